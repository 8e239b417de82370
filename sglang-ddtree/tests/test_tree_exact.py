"""build_tree equals an independent best-first heap, node for node, in pop order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ddtree_testlib import heap_tree

from sglang_ddtree.tree import build_tree, build_tree_from_topk, exact_topk, log_softmax_f32, tree_buffers


def make_logits(kind: str, bsz: int, depth: int, vocab: int, seed: int) -> torch.Tensor:
    """Draft logits of several shapes of difficulty (CPU, float32)."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "random":
        return torch.randn((bsz, depth, vocab), generator=gen) * 3.0
    if kind == "peaked":  # one confident token per depth, like a good drafter
        logits = torch.randn((bsz, depth, vocab), generator=gen)
        top = torch.randint(0, vocab, (bsz, depth), generator=gen)
        logits.scatter_(2, top[..., None], 12.0)
        return logits
    if kind == "ties":  # heavy ties: few distinct values, identical rows
        vals = torch.randint(0, 3, (bsz, depth, vocab), generator=gen).float()
        vals[:, 1::2] = vals[:, :1].expand_as(vals[:, 1::2]) if depth > 1 else vals[:, 1::2]
        return vals
    if kind == "uniform":  # all tokens tied at every depth
        return torch.zeros((bsz, depth, vocab))
    if kind == "zeros":  # exact-zero log-probs (one-hot rows) mixed with tied rows
        logits = torch.full((bsz, depth, vocab), -1e30)
        logits[..., 0] = 0.0
        mixed = torch.rand((bsz, depth), generator=gen) < 0.5
        logits[mixed] = torch.randint(0, 2, (int(mixed.sum()), vocab), generator=gen).float()
        return logits
    if kind == "masked":  # -inf logits (a masked / padded vocabulary): -inf log-probs tie
        logits = torch.randn((bsz, depth, vocab), generator=gen)
        drop = torch.rand((bsz, depth, vocab), generator=gen) < 0.6
        drop[..., 0] = False
        return logits.masked_fill(drop, float("-inf"))
    raise AssertionError(kind)


def assert_tree_matches_heap(logits: torch.Tensor, budget: int, device: torch.device, backend: str = "torch") -> None:
    logits = logits.to(device)
    tree = build_tree(logits, budget, backend=backend)
    # the log-probabilities this build ranked: its own normaliser (checked against logsumexp separately)
    logprobs = log_softmax_f32(logits, (tree.row_max, tree.row_logsum)).cpu().numpy()
    for b in range(logits.shape[0]):
        ref = heap_tree(logprobs[b], budget)
        n = len(ref)
        assert int(tree.num_nodes[b]) == n + 1
        assert tree.tokens[b, :n].tolist() == [r.token for r in ref]
        assert tree.depths[b, :n].tolist() == [r.depth for r in ref]
        assert tree.parents[b, 1 : n + 1].tolist() == [r.parent for r in ref]
        assert tree.ranks[b, :n].tolist() == [r.ranks[-1] for r in ref]
        assert tree.scores[b, :n].tolist() == [r.score for r in ref]  # bitwise: same float64 accumulation
        assert tree.parents[b, 0].item() == -1


CASES = [
    # kind, batch, depth, vocab, budget
    ("random", 1, 1, 5, 1),
    ("random", 2, 1, 50, 8),
    ("random", 3, 4, 50, 16),
    ("random", 2, 15, 50, 64),
    ("random", 2, 15, 7, 33),
    ("random", 4, 8, 3, 40),
    ("random", 1, 2, 1, 5),
    ("peaked", 3, 15, 100, 16),
    ("peaked", 2, 7, 100, 64),
    ("ties", 2, 5, 6, 30),
    ("ties", 3, 15, 4, 64),
    ("ties", 2, 3, 2, 13),
    ("uniform", 2, 6, 5, 40),
    ("uniform", 1, 15, 3, 64),
    ("zeros", 3, 6, 5, 20),
    ("zeros", 2, 15, 4, 64),
    ("zeros", 2, 3, 2, 17),
    ("masked", 3, 5, 12, 24),
    ("masked", 2, 15, 20, 64),
]


