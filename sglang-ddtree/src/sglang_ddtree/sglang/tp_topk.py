"""Tensor parallel > 1: the drafter's logits are split by vocabulary across ranks (SGLang's vocab-parallel
lm_head). The tree needs, per depth, the global top ``K = min(budget, V)`` tokens with their GLOBAL
log-probabilities. Each rank takes its shard's top-K (exact, ties by token id) and its shard's
log-sum-exp; the ranks all-gather both; the global log-normaliser is the log-sum-exp of the shard ones; the
candidates are the union of the shards' top-K with ``logit - global_lse``. ``build_tree_from_topk`` then picks
the true top-K of the union (the global top-K is always inside it).

``all_gather`` is injected (``torch.distributed`` / SGLang's TP group on GPU, a list concatenation in tests).

``resolve_tp_group`` finds SGLang's TP ``GroupCoordinator`` once, at start-up: ``get_parallel().tp_group``
(``sglang.srt.runtime_context``, present in every supported release), the accessor SGLang 0.5.21+ name when they
deprecate the module-level getter (``parallel_state._warn_if_called_from_outside``: "get_tp_group() is deprecated;
read get_parallel().tp_group instead, which answers the same thing and can be redirected by a scope"); the
module-level ``get_tp_group()`` only where ``get_parallel`` is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["resolve_tp_group", "sharded_candidates", "tp_group_reader"]


def sharded_candidates(
    local_logits: torch.Tensor,
    vocab_start: int,
    k: int,
    all_gather: Callable[[torch.Tensor], torch.Tensor],
    vocab_limit: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global candidate lists from one rank's vocabulary shard.

    Args:
        local_logits: [B, D, V_local] this rank's logits (columns past ``vocab_limit - vocab_start`` are
            padding of the last shard and are ignored).
        vocab_start: global token id of this shard's column 0.
        k: candidates per depth (``min(budget, V)``; capped at the shard width).
        all_gather: concatenates a tensor from every rank along its LAST dimension, in rank order.
        vocab_limit: global vocabulary size (to drop padded columns), or None.

    Returns:
        (logprobs float32 [B, D, world*k'], tokens int64 [B, D, world*k']) for ``build_tree_from_topk``.
    """
    from sglang_ddtree.tree import exact_topk

    logits = local_logits.float()
    width = logits.shape[-1]
    if vocab_limit is not None:
        real = max(0, min(width, vocab_limit - vocab_start))
        col = torch.arange(width, device=logits.device)
        logits = torch.where(col < real, logits, torch.full_like(logits, float("-inf")))
    local_lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # [B, D, 1]
    global_lse = torch.logsumexp(all_gather(local_lse), dim=-1, keepdim=True)
    kk = min(int(k), width)
    values, ids = exact_topk(logits, kk)
    logprobs = values - global_lse
    tokens = ids + int(vocab_start)
    return all_gather(logprobs.contiguous()), all_gather(tokens.contiguous())


def tp_group_reader() -> Callable[[], Any]:
    """The function that returns SGLang's TP group coordinator on this release (see the module docstring)."""
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:  # no ParallelContext: the module-level getter is the only one
        from sglang.srt.distributed.parallel_state import get_tp_group

        return get_tp_group
    return lambda: get_parallel().tp_group


def resolve_tp_group(tp_size: int) -> Any:
    """SGLang's TP group coordinator (its ``world_size`` and ``all_gather(tensor, dim=-1)`` are what the tree build
    uses), read once. None only when no group exists and ``tp_size`` is 1 (the CPU tests' workers); with
    ``tp_size`` > 1 a missing group is an error, never a silent single-rank tree over one vocabulary shard."""
    try:
        return tp_group_reader()()
    except (AssertionError, RuntimeError) as exc:  # 0.5.17: AssertionError; 0.5.21+: RuntimeError (not written)
        if int(tp_size) > 1:
            raise RuntimeError(
                f"DDTREE: --tp-size={tp_size} but SGLang's tensor-parallel group is not available ({exc}); the tree "
                "build needs it to gather the vocabulary shards' top-k"
            ) from exc
        return None
