#!/usr/bin/env bash
# mmdebstrap customize hook for the lab image (see lab/setup-docker.sh).
#   $1  the new root file system (mmdebstrap has /proc, /sys and /dev mounted in it)
#   $2  the wheelhouse on the host (lab/.wheelhouse): every wheel the SGLang venv needs, so the install
#       inside runs with --no-index
#   $3  the sglang version to install with --no-deps over the minimal runtime
# Makes the root file system boot systemd as PID 1 in an unprivileged docker container and creates the
# venv /opt/sglang/venv with the REAL sglang package (CPU torch).
set -euo pipefail
root=$1 wheelhouse=$2 sglang_version=$3

# --- systemd in a container: units that cannot work without privileges or hardware are masked.
masked=(
  getty.target console-getty.service getty@.service serial-getty@.service
  systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket
  systemd-udev-trigger.service systemd-udev-settle.service systemd-hwdb-update.service
  systemd-logind.service
  apt-daily.timer apt-daily-upgrade.timer apt-daily.service apt-daily-upgrade.service
  dev-hugepages.mount dev-mqueue.mount sys-kernel-config.mount sys-kernel-debug.mount
  sys-kernel-tracing.mount sys-fs-fuse-connections.mount proc-sys-fs-binfmt_misc.automount
  proc-sys-fs-binfmt_misc.mount systemd-binfmt.service kmod-static-nodes.service
  systemd-modules-load.service systemd-remount-fs.service systemd-firstboot.service
  systemd-sysusers.service systemd-journald-audit.socket systemd-pstore.service
  e2scrub_all.timer e2scrub_reap.service fstrim.timer
)
for unit in "${masked[@]}"; do
  ln -sfn /dev/null "$root/etc/systemd/system/$unit"
done
# systemd fills an empty machine-id with a fresh one at boot; every container gets its own.
: > "$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id" "$root/usr/sbin/policy-rc.d"
# journald: keep logs in /run (tmpfs) but large enough to read a server's start-up.
mkdir -p "$root/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\nRuntimeMaxUse=64M\n' > "$root/etc/systemd/journald.conf.d/lab.conf"

# --- the SGLang venv, installed from the host's wheelhouse without network access.
mkdir -p "$root/wheelhouse"
mount --bind "$wheelhouse" "$root/wheelhouse"
trap 'umount "$root/wheelhouse"; rmdir "$root/wheelhouse"' EXIT
# A clean environment: the host's PIP_* settings (find-links, indexes, constraints) mean nothing inside.
in_root() { chroot "$root" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  LANG=C.UTF-8 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"; }
in_root python3 -m venv /opt/sglang/venv
in_root /opt/sglang/venv/bin/python -m pip install -q --no-compile --no-index --find-links /wheelhouse \
  -r /wheelhouse/runtime-requirements.txt
in_root /opt/sglang/venv/bin/python -m pip install -q --no-compile --no-index --find-links /wheelhouse --no-deps \
  "sglang==$sglang_version"
# Byte-code validated by source HASH, not mtime: mmdebstrap clamps every mtime in its tarball to the time it
# started (--clamp-mtime), which would invalidate mtime-stamped .pyc files and make the first import in every
# new container recompile ~2500 modules (~30 s). Some files in wheels never compile (pip ignores them too).
in_root /opt/sglang/venv/bin/python -m compileall -q -j 0 --invalidation-mode checked-hash \
  /opt/sglang/venv/lib/python3.11/site-packages >/dev/null \
  || echo "customize-rootfs: compileall skipped files that do not compile (as pip does)" >&2
in_root apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
