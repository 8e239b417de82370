"""``DDTreeVerifyInput``: SGLang's ``DFlashVerifyInput`` plus the tree metadata SGLang's backends read.

It keeps ``SpecInputType.DFLASH_VERIFY`` (so FlashInfer builds its arguments through
``generate_attn_arg_prefill`` and passes ``custom_mask`` on, and Triton reads ``custom_mask``), sets ``topk`` > 1
(backends gate tree handling on it) and carries ``retrieve_index`` / ``retrieve_next_token`` /
``retrieve_next_sibling`` (the hybrid linear-attention backend derives each node's parent from them, so
GatedDeltaNet layers follow the tree instead of a chain).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sglang.srt.speculative.dflash_info import DFlashVerifyInput

from .server_args import TREE_TOPK

__all__ = ["DDTreeVerifyInput"]


@dataclass
class DDTreeVerifyInput(DFlashVerifyInput):
    retrieve_index: torch.Tensor | None = None
    retrieve_next_token: torch.Tensor | None = None
    retrieve_next_sibling: torch.Tensor | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.topk <= 1:
            self.topk = TREE_TOPK
