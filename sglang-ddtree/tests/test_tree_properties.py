"""Structural properties of DraftTree, brute-force optimality, and the greedy walk."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from ddtree_testlib import all_tuples, naive_children, naive_walk

from sglang_ddtree.tree import build_tree, log_softmax_f32
from sglang_ddtree.verify import greedy_walk

SHAPES = [
    # batch, depth, vocab, budget, tie-heavy
    (3, 1, 10, 6, False),
    (3, 4, 10, 20, False),
    (2, 15, 30, 64, False),
    (4, 6, 4, 48, True),
    (2, 15, 3, 64, True),
    (2, 2, 2, 64, True),  # cannot be filled: 2 + 4 = 6 nodes < 64
    (3, 3, 1, 8, False),  # vocabulary of one token: a chain
]


def logits_for(shape, seed):
    bsz, depth, vocab, _, ties = shape
    gen = torch.Generator().manual_seed(seed)
    if ties:
        return torch.randint(0, 2, (bsz, depth, vocab), generator=gen).float()
    return torch.randn((bsz, depth, vocab), generator=gen) * 2


@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_structure(shape, device, backend):
    bsz, depth, vocab, budget, _ = shape
    logits = logits_for(shape, 11).to(device)
    tree = build_tree(logits, budget, backend=backend)
    assert tree.tokens.shape == (bsz, budget) and tree.tokens.dtype == torch.int64
    assert tree.depths.shape == (bsz, budget)
    assert tree.parents.shape == (bsz, budget + 1)
    assert tree.ancestors.shape == (bsz, budget + 1, budget + 1) and tree.ancestors.dtype == torch.bool
    assert tree.first_child.shape == tree.next_sibling.shape == (bsz, budget + 1)
    assert tree.num_nodes.shape == (bsz,)
    assert tree.max_depth == depth
    for t in (tree.tokens, tree.parents, tree.ancestors, tree.num_nodes, tree.scores):
        assert t.device.type == torch.device(device).type
    capacity = sum(min(budget, vocab) ** d for d in range(1, depth + 1))
    for b in range(bsz):
        n = int(tree.num_nodes[b])
        assert n == 1 + min(budget, capacity)
        parents = tree.parents[b].tolist()
        depths = [0, *tree.depths[b].tolist()]
        tokens = tree.tokens[b].tolist()
        assert parents[0] == -1
        for i in range(1, n):
            p = parents[i]
            assert 0 <= p < i, "parent index below child (pop order)"
            assert depths[i] == depths[p] + 1
            assert 1 <= depths[i] <= depth
        for i in range(n, budget + 1):  # padding
            assert parents[i] == -1 and depths[i] == 0 and tokens[i - 1] == 0
        # siblings carry distinct tokens; ranks of siblings are 0..m-1 in index order (prefix closure per parent)
        for kids in naive_children(parents).values():
            assert len({tokens[c - 1] for c in kids}) == len(kids)
            assert [tree.ranks[b, c - 1].item() for c in kids] == list(range(len(kids)))
        # scores: parent score + own log-prob, and non-increasing in pop order
        lp = log_softmax_f32(logits, (tree.row_max, tree.row_logsum))[b].cpu()
        scores = tree.scores[b].tolist()
        for i in range(1, n):
            own = lp[depths[i] - 1, tokens[i - 1]].item()
            assert tree.logprobs[b, i - 1].item() == own
            parent_score = 0.0 if parents[i] == 0 else scores[parents[i] - 1]
            assert scores[i - 1] == parent_score + own
            if i > 1:
                assert scores[i - 1] <= scores[i - 2]


@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_ancestors_and_child_links(shape, device, backend):
    logits = logits_for(shape, 5).to(device)
    tree = build_tree(logits, shape[3], backend=backend)
    size = shape[3] + 1
    for b in range(shape[0]):
        parents = tree.parents[b].tolist()
        n = int(tree.num_nodes[b])
        expected = np.zeros((size, size), dtype=bool)
        for i in range(size):
            j = i
            expected[i, i] = True
            if i < n:
                while j != -1:
                    expected[i, j] = True
                    j = parents[j]
        assert (tree.ancestors[b].cpu().numpy() == expected).all()
        # first_child / next_sibling traversal == naive child map
        kids = naive_children(parents)
        for p in range(size):
            walked = []
            c = tree.first_child[b, p].item()
            while c != -1:
                walked.append(c)
                c = tree.next_sibling[b, c].item()
            assert walked == kids.get(p, [])
        assert tree.next_sibling[b, 0].item() == -1


@pytest.mark.parametrize("seed", range(4))
def test_nesting(seed, device, backend):
    """The tree of budget N is exactly the first N nodes of the tree of budget N+1."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randint(0, 3, (2, 5, 6), generator=gen).float() + torch.randn((2, 5, 6), generator=gen) * 0.3).to(
        device
    )
    prev = build_tree(logits, 1, backend=backend)
    for budget in range(2, 41):
        cur = build_tree(logits, budget, backend=backend)
        n = budget - 1
        assert torch.equal(cur.tokens[:, :n], prev.tokens)
        assert torch.equal(cur.parents[:, : n + 1], prev.parents)
        assert torch.equal(cur.ancestors[:, : n + 1, : n + 1], prev.ancestors)
        prev = cur


