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


@pytest.mark.parametrize(
    ("argv", "lines"),
    [
        (["/py", "-m", "sglang.launch_server", "--tp-size", "2"], ["/py -m sglang.launch_server", "--tp-size 2"]),
        (["/py", "-m", "s", "--x", "-1", "--flag", "--y", "a", "b"], ["/py -m s", "--x -1", "--flag", "--y a b"]),
        (["/py", "--model-path", "/a b"], ["/py", '--model-path "/a b"']),
        (["/py", "--frac", "50%"], ["/py", "--frac 50%%"]),
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
        ({"architectures": ["Qwen3ForCausalLM"]}, "not a DFlash drafter"),
        ({"block_size": 1}, "block_size"),
        ({"block_size": None}, "block_size"),
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


def test_dflash_check_block_size_inside_dflash_config():
    drafter = load("qwen3-8b-dflash-b16")
    drafter["dflash_config"]["block_size"] = drafter.pop("block_size")
    assert f.dflash_drafter_check(drafter, load("qwen3-8b"))["drafter"]["block_size"] == 16


def test_unit_header_keeps_leading_comments_only():
    assert f.systemd_unit_header(UNIT) == ["# hand-written header, dropped", "#"]
    assert f.systemd_unit_header("[Unit]\n# inside\n") == []
    with pytest.raises(AnsibleFilterError, match="expects the unit file's text"):
        f.systemd_unit_header(None)


def test_filters_are_registered():
    assert set(f.FilterModule().filters()) == {
        "systemd_unit_parse",
        "systemd_unit_header",
        "systemd_exec_lines",
        "dflash_drafter_check",
        "sglang_flag",
    }
