"""Tensor parallel > 1: the drafter's logits are split by vocabulary across ranks (SGLang's vocab-parallel
lm_head). The tree needs, per depth, the global top ``K = min(budget, V)`` tokens with their GLOBAL
log-probabilities. Each rank takes its shard's top-K (exact, ties by token id) and its shard's
log-sum-exp; the ranks all-gather both; the global log-normaliser is the log-sum-exp of the shard ones; the
candidates are the union of the shards' top-K with ``logit - global_lse``. ``build_tree_from_topk`` then picks
the true top-K of the union (the global top-K is always inside it).

``all_gather`` is injected (``torch.distributed`` / SGLang's TP group on GPU, a list concatenation in tests).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["sharded_candidates"]


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