@pytest.mark.parametrize(("kind", "bsz", "depth", "vocab", "budget"), CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_heap(kind, bsz, depth, vocab, budget, seed, device, backend):
    assert_tree_matches_heap(make_logits(kind, bsz, depth, vocab, seed), budget, device, backend)


@pytest.mark.parametrize("depth", list(range(1, 16)))
def test_every_depth_limit(depth, device, backend):
    logits = make_logits("random", 2, depth, 30, seed=depth)
    for budget in (1, 2, depth, 3 * depth):
        assert_tree_matches_heap(logits, budget, device, backend)


@pytest.mark.parametrize("budget", list(range(1, 65)))
def test_every_budget(budget, device, backend):
    logits = make_logits("ties", 1, 6, 9, seed=budget) + make_logits("random", 1, 6, 9, seed=budget) * 0.01
    assert_tree_matches_heap(logits, budget, device, backend)


@pytest.mark.parametrize("vocab", [151936, 248320])
def test_large_vocabulary(vocab, device, backend):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn((2, 3, vocab), generator=gen) * 2
    logits[0, :, 1000:1010] = 9.0  # a block of tied top tokens in row 0
    logits[1, 1, 5] = 40.0  # a near-certain token: log-prob exactly 0.0
    assert_tree_matches_heap(logits, 16, device, backend)
    assert_tree_matches_heap(logits.to(torch.bfloat16), 16, device, backend)


def test_batch_rows_get_different_trees(device, backend):
    logits = torch.stack([make_logits("random", 1, 5, 40, seed=s)[0] for s in range(4)])
    tree = build_tree(logits.to(device), 12, backend=backend)
    rows = {tuple(tree.tokens[b].tolist()) + tuple(tree.parents[b].tolist()) for b in range(4)}
    assert len(rows) == 4
    for b in range(4):  # each row equals its own single-row tree
        single = build_tree(logits[b : b + 1].to(device), 12, backend=backend)
        assert torch.equal(single.tokens[0], tree.tokens[b])
        assert torch.equal(single.parents[0], tree.parents[b])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_signed_zero_logprobs_tie(seed, device, backend):
    """-0.0 and +0.0 log-probabilities are equal (ties broken by token id / rank tuple), as in the heap."""
    gen = torch.Generator().manual_seed(seed)
    bsz, depth, vocab, budget = 2, 6, 5, 40
    choice = torch.randint(0, 4, (bsz, depth, vocab), generator=gen)
    lp = torch.where(choice == 0, -0.0, torch.where(choice == 1, 0.0, -(choice.float() - 1.0)))
    assert (torch.signbit(lp) & (lp == 0)).any() and (~torch.signbit(lp) & (lp == 0)).any()
    ids = torch.arange(vocab).expand(bsz, depth, vocab)
    tree = build_tree_from_topk(lp.to(device), ids.to(device), budget, backend=backend)
    for b in range(bsz):
        ref = heap_tree(lp[b].numpy(), budget)
        assert tree.tokens[b, : len(ref)].tolist() == [r.token for r in ref]
        assert tree.parents[b, 1 : len(ref) + 1].tolist() == [r.parent for r in ref]


def test_bfloat16_logits(device, backend):
    logits = make_logits("random", 2, 6, 64, seed=3).to(torch.bfloat16)  # bf16 rounding creates ties
    assert_tree_matches_heap(logits, 24, device, backend)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_normaliser_is_the_log_sum_exp(dtype, device, backend):
    logits = (torch.randn((3, 4, 5000), generator=torch.Generator().manual_seed(2)) * 4).to(dtype).to(device)
    logits[0, 0, :4000] = float("-inf")
    tree = build_tree(logits, 8, backend=backend)
    x = logits.float()
    torch.testing.assert_close(tree.row_max, x.amax(-1))
    torch.testing.assert_close(tree.row_max + tree.row_logsum, torch.logsumexp(x, -1), rtol=0, atol=2e-5)
    lp = log_softmax_f32(logits, (tree.row_max, tree.row_logsum))
    torch.testing.assert_close(lp[lp > -1e30], torch.log_softmax(x, -1)[lp > -1e30], rtol=0, atol=2e-5)


def test_backend_option_is_checked():
    with pytest.raises(ValueError, match="backend='gpu' is invalid"):
        build_tree(torch.zeros(1, 2, 3), 2, backend="gpu")


def test_exact_topk_tie_order(device):
    lp = torch.tensor([[-1.0, -0.5, -0.5, -2.0, -0.5, -0.0, 0.0]], device=device)
    values, indices = exact_topk(lp, 6)
    assert indices.tolist() == [[5, 6, 1, 2, 4, 0]]
    assert values.tolist() == [[0.0, 0.0, -0.5, -0.5, -0.5, -1.0]]


def test_from_topk_with_sharded_candidates_equals_full_logits(device, backend):
    """Tensor-parallel style input: per-shard top-k, normalised by the global log-sum-exp, concatenated."""
    gen = torch.Generator().manual_seed(7)
    bsz, depth, vocab, shards, budget = 3, 6, 64, 4, 10
    logits = (
        torch.randint(0, 4, (bsz, depth, vocab), generator=gen).float()
        + 0.1 * torch.randn((bsz, depth, vocab), generator=gen).round()
    )
    logits = logits.to(device)
    full = build_tree(logits, budget, backend=backend)
    lse = torch.logsumexp(logits.float(), dim=-1, keepdim=True)
    lp_all = log_softmax_f32(logits, (full.row_max, full.row_logsum))
    per = vocab // shards
    lps, toks = [], []
    for s in range(shards):
        shard_lp = lp_all[..., s * per : (s + 1) * per]
        v, i = exact_topk(shard_lp, min(budget, per))
        lps.append(v)
        toks.append(i + s * per)
    cat_lp, cat_tok = torch.cat(lps, -1), torch.cat(toks, -1)
    perm = torch.randperm(cat_lp.shape[-1], generator=gen).to(device)
    tree = build_tree_from_topk(cat_lp[..., perm], cat_tok[..., perm], budget, backend=backend)
    for name in ("tokens", "depths", "parents", "ancestors", "first_child", "next_sibling", "num_nodes", "scores"):
        assert torch.equal(getattr(tree, name), getattr(full, name)), name
    assert lse.shape == (bsz, depth, 1)
    # into fixed storage (the tree head inside the drafter's CUDA graphs at TP > 1): the same tree, in its rows
    storage = tree_buffers(bsz + 2, depth, budget, device)
    stored = build_tree_from_topk(cat_lp[..., perm], cat_tok[..., perm], budget, backend=backend, out=storage)
    for name in ("tokens", "depths", "parents", "ancestors", "first_child", "next_sibling", "num_nodes", "scores",
                 "ranks", "logprobs", "top1_tokens", "top1_logprobs"):
        assert torch.equal(getattr(stored, name), getattr(tree, name)), name
        assert getattr(stored, name).data_ptr() == getattr(storage, name).data_ptr(), name
    assert stored.row_max is None and stored.row_logsum is None  # no full-vocabulary normaliser from candidates
    with pytest.raises(ValueError, match="tree_buffers"):
        build_tree_from_topk(cat_lp, cat_tok, budget + 1, backend=backend, out=storage)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: build_tree(torch.zeros(3, 4), 4), "shape [B, D, V]"),
        (lambda: build_tree(torch.zeros(1, 3, 4), 0), "budget=0"),
        (lambda: build_tree(torch.zeros(1, 3, 4), 2.5), "budget=2.5"),
        (lambda: build_tree_from_topk(torch.zeros(1, 3, 4), torch.zeros(1, 3, 5, dtype=torch.long), 4), "topk_tokens"),
        (lambda: exact_topk(torch.zeros(2, 3), 4), "k=4"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        call()


def test_heap_reference_has_power():
    """The reference heap itself distinguishes tie orders (guards against a vacuous comparison)."""
    lp = np.log(np.full((2, 3), 1 / 3, dtype=np.float32))
    nodes = heap_tree(lp, 5)
    assert [n.ranks for n in nodes] == [(0,), (1,), (2,), (0, 0), (0, 1)]


def test_auto_backend_falls_back_to_torch_loudly(monkeypatch):
    """If the Triton kernels cannot run ("auto" mode), the torch backend builds the same tree, with a warning;
    an explicit backend="triton" raises instead."""
    pytest.importorskip("triton")
    from sglang_ddtree import tree as tree_mod

    if torch.cuda.is_available():
        pytest.skip("needs a machine where the Triton kernels cannot launch (CPU tensors)")
    monkeypatch.setattr(tree_mod, "_TRITON_FAILURE", [])

    def resolve(backend, device):  # pretend the device is a GPU
        return ("torch", False) if backend == "torch" else ("triton", backend is None)

    monkeypatch.setattr(tree_mod, "_resolve", resolve)
    logits = make_logits("random", 2, 4, 30, seed=0)
    with pytest.warns(RuntimeWarning, match="using the torch backend"):
        got = build_tree(logits, 8)
    want = build_tree(logits, 8, backend="torch")
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.parents, want.parents)
    assert tree_mod._TRITON_FAILURE
    with pytest.raises(Exception):  # noqa: B017 - whatever Triton raises for CPU tensors
        build_tree(logits, 8, backend="triton")


