"""The node budget chosen per step (``SGLANG_DDTREE_BUDGET=auto``, issue 24): the SGLang side of ``budget.py``.

Each decode round the worker asks :meth:`AutoBudget.begin_step` which candidate to verify (a tree budget, or the
drafter's argmax chain: DFLASH's draft), builds the widest tree as always, verifies the chosen prefix of it (or
the chain) at that width, then gives the tree to :meth:`AutoBudget.expect` and the walk's result to
:meth:`AutoBudget.observe`. What decides:

* expected accepted nodes per candidate (``budget.expected_accept_length`` over the widest tree, with the online
  ``Calibration``), batch-averaged on the device and copied to pinned host memory without waiting; the choice
  at step t reads the copy of step t - :data:`EXPECTATION_LAG` (by then long done: the event wait is normally
  free), so the decode path gains no host synchronisation;
* the step cost of each candidate at this batch size, measured while serving (``budget.OnlineStepCost``: per batch
  bucket, the candidates' cost ratios from sweeps of every candidate on a few steps in a row, every 256 of the bucket's
  steps or sooner when the load changed, and a level that every other step moves), by one of two clocks
  (:data:`STEP_CLOCK_ENV`): ``period`` (the default), the host time between the starts of two consecutive decode rounds
  of the same candidate (:class:`_PeriodTimer`): the wall time a round costs, the host work outside the round (the
  scheduler's own, SGLang's result processing) included; or ``events``, CUDA events around every round, read when
  done: the GPU's time inside the round only. A clock that leaves out a per-round cost common to every candidate
  makes the wide trees look dearer than they are: on the tiny trained pair (H100, 12-07) the events clock put budget
  32 at 4.0 ms and 16 at 2.8 ms at batch 32, where a round of each, held in the same engine, took 6.45 and 6.46 ms
  of wall time, and auto chose 16 on two thirds of those steps (0.91 of budget 32's tokens/s). Under tensor
  parallelism the first rank of the TP group chooses
  and broadcasts its choice on the group's CPU (gloo) group, one integer a step: the ranks' own timings differ, and
  their calibrations may differ in the last bits (``index_add_`` on a GPU adds in no fixed order), so a choice made on
  each rank could split them into different verify widths, which would hang the step's collectives.

Each width keeps its CUDA graphs: :func:`capture_verify_widths` captures SGLang's own decode graph runner once per
extra width, after the server's widest (sharing the attention backend's graph buffers, which the widest sized),
and :func:`select_width` points the model runner at the runner of the step's width. On hybrid linear-attention
targets, whose backend keeps per-width graph state, each width gets a backend of its own
(:func:`hybrid_width_backend`); ``HYBRID_GRAPHS_ENV=0`` captures the widest only instead. A width without a runner
runs eagerly (SGLang's own uniform-width check refuses a graph of another width); the measured costs then include
the eager run, so the choice only takes a narrower width where it pays even so.
"""

from __future__ import annotations

import collections
import copy
import json
import logging
import os
import time
from typing import Any

import torch

from ..budget import (
    CHAIN,
    PERIOD_CLOCK_COSTS,
    Calibration,
    OnlineStepCost,
    accepted_nodes,
    budget_histogram,
    chain_accepted,
    expected_accept_length,
    observe,
)
from ..tree import DraftTree
from . import testing

logger = logging.getLogger(__name__)

__all__ = [
    "EXPECTATION_LAG",
    "HYBRID_GRAPHS_ENV",
    "KINDS",
    "MAX_PERIOD_S",
    "SAMPLE_EVERY",
    "STATS_ENV",
    "STEP_CLOCK_ENV",
    "AutoBudget",
    "capture_verify_widths",
    "hybrid_width_backend",
    "select_width",
    "verify_width",
]

