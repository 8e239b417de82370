"""``logit_adjust.apply_tree_logit_adjustments`` against SGLang's own penalizers: for every tree node, a fresh
``BatchedPenalizerOrchestrator`` is fed the committed output tokens and then the node's root-to-node path (the
flattened chain a non-speculative decode would have emitted), and its additive and scaling penalties plus
``logit_bias`` are applied as ``SamplingBatchInfo.apply_logits_bias`` applies them after ``update_penalties``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_ddtree.sglang.logit_adjust import (
    TreeLogitAdjustments,
    apply_tree_logit_adjustments,
    path_token_counts,
)

V = 40
STOPS = (0, 7)


def _req(freq, pres, rep, min_new):
    params = SimpleNamespace(
        frequency_penalty=freq, presence_penalty=pres, repetition_penalty=rep, min_new_tokens=min_new,
        stop_token_ids={STOPS[1]},
    )
    tokenizer = SimpleNamespace(additional_stop_token_ids=None, eos_token_id=STOPS[0])
    return SimpleNamespace(sampling_params=params, eos_token_ids={STOPS[0]}, tokenizer=tokenizer)


class _Batch:
    """The two ScheduleBatch attributes the penalizers read (a class: the orchestrator takes a weakref)."""

    def __init__(self, reqs):
        self.reqs = reqs
        self.device = "cpu"


def _sglang_reference(logits_row, req, emitted, logit_bias_row):
    """SGLang's penalizers over one request that emitted ``emitted`` (committed outputs, then the path)."""
    from sglang.srt.sampling import penaltylib
    from sglang.srt.sampling.penaltylib.orchestrator import BatchedPenalizerOrchestrator
    from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties

    batch = _Batch([req])  # the orchestrator keeps a weak reference: hold the batch for the whole call
    orchestrator = BatchedPenalizerOrchestrator(
        vocab_size=V,
        batch=batch,
        penalizers={
            penaltylib.BatchedFrequencyPenalizer,
            penaltylib.BatchedMinNewTokensPenalizer,
            penaltylib.BatchedPresencePenalizer,
            penaltylib.BatchedRepetitionPenalizer,
        },
    )
    for token in emitted:
        orchestrator.cumulate_output_tokens(torch.tensor([token], dtype=torch.int64))
    logits = logits_row.clone().to(torch.float32).unsqueeze(0)
    additive = torch.zeros_like(logits)
    orchestrator.accumulate_additive_penalties(additive)
    logits.add_(additive)
    scaling = orchestrator.accumulate_scaling_penalties()
    if scaling is not None:
        apply_scaling_penalties(logits, scaling)
    logits.add_(logit_bias_row)
    return logits[0]


