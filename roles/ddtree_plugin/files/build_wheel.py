"""Build the sglang-ddtree wheel on the controller, reproducibly, without touching the source tree.

Usage: build_wheel.py SOURCE_DIR OUT_DIR      (build)
       build_wheel.py --describe WHEEL          (describe a prebuilt wheel)
Copies SOURCE_DIR (without build/, dist/, *.egg-info, caches) to a temporary directory, builds a wheel there with
`python -m pip wheel --no-deps --no-build-isolation` (no network needed: the controller's setuptools is used) and
SOURCE_DATE_EPOCH fixed, so the same sources give the same bytes (the copy to the hosts is then idempotent).
Prints one JSON line: {"wheel": path in OUT_DIR, "name", "version", "sha256", "sha1", "changed"}.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

IGNORE = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".pytest_cache", "tests")


def describe(wheel: Path, changed: bool) -> dict[str, object]:
    data = wheel.read_bytes()
    name, version = wheel.name.split("-")[:2]
    return {
        "wheel": str(wheel),
        "name": name.replace("_", "-"),
        "version": version,
        "sha256": hashlib.sha256(data).hexdigest(),
        "sha1": hashlib.sha1(data).hexdigest(),
        "changed": changed,
    }


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "--describe":
        wheel = Path(argv[2]).resolve()
        if not wheel.is_file() or wheel.suffix != ".whl" or wheel.name.count("-") < 4:
            print(f"{wheel} is not a wheel file (name-version-python-abi-platform.whl)", file=sys.stderr)
            return 2
        print(json.dumps(describe(wheel, False)))
        return 0
    if len(argv) != 3:
        print("usage: build_wheel.py SOURCE_DIR OUT_DIR | build_wheel.py --describe WHEEL", file=sys.stderr)
        return 2
    source, out = Path(argv[1]).resolve(), Path(argv[2]).resolve()
    if not (source / "pyproject.toml").is_file():
        print(
            f"{source} has no pyproject.toml: set ddtree_plugin_source_dir to the sglang-ddtree directory",
            file=sys.stderr,
        )
        return 2
    out.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        SOURCE_DATE_EPOCH=os.environ.get("SOURCE_DATE_EPOCH", "1700000000"),
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
        dest = out / wheel.name
        if not dest.exists() or hashlib.sha256(dest.read_bytes()).hexdigest() != digest:
            # atomically: a pivot running at the same time on this controller (the cache is shared) never reads a
            # half-written wheel; the same sources give the same bytes, so either writer's file is the right one
            part = out / f".{wheel.name}.{os.getpid()}.part"
            shutil.copyfile(wheel, part)
            os.replace(part, dest)
            changed = True
        else:
            changed = False
    print(json.dumps(describe(dest, changed)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
