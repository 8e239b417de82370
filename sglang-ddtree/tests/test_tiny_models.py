"""make_tiny_models writes loadable, SGLang-shaped, deterministic tiny models."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
from safetensors.torch import load_file

from sglang_ddtree.reference import load_models, make_tiny_models

DIMS = dict(hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128)


@pytest.fixture(scope="module")
def with_tokenizer(tmp_path_factory):
    return make_tiny_models(tmp_path_factory.mktemp("tok"), seed=3, vocab_size=300, block_size=4, **DIMS)


def test_files_and_drafter_config(with_tokenizer):
    m = with_tokenizer
    assert (m.target_dir / "config.json").is_file() and (m.target_dir / "model.safetensors").is_file()
    assert (m.target_dir / "tokenizer.json").is_file()
    cfg = json.loads((m.drafter_dir / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert cfg["model_type"] == "qwen3"
    assert cfg["layer_types"] == ["full_attention"]
    assert cfg["dflash_config"] == {
        "block_size": 4,
        "target_layer_ids": [1, 2],
        "mask_token": "<|MASK|>",
        "mask_token_id": 4,
    }
    assert cfg["num_target_layers"] == 4
    weights = load_file(str(m.drafter_dir / "model.safetensors"))
    assert weights["fc.weight"].shape == (64, 2 * 64)
    assert {"norm.weight", "hidden_norm.weight", "fc.weight"} <= set(weights)
    assert not any("embed" in k or "lm_head" in k for k in weights)
    assert all(k.startswith("layers.0.") for k in weights if k.startswith("layers."))
    assert weights["fc.weight"].dtype == torch.bfloat16
    target_cfg = json.loads((m.target_dir / "config.json").read_text())
    assert target_cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert target_cfg["vocab_size"] == 300


def test_tokenizer(with_tokenizer):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(with_tokenizer.target_dir), local_files_only=True)
    assert len(tok) == 300
    assert tok.convert_tokens_to_ids("<|MASK|>") == 4
    assert tok.eos_token_id == 0
    text = "def tree(self): return 42\n"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_models_load_and_generate(with_tokenizer):
    from sglang_ddtree.reference import generate, greedy_generate

    target, drafter = load_models(with_tokenizer.target_dir, with_tokenizer.drafter_dir, dtype=torch.float32)
    assert target.config.vocab_size == 300 and drafter.block_size == 4
    result = generate(target, drafter, [10, 20, 30], 12, 6)
    assert result.tokens == greedy_generate(target, [10, 20, 30], 12)


def test_seed_determinism(tmp_path):
    a = make_tiny_models(tmp_path / "a", seed=5, vocab_size=40, with_tokenizer=False, **DIMS)
    make_tiny_models(tmp_path / "b", seed=5, vocab_size=40, with_tokenizer=False, **DIMS)
    c = make_tiny_models(tmp_path / "c", seed=6, vocab_size=40, with_tokenizer=False, **DIMS)
    for sub in ("target", "drafter"):
        wa = load_file(str(tmp_path / "a" / sub / "model.safetensors"))
        wb = load_file(str(tmp_path / "b" / sub / "model.safetensors"))
        wc = load_file(str(tmp_path / "c" / sub / "model.safetensors"))
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
        assert any(not torch.equal(wa[k], wc[k]) for k in wa if wa[k].dim() >= 2)
    assert a.vocab_size == c.vocab_size == 40


def test_aligned_drafter_agrees_at_depth_one(tiny_aligned):
    """The aligned drafter's top depth-1 token is the target's greedy next token on random contexts."""
    target, drafter = tiny_aligned
    device = next(target.parameters()).device
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    gen = torch.Generator().manual_seed(0)
    agree = 0
    for _ in range(40):
        ids = torch.randint(5, 96, (1, 10), generator=gen).to(device)
        with torch.no_grad():
            out = target(input_ids=ids, output_hidden_states=True)
            feats = drafter.context_features(out.hidden_states)[:, :9]
            block = torch.full((1, drafter.block_size), 4, device=device)
            block[0, 0] = ids[0, -1]
            h = drafter(
                emb(block),
                torch.arange(9, 9 + drafter.block_size, device=device)[None],
                feats,
                torch.arange(9, device=device)[None],
            )
            agree += int(head(h[:, 1]).argmax() == out.logits[0, -1].argmax())
    assert agree >= 36


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"vocab_size": 100}, "vocab_size=100 is too small"),
        ({"block_size": 1}, "block_size=1"),
        ({"dtype": "int8"}, "dtype='int8'"),
        ({"target_layer_ids": [7]}, "target_layer_ids"),
    ],
)
def test_bad_arguments(kwargs, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        make_tiny_models(tmp_path, **{**DIMS, **kwargs})
