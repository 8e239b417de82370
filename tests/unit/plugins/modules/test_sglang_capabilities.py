"""specdec.pivot.sglang_capabilities run for real.

The module file executes as its own process through AnsibleModule (arguments as Ansible passes them) and probes
real interpreters: the project's .venv (the real sglang 0.5.23 from PyPI, with sglang-ddtree installed) and
.venv-sglang-0.5.17, plus a bare venv without sglang. Expected values are computed here, independently of the
module, by asking each interpreter (distribution metadata, sglang's own source of the help string, calling the
sglang-ddtree entry point and reading SGLang's registry).

This machine has no systemd: the ``unit`` tests put tests/unit/fixtures/systemctl_show/systemctl-stand-in on
PATH as ``systemctl``. It replays ``systemctl show`` output recorded from real systemd 252 (record.sh there); the
units' ExecStart name the project's venvs, so the probe still runs the real interpreters.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shutil
import subprocess
import venv
from pathlib import Path

import pytest
from module_runner import COLLECTIONS_ROOT, invoke_module, module_name

REPO = Path(__file__).resolve().parents[4]
SHOW = REPO / "tests" / "unit" / "fixtures" / "systemctl_show"
STAND_IN = SHOW / "systemctl-stand-in"
MODULE = module_name("sglang_capabilities")
PY_023 = REPO / ".venv" / "bin" / "python"
PY_017 = REPO / ".venv-sglang-0.5.17" / "bin" / "python"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"

EXPECT_SCRIPT = r"""
import importlib.metadata as md, json, pathlib, platform, re, sys
out = {"python_version": platform.python_version(), "executable": sys.executable}
try:
    out["sglang"] = md.version("sglang")
except md.PackageNotFoundError:
    out["sglang"] = None
try:
    out["torch"] = md.version("torch")
except md.PackageNotFoundError:
    out["torch"] = None
if out["sglang"]:
    import importlib.util
    root = pathlib.Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
    found = None
    for path in list((root / "srt").glob("server_args.py")) + list((root / "srt" / "arg_groups").rglob("*.py")):
        m = re.search(r"Speculative algorithm\. Builtins: ([A-Z0-9_, ]+)\.", path.read_text(errors="replace"))
        if m:
            found = [n.strip() for n in m.group(1).split(",")]
            break
    out["help_builtins"] = found
    out["v2_worker"] = (root / "srt" / "speculative" / "dflash_worker_v2.py").exists()
    eps = [ep for ep in md.entry_points(group="sglang.srt.plugins") if ep.value.startswith("sglang_ddtree")]
    out["ddtree_entry_point"] = bool(eps)
    out["ddtree_registered"] = False
    if eps:
        try:
            eps[0].load()()
            from sglang.srt.speculative import spec_registry
            out["ddtree_registered"] = spec_registry.get_spec("DDTREE") is not None
        except Exception as exc:
            out["ddtree_error"] = repr(exc)
