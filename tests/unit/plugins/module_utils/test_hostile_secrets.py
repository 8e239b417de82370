"""Issue 25 in tables: which values are secrets (module_utils _secrets), the module's masking and the role's way back
to the real values (filters pivot_secrets + pivot_unmask), systemd escaping of new ExecStart values (_systemd_cmdline,
_sglang_flags), and the role/playbook tasks that handle unit data under no_log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ansible_collections.specdec.pivot.plugins.filter import pivot as f
from ansible_collections.specdec.pivot.plugins.module_utils import (
    _exec_start,
    _sglang_flags,
    _systemd_cmdline,
    _systemd_unit,
)
from ansible_collections.specdec.pivot.plugins.module_utils import _secrets as s

ROOT = Path(__file__).resolve().parents[4]

# ------------------------------------------------------------------------------------------- secret flags


@pytest.mark.parametrize(
    ("word", "flag"),
    [
        ("--api-key", "--api-key"),
        ("--api-key=K", "--api-key"),
        ("--api-ke", "--api-key"),  # argparse accepts an unambiguous prefix
        ("--api", "--api-key"),
        ("--admin-api-key=K", "--admin-api-key"),
        ("--admin", "--admin-api-key"),
        ("--a", "--api-key"),  # ambiguous for argparse (the server refuses it): still masked
        ("--api-keys", None),
        ("--port", None),
        ("-api-key", None),
        ("--", None),
    ],
)
def test_secret_flag_resolves_prefixes_as_argparse(word, flag):
    assert s.secret_flag(word) == flag


SERVE = ["/py", "-m", "sglang.launch_server", "--model-path", "/m"]


@pytest.mark.parametrize(
    ("argv", "found"),
    [
        ([*SERVE, "--api-key", "K1"], [("--api-key", "K1")]),
        ([*SERVE, "--admin-api-key=K2"], [("--admin-api-key", "K2")]),
        ([*SERVE, "--api-ke", "K4"], [("--api-key", "K4")]),
        ([*SERVE, "--api-key", "--port", "1"], []),  # no value: argparse refuses it
        ([*SERVE, "--", "--api-key", "K9"], []),  # after --: not a flag
    ],
)
def test_flag_secrets(argv, found):
    assert s.flag_secrets(argv) == found


# ------------------------------------------------------------------------------------------- environment


@pytest.mark.parametrize(
    ("name", "harmless"),
    [
        ("PATH", True),
        ("CUDA_VISIBLE_DEVICES", True),
        ("NCCL_SOCKET_IFNAME", True),
        ("SGLANG_PLUGINS", True),
        ("TOKENIZERS_PARALLELISM", True),  # on the list by name, though it says TOKEN
        ("HF_HOME", True),
        ("HF_TOKEN", False),
        ("DATABASE_URL", False),  # a password in the URL
        ("GITHUB_PAT", False),
        ("SENTRY_DSN", False),
        ("DB_PWD", False),
        ("SSL_PASSPHRASE", False),
        ("SGLANG_API_KEY", False),  # a harmless prefix, a secret word
        ("NCCL_AUTH_TOKEN", False),
        ("CUDA_CREDENTIALS", False),
        ("MY_SETTING", False),  # every name not on the list
    ],
)
def test_only_listed_names_are_harmless(name, harmless):
    assert s.harmless_env_name(name) is harmless


def test_unit_secrets_collects_every_form():
    found = s.unit_secrets(
        [*SERVE, "--api-key", "K1", "--admin-api-key=K2", "--api-ke", "K4", "--x", "${API_KEY}"],
        {"HF_TOKEN": "K3", "CUDA_VISIBLE_DEVICES": "0", "DATABASE_URL": "postgres://u:PW@h/db", "FLAG": "true"},
        {"HF_TOKEN": "K3-from-file"},
    )
    assert found == {
        "--api-key": "K1",
        "--admin-api-key": "K2",
        "--api-key#2": "K4",
        "HF_TOKEN": "K3",
        "DATABASE_URL": "postgres://u:PW@h/db",
        "HF_TOKEN#2": "K3-from-file",
    }


# ------------------------------------------------------------------------------------------- mask / unmask

SECRETS = {
    "--api-key": "K1",
    "--admin-api-key": "sk-admin-key",
    "HF_TOKEN": "hf_secret_token",
    "DATABASE_URL": "postgres://u:PW@h/db",
    "MODEL": "Qwen3",
}


@pytest.mark.parametrize(
    ("data", "masked"),
    [
        ("K1", "{secret:--api-key}"),
        ("--api-key=K1", "--api-key={secret:--api-key}"),
        ("/models/K10", "/models/K10"),  # a short key only as a whole word
        ("python -m x --admin-api-key sk-admin-key", "python -m x --admin-api-key {secret:--admin-api-key}"),
        ("error: sk-admin-keyXYZ", "error: {secret:--admin-api-key}XYZ"),  # a key wherever it occurs
        ("env HF_TOKEN=hf_secret_token python", "env HF_TOKEN={secret:HF_TOKEN} python"),
        ("Qwen3", "{secret:MODEL}"),  # an environment value as a whole string ...
        ("/models/Qwen3-27B", "/models/Qwen3-27B"),  # ... never inside other text (the model path stays usable)
        (["--api-key", "K1"], ["--api-key", "{secret:--api-key}"]),
        ({"DATABASE_URL": "postgres://u:PW@h/db"}, {"DATABASE_URL": "{secret:DATABASE_URL}"}),
        (17, 17),
    ],
)
def test_mask_and_unmask_are_inverse(data, masked):
    assert s.mask(data, SECRETS) == masked
    assert s.unmask(masked, SECRETS) == data


def test_mask_is_one_pass():
    """A value that occurs in a marker's text is not searched for in the markers put in."""
    secrets = {"--api-key": "sk-secret-api", "X": "secret:--api-key"}
    assert s.mask("sk-secret-api", secrets) == "{secret:--api-key}"


