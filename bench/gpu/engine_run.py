"""One SGLang engine configuration in its own process (bench/gpu/sglang_ddtree_run.py), shared by the GPU drivers
(lossless.py, tau.py, step_cost.py): each engine gets a fresh interpreter, so environment switches such as the
test instruments' (read once at import by the scheduler processes) apply per configuration, and a finished
configuration (its JSON exists) is not run again when a driver is repeated after a 10-minute call limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).resolve().parent / "sglang_ddtree_run.py"


def run_config(
    out: Path,
    models: Path,
    algo: str,
    budget: int,
    mode: str,
    extra: list[str] | None = None,
    env_extra: dict[str, str] | None = None,
) -> dict | None:
    """The runner's JSON record for this configuration (running it unless ``out`` exists); None if it failed."""
    if not out.exists():
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
