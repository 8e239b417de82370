"""specdec.pivot.training_process run for real: AnsibleModule in a subprocess, real process trees, real signals.

Every tree is started by the test (tests/helpers/fake_training_run.py) with a unique token in every command
line, and every pattern contains that token, so nothing else on the machine can match. Fixtures kill whatever
is left through the handles they hold. Bad-input cases run the module in-process (patch_module_args): they
fail before any process is looked at.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
import yaml
from ansible.module_utils.testing import patch_module_args
from ansible_collections.specdec.pivot.plugins.modules import training_process as tp
from module_runner import COLLECTIONS_ROOT, invoke_module, module_name

ROOT = Path(__file__).resolve().parents[4]
MODULE = module_name("training_process")
COLLECTIONS = str(COLLECTIONS_ROOT)
NVIDIA_SMI_STANDIN = ROOT / "lab" / "stand-ins" / "nvidia-smi"


def _load_helper():
    path = ROOT / "tests" / "helpers" / "fake_training_run.py"
    spec = importlib.util.spec_from_file_location("fake_training_run", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fake_training_run", module)
    spec.loader.exec_module(module)
    return sys.modules["fake_training_run"]


FTR = _load_helper()


def module_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (COLLECTIONS, env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def run_module(args: dict, check: bool = False, diff: bool = False, env: dict | None = None) -> dict:
    """Run the module as Ansible would (a separate process, args as JSON on stdin); return its JSON result."""
    return invoke_module("training_process", args, module_env(env), check_mode=check, diff=diff)


def warnings_text(result: dict) -> str:
    return json.dumps(result.get("warnings", []))


@pytest.fixture
def fake_run(tmp_path):
    """Factory for fake training trees; each gets its own token; all are cleaned up."""
    runs = []

    def _start(**kwargs):
        token = f"tpmod{uuid.uuid4().hex[:12]}"
        run = FTR.start(tmp_path / token, token, **kwargs)
        runs.append(run)
        return run

    yield _start
    for run in runs:
        run.cleanup()


def worker_pattern(run) -> str:
    return rf"fake_training_run\.py worker --token {run.token}\b"


def still_ours(pid: int, token: str) -> bool:
    """Whether ``pid`` is still a running (non-zombie) process of the fake run with ``token``."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and token in " ".join(proc.cmdline())
    except psutil.NoSuchProcess:
        return False


def signals(result: dict, name: str) -> list:
    return sorted(s["pid"] for s in result["signals_sent"] if s["signal"] == name)


def got_first_signal(result: dict) -> list:
    """Pids the first signal was sent to, or found already gone when their turn came (a launcher that
    forwards SIGTERM can finish a worker before the module reaches it)."""
    skipped = [
        s["pid"] for s in result["signals_skipped"] if s["signal"] == "SIGTERM" and s["reason"] in ("gone", "zombie")
    ]
    return sorted(signals(result, "SIGTERM") + skipped)


# ------------------------------------------------------------------------------------------ documentation


def test_documentation_matches_argument_spec():
    doc = yaml.safe_load(tp.DOCUMENTATION)
    assert doc["module"] == "training_process"
    assert set(doc["options"]) == set(tp.ARGUMENT_SPEC)
    for name, spec in tp.ARGUMENT_SPEC.items():
        option = doc["options"][name]
        assert option["type"] == spec["type"], name
        assert option.get("default") == spec.get("default"), name
        assert option.get("choices") == spec.get("choices"), name
        assert option.get("aliases") == spec.get("aliases"), name
    assert doc["attributes"]["check_mode"]["support"] == "full"
    returns = yaml.safe_load(tp.RETURN)
    for key in (
        "msg",
        "found",
        "pids",
        "processes",
        "signals_sent",
        "escalated",
        "survivors",
        "elapsed_s",
        "signalled_at",
        "ended_at",
        "log",
        "checkpoint",
        "gpu",
        "excluded",
    ):
        assert key in returns, key
    yaml.safe_load(tp.EXAMPLES)


# ------------------------------------------------------------------------------------------ state=present


