"""Tests for plugins/module_utils/_model_fit.py: config reading, layer kinds, KV/state/weights sizes, option
checks and the fit estimate, on the model config fixtures (tests/unit/fixtures/models, see its README for where
each comes from) and the nvidia-smi GPU fixtures.

Expected numbers are derived by hand from the configs (the arithmetic is written next to them), or, where they
depend on the recorded GPU memory, from the documented formula applied to the fixture's values."""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from ansible_collections.specdec.pivot.plugins.module_utils import _model_fit as mf
from ansible_collections.specdec.pivot.plugins.module_utils._model_fit import FitInputError
from ansible_collections.specdec.pivot.plugins.module_utils._nvidia import (
    MIB,
)

GIB = 1 << 30
from hybrid_shape import DRAFTER_PARAMS, target_params, write_hybrid_shape
from nvidia_recordings import recorded_gpus

REPO = Path(__file__).resolve().parents[4]
MODELS = REPO / "tests" / "unit" / "fixtures" / "models"
SMI = REPO / "tests" / "unit" / "fixtures" / "nvidia_smi"

QWEN3_8B = json.loads((MODELS / "qwen3-8b" / "config.json").read_text())
HYBRID = json.loads((MODELS / "qwen3.6-27b-like" / "config.json").read_text())
DRAFTER = json.loads((MODELS / "qwen3-8b-dflash-b16" / "config.json").read_text())
HYBRID_TC = mf.text_config(HYBRID)

QWEN3_8B_BYTES = 16_381_470_720  # index total_size: 8,190,735,360 params x 2
HYBRID_BYTES = 53_791_996_928  # computed language-model size in the fixture index
DRAFTER_BYTES = 2_097_252_864  # 1,048,626,432 params x 2 (README)


IDLE2 = recorded_gpus(SMI / "h200x2" / "idle")
BUSY2 = recorded_gpus(SMI / "h200x2" / "busy")


def model_dir(tmp_path: Path, fixture: str, sparse: dict[str, int] | None = None, config: dict | None = None) -> Path:
    """A model directory: the fixture's JSON files, and sparse ``*.safetensors`` files of the given sizes."""
    dest = tmp_path / fixture
    shutil.copytree(MODELS / fixture, dest)
    if config is not None:
        (dest / "config.json").write_text(json.dumps(config))
    for name, size in (sparse or {}).items():
        with open(dest / name, "wb") as fh:
            fh.truncate(size)
    return dest


@pytest.fixture
def target8b(tmp_path):
    return mf.read_model_dir(str(model_dir(tmp_path, "qwen3-8b")), "target_model_path")


@pytest.fixture
def hybrid(tmp_path):
    return mf.read_model_dir(str(model_dir(tmp_path, "qwen3.6-27b-like")), "target_model_path")


@pytest.fixture
def drafter(tmp_path):
    path = model_dir(tmp_path, "qwen3-8b-dflash-b16", sparse={"model.safetensors": DRAFTER_BYTES})
    return mf.read_model_dir(str(path), "draft_model_path")


