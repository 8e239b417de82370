"""Verify-input construction and accept/commit bookkeeping on CPU tensors, checked against the core's tree."""

from __future__ import annotations

import pytest
import torch

from sglang_ddtree.sglang.commit import (
    commit_plan,
    last_accepted_node,
    out_tokens_from_path,
    tree_mamba_commit_indices,
)
from sglang_ddtree.sglang.tp_topk import sharded_candidates
from sglang_ddtree.sglang.verify_input import build_verify_arrays, chain_first_slots, mask_numel
from sglang_ddtree.tree import build_tree, build_tree_from_topk
from sglang_ddtree.verify import greedy_walk


def _trees(bsz=3, depth=4, vocab=50, budget=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(bsz, depth, vocab, generator=gen) * 3
    return build_tree(logits, budget), gen


def _arrays(tree, roots, prefix, prefix_sum, mask_buffer=None, req_to_token=None, rows=None):
    """build_verify_arrays with a plain slot table (slot = 1000 + 128 * row + position) unless one is given."""
    bsz = tree.tokens.shape[0]
    if req_to_token is None:
        req_to_token = torch.arange(bsz * 128).view(bsz, 128) + 1000
        rows = torch.arange(bsz)
    return build_verify_arrays(tree, roots, prefix, prefix_sum, req_to_token, rows, mask_buffer)


def _target_following(tree, gen, follow_prob=0.7):
    """Target tokens per node: often the token of a random child (so paths get accepted), else random."""
    bsz, m = tree.parents.shape
    target = torch.randint(0, 50, (bsz, m), generator=gen)
    for b in range(bsz):
        for i in range(m):
            kids = [j for j in range(1, m) if int(tree.parents[b, j]) == i]
            if kids and torch.rand((), generator=gen) < follow_prob:
                target[b, i] = tree.tokens[b, kids[int(torch.randint(len(kids), (), generator=gen))] - 1]
    return target


def test_verify_arrays_match_the_core_tree():
    tree, _ = _trees()
    bsz, m = tree.parents.shape
    prefix = torch.tensor([5, 0, 11])
    roots = torch.tensor([7, 8, 9])
    arrays = _arrays(tree, roots, prefix, int(prefix.sum()))
    assert arrays.num_nodes == m
    tokens = arrays.tokens.view(bsz, m)
    assert torch.equal(tokens[:, 0], roots) and torch.equal(tokens[:, 1:], tree.tokens)
    assert torch.equal(arrays.positions.view(bsz, m), prefix[:, None] + tree.positions)
    assert torch.equal(arrays.retrieve_next_token, tree.first_child)
    assert torch.equal(arrays.retrieve_next_sibling, tree.next_sibling)
    assert torch.equal(arrays.retrieve_index, torch.arange(bsz * m).view(bsz, m))


def test_custom_mask_layout_is_full_mask_per_request():
    tree, _ = _trees()
    bsz, m = tree.parents.shape
    prefix = torch.tensor([5, 0, 11])
    mask = _arrays(tree, torch.zeros(bsz, dtype=torch.long), prefix, int(prefix.sum())).custom_mask
    assert mask.dtype == torch.bool and mask.numel() == mask_numel(int(prefix.sum()), bsz, m)
    offset = 0
    for b in range(bsz):
        p = int(prefix[b])
        block = mask[offset : offset + m * (p + m)].view(m, p + m)
        assert block[:, :p].all()  # every node sees the whole committed prefix
        assert torch.equal(block[:, p:], tree.ancestors[b])  # and its ancestors-or-self in the tree
        offset += m * (p + m)
    # a node never sees a sibling: rows of two children of the root differ in the tree part
    assert offset == mask.numel()


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bool])
def test_mask_written_into_the_backend_buffer_has_the_tree_cells_and_leaves_the_prefix(dtype):
    """Only the tree cells are written (the prefix columns are never read by Triton's verify); they equal the
    full build's cells, and the returned view is the buffer's own storage (so the graph replay's copy is a
    self-copy)."""
    tree, _ = _trees()
    bsz, m = tree.parents.shape
    prefix = torch.tensor([5, 0, 11])
    full = _arrays(tree, torch.zeros(bsz, dtype=torch.long), prefix, int(prefix.sum())).custom_mask
    sentinel = 7 if dtype == torch.uint8 else False
    buffer = torch.full((full.numel() + 40,), sentinel, dtype=dtype)
    got = _arrays(tree, torch.zeros(bsz, dtype=torch.long), prefix, int(prefix.sum()), buffer).custom_mask
    assert got.data_ptr() == buffer.data_ptr() and got.numel() == full.numel() and got.dtype == dtype
    offset = 0
    for b in range(bsz):
        p = int(prefix[b])
        block = got[offset : offset + m * (p + m)].view(m, p + m)
        assert torch.equal(block[:, p:].bool(), tree.ancestors[b])
        assert (block[:, :p] == sentinel).all()  # prefix cells untouched
        offset += m * (p + m)
    assert (buffer[full.numel() :] == sentinel).all()
    with pytest.raises(ValueError, match="verify-mask buffer has"):
        _arrays(tree, torch.zeros(bsz, dtype=torch.long), prefix, int(prefix.sum()), buffer[:10])


