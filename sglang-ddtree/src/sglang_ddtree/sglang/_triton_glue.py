"""Triton kernels of the decode round's glue: one launch each, one program per request, no host synchronisation.

* ``verify_prep``: tree -> every verify array (tokens, positions, chain-first KV slots and their locations,
  retrieve index) and the tree cells of the FULL_MASK layout written into the backend's mask buffer.
  Reference: ``verify_input.build_verify_arrays(..., backend="torch")``.
* ``chain_mask``: the tree cells of a chain (causal) written into the mask buffer: what DFLASH's maskless verify
  means, for a verify CUDA graph that reads the buffer. Reference: ``verify_input.write_chain_mask(...,
  backend="torch")``.
* ``walk_commit``: the walk, the commit plan and the KV moves in ONE launch: from the target's token at every node
  (argmax, or the sampled token: the walk is the same) the accepted path, then the emitted tokens, commit lengths,
  new lengths, KV moves, drafter-context rows and last accepted node, and the moves applied to every layer of a
  slot-major pool (SGLang's ``data_ptrs``/``data_strides``: one base pointer and one row size in bytes per buffer).
  Program (b, buf) walks request b's tree (cheap: at most depth steps over budget + 1 nodes), then moves buffer
  buf's slots of that request (none when its path followed the chain); program (b, 0) also stores the outputs.
  Within a tile, every source is loaded before any destination is stored. References: ``verify.greedy_walk``,
  ``commit.commit_plan``.

Tested against the references in Triton's CPU interpreter (tests/triton_interpreted_check.py) and on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._alloc import CarveRing, carve
from .._triton_walk import walk_request

__all__ = ["chain_mask", "verify_prep", "walk_commit"]


@triton.jit(do_not_specialize=["N", "root_stride", "r2t_stride"])
def _verify_prep_kernel(
    tok_ptr,  # i64 [B, N] tree tokens
    depth_ptr,  # i64 [B, N]
    rank_ptr,  # i64 [B, N]
    anc_ptr,  # u8 [B, M, M]
    num_ptr,  # i64 [B] valid nodes incl. the root
    root_ptr,  # int [B] (strided)
    root_stride,
    prefix_ptr,  # int [B]
    pool_ptr,  # int [B] req_pool_indices
    r2t_ptr,  # int [R, L] req_to_token
    r2t_stride,
    N,
    o_tokens,  # i64 [B*M]
    o_positions,  # i64 [B*M]
    o_loc,  # [B*M]
    o_retrieve,  # i64 [B, M]
    o_slots,  # i64 [B, M]
    mask_ptr,  # u8 flat FULL_MASK buffer (unused unless WRITE_MASK)
    WRITE_MASK: tl.constexpr,
    NB: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    m = N + 1
    i = tl.arange(0, NB)
    inside = i < m
    draft = inside & (i >= 1)
    num = tl.load(num_ptr + b)
    tok = tl.load(tok_ptr + b * N + i - 1, mask=draft, other=0).to(tl.int64)
    dep = tl.load(depth_ptr + b * N + i - 1, mask=draft, other=0).to(tl.int64)
    rnk = tl.load(rank_ptr + b * N + i - 1, mask=draft, other=0)
    root = tl.load(root_ptr + b * root_stride).to(tl.int64)
    tok = tl.where(i == 0, root, tok)
    both = inside[:, None] & inside[None, :]
    anc = tl.load(anc_ptr + b * m * m + i[:, None] * m + i[None, :], mask=both, other=0)
    # chain-first slots (verify_input.chain_first_slots)
    off_rank = draft & (rnk != 0)
    off_chain = tl.max(((anc != 0) & off_rank[None, :]).to(tl.int32), axis=1)
    chain = draft & (i < num) & (off_chain == 0)
    count = tl.sum(chain.to(tl.int64), axis=0)
    other = draft & (chain == 0)
    before = tl.sum((other[None, :] & (i[None, :] < i[:, None])).to(tl.int64), axis=1)
    slot = tl.where(i == 0, 0, tl.where(chain, dep, count + 1 + before))
    prefix = tl.load(prefix_ptr + b).to(tl.int64)
    row = tl.load(pool_ptr + b).to(tl.int64)
    loc = tl.load(r2t_ptr + row * r2t_stride + prefix + slot, mask=inside, other=0)
    base = b * m
    tl.store(o_tokens + base + i, tok, mask=inside)
    tl.store(o_positions + base + i, prefix + dep, mask=inside)
    tl.store(o_loc + base + i, loc, mask=inside)
    tl.store(o_retrieve + base + i, tl.where(i < num, base + i, -1), mask=inside)
    tl.store(o_slots + base + i, slot, mask=inside)
    if WRITE_MASK:
        _store_mask_cells(mask_ptr, prefix_ptr, b, prefix, m, i, anc, both)


@triton.jit
def _store_mask_cells(mask_ptr, prefix_ptr, b, prefix, m, i, cells, both):
    """Store request b's [m, m] tree cells (query i, key prefix + j) into the flat FULL_MASK buffer."""
    # request b's block starts after the blocks of requests 0..b-1: M * (their prefixes) + b * M * M cells
    # (summed 16 requests at a time: the batch size is no compile-time constant, so one variant serves all)
    prior = b * 0
    for first in range(0, b, 16):
        bb = first + tl.arange(0, 16)
        prior += tl.sum(tl.load(prefix_ptr + bb, mask=bb < b, other=0).to(tl.int64), axis=0)
    start = m * prior + b * m * m
    cell = start + i[:, None] * (prefix + m) + prefix + i[None, :]
    tl.store(mask_ptr + cell, cells, mask=both)


