"""The DDTREE worker class: resolution through SGLang, and its overridden methods on CPU tensors (the methods
that need a GPU round - the drafter and target forwards - are exercised by bench/gpu/ only)."""

from __future__ import annotations

import json
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


class StandInAttnBackend:
    """Stand-in for SGLang's hybrid linear-attention backend (GPU-only): records the commit call."""

    def __init__(self):
        self.calls = []

    def update_mamba_state_after_mtp_verify(self, **kwargs):
        self.calls.append(kwargs)


class StandInKVPool:
    """Stand-in for SGLang's KV pool (allocated on the GPU): one tensor, SGLang's move_kv_cache semantics."""

    def __init__(self, kv):
        self.kv = kv
        self.moves = []

    def move_kv_cache(self, tgt_loc, src_loc):  # SGLang's semantics: all reads, then all writes
        self.moves.append((tgt_loc, src_loc))
        self.kv[tgt_loc] = self.kv[src_loc].clone()


def _worker(block_size=5, budget=8):
    from sglang_ddtree.sglang.worker import DDTreeWorker

    worker = object.__new__(DDTreeWorker)  # no GPU: set the attributes the helpers read
    worker.block_size = block_size
    worker.ddtree_budget = budget
    worker.ddtree_num_nodes = budget + 1
    worker._ddtree_capturing = False
    backend = StandInAttnBackend()
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
    arrays = worker._ddtree_verify_inputs(tree, torch.tensor([5, 6]), prefix, 27, req_to_token, pool_rows)
    m = worker.ddtree_num_nodes
    loc = arrays.out_cache_loc
    assert loc.shape == (bs * m,)
    assert sorted(loc.view(bs, m)[0].tolist()) == list(range(3 * 100 + 1000 + 7, 3 * 100 + 1000 + 7 + m))
    assert sorted(loc.view(bs, m)[1].tolist()) == list(range(1 * 100 + 1000 + 20, 1 * 100 + 1000 + 20 + m))
    assert loc.view(bs, m)[:, 0].tolist() == [3 * 100 + 1000 + 7, 1 * 100 + 1000 + 20]  # the root at the prefix
    assert arrays.positions.view(bs, m)[:, 0].tolist() == [7, 20]


@pytest.mark.parametrize("room", [0, 5])
def test_verify_mask_goes_into_the_backends_buffer_when_it_fits(room):
    """The tree cells are written into the full-attention backend's verify-mask buffer (a hybrid backend wraps
    it); a batch whose mask does not fit gets the whole mask built instead."""
    from sglang_ddtree.sglang.verify_input import mask_numel

    worker, backend = _worker()
    bs, m = 2, worker.ddtree_num_nodes
    tree = worker._ddtree_tree_from_hidden(torch.randn(bs * 4, 16), bs, _lm_head(), None, 40)
    prefix = torch.tensor([7, 20])
    need = mask_numel(27, bs, m)
    inner = SimpleNamespace(_verify_mask=SimpleNamespace(buffer=torch.zeros(need + room, dtype=torch.uint8)))
    backend.full_attn_backend = inner
    req_to_token = torch.arange(4 * 100).view(4, 100)
    arrays = worker._ddtree_verify_inputs(tree, torch.tensor([5, 6]), prefix, 27, req_to_token, torch.tensor([3, 1]))
    assert arrays.custom_mask.data_ptr() == inner._verify_mask.buffer.data_ptr()
    inner._verify_mask = SimpleNamespace(buffer=torch.zeros(need - 1, dtype=torch.uint8))
    arrays = worker._ddtree_verify_inputs(tree, torch.tensor([5, 6]), prefix, 27, req_to_token, torch.tensor([3, 1]))
    assert arrays.custom_mask.dtype == torch.bool and arrays.custom_mask.numel() == need


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


def _round_to_accept(bs: int, vocab: int):
    """A worker, a tree from random drafter states, its verify arrays, and target logits that often follow it."""
    worker, _ = _worker()
    gen = torch.Generator().manual_seed(2)
    tree = worker._ddtree_tree_from_hidden(torch.randn(bs * 4, 16, generator=gen), bs, _lm_head(), None, vocab)
    arrays = worker._ddtree_verify_inputs(
        tree, torch.zeros(bs, dtype=torch.long), torch.zeros(bs, dtype=torch.long), 0,
        torch.zeros((bs, 64), dtype=torch.long), torch.arange(bs),
    )
    logits, target = _logits_following(tree, bs, worker.ddtree_num_nodes, vocab, gen)
    return worker, tree, arrays, logits, target


def _accept(worker, tree, arrays, next_token_logits, sampling_info):
    """The walk along the worker's target tokens (``_ddtree_target_tokens``), as its round walks them on CPU."""
    return greedy_walk(tree, worker._ddtree_target_tokens(arrays, next_token_logits, sampling_info))


def test_accept_greedy_and_top_k_one_sampling_agree_with_the_core_walk():
    worker, tree, arrays, logits, target = _round_to_accept(bs := 3, vocab := 40)
    m = worker.ddtree_num_nodes
    ref = greedy_walk(tree, target)
    got = _accept(worker, tree, arrays, logits.view(bs * m, vocab), None)
    assert all(torch.equal(x, y) for x, y in zip(got, ref, strict=True))
    assert int(ref[1].max()) > 0
    sampling = StandInSamplingInfo(
        bs,
        is_all_greedy=False,
        temperatures=torch.full((bs, 1), 0.7),
        top_ks=torch.ones(bs, dtype=torch.int64),  # top-k 1: sampling must reproduce greedy exactly
        top_ps=torch.ones(bs),
    )
    sampled = _accept(worker, tree, arrays, logits.view(bs * m, vocab), sampling)
    assert all(torch.equal(x, y) for x, y in zip(sampled, ref, strict=True))


class StandInSamplingInfo(SimpleNamespace):
    """The attributes of SGLang's SamplingBatchInfo that its DFLASH verify adjustments read."""

    def __init__(self, bs, **fields):
        defaults = dict(is_all_greedy=True, has_custom_logit_processor=False, acc_linear_penalties=None,
                        penalizer_orchestrator=None, grammar_mask=None, logit_bias=None)
        super().__init__(**{**defaults, **fields})
        self._bs = bs

    def __len__(self):
        return self._bs


def test_accept_applies_sglangs_verify_adjustments_to_every_node():
    """logit_bias (one of the adjustments SGLang's DFLASH verify applies) forbids a token the target would pick
    at a node: DDTREE's walk must follow the adjusted logits, at every node (issue 14)."""
    worker, tree, arrays, logits, target = _round_to_accept(bs := 3, vocab := 40)
    m = worker.ddtree_num_nodes
    unbiased = greedy_walk(tree, target)
    b = int(torch.nonzero(unbiased[1] > 0)[0])  # a request that accepts a path: bias its first accepted token away
    banned = int(tree.tokens[b, int(unbiased[0][b, 1]) - 1])
    bias = torch.zeros(bs, vocab)
    bias[b, banned] = -1e4
    adjusted = logits.view(bs * m, vocab).clone() + bias.repeat_interleave(m, dim=0)
    ref = greedy_walk(tree, adjusted.view(bs, m, vocab).argmax(-1))
    info = StandInSamplingInfo(bs, logit_bias=bias)
    got = _accept(worker, tree, arrays, logits.view(bs * m, vocab).clone(), info)
    assert all(torch.equal(x, y) for x, y in zip(got, ref, strict=True))
    assert not torch.equal(got[0][b], unbiased[0][b])  # the banned token is no longer accepted
    others = [i for i in range(bs) if i != b]
    assert torch.equal(got[0][others], unbiased[0][others])  # other requests unaffected


