"""sglang_service's preflight entry point (tasks/preflight.yml with its argument spec) through real ansible-playbook on
this machine: every variable whose type admits a value the switch cannot use is refused, naming the variable, the
rule and the value; the defaults pass. playbooks/pivot.yml runs it in its preflight play, before training is halted
(asserted below on the playbook itself), so a bad value there stops the pivot with nothing changed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from local_playbook import play

REPO = Path(__file__).resolve().parents[2]

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: The switch role's preflight
      ansible.builtin.include_role:
        name: specdec.pivot.sglang_service
        tasks_from: preflight
"""


def run_preflight(tmp_path: Path, extra: dict):
    return play(tmp_path, PLAYBOOK, extra)


def test_the_defaults_pass(tmp_path):
    rc, out = run_preflight(tmp_path, {})
    assert rc == 0, out[-3000:]


@pytest.mark.parametrize(
    ("extra", "refusals"),
    [
        ({"sglang_service_health_timeout": 0}, ["sglang_service_health_timeout must be > 0 seconds (got 0)"]),
        ({"sglang_service_restart_timeout": -5}, ["sglang_service_restart_timeout must be > 0 seconds (got -5)"]),
        ({"sglang_service_health_delay": 0}, ["sglang_service_health_delay must be > 0 seconds"]),
        ({"sglang_service_poll_s": 0}, ["sglang_service_poll_s must be >= 1 second (got 0)"]),
        (
            {"sglang_service_health_path": "health"},
            ['sglang_service_health_path must be a path that starts with / (no spaces, no query) (got "health")'],
        ),
        ({"sglang_service_health_path": "/health?x=1"}, ["sglang_service_health_path must be a path"]),
        ({"sglang_service_health_path": "/my health"}, ["sglang_service_health_path must be a path"]),
        ({"sglang_service_generate_prompt": "  "}, ["sglang_service_generate_prompt must be not empty"]),
        ({"sglang_service_generate_max_new_tokens": 0}, ["sglang_service_generate_max_new_tokens must be >= 1"]),
        ({"sglang_service_baseline_prompts": ["a", ""]}, ["sglang_service_baseline_prompts must be a list of prompts"]),
        ({"sglang_service_baseline_prompts": []}, ["at least one when sglang_service_baseline is on (got [])"]),
        ({"sglang_service_baseline_repeats": 0}, ["sglang_service_baseline_repeats must be >= 1 (got 0)"]),
        ({"sglang_service_baseline_warmup": -1}, ["sglang_service_baseline_warmup must be >= 0"]),
        (
            {"sglang_service_gate_max_disagreements": -2},
            ["sglang_service_gate_max_disagreements must be >= -1 (-1: off) (got -2)"],
        ),
        ({"sglang_service_gate_min_speedup": -1}, ["sglang_service_gate_min_speedup must be >= 0 (0: off)"]),
        (
            {"sglang_service_poll_s": 0, "sglang_service_baseline_timeout": 0},  # every bad one named at once
            ["sglang_service_poll_s must be >= 1", "sglang_service_baseline_timeout must be > 0 seconds"],
        ),
        (
            {"sglang_service_health_timeout": "soon"},  # the type: the role's argument spec (entry point preflight)
            ["sglang_service_health_timeout", "float"],
        ),
    ],
    ids=lambda v: "-".join(f"{k.removeprefix('sglang_service_')}={v[k]}" for k in v) if isinstance(v, dict) else "",
)
def test_a_value_the_switch_cannot_use_is_refused(tmp_path, extra, refusals):
    rc, out = run_preflight(tmp_path, extra)
    assert rc != 0
    for refusal in refusals:
        assert refusal in out, out[-3000:]


def test_a_health_path_with_any_letters_passes(tmp_path):
    rc, out = run_preflight(tmp_path, {"sglang_service_health_path": "/v1/status/sglang-health_s"})
    assert rc == 0, out[-3000:]


def test_an_empty_baseline_is_fine_when_the_baseline_is_off(tmp_path):
    rc, out = run_preflight(tmp_path, {"sglang_service_baseline_prompts": [], "sglang_service_baseline": False})
    assert rc == 0, out[-3000:]


def test_the_pivot_checks_them_in_its_preflight_play():
    """In playbooks/pivot.yml's first play (the one that changes nothing), for the inference hosts; the switch itself
    comes in a later play."""
    plays = yaml.safe_load((REPO / "playbooks" / "pivot.yml").read_text())
    assert "Preflight" in plays[0]["name"]

    def includes(play):
        return [t["ansible.builtin.include_role"] for t in play["tasks"] if "ansible.builtin.include_role" in t]

    first = includes(plays[0])
    assert {"name": "specdec.pivot.sglang_service", "tasks_from": "preflight"} in first
    assert not [i for i in first if i["name"] == "specdec.pivot.sglang_service" and i.get("tasks_from") != "preflight"]