@triton.jit(do_not_specialize=["M"])
def _chain_mask_kernel(prefix_ptr, mask_ptr, M, NB: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, NB)
    inside = i < M
    both = inside[:, None] & inside[None, :]
    causal = (i[None, :] <= i[:, None]).to(tl.uint8)  # a chain node's ancestors: every node up to itself
    prefix = tl.load(prefix_ptr + b).to(tl.int64)
    _store_mask_cells(mask_ptr, prefix_ptr, b, prefix, M, i, causal, both)


#: verify_prep's and walk_commit's outputs reused in turn (:func:`reuse_outputs`), or allocated each call (None)
_RING: CarveRing | None = None


def reuse_outputs(depth: int | None) -> None:
    """From now on hand out verify_prep's and walk_commit's outputs from ``depth`` sets per batch shape, reused in
    turn (``_alloc.CarveRing``), or allocate them each call (None: the default). Set once at the worker's start-up
    (``SGLANG_DDTREE_GLUE_RING``)."""
    global _RING
    _RING = CarveRing(depth) if depth else None


def _outputs(name: str, shapes: list[tuple[int, ...]], dtype: torch.dtype, device) -> list[torch.Tensor]:
    """Uninitialised outputs of ``shapes`` (one dtype): the ring's next set of the outputs called ``name``, else one
    allocation (a single output: a plain tensor, no view)."""
    ring = _RING
    if ring is not None:
        return ring.carve(name, shapes, dtype, device)
    if len(shapes) == 1:
        return [torch.empty(shapes[0], dtype=dtype, device=device)]
    return carve(shapes, dtype, device)


def chain_mask(mask_buffer, prefix_lens, num_nodes, mask_cells):
    """Write the tree cells of a ``num_nodes``-token chain per request (lower-triangular: causal) into
    ``mask_buffer`` in one launch and return its first ``mask_cells`` elements (``verify_input.write_chain_mask``'s
    Triton path)."""
    if mask_cells > mask_buffer.numel():
        raise ValueError(f"chain mask needs {mask_cells} cells, the verify-mask buffer has {mask_buffer.numel()}")
    bsz = prefix_lens.shape[0]
    mask_arg = mask_buffer.view(torch.uint8) if mask_buffer.dtype == torch.bool else mask_buffer
    if bsz > 0:
        _chain_mask_kernel[(bsz,)](prefix_lens.contiguous(), mask_arg, int(num_nodes),
                                   NB=max(16, triton.next_power_of_2(int(num_nodes))), num_warps=4)
    return mask_buffer.view(-1)[:mask_cells]