@pytest.mark.parametrize(("depth", "vocab", "budget"), [(3, 2, 4), (3, 2, 6), (2, 3, 5), (3, 3, 6), (4, 2, 7)])
@pytest.mark.parametrize("ties", [False, True])
def test_brute_force_optimal_and_ordered(depth, vocab, budget, ties, device, backend):
    """Tiny V and D: (a) the tree equals the top-N of ALL rank tuples under the total order; (b) among all
    prefix-closed node sets of size N, it maximises the sum of path probabilities (expected acceptance)."""
    gen = torch.Generator().manual_seed(depth * 100 + vocab * 10 + budget + int(ties))
    if ties:
        logits = torch.randint(0, 2, (1, depth, vocab), generator=gen).float()
    else:
        logits = torch.randn((1, depth, vocab), generator=gen)
    tree = build_tree(logits.to(device), budget, backend=backend)
    lp = log_softmax_f32(logits.to(device), (tree.row_max, tree.row_logsum))[0].cpu().numpy()
    tuples = all_tuples(lp, budget)
    ordered = sorted(tuples, key=lambda st: (-st[0], st[1]))[:budget]
    got_scores = tree.scores[0, : len(ordered)].tolist()
    assert got_scores == [s for s, _ in ordered]
    assert tree.ranks[0, : len(ordered)].tolist() == [t[-1] for _, t in ordered]
    assert tree.depths[0, : len(ordered)].tolist() == [len(t) for _, t in ordered]
    # optimality over prefix-closed sets
    score = {t: s for s, t in tuples}
    best = max(sum(math.exp(score[t]) for t in chosen) for chosen in prefix_closed_sets(list(score), budget))
    mine = sum(math.exp(s) for s in got_scores)
    assert mine == pytest.approx(best, rel=1e-12)


def prefix_closed_sets(tuples, size):
    """Every prefix-closed set of `size` rank tuples (or of all tuples if fewer), by recursion."""
    order = sorted(tuples, key=lambda t: (len(t), t))
    size = min(size, len(order))
    out = []

    def rec(i, chosen):
        if len(chosen) == size:
            out.append(frozenset(chosen))
            return
        if len(order) - i < size - len(chosen):
            return
        t = order[i]
        if len(t) == 1 or t[:-1] in chosen:
            chosen.add(t)
            rec(i + 1, chosen)
            chosen.remove(t)
        rec(i + 1, chosen)

    rec(0, set())
    return out


def random_targets(tree, vocab, gen, follow_prob=0.8):
    """Target tokens that often follow an existing child (deep acceptance) and sometimes do not."""
    bsz, nodes = tree.parents.shape
    target = torch.randint(0, vocab, (bsz, nodes), generator=gen)
    for b in range(bsz):
        kids = naive_children(tree.parents[b].tolist())
        for p, cs in kids.items():
            if torch.rand((), generator=gen).item() < follow_prob:
                pick = cs[int(torch.randint(0, len(cs), (), generator=gen))]
                target[b, p] = tree.tokens[b, pick - 1]
    return target


@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
@pytest.mark.parametrize("follow", [0.0, 0.8, 1.0])
def test_greedy_walk_is_longest_matching_path(shape, follow, device, backend):
    bsz, depth, vocab, budget, _ = shape
    gen = torch.Generator().manual_seed(int(follow * 10) + budget)
    tree = build_tree(logits_for(shape, 3).to(device), budget, backend=backend)
    tree_cpu_tokens = tree.tokens.cpu()
    lengths = []
    for _ in range(3):
        target = random_targets(tree, vocab, gen, follow)
        accept_index, accept_len, bonus = greedy_walk(tree, target.to(device), backend=backend)
        assert accept_index.shape == (bsz, depth + 1)
        for b in range(bsz):
            path, bonus_ref = naive_walk(tree_cpu_tokens[b].tolist(), tree.parents[b].tolist(), target[b].tolist())
            assert accept_len[b].item() == len(path) - 1
            assert accept_index[b].tolist() == path + [-1] * (depth + 1 - len(path))
            assert bonus[b].item() == bonus_ref
            lengths.append(len(path) - 1)
    if follow == 1.0 and vocab > 1:
        assert max(lengths) >= 1


def test_greedy_walk_full_depth_chain(device, backend):
    """A one-token vocabulary gives a chain; a target that agrees accepts all D nodes."""
    logits = torch.zeros((2, 5, 1), device=device)
    tree = build_tree(logits, 5, backend=backend)
    target = torch.zeros((2, 6), dtype=torch.long, device=device)
    accept_index, accept_len, bonus = greedy_walk(tree, target, backend=backend)
    assert accept_len.tolist() == [5, 5]
    assert accept_index.tolist() == [[0, 1, 2, 3, 4, 5]] * 2
    assert bonus.tolist() == [0, 0]


def test_greedy_walk_rejects_bad_shape(device, backend):
    tree = build_tree(torch.zeros((1, 2, 3), device=device), 4, backend=backend)
    with pytest.raises(ValueError, match=r"target_tokens must have shape \[B, N\+1\]"):
        greedy_walk(tree, torch.zeros((1, 4), dtype=torch.long, device=device), backend=backend)
