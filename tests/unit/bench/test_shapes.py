"""bench/gpu/shapes.py on the CPU: the config-only shapes the GPU step cost runs on. Their drafters' target layers
must exist for SGLang's capture (``set_dflash_layers_to_capture`` marks ``layers[id + 1]``), and the 8B shape's
must be z-lab's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "bench" / "gpu" / "shapes.py"


def make(tmp_path: Path, *args: str) -> tuple[dict, dict, dict]:
    subprocess.run([sys.executable, str(SCRIPT), *args, str(tmp_path)], check=True, capture_output=True)
    names = ("target/config.json", "drafter/config.json", "shape.json")
    target, drafter, shape = (json.loads((tmp_path / name).read_text()) for name in names)
    return target, drafter, shape


def test_the_8b_shape_reads_z_labs_layers(tmp_path):
    target, drafter, shape = make(tmp_path, "qwen3-8b-shape")
    assert drafter["dflash_config"]["target_layer_ids"] == [1, 9, 17, 25, 33]
    assert target["num_hidden_layers"] == 36 and "engine_kwargs" not in shape


@pytest.mark.parametrize("layers", [4, 16, 20, 32, 40, 64])
def test_the_hybrid_shapes_drafter_reads_layers_sglang_can_capture(tmp_path, layers):
    target, drafter, shape = make(tmp_path, "qwen36-27b-hybrid-shape", "--layers", str(layers))
    text = target["text_config"]
    ids = drafter["dflash_config"]["target_layer_ids"]
    assert text["num_hidden_layers"] == len(text["layer_types"]) == layers == drafter["num_target_layers"]
    assert ids == sorted(set(ids)) and 1 <= len(ids) <= 5
    assert ids[0] >= 1 and ids[-1] + 1 <= layers - 2  # layers[id + 1] exists and is not the last layer
    assert shape["engine_kwargs"] == {"enable_multimodal": False}  # no processor files in a config-only checkpoint
    assert text["layer_types"][3::4] == ["full_attention"] * (layers // 4)


def test_the_hybrid_shape_refuses_a_depth_off_the_pattern(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "qwen36-27b-hybrid-shape", str(tmp_path), "--layers", "18"],
                         capture_output=True, text=True, check=False)
    assert run.returncode != 0 and "--layers 18: use a multiple of 4" in run.stderr