def verify_prep(tree, root_tokens, prefix_lens, req_pool_indices, req_to_token, mask_buffer, mask_cells):
    """The fields of ``verify_input.TreeVerifyArrays`` but the retrieve links (dict); ``custom_mask`` is the first
    ``mask_cells`` (``verify_input.mask_numel``) elements of ``mask_buffer``, the view SGLang reads, with the tree
    cells written; None when ``mask_buffer`` is None."""
    bsz, budget = tree.tokens.shape
    m = budget + 1
    device = tree.tokens.device
    wide = req_to_token.dtype == torch.int64  # out_cache_loc shares the int64 allocation
    views = _outputs("verify_prep", [(bsz * m,), (bsz * m,), (bsz, m), (bsz, m)] + ([(bsz * m,)] if wide else []),
                     torch.int64, device)
    out = dict(zip(("tokens", "positions", "retrieve_index", "slots"), views, strict=False))
    out["out_cache_loc"] = views[4] if wide else _outputs("out_cache_loc", [(bsz * m,)], req_to_token.dtype, device)[0]
    custom_mask = None
    write_mask = mask_buffer is not None
    if write_mask:
        if mask_cells > mask_buffer.numel():
            raise ValueError(f"tree mask needs {mask_cells} cells, the verify-mask buffer has {mask_buffer.numel()}")
        custom_mask = mask_buffer.view(-1)[:mask_cells]
        mask_arg = mask_buffer.view(torch.uint8) if mask_buffer.dtype == torch.bool else mask_buffer
    else:
        mask_arg = out["slots"]  # never written (WRITE_MASK is off)
    ancestors = tree.ancestors
    ancestors = ancestors.view(torch.uint8) if ancestors.dtype == torch.bool else ancestors.to(torch.uint8)
    if root_tokens.dim() != 1:
        raise ValueError(f"root_tokens must be 1-D [B], got {tuple(root_tokens.shape)}")
    _verify_prep_kernel[(bsz,)](
        tree.tokens.contiguous(),
        tree.depths.contiguous(),
        tree.ranks.contiguous(),
        ancestors.contiguous(),
        tree.num_nodes.contiguous(),
        root_tokens,
        root_tokens.stride(0),
        prefix_lens.contiguous(),
        req_pool_indices.contiguous(),
        req_to_token,
        req_to_token.stride(0),
        budget,
        out["tokens"],
        out["positions"],
        out["out_cache_loc"],
        out["retrieve_index"],
        out["slots"],
        mask_arg,
        WRITE_MASK=write_mask,
        NB=max(16, triton.next_power_of_2(m)),
        num_warps=4,
    )
    out["custom_mask"] = custom_mask
    return out