def test_present_reports_the_whole_tree_and_touches_nothing(fake_run):
    run = fake_run(nproc=3)
    args = {"pattern": worker_pattern(run), "log_path": run.log_path, "checkpoint_dir": run.checkpoint_dir}
    result = run_module(args)
    assert result["changed"] is False
    assert result["found"] is True
    assert result["pids"] == run.pids  # launcher first, then the workers
    roles = {p["pid"]: p["role"] for p in result["processes"]}
    assert roles == {run.launcher_pid: "launcher", **{w: "root" for w in run.worker_pids}}
    assert result["matched_pids"] == run.worker_pids
    assert result["signals_sent"] == []
    assert all(run.token in p["cmdline"] for p in result["processes"])
    assert sorted(run.running()) == sorted(run.pids)
    log = result["log"]
    assert isinstance(log["last_step"], int)
    assert log["line"] == FTR.log_line(log["last_step"])
    assert log["throughput_tok_s"] == FTR.THROUGHPUT_VALUE
    assert log["loss"] == pytest.approx(FTR.loss_at(log["last_step"]))
    assert log["tail"][-1].startswith("step ")
    # no checkpoint written yet: the directory does not exist -> a warning, not a failure
    assert result["checkpoint"]["path"] is None and result["checkpoint"]["error"]
    assert "checkpoint_dir=" in warnings_text(result)
    assert result["gpu"]["checked"] is False


def test_pid_option_brings_launcher_and_siblings(fake_run):
    run = fake_run(nproc=3)
    target = run.worker_pids[1]
    result = run_module({"pid": target})
    assert result["pids"] == run.pids
    roles = {p["pid"]: p["role"] for p in result["processes"]}
    assert roles[run.launcher_pid] == "launcher"
    assert roles[target] == "root"
    assert [roles[w] for w in run.worker_pids if w != target] == ["child", "child"]


def test_parent_that_is_not_a_launcher_is_left_out(fake_run):
    run = fake_run(nproc=2, launcher="supervisor")
    result = run_module({"pattern": worker_pattern(run), "state": "absent", "kill_after": 5, "timeout": 30})
    assert result["pids"] == run.worker_pids
    assert run.launcher_pid not in {s["pid"] for s in result["signals_sent"]}
    assert signals(result, "SIGTERM") == sorted(run.worker_pids)
    assert not set(run.worker_pids) & set(run.running())


# ------------------------------------------------------------------------------------------- state=absent


def test_halt_escalates_records_signals_reports_checkpoint_and_is_idempotent(fake_run):
    # rank 1 ignores SIGTERM (needs SIGKILL); rank 2 writes a checkpoint on SIGTERM and exits
    run = fake_run(nproc=3, ignore_term=(1,), checkpoint_rank=2)
    args = {
        "pattern": run.token,
        "state": "absent",
        "kill_after": 2.0,  # ample for the 0.1 s checkpoint save, so only the SIGTERM-ignoring worker escalates
        "timeout": 30,
        "log_path": run.log_path,
        "checkpoint_dir": run.checkpoint_dir,
    }
    result = run_module(args, diff=True)
    assert result["changed"] is True
    assert result.get("failed") is not True, result["msg"]
    assert run.running() == []  # every process of the run is gone (a zombie counts as gone)
    assert result["pids"] == run.pids
    assert result["survivors"] == []
    assert got_first_signal(result) == sorted(run.pids)  # everyone got the first signal
    assert result["signals_sent"][0] == {"pid": run.launcher_pid, "signal": "SIGTERM"}  # top-down
    assert result["escalated"] is True
    # the SIGTERM-ignoring worker needed SIGKILL; the polite and the checkpointing workers did not
    assert run.worker_pids[1] in signals(result, "SIGKILL")
    assert run.worker_pids[0] not in signals(result, "SIGKILL")
    assert run.worker_pids[2] not in signals(result, "SIGKILL")
    assert isinstance(result["elapsed_s"], float)
    # The halt's two times (host clock) are its own endpoints: elapsed_s apart, the escalation's 2 s within them.
    signalled, ended = (datetime.datetime.strptime(result[k], "%Y-%m-%dT%H:%M:%S.%fZ")
                        for k in ("signalled_at", "ended_at"))
    assert abs((ended - signalled).total_seconds() - result["elapsed_s"]) < 0.002
    assert result["elapsed_s"] >= 2.0
    assert result["diff"]["before"] == {"running_pids": run.pids}
    assert result["diff"]["after"] == {"running_pids": []}
    assert "escalated to SIGKILL" in result["msg"]
    # the checkpoint written on SIGTERM is the one reported
    saved = sorted(Path(run.checkpoint_dir).glob("checkpoint-*/state.json"))
    assert len(saved) == 1
    step = json.loads(saved[0].read_text())["step"]
    assert result["checkpoint"]["name"] == f"checkpoint-{step}"
    assert result["checkpoint"]["step"] == step
    assert result["checkpoint"]["count"] == 1
    # the log is read after the halt: its last step line is the newest in the file
    last_step_line = [ln for ln in Path(run.log_path).read_text().splitlines() if ln.startswith("step ")][-1]
    assert result["log"]["line"] == last_step_line
    assert result["log"]["last_step"] == int(last_step_line.split()[1])

    again = run_module(args, diff=True)
    assert again["changed"] is False
    assert again["found"] is False
    assert again["signals_sent"] == [] and again["pids"] == []
    assert "already stopped" in again["msg"]
    assert again["checkpoint"]["name"] == f"checkpoint-{step}"  # still reported when nothing runs
    assert again["log"]["last_step"] == result["log"]["last_step"]


