"""Hostile input for specdec.pivot.python_distribution (issue 25): names that are not distribution names, and
wheels whose RECORD is not to be trusted (it lies about the files, is malformed, or names paths outside the install
directory). The installed distribution is pluggy in the project's .venv, as in test_python_distribution.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from module_runner import COLLECTIONS_ROOT, invoke_module

DIST = "pluggy"
SKIP = ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD")


def digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def run(args: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(COLLECTIONS_ROOT)}
    return invoke_module("python_distribution", args, env)


def installed() -> dict[str, bytes]:
    out = {}
    for f in metadata.distribution(DIST).files or []:
        path = str(f).replace(os.sep, "/")
        if not (path.endswith(".pyc") or path.endswith(SKIP) or path.startswith("..")):
            out[path] = Path(f.locate()).read_bytes()
    return out


def record_dir(files: dict) -> str:
    return next(p.split("/")[0] for p in files if p.split("/")[0].endswith(".dist-info"))


def wheel(tmp_path: Path, files: dict[str, bytes], record: str) -> str:
    path = tmp_path / f"{DIST}-{metadata.version(DIST)}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{record_dir(files)}/RECORD", record)
    return str(path)


def honest_record(files: dict[str, bytes]) -> str:
    rows = [f"{p},{digest(d)},{len(d)}" for p, d in files.items()] + [f"{record_dir(files)}/RECORD,,"]
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("name", ["", " ", "['pluggy']", "{'a': 1}", "pluggy; rm -rf /", "-pluggy", "plug gy"])
def test_a_name_that_is_not_a_distribution_name_is_refused(name):
    r = run({"name": name})
    assert r["failed"] is True
    assert "is not a distribution name" in r["msg"] and "e.g. name=sglang-ddtree" in r["msg"]


def test_a_wheel_whose_record_lies_is_not_the_installed_content(tmp_path):
    """The wheel's RECORD carries the installed files' hashes, but one file of the wheel has other bytes: comparing
    RECORDs would call it the same; the wheel's own files say otherwise."""
    files = installed()
    record = honest_record(files)
    changed = sorted(p for p in files if p.endswith(".py"))[0]
    files[changed] = files[changed] + b"\n# not what RECORD says\n"
    r = run({"name": DIST, "wheel": wheel(tmp_path, files, record)})
    assert r["failed"] is True, r
    assert f"its RECORD's hash of {changed} is not the hash of the file: the wheel is corrupt" in r["msg"]


def test_an_honest_wheel_is_compared_with_the_files_on_disk(tmp_path):
    files = installed()
    r = run({"name": DIST, "wheel": wheel(tmp_path, files, honest_record(files))})
    assert (r["same_content"], r["differing"]) == (True, [])


def _rows(files: dict) -> list[str]:
    return honest_record(files).splitlines()


MALFORMED = [
    (lambda f: "\n".join([*_rows(f), "pkg/x.py,md5=abc,3"]), "not sha256=<43 characters>"),
    (lambda f: "\n".join([*_rows(f), "pkg/x.py,sha256=abc"]), "has 2 fields, not path,hash,size"),
    (lambda f: "\n".join([*_rows(f), "../../etc/passwd,,"]), "leaves the install directory"),
    (lambda f: "\n".join([*_rows(f), "/etc/passwd," + digest(b"") + ",0"]), "leaves the install directory"),
    (lambda f: "\n".join([*_rows(f), "pluggy/ghost.py," + digest(b"x") + ",1"]), "which the wheel does not hold"),
    (lambda f: "\n".join(r for r in _rows(f) if not r.startswith("pluggy/__init__.py")), "not in its RECORD"),
    (lambda f: "\n".join([*_rows(f), _rows(f)[0]]), "twice"),
    (lambda f: "\n".join(_rows(f)) + '\n"unterminated,', "RECORD row"),
]


@pytest.mark.parametrize(("make", "words"), MALFORMED, ids=[case[1] for case in MALFORMED])
def test_a_malformed_record_is_a_clear_error(tmp_path, make, words):
    files = installed()
    path = wheel(tmp_path, files, make(files))
    r = run({"name": DIST, "wheel": path})
    assert r["failed"] is True, r
    assert r["msg"].startswith(f"wheel={path}: "), r["msg"]
    assert words in r["msg"], r["msg"]
    assert "Traceback" not in json.dumps(r)


def test_a_record_that_is_not_utf8_is_a_clear_error(tmp_path):
    files = installed()
    path = tmp_path / "w-1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{record_dir(files)}/RECORD", b"\xff\xfe not text")
    r = run({"name": DIST, "wheel": str(path)})
    assert r["failed"] is True
    assert "its RECORD is not UTF-8 text" in r["msg"]


def test_a_member_outside_the_install_directory_is_refused(tmp_path):
    files = {**installed(), "../evil.py": b"x = 1\n"}
    r = run({"name": DIST, "wheel": wheel(tmp_path, files, honest_record(files))})
    assert r["failed"] is True
    assert "leaves the install directory" in r["msg"]
