"""The target verify's attention for a tree: one Triton kernel that replaces SGLang's ``extend_attention_fwd`` for
DDTREE's TARGET_VERIFY on the Triton backend.

Why: SGLang's extend kernel runs one program per (request, QUERY head) with a 128-row query tile, so a verify of
M = N+1 tokens fills M of 128 rows and reads every prefix K/V row once per query head (4x for a GQA group of 4),
and it has one program per (request, head) however long the prefix is. Here one program serves a whole GQA group
of one KV head: its rows are the M tokens x G query heads (68 of 128 at M=17, G=4), so the prefix K/V is read
once per KV head, and at small batch the prefix is split over ``S`` programs (flash-decoding, at least
``min_chunk`` keys each: a short prefix is left to the first of them, which then writes the output itself) whose
partial results a second kernel merges.

Layouts (T = total verify tokens = sum of the requests' M, Hq = G * Hkv):

* ``q`` [T, Hq, D], ``k`` / ``v`` [T, Hkv, D|Dv]: the pass's own query/key/value (the tree block attends to
  these, not to the cache, as SGLang's kernel does).
* ``k_buffer`` / ``v_buffer`` [slots, Hkv, D|Dv]: the layer's KV pool; the prefix of request b is
  ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (page size 1).
* ``qo_indptr`` [B+1]: request b's tokens are ``q[qo_indptr[b]:qo_indptr[b+1]]``.
* ``custom_mask`` flat, FULL_MASK layout (``verify_input``): request b's block starts at ``mask_indptr[b]``, row i
  of it is ``prefix_b + M_b`` cells, and only the last ``M_b`` (the tree cells: query node i may see node j) are
  read. The prefix is always visible.

Output ``o`` [T, Hq, Dv], in ``q``'s dtype. Scores in fp32 with exp2; probabilities cast to the value dtype for
the P x V product, as SGLang's kernel does. Reference: ``tree_verify_attention_torch`` (CPU tests run both in
Triton's interpreter, tests/triton_interpreted_check.py).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

__all__ = ["plan_splits", "tree_verify_attention", "tree_verify_attention_torch"]

LOG2E = 1.4426950408889634


@triton.jit
def _attend(q, kt, vv, allowed, m_i, l_i, acc, scale_log2):
    """One online-softmax step: rows ``q`` [R, D] against keys ``kt`` [D, N] where ``allowed`` [R or 1, N], values
    ``vv`` [N, DV] into the running (max ``m_i``, sum ``l_i``, ``acc``), base-2 exponentials. Returns them."""
    qk = tl.where(allowed, tl.dot(q, kt) * scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(qk - m_safe[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p.to(vv.dtype), vv)


@triton.jit
def _tree_attn_kernel(
    Q, K_new, V_new, K_buf, V_buf, Out, Part_acc, Part_ml,
    qo_indptr, kv_indptr, kv_indices, mask_ptr, mask_indptr,
    scale_log2,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_bkt, stride_bkh, stride_bvt, stride_bvh,
    Hkv,
    G: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, S: tl.constexpr,
    MIN_CHUNK: tl.constexpr,
):
    b = tl.program_id(0)
    pid1 = tl.program_id(1)  # kv head x row block
    h = pid1 % Hkv
    rb = pid1 // Hkv
    s = tl.program_id(2)

    q_start = tl.load(qo_indptr + b)
    q_len = tl.load(qo_indptr + b + 1) - q_start
    kv_start = tl.load(kv_indptr + b)
    prefix = tl.load(kv_indptr + b + 1) - kv_start

    r = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    qi = r // G
    head = h * G + r % G
    row_ok = qi < q_len
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    d_ok = d < D
    dv_ok = dv < DV
    tok = (q_start + qi).to(tl.int64)
    q = tl.load(Q + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_DV], tl.float32)

    # the prefix: this program's share of it (S programs split it evenly, none less than MIN_CHUNK keys: a short
    # prefix is left to the first programs, the others have nothing to add)
    chunk = tl.maximum(tl.cdiv(prefix, S), MIN_CHUNK)
    lo = s * chunk
    hi = tl.minimum(prefix, lo + chunk)
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + offs_n
        n_ok = n < hi
        slot = tl.load(kv_indices + kv_start + n, mask=n_ok, other=0).to(tl.int64)
        kt = tl.load(K_buf + slot[None, :] * stride_bkt + h * stride_bkh + d[:, None],
                     mask=n_ok[None, :] & d_ok[:, None], other=0.0)
        vv = tl.load(V_buf + slot[:, None] * stride_bvt + h * stride_bvh + dv[None, :],
                     mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
        m_i, l_i, acc = _attend(q, kt, vv, n_ok[None, :], m_i, l_i, acc, scale_log2)

    # the tree block (the first split): node qi sees node t where the mask says so
    if s == 0:
        t = tl.arange(0, BLOCK_T)
        t_ok = t < q_len
        ttok = (q_start + t).to(tl.int64)
        kt = tl.load(K_new + ttok[None, :] * stride_kt + h * stride_kh + d[:, None],
                     mask=t_ok[None, :] & d_ok[:, None], other=0.0)
        mask_start = tl.load(mask_indptr + b).to(tl.int64)
        cell = mask_start + qi.to(tl.int64)[:, None] * (prefix + q_len) + prefix + t[None, :]
        seen = tl.load(mask_ptr + cell, mask=row_ok[:, None] & t_ok[None, :], other=0) != 0
        vv = tl.load(V_new + ttok[:, None] * stride_vt + h * stride_vh + dv[None, :],
                     mask=t_ok[:, None] & dv_ok[None, :], other=0.0)
        m_i, l_i, acc = _attend(q, kt, vv, seen, m_i, l_i, acc, scale_log2)

    if (S == 1) | (prefix <= chunk):  # the first program had the whole request: its result is final
        if s == 0:
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            tl.store(Out + tok[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :],
                     out.to(Out.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])
    elif lo < prefix:
        # partials [B, Hkv * RB, S, BLOCK_R, BLOCK_DV] and [B, Hkv * RB, S, 2, BLOCK_R] of the splits that had work
        base = ((b * tl.num_programs(1) + pid1) * S + s).to(tl.int64)
        rr = tl.arange(0, BLOCK_R)
        tl.store(Part_acc + (base * BLOCK_R + rr[:, None]) * BLOCK_DV + dv[None, :], acc)
        tl.store(Part_ml + base * 2 * BLOCK_R + rr, m_i)
        tl.store(Part_ml + base * 2 * BLOCK_R + BLOCK_R + rr, l_i)


@triton.jit
def _tree_attn_merge_kernel(
    Out, Part_acc, Part_ml, qo_indptr, kv_indptr,
    stride_ot, stride_oh,
    Hkv,
    G: tl.constexpr, DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_R: tl.constexpr, S: tl.constexpr,
    MIN_CHUNK: tl.constexpr, DV_PART: tl.constexpr,
):
    b = tl.program_id(0)
    pid1 = tl.program_id(1)
    part = tl.program_id(2)  # which DV_PART columns of the value dim this program merges
    h = pid1 % Hkv
    rb = pid1 // Hkv
    q_start = tl.load(qo_indptr + b)
    q_len = tl.load(qo_indptr + b + 1) - q_start
    prefix = tl.load(kv_indptr + b + 1) - tl.load(kv_indptr + b)
    chunk = tl.maximum(tl.cdiv(prefix, S), MIN_CHUNK)
    if prefix <= chunk:
        return  # the first split wrote the output
    used = tl.minimum(tl.cdiv(prefix, chunk), S)  # the splits that wrote partials
    r = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    rr = tl.arange(0, BLOCK_R)
    qi = r // G
    head = h * G + r % G
    row_ok = qi < q_len
    dv = part * DV_PART + tl.arange(0, DV_PART)
    dv_ok = dv < DV
    base0 = ((b * tl.num_programs(1) + pid1) * S).to(tl.int64)
    m_all = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for s in range(S):
        if s < used:
            m_all = tl.maximum(m_all, tl.load(Part_ml + (base0 + s) * 2 * BLOCK_R + rr))
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    l_all = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, DV_PART], tl.float32)
    for s in range(S):
        if s < used:
            w = tl.exp2(tl.load(Part_ml + (base0 + s) * 2 * BLOCK_R + rr) - m_safe)
            l_all += w * tl.load(Part_ml + (base0 + s) * 2 * BLOCK_R + BLOCK_R + rr)
            acc += w[:, None] * tl.load(Part_acc + ((base0 + s) * BLOCK_R + rr[:, None]) * BLOCK_DV + dv[None, :])
    out = acc / tl.where(l_all > 0, l_all, 1.0)[:, None]
    tok = (q_start + qi).to(tl.int64)
    tl.store(Out + tok[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :],
             out.to(Out.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])


_SM_COUNT: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def plan_splits(batch: int, programs_per_request: int, sm_count: int, max_splits: int = 16) -> int:
    """How many programs share one request's prefix: 1 once the batch alone gives every SM a program, else
    enough to give every SM about two (at most ``max_splits``). Host arithmetic on shapes only: a CUDA graph
    captured for a batch size keeps its split."""
    programs = max(1, batch * programs_per_request)
    if programs >= sm_count:
        return 1
    return max(1, min(max_splits, math.ceil(2 * sm_count / programs)))


def _blocks(group: int, max_q: int, d: int, dv: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_N, num_warps): rows of (token, head-of-group) per program, prefix keys per step."""
    rows = triton.next_power_of_2(max(16, group * max_q))
    wide = max(d, dv) > 128
    block_r = min(rows, 64 if wide else 128)
    block_n = 32 if wide else 64
    return block_r, block_n, 8 if block_r * max(d, dv) >= 128 * 128 else 4


