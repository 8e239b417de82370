"""The auto budget's SGLang glue (sglang_ddtree.sglang.auto_budget): one decode graph runner per verify width, and
what it relies on in the installed SGLang release."""

from __future__ import annotations

import inspect
import json
import logging
import os
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch

from sglang_ddtree.budget import CHAIN, expected_accept_length
from sglang_ddtree.sglang.auto_budget import (
    SAMPLE_EVERY,
    AutoBudget,
    _PeriodTimer,
    capture_verify_widths,
    select_width,
    verify_width,
)


class StandInBackend:
    """Stand-in for the target's attention backend: counts ``init_cuda_graph_state`` calls (which re-allocate the
    graph buffers the captured graphs read)."""

    def __init__(self):
        self.inits = 0

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        self.inits += 1


class StandInRunner:
    """Stand-in for SGLang's DecodeCudaGraphRunner (it captures on a GPU): records its construction, calls the
    backend's ``init_cuda_graph_state`` as the real constructor does, and refuses the widths in ``FAILS``."""

    FAILS: ClassVar[set[int]] = set()
    built: ClassVar[list[int]] = []

    def __init__(self, model_runner, *, attn_backend=None, speculative_num_steps=None,
                 speculative_num_draft_tokens=None):
        if speculative_num_draft_tokens in self.FAILS:
            raise RuntimeError("capture failed: out of memory")
        self.attn_backend = attn_backend
        self.captured_req_width = speculative_num_draft_tokens
        attn_backend.init_cuda_graph_state(8, 8 * speculative_num_draft_tokens)
        type(self).built.append(speculative_num_draft_tokens)
        model_runner.decode_cuda_graph_runner = self  # SGLang's capture path sets it; the widest must come back


def _model_runner(width=17):
    backend = StandInBackend()
    base = object.__new__(StandInRunner)
    base.attn_backend, base.captured_req_width = backend, width
    return SimpleNamespace(decode_cuda_graph_runner=base), base, backend


def test_extra_widths_are_captured_widest_first_sharing_the_backends_buffers(monkeypatch):
    monkeypatch.setattr(StandInRunner, "built", [])
    model_runner, base, backend = _model_runner(17)
    record: dict = {}
    runners = capture_verify_widths(model_runner, [5, 9, 16, 17, 9], record)
    assert StandInRunner.built == [16, 9, 5]
    assert record["widest"] == 17 and record["widths"] == [16, 9, 5] and record["eager"] == []
    assert record["seconds"] >= 0 and "gb" in record
    assert set(runners) == {5, 9, 16, 17} and runners[17] is base
    assert all(r.attn_backend is backend and r.captured_req_width == w for w, r in runners.items())
    assert backend.inits == 0, "the widest runner's graph buffers must not be re-allocated"
    assert "init_cuda_graph_state" not in vars(backend)  # the backend's own method is back
    backend.init_cuda_graph_state(1, 1)
    assert backend.inits == 1
    assert model_runner.decode_cuda_graph_runner is base


def test_a_width_that_fails_to_capture_runs_eagerly_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(StandInRunner, "built", [])
    monkeypatch.setattr(StandInRunner, "FAILS", {9})
    model_runner, base, _ = _model_runner(17)
    with caplog.at_level(logging.WARNING, logger="sglang_ddtree"):
        runners = capture_verify_widths(model_runner, [5, 9, 17], record := {})
    assert set(runners) == {5, 17} and record["widths"] == [5] and record["eager"] == [9]
    assert any("no CUDA graphs for verify width 9 (RuntimeError: capture failed" in r.getMessage()
               for r in caplog.records)
    select_width(model_runner, runners, 9)
    assert model_runner.decode_cuda_graph_runner is base  # the widest: SGLang's width check then runs it eagerly
    select_width(model_runner, runners, 5)
    assert model_runner.decode_cuda_graph_runner is runners[5]


