"""Issue 16, point 1: only what EXECUTES the training script is the run, never what merely names it.

Real processes: a fake training tree (launcher + workers) running a copy of the helper named
``train_<token>.py``, and beside it real look-alikes whose argv names that script - ``tail -f``, ``grep``,
``python3 -c``, ``python3 other.py``, a ``bash -c`` wrapper, and pagers/editors/``watch``/an ``ssh`` client
(argv shaped with bash's ``exec -a`` around ``tail -F``, because the real ``less``/``vim``/``watch`` need a
terminal and an ``ssh`` client needs a server). Only processes this test started are ever signalled.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
import uuid

import psutil
import pytest
from test_training_process import FTR, run_module, warnings_text

SLEEPER = "import time, sys\nwhile True:\n    time.sleep(1)\n"


def _wait_argv(proc: subprocess.Popen, needle: str, timeout: float = 10.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            argv = psutil.Process(proc.pid).cmdline()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            argv = []
        if any(needle in a for a in argv):
            return argv
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    raise AssertionError(f"look-alike {proc.args!r} did not start (rc={proc.poll()})")


def _exec_as(name: str, *args: str) -> list:
    """argv ``name args...`` on a real, long-lived process (``tail -F`` under ``exec -a``)."""
    return ["bash", "-c", f"exec -a {shlex.quote(name)} tail -F " + " ".join(shlex.quote(a) for a in args)]


@pytest.fixture
def run_and_lookalikes(tmp_path):
    token = f"tplook{uuid.uuid4().hex[:10]}"
    script = tmp_path / "train" / f"train_{token}.py"
    run = FTR.start(tmp_path / token, token, nproc=2, script=script)
    other = tmp_path / "inspect_ckpt.py"
    other.write_text(SLEEPER)
    specs = {
        "tail -f": ["tail", "-f", str(script)],
        "grep": ["grep", "-F", script.name],  # blocks on its stdin pipe
        "python -c": [sys.executable, "-c", SLEEPER, str(script)],
        "python other.py": [sys.executable, str(other), str(script)],
        "bash -c wrapper": ["bash", "-c", f"sleep 300; : {script}"],
        "less": _exec_as("less", str(script)),
        "vim": _exec_as("vim", str(script)),
        "view": _exec_as("view", str(script)),
        "watch": _exec_as("watch", "-n1", f"grep {script.name}"),
        "ssh": _exec_as("ssh", "ct200", "python3", str(script)),
    }
    procs = {}
    try:
        for label, argv in specs.items():
            procs[label] = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        lookalikes = {label: proc.pid for label, proc in procs.items()}
        for proc in procs.values():
            _wait_argv(proc, script.name)
        yield run, script, lookalikes, procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        run.cleanup()


def _alive(procs: dict) -> dict:
    return {label: proc.poll() is None for label, proc in procs.items()}


@pytest.mark.parametrize("form", ["name", "path"])
def test_script_finds_only_the_run_never_a_lookalike(run_and_lookalikes, form):
    run, script, lookalikes, _procs = run_and_lookalikes
    value = script.name if form == "name" else str(script)
    result = run_module({"script": value})
    assert result["pids"] == run.pids
    assert sorted(result["matched_pids"]) == sorted(run.pids)  # launcher and workers execute it
    assert not set(lookalikes.values()) & set(result["pids"] + result["matched_pids"])
    assert "expert option" not in warnings_text(result)


def test_check_mode_lists_exactly_what_would_be_signalled(run_and_lookalikes):
    run, script, _lookalikes, procs = run_and_lookalikes
    result = run_module({"script": script.name, "state": "absent"}, check=True, diff=True)
    assert result["changed"] is True
    assert result["msg"].startswith(f"would halt {len(run.pids)} processes (pids ")
    assert result["pids"] == run.pids
    assert [p["pid"] for p in result["processes"]] == run.pids
    assert result["diff"]["before"] == {"running_pids": run.pids}
    assert result["signals_sent"] == []
    assert sorted(run.running()) == sorted(run.pids)
    assert all(_alive(procs).values())


def test_halt_stops_the_run_and_every_lookalike_keeps_running(run_and_lookalikes):
    run, script, _lookalikes, procs = run_and_lookalikes
    result = run_module({"script": script.name, "state": "absent", "kill_after": 5, "timeout": 30})
    assert result.get("failed") is not True, result["msg"]
    signalled = {s["pid"] for s in result["signals_sent"]}
    assert run.launcher_pid in signalled and signalled <= set(run.pids)
    assert run.running() == []
    time.sleep(0.2)
    assert _alive(procs) == {label: True for label in procs}
    again = run_module({"script": script.name, "state": "absent"})
    assert again["changed"] is False and again["found"] is False


def test_raw_pattern_is_an_expert_option_with_a_warning_and_skips_pagers_editors_grep_ssh(run_and_lookalikes):
    run, script, lookalikes, procs = run_and_lookalikes
    result = run_module({"pattern": script.name.replace(".", r"\."), "state": "absent"}, check=True)
    assert "expert option" in warnings_text(result) and "script" in warnings_text(result)
    excluded = {e["pid"]: e["reason"] for e in result["excluded"]}
    for label in ("tail -f", "grep", "python -c", "less", "vim", "view", "watch", "ssh"):
        pid = lookalikes[label]
        assert pid not in result["pids"], label
        assert "only names the script" in excluded[pid], (label, excluded.get(pid))
    assert set(run.pids) <= set(result["pids"])
    assert all(_alive(procs).values())


def test_script_and_pattern_are_mutually_exclusive_and_script_must_not_be_empty():
    both = run_module({"script": "x.py", "pattern": "x"})
    assert both["failed"] and "mutually exclusive" in both["msg"]
    empty = run_module({"script": " "})
    assert empty["failed"] and "script is empty" in empty["msg"]