def test_settle_looks_again_and_reports_a_run_that_came_back(fake_run, tmp_path):
    # settle: after the halt, the module waits and looks again with the same match (what the role's second look
    # did as two more tasks): nothing back here, then a run restarted meanwhile (a supervisor) is reported, not
    # signalled.
    run = fake_run(nproc=2)
    quiet = run_module({"pattern": run.token, "state": "absent", "timeout": 30, "kill_after": 5, "settle": 0.3})
    assert quiet.get("failed") is not True, quiet["msg"]
    assert run.running() == [] and quiet["came_back"] == {"settle_s": 0.3, "pids": [], "processes": []}

    first = fake_run(nproc=2)
    restarted: list = []

    def supervisor() -> None:  # starts the same run again once the first is gone
        deadline = time.monotonic() + 30
        while first.running() and time.monotonic() < deadline:
            time.sleep(0.02)
        restarted.append(FTR.start(tmp_path / "again", first.token, nproc=2))

    thread = threading.Thread(target=supervisor)
    thread.start()
    try:
        back = run_module({"pattern": first.token, "state": "absent", "timeout": 30, "kill_after": 5, "settle": 3})
        thread.join()
        assert back.get("failed") is not True, back["msg"]
        assert sorted(back["came_back"]["pids"]) == sorted(restarted[0].pids), (back["came_back"], restarted)
        assert all(still_ours(pid, first.token) for pid in restarted[0].pids), "came_back is reported, not halted"
        assert back["pids"] == first.pids and back["changed"] is True
    finally:
        thread.join()
        for again in restarted:
            again.cleanup()
    # nothing halted: no second look
    none = run_module({"pattern": f"{first.token}-nothing", "state": "absent", "settle": 5})
    assert none["came_back"] is None and none["changed"] is False


def test_check_mode_signals_nothing(fake_run):
    run = fake_run(nproc=2)
    result = run_module({"pattern": run.token, "state": "absent"}, check=True, diff=True)
    assert result["changed"] is True
    assert result["pids"] == run.pids
    assert result["signals_sent"] == []
    assert result["msg"].startswith("would halt 3 processes")
    header = f"training run (pattern '{run.token}')"
    assert result["diff"] == {
        "before": {"running_pids": run.pids},
        "after": {"running_pids": []},
        "before_header": header,
        "after_header": header,
    }
    assert sorted(run.running()) == sorted(run.pids)
    for handle in run.handles:
        assert handle.status() != psutil.STATUS_ZOMBIE


def test_launcher_that_exits_at_once_still_has_every_worker_halted(fake_run):
    run = fake_run(nproc=2, launcher_term="exit")  # the launcher dies on SIGTERM and orphans its workers
    result = run_module({"pattern": run.token, "state": "absent", "kill_after": 10, "timeout": 30})
    assert result["escalated"] is False
    assert got_first_signal(result) == sorted(run.pids)
    assert run.running() == []


