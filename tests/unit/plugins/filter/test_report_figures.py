"""The pivot report's figures agree (issue 26, part 3): every duration is the difference of the two times printed
beside it, the Markdown says what each measures, shows a stand-in server as one, and lists any disagreement.

The fixture is a lab run's report (secrets masked as the pivot writes them) with the endpoints this version records.
The Markdown is rendered with Jinja and Ansible's own filters, as the report play renders it.
"""

from __future__ import annotations

import copy
import datetime
import json
from pathlib import Path

import jinja2
import pytest
from ansible.plugins.filter.core import FilterModule as CoreFilters
from ansible.plugins.test.core import TestModule as CoreTests
from ansible_collections.specdec.pivot.plugins.filter import pivot as f

REPO = Path(__file__).resolve().parents[4]
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "pivot_report" / "lab-run.json"
TEMPLATE = REPO / "playbooks" / "templates" / "pivot-report.md.j2"


@pytest.fixture
def report() -> dict:
    return json.loads(FIXTURE.read_text())


def render(report: dict) -> str:
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    # Ansible's filters, except its default (Jinja's own treats the strict undefined the way Ansible's does)
    env.filters.update({k: v for k, v in CoreFilters().filters().items() if k not in ("default", "d")})
    env.filters.update({f"specdec.pivot.{k}": v for k, v in f.FilterModule().filters().items()})
    env.tests.update(CoreTests().tests())
    return env.from_string(TEMPLATE.read_text()).render(pivot_report=report)


def put(data: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[int(last) if last.isdigit() else last] = value


# ---------------------------------------------------------------------------------------------------- the rules
def test_the_lab_report_agrees(report):
    assert f.pivot_report_disagreements(report) == []


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        # The disagreements measured on an earlier lab run: the halt's duration printed beside the role's two times
        # (here: the halt signalled when the role started), a downtime of 5.6 s beside rows 7.4 s apart.
        ("training.0.halt.signalled_at", "2026-12-05T12:03:39.636007Z",
         "training[ct200].halt elapsed_s = 0.951 s (the halt: first signal to every process gone (host clock)): "
         "but signalled_at 2026-12-05T12:03:39.636007Z and ended_at"),
        ("inference.0.service.downtime_s", 5.6, "inference[pro6000].service downtime_s = 5.6 s"),
        ("inference.0.service.stop_s", 1.47, "inference[pro6000].service stop_s = 1.47 s"),
        ("inference.0.service.start_to_healthy_s", 4.35, "inference[pro6000].service start_to_healthy_s = 4.35 s"),
        ("inference.0.service.downtime_upper_s", 7.4, "inference[pro6000].service downtime_upper_s = 7.4 s"),
        ("wall_time_s", 62.5, "report wall_time_s = 62.5 s"),
        ("inference.0.service.first_healthy_at", None, "first_healthy_at=None are not both times"),
        ("training.0.halt.ended_at", "2026-12-04T19:57:10.000000Z", "ended_at 2026-12-04T19:57:10.000000Z is before"),
        ("phases.switch.finished_at", "2026-12-04T19:57:00.000000Z", "phase switch ends (2026-12-04T19:57:00.000000Z)"),
        ("summary.downtime_s.pro6000", 5.33, "summary downtime_s of pro6000 = 5.33 s, but its service says 6.042"),
    ],
    ids=["halt-beside-role-times", "downtime", "stop", "start", "controller-view", "wall-time", "missing-endpoint",
         "end-before-start", "phase", "summary"],
)
def test_a_figure_that_disagrees_is_named(report, path, value, expected):
    put(report, path, value)
    problems = f.pivot_report_disagreements(report)
    assert len(problems) >= 1 and any(expected in p for p in problems), problems


def test_a_halt_that_signalled_nothing_has_no_duration_to_check(report):
    halt = report["training"][0]["halt"]
    halt.update(already_stopped=True, signals_sent=[], pids=[], elapsed_s=0.0, signalled_at=None, ended_at=None)
    assert f.pivot_report_disagreements(report) == []
    assert "No training run was running (already stopped)." in render(report)
    halt["signals_sent"] = [{"pid": 1, "signal": "SIGTERM"}]  # signalled, yet no endpoints
    assert any("signalled_at=None" in p for p in f.pivot_report_disagreements(report))


