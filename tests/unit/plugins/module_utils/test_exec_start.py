"""Tables for plugins/module_utils/_exec_start.py: an ExecStart taken apart and written back.

Command lines written here are the test's own inputs.
"""

from __future__ import annotations

import pytest
from ansible_collections.specdec.pivot.plugins.module_utils import _exec_start as s

# ------------------------------------------------------------------------------------------------------ ExecStart

EXEC_CASES = {
    "module": (
        "/opt/venv/bin/python -m sglang.launch_server --model-path /m --tp 2 --enable-metrics",
        dict(
            interpreter="/opt/venv/bin/python",
            module="sglang.launch_server",
            kind="module",
            args=[],
            flags={"--model-path": "/m", "--tp": "2", "--enable-metrics": True},
        ),
    ),
    "python options and -mX": (
        "python3.11 -u -X dev -W ignore -msglang.launch_server --port 1",
        dict(
            interpreter="python3.11",
            python_options=["-u", "-X", "dev", "-W", "ignore"],
            module="sglang.launch_server",
            flags={"--port": "1"},
        ),
    ),
    "script": (
        "/usr/bin/python3 /srv/launch.py serve --a=1 --b -3 --c -1.5e3",
        dict(kind="script", script="/srv/launch.py", args=["serve"], flags={"--a": "1", "--b": "-3", "--c": "-1.5e3"}),
    ),
    "env launcher": (
        "/usr/bin/env -u X A=1 B='two words' python3 -m sglang.launch_server --x",
        dict(
            launcher=["/usr/bin/env", "-u", "X", "A=1", "B=two words"],
            env_assignments={"A": "1", "B": "two words"},
            program="python3",
            interpreter="python3",
            flags={"--x": True},
        ),
    ),
    "console script": (
        "/opt/venv/bin/sglang serve --model-path /m",
        dict(
            interpreter=None,
            kind="command",
            program="/opt/venv/bin/sglang",
            args=["serve"],
            flags={"--model-path": "/m"},
        ),
    ),
    "prefixes": (
        "-+/opt/venv/bin/python -m m --a 1",
        dict(prefix="-+", path="/opt/venv/bin/python", interpreter="/opt/venv/bin/python"),
    ),
    "@ prefix": (
        "@/opt/venv/bin/python3 sglang-server -m m",
        dict(
            prefix="@",
            path="/opt/venv/bin/python3",
            program="sglang-server",
            interpreter="/opt/venv/bin/python3",
            module="m",
            argv=["sglang-server", "-m", "m"],
        ),
    ),
    "nargs, repeats, trailing": (
        "python -m m --bs 1 2 4 --x a --y --x b --x c -- --not-a-flag z",
        dict(
            flags={"--bs": ["1", "2", "4"], "--x": ["a", "b", "c"], "--y": True},
            order=["--bs", "--x", "--y", "--x", "--x"],
            repeated=["--x"],
            trailing_args=["--not-a-flag", "z"],
        ),
    ),
    "ExecStart= and continuations": (
        'ExecStart=/opt/v/bin/python -m sglang.launch_server \\\n    --tp 2 \\\n    --host "0.0.0.0"',
        dict(module="sglang.launch_server", flags={"--tp": "2", "--host": "0.0.0.0"}, source="unit_file"),
    ),
    "systemctl show form": (
        "{ path=/opt/v/bin/python ; argv[]=/opt/v/bin/python -m m --a 1 ; ignore_errors=yes ; start_time=[n/a] ; "
        "stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }",
        dict(prefix="-", module="m", flags={"--a": "1"}, source="systemctl_show"),
    ),
    "argv list": (
        ["/opt/v/bin/python", "-m", "m", "--name", "a b"],
        dict(flags={"--name": "a b"}, source="argv", prefix=""),
    ),
    "interpreter only": ("/usr/bin/python3", dict(kind="interpreter", module=None, script=None, flags={})),
}


@pytest.mark.parametrize("case", EXEC_CASES)
def test_parse_exec_start(case):
    value, want = EXEC_CASES[case]
    parsed = s.parse_exec_start(value)
    for key, expected in want.items():
        assert parsed[key] == expected, key


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("", "empty ExecStart"),
        ("/usr/bin/env A=1", "names no program"),
        ('/x "a', "unterminated"),
        ("/bin/a ; /bin/b", "several commands"),
    ],
)
def test_parse_exec_start_errors(value, match):
    with pytest.raises(ValueError, match=match):
        s.parse_exec_start(value)


ROUND_TRIP = [case[0] for case in EXEC_CASES.values()] + [
    '/opt/v/bin/python -m m --json \'{"a": "b c"}\' --path "/models/x y" --empty "" --neg=-bar',
    '/opt/v/bin/python -m m --weird "tab\there" --q "say \\"hi\\""',
]


@pytest.mark.parametrize("value", ROUND_TRIP, ids=range(len(ROUND_TRIP)))
@pytest.mark.parametrize("multiline", [False, True])
def test_render_parse_round_trip(value, multiline):
    parsed = s.parse_exec_start(value)
    text = s.render_exec_start(parsed, multiline=multiline, escape_percent=False)
    again = s.parse_exec_start(text)
    for key in ("prefix", "path", "program", "interpreter", "module", "script", "args", "flags", "trailing_args"):
        assert again[key] == parsed[key], key
    assert again["argv"] == s.exec_start_argv(parsed)
    # rendering is a fixed point after one pass
    assert s.render_exec_start(again, multiline=multiline, escape_percent=False) == text


def test_render_keeps_plain_lines_verbatim():
    line = "-/opt/v/bin/python -u -m sglang.launch_server --model-path /m --tp 2 --enable-metrics"
    assert s.render_exec_start(s.parse_exec_start(line)) == line


def test_multiline_puts_one_flag_per_line():
    parsed = s.parse_exec_start("/p/python -m m --a 1 --bs 1 2 --c --d=-x")
    assert s.render_exec_start(parsed, multiline=True, indent="  ") == (
        "/p/python -m m \\\n  --a 1 \\\n  --bs 1 2 \\\n  --c \\\n  --d=-x"
    )


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        (["/p/python", "-m", "m", "--name", "100%"], "/p/python -m m --name 100%%"),
        ("/p/python -m m --name 100%%", "/p/python -m m --name 100%%"),
        ("/p/python -m m --log /var/log/%N", "/p/python -m m --log /var/log/%N"),
    ],
)
def test_percent_is_escaped_only_for_final_words(value, rendered):
    assert s.render_exec_start(s.parse_exec_start(value)) == rendered


def test_negative_numbers_are_values():
    parsed = s.parse_exec_start("python -m m --bs 1 -2 --t -0.5")
    assert parsed["flags"] == {"--bs": ["1", "-2"], "--t": "-0.5"}
    assert s.exec_start_argv(parsed)[3:] == ["--bs", "1", "-2", "--t", "-0.5"]


def test_repeated_flags_render_grouped():
    parsed = s.parse_exec_start("python -m m --x a --y --x b")
    assert s.exec_start_argv(parsed) == ["python", "-m", "m", "--x", "a", "--x", "b", "--y"]


def test_render_refuses_a_list_value_that_looks_like_a_flag():
    parsed = s.parse_exec_start("python -m m")
    parsed["flags"] = {"--bs": ["1", "--2"]}
    with pytest.raises(ValueError, match="starts with '-'"):
        s.exec_start_argv(parsed)
