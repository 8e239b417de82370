"""check_drafter_config / check_drafter_weights: honour each z-lab drafter field or refuse it, naming the field."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from sglang_ddtree.drafter_config import (
    DFLASH2_MESSAGE,
    DrafterConfigError,
    check_drafter_config,
    check_drafter_dir,
    check_drafter_weights,
    expected_weight_shapes,
    read_safetensors_shapes,
    resolve_drafter_config,
)

BASE = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "num_target_layers": 8,
    "dflash_config": {"block_size": 16, "target_layer_ids": [1, 4, 6], "mask_token": "<|MASK|>", "mask_token_id": 4},
}


def cfg_with(**changes) -> dict:
    cfg = json.loads(json.dumps(BASE))
    dflash = changes.pop("dflash_config", None)
    cfg.update(changes)
    if dflash is not None:
        cfg["dflash_config"].update(dflash)
    return {k: v for k, v in cfg.items() if v is not _DROP}


_DROP = object()


def test_plain_config_is_accepted_by_both_consumers():
    assert check_drafter_config(BASE, "reference") == []
    assert check_drafter_config(BASE, "sglang") == []
    spec = resolve_drafter_config(BASE)
    assert spec.target_layer_ids == (1, 4, 6)
    assert spec.block_size == 16 and spec.mask_token_id == 4
    assert spec.layer_types == ("full_attention",) * 3 and spec.causal == (False,) * 3
    assert spec.sliding_window is None
    assert (spec.input_embedding_scale, spec.output_multiplier, spec.final_logit_softcapping) == (1.0, 1.0, None)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        (dict(architectures=["DFlash2DraftModel"]), "architectures=['DFlash2DraftModel']"),
        (dict(architectures=["Qwen3ForCausalLM"]), "is not a DFlash drafter"),
        (dict(conv_kernel_size=4), "conv_kernel_size=4 marks a DFlash2"),
        (dict(dflash_config={"selector_rank": 32}), "selector_rank=32 marks a DFlash2"),
        (dict(num_target_layers=_DROP, dflash_config={"target_layer_ids": None}), "neither dflash_config"),
        (dict(dflash_config={"target_layer_ids": [1, 8]}), "has ids >= num_target_layers=8"),
        (dict(dflash_config={"target_layer_ids": []}), "non-empty list"),
        (dict(head_dim=_DROP), "missing required field 'head_dim'"),
        (dict(num_key_value_heads=_DROP), "missing required field 'num_key_value_heads'"),
        (dict(num_key_value_heads=3), "not a multiple of num_key_value_heads=3"),
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (dict(dflash_config={"block_size": None}), "no block_size"),
        (dict(dflash_config={"block_size": 1}), "block_size=1"),
        (dict(dflash_config={"mask_token_id": None}), "no mask_token_id"),
        (dict(layer_types=["full_attention"]), "one entry per drafter layer (3)"),
        (dict(layer_types=["full_attention", "chunked_attention", "full_attention"]), "'chunked_attention'"),
        (dict(layer_types=["sliding_attention"] * 3), "use_sliding_window is not true"),
        (dict(use_sliding_window=True, sliding_window=8), "max_window_layers=None"),
        (dict(use_sliding_window=True, sliding_window=None, max_window_layers=1), "sliding_window=None"),
        (dict(is_causal="yes"), "is_causal='yes'"),
        (dict(output_multiplier="x"), "output_multiplier='x'"),
        (dict(final_logit_softcapping=float("inf")), "final_logit_softcapping=inf"),
        (dict(projector_type="domino"), "projector_type='domino'"),
    ],
)
def test_refusals_name_the_field(changes, needle):
    for consumer in ("reference", "sglang"):
        problems = check_drafter_config(cfg_with(**changes), consumer)
        assert any(needle in p for p in problems), problems
    with pytest.raises(DrafterConfigError, match=None) as info:
        resolve_drafter_config(cfg_with(**changes), "where")
    assert str(info.value).startswith("where: ") and needle in str(info.value)


def test_dflash2_message_says_ddtree_does_not_support_it():
    (problem,) = check_drafter_config(cfg_with(architectures=["DFlash2DraftModel"]))
    assert "DDTREE does not support DFlash2 drafters yet" in problem and DFLASH2_MESSAGE in problem


def test_default_target_layers_from_num_target_layers():
    spec = resolve_drafter_config(cfg_with(num_target_layers=36, dflash_config={"target_layer_ids": None}))
    assert spec.target_layer_ids == (1, 17, 33)  # z-lab's build_target_layer_ids(36, 3)
    cfg = cfg_with(num_target_layers=_DROP)
    cfg["dflash_config"] = {"block_size": 16, "mask_token_id": 4, "num_target_layers": 8}  # dflash_config wins
    assert resolve_drafter_config(cfg).target_layer_ids == (1, 3, 5)


@pytest.mark.parametrize(
    ("changes", "types", "causal", "window"),
    [
        (dict(use_sliding_window=True, sliding_window=8, max_window_layers=1), "FSS", (False, True, True), 8),
        (dict(use_sliding_window=True, sliding_window=8, max_window_layers=1, is_causal=False), "FSS", (0, 0, 0), 8),
        (dict(use_sliding_window=True, sliding_window=8, max_window_layers=3), "FFF", (0, 0, 0), None),
        (dict(use_sliding_window=False, sliding_window=8, max_window_layers=0), "FFF", (0, 0, 0), None),
        (dict(is_causal=True), "FFF", (1, 1, 1), None),
        (
            dict(use_sliding_window=True, sliding_window=5, layer_types=["sliding_attention", "full_attention"] * 2)
            | {"num_hidden_layers": 4},
            "SFSF",
            (1, 0, 1, 0),
            5,
        ),
    ],
)
def test_attention_layout_follows_transformers_and_zlab(changes, types, causal, window):
    """Layer types as transformers' Qwen3Config derives them; causality as z-lab's Qwen3DFlashAttention."""
    from transformers import Qwen3Config

    cfg = cfg_with(**changes)
    spec = resolve_drafter_config(cfg)
    names = {"F": "full_attention", "S": "sliding_attention"}
    assert spec.layer_types == tuple(names[t] for t in types)
    assert spec.causal == tuple(bool(c) for c in causal)
    assert spec.sliding_window == window
    hf = Qwen3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    assert tuple(hf.layer_types) == spec.layer_types
    if window is not None:
        assert hf.sliding_window == window
    # the to_dict() form (what SGLang's server args hand over) resolves the same
    assert resolve_drafter_config(hf.to_dict() | {"architectures": ["DFlashDraftModel"]}) == spec


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        (dict(output_multiplier=2.0), "output_multiplier=2.0: DDTREE in SGLang does not apply it"),
        (dict(dflash_config={"input_embedding_scale": 0.5}), "input_embedding_scale=0.5"),
        (dict(final_logit_softcapping=30.0), "final_logit_softcapping=30.0"),
        (dict(is_causal=True), "causal drafter attention is not verified"),
        (dict(use_sliding_window=True, sliding_window=8, max_window_layers=2), "sliding-window drafter layers"),
    ],
)
def test_sglang_consumer_refuses_what_the_plugin_does_not_apply(changes, needle):
    cfg = cfg_with(**changes)
    assert check_drafter_config(cfg, "reference") == []
    problems = check_drafter_config(cfg, "sglang")
    assert any(needle in p for p in problems), problems


def test_neutral_values_are_accepted_by_sglang():
    cfg = cfg_with(output_multiplier=1.0, final_logit_softcapping=0.0, is_causal=False, input_embedding_scale=1)
    assert check_drafter_config(cfg, "sglang") == []


def test_unknown_consumer_is_an_error():
    with pytest.raises(ValueError, match="consumer='vllm'"):
        check_drafter_config(BASE, "vllm")


def test_weight_checks():
    spec = resolve_drafter_config(BASE)
    shapes = expected_weight_shapes(spec)
    assert shapes["fc.weight"] == (64, 3 * 64)
    assert len(shapes) == 3 * 11 + 3
    assert check_drafter_weights(spec, shapes) == []
    assert check_drafter_weights(spec, {f"model.{k}": v for k, v in shapes.items()}) == []
    extra = dict(shapes, **{"embed_tokens.weight": (10, 64), "lm_head.weight": (10, 64)})
    (problem,) = check_drafter_weights(spec, extra)
    assert "unexpected weights ['embed_tokens.weight', 'lm_head.weight'] (2 in all)" in problem
    missing = {k: v for k, v in shapes.items() if k != "layers.2.mlp.up_proj.weight"}
    (problem,) = check_drafter_weights(spec, missing)
    assert "lacks weights ['layers.2.mlp.up_proj.weight']" in problem
    (problem,) = check_drafter_weights(spec, dict(shapes, **{"fc.weight": (64, 128)}))
    assert "'fc.weight' has shape (64, 128), expected (64, 192)" in problem
    dflash2 = dict(shapes, **{"layers.0.mlp_conv.base_kernel": (2, 4, 64), "candidate_selector.x": (1,)})
    (problem,) = check_drafter_weights(spec, dflash2)
    assert problem.startswith("DFlash2 weights ['candidate_selector.x', 'layers.0.mlp_conv.base_kernel']")
    biased = resolve_drafter_config(cfg_with(attention_bias=True))
    assert expected_weight_shapes(biased)["layers.0.self_attn.k_proj.bias"] == (32,)


def test_check_drafter_dir(tmp_path):
    spec = resolve_drafter_config(BASE)
    weights = {k: torch.zeros(v) for k, v in expected_weight_shapes(spec).items()}
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    save_file(weights, str(tmp_path / "model.safetensors"))
    assert read_safetensors_shapes([tmp_path / "model.safetensors"]) == expected_weight_shapes(spec)
    report = check_drafter_dir(tmp_path, "sglang")
    assert report["ok"] and report["weights_checked"] and report["problems"] == []
    assert report["spec"]["target_layer_ids"] == [1, 4, 6]
    weights["lm_head.weight"] = torch.zeros(3, 64)
    save_file(weights, str(tmp_path / "model.safetensors"))
    report = check_drafter_dir(tmp_path, "reference")
    assert not report["ok"] and "unexpected weights ['lm_head.weight']" in report["problems"][0]
    assert not check_drafter_dir(tmp_path / "nope")["ok"]
