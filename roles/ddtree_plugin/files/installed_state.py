"""Is this wheel's content installed in this interpreter? Run with SGLang's own interpreter on the host.

Usage: installed_state.py DIST_NAME [WHEEL_PATH]
Prints one JSON line: {"installed", "version", "same_content", "differing", "direct_url"}. ``same_content`` compares
every file the wheel's RECORD lists (sha256) with the installed distribution's RECORD, so a rebuilt wheel with
the same version but other bytes counts as different, and an unchanged one as the same (pip does not always
record the archive's hash in direct_url.json). Without WHEEL_PATH only ``installed`` and ``version`` are
meaningful (``same_content`` is false). Read-only.
"""

from __future__ import annotations

import csv
import io
import json
import sys
import zipfile
from importlib import metadata

SKIP = ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")


def record_hashes(text: str) -> dict[str, str]:
    out = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[1] and not row[0].endswith(SKIP) and not row[0].endswith(".pyc"):
            out[row[0]] = row[1]
    return out


def main(argv: list[str]) -> int:
    name, wheel = argv[1], (argv[2] if len(argv) > 2 else "")
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        print(
            json.dumps(
                {"installed": False, "version": None, "same_content": False, "differing": [], "direct_url": None}
            )
        )
        return 0
    differing = ["(no wheel given)"]
    if wheel:
        with zipfile.ZipFile(wheel) as zf:
            record_name = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
            wanted = record_hashes(zf.read(record_name).decode())
        have = record_hashes(dist.read_text("RECORD") or "")
        differing = sorted(path for path, digest in wanted.items() if have.get(path) != digest)
    direct_url = json.loads(dist.read_text("direct_url.json") or "null")
    print(
        json.dumps(
            {
                "installed": True,
                "version": dist.version,
                "same_content": not differing,
                "differing": differing[:20],
                "direct_url": direct_url,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
