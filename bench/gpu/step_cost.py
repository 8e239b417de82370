"""Issues 18 and 23: per-step cost of none, DFLASH and DDTREE side by side, with kernel launches, host syncs and
GPU busy time per step from the torch profiler (SGLang's own ``Engine.start_profile``), at several batch sizes and
context lengths.

    python bench/gpu/step_cost.py --models DIR --work DIR --label qwen3-8b-shape [--budgets 16] \
        [--contexts 128,1024] [--batches 1,8,32] [--context-batches 32768=1,8] [--result FILE]

Per configuration one engine (bench/gpu/sglang_ddtree_run.py --mode speed,profile, its own process): ms per
decode step (median of --repeats timed 128-token generates after a warm-up that fills the prefix cache with the
same prompts) and, from one profiled generate, launches (cudaLaunchKernel and friends; a CUDA-graph replay counts
once as cudaGraphLaunch), synchronising calls and GPU busy time (the union of kernel intervals) per step. The
profiled window includes the (cached) prefill, so per-step counts are upper bounds. Models: any pair the runner
takes, e.g. bench/gpu/shapes.py's config-only shapes (random weights: nothing is accepted, every step verifies a
full block or tree). Written ``step-cost-<label>.json``: ``{"sglang", "gpu", "commit", "rows": [{"target",
"batch", "budget", "context", "none_ms", "dflash_ms", "ddtree_ms", "ddtree_over_dflash", "none_launches",
"dflash_launches", "ddtree_launches", "*_syncs", "*_gpu_busy_ms", "dflash_greedy_vs_none", "ddtree_greedy_vs_none",
"meets_goal"}]}``
(one row per DDTREE budget, batch and context). ``*_greedy_vs_none``: the first timed generate's greedy tokens
against no speculation's on the same prompts (``{"identical", "requests", "first_divergence"}``; random weights
make near-ties, so a divergence is a lead to check with bench/gpu/lossless.py, not a verdict).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import time
from pathlib import Path

from engine_run import exit_with, run_config

LAUNCH_NAMES = {
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaGraphLaunch",
    "cudaLaunchCooperativeKernel",
}
SYNC_NAMES = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"}
HOST_CATEGORIES = {"python_function", "cpu_op", "cuda_runtime", "cuda_driver", "user_annotation"}


def host_times(events: list[dict], top: int = 100) -> tuple[dict[str, float], dict[str, float]]:
    """(self, inclusive) host microseconds by event name, the ``top`` largest of each: where the host's time goes.

    Host events (``HOST_CATEGORIES``: Python frames when the profiler records stacks, torch ops, CUDA runtime
    calls) nest per thread; an event's self time is its duration less its direct children's. A name that recurs
    inside itself counts its outermost occurrence only in the inclusive table."""
    by_thread: dict[tuple, list[tuple[float, float, str]]] = {}
    for ev in events:
        if ev.get("ph") not in (None, "X") or ev.get("cat") not in HOST_CATEGORIES or "ts" not in ev:
            continue
        start = float(ev["ts"])
        by_thread.setdefault((ev.get("pid"), ev.get("tid")), []).append(
            (start, start + float(ev.get("dur", 0.0)), ev.get("name", ""))
        )
    own: dict[str, float] = {}
    inclusive: dict[str, float] = {}
    for spans in by_thread.values():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack: list[list] = []  # [end, name, children's time, duration]

        def close(stack: list[list]) -> None:
            _, name, children, dur = stack.pop()
            own[name] = own.get(name, 0.0) + max(dur - children, 0.0)
            if all(f[1] != name for f in stack):
                inclusive[name] = inclusive.get(name, 0.0) + dur

        for start, end, name in spans:
            while stack and stack[-1][0] <= start:
                close(stack)
            if stack:
                stack[-1][2] += end - start
            stack.append([end, name, 0.0, end - start])
        while stack:
            close(stack)

    def largest(table: dict[str, float]) -> dict[str, float]:
        return dict(sorted(table.items(), key=lambda kv: -kv[1])[:top])

    return largest(own), largest(inclusive)


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals (the GPU is busy while any kernel runs)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def count_trace(events: list[dict]) -> dict:
    """Launch and sync counts of a chrome trace's events (torch profiler ``cuda_runtime``/``cuda_driver`` rows)
    and the GPU busy time in microseconds (union of ``kernel`` events; a CUDA-graph replay's kernels included).

    A device-to-host ``cudaMemcpy``/``cudaMemcpyAsync`` (``.item()``, ``.tolist()``) is a host sync too.
    ``kernel_us``: the 15 kernels (by name) with the most GPU time in the trace, in microseconds; ``host_self_us``
    and ``host_inclusive_us``: ``host_times``."""
    launches = graph_launches = syncs = 0
    kernels = []
    by_name: dict[str, float] = {}
    for ev in events:
        name = ev.get("name", "")
        if ev.get("ph") not in (None, "X"):
            continue
        if ev.get("cat") == "kernel" and "ts" in ev:
            kernels.append((float(ev["ts"]), float(ev["ts"]) + float(ev.get("dur", 0.0))))
            short = name.split("(")[0][:80]
            by_name[short] = by_name.get(short, 0.0) + float(ev.get("dur", 0.0))
            continue
        if name in LAUNCH_NAMES:
            launches += 1
            graph_launches += name == "cudaGraphLaunch"
        elif name in SYNC_NAMES:
            syncs += 1
        elif name.startswith("cudaMemcpy") and "DtoH" in json.dumps(ev.get("args", {})):
            syncs += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:15]
    host_self, host_inclusive = host_times(events)
    return {"launches": launches, "graph_launches": graph_launches, "syncs": syncs, "gpu_busy_us": busy_time(kernels),
            "kernel_us": dict(top), "host_self_us": host_self, "host_inclusive_us": host_inclusive}


def parse_ab(items: list[str]) -> list[tuple[str, dict[str, str]]]:
    """``LABEL:ENV=VALUE`` items -> [(label, {ENV: VALUE})], for the extra DDTREE engines of ``--ab``."""
    variants = []
    for item in items:
        label, sep, assignment = item.partition(":")
        name, eq, value = assignment.partition("=")
        if not (sep and eq and label and name):
            raise SystemExit(f"--ab {item!r}: write LABEL:ENV=VALUE, "
                             "e.g. tree-after-pass:SGLANG_DDTREE_TREE_IN_GRAPH=0")
        variants.append((label, {name: value}))
    return variants


#: Host spans whose self time is not per-step work. SGLang 0.5.17 handles the profiler's stop request inside
#: ``scheduler.process_input_requests`` (``profiler_manager._profile``), so that span's self time holds the profiler's
#: own stop (its Python stacks: about 100 ms once), which grows with the events recorded: more for the engine with
#: more host events, spread over the profiled steps (+160-3500 us "a step" for DDTREE against DFLASH, 12-07).
NOT_PER_STEP = frozenset({"scheduler.process_input_requests"})


def host_difference(base: dict | None, other: dict | None, top: int = 15) -> list[tuple[str, float]]:
    """The ``top`` names whose host self time per step grows most from ``base`` to ``other`` (a name missing from
    one table counts 0 there), largest first; :data:`NOT_PER_STEP` left out."""
    if not base or not other:
        return []
    grown = {name: other.get(name, 0.0) - base.get(name, 0.0) for name in (set(base) | set(other)) - NOT_PER_STEP}
    return sorted(((n, d) for n, d in grown.items() if d > 0), key=lambda kv: -kv[1])[:top]


#: Issue 23's goal for one row: DDTREE's step at most GOAL_RATIO x DFLASH's, and at most GOAL_EXTRA_LAUNCHES more
#: kernel launches a step.
GOAL_RATIO = 1.05
GOAL_EXTRA_LAUNCHES = 10


def meets_goal(row: dict) -> bool | None:
    """Whether a row meets issue 23's goal (None: DFLASH or DDTREE was not measured in it)."""
    need = ("dflash_ms", "ddtree_ms", "dflash_launches", "ddtree_launches")
    if any(row.get(k) is None for k in need):
        return None
    return (row["ddtree_ms"] <= GOAL_RATIO * row["dflash_ms"]
            and row["ddtree_launches"] <= row["dflash_launches"] + GOAL_EXTRA_LAUNCHES)


def greedy_identity(reference: list[list[int]] | None, outputs: list[list[int]] | None) -> dict | None:
    """How many requests' greedy tokens equal the reference's (no speculation, same prompts), and where each
    other one first differs (token index). None when either side recorded no tokens."""
    if not reference or not outputs or len(reference) != len(outputs):
        return None
    divergence = []
    for ref, out in zip(reference, outputs, strict=True):
        if ref != out:
            differ = (i for i, (a, b) in enumerate(zip(ref, out, strict=False)) if a != b)
            divergence.append(next(differ, min(len(ref), len(out))))
    return {"identical": len(reference) - len(divergence), "requests": len(reference),
            "first_divergence": sorted(divergence)}


def read_traces(directory: Path, wait_s: float = 60.0, poll_s: float = 0.5) -> list[dict]:
    """The ``traceEvents`` of every trace file under ``directory``. The profiler's process may still be writing one
    when ``stop_profile`` returns (a gzip that ends early: seen on the H100, 12-05), so this waits up to ``wait_s``
    for at least one file and for every file to read whole; a file still unreadable then is left out."""
    deadline = time.monotonic() + wait_s
    while True:
        events, unreadable = [], 0
        paths = sorted(directory.rglob("*.json*"))
        for path in paths:
            opener = gzip.open if path.suffix == ".gz" else open
            try:
                with opener(path, "rt") as fh:
                    data = json.load(fh)
            except (OSError, ValueError, EOFError):
                unreadable += 1
                continue
            events += data.get("traceEvents", []) if isinstance(data, dict) else []
        if (paths and not unreadable) or time.monotonic() >= deadline:
            return events
        time.sleep(poll_s)


def _commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or None
    except OSError:
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--label", required=True, help="tiny | qwen3-8b-shape | qwen36-27b-hybrid-shape")
    ap.add_argument("--budgets", default="16", help="DDTREE budgets, one engine each")
    ap.add_argument("--contexts", default="1024")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--context-batches", default="", help="per-context batch sizes, e.g. 32768=1,8;8192=1,8,32")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--algos", default="none,DFLASH,DDTREE")
    ap.add_argument("--ab", action="append", default=[], metavar="LABEL:ENV=VALUE",
                    help="also DDTREE with ENV=VALUE in its engine's environment (repeatable); row fields "
                         "ddtree_<label>_ms / _gpu_busy_ms / _kernels_us / ... (label: - becomes _)")
    ap.add_argument("--ab-attention", action="store_true",
                    help="--ab sglang-attention:SGLANG_DDTREE_VERIFY_ATTENTION=sglang (SGLang's own verify attention)")
    ap.add_argument("--ab-tree-after-pass", action="store_true",
                    help="--ab tree-after-pass:SGLANG_DDTREE_TREE_IN_GRAPH=0 (the draft tree built after the drafter "
                         "pass, against the default: inside the drafter's CUDA graphs, draft_head.py)")
    ap.add_argument("--result", type=Path)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    per_context = dict(item.split("=", 1) for item in args.context_batches.split(";") if item)
    variants = parse_ab(args.ab + (["sglang-attention:SGLANG_DDTREE_VERIFY_ATTENTION=sglang"] if args.ab_attention
                                   else [])
                        + (["tree-after-pass:SGLANG_DDTREE_TREE_IN_GRAPH=0"] if args.ab_tree_after_pass else []))
    budgets = [int(b) for b in args.budgets.split(",")]
    algos = args.algos.split(",")
    runs, failed = {}, []
    for context in [int(c) for c in args.contexts.split(",")]:
        batches = per_context.get(str(context), args.batches)
        configs = [(a, 0) for a in algos if a != "DDTREE"] + [("DDTREE", b) for b in budgets if "DDTREE" in algos]
        for algo, budget in configs:
            tag = f"{algo}{budget or ''}-{context}"
            extra = ["--context", str(context), "--profile-dir", str(args.work / f"trace-{tag}"),
                     "--speed-batches", batches, "--repeats", str(args.repeats)]
            rec = run_config(args.work / f"cost-{tag}.json", args.models, algo, budget or 16, "speed,profile", extra)
            if rec is not None:
                runs[(algo, budget, context)] = rec
            else:
                failed.append(tag)
            for label, env in variants if algo == "DDTREE" else ():
                extra[extra.index("--profile-dir") + 1] = str(args.work / f"trace-{tag}-{label}")
                rec = run_config(args.work / f"cost-{tag}-{label}.json", args.models, algo, budget, "speed,profile",
                                 extra, env_extra=env)
                if rec is not None:
                    runs[(f"DDTREE-{label}", budget, context)] = rec
                else:
                    failed.append(f"{tag}-{label}")
    rows = []

    def by_batch(algo, budget, context, mode):
        return {r["batch"]: r for r in runs.get((algo, budget, context), {}).get(mode, [])}

    for context in sorted({c for _, _, c in runs}):
        for budget in budgets:
            for batch in sorted(by_batch("DDTREE", budget, context, "speed")):
                row = {"target": args.label, "batch": batch, "budget": budget, "context": context}
                for algo, b in (("none", 0), ("DFLASH", 0), ("DDTREE", budget),
                                *((f"DDTREE-{label}", budget) for label, _ in variants)):
                    if (algo, b, context) not in runs and algo.startswith("DDTREE-"):
                        continue
                    key = algo.lower().replace("-", "_")
                    row[f"{key}_ms"] = by_batch(algo, b, context, "speed").get(batch, {}).get("ms_per_step")
                    p = by_batch(algo, b, context, "profile").get(batch, {})
                    row[f"{key}_launches"] = p.get("launches_per_step")
                    row[f"{key}_syncs"] = p.get("syncs_per_step")
                    row[f"{key}_gpu_busy_ms"] = p.get("gpu_busy_ms_per_step")
                    row[f"{key}_kernels_us"] = p.get("kernel_us_per_step")
                    row[f"{key}_host_self_us"] = p.get("host_self_us_per_step")
                    row[f"{key}_host_inclusive_us"] = p.get("host_inclusive_us_per_step")
                reference = by_batch("none", 0, context, "speed").get(batch, {}).get("outputs")
                for algo, b in (("DFLASH", 0), ("DDTREE", budget)):
                    outputs = by_batch(algo, b, context, "speed").get(batch, {}).get("outputs")
                    row[f"{algo.lower()}_greedy_vs_none"] = greedy_identity(reference, outputs)
                ddtree_outputs = by_batch("DDTREE", budget, context, "speed").get(batch, {}).get("outputs")
                for label, _ in variants:  # an A/B switch of how, not what: the same tokens as DDTREE's
                    outputs = by_batch(f"DDTREE-{label}", budget, context, "speed").get(batch, {}).get("outputs")
                    row[f"ddtree_{label.replace('-', '_')}_greedy_vs_ddtree"] = greedy_identity(ddtree_outputs, outputs)
                if row["dflash_ms"] and row["ddtree_ms"]:
                    row["ddtree_over_dflash"] = round(row["ddtree_ms"] / row["dflash_ms"], 3)
                row["meets_goal"] = meets_goal(row)
                rows.append(row)
    first = next(iter(runs.values()), {})
    result = {"sglang": first.get("sglang"), "gpu": first.get("gpu"), "commit": _commit(), "rows": rows}
    text = json.dumps(result, indent=1)
    (args.work / f"step-cost-{args.label}.json").write_text(text)
    if args.result:
        args.result.write_text(text)

    def fmt(v, digits=2):
        return "-" if v is None else f"{v:.{digits}f}"

    def same(identity):
        return "-" if identity is None else f"{identity['identical']}/{identity['requests']}"

    print("| target | batch | budget | context | none ms | DFLASH ms | DDTREE ms | DDTREE/DFLASH "
          f"| launches DFLASH/DDTREE | GPU busy DFLASH/DDTREE ms | same as none DFLASH/DDTREE "
          f"| goal (<= {GOAL_RATIO}x, <= +{GOAL_EXTRA_LAUNCHES} launches) |")
    for r in rows:
        print(
            f"| {r['target']} | {r['batch']} | {r['budget']} | {r['context']} | {fmt(r['none_ms'])} | "
            f"{fmt(r['dflash_ms'])} | {fmt(r['ddtree_ms'])} | {fmt(r.get('ddtree_over_dflash'), 3)} | "
            f"{fmt(r['dflash_launches'], 1)}/{fmt(r['ddtree_launches'], 1)} | "
            f"{fmt(r['dflash_gpu_busy_ms'])}/{fmt(r['ddtree_gpu_busy_ms'])} | "
            f"{same(r['dflash_greedy_vs_none'])}/{same(r['ddtree_greedy_vs_none'])} | "
            f"{ {True: 'met', False: 'NOT met', None: '-'}[r['meets_goal']] } |"
        )
    for r in rows:
        for label, _ in variants:
            key = "ddtree_" + label.replace("-", "_")
            ms = r.get(f"{key}_ms")
            if ms:
                ratio = f"{ms / r['dflash_ms']:.3f}" if r.get("dflash_ms") else "-"
                print(f"DDTREE {label}: batch {r['batch']} context {r['context']}: {ms:.2f} ms ({ratio} of DFLASH), "
                      f"launches {fmt(r.get(f'{key}_launches'), 1)}, same tokens as DDTREE "
                      f"{same(r.get(f'{key}_greedy_vs_ddtree'))}")
                grown = host_difference(r.get("ddtree_host_self_us"), r.get(f"{key}_host_self_us"))
                if grown:
                    print(f"host self time DDTREE {label} - DDTREE per step (us, under the profiler): "
                          + "; ".join(f"{name} {us:+.1f}" for name, us in grown))
        extra = host_difference(r.get("dflash_host_self_us"), r.get("ddtree_host_self_us"))
        if extra:
            print(f"host self time DDTREE - DFLASH per step, batch {r['batch']}, context {r['context']} (us, under the "
                  "profiler): " + "; ".join(f"{name} {us:+.1f}" for name, us in extra))
    if failed:
        print(f"engine runs failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    exit_with(main)
