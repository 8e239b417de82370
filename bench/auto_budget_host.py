"""Host time per decode step of the auto budget's choice (issue 24), on the CPU.

``SGLANG_DDTREE_BUDGET=auto`` adds host work to every decode round of the DDTREE worker: ``AutoBudget.begin_step``
(read finished step timings, the choice over the measured cost table) and ``end_step`` (close the step's timing).
On a GPU the timings are CUDA events; here the CPU clock stands in for them, which is the same bookkeeping. The
expectations and the calibration (GPU tensor work, every 16th step) are not timed here: they are kernels, measured
with the step on the GPU (bench/gpu/).

For each batch-size pattern it runs ``--steps`` steps after a warm-up and prints the median over ``--repeats``
of the mean microseconds per step; ``--out`` writes the table as markdown.

    PYTHONPATH=sglang-ddtree/src .venv/bin/python bench/auto_budget_host.py --out bench/results/auto-budget-host.md
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import platform
import statistics
import time
from pathlib import Path

import torch
from sglang_ddtree.budget import CHAIN
from sglang_ddtree.sglang.auto_budget import AutoBudget

PATTERNS = {
    "batch 1": [1],
    "batch 32": [32],
    "batch 1..64 cycling": list(range(1, 65)),
}


def per_step_us(candidates: tuple[int, ...], batches: list[int], steps: int) -> float:
    """Mean microseconds of one begin_step + end_step over ``steps`` steps (after as many warm-up steps)."""
    auto = AutoBudget(candidates, 16, torch.device("cpu"))
    cycle = itertools.cycle(batches)
    for _ in range(steps):  # warm-up: exploration over, the table filled
        auto.begin_step(next(cycle))
        auto.end_step()
    began = time.perf_counter()
    for _ in range(steps):
        auto.begin_step(next(cycle))
        auto.end_step()
    return (time.perf_counter() - began) / steps * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = []
    for name, batches in PATTERNS.items():
        for candidates in ((CHAIN, 4, 8, 16), (CHAIN, 4, 8, 16, 32)):
            runs = [per_step_us(candidates, batches, args.steps) for _ in range(args.repeats)]
            rows.append((name, len(candidates), statistics.median(runs), min(runs), max(runs)))
    lines = [
        f"# Auto budget: host time per decode step ({datetime.date.today().isoformat()})",
        "",
        f"`bench/auto_budget_host.py --steps {args.steps} --repeats {args.repeats}` on {platform.node()}, "
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}"
        " (CPU clock in place of CUDA events).",
        "",
        "| batch sizes | candidates | us per step, median (min-max) |",
        "|---|---:|---|",
        *[f"| {n} | {c} | {m:.1f} ({lo:.1f}-{hi:.1f}) |" for n, c, m, lo, hi in rows],
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