def expected_tokens(available: int, mem_fraction: float, weights: int, draft: int, kv: int, state: int = 0) -> int:
    """The documented formula, written out independently of the implementation."""
    rest = int(mem_fraction * available) - weights - draft
    return max((rest - state) // kv, 0)


# --------------------------------------------------------------------------------------------- config


def test_text_config_overlays_the_wrapper():
    tc = mf.text_config(HYBRID)
    assert tc["num_hidden_layers"] == 64 and tc["model_type"] == "qwen3_5_text"
    assert tc["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert mf.text_config(QWEN3_8B) is QWEN3_8B


def _no_layer_types(tc: dict) -> dict:
    return {k: v for k, v in tc.items() if k != "layer_types"}


@pytest.mark.parametrize(
    ("tc", "full", "linear", "sliding", "source"),
    [
        pytest.param(QWEN3_8B, list(range(36)), [], [], "all layers", id="qwen3-8b-dense"),
        pytest.param(
            HYBRID_TC,
            list(range(3, 64, 4)),
            [i for i in range(64) if i % 4 != 3],
            [],
            "layer_types",
            id="hybrid-layer_types",
        ),
        pytest.param(
            _no_layer_types(HYBRID_TC),
            list(range(3, 64, 4)),
            [i for i in range(64) if i % 4 != 3],
            [],
            "full_attention_interval=4",
            id="hybrid-interval-only",
        ),
        pytest.param(DRAFTER, list(range(5)), [], [], "layer_types", id="dflash-drafter"),
        pytest.param(
            {"num_hidden_layers": 4, "layer_types": ["sliding_attention", "full_attention"] * 2},
            [1, 3],
            [],
            [0, 2],
            "layer_types",
            id="sliding-window",
        ),
    ],
)
def test_layer_kinds(tc, full, linear, sliding, source):
    kinds = mf.layer_kinds(tc)
    assert (kinds["full"], kinds["linear"], kinds["sliding"]) == (full, linear, sliding)
    assert kinds["source"].startswith(source)


@pytest.mark.parametrize(
    ("tc", "match"),
    [
        ({"num_hidden_layers": 3, "layer_types": ["full_attention"] * 2}, "2 entries but num_hidden_layers is 3"),
        ({"layer_types": ["full_attention"]}, "num_hidden_layers"),
    ],
)
def test_layer_kinds_rejects_inconsistent_configs(tc, match):
    with pytest.raises(ValueError, match=match):
        mf.layer_kinds(tc)


MLA = {
    "num_attention_heads": 128,
    "hidden_size": 7168,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "num_key_value_heads": 128,
    "num_hidden_layers": 61,
}


@pytest.mark.parametrize(
    ("tc", "layers", "tp", "elem", "expected"),
    [
        # Qwen3-8B: 8 KV heads x (128 K + 128 V) x 36 layers x 2 bytes
        pytest.param(QWEN3_8B, 36, 1, 2, 8 * 256 * 36 * 2, id="qwen3-8b-tp1"),
        pytest.param(QWEN3_8B, 36, 2, 2, 4 * 256 * 36 * 2, id="qwen3-8b-tp2"),
        pytest.param(QWEN3_8B, 36, 8, 2, 1 * 256 * 36 * 2, id="qwen3-8b-tp8"),
        pytest.param(QWEN3_8B, 36, 16, 2, 1 * 256 * 36 * 2, id="qwen3-8b-tp16-replicated"),
        pytest.param(QWEN3_8B, 36, 1, 1, 8 * 256 * 36 * 1, id="qwen3-8b-fp8"),
        # hybrid: only the 16 full-attention layers, 4 KV heads x (256 + 256)
        pytest.param(HYBRID_TC, 16, 1, 2, 4 * 512 * 16 * 2, id="hybrid-tp1"),
        pytest.param(HYBRID_TC, 16, 2, 2, 2 * 512 * 16 * 2, id="hybrid-tp2"),
        pytest.param(HYBRID_TC, 16, 8, 2, 1 * 512 * 16 * 2, id="hybrid-tp8-replicated"),
        # drafter: 5 layers like Qwen3-8B's
        pytest.param(DRAFTER, 5, 1, 2, 8 * 256 * 5 * 2, id="drafter-tp1"),
        # MLA: one (512 + 64) latent per layer, not split by TP
        pytest.param(MLA, 61, 8, 2, 576 * 61 * 2, id="mla"),
        pytest.param(QWEN3_8B, 0, 1, 2, 0, id="no-layers"),
    ],
)
def test_kv_bytes_per_token(tc, layers, tp, elem, expected):
    assert mf.kv_bytes_per_token(tc, layers, tp, elem) == expected


@pytest.mark.parametrize(
    ("tc", "tp", "expected"),
    [
        # conv: (48*128 + 2*16*128) = 10240 channels x (4-1) x 2 bytes; ssm: 48 x 128 x 128 x 4 bytes; x 48 layers
        pytest.param(HYBRID_TC, 1, (10240 * 3 * 2 + 48 * 128 * 128 * 4) * 48, id="tp1"),
        pytest.param(HYBRID_TC, 2, (5120 * 3 * 2 + 24 * 128 * 128 * 4) * 48, id="tp2"),
        pytest.param(
            {**HYBRID_TC, "mamba_ssm_dtype": "bfloat16"},
            1,
            (10240 * 3 * 2 + 48 * 128 * 128 * 2) * 48,
            id="bf16-ssm-state",
        ),
    ],
)
def test_linear_state_bytes_per_request(tc, tp, expected):
    assert mf.linear_state_bytes_per_request(tc, 48, tp) == expected
    assert mf.linear_state_bytes_per_request(tc, 0, tp) == 0


def test_linear_state_needs_the_linear_keys():
    with pytest.raises(ValueError, match="linear_num_key_heads"):
        mf.linear_state_bytes_per_request({"num_hidden_layers": 4, "full_attention_interval": 2}, 2, 1)


# --------------------------------------------------------------------------------------------- weights


def test_weights_from_index(target8b):
    assert mf.weights_bytes(target8b) == (QWEN3_8B_BYTES, "model.safetensors.index.json metadata.total_size")


def test_weights_from_file_sizes(tmp_path):
    sizes = {"model-00001-of-00002.safetensors": 3 * MIB + 7, "model-00002-of-00002.safetensors": 5 * MIB}
    path = model_dir(tmp_path, "qwen3-8b", sparse=sizes)
    (path / "model.safetensors.index.json").unlink()
    files = mf.read_model_dir(str(path), "target_model_path")
    assert mf.weights_bytes(files) == (8 * MIB + 7, "size of 2 *.safetensors file(s)")


def test_weights_missing_is_an_error(tmp_path):
    path = model_dir(tmp_path, "qwen3-8b-dflash-b16")  # config only, no weights
    with pytest.raises(ValueError, match=re.escape("neither model.safetensors.index.json")):
        mf.weights_bytes(mf.read_model_dir(str(path), "draft_model_path"))


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        ("auto", QWEN3_8B_BYTES),
        ("bfloat16", QWEN3_8B_BYTES),
        ("float32", QWEN3_8B_BYTES * 2),
        ("fp8", QWEN3_8B_BYTES // 2),
    ],
)
def test_loaded_weights_follow_dtype(target8b, dtype, expected):
    assert mf.loaded_weights_bytes(target8b, dtype)[0] == expected


def test_quantized_checkpoint_is_taken_as_stored(tmp_path):
    cfg = {**QWEN3_8B, "quantization_config": {"quant_method": "fp8"}}
    files = mf.read_model_dir(str(model_dir(tmp_path, "qwen3-8b", config=cfg)), "target_model_path")
    assert mf.loaded_weights_bytes(files, "float32")[0] == QWEN3_8B_BYTES


@pytest.mark.parametrize(
    ("setup", "words"),
    [
        ("missing-dir", ["target_model_path=", "not a directory"]),
        ("no-config", ["target_model_path=", "has no config.json"]),
        ("bad-json", ["target_model_path=", "config.json cannot be read as JSON"]),
        ("not-object", ["target_model_path=", "not a JSON object"]),
    ],
)
def test_read_model_dir_errors(tmp_path, setup, words):
    path = tmp_path / "m"
    if setup != "missing-dir":
        path.mkdir()
    if setup == "bad-json":
        (path / "config.json").write_text("{nope")
    if setup == "not-object":
        (path / "config.json").write_text("[1, 2]")
    with pytest.raises(FitInputError) as info:
        mf.read_model_dir(str(path), "target_model_path")
    assert info.value.option == "target_model_path"
    for word in words:
        assert word in str(info.value)


# --------------------------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("tc", "tp", "words"),
    [
        pytest.param(QWEN3_8B, 3, ["tp_size=3", "num_attention_heads=32", "e.g. 1, 2, 4, 8"], id="8b-tp3"),
        pytest.param(QWEN3_8B, 12, ["tp_size=12", "num_attention_heads=32"], id="8b-tp12"),
        pytest.param(HYBRID_TC, 3, ["tp_size=3", "num_key_value_heads=4"], id="hybrid-tp3-kv"),
        pytest.param(HYBRID_TC, 32, ["tp_size=32", "num_attention_heads=24"], id="hybrid-tp32"),
        pytest.param(
            {**HYBRID_TC, "linear_num_key_heads": 12},
            8,
            ["tp_size=8", "linear_num_key_heads=12"],
            id="hybrid-linear-heads",
        ),
    ],
)
def test_check_tp_refuses_splits_sglang_cannot_do(tc, tp, words):
    with pytest.raises(FitInputError) as info:
        mf.check_tp(tc, tp, "target model")
    assert info.value.option == "tp_size"
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    ("tc", "tp"), [(QWEN3_8B, 1), (QWEN3_8B, 2), (QWEN3_8B, 16), (HYBRID_TC, 2), (HYBRID_TC, 8), (DRAFTER, 4)]
)
def test_check_tp_accepts_valid_splits(tc, tp):
    mf.check_tp(tc, tp, "model")


