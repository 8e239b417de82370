"""Build the sglang-ddtree wheel on the controller, reproducibly, without touching the source tree.

Usage: build_wheel.py [--base64] SOURCE_DIR OUT_DIR      (build)
       build_wheel.py [--base64] --describe WHEEL          (describe a prebuilt wheel)
Copies SOURCE_DIR (without build/, dist/, *.egg-info, caches) to a temporary directory, builds a wheel there with
`python -m pip wheel --no-deps --no-build-isolation` (no network needed: the controller's setuptools is used) and
SOURCE_DATE_EPOCH fixed, so the same sources give the same bytes (the copy to the hosts is then idempotent).
Prints one JSON line: {"wheel": path in OUT_DIR, "name", "version", "sha256", "sha1", "changed", "reused"}, and with
--base64 the wheel's bytes as "base64" (the preflight probe takes them as they are, no copy task).

Each version of the sources has its own directory, OUT_DIR/<first 16 hex digits of the sources' key>, holding its
wheel and .build-cache.json: two checkouts that pivot at once from one controller (the cache is shared, and their
wheels have the same file name) never replace each other's wheel between its build and its copy to the hosts. The
build is skipped when that directory holds the wheel this script built from the same sources (every file it would
copy: path, executable bit, bytes) with the same interpreter and SOURCE_DATE_EPOCH, and that wheel still has the
sha256 it had then: "reused" is then true. The bytes are those a build would give. The KEEP most recently used
directories are kept, older ones removed.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

IGNORED = ("build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".pytest_cache", "tests")
IGNORE = shutil.ignore_patterns(*IGNORED)
CACHE = ".build-cache.json"
KEEP = 8  # versions of the sources whose wheels OUT_DIR keeps (the most recently built or reused)


def describe(wheel: Path, changed: bool, with_base64: bool = False, reused: bool = False) -> dict[str, object]:
    data = wheel.read_bytes()
    name, version = wheel.name.split("-")[:2]
    out: dict[str, object] = {
        "wheel": str(wheel),
        "name": name.replace("_", "-"),
        "version": version,
        "sha256": hashlib.sha256(data).hexdigest(),
        "sha1": hashlib.sha1(data).hexdigest(),
        "changed": changed,
        "reused": reused,
    }
    if with_base64:
        out["base64"] = base64.b64encode(data).decode("ascii")
    return out


def sources_key(source: Path, epoch: str) -> str:
    """The sha256 of what a build reads: every file copytree(IGNORE) would copy (relative path, executable bit,
    bytes), the interpreter that builds, its pip and setuptools, and SOURCE_DATE_EPOCH."""
    tools = []
    for dist in ("pip", "setuptools", "wheel"):
        try:
            tools.append(f"{dist}={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            tools.append(f"{dist}=none")
    h = hashlib.sha256(f"v1\0{sys.executable}\0{sys.version}\0{' '.join(tools)}\0{epoch}\0".encode())
    for root, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if not any(fnmatch.fnmatch(d, pat) for pat in IGNORED))
        for name in sorted(files):
            if any(fnmatch.fnmatch(name, pat) for pat in IGNORED):
                continue
            path = Path(root) / name
            rel = path.relative_to(source).as_posix()
            h.update(f"{rel}\0{os.access(path, os.X_OK)}\0".encode())
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def cached(out: Path, key: str) -> Path | None:
    """The wheel built earlier from the same sources, if it is still there with the same bytes."""
    try:
        entry = json.loads((out / CACHE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key or "/" in str(entry.get("wheel", "/")):
        return None
    wheel = out / entry["wheel"]
    try:
        return wheel if hashlib.sha256(wheel.read_bytes()).hexdigest() == entry.get("sha256") else None
    except OSError:
        return None


def remember(out: Path, key: str, wheel: Path) -> None:
    part = out / f".{CACHE}.{os.getpid()}.part"
    part.write_text(json.dumps({"key": key, "wheel": wheel.name,
                                "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}))
    os.replace(part, out / CACHE)


def prune(out: Path, keep: int, current: Path) -> None:
    """Remove all but the ``keep`` most recently used version directories of OUT_DIR (never ``current``)."""
    slots = [d for d in out.iterdir() if d.is_dir() and len(d.name) == 16
             and all(c in "0123456789abcdef" for c in d.name) and d != current]
    slots.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    for old in slots[max(0, keep - 1):]:
        shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str]) -> int:
    with_base64 = len(argv) > 1 and argv[1] == "--base64"
    if with_base64:
        argv = argv[:1] + argv[2:]
    if len(argv) == 3 and argv[1] == "--describe":
        wheel = Path(argv[2]).resolve()
        if not wheel.is_file() or wheel.suffix != ".whl" or wheel.name.count("-") < 4:
            print(f"{wheel} is not a wheel file (name-version-python-abi-platform.whl)", file=sys.stderr)
            return 2
        print(json.dumps(describe(wheel, False, with_base64)))
        return 0
    if len(argv) != 3:
        print("usage: build_wheel.py [--base64] SOURCE_DIR OUT_DIR | build_wheel.py [--base64] --describe WHEEL",
              file=sys.stderr)
        return 2
    source, out = Path(argv[1]).resolve(), Path(argv[2]).resolve()
    if not (source / "pyproject.toml").is_file():
        print(
            f"{source} has no pyproject.toml: set ddtree_plugin_source_dir to the sglang-ddtree directory",
            file=sys.stderr,
        )
        return 2
    out.mkdir(parents=True, exist_ok=True)
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "1700000000")
    key = sources_key(source, epoch)
    slot = out / key[:16]
    reuse = cached(slot, key)
    if reuse is not None:
        os.utime(slot)  # recently used: kept by prune()
        print(json.dumps(describe(reuse, False, with_base64, reused=True)))
        return 0
    slot.mkdir(exist_ok=True)
    env = dict(
        os.environ,
        SOURCE_DATE_EPOCH=epoch,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    with tempfile.TemporaryDirectory(prefix="ddtree-build-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(source, src, ignore=IGNORE)
        wheels = Path(tmp) / "wheels"
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--wheel-dir",
            str(wheels),
            str(src),
        ]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(f"building the wheel failed ({' '.join(cmd)}):\n{proc.stdout}\n{proc.stderr}", file=sys.stderr)
            return 1
        built = sorted(wheels.glob("*.whl"))
        if len(built) != 1:
            print(f"expected one wheel, got {[p.name for p in built]}", file=sys.stderr)
            return 1
        wheel = built[0]
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        dest = slot / wheel.name
        if not dest.exists() or hashlib.sha256(dest.read_bytes()).hexdigest() != digest:
            # atomically: a pivot of the same sources running at the same time on this controller never reads a
            # half-written wheel; the same sources give the same bytes, so either writer's file is the right one
            part = slot / f".{wheel.name}.{os.getpid()}.part"
            shutil.copyfile(wheel, part)
            os.replace(part, dest)
            changed = True
        else:
            changed = False
    remember(slot, key, dest)
    prune(out, KEEP, slot)
    print(json.dumps(describe(dest, changed, with_base64)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
