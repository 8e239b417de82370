"""The Qwen3.6-27B-shaped hybrid target and its block-16 DFlash drafter of bench/gpu/shapes.py (the configs the GPU
runs load with dummy weights) as model directories for the GPU-fit tests: the two config.json files as shapes.py
writes them, the target's ``model.safetensors.index.json`` with the ``metadata.total_size`` SGLang loads for it, and
a sparse ``model.safetensors`` of the drafter's size. The sizes are computed here from the widths (bfloat16):

target, per layer: MLP 3 x 5120 x 17408 = 267,386,880 and 2 norms of 5120; a full-attention layer (attn_output_gate:
q_proj doubled) 5120 x 12288 + 2 x 5120 x 1024 + 6144 x 5120 + q/k norms 2 x 256 = 104,858,112; a GatedDeltaNet layer
in_proj_qkv 5120 x 10240 + in_proj_z 5120 x 6144 + in_proj_b/a 2 x 5120 x 48 + conv 10240 x 4 + dt_bias/A_log 2 x 48
+ norm 128 + out_proj 6144 x 5120 = 115,876,064; embeddings and lm_head 2 x 248320 x 5120, final norm 5120. At 64
layers that is the fixture index's 26,895,998,464 parameters (tests/unit/fixtures/models/qwen3.6-27b-like).
drafter: 5 Qwen3 layers (q 5120 x 4096, k/v 5120 x 1024, o 4096 x 5120, q/k norms 2 x 128, MLP 3 x 5120 x 17408,
2 norms of 5120) = 319,826,176 each, fc 5 x 5120 -> 5120 = 131,072,000, 2 norms: 1,730,213,120 parameters.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path

SHAPES = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "shapes.py"
DRAFTER_PARAMS = 5 * 319_826_176 + 131_072_000 + 2 * 5120


def target_params(layers: int) -> int:
    full = layers // 4  # one full-attention layer in four
    return (
        2 * 248320 * 5120
        + 5120
        + layers * (267_386_880 + 2 * 5120)
        + full * 104_858_112
        + (layers - full) * 115_876_064
    )


def state_per_request(linear_layers: int, tp_size: int = 1) -> int:
    """One request's GatedDeltaNet state on one GPU: conv (48 x 128 + 2 x 16 x 128) / tp x 3 x 2 bytes + SSM 48 / tp
    x 128 x 128 x 4 bytes, per linear-attention layer (3,207,168 bytes a layer at tp 1)."""
    return ((10240 // tp_size) * 3 * 2 + (48 // tp_size) * 128 * 128 * 4) * linear_layers


def write_hybrid_shape(dest: Path, layers: int) -> tuple[Path, Path]:
    """``dest/target`` and ``dest/drafter``: shapes.py's ``qwen36_27b_hybrid(layers)`` with the weights above."""
    target_cfg, drafter_cfg = runpy.run_path(str(SHAPES))["qwen36_27b_hybrid"](layers)
    target, drafter = dest / "target", dest / "drafter"
    for path, cfg in ((target, target_cfg), (drafter, drafter_cfg)):
        path.mkdir(parents=True)
        (path / "config.json").write_text(json.dumps(cfg))
    index = {"metadata": {"total_size": target_params(layers) * 2}, "weight_map": {}}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    with open(drafter / "model.safetensors", "wb") as fh:
        fh.truncate(DRAFTER_PARAMS * 2)
    return target, drafter