def test_commit_kv_through_the_pool_interface():
    """Without the fused kernel's buffer table, the plan's moves go through the pool's own move_kv_cache; entries
    that move nothing become the padding slot's 0 -> 0."""
    from sglang_ddtree.sglang.commit import CommitPlan

    worker, _ = _worker()
    kv = torch.arange(400, dtype=torch.float)[:, None].repeat(1, 2)
    pool = StandInKVPool(kv)
    plan = CommitPlan(out_tokens=None, commit_lens=None, new_seq_lens=None, hidden_rows=None, last_node=None,
                      move_src=torch.tensor([[-1, 17, 18], [-1, -1, -1]]),
                      move_dst=torch.tensor([[-1, 15, 16], [-1, -1, -1]]))
    worker._ddtree_commit_kv(pool, plan)
    assert pool.kv[15, 0] == 17 and pool.kv[16, 0] == 18 and pool.kv[17, 0] == 17
    assert pool.moves[-1][0].tolist() == [0, 15, 16, 0, 0, 0]  # (destinations, sources) in one call
    assert (pool.kv[:15, 0] == torch.arange(15)).all() and (pool.kv[19:, 0] == torch.arange(19, 400)).all()


def test_mamba_commit_passes_the_last_accepted_node_index():
    worker, backend = _worker()
    batch = SimpleNamespace(mamba_track_indices=None, req_pool_indices=torch.tensor([4, 2]))
    accept_index = torch.tensor([[0, 2, 3, 5, -1], [0, 1, -1, -1, -1]])
    accept_len = torch.tensor([3, 1])
    worker._ddtree_mamba_commit(batch, accept_index, accept_len, torch.tensor([10, 10]), 8)
    (call,) = backend.calls
    assert call["last_correct_step_indices"].tolist() == [5, 1]  # not accept_len [3, 1]
    assert call["mamba_steps_to_track"] is None and call["req_pool_indices"].tolist() == [4, 2]


def test_mamba_commit_after_a_graph_replay_goes_through_the_replaying_runners_backend():
    """A narrower hybrid width replays with a backend of its own (auto_budget.hybrid_width_backend), whose metadata
    holds this step's state slots: the commit must use it, and the model runner's after an eager verify."""
    worker, own = _worker()
    width_backend = StandInAttnBackend()
    worker._target_worker.model_runner.decode_cuda_graph_runner = SimpleNamespace(attn_backend=width_backend)
    batch = SimpleNamespace(mamba_track_indices=None, req_pool_indices=torch.tensor([4]))
    args = (batch, torch.tensor([[0, 1, -1]]), torch.tensor([1]), torch.tensor([10]), 8)
    worker._ddtree_mamba_commit(*args, replayed=True)
    assert len(width_backend.calls) == 1 and own.calls == []
    worker._ddtree_mamba_commit(*args, replayed=False)
    assert len(width_backend.calls) == 1 and len(own.calls) == 1


def test_greedy_head_is_intercepted_only_while_capturing_the_draft():
    from sglang_ddtree.sglang.draft_head import DraftCaptured

    worker, _ = _worker()
    hidden = torch.randn(6, 16)
    worker._ddtree_capturing = True
    with pytest.raises(DraftCaptured) as captured:
        worker._greedy_sample_from_vocab_parallel_head(hidden_states=hidden, lm_head=None)
    assert captured.value.hidden_states is hidden


def _head_worker(monkeypatch, max_bs=4, glue="triton", world=1):
    """A worker whose tree may go into the drafter's graphs: Triton glue (pretended: on CPU build_tree falls back
    to torch), TP 1, graphs up to ``max_bs``, the target's lm_head."""
    worker, _ = _worker(block_size=5, budget=8)
    worker._ddtree_glue = glue
    worker._ddtree_tp_group = SimpleNamespace(world_size=world)
    worker._ddtree_vocab_size = 40
    worker.server_args = SimpleNamespace(cuda_graph_max_bs=max_bs)
    worker.device = "cpu"
    monkeypatch.delenv("SGLANG_DDTREE_TREE_IN_GRAPH", raising=False)  # the default: inside the graphs
    head = _lm_head(seed=4)
    worker._target_worker.model_runner.model = SimpleNamespace(lm_head=head)
    import sglang.srt.runtime_context as runtime_context

    monkeypatch.setattr(runtime_context, "get_exec", lambda: (_ for _ in ()).throw(RuntimeError("no runtime")))
    return worker, head


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"env": "0"}, "SGLANG_DDTREE_TREE_IN_GRAPH=0"),
        ({"glue": "torch"}, "no Triton kernels"),
        ({"world": 2}, "SGLANG_DDTREE_TREE_IN_GRAPH=all gathers inside the graphs"),
        ({"world": 2, "env": "all"}, "no plain vocabulary shards"),
        ({"oracle": "/tmp/oracle.json"}, "test oracle"),
        ({"max_bs": None}, "batch sizes are unknown"),
    ],
)
def test_tree_stays_out_of_the_drafter_graph_where_it_cannot_go(monkeypatch, caplog, change, reason):
    from sglang_ddtree.sglang import testing

    worker, _ = _head_worker(monkeypatch, max_bs=change.get("max_bs", 4), glue=change.get("glue", "triton"),
                             world=change.get("world", 1))
    if "env" in change:
        monkeypatch.setenv("SGLANG_DDTREE_TREE_IN_GRAPH", change["env"])
    monkeypatch.setattr(testing, "ORACLE_FILE", change.get("oracle"))
    with caplog.at_level("INFO", logger="sglang_ddtree.sglang.worker"):
        assert worker._maybe_build_draft_sampler() is None
    assert worker._ddtree_head is None
    assert reason in caplog.text and "outside its CUDA graph" in caplog.text


def test_tensor_parallel_trees_go_into_the_drafter_graph_when_opted_in(monkeypatch):
    """SGLANG_DDTREE_TREE_IN_GRAPH=all at TP > 1 (an lm_head with plain vocabulary shards, as DFLASH's own graph head
    needs): the head is built with the TP group (its gathers are captured, as DFLASH's greedy head's are) and its
    trees carry no full-vocabulary normalisers (tests/sglang/test_tp_group_coordinator.py builds such trees into
    fixed rows across two real ranks)."""
    worker, lm_head = _head_worker(monkeypatch, world=2)
    monkeypatch.setenv("SGLANG_DDTREE_TREE_IN_GRAPH", "all")
    lm_head.shard_indices = SimpleNamespace(num_added_elements=0, org_vocab_start_index=0, num_org_elements=40)
    built = []
    monkeypatch.setattr(worker, "_ddtree_tree_from_hidden", lambda *a, **k: built.append((a, k)))
    head = worker._maybe_build_draft_sampler()
    assert head is worker._ddtree_head and head.max_bs == 4
    head(torch.randn(2 * worker.block_size, 16))
    (args, kwargs), = built
    assert args[3] is worker._ddtree_tp_group and kwargs["out"] is head.buffers
    assert head.tree(2).row_max is None and head.tree(2).row_logsum is None and head.tree(2).tokens.shape == (2, 8)


