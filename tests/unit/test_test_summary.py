"""scripts/test_summary.py, the closing summary of scripts/test.sh, on made-up run directories: every declared stage is
named as passed, FAILED (with its first error line) or NOT RUN (with why), each failing test is named, and the exit
status says whether everything passed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test_summary.py"
_spec = importlib.util.spec_from_file_location("test_summary", SCRIPT)
summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(summary)

SHELLCHECK = """\
shellcheck 0.11.0 (/repo/.venv-lint/bin/shellcheck)

In scripts/test-installed-collection.sh line 58:
[ -f "$report" ] && [ -f "$work/run/reports/pivot-report.md" ] \\
                 ^-- SC2015 (info): Note that A && B || C is not if-then-else. C may run when A is true.

For more information:
  https://www.shellcheck.net/wiki/SC2015 -- Note that A && B || C is not if-t...
"""
RUFF = """\
ruff 0.17.5 (/repo/.venv/bin/ruff)
F401 [*] `os` imported but unused
 --> plugins/modules/x.py:1:8
  |
1 | import os
  |        ^^

Found 1 error.
"""
YAMLLINT = """\
All checks passed!
yamllint 1.38.0 (/repo/.venv/bin/yamllint)
roles/x/tasks/main.yml
  3:1       error    duplication of key "key" in mapping  (key-duplicates)
