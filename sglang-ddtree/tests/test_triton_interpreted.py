"""The Triton kernels run in Triton's CPU interpreter (a subprocess with TRITON_INTERPRET=1), so their logic is
checked without a GPU. On CUDA the compiled kernels are tested by every test that takes the `backend` fixture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ddtree_testlib import ddtree_device

pytest.importorskip("triton")

pytestmark = pytest.mark.skipif(
    ddtree_device().type == "cuda", reason="on CUDA the compiled kernels are tested instead"
)

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    src = str(HERE.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, str(HERE), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(HERE / "triton_interpreted_check.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["case"]: r for r in rows}


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
    "glue/walk-commit",
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
