"""The preflight's GPU fit gets the unit's memory-pool flags: the role's own server.yml (the server's settings, the
flags typed as SGLang's argparse types them) and fit.yml (the specdec.pivot.gpu_memory request and the assert) run
through real ansible-playbook on this machine, on recorded data: a new command line as sglang_capabilities returns
it, the Qwen3.6-27B-shaped target at 32 layers with its DFlash drafter (tests/unit/hybrid_shape.py, the configs of
bench/gpu/shapes.py), and the idle H200 recorded by tests/unit/fixtures/nvidia_smi/record.sh, replayed by
lab/stand-ins/nvidia-smi (there is no GPU here).

On the H200 (143156 MiB free) the weights leave 94.7 GB of the 0.85 budget; with --disable-radix-cache SGLang reserves
(96 + 1) x (1 + 17) request states of 76,972,032 bytes (134.4 GB) for --max-running-requests 96 at the default budget
16 (17 draft tokens), so that unit does not fit, while the same with the radix cache does. Not the lab (the lab's
fault test runs the whole preflight on its tiny dense model, where these flags change nothing).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from hybrid_shape import state_per_request, write_hybrid_shape
from local_playbook import one_line, run_local_playbook, run_local_playbook_version

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "lab" / "stand-ins" / "nvidia-smi"
H200_IDLE = REPO / "tests" / "unit" / "fixtures" / "nvidia_smi" / "h200" / "idle"

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    sglang_preflight_budget: 16
    sglang_preflight_gpu_fit: true
    sglang_preflight_nvidia_smi: {stand_in}
    sglang_preflight_dtype: ""
    sglang_preflight_assume_mem_fraction: 0.85
    sglang_preflight_drafter_path: {drafter}
    pivot_auth: {{secret_values: [], values: {{}}}}  # a unit without secrets (pivot_secrets' shape)
    sglang_preflight_host: {{files: {{}}}}  # no cgroup.procs: no process to free
    sglang_preflight_caps:  # as sglang_capabilities returns them
      exec_start_new: {{argv: {new_argv}}}
      unit: {{argv: {old_argv}, environment: {{CUDA_VISIBLE_DEVICES: "0"}}}}
      plugin_checks: {{server_args: {{abbreviations: {abbreviations}}}}}
  tasks:
    - name: The role's server settings
      ansible.builtin.import_tasks: {repo}/roles/sglang_preflight/tasks/server.yml

    - name: The two config.json files, as drafter.yml notes them
      ansible.builtin.set_fact:
        sglang_preflight_config_files:
          results:
            - {{item: {drafter}, content: "{{{{ lookup('file', '{drafter}/config.json') | b64encode }}}}"}}
            - {{item: {target}, content: "{{{{ lookup('file', '{target}/config.json') | b64encode }}}}"}}

    - name: The role's GPU fit
      block:
        - name: The role's GPU fit
          ansible.builtin.import_tasks: {repo}/roles/sglang_preflight/tasks/fit.yml
      always:
        - name: Keep the settings and what gpu_memory returned
          ansible.builtin.copy:
            content: >-
              {{{{ {{'server': sglang_preflight_server, 'fit': sglang_preflight_fit.fit | default(none)}} | to_json }}}}
            dest: {out}
            mode: "0600"
"""


