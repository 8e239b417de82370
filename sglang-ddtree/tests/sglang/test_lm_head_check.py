"""The worker refuses a target whose lm_head is not a dense floating-point matrix (issue 14: a quantized lm_head
works or is refused at start-up): the tree scores drafter hidden states as ``hidden @ lm_head.weight.T``."""

from __future__ import annotations

import types

import pytest
import torch

from sglang_ddtree.sglang.worker import lm_head_problem


class UnquantizedEmbeddingMethod:  # the name SGLang gives its unquantized lm_head method
    pass


class Fp8LinearMethod:
    pass


def head(weight, method=None):
    return types.SimpleNamespace(weight=weight, quant_method=method)


@pytest.mark.parametrize(
    ("lm_head", "problem"),
    [
        (head(torch.zeros(32, 8, dtype=torch.bfloat16), UnquantizedEmbeddingMethod()), None),
        (head(torch.zeros(32, 8, dtype=torch.float16)), None),
        (head(torch.zeros(32, 8, dtype=torch.float32), UnquantizedEmbeddingMethod()), None),
        (head(torch.zeros(32, 8, dtype=torch.bfloat16), Fp8LinearMethod()), r"is quantized \(Fp8LinearMethod\)"),
        (head(torch.zeros(32, 4, dtype=torch.int32)), r"weight is torch.int32 \(quantized\)"),
        (head(torch.zeros(32, 8, dtype=torch.float8_e4m3fn)), r"weight is torch.float8_e4m3fn"),
        (head(torch.zeros(32 * 8, dtype=torch.uint8)), r"no dense \[vocab, hidden\] weight"),
        (types.SimpleNamespace(qweight=torch.zeros(4, 4)), r"no dense \[vocab, hidden\] weight \(NoneType\)"),
        (None, r"is missing"),
    ],
)
def test_lm_head_problem(lm_head, problem):
    got = lm_head_problem(lm_head)
    if problem is None:
        assert got is None
    else:
        assert got is not None
        import re

        assert re.search(problem, got), got


# --- real SGLang layers (issue 27 section 2.2) --------------------------------------------------------------------
# ParallelLMHead built on the CPU exactly as a target model builds it (prefix "lm_head"; enable_tp=False: one rank;
# hidden 128: one GPTQ group) with the quantization config of a checkpoint. Which configs quantize the lm_head, in
# SGLang 0.5.17's source:
# Fp8Config.get_quant_method (layers/quantization/fp8.py) handles LinearBase and FusedMoE only, so an "fp8"
# checkpoint keeps a bf16 lm_head (UnquantizedEmbeddingMethod); ModelOptFp8Config._get_quant_method
# (modelopt_quant.py: `isinstance(layer, (LinearBase, ParallelLMHead))`) quantizes it to float8 unless lm_head is in
# exclude_modules; GPTQ with "lm_head": true (quantization/utils.py get_linear_quant_method,
# `isinstance(layer, ParallelLMHead) and cloned_config.lm_head_quantized`) gives packed int32 qweight and no weight.

REAL_CASES = [
    ("unquantized", None, None, None),
    ("fp8 checkpoint (lm_head left bf16)", "fp8", {"quant_method": "fp8", "activation_scheme": "dynamic"}, None),
    ("modelopt fp8, lm_head quantized", "modelopt_fp8",
     {"quantization": {"quant_algo": "FP8", "exclude_modules": []}}, r"^weight is torch\.float8_e4m3fn \(quantized\)$"),
    ("modelopt fp8, lm_head excluded", "modelopt_fp8",
     {"quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head"]}}, None),
    ("gptq, lm_head quantized", "gptq",
     {"bits": 4, "group_size": 128, "desc_act": False, "sym": True, "lm_head": True},
     r"^has no dense \[vocab, hidden\] weight \(NoneType\)$"),
    ("gptq, lm_head not quantized", "gptq", {"bits": 4, "group_size": 128, "desc_act": False, "sym": True}, None),
]


def _real_lm_head(method: str | None, config: dict | None):
    from sglang.srt.layers.quantization import get_quantization_config
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead

    quant_config = None
    if method is not None:
        try:
            cls = get_quantization_config(method)
        except ValueError as exc:  # e.g. plain "gptq" is not offered by 0.5.23 on this machine
            pytest.skip(f"quantization method {method!r} not available in this SGLang: {exc}")
        quant_config = cls.from_config(config)
        if getattr(quant_config, "packed_modules_mapping", {}) is None:
            quant_config.packed_modules_mapping = {}  # set by the model loader from the model class (loader.py)
    return ParallelLMHead(256, 128, params_dtype=torch.bfloat16, quant_config=quant_config, prefix="lm_head",
                          enable_tp=False)


@pytest.mark.parametrize(("name", "method", "config", "problem"), REAL_CASES, ids=[c[0] for c in REAL_CASES])
def test_lm_head_problem_on_real_sglang_lm_heads(name, method, config, problem):
    import re

    head = _real_lm_head(method, config)
    got = lm_head_problem(head)
    if problem is None:
        assert got is None, f"{name}: {got} ({type(head.quant_method).__name__})"
        assert head.weight.dtype == torch.bfloat16
    else:
        assert got is not None and re.search(problem, got), f"{name}: {got!r} ({type(head.quant_method).__name__})"
        assert "unquantized" not in type(head.quant_method).__name__.lower()


def test_the_refusal_names_the_fix():
    from sglang_ddtree.sglang.server_args import lm_head_refusal

    message = lm_head_refusal("weight is torch.float8_e4m3fn (quantized)")
    assert message.startswith("DDTREE: the target's lm_head weight is torch.float8_e4m3fn (quantized)")
    assert "exclude_modules" in message and "without speculative decoding" in message
    assert "DFLASH" in message and "use --speculative-algorithm DFLASH" not in message