def test_rounding_alone_is_no_disagreement(report):
    # downtime_s is rounded to ms on the host; its endpoints carry microseconds
    svc = report["inference"][0]["service"]
    healthy = datetime.datetime.strptime(svc["first_healthy_at"], "%Y-%m-%dT%H:%M:%S.%fZ")
    svc["first_healthy_at"] = (healthy + datetime.timedelta(microseconds=400)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    # start_to_healthy_s (same end) is 0.4 ms off too: still rounding
    assert f.pivot_report_disagreements(report) == []
    svc["first_healthy_at"] = (healthy + datetime.timedelta(milliseconds=20)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert len(f.pivot_report_disagreements(report)) == 2  # downtime_s and start_to_healthy_s


def test_a_rollback_outage_is_checked_against_its_endpoints(report):
    svc = report["inference"][0]["service"]
    svc["rollback"] = {"performed": True, "healthy": True, "reason": "Apply the gate: failed", "gate": True,
                       "restored_from": "/var/lib/specdec-pivot/units/x.pre-pivot",
                       "started_at": "2026-12-05T12:04:07.000000Z", "finished_at": "2026-12-05T12:04:13.320341Z",
                       "outage_from": svc["stopped_at"], "outage_s": 19.0}
    assert f.pivot_report_disagreements(report) == []
    svc["rollback"]["outage_s"] = 6.0  # rollback start to end: not the outage
    assert any("rollback outage_s = 6 s" in p for p in f.pivot_report_disagreements(report))


# ---------------------------------------------------------------------------------------------------- the Markdown
def line_with(markdown: str, *parts: str) -> str:
    lines = [ln for ln in markdown.splitlines() if all(p in ln for p in parts)]
    assert lines, f"no line holds {parts}:\n{markdown}"
    return lines[0]


@pytest.mark.parametrize("span", [s for s in f.REPORT_SPANS if s[1] not in ("wall_time_s", "outage_s")],
                         ids=lambda s: s[1])
def test_each_duration_is_printed_beside_its_own_endpoints(report, span):
    where, key, start_key, end_key, _what, _tol = span
    record = report["training"][0]["halt"] if where.startswith("training") else report["inference"][0]["service"]
    line_with(render(report), f.pivot_duration(record[key]), record[start_key], record[end_key])


def test_the_halt_and_the_role_are_two_durations_with_their_own_times(report):
    md = render(report)
    halt = report["training"][0]["halt"]
    assert "0.95 s (first SIGTERM at 2026-12-05T12:03:43.518801Z, every process gone at 2026-12-05T12:03:44.469365Z; " \
           "host clock)" in line_with(md, "the halt: first signal to every process gone")
    role = line_with(md, "the role, start to end")
    assert f"9.32 s ({halt['started_at']} to {halt['finished_at']}, controller clock)" in role


def test_wall_time_is_the_started_and_finished_rows(report):
    md = render(report)
    assert f"| started | {report['started_at']} |" in md and f"| finished | {report['finished_at']} |" in md
    assert "46 s (started to finished, the two rows above; controller clock)" in line_with(md, "wall time")


def test_a_stand_in_server_is_called_one_from_its_own_answer(report):
    md = render(report)
    says = report["inference"][0]["service"]["server_stand_in"]["says"]
    assert md.count("Lab stand-in") == 2, md  # the summary and the service's section
    assert f'says "{says}"' in md and "not a real model" in md
    report["inference"][0]["service"]["server_stand_in"] = None  # a real server says nothing of the kind
    assert "stand-in" not in render(report).lower()


def test_disagreeing_figures_are_listed_in_the_markdown(report):
    assert "Figures that disagree" not in render(report)
    put(report, "inference.0.service.downtime_s", 5.6)
    md = render(report)
    assert "## Figures that disagree" in md
    assert "- inference[pro6000].service downtime_s = 5.6 s" in md


@pytest.mark.parametrize(
    ("ddtree", "expected"),
    [
        ({"implementation": "plugin", "detail": "x.DDTreeSpecAlgo", "ok": False, "problem": "the hook is not wrapped"},
         "> **The check failed:** the hook is not wrapped"),
        ({"implementation": None, "ok": False, "problem": "DDTREE is not registered"},
         "**none** (DDTREE is not registered)"),
        ({"implementation": "plugin", "detail": "x", "ok": True, "undecided": "the CUDA-graph module does not import"},
         "> **Not decided on this host:** the CUDA-graph module does not import"),
    ],
    ids=["failed", "none", "undecided"],
)
def test_a_check_that_failed_or_was_not_decided_is_in_the_markdown(report, ddtree, expected):
    report = copy.deepcopy(report)
    report["inference"][0]["plan"]["ddtree"] = ddtree
    assert expected in render(report)


@pytest.mark.parametrize(
    ("choice", "expected", "absent"),
    [
        (None, "(`--speculative-num-draft-tokens 17`). GPU fit", "SGLANG_DDTREE_BUDGET"),
        ({"value": "auto", "candidates": [0, 4, 8, 16]},
         "chosen per step by the server among 0, 4, 8, 16 (`SGLANG_DDTREE_BUDGET=auto` in the unit; 0 is the chain, "
         "16 the widest)", "every step"),
        ({"value": "4", "candidates": [4]},
         "verifying 4 nodes every step (`SGLANG_DDTREE_BUDGET=4` in the unit; 0 is the chain; KV and graphs sized "
         "for 16)", "chosen per step"),
    ],
)
def test_the_budget_sentence_says_how_the_server_chooses(report, choice, expected, absent):
    plan = report["inference"][0]["plan"]
    plan["budget"], plan["num_draft_tokens"], plan["budget_choice"] = 16, 17, choice
    md = render(report)
    assert expected in md and absent not in md


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        ({"policy": "fixed", "candidates": ["16"], "steps": 52, "histogram": {"16": 52},
          "since": "the measured requests"},
         "DDTREE's node budget on the new server's tree rounds during these prompts (fixed): 16: 52 (100%) of 52 "
         "rounds."),
        ({"policy": "auto", "candidates": ["chain", "8", "16"], "steps": 40,
          "histogram": {"chain": 4, "8": 30, "16": 6}, "since": "the measured requests"},
         "(auto, candidates chain, 8, 16): chain: 4 (10%), 8: 30 (75%), 16: 6 (15%) of 40 rounds."),
        ({"policy": "auto", "candidates": ["chain", "32"], "steps": 0, "histogram": {"chain": 0, "32": 0},
          "since": "the server's start"},
         "(auto, candidates chain, 32): no tree rounds (counted from the server's start)."),
        (None, "DDTREE's node budget during these prompts: not reported by the new server"),
    ],
)
def test_the_budget_the_new_server_chose_during_the_baseline_is_in_the_markdown(report, budget, expected):
    """The generation probe's ``budget`` (the plugin's /get_server_info report, before and after the prompts)."""
    put(report, "inference.0.service.baseline.after.budget", budget)
    assert expected in render(report)