def test_restarted_worker_joins_the_tree_and_is_halted(fake_run):
    # the launcher ignores SIGTERM and restarts a worker that died (an elastic agent racing the halt)
    run = fake_run(nproc=2, launcher_term="restart", max_restarts=1)
    # kill_after leaves the launcher time to restart; the restarted worker is found and signalled meanwhile
    result = run_module({"pattern": run.token, "state": "absent", "kill_after": 3, "timeout": 30})
    assert result.get("failed") is not True, result["msg"]
    assert len(result["late_pids"]) == 1
    late = result["late_pids"][0]
    assert late not in run.pids
    assert late in result["pids"]
    assert late in {s["pid"] for s in result["signals_sent"]}
    assert not still_ours(late, run.token)
    # The launcher ignores SIGTERM. SIGKILL ends it, or it exits by itself once its restarted worker died of SIGTERM
    # (which the worker ignores until its interpreter resets the disposition it inherits): a race, so only the
    # outcome is asserted, nothing of the run left (the escalation itself: test_halt_escalates_records_signals_...).
    assert run.launcher_pid in got_first_signal(result)
    assert run.running() == []


def test_escalate_false_fails_and_names_the_survivors(fake_run):
    run = fake_run(nproc=2, ignore_term=(0,))
    result = run_module({"pattern": worker_pattern(run), "state": "absent", "escalate": False, "timeout": 1})
    assert result["failed"] is True
    # the SIGTERM-ignoring worker, and the launcher that waits for it, are still there
    assert sorted(result["survivors"]) == sorted([run.launcher_pid, run.worker_pids[0]])
    assert "escalate=false, so no SIGKILL was sent" in result["msg"]
    assert all(str(pid) in result["msg"] for pid in result["survivors"])
    assert signals(result, "SIGKILL") == []
    assert sorted(run.running()) == sorted(result["survivors"])


def test_max_processes_refuses_a_wide_match_and_signals_nothing(fake_run):
    run = fake_run(nproc=3)
    result = run_module({"pattern": run.token, "state": "absent", "max_processes": 2})
    assert result["failed"] is True
    assert "selects 4 processes" in result["msg"] and "max_processes=2" in result["msg"]
    assert "Nothing was signalled" in result["msg"]
    assert result["pids"] == run.pids
    assert sorted(run.running()) == sorted(run.pids)
    # a query of the same tree only warns
    query = run_module({"pattern": run.token, "max_processes": 2})
    assert query.get("failed") is not True
    assert "max_processes=2" in warnings_text(query)


def test_user_filter(fake_run):
    run = fake_run(nproc=1)
    me = psutil.Process().username()
    other = "nobody" if me != "nobody" else "root"
    mine = run_module({"pattern": run.token, "user": me})
    assert mine["pids"] == run.pids
    theirs = run_module({"pattern": run.token, "user": other, "state": "absent"})
    assert theirs["changed"] is False and theirs["pids"] == []
    assert {e["pid"] for e in theirs["excluded"]} == set(run.pids)
    assert all(f"not by user {other}" in e["reason"] for e in theirs["excluded"])
    assert sorted(run.running()) == sorted(run.pids)


# ------------------------------------------------------------------------------------------ pid handling


def test_pid_create_time_mismatch_means_reused_pid_and_nothing_is_signalled(fake_run):
    run = fake_run(nproc=1)
    real = psutil.Process(run.worker_pids[0]).create_time()
    result = run_module({"pid": run.worker_pids[0], "pid_create_time": real - 100, "state": "absent"})
    assert result["changed"] is False and result["found"] is False
    assert result["signals_sent"] == []
    assert "reused" in warnings_text(result)
    assert sorted(run.running()) == sorted(run.pids)
    # with the right start time the same call halts it
    exact = run_module(
        {"pid": run.worker_pids[0], "pid_create_time": real, "state": "absent", "kill_after": 5, "timeout": 30}
    )
    assert exact["changed"] is True
    assert run.running() == []


def test_pid_that_does_not_exist_is_already_stopped():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    started = psutil.Process(proc.pid).create_time()
    proc.stdin.close()
    proc.wait()  # reaped: the pid is free (and not ours any more)
    query = run_module({"pid": proc.pid})
    assert query["found"] is False and query["pids"] == []
    # pid_create_time guarantees that, should the pid be reused meanwhile, the new holder is not signalled
    halt = run_module({"pid": proc.pid, "pid_create_time": started, "state": "absent"})
    assert halt["changed"] is False and halt["signals_sent"] == []
    assert "no running process matches pid" in halt["msg"] and "already stopped" in halt["msg"]