#: The expectations and the calibration are updated on every SAMPLE_EVERY-th step only, and the choice uses the
#: expectations sampled EXPECTATION_LAG samples earlier (copied without waiting). One sample is about 100 small
#: tensor ops (62 for the expectations of five candidates, 38 for the calibration; counted on the CPU, 12-06): at
#: every 4th step that was 25 launches a step, half of what a whole DFLASH step launches, on a host-bound target
#: (the H100's trained pair, 12-05: auto 5.76 ms a round against 5.21 for the budget it chose 88% of the time).
#: Every 16th step leaves about 6; the batch-mean expectation and the calibration drift over hundreds of steps.
SAMPLE_EVERY = 16
EXPECTATION_LAG = 2
#: The kinds of round, each with its calibration and expectations: every request greedy, or some sampling.
KINDS = ("greedy", "sampled")
#: Seconds between two "DDTREE budget" log lines (the histogram since the previous line, and the costs).
LOG_EVERY_S = 60.0
#: Benchmarks: a file path; every :data:`STATS_EVERY` steps the first TP rank appends one JSON line with the steps
#: so far, the histogram of the choices and the measured costs (host data only: writing it never waits for the GPU).
STATS_ENV = "SGLANG_DDTREE_BUDGET_STATS"
STATS_EVERY = 64
#: How the step costs are measured: ``period`` (default) or ``events`` (see the module docstring).
STEP_CLOCK_ENV = "SGLANG_DDTREE_STEP_CLOCK"
STEP_CLOCKS = ("period", "events")
#: The period clock drops an interval longer than this (the server idled, or waited for requests, in between).
MAX_PERIOD_S = 1.0


def verify_width(candidate: int, block_size: int) -> int:
    """Tokens verified per request: budget + 1 for a tree, the drafter's block for the chain."""
    return block_size if candidate == CHAIN else candidate + 1


class _StepTimer:
    """Durations of steps without waiting for them: CUDA events on a GPU (read once done), the host clock on
    CPU (the tests: every op has finished when it returns)."""

    def __init__(self, device: torch.device, clock: Any = None):
        self.cuda = device.type == "cuda" and clock is None
        self.clock = clock or time.perf_counter
        self.pending: collections.deque = collections.deque()
        self.open: tuple | None = None

    def begin(self, candidate: int, batch_size: int, tag: Any = None) -> None:
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            start = self.clock()
        self.open = (candidate, batch_size, tag, start)

    def end(self) -> None:
        if self.open is None:
            return
        candidate, batch_size, tag, start = self.open
        self.open = None
        if self.cuda:
            stop = torch.cuda.Event(enable_timing=True)
            stop.record()
        else:
            stop = self.clock()
        self.pending.append((candidate, batch_size, tag, start, stop))

    def interrupt(self) -> None:
        """Nothing to drop: each round is timed on its own."""
        return None

    def done(self) -> list[tuple[int, int, float, Any]]:
        """(candidate, batch size, ms, the tag given to begin) of every finished step, oldest first; never waits."""
        out = []
        while self.pending:
            candidate, batch_size, tag, start, stop = self.pending[0]
            if self.cuda:
                if not stop.query():
                    break
                ms = float(start.elapsed_time(stop))
            else:
                ms = (stop - start) * 1000.0
            self.pending.popleft()
            out.append((candidate, batch_size, ms, tag))
        return out