def test_tree_head_builds_the_eager_tree_into_fixed_rows(monkeypatch):
    """What SGLang captures at the end of the drafter's graph (``make_draft_sampler_capture_hook`` calls the head
    with the block's hidden states [B*S, H]): the tree of block positions 1..S-1, equal to the eager path's, in the
    head's fixed rows; ``out`` (what DFLASH reads after a replay) is the argmax chain, except during a DDTREE round,
    where reading it ends DFLASH's round; a graph wider than the rows is refused."""
    from sglang_ddtree.sglang.draft_head import DraftCaptured

    worker, lm_head = _head_worker(monkeypatch)
    head = worker._maybe_build_draft_sampler()
    assert head is worker._ddtree_head and head.max_bs == 4
    bs, s, hidden_size = 3, worker.block_size, 16
    block_hidden = torch.randn(bs * s, hidden_size, generator=torch.Generator().manual_seed(3))
    head(block_hidden, torch.zeros(bs * s, dtype=torch.long))
    positions_1_on = block_hidden.view(bs, s, -1)[:, 1:].reshape(-1, hidden_size)
    want = worker._ddtree_tree_from_hidden(positions_1_on, bs, lm_head, None, 40)
    got = head.tree(bs)
    for name in ("tokens", "parents", "depths", "ancestors", "scores", "top1_tokens", "row_logsum"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert got.tokens.data_ptr() == head.buffers.tokens.data_ptr()
    assert head.tree(bs) is got and head.tree(2).tokens.shape == (2, 8)  # views made once per batch size
    chain = head.out[: bs * (s - 1)].view(bs, s - 1)
    assert torch.equal(chain, (positions_1_on @ lm_head.weight.t()).argmax(-1).view(bs, s - 1))
    head.in_round = True
    with pytest.raises(DraftCaptured) as captured:
        head.out  # noqa: B018 - the read is the signal
    assert captured.value.hidden_states is None
    with pytest.raises(RuntimeError, match="batch 5 exceeds the tree head's 4 rows"):
        head(torch.randn(5 * s, hidden_size))


def test_round_stops_dflash_at_the_graph_head_and_verifies_its_tree(monkeypatch):
    """After a drafter graph replay DFLASH reads its sampler's ``out``: in a DDTREE round that read ends DFLASH's
    round and the round verifies the tree the head built inside the graph (no hidden states, no eager tree)."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    worker, _ = _head_worker(monkeypatch)
    worker._ddtree_auto = None
    worker._draft_sampler = worker._maybe_build_draft_sampler()
    block_hidden = torch.randn(2 * worker.block_size, 16)

    def dflash_graph_round(self, batch, on_publish=None, grammar_barrier=None):  # DFLASH's draft, graph path
        self._draft_sampler(block_hidden)  # the replayed graph's tail
        self._draft_sampler.out[:8].view(2, 4)
        raise AssertionError("DFLASH's round went on to verify its chain")

    rounds = []
    monkeypatch.setattr(DFlashWorkerV2, "forward_batch_generation", dflash_graph_round)
    def stand_in_round(self, batch, hidden, on_publish, candidate=None, tree=None):
        rounds.append((hidden, tree))

    monkeypatch.setattr(type(worker), "_ddtree_round", stand_in_round)
    mode = SimpleNamespace(is_extend=lambda: False, is_idle=lambda: False)
    batch = SimpleNamespace(forward_mode=mode, is_extend_in_batch=False, has_grammar=False,
                            seq_lens=torch.tensor([3, 4]))
    worker.forward_batch_generation(batch)
    (hidden, tree), = rounds
    assert hidden is None and tree.tokens.shape == (2, 8)
    assert tree.tokens.data_ptr() == worker._ddtree_head.buffers.tokens.data_ptr()
    assert worker._ddtree_head.in_round is False and worker._ddtree_capturing is False


@pytest.mark.parametrize("greedy", [True, False])
def test_a_round_tells_the_auto_budget_whether_its_batch_samples(monkeypatch, greedy):
    """Greedy and sampled rounds keep their own calibration and expectations (auto_budget.KINDS): the round passes
    the batch's ``is_all_greedy`` to ``begin_step`` and verifies the candidate it returns."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    worker, _ = _head_worker(monkeypatch)
    worker._draft_sampler = worker._maybe_build_draft_sampler()
    block_hidden = torch.randn(2 * worker.block_size, 16)

    def dflash_graph_round(self, batch, on_publish=None, grammar_barrier=None):
        self._draft_sampler(block_hidden)
        self._draft_sampler.out[:8].view(2, 4)
        raise AssertionError("DFLASH's round went on to verify its chain")

    calls = []
    worker._ddtree_auto = SimpleNamespace(begin_step=lambda bs, greedy: calls.append((bs, greedy)) or 3,
                                          end_step=lambda: calls.append("end"), interrupt=lambda: None)
    monkeypatch.setattr(DFlashWorkerV2, "forward_batch_generation", dflash_graph_round)
    monkeypatch.setattr(type(worker), "_ddtree_round",
                        lambda self, batch, hidden, on_publish, candidate=None, tree=None: calls.append(candidate))
    mode = SimpleNamespace(is_extend=lambda: False, is_idle=lambda: False)
    batch = SimpleNamespace(forward_mode=mode, is_extend_in_batch=False, has_grammar=False,
                            seq_lens=torch.tensor([3, 4]), sampling_info=SimpleNamespace(is_all_greedy=greedy))
    worker.forward_batch_generation(batch)
    assert calls == [(2, greedy), 3, "end"]


def _stand_in_round(monkeypatch, worker, hidden_size=16, vocab=40):
    """Everything ``_ddtree_round`` reads, on CPU: a batch of 2, the drafter's hidden states, a KV pool, the
    target's forward as a stand-in whose argmax follows each node's first child (the verify input it got is in
    ``seen``), and the drafter-context write captured in ``appended``."""
    from sglang_ddtree.sglang.verify_spec_input import DDTreeVerifyInput

    bs = 2
    head = _lm_head(hidden_size, vocab, seed=4)
    gen = torch.Generator().manual_seed(9)
    draft_hidden = torch.randn(bs * (worker.block_size - 1), hidden_size, generator=gen)
    prefix = torch.tensor([6, 11])
    req_to_token = (torch.arange(3 * 64).view(3, 64) + 1).long()
    pool_rows = torch.tensor([2, 1])
    kv = torch.arange(400, dtype=torch.float)[:, None].repeat(1, 2)
    pool = StandInKVPool(kv)
    root = torch.tensor([11, 12])
    worker._draft_block_ids_buf = torch.stack([root] * worker.block_size, 1)
    worker._draft_block_positions_buf = prefix[:, None] + torch.arange(worker.block_size)[None]
    worker._draft_verify_out_cache_loc_buf = torch.gather(req_to_token[pool_rows], 1,
                                                          worker._draft_block_positions_buf)
    worker._need_mamba_verify_commit = False
    worker.model_runner = SimpleNamespace(
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
        model_config=SimpleNamespace(vocab_size=vocab, context_len=64),
        token_to_kv_pool=pool,
    )
    seen = {}

    def stand_in_prepare(self, batch, target_worker, defer_metadata_init=False):
        seen["verify_input"] = self
        seen["verify_lens"] = (batch.seq_lens_cpu.tolist(), batch.seq_lens_sum)
        return SimpleNamespace(), False

    def stand_in_target_forward(batch=None, forward_batch=None, is_verify=False, skip_attn_backend_init=None):
        vi = seen["verify_input"]
        m = vi.draft_token_num
        tokens = vi.draft_token.view(bs, m)
        first_child = vi.retrieve_next_token
        follow = torch.where(first_child >= 0, torch.gather(tokens, 1, first_child.clamp(min=0)), 3)
        logits = torch.full((bs, m, vocab), -5.0)
        logits.scatter_(2, follow[..., None], 5.0)
        hidden = torch.arange(bs * m, dtype=torch.float)[:, None].repeat(1, 3)  # row id as the hidden state
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits.view(bs * m, vocab),
                                                             hidden_states=hidden), can_run_cuda_graph=True)

    appended = {}

    def stand_in_append(**kwargs):
        appended.update(kwargs)

    monkeypatch.setattr(DDTreeVerifyInput, "prepare_for_verify", stand_in_prepare)
    worker._target_worker = SimpleNamespace(
        model_runner=SimpleNamespace(model=SimpleNamespace(lm_head=head), attn_backend=None),
        forward_batch_generation=stand_in_target_forward,
    )
    worker._append_target_hidden_to_draft_kv_by_loc = stand_in_append

    def new_batch():
        return SimpleNamespace(seq_lens=prefix.clone(), seq_lens_cpu=prefix.clone(), seq_lens_sum=int(prefix.sum()),
                               req_pool_indices=pool_rows, spec_info=SimpleNamespace(), sampling_info=None,
                               out_cache_loc=None, mamba_track_indices=None)

    return SimpleNamespace(bs=bs, head=head, draft_hidden=draft_hidden, prefix=prefix, req_to_token=req_to_token,
                           pool_rows=pool_rows, pool=pool, root=root, seen=seen, appended=appended,
                           new_batch=new_batch)


