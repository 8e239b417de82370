"""Reading the recorded nvidia-smi fixtures (tests/unit/fixtures/nvidia_smi), shared by the GPU tests."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.specdec.pivot.plugins.module_utils._nvidia import (
    attach_processes,
    parse_query_compute_apps,
    parse_query_gpu,
)


def fixture_text(path: Path) -> str:
    """A fixture file without its ``#fixture:`` provenance header lines (as the stand-in prints it)."""
    lines = path.read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("#fixture:"):
        lines.pop(0)
    return "".join(lines)


def recorded_gpus(recording: Path) -> list[dict]:
    """The GPUs (with compute processes) of one recording directory, as the parsers read them."""
    gpus = parse_query_gpu(fixture_text(recording / "query-gpu.out"))
    return attach_processes(gpus, parse_query_compute_apps(fixture_text(recording / "query-compute-apps.out")))
