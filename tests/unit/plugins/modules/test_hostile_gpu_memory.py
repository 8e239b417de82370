"""Hostile input for specdec.pivot.gpu_memory (issue 25): an absurd model config.json (huge, negative, wrong type,
unknown dtype name) or index, and non-finite options, each fail with a message that names the option and the file,
never a traceback or a negative size. The GPUs are the recorded H200 pair replayed by lab/stand-ins/nvidia-smi, as in
test_gpu_memory.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from module_runner import COLLECTIONS_ROOT, invoke_module

REPO = Path(__file__).resolve().parents[4]
FIX = REPO / "tests" / "unit" / "fixtures"
MODEL = FIX / "models" / "qwen3-8b"
STAND_IN = REPO / "lab" / "stand-ins" / "nvidia-smi"


def run(tmp_path: Path, args: dict) -> dict:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    if not (bindir / "nvidia-smi").exists():
        (bindir / "nvidia-smi").symlink_to(STAND_IN)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVIDIA_SMI_STANDIN", "ANSIBLE_"))}
    env.update(
        PATH=f"{bindir}:/usr/local/bin:/usr/bin:/bin",
        PYTHONPATH=str(COLLECTIONS_ROOT),
        NVIDIA_SMI_STANDIN_MODE="replay",
        NVIDIA_SMI_STANDIN_DIR=str(FIX / "nvidia_smi" / "h200x2" / "busy"),
    )
    return invoke_module("gpu_memory", args, env, cwd=tmp_path, timeout=120)


def model_with(tmp_path: Path, config: dict | None = None, index: str | None = None) -> str:
    dest = tmp_path / "model"
    dest.mkdir()
    cfg = json.loads((MODEL / "config.json").read_text())
    cfg.update(config or {})
    (dest / "config.json").write_text(json.dumps(cfg))
    (dest / "model.safetensors.index.json").write_text(
        index if index is not None else (MODEL / "model.safetensors.index.json").read_text()
    )
    return str(dest)


ABSURD_CONFIG = [
    ({"num_hidden_layers": 2**40}, "num_hidden_layers=1099511627776"),
    ({"num_hidden_layers": True}, "num_hidden_layers=True"),
    ({"num_hidden_layers": -36}, "num_hidden_layers=-36"),
    ({"head_dim": -128}, "head_dim=-128"),
    ({"head_dim": 128.5}, "head_dim=128.5"),
    ({"num_key_value_heads": "8"}, "num_key_value_heads='8'"),
    ({"num_attention_heads": 0}, "num_attention_heads=0"),
    ({"torch_dtype": "bfloat17"}, "torch_dtype='bfloat17', not a dtype name"),
    ({"mamba_ssm_dtype": 7}, "mamba_ssm_dtype=7, not a dtype name"),
    ({"layer_types": "full_attention"}, "layer_types='full_attention', not a list"),
    ({"text_config": [1, 2]}, "a text_config that is not an object"),
    ({"text_config": {"hidden_size": 10**12}}, "text_config.hidden_size=1000000000000"),
]


@pytest.mark.parametrize(("config", "words"), ABSURD_CONFIG, ids=[case[1] for case in ABSURD_CONFIG])
def test_an_absurd_config_is_a_clear_error(tmp_path, config, words):
    path = model_with(tmp_path, config)
    r = run(tmp_path, {"fit": {"target_model_path": path, "mem_fraction": 0.85, "context_length": 8192}})
    assert r["failed"] is True, r.get("fit")
    assert r["msg"].startswith(f"fit.target_model_path='{path}': config.json has "), r["msg"]
    assert words in r["msg"], r["msg"]
    assert r.get("option") == "fit.target_model_path"


@pytest.mark.parametrize("total", ["Infinity", "-5", "1e30", '"big"', "NaN"])
def test_an_absurd_index_total_size_is_a_clear_error(tmp_path, total):
    path = model_with(tmp_path, index='{"metadata": {"total_size": ' + total + '}, "weight_map": {}}')
    r = run(tmp_path, {"fit": {"target_model_path": path, "mem_fraction": 0.85, "context_length": 8192}})
    assert r["failed"] is True, r.get("fit")
    assert "model.safetensors.index.json has no sane metadata.total_size" in r["msg"], r["msg"]


NON_FINITE = [
    ({"timeout": "nan"}, "timeout=nan"),
    ({"timeout": "inf"}, "timeout=inf"),
    ({"fit": {"mem_fraction": "nan"}}, "fit.mem_fraction=nan"),
    ({"fit": {"mem_fraction": "inf"}}, "fit.mem_fraction=inf"),
    ({"fit": {"mamba_full_memory_ratio": "nan"}}, "fit.mamba_full_memory_ratio=nan"),
    ({"fit": {"mamba_full_memory_ratio": "inf"}}, "fit.mamba_full_memory_ratio=inf"),
]


@pytest.mark.parametrize(("args", "words"), NON_FINITE, ids=[case[1] for case in NON_FINITE])
def test_non_finite_options_are_refused(tmp_path, args, words):
    fit = {"target_model_path": str(MODEL), "mem_fraction": 0.85, "context_length": 8192, **args.get("fit", {})}
    r = run(tmp_path, {**args, "fit": fit})
    assert r["failed"] is True, r.get("fit")
    assert words in r["msg"], r["msg"]
