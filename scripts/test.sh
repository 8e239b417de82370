#!/usr/bin/env bash
# Everything CI checks. Called by `make test` (the README's test command) after set-up.
# Two groups run at the same time, each writing its own log that is printed when the group ends:
#   cpu  lint (scripts/lint.sh: ruff, yamllint, ShellCheck, ansible-lint), the collection's unit tests, sglang-ddtree
#        against every supported SGLang release, sanity (on .venv's ansible-core, then on the oldest and newest
#        cores: scripts/sanity-cores.sh), the molecule scenarios
#        (containers of their own names and networks, not the lab's), the lab's training job and server stand-in on
#        this machine (tests/integration/test_lab_host.py: no containers), then the fleet lab's tests (fleet-a/b/c +
#        HAProxy: their own containers, network and lock; here, not in the lab group, so the two groups take about
#        as long as each other)
#   lab  the pivot's fault scenarios, the pivot from the installed collection, the lab's integration tests
#        (the lab's containers ct200/pro6000, one user at a time through /tmp/specdec-lab.lock)
# Each group's stages are declared (cpu_stages, lab_stages) before any runs. A group stops at its first failing stage;
# the other group goes on to its end. Any failure fails the run (exit 1) after both groups have ended. The closing
# summary (scripts/test_summary.py) names every declared stage: passed (its time), FAILED (its first error line) or
# NOT RUN (why), then each failing test and the pytest totals. Every tool comes from the project's venvs by path
# (.venv, .venv-lint, .venv-core-*, .venv-sglang-*: scripts/setup-python.sh), never from whatever else is on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/.venv/bin
export PATH="$bin:$PATH"  # for what the tools themselves run (ansible-playbook under molecule, ...)
export ANSIBLE_CONFIG="$PWD/ansible.cfg"
out=$(mktemp -d)
mkdir -p "$out/plan" "$out/results" "$out/rc" "$out/stages" "$out/junit"

