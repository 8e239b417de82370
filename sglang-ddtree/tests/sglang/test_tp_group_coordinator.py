"""TP > 1 through SGLang's own objects on the CPU (issue 27 section 2.3): two real processes, a real SGLang TP group
and a real vocabulary-sharded ``ParallelLMHead``, the plugin's own tree build.

Each rank (spawned; torch.distributed over gloo, bound to the loopback interface, rendezvous through a file):

* starts SGLang's distributed environment (``parallel_state.init_distributed_environment(backend="gloo")``) and
  builds the TP ``GroupCoordinator`` with the factory SGLang's ``initialize_model_parallel`` uses for it
  (``init_model_parallel_group(..., group_name="tp")``). ``initialize_model_parallel`` itself cannot run on a
  CPU: on 0.5.17 it always creates a ``PyNcclCommunicator``, which needs a CUDA device, and on 0.5.21+ it reads
  the widths from a published server configuration. The group is made SGLang's TP group through SGLang's own
  hook for that, ``get_parallel().override(tp_group=..., tp_rank=..., tp_size=...)``;
* finds it with the plugin's start-up resolver ``tp_topk.resolve_tp_group`` (what the worker calls), with
  DeprecationWarnings as errors;
* builds ``ParallelLMHead(V, H)``: SGLang pads the vocabulary to a multiple of 64 and shards it across the two
  ranks; the full weight goes in through the layer's own ``weight_loader`` (which zeroes the padding rows), then
  the padding rows get a large junk value, so a tree that read a padding column would differ;
* runs ``DDTreeWorker._ddtree_tree_from_hidden`` (the worker's tree build: local logits through the shard, the
  vocab-parallel top-k, the all-gather through the coordinator, ``build_tree_from_topk``).

Both ranks must produce the same tree bit for bit (scores included), and its structure must equal the
single-rank ``build_tree`` over the full-vocabulary logits (scores up to rounding: the global log-normaliser is a
log-sum-exp of the shards' ones).
"""

from __future__ import annotations

import types
import warnings
from pathlib import Path

import pytest
import torch
from ddtree_testlib import assert_ranks_build_the_full_tree, run_ranks, sglang_tp_group

from sglang_ddtree.tree import build_tree

STRUCTURE = ("tokens", "parents", "depths", "ancestors", "first_child", "next_sibling", "num_nodes", "ranks")
JUNK = 1e4  # padding rows: logits far above any real one


