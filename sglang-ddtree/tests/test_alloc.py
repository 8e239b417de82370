"""``_alloc.carve``: several outputs from one allocation, each a separate, aligned, contiguous view."""

from __future__ import annotations

import pytest
import torch

from sglang_ddtree._alloc import carve


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.float64, torch.uint8])
def test_views_are_disjoint_aligned_and_shaped(dtype, device):
    shapes = [(3, 17), (3,), (5,), (1, 1), (0,), (2, 3, 3)]
    views = carve(shapes, dtype, device)
    assert [tuple(v.shape) for v in views] == shapes
    assert all(v.is_contiguous() and v.dtype == dtype and v.device.type == device.type for v in views)
    assert all(v.data_ptr() % 16 == 0 for v in views if v.numel())
    assert len({v.untyped_storage().data_ptr() for v in views}) == 1  # one allocation
    for i, v in enumerate(views):  # writing one view leaves every other alone
        v.fill_(i + 1)
    for i, v in enumerate(views):
        assert bool((v == i + 1).all())
