"""Triton kernels: exact per-row top-K of float32 log-probabilities in ~one streaming pass over the logits.

Order: log-probability ``lp = (x - m) - logsum`` (float32; m = row max, logsum = log(sum(exp(x - m))), both
returned) descending, ties by token id ascending; exactly as ``exact_topk`` on the full row of those values.

1. ``_vocab_scan`` (grid rows x groups; a group is ELEMENTS consecutive logits, split into tiles of TILE): per
   tile its max, per group the online-softmax pair (max, sum(exp(x - max))).
2. ``_vocab_select`` (grid rows): combines the row's log-sum-exp; picks the K groups with the largest max (ties:
   lower group first), then among their tiles the K tiles with the largest max (ties: lower tile first), loads
   only those K * TILE logits and extracts the K best (lp, id) keys. The top K elements always lie in the top K
   groups, and within them in the top K tiles (K maxima ranked above an element would already be K better
   elements). Every element outside the picked tiles has a logit <= M', the best max of an unpicked group or of
   an unpicked tile of a picked group. The selection is certified exact when lp(M') < lp of the K-th pick, or
   when M' <= its logit and the next representable input value below that logit already has a smaller lp
   (exact logit ties across tiles are resolved by the tile order: a lower tile holds lower ids). Otherwise
   (float32 rounding made distinct logits share a log-probability at the boundary, which is rare) the program
   rescans the whole row exactly, so the result is always exact.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ._alloc import carve

_INT64_MIN = -(2**63)
_LOW = 2147483647  # 2**31 - 1


@triton.jit
def _ord32(v):
    bits = v.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _pack(lp, ids):
    # (lp desc, id asc) -> int64 desc; lp + 0.0 merges -0.0 into +0.0
    return (_ord32(lp + 0.0).to(tl.int64) << 32) | (2147483647 - ids).to(tl.int64)


@triton.jit
def _unpack_lp(key):
    ordv = (key >> 32).to(tl.int32)
    bits = ordv ^ ((ordv >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


# Few compiled variants: sizes are bucketed below and plain integer arguments are not specialised.
@triton.jit(do_not_specialize=["V", "T", "P"])
def _vocab_scan(
    x_ptr,
    stride_row,
    V,
    T,
    P,
    tmax_ptr,
    pm_ptr,
    ps_ptr,
    TILE: tl.constexpr,
    TPP: tl.constexpr,
):
    row = tl.program_id(0)
    grp = tl.program_id(1)
    tiles = grp * TPP + tl.arange(0, TPP)
    offs = tiles[:, None] * TILE + tl.arange(0, TILE)[None, :]
    mask = offs < V
    x = tl.load(x_ptr + row.to(tl.int64) * stride_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
    tm = tl.max(x, axis=1)
    tl.store(tmax_ptr + row.to(tl.int64) * T + tiles, tm, mask=tiles < T)
    m = tl.max(tm, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(tl.sum(tl.where(mask, tl.exp(x - m_safe), 0.0), axis=1), axis=0)
    tl.store(pm_ptr + row * P + grp, m)
    tl.store(ps_ptr + row * P + grp, s)


@triton.jit
def _top_keys(keys, slots, K, KP: tl.constexpr):
    """The K largest of ``keys`` (any shape; unique values; key_min = empty) as [KP] (key_min past the end),
    and the largest key left."""
    key_min = -9223372036854775808
    picked = tl.full([KP], key_min, tl.int64)
    for i in range(K):
        top = tl.max(tl.reshape(keys, (slots,)), axis=0)
        picked = tl.where(tl.arange(0, KP) == i, top, picked)
        keys = tl.where(keys == top, key_min, keys)
    return picked, tl.max(tl.reshape(keys, (slots,)), axis=0)


@triton.jit(do_not_specialize=["V", "T", "P", "K", "STEP", "SCR"])
def _vocab_select(
    x_ptr,
    stride_row,
    V,
    T,
    P,
    K,
    STEP,
    tmax_ptr,
    pm_ptr,
    ps_ptr,
    scratch_ptr,
    SCR,
    out_val_ptr,
    out_id_ptr,
    out_m_ptr,
    out_ls_ptr,
    out_fallback_ptr,
    TILE: tl.constexpr,
    TPP: tl.constexpr,
    PP: tl.constexpr,
    KP: tl.constexpr,
    CAP: tl.constexpr,
    RB: tl.constexpr,
):
    row = tl.program_id(0)
    row64 = row.to(tl.int64)
    x_row = x_ptr + row64 * stride_row
    neg_inf = float("-inf")
    key_min = -9223372036854775808

    # row log-sum-exp from the group partials
    p = tl.arange(0, PP)
    pm = tl.load(pm_ptr + row * P + p, mask=p < P, other=neg_inf)
    ps = tl.load(ps_ptr + row * P + p, mask=p < P, other=0.0)
    m = tl.max(pm, axis=0)
    m_safe = tl.where(m == neg_inf, 0.0, m)
    terms = tl.where(pm == neg_inf, 0.0, ps * tl.exp(pm - m_safe))
    ls = tl.log(tl.sum(terms, axis=0))
    tl.store(out_m_ptr + row, m)
    tl.store(out_ls_ptr + row, ls)

    # level 1: the K groups with the largest max (ties: lower group first)
    j = tl.arange(0, KP)
    gkey = tl.where(p < P, (_ord32(pm + 0.0).to(tl.int64) << 32) | (2147483647 - p).to(tl.int64), key_min)
    gsel, gnext = _top_keys(gkey, PP, K, KP)
    groups = 2147483647 - (gsel & 0xFFFFFFFF)
    # level 2: among the tiles of those groups, the K with the largest max (ties: lower tile first)
    tt = groups[:, None] * TPP + tl.arange(0, TPP)[None, :]
    tvalid = (gsel != key_min)[:, None] & (tt < T)
    tm = tl.load(tmax_ptr + row64 * T + tt, mask=tvalid, other=neg_inf)
    tkey = tl.where(tvalid, (_ord32(tm + 0.0).to(tl.int64) << 32) | (2147483647 - tt), key_min)
    sel_keys, tnext = _top_keys(tkey, KP * TPP, K, KP)
    kt = tl.sum((sel_keys != key_min).to(tl.int32), axis=0)
    tile_ids = 2147483647 - (sel_keys & 0xFFFFFFFF)
    # M': the best max left out at either level
    m_next = tl.maximum(
        tl.where(gnext != key_min, _unpack_lp(gnext), neg_inf), tl.where(tnext != key_min, _unpack_lp(tnext), neg_inf)
    )

    offs = tile_ids[:, None] * TILE + tl.arange(0, TILE)[None, :]
    valid = (j < kt)[:, None] & (offs < V) & (offs >= 0)
    x = tl.load(x_row + offs, mask=valid, other=neg_inf).to(tl.float32)
    lp = (x - m) - ls
    keys = tl.where(valid, _pack(lp, offs), key_min)

    # When K tiles were picked, only elements with lp >= lp(tau), tau = the smallest picked tile max, can be in
    # the top K (the K tile maxima already reach it); with fewer tiles than K every element is a candidate.
    # Usually few: compact them and sort; otherwise extract K times from the block.
    tau_key = tl.min(tl.where(j < kt, sel_keys, 9223372036854775807), axis=0)
    lp_tau = tl.where(kt < K, neg_inf, (_unpack_lp(tau_key) - m) - ls)
    cand = valid & (lp >= lp_tau)
    count = tl.sum(tl.sum(cand.to(tl.int32), axis=1), axis=0)
    if count <= CAP:
        flat_cand = tl.reshape(cand, (KP * TILE,))
        flat_keys = tl.reshape(keys, (KP * TILE,))
        pos = tl.cumsum(flat_cand.to(tl.int32), axis=0) - 1
        comp_row = scratch_ptr + row64 * SCR
        tl.store(comp_row + pos, flat_keys, mask=flat_cand)
        tl.debug_barrier()
        c = tl.arange(0, CAP)
        ck = tl.load(comp_row + c, mask=c < count, other=key_min)
        ck = tl.sort(ck, descending=True)
        tl.store(out_val_ptr + row64 * K + c, _unpack_lp(ck), mask=c < K)
        tl.store(out_id_ptr + row64 * K + c, (2147483647 - (ck & 0xFFFFFFFF)).to(tl.int64), mask=c < K)
        best = tl.min(tl.where(c < K, ck, 9223372036854775807), axis=0)
    else:
        best = tl.max(tl.max(keys, axis=1), axis=0)
        for i in range(K):
            best = tl.max(tl.max(keys, axis=1), axis=0)
            tl.store(out_val_ptr + row64 * K + i, _unpack_lp(best))
            tl.store(out_id_ptr + row64 * K + i, (2147483647 - (best & 0xFFFFFFFF)).to(tl.int64))
            keys = tl.where(keys == best, key_min, keys)

    # certificate (see module docstring)
    lp_star = _unpack_lp(best)
    id_star = 2147483647 - (best & 0xFFFFFFFF)
    x_star = tl.load(x_row + id_star).to(tl.float32)
    c1 = ((m_next - m) - ls) < lp_star
    bits = x_star.to(tl.int32, bitcast=True)
    bits = tl.where(x_star == 0.0, -2147483648, bits)
    prev_bits = tl.where(bits < 0, bits + STEP, bits - STEP)
    x_prev = prev_bits.to(tl.float32, bitcast=True)
    c2 = (m_next <= x_star) & ((x_star == neg_inf) | (((x_prev - m) - ls) < lp_star))
    need_rescan = ~(c1 | c2)
    tl.store(out_fallback_ptr + row, need_rescan.to(tl.int32))
    if need_rescan:
        # exact rescan of the whole row: K passes, each taking the best key below the previous one
        prev = best * 0 + 9223372036854775807
        for i in range(K):
            cur = prev * 0 + key_min
            for start in range(0, V, RB):
                o = start + tl.arange(0, RB)
                xv = tl.load(x_row + o, mask=o < V, other=neg_inf).to(tl.float32)
                kv = tl.where(o < V, _pack((xv - m) - ls, o), key_min)
                kv = tl.where(kv < prev, kv, key_min)
                cur = tl.maximum(cur, tl.max(kv, axis=0))
            tl.store(out_val_ptr + row64 * K + i, _unpack_lp(cur))
            tl.store(out_id_ptr + row64 * K + i, (2147483647 - (cur & 0xFFFFFFFF)).to(tl.int64))
            prev = cur


_STEP = {torch.bfloat16: 1 << 16, torch.float32: 1, torch.float16: 1}


def topk_logprobs(logits: torch.Tensor, k: int, elements: int | None = None, tile: int | None = None,
                  normalizer_out: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Exact top-k log-probabilities of every row of ``logits`` [R, V] (see the module docstring).

    ``elements`` (default $SGLANG_DDTREE_TOPK_ELEMENTS or 2048) is the number of logits one scan program reads
    (a group); ``tile`` (default $SGLANG_DDTREE_TOPK_TILE or 32) the tile size inside it (the selection loads K
    tiles). Tuning knobs, not semantic ones. Logits must be finite or -inf. Two launches, no host sync.

    Returns (values float32 [R, k], ids int64 [R, k], row_max float32 [R], row_logsum float32 [R],
    fallback int32 [R] (1 where the exact rescan ran)); ``normalizer_out``: contiguous float32 [R] tensors that
    receive row_max and row_logsum (returned as they are).
    """
    if elements is None:
        elements = int(os.environ.get("SGLANG_DDTREE_TOPK_ELEMENTS", "2048"))
    if tile is None:
        tile = int(os.environ.get("SGLANG_DDTREE_TOPK_TILE", "32"))
    if logits.dim() != 2:
        raise ValueError(f"logits must be [R, V], got {tuple(logits.shape)}")
    if logits.dtype not in _STEP:
        logits = logits.float()
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    rows, vocab = logits.shape
    if not 1 <= k <= vocab:
        raise ValueError(f"k={k} must be in 1..{vocab}")
    kp = triton.next_power_of_2(k)
    tile = triton.next_power_of_2(max(16, min(1024, tile)))
    tpp = max(1, triton.next_power_of_2(elements) // tile)
    tiles = -(-vocab // tile)
    groups = -(-tiles // tpp)
    device = logits.device
    own_normalizer = normalizer_out is None
    floats = [(rows, tiles), (rows, groups), (rows, groups), (rows, k)] + [(rows,), (rows,)] * own_normalizer
    tmax, pm, ps, values, *normalizer = carve(floats, torch.float32, device)
    cap = max(64, 4 * kp)
    scratch, ids = carve([(rows, cap), (rows, k)], torch.int64, device)
    if own_normalizer:
        row_max, row_logsum = normalizer
    else:
        row_max, row_logsum = normalizer_out
        if any(t.shape != (rows,) or t.dtype != torch.float32 or not t.is_contiguous() for t in normalizer_out):
            raise ValueError(f"normalizer_out must be two contiguous float32 [{rows}] tensors")
    fallback = torch.empty((rows,), dtype=torch.int32, device=device)
    _vocab_scan[(rows, groups)](logits, logits.stride(0), vocab, tiles, groups, tmax, pm, ps, TILE=tile, TPP=tpp)
    _vocab_select[(rows,)](
        logits,
        logits.stride(0),
        vocab,
        tiles,
        groups,
        k,
        _STEP[logits.dtype],
        tmax,
        pm,
        ps,
        scratch,
        scratch.stride(0),
        values,
        ids,
        row_max,
        row_logsum,
        fallback,
        TILE=tile,
        TPP=tpp,
        PP=max(16, triton.next_power_of_2(groups)),
        KP=kp,
        CAP=cap,
        RB=1024,
        num_warps=8,
    )
    return values, ids, row_max, row_logsum, fallback
