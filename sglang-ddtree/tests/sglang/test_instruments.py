"""The GPU suite's test-only instruments (sglang_ddtree.sglang.testing) on CPU: the forced-branch oracle puts
the target's continuation where the issue asks (deep, under non-first siblings), and the counters count right."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from sglang_ddtree.sglang import testing
from sglang_ddtree.tree import build_tree
from sglang_ddtree.verify import greedy_walk

V, D = 500, 7
PATTERN = [1, 1, 1, 2, 1, 1, 3]  # the rank pattern bench/gpu/lossless.py uses


@pytest.mark.parametrize("rank", [1, 2, 3, 5])
def test_forced_token_gets_its_rank_with_junk_above(rank):
    logits = torch.randn(2, D, V)
    tokens = torch.randint(0, V, (2, D))
    tokens[1, 3:] = -1  # unknown: the drafter's own logits stay
    ranks = torch.full((2, D), rank)
    forced = testing.forced_draft_logits(logits, tokens, ranks)
    order = forced.argsort(dim=-1, descending=True)
    for d in range(D):
        assert int(order[0, d, rank - 1]) == int(tokens[0, d])
        assert int(tokens[0, d]) not in order[0, d, : rank - 1].tolist()
    assert torch.equal(forced[1, 3:], logits[1, 3:])
    assert not torch.equal(forced[1, :3], logits[1, :3])


def _oracle_walk(budget: int, position: int):
    """Tree from forced logits; the target's argmax at every node is the oracle path's next token."""
    tokens = torch.randint(5, V, (1, D), generator=torch.Generator().manual_seed(position))
    ranks = torch.tensor([[PATTERN[(position + d + 1) % len(PATTERN)] for d in range(D)]])
    tree = build_tree(testing.forced_draft_logits(torch.randn(1, D, V), tokens, ranks), budget)
    # target: after the root, node i's next token is the oracle's token at depth(i) + 1
    depth = torch.cat([torch.zeros(1, 1, dtype=torch.int64), tree.depths], dim=1)
    nxt = torch.cat([tokens, torch.zeros(1, 1, dtype=torch.int64)], dim=1)
    target = torch.gather(nxt, 1, depth)
    accept_index, accept_len, _ = greedy_walk(tree, target)
    return tree, accept_index, accept_len


@pytest.mark.parametrize("budget", [4, 8, 16])
def test_pattern_forces_deep_acceptance_through_nonfirst_siblings(budget):
    """What the GPU run must show (issue 13): accepted depth >= 3 and accepted non-first siblings, per budget."""
    depths, nonfirst = [], []
    for position in range(14):
        tree, accept_index, accept_len = _oracle_walk(budget, position)
        depths.append(int(accept_len[0]))
        nonfirst.append(int(testing.nonfirst_accepts(tree, accept_index, accept_len)[0]))
    assert max(depths) >= 3 and sum(nonfirst) > 0, (depths, nonfirst)


def test_nonfirst_accepts_counts_only_accepted_nodes_off_the_first_child():
    # root 0 -> children 1 (first), 2 (second); node 2 -> child 3 (first of 2)
    tree = SimpleNamespace(
        parents=torch.tensor([[-1, 0, 0, 2]]), first_child=torch.tensor([[1, -1, 3, -1]]),
    )
    path = torch.tensor([[0, 2, 3, -1]])
    assert testing.nonfirst_accepts(tree, path, torch.tensor([2])).tolist() == [1]
    assert testing.nonfirst_accepts(tree, torch.tensor([[0, 1, -1, -1]]), torch.tensor([1])).tolist() == [0]
    assert testing.nonfirst_accepts(tree, path, torch.tensor([0])).tolist() == [0]  # nothing accepted


def test_oracle_tokens_follow_each_request_from_its_root(tmp_path, monkeypatch):
    prompt = [7, 8, 9]
    cont = [20, 21, 22, 23, 24, 25]
    path = tmp_path / "oracle.json"
    path.write_text(json.dumps({"items": [{"prompt": prompt, "continuation": cont}], "ranks": [1, 2]}))
    monkeypatch.setattr(testing, "ORACLE_FILE", str(path))
    monkeypatch.setattr(testing, "_oracle", None)
    monkeypatch.setattr(testing, "_round", 0)
    reqs = [SimpleNamespace(origin_input_ids=prompt), SimpleNamespace(origin_input_ids=[1, 2]),
            SimpleNamespace(origin_input_ids=prompt)]
    # request 0: root = cont[2] at position 5; request 1 unknown prompt; request 2: root does not match
    tokens, ranks = testing.oracle_tokens(reqs, torch.tensor([5, 9, 4]), torch.tensor([22, 3, 99]), 4)
    assert tokens.tolist() == [[23, 24, 25, -1], [-1] * 4, [-1] * 4]
    assert ranks[0].tolist() == [2, 1, 2, 1] and ranks[1].tolist() == [1, 2, 1, 2]  # (round + request + d) % 2
    _, again = testing.oracle_tokens(reqs, torch.tensor([5, 9, 4]), torch.tensor([22, 3, 99]), 4)
    assert torch.equal(again[0], ranks[1])  # the next round shifts the pattern


class _VerifyingRunner:
    """Stand-in model runner whose verify reads the recurrent conv state and shifts it in place, as SGLang's
    GatedDeltaNet verify does (causal_conv1d_update)."""

    def __init__(self):
        conv = torch.arange(6.0).view(1, 6)
        self.req_to_token_pool = SimpleNamespace(
            mamba_pool=SimpleNamespace(mamba_cache=SimpleNamespace(conv=[conv], temporal=torch.zeros(2)))
        )
        self.decode_cuda_graph_runner = "graphs"
        self.eager_runner = "eager"
        self.runners_seen = []

    def forward(self, fb):
        self.runners_seen.append(self.decode_cuda_graph_runner)
        conv = self.req_to_token_pool.mamba_pool.mamba_cache.conv[0]
        logits = conv.sum().view(1, 1).repeat(3, 4) + torch.arange(4.0)
        conv.add_(1.0)  # the verify's in-place state update
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits))


@pytest.mark.parametrize("with_snapshot", [True, False])
def test_graph_vs_eager_reruns_from_the_recurrent_state_the_graph_verify_started_from(with_snapshot):
    runner = _VerifyingRunner()
    snapshot = testing.recurrent_state_snapshot(runner)
    assert len(snapshot) == 2  # conv layer + temporal
    graph_logits = runner.forward(SimpleNamespace(forward_metadata_ready=True)).logits_output.next_token_logits
    diff, argmax_diff = testing.graph_vs_eager(runner, SimpleNamespace(forward_metadata_ready=True), graph_logits,
                                               snapshot if with_snapshot else None)
    assert runner.runners_seen[-1] == "eager" and runner.decode_cuda_graph_runner == "graphs"
    assert argmax_diff == 0
    assert (diff == 0.0) is with_snapshot  # without the snapshot the shifted state shows up as a difference


def test_pure_attention_targets_have_no_recurrent_state_to_snapshot():
    assert testing.recurrent_state_snapshot(SimpleNamespace(req_to_token_pool=SimpleNamespace())) == []
