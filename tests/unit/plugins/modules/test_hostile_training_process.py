"""Hostile input for specdec.pivot.training_process (issue 25): patterns that cannot stand for one training run,
users that do not exist, non-finite times, logs that would block, checkpoint globs that leave the run's directory,
and a process that only claims (argv[0]) to be the interpreter running the script.

Every run here is state=present (a query): nothing is ever signalled, whatever the module decides. Each process a
test starts carries a unique token and is killed by the fixture.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest
from module_runner import COLLECTIONS_ROOT, invoke_module


def run_module(args: dict, timeout: float = 60) -> dict:
    path = os.pathsep.join(p for p in (str(COLLECTIONS_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    return invoke_module("training_process", args, env, timeout=timeout)


@pytest.fixture
def token_dir():
    """A world-readable directory named after a fresh token (other users may execute what is in it)."""
    token = f"hostile{uuid.uuid4().hex[:12]}"
    path = Path(tempfile.mkdtemp(prefix=f"{token}-", dir="/tmp"))
    path.chmod(0o755)
    procs: list[subprocess.Popen] = []
    yield token, path, procs
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)
    shutil.rmtree(path, ignore_errors=True)


def start(procs: list, argv: list[str], **kw) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    procs.append(proc)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until its own argv is in place (exec done)
        try:
            if any(str(w).endswith(argv[-1]) for w in psutil.Process(proc.pid).cmdline()):
                break
        except psutil.Error:
            pass
        time.sleep(0.05)
    return proc


# ------------------------------------------------------------------------------------------- raw patterns

CATCH_ALL = [".", ".*", "^", "$", "(?s).*", "s", "[a-z]"]


@pytest.mark.parametrize("pattern", CATCH_ALL)
def test_a_catch_all_pattern_is_refused(pattern):
    r = run_module({"pattern": pattern, "state": "present"})
    assert r["failed"] is True, r.get("msg")
    assert f"pattern={pattern!r} matches any command line (a catch-all)" in r["msg"]
    assert "Use script" in r["msg"]


def test_a_pattern_matching_pid_1_is_refused():
    cmdline = psutil.Process(1).cmdline()
    if not cmdline:
        pytest.skip("PID 1 has no command line here")
    r = run_module({"pattern": "^" + re.escape(" ".join(cmdline)) + "$", "state": "present"})
    assert r["failed"] is True, r.get("msg")
    assert "matches pid 1 " in r["msg"] and "PID 1 (init)" in r["msg"]


def test_a_pattern_matching_sshd_is_refused(token_dir):
    token, path, procs = token_dir
    sshd = path / "sshd"  # a program whose name is sshd (the kernel's command name): never part of a run
    shutil.copy(shutil.which("sleep"), sshd)
    start(procs, [str(sshd), "300"])
    r = run_module({"pattern": re.escape(token), "state": "present"})
    assert r["failed"] is True, r.get("msg")
    assert "a protected system program (sshd)" in r["msg"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root and runuser")
def test_a_pattern_matching_several_users_is_refused_without_user(token_dir):
    token, path, procs = token_dir
    worker = path / "worker"
    shutil.copy(shutil.which("sleep"), worker)
    worker.chmod(0o755)
    start(procs, [str(worker), "300"])
    start(procs, ["runuser", "-u", "nobody", "--", str(worker), "301"])
    r = run_module({"pattern": re.escape(token), "state": "present"})
    assert r["failed"] is True, r.get("msg")
    assert "matches processes of several users (nobody, root)" in r["msg"]
    mine = run_module({"pattern": re.escape(token), "state": "present", "user": "root"})
    assert not mine.get("failed"), mine["msg"]
    assert {p["username"] for p in mine["processes"]} == {"root"}  # with user: that user's run only


# ------------------------------------------------------------------------------------------- user, times


def test_a_user_that_does_not_exist_is_an_error():
    r = run_module({"script": "train_dflash_pipeline.py", "user": "specdec-no-such-user", "state": "absent"})
    assert r["failed"] is True
    assert "user='specdec-no-such-user' does not exist on this host" in r["msg"]
    assert "already stopped" not in r["msg"]


NON_FINITE = [
    (option, value)
    for option in ("timeout", "kill_after", "gpu_release_timeout", "gpu_query_timeout", "pid_create_time")
    for value in ("nan", "inf", "-inf")
]


@pytest.mark.parametrize(("option", "value"), NON_FINITE)
def test_non_finite_times_are_refused(option, value):
    args = {"pid": 999999, option: value} if option == "pid_create_time" else {"script": "x.py", option: value}
    r = run_module(args)
    assert r["failed"] is True, r.get("msg")
    assert f"{option}=" in r["msg"] and "is not a finite number" in r["msg"]


# ------------------------------------------------------------------------------------------- the log


def test_a_fifo_log_does_not_block(tmp_path):
    fifo = tmp_path / "train.log"
    os.mkfifo(fifo)
    r = run_module({"script": f"absent_{uuid.uuid4().hex}.py", "log_path": str(fifo)}, timeout=30)
    assert not r.get("failed"), r.get("msg")
    assert "is a FIFO, not a regular log file" in r["log"]["error"]
    assert r["log"]["tail"] == []


def test_a_device_log_is_not_read():
    r = run_module({"script": f"absent_{uuid.uuid4().hex}.py", "log_path": "/dev/zero"}, timeout=30)
    assert not r.get("failed"), r.get("msg")
    assert "is a device, not a regular log file" in r["log"]["error"]


def test_a_huge_log_is_read_from_its_end(tmp_path):
    log = tmp_path / "train.log"
    with open(log, "wb") as fh:
        fh.truncate(8 << 30)  # 8 GiB, sparse
        fh.seek(0, os.SEEK_END)
        fh.write(b"\nstep 5380 | 1234.5 tok/s | loss 0.42\n")
    started = time.monotonic()
    r = run_module({"script": f"absent_{uuid.uuid4().hex}.py", "log_path": str(log)}, timeout=30)
    assert not r.get("failed"), r.get("msg")
    assert r["log"]["last_step"] == 5380
    assert time.monotonic() - started < 30


# ------------------------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("glob", ["../*", "/etc/*", "a/../../*", "~/*"])
def test_a_checkpoint_glob_never_leaves_the_directory(tmp_path, glob):
    (tmp_path / "run").mkdir()
    r = run_module({"script": "x.py", "checkpoint_dir": str(tmp_path / "run"), "checkpoint_glob": glob})
    assert r["failed"] is True, r.get("checkpoint")
    assert f"checkpoint_glob={glob!r}" in r["msg"]


def test_a_symlink_out_of_the_directory_is_not_a_checkpoint(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint-100").mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.utime(outside, (time.time() + 60, time.time() + 60))  # newer than any checkpoint of the run
    (run / "checkpoint-999").symlink_to(outside)
    r = run_module({"script": "x.py", "checkpoint_dir": str(run)})
    assert r["checkpoint"]["path"] == str(run / "checkpoint-100"), r["checkpoint"]


# ------------------------------------------------------------------------------------------- argv[0]


def test_argv0_alone_does_not_make_a_process_the_run(token_dir):
    token, path, procs = token_dir
    script = path / f"train_{token}.py"
    script.write_text("import time\ntime.sleep(300)\n")
    # tail claims to be python3 running the script (exec -a); GNU tail takes -f after its operand
    spoof = start(procs, ["bash", "-c", 'exec -a python3 tail "$0" -f', str(script)])
    real = start(procs, [sys.executable, str(script)])
    r = run_module({"script": script.name, "state": "present"})
    assert not r.get("failed"), r.get("msg")
    assert spoof.pid not in r["pids"], json.dumps(r["processes"])
    assert real.pid in r["pids"]