def test_unmask_names_a_missing_value():
    with pytest.raises(KeyError, match="HF_TOKEN"):
        s.unmask("{secret:HF_TOKEN}", {})


UNIT = """[Unit]
Description=SGLang
[Service]
Environment=HF_TOKEN=K3-hf-token-value CUDA_VISIBLE_DEVICES=0,1
Environment=DATABASE_URL=postgres://u:PW-db-pass@h/db
EnvironmentFile=/etc/sglang.env
ExecStart=/opt/venv/bin/python -m sglang.launch_server --model-path /m \\
    --api-key K1-api-key-value --admin-api-key=K2-admin-value --api-ke K4-prefix-value \\
    --speculative-algorithm NEXTN
"""
ENV_FILE = "GITHUB_PAT=K5-pat-value\n"
SHOW_ENVIRONMENT = "HF_TOKEN=K3-hf-token-value CUDA_VISIBLE_DEVICES=0,1 DATABASE_URL=postgres://u:PW-db-pass@h/db"
PLANTED = ("K1-api-key-value", "K2-admin-value", "K3-hf-token-value", "PW-db-pass", "K4-prefix-value", "K5-pat-value")


def test_the_role_reads_back_every_value_the_module_masked():
    """What sglang_capabilities does (mask with unit_secrets of the unit's argv, Environment, EnvironmentFile) and
    what sglang_preflight does under no_log (pivot_secrets of the unit file's text, systemd's Environment property
    and the files; pivot_unmask of the module's argv) meet: the real argv comes back, and the masked one holds no
    planted value."""
    parsed = _exec_start.parse_exec_start(_systemd_unit.unit_exec_starts([UNIT])[0])
    show_env = _systemd_unit.parse_environment_property(SHOW_ENVIRONMENT)
    merged = {**show_env, **_systemd_unit.parse_environment_file(ENV_FILE)}
    module_secrets = s.unit_secrets(parsed["argv"], show_env, merged, parsed["env_assignments"])
    masked = s.mask({"argv": parsed["argv"], "environment": merged}, module_secrets)
    assert not any(v in json.dumps(masked) for v in PLANTED)

    auth = f.pivot_secrets(UNIT, SHOW_ENVIRONMENT, [ENV_FILE])
    assert auth["values"] == module_secrets
    assert f.pivot_unmask(masked["argv"], auth) == parsed["argv"]
    assert f.pivot_unmask(masked["environment"], auth) == merged
    # argparse keeps the last occurrence: --api-ke K4 is the key the server checks, the one the probe must send
    assert (auth["api_key"], auth["admin_api_key"]) == ("K4-prefix-value", "K2-admin-value")
    assert auth["names"] == ["--admin-api-key", "--api-key", "DATABASE_URL", "GITHUB_PAT", "HF_TOKEN"]
    shown = f.pivot_mask(" ".join(parsed["argv"]) + json.dumps(merged), auth)
    assert not any(v in shown for v in PLANTED)


