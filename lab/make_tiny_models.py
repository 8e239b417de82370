"""Create the lab's tiny random models on the controller (run with /work/main/.venv's python).

    python lab/make_tiny_models.py OUT_DIR

writes OUT_DIR/Qwen3-tiny (a tiny random Qwen3 causal LM with a byte-level BPE tokenizer) and
OUT_DIR/Qwen3-tiny-DFlash (a matching DFlash drafter in the z-lab checkpoint layout: config.json with
``architectures: [DFlashDraftModel]``, ``dflash_config`` with block size, target layer ids and mask token).

The models come from ``sglang_ddtree.reference.tiny.make_tiny_models`` (sglang-ddtree is installed editable in
the controller's venv), the same maker its reference engine is tested with, so the lab server's DDTree engine
loads exactly what it expects. ``aligned=True`` gives a drafter that usually agrees with the target at depth 1,
so acceptance lengths above 1 show up in the lab. Deterministic (fixed seed); OUT_DIR/.lab-models-stamp
records the settings and the maker's source hash, and a re-run with the same ones does nothing.
OUT_DIR/models.tar holds both directories and the stamp, for lab/provision.yml to ship in one transfer.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import sys
import tarfile
from pathlib import Path

TARGET = "Qwen3-tiny"
DRAFTER = "Qwen3-tiny-DFlash"
STAMP = ".lab-models-stamp"
ARCHIVE = "models.tar"  # both model directories and the stamp: one transfer to a host instead of one per file
# Block size 16 like the production drafter (z-lab "b16"); float32 on disk because the lab serves on CPU.
SETTINGS = {"seed": 0, "aligned": True, "block_size": 16, "dtype": "float32"}


def _readable(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mode = 0o755 if info.isdir() else 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def maker_hash() -> str | None:
    """sha256 of sglang_ddtree/reference/tiny.py (found without importing torch): a changed maker remakes the models."""
    spec = importlib.util.find_spec("sglang_ddtree")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "reference" / "tiny.py"
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    out: Path = args.out_dir
    stamp_text = json.dumps({"maker": "sglang_ddtree.reference.tiny.make_tiny_models", "maker_sha256": maker_hash(),
                             **SETTINGS}, sort_keys=True)
    stamp = out / STAMP
    if (stamp.is_file() and stamp.read_text().strip() == stamp_text and (out / ARCHIVE).is_file()
            and (out / TARGET / "config.json").is_file() and (out / DRAFTER / "config.json").is_file()):
        print(f"tiny models up to date in {out}")
        return 0
    try:
        from sglang_ddtree.reference.tiny import make_tiny_models
    except ImportError as exc:
        print(f"make_tiny_models.py: cannot import sglang_ddtree.reference.tiny ({exc}); run it with the "
              "controller venv's python (.venv/bin/python), where sglang-ddtree is installed", file=sys.stderr)
        return 1
    work = out / ".work"
    shutil.rmtree(work, ignore_errors=True)
    models = make_tiny_models(work, **SETTINGS)
    for produced, name in ((models.target_dir, TARGET), (models.drafter_dir, DRAFTER)):
        shutil.rmtree(out / name, ignore_errors=True)
        Path(produced).rename(out / name)
    shutil.rmtree(work, ignore_errors=True)
    stamp.write_text(stamp_text + "\n")
    with tarfile.open(out / ".work.tar", "w") as tar:
        for name in (TARGET, DRAFTER, STAMP):
            tar.add(out / name, arcname=name, filter=_readable)
    (out / ".work.tar").rename(out / ARCHIVE)
    print(f"tiny models written to {out / TARGET} and {out / DRAFTER} "
          f"(vocab {models.vocab_size}, block size {models.block_size}, target layers {models.target_layer_ids})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
