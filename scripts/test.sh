#!/usr/bin/env bash
# Everything CI checks, in order of speed. Called by `make test` (the README's test command) after set-up.
# Each stage prints a heading; the first failure stops the run with a non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$PWD/ansible.cfg"
stage() { printf '\n===== %s =====\n' "$*"; }
# Every pytest run leaves a JUnit file; the last line sums them up.
junit=$(mktemp -d)
n=0
pyt() { n=$((n + 1)); "$@" --junitxml="$junit/$n.xml"; }

stage "lint: ruff, yamllint"
ruff check plugins tests sglang-ddtree lab bench roles
yamllint -s .

stage "collection unit tests (pytest)"
pyt python -m pytest -q tests --ignore=tests/integration

stage "sglang-ddtree tests against sglang $(python -c 'import importlib.metadata as m; print(m.version("sglang"))')"
pyt python -m pytest -q sglang-ddtree/tests
# Every other supported SGLang release has a venv (scripts/setup-python.sh, SGLANG_OTHER_VERSIONS). The whole glue
# suite runs against 0.5.17 (the oldest); against each release in between only the fast version checks run
# (registration, server args, fail-loudly/native DDTREE, the DFLASH-branch audit; about 30 s each).
SGLANG_FULL_GLUE_VERSIONS="0.5.17"
sglang_fast=(sglang-ddtree/tests/sglang/test_registration.py sglang-ddtree/tests/sglang/test_server_args.py
             sglang-ddtree/tests/sglang/test_fail_loudly.py sglang-ddtree/tests/sglang/test_dflash_branches.py)
for venv in .venv-sglang-*; do
  [ -x "$venv/bin/python" ] || continue
  v=${venv#.venv-sglang-}
  if [[ " $SGLANG_FULL_GLUE_VERSIONS " == *" $v "* ]]; then
    stage "sglang-ddtree SGLang-glue tests against sglang $v"
    pyt "$venv/bin/python" -m pytest -q sglang-ddtree/tests -m sglang
  else
    stage "sglang-ddtree registration and server-args tests against sglang $v"
    pyt "$venv/bin/python" -m pytest -q "${sglang_fast[@]}"
  fi
done

stage "ansible-doc, collection build, ansible-test sanity"
bash scripts/sanity.sh

stage "lab integration tests (docker containers with systemd)"
SPECDEC_REQUIRE_LAB=1 pyt python -m pytest -q tests/integration --ignore=tests/integration/test_pivot_faults.py

# The pivot's fault scenarios, interrupted runs and playbooks/rollback.yml, through the real playbooks against the
# same lab containers (one set-up for all of them; ~14 min).
stage "pivot fault scenarios, interrupted runs, rollback (lab)"
SPECDEC_REQUIRE_LAB=1 pyt python -m pytest -q tests/integration/test_pivot_faults.py

for dir in molecule/*/; do
  scenario=$(basename "$dir")
  [ -f "molecule/$scenario/molecule.yml" ] || continue
  stage "molecule test -s $scenario"
  molecule test -s "$scenario"
done
python - "$junit" <<'PY'
import pathlib, sys, xml.etree.ElementTree as ET
total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
for f in pathlib.Path(sys.argv[1]).glob("*.xml"):
    for suite in ET.parse(f).getroot().iter("testsuite"):
        for key in total:
            total[key] += int(suite.get(key, 0))
failed = total["failures"] + total["errors"]
passed = total["tests"] - failed - total["skipped"]
print(f"all stages passed; pytest runs: {len(list(pathlib.Path(sys.argv[1]).glob('*.xml')))}")
print(f"tests: {passed} passed, {failed} failed, {total['skipped']} skipped")
PY
