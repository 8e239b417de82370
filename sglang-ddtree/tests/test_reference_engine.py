"""The HF reference engine: tree pass == linear pass, and lossless end to end."""

from __future__ import annotations

import pytest
import torch
from ddtree_testlib import naive_children

from sglang_ddtree.reference import generate, greedy_generate, tree_attention_mask
from sglang_ddtree.reference.engine import _new_cache, chain_tree
from sglang_ddtree.tree import build_tree

pytestmark = pytest.mark.slow

PROMPT = [7, 21, 33, 8, 15, 40, 2, 19]


def plain_greedy_no_cache(target, prompt, max_new_tokens, stops=()):
    """Independent baseline: full causal recomputation every step (no KV cache at all)."""
    device = next(target.parameters()).device
    ids = list(prompt)
    out = []
    with torch.no_grad():
        while len(out) < max_new_tokens:
            logits = target(input_ids=torch.tensor([ids], device=device)).logits
            tok = int(logits[0, -1].argmax())
            out.append(tok)
            ids.append(tok)
            if tok in stops:
                break
    return out


def tree_pass(target, prompt, tree, mask_fn=tree_attention_mask):
    device = next(target.parameters()).device
    cache = _new_cache(target)
    with torch.no_grad():
        target(input_ids=torch.tensor([prompt[:-1]], device=device), past_key_values=cache, use_cache=True)
        start = len(prompt) - 1  # the last prompt token is the root
        ids = torch.cat([torch.tensor([[prompt[-1]]], device=device), tree.tokens], dim=1)
        dtype = next(target.parameters()).dtype
        out = target(
            input_ids=ids,
            position_ids=start + tree.positions,
            attention_mask=mask_fn(tree.ancestors[0], start, dtype),
            past_key_values=cache,
            use_cache=True,
            output_hidden_states=True,
        )
    return out


def path_of(parents, node):
    path = []
    while node > 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def test_tree_pass_equals_linear_pass(tiny_random):
    """Every node's hidden states (all layers) in the ONE tree pass equal a causal pass over prompt + its path."""
    target, _ = tiny_random
    device = next(target.parameters()).device
    gen = torch.Generator().manual_seed(0)
    tree = build_tree(torch.randn((1, 4, 48), generator=gen).to(device), 12)
    assert max(len(c) for c in naive_children(tree.parents[0].tolist()).values()) > 1  # a real tree
    out = tree_pass(target, PROMPT, tree)
    tokens = tree.tokens[0].tolist()
    parents = tree.parents[0].tolist()
    with torch.no_grad():
        for node in range(tree.budget + 1):
            seq = PROMPT + [tokens[i - 1] for i in path_of(parents, node)]
            lin = target(input_ids=torch.tensor([seq], device=device), output_hidden_states=True)
            for layer, (h_tree, h_lin) in enumerate(zip(out.hidden_states, lin.hidden_states, strict=True)):
                torch.testing.assert_close(h_tree[0, node], h_lin[0, -1], rtol=1e-6, atol=1e-6, msg=f"layer {layer}")
            torch.testing.assert_close(out.logits[0, node], lin.logits[0, -1], rtol=1e-6, atol=1e-6)


def test_tree_pass_check_has_power(tiny_random):
    """A plain causal mask over the tree tokens (a chain) gives different hidden states: the check can fail."""
    target, _ = tiny_random
    device = next(target.parameters()).device
    tree = build_tree(torch.randn((1, 4, 48), generator=torch.Generator().manual_seed(0)).to(device), 12)

    def causal(ancestors, prefix, dtype):
        n = ancestors.shape[0]
        return tree_attention_mask(
            torch.tril(torch.ones(n, n, dtype=torch.bool, device=ancestors.device)), prefix, dtype
        )

    good = tree_pass(target, PROMPT, tree)
    bad = tree_pass(target, PROMPT, tree, causal)
    assert not torch.allclose(good.logits, bad.logits, atol=1e-3)


@pytest.mark.parametrize("budget", list(range(1, 17)))
def test_greedy_generate_is_lossless(budget, tiny_random):
    target, drafter = tiny_random
    expected = plain_greedy_no_cache(target, PROMPT, 24)
    result = generate(target, drafter, PROMPT, 24, budget)
    assert result.tokens == expected
    assert sum(result.accept_lengths) + 1 >= len(result.tokens)
    assert all(1 <= a <= drafter.block_size for a in result.accept_lengths)


def test_random_drafter_accepts_sometimes(tiny_random):
    """With a 48-token vocabulary and budget 16, random drafts are accepted in some rounds, so the KV
    compaction of non-trivial paths is exercised by the losslessness tests above."""
    target, drafter = tiny_random
    lengths = []
    for prompt in (PROMPT, [1, 2, 3], [30, 31, 32, 33, 34, 35]):
        lengths += generate(target, drafter, prompt, 24, 16).accept_lengths
    assert max(lengths) >= 2


@pytest.mark.parametrize("budget", [1, 3, 8, 16])
def test_aligned_drafter_is_lossless_and_accepts(budget, tiny_aligned):
    target, drafter = tiny_aligned
    prompt = [11, 50, 7, 90]
    expected = plain_greedy_no_cache(target, prompt, 30)
    result = generate(target, drafter, prompt, 30, budget)
    assert result.tokens == expected
    assert result.mean_accept_length > 1.5


