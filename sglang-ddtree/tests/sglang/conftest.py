"""Tests of the SGLang glue against the REAL sglang installed in the running interpreter (0.5.23 in .venv,
0.5.17 in .venv-sglang-0.5.17). Every test here carries the ``sglang`` marker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.sglang)


def pytest_configure(config):
    config.addinivalue_line("markers", "sglang: tests of the SGLang plugin glue (need the real sglang package)")


TARGET_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 2000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "eos_token_id": 0,
}


def drafter_config(block_size: int) -> dict:
    cfg = dict(TARGET_CONFIG)
    cfg.update(
        architectures=["DFlashDraftModel"],
        num_hidden_layers=1,
        num_target_layers=4,
        block_size=block_size,
        dflash_config={"block_size": block_size, "target_layer_ids": [1, 2], "mask_token": "<|MASK|>",
                       "mask_token_id": 4},
        layer_types=["full_attention"],
    )
    return cfg


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, str]:
    """Config-only model directories (server-args resolution reads configs, never weights)."""
    root = tmp_path_factory.mktemp("models")
    dirs = {}
    for name, cfg in (("target", TARGET_CONFIG), ("drafter", drafter_config(8)), ("drafter4", drafter_config(4))):
        d = root / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        dirs[name] = str(d)
    return dirs


@pytest.fixture(scope="session")
def plugins_loaded():
    """SGLang's own plugin loading (entry points -> register() -> hooks applied)."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    return True


def pytest_report_header(config):
    """Say up front whether this interpreter can import what the tests drive (a missing runtime package of
    SGLang shows up here once instead of as one ModuleNotFoundError per test)."""
    import importlib
    import importlib.metadata

    lines = []
    try:
        lines.append(f"sglang {importlib.metadata.version('sglang')}")
    except importlib.metadata.PackageNotFoundError:
        return ["sglang: NOT INSTALLED in this interpreter"]
    for module in ("sglang.srt.server_args", "sglang.srt.configs", "sglang.srt.speculative.dflash_worker_v2"):
        try:
            importlib.import_module(module)
        except Exception as exc:  # report, never hide: the tests then fail on the same import
            lines.append(f"cannot import {module}: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}")
    return lines
