"""Compile the decode round's glue kernels at start-up, for every verify width the server may choose.

Triton compiles a kernel the first time it is launched with a new set of compile-time constants (on an H200 about
0.9 s each). The glue's constants follow the verify width only (``_triton_glue``: NB, DB per power of two; the batch
size is a runtime value), so without a warm-up the first round at each width stalls for a few seconds, in the
middle of serving. With the auto budget that stall also lands in the first step-cost sample of the width, the
estimate the per-step choice is made from.

``warm_round_kernels`` runs the round's glue once per candidate on a one-request batch of dummy tensors made with the
round's own dtypes and row strides (the same variants are compiled): the tree from drafter logits (or, at TP > 1, from
gathered candidate lists), the candidate's tree (``tree_prefix``, ``chain_tree``), the verify arrays with and
without the backend's mask buffer, the causal cells of DFLASH's block (its rounds: grammar batches, the auto
budget's chain steps), and the walk + commit plan + KV move kernel (on a dummy buffer: the plan moves
nothing). It touches no server state. The worker runs it after its CUDA graphs are captured
(``DDTreeWorker.init_cuda_graphs``); on the CPU the tests run it in Triton's interpreter.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from ..budget import CHAIN, tree_prefix
from ..tree import build_tree, build_tree_from_topk, chain_tree
from ..verify import greedy_walk
from .commit import commit_plan
from .verify_input import build_verify_arrays, mask_numel, write_chain_mask

__all__ = ["warm_round_kernels"]


def warm_round_kernels(
    *,
    device: torch.device,
    budget: int,
    candidates: Sequence[int],
    depth: int,
    vocab_size: int,
    vocab_rows: int,
    logits_dtype: torch.dtype,
    index_dtype: torch.dtype,
    seq_dtype: torch.dtype = torch.int64,
    mask_dtype: torch.dtype | None = torch.uint8,
    tp_world: int = 1,
    move_kernel: bool = True,
    backend: str = "triton",
) -> dict:
    """Run every glue kernel variant the round will launch, once.

    Args:
        budget: the widest tree's budget (the tree every round builds).
        candidates: the budgets a round may verify (``CHAIN`` for the drafter's argmax chain); ``[budget]`` for a
            fixed budget.
        depth: draft depth (block size - 1).
        vocab_size / vocab_rows: the real vocabulary and the lm_head's rows (the padded width: the round's logits
            are a ``[:, :vocab_size]`` view of a ``vocab_rows``-wide matrix, and the row stride is compiled in).
        logits_dtype: the lm_head weight's dtype (the round's logits).
        index_dtype: ``req_to_token``'s dtype (the verify's KV locations); seq_dtype: ``seq_lens``' dtype.
        mask_dtype: the attention backend's verify-mask buffer dtype, None when it has none.
        tp_world: tensor-parallel ranks (> 1: the tree is built from gathered candidate lists, as the round does).
        move_kernel: whether the round's ``_triton_glue.walk_commit`` moves the KV itself (a slot-major pool).

    Returns:
        {"widths": the verify widths warmed (budget + 1 per candidate), "seconds": wall time}.
    """
    t0 = time.monotonic()
    gen = torch.Generator(device="cpu").manual_seed(0)
    if tp_world > 1:
        k = min(budget, vocab_size) * tp_world
        logprobs = torch.log_softmax(torch.randn(1, depth, k, generator=gen), dim=-1).to(device)
        tokens = torch.randint(0, vocab_size, (1, depth, k), generator=gen).to(device)
        tree = build_tree_from_topk(logprobs, tokens, budget, backend=backend)
    else:
        wide = torch.randn(depth, vocab_rows, generator=gen).to(device=device, dtype=logits_dtype)
        tree = build_tree(wide[:, :vocab_size].view(1, depth, vocab_size), budget, backend=backend)
    widths = []
    for candidate in candidates:
        if candidate == CHAIN:
            verified = chain_tree(tree, backend=backend)
        elif candidate < tree.budget:
            verified = tree_prefix(tree, candidate)
        else:
            verified = tree
        m = verified.budget + 1
        prefix = torch.ones(1, dtype=seq_dtype, device=device)
        req_to_token = torch.arange(2 * (m + 1), dtype=index_dtype, device=device).view(2, m + 1)
        rows = torch.zeros(1, dtype=torch.int64, device=device)
        roots = torch.zeros((1, 2), dtype=torch.int64, device=device)[:, 0]  # a strided column, as the round's
        buffers: list[torch.Tensor | None] = [None]
        if mask_dtype is not None:
            buffers.append(torch.zeros(mask_numel(1, 1, m), dtype=mask_dtype, device=device))
        for buffer in buffers:
            arrays = build_verify_arrays(verified, roots, prefix, 1, req_to_token, rows, buffer, backend=backend)
        target = torch.full((1, m), -1, dtype=torch.int64, device=device)  # no draft token matches: nothing moves
        if backend == "triton":
            from ._triton_glue import walk_commit

            table = None
            if move_kernel:
                pool = torch.zeros((req_to_token.numel(), 16), dtype=torch.uint8, device=device)  # every location
                table = (torch.tensor([pool.data_ptr()], dtype=torch.uint64, device=device),
                         torch.tensor([16], dtype=torch.int64, device=device))
            walk_commit(verified.parents, verified.tokens, target, verified.max_depth, arrays.slots,
                        arrays.out_cache_loc, prefix, table)
        else:
            index, length, bonus = greedy_walk(verified, target, backend=backend)
            commit_plan(index, length, bonus, arrays.slots, arrays.out_cache_loc, verified.tokens, prefix)
        widths.append(m)
    if mask_dtype is not None:  # DFLASH's rounds (grammar batches, chain steps) write the block's causal cells
        block = depth + 1
        write_chain_mask(torch.zeros(mask_numel(1, 1, block), dtype=mask_dtype, device=device),
                         torch.ones(1, dtype=seq_dtype, device=device), 1, block, backend=backend)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"widths": widths, "seconds": round(time.monotonic() - t0, 3)}
