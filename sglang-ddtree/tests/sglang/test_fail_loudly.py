"""Issue 14, fail loudly and native DDTREE: a registration failure is one clear log line; the check command
(``python -m sglang_ddtree check-sglang``) exits non-zero when DDTREE is not available after SGLang's
``load_plugins()``; a native DDTREE (enum member or registry entry of SGLang's own) makes the plugin step aside
with one line, and the check command reports which implementation a server would run."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest


def _ours(caplog):
    return [r for r in caplog.records if r.name.startswith("sglang_ddtree")]


def _boom(*args, **kwargs):
    raise RuntimeError("registry exploded\nsecond line of the message")


def test_registration_failure_is_one_self_explanatory_first_line(monkeypatch, caplog):
    from sglang.srt.speculative import spec_registry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    import sglang_ddtree.sglang as plugin

    monkeypatch.setattr(plugin, "last_status", plugin.last_status)  # restored after the test
    monkeypatch.setattr(spec_registry, "_REGISTRY", {})
    monkeypatch.setattr(SpeculativeAlgorithm, "register", classmethod(_boom), raising=False)
    with caplog.at_level(logging.INFO, logger="sglang_ddtree"):
        plugin.register()  # never raises
    records = _ours(caplog)
    assert len(records) == 1 and records[0].levelno == logging.ERROR
    message = records[0].getMessage()
    assert "\n" not in message  # the first line of the log entry is the whole message
    assert message.startswith("sglang-ddtree: DDTREE NOT REGISTERED: register() raised RuntimeError: registry exploded")
    assert "second line of the message" in message  # flattened, not cut
    assert "DDTREE will be rejected as unknown" in message
    assert records[0].exc_info is not None  # the traceback follows the line
    assert plugin.last_status == "failed: RuntimeError: registry exploded second line of the message"


def test_check_command_exits_non_zero_when_registration_failed(plugins_loaded, monkeypatch, capsys):
    """load_plugins() ran (idempotent: it does not run again), register() failed, DDTREE does not resolve."""
    from sglang.srt.speculative import spec_registry

    import sglang_ddtree.sglang as plugin
    from sglang_ddtree.cli import main

    monkeypatch.setattr(spec_registry, "_REGISTRY", {})
    monkeypatch.setattr(plugin, "last_status", "failed: RuntimeError: registry exploded")
    assert main(["check-sglang"]) == 1
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["ok"] is False and report["implementation"] is None
    assert report["problem"] == "DDTREE is not registered: failed: RuntimeError: registry exploded"
    assert err.strip().splitlines()[-1] == "sglang-ddtree: " + report["problem"]


def test_check_command_reports_the_plugin(plugins_loaded, capsys):
    import sglang_ddtree.sglang as plugin
    from sglang_ddtree.cli import main

    assert main(["check-sglang", "--expect", "plugin"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["implementation"] == "plugin" and report["problem"] is None
    assert report["detail"] == "sglang_ddtree.sglang.spec_algo.DDTreeSpecAlgo"
    assert report["plugin_status"] == plugin.last_status  # (another test may have left a monkeypatched failure)
    assert report["hooks"] and all(report["hooks"].values())
    assert main(["check-sglang", "--expect", "native"]) == 1


def test_check_command_fails_when_a_hook_is_missing(plugins_loaded, monkeypatch):
    import sglang_ddtree.sglang as plugin
    from sglang_ddtree.sglang import hooks

    monkeypatch.setattr(plugin, "_applied_hooks", lambda: {"a.b.c": True, "x.y.z": False})
    monkeypatch.setattr(hooks, "_target_importable", lambda target: None)  # it imports, yet it is not wrapped
    status, report = plugin.check_sglang()
    assert status == 1 and report["implementation"] == "plugin"
    assert report["problem"] == "DDTREE is registered but hooks are not applied: ['x.y.z']"
    assert "undecided" not in report


def test_check_command_says_when_a_hook_cannot_be_decided_on_this_host(plugins_loaded, monkeypatch):
    """A hook target that does not import here (a CUDA-graph module on a host without a GPU) is not a failure of
    the check: it says so in plain words; a missing hook whose target imports still fails."""
    import sglang_ddtree.sglang as plugin
    from sglang_ddtree.sglang import hooks

    monkeypatch.setattr(plugin, "_applied_hooks", lambda: {"a.b.c": True, "x.y.z": False})
    monkeypatch.setattr(hooks, "_target_importable", lambda target: "ImportError: libcuda.so.1: cannot open")
    status, report = plugin.check_sglang()
    assert status == 0 and report["ok"] is True and report["problem"] is None
    assert report["undecided"].startswith("cannot be decided on this host: the hook targets ['x.y.z'] do not")
    assert "libcuda.so.1" in report["undecided"]


# --- a native DDTREE: the plugin steps aside --------------------------------------------------------------


@pytest.fixture
def fresh_registry(plugins_loaded, monkeypatch):
    """An empty algorithm registry and a HookRegistry that records instead of registering."""
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.speculative import spec_registry

    import sglang_ddtree.sglang as plugin

    monkeypatch.setattr(plugin, "last_status", plugin.last_status)  # restored after the test
    monkeypatch.setattr(spec_registry, "_REGISTRY", {})
    hooks = []
    monkeypatch.setattr(HookRegistry, "register", classmethod(lambda cls, target, *a, **k: hooks.append(target)))
    return hooks


def _fake_enum_member(monkeypatch):
    """Make SpeculativeAlgorithm look like a release that ships a built-in DDTREE (an enum member)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    monkeypatch.setitem(SpeculativeAlgorithm._member_map_, "DDTREE", SpeculativeAlgorithm.DFLASH)
    assert "DDTREE" in SpeculativeAlgorithm.__members__
    return SpeculativeAlgorithm.DFLASH


