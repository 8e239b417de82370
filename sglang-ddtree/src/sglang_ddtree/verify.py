"""Verification walks over a verified DDTree: greedy and exactly lossless sampling, on device, no host sync.

After the target's one forward pass over the N+1 tree tokens (node 0 = root), the target's prediction at
node i is the distribution of the token that follows node i's path. The walk starts at the root and moves to
the child whose token equals the target's token at the current node, while such a child exists; the first
target token that is not a child is the *bonus* token, which roots the next round.

Outputs of both walks:
    accept_index: int64 [B, D+1]; accept_index[b, 0] = 0 (root), then the accepted draft nodes by depth;
        -1 padding after the last accepted node.
    accept_len: int64 [B]; number of accepted DRAFT nodes (0..D). A round emits accept_len + 1 tokens (the
        accepted drafts and the bonus); "acceptance length" statistics in this package report accept_len + 1.
    bonus: int64 [B]; the target's token at the last accepted node.
"""

from __future__ import annotations

import torch

from .tree import DraftTree, _is_capturing, _resolve, _triton_failed

__all__ = ["greedy_walk", "race_tokens", "sample_tokens", "sampling_walk"]


def greedy_walk(
    tree: DraftTree, target_tokens: torch.Tensor, *, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Follow the target's tokens down the tree.

    Args:
        tree: the verified trees.
        target_tokens: int [B, N+1]; target_tokens[b, i] is the target's token at node i (e.g. argmax of the
            target logits at node i for greedy decoding). Columns of padding nodes are ignored.
        backend: "torch", "triton" (one small kernel) or None/"auto", as for ``build_tree``.

    Returns:
        (accept_index [B, D+1], accept_len [B], bonus [B]), see the module docstring.
    """
    bsz, nodes = tree.parents.shape
    if target_tokens.shape != (bsz, nodes):
        raise ValueError(f"target_tokens must have shape [B, N+1] = {(bsz, nodes)}, got {tuple(target_tokens.shape)}")
    target_tokens = target_tokens.to(torch.int64)
    chosen, auto = _resolve(backend, target_tokens.device)
    if chosen == "triton":
        try:
            from ._triton_walk import greedy_walk as triton_walk

            return triton_walk(tree.parents, tree.tokens, target_tokens, tree.max_depth)
        except Exception as exc:
            if not auto or _is_capturing():
                raise
            _triton_failed(exc)
    return _greedy_walk_torch(tree, target_tokens)


def _greedy_walk_torch(tree: DraftTree, target_tokens: torch.Tensor):
    bsz, nodes = tree.parents.shape
    device = target_tokens.device
    depth_limit = tree.max_depth
    parents = tree.parents
    # match[i]: node i's token equals the target's token at its parent (root: True).
    parent_target = torch.gather(target_tokens, 1, parents[:, 1:].clamp(min=0))
    node_match = (tree.tokens == parent_target) & (parents[:, 1:] >= 0)
    ones = torch.ones((bsz, 1), dtype=torch.bool, device=device)
    match = torch.cat([ones, node_match], dim=1)
    # A node is on the accepted path iff it and all its ancestors match; such nodes form one chain
    # (sibling tokens are distinct).
    on_path = ~(tree.ancestors & ~match[:, None, :]).any(dim=2)
    depth_all = tree.positions
    accept_len = torch.where(on_path, depth_all, 0).amax(dim=1)
    node_ids = torch.arange(nodes, device=device)[None, :].expand(bsz, nodes)
    slot = torch.where(on_path, depth_all, depth_limit + 1)
    accept_index = torch.full((bsz, depth_limit + 2), -1, dtype=torch.int64, device=device)
    accept_index.scatter_(1, slot, torch.where(on_path, node_ids, -1))
    accept_index = accept_index[:, : depth_limit + 1]
    last = torch.gather(accept_index, 1, accept_len[:, None])
    bonus = torch.gather(target_tokens, 1, last)[:, 0]
    return accept_index, accept_len, bonus


def sample_tokens(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: one token per row of ``probs`` from one uniform in [0, 1).

    Args:
        probs: [..., V] non-negative weights (need not be normalised; each row must have a positive sum).
        uniforms: [...] uniforms in [0, 1).

    Returns:
        int64 [...]: the smallest token t with cumsum(probs)[t] > u * sum(probs) (a token of weight 0 is never
        returned).
    """
    cdf = torch.cumsum(probs.to(torch.float64), dim=-1)
    total = cdf[..., -1:]
    threshold = uniforms.to(torch.float64)[..., None] * total
    above = cdf > threshold
    first = torch.argmax(above.to(torch.int8), dim=-1)
    # u * total can round up to total: fall back to the last token of positive weight.
    vocab = probs.shape[-1]
    positive = probs > 0
    last_positive = vocab - 1 - torch.argmax(positive.flip(-1).to(torch.int8), dim=-1)
    return torch.where(above.any(dim=-1), first, last_positive)


def race_tokens(weights: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``weights``, drawn with probability proportional to its weight (an exponential race:
    the token with the largest ``weight / E``, E ~ Exp(1) independently per token, wins; exact, as
    :func:`sample_tokens`, without a cumulative sum: float32 noise instead of a float64 CDF of every row).

    Args:
        weights: [..., V] non-negative weights (need not be normalised; each row must have a positive sum).
        generator: the random source (tests); the default generator of the device otherwise.

    Returns:
        int64 [...]: the drawn tokens (a token of weight 0 is never drawn).
    """
    noise = torch.empty(weights.shape, dtype=torch.float32, device=weights.device).exponential_(generator=generator)
    w = weights.float()
    return torch.argmax(torch.where(w > 0, w / noise, -1.0), dim=-1)


def sampling_walk(
    tree: DraftTree, target_probs: torch.Tensor, uniforms: torch.Tensor, *, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exactly lossless tree verification for temperature > 0.

    At every node the target's token is drawn from the target distribution at that node (inverse CDF with
    that node's uniform), and the walk follows it while it is a child. This is the standard exact scheme for
    deterministic candidate sets, written in closed form: trying the children x_1..x_m in order, accepting
    x_k with probability p_res(x_k) / sum(p_res) and otherwise zeroing p_res(x_k) and renormalising, then
    drawing the bonus from the residual, yields token x with probability exactly p(x) - which is the law of
    a direct draw from p. The tokens emitted along the path are therefore distributed exactly as ancestral
    sampling from the target (nodes off the path are ignored; each node has its own uniform).

    Args:
        tree: the verified trees.
        target_probs: [B, N+1, V] target probabilities at each node, after temperature / top-k / top-p
            processing (rows need not be normalised; padding-node rows are ignored but must have a positive
            sum).
        uniforms: [B, N+1] independent uniforms in [0, 1).
        backend: of the walk, as for :func:`greedy_walk`.

    Returns:
        (accept_index [B, D+1], accept_len [B], bonus [B]).
    """
    bsz, nodes = tree.parents.shape
    if target_probs.dim() != 3 or target_probs.shape[:2] != (bsz, nodes):
        raise ValueError(
            f"target_probs must have shape [B, N+1, V] with B, N+1 = {bsz}, {nodes}; got {tuple(target_probs.shape)}"
        )
    if uniforms.shape != (bsz, nodes):
        raise ValueError(f"uniforms must have shape [B, N+1] = {(bsz, nodes)}, got {tuple(uniforms.shape)}")
    sampled = sample_tokens(target_probs, uniforms)
    return greedy_walk(tree, sampled, backend=backend)