@triton.jit(do_not_specialize=["M", "D"])
def _walk_commit_kernel(
    par_ptr,  # i64 [B, M] parents (root: -1)
    tok_ptr,  # i64 [B, M - 1] draft tokens (node i + 1 in column i)
    tgt_ptr,  # i64 [B, M] the target's token at each node
    slot_ptr,  # i64 [B, M]
    loc_ptr,  # int [B*M]
    prefix_ptr,  # int [B]
    M,
    D,  # depth limit; the path and the plan are D + 1 wide
    o_index,  # i64 [B, D + 1]
    o_len,  # i64 [B]
    o_bonus,  # i64 [B]
    o_out,  # i64 [B, D + 1]
    o_commit,  # i32 [B]
    o_new,  # prefix dtype [B]
    o_src,  # i64 [B, D + 1]
    o_dst,  # i64 [B, D + 1]
    o_rows,  # i64 [B*(D + 1)]
    o_last,  # i64 [B]
    ptrs,  # u64 [NBUF] (MOVE)
    strides,  # i64 [NBUF] (MOVE)
    MOVE: tl.constexpr,
    TILE: tl.constexpr,
    NB: tl.constexpr,
    DB: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    buf = tl.program_id(1)
    w = D + 1
    # the walk (verify.greedy_walk): from the root, the child whose token is the target's token at the current node
    i, tgt, path, length, bonus = walk_request(par_ptr, tok_ptr, tgt_ptr, b, M, D, NB, DB)
    inside = i < M
    k = tl.arange(0, DB)
    # the plan (commit.commit_plan): the KV of path entry k moves to the slot verified at offset k
    kin = k < w
    node = tl.where(path >= 0, path, 0)
    live = kin & (k <= length)
    slot = tl.load(slot_ptr + b * M + i, mask=inside, other=-1)
    loc = tl.load(loc_ptr + b * M + i, mask=inside, other=0).to(tl.int64)
    on_path = i[None, :] == node[:, None]
    src = tl.sum(tl.where(on_path, loc[None, :], 0), axis=1)
    dst = tl.sum(tl.where(slot[None, :] == k[:, None], loc[None, :], 0), axis=1)
    move = live & (src != dst)
    if buf == 0:
        tl.store(o_index + b * w + k, path, mask=kin)
        tl.store(o_len + b, length.to(tl.int64))
        tl.store(o_bonus + b, bonus)
        # emitted token k: the target's token at path node k (the next accepted draft, then the bonus)
        out = tl.sum(tl.where(on_path, tgt[None, :], 0), axis=1)
        tl.store(o_out + b * w + k, tl.where(live, out, 0), mask=kin)
        tl.store(o_src + b * w + k, tl.where(move, src, -1), mask=kin)
        tl.store(o_dst + b * w + k, tl.where(move, dst, -1), mask=kin)
        tl.store(o_rows + b * w + k, b * M + tl.where(live, node, tl.minimum(k, M - 1)), mask=kin)
        tl.store(o_last + b, tl.sum(tl.where(kin & (k == length), node, 0), axis=0))
        tl.store(o_commit + b, (length + 1).to(tl.int32))
        prefix = tl.load(prefix_ptr + b)
        tl.store(o_new + b, prefix + (length + 1).to(prefix.dtype))
    if MOVE:
        if tl.sum(move.to(tl.int32), axis=0) > 0:
            stride = tl.load(strides + buf).to(tl.int64)
            base = tl.cast(tl.load(ptrs + buf), tl.pointer_type(tl.uint8))
            for start in range(0, stride, TILE):
                o = start + tl.arange(0, TILE)
                sel = move[:, None] & (o[None, :] < stride)
                vals = tl.load(base + src[:, None] * stride + o[None, :], mask=sel)
                tl.debug_barrier()  # every source of this tile read before any destination is written
                tl.store(base + dst[:, None] * stride + o[None, :], vals, mask=sel)


def walk_commit(parents, tokens, target_tokens, depth, slots, out_cache_loc, prefix_lens, move_table=None,
                tile: int = 512):
    """(accept_index, accept_len, bonus, plan) of a round in one launch: ``verify.greedy_walk``'s outputs over
    ``target_tokens`` and ``commit.commit_plan``'s fields (dict); with ``move_table`` (the pool's ``(data_ptrs u64
    [NBUF], data_strides [NBUF] bytes per slot)``) the plan's KV moves are applied too, in place.

    parents int64 [B, M], tokens int64 [B, M-1], target_tokens int64 [B, M], slots int64 [B, M], out_cache_loc
    [B*M], prefix_lens [B]; the path and the plan are ``depth + 1`` wide."""
    bsz, m = parents.shape
    w = int(depth) + 1
    device = parents.device
    index, length, bonus, out_tokens, src, dst, rows, last = _outputs(
        "walk_commit", [(bsz, w), (bsz,), (bsz,), (bsz, w), (bsz, w), (bsz, w), (bsz * w,), (bsz,)], torch.int64, device
    )
    (commit_lens,) = _outputs("commit_lens", [(bsz,)], torch.int32, device)
    (new_seq_lens,) = _outputs("new_seq_lens", [(bsz,)], prefix_lens.dtype, device)
    move = move_table is not None and move_table[0].numel() > 0
    ptrs, strides = move_table if move else (slots, slots)  # never read without MOVE
    if bsz > 0:
        _walk_commit_kernel[(bsz, ptrs.numel() if move else 1)](
            parents.contiguous(),
            tokens.contiguous(),
            target_tokens.to(torch.int64).contiguous(),
            slots.contiguous(),
            out_cache_loc.contiguous(),
            prefix_lens.contiguous(),
            m,
            int(depth),
            index, length, bonus, out_tokens, commit_lens, new_seq_lens, src, dst, rows, last,
            ptrs,
            strides,
            MOVE=move,
            TILE=tile,
            NB=max(16, triton.next_power_of_2(m)),
            DB=max(16, triton.next_power_of_2(w)),
            num_warps=4,
        )
    plan = {"out_tokens": out_tokens, "commit_lens": commit_lens, "new_seq_lens": new_seq_lens, "move_src": src,
            "move_dst": dst, "hidden_rows": rows, "last_node": last}
    return index, length, bonus, plan
