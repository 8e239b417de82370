"""bench/gpu/lossless.py's sampling test on the CPU: tokens 2-4 of every filter set's draws (engine_run.SAMPLING_SETS)
against no speculation's, a chi-square homogeneity test per position that passes two draws of one distribution and
fails a distribution cut otherwise (as SGLang's DFLASH verify cut top-p after top-k, H100 12-07)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

GPU_BENCH = Path(__file__).resolve().parents[3] / "bench" / "gpu"
sys.path.insert(0, str(GPU_BENCH))
import engine_run
import lossless


def _draws(weights: dict[int, float], n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    tokens, probs = list(weights), list(weights.values())
    return [[0, *rng.choices(tokens, probs, k=3)] for _draw in range(n)]


def test_the_filter_sets_cover_a_joint_and_a_single_filter_and_none():
    assert engine_run.SAMPLING_SETS["sampling"] == {"temperature": 1.0, "top_k": 20, "top_p": 0.9}
    assert set(engine_run.SAMPLING_SETS["sampling_topk"]) == {"temperature", "top_k"}
    assert engine_run.SAMPLING_SETS["sampling_temperature"] == {"temperature": 1.0}


def test_same_distribution_passes_and_a_narrower_cut_fails():
    full = {t: 1.0 / (t + 1) for t in range(12)}
    narrow = {t: w for t, w in full.items() if t < 6}  # the tail cut away
    base = {"params": {}, "outputs": _draws(full, 4000, 1)}
    same = lossless.sampling_test(base, {"params": {"top_k": 20}, "outputs": _draws(full, 4000, 2)}, [])
    cut = lossless.sampling_test(base, {"params": {}, "outputs": _draws(narrow, 4000, 3)}, [])
    assert set(same["tests"]) == {"token2", "token3", "token4"} and same["params"] == {"top_k": 20}
    assert all(t["pass"] for t in same["tests"].values())
    assert not any(t["pass"] for t in cut["tests"].values())
