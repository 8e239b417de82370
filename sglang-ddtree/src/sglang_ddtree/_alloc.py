"""One allocation for several outputs of a glue kernel: each ``torch.empty`` costs host time on every decode step
(the caching allocator's bookkeeping, a Python call), so outputs of one dtype come from one buffer, as views."""

from __future__ import annotations

import math

import torch

__all__ = ["CarveRing", "carve"]

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


class CarveRing:
    """:func:`carve`'s outputs made once per shape set and handed out again in turn: ``depth`` sets of views per
    (name, shapes, dtype, device), the next set each call, so a step's outputs are overwritten only ``depth`` calls of
    the same name and shapes later. Saves a step the allocation and the views (a Python call each). Each call site
    names its outputs, so two calls of one round never take turns from the same sets.

    The caller's contract: nothing reads an output more than ``depth - 1`` calls of the same name and shapes after it
    was handed out (SGLang's overlap scheduler reads a round's results one round later)."""

    def __init__(self, depth: int = 4):
        if depth < 2:
            raise ValueError(f"depth must be >= 2 (a round's outputs are read during the next one), got {depth}")
        self.depth = int(depth)
        self._sets: dict[tuple, list] = {}  # key -> [next turn, [views of each turn]]

    def carve(self, name: str, shapes: list[tuple[int, ...]], dtype: torch.dtype, device: torch.device | str
              ) -> list[torch.Tensor]:
        key = (name, tuple(shapes), dtype, str(device))
        entry = self._sets.get(key)
        if entry is None:
            entry = self._sets[key] = [0, [carve(shapes, dtype, device) for _ in range(self.depth)]]
        turn = entry[0]
        entry[0] = (turn + 1) % self.depth
        return entry[1][turn]

    def __len__(self) -> int:
        """Shape sets held."""
        return len(self._sets)
