"""ONE variable for the pivot's state directory (issue 16, point 8): ``pivot_state_dir``.

Before, ``sglang_preflight_state_dir``, ``ddtree_plugin_remote_dir`` and ``sglang_service_restore_state_dir`` had to
be kept equal by hand. Now every role defaults and documents the same name, no role reads an old name, and a run
that still sets an old name is refused (with the fix) before anything happens.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("sglang_preflight", "ddtree_plugin", "sglang_service")
OLD_NAMES = ("sglang_preflight_state_dir", "ddtree_plugin_remote_dir", "sglang_service_restore_state_dir")
DEFAULT = "/var/lib/specdec-pivot"


def _role_texts(role: str) -> dict[Path, str]:
    """The role's tasks, defaults, vars and templates (what a run reads; the docs may name the old names)."""
    base = ROOT / "roles" / role
    return {
        p: p.read_text()
        for sub in ("tasks", "defaults", "vars", "templates", "handlers")
        for p in sorted((base / sub).rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("role", ROLES)
def test_every_role_defaults_the_one_variable(role):
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
    assert defaults["pivot_state_dir"] == DEFAULT
    assert not set(OLD_NAMES) & set(defaults), f"{role} still defaults an old state-dir name"


@pytest.mark.parametrize("role", ROLES)
def test_no_role_reads_an_old_name(role):
    for path, text in _role_texts(role).items():
        for lineno, line in enumerate(text.splitlines(), 1):
            for old in OLD_NAMES:
                if old in line:
                    # only the refusal task's pattern may name them
                    assert re.search(r"\^\(sglang_preflight_state_dir\|", line), f"{path}:{lineno} reads {old}: {line}"


@pytest.mark.parametrize(
    ("role", "entry"),
    [
        ("sglang_preflight", "main"),
        ("ddtree_plugin", "main"),
        ("ddtree_plugin", "restore"),
        ("sglang_service", "restore"),
    ],
)
def test_argument_specs_document_it(role, entry):
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    options = specs[entry]["options"]
    assert options["pivot_state_dir"]["default"] == DEFAULT
    assert not set(OLD_NAMES) & set(options)


PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: specdec.pivot.{role}
        tasks_from: {tasks_from}
"""


@pytest.mark.parametrize(("role", "tasks_from"), [("sglang_preflight", "main"), ("sglang_service", "restore")])
@pytest.mark.parametrize("old", OLD_NAMES)
def test_an_old_name_is_refused_with_the_fix(tmp_path, role, tasks_from, old):
    play = tmp_path / "play.yml"
    play.write_text(PLAYBOOK.format(role=role, tasks_from=tasks_from))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    bindir = Path(sys.executable).parent
    proc = subprocess.run(
        [str(bindir / "ansible-playbook"), "-i", "localhost,", str(play), "-e", f"{old}=/srv/pivot-records"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert f"{old} is set" in out and "rename" in out and "pivot_state_dir" in out, out
