"""Shared fixtures for the sglang-ddtree core tests.

Set SGLANG_DDTREE_TEST_DEVICE=cuda (or cuda:1, ...) to run the same tests on a GPU; tests marked ``cuda`` run
only then.
"""

from __future__ import annotations

import os

import pytest
import torch
from ddtree_testlib import ddtree_device


@pytest.fixture(scope="session")
def device() -> torch.device:
    dev = ddtree_device()
    if dev.type == "cuda" and not torch.cuda.is_available():
        pytest.fail(f"SGLANG_DDTREE_TEST_DEVICE={dev} but torch.cuda.is_available() is False")
    return dev


def backends() -> list[str]:
    """Tree backends under test: torch everywhere; also the compiled Triton kernels on CUDA (on CPU the Triton
    kernels run in Triton's interpreter in test_triton_interpreted.py, a subprocess)."""
    return ["torch", "triton"] if ddtree_device().type == "cuda" else ["torch"]


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", backends())


def pytest_configure(config):
    # Tiny CPU matmuls are far faster on one thread, and several thread pools on a shared 2-core machine spin
    # against each other (measured: 0.19 s vs 5.5 s for one engine run). SGLANG_DDTREE_TEST_THREADS overrides.
    torch.set_num_threads(int(os.environ.get("SGLANG_DDTREE_TEST_THREADS", "1")))


def pytest_collection_modifyitems(config, items):
    if ddtree_device().type == "cuda":
        return
    skip = pytest.mark.skip(reason="needs SGLANG_DDTREE_TEST_DEVICE=cuda (a GPU); not run, not counted as passed")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


TINY_DIMS = dict(hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128)


@pytest.fixture(scope="session")
def tiny_random_dirs(tmp_path_factory):
    """A random tiny Qwen3 target + random DFlash drafter, small vocabulary (random drafts hit often)."""
    pytest.importorskip("transformers")
    from sglang_ddtree.reference import make_tiny_models

    return make_tiny_models(
        tmp_path_factory.mktemp("tiny_random"),
        seed=0,
        vocab_size=48,
        block_size=6,
        dtype="float32",
        with_tokenizer=False,
        **TINY_DIMS,
    )


@pytest.fixture(scope="session")
def tiny_aligned_dirs(tmp_path_factory):
    pytest.importorskip("transformers")
    from sglang_ddtree.reference import make_tiny_models

    return make_tiny_models(
        tmp_path_factory.mktemp("tiny_aligned"),
        seed=1,
        vocab_size=96,
        block_size=5,
        dtype="float32",
        with_tokenizer=False,
        aligned=True,
        **TINY_DIMS,
    )


@pytest.fixture(scope="session")
def tiny_random(tiny_random_dirs, device):
    from sglang_ddtree.reference import load_models

    return load_models(tiny_random_dirs.target_dir, tiny_random_dirs.drafter_dir, dtype=torch.float64, device=device)


@pytest.fixture(scope="session")
def tiny_aligned(tiny_aligned_dirs, device):
    from sglang_ddtree.reference import load_models

    return load_models(tiny_aligned_dirs.target_dir, tiny_aligned_dirs.drafter_dir, dtype=torch.float64, device=device)
