"""Fault scenarios of the pivot, driven through the real playbooks against the lab (lab/: ct200 and pro6000).

Each test runs ``ansible-playbook -i inventories/lab playbooks/{pivot,rollback}.yml`` with a fault injected by
variables or lab state, and asserts the outcome on both hosts (processes, unit file, systemd state, installed
plugin, the pivot's records) and in the report. One lab, reset only where a scenario needs the initial state; the
tests run in file order and each states what it starts from.

| scenario | test |
|---|---|
| ``--check --diff``: the plan is shown, no host changes | test_check_diff_shows_the_plan_and_changes_nothing |
| bad variables: budget 0 / 64, missing drafter, unknown unit, a flag SGLang refuses | test_bad_variables_... |
| no root (no become): preflight proves the play may not halt, write, install, restart; nothing changed |
  test_without_root_preflight_fails_and_nothing_changes |
| GPU fit fails in preflight: nothing changed on any host | test_gpu_fit_failure_changes_nothing |
| training restarted by a supervisor: clear failure; disabled when asked | test_supervisor_... |
| pagers, editors, grep, watch, ssh, python -c naming the script beside the run: never signalled, --check lists
  exactly the run | test_processes_that_only_name_the_script_are_never_signalled |
| a wheel SGLang cannot load: the plugin's check-sglang fails in preflight, nothing changed | test_bad_wheel_... |
| a hook check undecided on this host: the pivot proceeds, the Markdown and the new server's log say so |
  test_an_undecided_hook_check_... |
| new flags make the server exit at start: old unit restored, healthy, the reason named | test_server_exits_... |
| health never comes up within the timeout: same | test_health_timeout_rolls_back |
| the opt-in gate fails: same rollback | test_gate_failure_rolls_back |
| interrupted pivot (Ctrl-C after the unit changed; lost session while the new server starts) converges, unit
  records and backups are kept, never overwritten | test_interrupted_... |
| playbooks/rollback.yml restores the NEXTN unit and the plugin (removed, or the previous version), idempotent,
  honest --check | test_rollback_... |

A training job that ignores SIGTERM (SIGKILL escalation) is covered by molecule/training_halt (molecule-th-stubborn).

Without a docker engine or the lab image these FAIL when SPECDEC_REQUIRE_LAB is set (CI), else they are skipped.
Run: ``SPECDEC_REQUIRE_LAB=1 .venv/bin/python -m pytest -q tests/integration/test_pivot_faults.py`` (~14 min).
The tests build on each other's lab state: run the whole file (``-k`` on one test starts from a reset lab).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import labkit as lk
import pytest
from ansible_collections.specdec.pivot.plugins.filter.pivot import pivot_report_disagreements, pivot_seconds_between

REQUIRE_LAB = bool(os.environ.get("SPECDEC_REQUIRE_LAB"))
IMAGE = os.environ.get("SPECDEC_LAB_IMAGE", "specdec-pivot-lab:bookworm")
SEEN: dict = {}  # facts one test leaves for a later one (the tests run in file order on one lab)


def unavailable(reason: str) -> None:
    if REQUIRE_LAB:
        pytest.fail(f"{reason}; SPECDEC_REQUIRE_LAB is set, so the lab must run here")
    pytest.skip(f"{reason}; set SPECDEC_REQUIRE_LAB=1 to make this a failure")


@pytest.fixture(scope="module")
def lab() -> Iterator[None]:
    if shutil.which("docker") is None:
        unavailable("no docker client on PATH (lab/setup-docker.sh installs docker.io)")
    if lk.docker("info", check=False, timeout=30).returncode != 0:
        unavailable("no docker engine answers (lab/setup-docker.sh starts one)")
    if lk.docker("image", "inspect", IMAGE, check=False).returncode != 0:
        unavailable(f"the lab image {IMAGE} is missing (lab/setup-docker.sh builds it)")
    if not lk.PLAYBOOK_BIN.exists():
        unavailable(".venv/bin/ansible-playbook is missing (make setup-python)")
    with open(os.environ.get("SPECDEC_LAB_LOCK", "/tmp/specdec-lab.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the lab is shared: one user at a time (lab/lab.env)
        os.environ["SPECDEC_LAB_LOCKED"] = "1"
        try:
            lk.reset()
            SEEN["pristine"] = lk.state()
            SEEN["seed_unit"] = lk.sh(lk.INFERENCE, f"cat {lk.UNIT_PATH}")
            yield
        finally:
            os.environ.pop("SPECDEC_LAB_LOCKED", None)
            fcntl.flock(lock, fcntl.LOCK_UN)


def pivot(tmp_path: Path, *args: str, **kw) -> lk.Run:
    return lk.playbook("pivot.yml", *args, report_dir=tmp_path / "reports", **kw)


def rollback(tmp_path: Path, *args: str, **kw) -> lk.Run:
    return lk.playbook("rollback.yml", *args, report_dir=tmp_path / "reports", **kw)


def assert_unchanged(before: dict, after: dict) -> None:
    """Nothing a pivot could change did change (the same processes, unit, plugin, records)."""
    assert after == before, f"the lab changed:\nbefore {before}\nafter  {after}"


def assert_nextn_serving() -> None:
    assert lk.healthy(), "the old server must be healthy again"
    info = lk.server_info()
    assert info["speculative_algorithm"] == "NEXTN", info
    assert lk.unit_show("ActiveState")["ActiveState"] == "active"
    assert lk.sh(lk.INFERENCE, f"cat {lk.UNIT_PATH}") == SEEN["seed_unit"], "the unit must be the seed's again"


def assert_rolled_back(run: lk.Run, reason: str) -> dict:
    assert run.rc != 0, run.tail()
    report = run.report()
    assert report["status"] == "failed"
    [failure] = report["failures"]
    assert failure["host"] == lk.INFERENCE and failure["phase"] == "sglang_service"
    assert reason in failure["msg"], failure["msg"]
    assert "Rolled back: the previous unit was restored from" in failure["msg"]
    svc = report["inference"][0]["service"]
    assert svc["rollback"]["performed"] is True and svc["rollback"]["healthy"] is True, svc["rollback"]
    assert svc["rollback"]["restored_from"].startswith(f"{lk.STATE_DIR}/units/{lk.UNIT}.")
    assert report["summary"]["rolled_back"] == [lk.INFERENCE]
    assert f"the pivot failed: {lk.INFERENCE}: sglang_service: switching {lk.UNIT}" in run.out
    md = (run.report_dir / "pivot-report.md").read_text()
    assert "> Next steps: the old server serves again" in md and "playbooks/rollback.yml" in md
    # the training section is rendered: the halt with its own duration, or that nothing was running
    # seen failing once (12-05), cause unknown: the message keeps what that run lost
    training = md.partition("## Training")[2][:2000]
    assert "| the halt: first signal to every process gone |" in md or "No training run was running" in md, (
        f"the report's training section:\n{training}\nthe run's tail:\n{run.tail()}")
    assert_nextn_serving()
    return report


# ------------------------------------------------------------------------------------------------ no change at all
def test_check_diff_shows_the_plan_and_changes_nothing(lab, tmp_path) -> None:
    run = pivot(tmp_path, "--check", "--diff")
    assert run.rc == 0, run.tail()
    # The plan: old vs new ExecStart, and the unit file's diff.
    assert "old ExecStart: /opt/sglang/venv/bin/python -m sglang_lab_server" in run.out
    assert "--speculative-algorithm DDTREE --speculative-draft-model-path /models/Qwen3-tiny-DFlash" in run.out
    assert "+    --speculative-algorithm DDTREE \\" in run.out
    assert "-    --speculative-algorithm NEXTN \\" in run.out
    report = run.report()
    assert report["status"] == "check" and report["check_mode"] is True and report["failures"] == []
    assert f"would halt 3 processes on {lk.TRAINING}" in run.out  # check mode says what it would do
    md = (run.report_dir / "pivot-report.md").read_text()
    assert "| would halt | 3 processes" in md and "Gate **off** (opt in with" in md
    # the lab's seed unit listens on 0.0.0.0 without --api-key: the plan and the report warn
    [warning] = [w for w in report["inference"][0]["plan"]["warnings"] if "without --api-key" in w]
    assert "0.0.0.0" in warning and "> **Warning:** the server listens on 0.0.0.0" in md
    assert report["inference"][0]["plan"]["new_exec_start"].endswith("--speculative-num-draft-tokens 17")
    assert report["inference"][0]["plan"]["args_check"]["ok"] is True
    # Preflight ran the plugin's own CLI in the unit's interpreter (python -m sglang_ddtree check-drafter and
    # check-sglang, the wheel on PYTHONPATH from a temporary copy) and says which DDTREE the server will run.
    plan = report["inference"][0]["plan"]
    assert plan["ddtree"]["implementation"] == "plugin", plan["ddtree"]
    assert plan["ddtree"]["detail"] == "sglang_ddtree.sglang.spec_algo.DDTreeSpecAlgo"
    assert plan["ddtree"]["plugin_status"] == "registered" and plan["ddtree"]["sglang"] == "0.5.23"
    drafter = plan["drafter"]["check"]
    assert drafter["ok"] is True and drafter["consumer"] == "sglang" and drafter["problems"] == [], drafter
    assert drafter["path"] == "/models/Qwen3-tiny-DFlash" and drafter["weights_checked"] is True
    assert "DDTREE the server will run: plugin (sglang_ddtree.sglang.spec_algo.DDTreeSpecAlgo)" in run.out
    assert "DDTREE the server will run: **plugin** (`sglang_ddtree.sglang.spec_algo.DDTreeSpecAlgo`)" in md
    # A check that failed or could not be decided here is in the Markdown too, not only in the JSON (issue 27).
    ddtree = plan["ddtree"]
    assert (f"> **The check failed:** {ddtree['problem']}" in md) is (not ddtree["ok"]), (ddtree, md)
    if ddtree.get("undecided"):
        assert f"> **Not decided on this host:** {ddtree['undecided']}" in md
    assert lk.preflight_leftovers() == "", "the temporary copy of the plugin must be gone"
    # Preflight reports no change (a second pivot run must say changed=0), not even its background checks.
    changed = [b.splitlines()[0] for b in run.out.split("TASK [")[1:]
               if b.startswith("specdec.pivot.sglang_preflight :") and "\nchanged:" in b]
    assert changed == [], changed
    assert_unchanged(SEEN["pristine"], lk.state())  # nothing installed (the plugin is part of the state)
    # rollback.yml on a host the pivot never touched: nothing to do, in --check and for real.
    for args in (["--check", "--diff"], []):
        rb = rollback(tmp_path, *args)
        assert rb.rc == 0 and rb.recap[lk.INFERENCE]["changed"] == 0, rb.tail()
        assert rb.report("rollback-report.json")["hosts"][0]["nothing_to_do"] is True
    assert_unchanged(SEEN["pristine"], lk.state())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-e", "sglang_preflight_budget=0"], "sglang_preflight_budget=0 is out of range"),
        (["-e", "sglang_preflight_budget=64"], "must be an integer from 1 to 63"),
        (["-e", "sglang_preflight_drafter_path=/models/no-such-drafter"],
         "missing config.json on pro6000: /models/no-such-drafter"),
        (["-e", "sglang_preflight_unit=no-such-sglang.service"],
         "unit no-such-sglang.service on pro6000 is not a loaded unit"),
        (["-e", '{"sglang_preflight_extra_args": ["--no-such-flag", "1"]}'],
         "own parser refuses the new command line on pro6000: unrecognized arguments: --no-such-flag 1"),
    ],
    ids=["budget-0", "budget-64", "missing-drafter", "unknown-unit", "flag-sglang-refuses"],
)
def test_bad_variables_fail_in_preflight_before_any_change(lab, tmp_path, extra, message) -> None:
    run = pivot(tmp_path, *extra)
    assert run.rc != 0
    assert message in run.out, run.tail()
    assert_unchanged(SEEN["pristine"], lk.state())


def test_without_root_preflight_fails_and_nothing_changes(lab, tmp_path) -> None:
    # The play connects as an unprivileged user (no become): it may not signal the run, write the unit, install
    # into the unit's site-packages or restart the service, so preflight says so and nothing changes anywhere.
    run = pivot(tmp_path, "-e", "ansible_user=nobody", "-e", "ansible_remote_tmp=/tmp/.ansible-nobody")
    assert run.rc != 0
    assert "Run the pivot with become" in run.out and "Nothing was changed" in run.out, run.tail()
    assert_unchanged(SEEN["pristine"], lk.state())


def test_gpu_fit_failure_changes_nothing(lab, tmp_path) -> None:
    # A context length the GPUs' memory cannot hold (the recorded H200 pair, the tiny model's KV cache).
    run = pivot(tmp_path, "-e", '{"sglang_preflight_extra_args": ["--context-length", "1000000000"]}')
    assert run.rc != 0
    assert "target + drafter do not fit the GPUs of pro6000" in run.out, run.tail()
    assert "context_length needs 1,000,000,000" in run.out
    assert_unchanged(SEEN["pristine"], lk.state())


# ------------------------------------------------------------------------------------------------ training side
def test_supervisor_restarting_the_job_is_a_clear_failure(lab, tmp_path) -> None:
    lk.up("--limit", lk.TRAINING, "-e", "lab_training_supervisor=true")
    before = lk.state()
    assert before["supervisor"] == ["enabled", "active"] and len(before["training_pids"]) == 3
    run = pivot(tmp_path, "--limit", lk.TRAINING, "-e", "training_halt_settle_s=6")
    assert run.rc != 0
    assert "matching processes are running again" in run.out, run.tail()
    assert "Set training_halt_supervisor_unit to the systemd unit that starts it" in run.out
    report = run.report()
    assert report["failures"][0]["host"] == lk.TRAINING and report["failures"][0]["phase"] == "training_halt"
    after = lk.state()
    assert after["supervisor"] == ["enabled", "active"] and len(after["training_pids"]) == 3
    assert set(after["training_pids"]).isdisjoint(before["training_pids"]), "the supervisor started a new job"
    assert {k: after[k] for k in ("unit_sha1", "service", "plugin", "state_dir")} == {
        k: before[k] for k in ("unit_sha1", "service", "plugin", "state_dir")}, "pro6000 must not be touched"


def test_supervisor_is_stopped_and_disabled_when_named(lab, tmp_path) -> None:
    run = pivot(tmp_path, "--limit", lk.TRAINING, "-e", "training_halt_supervisor_unit=dflash-train.service")
    assert run.rc == 0, run.tail()
    after = lk.state()
    assert after["supervisor"] == ["disabled", "inactive"]
    assert after["training_pids"] == []
    halt = run.report()["training"][0]
    assert halt["halt"]["supervisor_unit"] == "dflash-train.service" and halt["halt"]["supervisor_changed"] is True
    assert "supervisor dflash-train.service stopped and disabled first" in halt["stopped_how"]
    assert halt["halt"]["final_step"] is not None and halt["halt"]["checkpoint"]["path"].startswith("/opt/train/")
    again = pivot(tmp_path, "--limit", lk.TRAINING, "-e", "training_halt_supervisor_unit=dflash-train.service")
    assert again.rc == 0 and again.recap[lk.TRAINING]["changed"] == 0, again.tail()


def test_processes_that_only_name_the_script_are_never_signalled(lab, tmp_path) -> None:
    # Starts from: training stopped, its supervisor disabled (the test above). The nohup job again, and beside it
    # a tail -f, less, vim, grep, watch, an ssh client and a python -c whose command lines name the script.
    lk.up("--limit", lk.TRAINING)
    job = lk.training_pids()
    assert len(job) == 3, job
    lookalikes = lk.start_lookalikes()
    try:
        check = pivot(tmp_path, "--check", "--limit", lk.TRAINING)
        assert check.rc == 0, check.tail()
        assert sorted(check.report()["training"][0]["preflight"]["pids"]) == job  # exactly what would be halted
        run = pivot(tmp_path, "--limit", lk.TRAINING)
        assert run.rc == 0, run.tail()
        halt = run.report()["training"][0]["halt"]
        assert sorted(halt["pids"]) == job
        assert halt["match"] == "script train_dflash_pipeline.py"
        assert lk.training_pids() == []
        assert lk.alive_in_training(lookalikes) == {label: True for label in lookalikes}, "a look-alike was signalled"
    finally:
        lk.stop_lookalikes(lookalikes)


# ------------------------------------------------------------------------------------------------ plugin
def test_bad_wheel_is_refused_by_the_plugins_check_in_preflight(lab, tmp_path) -> None:
    # A wheel whose entry point SGLang cannot load: the plugin's own check-sglang (run in preflight, in the unit's
    # interpreter with the wheel on its path) fails, so the pivot stops in preflight with the check's message and
    # changes nothing: training as it was, the old server still serving (same PID), no plugin installed (issue 27).
    good = lk.built_wheel()
    bad = lk.rewrite_wheel(good, tmp_path / "wheels", version="0.1.0+broken",
                           entry_points="[sglang.srt.plugins]\nddtree = sglang_ddtree.no_such_module:register\n")
    before = lk.state()
    run = pivot(tmp_path, "-e", f"ddtree_plugin_wheel={bad}")
    assert run.rc != 0
    assert "the DDTREE plugin's own SGLang check fails in /opt/sglang/venv/bin/python on pro6000" in run.out, run.tail()
    assert "load_plugins() never called sglang-ddtree's register()" in run.out  # the check's own message
    assert "Nothing was changed." in run.out
    assert_unchanged(before, lk.state())
    assert lk.server_info()["speculative_algorithm"] == "NEXTN"
    assert lk.preflight_leftovers() == "", "the temporary copy of the plugin must be gone"


def test_an_install_pip_refuses_is_undone_and_never_stops_the_old_service(lab, tmp_path) -> None:
    # A wheel that passes every preflight check (its code loads and registers DDTREE from the wheel on the path) but
    # that pip refuses to install: it declares Requires-Python "<3". The install fails after preflight, main.yml's
    # rescue compares the interpreter with the snapshot taken before (no plugin: nothing to undo), the failure names
    # pip's reason, and the
    # switch never runs: the old server keeps serving NEXTN (same PID, same unit).
    good = lk.built_wheel()
    bad = lk.rewrite_wheel(good, tmp_path / "wheels", version="0.1.0+py2only", requires_python="<3")
    before = lk.state()
    run = pivot(tmp_path, "-e", f"ddtree_plugin_wheel={bad}")
    assert run.rc != 0
    report = run.report()
    [failure] = report["failures"]
    assert failure["phase"] == "ddtree_plugin", failure
    assert "requires a different Python" in failure["msg"], failure["msg"]
    assert "The SGLang service was not touched" in failure["msg"]
    # pip refused before writing anything, so the snapshot's state (no plugin) needed nothing undone
    assert "The previous state was put back (none: not installed" in failure["msg"], failure["msg"]
    plugin = report["inference"][0]["plugin"]
    assert plugin["failed"] is True and plugin["restored"]["action"] == "none", plugin
    assert report["inference"][0]["service"] is None, "the switch must not run"
    after = lk.state()
    assert after["service"] == before["service"], "the old server was never stopped (same PID, start, restarts)"
    assert after["unit_sha1"] == before["unit_sha1"]
    assert after["plugin"] is None, "nothing of the refused wheel stays installed"
    assert lk.server_info()["speculative_algorithm"] == "NEXTN"


# ------------------------------------------------------------------------------------------------ switch + rollback
def test_server_exits_at_start_rolls_back(lab, tmp_path) -> None:
    # Starts from: training halted, NEXTN, no plugin (the test above). The flag parses (SGLang's parser accepts it),
    # then SGLang's ModelConfig refuses a context longer than the model's 4096 at start.
    run = pivot(tmp_path, "-e", '{"sglang_preflight_extra_args": ["--context-length", "65536"]}')
    report = assert_rolled_back(run, "did not become healthy: the server exited")
    assert "User-specified context_length (65536) is greater than the derived context_length (4096)" in run.out
    svc = report["inference"][0]["service"]
    assert svc["health"]["healthy"] is False and svc["health"]["journal_errors"]
    assert svc["baseline"]["before"]["ok"] is True and svc["baseline"]["comparison"] is None
    assert lk.plugin_version() == "0.1.0", "a failed switch rolls the unit back; the plugin stays (rollback.yml)"
    records = lk.files_with_hashes(lk.INFERENCE, f"{lk.STATE_DIR}/units")
    assert len(records) == 2, records  # the seed unit's copy and its description
    SEEN["records"] = records
    SEEN["backups"] = lk.unit_backups()
    assert len(SEEN["backups"]) == 1


def test_health_timeout_rolls_back(lab, tmp_path) -> None:
    run = pivot(tmp_path, "-e", "sglang_service_health_timeout=1", "-e", "sglang_service_rollback_health_timeout=360")
    assert_rolled_back(run, "no 200 from http://127.0.0.1:30000/health within 1 s")
    assert lk.files_with_hashes(lk.INFERENCE, f"{lk.STATE_DIR}/units") == SEEN["records"], "records kept as they were"
    backups = lk.unit_backups()
    assert {k: backups[k] for k in SEEN["backups"]} == SEEN["backups"], "earlier backups are never overwritten"
    assert len(backups) == 2
    SEEN["backups"] = backups


def test_gate_failure_rolls_back(lab, tmp_path) -> None:
    run = pivot(tmp_path, "-e", "sglang_service_gate_min_speedup=100")
    report = assert_rolled_back(run, "Apply the gate: the gate failed on pro6000: speedup")
    svc = report["inference"][0]["service"]
    assert svc["rollback"]["gate"] is True
    assert ("Gate **on** (speedup at least x100.0; disagreeing prompts at most not checked; acceptance length at "
            "least not checked)") in (run.report_dir / "pivot-report.md").read_text()
    assert svc["gate"]["enabled"] is True and svc["gate"]["passed"] is False
    comparison = svc["baseline"]["comparison"]
    # Greedy decoding: the DDTREE server (the plugin's reference engine) agrees with the NEXTN server token by token.
    assert comparison["prompts"] == 5 and comparison["agreeing"] == 5, comparison["per_prompt"]
    assert comparison["tokens_per_s"]["before"] > 0 and comparison["tokens_per_s"]["after"] > 0
    assert comparison["accept_length"]["value"] >= 1.0
    # the budget per tree round during the comparison, from the server's own /get_server_info (the stand-in verifies
    # its one budget, 16, every round): every round of the measured prompts, none of the warm-up's
    budget = svc["baseline"]["after"]["budget"]
    assert (budget["policy"], budget["histogram"].keys(), budget["since"]) == ("fixed", {"16"}, "the measured requests")
    assert budget["steps"] == budget["histogram"]["16"] > 0
    assert (f"DDTREE's node budget on the new server's tree rounds during these prompts (fixed): 16: {budget['steps']} "
            f"(100%) of {budget['steps']} rounds.") in (run.report_dir / "pivot-report.md").read_text()
    assert report["summary"]["gate_failed"] == [lk.INFERENCE]
    assert lk.files_with_hashes(lk.INFERENCE, f"{lk.STATE_DIR}/units") == SEEN["records"]
    backups = lk.unit_backups()
    assert {k: backups[k] for k in SEEN["backups"]} == SEEN["backups"]


def assert_report_figures_agree(run: lk.Run, report: dict) -> None:
    """A real pivot's report (issue 26): every duration agrees with the two times printed beside it, the server is
    called the lab's stand-in from its own answer, and each wait's name states the limit its polls enforce."""
    assert pivot_report_disagreements(report) == []
    md = (run.report_dir / "pivot-report.md").read_text()
    assert "Figures that disagree" not in md
    svc = report["inference"][0]["service"]
    downtime = next(ln for ln in md.splitlines() if ln.startswith("| **downtime** |"))
    assert svc["stop_began_at"] in downtime and svc["first_healthy_at"] in downtime, downtime
    between = pivot_seconds_between(svc["stop_began_at"], svc["first_healthy_at"])
    assert between == pytest.approx(svc["downtime_s"], abs=0.0015)
    stand_in = svc["server_stand_in"]
    assert stand_in and "LAB STAND-IN" in stand_in["says"], stand_in
    assert stand_in["source"] == "GET /get_server_info of the new server"
    assert md.count("Lab stand-in") == 2 and "not a real model" in md
    # sglang-ddtree's own start-up check ran in preflight and could not decide: the lab's SGLang venv has no
    # torchvision, so SGLang's config reader does not import there (unit tests show its refusals on the real SGLang)
    check = report["inference"][0]["plan"]["args_check"]["startup_check"]
    assert (check["checked"], check["ok"]) == (False, None), check
    assert check["reason"].startswith("the check did not run here (ImportError: AutoImageProcessor requires"), check
    assert f"in preflight: **not decided on this host**: {check['reason']}." in md
    waits = re.findall(r"^waiting \[\S+\]: .* - limit (\d+) s, polled every \d+ s - \d+ s so far, limit (\d+) s",
                       run.out, re.M)
    assert waits, "no wait was polled (the new server's /health takes seconds)"
    assert all(named == polled for named, polled in waits), waits


# ------------------------------------------------------------------------------------------------ interrupted runs
def test_interrupted_after_the_unit_changed_converges(lab, tmp_path) -> None:
    # Ctrl-C right after the new unit file is installed: the file says DDTREE, NEXTN still runs. The run is stopped
    # while Ansible waits (--step) to note the stop time before the health wait's job (which reloads systemd and
    # restarts the unit): the install has ended, the reload and restart never began.
    first = pivot(tmp_path, interrupt_before="specdec.pivot.sglang_service : Note when the old server is stopped")
    assert first.rc != 0
    assert "--speculative-algorithm DDTREE" in lk.sh(lk.INFERENCE, f"cat {lk.UNIT_PATH}")
    assert lk.server_info()["speculative_algorithm"] == "NEXTN"
    backups_after_first = lk.unit_backups()
    # The seed's record (saved before the switch); run in file order, the one the tests above left, unchanged.
    records = lk.files_with_hashes(lk.INFERENCE, f"{lk.STATE_DIR}/units")
    assert len(records) == 2, records  # the seed unit's copy and its description
    if "records" in SEEN:
        assert records == SEEN["records"]

    # sglang_service_bg_wait_s=0: the background waits are polled from their start (a start that ends within the
    # default 10 s needs no poll), so their progress lines can be checked against the tasks' names below.
    again = pivot(tmp_path, "-e", "sglang_service_bg_wait_s=0")
    assert again.rc == 0, again.tail()
    report = again.report()
    plan = report["inference"][0]["plan"]
    assert plan["unit_changes"] is False and plan["needs_restart"] is True  # the file changed earlier
    assert "--speculative-algorithm NEXTN" in plan["pre_pivot_exec_start"]
    svc = report["inference"][0]["service"]
    assert svc["restarted"] is True and svc["downtime_s"] > 0
    assert svc["baseline"]["before"]["server"]["speculative_algorithm"] == "NEXTN"
    assert svc["saved_unit"].startswith(f"{lk.STATE_DIR}/units/")  # what a failure would have restored
    assert lk.server_info()["speculative_algorithm"] == "DDTREE"
    assert_report_figures_agree(again, report)
    # Nothing lost: the seed's record and every backup are still there, unchanged; no new record appeared.
    assert lk.files_with_hashes(lk.INFERENCE, f"{lk.STATE_DIR}/units") == records
    backups = lk.unit_backups()
    assert {k: backups[k] for k in backups_after_first} == backups_after_first

    third = pivot(tmp_path)
    assert third.rc == 0 and third.recap[lk.INFERENCE]["changed"] == 0 and third.recap[lk.TRAINING]["changed"] == 0


def test_rollback_restores_nextn_and_removes_the_plugin(lab, tmp_path) -> None:
    before = lk.state()
    check = rollback(tmp_path, "--check", "--diff")
    assert check.rc == 0, check.tail()
    assert check.recap[lk.INFERENCE]["changed"] > 0
    assert "would uninstall sglang-ddtree" in check.out
    assert "-    --speculative-algorithm DDTREE \\" in check.out
    assert "+    --speculative-algorithm NEXTN \\" in check.out
    assert_unchanged(before, lk.state())

    run = rollback(tmp_path)
    assert run.rc == 0, run.tail()
    host = run.report("rollback-report.json")["hosts"][0]
    assert host["unit_changed"] is True and host["restarted"] is True and host["healthy"] is True
    assert host["plugin"]["action"] == "uninstall" and host["generation_tokens"] > 0
    assert_nextn_serving()
    assert lk.plugin_version() is None
    assert lk.files_with_hashes(lk.INFERENCE, f"{lk.STATE_DIR}/units") == {}, "records archived"
    archived = lk.files_with_hashes(lk.INFERENCE, host["archived_to"])
    assert sum(p.endswith(".pre-pivot") for p in archived) == 1 and sum(p.endswith(".json") for p in archived) == 1
    assert sum("/pip-freeze-before-sglang-ddtree-" in p for p in archived) >= 1, archived
    assert not [p for p in lk.files_with_hashes(lk.INFERENCE, lk.STATE_DIR) if "/pip-freeze-before-" in p
                and "/archive/" not in p], "snapshots archived"

    again = rollback(tmp_path)
    assert again.rc == 0 and again.recap[lk.INFERENCE]["changed"] == 0, again.tail()
    assert again.report("rollback-report.json")["hosts"][0]["nothing_to_do"] is True


def test_interrupted_while_the_new_server_starts_converges(lab, tmp_path) -> None:
    # Starts from: NEXTN, no plugin, training halted. An older plugin version is installed first (by hand, from a
    # wheel kept on the host) so the rollback below must downgrade, not remove.
    old = lk.rewrite_wheel(lk.built_wheel(), tmp_path / "wheels", version="0.0.9")
    lk.sh(lk.INFERENCE, f"mkdir -p {lk.STATE_DIR}/wheels")
    lk.docker("cp", str(old), f"{lk.INFERENCE}:{lk.STATE_DIR}/wheels/{old.name}")
    lk.sh(lk.INFERENCE, f"{lk.VENV_PY} -m pip install -q --no-deps --no-index {lk.STATE_DIR}/wheels/{old.name}")
    assert lk.plugin_version() == "0.0.9"

    # The session is lost (SIGKILL) while the new server starts: at the first poll of the health wait, whose
    # background job restarted the unit first (it goes on, detached; -e sglang_service_bg_wait_s=0: polled at once).
    first = pivot(tmp_path, "-e", "sglang_service_bg_wait_s=0",
                  interrupt_on="waiting [pro6000]: Restart sglang.service (at most 300 s), then wait for /health",
                  interrupt_signal=signal.SIGKILL)
    assert first.rc != 0
    lk.wait_for(lk.healthy, 360, "the new server comes up by itself")  # SGLang's import: up to ~105 s on a loaded CI
    assert lk.server_info()["speculative_algorithm"] == "DDTREE"

    again = pivot(tmp_path)
    assert again.rc == 0, again.tail()
    svc = again.report()["inference"][0]["service"]
    assert svc["restarted"] is False, "the new server already runs the plan: no second restart"
    assert svc["health"]["status"] == 200
    assert lk.plugin_version() == "0.1.0"


def test_rollback_downgrades_the_plugin_to_its_previous_version(lab, tmp_path) -> None:
    run = rollback(tmp_path)
    assert run.rc == 0, run.tail()
    host = run.report("rollback-report.json")["hosts"][0]
    assert host["plugin"]["action"] == "install" and host["plugin"]["wanted"]["version"] == "0.0.9"
    assert lk.plugin_version() == "0.0.9"
    assert_nextn_serving()
    again = rollback(tmp_path)
    assert again.rc == 0 and again.recap[lk.INFERENCE]["changed"] == 0, again.tail()


def test_an_undecided_hook_check_proceeds_and_the_servers_log_says_so(lab, tmp_path) -> None:
    # Starts from: NEXTN, plugin 0.0.9 (the rollback above). It pivots for real, so it runs after every test that
    # starts from NEXTN; the secrets tests below reset the lab first.
    # On this CPU container two hook targets of the plugin do not import (check-sglang: "cannot be decided on this
    # host"): the pivot goes on, the Markdown says so, and after the restart the new server's own log (its journal)
    # says what became of those hooks. The lab's stand-in runs SGLang's load_plugins() (so the plugin's register()
    # and SGLang's HookRegistry log their lines) but no DDTREE worker: its log shows the hooks NOT installed, which a
    # real GPU server's worker would refuse to start with.
    run = pivot(tmp_path)
    assert run.rc == 0, run.tail()
    report = run.report()
    assert report["status"] == "ok"
    ddtree = report["inference"][0]["plan"]["ddtree"]
    assert ddtree["ok"] is True and ddtree["problem"] is None and ddtree["undecided"], ddtree
    undecided = sorted(t for t, on in ddtree["hooks"].items() if not on)
    assert undecided, ddtree["hooks"]
    md = (run.report_dir / "pivot-report.md").read_text()
    assert f"> **Not decided on this host:** {ddtree['undecided']}" in md
    assert "The check failed" not in md
    log = report["inference"][0]["service"]["ddtree_log"]
    assert log["registered"] is True, log
    journal = lk.sh(lk.INFERENCE, f"journalctl -u {lk.UNIT} -o cat --no-pager -n 300")
    for target in undecided:
        # the server's own words, read back here from the journal independently of the pivot
        assert f"sglang-ddtree: hook on {target} not installed (" in journal
        assert log["hooks"][target].startswith("not installed: "), log
        assert (f"> **Preflight could not decide** the hook on `{target}` on this host; the new server's log says: "
                f"**{log['hooks'][target]}**") in md
    for target, on in ddtree["hooks"].items():
        if on:
            assert log["hooks"][target] == "applied", log
            assert f"Applied 1 hook(s) to {target}" in journal
    assert "DDTREE worker: no start-up line (only a real SGLang scheduler writes one)" in md


def test_a_budget_variable_in_the_unit_is_checked_in_preflight_before_anything_stops(lab, tmp_path) -> None:
    # The operator opts in to the per-step budget (issue 24) with Environment=SGLANG_DDTREE_BUDGET=... in the unit
    # (the pivot keeps every Environment line). Preflight's probe runs the plugin's own parser of the variable in the
    # unit's environment, so a value the server would refuse at start stops the pivot there: nothing stopped or
    # changed. (The lab's stand-in itself runs no DDTREE worker, so only preflight can catch it here.)
    env = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "SGLANG_LAB_THREADS": "1",
           "SGLANG_DDTREE_BUDGET": "chain,99"}
    lk.reset("-e", json.dumps({"lab_sglang_environment": env}))
    before = lk.state()
    run = pivot(tmp_path)
    assert run.rc != 0
    out = " ".join(run.out.split())  # the message as printed, folded
    assert ("the new server on pro6000 would refuse to start: SGLANG_DDTREE_BUDGET='chain,99': '99' is not 'chain' "
            "or a budget in 1..16") in out, run.tail()
    assert "Nothing was changed" in out
    assert_unchanged(before, lk.state())
    assert lk.server_info()["speculative_algorithm"] == "NEXTN"
    # A value the server accepts: the pivot goes on, the new unit keeps the line, the report names the candidates.
    env["SGLANG_DDTREE_BUDGET"] = "auto"
    lk.reset("-e", json.dumps({"lab_sglang_environment": env}))
    run = pivot(tmp_path / "auto")
    assert run.rc == 0, run.tail()
    choice = run.report()["inference"][0]["plan"]["budget_choice"]
    assert choice["ok"] is True and choice["value"] == "auto" and choice["candidates"] == [0, 4, 8, 16], choice
    assert "Environment=SGLANG_DDTREE_BUDGET=auto" in lk.sh(lk.INFERENCE, f"cat {lk.UNIT_PATH}")
    md = (run.report_dir / "pivot-report.md").read_text()
    assert "chosen per step by the server among 0, 4, 8, 16 (`SGLANG_DDTREE_BUDGET=auto` in the unit" in md


def test_the_budget_policy_is_written_into_the_same_unit(lab, tmp_path) -> None:
    # sglang_preflight_budget_policy writes Environment=SGLANG_DDTREE_BUDGET=<value> into the unit the pivot
    # re-templates, in place of the unit's own assignment. A drop-in that sets the variable too would win over that
    # line, so preflight refuses it, before anything stops. A second run changes nothing.
    env = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "SGLANG_LAB_THREADS": "1", "SGLANG_DDTREE_BUDGET": "4"}
    lk.reset("-e", json.dumps({"lab_sglang_environment": env}))
    dropin = f"/etc/systemd/system/{lk.UNIT}.d/budget.conf"
    body = "[Service]\\nEnvironment=SGLANG_DDTREE_BUDGET=8\\n"
    lk.sh(lk.INFERENCE, f"mkdir -p {dropin.rsplit('/', 1)[0]} && printf '{body}' > {dropin} && systemctl daemon-reload")
    try:
        before = lk.state()
        run = pivot(tmp_path / "dropin", "-e", "sglang_preflight_budget_policy=auto")
        assert run.rc != 0
        out = " ".join(run.out.split())
        assert (f"but the drop-in {dropin} sets (or drops) SGLANG_DDTREE_BUDGET too and would win over the unit's "
                "line. Remove it there, or leave sglang_preflight_budget_policy empty") in out, run.tail()
        assert_unchanged(before, lk.state())
    finally:
        lk.sh(lk.INFERENCE, f"rm -rf {dropin.rsplit('/', 1)[0]} && systemctl daemon-reload")
    run = pivot(tmp_path / "auto", "-e", "sglang_preflight_budget_policy=auto")
    assert run.rc == 0, run.tail()
    unit = lk.sh(lk.INFERENCE, f"cat {lk.UNIT_PATH}")
    assert "Environment=SGLANG_DDTREE_BUDGET=auto" in unit and "SGLANG_DDTREE_BUDGET=4" not in unit, unit
    assert "Environment=PYTHONUNBUFFERED=1" in unit or "PYTHONUNBUFFERED=1" in unit  # the other variables stay
    plan = run.report()["inference"][0]["plan"]
    assert plan["budget_policy"] == "auto" and plan["budget_choice"]["candidates"] == [0, 4, 8, 16], plan
    md = (run.report_dir / "pivot-report.md").read_text()
    assert "`SGLANG_DDTREE_BUDGET=auto` written into the unit by this pivot (`sglang_preflight_budget_policy`)" in md
    again = pivot(tmp_path / "again", "-e", "sglang_preflight_budget_policy=auto")
    assert again.rc == 0 and again.recap[lk.INFERENCE]["changed"] == 0, again.tail()
    assert lk.sh(lk.INFERENCE, f"cat {lk.UNIT_PATH}") == unit
    # An earlier run that wrote the unit but was stopped before the restart: the unit already says auto, the server
    # still runs with another value (read from its /proc/PID/environ), so the pivot restarts it.
    set_budget = "sed -i 's/SGLANG_DDTREE_BUDGET=[a-z0-9,]*/SGLANG_DDTREE_BUDGET={}/' " + lk.UNIT_PATH
    lk.sh(lk.INFERENCE, f"{set_budget.format(8)} && systemctl daemon-reload && systemctl restart {lk.UNIT}")
    lk.wait_for(lk.healthy, 120, "the server restarted with SGLANG_DDTREE_BUDGET=8")
    lk.sh(lk.INFERENCE, f"{set_budget.format('auto')} && systemctl daemon-reload")
    assert lk.sh(lk.INFERENCE, f"cat {lk.UNIT_PATH}") == unit

    def running_budget() -> str:
        pid = lk.unit_show("MainPID")["MainPID"]
        environ = lk.sh(lk.INFERENCE, f"tr '\\0' '\\n' < /proc/{pid}/environ")
        return next((v.split("=", 1)[1] for v in environ.splitlines() if v.startswith("SGLANG_DDTREE_BUDGET=")), "")

    assert running_budget() == "8"
    resumed = pivot(tmp_path / "resumed", "-e", "sglang_preflight_budget_policy=auto")
    assert resumed.rc == 0, resumed.tail()
    assert resumed.report()["inference"][0]["plan"]["needs_restart"] is True
    assert running_budget() == "auto" and lk.healthy()


# ------------------------------------------------------------------------------------------------ secrets
API_KEY, HF_TOKEN = "lab-secret-api-key-4242", "hf_lab_token_7777"
ADMIN_KEY, DB_PASSWORD = "lab-admin-key-5353", "dbpw-lab-6161"  # --admin-api-key; a password inside DATABASE_URL


class CmdlineSampler(threading.Thread):
    """Every process command line on the controller and in both lab containers, read about once a second while a
    run goes on (any user can read /proc/*/cmdline: a secret there is a secret given away)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.seen: set[str] = set()

    def run(self) -> None:
        while not self.stop.is_set():
            for proc in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    self.seen.add(proc.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                except OSError:
                    pass
            for host in (lk.INFERENCE, lk.TRAINING):
                out = lk.sh(host, "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' <$f; echo; done 2>/dev/null",
                            check=False, timeout=30)
                self.seen.update(out.splitlines())
            self.stop.wait(1.0)


def test_a_unit_with_an_api_key_and_a_token_pivots_and_never_shows_them(lab, tmp_path) -> None:
    # A server started with --api-key and --admin-api-key (its /generate answers 401 without a key, as SGLang's
    # own auth rule says), a token and a database URL with a password in Environment=: health, baseline and
    # comparison authenticate; no secret reaches the console at -vvvv with --diff, the report, the pivot's records
    # (0600), or any process's command line on the controller or the hosts during the run (issue 25).
    env = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "SGLANG_LAB_THREADS": "1", "HF_TOKEN": HF_TOKEN,
           "DATABASE_URL": f"postgres://lab:{DB_PASSWORD}@db.invalid/pivot"}
    lk.reset("-e", json.dumps({"lab_sglang_extra_args": [["--api-key", API_KEY], ["--admin-api-key", ADMIN_KEY]],
                               "lab_sglang_environment": env}))
    unauth = lk.sh(lk.INFERENCE, "python3 -c \"import urllib.request as u; r=u.Request('http://127.0.0.1:30000/generate',"
                   " data=b'{}', method='POST');\ntry: u.urlopen(r)\nexcept Exception as e: print(e)\"", check=False)
    assert "401" in unauth, unauth
    sampler = CmdlineSampler()
    sampler.start()
    try:
        run = pivot(tmp_path, "--diff", "-vvvv")
    finally:
        sampler.stop.set()
        sampler.join(timeout=60)
    assert run.rc == 0, run.tail()
    svc = run.report()["inference"][0]["service"]
    assert svc["health"]["healthy"] is True and svc["baseline"]["before"]["ok"] is True, svc["baseline"]["before"]
    assert svc["baseline"]["comparison"]["agreeing"] == svc["baseline"]["comparison"]["prompts"]
    plan = run.report()["inference"][0]["plan"]
    assert plan["auth"]["api_key"] is True and plan["auth"]["admin_api_key"] is True, plan["auth"]
    assert {"--api-key", "--admin-api-key", "HF_TOKEN", "DATABASE_URL"} <= set(plan["auth"]["secrets"]), plan["auth"]
    assert any("holds a secret" in w for w in plan["warnings"]), plan["warnings"]
    assert not any("without --api-key" in w for w in plan["warnings"])
    assert len(sampler.seen) > 20, "the sampler must have read command lines during the run"
    # The SGLang server itself takes its keys on its command line (the operator's unit says so, old and new):
    # that is the server's own configuration, not something the pivot spawned.
    spawned = [line for line in sampler.seen if "-m sglang_lab_server" not in line]
    assert len(spawned) < len(sampler.seen), "the server's own command line must have been sampled too"
    texts = {"console (-vvvv, --diff)": run.out, "process command lines": "\n".join(spawned)}
    for name in ("pivot-report.json", "pivot-report.md"):
        texts[name] = (run.report_dir / name).read_text()
    for where, text in texts.items():
        for secret in (API_KEY, ADMIN_KEY, HF_TOKEN, DB_PASSWORD):
            assert secret not in text, f"{secret} in the {where}"
    # the new unit still carries every secret (the pivot changes the algorithm, not the server's credentials)
    unit = lk.sh(lk.INFERENCE, f"cat {lk.UNIT_PATH}")
    assert all(secret in unit for secret in (API_KEY, ADMIN_KEY, HF_TOKEN, DB_PASSWORD)), "a secret was lost"
    modes = lk.sh(lk.INFERENCE, f"find {lk.STATE_DIR}/units -type f -exec stat -c '%a %n' {{}} +").split("\n")
    assert modes and all(line.startswith("600 ") for line in modes if line.strip()), modes


def test_values_with_percent_and_dollar_reach_the_server_as_written(lab, tmp_path) -> None:
    # systemd expands %-specifiers and $VAR in ExecStart: a value the pivot writes into the unit is escaped (%%, $$),
    # so the new server's own argv (read from /proc) holds the literal value; the plan shows the words in the unit
    # file's form, which is what systemd reads (issue 25).
    name, escaped = "lab-100%n-$HOME-${USER}", "lab-100%%n-$$HOME-$${USER}"
    run = pivot(tmp_path, "-e", json.dumps({"sglang_preflight_extra_args": ["--served-model-name", name]}))
    assert run.rc == 0, run.tail()
    argv = lk.running_server_argv()
    assert argv[argv.index("--served-model-name") + 1] == name, argv
    plan = run.report()["inference"][0]["plan"]
    assert plan["new_argv"][plan["new_argv"].index("--served-model-name") + 1] == escaped, plan["new_argv"]
    assert escaped in lk.sh(lk.INFERENCE, f"cat {lk.UNIT_PATH}")
