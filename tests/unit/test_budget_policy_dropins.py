"""sglang_preflight's budget_policy.yml through real ansible-playbook on this machine: which drop-ins it names as
setting SGLANG_DDTREE_BUDGET (they would win over the unit's Environment= line, so the policy is refused).

The drop-ins' text is read as systemd reads it (filter ``systemd_unit_env_names``): an assignment on a continuation
line, inside quotes or written with an escape is found; the name inside another variable's value, a longer name, a
line of another section and one in a comment inside a continuation are not. Not the lab: no systemd, the role's
facts are given as the tasks before it would leave them.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from local_playbook import run_local_playbook

REPO = Path(__file__).resolve().parents[2]

DROPINS = {  # path -> (text, whether it sets SGLANG_DDTREE_BUDGET for systemd; "reset": it drops the unit's)
    "/etc/systemd/system/sglang.service.d/10-continued.conf":
        ("[Service]\nEnvironment=HF_HOME=/data/hf \\\n    SGLANG_DDTREE_BUDGET=8\n", True),
    "/etc/systemd/system/sglang.service.d/20-quoted.conf":
        ('[Service]\nEnvironment="SGLANG_DDTREE_BUDGET=8" "X=1"\nEnvironment=Y=2 SGLANG_DDTREE_BUDGET"=8"\n', True),
    "/etc/systemd/system/sglang.service.d/30-escaped.conf":
        ("[Service]\nEnvironment=SGLANG_DDTREE_\\x42UDGET=8\n", True),
    "/etc/systemd/system/sglang.service.d/40-in-a-value.conf":
        ('[Service]\nEnvironment=NOTE=SGLANG_DDTREE_BUDGET=8 "WHY=see SGLANG_DDTREE_BUDGET=8"\n', False),
    "/etc/systemd/system/sglang.service.d/50-longer-name.conf":
        ("[Service]\nEnvironment=MY_SGLANG_DDTREE_BUDGET=8\n", False),
    "/etc/systemd/system/sglang.service.d/60-other-section.conf":
        ("[Unit]\nEnvironment=SGLANG_DDTREE_BUDGET=8\n[Service]\nEnvironment=A=1 \\\n"
         "#  SGLANG_DDTREE_BUDGET=8 \\\n  B=2\n", False),
    # an empty Environment= in a drop-in drops every Environment= of the unit file: the policy's line with them
    "/etc/systemd/system/sglang.service.d/70-reset.conf":
        ("[Service]\nEnvironment=\nEnvironment=HF_HOME=/data/hf\n", "reset"),
}

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: The role's own budget_policy.yml
      block:
        - name: Import it
          ansible.builtin.import_tasks: {repo}/roles/sglang_preflight/tasks/budget_policy.yml
      always:
        - name: Write what it found
          ansible.builtin.copy:
            content: "{{{{ sglang_preflight_budget_overrides | to_json }}}}"
            dest: {out}
            mode: "0600"
"""


def test_the_dropins_that_set_the_budget_are_named_as_systemd_reads_them(tmp_path):
    facts = {
        "sglang_preflight_budget_policy": "auto",
        "sglang_preflight_unit": "/etc/systemd/system/sglang.service",
        "sglang_preflight_svc": {"status": {"DropInPaths": " ".join(DROPINS), "MainPID": "0"}},
        "sglang_preflight_host": {"files": {
            path: {"content": base64.b64encode(text.encode()).decode()} for path, (text, sets) in DROPINS.items()
        }},
        "sglang_preflight_caps": {"unit": {"environment_file_names": [], "exec_env_names": []}},
    }
    (tmp_path / "facts.json").write_text(json.dumps(facts))
    out = tmp_path / "overrides.json"
    book = tmp_path / "book.yml"
    book.write_text(PLAYBOOK.format(repo=REPO, out=out))
    proc = run_local_playbook(book, tmp_path, "-e", f"@{tmp_path / 'facts.json'}")
    output = " ".join((proc.stdout + proc.stderr).split())
    expected = [f"the drop-in {path}" for path, (text, sets) in DROPINS.items() if sets is True]
    expected += [f"the drop-in {path} (its empty Environment= drops the unit file's)"
                 for path, (text, sets) in DROPINS.items() if sets == "reset"]
    assert json.loads(out.read_text()) == expected, output[-4000:]
    # the policy is refused, naming those drop-ins and no other
    assert proc.returncode != 0
    assert (f"{', '.join(expected)} sets (or drops) SGLANG_DDTREE_BUDGET too and would win over the unit's line"
            ) in output, output[-4000:]
