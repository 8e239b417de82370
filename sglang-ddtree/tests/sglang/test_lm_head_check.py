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
