"""SGLang's real parse + resolution of DDTREE command lines (``--device cuda`` is parsed, never used)."""

from __future__ import annotations

import logging

import pytest
from _resolve import base_argv, resolve


@pytest.fixture(autouse=True)
def _plugin(plugins_loaded):
    return plugins_loaded


def test_ddtree_defaults(model_dirs):
    got = resolve(base_argv(model_dirs, "DDTREE"))
    assert got["speculative_algorithm"] == "DDTREE"
    assert got["speculative_num_draft_tokens"] == 17  # default budget 16, plus the root
    assert got["speculative_dflash_block_size"] == 8  # from the drafter's dflash_config
    assert got["speculative_num_steps"] == 7  # deepest node = block size - 1
    assert got["speculative_eagle_topk"] > 1  # tree metadata in the backends
    assert got["disable_overlap_schedule"] is False  # overlap scheduling stays on
    assert got["attention_backend"] == "triton"
    assert got["speculative_draft_attention_backend"] == "triton"
    assert got["max_running_requests"] == 48
    assert not got["enable_mixed_chunk"]


@pytest.mark.parametrize(("num_draft_tokens", "budget"), [(2, 1), (9, 8), (33, 32), (64, 63)])
def test_budget_from_num_draft_tokens(model_dirs, num_draft_tokens, budget):
    # the block-4 drafter: a budget of 1 verifies 2 tokens, and SGLang reserves 2 x 2 >= 4 slots per step
    got = resolve([*base_argv(model_dirs, "DDTREE", drafter="drafter4"), "--speculative-num-draft-tokens",
                   str(num_draft_tokens)])
    assert got["speculative_num_draft_tokens"] == budget + 1
    assert got["speculative_dflash_block_size"] == 4


def test_block_size_follows_the_drafter(model_dirs):
    got = resolve(base_argv(model_dirs, "DDTREE", drafter="drafter4"))
    assert got["speculative_dflash_block_size"] == 4 and got["speculative_num_steps"] == 3
    assert got["speculative_num_draft_tokens"] == 17


def test_explicit_settings_are_kept(model_dirs):
    got = resolve(
        [
            *base_argv(model_dirs, "DDTREE"),
            "--attention-backend",
            "triton",
            "--speculative-draft-attention-backend",
            "flashinfer",
            "--disable-overlap-schedule",
            "--max-running-requests",
            "8",
        ]
    )
    assert got["attention_backend"] == "triton"
    assert got["speculative_draft_attention_backend"] == "flashinfer"
    assert got["disable_overlap_schedule"] is True
    assert got["max_running_requests"] == 8


def test_plain_dflash_is_unchanged_with_the_plugin_loaded(model_dirs):
    """DFLASH resolves exactly as SGLang's own handler decides: block size = num_draft_tokens, chain (topk 1)."""
    got = resolve(base_argv(model_dirs, "DFLASH"))
    assert got["speculative_algorithm"] == "DFLASH"
    assert got["speculative_num_draft_tokens"] == 8
    assert got["speculative_num_steps"] == 1
    assert got["speculative_eagle_topk"] == 1
    assert got["speculative_dflash_block_size"] is None
    assert got["disable_overlap_schedule"] is False


@pytest.mark.parametrize(
    ("extra", "drafter", "message"),
    [
        (
            ["--speculative-num-draft-tokens", "1"],
            "drafter",
            r"--speculative-num-draft-tokens=1 gives a DDTREE node budget of 0.*1\.\.63",
        ),
        (["--speculative-num-draft-tokens", "65"], "drafter", r"--speculative-num-draft-tokens=65 .*budget of 64"),
        # block 8: 2 x 3 reserved slots < 8 block positions (the smallest accepted is 4, a budget of 3)
        (["--speculative-num-draft-tokens", "3"], "drafter",
         r"--speculative-num-draft-tokens=3 \(node budget 2\) is too small .* block_size 8.*"
         r">= 4 \(a budget of at least 3\)"),
        (["--attention-backend", "fa3"], "drafter", r"--attention-backend='fa3'.*\['triton'\]; pass"),
        # FlashInfer's captured verify graphs were never run with a tree: refused until a GPU run proves them
        (["--attention-backend", "flashinfer"], "drafter", r"--attention-backend='flashinfer'.*CUDA-graph"),
        (["--pp-size", "2"], "drafter", r"--pp-size=2: DDTREE does not support pipeline parallelism"),
        (["--tp-size", "2", "--attn-cp-size", "2"], "drafter", r"--attn-cp-size=2: DDTREE's tree verify"),
        (["--speculative-draft-window-size", "64"], "drafter", r"--speculative-draft-window-size=64"),
        (["--speculative-dflash-block-size", "16"], "drafter", r"--speculative-dflash-block-size=16 differs .* 8"),
        ([], "target", r"is not a DFlash drafter: its config has architectures \['Qwen3ForCausalLM'\]"),
        # issue 27: pages > 1 token are refused until a GPU run proves the tree verify and commit with pages
        (["--page-size", "16"], "drafter", r"^--page-size=16: DDTREE supports only --page-size 1.*pass --page-size 1"),
        (["--page-size", "64"], "drafter", r"^--page-size=64: DDTREE supports only --page-size 1"),
        # SGLang itself snaps the page to 64 for a trtllm_mha drafter: the fix is another drafter backend
        (["--speculative-draft-attention-backend", "trtllm_mha"], "drafter",
         r"^--page-size=64, set by SGLang for --speculative-draft-attention-backend trtllm_mha .*"
         r"use --speculative-draft-attention-backend triton"),
    ],
)
def test_bad_configurations_fail_at_startup_with_a_clear_message(model_dirs, extra, drafter, message):
    with pytest.raises(ValueError, match=message):
        resolve(base_argv(model_dirs, "DDTREE", drafter=drafter) + extra)


