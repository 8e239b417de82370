#!/usr/bin/python
# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_capabilities
short_description: Report what an SGLang environment can do for speculative decoding (read-only)
version_added: "0.1.0"
description:
  - Runs a short probe script in the Python interpreter of an SGLang environment and reports the SGLang
    version, the interpreter, its site-packages, the torch version, the speculative algorithms SGLang's
    own help lists, the algorithms registered after SGLang's C(load_plugins) ran, the plugin entry points
    seen, whether SGLang has the plugin API, which DFLASH worker it ships, and whether the DDTree plugin
    (sglang-ddtree) is supported and registered there.
  - The interpreter is given with O(python), or taken from a systemd unit (O(unit)) as systemd runs it - the
    ExecStart's program after any wrappers (C(env [VAR=...]), C(nice), C(ionice), C(taskset), C(numactl), C(chrt),
    C(conda|mamba|micromamba run -n ENV|-p PREFIX), C(uv run), C(poetry run), C(pipenv run)), or the C(#!) line of
    a console script such as C(/opt/venv/bin/sglang). A bare first word (C(python3)) is looked up in systemd's
    fixed search path, never in the unit's C(Environment=PATH); a program that C(env), C(nice) and the like start
    is looked up in the service's PATH; C(conda run) and friends run it in their environment. When the
    interpreter cannot be told for sure the module fails naming the ExecStart line and the fix
    (O(unit_python)); it never probes another interpreter than the one the unit runs. With O(unit) the probe
    runs with the unit's C(Environment=) and C(EnvironmentFile=) values, in its C(WorkingDirectory=), and as its
    C(User=) (see O(run_as_unit_user)), so it sees what the service sees (including C(SGLANG_PLUGINS)).
  - The probe imports sglang, calls C(sglang.srt.plugins.load_plugins) (SGLang 0.5.11+) while recording
    each plugin's fate from SGLang's own log records, lists C(SpeculativeAlgorithm) members and the plugin
    registry, checks C(SpeculativeAlgorithm.register) (0.5.12+), and finds the DFLASH worker by module spec
    (C(dflash_worker_v2) = v2, C(dflash_worker) = v1) without importing it. It never fails on an old SGLang; what
    is missing is reported as false/none.
  - "With O(help=true) it also runs C(python -m sglang.launch_server --help) (a few seconds) and reads the
    C(--speculative-algorithm) choices in both forms SGLang has printed - the argparse list
    C({DFLASH,EAGLE,...}) (0.5.10, 0.5.11, no plugin can add a name) and the free text
    C(Builtins: ... Or any name registered via SpeculativeAlgorithm.register) (0.5.12+)."
  - With O(unit) it also returns the unit's ExecStart parsed into interpreter, module, flags and leftover
    arguments (RV(exec_start_parsed)) and, with O(speculative_flags), the ExecStart with every speculative flag
    replaced (RV(exec_start_new)), computed by the same code the roles use.
  - Read-only. An interpreter without sglang is a result (RV(sglang.installed=false)), not a failure; assert on
    it where SGLang is required.
author:
  - specdec.pivot maintainers (@specdec)
requirements:
  - Python 3.8 or later in the probed interpreter.
  - C(systemctl) on the target when O(unit) is used.
options:
  python:
    description:
      - Path of the Python interpreter of the SGLang environment, for example C(/opt/sglang/.venv/bin/python).
      - Exactly one of O(python) and O(unit) is required.
    type: path
  unit:
    description:
      - A systemd unit that runs SGLang, for example C(sglang.service). Its ExecStart, Environment,
        EnvironmentFiles, User, Group, WorkingDirectory and FragmentPath are read with C(systemctl show), and the
        interpreter is derived from ExecStart.
      - Exactly one of O(python) and O(unit) is required.
    type: str
  unit_python:
    description:
      - With O(unit), the interpreter the unit's ExecStart runs, when the module cannot resolve it by itself (for
        example C(poetry run) with a virtualenv outside the project - C(poetry env info -p)/bin/python). The
        unit's ExecStart, environment and user are still read and used.
    type: path
  environment:
    description:
      - Extra environment variables for the probe and the help run. They override the unit's.
    type: dict
    default: {}
  timeout:
    description:
      - Seconds the probe and, separately, the help run may take before they are killed (needs C(timeout) from
        coreutils on the target; without it there is no limit and a warning says so).
    type: int
    default: 120
  help:
    description:
      - Also run C(python -m sglang.launch_server --help) and return the algorithms it lists (RV(help_algorithms)).
        Takes a few seconds. A help run that fails is reported in RV(help_error), not as a task failure.
    type: bool
    default: true
  run_as_unit_user:
    description:
      - With O(unit) and a unit C(User=) other than root, run the probe and the help as that user (through
        C(setpriv), else C(runuser)) when the module runs as root. When it does not run as root, the commands
        run as the connecting user and a warning says so.
    type: bool
    default: true
  speculative_flags:
    description:
      - With O(unit), the speculative flags the service should run with instead of its current ones, as a
        mapping of flag to value (keys with or without C(--), C(_) or C(-); C(true) for a bare flag, a list for
        several values, C(null) or C(false) to remove a flag).
      - Every C(--speculative-*) flag of the current ExecStart (and C(--enable-multi-layer-eagle),
        C(--uno-lora-path), C(--enable-linear-replayssm-spec)) is dropped, every other flag is kept in order, and
        the new flags go where the first old speculative flag stood. A key naming a kept flag replaces its value
        in place. The result is RV(exec_start_new); nothing is written.
    type: dict
  extra_args:
    description:
      - With O(speculative_flags), more server flags for the new ExecStart, as words (C([--context-length, "8192"])).
        A flag the ExecStart has gets the new value in place (argparse keeps the last one), a new flag is added at
        the end. Like the O(speculative_flags) values, each word is a literal value, escaped for systemd.
    type: list
    elements: str
    default: []
  plugin_checks:
    description:
      - The DDTree plugin's own checks, run in the SAME process as the probe (SGLang is imported once for all of
        them), with the unit's environment and user. The result is RV(plugin_checks).
    type: dict
    suboptions:
      wheel:
        description:
          - A plugin wheel on the host, put first on the probe's C(sys.path) after what is installed has been read
            (RV(ddtree.plugin_installed), RV(ddtree.plugin_version)) and before SGLang is imported, so that
            C(load_plugins) and the checks see the plugin the pivot would install (nothing is installed). The unit's
            user must be able to read it.
        type: path
      wheel_base64:
        description:
          - The plugin wheel's bytes, base64-encoded, instead of O(plugin_checks.wheel) (a wheel on the controller
            then needs no copy task and no temporary directory task of its own). The module writes it as
            O(plugin_checks.wheel_name) into a new temporary directory C(specdec-pivot-preflight.*) (mode 0755, the
            file 0644, so the unit's user can read it), uses it as O(plugin_checks.wheel), and removes the directory
            before it returns, whatever happened.
        type: str
      wheel_name:
        description:
          - The file name of the wheel given by O(plugin_checks.wheel_base64) (a wheel file name, C(*.whl), as pip
            and C(importlib.metadata) read the distribution's name and version from it).
        type: str
      drafter:
        description:
          - Run the plugin's drafter check (C(python -m sglang_ddtree check-drafter PATH --consumer sglang)) on this
            drafter directory.
        type: path
      check_sglang:
        description:
          - Run the plugin's SGLang check (C(python -m sglang_ddtree check-sglang --expect any)) after C(load_plugins).
        type: bool
        default: false
      server_args:
        description:
          - With O(speculative_flags), check the new command line's server words (RV(exec_start_new.server_args))
            with SGLang's own parser (what module specdec.pivot.sglang_server_args does), the real words given to
            the probe on its stdin. A command line with C($) or C(%) (systemd expands them at start) is not checked.
        type: bool
        default: false
      budget:
        description:
          - The new server's widest node budget (C(--speculative-num-draft-tokens) - 1). With O(plugin_checks.drafter),
            check the environment's C(SGLANG_DDTREE_BUDGET) (the unit's, which the new server inherits) against it
            and the drafter's block size with the plugin's own parser (C(sglang_ddtree.budget.parse_budget_option)),
            as the server would at start.
        type: int
extends_documentation_fragment:
  - specdec.pivot.attributes
  - specdec.pivot.attributes.read_only
attributes:
  check_mode:
    details:
      - Read-only; check mode runs the same probe and returns the same data.
  diff_mode:
    details:
      - Nothing changes, so there is no diff; RV(exec_start_new) shows a proposed ExecStart.
notes:
  - "Secrets are never returned: the value of C(--api-key) and C(--admin-api-key) (also written C(--flag=value) or
    abbreviated as SGLang's argparse accepts, e.g. C(--api-ke)), and every C(Environment=), C(EnvironmentFile=) and
    C(env NAME=value) value whose name is not on the collection's list of harmless names (C(PATH), C(HOME),
    C(PYTHONPATH), C(CUDA_VISIBLE_DEVICES), C(OMP_NUM_THREADS), C(HF_HOME), C(HF_HUB_OFFLINE), names starting
    with C(CUDA_), C(NCCL_), C(SGLANG_), C(TORCH_), C(LC_) unless they hold a word such as KEY, TOKEN, SECRET,
    PASS, AUTH, CRED, DSN, URL; see module_utils C(_secrets)) is replaced, in every returned field, by the marker
    C({secret:NAME}) (NAME the flag or the variable) - a key wherever it occurs, an environment value where it is
    a whole value or follows its C(NAME=) - and Ansible masks any key left with C(********). Values that carry
    nothing (empty, a boolean word, a number of at most 5 characters, a bare C($VAR), an absolute path) are shown.
    RV(secrets) names them. The role specdec.pivot.sglang_preflight reads the values themselves under C(no_log)."
  - Every new value (O(speculative_flags), O(extra_args)) is a literal value; RV(exec_start_new) writes it escaped
    for systemd (C(%) as C(%%), C($) as C($$)), so RV(exec_start_new) is what systemd runs. The words kept from the
    unit are as the unit file writes them.
  - With O(unit), ExecStart is read from the unit file (C(FragmentPath)) and its drop-ins, whose quoting is exact;
    C(%) specifiers and C($VAR) references stay as written there, and RV(exec_start_new) keeps them. When the file
    cannot be read, the C({ path=... ; argv[]=... }) form of C(systemctl show) is used with a warning - systemctl
    joins the words with spaces without quoting, so a word holding a space shows as several words there.
  - A unit file whose ExecStart differs from what systemd loaded (no C(daemon-reload) since the edit) gives a
    warning; RV(unit.need_daemon_reload) reports systemd's own view.
  - A unit with several ExecStart commands is reported through the first one, with a warning.
  - The probe sees the unit's environment as read from C(Environment=), C(EnvironmentFile=) and C(env NAME=value)
    words of ExecStart, plus the environment the module itself runs with; it is not a copy of the service's
    process environment (systemd's own variables such as C(INVOCATION_ID) are missing).
seealso:
  - module: specdec.pivot.gpu_memory
  - module: specdec.pivot.training_process
"""

EXAMPLES = r"""
- name: What can the SGLang of this unit do?
  specdec.pivot.sglang_capabilities:
    unit: sglang.service
  register: caps

- name: Require the plugin API before installing sglang-ddtree
  ansible.builtin.assert:
    that:
      - caps.sglang.installed
      - caps.plugin_api.available
    fail_msg: "SGLang {{ caps.sglang.version }} has no plugin API (needs >= {{ caps.plugin_api.min_version }})"

- name: Probe an interpreter directly, without the help run
  specdec.pivot.sglang_capabilities:
    python: /opt/sglang/.venv/bin/python
    help: false
    environment:
      SGLANG_PLUGINS: ddtree

- name: Compute the ExecStart for DDTree (nothing is changed)
  specdec.pivot.sglang_capabilities:
    unit: sglang.service
    help: false
    speculative_flags:
      speculative-algorithm: DDTREE
      speculative-draft-model-path: /root/models/Qwen3.6-27B-DFlash
      speculative-num-draft-tokens: 17
  register: caps

- name: Show it
  ansible.builtin.debug:
    msg: "{{ caps.exec_start_new.multiline }}"
"""

RETURN = r"""
msg:
  description: One line summing up the result.
  returned: always
  type: str
  sample: "sglang 0.5.23 in /opt/sglang/.venv/bin/python: plugin API available, DFLASH worker v2; DDTREE registered"
sglang:
  description: SGLang in the probed interpreter.
  returned: always
  type: dict
  contains:
    installed:
      description: Whether the C(sglang) package is importable (found by C(importlib.util.find_spec)).
      type: bool
    version:
      description: Its version from the distribution metadata, or null.
      type: str
      sample: 0.5.23
    location:
      description: The package directory.
      type: str
    error:
      description: Why C(import sglang) failed when it is installed but broken, else null.
      type: str
python:
  description: The probed interpreter, as it reports itself.
  returned: always
  type: dict
  contains:
    path:
      description: C(sys.executable).
      type: str
    version:
      description: C(platform.python_version).
      type: str
      sample: 3.11.7
    requested:
      description: The path the module ran (from O(python) or derived from the unit).
      type: str
    source:
      description: Where the interpreter came from (C(python option), C(unit ExecStart), C(#! line of ...)).
      type: str
    prefix:
      description: C(sys.prefix).
      type: str
    in_venv:
      description: Whether it is a virtual environment's interpreter.
      type: bool
site_packages:
  description: The interpreter's site-packages directories (purelib first).
  returned: always
  type: list
  elements: str
torch_version:
  description: The installed torch version (distribution metadata), or null.
  returned: always
  type: str
  sample: 2.13.0+cpu
help_algorithms:
  description: The speculative algorithms C(launch_server --help) lists; null when the help was not run or failed.
  returned: always
  type: list
  elements: str
  sample: [EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM, DFLASH, DSPARK, UNO]
help_form:
  description:
    - C(choices) for argparse's static list (no plugin can add a name), C(free_text) for the
      C(Builtins... or any name registered) form, C(unlisted) when the help has C(--speculative-algorithm) but
      names no choices (present, choices unknown), null when the help was not run or has no such option.
  returned: always
  type: str
help_option:
  description:
    - What the help says about C(--speculative-algorithm) - V(absent) (no such option), V(choices) (a static
      list, in RV(help_algorithms)), V(free_text) (a list of builtins, names may be added), V(unknown_choices)
      (the option is there, its help names no choices); null when the help was not run or failed.
  returned: always
  type: str
  choices: [absent, choices, free_text, unknown_choices]
help_accepts_registered:
  description: Whether the help says registered names are accepted; null when the help was not run.
  returned: always
  type: bool
help_error:
  description: Why the help run failed (the last line of its error output), else null.
  returned: always
  type: str
builtin_algorithms:
  description:
    - C(SpeculativeAlgorithm) members (without NONE) plus reserved aliases such as NEXTN where SGLang lists them.
  returned: always
  type: list
  elements: str
plugin_algorithms:
  description: Names in SGLang's plugin registry after C(load_plugins) (0.5.12+), e.g. C(DDTREE).
  returned: always
  type: list
  elements: str
registered_algorithms:
  description: Every name C(--speculative-algorithm) accepts in this interpreter, builtins then plugin ones.
  returned: always
  type: list
  elements: str
plugins_loaded:
  description:
    - Entry points of group C(sglang.srt.plugins) (name, value, dist, dist_version) with what C(load_plugins)
      did with each (C(loaded) and C(executed), each true, false or null, and C(error)).
  returned: always
  type: list
  elements: dict
plugin_api:
  description: SGLang's plugin API.
  returned: always
  type: dict
  contains:
    entry_points:
      description: C(sglang.srt.plugins.load_plugins) exists (entry-point group C(sglang.srt.plugins), 0.5.11+).
      type: bool
    register:
      description: C(SpeculativeAlgorithm.register) exists (0.5.12+).
      type: bool
    available:
      description: Both; a plugin can add a speculative algorithm.
      type: bool
    min_version:
      description: The first SGLang release with both.
      type: str
      sample: 0.5.12
    group:
      description: The entry-point group.
      type: str
dflash_worker:
  description: C(v2) (dflash_worker_v2.py), C(v1) (dflash_worker.py) or C(none).
  returned: always
  type: str
ddtree:
  description: The DDTree plugin in this environment.
  returned: always
  type: dict
  contains:
    supported:
      description: SGLang is importable, has the plugin API and DFlashWorkerV2, and its version is in range.
      type: bool
    registered:
      description:
        - DDTREE is in the registry after C(load_plugins) and C(SpeculativeAlgorithm.from_string) resolves it.
      type: bool
    plugin_installed:
      description: The C(sglang_ddtree) package is importable.
      type: bool
    plugin_version:
      description: sglang-ddtree's version, or null.
      type: str
    plugin_status:
      description:
        - The plugin's own C(last_status) after C(load_plugins) (C(registered), C(skipped) with a reason, ...), or null.
      type: str
    wheel:
      description:
        - With O(plugin_checks.wheel), that wheel's C(path) and C(version), else null. C(registered), C(plugin_status)
          and C(entry_point) then describe the wheel as SGLang loads it (nothing is installed); C(plugin_installed)
          and C(plugin_version) what is installed.
      type: dict
    entry_point:
      description: The sglang-ddtree entry of RV(plugins_loaded), or null.
      type: dict
    supported_range:
      description: The supported SGLang versions as a specifier.
      type: str
      sample: ">=0.5.17,<=0.5.23"
    range_text:
      description: The plugin's own wording of the range, or null.
      type: str
    range_source:
      description: C(sglang_ddtree.sglang.versions) when the plugin declared the range, else the collection's fallback.
      type: str
    tested_versions:
      description: SGLang versions DDTree was tested with.
      type: list
      elements: str
    reason:
      description: Why it is not supported or not registered, or that it is registered.
      type: str
plugin_checks:
  description: The outcome of each check O(plugin_checks) asked for.
  returned: when O(plugin_checks) is given
  type: dict
  contains:
    drafter:
      description:
        - The drafter check as the CLI command would end, C(rc) (0 or 1), C(stdout) (its JSON report) and
          C(stderr) (what went wrong when it printed no report); read it with the filter
          specdec.pivot.sglang_ddtree_cli(check-drafter).
      type: dict
      returned: when O(plugin_checks.drafter) is set
    sglang:
      description: The same for the SGLang check (filter specdec.pivot.sglang_ddtree_cli(check-sglang)).
      type: dict
      returned: when O(plugin_checks.check_sglang) is true
    server_args:
      description:
        - SGLang's parser's verdict on the new server words, the keys of module specdec.pivot.sglang_server_args
          (C(checked), C(ok), C(error), C(reason), C(algorithm), C(algorithm_resolved), C(startup_check), the
          verdict of sglang-ddtree's own start-up check on a DDTREE command line, and C(abbreviations)); secrets
          masked.
      type: dict
      returned: when O(plugin_checks.server_args) is true
    budget:
      description:
        - The per-step budget variable's verdict, C(checked), C(ok) (null when not checked), C(value) (the
          variable's value, null when unset), C(candidates) (null for a fixed budget), C(error) (the plugin's
          message naming the variable and the fix), C(reason) (why it was not checked).
      type: dict
      returned: when O(plugin_checks.budget) is set
    wheel:
      description: The wheel put on the probe's path and its version, or null.
      type: dict
      returned: when O(plugin_checks) is given
probe_errors:
  description: Steps of the probe that failed (old or broken SGLang), one line each.
  returned: always
  type: list
  elements: str
unit:
  description: The unit's facts.
  returned: when O(unit) is given
  type: dict
  contains:
    name:
      description: The unit's id.
      type: str
    fragment_path:
      description: The unit file.
      type: str
    exec_start:
      description: ExecStart as one line (prefix, words quoted for systemd where needed).
      type: str
    exec_start_source:
      description: C(unit file) (exact words) or C(systemctl show) (the fallback; see the notes).
      type: str
    argv:
      description: ExecStart's words (after the C(@) path, when there is one).
      type: list
      elements: str
    exec_commands:
      description: How many ExecStart commands the unit has.
      type: int
    drop_in_paths:
      description: The unit's drop-in files.
      type: list
      elements: str
    need_daemon_reload:
      description: systemd's C(NeedDaemonReload).
      type: bool
    environment:
      description: C(Environment=) values.
      type: dict
    environment_files:
      description: C(EnvironmentFile=) paths with C(ignore_errors).
      type: list
      elements: dict
    environment_file_names:
      description: The names the C(EnvironmentFile=) files set (they override C(Environment=)); names only.
      type: list
      elements: str
    exec_env_names:
      description: The names that C(env NAME=value) words of C(ExecStart) set (they override both); names only.
      type: list
      elements: str
    user:
      description: C(User=), empty for root.
      type: str
    group:
      description: C(Group=).
      type: str
    working_directory:
      description: C(WorkingDirectory=) without its C(-) prefix.
      type: str
    active_state:
      description: C(ActiveState).
      type: str
    main_pid:
      description: C(MainPID), 0 when not running.
      type: int
secrets:
  description:
    - The names (C(--api-key), C(--admin-api-key), environment variable names; a name seen with a second value gets
      C(#2)) whose values are masked in this result as C({secret:NAME}). Never a value.
  returned: always
  type: list
  elements: str
  sample: [--api-key, HF_TOKEN]
exec_start_parsed:
  description:
    - The unit's ExecStart parsed (module_utils C(_exec_start.parse_exec_start)) - C(interpreter), C(module) (for
      C(-m X)) or C(script), C(python_options), C(args) (positional words before the first flag), C(flags)
      (C(--flag value) gives the value, a bare flag true, several values or a repeated flag a list), C(order)
      (flags as they occur), C(repeated), C(trailing_args), C(launcher), C(env_assignments), C(program), C(kind).
  returned: when O(unit) is given
  type: dict
exec_start_new:
  description: The ExecStart with the speculative flags replaced by O(speculative_flags). Nothing is written.
  returned: when O(unit) and O(speculative_flags) are given
  type: dict
  contains:
    argv:
      description: The new argv.
      type: list
      elements: str
    server_args:
      description:
        - The server's own arguments of the new argv (its flags; after the program, its C(-m) module and any
          wrappers such as C(conda run) or C(numactl)), as SGLang's parser reads them.
      type: list
      elements: str
    value:
      description: The new ExecStart value on one line (for C(ExecStart=)).
      type: str
    multiline:
      description: The same with one flag per continuation line.
      type: str
    flags:
      description: The new flags.
      type: dict
    removed:
      description: The speculative flags that were dropped, with their old values.
      type: dict
    differs:
      description: Whether the new argv differs from the current one.
      type: bool
"""

import base64
import binascii
import grp
import json
import os
import pwd
import re
import shlex
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.specdec.pivot.plugins.module_utils import (
    _argv_flags,
    _exec_start,
    _exec_wrappers,
    _secrets,
    _server_args,
    _sglang_caps,
    _sglang_flags,
    _systemd_cmdline,
    _systemd_unit,
)
from ansible_collections.specdec.pivot.plugins.module_utils._sglang_probe import PROBE_SOURCE, parse_probe_output

ARGUMENT_SPEC = dict(
    python=dict(type="path"),
    unit=dict(type="str"),
    unit_python=dict(type="path"),
    environment=dict(type="dict", default={}),
    timeout=dict(type="int", default=120),
    help=dict(type="bool", default=True),
    run_as_unit_user=dict(type="bool", default=True),
    speculative_flags=dict(type="dict"),
    extra_args=dict(type="list", elements="str", default=[]),
    plugin_checks=dict(
        type="dict",
        mutually_exclusive=[("wheel", "wheel_base64")],
        required_together=[("wheel_base64", "wheel_name")],
        options=dict(
            wheel=dict(type="path"),
            wheel_base64=dict(type="str", no_log=True),
            wheel_name=dict(type="str"),
            drafter=dict(type="path"),
            check_sglang=dict(type="bool", default=False),
            server_args=dict(type="bool", default=False),
            budget=dict(type="int"),
        ),
    ),
)

#: A wheel file name: name-version(-build)?-python-abi-platform.whl, one path component.
WHEEL_NAME_RE = re.compile(r"^[A-Za-z0-9_.+]+(?:-[A-Za-z0-9_.+!]+){4,5}\.whl$")

#: Why a new command line is not checked with SGLang's parser (systemd expands $VAR and %-specifiers at start).
UNCHECKED_EXPANSION = "not checked (the command line uses $VAR or %, which systemd expands at start)"


class ProbeError(Exception):
    """A failure to report with fail_json; the message names the option and the fix."""


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _which(name: str, path_var: str) -> str | None:
    for d in path_var.split(os.pathsep):
        if d and _is_executable(os.path.join(d, name)):
            return os.path.join(d, name)
    return None


def read_unit(module: AnsibleModule, unit: str) -> dict:
    if not unit or unit.startswith("-") or any(c.isspace() for c in unit):
        raise ProbeError(f"unit={unit!r} is not a unit name; give the unit's name, e.g. unit=sglang.service")
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        raise ProbeError(
            f"unit={unit}: systemctl is not on this host's PATH, so the unit cannot be read; "
            "pass the interpreter with python=<path> instead of unit"
        )
    cmd = [systemctl, "show", "--no-pager"]
    for prop in _systemd_unit.UNIT_PROPERTIES:
        cmd += ["-p", prop]
    rc, out, err = module.run_command([*cmd, "--", unit], expand_user_and_vars=False)
    if rc != 0:
        raise ProbeError(f"unit={unit}: systemctl show failed (rc={rc}): {(err or out).strip()}")
    try:
        info = _systemd_unit.unit_info_from_show(_systemd_unit.parse_systemctl_show(out), unit)
    except ValueError as exc:
        raise ProbeError(f"unit={unit}: {exc}; check the name with `systemctl list-units --all '*sglang*'`") from exc
    return info


def unit_exec_start(module: AnsibleModule, info: dict) -> dict:
    """Parse the unit's ExecStart from its unit file and drop-ins (exact words), else from systemctl show.

    Updates ``info`` (exec_start, exec_start_source, argv, exec_commands) and returns the parsed ExecStart.
    """
    texts, why = [], ""
    paths = [info["fragment_path"], *info["drop_in_paths"]] if info["fragment_path"] else []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                texts.append(fh.read())
        except OSError as exc:
            why = f"cannot read {path}: {exc.strerror or exc}"
            break
    commands = _systemd_unit.unit_exec_starts(texts) if paths and not why else []
    if paths and not why and not commands:
        why = f"no ExecStart= in {', '.join(paths)}"
    if not paths:
        why = "the unit has no unit file (FragmentPath is empty)"
    try:
        if commands:
            parsed = _exec_start.parse_exec_start(commands[0])
            loaded = info["argv"]
            if "%" not in commands[0] and " ".join(parsed["argv"]).split() != loaded:
                shown = _secrets.mask(" ".join(loaded), _secrets.unit_secrets(loaded, info["environment"]), False)
                module.warn(
                    f"the ExecStart in {info['fragment_path']} differs from the one systemd has loaded "
                    f"({shown!r}); run `systemctl daemon-reload` (the unit file's is reported)"
                )
            info.update(exec_start_source="unit file", argv=parsed["argv"], exec_commands=len(commands))
        else:
            parsed = _exec_start.parse_exec_start(
                {"path": info["exec_path"], "argv": info["argv"], "prefix": info["exec_prefix"]}
            )
            module.warn(
                f"ExecStart of {info['name']} read from systemctl show ({why}): systemctl joins the words with "
                "spaces, so a word holding a space shows as several words"
            )
    except ValueError as exc:
        raise ProbeError(f"unit={info['name']}: cannot parse ExecStart: {exc}") from exc
    info["exec_start"] = _exec_start.render_exec_start(parsed)
    if info["exec_commands"] > 1:
        module.warn(f"unit {info['name']} has {info['exec_commands']} ExecStart commands; only the first one is used")
    return parsed


def unit_environment(module: AnsibleModule, info: dict) -> dict:
    """Environment=, then EnvironmentFile= contents (systemd: files override Environment=). The names the files
    set go into ``info["environment_file_names"]`` (names only: values may be secrets)."""
    env = dict(info["environment"])
    from_files: set = set()
    for ef in info["environment_files"]:
        try:
            with open(ef["path"], encoding="utf-8") as fh:
                values = _systemd_unit.parse_environment_file(fh.read())
            env.update(values)
            from_files.update(values)
        except OSError as exc:
            if not ef["ignore_errors"]:
                module.warn(f"cannot read EnvironmentFile {ef['path']} of unit {info['name']}: {exc}")
    info["environment_file_names"] = sorted(from_files)
    return env


def resolve_interpreter(parsed: dict, unit: str, env: dict, working_directory: str = "") -> tuple[str, str]:
    """(interpreter path, how it was found) from a parsed ExecStart, found as systemd and its wrappers find it."""
    try:
        resolved = _exec_wrappers.resolve_exec_program(parsed, env, working_directory, _is_executable, os.path.exists)
    except ValueError as exc:
        raise ProbeError(
            f"unit={unit}: cannot tell which interpreter "
            f"`ExecStart={_systemd_cmdline.render_argv(parsed['argv'])[:300]}` "
            f"runs: {exc}. Fix the unit (an absolute interpreter path), or give it with unit_python=<path> "
            "(role specdec.pivot.sglang_preflight: sglang_preflight_python)"
        ) from exc
    found = resolved["path"]
    path_var = env.get("PATH") or _exec_wrappers.SYSTEMD_DEFAULT_PATH
    via = f" via {' + '.join(resolved['wrappers'])}" if resolved["wrappers"] else ""
    if _exec_start.is_python(found):
        return found, f"unit ExecStart{via}"
    # a console script (e.g. /opt/venv/bin/sglang): its #! line names the interpreter
    try:
        with open(found, "rb") as fh:
            first = fh.readline(512).decode("utf-8", "replace").strip()
    except OSError as exc:
        raise ProbeError(f"unit={unit}: cannot read {found} to find its interpreter: {exc}") from exc
    if first.startswith("#!"):
        words = shlex.split(first[2:].strip())
        if words and os.path.basename(words[0]) == "env":
            words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
            cand = _which(words[0], path_var) if words else None
        else:
            cand = words[0] if words else None
        if cand and _exec_start.is_python(cand) and _is_executable(cand):
            return cand, f"#! line of {found}"
    env_root = os.path.dirname(os.path.dirname(found))
    if os.path.exists(os.path.join(env_root, "pyvenv.cfg")) or os.path.isdir(os.path.join(env_root, "conda-meta")):
        for name in ("python3", "python"):  # a program in a venv's or conda env's bin/ (e.g. a compiled launcher)
            sibling = os.path.join(os.path.dirname(found), name)
            if _is_executable(sibling):
                return sibling, f"python beside {found}"
    raise ProbeError(
        f"unit={unit}: ExecStart runs {found}, which is not a Python interpreter and names none in its #! line; "
        "give the interpreter with unit_python=<path> (role specdec.pivot.sglang_preflight: sglang_preflight_python)"
    )


def user_prefix(module: AnsibleModule, info: dict | None, run_as: bool) -> tuple[list[str], dict, str]:
    """(argv prefix, environment additions, user name) to run a command as the unit's User=."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    user = (info or {}).get("user") or ""
    if not info or not user or user in ("root", "0") or user == me or not run_as:
        return [], {}, me
    try:
        pw = pwd.getpwnam(user) if not user.isdigit() else pwd.getpwuid(int(user))
    except KeyError as exc:
        raise ProbeError(
            f"unit={info['name']} runs as User={user}, which does not exist on this host; "
            "fix the unit or set run_as_unit_user=false"
        ) from exc
    if os.geteuid() != 0:
        module.warn(f"the probe runs as {me}, not as the unit's User={user} (become root to run it as {user})")
        return [], {}, me
    env = {"HOME": pw.pw_dir, "USER": pw.pw_name, "LOGNAME": pw.pw_name}
    setpriv = module.get_bin_path("setpriv")
    if setpriv:
        gid = pw.pw_gid
        if info.get("group"):
            try:
                gid = int(info["group"]) if info["group"].isdigit() else grp.getgrnam(info["group"]).gr_gid
            except KeyError as exc:
                raise ProbeError(
                    f"unit={info['name']} runs as Group={info['group']}, which does not exist on this host; "
                    "fix the unit or set run_as_unit_user=false"
                ) from exc
        regid = str(gid)
        return [setpriv, f"--reuid={pw.pw_uid}", f"--regid={regid}", "--init-groups", "--"], env, pw.pw_name
    runuser = module.get_bin_path("runuser")
    if runuser:
        return [runuser, "-u", pw.pw_name, "--"], env, pw.pw_name
    module.warn(f"neither setpriv nor runuser is on PATH: the probe runs as {me}, not as User={user}")
    return [], {}, me


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def summary_message(r: dict) -> str:
    py = r["python"].get("path") or r["python"].get("requested")
    if not r["sglang"]["installed"]:
        return (
            f"sglang is not installed in {py}; point python= (or the unit's ExecStart) at the SGLang "
            "environment's interpreter"
        )
    if r["sglang"]["error"]:
        return f"sglang {r['sglang']['version']} in {py} does not import: {r['sglang']['error']}"
    api = "plugin API available" if r["plugin_api"]["available"] else "no plugin API"
    head = f"sglang {r['sglang']['version']} in {py}: {api}, DFLASH worker {r['dflash_worker']}; "
    if r["ddtree"]["registered"]:
        return head + f"DDTREE registered (sglang-ddtree {r['ddtree']['plugin_version']})"
    return head + f"DDTREE not registered: {r['ddtree']['reason']}"


def main() -> None:
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        mutually_exclusive=[("python", "unit"), ("python", "unit_python")],
        required_one_of=[("python", "unit")],
        supports_check_mode=True,
    )
    p = module.params
    result: dict = {"changed": False}
    secrets: dict = {}
    try:
        check_options(p)
        secrets = _secrets.unit_secrets([], p["environment"])
        env: dict = {}
        info = None
        cwd = None
        if p["unit"]:
            info = read_unit(module, p["unit"])
            env = unit_environment(module, info)
            parsed = unit_exec_start(module, info)
            # Secrets are found before anything is returned: every field of the result is masked with them, and
            # the ExecStart lines are rendered from the masked words. The keys are also left to Ansible's masking
            # (no_log_values); environment values are not, since Ansible masks a value inside any text (a
            # MODEL=Qwen3 would blank the model path and the interpreter path the role goes on with).
            secrets = _secrets.unit_secrets(
                [*parsed["argv"], *p["extra_args"]],
                info["environment"],
                env,
                parsed["env_assignments"],
                p["environment"],
            )
            module.no_log_values.update(v for k, v in secrets.items() if _secrets.is_key(k) and len(v) >= 4)
            env.update(parsed["env_assignments"])
            info["exec_env_names"] = sorted(parsed["env_assignments"])
            if p["unit_python"]:
                python, source = p["unit_python"], "unit_python option"
                if not _is_executable(python):
                    raise ProbeError(f"unit_python={python} is not an executable file; point it at the interpreter")
            else:
                python, source = resolve_interpreter(parsed, p["unit"], env, info["working_directory"])
            shown = _secrets.mask(parsed, secrets)  # resolve_interpreter above used the real words
            info["exec_start"] = _exec_start.render_exec_start(shown)
            result["unit"] = info
            result["exec_start_parsed"] = shown
            if info["working_directory"] and info["working_directory"] != "~":
                if os.path.isdir(info["working_directory"]):
                    cwd = info["working_directory"]
                else:
                    module.warn(f"WorkingDirectory {info['working_directory']} does not exist; the probe runs in /")
                    cwd = "/"
            if p["speculative_flags"] is not None:
                result["exec_start_new"] = new_exec_start(shown, info, p["speculative_flags"], p["extra_args"])
        else:
            python, source = p["python"], "python option"
            if not os.path.exists(python):
                raise ProbeError(
                    f"python={python} does not exist; set python to the SGLang environment's interpreter, "
                    "e.g. /opt/sglang/.venv/bin/python"
                )
            if not _is_executable(python):
                raise ProbeError(f"python={python} is not an executable file; point it at the interpreter itself")
        for k, v in (p["environment"] or {}).items():
            env[k] = "" if v is None else str(v)

        prefix, user_env, run_user = user_prefix(module, info, p["run_as_unit_user"])
        env.update(user_env)
        timeout_bin = module.get_bin_path("timeout")
        if timeout_bin:
            prefix = [timeout_bin, "--kill-after=10", str(p["timeout"]), *prefix]
        else:
            module.warn("`timeout` (coreutils) is not on PATH: the probe and help runs have no time limit")
        who = f"unit={p['unit']}" if p["unit"] else f"python={python}"

        request, unchecked = plugin_request(p, result, secrets)
        command = [*prefix, python, "-c", PROBE_SOURCE] + (["--request-stdin"] if request else [])
        wheel_dir = None
        try:
            if (p["plugin_checks"] or {}).get("wheel_base64"):
                wheel_dir, request["wheel"] = write_wheel(p["plugin_checks"])
            rc, out, err = module.run_command(
                command,
                environ_update=env,
                cwd=cwd,
                expand_user_and_vars=False,
                data=json.dumps(request) if request else None,
            )
        finally:
            if wheel_dir:
                shutil.rmtree(wheel_dir, ignore_errors=True)
        probe = parse_probe_output(out)
        if probe is None:
            if rc == 124:
                raise ProbeError(
                    f"{who}: the probe in {python} took longer than timeout={p['timeout']} s; raise timeout"
                )
            raise ProbeError(
                f"{who}: {python} did not run the probe (rc={rc}): {last_line(err) or last_line(out) or 'no output'}; "
                "is it a Python 3.8+ interpreter?"
            )

        help_result = None
        if p["help"] and (probe.get("sglang") or {}).get("installed"):
            help_env = dict(env)
            help_env.setdefault("COLUMNS", "200")
            rc, out, err = module.run_command(
                [*prefix, python, "-m", "sglang.launch_server", "--help"],
                environ_update=help_env,
                cwd=cwd,
                expand_user_and_vars=False,
            )
            if rc == 0:
                help_result = _sglang_caps.parse_help_algorithms(out)
            elif rc == 124:
                help_result = {"error": f"launch_server --help took longer than timeout={p['timeout']} s"}
            else:
                help_result = {"error": f"launch_server --help failed (rc={rc}): {last_line(err) or last_line(out)}"}

        caps = _sglang_caps.summarize_capabilities(probe, help_result)
        caps["python"] = dict(caps["python"], requested=python, source=source, run_as=run_user)
        result.update(caps)
        if p["plugin_checks"] is not None:
            checks = dict(probe.get("plugin_checks") or {})
            if unchecked:
                checks["server_args"] = unchecked
            checks["wheel"] = (probe.get("ddtree") or {}).get("wheel")
            for name in ("drafter", "sglang", "server_args", "budget"):
                wanted = {
                    "drafter": request.get("drafter"),
                    "sglang": request.get("check_sglang"),
                    "server_args": request.get("server_args") is not None,
                    "budget": request.get("budget") is not None,
                }[name]
                if wanted and name not in checks:  # the probe died before it ran the check
                    errors = "; ".join(probe.get("errors") or []) or "no error recorded"
                    reason = f"the check did not run: {errors}"
                    checks[name] = {
                        "server_args": _server_args.unchecked(reason),
                        "budget": {"checked": False, "ok": None, "value": None, "candidates": None, "error": "",
                                   "reason": reason},
                    }.get(name, {"rc": 1, "stdout": "", "stderr": reason})
            result["plugin_checks"] = checks
        result["msg"] = summary_message(result)
    except ProbeError as exc:
        result["msg"] = str(exc)
        module.fail_json(**masked_result(module, result, secrets))
    module.exit_json(**masked_result(module, result, secrets))


def write_wheel(checks: dict) -> tuple[str, str]:
    """O(plugin_checks.wheel_base64) written as O(plugin_checks.wheel_name) into a new temporary directory that the
    unit's user can read; (the directory, the wheel's path). The caller removes the directory."""
    name = checks["wheel_name"] or ""
    if not WHEEL_NAME_RE.match(name):
        raise ProbeError(
            f"plugin_checks.wheel_name={name[:80]!r} is not a wheel file name (name-version-python-abi-platform.whl)"
        )
    try:
        data = base64.b64decode(checks["wheel_base64"], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProbeError(f"plugin_checks.wheel_base64 is not base64 ({exc}); encode the wheel's bytes") from exc
    directory = tempfile.mkdtemp(prefix="specdec-pivot-preflight.")
    try:
        os.chmod(directory, 0o755)
        path = os.path.join(directory, name)
        with open(path, "wb") as fh:
            fh.write(data)
        os.chmod(path, 0o644)
    except OSError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        raise ProbeError(f"could not write the plugin wheel to {directory}: {exc}") from exc
    return directory, path


def plugin_request(p: dict, result: dict, secrets: dict) -> tuple[dict, dict | None]:
    """The probe's stdin request for O(plugin_checks) ({} when none), and the server-args verdict when the new command
    line cannot be checked as written (else None). The server words are the real ones (the probe's stdin is no
    command line); the result masks them again."""
    checks = p["plugin_checks"]
    if checks is None:
        return {}, None
    request: dict = {"wheel": checks["wheel"], "drafter": checks["drafter"], "check_sglang": checks["check_sglang"]}
    if checks["budget"] is not None:
        if checks["budget"] < 1 or not checks["drafter"]:
            raise ProbeError(
                f"plugin_checks.budget={checks['budget']} needs a budget >= 1 and plugin_checks.drafter (the block "
                "size comes from the drafter): pass both"
            )
        request["budget"] = checks["budget"]
    unchecked = None
    if checks["server_args"]:
        new = result.get("exec_start_new")
        if new is None:
            raise ProbeError(
                "plugin_checks.server_args needs speculative_flags (and unit): it checks the new ExecStart"
            )
        if any(re.search(r"[$%]", str(w)) for w in new["argv"]):
            unchecked = _server_args.unchecked(UNCHECKED_EXPANSION)
        else:
            request["server_args"] = {
                "source": _server_args.child_source(),
                "words": [str(w) for w in _secrets.unmask(new["server_args"], secrets)],
            }
    return request, unchecked


def masked_result(module: AnsibleModule, result: dict, secrets: dict) -> dict:
    """The result with every secret value replaced by its marker ``{secret:NAME}`` (module_utils ``_secrets.mask``),
    the names in ``secrets``, and the invocation's secrets as ``***``. The keys (4 characters or more) are also in
    ``module.no_log_values``, so Ansible masks any left (in a warning) with ``********``.
    """
    out = _secrets.mask(result, secrets)
    out["secrets"] = sorted(secrets)
    out["invocation"] = {"module_args": _secrets.mask(module.params, secrets, named=False)}
    return out


def check_options(p: dict) -> None:
    """Refuse options that cannot be right, naming the option and the fix (never a traceback later)."""
    for name in ("python", "unit", "unit_python"):
        if p[name] is not None and not str(p[name]).strip():
            raise ProbeError(f"{name} is an empty string; give a value or leave {name} out")
    if p["python"] is None and p["unit"] is None:
        raise ProbeError("one of python=<interpreter path> and unit=<systemd unit> is required")
    if p["timeout"] < 1:
        raise ProbeError(f"timeout={p['timeout']} must be a positive number of seconds, e.g. timeout=120")
    if p["speculative_flags"] is not None and not p["unit"]:
        raise ProbeError("speculative_flags needs unit=<name>: it rewrites that unit's ExecStart")
    if p["extra_args"] and p["speculative_flags"] is None:
        raise ProbeError("extra_args needs speculative_flags (and unit): they are added to the new ExecStart")
    for k, v in (p["environment"] or {}).items():
        if not _secrets.valid_env_name(k):
            raise ProbeError(
                f"environment: {str(k)[:80]!r} is not an environment variable name (letters, digits and _, not "
                "starting with a digit, e.g. SGLANG_PLUGINS); fix the key"
            )
        if isinstance(v, (dict, list)) or "\0" in str("" if v is None else v):
            raise ProbeError(f"environment: the value of {k} must be a string without NUL characters")
    if p["extra_args"] and not str(p["extra_args"][0]).startswith("--"):
        raise ProbeError(
            f"extra_args must start with a --flag (got {str(p['extra_args'][0])[:80]!r}); "
            "e.g. extra_args=[--context-length, '8192']"
        )


def new_exec_start(parsed: dict, info: dict, speculative_flags: dict, extra_args: list) -> dict:
    """RV(exec_start_new): the unit's ExecStart with its speculative flags replaced and ``extra_args`` applied.

    Every new value is escaped for systemd (``%%``, ``$$``): the result is the ExecStart as the unit file will
    write it, which systemd runs as the values were given. Words read back from ``systemctl show`` (specifiers
    already expanded) are first put in the unit file's form.
    """
    base = parsed if parsed.get("source") == "unit_file" else _exec_start.parse_exec_start(info["exec_start"])
    try:
        new_flags = _sglang_flags.replace_speculative_flags(base["flags"], speculative_flags)
        extra = _argv_flags.parse_flags([_systemd_cmdline.systemd_escape(w) for w in extra_args])
        if extra["args"] or extra["trailing_args"]:
            raise ValueError("extra_args must be --flag [value...] words, without positional words or --")
        for flag, value in extra["flags"].items():  # argparse: the last occurrence wins, so it replaces in place
            new_flags[flag] = value
        new = dict(base, flags=new_flags, repeated=[f for f in base["repeated"] if f in new_flags])
        new_argv = _exec_start.exec_start_argv(new)
        head = _exec_start.exec_start_argv({**new, "flags": {}, "trailing_args": []})
        return {
            "argv": new_argv,
            "server_args": new_argv[len(head) :],
            "value": _exec_start.render_exec_start(new),
            "multiline": _exec_start.render_exec_start(new, multiline=True),
            "flags": new_flags,
            "removed": _sglang_flags.speculative_flags(base["flags"]),
            "differs": new_argv != _exec_start.exec_start_argv(base),
        }
    except ValueError as exc:
        raise ProbeError(f"speculative_flags={speculative_flags!r}, extra_args={extra_args!r}: {exc}") from exc


if __name__ == "__main__":
    main()
