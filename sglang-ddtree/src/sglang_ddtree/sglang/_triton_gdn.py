"""The gated delta rule (GatedDeltaNet) over a draft TREE, as the target verify of a hybrid model runs it: one
Triton launch, no host synchronisation, same outputs and per-node states as SGLang's tree-mode
``fused_sigmoid_gating_delta_rule_update`` (``TritonGDNKernel.target_verify`` with ``retrieve_parent_token``).

Per request ``n`` (tokens ``bos .. eos-1`` of the flattened batch, ``cu_seqlens``), value head ``hv`` (key head
``h = hv // (HV // H)``) and node ``t`` in order, with the state ``S`` (``[V, K]``, fp32):

* the state before node ``t``: for ``t = 0`` the request's slot of ``initial_states`` (zeros for a slot < 0); for
  ``t > 0`` the state after its parent ``p = parents[n, t]`` (a node index of the same request, ``p < t``);
* ``g = -exp(A_log[hv]) * softplus(a[t, hv] + dt_bias[hv])`` (softplus with ``softplus_beta`` and the linear
  branch above ``softplus_threshold``), ``beta = sigmoid(b[t, hv])``;
* ``q`` and ``k`` L2-normalised (``x / sqrt(sum(x^2) + 1e-6)``, or ``x * (1 / sqrt(...))`` with
  ``reciprocal_norm``: SGLang 0.5.22 changed the formula, ``versions.gdn_reciprocal_norm``), ``q`` times ``scale``;
* ``S = S * exp(g)``; ``u = (v - S k) * beta``; ``S = S + u k^T``; ``out[t, hv] = S q``;
* the state after node ``t`` is stored at ``intermediate_states[intermediate_state_indices[n], t, hv]`` (nothing
  for an index < 0), in that buffer's dtype.

SGLang's kernel reloads the parent's state from that buffer at EVERY node after the first. This one reloads only
when the parent is not the node just computed (``p != t - 1``: a branch back up the tree); along a chain the state
stays in registers. The reload it skips would have read back the value just stored, so where the buffer holds
fp32 nothing changes; for a narrower buffer (bf16, fp16) the kept state is rounded through the buffer's dtype
(``.to(dtype).to(fp32)``, what the store and the reload do), so the results match there as well. A request whose
buffer index is < 0 is a plain chain in both kernels (no reload, no store). The arithmetic is written in the same
order as SGLang's, so under Triton's CPU interpreter the outputs and every stored state are bit for bit SGLang's
(tests/sglang/test_gdn_tree_kernel.py, every buffer dtype, releases 0.5.17 to 0.5.23). Compiled for sm_90 (PTX of
SGLang 0.5.17's kernel and this one, tiles of 4 and 32 value columns), the floating-point instructions are the
same in the same order, apart from ``exp(A_log)`` and ``1 / softplus_beta`` computed once before the node loop
(the same values); that file's CUDA test checks bit equality on a GPU.

The record mode (``records`` given; ``SGLANG_DDTREE_OWN_GDN=replay``, ``gdn_verify.py``) stores no state at all:
a state is 3 MiB a request and layer at Qwen3.6-27B's widths, and storing one per node is most of the verify's
time at batch 32. It stores each node's inputs to the update instead (normalised k, v, g, beta), recomputes a
branch's parent state from the initial state along its ancestors, and :func:`gdn_tree_replay` (one launch over
every layer, before SGLang's commit) rebuilds the states the commit reads from those records. Both run the same
update code (``_delta_step``) on the same fp32 values, so every output and every rebuilt state is the store
mode's, bit for bit.

Shapes (T: tokens of the whole batch, N requests, H key heads, HV value heads, a multiple of H):
``q``, ``k`` ``[1, T, H, K]``; ``v`` ``[1, T, HV, V]`` (token, head and element strides are read, so strided views
of a packed projection work); ``a``, ``b`` ``[T, HV]`` (or ``[1, T, HV]``); ``A_log``, ``dt_bias`` ``[HV]``;
``initial_states`` ``[slots, HV, V, K]`` (any strides); ``initial_state_indices`` ``[>= N]``; ``cu_seqlens``
``[N + 1]``; ``intermediate_states`` ``[slots', steps, HV, V, K]`` (any strides); ``intermediate_state_indices``
``[>= N]``; ``parents`` ``[>= N, >= tokens of the longest request]``. Returns ``[1, T, HV, V]`` (``v``'s shape)
in ``q``'s dtype. ``initial_states`` is only read.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

__all__ = ["default_block_v", "gdn_tree_replay", "gdn_tree_verify", "record_layout_problem", "record_width"]


@functools.lru_cache(maxsize=16)
def _capability(device: torch.device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" and torch.version.cuda else None


def default_block_v(k_dim: int, v_dim: int, requests: int, device: torch.device) -> int:
    """Value columns per program. SGLang's launch rule for a recurrent verify since 0.5.22 (measured there on
    H100/H200): 4 on Hopper for K = V = 128 and at most 64 requests (8x the programs, a fraction of the registers);
    otherwise ``min(next_pow2(V), 32)``, its tile before. The tile does not change the arithmetic: a state tile is
    laid out 4 consecutive K elements x 32 lanes per value column whatever its width, so every column is reduced
    over K in the same order (the Triton layouts of both tiles, checked for sm_90)."""
    if k_dim == 128 and v_dim == 128 and 0 < requests <= 64 and (_capability(device) or (0,))[0] == 9:
        return 4
    return min(triton.next_power_of_2(v_dim), 32)


@triton.jit
def _node_inputs(row, kh, hv, ks, vs, k_in, v_in, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr,
                 sq_t, sq_h, sq_k, sk_t, sk_h, sk_k, sv_t, sv_h, sv_v, sa_t, sa_h, sb_t, sb_h,
                 neg_rate, bias, scale, softplus_beta, softplus_threshold, RECIPROCAL_NORM: tl.constexpr):
    """Node ``row``'s (q * scale, normalised k, v, g, beta), fp32, in SGLang's order of operations."""
    q = tl.load(q_ptr + row * sq_t + kh * sq_h + ks * sq_k, mask=k_in, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + row * sk_t + kh * sk_h + ks * sk_k, mask=k_in, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + row * sv_t + hv * sv_h + vs * sv_v, mask=v_in, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row * sb_t + hv * sb_h).to(tl.float32)
    x = tl.load(a_ptr + row * sa_t + hv * sa_h).to(tl.float32) + bias
    bx = softplus_beta * x
    soft = tl.where(bx <= softplus_threshold, (1.0 / softplus_beta) * tl.log(1.0 + tl.exp(bx)), x)
    g = neg_rate * soft
    beta = 1.0 / (1.0 + tl.exp(-b))
    if RECIPROCAL_NORM:
        q = q * (1.0 / tl.sqrt(tl.sum(q * q) + 1e-6))
        k = k * (1.0 / tl.sqrt(tl.sum(k * k) + 1e-6))
    else:
        q = q / tl.sqrt(tl.sum(q * q) + 1e-6)
        k = k / tl.sqrt(tl.sum(k * k) + 1e-6)
    q = q * scale
    return q, k, v, g, beta


@triton.jit
def _initial_state(h0_tile, tile_in, slot0, BK: tl.constexpr, BV: tl.constexpr):
    """The request's initial state tile, fp32 (zeros for a slot < 0). Zeros + the slot: SGLang's sequence (0 + -0 is
    +0), so even the sign of a zero state element is SGLang's."""
    return tl.zeros([BK, BV], dtype=tl.float32) + tl.load(h0_tile, mask=tile_in & (slot0 >= 0), other=0.0).to(
        tl.float32)


