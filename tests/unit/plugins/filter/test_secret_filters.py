"""Secrets in a unit (issue 16, point 11): found on the command line and in the environment, masked everywhere."""

from __future__ import annotations

import json

import pytest
from ansible_collections.specdec.pivot.plugins.filter import pivot as f

SERVE = ["/opt/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/m", "--port", "30000"]

SECRETS = {
    "no secrets": (SERVE, {}, [], None, None, []),
    "--api-key value": ([*SERVE, "--api-key", "sk-live-123456"], {}, [], "sk-live-123456", None, ["sk-live-123456"]),
    "--api-key=value": ([*SERVE, "--api-key=sk-live-123456"], {}, [], "sk-live-123456", None, ["sk-live-123456"]),
    "both keys": (
        [*SERVE, "--api-key", "user-key-1", "--admin-api-key", "admin-key-22"],
        {},
        [],
        "user-key-1",
        "admin-key-22",
        ["admin-key-22", "user-key-1"],
    ),
    "token in Environment=": (
        SERVE,
        {"HF_TOKEN": "hf_abcdef", "CUDA_VISIBLE_DEVICES": "0,1"},
        [],
        None,
        None,
        ["hf_abcdef"],
    ),
    "key from an EnvironmentFile via ${VAR}": (
        [*SERVE, "--api-key", "${SGL_KEY}"],
        {},
        ["# secrets\nexport SGL_KEY='from-file-999'\nOPENAI_API_KEY=\"sk-openai\"\nPORT=1\n"],
        "from-file-999",
        None,
        ["from-file-999", "sk-openai"],
    ),
    "$VAR form, Environment=": ([*SERVE, "--api-key", "$K"], {"K": "envkey-77"}, [], "envkey-77", None, []),
    # systemd runs with the file's value; the Environment= value is still a secret (systemctl show prints it)
    "EnvironmentFile overrides Environment": (
        SERVE,
        {"MY_SECRET": "old"},
        ["MY_SECRET=new-secret"],
        None,
        None,
        ["new-secret", "old"],
    ),
    # issue 25: the names on the allow-list of harmless names (module_utils _secrets) are never masked ...
    "names that are not secrets": (
        SERVE,
        {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0,1", "SGLANG_PLUGINS": "ddtree", "HF_HOME": "/srv/hf"},
        [],
        None,
        None,
        [],
    ),
    # ... every other name's value is a secret, whatever the name says (DATABASE_URL holds a password)
    "every other name is a secret": (
        SERVE,
        {"KEYBOARD": "us", "DATABASE_URL": "postgres://u:PW@h/db", "SENTRY_DSN": "https://k@s/1", "X": "1"},
        [],
        None,
        None,
        ["postgres://u:PW@h/db", "https://k@s/1", "us"],
    ),
    "password and credentials": (
        SERVE,
        {"DB_PASSWORD": "pw-1", "AWS_CREDENTIALS": "c-2"},
        [],
        None,
        None,
        ["c-2", "pw-1"],
    ),
}


@pytest.mark.parametrize("case", SECRETS)
def test_pivot_secrets(case):
    argv, env, files, api_key, admin_key, values = SECRETS[case]
    got = f.pivot_secrets(argv, env, files)
    assert got["api_key"] == api_key and got["admin_api_key"] == admin_key
    if case == "$VAR form, Environment=":
        values = []  # K is not a secret-looking name; the key itself still is
        assert got["secret_values"] == ["envkey-77"]
        return
    assert sorted(got["secret_values"]) == sorted(values)
    assert not any(v in json.dumps(got["names"]) for v in values)  # names never carry values


def test_mask_walks_every_string_of_a_report():
    secrets = f.pivot_secrets([*SERVE, "--api-key", "sk-live-123456"], {"HF_TOKEN": "hf_abcdef"})
    report = {
        "plan": {
            "old_exec_start": "python -m sglang.launch_server --api-key sk-live-123456",
            "old_argv": [*SERVE, "--api-key", "sk-live-123456"],
            "environment": {"HF_TOKEN": "hf_abcdef"},
        },
        "failures": [{"msg": "POST /generate with Bearer sk-live-123456 -> 401"}],
        "n": 3,
        "ok": True,
        "none": None,
    }
    masked = f.pivot_mask(report, secrets)
    text = json.dumps(masked)
    assert "sk-live-123456" not in text and "hf_abcdef" not in text
    assert masked["plan"]["old_argv"][-1] == "***" and masked["plan"]["environment"]["HF_TOKEN"] == "***"
    assert masked["n"] == 3 and masked["ok"] is True and masked["none"] is None
    assert f.pivot_mask("nothing to hide", secrets) == "nothing to hide"
    assert f.pivot_mask({"a": "b"}, []) == {"a": "b"}


def test_a_short_secret_is_masked_only_as_a_whole_word():
    assert f.pivot_mask("--api-key ab --model abc/ab-x", ["ab"]) == "--api-key *** --model abc/ab-x"
    assert f.pivot_mask("k=abcd;abcdabcd", ["abcd"]) == "k=***;******"


@pytest.mark.parametrize(
    ("host", "api_key", "warns"),
    [
        ("127.0.0.1", None, False),
        ("127.0.1.1", None, False),
        ("localhost", None, False),
        ("::1", None, False),
        ("[::1]", None, False),
        ("0.0.0.0", None, True),
        ("0.0.0.0", "k", False),
        ("::", None, True),
        ("10.0.0.5", "", True),
        ("", None, False),  # SGLang's default host is 127.0.0.1
    ],
)
def test_listen_warning(host, api_key, warns):
    got = f.pivot_listen_warning(host, api_key)
    assert (got is not None) is warns
    if warns:
        assert "without --api-key" in got and "127.0.0.1" in got
