"""The preflight role's secret plumbing through real ansible-playbook at -vvvv (issue 25), on this machine: the real
sglang_capabilities module reads a unit with planted secrets (systemctl stand-in, the project's interpreter), the
role's own secrets.yml reads the values back under no_log, the plan's argv is put back with pivot_unmask, and the
sglang_service unit template renders the unit the switch would write. The whole -vvvv output holds no planted
value; the rendered unit holds every one where it belongs, and the new values escaped for systemd.

Not the lab: no systemd, no container, no SGLang server (the lab test that greps a whole pivot run and
/proc/*/cmdline is issue 25's other half).
"""

from __future__ import annotations

import json
from pathlib import Path

from local_playbook import run_local_playbook
from systemd_standin import write_unit

REPO = Path(__file__).resolve().parents[2]
PY = REPO / ".venv" / "bin" / "python"
K1, K2, K4 = "K1-planted-api-key", "K2-planted-admin-key", "K4-planted-prefix-key"
K3, PW, K5 = "K3-planted-hf-token", "PW-planted-db-password", "K5-planted-env-file-pat"
PLANTED = (K1, K2, K3, K4, PW, K5)

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    unit_path: {unit_path}
    drafter: /models/drafter-%n-$HOME
    sglang_preflight_extra_args: [--served-model-name, "m-100%"]  # the role's default is []
  tasks:
    - name: Read the unit, as preflight does (capabilities.yml)
      specdec.pivot.sglang_capabilities:
        unit: sglang-planted.service
        help: false
        speculative_flags:
          --speculative-algorithm: DDTREE
          --speculative-draft-model-path: "{{{{ drafter }}}}"
        extra_args: "{{{{ sglang_preflight_extra_args }}}}"
      register: sglang_preflight_caps

    - name: Read the unit file (as capabilities.yml)
      ansible.builtin.slurp:
        src: "{{{{ unit_path }}}}"
      register: sglang_preflight_unit_file
      no_log: true

    - name: systemd's view of the unit (unit.yml reads it with systemd_service, no_log)
      ansible.builtin.set_fact:
        sglang_preflight_svc:
          status:
            Environment: {environment}
      no_log: true

    - name: The role's own secrets.yml
      ansible.builtin.import_tasks: {repo}/roles/sglang_preflight/tasks/secrets.yml

    - name: The plan's unit and argv (plan.yml)
      ansible.builtin.set_fact:
        pivot_plan:
          new_argv: "{{{{ sglang_preflight_caps.exec_start_new.argv | specdec.pivot.pivot_unmask(pivot_auth) }}}}"
          old_argv: "{{{{ sglang_preflight_caps.unit.argv | specdec.pivot.pivot_unmask(pivot_auth) }}}}"
          unit:
            header: []
            sections: "{{{{ sglang_preflight_unit_file.content | b64decode | specdec.pivot.systemd_unit_parse }}}}"
      no_log: "{{{{ pivot_auth.secret_values | length > 0 }}}}"

    - name: Show the plan (as show.yml)
      ansible.builtin.debug:
        msg: "{{{{ ['new ExecStart: ' ~ (pivot_plan.new_argv | specdec.pivot.systemd_exec_lines | join(' '))]
                  | specdec.pivot.pivot_mask(pivot_auth) }}}}"

    - name: Render the unit the switch would write (sglang_service's template)
      ansible.builtin.template:
        src: {repo}/roles/sglang_service/templates/sglang.service.j2
        dest: {rendered}
        mode: "0600"
      diff: false
"""


def test_preflight_reads_the_secrets_back_and_shows_none(tmp_path):
    exec_start = (
        f"{PY} -m sglang.launch_server --model-path /models/m --port 30000 --api-key {K1} "
        f"--admin-api-key={K2} --api-ke {K4} --speculative-algorithm NEXTN"
    )
    environment = f"HF_TOKEN={K3} DATABASE_URL=postgres://u:{PW}@h/db CUDA_VISIBLE_DEVICES=0"
    env = write_unit(tmp_path, "sglang-planted", exec_start, environment, env_file=f"GITHUB_PAT={K5}\n")
    rendered = tmp_path / "rendered.service"
    book = tmp_path / "book.yml"
    book.write_text(
        PLAYBOOK.format(
            unit_path=tmp_path / "units" / "sglang-planted.service",
            environment=json.dumps(environment),
            repo=REPO,
            rendered=rendered,
        )
    )
    proc = run_local_playbook(book, tmp_path, "-vvvv", "--diff", env=env, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for value in PLANTED:
        assert value not in out, f"{value} in the -vvvv output"
    assert "new ExecStart: " in out and "--api-key ***" in out  # the plan, masked
    unit = rendered.read_text()
    for value in (K1, K2, K3, K4, PW):  # K5 stays in its EnvironmentFile
        assert value in unit, f"{value} is not in the unit the switch would write"
    assert f"--api-key {K1}" in unit and f"--admin-api-key {K2}" in unit and f"--api-ke {K4}" in unit
    assert "--speculative-draft-model-path /models/drafter-%%n-$$HOME" in unit  # escaped for systemd
    assert "--served-model-name m-100%%" in unit
    assert f"Environment=HF_TOKEN={K3}" in unit
