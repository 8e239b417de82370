"""Accept/commit bookkeeping after a tree verify: pure tensor functions (device-agnostic, static shapes, no host
synchronisation), tested on CPU with a simulated KV allocator. On CUDA the walk's Triton kernel
(``_triton_glue.walk_commit``) computes the same plan and applies its moves; ``commit_plan`` is its reference.

SGLang's spec-v2 workers (DFLASH and EAGLE alike) reserve each request's KV slots ahead of time: before a
decode round, ``req_to_token[r, prefix : prefix + W]`` already holds slots owned by the request (W = the
per-decode reservation, >= budget + 1 for DDTREE). The verify pass writes node i's KV into the slot at position
``prefix + slots[i]`` (``verify_input.chain_first_slots``: the argmax chain's nodes at their own depth). The
commit needs accepted node ``accept_index[k]`` at position ``prefix + k``: it MOVES the KV of the accepted nodes
that are not there already (none when the path follows the chain). Both ends of every move are read from the
verify's own ``out_cache_loc`` (the slot at position ``prefix + k`` is the location of the node verified into
offset k), never from ``req_to_token`` after the verify. The moves are data moves; the request-to-token map is
unchanged, so they are valid for any page size (a page keeps its slots contiguous). Positions past the new
length keep slots that stay reserved by the request and are overwritten next round, and every slot is returned
to the allocator when the request finishes, exactly as for DFLASH/EAGLE.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "CommitPlan",
    "commit_plan",
    "last_accepted_node",
    "out_tokens_from_path",
    "tree_mamba_commit_indices",
]


@dataclass(frozen=True)
class CommitPlan:
    """What one round commits, per request (B requests, W = accept_index's width = the drafter block size S).

    out_tokens: int64 [B, W] the emitted tokens (accepted drafts, then the bonus, then 0).
    commit_lens: int32 [B] accept_len + 1. new_seq_lens: [B] (prefix_lens' dtype) prefix + commit_lens.
    move_src, move_dst: int64 [B, W] KV slot moves (source, destination); -1 where nothing moves.
    hidden_rows: int64 [B*W] row of the verify's hidden states that becomes drafter context row k of request b:
        b*M + accept_index[b, k] for the committed k (other rows: any row of the request).
    last_node: int64 [B] local index of the last accepted node (the recurrent-state commit of hybrid targets).
    """

    out_tokens: torch.Tensor
    commit_lens: torch.Tensor
    new_seq_lens: torch.Tensor
    move_src: torch.Tensor
    move_dst: torch.Tensor
    hidden_rows: torch.Tensor
    last_node: torch.Tensor


def commit_plan(accept_index, accept_len, bonus, slots, out_cache_loc, tree_tokens, prefix_lens) -> CommitPlan:
    """The commit of a verified round, in plain torch ops (on CUDA ``_triton_glue.walk_commit`` computes the same
    plan in the walk's own launch).

    Args:
        accept_index: int [B, W] local node indices of the accepted path (root first), -1 padded.
        accept_len: int [B] accepted DRAFT nodes (the path has accept_len + 1 entries, the root included).
        bonus: int [B] the target's token at the last accepted node.
        slots: int64 [B, M] position offset of each node's verify slot (``chain_first_slots``).
        out_cache_loc: [B*M] the verify's KV locations (node-major per request).
        tree_tokens: int64 [B, N] the tree's draft tokens (node i+1 in column i).
        prefix_lens: int [B] committed lengths before this round (position of the root).
    """
    bsz, width = accept_index.shape
    m = slots.shape[1]
    device = accept_index.device
    k = torch.arange(width, device=device, dtype=torch.int64).view(1, width)
    length = accept_len.to(torch.int64).view(bsz, 1)
    live = k <= length
    node = accept_index.to(torch.int64).clamp(min=0)
    loc = out_cache_loc.to(torch.int64).view(bsz, m)
    src = torch.gather(loc, 1, node)
    # the node verified into offset k: inverse of the slot permutation
    inverse = torch.zeros_like(slots).scatter_(1, slots, torch.arange(m, device=device).expand(bsz, m).contiguous())
    dst = torch.gather(loc, 1, torch.gather(inverse, 1, k.clamp(max=m - 1).expand(bsz, width)))
    move = live & (src != dst)
    minus_one = torch.full_like(src, -1)
    node_tokens = torch.cat([torch.zeros_like(tree_tokens[:, :1]), tree_tokens.to(torch.int64)], dim=1)
    path_tokens = torch.gather(node_tokens, 1, node.clamp(max=m - 1))
    base = torch.arange(bsz, device=device, dtype=torch.int64).view(bsz, 1) * m
    commit_lens = (accept_len + 1).to(torch.int32)
    return CommitPlan(
        out_tokens=out_tokens_from_path(path_tokens, accept_len, bonus),
        commit_lens=commit_lens,
        new_seq_lens=prefix_lens + commit_lens.to(prefix_lens.dtype),
        move_src=torch.where(move, src, minus_one),
        move_dst=torch.where(move, dst, minus_one),
        hidden_rows=(base + torch.where(live, node, k.clamp(max=m - 1))).reshape(-1),
        last_node=last_accepted_node(accept_index, accept_len),
    )


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
    last: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Verify-step indices for the recurrent-state commit of hybrid (GatedDeltaNet) targets.

    Returns (last_correct_step_indices [B], mamba_steps_to_track [B] or None): the first is the last accepted
    node's index (the state to keep; ``last`` when the caller has it already); the second, when prefix-cache
    tracking is on, the node whose state is at the tracking boundary crossed this round (-1 when none is
    crossed), mirroring SGLang's chain logic with the path's node indices in place of chain offsets.
    """
    if last is None:
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