def test_no_budget_sentence_for_a_server_that_is_not_ddtree(report):
    put(report, "inference.0.service.baseline.after.budget", None)
    put(report, "inference.0.service.server_info_algorithm", "NEXTN")
    assert "node budget" not in render(report)


@pytest.mark.parametrize(
    ("check", "expected"),
    [
        ({"checked": True, "ok": True, "error": "", "reason": ""},
         "sglang-ddtree's own start-up check on the new command line (what the new server runs before it loads a "
         "model), in preflight: passed."),
        ({"checked": True, "ok": False, "error": "--page-size=16: pass --page-size 1 (the default)", "reason": ""},
         "in preflight: **refused**: --page-size=16: pass --page-size 1 (the default)."),
        ({"checked": False, "ok": None, "error": "",
          "reason": "--model-path Qwen/Qwen3.6-27B is not a directory on this host (a hub id is fetched by the "
                    "server at start, which runs this check then)"},
         "in preflight: **not decided on this host**: --model-path Qwen/Qwen3.6-27B is not a directory"),
    ],
    ids=["passed", "refused", "undecided"],
)
def test_the_plugins_start_up_check_is_in_the_markdown(report, check, expected):
    put(report, "inference.0.plan.args_check.startup_check", check)
    assert expected in render(report)


def test_no_start_up_check_line_for_a_command_line_it_did_not_check(report):
    put(report, "inference.0.plan.args_check.startup_check", None)
    assert "start-up check on the new command line" not in render(report)


def test_the_lab_run_states_its_budget_and_the_plugins_start_up_check(report):
    """The lab run's report (a real pivot of the lab, 12-05) carries the budget the new server chose during the
    baseline's prompts and the verdict of the plugin's own start-up check, and the Markdown says both."""
    md = render(report)
    budget = report["inference"][0]["service"]["baseline"]["after"]["budget"]
    rounds = budget["steps"]
    assert budget["histogram"] == {"16": rounds} and rounds > 0
    assert f"(fixed): 16: {rounds} (100%) of {rounds} rounds." in line_with(md, "DDTREE's node budget")
    check = report["inference"][0]["plan"]["args_check"]["startup_check"]
    assert check["checked"] is False and check["ok"] is None  # the lab's SGLang venv has no torchvision
    assert "**not decided on this host**" in line_with(md, "sglang-ddtree's own start-up check")
