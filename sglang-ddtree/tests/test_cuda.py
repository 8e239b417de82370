"""CUDA-only properties: no host synchronisation and CUDA-graph capture (run with SGLANG_DDTREE_TEST_DEVICE=cuda)."""

from __future__ import annotations

import pytest
import torch

from sglang_ddtree.tree import build_tree, build_tree_from_topk
from sglang_ddtree.verify import greedy_walk, sampling_walk

pytestmark = pytest.mark.cuda


def _inputs(device, bsz=8, depth=15, vocab=4096, seed=0, nodes=17):
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn((bsz, depth, vocab), generator=gen, device=device).to(torch.bfloat16)
    target = torch.randint(0, vocab, (bsz, nodes), generator=gen, device=device)
    return logits, target


def test_no_host_sync(device, backend):
    logits, target = _inputs(device)
    probs = torch.softmax(torch.randn((8, 17, 64), device=device), -1)
    lp = torch.log_softmax(logits.float(), -1)
    top = torch.topk(lp, 16, dim=-1)
    # warm-up: compile any kernels first (compilation is not part of a decoding step)
    greedy_walk(build_tree(logits, 16, backend=backend), target, backend=backend)
    sampling_walk(
        build_tree(logits[..., :64], 16, backend=backend), probs, torch.rand((8, 17), device=device), backend=backend
    )
    build_tree_from_topk(top.values, top.indices, 16, backend=backend)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tree = build_tree(logits, 16, backend=backend)
        greedy_walk(tree, target, backend=backend)
        sampling_walk(
            build_tree(logits[..., :64], 16, backend=backend),
            probs,
            torch.rand((8, 17), device=device),
            backend=backend,
        )
        build_tree_from_topk(top.values, top.indices, 16, backend=backend)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("budget", [8, 16, 32])
def test_cuda_graph_capture_and_replay(budget, device, backend):
    logits, target = _inputs(device, seed=budget, nodes=budget + 1)
    static_logits = logits.clone()
    static_target = target.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up outside the graph
            tree = build_tree(static_logits, budget, backend=backend)
            greedy_walk(tree, static_target, backend=backend)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_tree = build_tree(static_logits, budget, backend=backend)
        g_index, g_len, g_bonus = greedy_walk(g_tree, static_target, backend=backend)
    for seed in range(3):
        new_logits, new_target = _inputs(device, seed=100 + seed, nodes=budget + 1)
        # make the target follow the best draft at depth 1 so the walk accepts something
        eager = build_tree(new_logits, budget, backend=backend)
        new_target[:, 0] = eager.tokens[:, 0]
        static_logits.copy_(new_logits)
        static_target.copy_(new_target)
        graph.replay()
        torch.cuda.synchronize()
        e_index, e_len, e_bonus = greedy_walk(eager, new_target, backend=backend)
        for name in ("tokens", "parents", "depths", "ancestors", "first_child", "next_sibling", "num_nodes"):
            assert torch.equal(getattr(g_tree, name), getattr(eager, name)), name
        assert torch.equal(g_index, e_index) and torch.equal(g_len, e_len) and torch.equal(g_bonus, e_bonus)
        assert int(e_len.min()) >= 1


def test_cuda_matches_cpu_bitwise(device, backend):
    """Same float32 log-probabilities in, same tree out (log-softmax itself may differ by an ulp per device)."""
    gen = torch.Generator().manual_seed(9)
    logits = torch.randint(0, 3, (16, 15, 2000), generator=gen).float() + torch.randn((16, 15, 2000), generator=gen)
    lp = torch.log_softmax(logits, -1)
    lp[:, 3] = torch.log_softmax(torch.randint(0, 2, (16, 2000), generator=gen).float(), -1)  # heavy ties
    ids = torch.arange(2000).expand(16, 15, 2000)
    on_gpu = build_tree_from_topk(lp.to(device), ids.to(device), 32, backend=backend)
    on_cpu = build_tree_from_topk(lp, ids, 32, backend="torch")
    for name in ("tokens", "parents", "depths", "ancestors", "first_child", "next_sibling", "num_nodes", "scores"):
        assert torch.equal(getattr(on_gpu, name).cpu(), getattr(on_cpu, name)), name


@pytest.mark.parametrize("budget", [8, 16, 32, 64])
def test_backends_agree_on_large_batches(budget, device):
    """The fused Triton kernels and the torch ops give identical trees at serving sizes (same normaliser)."""
    logits, _ = _inputs(device, bsz=32, vocab=151936, seed=budget)
    fast = build_tree(logits, budget, backend="triton")
    lp = torch.log_softmax(logits.float(), -1)  # any log-probs: compare the tree stage on identical inputs
    top = torch.topk(lp, budget, dim=-1)
    a = build_tree_from_topk(top.values, top.indices, budget, backend="triton")
    b = build_tree_from_topk(top.values, top.indices, budget, backend="torch")
    for name in ("tokens", "parents", "depths", "ancestors", "first_child", "next_sibling", "num_nodes", "scores"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    slow = build_tree(logits, budget, backend="torch")
    torch.testing.assert_close(fast.row_max, slow.row_max, rtol=0, atol=0)
    torch.testing.assert_close(fast.row_logsum, slow.row_logsum, rtol=0, atol=1e-5)
