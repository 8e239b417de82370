"""The sampling walk is exactly lossless: emitted sequences follow the target's own distribution."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import fields, replace

import pytest
import torch
from ddtree_testlib import chi2_test, naive_children

from sglang_ddtree.tree import build_tree
from sglang_ddtree.verify import greedy_walk, race_tokens, sample_tokens, sampling_walk

VOCAB = 4
SAMPLES = 40_000


def setup_tree(seed: int, device):
    gen = torch.Generator().manual_seed(seed)
    draft_logits = torch.randn((1, 3, VOCAB), generator=gen) * 2
    tree1 = build_tree(draft_logits, 7, backend="torch")  # the same tree on every device (checked below)
    # target distributions at every node; some zero entries so "impossible" outcomes exist
    torch.manual_seed(seed)
    probs = torch.distributions.Dirichlet(torch.full((VOCAB,), 4.0)).sample((1, 8))
    probs[0, 2, 3] = 0.0
    probs = probs / probs.sum(-1, keepdim=True)
    return draft_logits.to(device), tree1, probs.to(torch.float64)


def exact_distribution(tree, probs) -> dict[tuple[int, ...], float]:
    """P(emitted tokens) by enumeration: follow every target token; stop at the first non-child (the bonus)."""
    tokens = tree.tokens[0].tolist()
    kids = naive_children(tree.parents[0].tolist())
    child_of = {p: {tokens[c - 1]: c for c in cs} for p, cs in kids.items()}
    out: dict[tuple[int, ...], float] = {}

    def rec(node, prefix, prob):
        for y in range(VOCAB):
            p = prob * probs[0, node, y].item()
            if p == 0.0:
                continue
            if y in child_of.get(node, {}):
                rec(child_of[node][y], (*prefix, y), p)
            else:
                out[(*prefix, y)] = out.get((*prefix, y), 0.0) + p

    rec(0, (), 1.0)
    return out


def library_samples(draft_logits, probs, seed, device, backend):
    one = build_tree(draft_logits, 7, backend="torch")
    tree = replace(
        one,
        **{
            f.name: getattr(one, f.name).expand(SAMPLES, *getattr(one, f.name).shape[1:])
            for f in fields(one)
            if torch.is_tensor(getattr(one, f.name))
        },
    )
    gen = torch.Generator().manual_seed(seed)
    uniforms = torch.rand((SAMPLES, 8), generator=gen, dtype=torch.float64).to(device)
    accept_index, accept_len, bonus = sampling_walk(
        tree, probs.to(device).expand(SAMPLES, -1, -1), uniforms, backend=backend
    )
    tokens = tree.tokens.cpu()
    counts: Counter = Counter()
    for idx, n, y in zip(accept_index.cpu().tolist(), accept_len.cpu().tolist(), bonus.cpu().tolist(), strict=True):
        counts[(*(tokens[0, i - 1].item() for i in idx[1 : n + 1]), y)] += 1
    return counts


def sequential_samples(tree, probs, seed, renormalise: bool, residual_bonus: bool):
    """The textbook multi-candidate scheme (children tried in order), with optional deliberate bugs."""
    rng = random.Random(seed)
    tokens = tree.tokens[0].tolist()
    kids = naive_children(tree.parents[0].tolist())
    counts: Counter = Counter()
    p_all = probs[0].tolist()
    for _ in range(SAMPLES):
        node, emitted = 0, []
        while True:
            p_res = list(p_all[node])
            moved = False
            for c in kids.get(node, []):
                x = tokens[c - 1]
                total = sum(p_res)
                accept_p = p_res[x] / total if renormalise else p_all[node][x]
                if rng.random() < accept_p:
                    emitted.append(x)
                    node, moved = c, True
                    break
                p_res[x] = 0.0
            if moved:
                continue
            weights = p_res if residual_bonus else p_all[node]
            y = rng.choices(range(VOCAB), weights=weights)[0]
            emitted.append(y)
            break
        counts[tuple(emitted)] += 1
    return counts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampling_walk_matches_target_distribution(seed, device, backend):
    draft_logits, tree, probs = setup_tree(seed, device)
    expected = exact_distribution(tree, probs)
    assert sum(expected.values()) == pytest.approx(1.0)
    counts = library_samples(draft_logits, probs, seed + 100, device, backend)
    assert chi2_test(counts, expected) > 1e-3
    # the distribution has mass beyond depth 1, so deep acceptance is exercised
    assert any(len(k) >= 3 for k in counts)


@pytest.mark.parametrize("seed", [0, 1])
def test_chi_square_check_has_power(seed):
    """The same check accepts the correct sequential scheme and rejects two classic mistakes."""
    _, tree, probs = setup_tree(seed, "cpu")
    expected = exact_distribution(tree, probs)
    good = sequential_samples(tree, probs, seed, renormalise=True, residual_bonus=True)
    assert chi2_test(good, expected) > 1e-3
    no_renorm = sequential_samples(tree, probs, seed, renormalise=False, residual_bonus=True)
    assert chi2_test(no_renorm, expected) < 1e-6
    full_bonus = sequential_samples(tree, probs, seed, renormalise=True, residual_bonus=False)
    assert chi2_test(full_bonus, expected) < 1e-6


def test_point_mass_sampling_equals_greedy(device, backend):
    gen = torch.Generator().manual_seed(4)
    tree = build_tree(torch.randn((3, 4, 6), generator=gen).to(device), 10)
    target = torch.randint(0, 6, (3, 11), generator=gen)
    # make the target follow the tree sometimes
    target[:, 0] = tree.tokens[:, 0].cpu()
    probs = torch.nn.functional.one_hot(target, 6).to(torch.float64).to(device)
    uniforms = torch.rand((3, 11), generator=gen, dtype=torch.float64).to(device)
    got = sampling_walk(tree, probs, uniforms, backend=backend)
    want = greedy_walk(tree, target.to(device), backend="torch")
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_sample_tokens_edges(device):
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]] * 4, dtype=torch.float64, device=device)
    u = torch.tensor([0.0, 0.49999, 0.5, 1.0 - 1e-17], dtype=torch.float64, device=device)
    assert sample_tokens(probs, u).tolist() == [1, 1, 3, 3]
    # unnormalised weights and float32 inputs
    w = torch.tensor([[2.0, 0.0, 6.0]], device=device)
    assert sample_tokens(w, torch.tensor([0.3], device=device)).tolist() == [2]
    assert sample_tokens(w, torch.tensor([0.2], device=device)).tolist() == [0]


def test_race_tokens_draw_each_row_from_its_weights(device):
    """The exponential race the worker samples every node with: each row's draws follow its (unnormalised) weights
    (chi-square against the exact distribution, fixed seed), a weight of 0 is never drawn, and a row with a single
    positive weight always draws it."""
    gen = torch.Generator(device=device).manual_seed(11)
    weights = torch.tensor([[1.0, 2.0, 0.0, 3.0, 4.0], [0.0, 0.0, 5.0, 0.0, 0.0], [0.1, 0.1, 0.1, 0.1, 9.6]],
                           device=device)
    draws = race_tokens(weights.unsqueeze(0).expand(SAMPLES, 3, 5), generator=gen)
    assert draws.shape == (SAMPLES, 3) and draws.dtype == torch.int64
    assert (draws[:, 0] != 2).all() and (draws[:, 1] == 2).all()
    for row in (0, 2):
        counts = Counter(draws[:, row].tolist())
        exact = {t: float(w) / float(weights[row].sum()) for t, w in enumerate(weights[row].tolist())}
        assert chi2_test(counts, exact) > 1e-3, (row, counts)


def test_sampling_walk_rejects_bad_shapes(device):
    tree = build_tree(torch.zeros((1, 2, 3), device=device), 4)
    with pytest.raises(ValueError, match="target_probs must have shape"):
        sampling_walk(tree, torch.ones((1, 4, 3), device=device), torch.zeros((1, 5), device=device))
    with pytest.raises(ValueError, match="uniforms must have shape"):
        sampling_walk(tree, torch.ones((1, 5, 3), device=device), torch.zeros((1, 4), device=device))
