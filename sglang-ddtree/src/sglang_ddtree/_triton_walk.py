"""Triton kernel: the greedy tree walk, one program per request (replaces ~20 small torch kernels)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._alloc import carve


@triton.jit
def walk_request(par_ptr, tok_ptr, tgt_ptr, b, M, D, NB: tl.constexpr, DB: tl.constexpr):
    """Request ``b``'s greedy walk, inside a kernel (also ``_triton_glue.walk_commit``'s), from i64 parents [B, M],
    draft tokens [B, M - 1] and the target's token at each node [B, M] -> (the node vector ``i = arange(NB)``, the
    target's tokens over it, path [DB]: root first, then the accepted nodes, -1 padded; accepted drafts; the bonus:
    the target's token at the last accepted node)."""
    i = tl.arange(0, NB)
    inside = i < M
    par = tl.load(par_ptr + b * M + i, mask=inside, other=-2)
    tok = tl.load(tok_ptr + b * (M - 1) + i - 1, mask=inside & (i >= 1), other=-1)
    tgt = tl.load(tgt_ptr + b * M + i, mask=inside, other=-1)
    big = 1 << 30
    j = tl.arange(0, DB)
    path = tl.where(j == 0, 0, -1).to(tl.int64)
    cur = tl.min(tl.where(i == 0, i, big), axis=0)  # 0, as a tensor
    length = cur
    alive = cur == 0
    for _ in range(D):
        want = tl.sum(tl.where(i == cur, tgt, 0), axis=0)
        hit = (par == cur) & (tok == want) & inside & (i >= 1)
        nxt = tl.min(tl.where(hit, i, big), axis=0)
        alive = alive & (nxt < big)
        length = length + alive.to(tl.int32)
        path = tl.where((j == length) & alive, nxt.to(tl.int64), path)
        cur = tl.where(alive, nxt, cur)
    return i, tgt, path, length, tl.sum(tl.where(i == cur, tgt, 0), axis=0).to(tl.int64)


@triton.jit(do_not_specialize=["N1", "D"])
def _walk_kernel(
    par_ptr,  # i64 [B, N1]
    tok_ptr,  # i64 [B, N1 - 1]
    tgt_ptr,  # i64 [B, N1]
    N1,
    D,
    o_index,  # i64 [B, D + 1]
    o_len,  # i64 [B]
    o_bonus,  # i64 [B]
    NB: tl.constexpr,
    DB: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    _, _, path, length, bonus = walk_request(par_ptr, tok_ptr, tgt_ptr, b, N1, D, NB, DB)
    j = tl.arange(0, DB)
    tl.store(o_index + b * (D + 1) + j, path, mask=j < D + 1)
    tl.store(o_len + b, length.to(tl.int64))
    tl.store(o_bonus + b, bonus)


def greedy_walk(parents: torch.Tensor, tokens: torch.Tensor, target_tokens: torch.Tensor, depth: int):
    """(accept_index [B, depth+1], accept_len [B], bonus [B]) as ``verify.greedy_walk`` defines them."""
    bsz, nodes = parents.shape
    device = parents.device
    accept_index, accept_len, bonus = carve([(bsz, depth + 1), (bsz,), (bsz,)], torch.int64, device)
    _walk_kernel[(bsz,)](
        parents.contiguous(),
        tokens.contiguous(),
        target_tokens.contiguous(),
        nodes,
        depth,
        accept_index,
        accept_len,
        bonus,
        NB=max(16, triton.next_power_of_2(nodes)),
        DB=max(16, triton.next_power_of_2(depth + 1)),
        num_warps=1,
    )
    return accept_index, accept_len, bonus
