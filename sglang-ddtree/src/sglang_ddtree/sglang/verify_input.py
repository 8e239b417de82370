"""Verify-input construction: from the core's ``DraftTree`` to the arrays SGLang's target verify consumes.

Pure tensor functions (device-agnostic, static shapes, no host synchronisation), tested on CPU against the
core's tree. Layouts (B requests, N+1 tree nodes per request, node 0 = root = the last verified token):

* ``tokens`` int64 [B*(N+1)]: root token then the tree's tokens, request-major (SGLang's ``draft_token``).
* ``positions`` int64 [B*(N+1)]: ``prefix_len + depth`` (every node sits right after its ancestors).
* ``custom_mask`` flat: per request a row-major [N+1, prefix_len + N+1] block (query node i may attend every
  prefix token and the tree nodes that are its ancestors or itself), requests concatenated. This is the
  FULL_MASK layout the Triton backend reads for TARGET_VERIFY (``mask_indptr = cumsum((N+1) * (seq_len +
  N+1))``). Triton's verify never reads the prefix columns (``extend_attention_fwd``'s
  ``skip_prefix_custom_mask`` defaults to True: the prefix is always visible), so with ``mask_buffer`` (the
  backend's own verify-mask buffer) only the B x (N+1)^2 tree cells are written, in place: the per-step mask
  work does not grow with the context, and the graph replay's copy of the mask into that buffer becomes a
  self-copy, which torch skips. Without it, the whole mask is built (bool; prefix columns True).
* ``retrieve_index`` int64 [B, N+1]: global row of each node (``b*(N+1) + i``); -1 for padding nodes.
* ``retrieve_next_token`` / ``retrieve_next_sibling`` int64 [B, N+1]: first child / next sibling (local node
  indices, -1 if none), EAGLE's layout, which the linear-attention backends turn into per-node parents.
* ``slots`` int64 [B, N+1]: the position offset (from the root's position) whose KV slot node i's KV is written
  to: ``chain_first_slots``. ``out_cache_loc`` [B*(N+1)]: those slots (``req_to_token[row, prefix + slot]``).
  Triton's verify attends the tree block from the pass's own K/V (not from the cache), so where a node's KV is
  stored does not change what it attends; it only decides which KV has to move at commit time.

On CUDA (``backend="triton"``) one kernel (``_triton_glue.verify_prep``) computes every array and writes the mask
cells; the torch functions below are its reference (CPU, tests, and the fallback).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "TreeVerifyArrays",
    "build_tree_custom_mask",
    "build_verify_arrays",
    "chain_first_slots",
    "dummy_verify_input_for_capture",
    "mask_numel",
    "tree_block_offsets",
    "write_chain_mask",
    "write_tree_mask",
]


@dataclass(frozen=True)
class TreeVerifyArrays:
    tokens: torch.Tensor
    positions: torch.Tensor
    custom_mask: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor
    out_cache_loc: torch.Tensor  # [B*(N+1)] KV slot each node's KV is written to (request-major)
    slots: torch.Tensor  # int64 [B, N+1] position offset of that slot (chain_first_slots)
    num_nodes: int  # N+1, tokens per request in the verify pass


def mask_numel(prefix_lens_sum: int, batch_size: int, num_nodes: int) -> int:
    """Elements of the flat custom mask: sum_b num_nodes * (prefix_b + num_nodes)."""
    return num_nodes * int(prefix_lens_sum) + batch_size * num_nodes * num_nodes


def build_tree_custom_mask(ancestors: torch.Tensor, prefix_lens: torch.Tensor, prefix_lens_sum: int) -> torch.Tensor:
    """Flat FULL_MASK-layout tree mask.

    Args:
        ancestors: bool [B, M, M] ancestor-or-self matrix (M = N+1 nodes).
        prefix_lens: int [B] committed length of each request (device tensor).
        prefix_lens_sum: the host-known sum of ``prefix_lens`` (SGLang's ``seq_lens_sum``); sizes the output
            without reading the device.
    """
    bsz, m, _ = ancestors.shape
    device = ancestors.device
    prefix = prefix_lens.to(torch.int64)
    total = mask_numel(prefix_lens_sum, bsz, m)
    row_len = prefix + m  # [B]
    sizes = m * row_len
    ends = torch.cumsum(sizes, dim=0)
    starts = ends - sizes
    flat = torch.arange(total, device=device, dtype=torch.int64)
    req = torch.searchsorted(ends, flat, right=True).clamp(max=bsz - 1)
    local = flat - starts[req]
    row_len_r = row_len[req]
    query = local // row_len_r
    col = local % row_len_r
    prefix_r = prefix[req]
    in_tree = col >= prefix_r
    key = (col - prefix_r).clamp(min=0)
    tree_allowed = ancestors.reshape(-1)[(req * m + query.clamp(max=m - 1)) * m + key.clamp(max=m - 1)]
    return torch.where(in_tree, tree_allowed, torch.ones_like(in_tree))


def tree_block_offsets(prefix_lens: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Flat positions [B, M, M] of each request's tree cells (query i, key prefix_b + j) in the FULL_MASK layout.

    Args:
        prefix_lens: int [B] committed length of each request (device tensor).
        num_nodes: M = N+1.
    """
    m = int(num_nodes)
    prefix = prefix_lens.to(torch.int64)
    bsz = prefix.shape[0]
    row_len = (prefix + m).view(bsz, 1, 1)
    starts = (m * (torch.cumsum(prefix, 0) - prefix) + torch.arange(bsz, device=prefix.device) * m * m).view(bsz, 1, 1)
    ar = torch.arange(m, device=prefix.device, dtype=torch.int64)
    return starts + ar.view(1, m, 1) * row_len + prefix.view(bsz, 1, 1) + ar.view(1, 1, m)


def write_tree_mask(buffer: torch.Tensor, ancestors: torch.Tensor, prefix_lens: torch.Tensor,
                    prefix_lens_sum: int) -> torch.Tensor:
    """Write the tree cells of the FULL_MASK layout into ``buffer`` (flat, any dtype); return its first
    ``mask_numel`` elements (the view SGLang's verify reads). Prefix cells are left as they are: never read.

    Args:
        buffer: flat mask buffer with at least ``mask_numel(prefix_lens_sum, B, M)`` elements.
        ancestors: bool [B, M, M] ancestor-or-self matrix.
        prefix_lens: int [B]; prefix_lens_sum: its host-known sum (or an upper bound of it).
    """
    bsz, m, _ = ancestors.shape
    total = mask_numel(prefix_lens_sum, bsz, m)
    if total > buffer.numel():
        raise ValueError(f"tree mask needs {total} cells, the verify-mask buffer has {buffer.numel()}")
    offsets = tree_block_offsets(prefix_lens, m)
    buffer.view(-1)[offsets.reshape(-1)] = ancestors.reshape(-1).to(buffer.dtype)
    return buffer.view(-1)[:total]


def write_chain_mask(buffer: torch.Tensor, prefix_lens: torch.Tensor, prefix_lens_sum: int, num_nodes: int,
                     backend: str = "torch") -> torch.Tensor:
    """Write the tree cells of a chain of ``num_nodes`` tokens per request (lower-triangular: each token sees itself
    and the tokens before it, the causal mask) into ``buffer``; return the view SGLang's verify reads.

    DFLASH's verify brings no mask (a chain is causal), but a DDTREE server's target verify graphs were all captured
    reading the mask buffer: before DFLASH's own round replays the graph of its width, this makes the buffer say what
    its causal verify means. ``backend="triton"``: one launch (``_triton_glue.chain_mask``); "torch":
    :func:`write_tree_mask` of the chain's ancestor matrix.

    Args:
        buffer: the backend's flat verify-mask buffer (at least ``mask_numel(prefix_lens_sum, B, num_nodes)``).
        prefix_lens: int [B]; prefix_lens_sum: its host-known sum (or an upper bound of it).
        num_nodes: tokens verified per request (the drafter's block for DFLASH).
    """
    bsz, m = int(prefix_lens.shape[0]), int(num_nodes)
    if backend == "triton":
        from ._triton_glue import chain_mask

        return chain_mask(buffer, prefix_lens, m, mask_numel(prefix_lens_sum, bsz, m))
    causal = torch.ones((m, m), dtype=torch.bool, device=prefix_lens.device).tril()
    return write_tree_mask(buffer, causal.expand(bsz, m, m), prefix_lens, prefix_lens_sum)


def chain_first_slots(tree: Any) -> torch.Tensor:
    """int64 [B, N+1]: the position offset (0 = the root's position) of the KV slot each node is verified into.

    The argmax chain's nodes (every node of their path, themselves included, has rank 0) go to their own depth:
    they are nodes at depths 1..c, so an accepted path that follows the chain is already where the commit needs
    it and moves nothing. The other nodes, then padding, take offsets c+1..N in node order. Since a node's
    ancestors come before it in node order, an accepted off-chain node at depth k sits at an offset > k, and the
    commit's moves never read a slot that an earlier move of the same request wrote.
    """
    bsz, m = tree.parents.shape
    device = tree.parents.device
    node = torch.arange(m, device=device).view(1, m)
    ranks = torch.cat([torch.zeros_like(tree.ranks[:, :1]), tree.ranks], dim=1)  # root: rank 0
    off_chain = (tree.ancestors & (ranks != 0).view(bsz, 1, m)).any(dim=-1)
    chain = (node >= 1) & (node < tree.num_nodes.view(bsz, 1)) & ~off_chain
    other = ((node >= 1) & ~chain).to(torch.int64)
    c = chain.sum(dim=1, keepdim=True)
    others_before = torch.cumsum(other, dim=1) - other
    depth = tree.positions.to(torch.int64)
    return torch.where(node == 0, 0, torch.where(chain, depth, c + 1 + others_before))


def build_verify_arrays(
    tree: Any,
    root_tokens: torch.Tensor,
    prefix_lens: torch.Tensor,
    prefix_lens_sum: int,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    mask_buffer: torch.Tensor | None = None,
    backend: str = "torch",
) -> TreeVerifyArrays:
    """All verify arrays for a batch of trees (``tree``: the core's ``DraftTree``).

    Args:
        tree: ``sglang_ddtree.tree.DraftTree`` with B rows and budget N.
        root_tokens: int [B] the last verified token of each request (the previous round's bonus token); may be a
            strided column view.
        prefix_lens: int [B] committed sequence lengths (positions of the roots).
        prefix_lens_sum: host-known sum of ``prefix_lens`` (or an upper bound of it).
        req_to_token: [R, L] SGLang's slot table; req_pool_indices: int [B] its rows of this batch.
        mask_buffer: the attention backend's verify-mask buffer: write only the tree cells into it (see the
            module docstring); None: build the whole mask.
        backend: "triton" (one kernel, CUDA or the Triton interpreter) or "torch".
    """
    if backend == "triton":
        from ._triton_glue import verify_prep

        fields = verify_prep(tree, root_tokens, prefix_lens, req_pool_indices, req_to_token, mask_buffer,
                             mask_numel(prefix_lens_sum, tree.tokens.shape[0], tree.tokens.shape[1] + 1))
        if fields["custom_mask"] is None:
            fields["custom_mask"] = build_tree_custom_mask(tree.ancestors, prefix_lens, prefix_lens_sum)
        return TreeVerifyArrays(
            **fields,
            retrieve_next_token=tree.first_child,
            retrieve_next_sibling=tree.next_sibling,
            num_nodes=tree.parents.shape[1],
        )
    bsz = tree.tokens.shape[0]
    m = tree.tokens.shape[1] + 1
    device = tree.tokens.device
    tokens = torch.cat([root_tokens.to(torch.int64).view(bsz, 1), tree.tokens.to(torch.int64)], dim=1)
    positions = prefix_lens.to(torch.int64).view(bsz, 1) + tree.positions.to(torch.int64)
    node = torch.arange(m, device=device, dtype=torch.int64)
    global_row = torch.arange(bsz, device=device, dtype=torch.int64).view(bsz, 1) * m + node.view(1, m)
    valid = node.view(1, m) < tree.num_nodes.view(bsz, 1)
    slots = chain_first_slots(tree)
    rows = req_to_token[req_pool_indices.to(torch.int64)]
    out_cache_loc = torch.gather(rows, 1, prefix_lens.to(torch.int64).view(bsz, 1) + slots).reshape(-1)
    return TreeVerifyArrays(
        tokens=tokens.reshape(-1),
        positions=positions.reshape(-1),
        custom_mask=(
            build_tree_custom_mask(tree.ancestors, prefix_lens, prefix_lens_sum)
            if mask_buffer is None
            else write_tree_mask(mask_buffer, tree.ancestors, prefix_lens, prefix_lens_sum)
        ),
        retrieve_index=torch.where(valid, global_row, -1),
        retrieve_next_token=tree.first_child.to(torch.int64),
        retrieve_next_sibling=tree.next_sibling.to(torch.int64),
        out_cache_loc=out_cache_loc,
        slots=slots,
        num_nodes=m,
    )


def dummy_verify_input_for_capture(*, custom_mask: Any, num_tokens_per_req: int, is_draft_worker: bool):
    """The verify input SGLang's CUDA-graph capture uses for DDTREE (see ``hooks.create_dummy_verify_input_hook``).

    The target's capture gets the capture buffer as its custom mask (so the captured graph reads the mask) and
    tree metadata; the drafter's capture is DFLASH's (a plain block, no mask).
    """
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    from .server_args import TREE_TOPK

    if is_draft_worker:
        from sglang.srt.speculative.dflash_info import DFlashVerifyInput

        return DFlashVerifyInput(
            draft_token=None,
            positions=None,
            draft_token_num=int(num_tokens_per_req),
            custom_mask=None,
            capture_hidden_mode=CaptureHiddenMode.NULL,
        )
    from .verify_spec_input import DDTreeVerifyInput

    return DDTreeVerifyInput(
        draft_token=None,
        positions=None,
        draft_token_num=int(num_tokens_per_req),
        topk=TREE_TOPK,
        custom_mask=custom_mask,
        capture_hidden_mode=CaptureHiddenMode.FULL,
    )
