"""Tables for the pure parsers of plugins/module_utils/_sglang.py.

Inputs are recorded from real software where it exists: ``launch_server --help`` of the real sglang wheels
0.5.10 - 0.5.23 (tests/unit/fixtures/sglang_help, see record.sh there), ``systemctl show`` of real systemd 252
(tests/unit/fixtures/systemctl_show) and the probe's JSON from real SGLang environments
(tests/unit/fixtures/sglang_probe). Command lines written here are the test's own inputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.specdec.pivot.plugins.module_utils import _sglang as s

FIX = Path(__file__).resolve().parents[3] / "unit" / "fixtures"
HELP = FIX / "sglang_help"
SHOW = FIX / "systemctl_show"
PROBE = FIX / "sglang_probe"


def help_text(version: str) -> str:
    text = (HELP / f"sglang-{version}.txt").read_text()
    header, sep, body = text.partition("# --- help text below ---\n")
    assert sep and f"# sglang: {version} " in header, "fixture header must say which version it is"
    return body


def show_text(name: str) -> str:
    return "".join(ln for ln in (SHOW / f"{name}.txt").read_text().splitlines(True) if not ln.startswith("# "))


def probe_json(name: str) -> dict:
    return json.loads((PROBE / f"probe-{name}.json").read_text())


# ------------------------------------------------------------------------------------------------------ versions

VERSION_ORDER = [
    "0.5.9",
    "0.5.10.dev1",
    "0.5.10a1",
    "0.5.10rc2",
    "0.5.10",
    "0.5.10.post1",
    "0.5.11",
    "0.5.17",
    "0.5.23",
    "0.5.100",
    "0.6",
    "1.0.0",
]


@pytest.mark.parametrize("i", range(len(VERSION_ORDER) - 1))
def test_versions_sort_like_pep440(i):
    older, newer = VERSION_ORDER[i], VERSION_ORDER[i + 1]
    assert s.compare_versions(older, newer) == -1
    assert s.compare_versions(newer, older) == 1


@pytest.mark.parametrize(
    ("a", "b"), [("0.5", "0.5.0"), ("1.0", "1.0.0.0"), ("v0.5.17", "0.5.17"), ("2.13.0+cpu", "2.13.0+cu130")]
)
def test_equal_versions(a, b):
    assert s.compare_versions(a, b) == 0


@pytest.mark.parametrize("bad", ["", "latest", "0.5.x", "abc1.0"])
def test_not_a_version(bad):
    with pytest.raises(ValueError, match="not a version"):
        s.parse_version(bad)


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("0.5.17", ">=0.5.14", True),
        ("0.5.12", ">=0.5.14", False),
        ("0.5.23", ">=0.5.17,<=0.5.23", True),
        ("0.5.24", ">=0.5.17,<=0.5.23", False),
        ("0.5.23.post1", ">=0.5.17,<=0.5.23", False),  # PEP 440: a post release is newer
        ("0.5.17", ">0.5.17", False),
        ("0.5.17", "!=0.5.17", False),
        ("0.5.18", "==0.5.*", True),
        ("0.6.0", "==0.5.*", False),
        ("0.6.0", "!=0.5.*", True),
        ("0.5.20", "~=0.5.14", True),
        ("0.6.0", "~=0.5.14", False),
        ("0.5.13", "~=0.5.14", False),
        ("0.5.17", "", True),
        ("0.5.17", " >= 0.5.14 , < 0.6 ", True),
    ],
)
def test_version_satisfies(version, spec, ok):
    assert s.version_satisfies(version, spec) is ok


@pytest.mark.parametrize(
    ("spec", "match"),
    [("=>0.5", "specifier clause"), (">=0.5.x", "not a version"), ("<0.5.*", "wildcard"), ("~=1", "two release parts")],
)
def test_bad_specifiers_name_the_clause(spec, match):
    with pytest.raises(ValueError, match=match):
        s.version_satisfies("0.5.17", spec)


# ------------------------------------------------------------------------------------------------------ help


@pytest.mark.parametrize(
    ("version", "algorithms", "form", "accepts_registered"),
    [
        # argparse choices=[...] in server_args.py of these wheels
        ("0.5.10", ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"], "choices", False),
        ("0.5.11", ["DFLASH", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"], "choices", False),
        # help="Speculative algorithm. Builtins: ... Or any name registered via `SpeculativeAlgorithm.register`."
        ("0.5.12", ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH"], "free_text", True),
        ("0.5.17", ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK"], "free_text", True),
        ("0.5.23", ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO"], "free_text", True),
    ],
)
def test_help_of_each_recorded_version(version, algorithms, form, accepts_registered):
    got = s.parse_help_algorithms(help_text(version))
    assert got == {
        "algorithms": algorithms,
        "form": form,
        "accepts_registered": accepts_registered,
        "option_present": True,
    }


@pytest.mark.parametrize("version", ["0.5.12", "0.5.17", "0.5.23"])
def test_free_text_help_read_at_any_width(version):
    """The recorded help wraps at 80 columns; the same paragraph on one line (COLUMNS=200) reads the same."""
    body = help_text(version)
    start = body.index("  --speculative-algorithm SPECULATIVE_ALGORITHM\n")
    end = body.index("\n  -", start + 10)
    paragraph = " ".join(ln.strip() for ln in body[start:end].splitlines()[1:])
    wide = f"options:\n  --speculative-algorithm SPECULATIVE_ALGORITHM    {paragraph}\n  --other X   y\n"
    assert s.parse_help_algorithms(wide)["algorithms"] == s.parse_help_algorithms(body)["algorithms"]


HELP_CASES = {
    "ansi colours (python 3.14 argparse)": (
        "usage: x [\x1b[36m--speculative-algorithm\x1b[0m {\x1b[33mEAGLE\x1b[0m,DFLASH}]\n",
        ["EAGLE", "DFLASH"],
        "choices",
    ),
    "choices only in the options section": (
        "options:\n  --speculative-algorithm {NGRAM,EAGLE}\n                        Speculative algorithm.\n",
        ["NGRAM", "EAGLE"],
        "choices",
    ),
    "another option's braces are not the algorithms": (
        "usage: x [--speculative-draft-load-format {auto,pt}]\n"
        "  --speculative-algorithm SPECULATIVE_ALGORITHM\n                        Builtins: EAGLE, NGRAM. Or any\n"
        "                        name registered.\n",
        ["EAGLE", "NGRAM"],
        "free_text",
    ),
    "builtins joined with and": (
        "  --speculative-algorithm SPECULATIVE_ALGORITHM\n      Builtins: EAGLE, NGRAM and DFLASH.\n",
        ["EAGLE", "NGRAM", "DFLASH"],
        "free_text",
    ),
    "option without a list": (
        "  --speculative-algorithm SPECULATIVE_ALGORITHM\n                        Speculative algorithm.\n",
        [],
        "unlisted",
    ),
    "free text naming examples, not a list": (
        "  --speculative-algorithm SPECULATIVE_ALGORITHM\n      The speculative decoding algorithm, e.g. EAGLE.\n",
        [],
        "unlisted",
    ),
    "option with a short metavar and no help": (
        "options:\n  --speculative-algorithm ALGO\n  --other X  y\n",
        [],
        "unlisted",
    ),
    "option with = and no help": ("options:\n  --speculative-algorithm=NAME\n", [], "unlisted"),
    "option only in the usage line": ("usage: x [--speculative-algorithm SPECULATIVE_ALGORITHM]\n", [], "unlisted"),
    "option with an alias first": (
        "  --spec-algo, --speculative-algorithm SPECULATIVE_ALGORITHM\n      Which algorithm; see the docs.\n",
        [],
        "unlisted",
    ),
    "option help wrapped over lines without names": (
        "  --speculative-algorithm SPECULATIVE_ALGORITHM\n                        Speculative algorithm (registered\n"
        "                        by plugins at start-up).\n  --speculative-draft-model-path P\n",
        [],
        "unlisted",
    ),
    "option missing (very old sglang)": ("usage: x [--model-path MODEL_PATH]\n", [], None),
    "empty": ("", [], None),
}


@pytest.mark.parametrize("case", HELP_CASES)
def test_help_variants(case):
    text, algorithms, form = HELP_CASES[case]
    got = s.parse_help_algorithms(text)
    assert (got["algorithms"], got["form"]) == (algorithms, form)
    assert got["option_present"] == ("--speculative-algorithm" in text.replace("\x1b[36m", "").replace("\x1b[0m", ""))


@pytest.mark.parametrize("case", HELP_CASES)
def test_help_option_is_absent_only_when_the_help_has_no_such_option(case):
    """Free text with no {...} choices is "present, choices unknown", never "absent" (issue 16, point 4)."""
    text, _algorithms, form = HELP_CASES[case]
    expected = {"choices": "choices", "free_text": "free_text", "unlisted": "unknown_choices", None: "absent"}[form]
    assert s.help_option(s.parse_help_algorithms(text)) == expected
    caps = s.summarize_capabilities({"sglang": {"installed": True, "version": "0.5.17"}}, s.parse_help_algorithms(text))
    assert caps["help_option"] == expected
    assert (caps["help_option"] == "absent") is ("--speculative-algorithm" not in text)


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


def unit_file(name: str) -> str:
    return (SHOW / "units" / f"{name}.service").read_text()


def test_recorded_unit_files_give_exact_words_where_show_loses_them():
    (value,) = s.unit_exec_starts([unit_file("sglang-quoting")])
    parsed = s.parse_exec_start(value)
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
    assert " ".join(s.parse_exec_start(values[0])["argv"]).split() == show["argv"]


def test_specifiers_are_expanded_in_show_but_not_in_the_file():
    (value,) = s.unit_exec_starts([unit_file("sglang-specifiers")])
    parsed = s.parse_exec_start(value)
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


# ------------------------------------------------------------------------------------------------------ splitting

SPLIT_CASES = [
    ("/bin/x a b", ["/bin/x", "a", "b"]),
    ('  /bin/x   "a b"  c  ', ["/bin/x", "a b", "c"]),
    ("/bin/x 'a \"b\" c'", ["/bin/x", 'a "b" c']),
    ('/bin/x a"b c"d', ["/bin/x", "ab cd"]),
    (r'/bin/x "a\"b" \\ \x41 \101 \u00e9 \t', ["/bin/x", 'a"b', "\\", "A", "A", "é", "\t"]),
    (r"/bin/x a\sb", ["/bin/x", "a b"]),
    # an unknown escape keeps its backslash and the character (systemd retries with CUNESCAPE_RELAX and warns)
    (r"/bin/x a\ b", ["/bin/x", "a\\ b"]),
    (r"/bin/x \;", ["/bin/x", ";"]),
    ("/bin/x \\\n  --flag \\\n  v", ["/bin/x", "--flag", "v"]),
    ("/bin/x $VAR ${VAR} %n %%", ["/bin/x", "$VAR", "${VAR}", "%n", "%%"]),
    ('/bin/x ""', ["/bin/x", ""]),
    (r"/bin/x \q", ["/bin/x", "\\q"]),
]


@pytest.mark.parametrize(("text", "words"), SPLIT_CASES)
def test_split_command_line(text, words):
    assert s.split_command_line(text) == words


@pytest.mark.parametrize(
    ("text", "match"), [('/bin/x "open', "unterminated"), ("/bin/x 'open", "unterminated"), ("/bin/a ; /bin/b", "';'")]
)
def test_split_errors(text, match):
    with pytest.raises(ValueError, match=match):
        s.split_command_line(text)


@pytest.mark.parametrize(
    "word",
    [
        "plain",
        "a b",
        'q"uote',
        "back\\slash",
        "tab\there",
        "new\nline",
        "",
        ";",
        "é",
        "$VAR",
        "%n",
        '{"a": [1, 2]}',
        "it's",
        "\x01",
    ],
)
def test_quote_word_round_trips(word):
    assert s.split_command_line(f"/bin/x {s.quote_word(word)}") == ["/bin/x", word]


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


# ------------------------------------------------------------------------------------------------------ spec flags

NEXTN = (
    "/opt/v/bin/python -m sglang.launch_server --model-path /m --tp-size 2 --speculative-algorithm NEXTN "
    "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --mem-fraction-static 0.85 "
    "--enable-multi-layer-eagle --port 30000"
)
DDTREE = {"speculative-algorithm": "DDTREE", "speculative_draft_model_path": "/d", "--speculative-num-draft-tokens": 17}

REPLACE_CASES = {
    "NEXTN -> DDTREE in place": (
        NEXTN,
        DDTREE,
        [
            "--model-path",
            "--tp-size",
            "--speculative-algorithm",
            "--speculative-draft-model-path",
            "--speculative-num-draft-tokens",
            "--mem-fraction-static",
            "--port",
        ],
        {"--speculative-algorithm": "DDTREE", "--speculative-num-draft-tokens": "17"},
    ),
    "no speculative flags: appended": (
        "/p/python -m m --model-path /m --port 1",
        {"speculative-algorithm": "DDTREE"},
        ["--model-path", "--port", "--speculative-algorithm"],
        {},
    ),
    "kept flag replaced in place, null removes, bare true": (
        NEXTN,
        {
            "speculative-algorithm": "DDTREE",
            "port": 30001,
            "mem-fraction-static": None,
            "disable-overlap-schedule": True,
        },
        ["--model-path", "--tp-size", "--speculative-algorithm", "--disable-overlap-schedule", "--port"],
        {"--port": "30001", "--disable-overlap-schedule": True},
    ),
    "false drops a new flag": (
        "/p/python -m m --a 1",
        {"speculative-algorithm": "DDTREE", "x": False},
        ["--a", "--speculative-algorithm"],
        {},
    ),
    "list value": (
        "/p/python -m m --speculative-algorithm EAGLE --a 1",
        {"speculative-algorithm": "DDTREE", "speculative-x": [1, 2]},
        ["--speculative-algorithm", "--speculative-x", "--a"],
        {"--speculative-x": ["1", "2"]},
    ),
}


@pytest.mark.parametrize("case", REPLACE_CASES)
def test_replace_speculative_flags(case):
    value, new, order, values = REPLACE_CASES[case]
    parsed = s.parse_exec_start(value)
    before = dict(parsed["flags"])
    flags = s.replace_speculative_flags(parsed["flags"], new)
    assert list(flags) == order
    for k, v in values.items():
        assert flags[k] == v
    assert parsed["flags"] == before, "the input must not change"
    for k in flags:
        if not s.is_speculative_flag(k):
            assert k in before or k in {s.normalize_flag(n) for n in new}
    rendered = s.render_exec_start(dict(parsed, flags=flags))
    assert s.parse_exec_start(rendered)["flags"] == flags


@pytest.mark.parametrize(
    ("flag", "speculative"),
    [
        ("--speculative-algorithm", True),
        ("speculative_num_steps", True),
        ("--speculative-draft-model-path=/x", True),
        ("--enable-multi-layer-eagle", True),
        ("--uno-lora-path", True),
        ("--enable-linear-replayssm-spec", True),
        ("--decoupled-spec-role", False),
        ("--spec-trace-dir", False),
        ("--enable-draft-weights-cpu-backup", False),
        ("--model-path", False),
        ("--disable-overlap-schedule", False),
    ],
)
def test_is_speculative_flag(flag, speculative):
    assert s.is_speculative_flag(flag) is speculative


def test_every_speculative_option_of_the_real_help_is_dropped():
    """All options of the recorded 0.5.23 help named --speculative-* are speculative flags."""
    names = {w.strip("[],") for w in help_text("0.5.23").split() if w.startswith(("--speculative-", "[--speculative-"))}
    assert len(names) > 30
    assert all(s.is_speculative_flag(n) for n in names)


def test_speculative_flags_view():
    parsed = s.parse_exec_start(NEXTN)
    assert list(s.speculative_flags(parsed["flags"])) == [
        "--speculative-algorithm",
        "--speculative-num-steps",
        "--speculative-eagle-topk",
        "--speculative-num-draft-tokens",
        "--enable-multi-layer-eagle",
    ]


# ------------------------------------------------------------------------------------------------------ summary

SUMMARY_CASES = {
    # name: (plugin_api entry_points, register, dflash_worker, supported, registered, reason contains)
    "0.5.10": (False, False, "none", False, False, "no plugin loader"),
    "0.5.11": (True, False, "v1", False, False, "no SpeculativeAlgorithm.register"),
    "0.5.12": (True, True, "v1", False, False, "older than 0.5.17"),
    "no-sglang": (False, False, "none", False, False, "not installed"),
}


@pytest.mark.parametrize("name", SUMMARY_CASES)
def test_summary_of_recorded_probes_of_old_versions(name):
    eps, register, worker, supported, registered, reason = SUMMARY_CASES[name]
    caps = s.summarize_capabilities(probe_json(name))
    assert caps["plugin_api"]["entry_points"] is eps
    assert caps["plugin_api"]["register"] is register
    assert caps["plugin_api"]["available"] is (eps and register)
    assert caps["plugin_api"]["min_version"] == "0.5.12"
    assert caps["dflash_worker"] == worker
    assert caps["ddtree"]["supported"] is supported
    assert caps["ddtree"]["registered"] is registered
    assert reason in caps["ddtree"]["reason"]
    assert caps["help_algorithms"] is None and caps["help_form"] is None


@pytest.mark.parametrize("name", ["0.5.17", "0.5.23"])
def test_summary_of_recorded_probes_of_supported_versions(name):
    probe = probe_json(name)
    caps = s.summarize_capabilities(probe, s.parse_help_algorithms(help_text(name)))
    assert caps["sglang"]["version"] == name
    assert caps["plugin_api"]["available"] is True
    assert caps["dflash_worker"] == "v2"
    assert caps["ddtree"]["supported"] is True
    assert caps["ddtree"]["registered"] is ("DDTREE" in probe["plugin_algorithms"] and probe["ddtree"]["resolves"])
    assert caps["registered_algorithms"] == probe["builtin_algorithms"] + probe["plugin_algorithms"]
    assert "DFLASH" in caps["help_algorithms"] and caps["help_form"] == "free_text"


def test_summary_when_the_plugin_is_not_installed():
    probe = probe_json("0.5.23")
    probe["entry_points"] = []
    probe["plugin_algorithms"] = []
    probe["ddtree"] = {"installed": False, "version": None, "declared": {}, "last_status": None, "resolves": False}
    caps = s.summarize_capabilities(probe)
    assert caps["ddtree"]["supported"] is True  # by the collection's fallback range >=0.5.14
    assert caps["ddtree"]["range_source"].startswith("specdec.pivot")
    assert caps["ddtree"]["registered"] is False
    assert "not installed" in caps["ddtree"]["reason"]


def test_summary_when_the_plugin_fails_to_load():
    probe = probe_json("0.5.23")
    probe["plugin_algorithms"] = []
    probe["ddtree"]["resolves"] = False
    probe["entry_points"][0].update(loaded=False, error="ModuleNotFoundError: No module named 'sglang_ddtree.sglang'")
    caps = s.summarize_capabilities(probe)
    assert caps["ddtree"]["registered"] is False
    assert "failed: ModuleNotFoundError" in caps["ddtree"]["reason"]


def test_summary_of_a_version_outside_the_plugin_range():
    probe = probe_json("0.5.23")
    probe["sglang"]["version"] = "0.5.30"
    probe["ddtree"]["declared"] = {"spec": ">=0.5.17,<=0.5.23"}  # no unsupported_reason: the spec decides
    caps = s.summarize_capabilities(probe)
    assert caps["ddtree"]["supported"] is False
    assert "outside the DDTree range >=0.5.17,<=0.5.23" in caps["ddtree"]["reason"]


def test_summary_reports_a_failed_help_run():
    caps = s.summarize_capabilities(probe_json("0.5.23"), {"error": "launch_server --help failed (rc=1): boom"})
    assert caps["help_algorithms"] is None
    assert caps["help_error"].endswith("boom")


def test_summary_reports_a_broken_import():
    probe = probe_json("0.5.23")
    probe["sglang"]["error"] = "import sglang failed: PermissionError: [Errno 13] Permission denied: '/nonexistent'"
    caps = s.summarize_capabilities(probe)
    assert caps["ddtree"]["supported"] is False
    assert "PermissionError" in caps["ddtree"]["reason"]
