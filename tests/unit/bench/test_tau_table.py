"""bench/gpu/tau.py on the CPU: which server serves a narrow budget (the KV reservation rule), the drafter's block
size as the trained pair writes it, and the rows of the table (speedups against no speculation, the auto row's
histogram), on CONSTRUCTED runner records (named ``constructed_*``). The GPU run is bench/gpu/run_all.sh's tau."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))  # tau.py imports engine_run from beside it
spec = importlib.util.spec_from_file_location("tau_bench", ROOT / "bench" / "gpu" / "tau.py")
tau = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tau)
import sglang_ddtree_run  # the runner's tau mode, beside tau.py's table


@pytest.mark.parametrize(
    ("budget", "block", "widest"),
    [(4, 16, 7), (7, 16, 7), (8, 16, 8), (16, 16, 16), (32, 16, 32), (4, 8, 4), (2, 8, 3), (1, 4, 1)],
)
def test_a_budget_below_half_the_block_is_served_under_a_wider_reservation(budget, block, widest):
    # SGLang's DFLASH decode reserves 2 x (widest + 1) slots a step; the block must fit: 2 * (widest + 1) >= block
    assert tau.reservation(budget, block) == widest
    assert 2 * (widest + 1) >= block


def test_the_block_size_is_read_from_the_drafter_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"block_size": 99, "dflash_config": {"block_size": 16}}))
    assert tau.drafter_block_size(tmp_path) == 16
    (tmp_path / "config.json").write_text(json.dumps({"block_size": 8}))
    assert tau.drafter_block_size(tmp_path) == 8


def constructed_record(rows):
    return {"tau": [dict(zip(("batch", "temperature", "tau", "tok_s"), r, strict=True)) for r in rows]}


def test_rows_price_every_method_against_no_speculation_and_carry_the_auto_histogram():
    runs = {
        ("none", 0): constructed_record([(1, 0.0, 1.0, 100.0), (8, 0.0, 1.0, 400.0)]),
        ("DFLASH", 0): constructed_record([(1, 0.0, 2.7, 180.0)]),
        ("DDTREE", "auto"): {**constructed_record([(1, 0.0, 3.4, 230.0)]),
                             "budget_stats": {"budget_histogram": {"chain": 1, "16": 9}}},
        ("DDTREE", "auto-events"): {**constructed_record([(1, 0.0, 3.3, 250.0)]),
                                    "budget_stats": {"budget_histogram": {"chain": 2, "16": 8}, "clock": "events"}},
        ("DDTREE", 4): constructed_record([(8, 0.0, 2.6, 500.0)]),
    }
    log = {"eval": {"rows": [{"mode": "dflash", "temperature": 0.0, "budget": None, "tau": 2.7, "tau_emitted": 2.65},
                             {"mode": "ddtree", "temperature": 0.0, "budget": 4, "tau": 2.6}],
                    "zlab_chain_greedy": {"tau": 2.57}, "dflash_greedy_bf16": {"tau_emitted": 2.69}}}
    rows = {(r["method"], r["budget"], r["batch"]): r for r in tau.table_rows(runs, log)}
    assert rows[("dflash", None, 1)]["speedup"] == 1.8 and rows[("dflash", None, 1)]["tau_reference"] == 2.65
    assert rows[("dflash", None, 1)]["tau_zlab"] == 2.57
    assert rows[("dflash", None, 1)]["tau_reference_bf16"] == 2.69  # the reference chain in SGLang's dtype
    assert "tau_reference_bf16" not in rows[("ddtree", 4, 8)]
    assert rows[("dflash", None, 1)]["ms_per_round"] == 15.0  # 2.7 tokens a round at 180 tokens/s
    assert rows[("ddtree", 4, 8)]["ms_per_round"] == pytest.approx(41.6)  # 8 x 2.6 tokens a round at 500 tokens/s
    auto = rows[("ddtree-auto", "auto", 1)]
    assert auto["speedup"] == 2.3 and auto["budget_histogram"] == {"chain": 1, "16": 9}
    assert auto["tau_reference"] is None  # the reference engine has no auto budget
    events = rows[("ddtree-auto", "auto-events", 1)]  # the same policy, costs from CUDA events
    assert events["speedup"] == 2.5 and events["budget_histogram"] == {"chain": 2, "16": 8}
    assert events["tau_reference"] is None
    assert rows[("ddtree", 4, 8)]["speedup"] == 1.25 and rows[("ddtree", 4, 8)]["tau_reference"] == 2.6
    assert "budget_histogram" not in rows[("ddtree", 4, 8)]
    # a runner that read the row's own rounds per budget from the server: that, not the whole run's
    runs[("DDTREE", "auto")]["tau"][0]["budget_histogram"] = {"chain": 0, "16": 4}
    own = {(r["method"], r["budget"], r["batch"]): r for r in tau.table_rows(runs, log)}[("ddtree-auto", "auto", 1)]
    assert own["budget_histogram"] == {"chain": 0, "16": 4}


def _row(method, budget, batch, temperature, tok_s):
    return {"method": method, "budget": budget, "batch": batch, "temperature": temperature, "tok_s": tok_s}


def test_the_goal_compares_auto_with_the_best_fixed_method_of_its_cell():
    fixed = [("dflash", None, 100.0), ("ddtree", 4, 90.0), ("ddtree", 8, 110.0), ("ddtree", 16, 120.0),
             ("ddtree", 32, 125.0)]
    rows = [_row(m, b, 1, 0.0, v) for m, b, v in fixed]
    rows += [_row(m, b, 8, 0.0, v) for m, b, v in fixed]
    rows += [_row("ddtree-auto", "auto", 1, 0.0, 123.0), _row("ddtree-auto", "auto-events", 1, 0.0, 121.0),
             _row("ddtree-auto", "auto", 8, 0.0, 120.0)]
    goals = {(g["auto"], g["batch"]): g for g in tau.goal_rows(rows)}
    met = goals[("auto", 1)]
    assert met["best"] == "ddtree-32" and met["auto_over_best"] == 0.984 and met["auto_over_dflash"] == 1.23
    assert met["meets_goal"] is True
    assert goals[("auto-events", 1)]["meets_goal"] is False  # 0.968 of the best
    assert goals[("auto", 8)]["auto_over_best"] == 0.96 and goals[("auto", 8)]["meets_goal"] is False
    assert "NOT met" in tau.goal_markdown(list(goals.values()))


def test_the_goal_needs_every_fixed_method_and_at_batch_1_auto_beats_dflash_by_ten_percent():
    rows = [_row("dflash", None, 1, 0.0, 100.0), _row("ddtree", 16, 1, 0.0, 105.0),
            _row("ddtree-auto", "auto", 1, 0.0, 108.0)]
    (partial,) = tau.goal_rows(rows)
    assert partial["meets_goal"] is None and partial["best"] == "ddtree-16"  # budgets 4, 8, 32 missing
    rows += [_row("ddtree", b, 1, 0.0, 60.0) for b in (4, 8, 32)]
    (full,) = tau.goal_rows(rows)
    assert full["auto_over_best"] == 1.029 and full["auto_over_dflash"] == 1.08
    assert full["meets_goal"] is False  # within 2% of the best, but not 1.10 x DFLASH at batch 1
    wider = [{**r, "batch": 8} for r in rows]
    assert tau.goal_rows(wider)[0]["meets_goal"] is True  # the 1.10 x DFLASH bar is batch 1's only


def test_the_clock_check_sets_auto_measured_costs_beside_the_fixed_engines_wall_time():
    rows = [{**_row("dflash", None, 8, 0.0, 100.0), "ms_per_round": 6.8},
            {**_row("ddtree", 32, 8, 0.0, 120.0), "ms_per_round": 8.1},
            {**_row("ddtree", 32, 1, 0.0, 120.0), "ms_per_round": 5.2},
            {**_row("ddtree-auto", "auto", 8, 0.0, 110.0), "clock": "events",
             "step_ms": {"b<=1": {"32": 4.0}, "b<=8": {"chain": 6.5, "32": 6.6}}},
            {**_row("ddtree-auto", "auto", 3, 0.0, 110.0), "clock": "events", "step_ms": {}},
            {**_row("ddtree-in-auto", "chain", 8, 0.0, 90.0), "ms_per_round": 6.9},
            {**_row("ddtree-in-auto", 32, 8, 0.0, 90.0), "ms_per_round": 7.7},
            {**_row("ddtree-in-auto", 32, 8, 1.0, 90.0), "ms_per_round": 9.9}]
    check = tau.clock_rows(rows)
    assert check[0] == {"auto": "auto", "clock": "events", "temperature": 0.0, "batch": 8, "bucket": "b<=8",
                        "measured_ms": {"chain": 6.5, "32": 6.6}, "wall_ms_per_round": {"chain": 6.8, "32": 8.1},
                        "held_ms_per_round": {"chain": 6.9, "32": 7.7}}
    assert check[1]["bucket"] == "b<=4" and check[1]["measured_ms"] == {} and check[1]["wall_ms_per_round"] == {}
    assert check[1]["held_ms_per_round"] == {} and len(check) == 2


class _ConstructedEngine:
    """Stands in for an SGLang engine (no GPU in CI): each request's verify rounds are its first token id."""

    def generate(self, input_ids, sampling_params):
        n = sampling_params["max_new_tokens"]
        return [{"meta_info": {"completion_tokens": n, "spec_verify_ct": ids[0]}} for ids in input_ids]