def test_tree_into_fixed_storage(device, backend):
    """``out`` (tree_buffers): the batch's trees land in its first rows and are returned as views of them, equal
    to trees built without it; the rows past the batch are left alone; storage of another shape is refused."""
    import dataclasses

    from sglang_ddtree.tree import DraftTree, tree_buffers, tree_rows

    logits = make_logits("random", 3, 5, 40, seed=7).to(device)
    out = tree_buffers(6, 5, 10, device)
    out.tokens.fill_(-7)
    got = build_tree(logits, 10, backend=backend, out=out)
    want = build_tree(logits, 10, backend=backend)
    for f in dataclasses.fields(DraftTree):
        g, w = getattr(got, f.name), getattr(want, f.name)
        if isinstance(g, torch.Tensor):
            assert torch.equal(g, w), f.name
            assert g.data_ptr() == getattr(out, f.name).data_ptr(), f.name
        else:
            assert g == w
    assert out.tokens[3:].eq(-7).all()
    assert torch.equal(tree_rows(out, 3).parents, want.parents)
    with pytest.raises(ValueError, match="budget 10 and depth 5; this batch needs 3 of budget 8"):
        build_tree(logits, 8, backend=backend, out=out)
    with pytest.raises(ValueError, match="out holds 2 trees"):
        build_tree(logits, 10, backend=backend, out=tree_buffers(2, 5, 10, device))
