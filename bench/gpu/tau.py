"""Issue 15's table: tau and tokens/s of no speculation, DFLASH and DDTREE (budgets 4, 8, 16, 32) in real SGLang, at
batch 1, 8 and 32, greedy and temperature 1, on the trained pair of bench/gpu/train_pair.py, beside the reference
engine's tau (and z-lab's chain tau) from that run's train_log.json.

    PYTHONPATH=/tmp/site python bench/gpu/train_pair.py --out /tmp/pair          # train (same GPU run)
    PYTHONPATH=/tmp/site python bench/gpu/tau.py --pair /tmp/pair --work /tmp/tau --result $OUT/tau.json

One engine per configuration, each in its own process (bench/gpu/sglang_ddtree_run.py --mode tau); finished
configurations are skipped when the command is repeated with the same --work (calls of the GPU host are limited).
Writes ``{"target", "drafter", "rows": [{"method", "budget", "batch", "temperature", "tau_sglang", "tau_reference",
"tau_zlab", "tok_s", "speedup"}]}`` and prints the table in the layout of the DDTree paper's Table 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine_run import OutOfTime, run_config
from sglang_ddtree.budget import least_widest_budget

#: The engines, in the order they run: auto (with its held candidates) first, so that a call cut short still
#: compares it with every budget in its own engine.
CONFIGS = [("DDTREE", "auto"), ("none", 0), ("DFLASH", 0), ("DDTREE", "auto-events"), ("DDTREE", 16),
           ("DDTREE", 8), ("DDTREE", 32), ("DDTREE", 4)]
#: DDTREE "auto" (issue 24): SGLANG_DDTREE_BUDGET=auto on a server whose widest budget is this (candidates: the
#: chain, 4, 8, 16, 32), its choices written by the worker to the stats file (sglang_ddtree.sglang.auto_budget);
#: "auto-events" the same with the step costs read by CUDA events around each round (SGLANG_DDTREE_STEP_CLOCK=events)
AUTO_WIDEST = 32
AUTO_ENV = {"auto": {}, "auto-events": {"SGLANG_DDTREE_STEP_CLOCK": "events"}}
#: The auto engine (period clock, the default) also times each of its candidates held fixed (the plugin's test-only
#: SGLANG_DDTREE_TEST_BUDGET), so that auto's choice is compared with every fixed budget in one engine, its graphs
#: and its process: engine starts differ by more than the budgets do on the host-bound tiny pair (12-06b).
FORCED_IN = {"auto": "chain,4,8,16,32"}
#: Seconds the auto engine with its held candidates needs at least (six times the timed passes of one engine: about
#: 200 s estimated on the lent H100, 45 s for the others): not started with less of run_all.sh's call left.
FORCED_NEED_S = 240


def config_name(method: str, budget) -> str:
    """How ``--configs`` names an engine of CONFIGS: none, DFLASH, auto, auto-events or the DDTREE budget."""
    return method if method in ("none", "DFLASH") else str(budget)


def config_names(text: str) -> set[str]:
    """``--configs``' value: a set of :func:`config_name` names, each one of CONFIGS'."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    known = [config_name(m, b) for m, b in CONFIGS]
    if not names or names - set(known):
        raise argparse.ArgumentTypeError(f"--configs takes a comma-separated subset of {','.join(known)}, got {text!r}")
    return names


def reservation(budget: int, block_size: int) -> int:
    """The widest budget a server verifying ``budget`` nodes needs (the plugin's start-up rule,
    ``sglang_ddtree.budget.least_widest_budget``): a budget below half the block is served as
    ``SGLANG_DDTREE_BUDGET=budget`` under a wider ``--speculative-num-draft-tokens``."""
    return max(budget, least_widest_budget(block_size))


def drafter_block_size(drafter: Path) -> int:
    cfg = json.loads((drafter / "config.json").read_text())
    return int((cfg.get("dflash_config") or {}).get("block_size") or cfg["block_size"])


def last_stats(path: Path) -> dict | None:
    """The auto budget's last stats line (steps, budget_histogram, step_ms), or None."""
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1]) if lines else None


def reference_tau(log: dict, method: str, budget: int, temperature: float) -> float | None:
    """tau_emitted of the reference engine's matching row (train_pair's eval), or None."""
    mode = {"DFLASH": "dflash", "DDTREE": "ddtree"}.get(method)
    for row in log.get("eval", {}).get("rows", []):
        if (
            row["mode"] == mode
            and float(row["temperature"]) == temperature
            and (method == "DFLASH" or row["budget"] == budget)
        ):
            return row.get("tau_emitted", row["tau"])
    return None