def test_tau_counts_rounds_per_request_of_the_last_timed_pass():
    prompts = [[3, 9], [5, 9], [2, 9]]
    out = sglang_ddtree_run.run_tau(_ConstructedEngine(), prompts, [1, 2], [0.0], 11, "DFLASH", repeats=2)
    one, two = out["tau"]
    assert one["rounds_per_request"] == [3, 5, 2]  # prompt order at batch 1
    assert two["rounds_per_request"] == [3, 5, 2, 3]  # cycled to fill the last group of 2
    assert one["rounds"] == 2 * (3 + 5 + 2)  # two timed passes
    assert one["tau"] == pytest.approx(2 * 3 * 10 / one["rounds"])


class _ConstructedDDTreeEngine(_ConstructedEngine):
    """As _ConstructedEngine, and the DDTREE worker's budget report of /get_server_info: every round verifies 16
    except the first request's of a call, which verifies the chain."""

    def __init__(self):
        self.rounds = {"chain": 0, "16": 0}

    def generate(self, input_ids, sampling_params):
        out = super().generate(input_ids, sampling_params)
        self.rounds["chain"] += 1
        self.rounds["16"] += sum(o["meta_info"]["spec_verify_ct"] for o in out) - 1
        return out

    def get_server_info(self):
        return {"internal_states": [{"ddtree_budget": {"budget_histogram": dict(self.rounds)}}]}


