#!/usr/bin/env bash
# Creates the project's Python environments (idempotent; a stamp per requirements hash skips repeat work):
#   .venv               controller + tests: ansible, molecule, pytest, linters, torch (CPU), the real
#                       sglang (SGLANG_MAIN_VERSION, --no-deps over a minimal runtime), sglang-ddtree (editable)
#   .venv-sglang-0.5.17 the runtime of .venv (through a .pth onto its site-packages) with sglang 0.5.17,
#                       so plugin and capability tests run against a second real SGLang release.
#   .venv-core-2.17     only ansible-core 2.17 (the oldest meta/runtime.yml admits) and .venv-core-2.21 (the newest,
#   .venv-core-2.21     on Python 3.12, which its controller needs): scripts/sanity-cores.sh runs sanity from them.
#   .venv-lint          the linters with pins of their own (requirements/lint.txt: ansible-lint and its ansible,
#                       ShellCheck): scripts/lint.sh runs them by path.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
# pip warns once per package about this machine's optional local indexes; keep its real errors visible.
pipq() { "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
SGLANG_MAIN_VERSION=0.5.23
SGLANG_OTHER_VERSIONS="0.5.17 0.5.18 0.5.19 0.5.20 0.5.21 0.5.22"
SANITY_CORES="2.17.14 2.21.5"  # ansible-core releases for scripts/sanity-cores.sh (latest patch of each)
stamp_input=$(cat requirements/*.txt scripts/setup-python.sh sglang-ddtree/pyproject.toml 2>/dev/null | sha256sum | cut -c1-16)
stamp=.venv/.setup-$stamp_input
core_venvs_present() {
  local v
  for v in $SANITY_CORES; do [ -x ".venv-core-${v%.*}/bin/ansible-test" ] || return 1; done
}
lint_venv_present() { [ -x .venv-lint/bin/ansible-lint ] && [ -x .venv-lint/bin/shellcheck ]; }
if [ -e "$stamp" ] && core_venvs_present && lint_venv_present; then echo "setup-python: up to date ($stamp)"; exit 0; fi

# A first set-up fills about 9 GB (.venv alone 6.8 GB: torch 2.14.1 is a CUDA build, the pair torchvision needs) and
# pip unpacks beside it: refuse at once with the figures rather than fail minutes later with "No space left on device".
need_gb=${SETUP_NEED_GB:-12}
free_gb=$(df -P -BG . | awk 'NR == 2 { sub("G", "", $4); print $4 }')
if [ ! -x .venv/bin/python ] && [ "${free_gb:-0}" -lt "$need_gb" ]; then
  echo "setup-python: only ${free_gb} GB free on $(df -P . | awk 'NR == 2 { print $6 }') for $PWD; a first set-up needs" \
    "about $need_gb GB (the venvs, with torch's CUDA build): free some space (old clones, ~/.cache/pip, docker" \
    "system prune) or set SETUP_NEED_GB to override" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
base_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# The venv of each other release needs only .venv's site-packages path: they are made while .venv is filled.
other_venvs() {
  local v venv site
  for v in $SGLANG_OTHER_VERSIONS; do
    venv=.venv-sglang-$v
    [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    pipq "$venv/bin/python" -m pip install -q --no-deps "sglang==$v" pytest==9.0.3
    pipq "$venv/bin/python" -m pip install -q --no-deps -e ./sglang-ddtree
    # The runtime (torch, transformers, ...) is shared with .venv; this venv's own site-packages come
    # first on sys.path, so its sglang (and nothing else) shadows the main one. (Written last: this venv's pip
    # never sees .venv while it is being filled.)
    echo "$base_site" > "$site/zz-specdec-base.pth"
  done
}
other_venvs > >(sed 's/^/[release venvs] /') 2>&1 &
others=$!
# ansible-core 2.20 and later need Python >= 3.12 on the controller (this machine's default is 3.11): PYTHON312,
# else python3.12 on PATH, else pyenv's.
python312() {
  local p
  for p in "${PYTHON312:-}" python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; do
    if [ -n "$p" ] && "$p" -c '' 2>/dev/null; then echo "$p"; return 0; fi
  done
  echo "setup-python: ansible-core $1 needs Python 3.12 or newer on the controller and none was found (tried" \
    "PYTHON312, python3.12 on PATH, \$(pyenv root)/versions/3.12*): install Python 3.12 with its venv module" \
    "(pyenv install 3.12, or apt-get install python3.12-venv) or set PYTHON312=/path/to/python3.12" >&2
  return 1
}
# ansible-test sanity creates a venv per test and bootstraps pip there with a script from a host this machine
# cannot reach; give it the same bootstrap built from PyPI's pip wheel (scripts/ansible_test_get_pip.py), for the pip
# that the ansible-test of each VENV given pins.
pip_bootstrap() {
  local cache=~/.ansible/test/cache venv pvs pv
  mkdir -p "$cache"
  for venv in "$@"; do
    pvs=$(grep -oP "^\s*pip='\K[0-9.]+" "$venv"/lib/python3.*/site-packages/ansible_test/_internal/python_requirements.py)
    for pv in $pvs; do
      [ -e "$cache/pip-$pv-py3-none-any.whl" ] || pipq "$venv/bin/python" -m pip download -q --no-deps -d "$cache" "pip==$pv"
      cp scripts/ansible_test_get_pip.py "$cache/get_pip_${pv//./_}.py"
    done
  done
}
core_venvs() {
  local v venv py log
  for v in $SANITY_CORES; do
    venv=.venv-core-${v%.*}
    py=$PY
    if [ "$(printf '%s\n' 2.20 "$v" | sort -V | head -1)" = 2.20 ]; then py=$(python312 "$v"); fi
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    pipq "$venv/bin/python" -m pip install -q "ansible-core==$v"
    pip_bootstrap "$venv"
  done
  # Each sanity test's venv, so that the test stage installs nothing (its log only when it fails).
  log=$(mktemp)
  bash scripts/sanity-cores.sh --prime-venvs >"$log" 2>&1 || { cat "$log"; rm -f "$log"; return 1; }
  rm -f "$log"
}
core_venvs > >(sed 's/^/[core venvs] /') 2>&1 &
cores=$!
lint_venv() {
  [ -x .venv-lint/bin/python ] || "$PY" -m venv .venv-lint
  pipq .venv-lint/bin/python -m pip install -q -r requirements/lint.txt
}
lint_venv > >(sed 's/^/[lint venv] /') 2>&1 &
lint=$!
pipq .venv/bin/python -m pip install -q --upgrade pip
pipq .venv/bin/python -m pip install -q -r requirements/dev.txt -r requirements/sglang-runtime.txt
pipq .venv/bin/python -m pip install -q -r requirements/sglang-test.txt
pipq .venv/bin/python -m pip install -q --no-deps "sglang==$SGLANG_MAIN_VERSION"
wait "$others" || { echo "setup-python: a release venv failed (above)"; exit 1; }
wait "$cores" || { echo "setup-python: an ansible-core venv failed (above)"; exit 1; }
wait "$lint" || { echo "setup-python: the lint venv failed (above)"; exit 1; }
pipq .venv/bin/python -m pip install -q --no-deps -e ./sglang-ddtree  # after them: one egg-info writer at a time
pip_bootstrap .venv
rm -f .venv/.setup-*
touch "$stamp"
echo "setup-python: done"