class _PeriodTimer:
    """Step costs as the host time from one decode round's start to the next one's (the ``period`` clock).

    Under SGLang's overlap scheduler the interval from round t-1's start to round t's holds round t-1's launch on
    the host, the processing of round t-2's result (which waits for the GPU to finish round t-2) and the scheduling
    of round t: in wall time, what one round costs, whichever of the host and the GPU is the bottleneck. It is
    attributed only when rounds t-2 and t-1 verified the same candidate in the same batch bucket (both readings of
    the interval then agree), to that candidate at round t-1's batch size. An interval that spans another kind of
    batch (a prefill, a grammar batch: :meth:`interrupt`) or lasts longer than :data:`MAX_PERIOD_S` is dropped."""

    def __init__(self, bucket: Any, clock: Any = None):
        self.bucket = bucket
        self.clock = clock or time.perf_counter
        self.prev: tuple[int, int] | None = None  # (candidate, bucket) of round t-2
        #: (candidate, batch size, bucket, tag, start) of round t-1
        self.last: tuple[int, int, int, Any, float] | None = None
        self.pending: list[tuple[int, int, float, Any]] = []

    def begin(self, candidate: int, batch_size: int, tag: Any = None) -> None:
        now = self.clock()
        if self.last is not None:
            last_candidate, last_batch, last_bucket, last_tag, start = self.last
            if self.prev == (last_candidate, last_bucket) and 0.0 < now - start <= MAX_PERIOD_S:
                self.pending.append((last_candidate, last_batch, (now - start) * 1000.0, last_tag))
            self.prev = (last_candidate, last_bucket)
        self.last = (candidate, batch_size, self.bucket(batch_size), tag, now)

    def end(self) -> None:
        return None

    def interrupt(self) -> None:
        self.prev = self.last = None

    def done(self) -> list[tuple[int, int, float, Any]]:
        out, self.pending = self.pending, []
        return out


