"""Issue 18: per-step cost of none, DFLASH and DDTREE side by side, with kernel launches and host syncs per step
from the torch profiler (SGLang's own ``Engine.start_profile``), at batch 1, 8, 32 and several context lengths.

    python bench/gpu/step_cost.py --models DIR --work DIR --label tiny [--contexts 1024,8192] [--result FILE]

Per configuration one engine (bench/gpu/sglang_ddtree_run.py --mode speed,profile, its own process): ms per
decode step (median of 5 timed generates) and, from one profiled generate, launches (cudaLaunchKernel and
friends; a CUDA-graph replay counts once as cudaGraphLaunch) and synchronising calls per step. The profiled window
includes the prefill, so launches per step are an upper bound for short generations; --profile-tokens sets the
generation length (default 64). Context: prompt length in tokens (the model's max_position_embeddings must allow
it). Written ``step-cost-*.json``: ``{"sglang", "gpu", "rows": [{"target", "batch", "budget", "context", "none_ms",
"dflash_ms", "ddtree_ms", "none_launches", "dflash_launches", "ddtree_launches", ...}]}``.

NOT YET RUN on a GPU (written after the session's device time was spent): expect to fix details on first use.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from engine_run import run_config

LAUNCH_NAMES = {
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaGraphLaunch",
    "cudaLaunchCooperativeKernel",
}
SYNC_NAMES = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"}


def count_trace(events: list[dict]) -> dict:
    """Launch and sync counts of a chrome trace's events (torch profiler ``cuda_runtime``/``cuda_driver`` rows).

    A device-to-host ``cudaMemcpy``/``cudaMemcpyAsync`` (``.item()``, ``.tolist()``) is a host sync too."""
    launches = graph_launches = syncs = 0
    for ev in events:
        name = ev.get("name", "")
        if ev.get("ph") not in (None, "X"):
            continue
        if name in LAUNCH_NAMES:
            launches += 1
            graph_launches += name == "cudaGraphLaunch"
        elif name in SYNC_NAMES:
            syncs += 1
        elif name.startswith("cudaMemcpy") and "DtoH" in json.dumps(ev.get("args", {})):
            syncs += 1
    return {"launches": launches, "graph_launches": graph_launches, "syncs": syncs}


def read_traces(directory: Path) -> list[dict]:
    events = []
    for path in sorted(directory.rglob("*.json*")):
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rt") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        events += data.get("traceEvents", []) if isinstance(data, dict) else []
    return events


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--label", required=True, help="tiny | qwen3-8b-shape | hybrid-27b-shape")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--contexts", default="1024")
    ap.add_argument("--result", type=Path)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    runs = {}
    for context in [int(c) for c in args.contexts.split(",")]:
        for algo in ("none", "DFLASH", "DDTREE"):
            extra = ["--context", str(context), "--profile-dir", str(args.work / f"trace-{algo}-{context}")]
            rec = run_config(
                args.work / f"cost-{algo}-{context}.json", args.models, algo, args.budget, "speed,profile", extra
            )
            if rec is not None:
                runs[(algo, context)] = rec
    rows = []
    for context in sorted({c for _, c in runs}):
        speed = {
            a: {r["batch"]: r for r in runs.get((a, context), {}).get("speed", [])}
            for a in ("none", "DFLASH", "DDTREE")
        }
        prof = {
            a: {r["batch"]: r for r in runs.get((a, context), {}).get("profile", [])}
            for a in ("none", "DFLASH", "DDTREE")
        }
        for batch in sorted(speed["DDTREE"]):
            row = {"target": args.label, "batch": batch, "budget": args.budget, "context": context}
            for algo in ("none", "DFLASH", "DDTREE"):
                key = algo.lower()
                row[f"{key}_ms"] = speed[algo].get(batch, {}).get("ms_per_step")
                p = prof[algo].get(batch, {})
                row[f"{key}_launches"] = p.get("launches_per_step")
                row[f"{key}_syncs"] = p.get("syncs_per_step")
            if row["dflash_ms"] and row["ddtree_ms"]:
                row["ddtree_over_dflash"] = round(row["ddtree_ms"] / row["dflash_ms"], 3)
            rows.append(row)
    first = next(iter(runs.values()), {})
    result = {"sglang": first.get("sglang"), "gpu": first.get("gpu"), "rows": rows}
    text = json.dumps(result, indent=1)
    (args.work / f"step-cost-{args.label}.json").write_text(text)
    if args.result:
        args.result.write_text(text)
    print("| batch | context | none ms | DFLASH ms | DDTREE ms | DDTREE/DFLASH | launches none/DFLASH/DDTREE | syncs |")
    for r in rows:
        print(
            f"| {r['batch']} | {r['context']} | {r['none_ms']} | {r['dflash_ms']} | {r['ddtree_ms']} | "
            f"{r.get('ddtree_over_dflash')} | {r['none_launches']}/{r['dflash_launches']}/{r['ddtree_launches']} | "
            f"{r['none_syncs']}/{r['dflash_syncs']}/{r['ddtree_syncs']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
