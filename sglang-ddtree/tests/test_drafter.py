"""The DFlash drafter module: an independent functional re-implementation, the context cache, loading."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from torch.nn import functional as F

pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

from sglang_ddtree.reference import DFlashDrafter


def rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def functional_drafter(sd, cfg, drafter, noise, pos, feats, ctx_pos):
    """Written from the DFlash description (z-lab): q from the block, k/v from [context ; block]."""
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    ctx = rms(feats @ sd["fc.weight"].T, sd["hidden_norm.weight"])
    h = noise
    all_pos = torch.cat([ctx_pos, pos], dim=1)
    cos_b, sin_b = drafter._rope(pos, h.dtype)
    cos_a, sin_a = drafter._rope(all_pos, h.dtype)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        x = rms(h, sd[p + "input_layernorm.weight"])
        both = torch.cat([ctx, x], dim=1)
        q = (x @ sd[p + "self_attn.q_proj.weight"].T).unflatten(-1, (heads, hd))
        k = (both @ sd[p + "self_attn.k_proj.weight"].T).unflatten(-1, (kv, hd))
        v = (both @ sd[p + "self_attn.v_proj.weight"].T).unflatten(-1, (kv, hd)).transpose(1, 2)
        q = rms(q, sd[p + "self_attn.q_norm.weight"]).transpose(1, 2)
        k = rms(k, sd[p + "self_attn.k_norm.weight"]).transpose(1, 2)
        q, _ = apply_rotary_pos_emb(q, q, cos_b, sin_b)
        k, _ = apply_rotary_pos_emb(k, k, cos_a, sin_a)
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # no mask: non-causal
        h = h + out.transpose(1, 2).flatten(2) @ sd[p + "self_attn.o_proj.weight"].T
        y = rms(h, sd[p + "post_attention_layernorm.weight"])
        mlp = (F.silu(y @ sd[p + "mlp.gate_proj.weight"].T) * (y @ sd[p + "mlp.up_proj.weight"].T)) @ sd[
            p + "mlp.down_proj.weight"
        ].T
        h = h + mlp
    return rms(h, sd["norm.weight"])


@pytest.fixture(scope="module")
def drafter_bundle(tiny_random_dirs):
    path = tiny_random_dirs.drafter_dir
    cfg = json.loads((path / "config.json").read_text())
    sd = {k: v.double() for k, v in load_file(str(path / "model.safetensors")).items()}
    drafter = DFlashDrafter.from_pretrained(path, dtype=torch.float64)
    return path, cfg, sd, drafter


def inputs(cfg, ctx_len, block, seed):
    gen = torch.Generator().manual_seed(seed)
    hidden = cfg["hidden_size"]
    nfeat = len(cfg["dflash_config"]["target_layer_ids"])
    feats = torch.randn((1, ctx_len, nfeat * hidden), generator=gen, dtype=torch.float64)
    noise = torch.randn((1, block, hidden), generator=gen, dtype=torch.float64)
    return feats, noise


def test_matches_functional_reimplementation(drafter_bundle):
    _, cfg, sd, drafter = drafter_bundle
    feats, noise = inputs(cfg, 9, drafter.block_size, 0)
    ctx_pos = torch.arange(9)[None]
    pos = torch.arange(9, 9 + drafter.block_size)[None]
    with torch.no_grad():
        got = drafter(noise, pos, feats, ctx_pos)
        want = functional_drafter(sd, cfg, drafter, noise, pos, feats, ctx_pos)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_context_cache_is_incremental(drafter_bundle):
    """Feeding the context in two rounds through the cache equals feeding it at once."""
    _, cfg, _, drafter = drafter_bundle
    feats, noise = inputs(cfg, 12, drafter.block_size, 1)
    cache = drafter.new_cache()
    with torch.no_grad():
        drafter(noise, torch.arange(7, 7 + drafter.block_size)[None], feats[:, :7], torch.arange(7)[None], cache)
        assert cache.length == 7
        pos = torch.arange(12, 12 + drafter.block_size)[None]
        incremental = drafter(noise, pos, feats[:, 7:], torch.arange(7, 12)[None], cache)
        assert cache.length == 12
        full = drafter(noise, pos, feats, torch.arange(12)[None])
    torch.testing.assert_close(incremental, full, rtol=1e-9, atol=1e-9)


def test_config_fields(drafter_bundle, tiny_random_dirs):
    drafter = drafter_bundle[3]
    assert drafter.block_size == tiny_random_dirs.block_size
    assert drafter.target_layer_ids == list(tiny_random_dirs.target_layer_ids)
    assert drafter.mask_token_id == 4


def test_model_prefix_is_accepted(drafter_bundle, tmp_path):
    path, _, sd, drafter = drafter_bundle
    shutil.copy(path / "config.json", tmp_path / "config.json")
    save_file({f"model.{k}": v.float() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    loaded = DFlashDrafter.from_pretrained(tmp_path, dtype=torch.float64)
    for (n1, p1), (n2, p2) in zip(loaded.named_parameters(), drafter.named_parameters(), strict=True):
        assert n1 == n2
        torch.testing.assert_close(p1, p2)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda cfg, sd: cfg.update(architectures=["Qwen3ForCausalLM"]), "not a DFlash drafter"),
        (lambda cfg, sd: sd.pop("norm.weight"), "lacks weights"),
        (lambda cfg, sd: sd.update({"fc.weight": torch.zeros(3, 3)}), "fc.weight"),
        (lambda cfg, sd: cfg.update(layer_types=["sliding_attention"]), "use_sliding_window is not true"),
        (lambda cfg, sd: cfg["dflash_config"].update(block_size=1), "block_size=1"),
        (lambda cfg, sd: cfg.update(architectures=["DFlash2DraftModel"]), "does not support DFlash2 drafters"),
        (lambda cfg, sd: cfg["dflash_config"].update(selector_top_k=16), "selector_top_k=16 marks a DFlash2"),
        (
            lambda cfg, sd: sd.update({"candidate_selector.hidden_projection.weight": torch.zeros(4, 64)}),
            r"DFlash2 weights \['candidate_selector.hidden_projection.weight'\]",
        ),
        (
            lambda cfg, sd: sd.update({"layers.0.attention_conv.base_kernel": torch.zeros(2, 3, 64)}),
            "does not support DFlash2",
        ),
        (lambda cfg, sd: sd.update({"lm_head.weight": torch.zeros(3, 64)}), r"unexpected weights \['lm_head.weight'\]"),
        (
            lambda cfg, sd: (cfg["dflash_config"].pop("target_layer_ids"), cfg.pop("num_target_layers")),
            "neither dflash_config.target_layer_ids nor num_target_layers",
        ),
        (lambda cfg, sd: cfg.pop("head_dim"), "missing required field 'head_dim'"),
        (lambda cfg, sd: cfg["dflash_config"].pop("mask_token_id"), "no mask_token_id"),
        (lambda cfg, sd: cfg.update(hidden_act="gelu"), "hidden_act='gelu'"),
    ],
)
def test_bad_checkpoints_are_named(mutate, message, drafter_bundle, tmp_path):
    _, cfg, sd, _ = drafter_bundle
    cfg = json.loads(json.dumps(cfg))
    sd = dict(sd)
    mutate(cfg, sd)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.float().contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=message):
        DFlashDrafter.from_pretrained(tmp_path)


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"no config\.json"):
        DFlashDrafter.from_pretrained(tmp_path / "nope")


def test_target_layer_ids_default_from_num_target_layers(drafter_bundle, tmp_path):
    """Without target_layer_ids, z-lab's default from num_target_layers (1 draft layer: the middle layer)."""
    _, cfg, sd, _ = drafter_bundle
    cfg = json.loads(json.dumps(cfg))
    cfg["dflash_config"].pop("target_layer_ids")
    cfg["num_target_layers"] = 6
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    nfeat = sd["fc.weight"].shape[1] // cfg["hidden_size"]
    sd = dict(sd)
    sd["fc.weight"] = sd["fc.weight"][:, : sd["fc.weight"].shape[1] // nfeat]
    save_file({k: v.float().contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    assert DFlashDrafter.from_pretrained(tmp_path).target_layer_ids == [3]


def test_every_problem_is_listed(drafter_bundle, tmp_path):
    """Several bad fields: one error naming each of them."""
    _, cfg, sd, _ = drafter_bundle
    cfg = json.loads(json.dumps(cfg))
    cfg.update(architectures=["DFlash2DraftModel"], hidden_act="gelu")
    cfg.pop("intermediate_size")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.float().contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError) as info:
        DFlashDrafter.from_pretrained(tmp_path)
    text = str(info.value)
    assert "DFlash2" in text and "hidden_act='gelu'" in text and "'intermediate_size'" in text
