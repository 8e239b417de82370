"""DDTree (Diffusion Draft Tree) speculative decoding: exact batched tree build, verification walks, SGLang plugin.

The core (``sglang_ddtree.tree``, ``sglang_ddtree.verify``) needs only torch. ``sglang_ddtree.reference`` (a
Hugging Face engine, a DFlash drafter, tiny test models) needs the ``reference`` extra; ``sglang_ddtree.sglang``
is the SGLang plugin and imports SGLang lazily.
"""

from __future__ import annotations

from .tree import DraftTree, build_tree, build_tree_from_topk
from .verify import greedy_walk, sampling_walk

__version__ = "0.1.0"

__all__ = ["DraftTree", "__version__", "build_tree", "build_tree_from_topk", "greedy_walk", "sampling_walk"]
