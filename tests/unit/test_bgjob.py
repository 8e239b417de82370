"""roles/sglang_service/files/bgjob.py, the runner of the role's background jobs, run for real here.

What background.yml relies on: ``start`` returns as soon as the job ends within its wait (with the job's output and
exit status), or after the wait with ``finished: false`` while the job goes on detached (the caller's pipes close:
subprocess.run returns at once); ``wait`` then sees its end; the job directory is gone once its end was read; a job
is ended at its limit (``killed``); the environment reaches the job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

BGJOB = Path(__file__).resolve().parents[2] / "roles" / "sglang_service" / "files" / "bgjob.py"


def bgjob(*args: str, env: dict | None = None, timeout: float = 30) -> dict:
    proc = subprocess.run([sys.executable, str(BGJOB), *args], capture_output=True, text=True, timeout=timeout,
                          check=False, env=env)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return json.loads(proc.stdout)


def test_a_job_that_ends_within_the_wait(tmp_path):
    t0 = time.monotonic()
    r = bgjob("start", str(tmp_path / "jobs"), "60", "10", "--", sys.executable, "-c",
              "import os, sys; print(os.environ['PROBE_X']); print('err', file=sys.stderr)",
              env={**os.environ, "PROBE_X": "from the environment"})
    assert time.monotonic() - t0 < 8
    assert r["finished"] is True and r["rc"] == 0 and r["killed"] is False, r
    assert r["stdout"] == "from the environment\n" and r["stderr"] == "err\n"
    assert not Path(r["job"]).exists(), "the job directory is removed once its end was read"
    assert r["started_at"] <= r["finished_at"]


def test_a_longer_job_goes_on_detached_and_is_waited_for(tmp_path):
    t0 = time.monotonic()
    r = bgjob("start", str(tmp_path / "jobs"), "60", "0.2", "--", sys.executable, "-c",
              "import time; time.sleep(1.5); print('done'); raise SystemExit(3)")
    assert time.monotonic() - t0 < 1.2, "start returns after its wait; the job's pipes are not the caller's"
    assert r == {"job": r["job"], "finished": False}
    assert bgjob("wait", r["job"], "0")["finished"] is False
    end = bgjob("wait", r["job"], "10")
    assert end["finished"] is True and end["rc"] == 3 and end["stdout"] == "done\n"
    assert not Path(r["job"]).exists()


def test_a_job_is_ended_at_its_limit(tmp_path):
    r = bgjob("start", str(tmp_path / "jobs"), "0.5", "10", "--", sys.executable, "-c", "import time; time.sleep(30)")
    assert r["finished"] is True and r["killed"] is True and r["rc"] != 0, r


def test_a_command_that_cannot_start(tmp_path):
    r = bgjob("start", str(tmp_path / "jobs"), "10", "5", "--", str(tmp_path / "no-such-program"))
    assert r["finished"] is True and r["rc"] == 127 and "cannot start" in r["stderr"]


def test_usage_and_a_missing_job(tmp_path):
    usage = subprocess.run([sys.executable, str(BGJOB), "start", "x"], capture_output=True, text=True, check=False)
    assert usage.returncode == 2 and "Usage" in usage.stderr
    missing = subprocess.run([sys.executable, str(BGJOB), "wait", str(tmp_path / "nope"), "0"],
                             capture_output=True, text=True, check=False)
    assert missing.returncode == 1 and json.loads(missing.stdout)["finished"] is False
