"""build_wheel.py (the ddtree_plugin role's wheel, built once on the controller): one cache directory per version of
the sources, so two checkouts that pivot at once from one controller keep their own wheels."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles" / "ddtree_plugin" / "files" / "build_wheel.py"


def build(source: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(source), str(out)], capture_output=True, text=True,
                          check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[Path, Path]:
    """Two versions of sglang-ddtree's sources that differ in one file (its tests and caches left out)."""
    root = tmp_path_factory.mktemp("sources")
    first, second = root / "a", root / "b"
    ignore = shutil.ignore_patterns("tests", "__pycache__", "*.egg-info", "build", "dist")
    shutil.copytree(REPO / "sglang-ddtree", first, ignore=ignore)
    shutil.copytree(first, second)
    module = second / "src" / "sglang_ddtree" / "tree.py"
    module.write_text(module.read_text() + "\n# the second checkout's change\n")
    return first, second


def sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_two_versions_of_the_sources_keep_their_own_wheels_in_one_cache(sources, tmp_path) -> None:
    first, second = sources
    out = tmp_path / "wheels"
    a = build(first, out)
    b = build(second, out)
    assert a["changed"] and b["changed"] and not a["reused"] and not b["reused"]
    # the same file name (pip needs it), in two directories, each with its own bytes
    assert Path(a["wheel"]).name == Path(b["wheel"]).name
    assert Path(a["wheel"]).parent != Path(b["wheel"]).parent
    assert a["sha256"] != b["sha256"]
    assert sha256(a["wheel"]) == a["sha256"] and sha256(b["wheel"]) == b["sha256"]
    # each is reused afterwards, in any order, without a rebuild
    again_a, again_b = build(first, out), build(second, out)
    assert again_a["reused"] and again_b["reused"]
    assert (again_a["wheel"], again_a["sha256"]) == (a["wheel"], a["sha256"])
    assert (again_b["wheel"], again_b["sha256"]) == (b["wheel"], b["sha256"])


def test_a_wheel_changed_in_the_cache_is_rebuilt(sources, tmp_path) -> None:
    first = sources[0]
    out = tmp_path / "wheels"
    built = build(first, out)
    Path(built["wheel"]).write_bytes(b"not the wheel")
    rebuilt = build(first, out)
    assert not rebuilt["reused"] and rebuilt["changed"]
    assert rebuilt["sha256"] == built["sha256"] == sha256(rebuilt["wheel"])  # the same bytes again


def test_only_the_most_recently_used_versions_are_kept(monkeypatch, tmp_path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_wheel", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "wheels"
    slots = []
    for i in range(5):
        slot = out / f"{i:016x}"
        slot.mkdir(parents=True)
        os.utime(slot, (1000 + i, 1000 + i))
        slots.append(slot)
    (out / "not-a-version").mkdir()
    module.prune(out, 3, current=slots[0])  # the current one is kept whatever its age
    assert sorted(p.name for p in out.iterdir()) == sorted([slots[0].name, slots[4].name, slots[3].name,
                                                            "not-a-version"])