"""
PYTEST = """\
........F.....                                                       [100%]
=================================== FAILURES ===================================
E       AssertionError: assert 1 == 2
=========================== short test summary info ============================
FAILED tests/unit/test_x.py::test_y - AssertionError: assert 1 == 2
1 failed, 13 passed in 0.52s
"""
ANSIBLE_TEST = """\
Running sanity test "pylint"
ERROR: Found 1 pylint issue(s) which need to be resolved:
ERROR: plugins/modules/x.py:3:0: unused-import: Unused import os
"""
ANSIBLE = """\
TASK [a check that may fail] ***************************************************
fatal: [pro6000]: FAILED! => {"changed": false, "msg": "expected"}
...ignoring
TASK [the real one] ************************************************************
fatal: [pro6000]: FAILED! => {"changed": false, "msg": "the unit did not start"}
PLAY RECAP *********************************************************************
pro6000                    : ok=3    changed=0    unreachable=0    failed=1    skipped=0    rescued=0    ignored=1
"""


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (
            SHELLCHECK,
            "scripts/test-installed-collection.sh:58: SC2015 (info): Note that A && B || C is not if-then-else. "
            "C may run when A is true.",
        ),
        (RUFF, "plugins/modules/x.py:1:8: F401 [*] `os` imported but unused"),
        (YAMLLINT, 'roles/x/tasks/main.yml:3:1: error: duplication of key "key" in mapping  (key-duplicates)'),
        (PYTEST, "FAILED tests/unit/test_x.py::test_y - AssertionError: assert 1 == 2"),
        (ANSIBLE_TEST, "ERROR: plugins/modules/x.py:3:0: unused-import: Unused import os"),
        (ANSIBLE, 'fatal: [pro6000]: FAILED! => {"changed": false, "msg": "the unit did not start"}'),
        ("--- sglang 0.5.18\n4 passed\na release's tests failed (above)\n\n", "a release's tests failed (above)"),
        ("", ""),
    ],
    ids=["shellcheck", "ruff", "yamllint", "pytest", "ansible-test", "ansible-ignored-fatal", "last-line", "empty"],
)
def test_first_error(output, expected):
    assert summary.first_error(output) == expected


def test_first_error_is_cut():
    assert summary.first_error("error: " + "x" * 1000) == ("error: " + "x" * 1000)[: summary.WIDTH - 3] + "..."


JUNIT_FAILING = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="4">
<testcase classname="tests.integration.test_pivot_faults" name="test_bad_wheel"/>
<testcase classname="tests.integration.test_pivot_faults" name="test_rollback">
<failure message="AssertionError: the unit was not restored&#10;second line">trace</failure></testcase>
<testcase classname="tests.integration.test_pivot_faults" name="test_skipped"><skipped/></testcase>
<testcase classname="tests.integration.test_pivot_faults" name="test_ok"/>
</testsuite></testsuites>
"""
JUNIT_PASSING = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="0" skipped="0" tests="2">
<testcase classname="tests.unit.test_a" name="test_1"/><testcase classname="tests.unit.test_a" name="test_2"/>
</testsuite></testsuites>
"""


def make_run(tmp_path: Path, groups: dict) -> Path:
    """A run directory as scripts/test.sh leaves it. groups: name -> {stages: [title...], results: [(rc, s)...],
    logs: {number: text}, rc: int or None, junit: {name: xml}}."""
    for sub in ("plan", "results", "rc", "stages", "junit"):
        (tmp_path / sub).mkdir(exist_ok=True)
    for group, g in groups.items():
        (tmp_path / "plan" / group).write_text("".join(f"{t}\tcommand {i}\n" for i, t in enumerate(g["stages"], 1)))
        (tmp_path / "results" / group).write_text(
            "".join(f"{i}\t{rc}\t{s}\t{g['stages'][i - 1]}\n" for i, (rc, s) in enumerate(g["results"], 1))
        )
        for number, text in g.get("logs", {}).items():
            (tmp_path / "stages" / f"{group}-{number}.log").write_text(text)
        for number in range(1, len(g["results"]) + 1):  # every stage that ended left a log
            (tmp_path / "stages" / f"{group}-{number}.log").touch()
        if g.get("rc") is not None:
            (tmp_path / "rc" / group).write_text(f"{g['rc']}\n")
        for name, xml in g.get("junit", {}).items():
            (tmp_path / "junit" / name).write_text(xml)
    return tmp_path


def run_summary(out: Path, *wall: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(out), *wall], capture_output=True, text=True, check=False)


def test_a_failing_run_names_every_stage(tmp_path):
    out = make_run(
        tmp_path,
        {
            "cpu": {
                "stages": ["lint: ruff, yamllint, ShellCheck, ansible-lint", "collection unit tests (pytest)",
                           "ansible-test sanity", "molecule test -s pivot"],
                "results": [(1, 4)],
                "logs": {1: SHELLCHECK},
                "rc": 1,
            },
            "lab": {
                "stages": ["pivot fault scenarios", "the lab pivot from the installed collection",
                           "lab integration tests"],
                "results": [(0, 300), (0, 95), (1, 160)],
                "logs": {3: PYTEST},
                "rc": 1,
                "junit": {"lab-1-1.xml": JUNIT_PASSING, "lab-3-1.xml": JUNIT_FAILING},
            },
        },
    )
    result = run_summary(out, "1234")
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "===== summary: 2 stages passed, 2 FAILED, 3 NOT RUN; wall 1234 s ====="
    assert lines[1:10] == [
        "cpu:",
        "  FAILED      4 s  lint: ruff, yamllint, ShellCheck, ansible-lint: exit 1: "
        "scripts/test-installed-collection.sh:58: SC2015 (info): Note that A && B || C is not if-then-else. "
        "C may run when A is true.",
        "  NOT RUN          collection unit tests (pytest): an earlier stage of the cpu group failed "
        "(lint: ruff, yamllint, ShellCheck, ansible-lint)",
        "  NOT RUN          ansible-test sanity: an earlier stage of the cpu group failed "
        "(lint: ruff, yamllint, ShellCheck, ansible-lint)",
        "  NOT RUN          molecule test -s pivot: an earlier stage of the cpu group failed "
        "(lint: ruff, yamllint, ShellCheck, ansible-lint)",
        "lab:",
        "  passed    300 s  pivot fault scenarios",
        "  passed     95 s  the lab pivot from the installed collection",
        "  FAILED    160 s  lab integration tests: exit 1: FAILED tests/unit/test_x.py::test_y - AssertionError: "
        "assert 1 == 2",
    ]
    # CI's tail names each failing test, with its stage and its message's first line.
    assert lines[10:] == [
        "FAILED [lab integration tests] tests.integration.test_pivot_faults::test_rollback: "
        "AssertionError: the unit was not restored",
        "SOME STAGES FAILED OR DID NOT RUN; pytest runs: 2",
        "tests: 4 passed, 1 failed, 1 skipped",
    ]


def test_a_group_stopped_during_a_stage(tmp_path):
    out = make_run(
        tmp_path,
        {
            "lab": {
                "stages": ["pivot fault scenarios", "lab integration tests"],
                "results": [],
                "logs": {1: "....\nTerminated\n"},
                "rc": 143,
            }
        },
    )
    lines, ok = summary.summarize(out)
    assert not ok
    assert lines[1:] == [
        "lab:",
        "  FAILED           pivot fault scenarios: did not finish: the lab group stopped during it (exit 143): "
        "Terminated",
        "  NOT RUN          lab integration tests: the lab group stopped before it (exit 143)",
        "SOME STAGES FAILED OR DID NOT RUN; pytest runs: 0",
        "tests: 0 passed, 0 failed, 0 skipped",
    ]


def test_a_group_that_never_ended(tmp_path):
    out = make_run(tmp_path, {"cpu": {"stages": ["lint"], "results": [], "rc": None}})
    lines, ok = summary.summarize(out)
    assert not ok
    assert lines[2] == "  NOT RUN          lint: the cpu group stopped before it (it never ended)"


def test_a_passing_run(tmp_path):
    out = make_run(
        tmp_path,
        {
            "cpu": {"stages": ["lint", "unit"], "results": [(0, 12), (0, 40)], "rc": 0,
                    "junit": {"cpu-2-1.xml": JUNIT_PASSING}},
            "lab": {"stages": ["faults"], "results": [(0, 3)], "rc": 0},
        },
    )
    result = run_summary(out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "===== summary: 3 stages passed, 0 FAILED, 0 NOT RUN =====",
        "cpu:",
        "  passed     12 s  lint",
        "  passed     40 s  unit",
        "lab:",
        "  passed      3 s  faults",
        "all stages passed; pytest runs: 1",
        "tests: 2 passed, 0 failed, 0 skipped",
    ]


def test_a_failing_test_in_a_passing_stage_fails_the_summary(tmp_path):
    out = make_run(
        tmp_path,
        {"cpu": {"stages": ["unit"], "results": [(0, 5)], "rc": 0, "junit": {"cpu-1-1.xml": JUNIT_FAILING}}},
    )
    lines, ok = summary.summarize(out)
    assert not ok
    assert lines[-3].startswith("FAILED [unit] tests.integration.test_pivot_faults::test_rollback: ")


def test_usage():
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "Usage: python scripts/test_summary.py OUT_DIR" in result.stderr