class AutoBudget:
    """The per-step choice of one DDTREE worker (see the module docstring).

    Args:
        candidates: from ``budget.parse_budget_option`` (the chain first, the widest budget last).
        block_size: the drafter's block; the calibration covers depths 1..block_size - 1.
        device: where the trees live.
        tp_group: SGLang's TP GroupCoordinator when the world size is > 1, else None.
        clock: test-only host clock (seconds) replacing CUDA events.
        sample_every: steps between two updates of the expectations and the calibration.
    """

    def __init__(self, candidates: tuple[int, ...], block_size: int, device: torch.device, tp_group: Any = None,
                 clock: Any = None, sample_every: int = SAMPLE_EVERY):
        self.candidates = tuple(candidates)
        self.device = torch.device(device)
        # one calibration and one expectation per kind of round (KINDS): a sampled round accepts by the target's
        # probabilities, a greedy one by its argmax, so their acceptance differs (the trained pair, 12-06b: 4.4 tokens
        # a round greedy, 1.8 at temperature 1, same trees); ``calibration`` is the current round's
        self._calibrations = [Calibration.create(int(block_size) - 1, device=self.device) for _ in KINDS]
        self.kind = 0
        self.calibration = self._calibrations[0]
        self.tp_group = tp_group if int(getattr(tp_group, "world_size", 1) or 1) > 1 else None
        self.first_rank = int(getattr(tp_group, "rank_in_group", 0) or 0) == 0
        self.clock_name = os.environ.get(STEP_CLOCK_ENV, "").strip().lower() or STEP_CLOCKS[0]
        if self.clock_name not in STEP_CLOCKS:
            raise ValueError(f"{STEP_CLOCK_ENV}={os.environ.get(STEP_CLOCK_ENV)!r}: use one of {list(STEP_CLOCKS)} "
                             f"(unset: {STEP_CLOCKS[0]})")
        if self.clock_name == "period":  # a sample needs two rounds of one candidate in a row
            self.costs = OnlineStepCost(self.candidates, **PERIOD_CLOCK_COSTS)
            self.timer: Any = _PeriodTimer(self.costs.bucket, clock)
        else:  # this rank's measurements; the first rank's decide
            self.costs = OnlineStepCost(self.candidates)
            self.timer = _StepTimer(self.device, clock)
        self.expectations: collections.deque = collections.deque()
        self._expected_by_kind = [[0.0] * len(self.candidates) for _ in KINDS]
        # over every sample read, per kind of round: the stats' expected_mean and expected_mean_by_kind
        self._expected_sums = [[0.0] * len(self.candidates) for _ in KINDS]
        self._expected_counts = [0 for _ in KINDS]
        self.steps = 0
        self.sample_every = max(1, int(sample_every))
        self.sampling = False  # this step updates the expectations and the calibration
        self.chosen: list[int] = []  # since the last log line
        self.total = dict.fromkeys(self.candidates, 0)
        self._last_log = time.monotonic()
        self.stats_path = os.environ.get(STATS_ENV) if self.first_rank else None
        #: one candidate (e.g. ``SGLANG_DDTREE_BUDGET=4`` under a wider KV reservation): nothing to choose, so no
        #: timing, no broadcast, and (``sampling`` stays False) no expectations or calibration
        self.fixed = len(self.candidates) == 1
        #: the extra widths' graph capture (capture_verify_widths's record), for the stats file
        self.graphs: dict = {}

    @property
    def expected(self) -> list[float]:
        """The expected accepted draft nodes per candidate (batch mean) last read for the current kind of round."""
        return self._expected_by_kind[self.kind]

    @expected.setter
    def expected(self, values: list[float]) -> None:
        self._expected_by_kind[self.kind] = list(values)

    # --- the choice -----------------------------------------------------------------------------------------
    def begin_step(self, batch_size: int, greedy: bool = True) -> int:
        """The candidate to verify this step (host only; starts timing the step). ``greedy``: every request of the
        batch is greedy (else the round samples: its own calibration and expectations, KINDS)."""
        self.kind = 0 if greedy else 1
        self.calibration = self._calibrations[self.kind]
        if self.fixed:
            self.steps += 1
            self.chosen.append(self.candidates[0])
            self.total[self.candidates[0]] += 1
            return self.candidates[0]
        for candidate, bs, ms, tag in self.timer.done():
            self.costs.record(candidate, bs, ms, tag)
        if testing.BUDGET_FILE and (forced := testing.forced_budget()) is not None:  # test-only: a fixed budget
            return self._forced_step(forced)
        self.steps += 1
        self.sampling = (self.steps - 1) % self.sample_every == 0
        while len(self.expectations) >= EXPECTATION_LAG:
            event, host, kind = self.expectations.popleft()
            if event is not None:
                event.synchronize()  # recorded EXPECTATION_LAG steps ago: done by now
            self._expected_by_kind[kind] = values = host.tolist()
            self._expected_sums[kind] = [a + b for a, b in zip(self._expected_sums[kind], values, strict=True)]
            self._expected_counts[kind] += 1
        # every rank chooses, so that the sweeps (which every rank times on its own) stay in step; the first rank's
        # choice is the one verified (a sweep step's is the same on every rank, and keeps its tag)
        candidate = self.costs.choose(self.expected, batch_size)
        tag = self.costs.last_tag
        if self.tp_group is not None:
            chosen = self._first_ranks(candidate)
            tag, candidate = (tag if chosen == candidate else None), chosen
        self.chosen.append(candidate)
        self.total[candidate] += 1
        self.timer.begin(candidate, batch_size, tag)
        return candidate

    def _forced_step(self, candidate: int) -> int:
        """A round of the candidate ``testing.BUDGET_FILE`` names: counted, neither timed nor sampled."""
        if candidate not in self.candidates:
            raise ValueError(f"SGLANG_DDTREE_TEST_BUDGET names {candidate}, not one of the candidates "
                             f"{list(self.candidates)} (0: the chain)")
        if self.tp_group is not None:  # each rank reads the file on its own: a change between reads splits them
            raise ValueError("SGLANG_DDTREE_TEST_BUDGET is for TP = 1 only (the ranks read the file one by one)")
        self.steps += 1
        self.sampling = False
        self.timer.interrupt()  # the period clock prices no interval that spans it
        self.chosen.append(candidate)
        self.total[candidate] += 1
        return candidate

    def interrupt(self) -> None:
        """A batch that is not a tree round ran (a prefill, a grammar batch): the period clock's interval spans it."""
        self.timer.interrupt()

    def end_step(self) -> None:
        self.timer.end()
        if self.stats_path and self.steps % STATS_EVERY == 0:
            self.write_stats()
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            logger.info("%s", self.summary(recent=True))
            self.chosen = []
            self._last_log = now

    def _first_ranks(self, candidate: int) -> int:
        """The first TP rank's choice on every rank (a broadcast of one integer on the group's CPU group)."""
        value = torch.tensor([candidate], dtype=torch.int64)
        torch.distributed.broadcast(value, src=int(self.tp_group.ranks[0]), group=self.tp_group.cpu_group)
        return int(value.item())

    # --- what the tree promises and what the target accepted ------------------------------------------------
    def expect(self, tree: DraftTree) -> None:
        """Expected accepted nodes of every candidate for this step's widest tree (batch mean), copied to the
        host without waiting (on sampling steps only)."""
        if not self.sampling:
            return
        expected = expected_accept_length(tree, self.candidates, calibration=self.calibration).mean(dim=0)
        if self.device.type == "cuda":
            host = torch.empty(expected.shape, dtype=expected.dtype, device="cpu", pin_memory=True)
            host.copy_(expected, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            host, event = expected, None
        self.expectations.append((event, host, self.kind))

    def observe(self, candidate: int, verified: DraftTree, accept_index: torch.Tensor,
                accept_len: torch.Tensor) -> None:
        """Fold the verified nodes into the calibration (in place on the device; no host sync; on sampling steps
        only)."""
        if not self.sampling:
            return
        if candidate == CHAIN:
            accepted = chain_accepted(accept_len, verified.budget)
        else:
            accepted = accepted_nodes(accept_index, verified.budget)
        observe(self.calibration, verified.scores, verified.depths, accepted, valid=verified.valid[:, 1:])

    # --- reporting ------------------------------------------------------------------------------------------
    def measured(self) -> list[tuple[str, list[float | None]]]:
        """("b<=LARGEST_BATCH", ms of every candidate or None) of each batch bucket with a measurement."""
        rows = [(f"b<={1 << k}", self.costs.costs(1 << k)) for k in range(self.costs.num_buckets)]
        return [(label, row) for label, row in rows if any(ms is not None for ms in row)]

    def stats(self) -> dict:
        """Steps, the histogram of every choice so far, the measured ms per batch bucket and candidate, and the
        mean of the (calibrated, batch-mean) expected accepted draft nodes per candidate over the samples read so far
        (``expected_mean``, empty before the first: what a projection to other step costs prices), also per kind of
        round (``expected_mean_by_kind``: ``greedy``, ``sampled``, those with samples). ``last_sweep``: per batch
        bucket, the number of its last settled sweep and each candidate's samples (ms, in arrival order; the sweep
        issues the candidates in order), to tell a cost from a trend within the sweep."""
        name = {c: "chain" if c == CHAIN else str(c) for c in self.candidates}
        costs = {label: {name[c]: round(ms, 4) for c, ms in zip(self.candidates, row, strict=True) if ms is not None}
                 for label, row in self.measured()}
        sweeps = {}
        for k, last in enumerate(self.costs.last_sweep):
            if last is not None:
                number, pool = last
                samples = {name[c]: [round(ms, 3) for ms in p] for c, p in zip(self.candidates, pool, strict=True)}
                sweeps[f"b<={1 << k}"] = {"sweep": number, **samples}

        def mean(sums: list[float], count: int) -> dict[str, float]:
            return {name[c]: round(v / count, 4) for c, v in zip(self.candidates, sums, strict=True)} if count else {}

        total = [sum(column) for column in zip(*self._expected_sums, strict=True)]
        by_kind = {kind: mean(sums, count) for kind, sums, count in
                   zip(KINDS, self._expected_sums, self._expected_counts, strict=True) if count}
        return {"steps": self.steps, "budget_histogram": {name[c]: n for c, n in self.total.items()},
                "step_ms": costs, "clock": self.clock_name, "expected_mean": mean(total, sum(self._expected_counts)),
                "expected_mean_by_kind": by_kind, "graphs": self.graphs, "last_sweep": sweeps}

    def write_stats(self) -> None:
        with open(self.stats_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(self.stats()) + "\n")

    def summary(self, recent: bool = False) -> str:
        """One log line: the choices (since the previous line, or all) and the measured ms per batch bucket."""
        chosen = self.chosen if recent else [c for c, n in self.total.items() for _ in range(n)]
        hist = budget_histogram(chosen, self.candidates)
        costs = [f"{label}: " + "/".join("-" if ms is None else f"{ms:.2f}" for ms in row)
                 for label, row in self.measured()]
        names = "/".join("chain" if c == CHAIN else str(c) for c in self.candidates)
        return (f"DDTREE budget: chosen {hist} over {len(chosen)} steps; step ms ({names}) "
                f"{'; '.join(costs) or 'not measured yet'}")


# --- one CUDA graph runner per verify width -------------------------------------------------------------------
def capture_verify_widths(model_runner: Any, widths: list[int], record: dict | None = None) -> dict[int, Any]:
    """{width: decode graph runner} for the target's verify: the runner SGLang captured (the server's widest
    width) and one more per other width, each captured by SGLang's own runner class.

    The attention backend's graph buffers (index pointers, the tree-mask buffer, KV indices) were sized for the
    widest width; the extra runners reuse them rather than re-allocate them (which would leave the captured
    graphs reading freed memory): their ``init_cuda_graph_state`` call is skipped. Returns {} when the server
    runs without CUDA graphs; a width whose capture fails is left out (it then runs eagerly) with one log line.
    ``record`` (optional) receives what the start-up log line says: ``widths`` with graphs besides the widest,
    ``eager`` (widths without), ``seconds`` and ``gb`` (device memory the extra graphs took).
    """
    base = getattr(model_runner, "decode_cuda_graph_runner", None)
    if base is None or not hasattr(base, "captured_req_width"):
        return {}
    runners = {int(base.captured_req_width): base}
    backend = base.attn_backend
    widest = max(runners)
    extra = sorted({int(w) for w in widths} - set(runners), reverse=True)
    too_wide = [w for w in extra if w > widest]
    if too_wide:
        raise ValueError(f"verify widths {too_wide} exceed the captured width {widest}")
    if not extra:
        return runners
    hybrid = hasattr(backend, "update_mamba_state_after_mtp_verify")
    if hybrid and os.environ.get(HYBRID_GRAPHS_ENV, "1") == "0":
        # The hybrid linear-attention backend precomputes per-width graph state (query start offsets and the
        # retrieve buffers, [bs, width]) in init_cuda_graph_state, so a narrower width needs a backend of its own
        # (hybrid_width_backend, the default); with HYBRID_GRAPHS_ENV=0 narrower widths run eagerly (exact; their
        # measured cost says so).
        logger.warning("DDTREE budget: hybrid linear-attention target: verify widths %s run without CUDA graphs "
                       "(only the widest, %d, has them: %s=0)", extra, widest, HYBRID_GRAPHS_ENV)
        if record is not None:
            record.update(widest=widest, widths=[], eager=extra, seconds=0.0, gb=0.0)
        return runners
    free_before = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0
    began = time.perf_counter()
    backend.init_cuda_graph_state = lambda *args, **kwargs: None  # instance attribute: the class method stays
    try:
        for width in extra:
            try:
                own = hybrid_width_backend(backend) if hybrid else backend
                runners[width] = type(base)(model_runner, attn_backend=own, speculative_num_draft_tokens=width)
            except Exception as exc:  # the width runs eagerly: slower, still exact
                logger.warning("DDTREE budget: no CUDA graphs for verify width %d (%s: %s); it runs eagerly",
                               width, type(exc).__name__, exc)
    finally:
        del backend.init_cuda_graph_state
        model_runner.decode_cuda_graph_runner = base
    free_after = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0
    captured = [w for w in extra if w in runners]
    seconds, gb = time.perf_counter() - began, (free_before - free_after) / 2**30
    logger.info("DDTREE budget: captured verify graphs for widths %s besides %d in %.1f s, %.2f GB",
                captured, widest, seconds, gb)
    if record is not None:
        record.update(widest=widest, widths=captured, eager=[w for w in extra if w not in runners],
                      seconds=round(seconds, 2), gb=round(gb, 3))
    return runners


#: Hybrid linear-attention targets get CUDA graphs at every verify width (:func:`hybrid_width_backend`) unless this
#: is ``0`` (the widest only; the others eager). On by default since bench/gpu/lossless.py's hybrid run showed it
#: exact (H100, 12-05: auto, widths 5, 8, 9 and 17 all replayed as graphs, 32/32 prompts at batch 1, 3 and 16,
#: graph and eager logits equal; bench/results/lossless-hybrid-auto-h100-2026-12-05.json).
HYBRID_GRAPHS_ENV = "SGLANG_DDTREE_HYBRID_WIDTH_GRAPHS"
#: The per-graph state a linear-attention backend (SGLang's MambaAttnBackendBase) builds in init_cuda_graph_state and
#: refreshes at each replay, sized by the verify width: a width's own backend starts with these empty.
_LINEAR_GRAPH_STATE = {
    "forward_metadata": None,
    "state_indices_list": list,
    "query_start_loc_list": list,
    "retrieve_next_token_list": list,
    "retrieve_next_sibling_list": list,
    "retrieve_parent_token_list": list,
    "mamba_track_indices_buf": None,
    "replayssm_write_pos_list": None,
    "replayssm_force_flush_list": None,
    "cached_cuda_graph_decode_query_start_loc": None,
    "cached_cuda_graph_verify_query_start_loc": None,
}


def hybrid_width_backend(backend: Any) -> Any:
    """A hybrid (full + linear attention) backend for one narrower verify width's graphs: the full-attention
    backend is shared (its graph buffers, sized for the widest width, serve every width, as for pure-attention
    targets), the linear-attention backend is a shallow copy with its own per-width graph state (query start
    offsets ``arange(0, bs * width, width)`` and ``[bs, width]`` retrieve buffers), which the returned backend's
    ``init_cuda_graph_state`` builds (for the linear part only) when SGLang's graph runner calls it.

    The copy's ``forward_metadata`` is what a replay of that width sets; the worker commits the recurrent state
    through the backend of the runner that replayed the step (``worker._ddtree_mamba_commit``).
    """
    linear = copy.copy(backend.linear_attn_backend)
    for name, fresh in _LINEAR_GRAPH_STATE.items():
        if hasattr(linear, name):
            setattr(linear, name, fresh() if callable(fresh) else fresh)
    own = copy.copy(backend)
    own.linear_attn_backend = linear
    own.attn_backend_list = [backend.full_attn_backend if x is backend.full_attn_backend else linear
                             for x in backend.attn_backend_list]
    own.init_cuda_graph_state = linear.init_cuda_graph_state  # the full-attention buffers are the widest's
    return own


def select_width(model_runner: Any, runners: dict[int, Any], width: int) -> None:
    """Point the model runner at the graph runner captured for ``width`` (none: the widest, which SGLang's
    uniform-width check then declines, so the step runs eagerly).

    When SGLang has captured its graphs anew since (a weight update with recapture), the model runner holds a
    runner that is not one of ``runners``: those are of the old capture, so ``runners`` is emptied (the other
    widths run eagerly from then on) and SGLang's runner is kept."""
    if not runners:
        return
    current = model_runner.decode_cuda_graph_runner
    if current is not None and not any(current is r for r in runners.values()):
        logger.warning("DDTREE budget: SGLang captured its verify graphs anew (a weight update?): the other widths "
                       "run without CUDA graphs from now on")
        runners.clear()
        return
    model_runner.decode_cuda_graph_runner = runners.get(width, runners[max(runners)])