@pytest.mark.parametrize("which", ["init", "pytest"])
def test_protected_pid_is_refused(which):
    pid = 1 if which == "init" else os.getpid()  # pytest is an ancestor of the module's process
    result = run_module({"pid": pid, "state": "absent"}, check=True)
    assert result["failed"] is True
    assert f"pid={pid}" in result["msg"]
    assert ("PID 1 (init)" if which == "init" else "an ancestor of the module's process") in result["msg"]
    assert "give the pid of the training process" in result["msg"]


# ---------------------------------------------------------------------------------- never ourselves


def test_a_pattern_matching_its_own_process_or_ancestors_is_refused(fake_run, tmp_path):
    """A wrapper (ancestor) and the module itself both match the pattern: the pattern does not stand for one
    training run (issue 25: it would match the controller's own processes), so nothing at all is signalled."""
    run = fake_run(nproc=2)
    args_file = tmp_path / f"{run.token}-args.json"  # puts the token into the module's own command line
    args_file.write_text(
        json.dumps({"ANSIBLE_MODULE_ARGS": {"pattern": run.token, "state": "absent", "kill_after": 10, "timeout": 30}})
    )
    wrapper_code = (
        "import subprocess, sys\n"
        f"argv = [sys.executable, '-m', {MODULE!r}, {str(args_file)!r}]\n"
        "out = subprocess.run(argv, capture_output=True, text=True)\n"
        "sys.stdout.write(out.stdout)\n"
    )
    wrapper = subprocess.run(
        [sys.executable, "-c", wrapper_code, run.token],
        check=False,
        capture_output=True,
        text=True,
        env=module_env(),
        timeout=120,
    )
    assert wrapper.returncode == 0, wrapper.stderr  # the wrapper was not signalled
    result = json.loads(wrapper.stdout)
    assert result["failed"] is True and result["changed"] is False
    assert "an ancestor of the module's process" in result["msg"] or "the module's own process" in result["msg"]
    assert "Use script" in result["msg"] and "Nothing was signalled" in result["msg"]
    assert sorted(run.running()) == sorted(run.pids)  # the fake run still runs


def test_pattern_matching_the_pytest_command_line_is_refused():
    me = psutil.Process()
    pattern = re.escape(" ".join(me.cmdline()))
    result = run_module({"pattern": pattern, "state": "present"})
    assert result["failed"] is True
    assert "which is an ancestor of the module's process" in result["msg"], result["msg"]  # pytest (or its parent)
    assert "signals_sent" not in result


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start the module as another (unprivileged) user")
def test_unprivileged_module_refuses_before_signalling_anything(fake_run):
    """The module, running as nobody, may not signal our (root's) tree: it must fail before sending anything."""
    run = fake_run(nproc=1)
    dropper = (
        "import os, sys\n"
        f"from {MODULE.rsplit('.', 1)[0]} import training_process as tp\n"
        "import ansible.module_utils.basic as basic\n"
        "import ansible.module_utils._internal._json._profiles._module_legacy_m2c\n"
        "import ansible.module_utils._internal._json._profiles._module_legacy_c2m\n"
        "import encodings.idna, locale, tempfile, shlex, platform, grp, pwd, syslog\n"  # imports needed after setuid
        "data = sys.stdin.buffer.read()\n"
        "os.chdir('/')\n"
        "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
        "basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE = data, 'legacy'\n"
        "tp.main()\n"
    )
    payload = json.dumps({"ANSIBLE_MODULE_ARGS": {"pattern": run.token, "state": "absent"}})
    proc = subprocess.run(
        [sys.executable, "-c", dropper],
        check=False,
        input=payload,
        capture_output=True,
        text=True,
        env=module_env(),
        timeout=120,
    )
    result = json.loads(proc.stdout)
    assert result["failed"] is True, result
    assert "not allowed to signal pids" in result["msg"] and "become: true" in result["msg"]
    assert result["signals_sent"] == []
    assert sorted(run.running()) == sorted(run.pids)


