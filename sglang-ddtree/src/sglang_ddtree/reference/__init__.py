"""Hugging Face transformers reference engine for DDTree, a DFlash drafter module and tiny test models.

Needs the ``reference`` extra (transformers, safetensors, tokenizers; tqdm for the CLI).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .drafter import DFlashDrafter, DrafterCache, load_drafter_config
from .engine import GenerateResult, chain_tree, generate, greedy_generate, tree_attention_mask
from .tiny import TinyModels, make_tiny_models, make_tokenizer

__all__ = [
    "DFlashDrafter",
    "DrafterCache",
    "GenerateResult",
    "TinyModels",
    "chain_tree",
    "generate",
    "greedy_generate",
    "load_drafter_config",
    "load_models",
    "make_tiny_models",
    "make_tokenizer",
    "tree_attention_mask",
]


def load_models(
    target_dir: str | Path,
    drafter_dir: str | Path,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    attn_implementation: str = "sdpa",
):
    """Load a HF causal LM target and a DFlash drafter from local directories (no downloads).

    Returns (target, drafter); both in ``dtype`` (default: the target checkpoint's dtype) on ``device``.
    """
    from transformers import AutoModelForCausalLM

    for name, path in (("target", target_dir), ("drafter", drafter_dir)):
        if not Path(path).is_dir():
            raise ValueError(f"{name} directory {str(path)!r} does not exist; pass a local model directory")
    kwargs = {"attn_implementation": attn_implementation, "local_files_only": True}
    if dtype is not None:
        kwargs["dtype"] = dtype
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), **kwargs).to(device).eval()
    target_dtype = next(target.parameters()).dtype
    drafter = DFlashDrafter.from_pretrained(drafter_dir, dtype=target_dtype, device=device)
    hidden = target.config.get_text_config().hidden_size
    if drafter.fc.in_features != len(drafter.target_layer_ids) * hidden:
        raise ValueError(
            f"drafter fc expects {drafter.fc.in_features} features but the target hidden size is {hidden} with "
            f"{len(drafter.target_layer_ids)} target layers; the drafter does not belong to this target"
        )
    return target, drafter
