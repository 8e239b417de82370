"""Accept/commit bookkeeping after a tree verify: pure tensor functions (device-agnostic, static shapes, no host
synchronisation), tested on CPU with a simulated KV allocator.

SGLang's spec-v2 workers (DFLASH and EAGLE alike) reserve each request's KV slots ahead of time: before a
decode round, ``req_to_token[r, prefix : prefix + W]`` already holds slots owned by the request (W = the
per-decode reservation, >= budget + 1 for DDTREE). The target's verify pass writes node i's KV into the slot
at position ``prefix + i``. Committing the accepted path (root, then the accepted nodes by depth) therefore
MOVES the KV of accepted node ``accept_index[k]`` into the slot at position ``prefix + k``: positions past the
new length keep slots that stay reserved by the request and are overwritten next round, and every slot is
returned to the allocator when the request finishes, exactly as for DFLASH/EAGLE. The moves are data moves;
the request-to-token map is unchanged, so they are valid for any page size (a page keeps its slots
contiguous). Padding moves are (0 -> 0): slot 0 is SGLang's reserved padding slot.
"""

from __future__ import annotations

import torch

__all__ = [
    "compact_to_front",
    "kv_commit_moves",
    "last_accepted_node",
    "out_tokens_from_path",
    "tree_mamba_commit_indices",
]


def kv_commit_moves(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    accept_index: torch.Tensor,
    accept_len: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(src_slots, dst_slots), both int64 [B, D+1]: move KV slot ``src`` to ``dst`` for each accepted path entry.

    Args:
        req_to_token: [R, L] slot table.
        req_pool_indices: [B] rows of the batch's requests.
        prefix_lens: [B] committed lengths before this round (position of the root).
        accept_index: [B, D+1] local node indices of the accepted path (root first), -1 padded.
        accept_len: [B] accepted DRAFT nodes (the path has accept_len + 1 entries, the root included).
    """
    width = accept_index.shape[1]
    device = accept_index.device
    k = torch.arange(width, device=device, dtype=torch.int64).view(1, width)
    live = k <= accept_len.to(torch.int64).view(-1, 1)
    rows = req_to_token[req_pool_indices.to(torch.int64)]  # [B, L]
    base = prefix_lens.to(torch.int64).view(-1, 1)
    dst_pos = (base + k).clamp(max=rows.shape[1] - 1)
    src_pos = (base + accept_index.to(torch.int64).clamp(min=0)).clamp(max=rows.shape[1] - 1)
    dst = torch.gather(rows, 1, dst_pos).to(torch.int64)
    src = torch.gather(rows, 1, src_pos).to(torch.int64)
    zero = torch.zeros_like(dst)
    return torch.where(live, src, zero), torch.where(live, dst, zero)


def compact_to_front(values: torch.Tensor, accept_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Gather each request's accepted path to the front of its ``num_nodes`` rows.

    ``values`` is node-major [B*num_nodes, ...]; rows past the path keep their old contents (they are never
    read as committed). ``accept_index`` may be wider than ``num_nodes`` (its width is the block size; a
    tree of budget N < block size - 1 has paths of at most N + 1 nodes, the rest is -1 padding). Returns a new
    tensor.
    """
    width = min(accept_index.shape[1], num_nodes)
    accept_index = accept_index[:, :width]
    bsz = accept_index.shape[0]
    device = values.device
    base = torch.arange(bsz, device=device, dtype=torch.int64).view(bsz, 1) * num_nodes
    src = (base + accept_index.to(torch.int64).clamp(min=0)).reshape(-1)
    out = values.clone()
    view = out.view(bsz, num_nodes, *values.shape[1:])
    view[:, :width] = values[src].view(bsz, width, *values.shape[1:])
    return out


def out_tokens_from_path(path_tokens: torch.Tensor, accept_len: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
    """[B, D+1] tokens emitted this round: the accepted drafts (path entries 1..accept_len) then the bonus;
    entries past accept_len are 0 (SGLang reads ``accept_lens`` = accept_len + 1 of them per request)."""
    bsz, width = path_tokens.shape
    k = torch.arange(width, device=path_tokens.device).view(1, width)
    acc = accept_len.to(torch.int64).view(bsz, 1)
    shifted = torch.cat([path_tokens[:, 1:], torch.zeros_like(path_tokens[:, :1])], dim=1)
    out = torch.where(k < acc, shifted, torch.zeros_like(shifted))
    return torch.where(k == acc, bonus.to(out.dtype).view(bsz, 1), out)


def last_accepted_node(accept_index: torch.Tensor, accept_len: torch.Tensor) -> torch.Tensor:
    """Local node index of each request's last accepted node: the verify step whose recurrent (linear-attention)
    state must be committed. For a chain this equals accept_len; for a tree it generally does not."""
    return torch.gather(accept_index.to(torch.int64), 1, accept_len.to(torch.int64).view(-1, 1)).view(-1)


def tree_mamba_commit_indices(
    accept_index: torch.Tensor,
    accept_len: torch.Tensor,
    seq_lens_pre_verify: torch.Tensor,
    track_interval: int | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Verify-step indices for the recurrent-state commit of hybrid (GatedDeltaNet) targets.

    Returns (last_correct_step_indices [B], mamba_steps_to_track [B] or None): the first is the last accepted
    node's index (the state to keep); the second, when prefix-cache tracking is on, the node whose state is at
    the tracking boundary crossed this round (-1 when none is crossed), mirroring SGLang's chain logic with the
    path's node indices in place of chain offsets.
    """
    last = last_accepted_node(accept_index, accept_len)
    if track_interval is None:
        return last, None
    commit_lens = accept_len.to(torch.int64) + 1
    pre = seq_lens_pre_verify.to(torch.int64)
    post = pre + commit_lens
    crosses = (pre // track_interval) != (post // track_interval)
    tracking_point = post // track_interval * track_interval
    ith = torch.clamp(tracking_point - pre - 1, min=0)
    can = crosses & (ith < commit_lens)
    node = torch.gather(accept_index.to(torch.int64), 1, ith.clamp(max=accept_index.shape[1] - 1).view(-1, 1)).view(-1)
    return last, torch.where(can, node, torch.full_like(node, -1))