@pytest.mark.parametrize("extra", [[], ["--page-size", "1"]], ids=["default", "explicit"])
def test_page_size_one_is_accepted(model_dirs, extra):
    got = resolve(base_argv(model_dirs, "DDTREE") + extra)
    assert got["page_size"] == 1 and got["speculative_algorithm"] == "DDTREE"


def test_device_cpu_is_rejected(model_dirs):
    with pytest.raises(ValueError, match=r"--device='cpu': DDTREE speculative decoding runs on CUDA GPUs only"):
        resolve(base_argv(model_dirs, "DDTREE", device="cpu"))


def test_missing_drafter_is_rejected(model_dirs):
    argv = [
        "--model-path",
        model_dirs["target"],
        "--speculative-algorithm",
        "DDTREE",
        "--device",
        "cuda",
        "--skip-tokenizer-init",
    ]
    with pytest.raises(ValueError, match=r"--speculative-draft-model-path is missing: DDTREE needs a DFlash drafter"):
        resolve(argv)


def test_unreadable_drafter_is_rejected(model_dirs, tmp_path):
    argv = base_argv(model_dirs, "DDTREE")
    argv[argv.index(model_dirs["drafter"])] = str(tmp_path / "nothing-here")
    # SGLang reads the drafter's config itself before DDTREE's handler runs; either way the error names the path.
    with pytest.raises((OSError, ValueError), match=r"nothing-here"):
        resolve(argv)


def test_dp_attention_is_rejected(model_dirs):
    argv = [*base_argv(model_dirs, "DDTREE"), "--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"]
    with pytest.raises(ValueError, match=r"DDTREE does not support data-parallel attention"):
        resolve(argv)


def test_lazy_mamba_state_tracking_is_refused(model_dirs):
    """0.5.17 offers --mamba-radix-cache-strategy extra_buffer_lazy and refuses it for DFLASH by name only; its
    chain-shaped lazy tracking would be wrong for a tree. Releases without the choice reject the flag themselves;
    0.5.23 refuses it for this (non-hybrid) target before DDTREE's handler runs, which is also a refusal."""
    import sglang.srt.server_args as sa

    argv = [*base_argv(model_dirs, "DDTREE"), "--mamba-radix-cache-strategy", "extra_buffer_lazy"]
    if "extra_buffer_lazy" in getattr(sa, "MAMBA_RADIX_CACHE_STRATEGY_CHOICES", ()):
        with pytest.raises(ValueError, match=r"extra_buffer_lazy(: its lazy state tracking follows a chain| needs)"):
            resolve(argv)
    else:  # not in this release's choice list: argparse or SGLang's own checks reject it
        with pytest.raises((SystemExit, ValueError)) as err:
            resolve(argv)
        assert err.type is SystemExit or "extra_buffer_lazy" in str(err.value)


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"sliding_window": 4096}, r"sliding_window=4096"),  # Mistral-style: a window is a window
        ({"sliding_window": 4096, "use_sliding_window": True}, r"sliding_window=4096 with use_sliding_window"),
        ({"layer_types": ["sliding_attention", "full_attention"] * 3}, r"layer_types has sliding-window .*\[0, 2, 4\]"),
        ({"text_config": {"layer_types": ["full_attention", "sliding_attention"]}}, r"text_config\.layer_types.*\[1\]"),
        ({"sliding_window": 4096, "use_sliding_window": False}, None),  # Qwen2/3: present but off
        ({"sliding_window": None, "use_sliding_window": False, "max_window_layers": 28}, None),
        ({"layer_types": ["linear_attention", "linear_attention", "full_attention"]}, None),  # hybrid GDN
        ({"sliding_window": 4096, "layer_types": ["full_attention"] * 4}, None),  # layer_types decide
        ({}, None),
    ],
)
def test_sliding_window_targets_are_told_apart(config, problem):
    from sglang_ddtree.sglang.server_args import sliding_window_problem

    got = sliding_window_problem(config)
    if problem is None:
        assert got is None
    else:
        assert got is not None and __import__("re").search(problem, got), got