def test_a_ddtree_row_has_the_rounds_per_budget_of_its_timed_passes_only():
    prompts = [[3, 9], [5, 9], [2, 9]]
    engine = _ConstructedDDTreeEngine()
    one, two = sglang_ddtree_run.run_tau(engine, prompts, [1, 3], [0.0], 11, "DDTREE", repeats=2)["tau"]
    # batch 1: three calls a pass, 10 rounds; two timed passes (the warm-up's are not counted)
    assert one["budget_histogram"] == {"chain": 6, "16": 14} and sum(one["budget_histogram"].values()) == one["rounds"]
    assert two["budget_histogram"] == {"chain": 2, "16": 18}  # one call a pass at batch 3
    assert engine.rounds == {"chain": 12, "16": 48}  # warm-ups included
    assert "budget_histogram" not in sglang_ddtree_run.run_tau(
        _ConstructedEngine(), prompts, [1], [0.0], 11, "DFLASH", repeats=1)["tau"][0]


class _ConstructedForcedEngine(_ConstructedEngine):
    """As _ConstructedEngine, with a DDTREE worker that reads SGLANG_DDTREE_TEST_BUDGET's file before every call and
    counts the call's rounds under the candidate it names (``auto`` for its own choice)."""

    def __init__(self, path):
        self.path = path
        self.rounds = {"auto": 0, "chain": 0, "8": 0}

    def generate(self, input_ids, sampling_params):
        out = super().generate(input_ids, sampling_params)
        self.rounds[self.path.read_text()] += sum(o["meta_info"]["spec_verify_ct"] for o in out)
        return out

    def get_server_info(self):
        return {"internal_states": [{"ddtree_budget": {"budget_histogram": dict(self.rounds)}}]}


