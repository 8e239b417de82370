#!/usr/bin/env bash
# Sets up what the lab needs on this machine, idempotently (a second run does nothing and takes ~1 s):
#   1. docker.io and mmdebstrap from apt (only if missing);
#   2. the docker engine, started by hand when `docker info` fails (its init script fails on these VMs:
#      ../shared/notes/containers.md);
#   3. only when the base image (4.) must be built: a wheelhouse lab/.wheelhouse (git-ignored) with every wheel
#      the lab's SGLang venv needs, built on the host where pip finds the local CPU torch wheel (with .venv's pip:
#      waits for scripts/setup-python.sh, which make setup runs at the same time);
#   4. the base image specdec-pivot-lab-base:<hash> — Debian bookworm minbase from mmdebstrap with systemd,
#      python3-psutil (the training_process module needs it on the training host),
#      python3.11 and the venv /opt/sglang/venv holding the REAL sglang (--no-deps over the minimal runtime
#      of requirements/sglang-runtime.txt, installed from the wheelhouse with --no-index);
#   5. the image specdec-pivot-lab:bookworm on top of it: the lab server stand-in installed in that venv, the
#      nvidia-smi stand-in, STOPSIGNAL SIGRTMIN+3, systemd as PID 1. Its label specdec.lab.inputs holds a
#      hash of every input, so a changed input rebuilds it (and only the base when the base's inputs changed).
# Environment: SPECDEC_LAB_IMAGE, SPECDEC_LAB_SGLANG_VERSION, SPECDEC_LAB_MIRROR, SPECDEC_LAB_NVIDIA_SMI_RECORDING
# (the recorded nvidia-smi outputs copied in), PYTHON (the pip used for the wheelhouse; default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

IMAGE=${SPECDEC_LAB_IMAGE:-specdec-pivot-lab:bookworm}
SGLANG_VERSION=${SPECDEC_LAB_SGLANG_VERSION:-0.5.23}
SUITE=bookworm
PACKAGES=usr-is-merged,python3,python3-venv,python3-psutil,systemd,systemd-sysv,dbus,procps,sudo,iproute2,curl,ca-certificates
RUNTIME_REQS=requirements/sglang-runtime.txt
WHEELHOUSE=$repo/lab/.wheelhouse
BUILD=$repo/lab/.build
NVIDIA_SMI_RECORDING=${SPECDEC_LAB_NVIDIA_SMI_RECORDING:-tests/unit/fixtures/nvidia_smi/h200x2}

log() { printf '[setup-docker] %s\n' "$*"; }
hash_of() { cat "$@" | sha256sum | cut -c1-16; }

# --- 1. packages
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]} with apt"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# --- 2. engine
if ! docker info >/dev/null 2>&1; then
  log "starting dockerd by hand (log: /var/log/dockerd.log)"
  nohup dockerd >/var/log/dockerd.log 2>&1 </dev/null &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { log "dockerd did not come up; see /var/log/dockerd.log"; tail -20 /var/log/dockerd.log; exit 1; }
fi
log "docker engine: $(docker info --format '{{.ServerVersion}} ({{.Driver}}, cgroup {{.CgroupVersion}})')"

# --- 3. wheelhouse (only when the base image must be built): every wheel the image's SGLang venv needs
build_wheelhouse() {
  local PY=${PYTHON:-}
  if [ -z "$PY" ]; then
    # .venv's pip (scripts/setup-python.sh; make setup runs it at the same time as this script: wait for its stamp)
    for _ in $(seq 1200); do compgen -G '.venv/.setup-*' >/dev/null && break; sleep 1; done
    if compgen -G '.venv/.setup-*' >/dev/null; then PY=.venv/bin/python; else PY=python3; fi
  fi
  local wh_hash
  wh_hash=$(printf '%s\n' "$SGLANG_VERSION" | cat - "$RUNTIME_REQS" | sha256sum | cut -c1-16)
  if [ ! -e "$WHEELHOUSE/.stamp-$wh_hash" ]; then
    log "building the wheelhouse $WHEELHOUSE (sglang==$SGLANG_VERSION over $RUNTIME_REQS) with $PY"
    mkdir -p "$WHEELHOUSE"
    "$PY" -m pip wheel -q -w "$WHEELHOUSE" -r "$RUNTIME_REQS" 2> >(grep -v "is ignored: it is neither a file" >&2)
    "$PY" -m pip wheel -q --no-deps -w "$WHEELHOUSE" "sglang==$SGLANG_VERSION" \
      2> >(grep -v "is ignored: it is neither a file" >&2)
    cp "$RUNTIME_REQS" "$WHEELHOUSE/runtime-requirements.txt"
    rm -f "$WHEELHOUSE"/.stamp-*
    touch "$WHEELHOUSE/.stamp-$wh_hash"
  fi
}

