# Private module_utils for specdec.pivot: a wheel's RECORD compared with an installed distribution's RECORD.
"""Is a wheel's content what a distribution has installed? Pure functions over RECORD text.

A wheel's ``*.dist-info/RECORD`` and the installed distribution's RECORD list every file with its
``sha256=<urlsafe base64>`` digest. :func:`record_hashes` reads one RECORD into ``{path: digest}``, leaving out
what an install writes or rewrites by itself (``RECORD``, ``INSTALLER``, ``REQUESTED``, ``direct_url.json``, and
the ``.pyc`` files pip compiles); :func:`differing_files` lists the wheel's files whose digest the installed RECORD
does not have (changed or missing). Used by the ``python_distribution`` module, which does the I/O; runs in the
interpreter under inspection, so it keeps to Python 3.8.

A wheel's RECORD is not trusted (issue 25): :func:`wheel_hashes` takes the digests computed from the wheel's own
files, checks the RECORD strictly against them (:func:`parse_record`: every row ``path,sha256=...,size``, no path
that leaves the install directory), and returns those computed digests; the module compares them with digests
computed from the installed files themselves (:func:`file_digest`).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re

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


_DIGEST_RE = re.compile(r"^sha256=[A-Za-z0-9_-]{43}$")


def record_digest(sha256: bytes) -> str:
    """A RECORD digest from a raw sha256: ``sha256=`` and its urlsafe base64 without padding (PEP 376/427)."""
    return "sha256=" + base64.urlsafe_b64encode(sha256).rstrip(b"=").decode("ascii")


def file_digest(data: bytes) -> str:
    """The RECORD digest of ``data``."""
    return record_digest(hashlib.sha256(data).digest())


def compared(path: str) -> bool:
    """Whether a wheel member is compared (the installer writes or rewrites the others; directories hold nothing)."""
    return not (path.endswith("/") or path.endswith(SKIPPED_SUFFIXES) or path.endswith(".pyc"))


def unsafe_path(path: str) -> bool:
    """A RECORD or zip path that would leave the directory it is installed into (absolute, ``..``, a drive)."""
    parts = path.replace("\\", "/").split("/")
    return path.startswith(("/", "\\")) or ".." in parts or (len(path) > 1 and path[1] == ":") or "\0" in path


def install_path(member: str) -> str | None:
    """Where a wheel member is installed, relative to site-packages; None for ``*.data/{scripts,headers,data}``
    members, which go elsewhere (scripts are rewritten) and are not compared."""
    parts = member.split("/")
    if len(parts) > 2 and parts[0].endswith(".data"):
        return "/".join(parts[2:]) if parts[1] in ("purelib", "platlib") else None
    return member


def parse_record(text: str) -> dict[str, str]:
    """A wheel's RECORD read strictly: ``{path: digest}`` (digest empty only for files the installer writes).

    Raises ValueError naming the row for anything else: not CSV, a row without three fields, an unsafe path, a
    compared file without a ``sha256=`` digest of 43 characters, a path listed twice.
    """
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise ValueError(f"its RECORD is not CSV ({exc})") from exc
    out: dict[str, str] = {}
    for n, row in enumerate(rows, 1):
        if not row or row == [""]:
            continue
        if len(row) != 3:
            raise ValueError(f"RECORD row {n} has {len(row)} fields, not path,hash,size: {str(row)[:120]}")
        path, digest, _size = row
        if not path or unsafe_path(path):
            raise ValueError(f"RECORD row {n} names the path {path[:120]!r}, which leaves the install directory")
        if digest and not _DIGEST_RE.match(digest):
            raise ValueError(f"RECORD row {n} ({path}) has the hash {digest[:60]!r}, not sha256=<43 characters>")
        if not digest and compared(path):
            raise ValueError(f"RECORD row {n} ({path}) has no hash")
        if path in out:
            raise ValueError(f"RECORD lists {path} twice (rows {list(out).index(path) + 1} and {n})")
        out[path] = digest
    return out


def wheel_hashes(record_text: str, members: dict[str, str]) -> dict[str, str]:
    """``{install path: digest}`` of the wheel's compared files, digests computed from the files themselves
    (``members``: zip member name -> :func:`file_digest` of its bytes), after checking that its RECORD describes
    exactly those files with those digests. Raises ValueError saying what does not match."""
    record = parse_record(record_text)
    for member in members:
        if unsafe_path(member):
            raise ValueError(f"it holds the member {member[:120]!r}, which leaves the install directory")
    out: dict[str, str] = {}
    for member, digest in sorted(members.items()):
        if not compared(member):
            continue
        if member not in record:
            raise ValueError(f"{member} is in the wheel but not in its RECORD")
        if record[member] != digest:
            raise ValueError(f"its RECORD's hash of {member} is not the hash of the file: the wheel is corrupt")
        target = install_path(member)
        if target is not None:
            out[target] = digest
    for path in record:
        if compared(path) and path not in members:
            raise ValueError(f"its RECORD lists {path}, which the wheel does not hold")
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
    version: str | None,
    installed_record: str | dict | None,
    wheel_record: str | dict | None,
    direct_url: object = None,
) -> dict:
    """The module's result for one distribution.

    ``version`` None = not installed (then nothing else is read). ``wheel_record`` None = no wheel was given:
    ``same_content`` is false and ``differing`` is ``["(no wheel given)"]``, since nothing was compared.
    ``installed_record`` and ``wheel_record`` are RECORD texts or ``{path: digest}`` mappings (the module gives
    digests computed from the files: :func:`wheel_hashes` and the installed files' :func:`file_digest`).
    """
    if version is None:
        return {"installed": False, "version": None, "same_content": False, "differing": [], "direct_url": None}
    if wheel_record is None:
        differing = ["(no wheel given)"]
    else:
        wanted = record_hashes(wheel_record) if isinstance(wheel_record, str) else dict(wheel_record)
        have = installed_record if isinstance(installed_record, dict) else record_hashes(installed_record or "")
        differing = differing_files(wanted, have)
    return {
        "installed": True,
        "version": version,
        "same_content": not differing,
        "differing": differing[:DIFFERING_LIMIT],
        "direct_url": direct_url,
    }
