"""Run one of the role's scripts on the host in the background, detached, and wait for its end here for a while.

Usage: bgjob.py start JOBS_DIR LIMIT_S WAIT_S -- COMMAND [ARG...]
       bgjob.py wait JOB_DIR WAIT_S

``start`` makes a new job directory under JOBS_DIR (mode 0700), starts COMMAND detached from this process (a new
session; stdin /dev/null, stdout and stderr to files in the job directory; the environment and working directory
of this process), and then waits up to WAIT_S seconds for it to end. A supervisor process ends the job after LIMIT_S
seconds (SIGTERM to its process group, SIGKILL 5 s later). ``wait`` waits up to WAIT_S seconds (0: just looks) for
the end of the job in JOB_DIR.

Both print one JSON line: ``job`` (its directory), ``finished``, and when finished ``rc``, ``stdout``, ``stderr``,
``killed`` (ended at the limit), ``started_at``, ``finished_at``; the job directory is removed once its end was
read. Job directories whose end nobody read for a day (the controller went away) are removed by the next ``start``.
Exit status 0 whenever the job could be started or read (the caller decides on ``finished``/``rc``); 2 on a usage
error, 1 when the job directory is missing or unreadable.

This is what Ansible's async + async_status did for these scripts, in one command per call: starting a job was three
round trips to the host (a temporary directory, the module file, the wrapper), its end was seen only at the next
poll, and removing its status file was a task of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

STALE_S = 86400  # a job directory whose end was not read for this long is left over from a lost controller
RESULT = "result.json"


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def write_json(path: str, data: dict) -> None:
    tmp = path + ".part"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def supervise(job: str, limit_s: float, command: list[str]) -> int:
    """The detached supervisor: run the command, end it at the limit, write the result."""
    started_at = now_iso()
    killed = False
    with open(os.path.join(job, "stdout"), "wb") as out, open(os.path.join(job, "stderr"), "wb") as err:
        try:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
        except OSError as exc:
            err.write(f"bgjob: cannot start {command[0]}: {exc}\n".encode())
            failed = {"rc": 127, "killed": False, "started_at": started_at, "finished_at": now_iso()}
            write_json(os.path.join(job, RESULT), failed)
            return 0
        try:
            rc = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            killed = True
            for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, None)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            rc = proc.wait()
    result = {"rc": rc, "killed": killed, "limit_s": limit_s, "started_at": started_at, "finished_at": now_iso()}
    write_json(os.path.join(job, RESULT), result)
    return 0


def detach(job: str, limit_s: float, command: list[str]) -> None:
    """Start the supervisor as a grandchild in its own session, with none of this process's open files."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)  # the first child exits at once; the grandchild is adopted by init
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)  # the caller's pipes close when the caller exits, not when the job ends
        os.closerange(3, 65536)
        os._exit(supervise(job, limit_s, command))
    except BaseException:
        os._exit(1)


def remove_stale(jobs_dir: str) -> None:
    for name in os.listdir(jobs_dir):
        path = os.path.join(jobs_dir, name)
        try:
            if time.time() - os.stat(os.path.join(path, RESULT)).st_mtime > STALE_S:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue


def status(job: str, wait_s: float) -> dict:
    deadline = time.monotonic() + max(wait_s, 0.0)
    result_path = os.path.join(job, RESULT)
    while not os.path.exists(result_path):
        if not os.path.isdir(job):
            raise FileNotFoundError(f"no job directory {job}")
        if time.monotonic() >= deadline:
            return {"job": job, "finished": False}
        time.sleep(0.05)
    with open(result_path, encoding="utf-8") as fh:
        out = dict(json.load(fh), job=job, finished=True)
    for name in ("stdout", "stderr"):
        with open(os.path.join(job, name), "rb") as fh:
            out[name] = fh.read().decode("utf-8", "replace")
    shutil.rmtree(job, ignore_errors=True)
    return out


def main(argv: list[str]) -> int:
    try:
        if len(argv) >= 6 and argv[1] == "start" and argv[5] == "--" and len(argv) > 6:
            jobs_dir, limit_s, wait_s, command = argv[2], float(argv[3]), float(argv[4]), argv[6:]
            os.makedirs(jobs_dir, mode=0o700, exist_ok=True)
            remove_stale(jobs_dir)
            name = os.path.basename(command[1] if len(command) > 1 else command[0])
            job = tempfile.mkdtemp(prefix=name + ".", dir=jobs_dir)
            detach(job, limit_s, command)
            print(json.dumps(status(job, wait_s)))
            return 0
        if len(argv) == 4 and argv[1] == "wait":
            print(json.dumps(status(argv[2], float(argv[3]))))
            return 0
    except ValueError as exc:
        print(f"bgjob: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(json.dumps({"job": argv[2] if len(argv) > 2 else None, "finished": False, "error": str(exc)}))
        return 1
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