# --- 4. base image (mmdebstrap root file system + SGLang venv), tagged by the hash of its inputs
base_hash=$( { printf '%s\n' "$SUITE" "$PACKAGES" "$SGLANG_VERSION"; cat lab/image/customize-rootfs.sh "$RUNTIME_REQS"; } \
  | sha256sum | cut -c1-16)
BASE=specdec-pivot-lab-base:$base_hash
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  mirror=${SPECDEC_LAB_MIRROR:-}
  if [ -z "$mirror" ]; then
    # The Debian mirror apt already uses (one-line or deb822 sources), not the security archive.
    mirror=$(grep -rhoE '(^deb|^URIs:)[^#]*https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
      | grep -oE 'https?://[^ ]+' | grep -v security | head -1 || true)
    mirror=${mirror:-http://deb.debian.org/debian}
  fi
  build_wheelhouse
  log "building the base image $BASE with mmdebstrap from $mirror (~3 min)"
  start=$(date +%s)
  tmp_tag=specdec-pivot-lab-base:partial-$$
  mkdir -p "$BUILD"
  if ! mmdebstrap --quiet --variant=minbase \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --include="$PACKAGES" \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook="$repo/lab/image/customize-rootfs.sh \"\$1\" $WHEELHOUSE $SGLANG_VERSION" \
        "$SUITE" - "$mirror" 2>"$BUILD/mmdebstrap.log" \
      | docker import --change 'CMD ["/lib/systemd/systemd"]' --change 'ENV container=docker' - "$tmp_tag" >/dev/null
  then
    docker rmi "$tmp_tag" >/dev/null 2>&1 || true
    tail -30 "$BUILD/mmdebstrap.log"
    log "base image build failed (full log: $BUILD/mmdebstrap.log)"; exit 1
  fi
  docker tag "$tmp_tag" "$BASE" && docker rmi "$tmp_tag" >/dev/null
  # Older base images (other input hashes) are removed unless a container still uses them.
  for old in $(docker images --format '{{.Repository}}:{{.Tag}}' specdec-pivot-lab-base); do
    [ "$old" = "$BASE" ] || docker rmi "$old" >/dev/null 2>&1 || true
  done
  log "base image built in $(( $(date +%s) - start )) s: $(docker image inspect -f '{{.Size}}' "$BASE" | numfmt --to=iec)"
fi

# --- 5. the lab image: lab server stand-in + nvidia-smi stand-in on top of the base
ctx=$BUILD/context
rm -rf "$ctx" && mkdir -p "$ctx/server" "$ctx/stand-ins"
cp lab/image/Dockerfile "$ctx/Dockerfile"
cp lab/image/server-pyproject.toml "$ctx/server/pyproject.toml"
(cd lab && find sglang_lab_server -name '*.py' -print0 | xargs -0 cp --parents -t "$ctx/server")
if [ -d lab/stand-ins ]; then cp -r lab/stand-ins/. "$ctx/stand-ins/"; fi
# The nvidia-smi stand-in replays a recorded two-GPU output; "idle" is selected by default (a scenario can
# point nvidia-smi.standin.json, or NVIDIA_SMI_STANDIN_DIR, at recordings/h200x2/busy instead).
if [ -d "$NVIDIA_SMI_RECORDING" ]; then
  mkdir -p "$ctx/stand-ins/recordings"
  cp -r "$NVIDIA_SMI_RECORDING" "$ctx/stand-ins/recordings/"
  [ -f "$ctx/stand-ins/nvidia-smi.standin.json" ] || printf '{"fixture_dir": "recordings/%s/idle"}\n' \
    "$(basename "$NVIDIA_SMI_RECORDING")" > "$ctx/stand-ins/nvidia-smi.standin.json"
else
  log "warning: no nvidia-smi recording at $NVIDIA_SMI_RECORDING: the image's nvidia-smi has none selected"
fi
find "$ctx" -name __pycache__ -prune -exec rm -rf {} +
inputs_hash=$( { echo "$BASE"; (cd "$ctx" && find . -type f | LC_ALL=C sort | xargs sha256sum); } | sha256sum | cut -c1-16)
current=$(docker image inspect -f '{{index .Config.Labels "specdec.lab.inputs"}}' "$IMAGE" 2>/dev/null || true)
if [ "$current" != "$inputs_hash" ]; then
  log "building $IMAGE (inputs $inputs_hash)"
  DOCKER_BUILDKIT=0 docker build -q --build-arg "BASE=$BASE" --label "specdec.lab.inputs=$inputs_hash" \
    -t "$IMAGE" "$ctx" >/dev/null 2> >(grep -v -i -E 'deprecated|legacy builder|buildx|buildkit|^\s*$|environment-variable' >&2)
  # The previous lab image, now untagged, goes too (docker keeps it while a container uses it).
  docker image prune -f --filter label=specdec.lab.inputs >/dev/null 2>&1 || true
fi
log "image $IMAGE ready: $(docker image inspect -f '{{.Size}}' "$IMAGE" | numfmt --to=iec) (inputs $inputs_hash)"
