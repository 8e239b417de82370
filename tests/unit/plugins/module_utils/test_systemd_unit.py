"""Tables for plugins/module_utils/_systemd_unit.py: ``systemctl show`` output and unit files.

Inputs are recorded from real software: ``systemctl show`` of real systemd 252 and the unit files it read
(tests/unit/fixtures/systemctl_show, see record.sh there). Other unit text written here is the test's own input.
"""

from __future__ import annotations

import pytest
from ansible_collections.specdec.pivot.plugins.module_utils import _exec_start
from ansible_collections.specdec.pivot.plugins.module_utils import _systemd_unit as s
from sglang_recordings import show_text, unit_file

# ------------------------------------------------------------------------------------------------------ systemctl show

SHOW_CASES = {
    "sglang-nextn": dict(
        name="sglang-nextn.service",
        active_state="inactive",
        user="root",
        working_directory="/opt/sglang",
        environment={"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"},
        exec_prefix="",
        argv_head=["/SPECDEC_REPO/.venv/bin/python", "-m", "sglang.launch_server", "--model-path"],
        main_pid=0,
    ),
    "sglang-quoting": dict(
        name="sglang-quoting.service",
        user="nobody",
        group="nogroup",
        working_directory="/opt/sglang-missing",  # shown as !/opt/sglang-missing (missing is ok)
        environment={"HF_HOME": "/data/hf cache", "CUDA_VISIBLE_DEVICES": "0,1"},
        environment_files=[{"path": "/etc/default/sglang-quoting", "ignore_errors": True}],
        exec_prefix="-",
        # systemctl joins argv with spaces: "/models/Qwen3 8B" comes back as two words
        argv_head=[
            "/SPECDEC_REPO/.venv/bin/python",
            "-u",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "/models/Qwen3",
            "8B",
        ],
    ),
    "sglang-specifiers": dict(
        exec_prefix="@",
        exec_path="/SPECDEC_REPO/.venv/bin/python",
        argv_head=["sglang-server", "-m", "sglang.launch_server"],
        environment={"PORT": "30002"},
        user="",
    ),
    "sglang-running": dict(active_state="active", sub_state="running", main_pid=-1, exec_commands=1),
    "sglang-twice": dict(exec_commands=2, argv_head=["/usr/bin/true", "first"]),
    "full-sglang-nextn": dict(
        name="sglang-nextn.service",
        fragment_path="/etc/systemd/system/sglang-nextn.service",
        need_daemon_reload=False,
        drop_in_paths=[],
    ),
}


@pytest.mark.parametrize("name", SHOW_CASES)
def test_unit_info_from_recorded_show(name):
    info = s.unit_info_from_show(s.parse_systemctl_show(show_text(name)), name)
    for key, want in SHOW_CASES[name].items():
        if key == "argv_head":
            assert info["argv"][: len(want)] == want
        elif key == "main_pid" and want == -1:
            assert info["main_pid"] > 0
        else:
            assert info[key] == want, key


def test_show_argv_is_the_joined_words_split_at_spaces():
    """What systemd 252 prints: the JSON value's quotes and spaces are not escaped (strv_join(argv, " "))."""
    info = s.unit_info_from_show(s.parse_systemctl_show(show_text("sglang-quoting")), "q")
    assert info["argv"][info["argv"].index("--json-model-override-args") + 1] == '{"rope_scaling":'
    assert "--log-level=info" in info["argv"]
    assert info["exec_start_source"] == "systemctl show"


def test_not_found_unit():
    props = s.parse_systemctl_show(show_text("sglang-missing"))
    assert props["LoadState"] == "not-found"
    with pytest.raises(ValueError, match=r"'sglang-missing.service' not found \(LoadState=not-found\)"):
        s.unit_info_from_show(props, "sglang-missing.service")


def test_unit_without_exec_start():
    with pytest.raises(ValueError, match="has no ExecStart"):
        s.unit_info_from_show({"LoadState": "loaded", "FragmentPath": "/x.service", "ExecStart": ""}, "x.service")


def test_full_show_output_keeps_every_property_once():
    props = s.parse_systemctl_show(show_text("full-sglang-nextn"))
    assert len(props) > 150
    assert props["Type"] == "simple"
    assert props["ExecStart"].startswith("{ path=/SPECDEC_REPO/.venv/bin/python ; argv[]=")


@pytest.mark.parametrize(
    ("line", "prefix", "ignore"),
    [
        (
            "{ path=/p ; argv[]=/p a ; flags= ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; "
            "status=0/0 }",
            "",
            False,
        ),
        (
            "{ path=/p ; argv[]=/p a ; flags=ignore-failure ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; "
            "code=(null) ; status=0/0 }",
            "-",
            True,
        ),
        (
            "{ path=/p ; argv[]=/p a ; flags=privileged no-env-expand ; start_time=[n/a] ; pid=0 ; code=(null) ; "
            "status=0/0 }",
            "+:",
            False,
        ),
        (
            "{ path=/p ; argv[]=/p a ; ignore_errors=yes ; start_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }",
            "-",
            True,
        ),
        (
            "{ path=/real ; argv[]=name a ; ignore_errors=no ; start_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }",
            "@",
            False,
        ),
    ],
)
def test_exec_property_prefixes(line, prefix, ignore):
    (cmd,) = s.parse_exec_property(line)
    assert (cmd["prefix"], cmd["ignore_errors"]) == (prefix, ignore)