# The stages of each group in the order they run, one a line: TITLE, a tab, COMMAND (a function of this script or a
# program, with its arguments, split on spaces: no quoting).
stage() { printf '%s\t%s\n' "$1" "$2"; }
cpu_stages() {
  local venv v scenario
  stage "lint: ruff, yamllint, ShellCheck, ansible-lint" "bash scripts/lint.sh"
  stage "collection unit tests (pytest)" "pyt $bin/python -m pytest -q tests --ignore=tests/integration"
  stage "sglang-ddtree tests against sglang $(sglang_version "$bin/python")" \
    "pyt $bin/python -m pytest -q sglang-ddtree/tests"
  # Every other supported SGLang release has a venv (scripts/setup-python.sh, SGLANG_OTHER_VERSIONS). The whole glue
  # suite runs against 0.5.17 (the oldest); against each release in between only the fast version checks run
  # (releases_in_between).
  for venv in .venv-sglang-*; do
    [ -x "$venv/bin/python" ] || continue
    v=${venv#.venv-sglang-}
    [[ " $full_glue " == *" $v "* ]] || continue
    stage "sglang-ddtree SGLang-glue tests against sglang $v" \
      "pyt $PWD/$venv/bin/python -m pytest -q sglang-ddtree/tests -m sglang"
  done
  stage "sglang-ddtree registration and server-args tests against the releases in between (two at a time)" \
    "releases_in_between"
  stage "ansible-doc, collection build, ansible-test sanity" "bash scripts/sanity.sh"
  stage "ansible-test sanity on ansible-core 2.17 and 2.21" "bash scripts/sanity-cores.sh"
  stage "the role task files driven by ansible-playbook, on ansible-core 2.17 and 2.21" "role_tasks_other_cores"
  for scenario in molecule/*/molecule.yml; do
    scenario=$(basename "$(dirname "$scenario")")
    stage "molecule test -s $scenario" "$bin/molecule test -s $scenario"
  done
  stage "the lab's training job and server stand-in on this machine (no containers)" \
    "pyt $bin/python -m pytest -q tests/integration/test_lab_host.py"
  stage "fleet lab tests (three hosts behind HAProxy: canary failure, interrupted rolling pivot under load)" \
    "lab_pyt tests/integration/test_fleet.py"
}
lab_stages() {
  # The pivot's fault scenarios (one lab for all of them), the pivot from the built and installed collection, then
  # every other file of tests/integration but test_fleet.py and test_lab_host.py (the cpu group's): the lab's own
  # container tests, and any added later.
  stage "pivot fault scenarios, interrupted runs, rollback (lab)" "lab_pyt tests/integration/test_pivot_faults.py"
  stage "the lab pivot from the installed collection (ansible-galaxy collection build + install)" \
    "bash scripts/test-installed-collection.sh"
  stage "lab integration tests (docker containers with systemd)" "lab_integration"
}
full_glue="0.5.17"
sglang_version() { "$1" -c 'import importlib.metadata as m; print(m.version("sglang"))'; }

# Every pytest run leaves a JUnit file, junit/STAGE-K.xml; the summary sums them up and names each failing test.
pyt() { k=$((k + 1)); "$@" --junitxml="$out/junit/$stage_id-$k.xml"; }
lab_pyt() { SPECDEC_REQUIRE_LAB=1 pyt "$bin/python" -m pytest -q "$@"; }
lab_integration() {
  lab_pyt tests/integration --ignore=tests/integration/test_pivot_faults.py --ignore=tests/integration/test_fleet.py \
    --ignore=tests/integration/test_lab_host.py
}
# The unit tests that drive the roles' task files through a real ansible-playbook (tests/unit/local_playbook.py), on
# the other cores' venvs (.venv-core-*: the oldest meta/runtime.yml admits and the newest); the stage above ran them
# on .venv's 2.19.
role_tasks_other_cores() {
  local venv files
  mapfile -t files < <(grep -l 'from local_playbook import' tests/unit/test_*.py)
  for venv in .venv-core-*/; do
    venv=$PWD/${venv%/}
    SPECDEC_ANSIBLE_PLAYBOOK=$venv/bin/ansible-playbook pyt "$bin/python" -m pytest -q "${files[@]}" || return 1
  done
}
releases_in_between() {
  local fast=(sglang-ddtree/tests/sglang/test_registration.py sglang-ddtree/tests/sglang/test_server_args.py
              sglang-ddtree/tests/sglang/test_fail_loudly.py sglang-ddtree/tests/sglang/test_dflash_branches.py
              sglang-ddtree/tests/sglang/test_kv_rows.py)
  local venv v pids=() logs=() i rc=0
  for venv in .venv-sglang-*; do
    [ -x "$venv/bin/python" ] || continue
    v=${venv#.venv-sglang-}
    [[ " $full_glue " == *" $v "* ]] && continue
    if [ ${#pids[@]} -ge 2 ]; then wait "${pids[0]}" || rc=1; pids=("${pids[@]:1}"); fi
    logs+=("$out/release-$v.log")
    { echo "--- sglang $v"; "$PWD/$venv/bin/python" -m pytest -q -p no:cacheprovider "${fast[@]}" \
        --junitxml="$out/junit/$stage_id-$v.xml"; } >"$out/release-$v.log" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=1; done
  for i in "${logs[@]}"; do cat "$i"; done
  [ "$rc" = 0 ] || { echo "a release's tests failed (above)"; return 1; }
}

# run_group GROUP: the group's declared stages in order, up to the first that fails. A stage's output goes to
# stages/GROUP-N.log (to follow it live: tail -f) and then to the group's log; its exit status and time to
# results/GROUP.
run_group() {
  local group=$1 number=0 title cmd argv begin rc
  while IFS=$'\t' read -r title cmd; do
    number=$((number + 1))
    printf '\n===== %s =====\n' "$title"
    begin=$SECONDS rc=0
    read -ra argv <<<"$cmd"
    # In the background and waited for, so that the stage's own set -e holds (it would not under `||`).
    (stage_id=$group-$number k=0; "${argv[@]}") </dev/null >"$out/stages/$group-$number.log" 2>&1 &
    wait $! || rc=$?
    cat "$out/stages/$group-$number.log"
    printf -- '----- %s: %s after %d s\n' "$title" "$([ "$rc" = 0 ] && echo passed || echo "FAILED (exit $rc)")" \
      $((SECONDS - begin))
    printf '%d\t%d\t%d\t%s\n' "$number" "$rc" $((SECONDS - begin)) "$title" >>"$out/results/$group"
    [ "$rc" = 0 ] || return "$rc"
  done <"$out/plan/$group"
}

start=$SECONDS
cpu_stages >"$out/plan/cpu"
lab_stages >"$out/plan/lab"
declare -A pid_group=()
for group in cpu lab; do
  (set -euo pipefail; run_group "$group") >"$out/$group.log" 2>&1 &
  pid_group[$!]=$group
  echo "[test] group $group started: $(wc -l <"$out/plan/$group") stages (log: $out/$group.log)"
done
failed=()
while [ ${#pid_group[@]} -gt 0 ]; do
  rc=0
  wait -n -p done_pid "${!pid_group[@]}" || rc=$?
  group=${pid_group[$done_pid]}
  unset "pid_group[$done_pid]"
  echo "$rc" >"$out/rc/$group"
  printf '\n################ group %s: %s after %d s ################\n' "$group" \
    "$([ "$rc" = 0 ] && echo passed || echo "FAILED (exit $rc)")" $((SECONDS - start))
  cat "$out/$group.log"
  [ "$rc" = 0 ] || failed+=("$group")
done

echo
summary=0
"$bin/python" scripts/test_summary.py "$out" $((SECONDS - start)) || summary=$?
if [ ${#failed[@]} -gt 0 ] || [ "$summary" != 0 ]; then
  echo "failed groups: ${failed[*]:-none} (the run's files: $out)"
  exit 1
fi
