"""specdec.pivot.python_distribution run for real.

The module runs as its own process through AnsibleModule (module_runner), in this test venv's interpreter, against
a real installed distribution (pluggy, which pytest needs) and real wheels built here in tmp_path: a zip holding
the installed distribution's own files with a ``*.dist-info/RECORD`` whose sha256 digests are computed here from
the bytes, independently of the module.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from module_runner import COLLECTIONS_ROOT, invoke_module

REPO = Path(__file__).resolve().parents[4]
DIST = "pluggy"
INSTALLER_WRITTEN = ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD")


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def installed_files() -> dict[str, bytes]:
    """The distribution's files as installed (what its wheel held), without .pyc and installer-written files."""
    dist = metadata.distribution(DIST)
    out = {}
    for f in dist.files or []:
        path = str(f).replace(os.sep, "/")
        if path.endswith(".pyc") or path.endswith(INSTALLER_WRITTEN) or path.startswith(".."):
            continue
        out[path] = Path(f.locate()).read_bytes()
    assert out, f"{DIST} lists no files"
    return out


def build_wheel(tmp_path: Path, files: dict[str, bytes], name: str = "w") -> Path:
    """A wheel (zip) holding ``files`` and a RECORD with their sha256, like pip/build write it."""
    record_dir = next(p.split("/")[0] for p in files if p.split("/")[0].endswith(".dist-info"))
    rows = [f"{path},{_digest(data)},{len(data)}" for path, data in files.items()]
    rows.append(f"{record_dir}/RECORD,,")
    wheel = tmp_path / f"{name}-{metadata.version(DIST)}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
        zf.writestr(f"{record_dir}/RECORD", "\n".join(rows) + "\n")
    return wheel


def run(args: dict, check_mode: bool = False) -> dict:
    env = {**os.environ, "PYTHONPATH": str(COLLECTIONS_ROOT)}
    return invoke_module("python_distribution", args, env, check_mode=check_mode)


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    return installed_files()


def first_module(files: dict[str, bytes]) -> str:
    return sorted(p for p in files if p.endswith(".py"))[0]


@pytest.mark.parametrize("check_mode", [False, True], ids=["run", "check"])
def test_the_same_wheel_is_installed(tmp_path, files, check_mode):
    r = run({"name": DIST, "wheel": str(build_wheel(tmp_path, files))}, check_mode=check_mode)
    assert r["changed"] is False
    assert r["python"] == sys.executable  # the interpreter it ran in is the one inspected
    assert r["installed"] is True
    assert r["version"] == metadata.version(DIST)
    assert r["same_content"] is True
    assert r["differing"] == []
    assert "installed as built" in r["msg"]


def test_a_changed_file_differs(tmp_path, files):
    changed = first_module(files)
    wheel = build_wheel(tmp_path, {**files, changed: files[changed] + b"\n# rebuilt\n"})
    r = run({"name": DIST, "wheel": str(wheel)})
    assert (r["installed"], r["same_content"], r["differing"]) == (True, False, [changed])


def test_a_file_not_installed_differs(tmp_path, files):
    top = first_module(files).split("/")[0]
    wheel = build_wheel(tmp_path, {**files, f"{top}/added_in_this_build.py": b"X = 1\n"})
    r = run({"name": DIST, "wheel": str(wheel)})
    assert (r["same_content"], r["differing"]) == (False, [f"{top}/added_in_this_build.py"])


def test_without_a_wheel_only_version_counts():
    r = run({"name": DIST})
    assert (r["installed"], r["version"], r["same_content"]) == (True, metadata.version(DIST), False)
    assert r["differing"] == ["(no wheel given)"]
    d = metadata.distribution(DIST).read_text("direct_url.json")
    assert (r["direct_url"] is None) == (not d)


def test_not_installed_is_a_result(tmp_path):
    r = run({"name": "specdec-not-installed-anywhere", "wheel": str(tmp_path / "absent.whl")})
    assert r.get("failed") is not True
    assert (r["installed"], r["version"], r["same_content"], r["differing"], r["direct_url"]) == (
        False, None, False, [], None)
    assert "is not installed in " + sys.executable in r["msg"]


def _absent(tmp_path: Path) -> Path:
    return tmp_path / "absent.whl"


def _not_a_zip(tmp_path: Path) -> Path:
    path = tmp_path / "text.whl"
    path.write_text("not a zip")
    return path


def _no_record(tmp_path: Path) -> Path:
    path = tmp_path / "norecord.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("x/__init__.py", "")
        zf.writestr("x/vendored/y-1.dist-info/RECORD", "")  # not the wheel's own RECORD
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_absent, "is not a file on the target"),
        (_not_a_zip, "is not a zip archive"),
        (_no_record, "has no *.dist-info/RECORD"),
    ],
    ids=["absent", "not-a-zip", "no-record"],
)
def test_a_bad_wheel_fails_naming_it(tmp_path, make, message):
    wheel = make(tmp_path)
    r = run({"name": DIST, "wheel": str(wheel)})
    assert r["failed"] is True
    assert str(wheel) in r["msg"] and message in r["msg"]


@pytest.mark.parametrize("venv", [".venv", ".venv-sglang-0.5.17"])
def test_through_ansible_it_inspects_the_interpreter_it_runs_in(tmp_path, venv):
    """As the role runs it (AnsiballZ, ``ansible_python_interpreter``): .venv-sglang-0.5.17 sees .venv's
    site-packages through a .pth but its own sglang first, so the two interpreters report different versions."""
    python = REPO / venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{python} is missing (make setup-python)")
    expected = subprocess.run(
        [str(python), "-c", "from importlib import metadata; print(metadata.version('sglang'))"],
        capture_output=True, text=True, check=True, cwd="/",
    ).stdout.strip()
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "ansible"), "localhost", "-c", "local", "-m",
         "specdec.pivot.python_distribution", "-a", "name=sglang", "-e", f"ansible_python_interpreter={python}",
         "--check"],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
        env={**os.environ, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json",
             "ANSIBLE_LOCAL_TEMP": str(tmp_path)},
    )
    r = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert proc.returncode == 0, (r, proc.stderr[-2000:])
    assert (r["changed"], r["python"], r["installed"], r["version"]) == (False, str(python), True, expected)
    assert "warnings" not in r