def reference_tau_bf16(log: dict, method: str, temperature: float) -> float | None:
    """The reference DFLASH chain's greedy tau_emitted with both models in bf16 (SGLang's dtype), or None."""
    row = log.get("eval", {}).get("dflash_greedy_bf16") or {}
    if method == "DFLASH" and temperature == 0 and "tau_emitted" in row:
        return row["tau_emitted"]
    return None


def zlab_tau(log: dict, method: str, temperature: float) -> float | None:
    z = log.get("eval", {}).get("zlab_chain_greedy") or {}
    if method == "DFLASH" and temperature == 0 and "tau" in z:
        return z["tau"]
    return None


def table_rows(runs: dict[tuple[str, int | str], dict], log: dict) -> list[dict]:
    """Rows of the result (every configuration x batch x temperature), speedup = tok_s / no speculation's; the
    auto budget's rows are ``ddtree-auto`` with ``budget_histogram`` (the row's own timed rounds per budget, as the
    runner read them from the server; the whole run's from the stats file where the runner had none),
    ``graphs`` (the extra verify widths' capture: widths, seconds, GB), the clock and the step costs measured."""
    base = {(r["batch"], r["temperature"]): r["tok_s"] for r in runs.get(("none", 0), {}).get("tau", [])}
    rows = []
    for (run_method, run_budget), rec in runs.items():
        for r in rec.get("tau", []):
            method, budget = run_method, run_budget
            ref_none = base.get((r["batch"], r["temperature"]))
            forced = r.get("forced")
            if forced is not None:  # a candidate held fixed in the auto engine: priced as that fixed method
                method, budget = ("DFLASH", 0) if forced == "chain" else ("DDTREE", int(forced))
            auto = budget in AUTO_ENV
            rows.append(
                {
                    "method": "ddtree-auto" if auto else "ddtree-in-auto" if forced is not None else method.lower(),
                    "budget": "chain" if forced == "chain" else budget or None,
                    "batch": r["batch"],
                    "temperature": r["temperature"],
                    "tau_sglang": round(r["tau"], 4) if method != "none" else 1.0,
                    "tau_reference": None if auto else (
                        reference_tau(log, method, budget, r["temperature"]) if method != "none" else 1.0),
                    "tau_zlab": zlab_tau(log, method, r["temperature"]),
                    **({"tau_reference_bf16": bf16} if (bf16 := reference_tau_bf16(log, method, r["temperature"]))
                       is not None else {}),
                    "tok_s": round(r["tok_s"], 1),
                    # wall time per decode round: tokens per round (tau per request x batch) over tokens per ms
                    "ms_per_round": round(1000.0 * (r["tau"] if method != "none" else 1.0) * r["batch"] / r["tok_s"], 3)
                    if r["tok_s"] else None,
                    "speedup": round(r["tok_s"] / ref_none, 3) if ref_none else None,
                    # tok/s spread over the timed passes, and the host's load around the engine (a loaded host's
                    # numbers are not comparable with another run's)
                    "tok_s_range": [round(r[k], 1) for k in ("tok_s_min", "tok_s_max") if k in r] or None,
                    "host_load": rec.get("host_load"),
                    **({key: (rec.get("budget_stats") or {}).get(key)
                        for key in ("budget_histogram", "graphs", "clock", "step_ms")} if auto else {}),
                    **({"budget_histogram": r["budget_histogram"]} if auto and r.get("budget_histogram") else {}),
                }
            )
    return rows


#: Issue 24's goal: at every batch and temperature, auto's tokens/s at least this share of the best fixed method's
#: (DFLASH or a DDTREE budget, same run), and at batch 1 (both temperatures) at least AUTO_OVER_DFLASH x DFLASH's.
AUTO_OVER_BEST = 0.98
AUTO_OVER_DFLASH = 1.10


def fixed_cells(rows: list[dict], field: str, name, methods: tuple[str, ...] = ("dflash", "ddtree")
                ) -> dict[tuple[float, int], dict[str, float]]:
    """{(temperature, batch): {name(method, budget): row[field]}} of the rows of ``methods`` (default the fixed
    engines: DFLASH's and the DDTREE budgets') where ``field`` is set."""
    cells: dict[tuple[float, int], dict[str, float]] = {}
    for r in rows:
        if r["method"] in methods and r.get(field):
            cells.setdefault((r["temperature"], r["batch"]), {})[name(r["method"], r["budget"])] = r[field]
    return cells


def _goal_name(method: str, budget: int | None) -> str:
    return "dflash" if method == "dflash" else f"ddtree-{budget}"


