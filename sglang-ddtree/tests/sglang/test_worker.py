"""The DDTREE worker class: resolution through SGLang, and its overridden methods on CPU tensors (the methods
that need a GPU round - the drafter and target forwards - are exercised by bench/gpu/ only)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang_ddtree.tree import build_tree
from sglang_ddtree.verify import greedy_walk


@pytest.fixture(autouse=True)
def _plugin(plugins_loaded):
    return plugins_loaded


def test_worker_class_resolves_through_sglang(model_dirs):
    from _resolve import base_argv
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang_ddtree.sglang.worker import DDTreeWorker

    server_args = prepare_server_args(base_argv(model_dirs, "DDTREE"))
    cls = SpeculativeAlgorithm.from_string("DDTREE").create_worker(server_args)
    assert cls is DDTreeWorker and issubclass(cls, DFlashWorkerV2)
    assert SpeculativeAlgorithm.from_string("DFLASH").create_worker(server_args) is DFlashWorkerV2
    for name in ("forward_batch_generation", "_greedy_sample_from_vocab_parallel_head", "_maybe_build_draft_sampler"):
        assert name in DDTreeWorker.__dict__ and hasattr(DFlashWorkerV2, name)  # overrides of real methods


class FakeAttnBackend:
    def __init__(self):
        self.calls = []

    def update_mamba_state_after_mtp_verify(self, **kwargs):
        self.calls.append(kwargs)


class FakeKVPool:
    def __init__(self, kv):
        self.kv = kv

    def move_kv_cache(self, tgt_loc, src_loc):  # SGLang's semantics: all reads, then all writes
        self.kv[tgt_loc] = self.kv[src_loc].clone()


def _worker(block_size=5, budget=8):
    from sglang_ddtree.sglang.worker import DDTreeWorker

    worker = object.__new__(DDTreeWorker)  # no GPU: set the attributes the helpers read
    worker.block_size = block_size
    worker.ddtree_budget = budget
    worker.ddtree_num_nodes = budget + 1
    worker._ddtree_capturing = False
    backend = FakeAttnBackend()
    worker._target_worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=backend, model="model"))
    return worker, backend


def _lm_head(hidden=16, vocab=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return SimpleNamespace(weight=torch.randn(vocab, hidden, generator=gen))


def test_tree_from_drafter_hidden_states_uses_the_target_head():
    worker, _ = _worker()
    bs, depth, hidden = 3, worker.block_size - 1, 16
    head = _lm_head()
    draft_hidden = torch.randn(bs * depth, hidden, generator=torch.Generator().manual_seed(1))
    tree = worker._ddtree_tree_from_hidden(draft_hidden, bs, head, None, vocab_size=40)
    ref = build_tree((draft_hidden @ head.weight.t()).view(bs, depth, -1), worker.ddtree_budget)
    assert torch.equal(tree.tokens, ref.tokens) and torch.equal(tree.parents, ref.parents)
    assert tree.max_depth == depth


def test_verify_inputs_take_the_slots_of_positions_prefix_to_prefix_plus_n():
    worker, _ = _worker()
    bs = 2
    head = _lm_head()
    tree = worker._ddtree_tree_from_hidden(torch.randn(bs * 4, 16), bs, head, None, 40)
    req_to_token = torch.arange(4 * 100).view(4, 100) + 1000
    pool_rows = torch.tensor([3, 1])
    prefix = torch.tensor([7, 20])
    arrays, loc = worker._ddtree_verify_inputs(tree, torch.tensor([5, 6]), prefix, 27, req_to_token, pool_rows)
    m = worker.ddtree_num_nodes
    assert loc.shape == (bs * m,)
    assert loc.view(bs, m)[0].tolist() == list(range(3 * 100 + 1000 + 7, 3 * 100 + 1000 + 7 + m))
    assert loc.view(bs, m)[1].tolist() == list(range(1 * 100 + 1000 + 20, 1 * 100 + 1000 + 20 + m))
    assert arrays.positions.view(bs, m)[:, 0].tolist() == [7, 20]


def _logits_following(tree, bs, m, vocab, gen):
    """Target logits whose argmax at each node is often the token of one of its children."""
    target = torch.randint(0, vocab, (bs, m), generator=gen)
    for b in range(bs):
        for i in range(m):
            kids = [j for j in range(1, m) if int(tree.parents[b, j]) == i]
            if kids and torch.rand((), generator=gen) < 0.85:
                target[b, i] = tree.tokens[b, kids[0] - 1]
    logits = torch.randn(bs, m, vocab, generator=gen)
    logits.scatter_(2, target[..., None], 50.0)
    return logits, target


def test_accept_greedy_and_top_k_one_sampling_agree_with_the_core_walk():
    worker, _ = _worker()
    bs, vocab = 3, 40
    gen = torch.Generator().manual_seed(2)
    tree = worker._ddtree_tree_from_hidden(torch.randn(bs * 4, 16, generator=gen), bs, _lm_head(), None, vocab)
    m = worker.ddtree_num_nodes
    arrays, _ = worker._ddtree_verify_inputs(
        tree, torch.zeros(bs, dtype=torch.long), torch.zeros(bs, dtype=torch.long), 0,
        torch.zeros((bs, 64), dtype=torch.long), torch.arange(bs),
    )
    logits, target = _logits_following(tree, bs, m, vocab, gen)
    ref = greedy_walk(tree, target)
    got = worker._ddtree_accept(tree, arrays, logits.view(bs * m, vocab), None)
    assert all(torch.equal(x, y) for x, y in zip(got, ref, strict=True))
    assert int(ref[1].max()) > 0
    sampling = SimpleNamespace(
        is_all_greedy=False,
        temperatures=torch.full((bs, 1), 0.7),
        top_ks=torch.ones(bs, dtype=torch.int64),  # top-k 1: sampling must reproduce greedy exactly
        top_ps=torch.ones(bs),
    )
    sampled = worker._ddtree_accept(tree, arrays, logits.view(bs * m, vocab), sampling)
    assert all(torch.equal(x, y) for x, y in zip(sampled, ref, strict=True))


@pytest.mark.parametrize("page_size", [1, 4])
def test_commit_kv_through_the_pool_interface(page_size):
    worker, _ = _worker()
    accept_index = torch.tensor([[0, 2, 5, -1, -1], [0, -1, -1, -1, -1]])
    accept_len = torch.tensor([2, 0])
    req_to_token = torch.zeros((2, 32), dtype=torch.long)
    req_to_token[0, :24] = torch.arange(24) + page_size * 10
    req_to_token[1, :24] = torch.arange(24) + page_size * 10 + 100
    kv = torch.arange(400, dtype=torch.float)[:, None].repeat(1, 2)
    pool = FakeKVPool(kv)
    prefix = torch.tensor([4, 9])
    worker._ddtree_commit_kv(pool, req_to_token, torch.tensor([0, 1]), prefix, accept_index, accept_len)
    row = req_to_token[0]
    assert pool.kv[row[4], 0] == row[4]  # root stays
    assert pool.kv[row[5], 0] == row[4 + 2]  # depth 1 <- node 2
    assert pool.kv[row[6], 0] == row[4 + 5]  # depth 2 <- node 5
    assert pool.kv[req_to_token[1, 9], 0] == req_to_token[1, 9]


def test_mamba_commit_passes_the_last_accepted_node_index():
    worker, backend = _worker()
    batch = SimpleNamespace(mamba_track_indices=None, req_pool_indices=torch.tensor([4, 2]))
    accept_index = torch.tensor([[0, 2, 3, 5, -1], [0, 1, -1, -1, -1]])
    accept_len = torch.tensor([3, 1])
    worker._ddtree_mamba_commit(batch, accept_index, accept_len, torch.tensor([10, 10]), 8)
    (call,) = backend.calls
    assert call["last_correct_step_indices"].tolist() == [5, 1]  # not accept_len [3, 1]
    assert call["mamba_steps_to_track"] is None and call["req_pool_indices"].tolist() == [4, 2]


def test_greedy_head_is_intercepted_only_while_capturing_the_draft():
    from sglang_ddtree.sglang.worker import _DraftCaptured

    worker, _ = _worker()
    hidden = torch.randn(6, 16)
    worker._ddtree_capturing = True
    with pytest.raises(_DraftCaptured) as captured:
        worker._greedy_sample_from_vocab_parallel_head(hidden_states=hidden, lm_head=None)
    assert captured.value.hidden_states is hidden
    assert worker._maybe_build_draft_sampler() is None
