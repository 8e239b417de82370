#!/usr/bin/env bash
# Everything CI checks. Called by `make test` (the README's test command) after set-up.
# Two groups run at the same time, each writing its own log that is printed when the group ends:
#   cpu  lint, the collection's unit tests, sglang-ddtree against every supported SGLang release, sanity (on .venv's
#        ansible-core, then on the oldest and newest cores: scripts/sanity-cores.sh), the molecule scenarios
#        (containers of their own names and networks, not the lab's), the lab's training job and server stand-in on
#        this machine (tests/integration/test_lab_host.py: no containers), then the fleet lab's tests (fleet-a/b/c +
#        HAProxy: their own containers, network and lock; here, not in the lab group, so the two groups take about
#        as long as each other)
#   lab  the pivot's fault scenarios, the pivot from the installed collection, the lab's integration tests
#        (the lab's containers ct200/pro6000, one user at a time through /tmp/specdec-lab.lock)
# A group stops at its first failing stage; the other group goes on to its end. Any failure fails the run (exit 1)
# after both groups have ended. The closing lines list each stage's time and the pytest totals of every stage.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$PWD/ansible.cfg"
out=$(mktemp -d)
junit=$out/junit timings=$out/timings
mkdir -p "$junit" "$timings"

# stage NAME: ends the group's current stage (its time goes to $timings/GROUP) and starts the next.
stage() {
  stage_end
  printf '\n===== %s =====\n' "$*"
  cur_stage=$* cur_start=$SECONDS
}
stage_end() {
  if [ -n "${cur_stage:-}" ]; then
    printf '%5d s  %s\n' $((SECONDS - cur_start)) "$cur_stage" >>"$timings/$group"
    printf -- '----- %s: %d s\n' "$cur_stage" $((SECONDS - cur_start))
  fi
  cur_stage=
}
# Every pytest run leaves a JUnit file; the last lines sum them up.
n=0
pyt() { n=$((n + 1)); "$@" --junitxml="$junit/$group-$n.xml"; }

