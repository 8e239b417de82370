"""Exact, batched, host-sync-free construction of DDTree draft trees.

DDTree (Ringel & Romano, "Accelerating Speculative Decoding with Block Diffusion Draft Trees") drafts one
block with a DFlash drafter: one pass gives per-depth distributions q_1..q_D over the vocabulary. Under a node
budget N, the reference implementation grows a tree with a best-first heap over *rank tuples*
``(r_1, ..., r_d)`` (r_k = rank of the token at depth k among that depth's candidates) and pops the N tuples
with the highest summed log-probability. This module computes exactly the same tree, in the same pop order,
for a whole batch at once, on the device of the input, with static shapes and without host synchronisation
(no ``.item()``, ``.cpu()``, ``.tolist()``, ``nonzero`` or boolean-mask indexing), so it can be captured in
a CUDA graph.

The total order (the contract; see ``README.md``):

* per depth, candidates are ranked by float32 log-probability descending, ties by token id ascending; only the
  best ``K = min(budget, V)`` candidates per depth can ever be used (a node of rank r needs its r elder
  siblings in the tree);
* the score of a tuple is the sum of its float32 log-probabilities, accumulated left to right in float64
  (``score(child) = score(parent) + float64(logprob)``; ``-0.0`` is treated as ``+0.0``);
* tuples are ordered by score descending, ties by the rank tuple in lexicographic ascending order (a prefix
  sorts before its extensions).

Why a beam reproduces the heap (proof sketch, exact under float rounding): log-probabilities are <= 0 and
float addition is monotone, so ``score(child) <= score(parent)`` and a tie is resolved towards the parent
(its tuple is a prefix); likewise an elder sibling never sorts after a younger one. Hence every tuple sorts
after its heap predecessors (parent, elder sibling), the heap pops the tuples in exactly this total order,
and the popped set S (the top N tuples) is prefix-closed. Let B_1 be all depth-1 candidates and B_d the best
N children of B_{d-1}. If S∩depth(d-1) ⊆ B_{d-1}, then S∩depth(d) ⊆ children(B_{d-1}); S∩depth(d) is a
top-set of all depth-d tuples, hence a top-set (of size <= N) of children(B_{d-1}), hence ⊆ B_d. By
induction S is contained in the union of the B_d, so S is the top N of that union. No step relies on scores
being distinct.

Implementation: each beam is kept in lexicographic order (slot order == lexicographic order), so
enumerating children as ``slot * K + rank`` enumerates them in lexicographic order and a *stable* descending
sort by score yields (score desc, lexicographic asc) exactly. Across depths, the lexicographic position is
the preorder index in the trie formed by the beams (computed from subtree sizes, see ``_preorder``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

import torch

__all__ = [
    "DraftTree",
    "build_tree",
    "build_tree_from_topk",
    "chain_tree",
    "exact_topk",
    "log_softmax_f32",
    "order_key_f32",
    "resolve_backend",
    "row_normalizer",
    "tree_buffers",
    "tree_rows",
]

_LOW_MASK = (1 << 31) - 1


@dataclass(frozen=True)
class DraftTree:
    """A batch of draft trees. Node 0 of every row is the root (the last verified token, not drafted here).

    Shapes use B = batch, N = budget (draft nodes), D = depth limit (drafter block size - 1).

    Attributes:
        tokens: int64 [B, N]. Token of draft node i+1 (column i). 0 in padding columns.
        depths: int64 [B, N]. Depth of draft node i+1, 1..D (the root has depth 0). 0 in padding columns.
        parents: int64 [B, N+1]. Parent node index; parents[:, 0] = -1 (root); every parent index is lower
            than its child's index (nodes are in heap pop order). -1 for padding nodes.
        ancestors: bool [B, N+1, N+1]. ancestors[b, i, j] is True iff node j is an ancestor of node i or
            j == i (the attention mask of the verify pass: node i may attend to node j).
        first_child: int64 [B, N+1]. Lowest-index child of each node, -1 if none.
        next_sibling: int64 [B, N+1]. Next child (in index order) of the same parent, -1 if none. Children
            of a node appear in rank order, so sibling order is "more likely first".
        num_nodes: int64 [B]. Number of valid nodes INCLUDING the root: N+1 unless the tree cannot be filled
            (only when sum_{d<=D} min(N, V)^d < N, i.e. a tiny vocabulary); then nodes num_nodes..N are padding
            (token 0, depth 0, parent -1, no children, attend only to themselves).
        scores: float64 [B, N]. Summed log-probability of each node's path (-inf in padding columns).
        ranks: int64 [B, N]. Candidate rank of each node's token at its depth (0 = the drafter's best); -1 in
            padding columns.
        logprobs: float32 [B, N]. Drafter log-probability of each node's token at its depth (q of the node).
        max_depth: D, the depth limit (static).
        row_max, row_logsum: float32 [B, D] or None. The log-softmax normaliser used by ``build_tree``:
            ``logprob = (float32(logit) - row_max) - row_logsum`` (None for ``build_tree_from_topk``).
        top1_tokens, top1_logprobs: int64 / float32 [B, D] or None. The rank-0 candidate of every depth and its
            log-probability (the drafter's argmax chain, what DFLASH verifies: :func:`chain_tree`), from the
            per-depth candidates the tree was built from (free: they are sorted).
    """

    tokens: torch.Tensor
    depths: torch.Tensor
    parents: torch.Tensor
    ancestors: torch.Tensor
    first_child: torch.Tensor
    next_sibling: torch.Tensor
    num_nodes: torch.Tensor
    scores: torch.Tensor
    ranks: torch.Tensor
    logprobs: torch.Tensor
    max_depth: int
    row_max: torch.Tensor | None = None
    row_logsum: torch.Tensor | None = None
    top1_tokens: torch.Tensor | None = None
    top1_logprobs: torch.Tensor | None = None

    @property
    def budget(self) -> int:
        """N, the number of draft nodes (excluding the root)."""
        return int(self.tokens.shape[1])

    @property
    def positions(self) -> torch.Tensor:
        """int64 [B, N+1]: position offset of every node relative to the root (= depth; root 0)."""
        zero = torch.zeros_like(self.depths[:, :1])
        return torch.cat([zero, self.depths], dim=1)

    @property
    def valid(self) -> torch.Tensor:
        """bool [B, N+1]: True for real nodes (root included), False for padding."""
        idx = torch.arange(self.parents.shape[1], device=self.parents.device)
        return idx[None, :] < self.num_nodes[:, None]


def row_normalizer(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row max, log(sum(exp(x - max)))) in float32 over the last dim (the torch backend's normaliser)."""
    x = logits.float()
    row_max = x.amax(dim=-1)
    shift = torch.where(torch.isinf(row_max), 0.0, row_max)
    row_logsum = torch.log(torch.exp(x - shift[..., None]).sum(dim=-1))
    return row_max, row_logsum


def log_softmax_f32(logits: torch.Tensor, normalizer: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Float32 log-probabilities as the tree defines them: ``(x - row_max) - row_logsum``.

    ``normalizer`` defaults to :func:`row_normalizer`; pass ``(tree.row_max, tree.row_logsum)`` to reproduce
    exactly the values a ``build_tree`` call ranked (the Triton backend sums the exponentials in another order,
    so its ``row_logsum`` may differ in the last bit).
    """
    row_max, row_logsum = row_normalizer(logits) if normalizer is None else normalizer
    return (logits.float() - row_max[..., None]) - row_logsum[..., None]


def order_key_f32(values: torch.Tensor) -> torch.Tensor:
    """Map float32 values to int32 keys with the same order (``-0.0`` and ``+0.0`` map to the same key).

    Not defined for NaN.
    """
    if values.dtype != torch.float32:
        raise TypeError(f"order_key_f32 needs float32 values, got {values.dtype}; cast with .float() first")
    bits = (values + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    return bits ^ ((bits >> 31) & _LOW_MASK)


def _packed_key(logprobs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """int64 keys whose descending order is (logprob desc, token asc); unique for distinct tokens."""
    high = order_key_f32(logprobs).to(torch.int64) << 32
    return high + (_LOW_MASK - tokens.to(torch.int64))


def exact_topk(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact, deterministic top-k along the last dim: by value descending, ties by index ascending.

    Args:
        logprobs: float32 [..., V].
        k: 1 <= k <= V.

    Returns:
        (values float32 [..., k], indices int64 [..., k]) in that order.
    """
    vocab = logprobs.shape[-1]
    if not 1 <= k <= vocab:
        raise ValueError(f"exact_topk: k={k} must be in 1..{vocab} (the size of the last dimension)")
    ids = torch.arange(vocab, device=logprobs.device, dtype=torch.int64)
    keys = _packed_key(logprobs, ids)
    top_keys, _ = torch.topk(keys, k, dim=-1, largest=True, sorted=True)
    indices = _LOW_MASK - (top_keys & 0xFFFFFFFF)
    values = torch.gather(logprobs, -1, indices)
    return values, indices


def _check_budget(budget: int) -> int:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget={budget!r} is invalid: the node budget must be an int >= 1 (e.g. budget=16)")
    return budget


_TRITON_FAILURE: list[str] = []  # set once if the Triton kernels fail to compile or launch in "auto" mode


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """Return "torch" or "triton" for ``backend`` (explicit, else $SGLANG_DDTREE_BACKEND, else "auto").

    "auto" means Triton on CUDA when triton is importable and its kernels have not failed in this process.
    """
    return _resolve(backend, device)[0]


def _resolve(backend: str | None, device: torch.device) -> tuple[str, bool]:
    choice = backend or os.environ.get("SGLANG_DDTREE_BACKEND", "auto")
    if choice not in ("auto", "torch", "triton"):
        raise ValueError(f"backend={choice!r} is invalid: use 'auto', 'torch' or 'triton' (SGLANG_DDTREE_BACKEND)")
    if choice == "auto":
        use = device.type == "cuda" and _triton_available() and not _TRITON_FAILURE
        return ("triton" if use else "torch"), True
    if choice == "triton" and not _triton_available():
        raise ValueError("backend='triton' needs the triton package; install it or use backend='torch'")
    return choice, False


def _triton_failed(exc: Exception) -> None:
    """In "auto" mode a Triton failure (e.g. an unsupported Triton version) falls back to torch, loudly."""
    import warnings

    _TRITON_FAILURE.append(f"{type(exc).__name__}: {exc}")
    warnings.warn(
        f"sglang_ddtree: the Triton tree kernels failed ({_TRITON_FAILURE[0][:500]}); using the torch backend "
        "(same trees, slower). Set SGLANG_DDTREE_BACKEND=triton to make this an error.",
        RuntimeWarning,
        stacklevel=3,
    )


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def tree_buffers(batch: int, depth: int, budget: int, device: torch.device | str) -> DraftTree:
    """Uninitialised storage for the trees of up to ``batch`` requests (``build_tree``'s ``out``): fixed addresses,
    so that a tree built inside a CUDA graph is read after every replay (``sglang/draft_head.py``)."""
    n1 = budget + 1

    def empty(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=device)

    return DraftTree(
        tokens=empty(batch, budget), depths=empty(batch, budget), parents=empty(batch, n1),
        ancestors=empty(batch, n1, n1, dtype=torch.bool), first_child=empty(batch, n1), next_sibling=empty(batch, n1),
        num_nodes=empty(batch), scores=empty(batch, budget, dtype=torch.float64), ranks=empty(batch, budget),
        logprobs=empty(batch, budget, dtype=torch.float32), max_depth=depth,
        row_max=empty(batch, depth, dtype=torch.float32), row_logsum=empty(batch, depth, dtype=torch.float32),
        top1_tokens=empty(batch, depth), top1_logprobs=empty(batch, depth, dtype=torch.float32),
    )


def tree_rows(tree: DraftTree, rows: int) -> DraftTree:
    """The trees of the first ``rows`` requests (views, no copy)."""
    return DraftTree(**{f.name: _rows(getattr(tree, f.name), rows) for f in fields(DraftTree)})


def _rows(value, rows: int):
    return value[:rows] if isinstance(value, torch.Tensor) else value


def _check_out(out: DraftTree, bsz: int, depth: int, budget: int) -> None:
    if out.tokens.shape[0] < bsz or out.budget != budget or out.max_depth != depth:
        raise ValueError(f"out holds {out.tokens.shape[0]} trees of budget {out.budget} and depth {out.max_depth}; "
                         f"this batch needs {bsz} of budget {budget} and depth {depth} (tree_buffers)")


def _store(out: DraftTree, tree: DraftTree) -> DraftTree:
    """``tree`` copied into the first rows of ``out`` (fields a kernel already wrote there are left as they are);
    returns those rows."""
    kept = tree_rows(out, tree.tokens.shape[0])
    for f in fields(DraftTree):
        src, dst = getattr(tree, f.name), getattr(kept, f.name)
        if isinstance(src, torch.Tensor) and src.data_ptr() != dst.data_ptr():
            dst.copy_(src)
    return kept


def build_tree(draft_logits: torch.Tensor, budget: int, *, backend: str | None = None,
               out: DraftTree | None = None) -> DraftTree:
    """Build the exact DDTree draft trees of a batch from drafter logits.

    Args:
        draft_logits: [B, D, V] logits (any float dtype) of the drafter at block positions 1..D
            (position 0 is the root/bonus token). Log-probabilities are
            ``(float32(x) - row_max) - row_logsum`` (see :func:`log_softmax_f32`; returned in the tree).
        budget: N >= 1, number of draft nodes per tree (the verify pass has N+1 tokens per request).
        backend: "torch" (pure torch ops, any device), "triton" (fused kernels; CUDA, or CPU under
            TRITON_INTERPRET=1), or None/"auto" (Triton on CUDA when available). Both give the exact tree of
            the log-probabilities they report.
        out: storage from :func:`tree_buffers` (at least B trees of this budget and depth): the tree is written
            into its first B rows (the Triton kernels write there directly) and returned as views of them.

    Returns:
        DraftTree on the device of ``draft_logits``.
    """
    if draft_logits.dim() != 3:
        raise ValueError(
            f"draft_logits must have shape [B, D, V], got {tuple(draft_logits.shape)}; add a batch dimension "
            "with draft_logits[None] for a single request"
        )
    budget = _check_budget(budget)
    bsz, depth, vocab = draft_logits.shape
    if out is not None:
        _check_out(out, bsz, depth, budget)
    k = min(budget, int(vocab))
    chosen, auto = _resolve(backend, draft_logits.device)
    if chosen == "triton":
        try:
            from ._triton_tree import build_sorted
            from ._triton_vocab import topk_logprobs

            norm = None if out is None else (out.row_max[:bsz].view(-1), out.row_logsum[:bsz].view(-1))
            values, indices, row_max, row_logsum, _ = topk_logprobs(draft_logits.reshape(bsz * depth, vocab), k,
                                                                    normalizer_out=norm)
            values, indices = values.view(bsz, depth, k), indices.view(bsz, depth, k)
            tree = DraftTree(
                **build_sorted(values, indices, budget, out=None if out is None else tree_rows(out, bsz)),
                max_depth=depth,
                row_max=row_max.view(bsz, depth),
                row_logsum=row_logsum.view(bsz, depth),
                top1_tokens=indices[..., 0],
                top1_logprobs=values[..., 0],
            )
            return tree if out is None else _store(out, tree)
        except Exception as exc:
            if not auto or _is_capturing():
                raise
            _triton_failed(exc)
    row_max, row_logsum = row_normalizer(draft_logits)
    values, indices = exact_topk(log_softmax_f32(draft_logits, (row_max, row_logsum)), k)
    tree = _build_sorted(values, indices, budget)
    tree = replace(tree, row_max=row_max, row_logsum=row_logsum, top1_tokens=indices[..., 0],
                   top1_logprobs=values[..., 0])
    return tree if out is None else _store(out, tree)


def build_tree_from_topk(
    topk_logprobs: torch.Tensor, topk_tokens: torch.Tensor, budget: int, *, backend: str | None = None,
    out: DraftTree | None = None,
) -> DraftTree:
    """Build the trees from per-depth candidate lists instead of full logits (e.g. gathered across TP ranks).

    The candidates need not be sorted and may be a superset (e.g. the concatenation of every vocabulary
    shard's own top-k, with log-probabilities normalised by the global log-sum-exp). For exactness each
    (row, depth) list must contain the true top ``min(budget, V)`` tokens by (log-probability desc, token
    id asc), with the same float32 values ``log_softmax_f32`` would give, and no duplicate tokens.
    Log-probabilities must be <= 0 (as any log-softmax is); NaN is not supported.

    Args:
        topk_logprobs: float32 [B, D, K'] candidate log-probabilities.
        topk_tokens: integer [B, D, K'] candidate token ids (0 <= id < 2**31).
        budget: N >= 1.
        backend: as for :func:`build_tree`.
        out: as for :func:`build_tree` (the returned views carry no ``row_max`` / ``row_logsum``: candidate lists
            have no full-vocabulary normaliser of their own).
    """
    if topk_logprobs.dim() != 3 or topk_logprobs.shape != topk_tokens.shape:
        raise ValueError(
            "topk_logprobs and topk_tokens must both have shape [B, D, K'], got "
            f"{tuple(topk_logprobs.shape)} and {tuple(topk_tokens.shape)}"
        )
    budget = _check_budget(budget)
    bsz, depth = topk_logprobs.shape[:2]
    if out is not None:
        _check_out(out, bsz, depth, budget)
    logprobs = topk_logprobs.float()
    k = min(budget, int(logprobs.shape[-1]))
    keys = _packed_key(logprobs, topk_tokens)
    _, order = torch.topk(keys, k, dim=-1, largest=True, sorted=True)
    values = torch.gather(logprobs, -1, order)
    tokens = torch.gather(topk_tokens.to(torch.int64), -1, order)
    chosen, auto = _resolve(backend, logprobs.device)
    tree = None
    if chosen == "triton":
        try:
            from ._triton_tree import build_sorted

            tree = DraftTree(**build_sorted(values, tokens, budget, out=None if out is None else tree_rows(out, bsz)),
                             max_depth=int(values.shape[1]), top1_tokens=tokens[..., 0], top1_logprobs=values[..., 0])
        except Exception as exc:
            if not auto or _is_capturing():
                raise
            _triton_failed(exc)
    if tree is None:
        tree = replace(_build_sorted(values, tokens, budget), top1_tokens=tokens[..., 0], top1_logprobs=values[..., 0])
    return tree if out is None else replace(_store(out, tree), row_max=None, row_logsum=None)


def chain_tree(tree: DraftTree, *, backend: str | None = None) -> DraftTree:
    """The drafter's argmax chain as a tree (what DFLASH verifies): node d is the rank-0 token at depth d, the
    only child of node d-1. It is the budget-D tree of a single candidate per depth (``build_tree_from_topk`` of
    the rank-0 candidates: equal field by field, tested), so every walk and glue kernel takes it as it takes any
    tree.

    Only the tokens, log-probabilities and path scores depend on the step; the shape of a chain is the same on every
    step (depths 1..D, parent d-1, one child, ancestors lower-triangular), so that part is made once per device
    and depth and shared as views, and a chain costs two small kernels (the path sums) instead of a tree build
    (about 20 launches of host time a step, which the auto budget's chain rounds paid on top of DFLASH's).

    Args:
        tree: a tree from :func:`build_tree` / :func:`build_tree_from_topk` (its ``top1_tokens`` and
            ``top1_logprobs``, [B, D]).
        backend: unused (kept for the callers': every backend gives this tree).

    Returns:
        DraftTree of budget D on the tree's device (scores: the chain's path log-probabilities, float64 sums in
        depth order; the structure tensors are read-only views shared between steps).
    """
    del backend
    if tree.top1_tokens is None or tree.top1_logprobs is None:
        raise ValueError("this tree carries no rank-0 candidates (top1_tokens): build it with build_tree")
    tokens, logprobs = tree.top1_tokens.to(torch.int64), tree.top1_logprobs.float()
    bsz, depth = int(tokens.shape[0]), int(tokens.shape[1])
    shape = _chain_shape(tokens.device, depth, bsz)
    return DraftTree(
        tokens=tokens,
        depths=shape["depths"][:bsz],
        parents=shape["parents"][:bsz],
        ancestors=shape["ancestors"][:bsz],
        first_child=shape["first_child"][:bsz],
        next_sibling=shape["next_sibling"][:bsz],
        num_nodes=shape["num_nodes"][:bsz],
        scores=torch.cumsum(logprobs.to(torch.float64) + 0.0, dim=1),  # canonical zeros, as _build_sorted's
        ranks=shape["ranks"][:bsz],
        logprobs=logprobs,
        max_depth=tree.max_depth,
        top1_tokens=tokens,
        top1_logprobs=logprobs,
    )


#: (device, depth) -> the structure of a chain of that depth for the largest batch asked so far (``chain_tree``).
_CHAIN_SHAPES: dict[tuple[str, int], dict[str, torch.Tensor]] = {}


def _chain_shape(device: torch.device, depth: int, bsz: int) -> dict[str, torch.Tensor]:
    """The step-independent fields of a depth-``depth`` chain tree, for at least ``bsz`` rows (made on the first
    request and when a larger batch comes; the rows are identical, so callers slice the first ``bsz``)."""
    key = (str(device), depth)
    shape = _CHAIN_SHAPES.get(key)
    if shape is not None and int(shape["depths"].shape[0]) >= bsz:
        return shape
    rows = max(bsz, 1)
    nodes = torch.arange(depth + 1, device=device)
    first_child = torch.where(nodes < depth, nodes + 1, -1)
    shape = {
        "depths": nodes[1:].expand(rows, depth).contiguous(),
        "parents": (nodes - 1).expand(rows, depth + 1).contiguous(),
        "ancestors": torch.tril(torch.ones(depth + 1, depth + 1, dtype=torch.bool, device=device))
        .expand(rows, depth + 1, depth + 1).contiguous(),
        "first_child": first_child.expand(rows, depth + 1).contiguous(),
        "next_sibling": torch.full((rows, depth + 1), -1, dtype=torch.int64, device=device),
        "num_nodes": torch.full((rows,), depth + 1, dtype=torch.int64, device=device),
        "ranks": torch.zeros((rows, depth), dtype=torch.int64, device=device),
    }
    _CHAIN_SHAPES[key] = shape
    return shape


def _is_capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _build_sorted(values: torch.Tensor, tokens: torch.Tensor, budget: int) -> DraftTree:
    """Core: ``values``/``tokens`` [B, D, K] sorted per (row, depth) by (logprob desc, token asc)."""
    bsz, depth_limit, k = values.shape
    width = budget
    device = values.device
    neg_inf = float("-inf")
    lp64 = values.to(torch.float64) + 0.0  # canonical zeros; scores are then canonical by induction

    # Depth 1: every candidate, in rank (= lexicographic) order, padded to the beam width.
    pad = width - k
    score = torch.nn.functional.pad(lp64[:, 0], (0, pad), value=neg_inf)
    valid = torch.arange(width, device=device)[None, :].expand(bsz, width) < k
    rank = torch.nn.functional.pad(torch.arange(k, device=device), (0, pad), value=0)[None, :].expand(bsz, width)
    parent_slot = torch.full((bsz, width), -1, dtype=torch.int64, device=device)

    beam_scores = [score]
    beam_valid = [valid]
    beam_rank = [rank]
    beam_parent = [parent_slot]
    children = None
    for d in range(1, depth_limit):
        # children[j * K + r] = beam slot j extended by rank r: lexicographic order.
        children = (score[:, :, None] + lp64[:, d, None, :]).reshape(bsz, width * k)
        child_valid = valid[:, :, None].expand(bsz, width, k).reshape(bsz, width * k)
        children = torch.where(child_valid, children, neg_inf)
        # Invalid children (of invalid slots) have the highest indices, so the stable sort keeps them after
        # valid -inf children.
        _, order = torch.sort(children, dim=-1, descending=True, stable=True)
        selected, _ = torch.sort(order[:, :width], dim=-1)  # back to lexicographic order
        score = torch.gather(children, 1, selected)
        valid = torch.gather(child_valid, 1, selected)
        rank = selected % k
        parent_slot = selected // k
        beam_scores.append(score)
        beam_valid.append(valid)
        beam_rank.append(rank)
        beam_parent.append(parent_slot)

    scores_u = torch.stack(beam_scores, dim=1)  # [B, D, W]
    valid_u = torch.stack(beam_valid, dim=1)
    rank_u = torch.stack(beam_rank, dim=1)
    parent_u = torch.stack(beam_parent, dim=1)
    pre_u, size_u = _preorder(valid_u, parent_u)

    units = depth_limit * width
    flat = lambda t: t.reshape(bsz, units)  # noqa: E731
    scores_f, valid_f, pre_f = flat(scores_u), flat(valid_u), flat(pre_u)
    flat_index = torch.arange(units, device=device)[None, :].expand(bsz, units)
    # Arrange the union in lexicographic (preorder) order, invalid entries last, then sort stably by score.
    lex_key = torch.where(valid_f, pre_f, units + flat_index)
    _, lex_order = torch.sort(lex_key, dim=-1)
    lex_scores = torch.gather(torch.where(valid_f, scores_f, neg_inf), 1, lex_order)
    _, by_score = torch.sort(lex_scores, dim=-1, descending=True, stable=True)
    chosen = torch.gather(lex_order, 1, by_score[:, :budget])  # flat union index of node i+1, pop order

    node_valid = torch.gather(valid_f, 1, chosen)
    chosen_depth0 = chosen // width  # depth - 1
    node_rank = torch.gather(flat(rank_u), 1, chosen)
    node_tokens = torch.gather(tokens.reshape(bsz, depth_limit * k), 1, chosen_depth0 * k + node_rank)
    node_logprobs = torch.gather(values.reshape(bsz, depth_limit * k), 1, chosen_depth0 * k + node_rank)
    node_scores = torch.gather(scores_f, 1, chosen)
    node_pre = torch.gather(pre_f, 1, chosen)
    node_size = torch.gather(flat(size_u), 1, chosen)

    # Parent node index: map union entries to node indices (0 = not chosen / root).
    node_ids = torch.arange(1, budget + 1, device=device)[None, :].expand(bsz, budget)
    node_of_flat = torch.zeros((bsz, units + 1), dtype=torch.int64, device=device)
    node_of_flat.scatter_(1, torch.where(node_valid, chosen, units), torch.where(node_valid, node_ids, 0))
    parent_slot_node = torch.gather(flat(parent_u), 1, chosen)
    parent_flat = torch.where(chosen_depth0 > 0, (chosen_depth0 - 1) * width + parent_slot_node, units)
    parent_node = torch.gather(node_of_flat, 1, parent_flat)  # depth 1 -> index `units` -> 0 (root)

    minus_one = torch.full((bsz, 1), -1, dtype=torch.int64, device=device)
    parents = torch.cat([minus_one, torch.where(node_valid, parent_node, -1)], dim=1)
    depths = torch.where(node_valid, chosen_depth0 + 1, 0)
    tokens_out = torch.where(node_valid, node_tokens, 0)
    ranks_out = torch.where(node_valid, node_rank, -1)
    scores_out = torch.where(node_valid, node_scores, neg_inf)
    logprobs_out = torch.where(node_valid, node_logprobs, neg_inf)
    num_nodes = node_valid.sum(dim=1) + 1

    # Ancestor-or-self: j is an ancestor of i iff pre(j) <= pre(i) < pre(j) + size(j) in the union trie.
    pre_all = torch.cat([minus_one, node_pre], dim=1)
    big = torch.full((bsz, 1), units + 1, dtype=torch.int64, device=device)
    end_all = torch.cat([big, node_pre + node_size], dim=1)
    valid_all = torch.cat([torch.ones_like(node_valid[:, :1]), node_valid], dim=1)
    ancestors = (
        (pre_all[:, None, :] <= pre_all[:, :, None])
        & (pre_all[:, :, None] < end_all[:, None, :])
        & valid_all[:, None, :]
        & valid_all[:, :, None]
    )
    eye = torch.eye(budget + 1, dtype=torch.bool, device=device)[None]
    ancestors = ancestors | eye

    first_child, next_sibling = _child_links(parents)
    return DraftTree(
        tokens=tokens_out,
        depths=depths,
        parents=parents,
        ancestors=ancestors,
        first_child=first_child,
        next_sibling=next_sibling,
        num_nodes=num_nodes,
        scores=scores_out,
        ranks=ranks_out,
        logprobs=logprobs_out,
        max_depth=depth_limit,
    )


def _preorder(valid: torch.Tensor, parent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Preorder (lexicographic) index and subtree size of every beam entry in the trie of all beams.

    Args:
        valid: bool [B, D, W]; beam d's slots are in lexicographic order with valid slots first.
        parent: int64 [B, D, W] parent slot in beam d-1 (ignored at depth 1).

    With slot(.) the slot of a node in its beam and desc(.) its number of descendants in the trie:
    pre(v) = sum_{k < depth(v)} (slot(anc_k(v)) + 1) + slot(v) + sum_{u in beam, slot(u) < slot(v)} desc(u).
    """
    bsz, depth_limit, width = valid.shape
    device = valid.device
    desc = [torch.zeros((bsz, width), dtype=torch.int64, device=device) for _ in range(depth_limit)]
    for d in range(depth_limit - 1, 0, -1):
        contrib = torch.where(valid[:, d], desc[d] + 1, 0)
        target = torch.where(valid[:, d], parent[:, d], 0)
        desc[d - 1] = desc[d - 1].scatter_add(1, target, contrib)
    slots = torch.arange(width, device=device)[None, :].expand(bsz, width)
    pres = []
    above = torch.zeros((bsz, width), dtype=torch.int64, device=device)  # sum over strict ancestors
    prev_pre_base = None
    for d in range(depth_limit):
        if d > 0:
            par = parent[:, d].clamp(min=0)
            above = torch.gather(prev_pre_base, 1, par)
        excl = torch.cumsum(desc[d], dim=1) - desc[d]
        pres.append(above + slots + excl)
        prev_pre_base = above + slots + 1  # what a child adds for this ancestor: slot + 1
    pre = torch.stack(pres, dim=1)
    size = torch.stack(desc, dim=1) + 1
    return pre, size


def _child_links(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """first_child / next_sibling from parent indices (children in index order)."""
    nodes = parents.shape[1]
    device = parents.device
    idx = torch.arange(nodes, device=device)
    big = nodes
    # is_child[b, p, i]: node i is a child of node p.
    is_child = parents[:, None, :] == idx[None, :, None]
    first_child = torch.where(is_child, idx[None, None, :], big).amin(dim=2)
    first_child = torch.where(first_child == big, -1, first_child)
    # same_parent_after[b, i, j]: j > i and parents[j] == parents[i] != -1.
    same = (parents[:, :, None] == parents[:, None, :]) & (parents[:, :, None] >= 0)
    after = idx[None, :] > idx[:, None]
    nxt = torch.where(same & after[None], idx[None, None, :], big).amin(dim=2)
    next_sibling = torch.where(nxt == big, -1, nxt)
    return first_child, next_sibling