print("EXPECT:" + json.dumps(out))
"""


def expectations(python: Path, env: dict | None = None) -> dict:
    """What the interpreter itself says, without the module or its probe."""
    proc = subprocess.run(
        [str(python), "-c", EXPECT_SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
        env={**os.environ, **(env or {})},
        check=False,
    )
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("EXPECT:"))
    return json.loads(line[len("EXPECT:") :])


def run_module(
    tmp: Path,
    args: dict,
    *,
    stand_in: bool = True,
    units: bool = True,
    check_mode: bool = False,
    path: str = SYSTEM_PATH,
) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    if stand_in and not (bindir / "systemctl").exists():
        (bindir / "systemctl").symlink_to(STAND_IN)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "SYSTEMCTL_STANDIN", "SGLANG_"))}
    env["PATH"] = f"{bindir}{os.pathsep}{path}" if path else str(bindir)
    env["PYTHONPATH"] = str(COLLECTIONS_ROOT)
    env["SYSTEMCTL_STANDIN_REPO"] = str(REPO)
    env["SYSTEMCTL_STANDIN_LOG"] = str(tmp / "systemctl.log")
    if units:
        unit_dir = tmp / "units"
        unit_dir.mkdir(exist_ok=True)
        for src in (SHOW / "units").glob("*.service"):
            (unit_dir / src.name).write_text(src.read_text().replace("/SPECDEC_REPO", str(REPO)))
        env["SYSTEMCTL_STANDIN_UNITS"] = str(unit_dir)
    result = invoke_module("sglang_capabilities", args, env, check_mode=check_mode, cwd=tmp, timeout=600)
    log = tmp / "systemctl.log"
    result["_systemctl_calls"] = [ln.split("\t") for ln in log.read_text().splitlines()] if log.exists() else []
    return result


def warnings(result: dict) -> list[str]:
    """The warning texts (ansible-core 2.19 reports each as a structured summary with the text in event.msg)."""
    out = []
    for w in result.get("warnings", []):
        out.append(w if isinstance(w, str) else str((w.get("event") or {}).get("msg", w)))
    return out


# ----------------------------------------------------------------------------------------- real interpreters


@pytest.fixture(scope="module")
def caps_023(tmp_path_factory):
    return run_module(tmp_path_factory.mktemp("c023"), {"python": str(PY_023)})


@pytest.fixture(scope="module")
def expect_023():
    return expectations(PY_023)


@pytest.fixture(scope="module")
def caps_017(tmp_path_factory):
    return run_module(tmp_path_factory.mktemp("c017"), {"python": str(PY_017)})


@pytest.fixture(scope="module")
def expect_017():
    return expectations(PY_017)


def test_sglang_023_versions_and_paths(caps_023, expect_023):
    r = caps_023
    assert not r.get("failed"), r
    assert r["changed"] is False
    assert r["sglang"]["installed"] is True and r["sglang"]["error"] is None
    assert r["sglang"]["version"] == expect_023["sglang"] == "0.5.23"
    assert r["python"]["version"] == expect_023["python_version"]
    assert r["python"]["requested"] == str(PY_023) and r["python"]["source"] == "python option"
    assert r["python"]["in_venv"] is True and r["python"]["prefix"] == str(REPO / ".venv")
    assert r["torch_version"] == expect_023["torch"]
    assert r["site_packages"][0].startswith(str(REPO / ".venv" / "lib"))
    assert r["sglang"]["location"].startswith(r["site_packages"][0])
    assert r["msg"].startswith(f"sglang 0.5.23 in {PY_023}: plugin API available, DFLASH worker v2; DDTREE ")


def test_sglang_023_help_lists_the_builtins_of_its_source(caps_023, expect_023):
    r = caps_023
    assert r["help_error"] is None
    assert r["help_form"] == "free_text"
    assert r["help_accepts_registered"] is True
    assert r["help_algorithms"] == expect_023["help_builtins"]
    assert "DFLASH" in r["help_algorithms"] and "EAGLE" in r["help_algorithms"]


def test_sglang_023_registry_plugin_api_and_worker(caps_023, expect_023):
    r = caps_023
    assert r["plugin_api"] == {
        "entry_points": True,
        "register": True,
        "available": True,
        "min_version": "0.5.12",
        "group": "sglang.srt.plugins",
    }
    assert r["dflash_worker"] == "v2" and expect_023["v2_worker"]
    for name in ("DFLASH", "EAGLE", "EAGLE3", "NGRAM", "STANDALONE", "NEXTN"):
        assert name in r["builtin_algorithms"]
    assert r["registered_algorithms"] == r["builtin_algorithms"] + r["plugin_algorithms"]
    # every name the help lists is one SGLang resolves
    assert set(r["help_algorithms"]) <= set(r["registered_algorithms"])


@pytest.mark.parametrize("which", ["023", "017"])
def test_ddtree_registered_iff_its_entry_point_registers(which, request):
    r = request.getfixturevalue(f"caps_{which}")
    e = request.getfixturevalue(f"expect_{which}")
    assert r["ddtree"]["registered"] is e["ddtree_registered"], (r["ddtree"], e)
    assert ("DDTREE" in r["plugin_algorithms"]) is e["ddtree_registered"]
    assert (r["ddtree"]["entry_point"] is not None) is e["ddtree_entry_point"]
    if e["ddtree_entry_point"]:
        ep = r["ddtree"]["entry_point"]
        assert ep["value"] == "sglang_ddtree.sglang:register" and ep["dist"] == "sglang-ddtree"
        assert ep in r["plugins_loaded"]
    assert r["ddtree"]["supported"] is True  # both versions are in every declared range
    assert r["ddtree"]["reason"]


def test_sglang_017(caps_017, expect_017):
    r = caps_017
    assert not r.get("failed"), r
    assert r["sglang"]["version"] == expect_017["sglang"] == "0.5.17"
    assert r["torch_version"] == expect_017["torch"]
    assert r["dflash_worker"] == "v2" and expect_017["v2_worker"]
    assert r["plugin_api"]["available"] is True
    assert "DFLASH" in r["builtin_algorithms"] and "DSPARK" in r["builtin_algorithms"]
    assert "UNO" not in r["builtin_algorithms"]  # added after 0.5.17


@pytest.fixture(scope="module")
def help_017():
    """The help run of the 0.5.17 venv, done here by the test itself."""
    proc = subprocess.run(
        [str(PY_017), "-m", "sglang.launch_server", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
        check=False,
    )
    return proc


def test_sglang_017_help_matches_what_the_interpreter_does(caps_017, expect_017, help_017):
    r = caps_017
    if help_017.returncode == 0:
        assert r["help_error"] is None
        assert r["help_form"] == "free_text"
        assert r["help_algorithms"] == expect_017["help_builtins"]
        assert "DFLASH" in r["help_algorithms"]
    else:  # the venv's minimal install cannot print its help (seen: No module named 'dill'); reported, not failed
        last = [ln for ln in help_017.stderr.splitlines() if ln.strip()][-1].strip()
        assert r["help_algorithms"] is None and r["help_form"] is None
        assert r["help_error"] == f"launch_server --help failed (rc={help_017.returncode}): {last}"


def test_interpreter_without_sglang(tmp_path):
    bare = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(bare)
    r = run_module(tmp_path / "run", {"python": str(bare / "bin" / "python")})
    assert not r.get("failed"), r
    assert r["sglang"] == {"installed": False, "version": None, "location": None, "error": None}
    assert r["python"]["prefix"] == str(bare)
    assert r["help_algorithms"] is None and r["help_error"] is None  # no help run without sglang
    assert r["plugin_api"]["available"] is False
    assert r["dflash_worker"] == "none"
    assert r["ddtree"]["supported"] is False and r["ddtree"]["registered"] is False
    assert r["ddtree"]["reason"] == "sglang is not installed in this interpreter"
    assert r["msg"].startswith(f"sglang is not installed in {bare}")


# ----------------------------------------------------------------------------------------- units (stand-in)


@pytest.fixture(scope="module")
def unit_nextn(tmp_path_factory):
    return run_module(
        tmp_path_factory.mktemp("nextn"),
        {
            "unit": "sglang-nextn.service",
            "help": False,
            "environment": {"SGLANG_PLUGINS": "none"},
            "speculative_flags": {
                "speculative-algorithm": "DDTREE",
                "speculative-draft-model-path": "/root/models/Qwen3.6-27B-DFlash",
                "speculative-num-draft-tokens": 17,
            },
        },
    )


def test_unit_facts_and_exact_exec_start(unit_nextn):
    r = unit_nextn
    assert not r.get("failed"), r
    u = r["unit"]
    assert u["name"] == "sglang-nextn.service"
    assert u["exec_start_source"] == "unit file"
    assert u["fragment_path"].endswith("/units/sglang-nextn.service")
    assert u["user"] == "root" and u["working_directory"] == "/opt/sglang"
    assert u["environment"] == {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    p = r["exec_start_parsed"]
    assert p["interpreter"] == str(PY_023) and p["module"] == "sglang.launch_server"
    assert p["flags"]["--tp-size"] == "2" and p["flags"]["--speculative-algorithm"] == "NEXTN"
    assert u["argv"] == p["argv"]
    assert r["python"]["requested"] == str(PY_023) and r["python"]["source"] == "unit ExecStart"
    assert r["sglang"]["version"] == "0.5.23"
    assert r["help_algorithms"] is None and r["help_form"] is None  # help: false


def test_unit_is_read_with_the_recorded_show_command(unit_nextn):
    (call,) = unit_nextn["_systemctl_calls"]
    assert call[:2] == ["show", "--no-pager"] and call[-2:] == ["--", "sglang-nextn.service"]
    props = [call[i + 1] for i, a in enumerate(call) if a == "-p"]
    assert "ExecStart" in props and "FragmentPath" in props and "User" in props


def test_environment_reaches_the_probe(unit_nextn, expect_023):
    """SGLANG_PLUGINS=none (from the task) makes SGLang's own load_plugins skip the ddtree entry point."""
    r = unit_nextn
    ep = r["ddtree"]["entry_point"]
    if expect_023["ddtree_entry_point"]:
        assert ep["loaded"] is False and "SGLANG_PLUGINS" in ep["error"]
    assert r["ddtree"]["registered"] is False
    assert "DDTREE" not in r["plugin_algorithms"]
    assert r["msg"].endswith(f"DDTREE not registered: {r['ddtree']['reason']}")


