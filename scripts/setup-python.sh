#!/usr/bin/env bash
# Creates the project's Python environments (idempotent; a stamp per requirements hash skips repeat work):
#   .venv               controller + tests: ansible, molecule, pytest, linters, torch (CPU), the real
#                       sglang (SGLANG_MAIN_VERSION, --no-deps over a minimal runtime), sglang-ddtree (editable)
#   .venv-sglang-0.5.17 the same runtime (through a .pth onto .venv's site-packages) with sglang 0.5.17,
#                       so plugin and capability tests run against a second real SGLang release.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
SGLANG_MAIN_VERSION=0.5.23
SGLANG_OTHER_VERSIONS="0.5.17"
stamp_input=$(cat requirements/*.txt scripts/setup-python.sh sglang-ddtree/pyproject.toml 2>/dev/null | sha256sum | cut -c1-16)
stamp=.venv/.setup-$stamp_input
if [ -e "$stamp" ]; then echo "setup-python: up to date ($stamp)"; exit 0; fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements/dev.txt -r requirements/sglang-runtime.txt
.venv/bin/python -m pip install -q --no-deps "sglang==$SGLANG_MAIN_VERSION"
.venv/bin/python -m pip install -q --no-deps -e ./sglang-ddtree

base_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for v in $SGLANG_OTHER_VERSIONS; do
  venv=.venv-sglang-$v
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # The runtime (torch, transformers, ...) is shared with .venv; this venv's own site-packages come
  # first on sys.path, so its sglang (and nothing else) shadows the main one.
  echo "$base_site" > "$site/zz-specdec-base.pth"
  "$venv/bin/python" -m pip install -q --no-deps "sglang==$v" pytest==9.0.3
  "$venv/bin/python" -m pip install -q --no-deps ./sglang-ddtree
done
rm -f .venv/.setup-*
touch "$stamp"
echo "setup-python: done"
