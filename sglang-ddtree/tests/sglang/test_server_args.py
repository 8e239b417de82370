"""SGLang's real parse + resolution of DDTREE command lines (``--device cuda`` is parsed, never used)."""

from __future__ import annotations

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


@pytest.mark.parametrize(
    ("num_draft_tokens", "budget"), [(2, 1), (9, 8), (33, 32), (64, 63)]
)
def test_budget_from_num_draft_tokens(model_dirs, num_draft_tokens, budget):
    got = resolve([*base_argv(model_dirs, "DDTREE"), "--speculative-num-draft-tokens", str(num_draft_tokens)])
    assert got["speculative_num_draft_tokens"] == budget + 1
    assert got["speculative_dflash_block_size"] == 8


def test_block_size_follows_the_drafter(model_dirs):
    got = resolve(base_argv(model_dirs, "DDTREE", drafter="drafter4"))
    assert got["speculative_dflash_block_size"] == 4 and got["speculative_num_steps"] == 3
    assert got["speculative_num_draft_tokens"] == 17


def test_explicit_settings_are_kept(model_dirs):
    got = resolve(
        [
            *base_argv(model_dirs, "DDTREE"),
            "--attention-backend", "triton", "--speculative-draft-attention-backend", "flashinfer",
            "--disable-overlap-schedule", "--max-running-requests", "8",
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
        (["--attention-backend", "fa3"], "drafter", r"--attention-backend='fa3'.*\['triton'\]; pass"),
        # FlashInfer's captured verify graphs were never run with a tree: refused until a GPU run proves them
        (["--attention-backend", "flashinfer"], "drafter", r"--attention-backend='flashinfer'.*CUDA-graph"),
        (["--pp-size", "2"], "drafter", r"--pp-size=2: DDTREE does not support pipeline parallelism"),
        (["--tp-size", "2", "--attn-cp-size", "2"], "drafter", r"--attn-cp-size=2: DDTREE's tree verify"),
        (["--speculative-draft-window-size", "64"], "drafter", r"--speculative-draft-window-size=64"),
        (["--speculative-dflash-block-size", "16"], "drafter", r"--speculative-dflash-block-size=16 differs .* 8"),
        ([], "target", r"is not a DFlash drafter: its config has architectures \['Qwen3ForCausalLM'\]"),
    ],
)
def test_bad_configurations_fail_at_startup_with_a_clear_message(model_dirs, extra, drafter, message):
    with pytest.raises(ValueError, match=message):
        resolve(base_argv(model_dirs, "DDTREE", drafter=drafter) + extra)


def test_device_cpu_is_rejected(model_dirs):
    with pytest.raises(ValueError, match=r"--device='cpu': DDTREE speculative decoding runs on CUDA GPUs only"):
        resolve(base_argv(model_dirs, "DDTREE", device="cpu"))


def test_missing_drafter_is_rejected(model_dirs):
    argv = ["--model-path", model_dirs["target"], "--speculative-algorithm", "DDTREE", "--device", "cuda",
            "--skip-tokenizer-init"]
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
