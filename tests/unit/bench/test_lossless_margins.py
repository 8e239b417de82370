"""bench/gpu/lossless.py's near-tie measure on the CPU: a config-only target (bench/gpu/shapes.py: no weights on disk,
SGLang fills random ones) is judged by the no-speculation engine's own top-2 log-probability gap at the first
divergence, read from its ``output_top_logprobs``; a target with weights keeps the fp32 transformers gap."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

GPU_BENCH = Path(__file__).resolve().parents[3] / "bench" / "gpu"
sys.path.insert(0, str(GPU_BENCH))
import lossless
import sglang_ddtree_run


def test_top2_margins_read_the_engines_top_logprobs():
    output = {"meta_info": {"output_top_logprobs": [
        [(-0.1, 5, None), (-2.6, 9, None)],
        [(-1.0, 3, None), (-1.0, 4, None)],  # an exact tie
        [(-0.5, 7, None)],  # one entry only
        None,
    ]}}
    assert sglang_ddtree_run.top2_margins(output) == [2.5, 0.0, None, None]
    assert sglang_ddtree_run.top2_margins({"meta_info": {}}) == []


def _config_only(tmp_path: Path) -> Path:
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    return tmp_path


def test_config_only_target_is_judged_by_the_engine_margin(tmp_path):
    args = SimpleNamespace(models=_config_only(tmp_path), tie_margin=1.0)
    assert not lossless.has_weights(args.models)
    base = {"prompts": [[1, 2], [3, 4]], "batch3": [[7, 8, 9], [7, 7, 7]],
            "margins3": [[3.0, 0.25, 4.0], [2.0, 2.0, 2.0]]}
    cand = {"batch3": [[7, 5, 9], [7, 7, 6]]}
    eq = lossless.equality(args, base, cand, "batch3", {})
    assert (eq["identical"], eq["near_ties"], eq["mismatches"]) == (0, 1, 1)
    assert eq["mismatch_detail"] == [{"prompt": 1, "token": 2, "margin": 2.0}]


def test_config_only_target_without_margins_stops_with_the_reason(tmp_path):
    args = SimpleNamespace(models=_config_only(tmp_path), tie_margin=1.0)
    with pytest.raises(SystemExit, match=r"no weights under .* and no engine margin for prompt 0 token 1"):
        lossless.equality(args, {"prompts": [[1]], "batch1": [[7, 8]]}, {"batch1": [[7, 9]]}, "batch1", {})


def test_weights_on_disk_keep_the_fp32_measure(tmp_path):
    models = _config_only(tmp_path)
    (models / "target" / "model.safetensors").write_bytes(b"")
    assert lossless.has_weights(models)


def test_round_summary_counts_rounds_whose_tree_was_built_in_the_drafter_graph():
    rounds = [
        {"accept_len": [3], "nonfirst": [1], "width": 17, "graph": True, "tree_in_graph": True},
        {"accept_len": [1, 0], "nonfirst": [0, 0], "width": 17, "graph": True, "tree_in_graph": False},
        {"accept_len": [2], "nonfirst": [0], "width": 9, "graph": False},  # a record written before the field
    ]
    summary = lossless.summarize_stats(rounds)
    assert summary["tree_in_graph_rounds"] == 1
    assert summary["graph_rounds"] == 2
    assert summary["rounds_by_width"] == {"17": [2, 2], "9": [1, 0]}
    assert summary["accepted_depth_histogram"] == {"0": 1, "1": 1, "2": 1, "3": 1}
