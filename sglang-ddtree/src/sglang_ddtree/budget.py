"""Adaptive node budget (issue 24), the CPU-testable core: expected acceptance, its calibration, the choice.

The SGLang worker uses it through ``sglang/auto_budget.py`` when ``SGLANG_DDTREE_BUDGET=auto`` (:data:`BUDGET_ENV`,
:func:`parse_budget_option`); this module only computes, on the host or on the device of its inputs.

The model
---------
One drafter pass gives per-depth distributions q_1..q_D; ``build_tree(logits, N)`` pops the N best rank tuples
in a fixed total order (score desc, lexicographic asc). That order does not depend on N (a node of rank r needs
its r elder siblings, so the top-min(N, V) candidates per depth never cut a tuple among the first n <= N pops):
**the first n nodes of a budget-N tree are the budget-n tree** (:func:`tree_prefix`). So the plugin can build
once at the largest candidate budget and price every smaller one from the same tree.

A draft node is accepted iff its whole path is (greedy: the target's argmax equals every token on the path;
sampling: the exact multi-candidate walk accepts a child x with the target's probability of x). Assuming the
target behaves like the drafter (the token at depth k follows q_k, independently of the path: DFlash's
per-position distributions do not condition on the drafted prefix), P(node i accepted) = exp(scores_i), and by
linearity of expectation the expected number of accepted draft nodes when the first n nodes are verified is

    E_n = sum_{i <= n} P(path to i accepted) ~= sum_{i <= n} exp(scores_i).

The chain (DFLASH's verify of the whole block) accepts depth d iff the rank-0 token matches at every depth <= d:
E_chain = sum_{d=1..D} prod_{k<=d} q_k(rank 0).

The drafter is not calibrated (trained drafters are typically over-confident deep in the block), so
:class:`Calibration` keeps an online, exponentially decayed ratio observed / predicted per (depth, probability
bucket) and rescales each node's probability by it (:func:`calibrated_probs`). The independence assumption is
the other approximation: a calibrated probability per (depth, bucket) absorbs its average error, not its
per-step error.

The choice: with one verify width per step (one CUDA graph per width), the batch commits sum_b (E_b + 1) tokens
per step, where +1 is the bonus token, so the plugin picks the candidate that maximises
B * (mean_b E_b + 1) / cost(B, candidate) (:func:`choose_budget`). ``cost`` is a table measured by the plugin
at start-up (:class:`StepCostTable`, interpolated between measured batch sizes) or while serving
(:class:`OnlineStepCost`: every step's own duration, per batch-size bucket; its choice maximises the long-run
rate instead, tokens minus the running rate times the cost); nothing here hard-codes a cost.
The chain is one candidate (:data:`CHAIN`), so a well-calibrated chooser is never worse than DFLASH by more
than its own cost.

Host synchronisation: :func:`tree_prefix`, :func:`expected_accept_length`, :func:`calibrated_probs`,
:func:`observe` and :func:`accepted_nodes` are tensor ops on the device of their inputs, with static shapes and
no host sync (no Python loop over requests). :func:`choose_budget` runs once per step on the host: it reads C
numbers (the batch mean of the expectations, one device-to-host copy) and a tiny host table; the chosen width
selects which CUDA graph to replay, so one host read per step is inherent to a per-step width.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import torch

from .tree import DraftTree

__all__ = [
    "AUTO_BUDGETS",
    "BUDGET_ENV",
    "CHAIN",
    "PERIOD_CLOCK_COSTS",
    "Calibration",
    "OnlineStepCost",
    "StepCostTable",
    "accepted_nodes",
    "budget_histogram",
    "calibrated_probs",
    "chain_accepted",
    "chain_path_logprobs",
    "choose_budget",
    "expected_accept_length",
    "observe",
    "parse_budget_option",
    "tokens_per_second",
    "top1_logprobs",
    "tree_prefix",
]

CHAIN = 0
"""The candidate "verify the drafter's argmax chain over the whole block" (DFLASH). Tree budgets are >= 1."""

#: The environment variable that selects the budget policy of a DDTREE server (every process of the server reads
#: it: the start-up check and each scheduler's worker). Unset or ``fixed``: the budget of
#: ``--speculative-num-draft-tokens``; ``auto``: chosen per step (:func:`parse_budget_option`).
BUDGET_ENV = "SGLANG_DDTREE_BUDGET"
#: The tree budgets ``auto`` offers (those up to the server's widest), besides the chain and the widest itself.
AUTO_BUDGETS = (4, 8, 16, 32)
#: :class:`OnlineStepCost`'s settings under the period clock (``sglang/auto_budget.py``), which prices a round only
#: after another round of the same candidate: one round of each burst gives no sample, so bursts are one longer.
PERIOD_CLOCK_COSTS = {"min_samples": 4, "refresh_burst": 3, "unsampled_per_burst": 1}


def least_widest_budget(block_size: int) -> int:
    """The smallest widest budget (``--speculative-num-draft-tokens`` - 1) a server with a drafter of this block size
    can start with: SGLang's DFLASH decode reserves 2 x num_draft_tokens KV slots a step ahead of each request and the
    drafter's block writes ``block_size`` of them, so num_draft_tokens >= ceil(block_size / 2). A narrower budget is
    served as a single candidate of :data:`BUDGET_ENV` under this one."""
    return -(-block_size // 2) - 1


def fixed_budget_report(budget: int, rounds: int) -> dict:
    """The ``ddtree_budget`` report (``/get_server_info``'s ``internal_states[i]``) of a server that verified one
    fixed budget on each of its ``rounds`` tree rounds: ``policy``, ``candidates``, ``steps``, ``budget_histogram``."""
    name = str(budget)
    return {"policy": "fixed", "candidates": [name], "steps": rounds, "budget_histogram": {name: rounds}}


def parse_budget_option(value: str | None, max_budget: int, block_size: int) -> tuple[int, ...] | None:
    """The candidates of a per-step budget choice named by :data:`BUDGET_ENV`, or None for a fixed budget.

    Args:
        value: the variable's value: None, ``""`` or ``"fixed"`` (a fixed budget), ``"auto"``, a comma list
            of ``chain`` and budgets, e.g. ``"chain,8,16"``, or one of them alone: every step verifies that
            candidate while KV and graphs stay sized for the widest (e.g. budget 4 with a block-16 drafter, whose
            block needs ``--speculative-num-draft-tokens`` >= 8).
        max_budget: the widest budget, from ``--speculative-num-draft-tokens`` (budget + 1): the KV reserved per
            request and the widest verify graph are sized for it, so no candidate may exceed it.
        block_size: the drafter's block size; the chain verifies ``block_size`` tokens (root + depth D).

    Returns:
        Sorted candidates, :data:`CHAIN` (0) first: ``auto`` gives the chain (when its width ``block_size`` fits
        within ``max_budget + 1``), every budget of :data:`AUTO_BUDGETS` below ``max_budget``, and ``max_budget``.
        One candidate alone comes back as a 1-tuple (None when it is ``max_budget``: that is the fixed budget).

    Raises:
        ValueError naming the variable, the bad value and the fix.
    """
    text = (value or "").strip().lower()
    if text in ("", "fixed"):
        return None
    chain_fits = block_size <= max_budget + 1
    if text == "auto":
        budgets = {b for b in AUTO_BUDGETS if b < max_budget} | {max_budget}
        return ((CHAIN,) if chain_fits else ()) + tuple(sorted(budgets))
    chosen: list[int] = []
    for word in (w.strip() for w in text.split(",")):
        if word == "chain":
            if not chain_fits:
                raise ValueError(
                    f"{BUDGET_ENV}={value!r}: the chain verifies the drafter's whole block ({block_size} tokens), "
                    f"wider than --speculative-num-draft-tokens {max_budget + 1}; raise it to at least {block_size} "
                    "or leave 'chain' out"
                )
            candidate = CHAIN
        elif word.isdigit() and 1 <= int(word) <= max_budget:
            candidate = int(word)
        else:
            raise ValueError(
                f"{BUDGET_ENV}={value!r}: {word!r} is not 'chain' or a budget in 1..{max_budget} (the widest budget "
                f"is --speculative-num-draft-tokens - 1 = {max_budget}); use 'auto', 'fixed', or a list such as "
                f"'chain,8,{max_budget}'"
            )
        if candidate in chosen:
            raise ValueError(f"{BUDGET_ENV}={value!r}: {word!r} is listed twice; name each candidate once")
        chosen.append(candidate)
    if chosen == [max_budget]:
        return None
    return tuple(sorted(chosen))


# --------------------------------------------------------------------------------------------------------------
# Prefix trees and expected acceptance


def tree_prefix(tree: DraftTree, n: int) -> DraftTree:
    """The budget-n tree contained in a budget-N tree (n <= N): its first n nodes, in the same pop order.

    Equal field by field to ``build_tree(same_logits, n)`` (tested): node columns are sliced, ``ancestors`` is the
    leading [n+1, n+1] block, children and siblings beyond node n are cut (siblings are in index order and a
    child's index exceeds its parent's, so a cut link has nothing valid after it), ``num_nodes`` is capped.

    Args:
        tree: DraftTree of budget N (shapes [B, N], [B, N+1], [B, N+1, N+1]).
        n: 1 <= n <= N.

    Returns:
        DraftTree of budget n, views or small new tensors on the same device; no host sync.
    """
    if not 1 <= n <= tree.budget:
        raise ValueError(f"prefix budget must be in 1..{tree.budget}, got {n}")
    cut = n + 1
    first_child = tree.first_child[:, :cut]
    next_sibling = tree.next_sibling[:, :cut]
    return replace(
        tree,
        tokens=tree.tokens[:, :n],
        depths=tree.depths[:, :n],
        parents=tree.parents[:, :cut],
        ancestors=tree.ancestors[:, :cut, :cut],
        first_child=torch.where(first_child < cut, first_child, -1),
        next_sibling=torch.where(next_sibling < cut, next_sibling, -1),
        num_nodes=tree.num_nodes.clamp(max=cut),
        scores=tree.scores[:, :n],
        ranks=tree.ranks[:, :n],
        logprobs=tree.logprobs[:, :n],
    )


def top1_logprobs(tree: DraftTree) -> torch.Tensor:
    """float32 [B, D]: log q_d(rank 0) per depth: the tree's ``top1_logprobs`` (for ``build_tree``, exactly
    ``-row_logsum``: the argmax logit equals ``row_max``)."""
    if tree.top1_logprobs is not None:
        return tree.top1_logprobs
    if tree.row_logsum is None:
        raise ValueError("this tree has no top1_logprobs or row_logsum: pass chain_logprobs explicitly")
    return -tree.row_logsum


def chain_path_logprobs(top1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The argmax chain as nodes: (path log-probability float64 [B, D], depth int64 [B, D] = 1..D).

    ``path[:, d-1] = sum_{k<=d} log q_k(rank 0)``, accumulated left to right in float64 like the tree's scores,
    so it equals the score of the rank-(0, ..., 0) node whenever the tree holds it.
    """
    path = top1.double().cumsum(dim=-1)
    depth = torch.arange(1, top1.shape[-1] + 1, device=top1.device).expand(top1.shape)
    return path, depth


