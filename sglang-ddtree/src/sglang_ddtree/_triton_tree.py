"""Triton kernel: the whole DDTree construction of one request per program (same algorithm as ``tree.py``).

Input: per-depth candidates sorted by (log-probability desc, token asc). One program per batch row runs the
per-depth beam (children enumerated in lexicographic order; the best N by (score desc, index asc) are found
with a sort of the scores for the N-th value and an in-order cumulative count for ties, then compacted in
index order, which keeps the beam lexicographic), the preorder numbering of the trie of all beams, the final
top-N in (score desc, preorder asc) order, and every output field. Scratch tables live in global memory
(gathers and scatters go through it, separated by ``tl.debug_barrier``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["D", "K", "N"])
def _tree_kernel(
    val_ptr,  # f32 [B, D, K]
    tok_ptr,  # i64 [B, D, K]
    D,
    K,
    N,
    s_score,  # f64 [B, D, WP]
    s_int,  # i32 [B, 6, D, WP]: valid, parent, rank, desc, base, pre
    s_u,  # i32 [B, 2, UP]: lexicographic union order, node of union entry
    s_node,  # i32 [B, 4, NB]: chosen union entry, pre, size, parent (node order)
    s_node_score,  # f64 [B, NB]
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
    WP: tl.constexpr,
    KP: tl.constexpr,
    UP: tl.constexpr,
    NB: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    neg_inf = float("-inf")
    slots = tl.arange(0, WP)
    ranks_k = tl.arange(0, KP)
    DW = D * WP
    score_row = s_score + b * DW
    valid_row = s_int + b * 6 * DW
    parent_row = valid_row + DW
    rank_row = valid_row + 2 * DW
    desc_row = valid_row + 3 * DW
    base_row = valid_row + 4 * DW
    pre_row = valid_row + 5 * DW
    vals_row = val_ptr + b * D * K
    toks_row = tok_ptr + b * D * K

    # ---- depth 1: all K candidates, lexicographic = rank order
    lp0 = tl.load(vals_row + slots, mask=slots < K, other=neg_inf).to(tl.float64) + 0.0
    tl.store(score_row + slots, tl.where(slots < K, lp0, neg_inf))
    tl.store(valid_row + slots, (slots < K).to(tl.int32))
    tl.store(parent_row + slots, slots * 0)
    tl.store(rank_row + slots, slots)
    tl.debug_barrier()

    # ---- per-depth beams
    flat = tl.arange(0, WP * KP)
    for d in range(1, D):
        score = tl.load(score_row + (d - 1) * WP + slots)
        valid = tl.load(valid_row + (d - 1) * WP + slots) != 0
        lpd = tl.load(vals_row + d * K + ranks_k, mask=ranks_k < K, other=neg_inf).to(tl.float64)
        ch = tl.reshape(score[:, None] + lpd[None, :], (WP * KP,))
        cv = tl.reshape(valid[:, None] & (ranks_k < K)[None, :], (WP * KP,))
        masked = tl.where(cv, ch, neg_inf)
        srt = tl.sort(masked, descending=True)
        v = tl.max(tl.where(flat == N - 1, srt, neg_inf), axis=0)
        gt = cv & (ch > v)
        eq = cv & (ch == v)
        need = N - tl.sum(gt.to(tl.int32), axis=0)
        eq_rank = tl.cumsum(eq.to(tl.int32), axis=0)
        sel = gt | (eq & (eq_rank <= need))
        pos = tl.cumsum(sel.to(tl.int32), axis=0) - 1
        # clear depth d, then scatter the selection in index (= lexicographic) order
        tl.store(score_row + d * WP + slots, tl.full((WP,), neg_inf, tl.float64))
        tl.store(valid_row + d * WP + slots, slots * 0)
        tl.store(parent_row + d * WP + slots, slots * 0)
        tl.store(rank_row + d * WP + slots, slots * 0)
        tl.debug_barrier()
        tl.store(score_row + d * WP + pos, masked, mask=sel)
        tl.store(valid_row + d * WP + pos, cv.to(tl.int32), mask=sel)
        tl.store(parent_row + d * WP + pos, flat // KP, mask=sel)
        tl.store(rank_row + d * WP + pos, flat % KP, mask=sel)
        tl.debug_barrier()

    # ---- descendants per beam entry (bottom-up)
    desc_cur = slots * 0
    for dd in range(1, D):
        d = D - dd
        tl.store(desc_row + d * WP + slots, desc_cur)
        vc = tl.load(valid_row + d * WP + slots) != 0
        pc = tl.load(parent_row + d * WP + slots)
        hit = (pc[None, :] == slots[:, None]) & vc[None, :]
        desc_cur = tl.sum(tl.where(hit, (desc_cur + 1)[None, :], 0), axis=1)
    tl.store(desc_row + slots, desc_cur)
    tl.debug_barrier()

    # ---- preorder (top-down): pre = sum_{k<d}(slot(anc_k)+1) + slot + sum of earlier beam entries' desc
    above = slots * 0
    for d in range(0, D):
        if d > 0:
            pc = tl.load(parent_row + d * WP + slots)
            above = tl.load(base_row + (d - 1) * WP + pc)
        desc_d = tl.load(desc_row + d * WP + slots)
        excl = tl.cumsum(desc_d, axis=0) - desc_d
        tl.store(pre_row + d * WP + slots, above + slots + excl)
        tl.store(base_row + d * WP + slots, above + slots + 1)
        tl.debug_barrier()

    # ---- union in lexicographic order
    u = tl.arange(0, UP)
    in_u = u < DW
    uvalid = (tl.load(valid_row + u, mask=in_u, other=0) != 0) & in_u
    upre = tl.load(pre_row + u, mask=in_u, other=0)
    lex_row = s_u + b * 2 * UP
    nodeof_row = lex_row + UP
    tl.store(nodeof_row + u, u * 0)
    tl.store(lex_row + upre, u, mask=uvalid)
    tl.debug_barrier()
    nvalid = tl.sum(uvalid.to(tl.int32), axis=0)
    lvalid = u < nvalid
    lu = tl.load(lex_row + u, mask=lvalid, other=0)
    lscore = tl.load(score_row + lu, mask=lvalid, other=neg_inf)
    masked = tl.where(lvalid, lscore, neg_inf)
    srt = tl.sort(masked, descending=True)
    v = tl.max(tl.where(u == N - 1, srt, neg_inf), axis=0)
    gt = lvalid & (lscore > v)
    eq = lvalid & (lscore == v)
    need = N - tl.sum(gt.to(tl.int32), axis=0)
    sel = gt | (eq & (tl.cumsum(eq.to(tl.int32), axis=0) <= need))
    cpos = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    nsel = tl.sum(sel.to(tl.int32), axis=0)
    node_row = s_node + b * 4 * NB
    nscore_row = s_node_score + b * NB
    tl.store(node_row + cpos, lu, mask=sel)
    tl.store(nscore_row + cpos, lscore, mask=sel)
    tl.debug_barrier()

    # ---- final order: (score desc, lexicographic asc) among the chosen
    j = tl.arange(0, NB)
    cvalid = j < nsel
    cu = tl.load(node_row + j, mask=cvalid, other=0)
    cs = tl.load(nscore_row + j, mask=cvalid, other=neg_inf)
    before = cvalid[None, :] & (
        (cs[None, :] > cs[:, None]) | ((cs[None, :] == cs[:, None]) & (j[None, :] < j[:, None]))
    )
    rank_final = tl.sum(before.to(tl.int32), axis=1)  # 0-based pop position
    cd = cu // WP
    crank = tl.load(rank_row + cu, mask=cvalid, other=0)
    cpar_slot = tl.load(parent_row + cu, mask=cvalid, other=0)
    cpre = tl.load(pre_row + cu, mask=cvalid, other=0)
    cdesc = tl.load(desc_row + cu, mask=cvalid, other=0)
    ctok = tl.load(toks_row + cd * K + crank, mask=cvalid, other=0)
    clp = tl.load(vals_row + cd * K + crank, mask=cvalid, other=neg_inf)
    tl.store(nodeof_row + cu, rank_final + 1, mask=cvalid)
    npre_row = node_row + NB
    nsize_row = node_row + 2 * NB
    npar_row = node_row + 3 * NB
    tl.store(npre_row + rank_final, cpre, mask=cvalid)
    tl.store(nsize_row + rank_final, cdesc + 1, mask=cvalid)
    out_n = b * N
    tl.store(o_tokens + out_n + rank_final, ctok, mask=cvalid)
    tl.store(o_depths + out_n + rank_final, (cd + 1).to(tl.int64), mask=cvalid)
    tl.store(o_scores + out_n + rank_final, cs, mask=cvalid)
    tl.store(o_ranks + out_n + rank_final, crank.to(tl.int64), mask=cvalid)
    tl.store(o_lps + out_n + rank_final, clp, mask=cvalid)
    pad = (j >= nsel) & (j < N)
    tl.store(o_tokens + out_n + j, (j * 0).to(tl.int64), mask=pad)
    tl.store(o_depths + out_n + j, (j * 0).to(tl.int64), mask=pad)
    tl.store(o_scores + out_n + j, tl.full((NB,), neg_inf, tl.float64), mask=pad)
    tl.store(o_ranks + out_n + j, (j * 0 - 1).to(tl.int64), mask=pad)
    tl.store(o_lps + out_n + j, tl.full((NB,), neg_inf, tl.float32), mask=pad)
    tl.debug_barrier()
    parent_u = tl.where(cd > 0, (cd - 1) * WP + cpar_slot, 0)
    pnode = tl.load(nodeof_row + parent_u, mask=cvalid & (cd > 0), other=0)
    tl.store(npar_row + rank_final, pnode, mask=cvalid)
    tl.store(npar_row + j, j * 0 - 1, mask=pad)
    tl.store(o_num + b, (nsel + 1).to(tl.int64))
    tl.debug_barrier()

    # ---- node-level outputs: parents, ancestors, first child, next sibling (node 0 = root)
    M1 = N + 1
    i = tl.arange(0, NB)
    real = (i >= 1) & (i < M1)
    im1 = tl.where(real, i - 1, 0)
    par = tl.where(i == 0, -1, tl.load(npar_row + im1, mask=real, other=-1))
    pre = tl.where(i == 0, -1, tl.load(npre_row + im1, mask=real, other=0))
    size = tl.where(i == 0, 1 << 30, tl.load(nsize_row + im1, mask=real, other=0))
    nvalid_node = i < nsel + 1
    tl.store(o_parents + b * M1 + i, par.to(tl.int64), mask=i < M1)
    anc = (pre[None, :] <= pre[:, None]) & (pre[:, None] < (pre + size)[None, :])
    anc = (anc & nvalid_node[None, :] & nvalid_node[:, None]) | (i[:, None] == i[None, :])
    inside = (i[:, None] < M1) & (i[None, :] < M1)
    tl.store(o_anc + b * M1 * M1 + i[:, None] * M1 + i[None, :], anc.to(tl.uint8), mask=inside)
    big = 1 << 30
    is_child = (par[None, :] == i[:, None]) & (i[None, :] < M1)
    first = tl.min(tl.where(is_child, i[None, :], big), axis=1)
    tl.store(o_first + b * M1 + i, tl.where(first == big, -1, first).to(tl.int64), mask=i < M1)
    sib = (par[None, :] == par[:, None]) & (par[:, None] >= 0) & (i[None, :] > i[:, None]) & (i[None, :] < M1)
    nxt = tl.min(tl.where(sib, i[None, :], big), axis=1)
    tl.store(o_next + b * M1 + i, tl.where(nxt == big, -1, nxt).to(tl.int64), mask=i < M1)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def build_sorted(values: torch.Tensor, tokens: torch.Tensor, budget: int):
    """Run the tree kernel; returns the DraftTree fields as a dict (see ``tree.DraftTree``)."""
    bsz, depth, k = values.shape
    values = values.contiguous().float()
    tokens = tokens.contiguous().to(torch.int64)
    device = values.device
    # Bucketed sizes keep the number of compiled variants small: one per power of two of the budget (and of
    # the depth beyond 16); masks handle the rest.
    wp = _next_pow2(budget)
    kp = wp  # k <= budget
    up = max(16, _next_pow2(depth)) * wp
    nb = 2 * wp
    n1 = budget + 1
    s_score = torch.empty((bsz, depth, wp), dtype=torch.float64, device=device)
    s_int = torch.empty((bsz, 6, depth, wp), dtype=torch.int32, device=device)
    s_u = torch.empty((bsz, 2, up), dtype=torch.int32, device=device)
    s_node = torch.empty((bsz, 4, nb), dtype=torch.int32, device=device)
    s_node_score = torch.empty((bsz, nb), dtype=torch.float64, device=device)
    out = {
        "tokens": torch.empty((bsz, budget), dtype=torch.int64, device=device),
        "depths": torch.empty((bsz, budget), dtype=torch.int64, device=device),
        "parents": torch.empty((bsz, n1), dtype=torch.int64, device=device),
        "ancestors": torch.empty((bsz, n1, n1), dtype=torch.uint8, device=device),
        "first_child": torch.empty((bsz, n1), dtype=torch.int64, device=device),
        "next_sibling": torch.empty((bsz, n1), dtype=torch.int64, device=device),
        "num_nodes": torch.empty((bsz,), dtype=torch.int64, device=device),
        "scores": torch.empty((bsz, budget), dtype=torch.float64, device=device),
        "ranks": torch.empty((bsz, budget), dtype=torch.int64, device=device),
        "logprobs": torch.empty((bsz, budget), dtype=torch.float32, device=device),
    }
    _tree_kernel[(bsz,)](
        values,
        tokens,
        depth,
        k,
        budget,
        s_score,
        s_int,
        s_u,
        s_node,
        s_node_score,
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
        WP=wp,
        KP=kp,
        UP=up,
        NB=nb,
        num_warps=4 if wp * kp <= 1024 else 8,
    )
    out["ancestors"] = out["ancestors"].view(torch.bool)
    return out