@triton.jit
def _delta_step(state, k, v, g, beta):
    """One gated delta-rule update of a [BK, BV] state tile (the verify and the replay run this same code)."""
    state = state * tl.exp(g)
    v = v - tl.sum(state * k[:, None], 0)
    v = v * beta
    return state + k[:, None] * v[None, :]


@triton.jit
def _tree_gated_delta_kernel(
    q_ptr,  # [1, T, H, K]
    k_ptr,  # [1, T, H, K]
    v_ptr,  # [1, T, HV, V]
    a_ptr,  # [T, HV]
    b_ptr,  # [T, HV]
    a_log_ptr,  # [HV]
    dt_bias_ptr,  # [HV]
    h0_ptr,  # [slots, HV, V, K]
    h0_idx_ptr,  # [N]
    buf_ptr,  # [slots', steps, HV, V, K]
    buf_idx_ptr,  # [N]
    parent_ptr,  # [N, steps]
    cu_ptr,  # [N + 1]
    o_ptr,  # [1, T, HV, V] contiguous
    rec_ptr,  # RECORD: [slots', steps, HV, K + V + 2] fp32 contiguous (else unused)
    meta_ptr,  # RECORD: [slots', 2] int32 (else unused)
    row_of_ptr,  # RECORD: [>= N] int32, each request's intermediate row (else unused)
    scale,
    softplus_beta,
    softplus_threshold,
    sq_t, sq_h, sq_k,
    sk_t, sk_h, sk_k,
    sv_t, sv_h, sv_v,
    sa_t, sa_h,
    sb_t, sb_h,
    s0_n, s0_h, s0_v, s0_k,
    sc_n, sc_t, sc_h, sc_v, sc_k,
    sp_n, sp_t,
    rec_steps,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    RECIPROCAL_NORM: tl.constexpr,
    ROUND_KEPT_STATE: tl.constexpr,
    RECORD: tl.constexpr,
):
    # Program (value tile, value head, request). The state tile is [BK, BV]: element (kk, vv) is S[v=vv, k=kk].
    col = tl.program_id(0)
    hv = tl.program_id(1)
    req = tl.program_id(2)
    kh = hv // (HV // H)
    first = tl.load(cu_ptr + req).to(tl.int64)
    count = (tl.load(cu_ptr + req + 1).to(tl.int64) - first).to(tl.int32)

    ks = tl.arange(0, BK)
    vs = col * BV + tl.arange(0, BV)
    k_in = ks < K
    v_in = vs < V
    tile_in = k_in[:, None] & v_in[None, :]

    slot0 = tl.load(h0_idx_ptr + req).to(tl.int64)
    h0_tile = h0_ptr + slot0 * s0_n + hv * s0_h + vs[None, :] * s0_v + ks[:, None] * s0_k
    state = _initial_state(h0_tile, tile_in, slot0, BK, BV)

    slot = tl.load(buf_idx_ptr + req).to(tl.int64)
    buf_tile = buf_ptr + slot * sc_n + hv * sc_h + vs[None, :] * sc_v + ks[:, None] * sc_k

    neg_rate = -tl.exp(tl.load(a_log_ptr + hv).to(tl.float32))
    bias = tl.load(dt_bias_ptr + hv).to(tl.float32)
    parent_row = parent_ptr + req * sp_n
    if RECORD:
        if col == 0 and hv == 0:
            tl.store(row_of_ptr + req, slot.to(tl.int32))
            if slot >= 0:  # this row's records are this step's; its state came from slot0
                tl.store(meta_ptr + slot * 2, 1)
                tl.store(meta_ptr + slot * 2 + 1, slot0.to(tl.int32))

    for t in range(0, count):
        if t > 0 and slot >= 0:
            parent = tl.load(parent_row + t * sp_t).to(tl.int32)
            if parent != t - 1:  # a branch back up the tree
                if RECORD:  # nothing was stored: recompute the parent's state from h0 along its ancestors
                    ancestors = tl.full([], 1, tl.int64)  # bit j: node j is on the root..parent path
                    up = parent
                    while up > 0:
                        ancestors = ancestors | (tl.full([], 1, tl.int64) << up.to(tl.int64))
                        up = tl.load(parent_row + up * sp_t).to(tl.int32)
                    state = _initial_state(h0_tile, tile_in, slot0, BK, BV)
                    for j in range(0, parent + 1):
                        if ((ancestors >> j) & 1) != 0:
                            _, kj, vj, gj, betaj = _node_inputs(
                                first + j, kh, hv, ks, vs, k_in, v_in, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr,
                                sq_t, sq_h, sq_k, sk_t, sk_h, sk_k, sv_t, sv_h, sv_v, sa_t, sa_h, sb_t, sb_h,
                                neg_rate, bias, scale, softplus_beta, softplus_threshold, RECIPROCAL_NORM)
                            state = _delta_step(state, kj, vj, gj, betaj)
                else:  # the parent's state is in the buffer
                    tl.debug_barrier()  # stored by this program, maybe by another of its threads (num_warps > 1)
                    state = tl.load(buf_tile + parent.to(tl.int64) * sc_t, mask=tile_in, other=0.0).to(tl.float32)
            elif ROUND_KEPT_STATE:  # what storing and reloading the kept state through the buffer's dtype does
                state = state.to(buf_ptr.dtype.element_ty).to(tl.float32)
        row = first + t
        q, k, v, g, beta = _node_inputs(
            row, kh, hv, ks, vs, k_in, v_in, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr,
            sq_t, sq_h, sq_k, sk_t, sk_h, sk_k, sv_t, sv_h, sv_v, sa_t, sa_h, sb_t, sb_h,
            neg_rate, bias, scale, softplus_beta, softplus_threshold, RECIPROCAL_NORM)
        if RECORD:
            if slot >= 0:  # the node's inputs, for the commit's replay of the accepted path
                rec = rec_ptr + ((slot * rec_steps + t) * HV + hv) * (K + V + 2)
                tl.store(rec + K + vs, v, mask=v_in)
                if col == 0:
                    tl.store(rec + ks, k, mask=k_in)
                    tl.store(rec + K + V, g)
                    tl.store(rec + K + V + 1, beta)
        state = _delta_step(state, k, v, g, beta)
        out = tl.sum(state * q[:, None], 0)
        tl.store(o_ptr + (row * HV + hv) * V + vs, out.to(o_ptr.dtype.element_ty), mask=v_in)
        if not RECORD:
            if slot >= 0:
                tl.store(buf_tile + t * sc_t, state.to(buf_ptr.dtype.element_ty), mask=tile_in)


