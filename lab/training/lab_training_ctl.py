#!/usr/bin/env python3
"""Lab plumbing: start, stop and inspect the lab training job on the lab training host (ct200).

Used by lab/provision.yml (``ensure``, ``stop``) and lab/status.sh (``status``); stdlib only, prints JSON.
The job is identified exactly, not by a pattern: a process whose argv[1] is the configured script path.

    lab_training_ctl.py ensure --config /opt/train/.lab-launch.json
        the job runs with exactly config["argv"]; otherwise stops what runs and starts it like the
        production run (``nohup ARGV >> LOG 2>&1 &`` in a new session, cwd the training dir), then waits
        until the launcher has its workers. {"changed": bool, "launcher": pid, "workers": [pids]}
    lab_training_ctl.py stop --config ...   SIGTERM the launchers, wait, SIGKILL what is left
    lab_training_ctl.py status --config ... the job's process tree and the last log line

config: {"argv": [...], "script": path, "log": path, "cwd": dir, "nproc": N, "env": {...}}
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def read_proc(pid: int) -> tuple[list[str], int] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None  # a zombie is not a running job
    return argv, int(fields[1])


def job_processes(script: str) -> dict[int, tuple[list[str], int]]:
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        info = read_proc(int(entry))
        if info is None:
            continue
        argv, _ppid = info
        # python3 SCRIPT ... or python3 -u SCRIPT ...
        args = [a for a in argv[1:3] if a != "-u"]
        if args and args[0] == script:
            found[int(entry)] = info
    return found


def launchers(procs: dict[int, tuple[list[str], int]]) -> list[int]:
    return sorted(pid for pid, (argv, _) in procs.items() if "--worker" not in argv)


def workers_of(procs: dict[int, tuple[list[str], int]], launcher: int) -> list[int]:
    return sorted(pid for pid, (argv, ppid) in procs.items() if ppid == launcher and "--worker" in argv)


def stop(cfg: dict, timeout: float = 15.0) -> bool:
    procs = job_processes(cfg["script"])
    if not procs:
        return False
    for pid in launchers(procs):
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job_processes(cfg["script"]):
        time.sleep(0.1)
    for pid in job_processes(cfg["script"]):
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and job_processes(cfg["script"]):
        time.sleep(0.1)
    return True


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def ensure(cfg: dict) -> dict:
    procs = job_processes(cfg["script"])
    roots = launchers(procs)
    if len(roots) == 1 and procs[roots[0]][0][1:] == cfg["argv"][1:]:
        kids = workers_of(procs, roots[0])
        if len(kids) == cfg["nproc"]:
            return {"changed": False, "launcher": roots[0], "workers": kids}
    stopped = stop(cfg)
    Path(cfg["log"]).parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **cfg.get("env", {}))
    with open(cfg["log"], "ab") as log, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(["nohup", *cfg["argv"]], cwd=cfg["cwd"], stdin=devnull, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)
    deadline = time.monotonic() + 20
    kids: list[int] = []
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the training job exited at once with {proc.returncode}; see {cfg['log']}")
        kids = workers_of(job_processes(cfg["script"]), proc.pid)
        if len(kids) == cfg["nproc"]:
            break
        time.sleep(0.1)
    else:
        raise SystemExit(f"the launcher {proc.pid} has {len(kids)} of {cfg['nproc']} workers after 20 s")
    return {"changed": True, "stopped_previous": stopped, "launcher": proc.pid, "workers": kids}


def status(cfg: dict) -> dict:
    procs = job_processes(cfg["script"])
    tree = [{"launcher": pid, "argv": procs[pid][0], "workers": workers_of(procs, pid)} for pid in launchers(procs)]
    last = ""
    try:
        with open(cfg["log"], "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.startswith("step ")]
            last = lines[-1] if lines else ""
    except OSError:
        pass
    return {"running": bool(tree), "jobs": tree, "last_step_line": last}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["ensure", "stop", "status"])
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    cfg = json.loads(Path(args.config).read_text())
    if args.action == "ensure":
        result = ensure(cfg)
    elif args.action == "stop":
        result = {"changed": stop(cfg)}
    else:
        result = status(cfg)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