def _assert_round_committed(worker, r, batch, result, tree):
    """The round emitted ``tree``'s greedy path under the stand-in target, moved its KV to positions
    prefix..prefix+accept_len and wrote the accepted nodes' hidden states as the drafter's context."""
    bs, m, prefix, root = r.bs, tree.budget + 1, r.prefix, r.root
    target = torch.where(tree.first_child >= 0,
                         torch.gather(torch.cat([root[:, None], tree.tokens], 1), 1, tree.first_child.clamp(min=0)), 3)
    accept_index, accept_len, bonus = greedy_walk(tree, target)
    assert int(accept_len.min()) >= 1  # the stand-in target accepts the first-child chain
    commit = accept_len + 1
    assert result.accept_lens.tolist() == commit.tolist()
    assert result.new_seq_lens.tolist() == (prefix + commit).tolist()
    out = result.next_token_ids.view(bs, worker.block_size)
    node_tokens = torch.cat([root[:, None], tree.tokens], 1)
    for b in range(bs):
        n = int(accept_len[b])
        assert out[b, :n].tolist() == [int(node_tokens[b, accept_index[b, k]]) for k in range(1, n + 1)]
        assert out[b, n] == bonus[b]
        loc = batch.out_cache_loc.view(bs, m)
        for k in range(n + 1):  # target KV of accepted node accept_index[k] now at position prefix + k
            slot = r.req_to_token[r.pool_rows[b], prefix[b] + k]
            assert r.pool.kv[slot, 0] == loc[b, accept_index[b, k]]
    # drafter context: row k of request b is the hidden state of accepted node accept_index[b, k]
    rows = r.appended["target_hidden"].view(bs, worker.block_size, -1)[..., 0]
    for b in range(bs):
        for k in range(int(accept_len[b]) + 1):
            assert rows[b, k] == b * m + accept_index[b, k]
    assert r.appended["commit_lens"].tolist() == commit.tolist()
    assert torch.equal(r.appended["positions"], worker._draft_block_positions_buf.reshape(-1))
    assert result.speculative_num_draft_tokens == worker.block_size
    # the verify input really carried the tree: positions prefix + depth and the FULL-layout mask
    vi = r.seen["verify_input"]
    assert vi.draft_token_num == m and vi.topk > 1
    assert torch.equal(vi.positions.view(bs, m), prefix[:, None] + tree.positions)
    assert batch.out_cache_loc.numel() == bs * m
    # the verify saw the host lengths of prefix + every verified node; the batch's own are put back after it
    assert r.seen["verify_lens"] == ((prefix + m).tolist(), int(prefix.sum()) + bs * m)
    assert batch.seq_lens_cpu.tolist() == prefix.tolist() and batch.seq_lens_sum == int(prefix.sum())


def test_full_decode_round_glue_with_stand_in_forwards(monkeypatch):
    """``_ddtree_round`` end to end on CPU with stand-ins for the two GPU forwards (the drafter's hidden states
    are given; the target's forward is a stand-in whose argmax follows each node's first child). Checks the
    emitted tokens, lengths, KV moves in the pool, the drafter-context write and the publish callback."""
    worker, _ = _worker(block_size=5, budget=8)
    r = _stand_in_round(monkeypatch, worker)
    published = []
    batch = r.new_batch()

    result = worker._ddtree_round(batch, r.draft_hidden, published.append)

    tree = build_tree((r.draft_hidden @ r.head.weight.t()).view(r.bs, worker.block_size - 1, -1),
                      worker.ddtree_budget)
    _assert_round_committed(worker, r, batch, result, tree)
    assert published[0] is result.new_seq_lens
    # what /get_server_info reports (hooks.scheduler_internal_state_hook): the fixed budget, one tree round
    assert worker.ddtree_budget_state() == {"policy": "fixed", "candidates": ["8"], "steps": 1,
                                            "budget_histogram": {"8": 1}}


def _stand_in_walk_commit(calls):
    """``_triton_glue.walk_commit`` on CPU: the core walk and ``commit_plan``, and the plan's moves applied to
    the StandInKVPool passed as the move table (the kernel's own logic is checked in Triton's interpreter:
    tests/triton_interpreted_check.py, glue/walk-commit)."""
    from sglang_ddtree.sglang.commit import commit_plan

    def walk_commit(parents, tokens, target, depth, slots, out_cache_loc, prefix, table=None):
        calls.append(table)
        bsz, m = parents.shape
        index = torch.full((bsz, depth + 1), -1, dtype=torch.int64)
        length, bonus = torch.zeros(bsz, dtype=torch.int64), torch.zeros(bsz, dtype=torch.int64)
        for b in range(bsz):  # the walk, spelled out: the child whose token is the target's token at the node
            path = [0]
            while len(path) <= depth:
                kids = [i for i in range(1, m) if parents[b, i] == path[-1] and tokens[b, i - 1] == target[b, path[-1]]]
                if not kids:
                    break
                path.append(kids[0])
            index[b, : len(path)] = torch.tensor(path)
            length[b], bonus[b] = len(path) - 1, target[b, path[-1]]
        plan = commit_plan(index, length, bonus, slots, out_cache_loc, tokens, prefix)
        if table is not None:
            table.move_kv_cache(plan.move_dst.clamp(min=0).reshape(-1), plan.move_src.clamp(min=0).reshape(-1))
        return index, length, bonus, vars(plan).copy()

    return walk_commit


@pytest.mark.parametrize(("table_given", "sampled"), [(True, False), (False, False), (True, True)])
def test_round_on_the_triton_glue_walks_commits_and_moves_in_one_call(monkeypatch, table_given, sampled):
    """On the Triton glue a round takes the fused path: one ``walk_commit`` call with the pool's move table gives
    the walk, the plan and the KV moves (the round then moves nothing itself); without a table the round moves the
    KV through the pool. Either way it commits exactly the eager torch round's result. A sampling round (top-k 1
    here: its draws are the argmax) walks the sampled tokens through the same call."""
    from sglang_ddtree.sglang import _triton_glue

    worker, _ = _worker(block_size=5, budget=8)
    r = _stand_in_round(monkeypatch, worker)
    calls = []
    monkeypatch.setattr(_triton_glue, "walk_commit", _stand_in_walk_commit(calls))
    torch_inputs = worker._ddtree_verify_inputs

    def verify_inputs_on_torch(*args):  # the verify arrays from the torch glue (no Triton on the CPU)
        worker._ddtree_glue = "torch"
        try:
            return torch_inputs(*args)
        finally:
            worker._ddtree_glue = "triton"

    worker._ddtree_verify_inputs = verify_inputs_on_torch
    worker._ddtree_glue = "triton"
    table = r.pool if table_given else None  # the stand-in pool plays the buffer table
    worker._ddtree_fused_move_table = lambda pool: table
    own_moves = []
    real_commit = worker._ddtree_commit_kv
    worker._ddtree_commit_kv = lambda pool, plan: (own_moves.append(plan), real_commit(pool, plan))
    batch = r.new_batch()
    if sampled:
        batch.sampling_info = StandInSamplingInfo(r.bs, is_all_greedy=False, temperatures=torch.full((r.bs, 1), 0.7),
                                                  top_ks=torch.ones(r.bs, dtype=torch.int64), top_ps=torch.ones(r.bs))
    result = worker._ddtree_round(batch, r.draft_hidden, None)
    tree = build_tree((r.draft_hidden @ r.head.weight.t()).view(r.bs, worker.block_size - 1, -1),
                      worker.ddtree_budget)
    _assert_round_committed(worker, r, batch, result, tree)
    assert calls == [table]
    assert len(own_moves) == (0 if table_given else 1)