cpu_group() {
  stage "lint: ruff, yamllint"
  ruff check plugins tests sglang-ddtree lab bench roles
  yamllint -s .

  stage "collection unit tests (pytest)"
  pyt python -m pytest -q tests --ignore=tests/integration

  stage "sglang-ddtree tests against sglang $(python -c 'import importlib.metadata as m; print(m.version("sglang"))')"
  pyt python -m pytest -q sglang-ddtree/tests
  # Every other supported SGLang release has a venv (scripts/setup-python.sh, SGLANG_OTHER_VERSIONS). The whole glue
  # suite runs against 0.5.17 (the oldest); against each release in between only the fast version checks run
  # (registration, server args, fail-loudly/native DDTREE, the DFLASH-branch audit), two releases at a time.
  local full_glue="0.5.17" v venv pids=() logs=() i rc=0
  local fast=(sglang-ddtree/tests/sglang/test_registration.py sglang-ddtree/tests/sglang/test_server_args.py
              sglang-ddtree/tests/sglang/test_fail_loudly.py sglang-ddtree/tests/sglang/test_dflash_branches.py)
  for venv in .venv-sglang-*; do
    [ -x "$venv/bin/python" ] || continue
    v=${venv#.venv-sglang-}
    if [[ " $full_glue " == *" $v "* ]]; then
      stage "sglang-ddtree SGLang-glue tests against sglang $v"
      pyt "$venv/bin/python" -m pytest -q sglang-ddtree/tests -m sglang
    fi
  done
  stage "sglang-ddtree registration and server-args tests against the releases in between (two at a time)"
  for venv in .venv-sglang-*; do
    [ -x "$venv/bin/python" ] || continue
    v=${venv#.venv-sglang-}
    [[ " $full_glue " == *" $v "* ]] && continue
    if [ ${#pids[@]} -ge 2 ]; then wait "${pids[0]}" || rc=1; pids=("${pids[@]:1}"); fi
    n=$((n + 1))
    logs+=("$out/release-$v.log")
    { echo "--- sglang $v"; "$venv/bin/python" -m pytest -q -p no:cacheprovider "${fast[@]}" \
        --junitxml="$junit/$group-$n.xml"; } >"$out/release-$v.log" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=1; done
  for i in "${logs[@]}"; do cat "$i"; done
  [ "$rc" = 0 ] || { echo "a release's tests failed (above)"; return 1; }

  stage "ansible-doc, collection build, ansible-test sanity"
  bash scripts/sanity.sh

  stage "ansible-test sanity on ansible-core 2.17 and 2.21"
  bash scripts/sanity-cores.sh

  local dir scenario
  for dir in molecule/*/; do
    scenario=$(basename "$dir")
    [ -f "molecule/$scenario/molecule.yml" ] || continue
    stage "molecule test -s $scenario"
    molecule test -s "$scenario"
  done

  stage "the lab's training job and server stand-in on this machine (no containers)"
  pyt python -m pytest -q tests/integration/test_lab_host.py

  stage "fleet lab tests (three hosts behind HAProxy: canary failure, interrupted rolling pivot under load)"
  SPECDEC_REQUIRE_LAB=1 pyt python -m pytest -q tests/integration/test_fleet.py
  stage_end
}

lab_group() {
  # The pivot's fault scenarios (one lab for all of them), the pivot from the built and installed collection, then
  # every other file of tests/integration but test_fleet.py and test_lab_host.py (the cpu group's): the lab's own
  # container tests, and any added later.
  stage "pivot fault scenarios, interrupted runs, rollback (lab)"
  SPECDEC_REQUIRE_LAB=1 pyt python -m pytest -q tests/integration/test_pivot_faults.py

  stage "the lab pivot from the installed collection (ansible-galaxy collection build + install)"
  bash scripts/test-installed-collection.sh

  stage "lab integration tests (docker containers with systemd)"
  SPECDEC_REQUIRE_LAB=1 pyt python -m pytest -q tests/integration --ignore=tests/integration/test_pivot_faults.py \
    --ignore=tests/integration/test_fleet.py --ignore=tests/integration/test_lab_host.py
  stage_end
}

start=$SECONDS
declare -A pid_group=()
for group in cpu lab; do
  ( set -euo pipefail
    trap '[ -z "${cur_stage:-}" ] || cur_stage="$cur_stage (FAILED)"; stage_end' EXIT
    "${group}_group" ) >"$out/$group.log" 2>&1 &
  pid_group[$!]=$group
  echo "[test] group $group started (log: $out/$group.log)"
done
failed=()
while [ ${#pid_group[@]} -gt 0 ]; do
  rc=0
  wait -n -p done_pid "${!pid_group[@]}" || rc=$?
  group=${pid_group[$done_pid]}
  unset "pid_group[$done_pid]"
  printf '\n################ group %s: %s after %d s ################\n' "$group" \
    "$([ "$rc" = 0 ] && echo passed || echo "FAILED (exit $rc)")" $((SECONDS - start))
  cat "$out/$group.log"
  [ "$rc" = 0 ] || failed+=("$group")
done

printf '\n===== stage times (s) =====\n'
for group in cpu lab; do
  echo "$group:"
  cat "$timings/$group" 2>/dev/null || true
done
echo "wall: $((SECONDS - start)) s"
python - "$junit" "${#failed[@]}" <<'PY'
import pathlib, sys, xml.etree.ElementTree as ET
total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
files = list(pathlib.Path(sys.argv[1]).glob("*.xml"))
for f in files:
    for suite in ET.parse(f).getroot().iter("testsuite"):
        for key in total:
            total[key] += int(suite.get(key, 0))
    # Each failing test by name with its message's first line, so that a log's last lines say what failed.
    for case in ET.parse(f).getroot().iter("testcase"):
        for bad in list(case.findall("failure")) + list(case.findall("error")):
            first = (bad.get("message") or bad.text or "").strip().splitlines()[:1]
            print(f"FAILED {f.stem}: {case.get('classname')}::{case.get('name')}: {first[0][:300] if first else ''}")
failed = total["failures"] + total["errors"]
passed = total["tests"] - failed - total["skipped"]
head = "all stages passed" if sys.argv[2] == "0" and failed == 0 else "SOME STAGES FAILED"
print(f"{head}; pytest runs: {len(files)}")
print(f"tests: {passed} passed, {failed} failed, {total['skipped']} skipped")
PY
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed groups: ${failed[*]}"
  exit 1
fi
