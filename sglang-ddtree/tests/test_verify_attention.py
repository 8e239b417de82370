"""Which extend-attention calls the plugin's tree kernel takes (verify_attention.routed_call_problem): a table of
calls that differ from a supported tree verify in one argument each."""

from __future__ import annotations

import pytest
import torch

from sglang_ddtree.sglang.verify_attention import routed_call_problem


def _call(**changes):
    t, hq, hkv, d = 34, 8, 2, 64
    args = {
        "q_extend": torch.zeros(t, hq, d, dtype=torch.bfloat16),
        "k_extend": torch.zeros(t, hkv, d, dtype=torch.bfloat16),
        "v_extend": torch.zeros(t, hkv, d, dtype=torch.bfloat16),
        "k_buffer": torch.zeros(100, hkv, d, dtype=torch.bfloat16),
        "v_buffer": torch.zeros(100, hkv, d, dtype=torch.bfloat16),
        "custom_mask": torch.ones(10, dtype=torch.uint8),
        "max_len_extend": 17,
        "k_scale": 1.0,
        "v_scale": 1.0,
    }
    args.update(changes)
    return lambda name, default: args.get(name, default)


def test_a_tree_verify_is_taken():
    assert routed_call_problem(_call()) is None


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"custom_mask": None}, "no custom mask"),  # prefill, DFLASH's causal verify
        ({"logit_cap": 30.0}, "logit_cap"),
        ({"skip_prefix_custom_mask": False}, "skip_prefix_custom_mask"),
        ({"sliding_window_size": 4096}, "sliding_window_size"),
        ({"sinks": torch.zeros(8)}, "sinks given"),
        ({"xai_temperature_len": 512}, "xai_temperature_len"),
        ({"lse_extend": torch.zeros(34, 8)}, "lse_extend given"),
        ({"skip_prefix": True}, "skip_prefix"),
        ({"page_size": 16}, "page_size"),
        ({"score_mod": object()}, "score_mod given"),
        ({"identity_kv_indices": True}, "identity_kv_indices"),
        ({"k_scale": 0.5}, "k_scale"),
        ({"k_buffer": torch.zeros(100, 2, 64, dtype=torch.float8_e4m3fn)}, "KV pool dtype"),
        ({"v_extend": torch.zeros(34, 2, 512, dtype=torch.bfloat16)}, "head dim 512"),
        ({"k_extend": torch.zeros(34, 3, 64, dtype=torch.bfloat16)}, "heads or dims"),
        ({"max_len_extend": 65}, "more than 64 tokens"),
    ],
)
def test_anything_else_stays_sglangs(changes, reason):
    problem = routed_call_problem(_call(**changes))
    assert problem is not None and reason in problem
