"""specdec.pivot.sglang_server_args run for real, in the interpreter it inspects.

The module runs as its own process through AnsibleModule (module_runner), the way ``ansible_python_interpreter``
runs it: in the project's .venv (the real sglang 0.5.23 from PyPI) and in .venv-sglang-0.5.17 (the real sglang
0.5.17 with sglang-ddtree installed, whose plugin registers DDTREE), and with an ``sglang`` that cannot be imported.
Its stdout must be the module's JSON alone (module_runner parses it strictly): SGLang's import noise is swallowed.
Each run imports SGLang (20-40 s here).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from module_runner import COLLECTIONS_ROOT, invoke_module

REPO = Path(__file__).resolve().parents[4]
PY_023 = REPO / ".venv" / "bin" / "python"
PY_017 = REPO / ".venv-sglang-0.5.17" / "bin" / "python"
BASE = ["--model-path", "/models/target", "--port", "30000"]


def run(python: Path, args: list, check_mode: bool = False, pythonpath: list[Path] = ()) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in [*pythonpath, COLLECTIONS_ROOT])}
    return invoke_module(
        "sglang_server_args", {"args": args}, env, check_mode=check_mode, python=python, cwd=Path("/"), timeout=600
    )


def test_sglang_accepts_a_command_line_in_check_mode():
    r = run(PY_023, [*BASE, "--speculative-algorithm", "NEXTN", "--speculative-num-draft-tokens", "4"], True)
    assert r["changed"] is False
    assert r["python"] == str(PY_023)
    assert (r["checked"], r["ok"], r["error"], r["algorithm"]) == (True, True, "", "NEXTN")
    assert r["algorithm_resolved"]  # a registered name (SGLang 0.5.23 resolves NEXTN to EAGLE)
    assert r["msg"].startswith(f"SGLang's parser in {PY_023} accepts the command line")


def test_sglang_expands_abbreviations_and_the_module_names_them():
    r = run(PY_023, [*BASE, "--max-running", "8", "--mem-fraction=0.8", "--tp", "2", "--enable-metrics"])
    assert (r["checked"], r["ok"]) == (True, True), r
    assert r["abbreviations"] == {"--max-running": "--max-running-requests", "--mem-fraction": "--mem-fraction-static"}


def test_sglang_refuses_an_unknown_flag():
    r = run(PY_023, [*BASE, "--speculative-budget", "16"])
    assert r.get("failed") is not True  # a refusal is a result; the role asserts on it
    assert (r["checked"], r["ok"]) == (True, False)
    assert r["error"] == "unrecognized arguments: --speculative-budget 16"


@pytest.mark.skipif(not PY_017.exists(), reason=f"{PY_017} is missing (make setup-python)")
def test_ddtree_resolves_where_the_plugin_is_installed():
    r = run(PY_017, [*BASE, "--speculative-algorithm", "DDTREE", "--speculative-num-draft-tokens", "17"])
    assert r["python"] == str(PY_017)
    assert (r["checked"], r["ok"], r["algorithm"], r["algorithm_resolved"], r["reason"]) == (
        True, True, "DDTREE", "DDTREE", "")


@pytest.fixture(scope="module")
def tiny_models() -> Path:
    """The lab's tiny target and DFlash drafter (lab/make_tiny_models.py; built once, then reused)."""
    out = REPO / "lab" / ".build" / "models"
    proc = subprocess.run([str(PY_023), str(REPO / "lab" / "make_tiny_models.py"), str(out)], capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize(
    ("extra", "refusal"),
    [
        ([], None),
        (["--page-size", "16"], "--page-size=16: "),
        (["--speculative-num-draft-tokens", "4"],
         "--speculative-num-draft-tokens=4 (node budget 3) is too small for the drafter's block_size 16"),
    ],
    ids=["accepted", "page-size", "budget-below-half-the-block"],
)
def test_the_plugins_own_start_up_check_runs_on_a_ddtree_command_line(tiny_models, extra, refusal):
    """sglang-ddtree (installed in .venv) checks the words as its server would at start, on the lab's real configs:
    what SGLang's parser accepts and the plugin refuses is refused here, before anything is stopped."""
    words = ["--model-path", str(tiny_models / "Qwen3-tiny"), "--speculative-algorithm", "DDTREE",
             "--speculative-draft-model-path", str(tiny_models / "Qwen3-tiny-DFlash"),
             "--speculative-num-draft-tokens", "17", *extra]
    r = run(PY_023, words, True)
    check = r["startup_check"]
    if refusal is None:
        assert (r["ok"], r["error"], check) == (True, "", {"checked": True, "ok": True, "error": "", "reason": ""})
    else:
        assert (r["ok"], check["checked"], check["ok"]) == (False, True, False)
        assert refusal in check["error"]
        assert r["error"] == f"sglang-ddtree's start-up check refuses it: {check['error']}"


def test_an_sglang_that_does_not_import_is_not_checked(tmp_path):
    broken = tmp_path / "shadow" / "sglang"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('this sglang is broken')\n")
    r = run(PY_023, BASE, pythonpath=[tmp_path / "shadow"])
    assert (r["checked"], r["ok"], r["error"]) == (False, None, "")
    assert r["reason"] == "cannot import SGLang's server args here (ImportError: this sglang is broken)"
    assert "was not asked" in r["msg"]


def test_through_ansible_with_the_interpreter_as_ansible_python_interpreter(tmp_path):
    """The way the role runs it: AnsiballZ ships the module and module_utils in a zip to the interpreter."""
    ansible = REPO / ".venv" / "bin" / "ansible"
    args = json.dumps({"args": [*BASE, "--speculative-algorithm", "DDTREE"]})
    proc = subprocess.run(
        [str(ansible), "localhost", "-c", "local", "-m", "specdec.pivot.sglang_server_args", "-a", args,
         "-e", f"ansible_python_interpreter={PY_023}", "--check"],
        capture_output=True, text=True, timeout=600, cwd=REPO, check=False,
        env={**os.environ, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json",
             "ANSIBLE_LOCAL_TEMP": str(tmp_path)},
    )
    out = json.loads(proc.stdout)
    r = out["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert proc.returncode == 0, (r, proc.stderr[-2000:])
    assert r["python"] == str(PY_023)
    assert (r["changed"], r["checked"], r["ok"], r["algorithm"]) == (False, True, True, "DDTREE")
    assert "warnings" not in r
