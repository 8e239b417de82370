"""specdec.pivot.read_files run for real (its own process through AnsibleModule, module_runner), in tmp_path.

What preflight relies on: several files read in one run (base64, NUL bytes kept), a missing, unreadable or relative
one reported (not a failure), metadata with the SHA-1 the records are named by, access as test -w decides, the
files of a directory matching a name pattern (none when the directory is missing), and the uid it ran as.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

from module_runner import COLLECTIONS_ROOT, invoke_module


def run(args: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(COLLECTIONS_ROOT)}
    return invoke_module("read_files", args, env, check_mode=True)


def test_reads_stats_finds_and_says_what_may_be_written(tmp_path):
    unit = tmp_path / "sglang.service"
    unit.write_bytes(b"[Service]\nExecStart=/bin/true\n")
    unit.chmod(0o644)
    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(b"python\0-m\0server\0")
    records = tmp_path / "units"
    records.mkdir()
    for name in ("sglang.service.bbb.json", "sglang.service.aaa.json", "other.service.ccc.json"):
        (records / name).write_text(f'{{"name": "{name}"}}')
    (records / "sglang.service.dir.json").mkdir()
    r = run({"files": [str(unit), str(cmdline), str(tmp_path / "missing"), "relative/path"],
             "stat": [str(unit), str(tmp_path / "missing")],
             "access": [str(tmp_path), str(tmp_path / "missing")],
             "find": [{"dir": str(records), "pattern": "sglang.service.*.json"},
                      {"dir": str(tmp_path / "no-dir"), "pattern": "*"}]})
    assert not r.get("failed") and r["changed"] is False, r
    assert r["euid"] == os.geteuid()
    assert base64.b64decode(r["files"][str(cmdline)]["content"]) == b"python\0-m\0server\0"
    assert r["files"][str(tmp_path / "missing")] == {"exists": False, "content": None, "error": "no such file"}
    assert r["files"]["relative/path"]["error"] == "not an absolute path"
    info = r["stat"][str(unit)]
    assert info["exists"] and not info["isdir"] and info["mode"] == "0644" and info["roth"] is True
    assert info["sha1"] == hashlib.sha1(unit.read_bytes()).hexdigest() and info["writeable"] is True
    assert r["stat"][str(tmp_path / "missing")] == {"exists": False}
    assert r["access"] == {str(tmp_path): "w", str(tmp_path / "missing"): "-"}
    wanted = [str(records / "sglang.service.aaa.json"), str(records / "sglang.service.bbb.json")]
    assert r["found"] == [wanted, []]
    assert [base64.b64decode(r["files"][p]["content"]).decode() for p in wanted] == [
        '{"name": "sglang.service.aaa.json"}', '{"name": "sglang.service.bbb.json"}']


def test_a_file_longer_than_max_bytes_is_an_error_not_a_part(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100)
    r = run({"files": [str(big)], "max_bytes": 10})
    assert r["files"][str(big)] == {"exists": True, "content": None, "error": "longer than max_bytes=10"}


def test_refusals(tmp_path):
    assert "not an absolute path" in run({"stat": ["rel"]})["msg"]
    assert "pattern a file name pattern" in run({"find": [{"dir": str(tmp_path), "pattern": "a/b"}]})["msg"]
    assert "must be at least 1" in run({"max_bytes": 0})["msg"]


def test_an_unreadable_file_is_reported(tmp_path):
    if os.geteuid() == 0:  # root reads any file; a directory opened as a file fails for everyone
        path = tmp_path / "a-directory"
        path.mkdir()
    else:
        path = tmp_path / "secret"
        path.write_text("x")
        path.chmod(0)
    r = run({"files": [str(path)]})
    entry = r["files"][str(path)]
    assert entry["exists"] is True and entry["content"] is None and entry["error"], entry
    assert Path(path).exists()
