"""The closing summary of scripts/test.sh: every declared stage of every group as passed, FAILED (with its first error
line) or NOT RUN (with why), then each failing test by name and the pytest totals, so that a log's last lines say
what ran and what failed.

It reads the run's directory (scripts/test.sh's $out):
  plan/GROUP             the group's stages in the order they run, one a line: TITLE<TAB>COMMAND
  results/GROUP          a line per stage that ended: NUMBER<TAB>EXIT STATUS<TAB>SECONDS<TAB>TITLE (NUMBER: 1, 2, ...)
  rc/GROUP               the group's exit status (absent: it never ended)
  stages/GROUP-N.log     the output of the group's N-th stage (present once the stage started)
  junit/GROUP-N-K.xml    the JUnit files of the N-th stage's pytest runs

Usage: python scripts/test_summary.py OUT_DIR [WALL_SECONDS]. Exits 1 when a stage failed or did not run, else 0.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

PASSED, FAILED, NOT_RUN = "passed", "FAILED", "NOT RUN"
WIDTH = 300  # an error line is cut to this many characters

# The first line that says what went wrong, tool by tool; the first rule that finds one wins.
SHELLCHECK_AT = re.compile(r"^In (\S+) line (\d+):$")
SHELLCHECK_CODE = re.compile(r"\b(SC\d{4} \((?:error|warning|info|style)\): .*)")
RUFF_CODE = re.compile(r"^([A-Z]+\d+ (?:\[\*\] )?.*)$")
RUFF_AT = re.compile(r"^\s*--> (\S+)$")
YAMLLINT_PROBLEM = re.compile(r"^\s+(\d+:\d+)\s+(error|warning)\s+(.*)$")
PYTEST_SHORT = re.compile(r"^(FAILED|ERROR) \S")
ANSIBLE_TEST_ERROR = re.compile(r"^ERROR: (?!Found \d+ |The \d+ sanity test\(s\) listed below)")
GENERIC = re.compile(r"(?i)\b(error|failed|failure|fatal)\b|^Traceback ")
NOT_AN_ERROR = re.compile(r"(?i)\b(failed|errors?|failures?)=0\b|\b0 (failed|errors?)\b|\bignore_errors\b")


def first_error(text: str) -> str:
    """The first line of a failing stage's output that says what went wrong ('' when the output is empty)."""
    lines = text.splitlines()

    for i, line in enumerate(lines):  # ShellCheck: "In FILE line N:", the line, then "^-- SCnnnn (level): ..."
        at = SHELLCHECK_AT.match(line)
        if at:
            for follow in lines[i + 1 : i + 8]:
                code = SHELLCHECK_CODE.search(follow)
                if code:
                    return _cut(f"{at.group(1)}:{at.group(2)}: {code.group(1)}")
    for i, line in enumerate(lines):  # Ruff: "F401 [*] message", then " --> FILE:LINE:COL"
        code = RUFF_CODE.match(line)
        if code and i + 1 < len(lines):
            at = RUFF_AT.match(lines[i + 1])
            if at:
                return _cut(f"{at.group(1)}: {code.group(1)}")
    for i, line in enumerate(lines):  # yamllint -s: "FILE", then "  LINE:COL  error  message  (rule)"
        problem = YAMLLINT_PROBLEM.match(line)
        if problem and i > 0:
            name = next((p for p in reversed(lines[:i]) if p.strip() and not YAMLLINT_PROBLEM.match(p)), "")
            return _cut(f"{name.strip()}:{problem.group(1)}: {problem.group(2)}: {problem.group(3).strip()}")
    for rule in (PYTEST_SHORT, ANSIBLE_TEST_ERROR):  # pytest's short summary (-ra); ansible-test's problems
        for line in lines:
            if rule.match(line):
                return _cut(line)
    for i, line in enumerate(lines):  # anything else: a line naming an error, a failure or a traceback
        if GENERIC.search(line) and not NOT_AN_ERROR.search(line) and not _ignored(lines, i):
            return _cut(line)
    return _cut(next((line for line in reversed(lines) if line.strip()), ""))


def _ignored(lines: list[str], i: int) -> bool:
    """An Ansible task failure that the task ignores (the next line says '...ignoring') is not the error."""
    rest = [line for line in lines[i + 1 : i + 3] if line.strip()]
    return bool(rest) and rest[0].strip() == "...ignoring"


def _cut(line: str) -> str:
    line = line.strip()
    return line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."


