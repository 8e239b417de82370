"""Hostile input for specdec.pivot.sglang_capabilities (issue 25): planted secrets never come back in clear, new
ExecStart values are escaped for systemd, and bad options fail with a message that names them.

The unit is a synthetic ``systemctl show`` answer written by each test in the format real systemd 252 prints
(tests/unit/fixtures/systemctl_show/*.txt), replayed by the same stand-in as test_sglang_capabilities.py; the probe
runs the project's real interpreter (.venv, sglang 0.5.23).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from module_runner import COLLECTIONS_ROOT, invoke_module
from systemd_standin import write_unit

REPO = Path(__file__).resolve().parents[4]
PY = REPO / ".venv" / "bin" / "python"

# Planted secrets: every form issue 25 names, plus one given to the module as an option.
K1, K2, K4 = "K1-planted-api-key", "K2-planted-admin-key", "K4-planted-prefix-key"
K3, PW = "K3-planted-hf-token", "PW-planted-db-password"
DB_URL = f"postgres://u:{PW}@h/db"
K5, K6 = "K5-planted-env-file-pat", "K6-planted-option-token"
PLANTED = (K1, K2, K3, K4, PW, K5, K6)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("planted")
    exec_start = (
        f"{PY} -m sglang.launch_server --model-path /models/m --port 30000 --api-key {K1} "
        f"--admin-api-key={K2} --api-ke {K4} --speculative-algorithm NEXTN"
    )
    env = write_unit(
        tmp,
        "sglang-planted",
        exec_start,
        f"HF_TOKEN={K3} DATABASE_URL={DB_URL} CUDA_VISIBLE_DEVICES=0,1 PYTHONUNBUFFERED=1",
        env_file=f"# secrets\nGITHUB_PAT={K5}\nSGLANG_PLUGINS=ddtree\n",
    )
    args = {
        "unit": "sglang-planted.service",
        "help": False,
        "environment": {"OTHER_TOKEN": K6},
        "speculative_flags": {"speculative-algorithm": "DDTREE", "speculative-num-draft-tokens": 17},
    }
    return invoke_module("sglang_capabilities", args, env, cwd=tmp, timeout=600)


def test_no_planted_secret_anywhere_in_the_result(planted):
    assert not planted.get("failed"), planted.get("msg")
    text = json.dumps(planted)
    for value in PLANTED:
        assert value not in text, f"{value} is in the result"


def test_secrets_are_named_markers_where_they_stood(planted):
    names = ["--api-key", "--admin-api-key", "--api-key#2", "HF_TOKEN", "DATABASE_URL", "GITHUB_PAT", "OTHER_TOKEN"]
    assert planted["secrets"] == sorted(names)
    argv = planted["unit"]["argv"]
    assert argv[argv.index("--api-key") + 1] == "{secret:--api-key}"
    assert "--admin-api-key={secret:--admin-api-key}" in argv
    assert argv[argv.index("--api-ke") + 1] == "{secret:--api-key#2}"  # an argparse prefix of --api-key
    new = planted["exec_start_new"]
    assert "--api-key {secret:--api-key}" in new["value"] and "--speculative-algorithm DDTREE" in new["value"]
    env = planted["unit"]["environment"]
    assert env["HF_TOKEN"] == "{secret:HF_TOKEN}" and env["DATABASE_URL"] == "{secret:DATABASE_URL}"
    # the allow-listed harmless names stay in clear (the role reads CUDA_VISIBLE_DEVICES for the GPU fit)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["PYTHONUNBUFFERED"] == "1"
    assert planted["invocation"]["module_args"]["environment"] == {"OTHER_TOKEN": "***"}
    assert planted["sglang"]["installed"] is True  # the probe still ran with the unit's real environment


ESCAPES = [
    ("--served-model-name", "/models/%n", "/models/%%n"),
    ("--tokenizer-path", "$HOME/drafter", "$$HOME/drafter"),
    ("--download-dir", "${HOME}", "$${HOME}"),
    ("--revision", "100%", "100%%"),
    ("--chat-template", "/plain/path", "/plain/path"),
]


def test_new_values_are_escaped_for_systemd(tmp_path):
    """systemd expands % specifiers and $VAR in ExecStart: every new value, from speculative_flags and from
    extra_args (the role's sglang_preflight_extra_args), is written so systemd runs it as given. One module run
    (it imports SGLang): the escaping function's own table is in test_hostile_secrets.py."""
    env = write_unit(tmp_path, "sglang-esc", f"{PY} -m sglang.launch_server --model-path /models/m", "")
    args = {
        "unit": "sglang-esc.service",
        "help": False,
        "speculative_flags": {"speculative-draft-model-path": "/models/%n-$HOME"},
        "extra_args": [word for flag, value, _written in ESCAPES for word in (flag, value)],
    }
    r = invoke_module("sglang_capabilities", args, env, cwd=tmp_path, timeout=600)
    assert not r.get("failed"), r["msg"]
    new = r["exec_start_new"]
    argv = new["argv"]
    assert argv[argv.index("--speculative-draft-model-path") + 1] == "/models/%%n-$$HOME"
    assert "--speculative-draft-model-path /models/%%n-$$HOME" in new["value"]
    for flag, value, written in ESCAPES:
        assert argv[argv.index(flag) + 1] == written, (flag, value)


BAD = [
    ({"unit": ""}, "unit is an empty string"),
    ({"python": ""}, "python is an empty string"),
    ({"python": "/usr/bin/python3", "environment": {"A B": "1"}}, "environment: 'A B' is not an environment variable"),
    ({"python": "/usr/bin/python3", "environment": {"1X": "1"}}, "environment: '1X' is not an environment variable"),
    ({"python": "/usr/bin/python3", "environment": {"": "1"}}, "environment: '' is not an environment variable"),
    ({"python": "/usr/bin/python3", "environment": {"X": "a\0b"}}, "the value of X must be a string without NUL"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[case[1] for case in BAD])
def test_bad_options_are_named(tmp_path, args, message):
    env = {**os.environ, "PYTHONPATH": str(COLLECTIONS_ROOT)}
    r = invoke_module("sglang_capabilities", args, env, cwd=tmp_path, timeout=120)
    assert r["failed"] is True
    assert message in r["msg"], r["msg"]
    assert "Traceback" not in json.dumps(r)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"speculative algorithm": "X"}, "'speculative algorithm' is not a flag name"),
        ({"--a=b": "X"}, "'--a=b' is not a flag name"),
        ({"speculative-algorithm": {"a": 1}}, "not a mapping"),
    ],
)
def test_bad_speculative_flags_are_named(tmp_path, flags, message):
    env = write_unit(tmp_path, "sglang-flags", f"{PY} -m sglang.launch_server --model-path /models/m", "")
    r = invoke_module(
        "sglang_capabilities",
        {"unit": "sglang-flags.service", "help": False, "speculative_flags": flags},
        env,
        cwd=tmp_path,
        timeout=600,
    )
    assert r["failed"] is True
    assert "speculative_flags=" in r["msg"] and message in r["msg"], r["msg"]