def make_inputs(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden [bs*depth, H], full weight [V, H]); ``ties``: few distinct logits, exact ties across the shards."""
    gen = torch.Generator().manual_seed(case["seed"])
    bs, depth, vocab, hidden = case["bsz"], case["depth"], case["vocab"], case["hidden"]
    if case["ties"]:
        h = torch.zeros(bs * depth, hidden)
        h[:, 0] = 1.0
        weight = torch.randint(0, 3, (vocab, hidden), generator=gen).float()
    else:
        h = torch.randn(bs * depth, hidden, generator=gen)
        weight = torch.randn(vocab, hidden, generator=gen)
    return h, weight


def rank_main(rank: int, world: int, store: str, out: str, case: dict) -> None:
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead
    from sglang.srt.runtime_context import get_parallel

    from sglang_ddtree.sglang.tp_topk import resolve_tp_group
    from sglang_ddtree.sglang.worker import DDTreeWorker
    from sglang_ddtree.tree import tree_buffers

    with sglang_tp_group(rank, world, store) as group, get_parallel().override(tp_group=group, tp_rank=rank,
                                                                                tp_size=world):
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            tp_group = resolve_tp_group(world)
        assert tp_group is group, f"resolve_tp_group found {tp_group!r}, not SGLang's TP group"

        hidden, weight = make_inputs(case)
        head = ParallelLMHead(case["vocab"], case["hidden"], params_dtype=torch.float32, prefix="lm_head")
        head.weight_loader(head.weight, weight)
        shard = head.shard_indices
        head.weight.data[int(shard.num_org_elements):] = JUNK
        assert head.weight.shape[0] * world >= case["vocab"]

        worker = object.__new__(DDTreeWorker)  # the attributes the tree build reads
        worker.block_size = case["depth"] + 1
        worker.ddtree_budget = case["budget"]
        tree = worker._ddtree_tree_from_hidden(hidden, case["bsz"], head, tp_group, vocab_size=case["vocab"])
        # the tree head's path (SGLANG_DDTREE_TREE_IN_GRAPH=all): the same build into fixed rows
        rows = tree_buffers(case["bsz"] + 1, case["depth"], case["budget"], "cpu")
        stored = worker._ddtree_tree_from_hidden(hidden, case["bsz"], head, tp_group, vocab_size=case["vocab"],
                                                 out=rows)
        same = all(torch.equal(getattr(stored, f), getattr(tree, f)) for f in (*STRUCTURE, "scores"))
        torch.save({"shard": (int(shard.org_vocab_start_index), int(shard.org_vocab_end_index)),
                    "stored_same": same and stored.tokens.data_ptr() == rows.tokens.data_ptr(),
                    **{f: getattr(tree, f) for f in (*STRUCTURE, "scores")}}, out)


CASES = [
    # real columns per rank (of 64-padded shards): 64 + 33; 96 + 34 with exact ties; 7 + 0 (budget > V)
    {"seed": 1, "bsz": 3, "depth": 5, "vocab": 97, "hidden": 16, "budget": 16, "ties": False},
    {"seed": 2, "bsz": 2, "depth": 4, "vocab": 130, "hidden": 8, "budget": 24, "ties": True},
    {"seed": 3, "bsz": 1, "depth": 3, "vocab": 7, "hidden": 8, "budget": 16, "ties": False},
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"V{c['vocab']}-N{c['budget']}-ties{c['ties']}")
def test_two_gloo_ranks_build_the_full_vocabulary_tree_through_sglang_objects(case: dict, tmp_path: Path) -> None:
    world = 2
    trees = run_ranks(rank_main, world, tmp_path, case, timeout=180)

    hidden, weight = make_inputs(case)
    full = build_tree(
        (hidden @ weight.t()).view(case["bsz"], case["depth"], -1), case["budget"], backend="torch"
    )
    assert trees[0]["shard"][0] == 0 and trees[1]["shard"] == (trees[0]["shard"][1], case["vocab"])  # two shards
    assert_ranks_build_the_full_tree(trees, full, STRUCTURE)
    assert [t["stored_same"] for t in trees] == [True, True]  # the tree head's rows hold the same tree


# --- the resolver on its own (one process, no group built) -----------------------------------------------------

def test_resolve_tp_group_without_a_group():
    """No TP group in this process: None for TP = 1 (the CPU tests' workers), an error naming --tp-size for TP > 1
    (before, the worker caught everything and built a one-shard tree on every rank)."""
    from sglang_ddtree.sglang.tp_topk import resolve_tp_group

    assert resolve_tp_group(1) is None
    with pytest.raises(RuntimeError, match=r"--tp-size=2 but SGLang's tensor-parallel group is not available"):
        resolve_tp_group(2)


def test_resolve_tp_group_reads_get_parallel_without_the_deprecated_getter():
    """The resolver returns ``get_parallel().tp_group`` and raises no DeprecationWarning. On releases that deprecate
    ``get_tp_group()`` (0.5.21+), calling that getter from plugin code does warn, naming the replacement the
    resolver uses (the control that shows the check can fail)."""
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.runtime_context import get_parallel

    from sglang_ddtree.sglang.tp_topk import resolve_tp_group

    stand_in = types.SimpleNamespace(world_size=1, rank_in_group=0)  # stand-in group: only its identity is checked
    with get_parallel().override(tp_group=stand_in, tp_rank=0, tp_size=1):
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            assert resolve_tp_group(1) is stand_in
        deprecates = hasattr(ps, "_warn_if_called_from_outside")
        if deprecates:
            ps._ALREADY_WARNED.discard("get_tp_group")  # it warns once per process
            with pytest.warns(DeprecationWarning, match=r"get_tp_group\(\) is deprecated; read "
                                                        r"get_parallel\(\)\.tp_group instead"):
                ps.get_tp_group()
