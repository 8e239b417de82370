"""Tables for check_server_args (behind specdec.pivot.sglang_server_args) with a stand-in for SGLang's parser.

The stand-in's ``add_cli_args`` declares a few of ServerArgs' options the way SGLang does (argparse, typed); the
real SGLang is asked in tests/unit/plugins/modules/test_sglang_server_args.py.
"""

from __future__ import annotations

import argparse

import pytest
from ansible_collections.specdec.pivot.plugins.module_utils import _server_args as sa
from ansible_collections.specdec.pivot.plugins.module_utils._sglang_probe import parse_probe_output

REGISTERED = {"EAGLE": "EAGLE", "NEXTN": "EAGLE", "DFLASH": "DFLASH"}  # NEXTN is an alias of EAGLE in SGLang


class StandInServerArgs:
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        print("SGLang prints things while it sets up")  # must not reach the module's stdout
        parser.add_argument("--model-path", type=str, required=True)
        parser.add_argument("--port", type=int, default=30000)
        parser.add_argument("--speculative-algorithm", type=str)
        parser.add_argument("--speculative-num-draft-tokens", type=int)
        parser.add_argument("--enable-metrics", action="store_true")


class StandInHooks(sa.SGLangHooks):
    def __init__(self, registered=None, fail_import: Exception | None = None, fail_plugins: Exception | None = None,
                 startup: Exception | None = None):
        self.registered = REGISTERED if registered is None else registered
        self.fail_import, self.fail_plugins, self.startup = fail_import, fail_plugins, startup
        self.startup_seen: list = []

    def load_plugins(self) -> None:
        print("plugin loaded")
        if self.fail_plugins:
            raise self.fail_plugins

    def server_args_class(self):
        if self.fail_import:
            raise self.fail_import
        return StandInServerArgs

    def resolve_algorithm(self, name: str) -> str:
        if name not in self.registered:
            raise ValueError(f"Unknown speculative algorithm name: {name}")
        return self.registered[name]

    def ddtree_startup_check(self, args: argparse.Namespace) -> None:
        self.startup_seen.append(args)
        args.speculative_num_draft_tokens = 99  # the plugin completes the args it is given: never the caller's
        if self.startup:
            raise self.startup


BASE = ["--model-path", "/models/t"]


@pytest.mark.parametrize(
    ("words", "hooks", "expected"),
    [
        (BASE, {}, {"checked": True, "ok": True, "algorithm": None, "algorithm_resolved": None}),
        (
            [*BASE, "--speculative-algorithm", "NEXTN", "--enable-metrics", "--port", 30001],  # an int word
            {},
            {"checked": True, "ok": True, "algorithm": "NEXTN", "algorithm_resolved": "EAGLE", "reason": ""},
        ),
        (
            [*BASE, "--speculative-algorithm", "DDTREE"],  # before the plugin is installed: reported, not refused
            {},
            {"ok": True, "algorithm": "DDTREE", "algorithm_resolved": None,
             "reason": "--speculative-algorithm DDTREE does not resolve here yet "
                       "(Unknown speculative algorithm name: DDTREE)"},
        ),
        (
            [*BASE, "--speculative-algorithm", "DDTREE"],
            {"registered": {**REGISTERED, "DDTREE": "DDTREE"}},
            {"ok": True, "algorithm_resolved": "DDTREE", "reason": ""},
        ),
        (
            [*BASE, "--speculative-budget", "16"],
            {},
            {"checked": True, "ok": False, "error": "unrecognized arguments: --speculative-budget 16"},
        ),
        (
            [*BASE, "--port", "http"],
            {},
            {"ok": False, "error": "argument --port: invalid int value: 'http'"},
        ),
        (
            [*BASE, "--speculative-num-draft-tokens"],
            {},
            {"ok": False, "error": "argument --speculative-num-draft-tokens: expected one argument"},
        ),
        (["--port", "1"], {}, {"ok": False, "error": "the following arguments are required: --model-path"}),
        (
            BASE,
            {"fail_import": ModuleNotFoundError("No module named 'sglang'")},
            {"checked": False, "ok": None, "error": "",
             "reason": "cannot import SGLang's server args here (ModuleNotFoundError: No module named 'sglang')"},
        ),
        (
            BASE,
            {"fail_plugins": RuntimeError("plugin boom")},  # a plugin that breaks SGLang's import: not guessed
            {"checked": False, "ok": None,
             "reason": "cannot import SGLang's server args here (RuntimeError: plugin boom)"},
        ),
    ],
    ids=["plain", "alias-resolves", "unregistered", "registered", "unknown-flag", "bad-int", "missing-value",
         "missing-required", "no-sglang", "plugin-fails"],
)
def test_check_server_args(capsys, words, hooks, expected):
    out = sa.check_server_args(words, StandInHooks(**hooks))
    assert set(out) == {"checked", "ok", "error", "reason", "algorithm", "algorithm_resolved", "startup_check",
                        "abbreviations"}
    assert {k: out[k] for k in expected} == expected
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "")  # SGLang's noise is swallowed


