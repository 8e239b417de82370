"""Per-tree-node logit adjustments: SGLang's sampling penalties, ``logit_bias`` and ``min_new_tokens``, applied to
each tree node's verify logits as SGLang would apply them when decoding that node's own path without speculation.

Pure torch (no SGLang import); not wired into the worker (see ``sglang_ddtree.sglang.worker``).

A request's verify row for tree node ``i`` (root ``i = 0``, the last committed token) gives the target's logits
for the token that follows the path root -> ... -> i. Without speculation, when that token is sampled the request
has emitted its committed output tokens (root included) and then the path's draft tokens at depths 1..depth(i).
So, for node ``i`` with ``count_i[v]`` = (committed count of ``v``) + (occurrences of ``v`` among the tokens of
``i``'s ancestors-or-self at depths >= 1) and ``len_i`` = (committed output length) + depth(i):

1. additive penalties, as SGLang's penalizers (``sglang.srt.sampling.penaltylib``):
   frequency ``logits -= frequency_penalty * count_i``; presence ``logits -= presence_penalty * (count_i > 0)``;
   min_new_tokens ``logits[stop tokens] += -inf`` while ``len_i < min_new_tokens``;
2. the scaling penalty (repetition): for ``count_i[v] > 0``, ``logits = logits * r`` where ``logits < 0``, else
   ``logits / r`` (``apply_scaling_penalties``);
3. ``logit_bias`` added.

The order (additive, then scaling, then logit_bias) is SGLang's ``SamplingBatchInfo.apply_logits_bias`` with
``update_penalties`` (``acc_additive_penalties``, then ``acc_scaling_penalties``, then the post-grammar
``logit_bias``). Note: SGLang's own DFLASH verify (``dflash_utils.apply_dflash_verify_logits_adjustments``)
applies the committed prefix's penalties to every block position alike (the block's earlier tokens are not
counted, and the repetition penalty is applied to a zero tensor, i.e. dropped); this function is exact per path.
Custom logit processors (Python callables over request state) and grammar masks are not covered.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["TreeLogitAdjustments", "apply_tree_logit_adjustments", "path_token_counts"]


@dataclass
class TreeLogitAdjustments:
    """Per-request sampling state (B requests, vocabulary V). Every field is optional; None means "off".

    * ``frequency_penalty``, ``presence_penalty``, ``repetition_penalty``: float [B] (0, 0, 1 = off per request).
    * the committed output's state, in ONE of two forms:
      - ``committed_counts``: float/int [B, V], how often each token occurs in the request's committed OUTPUT
        tokens (the tree's root, the previous round's bonus token, included; the prompt excluded, as SGLang's
        penalizers count output tokens only); or
      - SGLang's penalizer state for the same tokens (what ``from_sglang`` reads): ``committed_frequency``
        [B, V] = frequency_penalty * count, ``committed_presence`` [B, V] = presence_penalty where present else 0,
        ``committed_repetition`` [B, V] = repetition_penalty where present else 1 (each only with its penalty).
    * ``logit_bias``: float [B, V], added as is.
    * ``min_new_tokens``: int [B]; ``num_output_tokens``: int [B], committed output length (root included);
      ``stop_token_mask``: bool [B, V], the tokens SGLang masks (stop_token_ids, eos ids, the tokenizer's eos and
      additional stop ids). All three are needed for min_new_tokens.
    """

    committed_counts: torch.Tensor | None = None
    frequency_penalty: torch.Tensor | None = None
    presence_penalty: torch.Tensor | None = None
    repetition_penalty: torch.Tensor | None = None
    logit_bias: torch.Tensor | None = None
    min_new_tokens: torch.Tensor | None = None
    num_output_tokens: torch.Tensor | None = None
    stop_token_mask: torch.Tensor | None = None
    committed_frequency: torch.Tensor | None = None
    committed_presence: torch.Tensor | None = None
    committed_repetition: torch.Tensor | None = None

    @classmethod
    def from_sglang(cls, sampling_info) -> TreeLogitAdjustments:
        """The adjustments a SGLang ``SamplingBatchInfo`` carries (duck-typed, SGLang is not imported): the
        prepared penalizers of ``sampling_info.penalizer_orchestrator`` (frequency, presence, repetition,
        min_new_tokens; their state is the committed output as SGLang has cumulated it) and
        ``sampling_info.logit_bias``. Custom logit processors and grammar masks are not included."""
        adjust = cls(logit_bias=getattr(sampling_info, "logit_bias", None))
        orchestrator = getattr(sampling_info, "penalizer_orchestrator", None)
        if orchestrator is None or not getattr(orchestrator, "is_required", False):
            return adjust
        for penalizer in getattr(orchestrator, "penalizers", {}).values():
            if not getattr(penalizer, "_is_prepared", False):
                continue
            if hasattr(penalizer, "cumulated_frequency_penalties"):
                adjust.frequency_penalty = penalizer.frequency_penalties.reshape(-1)
                adjust.committed_frequency = penalizer.cumulated_frequency_penalties
            elif hasattr(penalizer, "cumulated_presence_penalties"):
                adjust.presence_penalty = penalizer.presence_penalties.reshape(-1)
                adjust.committed_presence = penalizer.cumulated_presence_penalties
            elif hasattr(penalizer, "cumulated_repetition_penalties"):
                adjust.repetition_penalty = penalizer.repetition_penalties.reshape(-1)
                adjust.committed_repetition = penalizer.cumulated_repetition_penalties
            elif hasattr(penalizer, "stop_token_penalties"):
                adjust.min_new_tokens = penalizer.min_new_tokens.reshape(-1)
                adjust.num_output_tokens = penalizer.len_output_tokens.reshape(-1)
                adjust.stop_token_mask = torch.isneginf(penalizer.stop_token_penalties)
            else:
                raise ValueError(f"unknown SGLang penalizer {type(penalizer).__name__}: not applied per tree node")
        return adjust


def _ancestors_or_self(parents: torch.Tensor) -> torch.Tensor:
    """bool [B, M, M]: ``[b, i, j]`` = node j is an ancestor of node i or j == i (``parents[:, 0] = -1``;
    padding nodes with parent -1 are their own only ancestor)."""
    bsz, m = parents.shape
    anc = torch.eye(m, dtype=torch.bool, device=parents.device).expand(bsz, m, m).clone()
    cur = parents.to(torch.int64)
    for _ in range(m - 1):  # a path has at most M - 1 edges; static shapes, no host sync
        valid = cur >= 0
        index = cur.clamp(min=0).unsqueeze(-1)
        anc.scatter_(2, index, anc.gather(2, index) | valid.unsqueeze(-1))
        cur = torch.where(valid, parents.to(torch.int64).gather(1, cur.clamp(min=0)), cur)
    return anc


def path_token_counts(tokens: torch.Tensor, parents: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """float32 [B, M, V]: for each node i, how often each token occurs among the tokens of i's ancestors-or-self
    EXCLUDING the root (node 0). ``tokens``, ``parents``: int [B, M] with node 0 the root, ``parents[:, 0] = -1``."""
    bsz, m = tokens.shape
    anc = _ancestors_or_self(parents)
    anc[:, :, 0] = False  # the root is committed already: counted in committed_counts
    counts = torch.zeros(bsz, m, vocab_size, dtype=torch.float32, device=tokens.device)
    index = tokens.long().clamp(0, vocab_size - 1).unsqueeze(1).expand(bsz, m, m)
    counts.scatter_add_(2, index, anc.to(torch.float32))
    return counts


def apply_tree_logit_adjustments(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depths: torch.Tensor,
    adjust: TreeLogitAdjustments,
) -> torch.Tensor:
    """The adjusted verify logits of every tree node (a new tensor, ``logits``' dtype).

    ``logits``: [B, M, V] (M = N + 1 nodes, node 0 the root; row i predicts the token after node i's path);
    ``tokens``: int [B, M] (``tokens[:, 0]`` the root token); ``parents``: int [B, M] (``parents[:, 0] = -1``);
    ``depths``: int [B, M] (root 0). ``DraftTree`` fields map as: tokens = cat(root, tree.tokens),
    depths = cat(0, tree.depths), parents = tree.parents. See the module docstring for the semantics.
    """
    if logits.ndim != 3:
        raise ValueError(f"logits must be [B, M, V], got shape {tuple(logits.shape)}")
    bsz, m, vocab = logits.shape
    if tokens.shape != (bsz, m) or parents.shape != (bsz, m) or depths.shape != (bsz, m):
        raise ValueError(
            f"tokens, parents and depths must be [B, M] = {[bsz, m]}, got {tuple(tokens.shape)}, "
            f"{tuple(parents.shape)}, {tuple(depths.shape)}"
        )
    out = logits.to(torch.float32).clone()
    path = None
    if any(p is not None for p in (adjust.frequency_penalty, adjust.presence_penalty, adjust.repetition_penalty)):
        path = path_token_counts(tokens, parents, vocab)
        in_path = path > 0

    def committed(state, from_counts, name):
        if state is not None:
            return state.to(torch.float32).view(bsz, 1, vocab)
        if adjust.committed_counts is None:
            raise ValueError(f"{name} needs committed_counts or its committed SGLang state")
        return from_counts(adjust.committed_counts.to(torch.float32).view(bsz, 1, vocab))

    # 1. additive penalties (SGLang: frequency, presence, min_new_tokens into one additive tensor); a path token
    #    adds to the frequency state and sets the presence state, as the penalizers' cumulate_output_tokens does
    additive = torch.zeros_like(out)
    if adjust.frequency_penalty is not None:
        f = adjust.frequency_penalty.to(torch.float32).view(bsz, 1, 1)
        additive -= committed(adjust.committed_frequency, lambda c: f * c, "frequency_penalty") + f * path
    if adjust.presence_penalty is not None:
        p = adjust.presence_penalty.to(torch.float32).view(bsz, 1, 1)
        state = committed(adjust.committed_presence, lambda c: torch.where(c > 0, p, 0.0), "presence_penalty")
        additive -= torch.where(in_path, p, state)
    if adjust.min_new_tokens is not None:
        if adjust.num_output_tokens is None or adjust.stop_token_mask is None:
            raise ValueError("min_new_tokens needs num_output_tokens and stop_token_mask")
        length = adjust.num_output_tokens.view(bsz, 1).to(torch.int64) + depths.to(torch.int64)
        active = (length < adjust.min_new_tokens.view(bsz, 1).to(torch.int64)).unsqueeze(-1)  # [B, M, 1]
        masked = active & adjust.stop_token_mask.view(bsz, 1, vocab)
        additive = additive + torch.where(masked, float("-inf"), 0.0)
    out += additive

    # 2. the scaling penalty (repetition)
    if adjust.repetition_penalty is not None:
        r = adjust.repetition_penalty.to(torch.float32).view(bsz, 1, 1)
        state = committed(adjust.committed_repetition, lambda c: torch.where(c > 0, r, 1.0), "repetition_penalty")
        scale = torch.where(in_path, r, state)
        out = torch.where(out < 0, out * scale, out / scale)

    # 3. logit_bias
    if adjust.logit_bias is not None:
        out += adjust.logit_bias.to(torch.float32).view(bsz, 1, vocab)
    return out.to(logits.dtype)