def test_exec_start_new(unit_nextn):
    new = unit_nextn["exec_start_new"]
    assert new["removed"] == {
        "--speculative-algorithm": "NEXTN",
        "--speculative-num-steps": "3",
        "--speculative-eagle-topk": "1",
        "--speculative-num-draft-tokens": "4",
    }
    assert new["differs"] is True
    assert new["argv"] == [
        str(PY_023), "-m", "sglang.launch_server", "--model-path", "/models/Qwen3.6-27B", "--tp-size", "2",
        "--mem-fraction-static", "0.85", "--context-length", "32768", "--host", "0.0.0.0", "--port", "30000",
        "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "/root/models/Qwen3.6-27B-DFlash",
        "--speculative-num-draft-tokens", "17",
    ]  # fmt: skip
    assert new["value"] == " ".join(new["argv"])
    assert new["server_args"] == new["argv"][3:]  # what SGLang's own parser is given (after python -m X)
    assert new["multiline"].splitlines()[0] == f"{PY_023} -m sglang.launch_server \\"
    assert "    --speculative-algorithm DDTREE \\" in new["multiline"].splitlines()


@pytest.fixture(scope="module")
def unit_env(tmp_path_factory):
    return run_module(tmp_path_factory.mktemp("env"), {"unit": "sglang-env.service", "help": False}, check_mode=True)


