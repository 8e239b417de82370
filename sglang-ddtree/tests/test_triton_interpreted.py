"""The Triton kernels run in Triton's CPU interpreter (a subprocess with TRITON_INTERPRET=1), so their logic is
checked without a GPU. On CUDA the compiled kernels are tested by every test that takes the `backend` fixture."""

from __future__ import annotations

from pathlib import Path

import pytest
from ddtree_testlib import ddtree_device, run_interpreted

pytest.importorskip("triton")

pytestmark = pytest.mark.skipif(
    ddtree_device().type == "cuda", reason="on CUDA the compiled kernels are tested instead"
)

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def results():
    return run_interpreted(HERE / "triton_interpreted_check.py", HERE)


CASES = [
    "vocab/random",
    "vocab/bf16-ties",
    "vocab/fp16",
    "vocab/int-ties",
    "vocab/uniform",
    "vocab/masked",
    "vocab/k-equals-v",
    "vocab/rounding-merge-fallback",
    "tree/random",
    "tree/ties",
    "tree/uniform-unfillable",
    "tree/exact-zero",
    "tree/one-token-chain",
    "tree/bf16",
    "tree/out-buffers",
    "from-topk",
    "walk/random",
    "walk/unfillable",
    "walk/chain",
    "glue/verify-prep",
    "glue/chain-mask",
    "glue/walk-commit",
    "glue/ring",
    "warmup/widths",
    "warmup/tp",
    "attention/reference",
    "attention/sglang",
    "attention/router",
]


@pytest.mark.parametrize("case", CASES)
def test_interpreted_kernel(case, results):
    assert case in results, f"case {case} did not run"
    assert results[case]["ok"], results[case]["detail"]