@pytest.mark.parametrize("bad", ["path=/x argv[]=/x", "{ path=/x ; ignore_errors=no }"])
def test_bad_exec_property(bad):
    with pytest.raises(ValueError):
        s.parse_exec_property(bad)


ENV_FILE = """# comment
; another
export A=1
B="two words"
C='single $kept'
D="esc \\" quote"
 E = spaced
broken line
"""


def test_environment_file():
    assert s.parse_environment_file(ENV_FILE) == {
        "A": "1",
        "B": "two words",
        "C": "single $kept",
        "D": 'esc " quote',
        "E": "spaced",
    }


def test_environment_files_property():
    value = "/etc/default/a (ignore_errors=no) /etc/b (ignore_errors=yes)"
    assert s.parse_environment_files_property(value) == [
        {"path": "/etc/default/a", "ignore_errors": False},
        {"path": "/etc/b", "ignore_errors": True},
    ]


# ------------------------------------------------------------------------------------------------------ unit files


def test_recorded_unit_files_give_exact_words_where_show_loses_them():
    (value,) = s.unit_exec_starts([unit_file("sglang-quoting")])
    parsed = _exec_start.parse_exec_start(value)
    assert parsed["prefix"] == "-"
    assert parsed["flags"]["--model-path"] == "/models/Qwen3 8B"
    assert parsed["flags"]["--json-model-override-args"] == '{"rope_scaling": {"type": "yarn", "factor": 4.0}}'
    assert parsed["flags"]["--served-model-name"] == "qwen 8b"
    assert parsed["flags"]["--cuda-graph-bs"] == ["1", "2", "4", "8"]
    assert parsed["flags"]["--log-level"] == "info"
    # the same words joined with spaces are what systemd printed in `show`
    show = s.unit_info_from_show(s.parse_systemctl_show(show_text("sglang-quoting")), "q")
    assert " ".join(parsed["argv"]).split() == show["argv"]


@pytest.mark.parametrize("name", ["sglang-nextn", "sglang-env", "sglang-console", "sglang-0517", "sglang-running"])
def test_unit_file_and_show_agree_on_plain_units(name):
    values = s.unit_exec_starts([unit_file(name)])
    show = s.unit_info_from_show(s.parse_systemctl_show(show_text(name)), name)
    assert len(values) == show["exec_commands"] == 1
    assert " ".join(_exec_start.parse_exec_start(values[0])["argv"]).split() == show["argv"]


def test_specifiers_are_expanded_in_show_but_not_in_the_file():
    (value,) = s.unit_exec_starts([unit_file("sglang-specifiers")])
    parsed = _exec_start.parse_exec_start(value)
    show = s.unit_info_from_show(s.parse_systemctl_show(show_text("sglang-specifiers")), "x")
    assert parsed["flags"]["--log-dir"] == "/var/log/%N"
    assert "/var/log/sglang-specifiers" in show["argv"]
    assert parsed["flags"]["--served-model-name"] == "100%%"
    assert "100%" in show["argv"]
    assert parsed["flags"]["--port"] == "$PORT" and "$PORT" in show["argv"]
    assert parsed["prefix"] == "@" and parsed["path"] == show["exec_path"] == "/SPECDEC_REPO/.venv/bin/python"
    assert parsed["interpreter"] == "/SPECDEC_REPO/.venv/bin/python"  # decided by the @ path, not argv[0]


def test_twice_and_drop_in_reset():
    assert s.unit_exec_starts([unit_file("sglang-twice")]) == ["/usr/bin/true first", "/usr/bin/true second"]
    dropin = "[Service]\nExecStart=\nExecStart=/usr/bin/true third\n"
    assert s.unit_exec_starts([unit_file("sglang-twice"), dropin]) == ["/usr/bin/true third"]
    assert s.unit_exec_starts([unit_file("sglang-twice"), "[Service]\nExecStart=/x\n"])[-1] == "/x"


def test_unit_file_entries():
    text = (
        "# head\n[Unit]\nDescription=a = b\n\n[Service]\n; comment\nExecStart=/bin/x \\\n  --a 1 \\\n"
        "# inside\n  --b\nEnvironment=X=1\n[Install]\nWantedBy=multi-user.target\n"
    )
    assert s.unit_file_entries(text) == [
        ("Unit", "Description", "a = b"),
        ("Service", "ExecStart", "/bin/x  --a 1  --b"),
        ("Service", "Environment", "X=1"),
        ("Install", "WantedBy", "multi-user.target"),
    ]
