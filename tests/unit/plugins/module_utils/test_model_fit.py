"""Tests for plugins/module_utils/_model_fit.py: config reading, layer kinds, KV/state/weights sizes, option
checks and the fit estimate, on the model config fixtures (tests/unit/fixtures/models, see its README for where
each comes from) and the nvidia-smi GPU fixtures.

Expected numbers are derived by hand from the configs (the arithmetic is written next to them), or, where they
depend on the recorded GPU memory, from the documented formula applied to the fixture's values."""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
from pathlib import Path

import pytest
from ansible_collections.specdec.pivot.plugins.module_utils import _model_fit as mf
from ansible_collections.specdec.pivot.plugins.module_utils._model_fit import FitInputError
from ansible_collections.specdec.pivot.plugins.module_utils._nvidia import (
    MIB,
)
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
