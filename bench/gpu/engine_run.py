"""One SGLang engine configuration in its own process (bench/gpu/sglang_ddtree_run.py), shared by the GPU drivers
(lossless.py, tau.py, step_cost.py): each engine gets a fresh interpreter, so environment switches such as the
test instruments' (read once at import by the scheduler processes) apply per configuration, and a finished
configuration (its JSON exists) is not run again when a driver is repeated after a 10-minute call limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

RUNNER = Path(__file__).resolve().parent / "sglang_ddtree_run.py"
#: Seconds an engine configuration needs at least (start-up about 45 s on the lent H100, then its runs): under
#: bench/gpu/run_all.sh (which exports its call's end as RUN_ALL_DEADLINE, epoch seconds) a configuration is not
#: started with less left (ENGINE_NEED_S in the environment overrides), so that a call ends early instead of holding
#: the GPU for an engine the call's limit would cut off.
ENGINE_NEED_S = 90

#: the sampling test's filter sets, by result key: top-k with top-p (filtered jointly over the whole distribution by
#: SGLang's sampler; DFLASH's verify takes top-p over the renormalised top-k instead, so the auto budget keeps such
#: batches off DFLASH's round), then top-k alone and temperature alone (tau.py's sampled rows), which DFLASH's round
#: verifies for the auto budget's chain steps (its sparse top-k path and its dense one)
SAMPLING_SETS = {
    "sampling": {"temperature": 1.0, "top_k": 20, "top_p": 0.9},
    "sampling_topk": {"temperature": 1.0, "top_k": 20},
    "sampling_temperature": {"temperature": 1.0},
}


class OutOfTime(RuntimeError):
    """Too little of run_all.sh's call is left to start another engine; the driver is run again in the next call
    (finished configurations are kept), so its step must not count as done."""


def exit_with(main) -> None:
    """``sys.exit(main())`` for a driver run by run_all.sh: OutOfTime exits 3 with its one-line reason instead of a
    traceback (the step is not done; the next call goes on from the finished configurations)."""
    try:
        sys.exit(main())
    except OutOfTime as exc:
        print(exc, flush=True)
        sys.exit(3)


def seconds_left(env: dict | None = None, now: float | None = None) -> float | None:
    """Seconds left in run_all.sh's call (its exported RUN_ALL_DEADLINE), or None outside it."""
    env = os.environ if env is None else env
    try:
        return float(env["RUN_ALL_DEADLINE"]) - (time.time() if now is None else now)
    except (KeyError, ValueError):
        return None


def run_config(
    out: Path,
    models: Path,
    algo: str,
    budget: int,
    mode: str,
    extra: list[str] | None = None,
    env_extra: dict[str, str] | None = None,
    need_s: float | None = None,
) -> dict | None:
    """The runner's JSON record for this configuration (running it unless ``out`` exists); None if it failed.
    Raises OutOfTime instead of starting it with less than ``need_s`` (default ``ENGINE_NEED_S``) of run_all.sh's
    call left."""
    if not out.exists():
        left = seconds_left()
        need = float(os.environ.get("ENGINE_NEED_S", ENGINE_NEED_S)) if need_s is None else need_s
        if left is not None and left < need:
            raise OutOfTime(f"{out.name}: {left:.0f} s left in this call, an engine needs about {need:.0f} s: "
                            "not started (the next call runs it)")
        cmd = [
            sys.executable,
            str(RUNNER),
            "--models",
            str(models),
            "--algo",
            algo,
            "--budget",
            str(budget),
            "--mode",
            mode,
            *(extra or []),
            "--out",
            str(out),
        ]
        env_extra = env_extra or {}
        print("+", " ".join(cmd), " ".join(f"{k}={v}" for k, v in env_extra.items()), flush=True)
        if subprocess.run(cmd, env=dict(os.environ, **env_extra)).returncode != 0:
            print(f"{out.name}: engine run failed", flush=True)
            return None
    else:
        print(f"{out.name}: done earlier", flush=True)
    return json.loads(out.read_text())
