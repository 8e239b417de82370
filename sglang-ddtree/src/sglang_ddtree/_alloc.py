"""One allocation for several outputs of a glue kernel: each ``torch.empty`` costs host time on every decode step
(the caching allocator's bookkeeping, a Python call), so outputs of one dtype come from one buffer, as views."""

from __future__ import annotations

import math

import torch

__all__ = ["carve"]

#: Every view starts on a 16-byte boundary: Triton specialises pointers on that alignment, so a view of a shared
#: buffer compiles (and warms up) the same kernel variant as a tensor of its own.
ALIGN_BYTES = 16


def carve(shapes: list[tuple[int, ...]], dtype: torch.dtype, device: torch.device | str) -> list[torch.Tensor]:
    """Uninitialised contiguous tensors of ``shapes`` (one dtype) carved from a single allocation, each starting
    on a 16-byte boundary."""
    step = max(1, ALIGN_BYTES // dtype.itemsize)
    sizes = [math.prod(shape) for shape in shapes]
    starts, total = [], 0
    for size in sizes:
        starts.append(total)
        total += -(-size // step) * step
    flat = torch.empty(max(total, 1), dtype=dtype, device=device)
    return [flat[start : start + size].view(shape) for start, size, shape in zip(starts, sizes, shapes, strict=True)]