def test_env_launcher_unit_in_check_mode(unit_env):
    r = unit_env
    assert not r.get("failed"), r
    assert r["changed"] is False
    p = r["exec_start_parsed"]
    assert p["launcher"] == ["/usr/bin/env", "SGLANG_PLUGINS=ddtree"] and p["program"] == "python3"
    # python3 found on the unit's PATH (Environment=PATH=<repo>/.venv/bin:...)
    assert r["python"]["requested"] == str(REPO / ".venv" / "bin" / "python3")
    e = expectations(PY_023, {"SGLANG_PLUGINS": "ddtree"})
    assert r["ddtree"]["registered"] is e["ddtree_registered"]
    assert r["sglang"]["version"] == "0.5.23"


def test_console_script_unit_uses_its_shebang(tmp_path):
    r = run_module(tmp_path, {"unit": "sglang-console.service", "help": False})
    assert not r.get("failed"), r
    script = REPO / ".venv" / "bin" / "sglang"
    shebang = script.read_text().splitlines()[0][2:].strip()
    assert r["python"]["requested"] == shebang
    assert r["python"]["source"] == f"#! line of {script}"
    assert r["exec_start_parsed"]["kind"] == "command" and r["exec_start_parsed"]["args"] == ["serve"]
    assert r["sglang"]["installed"] is True


def test_unit_without_readable_file_falls_back_to_show(tmp_path):
    r = run_module(tmp_path, {"unit": "sglang-0517.service", "help": False}, units=False)
    assert not r.get("failed"), r
    assert r["unit"]["exec_start_source"] == "systemctl show"
    assert any("read from systemctl show" in w for w in warnings(r))
    assert r["exec_start_parsed"]["source"] == "systemctl_show"
    assert r["python"]["requested"] == str(PY_017)
    assert r["sglang"]["version"] == "0.5.17"
    assert r["dflash_worker"] == "v2"


def test_unit_whose_program_is_not_python(tmp_path):
    r = run_module(tmp_path, {"unit": "sglang-twice.service"})
    assert r["failed"] is True
    assert r["msg"] == (
        "unit=sglang-twice.service: ExecStart runs /usr/bin/true, which is not a Python interpreter and names none "
        "in its #! line; give the interpreter with unit_python=<path> (role specdec.pivot.sglang_preflight: "
        "sglang_preflight_python)"
    )
    assert any("has 2 ExecStart commands; only the first one is used" in w for w in warnings(r))


