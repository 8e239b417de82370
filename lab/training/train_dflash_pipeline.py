#!/usr/bin/env python3
"""train_dflash_pipeline.py — LAB STAND-IN for the DFlash drafter training job on ct200.

The real job trains a DFlash drafter on 8 GPUs under torchrun; this lab container has no GPU, so this
script reproduces what the pivot touches, with REAL processes, signals and files, and no training:

* a launcher (like torchrun) started with ``--nproc-per-node N`` that spawns N worker processes running
  this same file (``--worker --local-rank R``; env RANK/LOCAL_RANK/WORLD_SIZE as torchrun sets them);
* rank 0 prints ``step N | loss X | 19.5K tok/s`` lines (stdout, i.e. logs/train.log under nohup);
* rank 0 writes a checkpoint ``CHECKPOINT_DIR/step-N/`` every ``--checkpoint-every`` steps and on SIGTERM,
  then exits 0; other ranks exit 0 on SIGTERM;
* the launcher forwards SIGTERM/SIGINT to its workers and waits up to ``--stop-timeout`` seconds (torchrun
  waits 30 s) before it SIGKILLs what is left; if a worker dies on its own, the launcher stops the others
  and exits 1, like torchrun's failure handling;
* ``--ignore-sigterm-rank R`` (or env LAB_IGNORE_SIGTERM_RANK=R) makes worker R ignore SIGTERM, so only
  SIGKILL stops it (exercises the halt's escalation);
* a new run resumes from the newest ``step-N`` checkpoint (what a restarted job does).

Nothing here uses a GPU or noticeable CPU: a "step" is a sleep of ``--step-interval`` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

THROUGHPUT_TOK_S = 19500.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="LAB STAND-IN for the DFlash drafter training job (see docstring)")
    p.add_argument("--nproc-per-node", type=int, default=2, help="worker processes (like torchrun)")
    p.add_argument("--checkpoint-dir", default="/opt/train/checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=200, help="steps between periodic checkpoints")
    p.add_argument("--checkpoint-seconds", type=float, default=0.5, help="time a checkpoint save takes")
    p.add_argument("--step-interval", type=float, default=0.5, help="seconds per training step")
    p.add_argument("--stop-timeout", type=float, default=30.0,
                   help="launcher: seconds to wait for workers after forwarding SIGTERM before SIGKILL")
    env_rank = os.environ.get("LAB_IGNORE_SIGTERM_RANK", "")
    p.add_argument("--ignore-sigterm-rank", type=int, default=int(env_rank) if env_rank.strip() else -1,
                   help="this worker rank ignores SIGTERM (-1 = none; env LAB_IGNORE_SIGTERM_RANK)")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this step (0 = run until stopped)")
    p.add_argument("--seed", type=int, default=0)
    # worker-only (set by the launcher)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--local-rank", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.nproc_per_node < 1:
        p.error(f"--nproc-per-node must be >= 1, got {args.nproc_per_node}")
    if args.step_interval <= 0:
        p.error(f"--step-interval must be > 0, got {args.step_interval}")
    return args


def say(*parts: object) -> None:
    print(*parts, flush=True)


# ------------------------------------------------------------------------------------------------ checkpoints
def newest_checkpoint(ckpt_dir: Path) -> tuple[int, Path | None]:
    best, best_path = 0, None
    if ckpt_dir.is_dir():
        for entry in ckpt_dir.glob("step-*"):
            state = entry / "trainer_state.json"
            if not state.is_file():
                continue  # an interrupted save
            try:
                step = int(entry.name.split("-", 1)[1])
            except ValueError:
                continue
            if step > best:
                best, best_path = step, entry
    return best, best_path


def save_checkpoint(ckpt_dir: Path, step: int, loss: float, reason: str, seconds: float, world: int) -> Path:
    path = ckpt_dir / f"step-{step}"
    tmp = ckpt_dir / f".step-{step}.partial"
    tmp.mkdir(parents=True, exist_ok=True)
    say(f"[rank0] saving checkpoint {path} ({reason})")
    # A few hundred KiB of "weights", written for real; the save takes --checkpoint-seconds.
    (tmp / "model.safetensors").write_bytes(os.urandom(256 * 1024))
    (tmp / "optimizer.pt").write_bytes(os.urandom(128 * 1024))
    time.sleep(seconds)
    (tmp / "trainer_state.json").write_text(json.dumps({
        "global_step": step, "loss": loss, "throughput_tok_s": THROUGHPUT_TOK_S, "world_size": world,
        "reason": reason, "saved_at": time.time(), "lab_stand_in": True}, indent=2) + "\n")
    if path.exists():
        for f in path.iterdir():
            f.unlink()
        path.rmdir()
    tmp.rename(path)
    say(f"[rank0] checkpoint saved: {path}")
    return path


def loss_at(step: int, rng: random.Random) -> float:
    return round(6.0 / (1.0 + step / 150.0) + 0.4 + rng.uniform(-0.02, 0.02), 4)


# ------------------------------------------------------------------------------------------------ worker
def run_worker(args: argparse.Namespace) -> int:
    rank = args.local_rank
    world = int(os.environ.get("WORLD_SIZE", args.nproc_per_node))
    stop = {"signal": None}

    def on_term(signum: int, _frame: object) -> None:
        stop["signal"] = signum
        # A shutdown is under way: the same signal again (the launcher forwards what systemd already sent the whole
        # cgroup) must not kill the worker while it checkpoints or during interpreter teardown, where Python has
        # put the default handler back (exit -15, and the supervisor unit would end "failed").
        signal.signal(signum, signal.SIG_IGN)

    if rank == args.ignore_sigterm_rank:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        say(f"[rank{rank}] lab switch: this worker IGNORES SIGTERM (only SIGKILL stops it)")
    else:
        signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    ckpt_dir = Path(args.checkpoint_dir)
    step, resumed = newest_checkpoint(ckpt_dir)
    rng = random.Random(args.seed + step)
    if rank == 0:
        say(f"[rank0] world_size={world} " + (f"resumed from {resumed} at step {step}" if resumed
                                               else "starting from step 0"))
    loss = loss_at(step, rng)
    next_tick = time.monotonic()
    while stop["signal"] is None:
        next_tick += args.step_interval
        while stop["signal"] is None and time.monotonic() < next_tick:
            time.sleep(min(0.05, max(0.0, next_tick - time.monotonic())))
        if stop["signal"] is not None:
            break
        step += 1
        loss = loss_at(step, rng)
        if rank == 0:
            tok_s = THROUGHPUT_TOK_S * (1 + rng.uniform(-0.004, 0.004))
            say(f"step {step} | loss {loss:.4f} | {tok_s / 1000:.1f}K tok/s")
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                save_checkpoint(ckpt_dir, step, loss, "periodic", args.checkpoint_seconds, world)
        if args.max_steps and step >= args.max_steps:
            if rank == 0:
                save_checkpoint(ckpt_dir, step, loss, "max-steps", args.checkpoint_seconds, world)
            return 0
    name = signal.Signals(stop["signal"]).name
    if rank == 0:
        say(f"[rank0] received {name} at step {step}: checkpointing before exit")
        save_checkpoint(ckpt_dir, step, loss, name, args.checkpoint_seconds, world)
    say(f"[rank{rank}] exiting after {name}")
    return 0


# ------------------------------------------------------------------------------------------------ launcher
def run_launcher(args: argparse.Namespace, argv: list[str]) -> int:
    n = args.nproc_per_node
    say(f"[launcher] pid {os.getpid()}: starting {n} workers (LAB STAND-IN of torchrun --nproc-per-node {n})")
    workers: list[subprocess.Popen] = []
    for rank in range(n):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(n),
                   LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
        cmd = [sys.executable, "-u", os.path.abspath(__file__), *argv, "--worker", "--local-rank", str(rank)]
        workers.append(subprocess.Popen(cmd, env=env))
    say("[launcher] workers: " + ", ".join(f"rank{r}=pid {w.pid}" for r, w in enumerate(workers)))

    got = {"signal": None}

    def on_term(signum: int, _frame: object) -> None:
        if got["signal"] is None:
            got["signal"] = signum
        signal.signal(signum, signal.SIG_IGN)  # as the workers: a repeated signal must not kill the shutdown

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    while got["signal"] is None:
        codes = [w.poll() for w in workers]
        if all(c is not None for c in codes):
            say(f"[launcher] all workers finished: exit codes {codes}")
            return 0 if all(c == 0 for c in codes) else 1
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            say(f"[launcher] worker failure {failed}: stopping the remaining workers")
            stop_workers(workers, signal.SIGTERM, args.stop_timeout)
            return 1
        time.sleep(0.2)

    name = signal.Signals(got["signal"]).name
    say(f"[launcher] received {name}: forwarding it to the workers")
    codes = stop_workers(workers, got["signal"], args.stop_timeout)
    say(f"[launcher] workers exited: {codes}; launcher exits")
    return 0 if all(c == 0 for c in codes) else 1


def stop_workers(workers: list[subprocess.Popen], signum: int, timeout: float) -> list[int | None]:
    for w in workers:
        if w.poll() is None:
            w.send_signal(signum)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(w.poll() is None for w in workers):
        time.sleep(0.1)
    for rank, w in enumerate(workers):
        if w.poll() is None:
            say(f"[launcher] rank{rank} (pid {w.pid}) still alive after {timeout:.0f} s: SIGKILL")
            w.kill()
            w.wait()
    return [w.returncode for w in workers]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        return run_worker(args)
    return run_launcher(args, argv)


if __name__ == "__main__":
    sys.exit(main())
