"""bench/gpu/auto_budget_projection.py on the CPU, on CONSTRUCTED tau and step-cost rows (``constructed_*``): the
tokens per ms of each fixed candidate at the 8B shape's costs, the best, and the pick of the plugin's own choice
rule (sglang_ddtree.budget.OnlineStepCost) with the oracle's or a miscalibrated auto run's expectations."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("projection", ROOT / "bench" / "gpu" / "auto_budget_projection.py")
proj = importlib.util.module_from_spec(spec)
spec.loader.exec_module(proj)

constructed_tau = [
    {"method": "none", "budget": None, "batch": 1, "temperature": 0.0, "tau_sglang": 1.0},
    {"method": "dflash", "budget": None, "batch": 1, "temperature": 0.0, "tau_sglang": 3.0},
    {"method": "ddtree", "budget": 16, "batch": 1, "temperature": 0.0, "tau_sglang": 3.7},
    {"method": "ddtree", "budget": 32, "batch": 1, "temperature": 0.0, "tau_sglang": 4.0},
    {"method": "ddtree", "budget": 32, "batch": 8, "temperature": 0.0, "tau_sglang": 4.1},
    {"method": "ddtree-auto", "budget": "auto", "batch": 1, "temperature": 0.0, "tau_sglang": 3.9},
]
constructed_costs = [
    {"batch": 1, "budget": 16, "context": 128, "dflash_ms": 7.0, "ddtree_ms": 7.0},
    {"batch": 1, "budget": 32, "context": 128, "dflash_ms": 7.0, "ddtree_ms": 9.0},
    {"batch": 32, "budget": 16, "context": 128, "dflash_ms": 20.0, "ddtree_ms": 20.0},
    {"batch": 1, "budget": 16, "context": 8192, "dflash_ms": 1.0, "ddtree_ms": 1.0},  # another context: left out
]


def test_the_oracle_pick_is_the_best_fixed_candidate_at_every_batch():
    rows = {(r["batch"]): r for r in proj.project(constructed_tau, constructed_costs, None)}
    one = rows[1]
    assert one["tok_per_ms"] == pytest.approx({"chain": 3.0 / 7.0, "16": 3.7 / 7.0, "32": 4.0 / 9.0}, abs=1e-4)
    assert one["best"] == "16" and one["auto"] == "16" and one["auto_over_best"] == 1.0
    assert one["ms"]["chain"] == 7.0  # not the 8192-context row's 1.0
    # batch 32: the tau of the nearest measured batch (8: only budget 32, unmeasured at the 8B shape there)
    assert 32 not in rows or rows[32]["tau_batch"] == 8


def test_a_miscalibrated_auto_run_is_priced_below_the_best():
    expected = {"chain": 2.0, "16": 2.7, "32": 6.0}  # an over-confident calibration of the widest tree
    one = next(r for r in proj.project(constructed_tau, constructed_costs, expected) if r["batch"] == 1)
    assert one["best"] == "16" and one["auto"] == "32"
    assert one["auto_over_best"] == pytest.approx((4.0 / 9.0) / (3.7 / 7.0), abs=1e-4)
    assert "expected_mean" in one["expectations"]


def test_the_command_writes_markdown_and_json(tmp_path):
    (tmp_path / "tau.json").write_text(json.dumps({"rows": constructed_tau}))
    (tmp_path / "cost.json").write_text(json.dumps({"rows": constructed_costs}))
    (tmp_path / "stats.jsonl").write_text(json.dumps({"steps": 64, "expected_mean": {}}) + "\n"
                                          + json.dumps({"steps": 128, "expected_mean": {"chain": 2.0, "16": 2.7,
                                                                                        "32": 3.0}}) + "\n")
    out = tmp_path / "auto-budget.md"
    assert proj.main(["--tau", str(tmp_path / "tau.json"), "--step-cost", str(tmp_path / "cost.json"),
                      "--auto-stats", str(tmp_path / "stats.jsonl"), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| 0.0 | 1 | chain: 3.00 / 7.00 ms = 0.429; 16: 3.70 / 7.00 ms = 0.529; 32: 4.00 / 9.00 ms = 0.444" in text
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert rows[0]["auto"] == "16" and rows[0]["expectations"] == "auto's calibrated expected_mean"


def test_each_temperature_is_priced_with_its_own_kind_of_rounds_expectations():
    """Greedy rounds for T=0, sampled ones for T=1 (the stats' expected_mean_by_kind): the same tree promises less to
    a sampled round, so the pick there may be narrower."""
    tau_rows = constructed_tau + [{**r, "temperature": 1.0, "tau_sglang": r["tau_sglang"] / 2}
                                  for r in constructed_tau if r["temperature"] == 0.0]
    by_kind = {"greedy": {"chain": 2.0, "16": 2.7, "32": 6.0}, "sampled": {"chain": 1.0, "16": 1.35, "32": 1.4}}
    rows = {(r["temperature"], r["batch"]): r for r in proj.project(tau_rows, constructed_costs, None, by_kind)}
    greedy, sampled = rows[(0.0, 1)], rows[(1.0, 1)]
    assert greedy["auto"] == "32" and greedy["expectations"] == "auto's calibrated expected_mean (greedy rounds)"
    assert sampled["auto"] == "16" and sampled["expectations"].endswith("(sampled rounds)")  # 2.35 / 7 > 2.4 / 9


def test_candidates_held_in_autos_engine_stand_in_only_where_no_fixed_engine_ran():
    """tau.py --configs auto,none,DFLASH times each candidate held in auto's engine (``ddtree-in-auto``) and no
    fixed DDTREE engine: those rows are the candidates' tau; a fixed engine's row, where there is one, wins."""
    held = [{"method": "ddtree-in-auto", "budget": b, "batch": 1, "temperature": 0.0, "tau_sglang": t}
            for b, t in (("chain", 2.9), (16, 3.6), (8, 3.3))]
    taus = proj.fixed_taus(constructed_tau + held)
    assert taus[(0.0, 1)] == {"chain": 3.0, "16": 3.7, "32": 4.0, "8": 3.3}  # DFLASH's and the fixed engines' kept
    assert proj.fixed_taus(held) == {(0.0, 1): {"chain": 2.9, "16": 3.6, "8": 3.3}}


def test_held_budgets_and_the_ddtree_engines_chain_are_priced_as_auto_verifies_them():
    """step_cost.py's --ab fields: ``ddtree_b4_ms`` (budget 4 held under a wider server) becomes candidate 4 where no
    fixed engine of it ran; ``ddtree_chain_ms`` (DFLASH's round inside the DDTREE engine, auto's chain) replaces
    DFLASH's own step as the chain's cost; rows without it keep DFLASH's."""
    rows = [
        {"batch": 8, "budget": 16, "context": 128, "dflash_ms": 8.6, "ddtree_ms": 8.3, "ddtree_b4_ms": 7.6,
         "ddtree_chain_ms": 8.1},
        {"batch": 8, "budget": 4, "context": 128, "dflash_ms": 8.6, "ddtree_ms": 7.0},  # a fixed engine of 4: kept
        {"batch": 32, "budget": 16, "context": 128, "dflash_ms": 20.0, "ddtree_ms": 20.0, "ddtree_b4_ms": 10.7},
    ]
    costs = proj.step_costs(rows)
    assert costs[8] == {"chain": 8.1, "16": 8.3, "4": 7.0}
    assert costs[32] == {"chain": 20.0, "16": 20.0, "4": 10.7}
