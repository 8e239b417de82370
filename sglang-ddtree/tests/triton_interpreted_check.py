"""Run by test_triton_interpreted.py in a subprocess with TRITON_INTERPRET=1: the Triton kernels on the CPU.
``--glue-device cuda`` runs the glue and attention cases compiled on a GPU instead (bench/gpu/run_all.sh
glue-check).

Prints one JSON object per case: {"case": ..., "ok": bool, "detail": ...}.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from ddtree_testlib import heap_tree

from sglang_ddtree._triton_vocab import topk_logprobs
from sglang_ddtree.sglang import _triton_attention, _triton_glue
from sglang_ddtree.sglang.commit import commit_plan
from sglang_ddtree.sglang.verify_input import build_verify_arrays, mask_numel
from sglang_ddtree.tree import (
    DraftTree,
    build_tree,
    build_tree_from_topk,
    chain_tree,
    exact_topk,
    log_softmax_f32,
    tree_buffers,
)
from sglang_ddtree.verify import greedy_walk

torch.set_num_threads(1)
FIELDS = ("tokens", "depths", "parents", "ancestors", "first_child", "next_sibling", "num_nodes", "scores", "ranks")


def report(case, ok, detail=""):
    print(json.dumps({"case": case, "ok": bool(ok), "detail": str(detail)}), flush=True)


def vocab_case(name, x, k, expect_fallback=None):
    values, ids, row_max, row_logsum, fallback = topk_logprobs(x, k, elements=512)
    lp = (x.float() - row_max[:, None]) - row_logsum[:, None]
    ref_v, ref_i = exact_topk(lp, k)
    ok = torch.equal(ids, ref_i) and torch.equal(values, ref_v)
    ok = ok and torch.allclose(row_max + row_logsum, torch.logsumexp(x.float(), -1), atol=2e-5)
    if expect_fallback is not None:
        ok = ok and fallback.tolist() == expect_fallback
    report(f"vocab/{name}", ok, f"fallback={fallback.tolist()}")


def tree_case(name, logits, budget):
    tree = build_tree(logits, budget, backend="triton")
    lp = log_softmax_f32(logits, (tree.row_max, tree.row_logsum))
    ok, detail = True, ""
    for b in range(logits.shape[0]):
        ref = heap_tree(lp[b].numpy(), budget)
        n = len(ref)
        got = (tree.tokens[b, :n].tolist(), tree.parents[b, 1 : n + 1].tolist(), tree.scores[b, :n].tolist())
        want = ([r.token for r in ref], [r.parent for r in ref], [r.score for r in ref])
        if got != want or int(tree.num_nodes[b]) != n + 1:
            ok, detail = False, f"row {b}: got {got} want {want}"
    ids = torch.arange(logits.shape[-1]).expand_as(lp)
    torch_tree = build_tree_from_topk(lp, ids, budget, backend="torch")
    for field in FIELDS:
        if not torch.equal(getattr(tree, field), getattr(torch_tree, field)):
            ok, detail = False, f"field {field} differs from the torch backend"
    report(f"tree/{name}", ok, detail)


def tree_out_case(gen, device="cpu"):
    """build_tree into fixed storage (the drafter-graph tree head, sglang/draft_head.py): the Triton kernels write
    the first B rows in place, the result equals a tree built without it, and the rows past B are untouched."""
    import dataclasses

    logits = (torch.randn((3, 5, 300), generator=gen) * 3).to(device)
    out = tree_buffers(5, 5, 12, device)
    for f in dataclasses.fields(DraftTree):
        t = getattr(out, f.name)
        if isinstance(t, torch.Tensor):
            t.fill_(True if t.dtype == torch.bool else -7)
    got = build_tree(logits, 12, backend="triton", out=out)
    want = build_tree(logits, 12, backend="triton")
    ok, detail = True, ""
    for f in dataclasses.fields(DraftTree):
        g, w, whole = getattr(got, f.name), getattr(want, f.name), getattr(out, f.name)
        if not isinstance(g, torch.Tensor):
            continue
        if not torch.equal(g, w) or g.data_ptr() != whole.data_ptr():
            ok, detail = False, f"field {f.name} differs or is not in the buffer"
        elif not bool((whole[3:] == (True if whole.dtype == torch.bool else -7)).all()):
            ok, detail = False, f"field {f.name}: rows past the batch were written"
    report("tree/out-buffers", ok, detail)


def glue_cases(gen, device="cpu"):
    """The decode round's glue kernels against their torch references: the verify arrays and mask cells here, the
    walk + commit plan + KV moves in ``walk_commit_case``."""
    ok_prep, detail = True, ""
    cases = [(3, 7, 50, 8), (2, 15, 60, 16), (4, 7, 3, 20), (1, 3, 50, 4), (5, 5, 30, 31), (35, 3, 40, 6)]
    for bsz, depth, vocab, budget in cases:  # 35 requests: the mask offsets summed over three chunks of 16
        tree = build_tree((torch.randn(bsz, depth, vocab, generator=gen) * 3).to(device), budget, backend="torch")
        m = budget + 1
        prefix = torch.randint(0, 20, (bsz,), generator=gen).to(device)
        roots = torch.randint(0, vocab, (bsz, 4), generator=gen).to(device)[:, 0]  # a strided column, as the worker's
        r2t = torch.randperm(40 * 64, generator=gen).view(40, 64).to(torch.int32).to(device)
        rows = torch.randperm(40, generator=gen)[:bsz].to(device)
        total = mask_numel(int(prefix.sum()), bsz, m)
        buf_ref = torch.full((total + 7,), 9, dtype=torch.uint8, device=device)
        buf_got = buf_ref.clone()
        ref = build_verify_arrays(tree, roots, prefix, int(prefix.sum()), r2t, rows, buf_ref, "torch")
        got = build_verify_arrays(tree, roots, prefix, int(prefix.sum()), r2t, rows, buf_got, "triton")
        for f in ("tokens", "positions", "out_cache_loc", "retrieve_index", "slots", "custom_mask"):
            if not torch.equal(getattr(ref, f).to(torch.int64), getattr(got, f).to(torch.int64)):
                ok_prep, detail = False, f"verify_prep field {f} differs ({bsz}, {depth}, {vocab}, {budget})"
        ok_prep = ok_prep and torch.equal(buf_ref, buf_got) and got.out_cache_loc.dtype == r2t.dtype
        nomask = build_verify_arrays(tree, roots, prefix, int(prefix.sum()), r2t, rows, None, "triton")
        ok_prep = ok_prep and torch.equal(nomask.custom_mask, ref.custom_mask.bool() | (buf_ref[:total] == 9))
    report("glue/verify-prep", ok_prep, detail)
    chain_mask_case(gen, device)
    walk_commit_case(gen, device)
    ring_case(gen, device)


def ring_case(gen, device="cpu", depth=3):
    """``_triton_glue.reuse_outputs``: with the outputs reused in turn, every round's verify arrays and walk/commit
    results equal freshly allocated ones, stay intact for ``depth - 1`` later rounds of the same shapes, and the
    round ``depth`` later reuses the storage (the reuse happens)."""
    ok, detail = True, ""
    bsz, depth_tree, vocab, budget = 3, 7, 50, 8
    rounds = []
    try:
        for ring in (None, depth):
            _triton_glue.reuse_outputs(ring)
            gen_round = torch.Generator().manual_seed(5)  # the same inputs with and without the ring
            held = []
            for _ in range(depth + 1):
                tree = build_tree((torch.randn(bsz, depth_tree, vocab, generator=gen_round) * 3).to(device), budget,
                                  backend="torch")
                prefix = torch.randint(0, 20, (bsz,), generator=gen_round).to(device)
                roots = torch.randint(0, vocab, (bsz,), generator=gen_round).to(device)
                r2t = torch.randperm(40 * 64, generator=gen_round).view(40, 64).to(torch.int32).to(device)
                rows = torch.randperm(40, generator=gen_round)[:bsz].to(device)
                target = torch.randint(0, vocab, (bsz, budget + 1), generator=gen_round).to(device)
                arrays = build_verify_arrays(tree, roots, prefix, int(prefix.sum()), r2t, rows, None, "triton")
                index, length, bonus, plan = _triton_glue.walk_commit(
                    tree.parents, tree.tokens, target, tree.max_depth, arrays.slots, arrays.out_cache_loc, prefix)
                out = [arrays.tokens, arrays.positions, arrays.out_cache_loc, arrays.retrieve_index, arrays.slots,
                       index, length, bonus, *plan.values()]
                held.append((out, [t.clone() for t in out]))
                for earlier, (views, copies) in enumerate(held[-depth:]):  # the last depth rounds still intact
                    if not all(torch.equal(v, c) for v, c in zip(views, copies, strict=True)):
                        ok, detail = False, f"ring {ring}: a round's outputs changed {len(held) - 1 - earlier} later"
            rounds.append(held)
        fresh, reused = rounds
        for i, ((_, a), (_, b)) in enumerate(zip(fresh, reused, strict=True)):
            if not all(torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(a, b, strict=True)):
                ok, detail = False, f"round {i}: the ring's outputs differ from fresh ones"
        first, again = reused[0][0], reused[depth][0]
        if [t.data_ptr() for t in first] != [t.data_ptr() for t in again]:
            ok, detail = False, f"the round {depth} later did not reuse the first round's outputs"
    finally:
        _triton_glue.reuse_outputs(None)
    report("glue/ring", ok, detail)


def chain_mask_case(gen, device="cpu"):
    """``chain_mask`` (the causal cells of DFLASH's block verify, one launch) against ``write_chain_mask``'s torch
    reference: every tree cell written, nothing else touched (bool and uint8 buffers; 35 requests: the offsets summed
    over three chunks of 16)."""
    from sglang_ddtree.sglang.verify_input import write_chain_mask

    ok, detail = True, ""
    for bsz, m, dtype in [(1, 16, torch.uint8), (3, 8, torch.bool), (35, 16, torch.uint8), (2, 33, torch.uint8)]:
        prefix = torch.randint(0, 40, (bsz,), generator=gen).to(device)
        total = mask_numel(int(prefix.sum()), bsz, m)
        start = torch.randint(0, 2, (total + 5,), generator=gen).to(device=device, dtype=dtype)
        ref, got = start.clone(), start.clone()
        view_ref = write_chain_mask(ref, prefix, int(prefix.sum()), m, backend="torch")
        view_got = write_chain_mask(got, prefix, int(prefix.sum()), m, backend="triton")
        if not (torch.equal(ref, got) and view_got.numel() == total == view_ref.numel()):
            ok, detail = False, f"chain mask differs (batch {bsz}, width {m}, {dtype})"
    report("glue/chain-mask", ok, detail)


def walk_commit_case(gen, device="cpu"):
    """``walk_commit`` (walk + plan + KV moves in one launch) against ``greedy_walk`` and ``commit_plan`` and
    the plan's moves applied by gather-then-scatter, with and without the move table; trees smaller and larger than
    the drafter block, paths on and off the argmax chain."""
    ok, detail = True, ""
    for bsz, depth, vocab, budget in [(3, 7, 50, 8), (2, 15, 60, 16), (4, 7, 3, 20), (1, 7, 50, 4), (5, 5, 30, 31)]:
        tree = build_tree((torch.randn(bsz, depth, vocab, generator=gen) * 3).to(device), budget, backend="torch")
        m = budget + 1
        prefix = torch.randint(0, 20, (bsz,), generator=gen).to(device)
        roots = torch.randint(0, vocab, (bsz,), generator=gen).to(device)
        r2t = torch.randperm(40 * 64, generator=gen).view(40, 64).to(torch.int32).to(device)
        rows = torch.randperm(40, generator=gen)[:bsz].to(device)
        arrays = build_verify_arrays(tree, roots, prefix, int(prefix.sum()), r2t, rows, None, "torch")
        for trial in range(3):
            target = torch.randint(0, vocab, (bsz, m), generator=gen).to(device)
            for b in range(bsz):  # follow a random existing path, or (trial 0, request 0) none at all
                valid = int(tree.num_nodes[b])
                node = int(torch.randint(1, valid, (), generator=gen)) if valid > 1 and (trial, b) != (0, 0) else 0
                while node > 0:
                    parent = int(tree.parents[b, node])
                    target[b, parent] = tree.tokens[b, node - 1]
                    node = parent
            index, length, bonus = greedy_walk(tree, target, backend="torch")
            want = commit_plan(index, length, bonus, arrays.slots, arrays.out_cache_loc, tree.tokens, prefix)
            kv = [torch.randn(40 * 64, 2, 12, generator=gen).to(device) for _ in range(2)]  # 96-byte rows
            before = [t.clone() for t in kv]
            expect = [t.clone() for t in kv]
            moving = want.move_src >= 0
            for e in expect:
                e[want.move_dst[moving]] = e[want.move_src[moving]].clone()
            ptrs = torch.tensor([t.data_ptr() for t in kv], dtype=torch.uint64, device=device)
            strides = torch.tensor([t[0].numel() * t.element_size() for t in kv], dtype=torch.int64, device=device)
            for table in (None, (ptrs, strides)):
                got = _triton_glue.walk_commit(tree.parents, tree.tokens, target, tree.max_depth, arrays.slots,
                                               arrays.out_cache_loc, prefix, table, tile=64)
                for name, a, b in zip(("accept_index", "accept_len", "bonus"), (index, length, bonus), got[:3],
                                      strict=True):
                    if not torch.equal(a.to(torch.int64), b):
                        ok, detail = False, f"{name} differs ({bsz}, {depth}, {budget})"
                for f in want.__dataclass_fields__:
                    a, b = getattr(want, f), got[3][f]
                    if a.dtype != b.dtype or not torch.equal(a, b):
                        ok, detail = False, f"plan field {f} differs ({bsz}, {depth}, {budget})"
                if table is None and not all(torch.equal(a, b) for a, b in zip(kv, before, strict=True)):
                    ok, detail = False, "KV moved without a move table"
            if not all(torch.equal(a, b) for a, b in zip(kv, expect, strict=True)):
                ok, detail = False, f"KV moves differ ({bsz}, {depth}, {budget})"
    report("glue/walk-commit", ok, detail)


def _compiled_variants(kernels):
    """Compiled variants of each JIT kernel (Triton's per-device caches), or None where this Triton keeps them
    elsewhere (or the interpreter runs them)."""
    counts = {}
    for name, fn in kernels.items():
        caches = getattr(fn, "device_caches", None)
        if caches is not None:
            counts[name] = sum(len(entry[0]) for entry in caches.values())
        elif isinstance(getattr(fn, "cache", None), dict):
            counts[name] = sum(len(entry) for entry in fn.cache.values())
        else:
            return None
    return counts


def warmup_cases(gen, device="cpu"):
    """warmup.warm_round_kernels runs the whole glue for every candidate width (the chain, tree prefixes, the
    widest tree; TP > 1 trees from candidate lists; with and without a mask buffer). On CUDA also: rounds at other
    batch sizes and prefix lengths afterwards compile no new kernel variant."""
    from sglang_ddtree import _triton_tree, _triton_vocab
    from sglang_ddtree.budget import CHAIN, tree_prefix
    from sglang_ddtree.sglang.warmup import warm_round_kernels

    dev = torch.device(device)
    common = dict(device=dev, budget=16, depth=7, vocab_size=50, vocab_rows=64, index_dtype=torch.int32)
    done = warm_round_kernels(candidates=[CHAIN, 4, 8, 16], logits_dtype=torch.bfloat16, **common)
    report("warmup/widths", done["widths"] == [8, 5, 9, 17], done)
    done = warm_round_kernels(candidates=[16], logits_dtype=torch.float32, tp_world=2, mask_dtype=torch.bool,
                              move_kernel=False, **common)
    report("warmup/tp", done["widths"] == [17], done)
    kernels = {
        "scan": _triton_vocab._vocab_scan, "select": _triton_vocab._vocab_select, "tree": _triton_tree._tree_kernel,
        "prep": _triton_glue._verify_prep_kernel, "walk_commit": _triton_glue._walk_commit_kernel,
        "chain_mask": _triton_glue._chain_mask_kernel,
    }
    warm_round_kernels(candidates=[CHAIN, 4, 8, 16], logits_dtype=torch.bfloat16, **common)
    before = _compiled_variants(kernels)
    if dev.type != "cuda" or before is None:
        return
    pool = torch.zeros((40 * 512, 16), dtype=torch.uint8, device=dev)  # every location of the rounds below
    pool_ptrs = torch.tensor([pool.data_ptr()], dtype=torch.uint64, device=dev)
    pool_strides = torch.tensor([16], dtype=torch.int64, device=dev)
    for bsz in (1, 7, 40):
        wide = torch.randn(bsz * 7, 64, generator=gen).to(device=dev, dtype=torch.bfloat16)
        tree = build_tree(wide[:, :50].view(bsz, 7, 50), 16, backend="triton")
        for verified in (chain_tree(tree, backend="triton"), tree_prefix(tree, 4), tree_prefix(tree, 8), tree):
            m = verified.budget + 1
            prefix = torch.randint(1, 300, (bsz,), generator=gen).to(dev)
            r2t = torch.arange(bsz * 512, dtype=torch.int32, device=dev).view(bsz, 512)
            rows = torch.randperm(bsz, generator=gen).to(dev)
            roots = torch.zeros((bsz, 16), dtype=torch.int64, device=dev)[:, 0]
            total = mask_numel(int(prefix.sum()), bsz, m)
            arrays = build_verify_arrays(verified, roots, prefix, int(prefix.sum()), r2t, rows,
                                         torch.zeros(total, dtype=torch.uint8, device=dev), "triton")
            if verified.budget == 7:  # the chain: DFLASH's round writes the block's causal cells instead
                _triton_glue.chain_mask(torch.zeros(total, dtype=torch.uint8, device=dev), prefix, m, total)
            target = torch.randint(0, 50, (bsz, m), device=dev)
            _triton_glue.walk_commit(verified.parents, verified.tokens, target, verified.max_depth, arrays.slots,
                                     arrays.out_cache_loc, prefix, (pool_ptrs, pool_strides))
    after = _compiled_variants(kernels)
    report("warmup/covers-later-rounds", after == before, f"variants before {before}, after {after}")


def attention_inputs(gen, prefixes, m, hq, hkv, d, dtype, device):
    """A verify batch: random q/k/v and pool, each request's prefix at random slots, a random tree per request in
    the FULL_MASK layout whose prefix cells are random too (the kernel must never read them)."""
    bsz, pool = len(prefixes), sum(prefixes) + 9

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    cells, starts = [], [0]
    for p in prefixes:
        anc = torch.eye(m, dtype=torch.bool)
        for i in range(1, m):
            anc[i] |= anc[int(torch.randint(0, i, (), generator=gen))]
        block = torch.randint(0, 2, (m, p + m), generator=gen, dtype=torch.uint8)
        block[:, p:] = anc
        cells.append(block.reshape(-1))
        starts.append(starts[-1] + m * (p + m))
    lens = torch.tensor([0, *prefixes])
    return dict(
        q=rnd(bsz * m, hq, d), k=rnd(bsz * m, hkv, d), v=rnd(bsz * m, hkv, d), k_buffer=rnd(pool, hkv, d),
        v_buffer=rnd(pool, hkv, d), qo_indptr=torch.arange(0, (bsz + 1) * m, m, dtype=torch.int32).to(device),
        kv_indptr=torch.cumsum(lens, 0).to(device=device, dtype=torch.int32),
        kv_indices=torch.randperm(pool, generator=gen)[: sum(prefixes)].to(device=device, dtype=torch.int64),
        custom_mask=torch.cat(cells).to(device), mask_indptr=torch.tensor(starts, dtype=torch.int64).to(device))


def attention_cases(gen, device="cpu"):
    """The plugin's tree verify attention against the torch reference (prefix splits 1 and 3, prefixes 0..70,
    GQA groups 1 and 4, M 5 and 17) and against SGLang's own ``extend_attention_fwd``; the router sends a tree
    call to the plugin's kernel and anything else to SGLang's."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    tol = 1e-4 if device == "cpu" else 2e-2
    ok, detail = True, []
    # (prefixes, M, Hq, Hkv, D, splits, min_chunk): one program per request; the prefix split three ways with every
    # split busy (min_chunk 8) or with the short prefixes left to the first split; G = 1, 4, 6; D up to 128
    for prefixes, m, hq, hkv, d, splits, chunk in [([5, 0, 70], 17, 8, 2, 32, 1, 256), ([5, 0, 70], 17, 8, 2, 32, 3, 8),
                                                   ([5, 0, 70], 17, 8, 2, 32, 3, 64), ([130], 5, 4, 4, 16, 2, 16),
                                                   ([3, 40], 9, 12, 2, 64, 1, 256),
                                                   ([40, 300], 9, 8, 2, 128, 3, 64)]:  # merged in two column halves
        x = attention_inputs(gen, prefixes, m, hq, hkv, d, dtype, device)
        ref = _triton_attention.tree_verify_attention_torch(sm_scale=d ** -0.5, **{n: t.cpu() for n, t in x.items()})
        for _ in range(2):  # a second call over the same buffers gives the same result
            o = torch.zeros_like(x["q"])
            _triton_attention.tree_verify_attention(o=o, max_q=m, sm_scale=d ** -0.5, splits=splits,
                                                    min_chunk=chunk, **x)
            err = (o.float().cpu() - ref).abs().max().item()
            ok = ok and err < tol
        detail.append(f"{prefixes} m={m} G={hq // hkv} S={splits} chunk>={chunk}: {err:.2e}")
    report("attention/reference", ok, "; ".join(detail))

    try:
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    except Exception as exc:  # an environment without SGLang: the reference case above still ran
        report("attention/sglang", False, f"SGLang's extend_attention_fwd does not import: {exc}")
        return
    x = attention_inputs(gen, [7, 0, 33], 17, 8, 2, 32, dtype, device)
    theirs, ours = torch.zeros_like(x["q"]), torch.zeros_like(x["q"])
    args = (x["q"], x["k"], x["v"], theirs, x["k_buffer"], x["v_buffer"], x["qo_indptr"], x["kv_indptr"],
            x["kv_indices"], x["custom_mask"], True, x["mask_indptr"], 17, 1.0, 1.0)
    extend_attention_fwd(*args, sm_scale=32 ** -0.5)
    _triton_attention.tree_verify_attention(o=ours, max_q=17, sm_scale=32 ** -0.5, **x)
    err = (ours.float() - theirs.float()).abs().max().item()
    report("attention/sglang", err < tol, f"max |ours - SGLang's| {err:.2e}")

    import functools

    from sglang_ddtree.sglang.verify_attention import route_verify_attention

    calls = []

    @functools.wraps(extend_attention_fwd)
    def counted(*a, **kw):
        calls.append(kw.get("logit_cap", 0.0))
        return extend_attention_fwd(*a, **kw)

    class Backend:  # stand-in: the instance attribute TritonAttnBackend.__init__ sets and forward_extend calls
        def __init__(self):
            self.extend_attention_fwd = counted

    backend = Backend()
    routed = route_verify_attention(backend) and route_verify_attention(backend)  # idempotent
    out = torch.zeros_like(x["q"])
    backend.extend_attention_fwd(*args[:3], out, *args[4:], sm_scale=32 ** -0.5)  # a tree verify: ours
    ours_routed = len(calls) == 0 and torch.equal(out, ours)
    backend.extend_attention_fwd(*args[:3], out, *args[4:], sm_scale=32 ** -0.5, logit_cap=30.0)  # soft cap: theirs
    backend.extend_attention_fwd(*args[:9], None, True, None, 17, 1.0, 1.0, sm_scale=32 ** -0.5)  # causal: theirs
    report("attention/router", routed and ours_routed and calls == [30.0, 0.0], f"calls to SGLang's: {calls}")


def main():
    if "--glue-device" in sys.argv:
        device = sys.argv[sys.argv.index("--glue-device") + 1]
        glue_cases(torch.Generator().manual_seed(0), device)
        tree_out_case(torch.Generator().manual_seed(3), device)
        warmup_cases(torch.Generator().manual_seed(2), device)
        attention_cases(torch.Generator().manual_seed(1), device)
        return 0
    assert os.environ.get("TRITON_INTERPRET") == "1"
    gen = torch.Generator().manual_seed(0)
    vocab_case("random", torch.randn((3, 1000), generator=gen), 8, [0, 0, 0])
    vocab_case("bf16-ties", (torch.randn((3, 1000), generator=gen) * 3).to(torch.bfloat16), 16, [0, 0, 0])
    vocab_case("fp16", torch.randn((2, 700), generator=gen).to(torch.float16), 5)
    vocab_case("int-ties", torch.randint(0, 3, (2, 700), generator=gen).float(), 8)
    vocab_case("uniform", torch.zeros((2, 300)), 5)
    masked = torch.randn((2, 500), generator=gen)
    masked[0, 100:] = float("-inf")
    vocab_case("masked", masked, 4)
    vocab_case("k-equals-v", torch.randn((2, 50), generator=gen), 50)
    merge = torch.full((1, 2000), -30.0)
    merge[0, 0] = 60.0
    merge[0, 1000] = 1.0
    merge[0, 600] = torch.nextafter(torch.tensor(1.0), torch.tensor(0.0))  # same log-prob as 1.0, lower id
    vocab_case("rounding-merge-fallback", merge, 2, [1])

    tree_case("random", torch.randn((2, 4, 40), generator=gen) * 3, 8)
    tree_case("ties", torch.randint(0, 2, (2, 3, 5), generator=gen).float(), 12)
    tree_case("uniform-unfillable", torch.zeros((1, 2, 2)), 8)
    zeros = torch.full((2, 3, 6), -1e30)
    zeros[..., 0] = 0.0
    tree_case("exact-zero", zeros, 6)
    tree_case("one-token-chain", torch.zeros((1, 4, 1)), 3)
    tree_case("bf16", (torch.randn((1, 3, 30), generator=gen) * 2).to(torch.bfloat16), 7)
    tree_out_case(gen)
    lp = torch.log_softmax(torch.randint(0, 3, (2, 3, 9), generator=gen).float(), -1)
    lp[0, 0, 2] = -0.0
    ids = torch.arange(9).expand(2, 3, 9)
    a = build_tree_from_topk(lp, ids, 6, backend="triton")
    b = build_tree_from_topk(lp, ids, 6, backend="torch")
    report("from-topk", all(torch.equal(getattr(a, f), getattr(b, f)) for f in FIELDS))

    for name, logits, budget in [
        ("random", torch.randn((3, 5, 12), generator=gen), 14),
        ("unfillable", torch.zeros((2, 2, 2)), 9),
        ("chain", torch.zeros((2, 4, 1)), 4),
    ]:
        tree = build_tree(logits, budget, backend="torch")
        ok = True
        for trial in range(4):
            target = torch.randint(0, logits.shape[-1], (logits.shape[0], budget + 1), generator=gen)
            for b in range(logits.shape[0]):  # follow an existing path to the deepest node, then stop
                node = int(tree.num_nodes[b]) - 1 - trial
                while node > 0:
                    parent = int(tree.parents[b, node])
                    target[b, parent] = tree.tokens[b, node - 1]
                    node = parent
            got = greedy_walk(tree, target, backend="triton")
            want = greedy_walk(tree, target, backend="torch")
            ok = ok and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
            ok = ok and int(want[1].max()) >= 1
        report(f"walk/{name}", ok)
    glue_cases(gen)
    warmup_cases(gen)
    attention_cases(gen)


if __name__ == "__main__":
    sys.exit(main())