def test_round_from_the_graph_heads_tree_commits_as_the_eager_round(monkeypatch):
    """The same round when the drafter ran as a graph: the tree comes from the head's fixed rows (built from the
    block's hidden states at capture), not from hidden states, and the round commits exactly that tree."""
    worker, _ = _worker(block_size=5, budget=8)
    r = _stand_in_round(monkeypatch, worker)
    from sglang_ddtree.sglang.draft_head import TreeDraftHead

    head = TreeDraftHead(lambda hidden, bs, out: worker._ddtree_tree_from_hidden(hidden, bs, r.head, None, 40, out=out),
                         block_size=worker.block_size, budget=worker.ddtree_budget, max_bs=4, device="cpu")
    block_hidden = torch.cat([torch.zeros(r.bs, 1, 16), r.draft_hidden.view(r.bs, worker.block_size - 1, 16)], 1)
    head(block_hidden.reshape(-1, 16))
    batch = r.new_batch()
    result = worker._ddtree_round(batch, None, None, tree=head.tree(r.bs))
    tree = build_tree((r.draft_hidden @ r.head.weight.t()).view(r.bs, worker.block_size - 1, -1),
                      worker.ddtree_budget)
    _assert_round_committed(worker, r, batch, result, tree)


def test_auto_budget_rounds_verify_the_chosen_candidate_at_its_width_with_its_graphs(monkeypatch):
    """SGLANG_DDTREE_BUDGET=chain,3,8: the first rounds explore the candidates in order (the chain, budget 3, the
    widest 8). Each round verifies exactly that tree (the argmax chain; the widest tree's first 3 nodes; the whole
    tree) at its own width, commits its greedy path, points the target at the graph runner of that width, and
    feeds the calibration; the expectations of every candidate come from the widest tree."""
    from sglang_ddtree.budget import CHAIN, expected_accept_length, tree_prefix
    from sglang_ddtree.sglang.auto_budget import AutoBudget
    from sglang_ddtree.tree import chain_tree

    worker, _ = _worker(block_size=5, budget=8)
    r = _stand_in_round(monkeypatch, worker)
    ticks = iter(range(1000))
    monkeypatch.setenv("SGLANG_DDTREE_STEP_CLOCK", "events")  # each round timed on its own (here the host clock)
    worker._ddtree_auto = AutoBudget((CHAIN, 3, 8), worker.block_size,
                                     torch.device("cpu"), clock=lambda: next(ticks) * 1e-3, sample_every=1)
    worker._ddtree_auto.costs.min_samples = 1
    runners = {5: "graphs of width 5 (the chain)", 4: "graphs of width 4", 9: "graphs of width 9"}
    worker._ddtree_width_runners = runners
    worker._target_worker.model_runner.decode_cuda_graph_runner = runners[9]
    widest = build_tree((r.draft_hidden @ r.head.weight.t()).view(r.bs, worker.block_size - 1, -1), 8)
    for expect_candidate, tree, width in ((CHAIN, chain_tree(widest), 5), (3, tree_prefix(widest, 3), 4),
                                          (8, widest, 9)):
        batch = r.new_batch()
        candidate = worker._ddtree_auto.begin_step(r.bs)
        assert candidate == expect_candidate
        result = worker._ddtree_round(batch, r.draft_hidden, None, candidate)
        worker._ddtree_auto.end_step()
        _assert_round_committed(worker, r, batch, result, tree)
        assert worker._target_worker.model_runner.decode_cuda_graph_runner == runners[width]
    auto = worker._ddtree_auto
    assert auto.total == {CHAIN: 1, 3: 1, 8: 1}
    assert auto.costs.costs(r.bs) == [None, None, None]  # the sweep is priced once its third step's time is read
    for candidate, bs, ms, tag in auto.timer.done():  # as the next step's begin_step does
        auto.costs.record(candidate, bs, ms, tag)
    assert auto.costs.costs(r.bs) == [1.0, 1.0, 1.0]
    # the choice at step 3 read the expectations of step 1 (lagged by two steps; step 1 had no calibration data)
    first = expected_accept_length(widest, (CHAIN, 3, 8)).mean(dim=0)
    assert len(auto.expectations) == 2 and auto.expected == pytest.approx(first.tolist())
    assert float(auto.calibration.predicted.sum()) > 0 and float(auto.calibration.observed.sum()) > 0
    assert "chosen {'chain': 1, '3': 1, '8': 1} over 3 steps" in auto.summary()
    state = worker.ddtree_budget_state()
    assert (state["policy"], state["candidates"], state["steps"]) == ("auto", ["chain", "3", "8"], 3)
    assert state["budget_histogram"] == {"chain": 1, "3": 1, "8": 1}
    assert state["step_ms"] == {f"b<={1 << (r.bs - 1).bit_length()}": {"chain": 1.0, "3": 1.0, "8": 1.0}}
    assert json.loads(json.dumps(state)) == state  # plain JSON, as SGLang sends the internal state


def _cpu_multinomial_with_seed(logprobs, seed, positions):
    """CPU stand-in for SGLang's seeded Gumbel-max draw (its murmur hash runs only on a GPU): the same contract,
    noise keyed by (seed, position, token id)."""
    cols = torch.arange(logprobs.shape[1])
    gen = torch.Generator().manual_seed(0)
    table = torch.rand(1 << 16, generator=gen, dtype=torch.float64)  # fixed noise, indexed by a hash of the key
    key = seed.to(torch.int64)[:, None] * 1_000_003 + positions.to(torch.int64)[:, None] * 7_919 + cols * 104_729
    u = table[(key * 2_654_435_761) % (1 << 16)]
    gumbel = -torch.log(-torch.log(u.clamp(1e-12, 1 - 1e-12)))
    return torch.argmax(logprobs.to(torch.float64) + gumbel, dim=1, keepdim=True)


def test_seeded_sampling_draws_every_node_as_sglangs_sampler_and_walks_those_tokens(monkeypatch):
    """sampling_seed is honoured (issue 13): each node's token is SGLang's own seeded top-k/top-p draw at the
    node's position, so an emitted path is token for token what the same seed gives without speculation; same
    seed, same result. SGLang's hash needs a GPU: its seeded draw is replaced by a CPU stand-in with its contract."""
    from sglang.srt.layers import sampler

    monkeypatch.setattr(sampler, "multinomial_with_seed", _cpu_multinomial_with_seed)
    bs, vocab = 3, 40
    worker, tree, arrays, logits, _ = _round_to_accept(bs, vocab)
    m = worker.ddtree_num_nodes
    logits = logits / 50.0  # a real distribution, not one-hot

    def info(seed):
        return StandInSamplingInfo(
            bs, is_all_greedy=False, temperatures=torch.full((bs, 1), 0.9), top_ks=torch.full((bs,), 30),
            top_ps=torch.full((bs,), 0.95), min_ps=torch.zeros(bs), need_min_p_sampling=False,
            sampling_seed=torch.tensor([seed, seed + 1, seed + 2]),
        )

    got = _accept(worker, tree, arrays, logits.reshape(bs * m, vocab).clone(), info(7))
    probs = torch.softmax(logits.reshape(bs * m, vocab) / 0.9, dim=-1)
    expected = sampler.top_k_top_p_min_p_sampling_from_probs_torch(
        probs, torch.full((bs * m,), 30), torch.full((bs * m,), 0.95), None, False,
        torch.tensor([7, 8, 9]).repeat_interleave(m), arrays.positions,
    ).view(bs, m).to(torch.int64)
    ref = greedy_walk(tree, expected)
    assert all(torch.equal(x, y) for x, y in zip(got, ref, strict=True))
    again = _accept(worker, tree, arrays, logits.reshape(bs * m, vocab).clone(), info(7))
    assert all(torch.equal(x, y) for x, y in zip(again, got, strict=True))
    others = [_accept(worker, tree, arrays, logits.reshape(bs * m, vocab).clone(), info(s))[2] for s in range(20)]
    assert len({tuple(o.tolist()) for o in others}) > 1  # the seed matters


