"""``_alloc.carve``: several outputs from one allocation, each a separate, aligned, contiguous view; ``CarveRing``:
the same views handed out again in turn."""

from __future__ import annotations

import pytest
import torch

from sglang_ddtree._alloc import CarveRing, carve


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


def test_a_ring_hands_each_set_out_again_after_depth_calls(device):
    ring = CarveRing(3)
    shapes = [(2, 5), (2,)]
    sets = [ring.carve("out", shapes, torch.int64, device) for _ in range(7)]
    ptrs = [tuple(v.data_ptr() for v in views) for views in sets]
    assert len(set(ptrs[:3])) == 3  # three different sets in turn
    assert ptrs[3:6] == ptrs[:3] and ptrs[6] == ptrs[0]
    assert [tuple(v.shape) for v in sets[0]] == shapes and all(v.data_ptr() % 16 == 0 for v in sets[0])
    other = ring.carve("out", shapes, torch.int32, device)  # another dtype (or shapes): a set of its own
    assert other[0].dtype == torch.int32 and len(ring) == 2
    assert other[0].data_ptr() not in {p[0] for p in ptrs}
    # another name (a second call of one round, same shapes): sets of its own, not the next turn of "out"'s
    named = ring.carve("lens", shapes, torch.int64, device)
    assert len(ring) == 3 and named[0].data_ptr() not in {p[0] for p in ptrs}


@pytest.mark.parametrize("depth", [0, 1])
def test_a_ring_needs_two_sets_at_least(depth):
    with pytest.raises(ValueError, match="depth must be >= 2"):
        CarveRing(depth)
