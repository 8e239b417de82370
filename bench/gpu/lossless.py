"""Is DDTREE lossless inside SGLang where it matters: deep, branching accepted paths under CUDA graphs (issue 13).

For one target (pure attention or hybrid GatedDeltaNet) and the triton backend, with CUDA graphs on:

1. ``none``: greedy outputs of 32 prompts x 64 tokens at batch 1, 3 and 16 (and, with --sampling, 4000 draws of
   tokens 2-4 of one prompt at temperature 1 with top_k 20 and top_p 0.9, with top_k 20 alone, and alone);
2. an oracle file from the batch-1 outputs: the target's own greedy continuation of every prompt, forced into
   the drafter's distribution at ranks that cycle through ``PATTERN`` (junk ranked above it), so anything
   accepted is accepted deep and through non-first siblings (sglang_ddtree.sglang.testing);
3. ``DDTREE`` at each budget with the oracle, the per-round stats and the graph-vs-eager check: after every
   target verify replayed from a CUDA graph, the same verify runs eagerly and the largest logit difference
   and argmax disagreements are recorded;
4. ``--before``: the same at one budget with the plugin's graph hook left out (the capture as before the fix),
   which must show the defect;
5. a summary: per budget and batch, prompts identical to no speculation (first divergences at fp32 near-ties
   are counted apart), the accepted-depth histogram, accepted non-first siblings, graph-vs-eager max |diff|;
   with --sampling a two-sample chi-square test per token position against no speculation.

Each engine runs in its own process (sglang_ddtree_run.py). Finished runs are kept and skipped when the
command is repeated with the same --work directory (calls of the GPU host are limited to 10 minutes).

    python bench/gpu/lossless.py --models DIR --work DIR --label pure [--budgets 4,8,16] [--before] [--sampling]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import subprocess
from collections import Counter
from pathlib import Path

from engine_run import SAMPLING_SETS, exit_with, run_config

#: Rank (1 = first) of the target's continuation at successive positions (see sglang_ddtree.sglang.testing);
#: with the forced runner-up, budgets 4, 8 and 16 all accept depth >= 3 and non-first siblings (CPU-tested in
#: sglang-ddtree/tests/sglang/test_instruments.py with the same pattern).
PATTERN = [1, 1, 1, 2, 1, 1, 3]
BATCHES = "1,3,16"
#: engines whose steps choose among candidates (SGLANG_DDTREE_BUDGET), by config name; the rows' "budget"
POLICIES = {"ddtree-auto": "auto", "ddtree-chain": "chain"}


def run_engine(args, name: str, algo: str, budget: int, modes: str, env_extra: dict[str, str]) -> Path:
    out = args.work / f"{name}.json"
    stats = env_extra.get("SGLANG_DDTREE_TEST_STATS")
    if not out.exists() and stats and Path(stats).exists():
        Path(stats).unlink()  # a run cut short earlier left partial stats
    extra = ["--batches", BATCHES, "--samples", str(args.samples)]
    if algo == "none" and not has_weights(args.models):
        extra.append("--margins")  # the near-tie measure of a config-only target (divergence_margin)
    if args.prompts_file:
        extra += ["--prompts-file", str(args.prompts_file)]
    if run_config(out, args.models, algo, budget, modes, extra, env_extra) is None:
        raise subprocess.CalledProcessError(1, name)
    return out


def write_oracle(none_run: Path, path: Path) -> None:
    rec = json.loads(none_run.read_text())
    items = [{"prompt": p, "continuation": c} for p, c in zip(rec["prompts"], rec["batch1"], strict=True)]
    path.write_text(json.dumps({"items": items, "ranks": PATTERN}))


def read_stats(path: Path) -> dict[str, list[dict]]:
    """Stats lines grouped by the phase the runner marked before them."""
    phases: dict[str, list[dict]] = {}
    current = "start"
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        if "phase" in rec:
            current = rec["phase"]
            continue
        phases.setdefault(current, []).append(rec)
    return phases


def summarize_stats(rounds: list[dict]) -> dict:
    hist: Counter = Counter()
    widths: Counter = Counter()  # verify width -> (rounds, rounds replayed from graphs): the auto budget's widths
    graphed: Counter = Counter()
    nonfirst = 0
    diffs, argmax_diff, graph_rounds, tree_in_graph = [], 0, 0, 0
    for rec in rounds:
        hist.update(rec["accept_len"])
        widths[rec.get("width")] += 1
        graphed[rec.get("width")] += bool(rec.get("graph"))
        nonfirst += sum(rec["nonfirst"])
        graph_rounds += bool(rec.get("graph"))
        tree_in_graph += bool(rec.get("tree_in_graph"))
        if "graph_vs_eager_max_abs" in rec:
            diffs.append(rec["graph_vs_eager_max_abs"])
            argmax_diff += rec["graph_vs_eager_argmax_diff"]
    return {
        "rounds": len(rounds),
        "graph_rounds": graph_rounds,
        # rounds whose draft tree was built inside the drafter's CUDA graphs (the default; the test oracle and
        # SGLANG_DDTREE_TREE_IN_GRAPH=0 build it after the pass)
        "tree_in_graph_rounds": tree_in_graph,
        "accepted_depth_histogram": {str(k): hist[k] for k in sorted(hist)},
        "max_accepted_depth": max(hist) if hist else 0,
        "nonfirst_sibling_accepts": nonfirst,
        "graph_vs_eager_max_abs": max(diffs) if diffs else None,
        "graph_vs_eager_checked_rounds": len(diffs),
        "graph_vs_eager_argmax_diff_nodes": argmax_diff,
        "rounds_by_width": {str(w): [widths[w], graphed[w]] for w in sorted(widths, key=str)},
    }


def has_weights(models: Path) -> bool:
    """Whether the target's weights are on disk (bench/gpu/shapes.py's shapes are config only: SGLang fills them with
    random values, which no other program can reproduce)."""
    return any((models / "target").glob("*.safetensors")) or any((models / "target").glob("*.bin"))


def divergence_margin(args, base: dict, batch: str, idx: int, pos: int, model_cache: dict) -> float:
    """How close the baseline's choice at the first divergence was to a tie: the target's fp32 top-2 logit gap there
    (transformers, from the weights on disk), or, for a config-only target, the gap between the two most likely
    tokens that the no-speculation engine itself reported (``--margins``: its bf16 log-probabilities)."""
    if not has_weights(args.models):
        gaps = base.get(f"margins{batch.removeprefix('batch')}")
        gap = gaps[idx][pos] if gaps and pos < len(gaps[idx]) else None
        if gap is None:
            raise SystemExit(f"no weights under {args.models}/target and no engine margin for prompt {idx} token {pos}")
        return float(gap)
    from sglang_ddtree_compare import fp32_margin

    if "model" not in model_cache:
        import torch
        from transformers import AutoModelForCausalLM

        model_cache["model"] = AutoModelForCausalLM.from_pretrained(
            args.models / "target", torch_dtype=torch.float32
        ).to("cuda" if torch.cuda.is_available() else "cpu")
    return fp32_margin(model_cache["model"], base["prompts"][idx], base[batch][idx][:pos])


def equality(args, base: dict, cand: dict, batch: str, model_cache: dict) -> dict:
    from sglang_ddtree_compare import first_divergence

    identical, ties, mismatches = 0, 0, []
    for idx, (ref, got) in enumerate(zip(base[batch], cand[batch], strict=True)):
        pos = first_divergence(ref, got)
        if pos is None:
            identical += 1
            continue
        margin = divergence_margin(args, base, batch, idx, pos, model_cache)
        if margin < args.tie_margin:
            ties += 1
        else:
            mismatches.append({"prompt": idx, "token": pos, "margin": round(margin, 3)})
    return {"identical": identical, "near_ties": ties, "mismatches": len(mismatches), "mismatch_detail": mismatches[:8]}


def chi_square(a: list[int], b: list[int], min_count: int = 5) -> dict:
    """Two-sample chi-square homogeneity test of two samples of tokens; rare tokens pooled into one cell.

    Returns the statistic, degrees of freedom and the 0.001 critical value (Wilson-Hilferty approximation)."""
    ca, cb = Counter(a), Counter(b)
    keys = [k for k in set(ca) | set(cb) if ca[k] + cb[k] >= min_count]
    rest_a = sum(v for k, v in ca.items() if k not in keys)
    rest_b = sum(v for k, v in cb.items() if k not in keys)
    cells = [(ca[k], cb[k]) for k in keys] + ([(rest_a, rest_b)] if rest_a + rest_b else [])
    na, nb = sum(ca.values()), sum(cb.values())
    stat = 0.0
    for xa, xb in cells:
        total = xa + xb
        ea, eb = total * na / (na + nb), total * nb / (na + nb)
        stat += (xa - ea) ** 2 / ea + (xb - eb) ** 2 / eb
    df = max(len(cells) - 1, 1)
    z = 3.090  # one-sided 0.001
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return {
        "statistic": round(stat, 2),
        "df": df,
        "critical_0.001": round(critical, 2),
        "cells": len(cells),
        "samples": [na, nb],
        "pass": stat < critical,
    }


def sampling_test(base: dict, cand: dict, rounds: list[dict]) -> dict:
    """Tokens 2-4 of one prompt's continuations (run_sampling's record) against no speculation's: the first token
    comes from the prefill, so only the speculative rounds' tokens are tested."""
    tests = {
        f"token{pos + 1}": chi_square([o[pos] for o in base["outputs"]], [o[pos] for o in cand["outputs"]])
        for pos in (1, 2, 3)
    }
    return {"params": cand["params"], "tests": tests, "rounds": summarize_stats(rounds)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--label", required=True, choices=["pure", "hybrid"])
    ap.add_argument("--budgets", default="4,8,16")
    ap.add_argument("--before", action="store_true", help="also run budget 16 without the graph hook")
    ap.add_argument("--auto", action="store_true",
                    help="also run SGLANG_DDTREE_BUDGET=auto (issue 24) with the largest budget as the widest")
    ap.add_argument("--chain", action="store_true",
                    help="also run SGLANG_DDTREE_BUDGET=chain: every step the drafter's chain as DFLASH's own round "
                         "on the verify graphs of its width (the causal cells written into the tree-mask buffer)")
    ap.add_argument("--sampling", action="store_true", help="temperature-1 statistical test at the largest budget")
    ap.add_argument("--no-equality", action="store_true", help="only the sampling test (e.g. on a flat target)")
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument(
        "--natural",
        action="store_true",
        help="no oracle: the drafter's own trees (a trained pair of train_pair.py: natural branching)",
    )
    ap.add_argument("--prompts-file", type=Path, help="prompts (train_pair's eval_prompts.json) instead of random ids")
    ap.add_argument("--tie-margin", type=float, default=1.0)
    ap.add_argument("--graph-tol", type=float, default=0.01, help="largest |graph - eager| logit difference allowed")
    ap.add_argument("--result", type=Path, help="summary JSON (bench/results/lossless-*.json layout)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    budgets = [int(b) for b in args.budgets.split(",")]

    wanted = ([] if args.no_equality else ["equality"]) + (["sampling"] if args.sampling else [])
    # the oracle needs the greedy continuations: the none run always has them
    none_run = run_engine(args, "none", "none", 0, "equality" + (",sampling" if args.sampling else ""), {})
    oracle = args.work / "oracle.json"
    write_oracle(none_run, oracle)

    runs = []  # (name, budget, fixed)
    configs = [(f"ddtree-b{b}", b, True) for b in budgets]
    if args.before:
        configs.append(("ddtree-b16-before", 16, False))
    if args.auto:  # every step verifies the candidate the auto budget chose, at that width with its graphs
        configs.append(("ddtree-auto", max(budgets), True))
    if args.chain:  # DFLASH's round (under the oracle it drafts the oracle's chain: accepted up to the first rank 2)
        configs.append(("ddtree-chain", max(budgets), True))
    for name, budget, fixed in configs:
        env = {} if args.natural else {"SGLANG_DDTREE_TEST_ORACLE": str(oracle)}
        if name in POLICIES:
            env["SGLANG_DDTREE_BUDGET"] = POLICIES[name]
        env |= {
            "SGLANG_DDTREE_TEST_STATS": str(args.work / f"{name}.jsonl"),
            "SGLANG_DDTREE_TEST_GRAPH_CHECK": "1",
        }
        if not fixed:
            env["SGLANG_DDTREE_TEST_SKIP_HOOKS"] = "graph_get_spec_info"
        modes = [m for m in wanted if m == "equality" or (fixed and budget == max(budgets))]
        modes = ",".join(modes) or "equality"
        try:
            run_engine(args, name, "DDTREE", budget, modes, env)
        except subprocess.CalledProcessError as exc:
            print(f"{name}: engine run failed ({exc.returncode})", flush=True)
            continue
        runs.append((name, budget, fixed))

    base = json.loads(none_run.read_text())
    import sglang

    rows, cache = [], {}
    samplings = {}
    for name, budget, fixed in runs:
        cand = json.loads((args.work / f"{name}.json").read_text())
        phases = read_stats(args.work / f"{name}.jsonl")
        for batch in [] if args.no_equality else BATCHES.split(","):
            key = f"batch{batch}"
            stats = summarize_stats(phases.get(key, []))
            eq = equality(args, base, cand, key, cache)
            rows.append(
                {
                    "backend": "triton",
                    "target": args.label,
                    "batch": int(batch),
                    "budget": POLICIES.get(name, budget),
                    "graph_mask_fix": fixed,
                    "prompts": len(base[key]),
                    "near_tie_measure": "fp32 top-2 logit gap (transformers)" if has_weights(args.models)
                    else "no-speculation engine's top-2 log-probability gap",
                    **eq,
                    **stats,
                }
            )
        for key in SAMPLING_SETS:  # "sampling" (top-k with top-p) keeps its old name; others: NAME/KEY
            if key in cand and key in base:
                samplings[name if key == "sampling" else f"{name}/{key}"] = sampling_test(
                    base[key], cand[key], phases.get(key, []))
    summary = {
        "sglang": sglang.__version__,
        "date": datetime.date.today().isoformat(),
        "pattern": None if args.natural else PATTERN,
        "drafts": "natural (the drafter's own trees)" if args.natural else "forced (oracle)",
        "rows": rows,
        "sampling": samplings,
    }
    text = json.dumps(summary, indent=1)
    (args.work / f"lossless-{args.label}.json").write_text(text)
    if args.result:
        args.result.parent.mkdir(parents=True, exist_ok=True)
        args.result.write_text(text)
    print(
        "| target | fix | budget | batch | identical | ties | mismatch | max depth | non-first | graph-eager max|d| |"
        " argmax diff |"
    )
    for r in rows:
        print(
            f"| {r['target']} | {r['graph_mask_fix']} | {r['budget']} | {r['batch']} | {r['identical']}/{r['prompts']}"
            f" | {r['near_ties']} | {r['mismatches']} | {r['max_accepted_depth']} | {r['nonfirst_sibling_accepts']}"
            f" | {r['graph_vs_eager_max_abs']} | {r['graph_vs_eager_argmax_diff_nodes']} |"
        )
    for name, rec in samplings.items():
        print(name, json.dumps(rec["tests"]))
    fixed_rows = [r for r in rows if r["graph_mask_fix"]]
    ok = all(r["mismatches"] == 0 and (r["graph_vs_eager_max_abs"] or 0.0) <= args.graph_tol for r in fixed_rows)
    ok = ok and all(t["pass"] for rec in samplings.values() for t in rec["tests"].values())
    for r in rows:
        if not r["graph_mask_fix"]:  # the capture as before the fix must show the defect
            seen = r["mismatches"] > 0 or (r["graph_vs_eager_max_abs"] or 0.0) > args.graph_tol
            print(f"before the fix, batch {r['batch']}: defect {'DETECTED' if seen else 'NOT detected'}")
    print("RESULT:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    exit_with(main)