def _read_lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.is_file() else []


def stage_rows(out: Path, group: str) -> list[dict]:
    """Every declared stage of GROUP in order: {number, title, status, seconds, why}."""
    plan = [line.split("\t", 1)[0] for line in _read_lines(out / "plan" / group) if line.strip()]
    results = {}
    for line in _read_lines(out / "results" / group):
        number, rc, seconds, title = line.split("\t", 3)
        results[int(number)] = (int(rc), int(seconds), title)
    rc_file = out / "rc" / group
    group_rc = int(rc_file.read_text().strip()) if rc_file.is_file() else None
    ended = "it never ended" if group_rc is None else f"exit {group_rc}"
    rows, stopped_by = [], None
    for number, title in enumerate(plan, start=1):
        log = out / "stages" / f"{group}-{number}.log"
        output = log.read_text(errors="replace") if log.is_file() else ""
        row = {"number": number, "title": title, "seconds": None, "why": ""}
        if number in results:
            rc, row["seconds"] = results[number][:2]
            row["status"] = PASSED if rc == 0 else FAILED
            if rc != 0:
                error = first_error(output)
                row["why"] = f"exit {rc}: {error}" if error else f"exit {rc}"
                stopped_by = title
        elif log.is_file():  # started, never ended: the group was stopped during it
            row["status"] = FAILED
            row["why"] = f"did not finish: the {group} group stopped during it ({ended}): {first_error(output)}"
        elif stopped_by is not None:
            row["status"] = NOT_RUN
            row["why"] = f"an earlier stage of the {group} group failed ({stopped_by})"
        else:
            row["status"] = NOT_RUN
            row["why"] = f"the {group} group stopped before it ({ended})"
        rows.append(row)
    return rows


def junit_report(out: Path, titles: dict[str, str]) -> tuple[list[str], dict[str, int], int]:
    """Each failing test as a line (its stage, name and message's first line), the totals, the number of files."""
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failing = []
    files = sorted((out / "junit").glob("*.xml"))
    for f in files:
        try:
            root = ET.parse(f).getroot()
        except ET.ParseError as exc:
            failing.append(f"FAILED {f.name}: unreadable JUnit file: {exc}")
            continue
        for suite in root.iter("testsuite"):
            for key in total:
                total[key] += int(suite.get(key, 0))
        stage = titles.get(f.stem.rsplit("-", 1)[0], f.stem)
        for case in root.iter("testcase"):
            for bad in list(case.findall("failure")) + list(case.findall("error")):
                first = (bad.get("message") or bad.text or "").strip().splitlines()[:1]
                failing.append(
                    f"FAILED [{stage}] {case.get('classname')}::{case.get('name')}: {_cut(first[0]) if first else ''}"
                )
    return failing, total, len(files)


def summarize(out: Path, wall: int | None = None) -> tuple[list[str], bool]:
    """The summary's lines and whether everything passed."""
    groups = sorted(p.name for p in (out / "plan").iterdir()) if (out / "plan").is_dir() else []
    lines, counts, titles = [], {PASSED: 0, FAILED: 0, NOT_RUN: 0}, {}
    for group in groups:
        rows = stage_rows(out, group)
        lines.append(f"{group}:")
        for row in rows:
            counts[row["status"]] += 1
            titles[f"{group}-{row['number']}"] = row["title"]
            seconds = "" if row["seconds"] is None else f"{row['seconds']} s"
            why = f": {row['why']}" if row["why"] else ""
            lines.append(f"  {row['status']:<7} {seconds:>7}  {row['title']}{why}")
    failing, total, runs = junit_report(out, titles)
    ok = counts[FAILED] == 0 and counts[NOT_RUN] == 0 and not failing
    head = f"===== summary: {counts[PASSED]} stages passed, {counts[FAILED]} FAILED, {counts[NOT_RUN]} NOT RUN"
    lines.insert(0, head + (f"; wall {wall} s =====" if wall is not None else " ====="))
    bad = total["failures"] + total["errors"]
    lines += failing
    lines.append(("all stages passed" if ok else "SOME STAGES FAILED OR DID NOT RUN") + f"; pytest runs: {runs}")
    lines.append(f"tests: {total['tests'] - bad - total['skipped']} passed, {bad} failed, {total['skipped']} skipped")
    return lines, ok


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    lines, ok = summarize(Path(argv[1]), int(argv[2]) if len(argv) == 3 else None)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
