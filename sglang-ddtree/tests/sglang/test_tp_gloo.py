"""Vocabulary-sharded tree build across REAL processes: torch.distributed with the gloo backend on the CPU.

Each rank holds its shard of the drafter logits (the last shard padded, as SGLang's vocab-parallel lm_head pads
it), runs ``sharded_candidates`` with a real ``all_gather`` and builds the tree from the gathered candidates.
Every rank must end with the same tree (bit for bit, scores included: that is what lets the ranks verify and
commit in step under TP), and its structure must equal the tree built from the full-vocabulary logits (the
scores only up to rounding: the global log-normaliser is a log-sum-exp of the shards' ones, summed in another
order). Rendezvous through a file in tmp_path (no sockets).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ddtree_testlib import assert_ranks_build_the_full_tree, run_ranks

from sglang_ddtree.tree import build_tree

STRUCTURE = ("tokens", "parents", "depths", "ancestors", "first_child", "next_sibling", "num_nodes")


def make_logits(seed: int, bsz: int, depth: int, vocab: int, ties: bool) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if ties:  # few distinct values: exact ties inside and across shards
        return torch.randint(0, 3, (bsz, depth, vocab), generator=gen).float()
    return torch.randn((bsz, depth, vocab), generator=gen) * 3


def rank_main(rank: int, world: int, store: str, out: str, case: dict) -> None:
    import torch.distributed as dist

    from sglang_ddtree.sglang.tp_topk import sharded_candidates
    from sglang_ddtree.tree import build_tree_from_topk

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        logits = make_logits(case["seed"], case["bsz"], case["depth"], case["vocab"], case["ties"])
        shard = -(-case["vocab"] // world)
        padded = torch.nn.functional.pad(logits, (0, shard * world - case["vocab"]), value=123.0)  # junk padding
        local = padded[..., rank * shard : (rank + 1) * shard].contiguous()

        def all_gather(t: torch.Tensor) -> torch.Tensor:
            parts = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(parts, t.contiguous())
            return torch.cat(parts, dim=-1)

        k = min(case["budget"], case["vocab"])
        logprobs, tokens = sharded_candidates(local, rank * shard, k, all_gather, vocab_limit=case["vocab"])
        tree = build_tree_from_topk(logprobs, tokens, case["budget"], backend="torch")
        torch.save({f: getattr(tree, f) for f in (*STRUCTURE, "scores")}, out)
    finally:
        dist.destroy_process_group()


CASES = [
    {"seed": 1, "bsz": 3, "depth": 5, "vocab": 97, "budget": 16, "ties": False, "world": 2},
    {"seed": 2, "bsz": 2, "depth": 4, "vocab": 61, "budget": 8, "ties": True, "world": 2},
    {"seed": 3, "bsz": 2, "depth": 3, "vocab": 50, "budget": 12, "ties": False, "world": 3},
    {"seed": 4, "bsz": 1, "depth": 6, "vocab": 9, "budget": 16, "ties": True, "world": 2},  # budget > V
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"world{c['world']}-V{c['vocab']}-N{c['budget']}-ties{c['ties']}")
def test_every_rank_builds_the_full_vocabulary_tree(case: dict, tmp_path: Path) -> None:
    world = case["world"]
    trees = run_ranks(rank_main, world, tmp_path, case, timeout=120)

    full = build_tree(
        make_logits(case["seed"], case["bsz"], case["depth"], case["vocab"], case["ties"]), case["budget"]
    )
    assert_ranks_build_the_full_tree(trees, full, STRUCTURE)