def expected_accept_length(
    tree: DraftTree,
    candidates: Sequence[int],
    *,
    calibration: Calibration | None = None,
    chain_logprobs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Expected accepted draft nodes per request for every candidate, from one tree built at the largest budget.

    Args:
        tree: DraftTree of budget N >= every tree candidate.
        candidates: budgets n in 1..N, and/or :data:`CHAIN` (static Python ints, e.g. ``(CHAIN, 4, 8, 16, 32)``).
        calibration: if given, node probabilities go through :func:`calibrated_probs`; else raw exp(scores).
        chain_logprobs: float [B, D] rank-0 log-probabilities per depth, needed for CHAIN when the tree has no
            normaliser (default :func:`top1_logprobs`).

    Returns:
        float64 [B, C]: column c is E[accepted draft nodes] (0..D; the round commits this + 1 tokens) if
        candidate c were verified. Tree columns: cumulative sums of the node probabilities in pop order, so
        non-decreasing in n. Padding nodes (tiny vocabularies) count 0. Device of the tree, no host sync.
    """
    n_max = tree.budget
    bad = [c for c in candidates if c != CHAIN and not 1 <= c <= n_max]
    if bad:
        raise ValueError(f"tree candidates must be in 1..{n_max} (the tree's budget) or CHAIN, got {bad}")
    probs = calibrated_probs(calibration, tree.scores, tree.depths)
    cols = [torch.zeros_like(probs[:, :1]), probs.cumsum(dim=1)]
    if CHAIN in candidates:
        top1 = top1_logprobs(tree) if chain_logprobs is None else chain_logprobs
        path, depth = chain_path_logprobs(top1.to(tree.scores.device))
        cols.append(calibrated_probs(calibration, path, depth).sum(dim=1, keepdim=True))
    table = torch.cat(cols, dim=1)  # [B, N+2]: 0, E_1..E_N, E_chain
    index = [n_max + 1 if c == CHAIN else c for c in candidates]  # static: slices, no host-to-device copy
    return torch.cat([table[:, i : i + 1] for i in index], dim=1)


# --------------------------------------------------------------------------------------------------------------
# Online calibration


@dataclass
class Calibration:
    """Online calibration of path probabilities: decayed sums per (depth, bucket of predicted probability).

    Buckets are uniform in log-probability: bucket k holds predicted path log-probabilities in
    ``(-(k+1) * bucket_width, -k * bucket_width]`` nats; the last bucket takes everything lower (and -inf).
    A cell's correction factor is the ratio observed / predicted, shrunk towards the same bucket pooled over all
    depths by ``prior`` pseudo-acceptances, which is itself shrunk towards 1 (trust the drafter) the same way:

        f_k     = (sum_d observed[d, k] + prior) / (sum_d predicted[d, k] + prior)
        f[d, k] = (observed[d, k] + prior * f_k) / (predicted[d, k] + prior)

    and a node's calibrated probability is ``min(1, exp(logp) * f[depth, bucket])``. Every :func:`observe` first
    multiplies both sums by ``decay`` (per step: an old regime fades with half-life log(0.5)/log(decay) steps).

    Fields: predicted, observed: float64 [D, K] (fixed size, updated in place by :func:`observe`); decay in
    (0, 1]; bucket_width > 0 (nats); prior >= 0. A ratio per bucket corrects scale (2x over-confidence is f =
    0.5) and keeps the order of nodes within a bucket. A child may come out above its parent across a bucket
    edge; the expectation only sums, so this is harmless.
    """

    predicted: torch.Tensor
    observed: torch.Tensor
    decay: float = 0.99
    bucket_width: float = 0.5
    prior: float = 2.0

    @classmethod
    def create(
        cls,
        max_depth: int,
        *,
        num_buckets: int = 16,
        bucket_width: float = 0.5,
        decay: float = 0.99,
        prior: float = 2.0,
        device: torch.device | str | None = None,
    ) -> Calibration:
        """Empty state for depths 1..max_depth (factors all 1 until observations arrive)."""
        if max_depth < 1 or num_buckets < 1:
            raise ValueError("max_depth and num_buckets must be >= 1")
        if not 0.0 < decay <= 1.0 or bucket_width <= 0.0 or prior < 0.0:
            raise ValueError("need 0 < decay <= 1, bucket_width > 0, prior >= 0")
        zeros = torch.zeros(max_depth, num_buckets, dtype=torch.float64, device=device)
        return cls(zeros, zeros.clone(), decay=decay, bucket_width=bucket_width, prior=prior)

    def buckets(self, logp: torch.Tensor) -> torch.Tensor:
        """int64, shape of ``logp``: bucket of each predicted path log-probability."""
        k = (-logp.double() / self.bucket_width).floor().clamp(0, self.predicted.shape[1] - 1)
        return torch.nan_to_num(k, nan=0.0).long()

    def cells(self, logp: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
        """int64, shape of ``logp``: flat index (depth - 1) * K + bucket; depths clamped to 1..D (padding -> 1)."""
        d = depths.long().clamp(1, self.predicted.shape[0]) - 1
        return d * self.predicted.shape[1] + self.buckets(logp)

    def factors(self) -> torch.Tensor:
        """float64 [D, K]: the correction factor of every cell (see the class docstring)."""
        pooled = (self.observed.sum(0) + self.prior) / (self.predicted.sum(0) + self.prior)
        return (self.observed + self.prior * pooled) / (self.predicted + self.prior)


def calibrated_probs(calibration: Calibration | None, logp: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """float64, shape of ``logp``: acceptance probability of each node from its path log-probability and depth.

    ``exp(logp)`` when ``calibration`` is None, else ``min(1, exp(logp) * factor[depth, bucket])``. -inf (padding)
    gives 0. Device of the inputs, no host sync.
    """
    probs = logp.double().exp()
    if calibration is None:
        return probs
    factor = calibration.factors().take(calibration.cells(logp, depths))
    return (probs * factor).clamp(max=1.0)


def accepted_nodes(accept_index: torch.Tensor, budget: int) -> torch.Tensor:
    """bool [B, n]: which of the n verified draft nodes were accepted, from a walk's ``accept_index [B, D+1]``.

    ``accept_index`` is root first then accepted node indices (1..n), -1 padded (``greedy_walk``/``sampling_walk``).
    """
    hit = torch.zeros(accept_index.shape[0], budget + 1, dtype=torch.bool, device=accept_index.device)
    hit.scatter_(1, accept_index.clamp(min=0), True)  # -1 padding lands on the root column, dropped below
    return hit[:, 1:]


def chain_accepted(accept_len: torch.Tensor, max_depth: int) -> torch.Tensor:
    """bool [B, D]: depth d of the chain was accepted (d <= accept_len), for :func:`observe` after a DFLASH step."""
    depth = torch.arange(1, max_depth + 1, device=accept_len.device)
    return depth[None, :] <= accept_len[:, None]


def observe(
    calibration: Calibration,
    logp: torch.Tensor,
    depths: torch.Tensor,
    accepted: torch.Tensor,
    valid: torch.Tensor | None = None,
) -> None:
    """Fold one step's verified nodes into ``calibration`` (in place: capturable, no host sync).

    Args:
        calibration: the state; both sums are first multiplied by its decay.
        logp: float [B, n] predicted path log-probabilities of the verified nodes (tree ``scores[:, :n]``, or
            :func:`chain_path_logprobs` for a DFLASH step). Use the RAW drafter values, not calibrated ones.
        depths: int [B, n], 1..D.
        accepted: bool [B, n], e.g. :func:`accepted_nodes` or :func:`chain_accepted`.
        valid: bool [B, n] or None; False entries (padding nodes, idle requests) are ignored.
    """
    cells = calibration.cells(logp, depths).reshape(-1)
    weight = torch.ones_like(logp, dtype=torch.float64) if valid is None else valid.double()
    weight = torch.where(torch.isneginf(logp), 0.0, weight)
    calibration.predicted.mul_(calibration.decay)
    calibration.observed.mul_(calibration.decay)
    calibration.predicted.view(-1).index_add_(0, cells, (logp.double().exp() * weight).reshape(-1).nan_to_num(0.0))
    calibration.observed.view(-1).index_add_(0, cells, (accepted.double() * weight).reshape(-1))


# --------------------------------------------------------------------------------------------------------------
# The choice


@dataclass(frozen=True)
class StepCostTable:
    """Measured ms per decode step for each candidate at a few batch sizes (the plugin measures it at start-up).

    Fields: batch_sizes: strictly increasing ints, S >= 1; candidates: C distinct ints (:data:`CHAIN` or a budget);
    cost_ms: S rows of C positive floats, ``cost_ms[s][c]`` = one step of candidate c at batch_sizes[s].
    """

    batch_sizes: tuple[int, ...]
    candidates: tuple[int, ...]
    cost_ms: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if not self.batch_sizes or any(
            b >= a for a, b in zip(self.batch_sizes[1:], self.batch_sizes[:-1], strict=True)
        ):
            raise ValueError(f"batch_sizes must be non-empty and strictly increasing, got {self.batch_sizes}")
        if len(set(self.candidates)) != len(self.candidates) or any(c < 0 for c in self.candidates):
            raise ValueError(f"candidates must be distinct, CHAIN (0) or budgets >= 1, got {self.candidates}")
        if len(self.cost_ms) != len(self.batch_sizes) or any(len(r) != len(self.candidates) for r in self.cost_ms):
            raise ValueError("cost_ms must have one row per batch size and one column per candidate")
        if not all(math.isfinite(x) and x > 0 for r in self.cost_ms for x in r):
            raise ValueError("costs must be finite and > 0 ms")

    def cost_at(self, batch_size: float) -> list[float]:
        """C costs in ms at ``batch_size``: linear interpolation between the measured batch sizes around it,
        the nearest measured row outside their range (only ratios between candidates matter to the choice)."""
        sizes, rows = self.batch_sizes, self.cost_ms
        if batch_size <= sizes[0]:
            return list(rows[0])
        if batch_size >= sizes[-1]:
            return list(rows[-1])
        hi = next(i for i, s in enumerate(sizes) if s >= batch_size)
        t = (batch_size - sizes[hi - 1]) / (sizes[hi] - sizes[hi - 1])
        return [(1 - t) * a + t * b for a, b in zip(rows[hi - 1], rows[hi], strict=True)]


def tokens_per_second(
    expected: torch.Tensor | Sequence[float], cost_ms: Sequence[float], batch_size: int
) -> list[float]:
    """Committed tokens per second of the batch for each candidate: batch_size * (E + 1) / cost * 1000.

    Args:
        expected: [B, C] per-request expected accepted draft nodes (the batch mean is used), or [C] already
            averaged. One device-to-host copy of C numbers if it lives on a GPU.
        cost_ms: C step costs in ms (e.g. ``StepCostTable.cost_at(batch_size)``).
        batch_size: B.
    """
    e = torch.as_tensor(expected, dtype=torch.float64)
    if e.dim() == 2:
        e = e.mean(dim=0)
    mean = e.cpu().tolist()
    if len(mean) != len(cost_ms):
        raise ValueError(f"{len(mean)} expectations for {len(cost_ms)} costs")
    return [batch_size * (m + 1.0) * 1000.0 / c for m, c in zip(mean, cost_ms, strict=True)]


def choose_budget(expected: torch.Tensor | Sequence[float], table: StepCostTable, batch_size: int | None = None) -> int:
    """The candidate (a budget, or :data:`CHAIN`) with the most committed tokens per second. Host side, once per step.

    Args:
        expected: [B, C] or [C] expected accepted draft nodes, columns in ``table.candidates`` order (e.g.
            ``expected_accept_length(tree, table.candidates, calibration=cal)``).
        table: measured step costs.
        batch_size: the batch size to price (default B of a 2-D ``expected``).

    Ties go to the earlier candidate in the table (list the chain and cheap budgets first).
    """
    if batch_size is None:
        if not isinstance(expected, torch.Tensor) or expected.dim() != 2:
            raise ValueError("batch_size is required unless expected is a [B, C] tensor")
        batch_size = int(expected.shape[0])
    rates = tokens_per_second(expected, table.cost_at(batch_size), batch_size)
    best = max(range(len(rates)), key=lambda i: (rates[i], -i))
    return table.candidates[best]


@dataclass
class OnlineStepCost:
    """Step costs measured while serving, and the per-step choice made from them.

    Per batch-size bucket (:meth:`bucket`: 1, 2, 3-4, 5-8, ... up to ``num_buckets``) the cost of candidate c is a
    level times c's ratio to it, ``exp(level + ratio[c])`` ms (log space):

    * the **ratios** come from **sweeps**: every candidate issued on a few consecutive steps of the bucket
      (``min_samples`` steps each in the bucket's first sweep, the exploration; ``refresh_burst`` in the later ones, one
      every ``refresh_steps`` of the bucket's steps, or as soon as ``min_gap`` steps after the last one when the level
      has moved by more than a factor ``drift`` since that sweep). The candidates of one sweep are measured within a few
      steps of each other, under the same load (context length, temperature mix, what else the host runs), so their
      relative costs are comparable; each candidate's statistic is the lower median of its sweep samples (a one-off slow
      step, such as a Triton kernel compiled at a width's first use, 0.9 s against 3-5 ms on the H200 12-05, never sets
      it; a candidate priced for the first time needs two samples, or it stays unpriced until a later sweep). A later
      sweep moves each ratio by ``ratio_alpha`` of the way (at most a factor ``clip``). A sweep costs
      throughput (at batch 32 the widest tree's step is 2.5x the best one's): when a refresh finds every ratio within
      a factor ``stable`` of where it was, the bucket's next refresh comes twice as many steps later (up to
      ``max_refresh_steps``), and one that moved anything brings the interval back to ``refresh_steps``;
    * the **level** follows every other step: whatever the choice issues, its measured duration over its ratio moves
      the level by ``alpha`` (the log residual clipped to a factor ``clip``). When every step gets slower (longer
      contexts, temperature-1 batches after greedy ones) the level moves and every candidate's cost with it.

    The costs of 12-06 kept each candidate's own average instead: the candidate the choice issued followed the load
    (its cost doubled when sampling batches came) while the others kept the costs measured at exploration, under
    other load, for up to 2000 steps, so the choice compared a fresh cost against stale ones
    (``bench/results/tau-h100-2026-12-06b.md``).

    A step's sample is tagged by :meth:`choose` (``last_tag``: (bucket, sweep) on a sweep step, else None) and the
    tag is handed back to :meth:`record` with the duration, which may arrive steps later (CUDA events are read once
    done; the period clock prices a round at the start of the next one). A sweep's ratios are set once its last step
    is issued and every candidate has ``refresh_burst - unsampled_per_burst`` samples (``min_samples - ...`` for the
    first), or ``settle_steps`` of the bucket's steps after it, with what arrived; a later sample of it counts for
    the level. Plain Python floats and lists on the host (a few hundred numbers; about 10 us a step, no tensor op).

    The choice maximises the long-run rate, total committed tokens over total time, not each step's own rate: a
    step's expected tokens minus ``rate`` times its cost (Dinkelbach's rule for a ratio of sums), where ``rate`` is
    the bucket's running rate of the steps chosen so far (weight ``rate_alpha``; each step's own rate until there
    is one). On a step whose expectations are low a slightly cheaper candidate then wins less often than by the
    per-step ratio, which would trade tokens on good steps for time on poor ones.

    :meth:`choose` is a function of these tables, the batch size and the expectations only (under tensor
    parallelism every rank runs it, so that the sweeps stay in step, and the first rank's choice is broadcast:
    ``sglang/auto_budget.py``).

    Fields: candidates (as :func:`parse_budget_option` returns them, the chain first); alpha in (0, 1]: the level's
    weight of a new step; min_samples >= 1 and refresh_burst >= 1: consecutive steps per candidate in the first and
    in later sweeps; refresh_steps >= 1: the bucket's steps from one sweep's start to the next; drift > 1 and
    min_gap >= 1: an earlier sweep when the level moved (see above); max_refresh_steps >= refresh_steps and stable
    > 1: the refresh back-off; rate_alpha in (0, 1]: the running rate's weight of a step; unsampled_per_burst
    >= 0: steps of a burst that give no sample (1 for the period clock, which prices a round only after another of
    the same candidate), below both bursts; num_buckets >= 1; clip > 1; ratio_alpha in (0, 1]; settle_steps >= 1.
    """

    candidates: tuple[int, ...]
    alpha: float = 0.2
    min_samples: int = 3
    refresh_steps: int = 256
    num_buckets: int = 12
    clip: float = 2.0
    refresh_burst: int = 3
    unsampled_per_burst: int = 0
    ratio_alpha: float = 0.5
    settle_steps: int = 4
    drift: float = 1.25
    min_gap: int = 128
    max_refresh_steps: int = 4096
    stable: float = 1.1
    rate_alpha: float = 0.02

    def __post_init__(self) -> None:
        if len(set(self.candidates)) != len(self.candidates) or len(self.candidates) < 1:
            raise ValueError(f"candidates must be distinct and non-empty, got {self.candidates}")
        if (not 0.0 < self.alpha <= 1.0 or self.min_samples < 1 or self.refresh_steps < 1 or self.num_buckets < 1
                or not self.clip > 1.0 or self.refresh_burst < 1 or not 0.0 < self.ratio_alpha <= 1.0
                or self.settle_steps < 1 or not self.drift > 1.0 or self.min_gap < 1
                or self.max_refresh_steps < self.refresh_steps or not self.stable > 1.0
                or not 0.0 < self.rate_alpha <= 1.0
                or not 0 <= self.unsampled_per_burst < min(self.min_samples, self.refresh_burst)):
            raise ValueError("need 0 < alpha <= 1, min_samples >= 1, refresh_steps >= 1, num_buckets >= 1, clip > 1, "
                             "refresh_burst >= 1, 0 < ratio_alpha <= 1, settle_steps >= 1, drift > 1, min_gap >= 1, "
                             "max_refresh_steps >= refresh_steps, stable > 1, 0 < rate_alpha <= 1, "
                             "0 <= unsampled_per_burst < min(min_samples, refresh_burst)")
        width, buckets = len(self.candidates), range(self.num_buckets)
        self.level: list[float | None] = [None for _ in buckets]
        self.ratio: list[list[float]] = [[0.0] * width for _ in buckets]
        self.measured: list[list[bool]] = [[False] * width for _ in buckets]
        self.samples: list[list[int]] = [[0] * width for _ in buckets]
        self.steps: list[int] = [0 for _ in buckets]
        self.sweeps: list[int] = [0 for _ in buckets]  # sweeps started per bucket
        self._queue: list[list[int]] = [[] for _ in buckets]  # candidate indices the current sweep still issues
        self._sweep_start: list[int] = [0 for _ in buckets]
        self._sweep_end: list[int] = [0 for _ in buckets]  # the bucket step that issued its last candidate
        self._pool: list[list[list[float]] | None] = [None for _ in buckets]  # the open sweep's samples
        #: per bucket, the last settled sweep: (its number, each candidate's samples in arrival order), for reports
        self.last_sweep: list[tuple[int, list[list[float]]] | None] = [None for _ in buckets]
        self._swept_level: list[float | None] = [None for _ in buckets]  # the level when the last ratios were set
        self.interval: list[int] = [self.refresh_steps for _ in buckets]  # steps from one refresh to the next
        self.rate: list[float | None] = [None for _ in buckets]  # running tokens per ms of the chosen steps
        self._index = {c: i for i, c in enumerate(self.candidates)}
        self._log_clip, self._log_drift = math.log(self.clip), math.log(self.drift)
        self.last_tag: tuple[int, int] | None = None

    def bucket(self, batch_size: int) -> int:
        """0 for batch 1, 1 for 2, 2 for 3-4, 3 for 5-8, ...: ceil(log2(batch_size)), capped at num_buckets - 1."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return min(int(batch_size - 1).bit_length(), self.num_buckets - 1)

    def _clipped(self, x: float) -> float:
        return min(max(x, -self._log_clip), self._log_clip)

    def record(self, candidate: int, batch_size: int, ms: float, tag: tuple[int, int] | None = None) -> None:
        """Fold one step's measured duration (ms > 0 and finite; anything else is ignored) into its bucket;
        ``tag``: what :meth:`choose` set as ``last_tag`` for that step."""
        if not (math.isfinite(ms) and ms > 0):
            return
        if candidate not in self._index:
            raise ValueError(f"{candidate} is not a candidate {self.candidates}")
        k, c = self.bucket(batch_size), self._index[candidate]
        self.samples[k][c] += 1
        pool = self._pool[k]
        if pool is not None and tag == (k, self.sweeps[k]):
            pool[c].append(ms)
            self._settle(k)
            return
        level = self.level[k]
        if level is not None and self.measured[k][c]:
            self.level[k] = level + self.alpha * self._clipped(math.log(ms) - level - self.ratio[k][c])

    def _settle(self, k: int) -> None:
        """Set the ratios from the open sweep of bucket k once it is complete or settled (see the class)."""
        pool = self._pool[k]
        if pool is None or self._queue[k]:
            return
        complete = all(len(p) >= self._burst(self.sweeps[k]) - self.unsampled_per_burst for p in pool)
        if not complete and self.steps[k] - self._sweep_end[k] < self.settle_steps:
            return
        self._pool[k] = None
        self.last_sweep[k] = (self.sweeps[k], pool)
        ratio, measured = self.ratio[k], self.measured[k]
        # a candidate priced for the first time needs two samples (one where a burst yields one): a lone slow step
        # would set its ratio outright, and later sweeps move a ratio by a bounded step only. On the H100 12-07b
        # auto priced budget 4 at about 20x its neighbours in the batch 3-4 bucket from its first sweep (a bucket
        # the draining batches pass through in a few steps) and kept it there for the remaining 20000 steps
        first = min(2, self._burst(self.sweeps[k]) - self.unsampled_per_burst)
        stat = {c: math.log(statistics.median_low(p)) for c, p in enumerate(pool)
                if p and (measured[c] or len(p) >= first)}
        if not stat:
            return
        known = [c for c in stat if measured[c]]
        if not known:  # the bucket's first costs, or only candidates never measured: relative to each other
            base = statistics.fmean(stat.values())
            for c, x in stat.items():
                ratio[c] = x - base
            if self.level[k] is None:
                self.level[k] = base
        else:  # relative to the candidates measured before, whose mean ratio stays where it was
            shift = statistics.fmean(ratio[c] for c in known) - statistics.fmean(stat[c] for c in known)
            moved = any(not measured[c] or abs(x + shift - ratio[c]) > math.log(self.stable) for c, x in stat.items())
            self.interval[k] = self.refresh_steps if moved else min(2 * self.interval[k], self.max_refresh_steps)
            for c, x in stat.items():
                if measured[c]:
                    ratio[c] += self.ratio_alpha * self._clipped(x + shift - ratio[c])
                else:
                    ratio[c] = x + shift
            level = statistics.fmean(stat[c] - ratio[c] for c in known)
            self.level[k] += self.ratio_alpha * self._clipped(level - self.level[k])
        for c in stat:
            measured[c] = True
        self._swept_level[k] = self.level[k]

    def _drifted(self, k: int, step: int) -> bool:
        """Bucket k's level moved by more than ``drift`` since its ratios were last set, ``min_gap`` steps ago or
        more: the load changed, so its ratios are measured again."""
        level, swept = self.level[k], self._swept_level[k]
        return (level is not None and swept is not None and step - self._sweep_start[k] >= self.min_gap
                and abs(level - swept) > self._log_drift)

    def _burst(self, sweep: int) -> int:
        """Consecutive steps per candidate in the bucket's ``sweep``-th sweep (1: the exploration)."""
        return self.min_samples if sweep == 1 else self.refresh_burst

    def costs(self, batch_size: int) -> list[float | None]:
        """The measured ms of every candidate at this batch size's bucket (None: not measured yet)."""
        k = self.bucket(batch_size)
        level = self.level[k]
        return [math.exp(level + r) if level is not None and m else None
                for r, m in zip(self.ratio[k], self.measured[k], strict=True)]

    def choose(self, expected: Sequence[float], batch_size: int) -> int:
        """The candidate to verify this step; sets ``last_tag`` for :meth:`record`.

        In order: the current sweep's next candidate (a sweep starts at the bucket's first step and ``interval``
        of its steps after the last one started, ``refresh_steps`` to ``max_refresh_steps``, or ``min_gap`` after
        it once the level has moved by more than a factor ``drift`` since its ratios were set; never before they
        are set); else, among the candidates measured here, the one with the most expected committed tokens
        ``E + 1`` a request minus ``rate`` times its cost (the class docstring; ties: the earlier candidate); the
        widest candidate when none is measured yet.

        Args:
            expected: C expected accepted draft nodes per request (a batch mean), in ``candidates`` order.
            batch_size: B >= 1.
        """
        if len(expected) != len(self.candidates):
            raise ValueError(f"{len(expected)} expectations for {len(self.candidates)} candidates")
        k = self.bucket(batch_size)
        self.steps[k] += 1
        step = self.steps[k]
        self._settle(k)
        queue = self._queue[k]
        if not queue and self._pool[k] is None and (
            self.sweeps[k] == 0 or step - self._sweep_start[k] >= self.interval[k] or self._drifted(k, step)
        ):
            self.sweeps[k] += 1
            burst = self._burst(self.sweeps[k])
            queue.extend(c for c in range(len(self.candidates)) for _ in range(burst))
            self._sweep_start[k] = step
            self._pool[k] = [[] for _ in self.candidates]
        if queue:
            pick = queue.pop(0)
            if not queue:
                self._sweep_end[k] = step
            self.last_tag = (k, self.sweeps[k])
            return self.candidates[pick]
        self.last_tag = None
        costs = self.costs(batch_size)
        priced = [(c, float(e) + 1.0, cost) for c, (e, cost) in enumerate(zip(expected, costs, strict=True))
                  if cost is not None and math.isfinite(e)]
        if not priced:
            return self.candidates[-1]
        rate = self.rate[k]
        if rate is None:  # no chosen step yet: the best rate of this one
            rate = max(tokens / cost for _, tokens, cost in priced)
        best = priced[0]
        for item in priced[1:]:
            if item[1] - rate * item[2] > best[1] - rate * best[2]:
                best = item
        self.rate[k] = rate + self.rate_alpha * (best[1] / best[2] - rate)
        return self.candidates[best[0]]


def budget_histogram(chosen: Iterable[int], candidates: Sequence[int]) -> dict[str, int]:
    """Counts of the chosen candidates, for reports (the issue's ``budget_histogram``).

    Keys in ``candidates`` order, every candidate present (zero counts included): ``"chain"`` for :data:`CHAIN`,
    else the budget as a string. A choice outside ``candidates`` is an error.
    """
    counts = {c: 0 for c in candidates}
    for c in chosen:
        if c not in counts:
            raise ValueError(f"chosen budget {c} is not a candidate {tuple(candidates)}")
        counts[c] += 1
    return {("chain" if c == CHAIN else str(c)): n for c, n in counts.items()}