def test_a_key_in_the_extra_args_is_a_secret_too():
    """sglang_preflight_extra_args reach the module as extra_args: a key there is masked by the module and read
    back by the role the same way (pivot_secrets' extra_args)."""
    extra = ["--api-key", "KX-extra-key-value"]
    parsed = _exec_start.parse_exec_start(_systemd_unit.unit_exec_starts([UNIT])[0])
    show_env = _systemd_unit.parse_environment_property(SHOW_ENVIRONMENT)
    merged = {**show_env, **_systemd_unit.parse_environment_file(ENV_FILE)}
    module_secrets = s.unit_secrets([*parsed["argv"], *extra], show_env, merged, parsed["env_assignments"])
    auth = f.pivot_secrets(UNIT, SHOW_ENVIRONMENT, [ENV_FILE], extra)
    assert auth["values"] == module_secrets and "KX-extra-key-value" in auth["secret_values"]
    assert f.pivot_unmask(s.mask(extra, module_secrets), auth) == extra


def test_pivot_unmask_fails_naming_the_secret():
    with pytest.raises(Exception, match="HF_TOKEN"):
        f.pivot_unmask(["{secret:HF_TOKEN}"], {"values": {}})


# ------------------------------------------------------------------------------------------- systemd escaping


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        ("/models/%n", "/models/%%n"),
        ("$HOME/x", "$$HOME/x"),
        ("${HOME}", "$${HOME}"),
        ("100%", "100%%"),
        ("%%", "%%%%"),
        ("plain", "plain"),
        (17, "17"),
    ],
)
def test_new_values_are_escaped_for_systemd(value, escaped):
    assert _systemd_cmdline.systemd_escape(value) == escaped
    flags = _sglang_flags.replace_speculative_flags({"--model-path": "/m/%i"}, {"speculative-draft-model-path": value})
    assert flags == {"--model-path": "/m/%i", "--speculative-draft-model-path": escaped}  # kept words: as written
    parsed = _exec_start.parse_exec_start(f"/py -m sglang.launch_server --model-path /m --x {escaped}")
    line = _exec_start.render_exec_start(parsed)
    assert line.endswith(f"--x {escaped}")  # the unit file's form, not escaped twice
    assert f.systemd_exec_lines(parsed["argv"])[-1] == f"--x {escaped}"  # the role's template, the same


# ------------------------------------------------------------------------------------------- roles, playbooks


def _tasks(path: Path) -> dict:
    out = {}

    def walk(tasks):
        for task in tasks or []:
            if "name" in task:
                out[task["name"]] = task
            for part in ("block", "rescue", "always"):
                walk(task.get(part))

    walk(yaml.safe_load(path.read_text()))
    return out


