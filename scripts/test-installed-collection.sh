#!/usr/bin/env bash
# The collection as a user gets it: `ansible-galaxy collection build` of this checkout (galaxy.yml's build_ignore
# applies), `ansible-galaxy collection install` of the tarball into an empty collections path, then the lab pivot
# run from the INSTALLED copy (its playbook, inventory, roles and sglang-ddtree source; nothing of the checkout),
# from a directory outside it, with the plugin wheel built by a stock `python3 -m venv` (its bundled pip and
# setuptools, no wheel package, no network). Checks: the report lands in ./reports of the directory the run
# started in (pivot_report_dir's default), it says DDTREE serves and names the collection's version, and nothing
# is written into the installed collection. (That a second pivot reports changed=0 is checked on the checkout by
# tests/integration/test_pivot_faults.py; here it would add ~2.5 min.) Needs the lab (make setup); holds the lab
# lock while it uses it. A stage of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
# shellcheck source=lab/lab.env
. lab/lab.env
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log() { printf '[installed-collection] %s\n' "$*"; }
fail() { printf '[installed-collection] FAILED: %s\n' "$*" >&2; exit 1; }

# The installed collection is the only specdec.pivot Ansible sees (not the checkout's .venv/collections link).
mkdir "$work/run"
export ANSIBLE_COLLECTIONS_PATH=$work/collections ANSIBLE_CONFIG=$work/run/ansible.cfg
printf '[defaults]\ninterpreter_python = auto_silent\nretry_files_enabled = false\ncallback_result_format = yaml\n' \
  >"$ANSIBLE_CONFIG"
.venv/bin/ansible-galaxy collection build --output-path "$work" "$repo" >/dev/null
tarball=$(ls "$work"/specdec-pivot-*.tar.gz)
log "built $(basename "$tarball") ($(du -h "$tarball" | cut -f1))"
.venv/bin/ansible-galaxy collection install -p "$work/collections" "$tarball" >/dev/null
installed=$work/collections/ansible_collections/specdec/pivot
[ -f "$installed/playbooks/pivot.yml" ] || fail "no playbooks/pivot.yml in the installed collection"
[ ! -e "$installed/inventories/production" ] || fail "inventories/production was installed"
log "installed into $work/collections"

# A stock controller's venv: the interpreter's own bundled pip and setuptools, nothing upgraded or added.
python3 -m venv "$work/stock-venv"
log "stock venv: $("$work/stock-venv/bin/python" -m pip list --format=freeze 2>/dev/null | tr '\n' ' ')"

# The run starts in an empty directory.
pivot() {
  (cd "$work/run" && env -u PIVOT_REPORT_DIR PWD="$work/run" XDG_CACHE_HOME="$work/cache" \
     "$repo/.venv/bin/ansible-playbook" -i "$installed/inventories/lab" specdec.pivot.pivot \
     -e "ddtree_plugin_build_python=$work/stock-venv/bin/python")
}

lab_lock
log "resetting the lab (lab/up.sh)"
env -u ANSIBLE_COLLECTIONS_PATH ANSIBLE_CONFIG="$repo/ansible.cfg" bash lab/up.sh -- -e lab_clear_pivot_state=true \
  >"$work/up.log" 2>&1 || { tail -40 "$work/up.log"; fail "lab/up.sh"; }
before=$(find "$installed" -type f | sort | sha256sum)

start=$SECONDS
pivot >"$work/run1.log" 2>&1 || { tail -60 "$work/run1.log"; fail "the pivot from the installed collection"; }
log "pivot from the installed collection: ok in $((SECONDS - start)) s"
# one directory per version of the plugin's sources (roles/ddtree_plugin/files/build_wheel.py)
ls "$work/cache/specdec.pivot/wheels/"*/sglang_ddtree-*.whl >/dev/null \
  || fail "no plugin wheel built by the stock venv under $work/cache/specdec.pivot/wheels"
report=$work/run/reports/pivot-report.json
if [ ! -f "$report" ] || [ ! -f "$work/run/reports/pivot-report.md" ]; then
  fail "no report in $work/run/reports (the default report directory is ./reports of the run's directory)"
fi
version=$(sed -n 's/^version: *//p' galaxy.yml)
"$repo/.venv/bin/python" - "$report" "$version" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["status"] == "ok", r["status"]
assert r["failures"] == [], r["failures"]
[inf] = r["inference"]
assert "DDTREE" in inf["plan"]["new_exec_start"], inf["plan"]["new_exec_start"]
assert r["versions"]["collection"] == sys.argv[2], r["versions"]
print(f"[installed-collection] report: status ok, DDTREE serving, collection {r['versions']['collection']}")
PY
after=$(find "$installed" -type f | sort | sha256sum)
[ "$before" = "$after" ] || fail "the run wrote into the installed collection: $(find "$installed" -newer "$tarball" -type f | head)"

