"""Triton kernel: the whole DDTree construction of one request per program, in registers.

Input: per-depth candidates sorted by (log-probability desc, token asc), so a candidate's rank is its index.
The program runs the reference best-first search itself: N pops from a frontier of at most N + 1 candidate
prefixes held in registers (the first candidate is depth 1, rank 0; popping a node adds its first child and its
next sibling). The pop order is (summed log-probability desc, rank tuple lexicographic asc): scores are float64
sums, and the lexicographic order of the frontier is kept as an integer position per entry (a popped node's first
child goes right after it and its next sibling right after that, since its subtree holds nothing else yet).
Every output field is then computed from the node table in registers (ancestors by climbing parent chains).
No scratch memory, no barriers; N sequential steps of a few reductions over 2N lanes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._alloc import carve


@triton.jit(do_not_specialize=["D", "K", "N"])
def _tree_kernel(
    val_ptr,  # f32 [B, D, K]
    tok_ptr,  # i64 [B, D, K]
    D,
    K,
    N,
    o_tokens,  # i64 [B, N]
    o_depths,  # i64 [B, N]
    o_parents,  # i64 [B, N+1]
    o_anc,  # u8 [B, N+1, N+1]
    o_first,  # i64 [B, N+1]
    o_next,  # i64 [B, N+1]
    o_num,  # i64 [B]
    o_scores,  # f64 [B, N]
    o_ranks,  # i64 [B, N]
    o_lps,  # f32 [B, N]
    FP: tl.constexpr,  # frontier slots, >= 2N + 1
    NB: tl.constexpr,  # node slots, >= N + 1
):
    b = tl.program_id(0).to(tl.int64)
    neg_inf = float("-inf")
    big = 1 << 30
    vals_row = val_ptr + b * D * K
    toks_row = tok_ptr + b * D * K
    f = tl.arange(0, FP)
    j = tl.arange(0, NB)

    # Frontier (registers): candidate prefixes whose parent is already a node. Slot 0 holds depth 1, rank 0;
    # pop s writes its first child into slot 2s + 1 and its next sibling into slot 2s + 2.
    # f_pos orders the frontier lexicographically by rank tuple (the tie-break): a popped node's first child
    # comes right after it and its next sibling right after that (its subtree holds no other entry yet).
    lp00 = tl.load(vals_row).to(tl.float64) + 0.0
    f_active = f == 0
    f_score = tl.where(f == 0, lp00, neg_inf)
    f_pscore = tl.zeros([FP], tl.float64)
    f_parent = f * 0
    f_depth = f * 0 + 1
    f_rank = f * 0
    f_pos = f * 0
    n_parent = j * 0 - 1
    n_depth = j * 0
    n_rank = j * 0 - 1
    n_score = tl.full([NB], neg_inf, tl.float64)
    count = tl.sum(f * 0, axis=0)
    for s in range(N):
        has = tl.max(f_active.to(tl.int32), axis=0) > 0
        m = tl.max(tl.where(f_active, f_score, neg_inf), axis=0)
        cand = f_active & (f_score == m)
        pmin = tl.min(tl.where(cand, f_pos, big), axis=0)
        sel = cand & (f_pos == pmin)
        v_score = tl.max(tl.where(sel, f_score, neg_inf), axis=0)
        v_pscore = tl.max(tl.where(sel, f_pscore, neg_inf), axis=0)
        v_parent = tl.sum(tl.where(sel, f_parent, 0), axis=0)
        v_depth = tl.sum(tl.where(sel, f_depth, 0), axis=0)
        v_rank = tl.sum(tl.where(sel, f_rank, 0), axis=0)
        node = s + 1
        put = (j == node) & has
        n_parent = tl.where(put, v_parent, n_parent)
        n_depth = tl.where(put, v_depth, n_depth)
        n_rank = tl.where(put, v_rank, n_rank)
        n_score = tl.where(put, v_score, n_score)
        count += has.to(tl.int32)

        add_c = has & (v_depth < D)
        add_s = has & (v_rank + 1 < K)
        lp_c = tl.load(vals_row + v_depth * K, mask=add_c, other=0.0).to(tl.float64) + 0.0
        lp_s = tl.load(vals_row + (v_depth - 1) * K + v_rank + 1, mask=add_s, other=0.0).to(tl.float64) + 0.0
        f_active = f_active & ~sel
        f_pos = tl.where(f_pos > pmin, f_pos + 2, f_pos)
        is_c = (f == 2 * s + 1) & add_c
        is_s = (f == 2 * s + 2) & add_s
        f_active = f_active | is_c | is_s
        f_score = tl.where(is_c, v_score + lp_c, tl.where(is_s, v_pscore + lp_s, f_score))
        f_pscore = tl.where(is_c, v_score, tl.where(is_s, v_pscore, f_pscore))
        f_parent = tl.where(is_c, node, tl.where(is_s, v_parent, f_parent))
        f_depth = tl.where(is_c, v_depth + 1, tl.where(is_s, v_depth, f_depth))
        f_rank = tl.where(is_c, 0, tl.where(is_s, v_rank + 1, f_rank))
        f_pos = tl.where(is_c, pmin + 1, tl.where(is_s, pmin + 2, f_pos))

    # ---- per-node outputs (node i >= 1 is pop i; invalid past num_nodes)
    M1 = N + 1
    real = (j >= 1) & (j <= count)
    slot = tl.where(real, (n_depth - 1) * K + n_rank, 0)
    tok = tl.load(toks_row + slot, mask=real, other=0)
    lpv = tl.load(vals_row + slot, mask=real, other=neg_inf)
    out_n = b * N + j - 1
    in_n = (j >= 1) & (j < M1)
    tl.store(o_tokens + out_n, tl.where(real, tok, 0).to(tl.int64), mask=in_n)
    tl.store(o_depths + out_n, tl.where(real, n_depth, 0).to(tl.int64), mask=in_n)
    tl.store(o_scores + out_n, tl.where(real, n_score, neg_inf), mask=in_n)
    tl.store(o_ranks + out_n, tl.where(real, n_rank, -1).to(tl.int64), mask=in_n)
    tl.store(o_lps + out_n, tl.where(real, lpv, neg_inf), mask=in_n)
    tl.store(o_num + b, (count + 1).to(tl.int64))
    par = tl.where(real, n_parent, -1)
    tl.store(o_parents + b * M1 + j, par.to(tl.int64), mask=j < M1)

    # ancestors-or-self: climb every node's parent chain (at most D steps; the root's parent is -1)
    valid = j <= count
    ptr = j
    anc = j[:, None] == j[None, :]
    for _ in range(D):
        up = tl.sum(tl.where(j[None, :] == ptr[:, None], par[None, :], 0), axis=1)
        ptr = tl.where((ptr < NB) & (up >= 0), up, big)
        anc = anc | ((j[None, :] == ptr[:, None]) & valid[:, None])
    inside = (j[:, None] < M1) & (j[None, :] < M1)
    tl.store(o_anc + b * M1 * M1 + j[:, None] * M1 + j[None, :], anc.to(tl.uint8), mask=inside)

    is_child = (par[None, :] == j[:, None]) & (j[None, :] < M1)
    first = tl.min(tl.where(is_child, j[None, :], big), axis=1)
    tl.store(o_first + b * M1 + j, tl.where(first == big, -1, first).to(tl.int64), mask=j < M1)
    sib = (par[None, :] == par[:, None]) & (par[:, None] >= 0) & (j[None, :] > j[:, None]) & (j[None, :] < M1)
    nxt = tl.min(tl.where(sib, j[None, :], big), axis=1)
    tl.store(o_next + b * M1 + j, tl.where(nxt == big, -1, nxt).to(tl.int64), mask=j < M1)


_FIELDS = ("tokens", "depths", "parents", "ancestors", "first_child", "next_sibling", "num_nodes", "scores", "ranks",
           "logprobs")


def build_sorted(values: torch.Tensor, tokens: torch.Tensor, budget: int, out=None):
    """Run the tree kernel; returns the DraftTree fields as a dict (see ``tree.DraftTree``).

    ``out``: a DraftTree of exactly these B rows (``tree.tree_rows`` of ``tree.tree_buffers``) whose tensors the
    kernel writes instead of new ones."""
    bsz, depth, k = values.shape
    values = values.contiguous().float()
    tokens = tokens.contiguous().to(torch.int64)
    device = values.device
    n1 = budget + 1
    if out is not None:
        given = {name: getattr(out, name) for name in _FIELDS}
        given["ancestors"] = given["ancestors"].view(torch.uint8)
        if any(not t.is_contiguous() or t.shape[0] != bsz for t in given.values()):
            raise ValueError("out must hold exactly this batch's rows, contiguous (tree.tree_rows of tree_buffers)")
        out = given
    else:
        names = ("tokens", "depths", "parents", "first_child", "next_sibling", "num_nodes", "ranks")
        shapes = [(bsz, budget), (bsz, budget), (bsz, n1), (bsz, n1), (bsz, n1), (bsz,), (bsz, budget)]
        out = dict(zip(names, carve(shapes, torch.int64, device), strict=True))
        out["ancestors"] = torch.empty((bsz, n1, n1), dtype=torch.uint8, device=device)
        out["scores"] = torch.empty((bsz, budget), dtype=torch.float64, device=device)
        out["logprobs"] = torch.empty((bsz, budget), dtype=torch.float32, device=device)
    # Bucketed sizes keep the number of compiled variants small (one per power of two of the budget).
    _tree_kernel[(bsz,)](
        values,
        tokens,
        depth,
        k,
        budget,
        out["tokens"],
        out["depths"],
        out["parents"],
        out["ancestors"],
        out["first_child"],
        out["next_sibling"],
        out["num_nodes"],
        out["scores"],
        out["ranks"],
        out["logprobs"],
        FP=triton.next_power_of_2(2 * budget + 1),
        NB=triton.next_power_of_2(budget + 1),
        num_warps=4,
    )
    out["ancestors"] = out["ancestors"].view(torch.bool)
    return out