def _warm_worker(auto_candidates=None, mask_dtype=torch.uint8):
    worker, backend = _worker(block_size=5, budget=8)
    worker._ddtree_glue = "triton"
    worker._ddtree_vocab_size = 40
    worker._ddtree_tp_group = None
    worker._ddtree_auto = None if auto_candidates is None else SimpleNamespace(candidates=tuple(auto_candidates))
    worker.device = "cpu"
    worker._target_worker.model_runner.model = SimpleNamespace(lm_head=_lm_head(vocab=48))
    worker._target_worker.model_runner.attn_backend = backend
    if mask_dtype is not None:
        backend._verify_mask = SimpleNamespace(buffer=torch.zeros(4096, dtype=mask_dtype))
    worker.model_runner = SimpleNamespace(
        req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros((2, 8), dtype=torch.int32)),
        token_to_kv_pool=StandInKVPool(torch.zeros(4, 2)),
    )
    return worker


@pytest.mark.parametrize("auto, mask_dtype, candidates", [
    (None, torch.uint8, [8]),
    ((0, 4, 8), torch.bool, [0, 4, 8]),
    (None, None, [8]),
])
def test_glue_warm_up_gets_the_rounds_shapes_and_dtypes(monkeypatch, auto, mask_dtype, candidates):
    """After the graphs, the worker warms the glue for every width it may verify (the fixed budget, or each of
    the auto budget's candidates) with the round's own dtypes: the lm_head's logits and padded rows, req_to_token's
    locations, the backend's mask buffer (none: only the built mask), the move kernel only on a slot-major pool."""
    from sglang_ddtree.sglang import warmup

    seen = {}

    def record(**kwargs):
        seen.update(kwargs)
        return {"widths": [c + 1 for c in kwargs["candidates"]], "seconds": 0.0}

    monkeypatch.setattr(warmup, "warm_round_kernels", record)
    worker = _warm_worker(auto, mask_dtype)
    assert worker._ddtree_warm_glue() == {"widths": [c + 1 for c in candidates], "seconds": 0.0}
    assert seen["candidates"] == candidates and seen["budget"] == 8 and seen["depth"] == 4
    assert (seen["vocab_size"], seen["vocab_rows"], seen["logits_dtype"]) == (40, 48, torch.float32)
    assert seen["index_dtype"] == torch.int32 and seen["mask_dtype"] == mask_dtype
    assert seen["move_kernel"] is False and seen["tp_world"] == 1  # a CPU pool has no fused move table


def test_glue_warm_up_failure_is_logged_and_serving_goes_on(caplog):
    """Triton cannot launch on CPU tensors outside its interpreter: the warm-up's failure is a warning (the
    kernels then compile at their first use, as without it), never an exception out of start-up."""
    worker = _warm_worker()
    with caplog.at_level("WARNING", logger="sglang_ddtree.sglang.worker"):
        assert worker._ddtree_warm_glue() is None
    assert "warm-up failed" in caplog.text and "compile at their first use" in caplog.text
    worker._ddtree_glue = "torch"  # nothing to compile
    assert worker._ddtree_warm_glue() is None


def test_glue_warm_up_runs_the_round_pipeline_on_torch():
    """warm_round_kernels on the torch glue runs the same steps (tree, candidate trees, verify arrays with and
    without a mask buffer, walk, commit plan) for every candidate: its widths are each candidate's budget + 1."""
    from sglang_ddtree.budget import CHAIN
    from sglang_ddtree.sglang.warmup import warm_round_kernels

    done = warm_round_kernels(device=torch.device("cpu"), budget=8, candidates=[CHAIN, 4, 8], depth=4,
                              vocab_size=40, vocab_rows=48, logits_dtype=torch.float32, index_dtype=torch.int32,
                              backend="torch")
    assert done["widths"] == [5, 5, 9]
    done = warm_round_kernels(device=torch.device("cpu"), budget=8, candidates=[8], depth=4, vocab_size=40,
                              vocab_rows=48, logits_dtype=torch.float32, index_dtype=torch.int64, tp_world=4,
                              mask_dtype=None, backend="torch")
    assert done["widths"] == [9]


@pytest.mark.parametrize("flags", [{}, {"need_top_k_sampling": True}, {"need_top_p_sampling": True},
                                   {"need_min_p_sampling": True}])
def test_unfiltered_sampling_skips_the_sort_and_keeps_the_same_probabilities(monkeypatch, flags):
    """A batch that sets no top-k, top-p or min-p (SGLang's host flags all False) gets each node's softmax as it is,
    without the vocabulary sort. The filtering path at top-p 1 gives the same except in the far tail, where its
    float32 cumulative sum passes 1.0 and drops a few tokens (as SGLang's torch sampler does; its default sampler
    skips top-p when no request sets it). With any flag set (or the flags missing) the filtering path runs."""
    from sglang_ddtree.sglang import worker as worker_module

    bs, m, vocab = 2, 3, 50
    logits = torch.randn(bs, m, vocab, generator=torch.Generator().manual_seed(3)) * 3
    no_filter = dict(temperatures=torch.full((bs, 1), 0.8), top_ks=torch.full((bs,), 1 << 30),
                     top_ps=torch.ones(bs), min_ps=torch.zeros(bs))
    sorted_calls = []
    real_sort = torch.sort
    monkeypatch.setattr(torch, "sort", lambda *a, **k: sorted_calls.append(1) or real_sort(*a, **k))
    slow = worker_module._target_probs(logits, SimpleNamespace(**no_filter))  # flags missing: the filtering path
    assert sorted_calls == [1]
    off = dict(need_top_k_sampling=False, need_top_p_sampling=False, need_min_p_sampling=False)
    fast = worker_module._target_probs(logits, SimpleNamespace(**no_filter, **{**off, **flags}))
    assert sorted_calls == ([1] if not flags else [1, 1])
    if not flags:
        assert torch.equal(fast, torch.softmax(logits / torch.full((bs, 1, 1), 0.8), dim=-1))
        kept = slow > 0
        assert torch.equal(fast[kept], slow[kept]) and float(fast[~kept].sum()) < 1e-5
    else:
        assert torch.equal(fast, slow)
    # a request that does filter (top-k 5) is honoured whenever its flag says so
    top5 = {**no_filter, "top_ks": torch.tensor([5, 1 << 30])}
    filtered = worker_module._target_probs(logits, SimpleNamespace(**top5, **{**off, "need_top_k_sampling": True}))
    assert (filtered[0] > 0).sum(-1).tolist() == [5] * m and torch.equal(filtered[1], slow[1])
    assert torch.equal(filtered[0][filtered[0] > 0], fast[0][filtered[0] > 0])


def _renorm_filters(probs, top_k, top_p, min_p):
    """SGLang's flashinfer sampler on a batch with min-p, one row: top-k renormalised, then top-p over that
    (the smallest set of most likely tokens whose mass reaches top_p), renormalised, then min-p."""
    kept = torch.zeros_like(probs)
    order = torch.argsort(probs, descending=True)[:top_k]
    kept[order] = probs[order] / probs[order].sum()
    order = torch.argsort(kept, descending=True)
    before = torch.cumsum(kept[order], 0) - kept[order]
    out = torch.zeros_like(kept)
    out[order[before <= top_p]] = kept[order[before <= top_p]]
    out = out / out.sum()
    return torch.where(out < out.max() * min_p, torch.zeros_like(out), out)


@pytest.mark.parametrize("min_p", [False, True])
def test_min_p_batches_are_filtered_as_the_sampling_backend_filters_them(min_p):
    """With min-p, SGLang's flashinfer sampler renormalises after top-k and after top-p (its torch sampler cuts
    all three over the whole distribution): the tree walk's target probabilities follow the backend the server
    runs. Without min-p both backends cut top-k and top-p jointly, and so does the walk."""
    from sglang_ddtree.sglang import worker as worker_module

    bs, m, vocab = 2, 3, 40
    logits = torch.randn(bs, m, vocab, generator=torch.Generator().manual_seed(5)) * 2
    info = SimpleNamespace(temperatures=torch.ones(bs, 1), top_ks=torch.tensor([6, 12]),
                           top_ps=torch.tensor([0.5, 0.7]), min_ps=torch.tensor([0.1, 0.05]),
                           need_top_k_sampling=True, need_top_p_sampling=True, need_min_p_sampling=min_p)
    joint = worker_module._target_probs(logits, info)
    renorm = worker_module._target_probs(logits, info, min_p_renorms=True)
    if not min_p:
        assert torch.equal(joint, renorm)
        return
    probs = torch.softmax(logits, dim=-1)
    for b in range(bs):
        for j in range(m):
            want = _renorm_filters(probs[b, j], int(info.top_ks[b]), float(info.top_ps[b]), float(info.min_ps[b]))
            got = renorm[b, j] / renorm[b, j].sum()
            assert torch.equal(got > 0, want > 0), (b, j)
            assert torch.allclose(got, want, atol=1e-6)
    # the two filters differ here: top-p over the top-k's own mass keeps fewer tokens
    assert int((joint > 0).sum()) > int((renorm > 0).sum())