def _random_tree(gen, m):
    """Parents in pop order (parent < child), depths from them, tokens from a small alphabet (many repeats)."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, m)]
    depths = [0] * m
    for i in range(1, m):
        depths[i] = depths[parents[i]] + 1
    tokens = [int(t) for t in torch.randint(0, 9, (m,), generator=gen)]
    return tokens, parents, depths


def _path(parents, tokens, i):
    path = []
    while i > 0:
        path.append(tokens[i])
        i = parents[i]
    return path[::-1]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_node_matches_sglangs_penalizers_on_its_flattened_path(seed):
    gen = torch.Generator().manual_seed(seed)
    m = 9
    reqs = [_req(0.7, 0.3, 1.3, 6), _req(0.0, 1.1, 1.0, 0), _req(0.25, 0.0, 2.0, 3)]
    bsz = len(reqs)
    trees = [_random_tree(gen, m) for _ in range(bsz)]
    # committed output tokens, ending with the root (the previous round's bonus token)
    committed = [[int(t) for t in torch.randint(0, 9, (int(n),), generator=gen)] + [trees[b][0][0]]
                 for b, n in enumerate(torch.randint(0, 4, (bsz,), generator=gen))]
    logits = torch.randn(bsz, m, V, generator=gen) * 3
    logit_bias = torch.zeros(bsz, V)
    logit_bias[0, 3] = 5.0
    logit_bias[2, 8] = -2.5

    tokens = torch.tensor([t for t, _, _ in trees])
    parents = torch.tensor([p for _, p, _ in trees])
    depths = torch.tensor([d for _, _, d in trees])
    counts = torch.zeros(bsz, V)
    for b, seq in enumerate(committed):
        for t in seq:
            counts[b, t] += 1
    stop_mask = torch.zeros(bsz, V, dtype=torch.bool)
    stop_mask[:, list(STOPS)] = True
    adjust = TreeLogitAdjustments(
        committed_counts=counts,
        frequency_penalty=torch.tensor([r.sampling_params.frequency_penalty for r in reqs]),
        presence_penalty=torch.tensor([r.sampling_params.presence_penalty for r in reqs]),
        repetition_penalty=torch.tensor([r.sampling_params.repetition_penalty for r in reqs]),
        logit_bias=logit_bias,
        min_new_tokens=torch.tensor([r.sampling_params.min_new_tokens for r in reqs]),
        num_output_tokens=torch.tensor([len(c) for c in committed]),
        stop_token_mask=stop_mask,
    )
    got = apply_tree_logit_adjustments(logits, tokens, parents, depths, adjust)
    masked_somewhere = False
    for b in range(bsz):
        tree_tokens, tree_parents, _ = trees[b]
        for i in range(m):
            emitted = committed[b] + _path(tree_parents, tree_tokens, i)
            want = _sglang_reference(logits[b, i], reqs[b], emitted, logit_bias[b])
            torch.testing.assert_close(got[b, i], want, msg=f"request {b} node {i}")
            masked_somewhere |= bool(torch.isinf(want).any())
    assert masked_somewhere  # min_new_tokens was exercised


def test_min_new_tokens_unmasks_stops_by_each_nodes_depth():
    # a chain root(0) -> 1 -> 2 -> 3: committed 2 outputs, min_new_tokens 4 -> masked while 2 + depth < 4
    tokens = torch.tensor([[5, 6, 6, 9]])
    parents = torch.tensor([[-1, 0, 1, 2]])
    depths = torch.tensor([[0, 1, 2, 3]])
    stop = torch.zeros(1, V, dtype=torch.bool)
    stop[0, 0] = True
    adjust = TreeLogitAdjustments(
        min_new_tokens=torch.tensor([4]), num_output_tokens=torch.tensor([2]), stop_token_mask=stop
    )
    got = apply_tree_logit_adjustments(torch.zeros(1, 4, V), tokens, parents, depths, adjust)
    assert got[0, :, 0].tolist() == [float("-inf"), float("-inf"), 0.0, 0.0]
    assert torch.isfinite(got[0, :, 1:]).all()


def test_siblings_do_not_see_each_others_tokens():
    # root -> a(3), root -> b(4): a's row counts 3 only, b's row counts 4 only
    counts = path_token_counts(torch.tensor([[1, 3, 4]]), torch.tensor([[-1, 0, 0]]), 6)
    assert counts[0, 0].tolist() == [0] * 6
    assert counts[0, 1].tolist() == [0, 0, 0, 1, 0, 0]
    assert counts[0, 2].tolist() == [0, 0, 0, 0, 1, 0]


def test_nothing_to_apply_returns_the_logits_and_dtype_is_kept():
    logits = torch.randn(2, 3, V, dtype=torch.bfloat16)
    tokens = torch.zeros(2, 3, dtype=torch.int64)
    parents = torch.tensor([[-1, 0, 1]] * 2)
    depths = torch.tensor([[0, 1, 2]] * 2)
    got = apply_tree_logit_adjustments(logits, tokens, parents, depths, TreeLogitAdjustments())
    assert got.dtype == torch.bfloat16 and torch.equal(got, logits)


def test_penalties_need_the_committed_counts():
    with pytest.raises(ValueError, match="committed_counts"):
        apply_tree_logit_adjustments(
            torch.zeros(1, 2, V), torch.zeros(1, 2, dtype=torch.int64), torch.tensor([[-1, 0]]),
            torch.tensor([[0, 1]]), TreeLogitAdjustments(frequency_penalty=torch.tensor([0.5])),
        )


def _orchestrator(reqs):
    from sglang.srt.sampling import penaltylib
    from sglang.srt.sampling.penaltylib.orchestrator import BatchedPenalizerOrchestrator

    batch = _Batch(reqs)
    orchestrator = BatchedPenalizerOrchestrator(
        vocab_size=V,
        batch=batch,
        penalizers={
            penaltylib.BatchedFrequencyPenalizer,
            penaltylib.BatchedMinNewTokensPenalizer,
            penaltylib.BatchedPresencePenalizer,
            penaltylib.BatchedRepetitionPenalizer,
        },
    )
    return orchestrator, batch


def test_from_sglang_reads_a_real_batchs_penalizer_state():
    """The committed state as SGLang's own batched penalizers hold it (cumulated step by step over the batch),
    read by TreeLogitAdjustments.from_sglang, gives every node what the per-path reference gives."""
    gen = torch.Generator().manual_seed(7)
    m = 8
    reqs = [_req(0.5, 0.2, 1.4, 5), _req(0.0, 0.0, 1.0, 0), _req(1.0, 0.6, 1.0, 9)]
    bsz = len(reqs)
    trees = [_random_tree(gen, m) for _ in range(bsz)]
    steps = 3
    committed = [[int(t) for t in torch.randint(0, 9, (steps,), generator=gen)] + [trees[b][0][0]]
                 for b in range(bsz)]
    orchestrator, batch = _orchestrator(reqs)
    for step in range(steps + 1):  # one token per request per decode step, as the scheduler feeds them
        orchestrator.cumulate_output_tokens(torch.tensor([c[step] for c in committed], dtype=torch.int64))
    logit_bias = torch.zeros(bsz, V)
    logit_bias[1, 5] = 3.0
    sampling_info = SimpleNamespace(penalizer_orchestrator=orchestrator, logit_bias=logit_bias)

    adjust = TreeLogitAdjustments.from_sglang(sampling_info)
    assert adjust.committed_frequency is not None and adjust.committed_repetition is not None
    assert adjust.num_output_tokens.tolist() == [steps + 1] * bsz
    logits = torch.randn(bsz, m, V, generator=gen) * 3
    got = apply_tree_logit_adjustments(
        logits,
        torch.tensor([t for t, _, _ in trees]),
        torch.tensor([p for _, p, _ in trees]),
        torch.tensor([d for _, _, d in trees]),
        adjust,
    )
    for b in range(bsz):
        tree_tokens, tree_parents, _ = trees[b]
        for i in range(m):
            emitted = committed[b] + _path(tree_parents, tree_tokens, i)
            want = _sglang_reference(logits[b, i], reqs[b], emitted, logit_bias[b])
            torch.testing.assert_close(got[b, i], want, msg=f"request {b} node {i}")
    del batch


def test_from_sglang_without_penalties_is_just_the_logit_bias():
    bias = torch.ones(2, V)
    adjust = TreeLogitAdjustments.from_sglang(SimpleNamespace(penalizer_orchestrator=None, logit_bias=bias))
    assert adjust.logit_bias is bias and adjust.frequency_penalty is None and adjust.min_new_tokens is None