def test_present_says_which_pids_this_user_may_not_signal(fake_run):
    """Issue 16, point 5: a query (state=present) as an unprivileged user lists the pids it could not signal, so
    preflight fails before anything changes; as the owner, none. No signal is sent either way."""
    run = fake_run(nproc=1)
    dropper = (
        "import os, sys\n"
        f"from {MODULE.rsplit('.', 1)[0]} import training_process as tp\n"
        "import ansible.module_utils.basic as basic\n"
        "import ansible.module_utils._internal._json._profiles._module_legacy_m2c\n"
        "import ansible.module_utils._internal._json._profiles._module_legacy_c2m\n"
        "import encodings.idna, locale, tempfile, shlex, platform, grp, pwd, syslog\n"
        "data = sys.stdin.buffer.read()\n"
        "os.chdir('/')\n"
        "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
        "basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE = data, 'legacy'\n"
        "tp.main()\n"
    )
    payload = json.dumps({"ANSIBLE_MODULE_ARGS": {"pattern": run.token, "state": "present"}})
    proc = subprocess.run(
        [sys.executable, "-c", dropper],
        check=False,
        input=payload,
        capture_output=True,
        text=True,
        env=module_env(),
        timeout=120,
    )
    as_nobody = json.loads(proc.stdout)
    assert not as_nobody.get("failed"), as_nobody
    assert sorted(as_nobody["signal_denied"]) == sorted(run.pids)
    as_owner = run_module({"pattern": run.token, "state": "present"})
    assert as_owner["signal_denied"] == [] and as_owner["pids"] == run.pids
    assert sorted(run.running()) == sorted(run.pids)


# ------------------------------------------------------------------------------------------ GPU release


def standin_env(tmp_path, apps_pids: list, mode: str = "replay") -> dict:
    """A recording for lab/stand-ins/nvidia-smi (a STAND-IN that replays files; there is no GPU here)."""
    rec = tmp_path / "nvidia-smi-recording"
    rec.mkdir(exist_ok=True)
    uuid_ = "GPU-00000000-1111-2222-3333-444444444444"
    (rec / "query-gpu.out").write_text(
        "#fixture: written by test_training_process.py for the nvidia-smi stand-in (invented values, no GPU)\n"
        f"0, {uuid_}, NVIDIA H200, 143771, 70000, 73771, 0\n"
    )
    (rec / "query-compute-apps.out").write_text(
        "#fixture: written by test_training_process.py for the nvidia-smi stand-in (invented values, no GPU)\n"
        + "".join(f"{uuid_}, {pid}, python3, 69990\n" for pid in apps_pids)
    )
    return {"NVIDIA_SMI_STANDIN_DIR": str(rec), "NVIDIA_SMI_STANDIN_MODE": mode, "NVIDIA_SMI_STANDIN_HANG_S": "30"}


def gpu_args(run, **extra) -> dict:
    return {
        "pattern": run.token,
        "state": "absent",
        "kill_after": 10,
        "timeout": 30,
        "wait_gpu_release": True,
        "nvidia_smi": str(NVIDIA_SMI_STANDIN),
        "gpu_backend": "nvidia-smi",
        **extra,
    }


def test_gpu_release_confirmed_when_no_halted_pid_is_listed(fake_run, tmp_path):
    run = fake_run(nproc=1)
    result = run_module(gpu_args(run), env=standin_env(tmp_path, [1]))  # only an unrelated pid holds the GPU
    assert result.get("failed") is not True, result["msg"]
    assert result["gpu"]["checked"] is True
    assert result["gpu"]["released"] is True
    assert result["gpu"]["gpu_count"] == 1
    assert result["gpu"]["still_on_gpu"] == []


def test_gpu_still_holding_a_halted_pid_fails(fake_run, tmp_path):
    run = fake_run(nproc=1)
    env = standin_env(tmp_path, [run.worker_pids[0]])  # the driver keeps listing the (dead) worker
    result = run_module(gpu_args(run, gpu_release_timeout=0.5), env=env)
    assert result["failed"] is True
    assert run.running() == []  # the halt itself worked
    assert result["gpu"]["released"] is False
    assert [s["pid"] for s in result["gpu"]["still_on_gpu"]] == [run.worker_pids[0]]
    assert f"{run.worker_pids[0]} on GPU 0" in result["msg"]