GOOD = {"mem_fraction": 0.85, "tp_size": 2, "context_length": 32768, "dtype": "auto", "kv_cache_dtype": "auto"}


@pytest.mark.parametrize(
    ("change", "option", "words"),
    [
        ({"mem_fraction": 1.5}, "mem_fraction", ["mem_fraction=1.5", "between 0 and 1", "e.g. 0.85"]),
        ({"mem_fraction": 0.0}, "mem_fraction", ["mem_fraction=0.0", "between 0 and 1"]),
        ({"mem_fraction": 1.0}, "mem_fraction", ["mem_fraction=1.0"]),
        ({"mem_fraction": -0.2}, "mem_fraction", ["mem_fraction=-0.2"]),
        ({"tp_size": 0}, "tp_size", ["tp_size=0", "positive integer"]),
        ({"context_length": 0}, "context_length", ["context_length=0", "--context-length"]),
        ({"max_running_requests": 0}, "max_running_requests", ["max_running_requests=0"]),
        ({"mamba_full_memory_ratio": 0}, "mamba_full_memory_ratio", ["mamba_full_memory_ratio=0", "0.9"]),
        ({"max_mamba_cache_size": -4}, "max_mamba_cache_size", ["max_mamba_cache_size=-4", "positive integer"]),
        (
            {"disable_radix_cache": "yes"},
            "disable_radix_cache",
            ["disable_radix_cache='yes'", "true or false", "--disable-radix-cache"],
        ),
        ({"disable_radix_cache": 1}, "disable_radix_cache", ["disable_radix_cache=1", "true or false"]),
        ({"dtype": "int4"}, "dtype", ["dtype='int4'", "bfloat16"]),
        ({"kv_cache_dtype": "fp4"}, "kv_cache_dtype", ["kv_cache_dtype='fp4'", "fp8_e4m3"]),
    ],
)
def test_validate_options(change, option, words):
    with pytest.raises(FitInputError) as info:
        mf.validate_options({**GOOD, **change})
    assert info.value.option == option
    for word in words:
        assert word in str(info.value)


def test_validate_options_accepts_good_values():
    mf.validate_options(GOOD)


@pytest.mark.parametrize(
    ("indices", "tp", "expected"),
    [(None, 1, [0]), (None, 2, [0, 1]), ([1], 1, [1]), ([1, 0], 2, [1, 0])],
)
def test_select_gpus(indices, tp, expected):
    assert [g["index"] for g in mf.select_gpus(IDLE2, indices, tp)] == expected


@pytest.mark.parametrize(
    ("indices", "tp", "option", "words"),
    [
        ([0, 5], 2, "gpu_indices", ["[5] are not present", "present are [0, 1]"]),
        ([0, 0], 2, "gpu_indices", ["twice"]),
        ([0], 2, "gpu_indices", ["has 1 GPU(s) but tp_size is 2"]),
        (None, 4, "tp_size", ["needs 4 GPUs but this host has 2"]),
    ],
)
def test_select_gpus_errors(indices, tp, option, words):
    with pytest.raises(FitInputError) as info:
        mf.select_gpus(IDLE2, indices, tp)
    assert info.value.option == option
    for word in words:
        assert word in str(info.value)


# --------------------------------------------------------------------------------------------- plan_fit


def avail(gpu: dict) -> int:
    return gpu["memory_free_mib"] * MIB


def test_dense_qwen3_8b_tp1(target8b):
    gpu = IDLE2[0]
    fit = mf.plan_fit(target8b, None, [gpu], tp_size=1, mem_fraction=0.85, context_length=32768)
    kv = 8 * 256 * 36 * 2
    assert fit["weights_bytes_per_gpu"] == QWEN3_8B_BYTES
    assert fit["kv_bytes_per_token"] == kv
    assert (fit["full_attention_layers"], fit["linear_attention_layers"]) == (36, 0)
    assert fit["kv_tokens_fit"] == expected_tokens(avail(gpu), 0.85, QWEN3_8B_BYTES, 0, kv)
    assert fit["budget_bytes_per_gpu"] == [int(0.85 * avail(gpu))]
    assert fit["free_bytes_per_gpu"] == [avail(gpu)]
    assert fit["fits"] is True
    assert fit["min_kv_tokens_needed"] == 32768
    assert fit["reason"].startswith("fits (estimate)")
    assert fit["estimate"] is True