def test_ddtree_verify_input_is_a_dflash_verify_input_with_tree_metadata(plugins_loaded):
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput
    from sglang.srt.speculative.spec_info import SpecInputType

    from sglang_ddtree.sglang.verify_spec_input import DDTreeVerifyInput

    tree, _ = _trees()
    prefix = torch.tensor([5, 0, 11])
    arrays = _arrays(tree, torch.zeros(3, dtype=torch.long), prefix, 16)
    vi = DDTreeVerifyInput(
        draft_token=arrays.tokens, positions=arrays.positions, draft_token_num=arrays.num_nodes,
        custom_mask=arrays.custom_mask, retrieve_index=arrays.retrieve_index,
        retrieve_next_token=arrays.retrieve_next_token, retrieve_next_sibling=arrays.retrieve_next_sibling,
    )
    assert isinstance(vi, DFlashVerifyInput) and vi.spec_input_type == SpecInputType.DFLASH_VERIFY
    assert vi.topk > 1 and vi.num_tokens_per_req == arrays.num_nodes
    assert vi.is_verify_input() and not vi.is_draft_input()


@pytest.mark.parametrize("seed", range(4))
def test_chain_first_slots_put_the_argmax_chain_at_its_depth_and_are_a_permutation(seed):
    gen = torch.Generator().manual_seed(seed)
    tree = build_tree(torch.randn(3, 7, 30, generator=gen) * 2, 16)
    slots = chain_first_slots(tree)
    bsz, m = slots.shape
    for b in range(bsz):
        assert sorted(slots[b].tolist()) == list(range(m))  # every position prefix..prefix+N exactly once
        assert slots[b, 0] == 0  # the root stays at the root's position
        on_chain = []
        for i in range(1, int(tree.num_nodes[b])):  # the path of rank-0 nodes from the root
            node, path = i, []
            while node > 0:
                path.append(int(tree.ranks[b, node - 1]))
                node = int(tree.parents[b, node])
            if not any(path):
                on_chain.append(i)
                assert slots[b, i] == tree.depths[b, i - 1]
        assert len(on_chain) >= 1  # the best depth-1 candidate is always a node
        off = [i for i in range(1, m) if i not in on_chain]
        assert [int(slots[b, i]) for i in off] == list(range(len(on_chain) + 1, m))  # node order after the chain


