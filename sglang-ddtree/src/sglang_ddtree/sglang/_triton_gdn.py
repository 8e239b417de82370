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

__all__ = ["default_block_v", "gdn_tree_verify"]


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
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    RECIPROCAL_NORM: tl.constexpr,
    ROUND_KEPT_STATE: tl.constexpr,
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
    # zeros + the slot: SGLang's sequence (0 + -0 is +0), so even the sign of a zero state element is SGLang's
    h0 = tl.load(h0_tile, mask=tile_in & (slot0 >= 0), other=0.0).to(tl.float32)
    state = tl.zeros([BK, BV], dtype=tl.float32) + h0

    slot = tl.load(buf_idx_ptr + req).to(tl.int64)
    buf_tile = buf_ptr + slot * sc_n + hv * sc_h + vs[None, :] * sc_v + ks[:, None] * sc_k

    neg_rate = -tl.exp(tl.load(a_log_ptr + hv).to(tl.float32))
    bias = tl.load(dt_bias_ptr + hv).to(tl.float32)
    parent_row = parent_ptr + req * sp_n

    for t in range(0, count):
        if t > 0 and slot >= 0:
            parent = tl.load(parent_row + t * sp_t).to(tl.int32)
            if parent != t - 1:  # a branch: the parent's state is in the buffer
                tl.debug_barrier()  # stored by this program, maybe by another of its threads (num_warps > 1)
                state = tl.load(buf_tile + parent.to(tl.int64) * sc_t, mask=tile_in, other=0.0).to(tl.float32)
            elif ROUND_KEPT_STATE:  # what storing and reloading the kept state through the buffer's dtype does
                state = state.to(buf_ptr.dtype.element_ty).to(tl.float32)
        row = first + t
        q = tl.load(q_ptr + row * sq_t + kh * sq_h + ks * sq_k, mask=k_in, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + row * sk_t + kh * sk_h + ks * sk_k, mask=k_in, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + row * sv_t + hv * sv_h + vs * sv_v, mask=v_in, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + row * sb_t + hv * sb_h).to(tl.float32)
        x = tl.load(a_ptr + row * sa_t + hv * sa_h).to(tl.float32) + bias

        # gate and write strength, in SGLang's order of operations
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

        state = state * tl.exp(g)
        v = v - tl.sum(state * k[:, None], 0)
        v = v * beta
        state = state + k[:, None] * v[None, :]
        out = tl.sum(state * q[:, None], 0)
        tl.store(o_ptr + (row * HV + hv) * V + vs, out.to(o_ptr.dtype.element_ty), mask=v_in)
        if slot >= 0:
            tl.store(buf_tile + t * sc_t, state.to(buf_ptr.dtype.element_ty), mask=tile_in)


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
) -> torch.Tensor:
    """The tree's outputs ``[1, T, HV, V]`` (``v``'s shape, ``q``'s dtype); every node's state is stored into
    ``intermediate_states`` (module docstring: semantics and shapes). No host synchronisation: one launch of
    (value tiles, HV, N) programs."""
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
    grid = (triton.cdiv(v_dim, bv), v_heads, requests)
    _tree_gated_delta_kernel[grid](
        q, k, v, a, b, A_log, dt_bias,
        initial_states, initial_state_indices,
        intermediate_states, intermediate_state_indices,
        parents, cu_seqlens, out,
        float(scale), float(softplus_beta), float(softplus_threshold),
        q.stride(-3), q.stride(-2), q.stride(-1),
        k.stride(-3), k.stride(-2), k.stride(-1),
        v.stride(-3), v.stride(-2), v.stride(-1),
        a.stride(-2), a.stride(-1),
        b.stride(-2), b.stride(-1),
        *initial_states.stride(),
        *intermediate_states.stride(),
        parents.stride(0), parents.stride(1),
        H=heads, HV=v_heads, K=k_dim, V=v_dim, BK=bk, BV=bv,
        RECIPROCAL_NORM=bool(reciprocal_norm),
        ROUND_KEPT_STATE=intermediate_states.dtype != torch.float32,
        num_warps=num_warps,
    )
    return out
