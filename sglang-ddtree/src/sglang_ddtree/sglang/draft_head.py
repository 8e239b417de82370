"""The draft tree built inside the drafter's CUDA graph: DDTREE's use of DFLASH's draft-sampler slot.

SGLang's DFLASH folds its greedy draft head (the drafter's hidden states through the target's lm_head, argmax) into
the drafter's CUDA graph: ``init_cuda_graphs`` asks ``_maybe_build_draft_sampler`` for a callable and adds it to
the draft model runner's ``capture_tail_hooks``, so it is captured at the end of every drafter graph; after a
replay DFLASH reads the tokens from the sampler's ``out`` buffer. DDTREE hands it a :class:`TreeDraftHead`
instead: the whole tree (lm_head product, top-k, tree kernel) is captured into the drafter's graphs and written
into fixed storage (``tree.tree_buffers``), so a decode step spends no host time on it. Reading ``out`` during a
DDTREE round ends DFLASH's round there (``DraftCaptured``, as the eager path ends it at the greedy head); outside
one (grammar batches and the auto budget's chain steps: DFLASH's own rounds) ``out`` is the drafter's argmax chain,
the trees' rank-0 tokens, and the pass's whole tree stays readable (``served``, ``tree``).

The same ``build`` function makes the tree eagerly when the drafter ran without a graph, so both paths give the
same tree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from ..tree import DraftTree, tree_buffers, tree_rows

__all__ = ["DraftCaptured", "TreeDraftHead"]


class DraftCaptured(Exception):
    """Ends DFLASH's round right after its drafter pass: with the drafter's hidden states (eager drafter pass; the
    tree is built from them) or without (the tree was built inside the drafter's graph: ``TreeDraftHead.tree``)."""

    def __init__(self, hidden_states: torch.Tensor | None = None):
        super().__init__("ddtree draft captured")
        self.hidden_states = hidden_states


class TreeDraftHead:
    """DFLASH's draft-sampler protocol with DDTree trees (see the module docstring).

    ``build(hidden [B*D, H], B, out) -> DraftTree``: the tree of B requests from the hidden states of block positions
    1..D, written into ``out`` (``tree.build_tree``'s storage argument). ``max_bs``: the largest batch the
    drafter's graphs are captured for (a larger one at capture is refused: its rows would not fit).
    ``normalizers``: False where the tree comes from gathered vocabulary shards (TP > 1,
    ``tree.build_tree_from_topk``), which have no full-vocabulary ``row_max`` / ``row_logsum``."""

    def __init__(self, build: Callable[[torch.Tensor, int, DraftTree], DraftTree], *, block_size: int, budget: int,
                 max_bs: int, device: torch.device | str, normalizers: bool = True):
        self.block_size = int(block_size)
        self.max_bs = int(max_bs)
        self.buffers = tree_buffers(self.max_bs, self.block_size - 1, int(budget), device)
        self.in_round = False  # set by the worker while a DDTREE round runs DFLASH's drafter pass
        self.served = False  # ``out`` was read outside a DDTREE round: this pass's tree is in the buffers
        self._build = build
        self._views: dict[int, DraftTree] = {}  # tree(bs): the fixed rows' views, made once per batch size
        self._normalizers = normalizers  # False: trees of gathered candidates (TP > 1), no row_max / row_logsum

    def __call__(self, hidden_states: torch.Tensor, input_ids: torch.Tensor | None = None) -> None:
        """At capture (and its warm-up runs): hidden_states [B*S, H] of the drafter's block (S = block size)."""
        del input_ids
        bs = hidden_states.shape[0] // self.block_size
        if bs > self.max_bs:
            raise RuntimeError(f"DDTREE: the drafter's CUDA graph for batch {bs} exceeds the tree head's {self.max_bs} "
                               "rows; start with --disable-cuda-graph or report the SGLang version")
        hidden = hidden_states.view(bs, self.block_size, -1)[:, 1:, :].reshape(-1, hidden_states.shape[-1])
        self._build(hidden, bs, self.buffers)

    @property
    def out(self) -> torch.Tensor:
        """What DFLASH reads after a replay: int64 [max_bs * D] argmax chains; in a DDTREE round, the round's end."""
        if self.in_round:
            raise DraftCaptured(None)
        self.served = True
        return self.buffers.top1_tokens.view(-1)

    def tree(self, bs: int) -> DraftTree:
        """The trees of the last replay's first ``bs`` requests (valid until the next drafter pass). The views of
        fixed storage do not change, so each batch size's are made once, not on every step."""
        views = self._views.get(bs)
        if views is None:
            views = tree_rows(self.buffers, bs)
            if not self._normalizers:
                views = replace(views, row_max=None, row_logsum=None)
            self._views[bs] = views
        return views