def tree_verify_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                          k_buffer: torch.Tensor, v_buffer: torch.Tensor, qo_indptr: torch.Tensor,
                          kv_indptr: torch.Tensor, kv_indices: torch.Tensor, custom_mask: torch.Tensor,
                          mask_indptr: torch.Tensor, max_q: int, sm_scale: float,
                          splits: int | None = None, min_chunk: int = 256) -> torch.Tensor:
    """Tree-masked verify attention into ``o`` (see the module docstring for the layouts); returns ``o``.

    Args:
        max_q: the largest per-request token count (the verify's M = N+1); host-known.
        splits: programs per request's prefix (default: ``plan_splits`` for this batch on this GPU).
        min_chunk: fewest prefix keys a split program takes (a shorter prefix is served by fewer programs).
    """
    _, hq, d = q.shape
    hkv, dv = k.shape[1], v.shape[-1]
    group = hq // hkv
    batch = qo_indptr.shape[0] - 1
    block_r, block_n, warps = _blocks(group, max_q, d, dv)
    row_blocks = triton.cdiv(group * max_q, block_r)
    if splits is None:
        splits = plan_splits(batch, hkv * row_blocks, _sm_count(q.device))
    block_dv = triton.next_power_of_2(max(16, dv))
    if splits > 1:
        part_acc = torch.empty(batch * hkv * row_blocks * splits * block_r * block_dv, device=q.device,
                               dtype=torch.float32)
        part_ml = torch.empty(batch * hkv * row_blocks * splits * 2 * block_r, device=q.device, dtype=torch.float32)
    else:
        part_acc = part_ml = o  # unused
    _tree_attn_kernel[(batch, hkv * row_blocks, splits)](
        q, k, v, k_buffer, v_buffer, o, part_acc, part_ml,
        qo_indptr, kv_indptr, kv_indices, custom_mask, mask_indptr,
        float(sm_scale) * LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), o.stride(0), o.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        hkv,
        G=group, D=d, DV=dv, BLOCK_D=triton.next_power_of_2(max(16, d)), BLOCK_DV=block_dv,
        BLOCK_R=block_r, BLOCK_N=block_n, BLOCK_T=triton.next_power_of_2(max(16, max_q)), S=splits,
        MIN_CHUNK=max(int(min_chunk), 1), num_warps=warps, num_stages=1,
    )
    if splits > 1:
        dv_part = min(block_dv, 64)  # more, smaller merge programs: each reads S x BLOCK_R x 64 partial values
        _tree_attn_merge_kernel[(batch, hkv * row_blocks, block_dv // dv_part)](
            o, part_acc, part_ml, qo_indptr, kv_indptr, o.stride(0), o.stride(1), hkv,
            G=group, DV=dv, BLOCK_DV=block_dv, BLOCK_R=block_r, S=splits, MIN_CHUNK=max(int(min_chunk), 1),
            DV_PART=dv_part, num_warps=4,
        )
    return o


def tree_verify_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor,
                                v_buffer: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                                kv_indices: torch.Tensor, custom_mask: torch.Tensor, mask_indptr: torch.Tensor,
                                sm_scale: float) -> torch.Tensor:
    """Reference (test-only: a Python loop over requests): softmax(q K^T * sm_scale + mask) V in fp32, keys =
    the request's prefix from the pool, then its own tokens under the tree cells of the mask."""
    tokens, hq, _ = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    out = torch.zeros(tokens, hq, v.shape[-1], dtype=torch.float32)
    for b in range(qo_indptr.shape[0] - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        p0, p1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
        m, prefix = q1 - q0, p1 - p0
        if m == 0:
            continue
        slots = kv_indices[p0:p1].long()
        keys = torch.cat([k_buffer[slots], k[q0:q1]]).float()  # [prefix + m, Hkv, D]
        vals = torch.cat([v_buffer[slots], v[q0:q1]]).float()
        start = int(mask_indptr[b])
        cells = custom_mask[start:start + m * (prefix + m)].view(m, prefix + m).bool().clone()
        cells[:, :prefix] = True
        keys = keys.repeat_interleave(group, dim=1)  # [L, Hq, D]
        vals = vals.repeat_interleave(group, dim=1)
        scores = torch.einsum("mhd,lhd->hml", q[q0:q1].float(), keys) * sm_scale
        scores = scores.masked_fill(~cells.unsqueeze(0), float("-inf"))
        out[q0:q1] = torch.einsum("hml,lhd->mhd", torch.softmax(scores, dim=-1), vals)
    return out