def goal_rows(rows: list[dict]) -> list[dict]:
    """Issue 24's goal per (auto row, temperature, batch): the best fixed method there (``dflash`` or ``ddtree-N``)
    and its tok/s, auto's tok/s over it and over DFLASH's, and ``meets_goal`` (None when a fixed method is
    missing: an incomplete run proves nothing either way)."""
    fixed = fixed_cells(rows, "tok_s", _goal_name)
    every = {"dflash", *(_goal_name("ddtree", b) for m, b in CONFIGS if m == "DDTREE" and isinstance(b, int))}
    out = []
    for r in rows:
        if r["method"] != "ddtree-auto" or not r["tok_s"]:
            continue
        cell = fixed.get((r["temperature"], r["batch"]), {})
        best = max(cell, key=cell.get) if cell else None
        over_best = round(r["tok_s"] / cell[best], 3) if best else None
        over_dflash = round(r["tok_s"] / cell["dflash"], 3) if "dflash" in cell else None
        complete = every <= set(cell)
        meets = None
        if complete:
            meets = over_best >= AUTO_OVER_BEST and (r["batch"] != 1 or over_dflash >= AUTO_OVER_DFLASH)
        out.append({"auto": r["budget"], "temperature": r["temperature"], "batch": r["batch"], "best": best,
                    "best_tok_s": cell.get(best), "auto_tok_s": r["tok_s"], "auto_over_best": over_best,
                    "auto_over_dflash": over_dflash, "meets_goal": meets})
    return out


def same_engine_rows(rows: list[dict]) -> list[dict]:
    """Auto against its own candidates held fixed in the same engine (``ddtree-in-auto`` rows), per temperature and
    batch: the best of them, its tok/s, and auto's over it (issue 24's 0.98 apart from the engine-to-engine
    differences)."""
    held = fixed_cells(rows, "tok_s", lambda method, budget: str(budget), methods=("ddtree-in-auto",))
    out = []
    for r in rows:
        cell = held.get((r["temperature"], r["batch"]))
        if r["method"] != "ddtree-auto" or r["budget"] not in FORCED_IN or not cell or not r["tok_s"]:
            continue
        best = max(cell, key=cell.get)
        out.append({"temperature": r["temperature"], "batch": r["batch"], "best": best, "best_tok_s": cell[best],
                    "auto_tok_s": r["tok_s"], "auto_over_best": round(r["tok_s"] / cell[best], 3),
                    "held_tok_s": cell, "budget_histogram": r.get("budget_histogram")})
    return out


def clock_rows(rows: list[dict]) -> list[dict]:
    """What each auto run's clock measured per candidate beside the wall time a round of that candidate took in its
    own fixed engine (``ms_per_round``, same batch and temperature): a clock that ranks the candidates unlike the
    wall time makes auto choose unlike the best fixed method. One row per auto run, batch and temperature; the
    auto run's ``step_ms`` of the batch's bucket (``b<=1``, ``b<=8``, ``b<=32``: every temperature together), and
    ``held_ms_per_round``: the wall time a round took with the auto engine held at each candidate (FORCED_IN), the
    same process and graphs (bench/results/tau-h100-2026-12-07.md reads one such check)."""
    # named as the auto budget's stats name its candidates
    wall = fixed_cells(rows, "ms_per_round", lambda method, budget: "chain" if method == "dflash" else str(budget))
    held = fixed_cells(rows, "ms_per_round", lambda method, budget: str(budget), methods=("ddtree-in-auto",))
    out = []
    for r in rows:
        if r["method"] != "ddtree-auto":
            continue
        bucket = f"b<={1 << max(0, int(r['batch'] - 1).bit_length())}"
        measured = (r.get("step_ms") or {}).get(bucket) or {}
        out.append({"auto": r["budget"], "clock": r.get("clock"), "temperature": r["temperature"],
                    "batch": r["batch"], "bucket": bucket, "measured_ms": measured,
                    "wall_ms_per_round": wall.get((r["temperature"], r["batch"]), {}),
                    "held_ms_per_round": held.get((r["temperature"], r["batch"]), {})})
    return out


def goal_markdown(goals: list[dict]) -> str:
    lines = ["| auto | T | batch | best fixed (tok/s) | auto tok/s | auto / best | auto / DFLASH | goal |",
             "|---|---:|---:|---|---:|---:|---:|---|"]
    for g in goals:
        verdict = {True: "met", False: "NOT met", None: "incomplete"}[g["meets_goal"]]
        lines.append(f"| {g['auto']} | {g['temperature']} | {g['batch']} | {g['best']} ({g['best_tok_s']}) | "
                     f"{g['auto_tok_s']} | {g['auto_over_best']} | {g['auto_over_dflash']} | {verdict} |")
    return "\n".join(lines)