@pytest.mark.parametrize("stop_at", [0, 3, 9])
def test_stop_tokens(stop_at, tiny_random):
    target, drafter = tiny_random
    free = plain_greedy_no_cache(target, PROMPT, 24)
    stop = free[stop_at]
    expected = free[: free.index(stop) + 1]
    for budget in (1, 5, 16):
        result = generate(target, drafter, PROMPT, 24, budget, stop_token_ids=[stop])
        assert result.tokens == expected
        assert result.stopped
    assert greedy_generate(target, PROMPT, 24, [stop]) == expected


@pytest.mark.parametrize("max_new", [1, 2, 7])
def test_max_new_tokens_exact(max_new, tiny_aligned):
    target, drafter = tiny_aligned
    result = generate(target, drafter, [3, 4, 5], max_new, 8)
    assert len(result.tokens) == max_new
    assert result.tokens == greedy_generate(target, [3, 4, 5], max_new)
    assert not result.stopped


def test_sampling_path_wiring(tiny_aligned):
    """temperature > 0: reproducible per seed, and a near-zero temperature reproduces greedy decoding (the
    aligned target has large logit margins), which checks that node i's probabilities are used at node i."""
    target, drafter = tiny_aligned
    prompt = [11, 50, 7, 90]
    a = generate(target, drafter, prompt, 20, 8, temperature=1.0, seed=3)
    b = generate(target, drafter, prompt, 20, 8, temperature=1.0, seed=3)
    assert a.tokens == b.tokens and len(a.tokens) == 20
    cold = generate(target, drafter, prompt, 20, 8, temperature=1e-4, seed=5)
    assert cold.tokens == greedy_generate(target, prompt, 20)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"budget": 0}, "budget=0"),
        ({"max_new_tokens": 0}, "max_new_tokens=0"),
        ({"temperature": -1.0}, "temperature=-1.0"),
        ({"input_ids": []}, "input_ids"),
        ({"mode": "eagle"}, "mode='eagle'"),
        ({"budget": None}, "budget=None"),
    ],
)
def test_bad_arguments(kwargs, message, tiny_random):
    target, drafter = tiny_random
    args = {"input_ids": PROMPT, "max_new_tokens": 4, "budget": 4}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        generate(target, drafter, **args)


# ---- DFLASH chain mode -------------------------------------------------------------------------------------------


def test_chain_tree_is_the_argmax_chain():
    """chain_tree equals build_tree's tree when the drafter is so peaked that the best D prefixes are the chain."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn((2, 5, 40), generator=gen, dtype=torch.float64)
    logits.scatter_(2, logits.argmax(-1, keepdim=True), 60.0)
    chain = chain_tree(logits)
    tree = build_tree(logits, 5)
    assert torch.equal(chain.tokens, logits.argmax(-1))
    for name in ("tokens", "depths", "parents", "ancestors", "first_child", "next_sibling", "num_nodes", "ranks"):
        assert torch.equal(getattr(chain, name), getattr(tree, name)), name
    torch.testing.assert_close(chain.scores, tree.scores)
    torch.testing.assert_close(chain.logprobs, tree.logprobs)
    assert chain.max_depth == tree.max_depth == 5


@pytest.mark.parametrize("fixture", ["tiny_random", "tiny_aligned"])
def test_chain_mode_is_lossless_and_reports_tau(fixture, request):
    target, drafter = request.getfixturevalue(fixture)
    for prompt in (PROMPT, [11, 40, 7, 30], [1, 2, 3]):
        expected = plain_greedy_no_cache(target, prompt, 30)
        result = generate(target, drafter, prompt, 30, None, mode="dflash")
        assert result.tokens == expected
        assert all(1 <= a <= drafter.block_size for a in result.accept_lengths)
        assert sum(result.accept_lengths) + 1 >= len(result.tokens)
        assert result.mean_accept_length == sum(result.accept_lengths) / len(result.accept_lengths)
    if fixture == "tiny_aligned":
        assert result.mean_accept_length > 1.5


def test_chain_mode_stops_and_max_new_tokens(tiny_random):
    target, drafter = tiny_random
    free = plain_greedy_no_cache(target, PROMPT, 24)
    stop = free[5]
    result = generate(target, drafter, PROMPT, 24, None, stop_token_ids=[stop], mode="dflash")
    assert result.tokens == free[: free.index(stop) + 1] and result.stopped
    assert generate(target, drafter, PROMPT, 7, 3, mode="dflash").tokens == free[:7]


def test_chain_mode_sampling_is_seeded(tiny_aligned):
    target, drafter = tiny_aligned
    a = generate(target, drafter, [11, 50, 7, 90], 20, None, temperature=1.0, seed=3, mode="dflash")
    b = generate(target, drafter, [11, 50, 7, 90], 20, None, temperature=1.0, seed=3, mode="dflash")
    assert a.tokens == b.tokens and len(a.tokens) == 20
    cold = generate(target, drafter, [11, 50, 7, 90], 20, None, temperature=1e-4, seed=5, mode="dflash")
    assert cold.tokens == greedy_generate(target, [11, 50, 7, 90], 20)