def _fake_registry_entry(monkeypatch):
    """A built-in registry entry under DDTREE that is not the plugin's spec class."""
    from sglang.srt.speculative import spec_registry
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    native = CustomSpecAlgo("DDTREE", lambda server_args: object, supports_overlap=True)
    monkeypatch.setitem(spec_registry._REGISTRY, "DDTREE", native)
    return native


@pytest.mark.parametrize("make_native", [_fake_enum_member, _fake_registry_entry], ids=["enum", "registry"])
def test_plugin_steps_aside_for_a_native_ddtree(fresh_registry, monkeypatch, caplog, make_native):
    from sglang.srt.speculative import spec_registry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    import sglang_ddtree.sglang as plugin

    native = make_native(monkeypatch)
    before = dict(spec_registry._REGISTRY)
    with caplog.at_level(logging.INFO, logger="sglang_ddtree"):
        plugin.register()
    records = _ours(caplog)
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    message = records[0].getMessage()
    assert "ships a native DDTREE" in message and "steps aside" in message and "\n" not in message
    assert plugin.last_status.startswith("native: ")
    assert spec_registry._REGISTRY == before  # nothing registered
    assert fresh_registry == []  # and no hooks: they would act on the native algorithm's name
    assert SpeculativeAlgorithm.from_string("DDTREE") is native

    report = plugin.ddtree_implementation()
    assert report["implementation"] == "native" and report["plugin_status"].startswith("native: ")
    status, checked = plugin.check_sglang("any")
    assert status == 0 and checked["implementation"] == "native" and "hooks" not in checked
    assert plugin.check_sglang("native")[0] == 0
    status, checked = plugin.check_sglang("plugin")
    assert status == 1 and checked["problem"] == "DDTREE resolves to the native implementation, expected plugin"


def test_native_check_runs_before_the_version_check(fresh_registry, monkeypatch, caplog):
    """A newer release outside the supported range that ships DDTREE natively: the log says native, not
    'unsupported version'."""
    import sglang_ddtree.sglang as plugin

    _fake_enum_member(monkeypatch)
    monkeypatch.setattr(plugin, "installed_sglang_version", lambda: "0.6.0")
    with caplog.at_level(logging.INFO, logger="sglang_ddtree"):
        plugin.register()
    records = _ours(caplog)
    assert len(records) == 1 and "sglang 0.6.0 ships a native DDTREE" in records[0].getMessage()


def test_plugins_own_registration_is_not_native(plugins_loaded):
    import sglang_ddtree.sglang as plugin

    assert plugin.native_ddtree() is None
    assert plugin.ddtree_implementation()["implementation"] == "plugin"


def _run_check(env_extra: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra}
    return subprocess.run(
        [sys.executable, "-m", "sglang_ddtree", "check-sglang"],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )


def test_check_command_in_a_fresh_interpreter_when_the_plugin_is_excluded():
    """End to end: SGLang's load_plugins() skips the plugin (SGLANG_PLUGINS), the command exits 1 and says why."""
    proc = _run_check({"SGLANG_PLUGINS": "some_other_plugin"})
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["implementation"] is None and report["plugin_status"] is None
    assert "SGLANG_PLUGINS" in report["problem"]
    assert f"sglang-ddtree: {report['problem']}" in proc.stderr


_FAILING_REGISTRATION = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

def boom(cls, *args, **kwargs):
    raise RuntimeError("registry exploded")

SpeculativeAlgorithm.register = classmethod(boom)
from sglang.srt.plugins import load_plugins

load_plugins()  # SGLang's own plugin loading, as in every server process
from sglang_ddtree.sglang import check_sglang

status, report = check_sglang()
print(status, report["problem"])
"""


def test_a_registration_failure_under_sglangs_load_plugins_is_one_line_then_the_traceback():
    proc = subprocess.run(
        [sys.executable, "-c", _FAILING_REGISTRATION], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    ours = [n for n, line in enumerate(lines) if "DDTREE NOT REGISTERED" in line]
    assert len(ours) == 1, proc.stderr
    assert lines[ours[0]] == (
        "ERROR sglang_ddtree: sglang-ddtree: DDTREE NOT REGISTERED: register() raised RuntimeError: registry "
        "exploded; --speculative-algorithm DDTREE will be rejected as unknown, other algorithms are unaffected "
        "(traceback follows)"
    )
    assert lines[ours[0] + 1] == "Traceback (most recent call last):"
    assert proc.stdout.strip() == "1 DDTREE is not registered: failed: RuntimeError: registry exploded"