def test_forced_rows_time_every_named_candidate_in_autos_engine(monkeypatch, tmp_path):
    path = tmp_path / "budget"
    monkeypatch.setenv("SGLANG_DDTREE_TEST_BUDGET", str(path))
    engine = _ConstructedForcedEngine(path)
    rows = sglang_ddtree_run.run_tau(engine, [[3, 9], [5, 9]], [1, 2], [0.0, 1.0], 11, "DDTREE", repeats=1,
                                     forced=["chain", "8"])["tau"]
    # per temperature and batch: auto's row, then one per forced candidate, each with its own rounds only
    assert [(r["temperature"], r["batch"], r.get("forced")) for r in rows[:6]] == [
        (0.0, 1, None), (0.0, 1, "chain"), (0.0, 1, "8"), (0.0, 2, None), (0.0, 2, "chain"), (0.0, 2, "8")]
    assert len(rows) == 12
    assert rows[1]["budget_histogram"] == {"auto": 0, "chain": 8, "8": 0}  # 3 + 5 rounds, one timed pass
    assert rows[2]["budget_histogram"] == {"auto": 0, "chain": 0, "8": 8}
    assert rows[0]["budget_histogram"] == {"auto": 8, "chain": 0, "8": 0}
    assert path.read_text() == "auto"  # the engine is left to its own choice
    monkeypatch.delenv("SGLANG_DDTREE_TEST_BUDGET")
    with pytest.raises(SystemExit, match="needs SGLANG_DDTREE_TEST_BUDGET"):
        sglang_ddtree_run.run_tau(engine, [[3, 9]], [1], [0.0], 11, "DDTREE", forced=["8"])


def test_held_candidates_are_priced_as_their_fixed_methods_and_compared_with_auto_in_one_engine():
    auto_rows = [(1, 0.0, 3.4, 230.0)]
    held = [{"batch": 1, "temperature": 0.0, "tau": tau_, "tok_s": tok_s, "forced": mode}
            for mode, tau_, tok_s in (("chain", 2.7, 190.0), ("8", 3.3, 240.0), ("32", 3.6, 220.0))]
    runs = {
        ("none", 0): constructed_record([(1, 0.0, 1.0, 100.0)]),
        ("DFLASH", 0): constructed_record([(1, 0.0, 2.7, 180.0)]),
        ("DDTREE", "auto"): {"tau": [{**constructed_record(auto_rows)["tau"][0], "budget_histogram": {"8": 5}},
                                     *held]},
        ("DDTREE", "auto-events"): constructed_record([(1, 0.0, 3.3, 250.0)]),
    }
    log = {"eval": {"rows": [{"mode": "dflash", "temperature": 0.0, "budget": None, "tau": 2.7, "tau_emitted": 2.65},
                             {"mode": "ddtree", "temperature": 0.0, "budget": 8, "tau": 3.2}]}}
    rows = {(r["method"], r["budget"]): r for r in tau.table_rows(runs, log)}
    assert rows[("ddtree-in-auto", "chain")]["tau_reference"] == 2.65  # the chain is DFLASH's draft
    assert rows[("ddtree-in-auto", 8)]["tau_reference"] == 3.2 and rows[("ddtree-in-auto", 8)]["speedup"] == 2.4
    assert rows[("ddtree-auto", "auto")]["budget_histogram"] == {"8": 5}
    assert "clock" not in rows[("ddtree-in-auto", 8)]  # not an auto row
    listed = list(rows.values())
    (goal,) = [g for g in tau.goal_rows(listed) if g["auto"] == "auto"]
    assert goal["best"] == "dflash"  # held candidates are not the fixed engines of the goal
    (same,) = tau.same_engine_rows(listed)
    assert (same["best"], same["best_tok_s"], same["auto_over_best"]) == ("8", 240.0, 0.958)
    assert same["held_tok_s"] == {"chain": 190.0, "8": 240.0, "32": 220.0}


