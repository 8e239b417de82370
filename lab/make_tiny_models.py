"""Create the lab's tiny random models on the controller (run with /work/main/.venv's python).

    python lab/make_tiny_models.py OUT_DIR

writes OUT_DIR/Qwen3-tiny (a tiny random Qwen3 causal LM with a byte-level tokenizer) and
OUT_DIR/Qwen3-tiny-DFlash (a matching DFlash drafter: z-lab checkpoint layout, config.json with
``architectures: [DFlashDraftModel]``, ``block_size``, ``dflash_config.target_layer_ids`` and
``mask_token_id``; it shares the target's embeddings and lm_head, so it has none of its own).

When the sglang-ddtree package provides ``sglang_ddtree.reference.tiny.make_tiny_models`` (the models its
reference engine is tested with), that maker is used, so the lab's drafter is exactly what the DDTree
engine expects; otherwise the fallback below writes the same layout. Deterministic (fixed seed); a stamp
file with the maker's name makes re-runs no-ops.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TARGET = "Qwen3-tiny"
DRAFTER = "Qwen3-tiny-DFlash"
STAMP = ".lab-models-stamp"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]


def make_with_reference(out: Path) -> str | None:
    """Use sglang_ddtree.reference.tiny.make_tiny_models when it exists; returns its name or None."""
    try:
        from sglang_ddtree.reference.tiny import make_tiny_models  # type: ignore[import-not-found]
    except ImportError:
        return None
    import inspect

    params = inspect.signature(make_tiny_models).parameters
    kwargs = {}
    if "target_name" in params:
        kwargs["target_name"] = TARGET
    if "drafter_name" in params:
        kwargs["drafter_name"] = DRAFTER
    result = make_tiny_models(out, **kwargs)
    # Normalise the directory names to the lab's (the maker may choose its own).
    if isinstance(result, (tuple, list)) and len(result) == 2:
        for produced, wanted in zip(result, (TARGET, DRAFTER), strict=True):
            produced = Path(produced)
            if produced.resolve() != (out / wanted).resolve():
                if (out / wanted).exists():
                    raise SystemExit(f"{out / wanted} exists; remove {out} and run again")
                produced.rename(out / wanted)
    return "sglang_ddtree.reference.tiny.make_tiny_models"


def make_tokenizer(path: Path) -> int:
    """A byte-level BPE tokenizer with no merges: 256 byte tokens + the special tokens. Returns its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for tok in SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL_TOKENS[1:])
    fast.save_pretrained(path)
    return len(vocab)


def make_fallback(out: Path, seed: int = 0) -> str:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    target_dir, drafter_dir = out / TARGET, out / DRAFTER
    target_dir.mkdir(parents=True, exist_ok=True)
    drafter_dir.mkdir(parents=True, exist_ok=True)
    n_tok = make_tokenizer(target_dir)
    make_tokenizer(drafter_dir)
    vocab_size = 512
    assert n_tok <= vocab_size
    eos_id, mask_id = 256, 259  # <|endoftext|>, <|MASK|> (after the 256 byte tokens)
    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, rope_theta=1_000_000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=eos_id, eos_token_id=eos_id,
                  pad_token_id=eos_id)
    target_layers = 4
    config = Qwen3Config(num_hidden_layers=target_layers, **common)
    config.architectures = ["Qwen3ForCausalLM"]
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.save_pretrained(target_dir, safe_serialization=True)

    # DFlash drafter in the z-lab layout: 2 layers, fed by the hidden states of target layers 1 and 2.
    draft_layers, block_size = 2, 16
    target_layer_ids = [1, 2]
    hidden, inter, heads, kv_heads, head_dim = 64, 128, 4, 2, 16
    draft_cfg = {
        **common,
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "num_hidden_layers": draft_layers,
        "num_target_layers": target_layers,
        "block_size": block_size,
        "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": target_layer_ids},
        "torch_dtype": "float32",
        "lab_note": "tiny random DFlash drafter for the specdec.pivot lab (lab/make_tiny_models.py)",
    }
    (drafter_dir / "config.json").write_text(json.dumps(draft_cfg, indent=2) + "\n")

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape) * 0.02).contiguous()

    tensors = {
        "fc.weight": w(hidden, hidden * len(target_layer_ids)),
        "hidden_norm.weight": torch.ones(hidden),
        "norm.weight": torch.ones(hidden),
    }
    for i in range(draft_layers):
        p = f"layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
            p + "self_attn.q_proj.weight": w(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": torch.ones(head_dim),
            p + "self_attn.k_norm.weight": torch.ones(head_dim),
            p + "mlp.gate_proj.weight": w(inter, hidden),
            p + "mlp.up_proj.weight": w(inter, hidden),
            p + "mlp.down_proj.weight": w(hidden, inter),
        })
    save_file(tensors, str(drafter_dir / "model.safetensors"), metadata={"format": "pt"})
    return "lab/make_tiny_models.py fallback"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--fallback", action="store_true", help="never use sglang_ddtree's maker")
    args = parser.parse_args(argv)
    out: Path = args.out_dir
    stamp = out / STAMP
    if stamp.exists() and (out / TARGET / "config.json").exists() and (out / DRAFTER / "config.json").exists():
        print(f"tiny models up to date in {out} ({stamp.read_text().strip()})")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    maker = None if args.fallback else make_with_reference(out)
    if maker is None:
        maker = make_fallback(out)
    stamp.write_text(maker + "\n")
    print(f"tiny models written to {out}/{TARGET} and {out}/{DRAFTER} by {maker}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
