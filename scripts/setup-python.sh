#!/usr/bin/env bash
# Creates the project's Python environments (idempotent; a stamp per requirements hash skips repeat work):
#   .venv               controller + tests: ansible, molecule, pytest, linters, torch (CPU), the real
#                       sglang (SGLANG_MAIN_VERSION, --no-deps over a minimal runtime), sglang-ddtree (editable)
#   .venv-sglang-0.5.17 the runtime of .venv (through a .pth onto its site-packages) with sglang 0.5.17,
#                       so plugin and capability tests run against a second real SGLang release.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
# pip warns once per package about this machine's optional local indexes; keep its real errors visible.
pipq() { "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
SGLANG_MAIN_VERSION=0.5.23
SGLANG_OTHER_VERSIONS="0.5.17 0.5.18 0.5.19 0.5.20 0.5.21 0.5.22"
stamp_input=$(cat requirements/*.txt scripts/setup-python.sh sglang-ddtree/pyproject.toml 2>/dev/null | sha256sum | cut -c1-16)
stamp=.venv/.setup-$stamp_input
if [ -e "$stamp" ]; then echo "setup-python: up to date ($stamp)"; exit 0; fi

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
pipq .venv/bin/python -m pip install -q --upgrade pip
pipq .venv/bin/python -m pip install -q -r requirements/dev.txt -r requirements/sglang-runtime.txt
pipq .venv/bin/python -m pip install -q -r requirements/sglang-test.txt
pipq .venv/bin/python -m pip install -q --no-deps "sglang==$SGLANG_MAIN_VERSION"
wait "$others" || { echo "setup-python: a release venv failed (above)"; exit 1; }
pipq .venv/bin/python -m pip install -q --no-deps -e ./sglang-ddtree  # after them: one egg-info writer at a time
# ansible-test sanity creates a venv per test and bootstraps pip there with a script from a host this machine
# cannot reach; give it the same bootstrap built from PyPI's pip wheel (scripts/ansible_test_get_pip.py).
cache=~/.ansible/test/cache
mkdir -p "$cache"
pv=$(grep -oP "^\s*pip='\K[0-9.]+" .venv/lib/python3.*/site-packages/ansible_test/_internal/python_requirements.py)
for pv in $pv; do
  [ -e "$cache/pip-$pv-py3-none-any.whl" ] || pipq .venv/bin/python -m pip download -q --no-deps -d "$cache" "pip==$pv"
  cp scripts/ansible_test_get_pip.py "$cache/get_pip_${pv//./_}.py"
done
rm -f .venv/.setup-*
touch "$stamp"
echo "setup-python: done"