def test_unit_user_is_used_for_the_probe(tmp_path):
    """sglang-quoting runs as User=nobody: as root the probe runs as nobody (setpriv), else a warning says not."""
    r = run_module(tmp_path, {"unit": "sglang-quoting.service", "help": False})
    assert not r.get("failed"), r
    assert r["unit"]["user"] == "nobody" and r["unit"]["environment"]["HF_HOME"] == "/data/hf cache"
    assert r["exec_start_parsed"]["flags"]["--model-path"] == "/models/Qwen3 8B"
    assert any("WorkingDirectory /opt/sglang-missing does not exist" in w for w in warnings(r))
    if os.geteuid() == 0 and shutil.which("setpriv", path=SYSTEM_PATH):
        assert r["python"]["run_as"] == "nobody"
    else:
        assert any("not as the unit's User=nobody" in w for w in warnings(r))


# ----------------------------------------------------------------------------------------- bad input


def fake_python(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fake" / "python"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"python": "/nonexistent/bin/python"}, "python=/nonexistent/bin/python does not exist; set python to"),
        ({}, "one of the following is required: python, unit"),
        ({"python": "/usr/bin/python3", "unit": "x.service"}, "parameters are mutually exclusive: python|unit"),
        (
            {"unit": "sglang-missing.service"},
            "unit=sglang-missing.service: systemd unit 'sglang-missing.service' not found",
        ),
        ({"unit": "--all"}, "unit='--all' is not a unit name"),
        ({"python": "/usr/bin/python3", "timeout": 0}, "timeout=0 must be a positive number of seconds"),
        ({"python": "/usr/bin/python3", "speculative_flags": {"a": 1}}, "speculative_flags needs unit=<name>"),
    ],
)
def test_bad_input_is_named(tmp_path, args, message):
    r = run_module(tmp_path, args)
    assert r["failed"] is True
    assert message in r["msg"], r["msg"]


def test_not_executable(tmp_path):
    plain = tmp_path / "python"
    plain.write_text("not a program")
    plain.chmod(0o644)
    r = run_module(tmp_path / "run", {"python": str(plain)})
    assert r["failed"] is True
    assert r["msg"] == f"python={plain} is not an executable file; point it at the interpreter itself"


def test_no_systemctl_on_the_host(tmp_path):
    r = run_module(tmp_path, {"unit": "sglang-nextn.service"}, stand_in=False, path="")
    assert r["failed"] is True
    assert "unit=sglang-nextn.service: systemctl is not on this host's PATH" in r["msg"]
    assert "python=<path> instead of unit" in r["msg"]


def test_the_real_systemctl_of_this_host(tmp_path):
    """No stand-in: the host's own systemctl. On a machine not booted with systemd (this one, CI) it fails and
    the module says so; where systemd runs, the unit is simply not there."""
    if not shutil.which("systemctl", path=SYSTEM_PATH):
        pytest.fail("expected a systemctl binary on this machine (Debian's systemd package)")
    r = run_module(tmp_path, {"unit": "specdec-no-such-unit.service"}, stand_in=False)
    assert r["failed"] is True
    if os.path.isdir("/run/systemd/system"):
        assert "systemd unit 'specdec-no-such-unit.service' not found" in r["msg"]
    else:
        assert r["msg"].startswith("unit=specdec-no-such-unit.service: systemctl show failed (rc=1): ")
        assert "not been booted with systemd" in r["msg"]


def test_not_a_python(tmp_path):
    r = run_module(tmp_path, {"python": str(fake_python(tmp_path, "echo hello; exit 3"))})
    assert r["failed"] is True
    assert "did not run the probe (rc=3): hello; is it a Python 3.8+ interpreter?" in r["msg"]


def test_probe_timeout(tmp_path):
    r = run_module(tmp_path, {"python": str(fake_python(tmp_path, "sleep 30")), "timeout": 1})
    assert r["failed"] is True
    assert "took longer than timeout=1 s; raise timeout" in r["msg"]


def test_documentation_matches_the_argument_spec():
    spec = importlib.util.find_spec(MODULE)
    src = Path(spec.origin).read_text()
    import yaml

    doc = yaml.safe_load(re.search(r'DOCUMENTATION = r"""(.*?)"""', src, re.S).group(1))
    from ansible_collections.specdec.pivot.plugins.modules import sglang_capabilities as mod

    assert set(doc["options"]) == set(mod.ARGUMENT_SPEC)
    for name, opt in mod.ARGUMENT_SPEC.items():
        assert doc["options"][name]["type"] == opt["type"], name
        assert doc["options"][name].get("default") == opt.get("default"), name