@pytest.mark.parametrize(
    ("mode", "failed", "expect"),
    [
        ("no-devices", False, "no_devices"),
        ("driver-mismatch", True, "driver_mismatch"),
        ("hang", True, "timeout"),
    ],
)
def test_gpu_check_failure_modes(fake_run, tmp_path, mode, failed, expect):
    run = fake_run(nproc=1)
    # a short query timeout only where the stand-in hangs: a loaded machine may need more for a normal answer
    timeout = 0.5 if mode == "hang" else 15
    result = run_module(gpu_args(run, gpu_query_timeout=timeout), env=standin_env(tmp_path, [], mode=mode))
    assert run.running() == []
    assert bool(result.get("failed")) is failed, result["msg"]
    if failed:
        assert result["gpu"]["error_kind"] == expect
        assert "GPU-release check failed" in result["msg"]
        if mode == "hang":
            assert "did not answer within" in result["msg"]
    else:
        assert result["gpu"]["checked"] is False
        assert expect in result["gpu"]["skipped_reason"]


def test_no_nvidia_smi_at_all_is_skipped_with_the_reason(fake_run, tmp_path):
    run = fake_run(nproc=1)
    result = run_module(gpu_args(run, nvidia_smi=str(tmp_path / "no-such-nvidia-smi")))
    assert result.get("failed") is not True
    assert result["gpu"]["checked"] is False
    assert "no NVIDIA GPU" in result["gpu"]["skipped_reason"]


def test_gpu_check_is_skipped_when_nothing_was_halted(tmp_path):
    token = f"tpmod{uuid.uuid4().hex[:12]}"
    result = run_module(
        {"pattern": token, "state": "absent", "wait_gpu_release": True, "nvidia_smi": str(NVIDIA_SMI_STANDIN)},
        env=standin_env(tmp_path, [], mode="hang"),
    )
    assert result["changed"] is False
    assert result["gpu"]["skipped_reason"] == "nothing was halted"


# ------------------------------------------------------------------------------------------- bad input


def run_inprocess(args: dict, capsys) -> dict:
    with patch_module_args(args), pytest.raises(SystemExit):
        tp.main()
    return json.loads(capsys.readouterr().out)


