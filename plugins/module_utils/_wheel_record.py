# Private module_utils for specdec.pivot: a wheel's RECORD compared with an installed distribution's RECORD.
"""Is a wheel's content what a distribution has installed? Pure functions over RECORD text.

A wheel's ``*.dist-info/RECORD`` and the installed distribution's RECORD list every file with its
``sha256=<urlsafe base64>`` digest. :func:`record_hashes` reads one RECORD into ``{path: digest}``, leaving out
what an install writes or rewrites by itself (``RECORD``, ``INSTALLER``, ``REQUESTED``, ``direct_url.json``, and
the ``.pyc`` files pip compiles); :func:`differing_files` lists the wheel's files whose digest the installed RECORD
does not have (changed or missing). Used by the ``python_distribution`` module, which does the I/O; runs in the
interpreter under inspection, so it keeps to Python 3.8.
"""

from __future__ import annotations

import csv
import io

#: RECORD rows whose path ends with one of these are not compared: the installer writes or rewrites them.
SKIPPED_SUFFIXES = ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")

#: How many differing paths a result lists at most.
DIFFERING_LIMIT = 20


def record_hashes(text: str) -> dict[str, str]:
    """``{path: "sha256=..."}`` for every RECORD row that has a digest and is compared (see SKIPPED_SUFFIXES)."""
    out = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) < 2 or not row[1]:
            continue
        path = row[0]
        if path.endswith(SKIPPED_SUFFIXES) or path.endswith(".pyc"):
            continue
        out[path] = row[1]
    return out


def differing_files(wanted: dict[str, str], have: dict[str, str]) -> list[str]:
    """The paths of ``wanted`` (the wheel's) whose digest ``have`` (the installed RECORD) lacks, sorted."""
    return sorted(path for path, digest in wanted.items() if have.get(path) != digest)


def find_record_name(names: list[str]) -> str | None:
    """The ``<name>-<version>.dist-info/RECORD`` member among a wheel's member names (top level only), or None."""
    for name in names:
        parts = name.split("/")
        if len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "RECORD":
            return name
    return None


def distribution_state(
    version: str | None, installed_record: str | None, wheel_record: str | None, direct_url: object = None
) -> dict:
    """The module's result for one distribution.

    ``version`` None = not installed (then nothing else is read). ``wheel_record`` None = no wheel was given:
    ``same_content`` is false and ``differing`` is ``["(no wheel given)"]``, since nothing was compared.
    """
    if version is None:
        return {"installed": False, "version": None, "same_content": False, "differing": [], "direct_url": None}
    if wheel_record is None:
        differing = ["(no wheel given)"]
    else:
        differing = differing_files(record_hashes(wheel_record), record_hashes(installed_record or ""))
    return {
        "installed": True,
        "version": version,
        "same_content": not differing,
        "differing": differing[:DIFFERING_LIMIT],
        "direct_url": direct_url,
    }