def run_preflight_fit(
    tmp_path: Path, flags: list[str], abbreviations: dict | None = None
) -> tuple[int, str, dict | None]:
    target, drafter = write_hybrid_shape(tmp_path / "shape", 32)
    new_argv = [
        "/venv/bin/python", "-m", "sglang.launch_server", "--model-path", str(target), "--port", "30000",
        *flags,
        "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", str(drafter),
        "--speculative-num-draft-tokens", "17",
    ]  # fmt: skip
    out = tmp_path / "fit.json"
    book = tmp_path / "book.yml"
    book.write_text(
        PLAYBOOK.format(
            stand_in=STAND_IN, drafter=drafter, target=target, repo=REPO, out=out,
            new_argv=json.dumps(new_argv), old_argv=json.dumps(new_argv[:7]),
            abbreviations=json.dumps(abbreviations or {}),
        )
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVIDIA_SMI_STANDIN", "ANSIBLE_"))}
    env.update(NVIDIA_SMI_STANDIN_DIR=str(H200_IDLE), NVIDIA_SMI_STANDIN_MODE="replay")
    proc = run_local_playbook(book, tmp_path, env=env, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr, json.loads(out.read_text()) if out.exists() else None


def _playbook_core() -> tuple[int, int]:
    """The (major, minor) of the ansible-core that run_local_playbook runs."""
    proc = run_local_playbook_version()
    major, minor = re.search(r"core (\d+)\.(\d+)", proc).groups()
    return int(major), int(minor)


#: ansible-core before 2.19 (the oldest meta/runtime.yml admits is 2.17) keeps a set_fact value that is not a whole
#: native expression as a string, and none as '': the role copes (fit.yml drops '', gpu_memory's argument spec
#: types the rest), the tests read the values as that core left them.
OLD_TEMPLATING = _playbook_core() < (2, 19)


def as_set_fact_keeps(value):
    """A server setting as the test expects it: '' as None and '96' as 96 on an ansible-core before 2.19."""
    if not OLD_TEMPLATING or not isinstance(value, str):
        return value
    if value == "":
        return None
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


P = state_per_request(24)  # 76,972,032 bytes: one request's GatedDeltaNet state at tp 1


@pytest.mark.parametrize(
    ("flags", "server", "rule", "state", "fits"),
    [
        pytest.param(
            ["--disable-radix-cache", "--max-running-requests=96"],
            {"max_running_requests": 96, "max_mamba_cache_size": None, "mamba_full_memory_ratio": None,
             "disable_radix_cache": True},
            "disable_radix_cache", 97 * 18 * P, False, id="disable-radix-cache-96",
        ),
        pytest.param(
            ["--max-running-requests", "96", "--mamba-full-memory-ratio", "0.5"],
            {"max_running_requests": 96, "max_mamba_cache_size": None, "mamba_full_memory_ratio": 0.5,
             "disable_radix_cache": False},
            "mamba_full_memory_ratio", None, True, id="radix-cache-on-ratio-0.5",
        ),
        pytest.param(
            ["--disable-radix-cache", "--max-mamba-cache-size", "8", "--max-running-requests", "96"],
            {"max_running_requests": 96, "max_mamba_cache_size": 8, "mamba_full_memory_ratio": None,
             "disable_radix_cache": True},
            "max_mamba_cache_size", 9 * P + 9 * 17 * P, True, id="max-mamba-cache-size-8",
        ),
        pytest.param(
            ["--disable-radix-cache"],  # DDTREE's default 48 running requests
            {"max_running_requests": None, "max_mamba_cache_size": None, "mamba_full_memory_ratio": None,
             "disable_radix_cache": True},
            "disable_radix_cache", 49 * 18 * P, True, id="disable-radix-cache-default-48",
        ),
    ],
)  # fmt: skip
def test_the_units_memory_pool_flags_reach_the_fit(tmp_path, flags, server, rule, state, fits):
    rc, out, kept = run_preflight_fit(tmp_path, flags)
    assert kept is not None, out[-4000:]
    assert {k: as_set_fact_keeps(kept["server"][k]) for k in server} == server, kept["server"]
    if not OLD_TEMPLATING:
        assert all(type(kept["server"][k]) is type(v) for k, v in server.items()), kept["server"]
    fit = kept["fit"]
    assert fit is not None, out[-4000:]
    sent = {k: v for k, v in server.items() if v is not None}
    assert {k: fit[k] for k in sent} == sent  # what the module used: the unit's flags
    assert fit["max_running_requests"] == (server["max_running_requests"] or 48)
    assert fit["speculative_num_draft_tokens"] == 17
    assert fit["linear_state_rule"] == rule
    if state is not None:
        assert fit["linear_state_bytes_per_gpu"] == state
    assert fit["fits"] is fits
    if fits:
        assert rc == 0, out[-4000:]
        return
    assert rc != 0
    text = one_line(out)
    assert "target + drafter do not fit the GPUs of localhost with --tp-size 1 and --mem-fraction-static 0.85:" in text
    assert "Loaded weights leave no GPU memory for the KV cache" in text
    assert "--speculative-num-draft-tokens is sglang_preflight_budget + 1 = 17" in text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        pytest.param(
            ["--max-running-requests", "lots"], "--max-running-requests='lots': not an integer", id="running-word"
        ),
        pytest.param(
            ["--disable-radix-cache=yes"], "--disable-radix-cache is a switch without a value", id="radix-value"
        ),
    ],
)
def test_a_flag_sglang_would_refuse_stops_before_the_fit(tmp_path, flags, message):
    rc, out, kept = run_preflight_fit(tmp_path, flags)
    assert rc != 0 and kept is None
    text = one_line(out)
    assert message in text, out[-4000:]
    assert "fix it in the unit's ExecStart (or sglang_preflight_extra_args)" in text


@pytest.mark.parametrize(
    ("flags", "abbreviations", "message"),
    [
        pytest.param(
            ["--max-running", "96"], {"--max-running": "--max-running-requests"},
            "The command line abbreviates --max-running, which SGLang's argparse expands to --max-running-requests;",
            id="abbreviation",
        ),
        pytest.param(
            ["--config", "/etc/sglang/server.yaml"], {},
            "The unit's ExecStart passes --config: SGLang merges that YAML file's options into its command line",
            id="config-file",
        ),
        pytest.param(
            ["--config=/etc/sglang/server.yaml"], {}, "Move the file's options into ExecStart", id="config-equals",
        ),
    ],
)  # fmt: skip
def test_a_flag_the_pivot_would_not_read_as_sglang_does_stops_the_preflight(tmp_path, flags, abbreviations, message):
    """An abbreviation (as the SGLang parser's verdict reports it: test_server_args.py) or a --config file: SGLang
    would read a setting that the pivot's own reading of the command line misses, so the preflight stops first."""
    rc, out, kept = run_preflight_fit(tmp_path, flags, abbreviations)
    text = one_line(out)
    assert rc != 0 and kept is None, out[-4000:]
    assert message in text, out[-4000:]
    assert "Nothing was changed." in text


def test_tp_the_short_form_sglang_documents_is_read(tmp_path):
    out, kept = run_preflight_fit(tmp_path, ["--tp", "2"])[1:]
    assert kept is not None, out[-4000:]
    assert as_set_fact_keeps(kept["server"]["tp_size"]) == 2
