"""Hostile input for specdec.pivot.sglang_server_args (issue 25): the server's keys never reach a command line
(any user can read /proc/PID/cmdline), the invocation does not show the words, and a parser message that echoes a
key comes back masked.

SGLang here is a stand-in package put first on PYTHONPATH (sglang.srt.server_args.ServerArgs with --model-path,
--port, --api-key and --admin-api-key; argparse itself decides, as with the real one), so each run takes a second,
not SGLang's import time. A sitecustomize.py on the same path records the argv of every process the module (and
its child) starts.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from module_runner import COLLECTIONS_ROOT, invoke_module

K1, K2, K4 = "K1-planted-api-key", "K2-planted-admin-key", "K4-planted-prefix-key"

STAND_IN = '''
class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--model-path")
        parser.add_argument("--port", type=int)
        parser.add_argument("--api-key")
        parser.add_argument("--admin-api-key")
        parser.add_argument("--speculative-algorithm")
'''

RECORDER = '''
import json, os, subprocess
_init = subprocess.Popen.__init__
def _recording_init(self, args, *a, **kw):
    with open(os.environ["ARGV_LOG"], "a") as fh:
        fh.write(json.dumps([str(w) for w in (args if isinstance(args, (list, tuple)) else [args])]) + "\\n")
    _init(self, args, *a, **kw)
subprocess.Popen.__init__ = _recording_init
'''


@pytest.fixture
def shadow(tmp_path):
    root = tmp_path / "shadow"
    (root / "sglang" / "srt").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    (root / "sglang" / "srt" / "__init__.py").write_text("")
    (root / "sglang" / "srt" / "server_args.py").write_text(STAND_IN)
    (root / "sitecustomize.py").write_text(RECORDER)
    return root


def run(tmp_path: Path, shadow: Path, words: list[str]) -> tuple[dict, list[list[str]]]:
    log = tmp_path / "argv.log"
    env = {**os.environ, "PYTHONPATH": f"{shadow}{os.pathsep}{COLLECTIONS_ROOT}", "ARGV_LOG": str(log)}
    result = invoke_module("sglang_server_args", {"args": words}, env, cwd=tmp_path, python=sys.executable)
    argvs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, argvs


def test_the_keys_are_never_on_a_command_line_nor_in_the_result(tmp_path, shadow):
    words = ["--model-path", "/m", "--api-key", K1, f"--admin-api-key={K2}", "--port", "30000"]
    r, argvs = run(tmp_path, shadow, words)
    assert (r["checked"], r["ok"]) == (True, True), r
    assert argvs, "the module started no child process (the recorder saw nothing)"
    for argv in argvs:
        for key in (K1, K2):
            assert not any(key in w for w in argv), f"{key} on the command line {argv[:3]}..."
    text = json.dumps(r)
    assert K1 not in text and K2 not in text
    assert r["invocation"]["module_args"]["args"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"


def test_a_refusal_that_echoes_a_key_is_masked(tmp_path, shadow):
    # argparse echoes unrecognized words: the abbreviation --api-ke is the key's flag, the key comes back masked
    r = run(tmp_path, shadow, ["--model-path", "/m", "--api-ke", K4, "--bogus", K4])[0]
    assert (r["checked"], r["ok"]) == (True, False), r
    assert K4 not in json.dumps(r)
    assert "unrecognized arguments: --bogus {secret:--api-key}" in r["error"]


def test_the_rest_of_the_result_is_not_masked(tmp_path, shadow):
    """args is no_log, but only the keys are masked in the result: the algorithm and the error stay readable."""
    r = run(tmp_path, shadow, ["--model-path", "/m", "--api-key", K1, "--speculative-algorithm", "DDTREE"])[0]
    assert r["algorithm"] == "DDTREE"
    assert "accepts the command line (--speculative-algorithm DDTREE)" in r["msg"]
