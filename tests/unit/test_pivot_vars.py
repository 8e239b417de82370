"""playbooks/tasks/check-vars.yml (the pivot playbook's own rollout and balancer variables, checked in its preflight
play) through real ansible-playbook on this machine: each value the switch play could not use, or would silently read
as something else (a typo in pivot_on_failure read as stop, pivot_canary: maybe read as false), is refused with the
variable, the rule and the value; the defaults and the fleet lab's settings pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from local_playbook import play

REPO = Path(__file__).resolve().parents[2]
FLEET = yaml.safe_load((REPO / "inventories" / "lab-fleet" / "group_vars" / "all.yml").read_text())["pivot_balancer"]

PLAYBOOK = f"""
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: The pivot's variable checks
      ansible.builtin.import_tasks: {REPO}/playbooks/tasks/check-vars.yml
"""


def run_checks(tmp_path: Path, extra: dict):
    return play(tmp_path, PLAYBOOK, extra)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"pivot_switch_serial": 3, "pivot_canary": False, "pivot_on_failure": "continue"},
        {"pivot_switch_serial": "25%", "pivot_max_fail_percentage": 50, "pivot_confirm_production": "true"},
        {"pivot_switch_serial": "100%", "pivot_canary": "no", "pivot_max_fail_percentage": "12.5"},
        {"pivot_balancer": {**FLEET, "host": "localhost"}},  # the fleet lab's settings, on this inventory's host
        {"pivot_balancer": {"host": "localhost"}},
    ],
    ids=["defaults", "batches-of-3", "percent", "all-at-once", "fleet-balancer", "balancer-host-only"],
)
def test_usable_values_pass(tmp_path, extra):
    rc, out = run_checks(tmp_path, extra)
    assert rc == 0, out[-3000:]


@pytest.mark.parametrize(
    ("extra", "refusals"),
    [
        ({"pivot_switch_serial": 0}, ["pivot_switch_serial must be a number of hosts >= 1 or a percentage"]),
        ({"pivot_switch_serial": "half"}, ['(got "half")']),
        ({"pivot_switch_serial": "150%"}, ["pivot_switch_serial must be", '(got "150%")']),
        ({"pivot_on_failure": "contiue"}, ['pivot_on_failure must be stop or continue (got "contiue")']),
        ({"pivot_canary": "maybe"}, ['pivot_canary must be true or false (got "maybe")']),
        ({"pivot_confirm_production": "sure"}, ["pivot_confirm_production must be true or false"]),
        ({"pivot_max_fail_percentage": 150}, ["pivot_max_fail_percentage must be a number from 0 to 100 (got 150)"]),
        ({"pivot_max_fail_percentage": -5}, ["pivot_max_fail_percentage must be a number from 0 to 100"]),
        (
            {"pivot_balancer": {"host": "no-such-host"}},
            ["pivot_balancer must be a mapping with host (an inventory host)"],
        ),
        ({"pivot_balancer": {"host": "localhost", "drain_timeout": "a minute"}}, ['"drain_timeout": "a minute"']),
        ({"pivot_balancer": {"host": "localhost", "socket": "admin.sock"}}, ["socket (an absolute path)"]),
        ({"pivot_balancer": "fleet-lb"}, ["pivot_balancer must be a mapping", '(got "fleet-lb")']),
        (
            {"pivot_on_failure": "never", "pivot_switch_serial": 0},  # every bad one named at once
            ["pivot_switch_serial must be", "pivot_on_failure must be"],
        ),
    ],
    ids=[
        "serial-0",
        "serial-word",
        "serial-150pct",
        "on-failure-typo",
        "canary-maybe",
        "confirm-sure",
        "fail-150",
        "fail-negative",
        "balancer-unknown-host",
        "balancer-drain-words",
        "balancer-relative-socket",
        "balancer-not-a-mapping",
        "two-at-once",
    ],
)
def test_a_value_the_switch_play_cannot_use_is_refused(tmp_path, extra, refusals):
    rc, out = run_checks(tmp_path, extra)
    assert rc != 0
    for refusal in refusals:
        assert refusal in out, out[-3000:]
    assert "Nothing was changed." in out


def test_rollback_names_a_bad_rollout_variable_before_any_host_is_touched(tmp_path):
    """playbooks/rollback.yml reads pivot_switch_serial when its restore play starts: its first play checks the
    rollout variables, so a bad value is named (variable, rule, value) and the restore play never starts."""
    from local_playbook import one_line, run_local_playbook

    inventory = tmp_path / "inventory.ini"
    inventory.write_text("[inference]\nlocalhost ansible_connection=local\n")
    proc = run_local_playbook(REPO / "playbooks" / "rollback.yml", tmp_path, "-i", str(inventory),
                              "-e", "pivot_switch_serial=half")
    out = one_line(proc.stdout + proc.stderr)
    assert proc.returncode != 0
    assert 'pivot_switch_serial must be a number of hosts >= 1 or a percentage from 1% to 100% (got "half")' in out
    assert "Roll back the pivot on the inference hosts" not in out