@pytest.mark.parametrize(("name", "renorms"), [("flashinfer", True), ("intel_xpu", True), ("pytorch", False),
                                               ("ascend", False)])
def test_the_sampling_backend_is_read_once_at_start_up(monkeypatch, name, renorms):
    """The backend comes from SGLang's runtime context (what its sampler reads), else ServerArgs."""
    from sglang.srt import runtime_context

    from sglang_ddtree.sglang import worker as worker_module

    monkeypatch.setattr(runtime_context, "get_exec", lambda: SimpleNamespace(kernel=SimpleNamespace(
        sampling_backend=name)))
    assert (worker_module.sampling_backend(None) in worker_module.MIN_P_RENORM_BACKENDS) is renorms

    def no_context():
        raise RuntimeError("no runtime context")

    monkeypatch.setattr(runtime_context, "get_exec", no_context)
    assert worker_module.sampling_backend(SimpleNamespace(sampling_backend=name)) == name


def _dflash_round_worker(monkeypatch, *, hybrid=False, buffer_cells=10_000, fails=False):
    """A head worker whose DFLASH round (a stand-in for DFlashWorkerV2's, which needs a GPU) runs the drafter head,
    reads DFLASH's chain from it, and records the graph runner, the mask buffer and the arguments it saw."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    worker, _ = _head_worker(monkeypatch)
    backend = worker._target_worker.model_runner.attn_backend
    worker._draft_sampler = worker._maybe_build_draft_sampler()
    worker._ddtree_glue = "torch"  # the mask write's reference (its Triton kernel: tests/triton_interpreted_check.py)
    worker._need_mamba_verify_commit = hybrid
    block_hidden = torch.randn(2 * worker.block_size, 16, generator=torch.Generator().manual_seed(5))
    model_runner = worker._target_worker.model_runner
    graphs = SimpleNamespace(name="the widest width's graphs")
    model_runner.decode_cuda_graph_runner = graphs
    buffer = torch.full((buffer_cells,), 7, dtype=torch.uint8)  # 7: cells nobody wrote
    backend.full_attn_backend = SimpleNamespace(_verify_mask=SimpleNamespace(buffer=buffer))
    seen = []

    def dflash_round(self, batch, on_publish=None, grammar_barrier=None):
        self._draft_sampler(block_hidden)
        chain = self._draft_sampler.out[:8].view(2, 4)  # outside a tree round: the drafter's argmax chain
        seen.append({"runner": model_runner.decode_cuda_graph_runner, "mask": buffer.clone(), "chain": chain.clone(),
                     "args": (on_publish, grammar_barrier)})
        if fails:
            raise RuntimeError("the round failed")
        return SimpleNamespace(accept_lens=torch.tensor([3, 1], dtype=torch.int32), can_run_cuda_graph=True)

    monkeypatch.setattr(DFlashWorkerV2, "forward_batch_generation", dflash_round)
    monkeypatch.setattr(type(worker), "_ddtree_round", lambda *a, **k: pytest.fail("a tree round ran"))
    widths = []
    monkeypatch.setattr(type(worker), "_ddtree_select_width", lambda self, width: widths.append(width))
    mode = SimpleNamespace(is_extend=lambda: False, is_idle=lambda: False)
    batch = SimpleNamespace(forward_mode=mode, is_extend_in_batch=False, has_grammar=False,
                            seq_lens=torch.tensor([3, 4]), seq_lens_cpu=torch.tensor([3, 4]), spec_info=None,
                            sampling_info=SimpleNamespace(is_all_greedy=True))
    return worker, batch, graphs, seen, widths, buffer


@pytest.mark.parametrize("fails", [False, True])
def test_a_grammar_batch_is_dflashs_round_on_its_widths_graphs_with_the_causal_cells_written(monkeypatch, fails):
    """A grammar batch is verified as DFLASH verifies it (its chain, no tree), on the graphs of DFLASH's width: every
    DDTREE target graph reads the tree-mask buffer, which DFLASH's maskless verify does not fill, so the chain's
    causal cells are written there first (a tree round's mask left there would otherwise be read)."""
    from sglang_ddtree.sglang.verify_input import mask_numel, tree_block_offsets

    worker, batch, graphs, seen, widths, buffer = _dflash_round_worker(monkeypatch, fails=fails)
    batch.has_grammar = True
    interrupts = []
    worker._ddtree_auto = SimpleNamespace(interrupt=lambda: interrupts.append(1),
                                          begin_step=lambda *a, **k: pytest.fail("a grammar batch is no auto step"))
    publish = object()
    if fails:
        with pytest.raises(RuntimeError, match="the round failed"):
            worker.forward_batch_generation(batch, on_publish=publish, grammar_barrier="barrier")
    else:
        assert worker.forward_batch_generation(batch, on_publish=publish, grammar_barrier="barrier").accept_lens \
            .tolist() == [3, 1]
    (got,) = seen
    assert got["runner"] is graphs and widths == [worker.block_size] and got["args"] == (publish, "barrier")
    m = worker.block_size
    cells = got["mask"][tree_block_offsets(batch.seq_lens, m)]
    assert torch.equal(cells.bool(), torch.ones(m, m, dtype=torch.bool).tril().expand(2, m, m))
    touched = torch.zeros_like(buffer, dtype=torch.bool)
    touched[tree_block_offsets(batch.seq_lens, m).reshape(-1)] = True
    assert (got["mask"][~touched] == 7).all() and mask_numel(7, 2, m) <= buffer.numel()  # nothing else written
    assert worker._target_worker.model_runner.decode_cuda_graph_runner is graphs and interrupts == [1]
    assert worker._ddtree_head.in_round is False and worker._ddtree_capturing is False


@pytest.mark.parametrize(("hybrid", "buffer_cells", "fails"), [(True, 10_000, False), (False, 20, False),
                                                               (True, 10_000, True)])
def test_a_dflash_round_runs_without_graphs_where_the_causal_cells_cannot_be_written(monkeypatch, hybrid,
                                                                                      buffer_cells, fails):
    """Hybrid linear-attention targets (their verify graphs also read the tree's parent links) and a mask that does
    not fit the buffer: DFLASH's verify runs with no graph runner; the runner comes back, also when the round fails."""
    worker, batch, graphs, seen, widths, _ = _dflash_round_worker(monkeypatch, hybrid=hybrid,
                                                                  buffer_cells=buffer_cells, fails=fails)
    batch.has_grammar = True
    worker._ddtree_auto = None
    if fails:
        with pytest.raises(RuntimeError, match="the round failed"):
            worker.forward_batch_generation(batch)
    else:
        worker.forward_batch_generation(batch)
    assert seen[0]["runner"] is None and widths == [] and (seen[0]["mask"] == 7).all()
    assert worker._target_worker.model_runner.decode_cuda_graph_runner is graphs


@pytest.mark.parametrize("sampling", [False, True])
@pytest.mark.parametrize("served", [True, False])
def test_an_auto_chain_step_is_dflashs_own_round_and_feeds_the_calibration_on_sampling_steps(monkeypatch, sampling,
                                                                                            served):
    """The auto budget's chain: DFLASH's whole round (draft, verify at its width's graphs, commit: at its cost), timed
    as the step. On a sampling step the drafter's widest tree prices every candidate and DFLASH's accepted lengths
    calibrate the chain: the tree of the drafter's graph (``served``), else one built from the hidden states DFLASH's
    eager greedy head was given."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_ddtree.budget import CHAIN, chain_accepted

    worker, batch, graphs, seen, widths, _ = _dflash_round_worker(monkeypatch)
    hidden = torch.randn(2 * (worker.block_size - 1), 16, generator=torch.Generator().manual_seed(6))
    if not served:  # the drafter ran eagerly: DFLASH's greedy head gets the hidden states (no tree head read)
        def eager_round(self, batch, on_publish=None, grammar_barrier=None):
            self._greedy_sample_from_vocab_parallel_head(hidden_states=hidden, lm_head=None)
            seen.append({"runner": self._target_worker.model_runner.decode_cuda_graph_runner})
            return SimpleNamespace(accept_lens=torch.tensor([3, 1], dtype=torch.int32), can_run_cuda_graph=True)

        monkeypatch.setattr(DFlashWorkerV2, "forward_batch_generation", eager_round)
        monkeypatch.setattr(DFlashWorkerV2, "_greedy_sample_from_vocab_parallel_head", lambda self, **kw: None)
    calls = []
    worker._ddtree_auto = SimpleNamespace(
        begin_step=lambda bs, greedy: calls.append("begin") or CHAIN, end_step=lambda: calls.append("end"),
        interrupt=lambda: None, sampling=sampling,
        expect=lambda tree: calls.append(("expect", tree.budget, tuple(tree.tokens.shape))),
        observe=lambda cand, verified, index, length: calls.append(
            ("observe", cand, verified.budget, chain_accepted(length, verified.budget).sum(1).tolist())),
    )
    worker.forward_batch_generation(batch)
    assert seen[0]["runner"] is graphs and widths == [worker.block_size]
    depth = worker.block_size - 1
    sample = [("expect", worker.ddtree_budget, (2, worker.ddtree_budget)), ("observe", CHAIN, depth, [2, 0])]
    assert calls == ["begin"] + (sample if sampling else []) + ["end"]
    if sampling and not served:  # the same tree the drafter's graph would have built from these hidden states
        assert worker._ddtree_kept_hidden is None
    assert worker._ddtree_keep_hidden is False and worker._ddtree_head.in_round is False


def _sampled(**flags):
    """A sampled batch's sampling_info: no seeds, no filters unless ``flags`` set them."""
    base = {"is_all_greedy": False, "sampling_seed": None, "need_top_k_sampling": False,
            "need_top_p_sampling": False, "need_min_p_sampling": False}
    return SimpleNamespace(**{**base, **flags})


@pytest.mark.parametrize(("hybrid", "oracle", "info", "available", "dflash"), [
    (False, None, None, False, True),
    (False, None, SimpleNamespace(is_all_greedy=True), False, True),
    (False, None, _sampled(), True, True),
    (False, None, _sampled(), False, False),
    (False, None, _sampled(sampling_seed=torch.tensor([1])), True, False),
    (False, None, _sampled(need_top_k_sampling=True), True, True),
    (False, None, _sampled(need_top_p_sampling=True), True, True),
    # DFLASH's verify takes top-p over the renormalised top-k and ignores min-p: not SGLang's sampler's distribution
    (False, None, _sampled(need_top_k_sampling=True, need_top_p_sampling=True), True, False),
    (False, None, _sampled(need_min_p_sampling=True), True, False),
    (False, None, SimpleNamespace(is_all_greedy=False, sampling_seed=None), True, False),  # flags unknown: not DFLASH
    (True, None, SimpleNamespace(is_all_greedy=True), True, False),
    (False, "/tmp/oracle.json", SimpleNamespace(is_all_greedy=True), True, True),
])
def test_which_chain_steps_dflash_verifies(monkeypatch, hybrid, oracle, info, available, dflash):
    """DFLASH's round verifies a chain step where it verifies the chain as the tree walk would: not on hybrid targets,
    not a sampled batch without SGLang's sampling-verify kernel, with seeds, with min-p or with top-k and top-p
    together (the test oracle: its chain is drafted,
    ``test_under_the_oracle_dflashs_round_drafts_the_oracles_chain``)."""
    from sglang_ddtree.sglang import testing

    worker, _ = _worker()
    worker._need_mamba_verify_commit = hybrid
    worker._ddtree_dflash_samples = available
    monkeypatch.setattr(testing, "ORACLE_FILE", oracle)
    assert worker._ddtree_chain_is_dflash(SimpleNamespace(sampling_info=info)) is dflash


def test_under_the_oracle_dflashs_round_drafts_the_oracles_chain(monkeypatch, tmp_path):
    """Test-only (the GPU lossless run's oracle): a chain step run as DFLASH's round drafts the argmax chain of the
    drafter's logits with the oracle's continuation forced in, as the tree of a tree round gets them (so the chain
    is accepted deep and the causal cells are exercised), and only while that round runs."""
    import json

    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_ddtree.sglang import testing

    worker, batch, *_ = _dflash_round_worker(monkeypatch)
    depth = worker.block_size - 1
    prompt, continuation = [5, 6, 7], [11, 12, 13, 14, 15, 16]
    oracle = tmp_path / "oracle.json"
    oracle.write_text(json.dumps({"items": [{"prompt": prompt, "continuation": continuation}], "ranks": [1]}))
    monkeypatch.setattr(testing, "ORACLE_FILE", str(oracle))
    monkeypatch.setattr(testing, "_oracle", None)
    batch.reqs = [SimpleNamespace(origin_input_ids=prompt), SimpleNamespace(origin_input_ids=[9])]
    batch.seq_lens = torch.tensor([3, 2])  # request 0: its prompt; the root (not in the cache yet): continuation[0]
    worker._draft_block_ids_buf = torch.tensor([[11, 0, 0, 0, 0], [3, 0, 0, 0, 0]])
    worker._target_worker.model_runner.model.lm_head.weight = torch.randn(40, 16)
    worker._ddtree_auto = None
    hidden = torch.randn(2 * depth, 16)
    drafted = []

    def eager_round(self, batch, on_publish=None, grammar_barrier=None):
        drafted.append(self._greedy_sample_from_vocab_parallel_head(hidden_states=hidden, lm_head=None))
        return SimpleNamespace(accept_lens=torch.tensor([3, 1], dtype=torch.int32), can_run_cuda_graph=True)

    monkeypatch.setattr(DFlashWorkerV2, "forward_batch_generation", eager_round)
    monkeypatch.setattr(DFlashWorkerV2, "_greedy_sample_from_vocab_parallel_head", lambda self, **kw: "DFLASH's own")
    worker._ddtree_dflash_round(batch, None, None, chain_step=True)
    chain = drafted[0].view(2, depth)
    assert chain[0].tolist() == continuation[1:1 + depth]  # forced at rank 1: the chain is the continuation
    lm = worker._target_worker.model_runner.model.lm_head.weight
    assert chain[1].tolist() == torch.argmax(hidden.view(2, depth, 16)[1] @ lm.t(), -1).tolist()  # unknown prompt
    assert worker._ddtree_oracle_batch is None
    assert worker._greedy_sample_from_vocab_parallel_head(hidden_states=hidden) == "DFLASH's own"  # no round: SGLang's


@pytest.mark.parametrize(("value", "depth"), [(None, None), ("", None), ("0", None), (" 4 ", 4), ("2", 2),
                                              ("1", ValueError), ("four", ValueError), ("-3", ValueError)])
def test_the_glue_ring_option_reads_a_depth_or_refuses_naming_the_fix(value, depth):
    """``SGLANG_DDTREE_GLUE_RING``: unset or 0 allocates each round; d >= 2 reuses d output sets in turn; anything
    else is refused with the variable, what to give and an example."""
    from sglang_ddtree.sglang import worker as worker_module

    if depth is ValueError:
        with pytest.raises(ValueError, match=r"SGLANG_DDTREE_GLUE_RING=.*at least 2.*e\.g\. 4"):
            worker_module.glue_ring_depth(value)
    else:
        assert worker_module.glue_ring_depth(value) == depth