@triton.jit
def _replay_kernel(
    rec_ptr,  # [L, rows, steps, HV, K + V + 2] fp32 contiguous
    meta_ptr,  # [L, rows, 2] int32 contiguous
    row_of_ptr,  # [N] int32: each request's intermediate row in the verify (-1: none)
    h0_ptr,  # [L, slots, HV, V, K]
    buf_ptr,  # [L, rows, steps, HV, V, K]
    path_ptr,  # [N, depth]
    len_ptr,  # [N]
    last_ptr,  # [N]
    track_ptr,  # [N]
    requests,
    rows,
    steps,
    s0_l, s0_n, s0_h, s0_v, s0_k,
    sc_l, sc_n, sc_t, sc_h, sc_v, sc_k,
    sp_n, sp_d,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    # Program (value tile, value head, layer x request); the request's records and states are at its verify's row.
    col = tl.program_id(0)
    hv = tl.program_id(1)
    req = tl.program_id(2) % requests
    layer = (tl.program_id(2) // requests).to(tl.int64)
    row = tl.load(row_of_ptr + req).to(tl.int64)
    meta = meta_ptr + (layer * rows + row) * 2
    last = tl.load(last_ptr + req).to(tl.int32)
    recorded = tl.load(meta, mask=row >= 0, other=0) != 0  # row < 0: a padded request, nothing recorded
    if (row >= 0) & (last >= 0) & recorded:
        ks = tl.arange(0, BK)
        vs = col * BV + tl.arange(0, BV)
        k_in = ks < K
        v_in = vs < V
        tile_in = k_in[:, None] & v_in[None, :]
        slot0 = tl.load(meta + 1).to(tl.int64)
        h0_tile = h0_ptr + layer * s0_l + slot0 * s0_n + hv * s0_h + vs[None, :] * s0_v + ks[:, None] * s0_k
        state = _initial_state(h0_tile, tile_in, slot0, BK, BV)
        track = tl.load(track_ptr + req).to(tl.int32)
        buf_tile = buf_ptr + layer * sc_l + row * sc_n + hv * sc_h + vs[None, :] * sc_v + ks[:, None] * sc_k
        depth = tl.load(len_ptr + req).to(tl.int32)
        for p in range(0, depth + 1):
            node = tl.load(path_ptr + req * sp_n + p * sp_d).to(tl.int32)
            rec = rec_ptr + (((layer * rows + row) * steps + node) * HV + hv) * (K + V + 2)
            k = tl.load(rec + ks, mask=k_in, other=0.0)
            v = tl.load(rec + K + vs, mask=v_in, other=0.0)
            state = _delta_step(state, k, v, tl.load(rec + K + V), tl.load(rec + K + V + 1))
            if node == last or node == track:
                tl.store(buf_tile + node.to(tl.int64) * sc_t, state.to(buf_ptr.dtype.element_ty), mask=tile_in)


def gdn_tree_verify(
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    initial_states: torch.Tensor,
    initial_state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    intermediate_states: torch.Tensor,
    intermediate_state_indices: torch.Tensor,
    parents: torch.Tensor,
    scale: float | None = None,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    reciprocal_norm: bool = False,
    block_v: int | None = None,
    num_warps: int = 1,
    records: torch.Tensor | None = None,
    record_meta: torch.Tensor | None = None,
    record_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """The tree's outputs ``[1, T, HV, V]`` (``v``'s shape, ``q``'s dtype); every node's state is stored into
    ``intermediate_states`` (module docstring: semantics and shapes). No host synchronisation: one launch of
    (value tiles, HV, N) programs.

    With ``records`` (``[rows, steps, HV, K + V + 2]`` fp32, contiguous), ``record_meta`` (``[rows, 2]`` int32) and
    ``record_rows`` (``[>= N]`` int32): the record mode. No state is stored; each node's inputs to the state update
    (normalised k, v, g, beta) go to ``records[row, node, hv]`` (``row = intermediate_state_indices[n]``, which
    ``record_rows[n]`` receives), and ``record_meta[row]`` becomes ``(1, the request's initial-state slot)``, for
    :func:`gdn_tree_replay` to rebuild the states the commit needs. A branch back up the
    tree recomputes the parent's state from the initial state along its ancestors (the same code as the first
    computation, so the same bits). Outputs are those of the store mode. Needs an fp32 ``intermediate_states``."""
    heads, k_dim = k.shape[-2], k.shape[-1]
    v_heads, v_dim = v.shape[-2], v.shape[-1]
    if q.shape != k.shape or v.shape[:-2] != k.shape[:-2] or v_heads % heads:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: not [1, T, H(V), dim] "
                         "with value heads a multiple of key heads")
    if q.dim() == 4 and q.shape[0] != 1:
        raise ValueError(f"q {tuple(q.shape)}: a flattened batch [1, T, H, K] with cu_seqlens is expected")
    out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    requests = cu_seqlens.numel() - 1
    if requests <= 0 or q.shape[-3] == 0:
        return out
    bk = triton.next_power_of_2(k_dim)
    bv = int(block_v) if block_v else default_block_v(k_dim, v_dim, requests, q.device)
    if scale is None:
        scale = k_dim**-0.5
    record = records is not None
    if record:
        problem = record_layout_problem(records, record_meta, record_rows, requests, intermediate_states, k_dim, v_dim)
        if problem:
            raise ValueError(f"record mode: {problem}")
    grid = (triton.cdiv(v_dim, bv), v_heads, requests)
    _tree_gated_delta_kernel[grid](
        q, k, v, a, b, A_log, dt_bias,
        initial_states, initial_state_indices,
        intermediate_states, intermediate_state_indices,
        parents, cu_seqlens, out,
        records if record else out, record_meta if record else cu_seqlens, record_rows if record else cu_seqlens,
        float(scale), float(softplus_beta), float(softplus_threshold),
        q.stride(-3), q.stride(-2), q.stride(-1),
        k.stride(-3), k.stride(-2), k.stride(-1),
        v.stride(-3), v.stride(-2), v.stride(-1),
        a.stride(-2), a.stride(-1),
        b.stride(-2), b.stride(-1),
        *initial_states.stride(),
        *intermediate_states.stride(),
        parents.stride(0), parents.stride(1),
        records.shape[1] if record else 0,
        H=heads, HV=v_heads, K=k_dim, V=v_dim, BK=bk, BV=bv,
        RECIPROCAL_NORM=bool(reciprocal_norm),
        ROUND_KEPT_STATE=intermediate_states.dtype != torch.float32,
        RECORD=record,
        num_warps=num_warps,
    )
    return out


def record_width(k_dim: int, v_dim: int) -> int:
    """fp32 values a node's record holds per value head: normalised k (K), v (V), g and beta."""
    return k_dim + v_dim + 2


def record_layout_problem(records: torch.Tensor, meta: torch.Tensor | None, rows: torch.Tensor | None, requests: int,
                          intermediate: torch.Tensor, k_dim: int, v_dim: int) -> str:
    """'' when ``records`` ([..., rows, steps, HV, K + V + 2] fp32) and ``meta`` ([..., rows, 2] int32), both
    contiguous, fit the intermediate buffer ([..., rows, steps, HV, V, K], fp32) and the row table ``rows`` (int32)
    holds ``requests`` entries, else what does not."""
    if intermediate.dtype != torch.float32:
        return f"the intermediate buffer is {intermediate.dtype}, the record mode needs float32"
    want = (*intermediate.shape[:-2], record_width(k_dim, v_dim))
    if tuple(records.shape) != want or records.dtype != torch.float32 or not records.is_contiguous():
        return f"records {tuple(records.shape)} {records.dtype}: expected contiguous float32 {want}"
    if (meta is None or tuple(meta.shape) != (*intermediate.shape[:-4], 2) or meta.dtype != torch.int32
            or not meta.is_contiguous()):
        got = None if meta is None else (tuple(meta.shape), meta.dtype)
        return f"record_meta {got}: expected contiguous int32 {(*intermediate.shape[:-4], 2)}"
    if records.shape[-3] > 63 or records.device != intermediate.device:
        return "more than 63 steps (the ancestor walk keeps a 64-bit set), or records on another device"
    if rows is None or rows.dtype != torch.int32 or rows.numel() < requests:
        return f"record_rows: int32 with at least {requests} entries expected"
    return ""


def gdn_tree_replay(
    records: torch.Tensor,
    record_meta: torch.Tensor,
    record_rows: torch.Tensor,
    states: torch.Tensor,
    intermediate: torch.Tensor,
    path: torch.Tensor,
    path_len: torch.Tensor,
    last: torch.Tensor,
    track: torch.Tensor | None = None,
    *,
    block_v: int | None = None,
    num_warps: int = 1,
) -> None:
    """After a record-mode verify (:func:`gdn_tree_verify` with ``records``) of every layer: rebuild, for each
    layer ``l`` and request ``n`` whose row ``r = record_rows[n]`` (the verify's) is >= 0 with ``record_meta[l, r]``
    set, and ``last[n] >= 0``, the states along its accepted path and store the state after node ``last[n]`` (and
    after node ``track[n]``, if on the path) at ``intermediate[l, r, node]``, exactly where the store mode would
    have put them, so that SGLang's own commit
    (``update_mamba_state_after_mtp_verify``) then reads the same bits. One launch, no host synchronisation.

    ``records`` [L, rows, steps, HV, K + V + 2] and ``record_meta`` [L, rows, 2] (the verify's, per layer);
    ``states`` [L, slots, HV, V, K] (the initial states the verify read, not yet changed); ``intermediate``
    [L, rows, steps, HV, V, K] fp32; ``path`` [N, depth] the accepted node indices from the root (node 0) on,
    ``path_len`` [N] the accepted nodes after the root (``path[n, path_len[n]] == last[n]``), ``last`` [N],
    ``track`` [N] (-1: none)."""
    layers, rows, steps, v_heads, v_dim, k_dim = intermediate.shape
    requests = last.numel()
    problem = record_layout_problem(records, record_meta, record_rows, requests, intermediate, k_dim, v_dim)
    if problem:
        raise ValueError(problem)
    if states.dim() != 5 or states.shape[0] != layers or tuple(states.shape[2:]) != (v_heads, v_dim, k_dim):
        raise ValueError(f"states {tuple(states.shape)}: expected [{layers}, slots, {v_heads}, {v_dim}, {k_dim}]")
    if requests == 0 or layers == 0:
        return
    bv = int(block_v) if block_v else default_block_v(k_dim, v_dim, requests, intermediate.device)
    grid = (triton.cdiv(v_dim, bv), v_heads, layers * requests)
    _replay_kernel[grid](
        records, record_meta, record_rows, states, intermediate, path, path_len, last,
        last if track is None else track,
        requests, rows, steps,
        *states.stride(), *intermediate.stride(), path.stride(0), path.stride(1),
        HV=v_heads, K=k_dim, V=v_dim, BK=triton.next_power_of_2(k_dim), BV=bv,
        num_warps=num_warps,
    )