def test_a_sliding_window_target_is_refused_at_startup(model_dirs, tmp_path):
    import json
    from pathlib import Path

    cfg = json.loads((Path(model_dirs["target"]) / "config.json").read_text())
    # Qwen3: layers from max_window_layers on use the window (transformers spells them out in layer_types)
    cfg.update(sliding_window=512, use_sliding_window=True, max_window_layers=2)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    argv = base_argv(dict(model_dirs, target=str(tmp_path)), "DDTREE")
    window = r"(layer_types has sliding-window layers \[2, 3\]|sliding_window=512 with use_sliding_window=true)"
    with pytest.raises(ValueError, match=rf"--model-path=.*sliding-window attention \({window}\).*DFLASH"):
        resolve(argv)
    resolve(base_argv(model_dirs, "DDTREE"))  # the same target without the window resolves
    cfg.update(max_window_layers=28)  # the window on no layer (a 4-layer model): not refused
    (tmp_path / "off").mkdir()  # a new path: SGLang caches configs per path
    (tmp_path / "off" / "config.json").write_text(json.dumps(cfg))
    resolve(base_argv(dict(model_dirs, target=str(tmp_path / "off")), "DDTREE"))


# --- SGLANG_DDTREE_BUDGET (issue 24): the budget chosen per step ------------------------------------------------
@pytest.mark.parametrize(
    ("value", "num_draft_tokens", "candidates"),
    [
        ("auto", "17", "[0, 4, 8, 16]"),  # the chain (block 8 fits in width 17), 4, 8, and the widest
        ("chain,16", "17", "[0, 16]"),
        ("4", "9", "4 every step"),  # one candidate: always budget 4, KV and graphs for width 9
        ("fixed", "17", None),
        ("", "9", None),
    ],
)
def test_the_budget_option_is_checked_and_logged_at_startup(model_dirs, monkeypatch, value, num_draft_tokens,
                                                           candidates):
    monkeypatch.setenv("SGLANG_DDTREE_BUDGET", value)
    # a handler on the module's own logger: SGLang's argument resolution reconfigures the root logger (caplog's)
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append
    log = logging.getLogger("sglang_ddtree.sglang.server_args")
    log.addHandler(handler)
    try:
        got = resolve([*base_argv(model_dirs, "DDTREE"), "--speculative-num-draft-tokens", num_draft_tokens])
    finally:
        log.removeHandler(handler)
    assert got["speculative_num_draft_tokens"] == int(num_draft_tokens)  # the widest width: KV and graphs
    chosen = [r.getMessage() for r in seen if r.getMessage().startswith("DDTREE: budget=")]
    if candidates is None:
        assert chosen and chosen[-1].startswith(f"DDTREE: budget={int(num_draft_tokens) - 1} "), chosen
    elif candidates.startswith("["):
        assert chosen and f"chosen per step among {candidates}" in chosen[-1], chosen
    else:
        assert chosen and chosen[-1].startswith(f"DDTREE: budget={candidates} (SGLANG_DDTREE_BUDGET"), chosen


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("chain,4", r"SGLANG_DDTREE_BUDGET='chain,4': the chain verifies the drafter's whole block \(8 tokens\), "
                    r"wider than --speculative-num-draft-tokens 5; raise it to at least 8"),
        ("4,40", r"SGLANG_DDTREE_BUDGET='4,40': '40' is not 'chain' or a budget in 1..4"),
        ("wide", r"'wide' is not 'chain' or a budget"),
        ("4,4", r"'4' is listed twice"),
        ("chain", r"SGLANG_DDTREE_BUDGET='chain': the chain verifies the drafter's whole block"),
    ],
)
def test_a_bad_budget_option_fails_at_startup_naming_the_variable(model_dirs, monkeypatch, value, message):
    monkeypatch.setenv("SGLANG_DDTREE_BUDGET", value)
    with pytest.raises(ValueError, match=message):
        resolve([*base_argv(model_dirs, "DDTREE"), "--speculative-num-draft-tokens", "5"])
