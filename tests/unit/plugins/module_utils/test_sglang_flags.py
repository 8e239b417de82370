"""Tables for plugins/module_utils/_sglang_flags.py: SGLang's speculative flags replaced.

Inputs are recorded from real software where it exists: ``launch_server --help`` of the real sglang wheels
(tests/unit/fixtures/sglang_help). Command lines written here are the test's own inputs.
"""

from __future__ import annotations

import pytest
from ansible_collections.specdec.pivot.plugins.module_utils import _exec_start
from ansible_collections.specdec.pivot.plugins.module_utils import _sglang_flags as s
from sglang_recordings import help_text

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
    parsed = _exec_start.parse_exec_start(value)
    before = dict(parsed["flags"])
    flags = s.replace_speculative_flags(parsed["flags"], new)
    assert list(flags) == order
    for k, v in values.items():
        assert flags[k] == v
    assert parsed["flags"] == before, "the input must not change"
    for k in flags:
        if not s.is_speculative_flag(k):
            assert k in before or k in {s.normalize_flag(n) for n in new}
    rendered = _exec_start.render_exec_start(dict(parsed, flags=flags))
    assert _exec_start.parse_exec_start(rendered)["flags"] == flags


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
    parsed = _exec_start.parse_exec_start(NEXTN)
    assert list(s.speculative_flags(parsed["flags"])) == [
        "--speculative-algorithm",
        "--speculative-num-steps",
        "--speculative-eagle-topk",
        "--speculative-num-draft-tokens",
        "--enable-multi-layer-eagle",
    ]
