"""Tests of plugins/filter/pivot.py (the filters the pivot roles plan with): pure functions, tables."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.specdec.pivot.plugins.filter import pivot as f

MODELS = Path(__file__).resolve().parents[2] / "fixtures" / "models"


def load(name: str) -> dict:
    return json.loads((MODELS / name / "config.json").read_text())


UNIT = """\
# hand-written header, dropped
#
[Unit]
Description=SGLang server
After=network-online.target

[Service]
User=root
Environment=CUDA_VISIBLE_DEVICES=0,1
Environment="HF_HOME=/data/hf cache"
ExecStart=/opt/sglang/venv/bin/python -m sglang.launch_server --model-path /models/m \\
   --tp-size 2 \\
# a comment inside a continuation is skipped
   --port 30000
; a kept comment
Restart=always

[Install]
WantedBy=multi-user.target
"""


def test_unit_parse_sections_entries_and_continuations():
    sections = f.systemd_unit_parse(UNIT)
    assert [s["name"] for s in sections] == ["Unit", "Service", "Install"]
    service = sections[1]["entries"]
    assert service[0] == {"key": "User", "value": "root"}
    assert service[2] == {"key": "Environment", "value": '"HF_HOME=/data/hf cache"'}
    assert service[3] == {
        "key": "ExecStart",
        "value": "/opt/sglang/venv/bin/python -m sglang.launch_server --model-path /models/m --tp-size 2 --port 30000",
    }
    assert service[4] == {"comment": "; a kept comment"}
    assert service[5] == {"key": "Restart", "value": "always"}
    assert sections[2]["entries"] == [{"key": "WantedBy", "value": "multi-user.target"}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Description=x\n", r"before any \[Section\]"),
        ("[Unit]\nnot a key value\n", "neither a section"),
        (None, "expects the unit file's text"),
    ],
)
def test_unit_parse_rejects(text, message):
    with pytest.raises(AnsibleFilterError, match=message):
        f.systemd_unit_parse(text)


def render(sections: list[dict], argv: list[str]) -> str:
    """What templates/sglang.service.j2 renders (same structure), to prove parse(render(x)) is a fixed point."""
    out = ["#", "# Ansible managed", "#"]
    for i, section in enumerate(sections):
        if i:
            out.append("")
        out.append(f"[{section['name']}]")
        for entry in section["entries"]:
            if "comment" in entry:
                out.append(entry["comment"])
            elif section["name"] == "Service" and entry["key"] == "ExecStart":
                out.append("ExecStart=" + " \\\n    ".join(f.systemd_exec_lines(argv)))
            else:
                out.append(f"{entry['key']}={entry['value']}")
    return "\n".join(out) + "\n"


def test_render_parse_is_a_fixed_point():
    argv = ["/py", "-m", "srv", "--model-path", "/m x", "--tp-size", "2", "--speculative-algorithm", "DDTREE"]
    first = render(f.systemd_unit_parse(UNIT), argv)
    second = render(f.systemd_unit_parse(first), argv)
    assert first == second
    execstart = next(e for e in f.systemd_unit_parse(first)[1]["entries"] if e.get("key") == "ExecStart")
    assert shlex.split(execstart["value"]) == argv


def _service_env_lines(sections) -> list[str]:
    service = next(s for s in sections if s["name"] == "Service")
    return [f"{e['key']}={e['value']}" for e in service["entries"] if e.get("key") == "Environment"]


@pytest.mark.parametrize(
    ("env_lines", "expected"),
    [
        # no assignment: a new line after the last Environment= line
        (['Environment=CUDA_VISIBLE_DEVICES=0,1'],
         ['Environment=CUDA_VISIBLE_DEVICES=0,1', 'Environment=SGLANG_DDTREE_BUDGET=auto']),
        # the exact line stays where it is (a second run changes nothing)
        (['Environment=SGLANG_DDTREE_BUDGET=auto', 'Environment=A=1'],
         ['Environment=SGLANG_DDTREE_BUDGET=auto', 'Environment=A=1']),
        # another value: taken out of its line (the line's other words kept, quoted), the new line at the end
        (['Environment="HF_HOME=/data/hf cache" SGLANG_DDTREE_BUDGET=4', 'Environment=A=1'],
         ['Environment="HF_HOME=/data/hf cache"', 'Environment=A=1', 'Environment=SGLANG_DDTREE_BUDGET=auto']),
        # a line left empty is dropped; a later assignment (which would win) is removed too
        (['Environment=SGLANG_DDTREE_BUDGET=4', 'Environment=SGLANG_DDTREE_BUDGET=auto',
          'Environment=B=2 SGLANG_DDTREE_BUDGET=8'],
         ['Environment=SGLANG_DDTREE_BUDGET=auto', 'Environment=B=2']),
        # a name that only starts like it is another variable
        (['Environment=SGLANG_DDTREE_BUDGET_X=1'],
         ['Environment=SGLANG_DDTREE_BUDGET_X=1', 'Environment=SGLANG_DDTREE_BUDGET=auto']),
        # no Environment= line at all: at the end of [Service]
        ([], ['Environment=SGLANG_DDTREE_BUDGET=auto']),
    ],
    ids=["added", "kept-in-place", "replaced", "duplicates-removed", "prefix-name", "no-env-lines"],
)
def test_unit_set_env(env_lines, expected):
    text = "[Unit]\nDescription=x\n\n[Service]\nUser=root\n" + "\n".join(env_lines) + \
        "\nExecStart=/py -m srv\n; note\n\n[Install]\nWantedBy=multi-user.target\n"
    sections = f.systemd_unit_parse(text)
    got = f.systemd_unit_set_env(sections, "SGLANG_DDTREE_BUDGET", "auto")
    assert _service_env_lines(got) == expected
    assert got[0] == sections[0] and got[2] == sections[2]  # other sections untouched
    keys = [e.get("key", e.get("comment")) for e in got[1]["entries"]]
    assert keys[:1] == ["User"] and "ExecStart" in keys and "; note" in keys
    # rendered and parsed again, then set again: nothing moves (idempotent)
    rendered = render(got, ["/py", "-m", "srv"])
    again = f.systemd_unit_set_env(f.systemd_unit_parse(rendered), "SGLANG_DDTREE_BUDGET", "auto")
    assert _service_env_lines(again) == expected


def test_unit_set_env_quotes_a_value_with_spaces_and_refuses_bad_input():
    sections = f.systemd_unit_parse("[Service]\nExecStart=/py\n")
    assert _service_env_lines(f.systemd_unit_set_env(sections, "X", "a b")) == ['Environment="X=a b"']
    for args, word in [(("1X", "v"), "not an environment variable name"), (("X", "a\nb"), "one line of text"),
                       (("X", True), "one line of text")]:
        with pytest.raises(AnsibleFilterError, match=word):
            f.systemd_unit_set_env(sections, *args)
    with pytest.raises(AnsibleFilterError, match="no \\[Service\\] section"):
        f.systemd_unit_set_env(f.systemd_unit_parse("[Unit]\nA=1\n"), "X", "v")


S = "[Service]\n"  # the section whose Environment= lines count


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (S + "Environment=SGLANG_DDTREE_BUDGET=8\n", ["SGLANG_DDTREE_BUDGET"]),
        # systemd joins a line ending in a backslash with the next one
        (S + "Environment=A=1 \\\n  SGLANG_DDTREE_BUDGET=8\n", ["A", "SGLANG_DDTREE_BUDGET"]),
        # a comment line inside the continuation is skipped, the continuation goes on after it
        (S + "Environment=A=1 \\\n# SGLANG_DDTREE_BUDGET=8 \\\n  B=2\n", ["A", "B"]),
        # a comment does not continue: the next line is an assignment of its own
        (S + "# Environment=X=1 \\\nEnvironment=SGLANG_DDTREE_BUDGET=8\n", ["SGLANG_DDTREE_BUDGET"]),
        (S + "#Environment=SGLANG_DDTREE_BUDGET=8\n; Environment=SGLANG_DDTREE_BUDGET=8\n", []),
        # quoting and escapes of Environment= words
        (S + 'Environment="SGLANG_DDTREE_BUDGET=8" "X=1"\n', ["SGLANG_DDTREE_BUDGET", "X"]),
        (S + "Environment='SGLANG_DDTREE_BUDGET=8 9' Y=\"a b\"\n", ["SGLANG_DDTREE_BUDGET", "Y"]),
        (S + 'Environment=SGLANG_DDTREE_BUDGET"=8"\n', ["SGLANG_DDTREE_BUDGET"]),
        (S + "Environment=SGLANG_DDTREE_\\x42UDGET=8\n", ["SGLANG_DDTREE_BUDGET"]),
        (S + 'Environment="A=1 SGLANG_DDTREE_BUDGET=8"\n', ["A"]),  # one word: A's value
        # systemd has no comment at the end of a line: '#' is a word (not an assignment), the next one sets
        (S + "Environment=A=1 # SGLANG_DDTREE_BUDGET=8\n", ["A", "SGLANG_DDTREE_BUDGET"]),
        # the name inside another variable's value, or a longer name
        (S + "Environment=NOTE=SGLANG_DDTREE_BUDGET=8\n", ["NOTE"]),
        (S + "Environment=MY_SGLANG_DDTREE_BUDGET=1 SGLANG_DDTREE_BUDGET_X=2\n",
         ["MY_SGLANG_DDTREE_BUDGET", "SGLANG_DDTREE_BUDGET_X"]),
        # only [Service] (section names are case-sensitive), and only the Environment key
        ("[Unit]\nEnvironment=SGLANG_DDTREE_BUDGET=8\n[service]\nEnvironment=X=1\n[X-Service]\nEnvironment=Y=1\n",
         []),
        ("Environment=SGLANG_DDTREE_BUDGET=8\n[Unit]\nDescription=x\n", []),  # before any section
        ("[Unit]\nDescription=x\n" + S + "Environment=A=1\n[Install]\nWantedBy=multi-user.target\n"
         + S + " Environment = B=2\n", ["A", "B"]),
        (S + "environment=X=1\nEnvironmentFile=/etc/x\nUnsetEnvironment=Y\nExecStart=/bin/env Z=1 x\n", []),
        # words that are no assignment (systemd ignores them): no '=', an invalid or empty name
        (S + "Environment=SGLANG_DDTREE_BUDGET\n", []),
        (S + 'Environment==8 1X=1 BAD-NAME=1 "" "A\\n=1" OK=1\n', ["OK"]),
        # an empty Environment= resets the list: what came before it is gone
        (S + "Environment=SGLANG_DDTREE_BUDGET=8 A=1\nEnvironment=\nEnvironment=B=2\n", ["B"]),
        (S + "Environment=SGLANG_DDTREE_BUDGET=8\nEnvironment=  \n", []),
        (S + "Environment=\nEnvironment=SGLANG_DDTREE_BUDGET=8\n", ["SGLANG_DDTREE_BUDGET"]),
        # an unterminated quote: the words before it count, systemd ignores the rest of the line
        (S + 'Environment=A=1 "SGLANG_DDTREE_BUDGET=8\nEnvironment=B=2\n', ["A", "B"]),
        # each name once, sorted
        (S + "Environment=B=1 A=1\nEnvironment=B=2\n", ["A", "B"]),
        ("", []),
        (None, []),
    ],
    ids=["plain", "continuation", "comment-in-continuation", "comment-does-not-continue", "commented-out",
         "double-quoted-words", "single-quoted-word", "quote-inside-word", "escaped-name", "name-in-quoted-value",
         "hash-is-a-word", "name-in-value", "prefix-and-suffix-names", "other-sections", "before-any-section",
         "several-service-sections", "other-keys", "no-assignment", "invalid-names", "reset-line",
         "reset-at-the-end", "reset-then-set", "unterminated-quote", "sorted-once", "empty", "none"],
)
def test_unit_env_names(text, names):
    assert f.systemd_unit_env_names(text) == names


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (S + "Environment=\nEnvironment=A=1\n", ["=", "A"]),  # the reset drops the unit file's lines: marked
        (S + "Environment=A=1\n", ["A"]),
        ("[Unit]\nEnvironment=\n" + S + "Environment=A=1\n", ["A"]),  # not [Service]: no reset
        (S + "Environment=  \n", ["="]),
    ],
)
def test_unit_env_names_marks_a_reset_when_asked(text, names):
    assert f.systemd_unit_env_names(text, reset_marker="=") == names
    assert "=" not in f.systemd_unit_env_names(text)


def test_unit_env_names_never_returns_a_value_and_needs_text():
    text = S + 'Environment=HF_TOKEN=hf-secret-1 "DB_URL=postgres://u:pw-secret-2@h/db"\n'
    got = f.systemd_unit_env_names(text)
    assert got == ["DB_URL", "HF_TOKEN"] and "secret" not in repr(got)
    for bad in ([], {"content": "x"}, 1):
        with pytest.raises(AnsibleFilterError, match="expects a unit file's text"):
            f.systemd_unit_env_names(bad)


@pytest.mark.parametrize(
    ("argv", "lines"),
    [
        (["/py", "-m", "sglang.launch_server", "--tp-size", "2"], ["/py -m sglang.launch_server", "--tp-size 2"]),
        (["/py", "-m", "s", "--x", "-1", "--flag", "--y", "a", "b"], ["/py -m s", "--x -1", "--flag", "--y a b"]),
        (["/py", "--model-path", "/a b"], ["/py", '--model-path "/a b"']),
        # the words are in the unit file's form (sglang_capabilities escapes new values: 50%% means 50%, %n is the
        # unit's specifier): written as they are, never escaped twice
        (["/py", "--frac", "50%%"], ["/py", "--frac 50%%"]),
        (["/py", "--log", "/var/log/%n"], ["/py", "--log /var/log/%n"]),
        (["/py", "--json", '{"a": 1}'], ["/py", '--json "{\\"a\\": 1}"']),
        (["/py", "--empty", ""], ["/py", '--empty ""']),
        (["/py", "--path", "${HOME}/x"], ["/py", "--path ${HOME}/x"]),
    ],
)
def test_exec_lines(argv, lines):
    assert f.systemd_exec_lines(argv) == lines


@pytest.mark.parametrize("bad", [[], "python -m x", None])
def test_exec_lines_rejects(bad):
    with pytest.raises(AnsibleFilterError, match="non-empty list"):
        f.systemd_exec_lines(bad)


@pytest.mark.parametrize(
    ("argv", "names", "default", "expected"),
    [
        (["p", "--tp-size", "2"], ["--tp-size", "--tp"], 1, "2"),
        (["p", "--tp", "4"], ["--tp-size", "--tp"], 1, "4"),
        (["p", "--port=31000"], "--port", 30000, "31000"),
        (["p"], "--port", 30000, 30000),
        (["p", "--tp-size", "2", "--tp-size", "8"], "--tp-size", 1, "8"),
        (["p", "--enable-x", "--port", "1"], "--enable-x", False, True),
        (["p", "--enable-x"], "--enable-x", False, True),
        (["p", "--tp-sizes", "2"], "--tp-size", 1, 1),
    ],
)
def test_sglang_flag(argv, names, default, expected):
    assert f.sglang_flag(argv, names, default) == expected


# The memory-pool flags the GPU fit reads, typed as SGLang's argparse types them (0.5.17 and 0.5.23: type=int for
# --max-running-requests and --max-mamba-cache-size, type=float for --mamba-full-memory-ratio, store_true for
# --disable-radix-cache). Each row: the words after the program, the flag, the default, the type, the value.
SERVER = ["-m", "sglang.launch_server", "--model-path", "/m"]


@pytest.mark.parametrize(
    ("words", "name", "default", "kind", "expected"),
    [
        pytest.param([], "--disable-radix-cache", False, "bool", False, id="radix-absent"),
        pytest.param([], "--disable-radix-cache", None, "bool", False, id="radix-absent-default-none"),
        pytest.param(["--disable-radix-cache"], "--disable-radix-cache", False, "bool", True, id="radix-last-word"),
        pytest.param(
            ["--disable-radix-cache", "--port", "1"], "--disable-radix-cache", False, "bool", True, id="radix-present"
        ),
        pytest.param(
            ["--disable-radix-cache-x"], "--disable-radix-cache", False, "bool", False, id="radix-longer-name"
        ),
        pytest.param(["--max-running-requests=8"], "--max-running-requests", None, "int", 8, id="running-equals"),
        pytest.param(["--max-running-requests", "8"], "--max-running-requests", None, "int", 8, id="running-space"),
        pytest.param(
            ["--max-running-requests", "8", "--max-running-requests=32"],
            "--max-running-requests",
            None,
            "int",
            32,
            id="running-last-wins",
        ),
        pytest.param([], "--max-running-requests", None, "int", None, id="running-absent"),
        pytest.param(["--max-running-requests", "-1"], "--max-running-requests", None, "int", -1, id="running-neg"),
        pytest.param(["--max-mamba-cache-size", "64"], "--max-mamba-cache-size", None, "int", 64, id="mamba-cache"),
        pytest.param(["--max-mamba-cache-size=1_000"], "--max-mamba-cache-size", None, "int", 1000, id="underscore"),
        pytest.param(
            ["--mamba-full-memory-ratio", "0.5"], "--mamba-full-memory-ratio", None, "float", 0.5, id="ratio"
        ),
        pytest.param(["--mamba-full-memory-ratio=2"], "--mamba-full-memory-ratio", None, "float", 2.0, id="ratio-int"),
        pytest.param([], "--mamba-full-memory-ratio", None, "float", None, id="ratio-absent"),
        # systemd expands $VAR / ${VAR} when it starts the command: a valid unit, the value unknown here
        pytest.param(["--max-running-requests", "${N}"], "--max-running-requests", None, "int", None, id="var"),
        pytest.param(["--max-running-requests=$N"], "--max-running-requests", 48, "int", 48, id="var-default"),
        pytest.param(
            ["--max-running-requests", "8", "--max-running-requests", "${N}"],
            "--max-running-requests",
            None,
            "int",
            None,
            id="var-last-wins",
        ),
        pytest.param(["--port", "31000"], "--port", 30000, "raw", "31000", id="raw-as-before"),
    ],
)
def test_sglang_flag_typed(words, name, default, kind, expected):
    got = f.sglang_flag([*SERVER, *words], name, default, kind)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    ("words", "name", "kind", "message"),
    [
        pytest.param(
            ["--max-running-requests", "eight"], "--max-running-requests", "int",
            "--max-running-requests='eight': not an integer (SGLang's argparse reads it with type=int",
            id="running-not-int",
        ),
        pytest.param(
            ["--max-running-requests=8.0"], "--max-running-requests", "int", "--max-running-requests='8.0': not an",
            id="running-float",
        ),
        pytest.param(
            ["--max-running-requests", "--port", "1"], "--max-running-requests", "int",
            "--max-running-requests has no value: SGLang's argparse expects one argument, an integer",
            id="running-no-value",
        ),
        pytest.param(
            ["--mamba-full-memory-ratio", "high"], "--mamba-full-memory-ratio", "float",
            "--mamba-full-memory-ratio='high': not a number (SGLang's argparse reads it with type=float",
            id="ratio-not-float",
        ),
        pytest.param(
            ["--disable-radix-cache=true"], "--disable-radix-cache", "bool",
            "'--disable-radix-cache=true': --disable-radix-cache is a switch without a value", id="radix-equals",
        ),
        pytest.param(
            ["--disable-radix-cache", "yes"], "--disable-radix-cache", "bool",
            "--disable-radix-cache 'yes': --disable-radix-cache is a switch without a value", id="radix-word-after",
        ),
    ],
)  # fmt: skip
def test_sglang_flag_typed_refuses_what_sglang_refuses(words, name, kind, message):
    with pytest.raises(AnsibleFilterError) as info:
        f.sglang_flag([*SERVER, *words], name, None, kind)
    assert message in str(info.value)
    assert "fix it in the unit's ExecStart (or sglang_preflight_extra_args)" in str(info.value)


def test_sglang_flag_rejects_an_unknown_type():
    with pytest.raises(AnsibleFilterError, match="type='str', choose one of raw, int, float, bool"):
        f.sglang_flag(["p"], "--port", None, "str")


def test_dflash_check_real_pair_is_ok():
    result = f.dflash_drafter_check(load("qwen3-8b-dflash-b16"), load("qwen3-8b"))
    assert result["ok"], result["errors"]
    assert result["drafter"]["block_size"] == 16
    assert result["drafter"]["target_layer_ids"] == [1, 9, 17, 25, 33]
    assert result["target"]["num_hidden_layers"] == 36


def test_dflash_check_reads_text_config_of_multimodal_targets():
    result = f.dflash_drafter_check(load("qwen3-8b-dflash-b16"), load("qwen3.6-27b-like"))
    assert not result["ok"]
    assert result["target"]["num_hidden_layers"] == 64
    joined = " ".join(result["errors"])
    assert "hidden_size 4096 != target hidden_size 5120" in joined
    assert "vocab_size 151936 != target vocab_size 248320" in joined
    assert "num_target_layers 36 != target num_hidden_layers 64" in joined


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 36]}}, r"\[36\] are outside"),
        ({"dflash_config": {"mask_token_id": 151669, "target_layer_ids": []}}, "non-empty list"),
        ({"dflash_config": {"mask_token_id": 999999, "target_layer_ids": [1]}}, "mask_token_id 999999"),
        ({"vocab_size": 1000}, "vocab_size 1000 != target vocab_size 151936"),
        ({"hidden_size": None}, "hidden_size missing"),
    ],
)
def test_dflash_check_each_problem_is_named(change, message):
    drafter = {**load("qwen3-8b-dflash-b16"), **change}
    result = f.dflash_drafter_check(drafter, load("qwen3-8b"))
    assert not result["ok"]
    assert any(re.search(message, e) for e in result["errors"]), result["errors"]


@pytest.mark.parametrize(
    "change",
    [{"architectures": ["Qwen3ForCausalLM"]}, {"block_size": 1}, {"block_size": None}],
    ids=["architecture", "block-size-1", "no-block-size"],
)
def test_dflash_check_leaves_the_drafter_itself_to_the_plugin_cli(change):
    # One place decides whether the drafter itself can be served: python -m sglang_ddtree check-drafter (run by
    # sglang_preflight). This filter only compares drafter and target, so it no longer repeats those checks.
    drafter = {**load("qwen3-8b-dflash-b16"), **change}
    assert f.dflash_drafter_check(drafter, load("qwen3-8b"))["ok"]


def test_dflash_check_uses_the_plugin_resolved_target_layers():
    # config.json names only num_target_layers: the plugin resolves z-lab's default ids; the filter checks those.
    drafter = load("qwen3-8b-dflash-b16")
    drafter["dflash_config"].pop("target_layer_ids", None)
    drafter.pop("target_layer_ids", None)
    assert not f.dflash_drafter_check(drafter, load("qwen3-8b"))["ok"]
    spec = {"target_layer_ids": [1, 9, 17, 25, 33], "block_size": 16, "mask_token_id": 151669}
    result = f.dflash_drafter_check(drafter, load("qwen3-8b"), spec)
    assert result["ok"], result["errors"]
    assert result["drafter"]["target_layer_ids"] == [1, 9, 17, 25, 33]
    bad = f.dflash_drafter_check(drafter, load("qwen3-8b"), {**spec, "target_layer_ids": [1, 40]})
    assert any("[40] are outside the target's 36 layers" in e for e in bad["errors"]), bad["errors"]
    with pytest.raises(AnsibleFilterError, match="spec must be"):
        f.dflash_drafter_check(drafter, load("qwen3-8b"), ["not", "a", "dict"])


def test_dflash_check_block_size_inside_dflash_config():
    drafter = load("qwen3-8b-dflash-b16")
    drafter["dflash_config"]["block_size"] = drafter.pop("block_size")
    assert f.dflash_drafter_check(drafter, load("qwen3-8b"))["drafter"]["block_size"] == 16


DRAFTER_OK = '{\n "consumer": "sglang",\n "ok": true,\n "problems": [],\n "spec": {"block_size": 16}\n}\n'
DRAFTER_REFUSED = (
    '{\n "consumer": "sglang",\n "ok": false,\n "problems": ["output_multiplier=2.0: DDTREE in SGLang does not '
    'apply it (...); only 1.0 is supported"],\n "spec": {"block_size": 16}\n}\n'
)
SGLANG_PLUGIN = (
    'INFO sglang: loading plugins\n{\n "implementation": "plugin",\n "detail": "sglang_ddtree.sglang.spec_algo.'
    'DDTreeSpecAlgo",\n "ok": true,\n "problem": null,\n "sglang": "0.5.23"\n}\n'
)
SGLANG_NONE = (
    '{\n "implementation": null,\n "ok": false,\n "plugin_status": "skipped: sglang 0.5.9 has no plugin API",\n'
    ' "problem": "DDTREE is not registered: skipped: sglang 0.5.9 has no plugin API"\n}\n'
)


@pytest.mark.parametrize(
    ("result", "command", "ok", "problems", "extra"),
    [
        ({"rc": 0, "stdout": DRAFTER_OK, "stderr": ""}, "check-drafter", True, [], {"spec": {"block_size": 16}}),
        (
            {"rc": 1, "stdout": DRAFTER_REFUSED, "stderr": ""},
            "check-drafter",
            False,
            ["output_multiplier=2.0: DDTREE in SGLang does not apply it (...); only 1.0 is supported"],
            {},
        ),
        (  # an interpreter that cannot import the plugin (torch missing, say): no report, the reason from stderr
            {
                "rc": 1,
                "stdout": "",
                "stderr": "Traceback ...\n  File x\nModuleNotFoundError: No module named 'torch'\n",
            },
            "check-drafter",
            False,
            [
                "python -m sglang_ddtree check-drafter exited with status 1 and printed no report: Traceback ... | "
                "File x | ModuleNotFoundError: No module named 'torch'"
            ],
            {"ran": False},
        ),
        (  # a report that says ok with a non-zero exit is not ok
            {"rc": 2, "stdout": DRAFTER_OK, "stderr": ""},
            "check-drafter",
            False,
            ["python -m sglang_ddtree check-drafter exited with status 2"],
            {},
        ),
        (
            {"rc": 0, "stdout": SGLANG_PLUGIN, "stderr": "warnings"},
            "check-sglang",
            True,
            [],
            {"implementation": "plugin", "detail": "sglang_ddtree.sglang.spec_algo.DDTreeSpecAlgo"},
        ),
        (
            {"rc": 1, "stdout": SGLANG_NONE, "stderr": ""},
            "check-sglang",
            False,
            ["DDTREE is not registered: skipped: sglang 0.5.9 has no plugin API"],
            {"implementation": None},
        ),
        (
            {"rc": 1, "stdout": "", "stderr": ""},
            "check-sglang",
            False,
            ["python -m sglang_ddtree check-sglang exited with status 1 and printed no report"],
            {"implementation": None, "ran": False},
        ),
    ],
    ids=["drafter-ok", "drafter-refused", "no-report", "ok-but-rc", "plugin", "none", "silent-crash"],
)
def test_sglang_ddtree_cli_reads_the_plugin_checks(result, command, ok, problems, extra):
    out = f.sglang_ddtree_cli(result, command)
    assert out["ok"] is ok
    assert out["problems"] == problems
    assert out["rc"] == result["rc"]
    for key, value in extra.items():
        assert out[key] == value, (key, out)


def test_sglang_ddtree_cli_refuses_what_it_cannot_read():
    with pytest.raises(AnsibleFilterError, match="registered command result"):
        f.sglang_ddtree_cli("text", "check-drafter")
    with pytest.raises(AnsibleFilterError, match="is not check-drafter or check-sglang"):
        f.sglang_ddtree_cli({"rc": 0}, "generate")


def test_unit_header_keeps_leading_comments_only():
    assert f.systemd_unit_header(UNIT) == ["# hand-written header, dropped", "#"]
    assert f.systemd_unit_header("[Unit]\n# inside\n") == []
    with pytest.raises(AnsibleFilterError, match="expects the unit file's text"):
        f.systemd_unit_header(None)


def test_filters_are_registered():
    assert set(f.FilterModule().filters()) == {
        "pivot_report_disagreements",
        "systemd_unit_parse",
        "systemd_unit_header",
        "systemd_unit_set_env",
        "systemd_unit_env_names",
        "systemd_exec_lines",
        "dflash_drafter_check",
        "sglang_ddtree_cli",
        "sglang_flag",
        "generation_compare",
        "pip_freeze_find",
        "pivot_secrets",
        "pivot_mask",
        "pivot_unmask",
        "pivot_listen_warning",
        "pivot_duration",
        "pivot_si",
        "pivot_seconds_between",
    }
    docs = {p.stem for p in (Path(f.__file__).parent).glob("*.yml")}
    assert docs == set(f.FilterModule().filters()), "every filter has its documentation file"


# ---------------------------------------------------------------------------------------------- generation_compare
def probe(outputs: list[list[int]], tps: float, accept: list[float | None] | None = None, server_avg=None) -> dict:
    accept = accept or [None] * len(outputs)
    return {
        "ok": True,
        "error": "",
        "tokens_per_s": tps,
        "server": {"speculative_algorithm": "X", "avg_spec_accept_length": server_avg},
        "results": [
            {
                "prompt": f"p{i}",
                "output_ids": ids,
                "text": " ".join(map(str, ids)),
                "completion_tokens": len(ids),
                "spec_accept_length": acc,
            }
            for i, (ids, acc) in enumerate(zip(outputs, accept, strict=True))
        ],
    }


def test_compare_agreement_and_first_divergence():
    before = probe([[1, 2, 3, 4], [5, 6, 7, 8], [9, 9]], 100.0)
    after = probe([[1, 2, 3, 4], [5, 6, 0, 8], [9, 9, 1]], 150.0, [2.5, 3.5, None], server_avg=2.0)
    out = f.generation_compare(before, after)
    assert (out["prompts"], out["agreeing"], out["disagreeing"]) == (3, 1, 2)
    assert [p["first_divergence"] for p in out["per_prompt"]] == [None, 2, 2]  # prefix: the shorter length
    assert [p["agree"] for p in out["per_prompt"]] == [True, False, False]
    assert out["per_prompt"][1]["unit"] == "token"
    assert out["tokens_per_s"] == {"before": 100.0, "after": 150.0}
    assert out["speedup"] == 1.5
    assert out["accept_length"] == {"mean_per_request": 3.0, "server_avg": 2.0, "value": 3.0}
    assert out["gate"] == {
        "enabled": False,
        "passed": True,
        "failures": [],
        "min_speedup": 0.0,
        "max_disagreements": -1,
        "min_accept_length": 0.0,
    }


def test_compare_falls_back_to_text_and_server_average():
    before = probe([[1, 2]], 10.0)
    after = probe([[1, 2]], 10.0, server_avg=1.75)
    for r in before["results"] + after["results"]:
        del r["output_ids"]
    after["results"][0]["text"] = "1 3"
    out = f.generation_compare(before, after)
    assert out["per_prompt"][0] | {"before_text": None, "after_text": None} == {
        "index": 0,
        "prompt": "p0",
        "agree": False,
        "first_divergence": 2,
        "unit": "char",
        "before_tokens": 2,
        "after_tokens": 2,
        "before_text": None,
        "after_text": None,
    }
    assert out["accept_length"]["value"] == 1.75


@pytest.mark.parametrize(
    ("limits", "passed", "needle"),
    [
        ((1.2, -1, 0), True, None),
        ((2.0, -1, 0), False, r"speedup 1.5x .* below the minimum 2x"),
        ((0, 0, 0), False, r"1 of 2 prompts disagree .*allowed 0.*prompt 1 diverges at token 1"),
        ((0, 1, 0), True, None),
        ((0, -1, 3.0), True, None),
        ((0, -1, 3.5), False, r"acceptance length 3.25 is below the minimum 3.5"),
    ],
)
def test_compare_gate_limits(limits, passed, needle):
    before = probe([[1, 2], [3, 4]], 10.0)
    after = probe([[1, 2], [3, 5]], 15.0, [3.0, 3.5])
    gate = f.generation_compare(before, after, *limits)["gate"]
    assert gate["enabled"] and gate["passed"] is passed
    if needle:
        assert len(gate["failures"]) == 1 and re.search(needle, gate["failures"][0]), gate["failures"]
    else:
        assert gate["failures"] == []


def test_compare_gate_fails_when_it_cannot_be_evaluated():
    after = probe([[1, 2]], 15.0)  # no acceptance length reported
    out = f.generation_compare(None, after, 1.1, 0, 2.0)
    assert out["baseline"] is False and out["prompts"] == 0 and out["speedup"] is None
    fails = out["gate"]["failures"]
    assert not out["gate"]["passed"] and len(fails) == 3
    assert "no baseline tokens/s" in fails[0] and "no baseline to compare" in fails[1]
    assert "reports none" in fails[2]
    # Without a gate, a missing baseline is only reported.
    assert f.generation_compare(None, after)["gate"]["passed"] is True


def test_compare_failed_probe_fails_an_enabled_gate_only():
    failed = {"ok": False, "error": "connection refused", "results": []}
    assert f.generation_compare(probe([[1]], 1.0), failed)["gate"]["passed"] is True
    gate = f.generation_compare(probe([[1]], 1.0), failed, 0, 0)["gate"]
    assert not gate["passed"] and "probe failed: connection refused" in gate["failures"][0]


def test_compare_refuses_mismatched_prompt_sets_and_bad_limits():
    with pytest.raises(AnsibleFilterError, match="baseline has 2 prompts and the new run 1"):
        f.generation_compare(probe([[1], [2]], 1.0), probe([[1]], 1.0))
    with pytest.raises(AnsibleFilterError, match="gate limits must be numbers"):
        f.generation_compare(probe([[1]], 1.0), probe([[1]], 1.0), "fast")
    with pytest.raises(AnsibleFilterError, match="as dicts"):
        f.generation_compare(probe([[1]], 1.0), [1])


# ---------------------------------------------------------------------------------------------- pip_freeze_find
FREEZE = """pip==24.0
Sglang_DDTree @ file:///var/lib/specdec-pivot/wheels/sglang_ddtree-0.1.0-py3-none-any.whl
torch==2.13.0+cpu
-e git+https://example.invalid/x.git@abc#egg=editable_pkg
sglang[all]==0.5.23
"""


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("torch", {"present": True, "version": "2.13.0+cpu", "url": None, "line": "torch==2.13.0+cpu"}),
        (
            "sglang-ddtree",
            {
                "present": True,
                "version": "0.1.0",
                "url": "file:///var/lib/specdec-pivot/wheels/sglang_ddtree-0.1.0-py3-none-any.whl",
                "line": FREEZE.splitlines()[1],
            },
        ),
        ("sglang", {"present": True, "version": "0.5.23", "url": None, "line": "sglang[all]==0.5.23"}),
        (
            "editable.pkg",
            {
                "present": True,
                "version": None,
                "url": "git+https://example.invalid/x.git@abc#egg=editable_pkg",
                "line": FREEZE.splitlines()[3],
            },
        ),
        ("sglang-ddtre", {"present": False, "version": None, "url": None, "line": None}),
    ],
)
def test_pip_freeze_find(name, expected):
    assert f.pip_freeze_find(FREEZE, name) == expected


def test_pip_freeze_find_needs_text_and_name():
    with pytest.raises(AnsibleFilterError, match="snapshot's text"):
        f.pip_freeze_find(None, "x")
    assert f.pip_freeze_find("", "x")["present"] is False
