"""make_tiny_models writes loadable, SGLang-shaped, deterministic tiny models."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
from safetensors.torch import load_file

from sglang_ddtree.reference import load_models, make_tiny_models
from sglang_ddtree.reference.tiny import is_hybrid_target, make_tiny_hybrid_models

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


HYBRID_DIMS = dict(
    hidden_size=64,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=64,
    drafter_intermediate_size=128,
)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return make_tiny_hybrid_models(
        tmp_path_factory.mktemp("hybrid"),
        seed=2,
        vocab_size=96,
        block_size=5,
        dtype="float32",
        with_tokenizer=False,
        aligned=True,
        **HYBRID_DIMS,
    )


def test_hybrid_files_and_configs(hybrid):
    cfg = json.loads((hybrid.target_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3NextForCausalLM"] and cfg["model_type"] == "qwen3_next"
    assert cfg["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert cfg["full_attention_interval"] == 4  # SGLang's Qwen3NextConfig derives its layer types from it
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"]
    assert is_hybrid_target(cfg)
    weights = load_file(str(hybrid.target_dir / "model.safetensors"))
    # the checkpoint layout SGLang's Qwen3NextForCausalLM.load_weights maps (per-expert names, fused GDN inputs)
    for name in (
        "model.layers.0.linear_attn.in_proj_qkvz.weight",
        "model.layers.0.linear_attn.in_proj_ba.weight",
        "model.layers.0.linear_attn.conv1d.weight",
        "model.layers.0.linear_attn.A_log",
        "model.layers.0.linear_attn.dt_bias",
        "model.layers.0.mlp.experts.3.down_proj.weight",
        "model.layers.0.mlp.shared_expert_gate.weight",
        "model.layers.3.self_attn.q_proj.weight",
        "lm_head.weight",
    ):
        assert name in weights, name
    drafter = json.loads((hybrid.drafter_dir / "config.json").read_text())
    assert drafter["architectures"] == ["DFlashDraftModel"] and drafter["hidden_size"] == cfg["hidden_size"]
    assert drafter["dflash_config"]["target_layer_ids"] == [1, 2] and drafter["num_target_layers"] == 4
    assert not is_hybrid_target(drafter)
    assert not is_hybrid_target({"model_type": "qwen3", "layer_types": ["full_attention"] * 4})


def test_hybrid_target_generates_and_aligned_drafter_agrees(hybrid):
    """transformers loads the hybrid target; greedy with its cache equals greedy without; the aligned drafter's
    depth-1 token is the target's next token on random contexts."""
    target, drafter = load_models(hybrid.target_dir, hybrid.drafter_dir, dtype=torch.float32)
    assert type(target).__name__ == "Qwen3NextForCausalLM"
    ids = torch.tensor([[10, 20, 30, 40, 50]])
    with torch.no_grad():
        out = target.generate(ids, max_new_tokens=8, do_sample=False)
        seq = ids
        for _ in range(8):
            seq = torch.cat([seq, target(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    gen = torch.Generator().manual_seed(0)
    agree = 0
    for _ in range(20):
        ctx = torch.randint(5, 96, (1, 10), generator=gen)
        with torch.no_grad():
            res = target(input_ids=ctx, output_hidden_states=True, use_cache=False)
            feats = drafter.context_features(res.hidden_states)[:, :9]
            block = torch.full((1, drafter.block_size), 4)
            block[0, 0] = ctx[0, -1]
            h = drafter(emb(block), torch.arange(9, 9 + drafter.block_size)[None], feats, torch.arange(9)[None])
            agree += int(head(h[:, 1]).argmax() == res.logits[0, -1].argmax())
    assert agree >= 17


def test_hybrid_seed_determinism(tmp_path):
    kw = dict(vocab_size=40, with_tokenizer=False, **HYBRID_DIMS)
    make_tiny_hybrid_models(tmp_path / "a", seed=5, **kw)
    make_tiny_hybrid_models(tmp_path / "b", seed=5, **kw)
    for sub in ("target", "drafter"):
        wa = load_file(str(tmp_path / "a" / sub / "model.safetensors"))
        wb = load_file(str(tmp_path / "b" / sub / "model.safetensors"))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target_layer_ids": [3]}, "target_layer_ids"),
        ({"full_attention_interval": 5}, "full_attention_interval=5"),
        ({"linear_num_value_heads": 3}, "linear_num_value_heads=3"),
        ({"num_experts_per_tok": 5}, "num_experts_per_tok=5"),
        ({"block_size": 1}, "block_size=1"),
    ],
)
def test_hybrid_bad_arguments(kwargs, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        make_tiny_hybrid_models(tmp_path, with_tokenizer=False, vocab_size=40, **{**HYBRID_DIMS, **kwargs})


def test_hybrid_recognised_by_sglang(hybrid):
    """SGLang's own config loading sees a GatedDeltaNet hybrid (mamba-style state) with the expected layers."""
    pytest.importorskip("sglang.srt.configs.model_config")
    from sglang.srt.configs.hybrid_arch import hybrid_gdn_config, mambaish_config
    from sglang.srt.configs.model_config import ModelConfig

    mc = ModelConfig(model_path=str(hybrid.target_dir))
    assert mambaish_config(mc) is not None and hybrid_gdn_config(mc) is not None
    assert mc.hf_config.linear_layer_ids == [0, 1, 2] and mc.hf_config.full_attention_layer_ids == [3]
    assert mc.hf_config.rope_theta == 1_000_000.0 and mc.hf_config.partial_rotary_factor == 0.25
