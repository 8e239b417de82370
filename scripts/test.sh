#!/usr/bin/env bash
# Everything CI checks, in order of speed. Called by `make test` (the README's test command) after set-up.
# Each stage prints a heading; the first failure stops the run with a non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$PWD/ansible.cfg"
stage() { printf '\n===== %s =====\n' "$*"; }

stage "lint: ruff, yamllint"
ruff check plugins tests sglang-ddtree lab bench
yamllint -s .

stage "collection unit tests (pytest)"
python -m pytest -q tests

stage "sglang-ddtree tests against sglang $(python -c 'import importlib.metadata as m; print(m.version("sglang"))')"
python -m pytest -q sglang-ddtree/tests
for venv in .venv-sglang-*; do
  [ -x "$venv/bin/python" ] || continue
  stage "sglang-ddtree SGLang-glue tests against ${venv#.venv-}"
  "$venv/bin/python" -m pytest -q sglang-ddtree/tests -m sglang
done

stage "ansible-doc and collection build"
bash scripts/sanity.sh

for scenario in $(ls molecule 2>/dev/null); do
  [ -f "molecule/$scenario/molecule.yml" ] || continue
  stage "molecule test -s $scenario"
  molecule test -s "$scenario"
done
echo "all stages passed"