OPTIONS = ["--model-path", "--port", "--speculative-algorithm", "--speculative-num-draft-tokens", "--enable-metrics",
           "--tp-size", "--tensor-parallel-size", "--max-running-requests", "--max-prefill-tokens"]


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["--port", "30000", "--enable-metrics"], {}),
        (["--max-running", "8"], {"--max-running": "--max-running-requests"}),
        (["--po=30001", "--enable-m"], {"--po": "--port", "--enable-m": "--enable-metrics"}),
        (["--max", "8"], {}),  # two options start so: argparse refuses it as ambiguous, not an abbreviation
        (["--tp", "2"], {}),  # the short form SGLang documents, read by the pivot as --tp-size
        (["--model-path", "/m", "--", "--po", "1"], {}),  # after --: not flags
        (["-p", "1"], {}),  # a single dash: not argparse's long-option abbreviation
    ],
    ids=["full-names", "abbreviated", "equals-and-switch", "ambiguous", "tp", "after-double-dash", "single-dash"],
)
def test_abbreviations(words, expected):
    assert sa.abbreviations(words, OPTIONS) == expected


def test_the_parser_reports_the_abbreviations_it_accepted():
    out = sa.check_server_args([*BASE, "--po", "30001", "--enable-met"], StandInHooks())
    assert (out["ok"], out["abbreviations"]) == (True, {"--po": "--port", "--enable-met": "--enable-metrics"})
    refused = sa.check_server_args([*BASE, "--po", "http"], StandInHooks())
    assert (refused["ok"], refused["abbreviations"]) == (False, {})


@pytest.fixture
def model_dirs(tmp_path) -> list[str]:
    """The words' --model-path and --speculative-draft-model-path as directories of this host."""
    target, drafter = tmp_path / "target", tmp_path / "drafter"
    target.mkdir()
    drafter.mkdir()
    return ["--model-path", str(target), "--speculative-algorithm", "DDTREE",
            "--speculative-draft-model-path", str(drafter)]


DDTREE_REGISTERED = {**REGISTERED, "DDTREE": "DDTREE"}


class StandInDrafterArgs(StandInServerArgs):
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        StandInServerArgs.add_cli_args(parser)
        parser.add_argument("--speculative-draft-model-path", type=str)
        parser.add_argument("--device", type=str)


class DrafterHooks(StandInHooks):
    def server_args_class(self):
        return StandInDrafterArgs


@pytest.mark.parametrize(
    ("startup", "expected"),
    [
        (None, {"checked": True, "ok": True, "error": "", "reason": ""}),
        (sa.Refused("--page-size=16: the tree verify writes one slot per node; pass --page-size 1"),
         {"checked": True, "ok": False, "error": "--page-size=16: the tree verify writes one slot per node; pass "
                                                 "--page-size 1", "reason": ""}),
        (ImportError("cannot import name 'handle_ddtree_server_args'"),
         {"checked": False, "ok": None, "error": "",
          "reason": "the check did not run here (ImportError: cannot import name 'handle_ddtree_server_args')"}),
        (ImportError("\nAutoImageProcessor requires the Torchvision library\nbut it was not found\n"),
         {"checked": False, "ok": None, "error": "",  # one line: the report's Markdown prints it
          "reason": "the check did not run here (ImportError: AutoImageProcessor requires the Torchvision library "
                    "but it was not found)"}),
        (RuntimeError("no CUDA here"),
         {"checked": False, "ok": None, "error": "",
          "reason": "the check did not run here (RuntimeError: no CUDA here)"}),
    ],
    ids=["passes", "refused", "no-check-in-this-plugin", "partial-sglang", "check-breaks"],
)
def test_a_ddtree_command_line_goes_through_the_plugins_own_start_up_check(model_dirs, startup, expected):
    hooks = DrafterHooks(registered=DDTREE_REGISTERED, startup=startup)
    out = sa.check_server_args([*model_dirs, "--speculative-num-draft-tokens", "17"], hooks)
    assert out["startup_check"] == expected
    refused = expected["ok"] is False
    assert (out["checked"], out["ok"]) == (True, not refused)
    assert out["error"] == (f"sglang-ddtree's start-up check refuses it: {expected['error']}" if refused else "")
    (seen,) = hooks.startup_seen
    assert seen.device == "cuda"  # unset: SGLang's choice on a GPU host
    assert seen.speculative_draft_model_path == model_dirs[-1]