def test_dense_qwen3_8b_tp2_splits_weights_and_kv(target8b):
    tp1 = mf.plan_fit(target8b, None, IDLE2[:1], tp_size=1, mem_fraction=0.85, context_length=32768)
    tp2 = mf.plan_fit(target8b, None, IDLE2, tp_size=2, mem_fraction=0.85, context_length=32768)
    assert tp2["weights_bytes_per_gpu"] == QWEN3_8B_BYTES // 2
    assert tp2["kv_bytes_per_token"] == tp1["kv_bytes_per_token"] // 2
    assert tp2["gpu_indices"] == [0, 1]
    want = min(expected_tokens(avail(g), 0.85, QWEN3_8B_BYTES // 2, 0, 4 * 256 * 36 * 2) for g in IDLE2)
    assert tp2["kv_tokens_fit"] == want
    assert tp2["kv_tokens_fit"] > 2 * tp1["kv_tokens_fit"]  # half the KV per token and half the weights


def test_hybrid_counts_only_full_attention_layers(hybrid):
    gpu = IDLE2[0]
    fit = mf.plan_fit(hybrid, None, [gpu], tp_size=1, mem_fraction=0.85, context_length=131072)
    assert (fit["full_attention_layers"], fit["linear_attention_layers"]) == (16, 48)
    assert fit["kv_bytes_per_token"] == 4 * 512 * 16 * 2
    assert fit["kv_bytes_per_token"] * 4 == mf.kv_bytes_per_token(HYBRID_TC, 64, 1, 2)  # not all 64 layers
    per_req = (10240 * 3 * 2 + 48 * 128 * 128 * 4) * 48
    assert fit["linear_state_bytes_per_request"] == per_req
    rest = int(0.85 * avail(gpu)) - HYBRID_BYTES
    state = int(rest * 0.9 / 1.9)
    assert fit["linear_state_bytes_per_gpu"] == state
    assert fit["kv_tokens_fit"] == (rest - state) // (4 * 512 * 16 * 2)
    assert fit["fits"] is (fit["kv_tokens_fit"] >= 131072)


def test_hybrid_with_fixed_state_slots(hybrid):
    per_req = (10240 * 3 * 2 + 48 * 128 * 128 * 4) * 48
    fit = mf.plan_fit(
        hybrid, None, IDLE2[:1], tp_size=1, mem_fraction=0.85, context_length=4096, max_mamba_cache_size=64
    )
    assert fit["linear_state_bytes_per_gpu"] == 65 * per_req
    spec = mf.plan_fit(
        hybrid,
        None,
        IDLE2[:1],
        tp_size=1,
        mem_fraction=0.85,
        context_length=4096,
        max_mamba_cache_size=64,
        speculative_num_draft_tokens=8,
        max_running_requests=16,
    )
    assert spec["linear_state_bytes_per_gpu"] == 65 * per_req + per_req * (16 + 1) * 8
    assert spec["kv_tokens_fit"] < fit["kv_tokens_fit"]


def test_hybrid_without_room_for_one_request_state(hybrid):
    fit = mf.plan_fit(
        hybrid, None, IDLE2[:1], tp_size=1, mem_fraction=0.5, context_length=1024, speculative_num_draft_tokens=100
    )
    assert fit["fits"] is False
    assert "linear-attention state of even one request" in fit["reason"]


def test_drafter_weights_and_kv_are_included(target8b, drafter):
    gpu = IDLE2[0]
    alone = mf.plan_fit(target8b, None, [gpu], tp_size=1, mem_fraction=0.85, context_length=32768)
    fit = mf.plan_fit(target8b, drafter, [gpu], tp_size=1, mem_fraction=0.85, context_length=32768)
    assert fit["draft_bytes"] == DRAFTER_BYTES
    assert fit["draft_source"] == "size of 1 *.safetensors file(s)"
    assert fit["draft_kv_bytes_per_token"] == 8 * 256 * 5 * 2
    assert fit["kv_bytes_per_token"] == alone["kv_bytes_per_token"] + 8 * 256 * 5 * 2
    assert fit["draft_layers"] == 5
    assert fit["speculative_num_draft_tokens"] == 16  # the drafter's block size
    assert fit["kv_tokens_fit"] == expected_tokens(
        avail(gpu), 0.85, QWEN3_8B_BYTES, DRAFTER_BYTES, fit["kv_bytes_per_token"]
    )
    assert fit["kv_tokens_fit"] < alone["kv_tokens_fit"]
    assert fit["notes"] == []  # drafter built for this target


def test_drafter_for_another_target_is_noted(hybrid, drafter):
    fit = mf.plan_fit(hybrid, drafter, IDLE2[:1], tp_size=1, mem_fraction=0.85, context_length=4096)
    assert any("36 layers" in n and "64" in n for n in fit["notes"])
    assert any("hidden_size 4096" in n for n in fit["notes"])


@pytest.mark.parametrize("kv_dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_fp8_kv_cache_halves_kv_per_token(target8b, kv_dtype):
    gpu = IDLE2[0]
    bf16 = mf.plan_fit(target8b, None, [gpu], tp_size=1, mem_fraction=0.85, context_length=32768)
    fp8 = mf.plan_fit(
        target8b, None, [gpu], tp_size=1, mem_fraction=0.85, context_length=32768, kv_cache_dtype=kv_dtype
    )
    assert fp8["kv_bytes_per_token"] * 2 == bf16["kv_bytes_per_token"]
    assert fp8["kv_cache_dtype_used"] == kv_dtype
    assert fp8["kv_tokens_fit"] == expected_tokens(avail(gpu), 0.85, QWEN3_8B_BYTES, 0, 8 * 256 * 36)


def test_mem_fraction_too_small_for_the_weights(hybrid):
    fit = mf.plan_fit(hybrid, None, IDLE2[:1], tp_size=1, mem_fraction=0.1, context_length=4096)
    assert fit["fits"] is False
    assert fit["kv_tokens_fit"] == 0
    assert "weights alone" in fit["reason"] and "mem_fraction 0.1" in fit["reason"]
    assert "raise mem_fraction or tp_size" in fit["reason"]


def test_mem_fraction_too_small_for_the_context(hybrid):
    fit = mf.plan_fit(hybrid, None, IDLE2[:1], tp_size=1, mem_fraction=0.45, context_length=262144)
    assert fit["fits"] is False
    assert 0 < fit["kv_tokens_fit"] < 262144
    assert f"room for {fit['kv_tokens_fit']:,} KV tokens, context_length needs 262,144" in fit["reason"]
    assert "kv_cache_dtype fp8" in fit["reason"]


def occupied_gpu(base: dict, pid: int, mib: int) -> dict:
    """A GPU like ``base`` where one more compute process holds ``mib`` MiB."""
    gpu = copy.deepcopy(base)
    gpu["memory_used_mib"] += mib
    gpu["memory_free_mib"] -= mib
    gpu["compute_processes"].append({"pid": pid, "name": "/opt/train/bin/python", "used_mib": mib})
    return gpu


def test_reason_names_the_process_holding_the_memory(hybrid):
    gpu = occupied_gpu(IDLE2[0], 31337, 60 * 1024)
    probe = mf.plan_fit(hybrid, None, [gpu], tp_size=1, mem_fraction=0.85, context_length=1)
    busy, idle = probe["per_gpu"][0]["kv_tokens"], probe["per_gpu"][0]["kv_tokens_if_idle"]
    assert busy < idle
    context = (busy + idle) // 2  # fits on an idle GPU, not next to the process
    fit = mf.plan_fit(hybrid, None, [gpu], tp_size=1, mem_fraction=0.85, context_length=context)
    assert fit["fits"] is False
    assert "pid 31337 (/opt/train/bin/python, 61440 MiB)" in fit["reason"]
    assert "stop those processes first" in fit["reason"]
    freed = mf.plan_fit(
        hybrid, None, [gpu], tp_size=1, mem_fraction=0.85, context_length=context, assume_freed_pids=[31337]
    )
    assert freed["available_bytes_per_gpu"] == [avail(gpu) + 60 * 1024 * MIB]
    assert freed["fits"] is True


def test_reason_names_the_recorded_holder_on_the_busy_gpu(target8b):
    gpu = BUSY2[0]
    fit = mf.plan_fit(target8b, None, [gpu], tp_size=1, mem_fraction=0.12, context_length=32768)
    assert fit["fits"] is False
    in_use = gpu["memory_total_mib"] - gpu["memory_free_mib"]
    if in_use > 0.05 * gpu["memory_total_mib"]:
        for proc in gpu["compute_processes"]:
            assert f"pid {proc['pid']}" in fit["reason"]
    assert f"GPU {gpu['index']}:" in fit["reason"]


def test_tightest_gpu_decides(target8b):
    """SGLang sizes every rank of a TP group from the group's smallest free memory (pre_model_load_memory)."""
    busy0 = occupied_gpu(IDLE2[0], 99, 40 * 1024)
    fit = mf.plan_fit(
        target8b,
        None,
        [busy0, IDLE2[1]],
        tp_size=2,
        mem_fraction=0.85,
        context_length=1024,
        tp_memory_balance_check=False,
    )
    tokens = [g["kv_tokens"] for g in fit["per_gpu"]]
    assert tokens[0] == tokens[1] == fit["kv_tokens_fit"]
    assert fit["budget_bytes_per_gpu"] == [math.floor(0.85 * avail(busy0))] * 2
    assert fit["fits"] is True and "only warns" in fit["tp_memory_balance"]["warning"]


# ------------------------------------------------------------------------ SGLang's TP memory-balance check
# Recorded H200 pair (h200x2/idle), with a foreign process added on one GPU (the shape nvidia-smi reports).


@pytest.mark.parametrize(
    ("foreign_mib", "on_gpu", "tp_size", "freed", "check", "ok"),
    [
        (40 * 1024, 1, 2, [], True, False),  # the case: SGLang refuses to start
        (40 * 1024, 0, 2, [], True, False),  # on either GPU of the group
        (13 * 1024, 1, 2, [], True, True),  # 126.8 GiB >= 0.9 x 139.8 GiB = 125.8 GiB: within SGLang's 10 %
        (15 * 1024, 1, 2, [], True, False),  # 124.8 GiB < 125.8 GiB: just outside
        (40 * 1024, 1, 2, [4242], True, True),  # the holder is stopped before the server starts (old server)
        (40 * 1024, 1, 2, [], False, True),  # SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=false: SGLang only warns
        (40 * 1024, 0, 1, [], True, True),  # tp_size 1: no balance check
    ],
)
def test_tp_memory_balance_as_sglang_checks_it(target8b, foreign_mib, on_gpu, tp_size, freed, check, ok):
    gpus = [occupied_gpu(g, 4242, foreign_mib) if g["index"] == on_gpu else g for g in IDLE2][:tp_size]
    if tp_size == 1:
        gpus = [occupied_gpu(IDLE2[0], 4242, foreign_mib)]
    fit = mf.plan_fit(
        target8b,
        None,
        gpus,
        tp_size=tp_size,
        mem_fraction=0.85,
        context_length=4096,
        assume_freed_pids=freed,
        tp_memory_balance_check=check,
    )
    balance = fit["tp_memory_balance"]
    assert balance["ok"] is ok and fit["fits"] is ok, fit["reason"]
    assert balance["checked"] is (tp_size > 1)
    if not ok:
        assert fit["reason"].startswith("does not fit (SGLang's start-up rules)")
        assert f"GPU {on_gpu} has" in fit["reason"] and "memory-balance check" in fit["reason"]
        assert "pid 4242 (/opt/train/bin/python, " in fit["reason"]
        assert "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=false" in fit["reason"]


def test_the_model_would_fit_by_budget_yet_sglang_refuses_to_start(target8b):
    """Issue 16, point 3: 40 GB foreign on GPU 1 at TP 2 - the budget holds the model, the balance check does not."""
    gpus = [IDLE2[0], occupied_gpu(IDLE2[1], 4242, 40 * 1024)]
    off = mf.plan_fit(
        target8b, None, gpus, tp_size=2, mem_fraction=0.85, context_length=32768, tp_memory_balance_check=False
    )
    assert off["kv_tokens_fit"] >= 32768  # the memory alone is enough
    on = mf.plan_fit(target8b, None, gpus, tp_size=2, mem_fraction=0.85, context_length=32768)
    assert on["fits"] is False and "refuses to start" in on["reason"]


@pytest.mark.parametrize(
    ("available", "tp_size", "ok"),
    [
        ([100, 100], 2, True),
        ([90, 100], 2, True),
        ([89, 100], 2, False),
        ([100, 89], 2, False),
        ([100, 100, 100, 80], 4, False),
        ([100, 95, 92, 91], 4, True),
        ([10], 1, True),
        ([0, 100], 2, False),
    ],
)
def test_tp_balance_table(available, tp_size, ok):
    got = mf.tp_balance(list(enumerate(available)), tp_size)
    assert got["ok"] is ok and got["unbalanced"] is (not ok)
    assert got["min_available_bytes"] == min(available) and got["threshold_bytes"] == int(0.9 * max(available))
    assert mf.tp_balance(list(enumerate(available)), tp_size, enabled=False)["ok"] is True


def test_plan_fit_checks_its_inputs(target8b):
    with pytest.raises(FitInputError, match=re.escape("mem_fraction=1.5")):
        mf.plan_fit(target8b, None, IDLE2[:1], tp_size=1, mem_fraction=1.5, context_length=1)
    with pytest.raises(FitInputError, match="exactly tp_size=2"):
        mf.plan_fit(target8b, None, IDLE2[:1], tp_size=2, mem_fraction=0.5, context_length=1)
    with pytest.raises(FitInputError, match="tp_size=3"):
        mf.plan_fit(target8b, None, [*IDLE2, IDLE2[0]], tp_size=3, mem_fraction=0.5, context_length=1)


def test_budget_is_a_fraction_of_available_memory(target8b):
    for mem_fraction in (0.3, 0.6, 0.9):
        fit = mf.plan_fit(target8b, None, IDLE2[:1], tp_size=1, mem_fraction=mem_fraction, context_length=1)
        assert fit["budget_bytes_per_gpu"] == [math.floor(mem_fraction * avail(IDLE2[0]))]


# --------------------------------------------------------------------------------------------- linear-attention state
# SGLang's _handle_max_mamba_cache (kv_cache_configurator.py, 0.5.17 and 0.5.23): three ways to size the state of
# the GatedDeltaNet layers. The numbers: P = one request's state, D = draft tokens; every pool has a padding slot.

P = 1_000_000  # a round state per request for the hand arithmetic
REST = 40 * P * 100  # 4e9 bytes left after the weights


@pytest.mark.parametrize(
    ("kwargs", "reserved", "slots", "rule"),
    [
        # --disable-radix-cache --max-running-requests 32: 32 slots + padding, and with D = 17 one state per verify
        # token of each of them: 33 x P + 33 x P x 17 = 33 x 18 x P = 594 P
        pytest.param(dict(spec=17, running=32, radix_off=True), 594 * P, 32, "disable_radix_cache", id="drc-spec17"),
        pytest.param(dict(spec=0, running=32, radix_off=True), 33 * P, 32, "disable_radix_cache", id="drc-no-spec"),
        pytest.param(dict(spec=8, running=1, radix_off=True), 2 * P + 2 * 8 * P, 1, "disable_radix_cache", id="drc-1"),
        # --disable-radix-cache without max_running_requests (no speculative default either): the ratio budget
        pytest.param(
            dict(spec=0, running=None, radix_off=True),
            int(REST * 0.9 / 1.9),
            int(REST * 0.9 / 1.9) // P - 1,
            "mamba_full_memory_ratio",
            id="drc-without-running-is-ratio",
        ),
        # radix cache on: max_running_requests alone changes nothing, the ratio budget rest x 0.9 / 1.9
        pytest.param(
            dict(spec=0, running=32, radix_off=False),
            int(REST * 0.9 / 1.9),
            int(REST * 0.9 / 1.9) // P - 1,
            "mamba_full_memory_ratio",
            id="radix-on-ratio",
        ),
        # ... with D = 17 the slots hold 18 states each: (budget - 18 P) // 18 P
        pytest.param(
            dict(spec=17, running=32, radix_off=False),
            int(REST * 0.9 / 1.9),
            (int(REST * 0.9 / 1.9) - 18 * P) // (18 * P),
            "mamba_full_memory_ratio",
            id="radix-on-ratio-spec17",
        ),
        # --max-mamba-cache-size 64 wins over both: 65 P, and min(running, 64) + 1 verify states per draft token
        pytest.param(
            dict(spec=8, running=16, radix_off=True, fixed=64),
            65 * P + 17 * 8 * P,
            64,
            "max_mamba_cache_size",
            id="max-mamba-cache-size-wins",
        ),
        pytest.param(dict(spec=0, running=None, fixed=64), 65 * P, 64, "max_mamba_cache_size", id="mmcs-no-spec"),
    ],
)
def test_state_reservation(kwargs, reserved, slots, rule):
    got = mf._state_reservation(
        REST, P, kwargs["spec"], 0.9, kwargs.get("fixed"), kwargs["running"], kwargs.get("radix_off", False)
    )
    assert got == (reserved, slots, rule)


def test_state_reservation_without_linear_layers():
    assert mf._state_reservation(REST, 0, 17, 0.9, None, 32, True) == (0, 0, None)


def test_the_fixed_state_does_not_shrink_with_the_memory_left():
    """The ratio budget follows what the weights leave; --disable-radix-cache's state does not (SGLang reserves it
    first and finds out afterwards that nothing is left for the KV cache)."""
    small, large = REST // 10, REST * 10
    assert mf._state_reservation(small, P, 17, 0.9, None, 32, True)[0] == 594 * P > small
    assert mf._state_reservation(large, P, 17, 0.9, None, 32, True)[0] == 594 * P
    assert mf._state_reservation(small, P, 17, 0.9, None, 32, False)[0] == int(small * 0.9 / 1.9)


def hybrid_shape(tmp_path: Path, layers: int) -> tuple[mf.ModelFiles, mf.ModelFiles]:
    """bench/gpu/shapes.py's Qwen3.6-27B-shaped target, ``layers`` deep, and its DFlash drafter (tests/unit/
    hybrid_shape.py says how their weight sizes are computed)."""
    target, drafter = write_hybrid_shape(tmp_path / "shape", layers)
    return mf.read_model_dir(str(target), "target_model_path"), mf.read_model_dir(str(drafter), "draft_model_path")


def test_the_hybrid_shape_weights_follow_the_fixture_index(tmp_path):
    target, drafter = hybrid_shape(tmp_path, 64)
    assert mf.weights_bytes(target)[0] == HYBRID_BYTES  # the same arithmetic as the fixture's index
    assert mf.weights_bytes(drafter)[0] == 2 * 1_730_213_120
    assert target_params(32) == 14_719_400_192


#: An idle 80 GB H100: nvidia-smi's memory.total of the H100 80GB HBM3 (81559 MiB); free is total less the 615 MiB
#: the driver kept on the recorded idle H200 (143771 - 143156; tests/unit/fixtures/nvidia_smi/h200/idle).
H100 = {
    "index": 0,
    "uuid": "GPU-00000000-0000-0000-0000-000000000000",
    "name": "NVIDIA H100 80GB HBM3",
    "memory_total_mib": 81559,
    "memory_used_mib": 0,
    "memory_free_mib": 81559 - 615,
    "compute_processes": [],
}
SHAPE32_TARGET_BYTES = 2 * target_params(32)
SHAPE32_DRAFTER_BYTES = 2 * DRAFTER_PARAMS
#: one request's GatedDeltaNet state at tp 1: conv (48 x 128 + 2 x 16 x 128) x 3 x 2 bytes + SSM 48 x 128 x 128 x 4
#: bytes, x 24 linear layers = 76,972,032 (3.2 MB a layer)
SHAPE32_STATE = (10240 * 3 * 2 + 48 * 128 * 128 * 4) * 24
#: KV per token: the target's 8 full-attention layers (4 KV heads x 512 x 2 bytes) + the drafter's 5 (8 x 256 x 2)
SHAPE32_KV = 4 * 512 * 8 * 2 + 8 * 256 * 5 * 2


@pytest.mark.parametrize(
    ("radix_off", "state", "slots", "rule", "fits"),
    [
        # the H100 failure: --disable-radix-cache --max-running-requests 32, 17 draft tokens (DDTree budget 16):
        # 33 x 76,972,032 main + 33 x 17 x 76,972,032 verify state = 45,721,387,008 bytes (42.6 GiB), more than the
        # 39.2 GB the weights leave of 0.85 x 79.0 GiB: SGLang stopped with "Loaded weights leave no GPU memory for
        # the KV cache under --mem-fraction-static=0.85"
        pytest.param(True, 594 * SHAPE32_STATE, 32, "disable_radix_cache", False, id="disable-radix-cache-h100"),
        # the same with the radix cache on: rest x 0.9 / 1.9 for the state, the rest holds the KV cache
        pytest.param(False, None, None, "mamba_full_memory_ratio", True, id="radix-cache-on-h100"),
    ],
)
def test_qwen36_27b_shape_on_an_h100(tmp_path, radix_off, state, slots, rule, fits):
    target, drafter = hybrid_shape(tmp_path, 32)
    fit = mf.plan_fit(
        target,
        drafter,
        [H100],
        tp_size=1,
        mem_fraction=0.85,
        context_length=40960,  # the shape's max_position_embeddings
        speculative_num_draft_tokens=17,
        max_running_requests=32,
        disable_radix_cache=radix_off,
    )
    rest = int(0.85 * (81559 - 615) * MIB) - SHAPE32_TARGET_BYTES - SHAPE32_DRAFTER_BYTES
    assert rest == 39_245_318_758
    assert fit["weights_bytes_per_gpu"] == SHAPE32_TARGET_BYTES == 29_438_800_384
    assert fit["draft_bytes"] == SHAPE32_DRAFTER_BYTES
    assert fit["linear_state_bytes_per_request"] == SHAPE32_STATE == 76_972_032
    assert fit["kv_bytes_per_token"] == SHAPE32_KV
    assert (fit["full_attention_layers"], fit["linear_attention_layers"]) == (8, 24)
    if state is None:  # the ratio branch: (budget - 18 P) // 18 P slots
        state = int(rest * 0.9 / 1.9)
        slots = (state - 18 * SHAPE32_STATE) // (18 * SHAPE32_STATE)
        assert slots == 12
    assert (fit["linear_state_bytes_per_gpu"], fit["linear_state_slots"], fit["linear_state_rule"]) == (
        state,
        slots,
        rule,
    )
    assert fit["kv_tokens_fit"] == max((rest - state) // SHAPE32_KV, 0)
    assert fit["fits"] is fits
    assert (fit["max_running_requests"], fit["disable_radix_cache"], fit["speculative_num_draft_tokens"]) == (
        32,
        radix_off,
        17,
    )
    if fits:
        assert fit["kv_tokens_fit"] == 387_909
        return
    assert state == 45_721_387_008 > rest
    assert fit["kv_tokens_fit"] == 0
    for words in (
        "SGLang reserves 42.6 GiB of linear-attention state for 32 request slots",
        "disable_radix_cache with max_running_requests 32, one more state per request for each of 17 draft tokens",
        "more than the 36.6 GiB the weights leave",
        "Loaded weights leave no GPU memory for the KV cache",
        "lower max_running_requests or speculative_num_draft_tokens",
        "drop --disable-radix-cache",
    ):
        assert words in fit["reason"], fit["reason"]


@pytest.mark.parametrize(
    ("running", "spec", "expected_running", "state"),
    [
        # speculative decoding: SGLang's algorithms (and DDTREE) set max_running_requests to 48 when it is unset
        pytest.param(None, 17, 48, 49 * 18 * SHAPE32_STATE, id="spec-default-48"),
        pytest.param(8, 17, 8, 9 * 18 * SHAPE32_STATE, id="spec-8"),
        # without speculative decoding and without max_running_requests: the ratio budget
        pytest.param(None, None, None, None, id="no-spec-no-running"),
        pytest.param(8, None, 8, 9 * SHAPE32_STATE, id="no-spec-8"),
    ],
)
def test_disable_radix_cache_running_requests(tmp_path, running, spec, expected_running, state):
    target, _drafter = hybrid_shape(tmp_path, 32)
    fit = mf.plan_fit(
        target,
        None,
        [H100],
        tp_size=1,
        mem_fraction=0.85,
        context_length=4096,
        speculative_num_draft_tokens=spec,
        max_running_requests=running,
        disable_radix_cache=True,
    )
    assert fit["max_running_requests"] == expected_running
    if state is None:
        assert fit["linear_state_rule"] == "mamba_full_memory_ratio"
        return
    assert fit["linear_state_rule"] == "disable_radix_cache"
    assert fit["linear_state_bytes_per_gpu"] == state


def test_a_small_fixed_state_leaves_a_context_short_with_both_fixes(tmp_path):
    """Room for some KV tokens after the fixed state, but not for the context: the reason names the state and
    every fix (the state's knobs and the KV cache's)."""
    target, _drafter = hybrid_shape(tmp_path, 32)
    fit = mf.plan_fit(
        target, None, [H100], tp_size=1, mem_fraction=0.85, context_length=10**7,
        speculative_num_draft_tokens=17, max_running_requests=8, disable_radix_cache=True,
    )  # fmt: skip
    assert fit["fits"] is False and 0 < fit["kv_tokens_fit"] < 10**7
    state = f"{9 * 18 * SHAPE32_STATE / GIB:.1f} GiB"
    assert f"after {state} of linear-attention state for 8 request slots" in fit["reason"], fit["reason"]
    assert "drop --disable-radix-cache" in fit["reason"] and "lower context_length" in fit["reason"]


# --------------------------------------------------------------------------------------------- against SGLang itself
# SGLang's own _handle_max_mamba_cache and Qwen3.5's mamba2_cache_params, called in a fresh interpreter of each
# project venv (importing sglang in this process fails once ansible's module_utils have patched sys.intern, see
# tests/unit/bench/test_http_semantics.py) on a stand-in for the KVCacheConfigurator: only the attributes and the
# runtime-context getters the method reads, with attention DP 1, PP 1, no ReplaySSM, no fused draft state, no PD.
SGLANG_PYTHONS = {
    "0.5.23": REPO / ".venv" / "bin" / "python",
    "0.5.17": REPO / ".venv-sglang-0.5.17" / "bin" / "python",
}

SGLANG_STANDIN = r"""
import json, sys
from types import SimpleNamespace as NS

import sglang
from sglang.srt.configs import qwen3_5, qwen3_next
from sglang.srt.mem_cache import kv_cache_configurator as kvc

request = json.load(sys.stdin)
out = {"version": sglang.__version__, "per_req": {}, "cases": []}
for tp in (1, 2):  # the state of one request, as SGLang's Qwen3.5 config computes it
    qwen3_next.get_parallel = lambda tp=tp: NS(attn_tp_size=tp)  # 0.5.17
    qwen3_next.linear_attn_tp_size = lambda tp=tp: tp  # 0.5.23
    params = qwen3_5.Qwen3_5TextConfig(**request["text_config"]).mamba2_cache_params
    out["per_req"][str(tp)] = [params.mamba_cache_per_req, len(params.layers)]

C = kvc.KVCacheConfigurator
for case in request["cases"]:
    sched = NS(max_running_requests=case["running"], max_mamba_cache_size=case["fixed"],
               mamba_full_memory_ratio=case["ratio"], disable_overlap_schedule=False)
    mamba = NS(enable_linear_replayssm_spec=False, enable_mamba_extra_buffer=False,
               enable_mamba_extra_buffer_lazy=False, linear_replayssm_cache_len=0)
    ctx = NS(override=lambda _name, **kw: [setattr(sched, k, v) for k, v in kw.items()])
    memory = NS(disable_radix_cache=case["radix_off"], enable_unified_memory=False)
    getters = {"get_schedule": sched, "get_memory": memory,
               "get_spec": NS(speculative_num_draft_tokens=case["spec"] or None), "get_exec": NS(mamba=mamba),
               "get_context": ctx, "get_disagg": NS(disaggregation_mode="null", enable_pd_role_switch=False)}
    for name, value in getters.items():
        setattr(kvc, name, lambda value=value: value)
    params = NS(layers=list(range(case["layers"])), mamba_cache_per_req=case["per_req"])
    me = NS(
        mambaish_config=NS(mamba2_cache_params=params),
        pp_size=1, attn_dp_size=1, ps=NS(pp_size=1, attn_dp_size=1), model_config=NS(num_hidden_layers=case["layers"]),
        spec_algorithm=NS(is_none=lambda spec=case["spec"]: not spec), hybrid_gdn_config=object(),
        hybrid_kda_config=None, extra_mamba_cache_bytes_per_req=0, fused_entry_bytes=lambda _name: None,
        server_args=NS(enable_mamba_extra_buffer=lambda: False, enable_mamba_extra_buffer_lazy=lambda: False,
                       max_speculative_num_draft_tokens=None),
    )
    me._calculate_mamba_ratio = lambda me=me: C._calculate_mamba_ratio(me)
    rest_gb = case["rest"] / (1 << 30)
    left_gb = C._handle_max_mamba_cache(me, rest_gb)
    out["cases"].append({"reserved": round((rest_gb - left_gb) * (1 << 30)), "slots": sched.max_mamba_cache_size})
print("STANDIN_JSON:" + json.dumps(out))
"""

#: (max_running_requests, max_mamba_cache_size, disable_radix_cache, draft tokens, how ours compares to SGLang's)
STANDIN_CASES = [
    (32, None, True, 17, "equal"),  # the H100 failure
    (32, None, True, 0, "equal"),
    (1, None, True, 8, "equal"),
    (64, 64, True, 8, "equal"),  # --max-mamba-cache-size with --disable-radix-cache: SGLang's ratio is 1
    (16, 64, False, 8, "equal"),  # min(16, 64 // 3) = 16 either way
    (40, 64, False, 8, "upper bound"),  # SGLang: min(40, 64 // 3) = 21 verify slots, ours min(40, 64) = 40
    (None, None, False, 0, "ratio"),
    (None, None, True, 0, "ratio"),
    (48, None, False, 17, "ratio"),
]


@pytest.mark.parametrize("version", sorted(SGLANG_PYTHONS))
def test_the_state_reservation_is_sglangs(tmp_path, version):
    python = SGLANG_PYTHONS[version]
    if not python.exists():
        pytest.skip(f"no {python.parent.parent.name} (scripts/setup-python.sh makes it)")
    text = copy.deepcopy(HYBRID_TC)
    text.update(num_hidden_layers=32, layer_types=text["layer_types"][:32])
    rest = 39_245_318_758  # what the weights leave on the H100 above
    cases = [
        {"running": r, "fixed": k, "radix_off": off, "spec": d, "ratio": 0.9, "rest": rest, "layers": 24,
         "per_req": SHAPE32_STATE}
        for r, k, off, d, _how in STANDIN_CASES
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}  # SGLang's defaults
    run = subprocess.run(
        [str(python), "-c", SGLANG_STANDIN],
        input=json.dumps({"text_config": text, "cases": cases}),
        capture_output=True, text=True, timeout=300, check=False, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.split("STANDIN_JSON:", 1)[1])
    assert got["version"] == version
    assert got["per_req"] == {
        "1": [mf.linear_state_bytes_per_request(text, 24, 1), 24],
        "2": [mf.linear_state_bytes_per_request(text, 24, 2), 24],
    }
    assert got["per_req"]["1"][0] == SHAPE32_STATE
    for (running, fixed, radix_off, spec, how), sglang in zip(STANDIN_CASES, got["cases"], strict=True):
        ours, slots, _rule = mf._state_reservation(rest, SHAPE32_STATE, spec, 0.9, fixed, running, radix_off)
        case = f"running={running} fixed={fixed} radix_off={radix_off} spec={spec}: ours {ours}, SGLang's {sglang}"
        if how == "equal":
            assert (ours, slots) == (sglang["reserved"], sglang["slots"]), case
        elif how == "upper bound":
            assert slots == sglang["slots"] and ours > sglang["reserved"], case
        else:  # the ratio budget, all of it counted as reserved: SGLang's rounds its slots down, less than one
            # slot's states below it (max_running_requests 48 does not cap SGLang's verify slots here)
            assert 0 <= ours - sglang["reserved"] < SHAPE32_STATE * (1 + spec), case
            assert sglang["slots"] >= slots, case
            if not spec:
                assert sglang["slots"] == slots, case


#: An idle H200 as recorded (tests/unit/fixtures/nvidia_smi/h200/idle): 143771 MiB, 143156 free.
H200 = dict(H100, name="NVIDIA H200", memory_total_mib=143771, memory_free_mib=143156)


@pytest.mark.parametrize(
    ("gpu", "layers", "fits"),
    [
        pytest.param(H100, 20, True, id="h100-20"),  # bench/gpu/run_all.sh's hybrid_layers below 130 GB
        pytest.param(H100, 32, False, id="h100-32"),  # what stopped SGLang on the H100 (12-05)
        pytest.param(H200, 40, True, id="h200-40"),  # hybrid_layers at 130 GB or more
        pytest.param(H200, 64, False, id="h200-64"),  # the real depth: 53.8 GB of weights + 91.4 GB of state
    ],
)
def test_the_depths_the_gpu_step_cost_uses_fit_their_gpus(tmp_path, gpu, layers, fits):
    """The GPU step cost (bench/gpu/step_cost.py via run_all.sh cost-hybrid) runs the shape with the engine settings of
    bench/gpu/sglang_ddtree_run.py: --disable-radix-cache, 32 running requests, DDTREE's 17 draft tokens, 0.85."""
    target, drafter = hybrid_shape(tmp_path, layers)
    fit = mf.plan_fit(target, drafter, [gpu], tp_size=1, mem_fraction=0.85, context_length=1024,
                      speculative_num_draft_tokens=17, max_running_requests=32, disable_radix_cache=True)
    assert fit["fits"] is fits, fit["reason"]
    if fits:  # a KV cache of some room left: 483,444 tokens at 20 layers on the H100, 511,949 at 40 on the H200
        assert fit["kv_tokens_fit"] >= 100_000, fit["kv_tokens_fit"]
