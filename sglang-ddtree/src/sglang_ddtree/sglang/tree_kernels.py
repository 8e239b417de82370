"""Greedy tree verification in SGLang's EAGLE layout: SGLang's ``verify_tree_greedy`` kernel on GPU, and a
pure-torch equivalent (``verify_tree_greedy_torch``) on CPU (SGLang's own CPU path needs ``sgl_kernel``'s CPU
build). Both fill the same outputs:

* ``predicts`` int [B*M]: at each accepted node's row, the target's token there (the next emitted token);
* ``accept_index`` int [B, D+1]: GLOBAL rows (b*M + node) of the accepted path, root first, -1 padded;
* ``accept_token_num`` int [B]: accepted draft nodes (root excluded).
"""

from __future__ import annotations

import torch

__all__ = ["verify_tree_greedy", "verify_tree_greedy_torch"]


def verify_tree_greedy_torch(
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    max_depth: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk: from the root, move to the child whose token equals the target's token at the current node.

    Args: candidates / target_predict int [B, M] (node tokens, target argmax per node); retrieve_* [B, M].
    Returns (predicts [B*M], accept_index [B, max_depth+1], accept_token_num [B]). One vectorised step per
    depth and per sibling (static loop bounds), no host synchronisation.
    """
    bsz, m = candidates.shape
    device = candidates.device
    rows = torch.arange(bsz, device=device)
    predicts = torch.zeros(bsz * m, dtype=torch.int64, device=device)
    accept_index = torch.full((bsz, max_depth + 1), -1, dtype=torch.int64, device=device)
    accept_num = torch.zeros(bsz, dtype=torch.int64, device=device)
    cur = torch.zeros(bsz, dtype=torch.int64, device=device)
    alive = torch.ones(bsz, dtype=torch.bool, device=device)
    accept_index[:, 0] = retrieve_index[:, 0]
    for depth in range(1, max_depth + 1):
        want = target_predict[rows, cur]
        child = retrieve_next_token[rows, cur]
        found = torch.full_like(cur, -1)
        for _ in range(m):  # scan the sibling list (at most M-1 children)
            ok = (child >= 0) & (found < 0)
            hit = ok & (candidates[rows, child.clamp(min=0)] == want)
            found = torch.where(hit, child, found)
            child = torch.where(ok & ~hit, retrieve_next_sibling[rows, child.clamp(min=0)], torch.full_like(child, -1))
        step = alive & (found >= 0)
        gidx = retrieve_index[rows, cur]
        predicts[gidx.clamp(min=0)] = torch.where(step, want, predicts[gidx.clamp(min=0)])
        cur = torch.where(step, found, cur)
        accept_index[:, depth] = torch.where(step, retrieve_index[rows, cur], accept_index[:, depth])
        accept_num = accept_num + step.to(torch.int64)
        alive = step
    # The bonus: the target's token at the last accepted node.
    last = retrieve_index[rows, cur]
    predicts[last] = target_predict[rows, cur]
    return predicts, accept_index, accept_num


def verify_tree_greedy(
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    max_depth: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang's tree kernel on CUDA (same outputs as ``verify_tree_greedy_torch``), the torch walk elsewhere."""
    if candidates.device.type != "cuda":
        return verify_tree_greedy_torch(
            candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, target_predict, max_depth
        )
    try:
        from sglang.srt.speculative.eagle_utils import verify_tree_greedy_func
    except ImportError:  # 0.5.23 moved it
        from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_func
    bsz, m = candidates.shape
    predicts = torch.zeros(bsz * m, dtype=torch.int32, device=candidates.device)
    accept_index = torch.full((bsz, max_depth + 1), -1, dtype=torch.int32, device=candidates.device)
    accept_num = torch.zeros(bsz, dtype=torch.int32, device=candidates.device)
    verify_tree_greedy_func(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_num,
        candidates=candidates.to(torch.int64),
        retrieve_index=retrieve_index.to(torch.int64),
        retrieve_next_token=retrieve_next_token.to(torch.int64),
        retrieve_next_sibling=retrieve_next_sibling.to(torch.int64),
        target_predict=target_predict.to(torch.int64),
    )
    return predicts.to(torch.int64), accept_index.to(torch.int64), accept_num.to(torch.int64)