def _play_tasks(path: Path) -> dict:
    out = {}
    for play in yaml.safe_load(path.read_text()):
        for task in play.get("tasks", []):
            out[task["name"]] = task
    return out


PREFLIGHT = ROOT / "roles" / "sglang_preflight" / "tasks"


@pytest.mark.parametrize(
    ("path", "task"),
    [
        (PREFLIGHT / "unit.yml", "Read the unit's state from systemd"),
        (PREFLIGHT / "unit.yml",
         "Read the unit file, its metadata, the server's command line and processes, and the pivot's records"),
        (PREFLIGHT / "capabilities.yml",
         "Parse the unit file and its drop-ins (read by unit.yml's one read_files run)"),
        (PREFLIGHT / "records.yml", "Parse the records of units saved by earlier pivot runs "
                                    "(the unit as it was before each switch; oldest first)"),
        (PREFLIGHT / "capabilities.yml", "Note the running server's command line (never shown; compared with the plan's)"),  # noqa: E501
        (PREFLIGHT / "secrets.yml", "Note the unit's secrets (API keys, tokens; masked wherever shown)"),
        (PREFLIGHT / "secrets.yml", "Read the unit's EnvironmentFile= files (their values are never shown)"),
        (PREFLIGHT / "server.yml", "Derive the server's settings from the unit"),
    ],
)
def test_role_tasks_that_hold_unit_data_are_no_log(path, task):
    no_log = _tasks(path)[task].get("no_log")
    assert no_log is True or "pivot_auth.secret_values | length > 0" in str(no_log)  # always, or with a secret


SERVICE = ROOT / "roles" / "sglang_service" / "tasks"


@pytest.mark.parametrize(
    ("path", "task"),
    [
        (SERVICE / "restore.yml", "Read the unit's state from systemd"),
        (SERVICE / "restore_find.yml", "Read the unit records"),
        (SERVICE / "restore_find.yml", "Read the unit file as it is now"),
        (SERVICE / "restore_find.yml", "Decide what to restore"),
        (SERVICE / "restore_apply.yml", "Read the unit as it was before the pivot"),
        (SERVICE / "restore_apply.yml", "Read the running server's command line"),
        (SERVICE / "restore_apply.yml", "Restart the restored service"),
        (SERVICE / "switch.yml", "Restart the service with the new ExecStart"),
        (SERVICE / "rollback.yml", "Restart the restored service"),
    ],
)
def test_service_tasks_that_hold_unit_data_are_no_log(path, task):
    """systemd_service's result holds the unit's status (Environment=, ExecStart); records and /proc hold argv."""
    no_log = _tasks(path)[task].get("no_log")
    assert no_log is True or "sglang_service_secret" in str(no_log)


@pytest.mark.parametrize("task", ["Read the unit's state", "Ask the server"])
def test_status_tasks_that_hold_unit_data_are_no_log(task):
    assert _play_tasks(ROOT / "playbooks" / "status.yml")[task].get("no_log") is True


def test_no_message_prints_a_raw_exec_start():
    """An assert's message shows the module's (masked) words at most, never the ExecStart line."""
    for path in PREFLIGHT.glob("*.yml"):
        text = path.read_text()
        assert "unit.exec_start" not in text, path.name
        assert "sglang_preflight_svc.status.ExecStart" not in text, path.name
    status = (ROOT / "playbooks" / "status.yml").read_text()
    assert "unit.argv | join(' ')" not in status  # its ExecStart line is the module's masked one


def test_sglang_missing_is_named_not_a_jinja_error():
    task = _tasks(PREFLIGHT / "capabilities.yml")["Check SGLang is installed in the unit's interpreter"]
    assert "SGLang is not installed in {{ sglang_preflight_interpreter }}" in task["ansible.builtin.assert"]["fail_msg"]
    # a missing SGLang reports version: null; default('') alone would hand None to length (the Jinja error)
    assert any("default('', true)" in cond for cond in task["ansible.builtin.assert"]["that"])