def test_out_cache_loc_reads_the_slot_table_at_prefix_plus_slot():
    tree, _ = _trees()
    bsz, m = tree.parents.shape
    prefix = torch.tensor([5, 0, 11])
    req_to_token = torch.randperm(6 * 64).view(6, 64)
    rows = torch.tensor([4, 1, 3])
    arrays = _arrays(tree, torch.zeros(bsz, dtype=torch.long), prefix, 16, None, req_to_token, rows)
    for b in range(bsz):
        for i in range(m):
            assert arrays.out_cache_loc[b * m + i] == req_to_token[rows[b], prefix[b] + arrays.slots[b, i]]


class SimulatedAllocator:
    """Page-granular slot allocator (slot 0 reserved as padding, like SGLang's)."""

    def __init__(self, num_pages: int, page_size: int):
        self.page_size = page_size
        self.free_pages = list(range(1, num_pages))
        self.total = num_pages - 1

    def alloc(self, num_tokens: int) -> list[int]:
        pages = -(-num_tokens // self.page_size)
        assert pages <= len(self.free_pages)
        taken, self.free_pages = self.free_pages[:pages], self.free_pages[pages:]
        return [p * self.page_size + o for p in taken for o in range(self.page_size)][:num_tokens]

    def free(self, slots: list[int]) -> None:
        pages = sorted({s // self.page_size for s in slots})
        assert not set(pages) & set(self.free_pages), "double free"
        self.free_pages += pages


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("seed", [3, 4, 5])
def test_commit_moves_accepted_kv_to_the_front_and_leaks_nothing(page_size, seed):
    gen = torch.Generator().manual_seed(seed)
    tree = build_tree(torch.randn(3, 7, 40, generator=gen) * 2, 16)
    bsz, m = tree.parents.shape
    target = _target_following(tree, gen, follow_prob=0.9)
    accept_index, accept_len, bonus = greedy_walk(tree, target)
    assert int(accept_len.max()) >= 2  # a path deeper than one node (a real compaction)

    alloc = SimulatedAllocator(num_pages=400, page_size=page_size)
    prefix = torch.tensor([3, 6, 9])
    reserve = m + page_size  # the per-decode reservation covers the tree
    req_to_token = torch.zeros((5, 64), dtype=torch.long)
    pool_rows = torch.tensor([2, 0, 4])
    owned = {}
    for b in range(bsz):
        slots = alloc.alloc(int(prefix[b]) + reserve)
        req_to_token[pool_rows[b], : len(slots)] = torch.tensor(slots)
        owned[b] = set(slots)
    arrays = _arrays(tree, torch.zeros(bsz, dtype=torch.long), prefix, int(prefix.sum()), None, req_to_token,
                     pool_rows)
    kv = torch.zeros(400 * page_size, 2)  # [slots, head_dim]
    for b in range(bsz):  # the verify pass wrote node i's KV at its out_cache_loc
        for i in range(m):
            kv[arrays.out_cache_loc[b * m + i]] = torch.tensor([b, 100 + i], dtype=torch.float)
    table_before = req_to_token.clone()

    plan = commit_plan(accept_index, accept_len, bonus, arrays.slots, arrays.out_cache_loc, tree.tokens, prefix)
    for b in range(bsz):  # the moves in order (the fused kernel reads every source first; same result, see below)
        for k in range(plan.move_src.shape[1]):
            if plan.move_src[b, k] >= 0:
                kv[plan.move_dst[b, k]] = kv[plan.move_src[b, k]]

    assert torch.equal(req_to_token, table_before)  # slot table untouched (page layout intact)
    for b in range(bsz):
        for k in range(int(accept_len[b]) + 1):
            node = int(accept_index[b, k])
            slot = int(req_to_token[pool_rows[b], prefix[b] + k])
            assert kv[slot].tolist() == [b, 100 + node]
        moved = plan.move_src[b] >= 0
        assert set(plan.move_src[b][moved].tolist()) | set(plan.move_dst[b][moved].tolist()) <= owned[b]
        # no move reads a slot that an earlier move of the request wrote: in order == all reads first
        written = set()
        for k in range(plan.move_src.shape[1]):
            if plan.move_src[b, k] >= 0:
                assert int(plan.move_src[b, k]) not in written
                written.add(int(plan.move_dst[b, k]))
    assert torch.equal(plan.commit_lens, (accept_len + 1).to(torch.int32))
    assert torch.equal(plan.new_seq_lens, prefix + accept_len + 1)
    # the request finishes: everything it holds goes back, nothing leaked, nothing freed twice
    for b in range(bsz):
        alloc.free(sorted(owned[b]))
    assert len(alloc.free_pages) == alloc.total


def test_a_path_along_the_argmax_chain_moves_nothing():
    gen = torch.Generator().manual_seed(8)
    tree = build_tree(torch.randn(2, 7, 40, generator=gen) * 2, 16)
    bsz, m = tree.parents.shape
    # the target agrees with the drafter's argmax everywhere: the accepted path is the rank-0 chain
    node_tokens = torch.cat([torch.zeros(bsz, 1, dtype=torch.long), tree.tokens], 1)
    target = torch.full((bsz, m), 1)
    for b in range(bsz):
        for i in range(m):
            kids = [j for j in range(1, m) if int(tree.parents[b, j]) == i and int(tree.ranks[b, j - 1]) == 0]
            target[b, i] = node_tokens[b, kids[0]] if kids else 1
    accept_index, accept_len, bonus = greedy_walk(tree, target)
    assert int(accept_len.min()) >= 1
    arrays = _arrays(tree, torch.zeros(bsz, dtype=torch.long), torch.tensor([4, 9]), 13)
    plan = commit_plan(accept_index, accept_len, bonus, arrays.slots, arrays.out_cache_loc, tree.tokens,
                       torch.tensor([4, 9]))
    assert (plan.move_src == -1).all() and (plan.move_dst == -1).all()


def test_commit_plan_rows_and_emitted_tokens():
    tree, gen = _trees(bsz=2, seed=5)
    bsz, m = tree.parents.shape
    target = _target_following(tree, gen, follow_prob=0.9)
    accept_index, accept_len, bonus = greedy_walk(tree, target)
    arrays = _arrays(tree, torch.zeros(bsz, dtype=torch.long), torch.tensor([2, 3]), 5)
    plan = commit_plan(accept_index, accept_len, bonus, arrays.slots, arrays.out_cache_loc, tree.tokens,
                       torch.tensor([2, 3]))
    width = accept_index.shape[1]
    rows = plan.hidden_rows.view(bsz, width)
    node_tokens = torch.cat([torch.zeros(bsz, 1, dtype=torch.long), tree.tokens], 1)
    for b in range(bsz):
        n = int(accept_len[b])
        for k in range(n + 1):
            assert rows[b, k] == b * m + accept_index[b, k]
        assert ((rows[b] >= b * m) & (rows[b] < (b + 1) * m)).all()  # only the request's own rows
        assert plan.out_tokens[b, :n].tolist() == [int(node_tokens[b, accept_index[b, k]]) for k in range(1, n + 1)]
        assert plan.out_tokens[b, n] == bonus[b] and not plan.out_tokens[b, n + 1 :].any()
        assert plan.last_node[b] == accept_index[b, n]


def test_emitted_tokens_from_a_path():
    path_tokens = torch.tensor([[9, 4, 5, 6], [9, 7, 0, 0]])
    out = out_tokens_from_path(path_tokens, torch.tensor([2, 1]), torch.tensor([11, 12]))
    assert out.tolist() == [[4, 5, 11, 0], [7, 12, 0, 0]]


def test_recurrent_state_commit_uses_the_last_accepted_node_not_the_length():
    # root 0; children of root: 1, 2; child of 2: 3; children of 3: 4, 5. Accepted path 0 -> 2 -> 3 -> 5.
    accept_index = torch.tensor([[0, 2, 3, 5, -1], [0, 1, -1, -1, -1]])
    accept_len = torch.tensor([3, 1])
    last = last_accepted_node(accept_index, accept_len)
    assert last.tolist() == [5, 1]
    assert last.tolist() != accept_len.tolist()  # a chain assumption would commit node 3 for request 0
    idx, track = tree_mamba_commit_indices(accept_index, accept_len, torch.tensor([6, 6]), None)
    assert idx.tolist() == [5, 1] and track is None
    # tracking interval 8: request 0 goes 6 -> 10, request 1 goes 6 -> 8; both cross 8 at path entry 1
    # (the token at position 7), which is node 2 for request 0 and node 1 for request 1
    idx, track = tree_mamba_commit_indices(accept_index, accept_len, torch.tensor([6, 6]), 8)
    assert track.tolist() == [2, 1]
    # 0 -> 4 and 0 -> 2 cross nothing
    _, track = tree_mamba_commit_indices(accept_index, accept_len, torch.tensor([0, 0]), 8)
    assert track.tolist() == [-1, -1]


@pytest.mark.parametrize("world", [2, 3])
def test_vocab_sharded_topk_gives_the_same_tree_as_full_logits(world):
    gen = torch.Generator().manual_seed(11)
    bsz, depth, vocab, budget = 2, 4, 61, 8
    logits = torch.randn(bsz, depth, vocab, generator=gen) * 2
    shard = -(-vocab // world)
    padded = torch.nn.functional.pad(logits, (0, shard * world - vocab), value=0.0)
    shards = [padded[..., r * shard : (r + 1) * shard] for r in range(world)]

    # simulate the all-gather of every rank at once: run the ranks' steps in lockstep
    lse_parts = [torch.logsumexp(torch.where(torch.arange(shard) < max(0, min(shard, vocab - r * shard)),
                                             s.float(), torch.tensor(float("-inf"))), -1, keepdim=True)
                 for r, s in enumerate(shards)]
    results = []
    for r in range(world):
        gathered = iter([torch.cat(lse_parts, -1)])
        topk_parts = []

        def all_gather(t, _gathered=gathered, _parts=topk_parts, _r=r):
            first = next(_gathered, None)
            if first is not None:
                return first
            _parts.append(t)
            return t

        results.append(sharded_candidates(shards[r], r * shard, budget, all_gather, vocab_limit=vocab))
    logprobs = torch.cat([lp for lp, _ in results], -1)
    tokens = torch.cat([tk for _, tk in results], -1)
    sharded_tree = build_tree_from_topk(logprobs, tokens, budget)
    full_tree = build_tree(logits, budget)
    assert torch.equal(sharded_tree.tokens, full_tree.tokens)
    assert torch.equal(sharded_tree.parents, full_tree.parents)


def test_commit_plan_when_the_tree_is_smaller_than_the_drafter_block():
    """Budget 4 with block size 8 (seen failing on the H200): accept_index is block-wide, the tree has 5 nodes."""
    bsz, block_size, budget = 2, 8, 4
    gen = torch.Generator().manual_seed(11)
    tree = build_tree(torch.randn(bsz, block_size - 1, 50, generator=gen), budget)
    m = tree.parents.shape[1]
    assert m == budget + 1 < block_size
    target = _target_following(tree, gen, follow_prob=1.0)
    accept_index, accept_len, bonus = greedy_walk(tree, target)
    assert accept_index.shape[1] == block_size
    arrays = _arrays(tree, torch.zeros(bsz, dtype=torch.long), torch.tensor([1, 2]), 3)
    plan = commit_plan(accept_index, accept_len, bonus, arrays.slots, arrays.out_cache_loc, tree.tokens,
                       torch.tensor([1, 2]))
    rows = plan.hidden_rows.view(bsz, block_size)
    assert plan.out_tokens.shape == (bsz, block_size)
    for b in range(bsz):
        for k in range(int(accept_len[b]) + 1):
            assert rows[b, k] == b * m + accept_index[b, k]
        assert ((rows[b] >= b * m) & (rows[b] < (b + 1) * m)).all()