def markdown(rows: list[dict]) -> str:
    """Paper Table 1 layout: one line per method/budget, per (temperature, batch) tau and speedup."""
    cols = sorted({(r["temperature"], r["batch"]) for r in rows})
    head = "| method | " + " | ".join(f"T={t} b={b}: tau / speedup" for t, b in cols) + " |"
    lines = [head, "|---|" + "---:|" * len(cols)]
    by = {}
    for r in rows:
        by.setdefault((r["method"], r["budget"]), {})[(r["temperature"], r["batch"])] = r
    for (method, budget), cells in by.items():
        name = method if budget is None else f"{method} {budget}"
        vals = []
        for c in cols:
            r = cells.get(c)
            vals.append("-" if r is None else f"{r['tau_sglang']:.2f} (ref {r['tau_reference']}) / {r['speedup']}x")
        lines.append(f"| {name} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", required=True, type=Path, help="train_pair.py output (target/, drafter/, ...)")
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--result", type=Path)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--configs", type=config_names, default=None,
                    help="a subset of the engines, comma-separated, run in the table's order: none, DFLASH, auto, "
                         "auto-events or a DDTREE budget (4, 8, 16, 32); default all. The auto engine times its "
                         "candidates held fixed, so none,DFLASH,auto compares auto with every budget in one engine")
    ap.add_argument("--new-tokens", type=int, default=0,
                    help="new tokens per request (default: the reference evaluation's, from the pair's train_log)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    log_path = args.pair / "train_log.json"
    log = json.loads(log_path.read_text()) if log_path.exists() else {}
    if not args.new_tokens:  # the reference's tau is over its own length: compare like with like
        args.new_tokens = int(log.get("settings", {}).get("eval_new_tokens", 128))
    block = drafter_block_size(args.pair / "drafter")
    runs = {}
    unfinished = False
    for method, budget in CONFIGS:
        if args.configs is not None and config_name(method, budget) not in args.configs:
            continue
        extra = [
            "--prompts-file",
            str(args.pair / "eval_prompts.json"),
            "--batches",
            args.batches,
            "--temperatures",
            args.temperatures,
            "--new-tokens",
            str(args.new_tokens),
        ]
        env, need = None, None
        widest = AUTO_WIDEST if budget in AUTO_ENV else budget or 16
        if budget in AUTO_ENV:
            stats = args.work / f"tau-DDTREE-{budget}-budget.jsonl"
            env = {"SGLANG_DDTREE_BUDGET": "auto", "SGLANG_DDTREE_BUDGET_STATS": str(stats), **AUTO_ENV[budget]}
            if budget in FORCED_IN:
                env["SGLANG_DDTREE_TEST_BUDGET"] = str(args.work / f"tau-DDTREE-{budget}-forced.txt")
                extra += ["--force-budgets", FORCED_IN[budget]]
                need = FORCED_NEED_S
        elif method == "DDTREE" and reservation(budget, block) > budget:
            widest = reservation(budget, block)
            env = {"SGLANG_DDTREE_BUDGET": str(budget)}
        try:
            rec = run_config(args.work / f"tau-{method}-{budget}.json", args.pair, method, widest, "tau", extra, env,
                             need_s=need)
        except OutOfTime as exc:  # a failed step (the next call goes on); the engines after it that finished in an
            print(exc, flush=True)  # earlier call, or need less time than is left, still make this call's table
            unfinished = True
            continue
        if rec is not None and budget in AUTO_ENV:
            rec["budget_stats"] = last_stats(stats)
        if rec is not None:
            runs[(method, budget)] = rec
    rows = table_rows(runs, log)
    result = {
        "target": str(args.pair / "target"),
        "drafter": str(args.pair / "drafter"),
        "sglang": next(iter(runs.values()), {}).get("sglang"),
        "new_tokens": args.new_tokens,
        "rows": rows,
        "goal": goal_rows(rows),
        "same_engine": same_engine_rows(rows),
        "clock_check": clock_rows(rows),
    }
    text = json.dumps(result, indent=1)
    (args.work / "tau.json").write_text(text)
    if args.result:
        args.result.write_text(text)
    print(markdown(rows))
    print(goal_markdown(result["goal"]))
    for g in result["same_engine"]:
        print(f"same engine T={g['temperature']} b={g['batch']}: auto {g['auto_tok_s']} tok/s, best held "
              f"{g['best']} {g['best_tok_s']} ({g['auto_over_best']}); held {g['held_tok_s']}; "
              f"auto chose {g['budget_histogram']}")
    return 1 if unfinished else 0


if __name__ == "__main__":
    sys.exit(main())