BAD_INPUT = [
    ({"pattern": "train("}, "pattern='train(' is not a valid Python regular expression"),
    ({"pattern": ""}, "pattern is empty"),
    ({"pattern": "x", "pid": 5}, "mutually exclusive: script|pattern|pid"),
    ({}, "one of the following is required: script, pattern, pid"),
    ({"pid": 0}, "pid=0 is not a process id"),
    (
        {"pid": 5, "pid_create_time": 1.0, "state": "absent", "timeout": 5, "kill_after": 10},
        "kill_after=10.0 must be less than timeout=5.0",
    ),
    ({"pattern": "x", "pid_create_time": 5.0}, "pid_create_time"),
    ({"pattern": "x", "step_regex": r"step \d+"}, "step_regex='step \\\\d+' has no capture group"),
    ({"pattern": "x", "loss_regex": "loss ([0-9"}, "loss_regex="),
    ({"pattern": "x", "launcher_regex": "(("}, "launcher_regex='((' is not a valid"),
    ({"pattern": "x", "signal": "SIGSTOP"}, "value of signal must be one of"),
    ({"pattern": "x", "gpu_backend": "cuda"}, "value of gpu_backend must be one of"),
    ({"pattern": "x", "log_lines": 0}, "log_lines=0 must be between 1 and 10000"),
    ({"pattern": "x", "max_processes": 0}, "max_processes=0 must be >= 1"),
    ({"pattern": "x", "timeout": 0}, "timeout=0.0 must be > 0"),
    ({"pattern": "x", "kill_after": -1}, "kill_after=-1.0 must be >= 0"),
    ({"pattern": "x", "gpu_release_timeout": 0}, "gpu_release_timeout=0.0 must be > 0"),
    ({"pattern": "x", "gpu_query_timeout": -2}, "gpu_query_timeout=-2.0 must be > 0"),
    ({"pattern": "x", "user": " "}, "user is empty"),
    ({"pattern": "x", "checkpoint_glob": ""}, "checkpoint_glob is empty"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUT, ids=[case[1][:40] for case in BAD_INPUT])
def test_bad_input_names_the_option_value_and_fix(args, message, capsys):
    result = run_inprocess(args, capsys)
    assert result["failed"] is True
    assert message in result["msg"], result["msg"]


def test_kill_after_may_exceed_timeout_when_not_escalating_or_querying(capsys):
    token = f"tpmod{uuid.uuid4().hex[:12]}"
    for args in (
        {"pattern": token, "kill_after": 500},
        {"pattern": token, "state": "absent", "kill_after": 500, "escalate": False},
        {"pattern": token, "state": "absent", "kill_after": 500, "signal": "SIGKILL"},
    ):
        result = run_inprocess(args, capsys)
        assert result.get("failed") is not True, result
        assert result["found"] is False


def test_unreadable_log_is_a_warning_not_a_failure(tmp_path):
    # a subprocess: in-process, warnings go to the controller's display once controller code was imported
    token = f"tpmod{uuid.uuid4().hex[:12]}"
    result = run_module({"pattern": token, "log_path": str(tmp_path / "missing.log")})
    assert result.get("failed") is not True
    assert result["log"]["error"] and result["log"]["tail"] == []
    assert "log_path=" in warnings_text(result) and "could not be read" in warnings_text(result)


def test_psutil_missing_is_reported_with_missing_required_lib(monkeypatch, capsys):
    monkeypatch.setattr(tp._procs, "HAS_PSUTIL", False)
    monkeypatch.setattr(tp._procs, "PSUTIL_IMPORT_ERROR", ImportError("No module named 'psutil'"))
    result = run_inprocess({"pattern": "x"}, capsys)
    assert result["failed"] is True
    assert "Failed to import the required Python library (psutil)" in result["msg"]


def test_signal_choices_are_real_signals():
    for name in tp.ARGUMENT_SPEC["signal"]["choices"]:
        assert isinstance(getattr(signal, name), signal.Signals)


CUDA_HOLDER = """
import sys, time, torch
if not torch.cuda.is_available():
    sys.stdout.write('no-cuda\\n'); sys.stdout.flush(); sys.exit(0)
block = torch.ones(1 << 26, device='cuda')  # 256 MiB, so the driver lists this pid as a compute process
torch.cuda.synchronize()
sys.stdout.write('ready\\n'); sys.stdout.flush()
while True:
    time.sleep(1)
"""


@pytest.mark.skipif(
    shutil.which("nvidia-smi") is None or importlib.util.find_spec("torch") is None,
    reason="needs an NVIDIA GPU (nvidia-smi) and torch: run on the GPU host",
)
def test_gpu_release_with_a_real_cuda_process(tmp_path):
    """On a GPU host: a real process holding CUDA memory is halted and the GPU is seen to release it."""
    from ansible.module_utils.basic import AnsibleModule
    from ansible_collections.specdec.pivot.plugins.module_utils import _nvidia

    with patch_module_args({}):
        module = AnsibleModule(argument_spec={})  # read_gpus runs nvidia-smi through its run_command
    token = f"tpmod{uuid.uuid4().hex[:12]}"
    holder = subprocess.Popen([sys.executable, "-c", CUDA_HOLDER, token], stdout=subprocess.PIPE, text=True)
    try:
        first = holder.stdout.readline().strip()
        if first == "no-cuda":
            pytest.skip("torch sees no CUDA device")
        assert first == "ready"
        listed = _procs_on_gpu(_nvidia.read_gpus(module), holder.pid)
        if not listed:
            pytest.skip("the driver does not list this pid (a container with its own pid namespace)")
        result = run_module(
            {
                "pattern": token,
                "state": "absent",
                "kill_after": 20,
                "timeout": 60,
                "wait_gpu_release": True,
                "gpu_release_timeout": 60,
            }
        )
        assert result.get("failed") is not True, result["msg"]
        assert result["pids"] == [holder.pid]
        assert result["gpu"]["checked"] is True and result["gpu"]["released"] is True
        assert not _procs_on_gpu(_nvidia.read_gpus(module), holder.pid)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()


def _procs_on_gpu(gpus: list, pid: int) -> list:
    return [p for g in gpus for p in g["compute_processes"] if p["pid"] == pid]