def test_unit_python_overrides_the_resolution_and_keeps_the_unit(tmp_path):
    """Issue 16, point 2: where the module cannot resolve a wrapper (poetry run with an outside virtualenv), the
    interpreter is given with unit_python; the unit's ExecStart is still read and rewritten."""
    r = run_module(tmp_path, {"unit": "sglang-nextn.service", "unit_python": str(PY_017), "help": False})
    assert not r.get("failed"), r
    assert r["python"]["requested"] == str(PY_017) and r["python"]["source"] == "unit_python option"
    assert r["sglang"]["version"] == "0.5.17"
    assert r["exec_start_parsed"]["module"] == "sglang.launch_server"
    missing = run_module(tmp_path / "m", {"unit": "sglang-nextn.service", "unit_python": "/no/such/python"})
    assert missing["failed"] and "unit_python=/no/such/python is not an executable file" in missing["msg"]


# ------------------------------------------------------------------------------ plugin_checks: one import of SGLang
DRAFTER = REPO / "tests" / "unit" / "fixtures" / "models" / "qwen3-8b-dflash-b16"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The plugin wheel the pivot builds (roles/ddtree_plugin/files/build_wheel.py), in a temporary directory."""
    out = subprocess.run(
        [str(PY_023), str(REPO / "roles/ddtree_plugin/files/build_wheel.py"), str(REPO / "sglang-ddtree"),
         str(tmp_path_factory.mktemp("wheel"))],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    return Path(json.loads(out)["wheel"])


def plugin_cli(python: Path, wheel: Path, *args: str) -> tuple[int, dict]:
    """``PYTHONPATH=WHEEL python -m sglang_ddtree ARGS``, as preflight ran the plugin's checks before they were folded
    into the probe: its exit status and its JSON report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "SGLANG_"))}
    env["PYTHONPATH"] = str(wheel)
    proc = subprocess.run([str(python), "-m", "sglang_ddtree", *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd="/", check=False)  # fmt: skip
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.parametrize("python", [PY_017, PY_023], ids=["0.5.17", "0.5.23"])
def test_plugin_checks_in_the_probe_say_what_the_plugins_cli_says(tmp_path, wheel, python):
    """check-drafter and check-sglang run inside the probe (SGLang imported once) give the CLI's exit status and
    report, with the wheel first on the path as PYTHONPATH=WHEEL put it."""
    checks = {"wheel": str(wheel), "drafter": str(DRAFTER), "check_sglang": True, "budget": 16}
    r = run_module(tmp_path, {"python": str(python), "help": False, "plugin_checks": checks,
                              "environment": {"SGLANG_DDTREE_BUDGET": "auto"}})
    assert not r.get("failed"), r["msg"]
    checks = r["plugin_checks"]
    # the per-step budget variable, parsed by the plugin with the drafter's block size (8: the chain fits in 17)
    assert checks["budget"] == {"checked": True, "ok": True, "value": "auto", "candidates": [0, 4, 8, 16],
                                "error": "", "reason": ""}, checks["budget"]
    for name, args in (("drafter", ["check-drafter", str(DRAFTER), "--consumer", "sglang"]),
                       ("sglang", ["check-sglang", "--expect", "any"])):  # fmt: skip
        rc, report = plugin_cli(python, wheel, *args)
        assert checks[name]["rc"] == rc, (name, checks[name])
        assert json.loads(checks[name]["stdout"]) == report, name
    assert checks["wheel"] == {"path": str(wheel), "version": r["ddtree"]["wheel"]["version"]}
    sglang = json.loads(checks["sglang"]["stdout"])
    assert sglang["implementation"] == "plugin" and sglang["plugin_status"] == "registered"
    # what is installed is read before the wheel goes on the path; the registration is the wheel's
    assert r["ddtree"]["registered"] is True
    assert r["ddtree"]["reason"].startswith("DDTREE registers with the plugin wheel")


def test_the_wheels_bytes_in_the_arguments_are_checked_as_the_wheel_and_left_nowhere(tmp_path, wheel):
    """plugin_checks.wheel_base64 (what preflight passes: no copy task): the module writes the bytes to a temporary
    directory of its own (specdec-pivot-preflight.*), checks them as plugin_checks.wheel would, and removes it."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    checks = {"wheel_base64": base64.b64encode(wheel.read_bytes()).decode(), "wheel_name": wheel.name,
              "check_sglang": True}
    env_before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmpdir)
    try:
        r = run_module(tmp_path, {"python": str(PY_023), "help": False, "plugin_checks": checks})
    finally:
        if env_before is None:
            os.environ.pop("TMPDIR")
        else:
            os.environ["TMPDIR"] = env_before
    assert not r.get("failed"), r["msg"]
    seen = r["plugin_checks"]["wheel"]
    assert Path(seen["path"]).name == wheel.name and Path(seen["path"]).parent.name.startswith(
        "specdec-pivot-preflight.") and Path(seen["path"]).parent.parent == tmpdir, seen
    assert json.loads(r["plugin_checks"]["sglang"]["stdout"])["implementation"] == "plugin"
    assert list(tmpdir.iterdir()) == [], "the temporary copy is removed before the module returns"
    assert checks["wheel_base64"][:64] not in json.dumps(r), "the bytes are not echoed back"
    bad = run_module(tmp_path / "bad", {"python": str(PY_023), "help": False,
                                        "plugin_checks": {"wheel_base64": "not base64!", "wheel_name": wheel.name}})
    assert bad["failed"] and "is not base64" in bad["msg"]
    name = run_module(tmp_path / "name", {"python": str(PY_023), "help": False,
                                          "plugin_checks": {"wheel_base64": "AAAA", "wheel_name": "../x.whl"}})
    assert name["failed"] and "is not a wheel file name" in name["msg"]


def test_plugin_checks_server_args_with_the_wheel_visible(tmp_path, wheel):
    """SGLang's parser on the new command line, in the probe: DDTREE resolves (the wheel is on the path), an unknown
    flag is refused with argparse's message, a command line with % is not checked."""
    base = {"unit": "sglang-nextn.service", "help": False,
            "speculative_flags": {"speculative-algorithm": "DDTREE", "speculative-num-draft-tokens": 17,
                                  "speculative-draft-model-path": str(DRAFTER)}}  # fmt: skip
    checks = {"wheel": str(wheel), "server_args": True}
    ok = run_module(tmp_path / "ok", {**base, "plugin_checks": checks})["plugin_checks"]["server_args"]
    assert ok["checked"] is True and ok["ok"] is True and ok["error"] == "", ok
    assert ok["algorithm"] == "DDTREE" and ok["algorithm_resolved"] == "DDTREE", ok
    bad = run_module(tmp_path / "bad", {**base, "extra_args": ["--no-such-flag", "1"], "plugin_checks": checks})
    verdict = bad["plugin_checks"]["server_args"]
    assert verdict["checked"] is True and verdict["ok"] is False
    assert verdict["error"] == "unrecognized arguments: --no-such-flag 1", verdict
    pct = run_module(tmp_path / "pct", {**base, "extra_args": ["--served-model-name", "a%nb"], "plugin_checks": checks})
    assert pct["plugin_checks"]["server_args"]["checked"] is False
    assert "$VAR or %" in pct["plugin_checks"]["server_args"]["reason"]
    assert "sglang" not in pct["plugin_checks"] and "drafter" not in pct["plugin_checks"]  # not asked for


def test_the_names_set_outside_environment_lines_are_reported(tmp_path, unit_env, unit_nextn):
    """EnvironmentFile= and env words of ExecStart override the unit's Environment= lines: the result names what
    they set (names only), so that the role can refuse to write a variable they would override."""
    from ansible_collections.specdec.pivot.plugins.modules import sglang_capabilities as mod

    assert unit_env["unit"]["exec_env_names"] == ["SGLANG_PLUGINS"]
    assert unit_nextn["unit"]["exec_env_names"] == [] and unit_nextn["unit"]["environment_file_names"] == []
    (tmp_path / "env").write_text("# note\nSGLANG_DDTREE_BUDGET=4\nexport HF_TOKEN='secret value'\n")
    warned = []
    info = {"name": "u.service", "environment": {"A": "1", "SGLANG_DDTREE_BUDGET": "auto"},
            "environment_files": [{"path": str(tmp_path / "env"), "ignore_errors": False},
                                  {"path": str(tmp_path / "missing"), "ignore_errors": True}]}
    env = mod.unit_environment(type("M", (), {"warn": lambda self, m: warned.append(m)})(), info)
    assert env == {"A": "1", "SGLANG_DDTREE_BUDGET": "4", "HF_TOKEN": "secret value"}  # the file wins
    assert info["environment_file_names"] == ["HF_TOKEN", "SGLANG_DDTREE_BUDGET"] and warned == []