def test_main_starts_each_engine_with_its_budget_environment_and_the_auto_engine_with_held_candidates(
        tmp_path, monkeypatch):
    pair, work = tmp_path / "pair", tmp_path / "work"
    (pair / "drafter").mkdir(parents=True)
    (pair / "drafter" / "config.json").write_text(json.dumps({"block_size": 16}))
    calls = []

    def run_config(out, models, algo, budget, mode, extra, env, need_s=None):
        calls.append((out.name, algo, budget, extra, env, need_s))
        return {"sglang": "0.5.17", "tau": []}

    monkeypatch.setattr(tau, "run_config", run_config)
    monkeypatch.setattr(sys, "argv", ["tau.py", "--pair", str(pair), "--work", str(work), "--new-tokens", "8"])
    assert tau.main() == 0
    by = {name: (algo, budget, extra, env, need) for name, algo, budget, extra, env, need in calls}
    algo, budget, extra, env, need = by["tau-DDTREE-auto.json"]
    assert (algo, budget, need) == ("DDTREE", 32, tau.FORCED_NEED_S)
    assert extra[-2:] == ["--force-budgets", "chain,4,8,16,32"]
    assert env["SGLANG_DDTREE_BUDGET"] == "auto" and env["SGLANG_DDTREE_TEST_BUDGET"].endswith("forced.txt")
    algo, budget, extra, env, need = by["tau-DDTREE-auto-events.json"]
    assert "--force-budgets" not in extra and "SGLANG_DDTREE_TEST_BUDGET" not in env and need is None
    assert env["SGLANG_DDTREE_STEP_CLOCK"] == "events"
    narrow = by["tau-DDTREE-4.json"]  # below half the block: served under a wider reservation
    assert (narrow[1], narrow[3], narrow[4]) == (7, {"SGLANG_DDTREE_BUDGET": "4"}, None)
    assert by["tau-DDTREE-16.json"][3] is None and len(calls) == len(tau.CONFIGS)


def test_configs_runs_only_the_named_engines_in_the_tables_order(tmp_path, monkeypatch):
    pair, work = tmp_path / "pair", tmp_path / "work"
    (pair / "drafter").mkdir(parents=True)
    (pair / "drafter" / "config.json").write_text(json.dumps({"block_size": 16}))
    names = []
    monkeypatch.setattr(tau, "run_config", lambda out, *args, **kwargs: names.append(out.name) or None)
    monkeypatch.setattr(sys, "argv", ["tau.py", "--pair", str(pair), "--work", str(work), "--new-tokens", "8",
                                      "--configs", "auto,DFLASH,none"])
    assert tau.main() == 0
    assert names == ["tau-DDTREE-auto.json", "tau-none-0.json", "tau-DFLASH-0.json"]


@pytest.mark.parametrize("text", ["", "auto,7", "dflash"])
def test_configs_refuses_an_engine_the_table_does_not_have(text):
    with pytest.raises(argparse.ArgumentTypeError, match="--configs takes"):
        tau.config_names(text)
