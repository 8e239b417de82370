"""A REAL process tree shaped like a torchrun training job, for tests of specdec.pivot.training_process.

Nothing here is simulated at the OS level: the launcher is a real parent process, the workers are real child
processes with real signal dispositions, the log and checkpoints are real files. Only the "training" itself
is a loop that counts steps.

Command line (the launcher starts the workers with the same file)::

    fake_training_run.py torchrun --token T --nproc-per-node 3 [options]   # a launcher the module recognises
    fake_training_run.py supervisor --token T ...                          # same, but NOT a known launcher
    fake_training_run.py worker --token T --rank 0 ...                     # started by the launcher

Options:
    --ignore-term RANKS      comma-separated ranks whose workers ignore SIGTERM (they need SIGKILL)
    --checkpoint-rank R      that worker, on SIGTERM, writes CHECKPOINT_DIR/checkpoint-<step>/ and exits 0
    --checkpoint-dir DIR     where it writes
    --checkpoint-delay S     seconds the checkpoint "save" takes (default 0.1)
    --log PATH               rank 0 appends ``step N | lr ... | 19.5K tok/s | loss L`` lines
    --log-interval S         seconds per step (default 0.05)
    --launcher-term MODE     launcher's SIGTERM behaviour: forward (default; like torchrun: forward to the
                             workers and wait for them), exit (exit at once, orphaning the workers),
                             ignore (ignore SIGTERM; needs SIGKILL), restart (ignore SIGTERM and
                             restart a worker that died, up to --max-restarts times, like an elastic agent)
    --max-restarts N         restarts allowed with --launcher-term restart (default 1)
    --ready-file PATH        the launcher writes {"launcher": pid, "workers": [{rank, pid}]} there once every
                             worker has installed its signal handling (tests wait for it instead of sleeping)

Python API for tests: :func:`start` returns a :class:`FakeRun` with the pids and a ``cleanup()`` that kills
what is left through the handles it holds (the launcher's Popen and psutil handles of the workers, which
refuse to signal a pid that was reused).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

THROUGHPUT_TEXT = "19.5K tok/s"
THROUGHPUT_VALUE = 19500.0


def loss_at(step: int) -> float:
    return round(2.0 / (1.0 + step / 100.0), 4)


def log_line(step: int) -> str:
    return f"step {step} | lr 1.0e-04 | {THROUGHPUT_TEXT} | loss {loss_at(step):.4f}"


# ------------------------------------------------------------------------------------------------ processes


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["torchrun", "supervisor", "worker"])
    parser.add_argument("--token", required=True)
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--ignore-term", default="")
    parser.add_argument("--checkpoint-rank", type=int, default=-1)
    parser.add_argument("--checkpoint-dir", default="")
    parser.add_argument("--checkpoint-delay", type=float, default=0.1)
    parser.add_argument("--log", default="")
    parser.add_argument("--log-interval", type=float, default=0.05)
    parser.add_argument("--launcher-term", choices=["forward", "exit", "ignore", "restart"], default="forward")
    parser.add_argument("--max-restarts", type=int, default=1)
    parser.add_argument("--ready-file", default="")
    return parser


def _ranks(text: str) -> set:
    return {int(part) for part in text.split(",") if part.strip()}


def run_worker(args: argparse.Namespace) -> int:
    state = {"step": 0}

    if args.rank in _ranks(args.ignore_term):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif args.rank == args.checkpoint_rank:

        def save_and_exit(signum, frame):
            target = Path(args.checkpoint_dir) / f"checkpoint-{state['step']}"
            target.mkdir(parents=True, exist_ok=True)
            time.sleep(args.checkpoint_delay)  # the "save" takes a moment, like a real one
            (target / "state.json").write_text(json.dumps({"step": state["step"], "rank": args.rank}))
            if args.log:
                with open(args.log, "a", encoding="utf-8") as handle:
                    handle.write(f"rank {args.rank}: saved {target.name} on SIGTERM\n")
            os._exit(0)

        signal.signal(signal.SIGTERM, save_and_exit)
    else:  # the default action (terminate), like a plain training script; set explicitly because an ignored
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # signal would be inherited from the launcher

    log = open(args.log, "a", encoding="utf-8", buffering=1) if args.log and args.rank == 0 else None
    if log is not None:
        log.write(log_line(state["step"]) + "\n")
    sys.stdout.write(f"ready {os.getpid()}\n")
    sys.stdout.flush()
    while True:
        time.sleep(args.log_interval)
        state["step"] += 1
        if log is not None:
            log.write(log_line(state["step"]) + "\n")


def run_launcher(args: argparse.Namespace) -> int:
    worker_args = [
        sys.executable,
        os.path.abspath(__file__),
        "worker",
        "--token",
        args.token,
        "--ignore-term",
        args.ignore_term,
        "--checkpoint-rank",
        str(args.checkpoint_rank),
        "--checkpoint-delay",
        str(args.checkpoint_delay),
        "--log-interval",
        str(args.log_interval),
    ]
    if args.checkpoint_dir:
        worker_args += ["--checkpoint-dir", args.checkpoint_dir]
    if args.log:
        worker_args += ["--log", args.log]
    alive: dict = {}  # pid -> (rank, Popen); reaped with os.wait() below
    state = {"forwarded": False, "restarts": 0}

    def forward(signum, frame):
        if state["forwarded"]:
            return
        state["forwarded"] = True
        for pid in list(alive):
            try:
                os.kill(pid, signum)  # our own unreaped child: the pid cannot have been reused
            except ProcessLookupError:
                pass

    if args.launcher_term in ("ignore", "restart"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif args.launcher_term == "forward":
        signal.signal(signal.SIGTERM, forward)
    # "exit": default action, the launcher dies and orphans its workers

    def spawn(rank: int) -> subprocess.Popen:
        proc = subprocess.Popen([*worker_args, "--rank", str(rank)], stdout=subprocess.PIPE, text=True)
        alive[proc.pid] = (rank, proc)
        return proc

    workers = [spawn(rank) for rank in range(args.nproc_per_node)]
    ready = []
    for rank, proc in enumerate(workers):
        line = proc.stdout.readline()
        if not line.startswith("ready"):
            for other in workers:
                other.kill()
            sys.stderr.write(f"worker {rank} did not start: {line!r}\n")
            return 3
        ready.append({"rank": rank, "pid": proc.pid})
    if args.ready_file:
        tmp = args.ready_file + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump({"launcher": os.getpid(), "workers": ready}, handle)
        os.replace(tmp, args.ready_file)
    code = 0
    while alive:  # like torchrun: stay until every worker is gone
        pid, status = os.wait()
        if pid not in alive:
            continue
        rank, _proc = alive.pop(pid)
        code = max(code, os.waitstatus_to_exitcode(status) if status else 0)
        if args.launcher_term == "restart" and state["restarts"] < args.max_restarts:
            state["restarts"] += 1  # an elastic restart: a fresh worker with a new pid takes the rank over
            spawn(rank)
    return 143 if state["forwarded"] else code


def main(argv: list | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.role == "worker":
        return run_worker(args)
    return run_launcher(args)


# ------------------------------------------------------------------------------------------------- test API


@dataclass
class FakeRun:
    """Handles of one started tree. ``cleanup()`` is safe to call more than once."""

    popen: subprocess.Popen
    token: str
    launcher_pid: int
    worker_pids: list
    log_path: str
    checkpoint_dir: str
    stderr_path: str
    handles: list = field(default_factory=list)  # psutil.Process of launcher + workers, taken at start

    @property
    def pids(self) -> list:
        return [self.launcher_pid, *self.worker_pids]

    def running(self) -> list:
        """Pids of this run that still run (a zombie or a reused pid counts as gone)."""
        import psutil

        alive = []
        for handle in self.handles:
            try:
                if handle.is_running() and handle.status() != psutil.STATUS_ZOMBIE:
                    alive.append(handle.pid)
            except psutil.NoSuchProcess:
                continue
        return alive

    def cleanup(self) -> None:
        import psutil

        try:  # workers restarted after start() are descendants of our launcher, so ours as well
            if self.popen.poll() is None:
                known = {h.pid for h in self.handles}
                self.handles += [c for c in self.handles[0].children(recursive=True) if c.pid not in known]
        except psutil.NoSuchProcess:
            pass
        for handle in self.handles[1:]:
            try:
                handle.kill()  # psutil refuses (NoSuchProcess) when the pid now belongs to someone else
            except psutil.NoSuchProcess:
                pass
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)
        deadline = time.monotonic() + 10
        while self.running() and time.monotonic() < deadline:  # orphans are reaped by init; a zombie is done
            time.sleep(0.01)


def start(
    workdir: str | os.PathLike,
    token: str,
    nproc: int = 2,
    launcher: str = "torchrun",
    ignore_term: tuple = (),
    checkpoint_rank: int | None = None,
    launcher_term: str = "forward",
    max_restarts: int = 1,
    log_interval: float = 0.05,
    checkpoint_delay: float = 0.1,
    ready_timeout: float = 30.0,
    script: str | os.PathLike | None = None,
) -> FakeRun:
    """Start a tree and return once every worker has set up its signal handling.

    With ``script`` (a path), this file is copied there and the launcher and workers run the copy, so their
    command lines execute a script of that name (``python3 SCRIPT torchrun ...``).
    """
    import shutil

    import psutil

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    program = os.path.abspath(__file__)
    if script is not None:
        Path(script).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(program, script)
        program = os.path.abspath(script)
    ready_file = workdir / f"{token}.ready.json"
    log_path = workdir / f"{token}.log"
    checkpoint_dir = workdir / f"{token}-checkpoints"
    stderr_path = workdir / f"{token}.stderr"
    cmd = [
        sys.executable,
        program,
        launcher,
        "--token",
        token,
        "--nproc-per-node",
        str(nproc),
        "--ignore-term",
        ",".join(str(r) for r in ignore_term),
        "--launcher-term",
        launcher_term,
        "--max-restarts",
        str(max_restarts),
        "--log",
        str(log_path),
        "--log-interval",
        str(log_interval),
        "--ready-file",
        str(ready_file),
        "--checkpoint-dir",
        str(checkpoint_dir),
        "--checkpoint-delay",
        str(checkpoint_delay),
    ]
    if checkpoint_rank is not None:
        cmd += ["--checkpoint-rank", str(checkpoint_rank)]
    ready_file.unlink(missing_ok=True)  # a stale file from an earlier run with the same token
    with open(stderr_path, "wb") as stderr:
        popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + ready_timeout
        delay = 0.005
        while not ready_file.exists():
            if popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fake training run {token} did not start: {stderr_path.read_text()!r}")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        ready = json.loads(ready_file.read_text())
        worker_pids = [w["pid"] for w in ready["workers"]]
        handles = [psutil.Process(popen.pid)] + [psutil.Process(pid) for pid in worker_pids]
    except BaseException:
        # never leave a half-started tree behind: its processes are descendants of our own child
        try:
            for child in psutil.Process(popen.pid).children(recursive=True):
                child.kill()
        except psutil.NoSuchProcess:
            pass
        if popen.poll() is None:
            popen.kill()
        popen.wait()
        raise
    return FakeRun(
        popen=popen,
        token=token,
        launcher_pid=popen.pid,
        worker_pids=worker_pids,
        log_path=str(log_path),
        checkpoint_dir=str(checkpoint_dir),
        stderr_path=str(stderr_path),
        handles=handles,
    )


if __name__ == "__main__":
    sys.exit(main())
