"""Where the time of one DDTree tree step goes on a GPU: the vocabulary pass, the tree kernel and the walk apart.

For one (B, N, V) with D = 15 (default the issue's goal point B = 64, N = 16, V = 151936, bfloat16 logits) it
times, each captured in a CUDA graph:

* ``read_floor``: ``logits.amax(-1)``, one read of the logits (what any exact top-k must at least pay);
* ``torch_topk``: ``torch.topk`` of the logits (not exact under ties; a yardstick only);
* ``vocab``: ``topk_logprobs`` (the Triton vocabulary pass: top-N log-probabilities + normaliser per row);
* ``tree``: the Triton tree kernel on precomputed top-N candidates;
* ``walk``: the Triton greedy walk;
* ``build_tree+walk``: the whole step as ``bench/tree_build.py`` times it.

Each row gives the median over ``--iters`` replays of one graph holding ``--reps`` copies of the stage, divided
by ``--reps`` (the steady cost inside a larger captured decode step), and the median of single-copy replays
(which adds one graph launch). Extra variants come from ``--env NAME=V1,V2`` (environment variables the
kernels read; each value gets its own row), e.g. ``--env SGLANG_DDTREE_TOPK_ELEMENTS=4096,8192``.

    python bench/gpu/tree_stages.py --out stages.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sglang-ddtree" / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: tree_build.capture
from sglang_ddtree._triton_tree import build_sorted
from sglang_ddtree._triton_vocab import topk_logprobs
from sglang_ddtree._triton_walk import greedy_walk as triton_walk
from sglang_ddtree.tree import build_tree
from sglang_ddtree.verify import greedy_walk
from tree_build import capture

DEPTH = 15


def time_graph(graph, iters, reps):
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times), min(times), max(times)


def measure(name, fn, args, extra):
    many = capture(fn, args.reps)
    med, lo, hi = time_graph(many, args.iters, args.reps)
    one = capture(fn)
    single, _, _ = time_graph(one, args.iters, 1)
    row = {"stage": name, **extra, "ms": med, "ms_min": lo, "ms_max": hi, "single_replay_ms": single}
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--env", action="append", default=[], help="NAME=V1,V2,... kernel knobs to sweep")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tree_stages.py needs a CUDA device")
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    bsz, budget, vocab = args.batch, args.budget, args.vocab
    logits = (torch.randn((bsz, DEPTH, vocab), generator=gen, device=device) * 3).to(getattr(torch, args.dtype))
    flat = logits.view(bsz * DEPTH, vocab)
    target = torch.randint(0, vocab, (bsz, budget + 1), generator=gen, device=device)
    values, ids, _, _, _ = topk_logprobs(flat, budget)
    values, ids = values.view(bsz, DEPTH, budget), ids.view(bsz, DEPTH, budget)
    fields = build_sorted(values, ids, budget)
    target[:, 0] = fields["tokens"][:, 0]

    knobs = []
    for spec in args.env:
        name, _, vals = spec.partition("=")
        knobs.append([(name, v) for v in vals.split(",")])
    rows = [
        measure("read_floor", lambda: flat.amax(-1), args, {}),
        measure("torch_topk", lambda: torch.topk(flat, budget, dim=-1), args, {}),
    ]
    combos = list(itertools.product(*knobs)) if knobs else [()]
    for combo in combos:
        saved = {name: os.environ.get(name) for name, _ in combo}
        os.environ.update(dict(combo))
        extra = {"env": dict(combo)}
        try:
            rows.append(measure("vocab", lambda: topk_logprobs(flat, budget), args, extra))
            rows.append(measure("tree", lambda: build_sorted(values, ids, budget), args, extra))
            rows.append(
                measure(
                    "build_tree+walk",
                    lambda: greedy_walk(build_tree(logits, budget, backend="triton"), target, backend="triton"),
                    args,
                    extra,
                )
            )
        except Exception as exc:  # one failing variant must not hide the others
            rows.append({"stage": "error", **extra, "error": f"{type(exc).__name__}: {exc}"[:500]})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        finally:
            for name, old in saved.items():
                if old is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = old
    rows.append(measure("walk", lambda: triton_walk(fields["parents"], fields["tokens"], target, DEPTH), args, {}))
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "B": bsz, "N": budget, "V": vocab}
    meta["dtype"] = args.dtype
    print(f"DDTree step stages on {meta['gpu']}: B={bsz} N={budget} V={vocab} D={DEPTH} {args.dtype}, ms per copy")
    print("")
    print("| stage | knobs | median ms | min | max | single replay ms |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        if r["stage"] == "error":
            print(f"| error | {r.get('env', '')} | {r['error']} | | | |")
            continue
        knobs = " ".join(f"{k}={v}" for k, v in r.get("env", {}).items())
        times = " | ".join(f"{r[k]:.4f}" for k in ("ms", "ms_min", "ms_max", "single_replay_ms"))
        print(f"| {r['stage']} | {knobs} | {times} |")
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
