"""Config-only target + DFlash drafter at real model widths, for step-cost measurements (issue 23).

SGLang loads them with ``load_format="dummy"`` (random weights made on the GPU by SGLang itself; no weights are
written or carried), so a Qwen3-8B-shaped or a Qwen3.6-27B-shaped engine starts in seconds. The outputs are
random: nothing is accepted, which is the regime the step cost is measured in; losslessness is checked on the
tiny and trained pairs (bench/gpu/lossless.py), not here.

    python bench/gpu/shapes.py qwen3-8b-shape OUT_DIR
    python bench/gpu/shapes.py qwen36-27b-hybrid-shape OUT_DIR [--layers 32]

* ``qwen3-8b-shape``: Qwen3-8B's public config (36 layers, hidden 4096, 32/8 heads of 128, MLP 12288, vocab
  151936; tests/unit/fixtures/models/qwen3-8b) and the z-lab Qwen3-8B-DFlash-b16 drafter's (5 layers, block 16,
  target layers 1, 9, 17, 25, 33; tests/unit/fixtures/models/qwen3-8b-dflash-b16).
* ``qwen36-27b-hybrid-shape``: the Qwen3.5/3.6-27B text config of tests/unit/fixtures/models/qwen3.6-27b-like
  (hidden 5120, 24/4 heads of 256, GatedDeltaNet 16/48 heads of 128, MLP 17408, vocab 248320, one full-attention
  layer in four) with ``--layers`` layers (default 64, the real count), as the real model's
  ``Qwen3_5ForConditionalGeneration``; a block-16 drafter of 5 Qwen3 layers at hidden 5120 reading five target
  layers spread over the depth (z-lab's drafter for this model is not in this repository's fixtures: its widths
  here are the 8B drafter's recipe at the 27B hidden size).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "unit" / "fixtures" / "models"
MASK_TOKEN_ID = 4  # any id below the vocabulary: dummy weights make every token alike
BLOCK = 16


def _drafter(hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, vocab: int, target_layers: int,
             layer_ids: list[int], rope_theta: float, max_pos: int) -> dict:
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": 5,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": rope_theta,
        "max_position_embeddings": max_pos,
        "vocab_size": vocab,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "num_target_layers": target_layers,
        "block_size": BLOCK,
        "layer_types": ["full_attention"] * 5,
        "dflash_config": {"block_size": BLOCK, "target_layer_ids": layer_ids, "mask_token": "<|MASK|>",
                          "mask_token_id": MASK_TOKEN_ID},
    }


def qwen3_8b() -> tuple[dict, dict]:
    target = json.loads((FIXTURES / "qwen3-8b" / "config.json").read_text())
    target.update(max_position_embeddings=40960, torch_dtype="bfloat16", eos_token_id=0, bos_token_id=None)
    drafter = _drafter(4096, 32, 8, 128, 12288, target["vocab_size"], 36, [1, 9, 17, 25, 33], 1_000_000.0, 40960)
    return target, drafter


def qwen36_27b_hybrid(layers: int) -> tuple[dict, dict]:
    """The real model's class, ``Qwen3_5ForConditionalGeneration`` (its vision tower included, trimmed as in the
    fixture): SGLang 0.5.17's text-only ``Qwen3_5ForCausalLM`` (models/qwen3_5_text.py) has no
    ``set_dflash_layers_to_capture``, so DFLASH (and DDTREE) refuse it at start-up (seen on the H200, 12-04)."""
    if layers < 4 or layers % 4:
        raise SystemExit(f"--layers {layers}: use a multiple of 4 (one full-attention layer in four), at least 4")
    config = json.loads((FIXTURES / "qwen3.6-27b-like" / "config.json").read_text())
    text = config["text_config"]
    text.update(num_hidden_layers=layers, layer_types=text["layer_types"][:layers], max_position_embeddings=40960,
                eos_token_id=0)
    text.pop("mtp_num_hidden_layers", None)
    config.update(eos_token_id=0, torch_dtype="bfloat16")
    # Five layers spread as z-lab's Qwen3-8B drafter spreads them over 36 (1, 9, 17, 25, 33): from 1 to L - 3. SGLang
    # captures the hidden state after layer id at the input of layer id + 1 (set_dflash_layers_to_capture marks
    # self.layers[id + 1]), so an id of L - 1 is an IndexError at start.
    ids = sorted({1 + round(i * (layers - 4) / 4) for i in range(5)})
    drafter = _drafter(5120, 32, 8, 128, 17408, text["vocab_size"], layers, ids,
                       float(text["rope_parameters"]["rope_theta"]), 40960)
    return config, drafter


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", choices=["qwen3-8b-shape", "qwen36-27b-hybrid-shape"])
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=64, help="hybrid: target layers (a multiple of 4)")
    ap.add_argument("--dummy-range", type=float, default=0.02,
                    help="dummy weights drawn from U(-R, R) (SGLang's own 1e-3 makes nearly every logit tie)")
    args = ap.parse_args()
    target, drafter = qwen3_8b() if args.shape == "qwen3-8b-shape" else qwen36_27b_hybrid(args.layers)
    for name, config in (("target", target), ("drafter", drafter)):
        d = args.out / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    spec = {"shape": args.shape, "load_format": "dummy", "dummy_range": args.dummy_range,
            "target_layers": target.get("text_config", target)["num_hidden_layers"]}
    if args.shape == "qwen36-27b-hybrid-shape":
        # A config-only checkpoint has no processor files, and SGLang's tokenizer manager loads the image processor
        # of any model it treats as multimodal, skip_tokenizer_init or not (H100, 12-05: "Can't load image
        # processor"). The prompts are token ids, so the text path is all that is timed.
        spec["engine_kwargs"] = {"enable_multimodal": False}
    (args.out / "shape.json").write_text(json.dumps(spec) + "\n")
    layers = target.get("text_config", target)["num_hidden_layers"]
    print(f"{args.shape}: {args.out} (target {layers} layers, drafter block {BLOCK})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