def test_without_graphs_nothing_is_captured_and_wider_widths_are_refused():
    assert capture_verify_widths(SimpleNamespace(decode_cuda_graph_runner=None), [5, 9]) == {}
    model_runner, _, _ = _model_runner(9)
    with pytest.raises(ValueError, match=r"verify widths \[17\] exceed the captured width 9"):
        capture_verify_widths(model_runner, [5, 17])
    select_width(model_runner, {}, 5)  # no runners: nothing to point at


def test_with_the_variable_off_a_hybrid_targets_narrower_widths_run_eagerly(monkeypatch, caplog):
    """SGLANG_DDTREE_HYBRID_WIDTH_GRAPHS=0 (the way out): nothing is captured beside the widest."""
    monkeypatch.setattr(StandInRunner, "built", [])
    monkeypatch.setenv("SGLANG_DDTREE_HYBRID_WIDTH_GRAPHS", "0")
    model_runner, base, backend = _model_runner(17)
    backend.update_mamba_state_after_mtp_verify = lambda **kwargs: None
    with caplog.at_level(logging.WARNING, logger="sglang_ddtree"):
        runners = capture_verify_widths(model_runner, [5, 9, 17], record := {})
    assert runners == {17: base} and StandInRunner.built == [] and record["eager"] == [9, 5]
    assert any("hybrid linear-attention target: verify widths [9, 5] run without CUDA graphs" in r.getMessage()
               and "SGLANG_DDTREE_HYBRID_WIDTH_GRAPHS=0" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("variable", [None, "1"])
def test_a_hybrid_targets_widths_get_graphs_and_linear_state_of_their_own(monkeypatch, variable):
    """By default (or SGLANG_DDTREE_HYBRID_WIDTH_GRAPHS=1) each narrower width's runner gets a hybrid backend
    sharing the full-attention backend (and its widest-sized buffers) and a copy of SGLang's own linear-attention
    backend class whose per-width graph state is built afresh at that width; the widest's state is untouched."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
        HybridLinearAttnBackend,
        MambaAttnBackendBase,
    )

    monkeypatch.setattr(StandInRunner, "built", [])
    if variable is None:
        monkeypatch.delenv("SGLANG_DDTREE_HYBRID_WIDTH_GRAPHS", raising=False)
    else:
        monkeypatch.setenv("SGLANG_DDTREE_HYBRID_WIDTH_GRAPHS", variable)
    linear = object.__new__(MambaAttnBackendBase)  # SGLang's class, its attributes set as its __init__ does
    for name in ("state_indices_list", "query_start_loc_list", "retrieve_next_token_list",
                 "retrieve_next_sibling_list", "retrieve_parent_token_list"):
        setattr(linear, name, [])
    linear.replayssm_write_pos_list = linear.replayssm_force_flush_list = None
    linear.pad_slot_id, linear.device, linear.forward_metadata = -1, torch.device("cpu"), "the widest's metadata"
    linear._replayssm_enabled = lambda: False
    full = StandInBackend()
    hybrid = object.__new__(HybridLinearAttnBackend)
    hybrid.full_attn_backend, hybrid.linear_attn_backend = full, linear
    hybrid.attn_backend_list = [full, linear]
    MambaAttnBackendBase.init_cuda_graph_state(linear, 4, 4 * 17)  # what the widest's capture built
    widest_offsets = linear.cached_cuda_graph_verify_query_start_loc.clone()
    base = object.__new__(StandInRunner)
    base.attn_backend, base.captured_req_width = hybrid, 17
    model_runner = SimpleNamespace(decode_cuda_graph_runner=base)
    record: dict = {}
    runners = capture_verify_widths(model_runner, [5, 9, 17], record)
    assert set(runners) == {5, 9, 17} and record["widths"] == [9, 5] and record["eager"] == []
    assert full.inits == 0  # the full-attention buffers stay the widest's
    own = runners[5].attn_backend
    assert own is not hybrid and own.full_attn_backend is full and own.linear_attn_backend is not linear
    assert own.attn_backend_list == [full, own.linear_attn_backend]
    # the stand-in runner built it with max_bs 8 and 8 * width tokens: offsets step by the width
    assert own.linear_attn_backend.cached_cuda_graph_verify_query_start_loc[:3].tolist() == [0, 5, 10]
    assert own.linear_attn_backend.retrieve_next_token_list[0].shape == (1, 5)
    assert own.linear_attn_backend.forward_metadata is None
    assert torch.equal(linear.cached_cuda_graph_verify_query_start_loc, widest_offsets)  # the widest's untouched
    assert len(linear.state_indices_list) == 4 and linear.forward_metadata == "the widest's metadata"
    assert "init_cuda_graph_state" not in vars(hybrid)
    # every attribute this SGLang release's init_cuda_graph_state builds is one a width's copy starts afresh
    from sglang_ddtree.sglang.auto_budget import _LINEAR_GRAPH_STATE

    probe = object.__new__(MambaAttnBackendBase)
    given = {"pad_slot_id": -1, "device": torch.device("cpu"), "_replayssm_enabled": lambda: False}
    vars(probe).update(given, **{name: [] for name in ("state_indices_list", "query_start_loc_list",
                                                        "retrieve_next_token_list", "retrieve_next_sibling_list",
                                                        "retrieve_parent_token_list")})
    MambaAttnBackendBase.init_cuda_graph_state(probe, 2, 2 * 5)
    built = {k for k, v in vars(probe).items() if k not in given and v is not None and not (isinstance(v, list)
                                                                                           and not v)}
    assert built and built <= set(_LINEAR_GRAPH_STATE), built - set(_LINEAR_GRAPH_STATE)


def test_after_sglang_captures_anew_the_old_widths_are_dropped(caplog):
    model_runner, base, _ = _model_runner(17)
    runners = {17: base, 9: "graphs of width 9"}
    model_runner.decode_cuda_graph_runner = fresh = object()  # a weight update recaptured SGLang's graphs
    with caplog.at_level(logging.WARNING, logger="sglang_ddtree"):
        select_width(model_runner, runners, 9)
    assert runners == {} and model_runner.decode_cuda_graph_runner is fresh
    assert any("captured its verify graphs anew" in r.getMessage() for r in caplog.records)


def test_the_worker_captures_the_widths_after_sglang_captured_the_target(monkeypatch):
    """SGLang's scheduler builds the workers, then captures the target's graphs, then calls the draft worker's
    init_cuda_graphs: the widths are captured there (DFLASH's drafter graphs first)."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_ddtree.sglang.worker import DDTreeWorker

    calls = []
    monkeypatch.setattr(DFlashWorkerV2, "init_cuda_graphs", lambda self: calls.append("drafter graphs"))
    monkeypatch.setattr(StandInRunner, "built", [])
    model_runner, base, _ = _model_runner(17)
    worker = object.__new__(DDTreeWorker)
    worker.block_size = 8
    worker._target_worker = SimpleNamespace(model_runner=model_runner)
    worker._ddtree_auto = AutoBudget((CHAIN, 4, 16), 8, torch.device("cpu"))
    worker.init_cuda_graphs()
    assert calls == ["drafter graphs"] and StandInRunner.built == [8, 5]  # the chain (block 8), budget 4
    assert set(worker._ddtree_width_runners) == {17, 8, 5} and worker._ddtree_width_runners[17] is base
    assert worker._ddtree_auto.stats()["graphs"]["widths"] == [8, 5]  # the stats file says what was captured
    # fixed budget, or graphs disabled (no target runner): nothing more than DFLASH's
    worker._ddtree_width_runners = None
    model_runner.decode_cuda_graph_runner = None
    worker.init_cuda_graphs()
    assert calls == ["drafter graphs"] * 2 and worker._ddtree_width_runners is None


def test_verify_widths():
    assert verify_width(CHAIN, 16) == 16 and verify_width(8, 16) == 9 and verify_width(16, 16) == 17


def test_the_summary_line_names_choices_and_measured_costs(monkeypatch):
    monkeypatch.setenv("SGLANG_DDTREE_STEP_CLOCK", "events")  # each round timed on its own (here the host clock)
    ticks = iter([0.0, 0.004, 0.010, 0.016, 0.020])
    auto = AutoBudget((CHAIN, 8), 4, torch.device("cpu"), clock=lambda: next(ticks))
    auto.costs.min_samples = 1
    for _ in range(2):
        auto.begin_step(3)
        auto.end_step()
    auto.begin_step(3)  # reads the two finished steps: the chain 4 ms, budget 8 6 ms (batch bucket 3-4)
    line = auto.summary()
    assert line.startswith("DDTREE budget: chosen {'chain': 2, '8': 1} over 3 steps"), line  # 3 commits/4 ms wins
    assert "step ms (chain/8) b<=4: 4.00/6.00" in line, line


# --- what the glue relies on in the installed SGLang ----------------------------------------------------------
def test_sglang_builds_a_graph_runner_per_width_and_replays_only_its_own_width():
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    params = inspect.signature(DecodeCudaGraphRunner.__init__).parameters
    assert {"attn_backend", "speculative_num_draft_tokens"} <= set(params)  # capture_verify_widths' keywords
    # a runner replays a batch only at its own width (else SGLang runs it eagerly): a wrong pick is never wrong
    assert "captured_req_width" in inspect.getsource(DecodeCudaGraphRunner.can_run_graph)
    # the model runner replays through this attribute (select_width points it at the step's runner)
    assert "self.decode_cuda_graph_runner.can_run_graph(forward_batch)" in inspect.getsource(ModelRunner.forward) \
        or "decode_cuda_graph_runner.can_run_graph" in inspect.getsource(ModelRunner)
    # one Triton backend serves every width: the verify width comes from the batch's spec_info (0.5.17 reads its
    # draft_token_num, 0.5.23 its num_tokens_per_req, which DFlashVerifyInput derives from draft_token_num)
    source = inspect.getsource(TritonAttnBackend)
    assert "spec_info.draft_token_num" in source or "spec_info.num_tokens_per_req" in source


def test_the_stats_file_holds_the_choices_and_costs_every_64_steps(monkeypatch, tmp_path):
    path = tmp_path / "budget.jsonl"
    monkeypatch.setenv("SGLANG_DDTREE_BUDGET_STATS", str(path))
    ticks = iter(range(10_000))
    auto = AutoBudget((CHAIN, 4, 8), 4, torch.device("cpu"), clock=lambda: next(ticks) * 1e-3)
    for _ in range(128):
        auto.begin_step(1)
        auto.end_step()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["steps"] for line in lines] == [64, 128]
    assert lines[-1]["budget_histogram"] == {"chain": auto.total[CHAIN], "4": auto.total[4], "8": auto.total[8]}
    assert sum(lines[-1]["budget_histogram"].values()) == 128
    assert lines[-1]["step_ms"] == {"b<=1": {"chain": 1.0, "4": 1.0, "8": 1.0}}  # one tick a step
    assert lines[-1]["expected_mean"] == {}  # no tree was ever priced
    # the last settled sweep's own samples per candidate (the period clock: a burst of 4 gives 3)
    sweep = lines[-1]["last_sweep"]["b<=1"]
    assert sweep["sweep"] >= 1 and {k: len(v) for k, v in sweep.items() if k != "sweep"} == {"chain": 3, "4": 3, "8": 3}
    assert all(ms == 1.0 for k, v in sweep.items() if k != "sweep" for ms in v)
    # a second TP rank writes nothing (the first rank's file is the record)
    other = AutoBudget((CHAIN, 8), 4, torch.device("cpu"), tp_group=SimpleNamespace(world_size=1, rank_in_group=1))
    assert other.stats_path is None


def test_expectations_and_calibration_are_sampled_every_sixteenth_step():
    """About 100 small kernels together: the expectations and the calibration are updated on steps 1, 17, 33, ...
    only (SAMPLE_EVERY)."""
    from sglang_ddtree.tree import build_tree

    assert SAMPLE_EVERY == 16
    logits = torch.randn(2, 3, 20, generator=torch.Generator().manual_seed(1))
    tree = build_tree(logits, 6, backend="torch")
    accept_index = torch.tensor([[0, 1, -1, -1], [0, -1, -1, -1]])
    auto = AutoBudget((CHAIN, 6), 4, torch.device("cpu"), clock=lambda: 0.0)
    sampled = []
    for _ in range(33):
        candidate = auto.begin_step(2)
        before = float(auto.calibration.predicted.sum())
        auto.expect(tree)
        auto.observe(6, tree, accept_index, torch.tensor([1, 0]))
        sampled.append(float(auto.calibration.predicted.sum()) != before)
        auto.end_step()
        assert candidate in (CHAIN, 6)
    assert [i + 1 for i, s in enumerate(sampled) if s] == [1, 17, 33]
    # 3 samples: step 33's choice read the first (two samples earlier); the first had no calibration data yet
    first = expected_accept_length(tree, (CHAIN, 6)).mean(dim=0).tolist()
    assert len(auto.expectations) == 2 and auto.expected == pytest.approx(first)
    assert auto.stats()["expected_mean"] == pytest.approx({"chain": first[0], "6": first[1]}, abs=1e-4)


def test_one_candidate_is_verified_every_step_without_timing_or_calibration():
    """SGLANG_DDTREE_BUDGET=4 under a wider reservation: nothing to choose, so nothing is measured or sampled."""
    from sglang_ddtree.tree import build_tree

    tree = build_tree(torch.randn(2, 3, 20, generator=torch.Generator().manual_seed(2)), 6, backend="torch")
    auto = AutoBudget((4,), 4, torch.device("cpu"), clock=lambda: 0.0)
    before = auto.calibration.predicted.clone()
    for _ in range(9):
        assert auto.begin_step(2) == 4
        auto.expect(tree)
        auto.observe(4, tree, torch.tensor([[0, 1, -1, -1, -1], [0, -1, -1, -1, -1]]), torch.tensor([1, 0]))
        auto.end_step()
    assert auto.stats()["budget_histogram"] == {"4": 9} and auto.stats()["steps"] == 9
    assert not auto.expectations and not auto.timer.pending and auto.costs.samples[1] == [0]
    assert torch.equal(auto.calibration.predicted, before)


# --- tensor parallelism: one choice for every rank ------------------------------------------------------------
def tp_rank_main(rank: int, world: int, store: str, out: str, case: dict) -> None:
    """A rank of a real SGLang TP GroupCoordinator (gloo, loopback): its own step timings (rank 1's favour another
    candidate than rank 0's) and slightly different expectations; it records the choice of every step."""
    import types

    from ddtree_testlib import sglang_tp_group

    os.environ["SGLANG_DDTREE_STEP_CLOCK"] = "events"  # each round timed on its own: the batch changes every step
    with sglang_tp_group(rank, world, store) as group:
        clock = types.SimpleNamespace(now=0.0)
        auto = AutoBudget((CHAIN, 4, 8, 16), 8, torch.device("cpu"), tp_group=group, clock=lambda: clock.now)
        # this rank's step cost of each candidate: rank 0 finds budget 8 cheap, rank 1 finds the chain cheap
        cost = {0: {CHAIN: 9.0, 4: 9.0, 8: 5.0, 16: 9.5}, 1: {CHAIN: 5.0, 4: 9.0, 8: 9.0, 16: 9.5}}[rank]
        chosen = []
        for step in range(case["steps"]):
            candidate = auto.begin_step(1 + step % 5)
            auto.expected = [1.0 + 1e-12 * rank * step] * 4  # last-bit differences, as index_add_ may give
            clock.now += cost[candidate] / 1000.0
            auto.end_step()
            chosen.append(candidate)
        costs = auto.costs.costs(1)  # this rank's own table at batch 1: its cheapest candidate
        own_best = min(range(4), key=lambda i: costs[i] if costs[i] is not None else 1e9)
        torch.save({"chosen": chosen, "own_best": auto.candidates[own_best], "costs": costs}, out)


def test_two_tp_ranks_with_different_timings_verify_the_same_width_every_step(tmp_path):
    from ddtree_testlib import run_ranks

    ranks = run_ranks(tp_rank_main, 2, tmp_path, {"steps": 120}, timeout=180)
    assert ranks[0]["chosen"] == ranks[1]["chosen"]
    chosen = ranks[0]["chosen"]
    assert set(chosen) == {CHAIN, 4, 8, 16}  # explored everything
    assert chosen[-20:] == [8] * 20  # then the first rank's fastest, whatever rank 1 measured
    assert (ranks[0]["own_best"], ranks[1]["own_best"]) == (8, CHAIN), ranks  # rank 1 alone would pick the chain


# --- the period clock (SGLANG_DDTREE_STEP_CLOCK=period) --------------------------------------------------------
def _period_auto(monkeypatch, candidates=(CHAIN, 8), clock=None):
    monkeypatch.setenv("SGLANG_DDTREE_STEP_CLOCK", "period")
    return AutoBudget(candidates, 4, torch.device("cpu"), clock=clock)


def test_the_period_clock_prices_a_round_by_the_time_to_the_next_round_of_the_same_candidate(monkeypatch):
    from sglang_ddtree.sglang.auto_budget import _PeriodTimer

    now = SimpleNamespace(t=0.0)
    timer = _PeriodTimer(lambda bs: min(int(bs - 1).bit_length(), 11), clock=lambda: now.t)
    # rounds (candidate, batch, ms until the next round starts)
    rounds = ((8, 2, 6.0), (8, 2, 7.0), (8, 2, 8.0), (CHAIN, 2, 3.0), (CHAIN, 2, 4.0), (CHAIN, 5, 2.0), (CHAIN, 6, 9.0),
              (CHAIN, 6, 1.0))
    for i, (candidate, batch, ms) in enumerate(rounds):
        timer.begin(candidate, batch, f"round {i}")
        now.t += ms / 1000.0
    timer.begin(CHAIN, 6)
    # 8's second and third rounds (each after another 8); the chain's second (after a chain in the same bucket);
    # the round at batch 5 follows one at batch 2 (another bucket): dropped; the two after it are the chain's at
    # batch 5-8. The first round of each run of a candidate is never priced. Each keeps its own round's tag.
    assert [(c, b, round(ms, 6), tag) for c, b, ms, tag in timer.done()] == [
        (8, 2, 7.0, "round 1"), (8, 2, 8.0, "round 2"), (CHAIN, 2, 4.0, "round 4"), (CHAIN, 6, 9.0, "round 6"),
        (CHAIN, 6, 1.0, "round 7")]
    assert timer.done() == []


def test_the_period_clock_drops_intervals_across_other_batches_and_idle_time(monkeypatch):
    from sglang_ddtree.sglang.auto_budget import MAX_PERIOD_S

    now = SimpleNamespace(t=0.0)
    auto = _period_auto(monkeypatch, clock=lambda: now.t)
    assert auto.clock_name == "period" and auto.costs.min_samples == 4 and auto.costs.refresh_burst == 3
    assert auto.costs.unsampled_per_burst == 1
    auto.timer.begin(8, 1)
    now.t += 0.005
    auto.timer.begin(8, 1)
    now.t += 0.005
    auto.interrupt()  # a prefill ran in between: the interval from the last round's start spans it
    auto.timer.begin(8, 1)
    now.t += MAX_PERIOD_S + 0.1  # the server idled
    auto.timer.begin(8, 1)
    now.t += 0.004
    auto.timer.begin(8, 1)
    assert [round(ms, 6) for _, _, ms, _ in auto.timer.done()] == [4.0]


def test_auto_with_the_period_clock_picks_the_candidate_with_the_most_tokens_per_wall_second(monkeypatch, tmp_path):
    """A simulated overlap pipeline: the wall time from one round's start to the next is the cost of the round
    before (the GPU-bound reading of the interval); the chain commits 2 tokens in 4 ms, budget 8 3.5 in 5 ms."""
    monkeypatch.setenv("SGLANG_DDTREE_BUDGET_STATS", str(tmp_path / "stats.jsonl"))
    now = SimpleNamespace(t=0.0)
    auto = _period_auto(monkeypatch, clock=lambda: now.t)
    cost = {CHAIN: 4.0, 8: 5.0}
    previous = None
    chosen = []
    for _ in range(64):
        candidate = auto.begin_step(1)
        auto.expected = [1.0, 2.5]
        now.t += cost[previous if previous is not None else candidate] / 1000.0
        previous = candidate
        auto.end_step()
        chosen.append(candidate)
    assert chosen[:8] == [CHAIN] * 4 + [8] * 4  # exploration: each candidate on 4 rounds in a row
    assert set(chosen[8:]) == {8}, chosen
    # the chain's three samples are its own rounds' 4 ms: the interval after the switch to 8 (still a chain round
    # in the pipeline) is not priced
    assert auto.costs.costs(1) == [pytest.approx(4.0), pytest.approx(5.0)]
    line = json.loads((tmp_path / "stats.jsonl").read_text().splitlines()[-1])
    assert line["clock"] == "period"


def test_a_bad_step_clock_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("SGLANG_DDTREE_STEP_CLOCK", "wall")
    with pytest.raises(ValueError, match=r"SGLANG_DDTREE_STEP_CLOCK='wall': use one of \['period', 'events'\]"):
        AutoBudget((CHAIN, 8), 4, torch.device("cpu"))
    monkeypatch.delenv("SGLANG_DDTREE_STEP_CLOCK")
    auto = AutoBudget((CHAIN, 8), 4, torch.device("cpu"))  # unset: the wall time of a round (12-07's tau run)
    assert auto.stats()["clock"] == "period" and isinstance(auto.timer, _PeriodTimer)
    monkeypatch.setenv("SGLANG_DDTREE_STEP_CLOCK", " Events ")
    assert AutoBudget((CHAIN, 8), 4, torch.device("cpu")).stats()["clock"] == "events"


@pytest.mark.parametrize("kind", ["extend", "grammar"])
def test_a_batch_that_is_no_tree_round_interrupts_the_period_clock(monkeypatch, kind):
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_ddtree.sglang.worker import DDTreeWorker

    monkeypatch.setattr(DFlashWorkerV2, "forward_batch_generation", lambda self, batch, **kw: "DFLASH's")
    worker = object.__new__(DDTreeWorker)  # no GPU: the attributes this path reads
    worker.block_size = 4
    worker._target_worker = SimpleNamespace(model_runner=SimpleNamespace(decode_cuda_graph_runner=None))
    calls = []
    worker._ddtree_auto = SimpleNamespace(interrupt=lambda: calls.append("interrupt"))
    mode = SimpleNamespace(is_extend=lambda: kind == "extend", is_idle=lambda: False)
    batch = SimpleNamespace(forward_mode=mode, is_extend_in_batch=False, has_grammar=kind == "grammar")
    assert worker.forward_batch_generation(batch) == "DFLASH's"
    assert calls == ["interrupt"]


def test_a_test_budget_file_forces_a_candidate_untimed_and_unsampled(monkeypatch, tmp_path):
    """SGLANG_DDTREE_TEST_BUDGET (bench/gpu/tau.py times every fixed budget in auto's engine): while the file names a
    candidate every round verifies it, neither timed nor sampled; ``auto`` gives the choice back, its state as it
    was."""
    from sglang_ddtree.sglang import testing

    path = tmp_path / "budget"
    monkeypatch.setattr(testing, "BUDGET_FILE", str(path))
    monkeypatch.setattr(testing, "_forced", (None, None))
    stamp = iter(range(1, 100))

    def write(text):
        path.write_text(text)
        tick = next(stamp) * 10**9
        os.utime(path, ns=(tick, tick))  # a new time for every write: the file system's may be coarser

    ticks = iter(range(10_000))
    monkeypatch.setenv("SGLANG_DDTREE_STEP_CLOCK", "events")
    auto = AutoBudget((CHAIN, 4, 8), 4, torch.device("cpu"), clock=lambda: next(ticks) * 1e-3, sample_every=1)
    assert auto.begin_step(1) == CHAIN  # no file: auto's own choice (the first sweep's first step)
    auto.end_step()
    write("8")
    for _ in range(5):
        assert auto.begin_step(1) == 8 and not auto.sampling
        auto.end_step()
    write("chain")
    assert auto.begin_step(1) == CHAIN
    auto.end_step()
    assert auto.total == {CHAIN: 2, 4: 0, 8: 5} and auto.steps == 7
    assert auto.costs.samples[0] == [1, 0, 0]  # only auto's own first step was timed
    write("auto")
    assert auto.begin_step(1) == CHAIN and auto.sampling  # the first sweep goes on where it was: its second step
    auto.end_step()
    write("16")
    with pytest.raises(ValueError, match=r"names 16, not one of the candidates \[0, 4, 8\]"):
        auto.begin_step(1)
    write("wide")
    with pytest.raises(ValueError, match=r"SGLANG_DDTREE_TEST_BUDGET=.*'wide' is no candidate"):
        auto.begin_step(1)
    write("8")
    auto.tp_group = SimpleNamespace(world_size=2)
    with pytest.raises(ValueError, match="TP = 1 only"):
        auto.begin_step(1)


def test_greedy_and_sampled_rounds_keep_their_own_calibration_and_expectations():
    """A sampled round accepts by the target's probabilities, a greedy one by its argmax: the same trees accept
    differently (12-06b: 4.4 tokens a round greedy, 1.8 at temperature 1), so each kind learns its own calibration
    and the choice for a kind of round reads that kind's expectations."""
    from sglang_ddtree.tree import build_tree

    tree = build_tree(torch.randn(2, 3, 20, generator=torch.Generator().manual_seed(3)), 6, backend="torch")
    deep = torch.tensor([[0, 1, 2, -1], [0, 1, -1, -1]])  # greedy rounds: the first child and its child accepted
    none = torch.tensor([[0, -1, -1, -1], [0, -1, -1, -1]])  # sampled rounds: nothing accepted
    auto = AutoBudget((CHAIN, 6), 4, torch.device("cpu"), clock=lambda: 0.0, sample_every=1)
    for greedy in [True] * 12 + [False] * 12:
        auto.begin_step(2, greedy=greedy)
        auto.expect(tree)
        auto.observe(6, tree, deep if greedy else none, torch.tensor([2, 1]) if greedy else torch.tensor([0, 0]))
        auto.end_step()
    greedy_cal, sampled_cal = auto._calibrations
    assert float(greedy_cal.observed.sum()) > 0 and float(sampled_cal.observed.sum()) == 0
    assert float(sampled_cal.predicted.sum()) > 0  # it priced its trees, and saw nothing accepted
    auto.begin_step(2, greedy=True)
    greedy_expected = list(auto.expected)
    auto.begin_step(2, greedy=False)
    assert auto.expected[1] < greedy_expected[1]  # the same tree promises less to a sampled round
    assert auto.calibration is sampled_cal
    by_kind = auto.stats()["expected_mean_by_kind"]  # what the projection to the 8B shape prices, per temperature
    assert set(by_kind) == {"greedy", "sampled"} and by_kind["sampled"]["6"] < by_kind["greedy"]["6"]
