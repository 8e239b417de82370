"""specdec.pivot.state_files run for real (its own process through AnsibleModule, module_runner), in tmp_path.

What the pivot relies on: several files and directories in one run, each file whole with its mode; an existing file
with the same bytes and mode is no change (a second pivot run says changed=0); force=false never touches an existing
record; scratch files are written but never reported as a change; src copies a file on the host; check mode
writes nothing and predicts the change; the contents never appear in the result.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path

from module_runner import COLLECTIONS_ROOT, invoke_module


def run(args: dict, check_mode: bool = False) -> dict:
    env = {**os.environ, "PYTHONPATH": str(COLLECTIONS_ROOT)}
    return invoke_module("state_files", args, env, check_mode=check_mode)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_writes_directories_and_files_then_nothing_to_do(tmp_path):
    state = tmp_path / "state"
    args = {
        "directories": [{"path": str(state / "units")}, {"path": str(state / "bin"), "mode": "0700"}],
        "files": [
            {"path": str(state / "units" / "a.json"), "content": '{"a": 1}', "mode": "0600"},
            {"path": str(state / "bin" / "s.py"), "content": "print('x')\n", "mode": "0755"},
        ],
    }
    first = run(args)
    assert first["changed"] is True and not first.get("failed"), first
    assert first["directories"] == [str(state / "units"), str(state / "bin")]
    assert (state / "units" / "a.json").read_text() == '{"a": 1}'
    assert mode(state / "units" / "a.json") == 0o600 and mode(state / "bin" / "s.py") == 0o755
    assert mode(state / "bin") == 0o700
    assert [f["sha1"] for f in first["files"]] == [hashlib.sha1(b'{"a": 1}').hexdigest(),
                                                   hashlib.sha1(b"print('x')\n").hexdigest()]
    assert [f["existed"] for f in first["files"]] == [False, False]
    again = run(args)
    assert again["changed"] is False and again["directories"] == [], again
    assert [f["changed"] for f in again["files"]] == [False, False]
    assert not list(state.rglob(".*")), "no temporary file is left"


def test_a_mode_or_content_change_is_a_change(tmp_path):
    path = tmp_path / "f"
    path.write_text("old")
    path.chmod(0o644)
    r = run({"files": [{"path": str(path), "content": "old", "mode": "0600"}]})
    assert r["changed"] is True and mode(path) == 0o600 and path.read_text() == "old"
    r = run({"files": [{"path": str(path), "content": "new", "mode": "0600"}]})
    assert r["changed"] is True and path.read_text() == "new" and mode(path) == 0o600


def test_force_false_never_touches_an_existing_file(tmp_path):
    record = tmp_path / "unit.abc.pre-pivot"
    record.write_text("the unit before the first switch")
    record.chmod(0o644)
    r = run({"files": [{"path": str(record), "content": "something else", "mode": "0600", "force": False}]})
    assert r["changed"] is False and r["files"][0]["existed"] is True
    assert record.read_text() == "the unit before the first switch" and mode(record) == 0o644
    assert r["files"][0]["sha1"] == hashlib.sha1(b"the unit before the first switch").hexdigest()


def test_src_copies_a_file_on_the_host(tmp_path):
    unit = tmp_path / "sglang.service"
    unit.write_bytes(b"[Service]\nExecStart=/bin/true\n")
    copy = tmp_path / "units" / "sglang.service.pre-pivot"
    copy.parent.mkdir()
    r = run({"files": [{"path": str(copy), "src": str(unit), "mode": "0600", "force": False}]})
    assert r["changed"] is True and copy.read_bytes() == unit.read_bytes() and mode(copy) == 0o600


def test_scratch_files_are_written_but_no_change(tmp_path):
    keys = tmp_path / "probe-auth.json"
    r = run({"files": [{"path": str(keys), "content": '{"api_key": "sk-secret-1234"}', "mode": "0600",
                        "scratch": True}]})
    assert r["changed"] is False and r["files"][0]["changed"] is True
    assert keys.read_text() == '{"api_key": "sk-secret-1234"}' and mode(keys) == 0o600
    assert "sk-secret-1234" not in json.dumps(r), "a file's content never appears in the result"


def test_check_mode_writes_nothing(tmp_path):
    state = tmp_path / "state"
    args = {"directories": [{"path": str(state)}],
            "files": [{"path": str(state / "f"), "content": "x", "mode": "0600"}]}
    r = run(args, check_mode=True)
    assert r["changed"] is True and r["files"][0]["changed"] is True
    assert not state.exists()


def test_refusals_before_anything_is_written(tmp_path):
    missing = run({"files": [{"path": str(tmp_path / "a"), "content": "some text", "mode": "0600"},
                             {"path": str(tmp_path / "b"), "src": str(tmp_path / "nope"), "mode": "0600"}]})
    assert missing["failed"] and "is not a file on the host" in missing["msg"]
    assert not (tmp_path / "a").exists()
    relative = run({"files": [{"path": "rel/f", "content": "some text", "mode": "0600"}]})
    assert relative["failed"] and "not an absolute path" in relative["msg"]
    both = run({"files": [{"path": str(tmp_path / "c"), "content": "some text", "src": "/etc/hostname",
                           "mode": "0600"}]})
    assert both["failed"] and "mutually exclusive" in both["msg"]
    no_dir = run({"files": [{"path": str(tmp_path / "no" / "f"), "content": "some text", "mode": "0600"}]})
    assert no_dir["failed"] and "does not exist" in no_dir["msg"]


def test_an_empty_file(tmp_path):
    r = run({"files": [{"path": str(tmp_path / "empty"), "content": "", "mode": "0644"}]})
    assert r["changed"] is True and (tmp_path / "empty").read_bytes() == b"" and r["files"][0]["path"].endswith("empty")


def test_bytes_from_base64_checked_against_their_sha256(tmp_path):
    data = bytes(range(256)) * 4
    wheel = tmp_path / "wheels" / "x-1.0-py3-none-any.whl"
    spec = {"path": str(wheel), "content_base64": base64.b64encode(data).decode(), "mode": "0644",
            "sha256": hashlib.sha256(data).hexdigest()}
    r = run({"directories": [{"path": str(wheel.parent)}], "files": [spec]})
    assert r["changed"] is True and wheel.read_bytes() == data and mode(wheel) == 0o644
    assert run({"files": [spec]})["changed"] is False
    wrong = run({"files": [{**spec, "path": str(tmp_path / "other.whl"), "sha256": "0" * 64}]})
    assert wrong["failed"] and "do not have sha256" in wrong["msg"] and not (tmp_path / "other.whl").exists()
    junk = run({"files": [{"path": str(tmp_path / "j"), "content_base64": "not base64!", "mode": "0644"}]})
    assert junk["failed"] and "is not base64" in junk["msg"]