def test_the_start_up_check_keeps_an_explicit_device_and_runs_for_ddtree_only(model_dirs):
    hooks = DrafterHooks(registered=DDTREE_REGISTERED)
    assert sa.check_server_args([*model_dirs, "--device", "cpu"], hooks)["startup_check"]["ok"] is True
    assert hooks.startup_seen[0].device == "cpu"  # the plugin refuses it itself (CUDA only)
    nextn = [w if w != "DDTREE" else "NEXTN" for w in model_dirs]
    assert sa.check_server_args(nextn, hooks)["startup_check"] is None
    assert len(hooks.startup_seen) == 1


@pytest.mark.parametrize("which", ["--model-path", "--speculative-draft-model-path"])
def test_a_model_path_that_is_not_a_directory_here_is_left_to_the_server(model_dirs, which):
    words = list(model_dirs)
    words[words.index(which) + 1] = "z-lab/Qwen3-8B-DFlash-b16"
    hooks = DrafterHooks(registered=DDTREE_REGISTERED)
    out = sa.check_server_args(words, hooks)
    assert (out["ok"], out["startup_check"]["checked"], out["startup_check"]["ok"]) == (True, False, None)
    assert out["startup_check"]["reason"] == (
        f"{which} z-lab/Qwen3-8B-DFlash-b16 is not a directory on this host (a hub id is fetched by the server at "
        "start, which runs this check then)")
    assert hooks.startup_seen == []


def test_sglang_without_the_plugin_api_still_parses(monkeypatch):
    """SGLang < 0.5.11 has no sglang.srt.plugins: load_plugins is skipped, the parser still decides."""

    class OldSGLang(StandInHooks):
        def load_plugins(self) -> None:
            sa.SGLangHooks.load_plugins(self)  # the real hook: the import fails with ImportError and is skipped

    import builtins

    real_import = builtins.__import__

    def no_plugins(name, *args, **kwargs):
        if name == "sglang.srt.plugins":
            raise ImportError("No module named 'sglang.srt.plugins'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_plugins)
    out = sa.check_server_args([*BASE, "--speculative-algorithm", "EAGLE"], OldSGLang())
    assert (out["checked"], out["ok"], out["algorithm_resolved"]) == (True, True, "EAGLE")


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        (sa.MARKER + '{"checked": true, "ok": true}\n', {"checked": True, "ok": True}),
        ("torch C++ warning\n" + sa.MARKER + '{"ok": false}\nan atexit line\n', {"ok": False}),  # noise around
        (sa.MARKER + '{"ok": 1}\n' + sa.MARKER + '{"ok": 2}\n', {"ok": 2}),  # the last one wins
        (sa.MARKER + "{not json\n", None),
        (sa.MARKER + "[1, 2]\n", None),
        ("Traceback (most recent call last):\n", None),
        ("", None),
    ],
    ids=["clean", "noise", "last", "bad-json", "not-a-dict", "no-marker", "empty"],
)
def test_parse_output(stdout, expected):
    assert parse_probe_output(stdout, sa.MARKER) == expected


def test_child_source_is_this_file_plus_its_main():
    src = sa.child_source()
    assert src.startswith(open(sa.__file__, encoding="utf-8").read())
    assert src.rstrip().endswith("sys.exit(main(sys.argv))")
    compile(src, "<child>", "exec")  # `python -c` accepts it (the __future__ import stays first)
