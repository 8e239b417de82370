#!/usr/bin/python
# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_server_args
short_description: Check a server command line with SGLang's own argument parser (read-only)
version_added: "0.1.0"
description:
  - Asks SGLang's own parser, in B(the Python interpreter this module runs in), whether it accepts O(args) as
    C(sglang.launch_server)'s arguments. Does what C(launch_server) does before it builds its ServerArgs -
    C(sglang.srt.plugins.load_plugins) (SGLang 0.5.11+; skipped on an SGLang without it),
    C(ServerArgs.add_cli_args) on an argparse parser, C(parse_args) - then resolves C(--speculative-algorithm) with
    C(SpeculativeAlgorithm.from_string) when that name is registered there.
  - When the algorithm resolves to DDTREE, also runs sglang-ddtree's own start-up check
    (C(sglang_ddtree.sglang.server_args.handle_ddtree_server_args), what a DDTREE server runs before it loads a
    model) on a copy of the parsed arguments, when the target's and the drafter's paths are directories on the host
    (it reads their C(config.json)); a refusal there is RV(ok=false) too. See RV(startup_check).
  - To check a systemd unit's command line, run the module with the unit's interpreter (set
    C(ansible_python_interpreter) on the task) and its C(Environment=) (the task's C(environment)); see the
    examples. The module never starts another interpreter.
  - Nothing starts, no weights are read, no GPU is touched. A refused command line is a result (RV(ok=false) with
    RV(error)), and so is an interpreter where SGLang's parser cannot be imported (RV(checked=false) with
    RV(reason)); assert on them where it matters. What SGLang prints while importing is not shown.
  - SGLang is imported in a separate process of that same interpreter (C(sys.executable) C(-c)), with the
    module's environment, not in the module's own process (ansible-core's patches of C(sys) break torch there).
author:
  - specdec.pivot maintainers (@specdec)
requirements:
  - SGLang in the interpreter the module runs in (without it the result is RV(checked=false)).
  - Python 3.8 or later.
options:
  args:
    description:
      - The server's words from the first C(--flag) on, for example C([--model-path, /models/x, --port, "30000"]);
        C(python -m sglang.launch_server) and positional words such as C(serve) left out.
      - They may hold the server's keys (C(--api-key)); the option is C(no_log), the words reach SGLang's parser on
        its standard input (never on a command line), and the values of C(--api-key) and C(--admin-api-key) (also
        abbreviated, e.g. C(--api-ke)) are masked in every returned field.
    type: list
    elements: str
    required: true
extends_documentation_fragment:
  - specdec.pivot.attributes
  - specdec.pivot.attributes.read_only
attributes:
  check_mode:
    details:
      - Read-only; check mode runs the same parser and returns the same data.
notes:
  - systemd expands C($VAR) and C(%) specifiers at start; a command line holding them cannot be checked as written
    (the caller should skip it).
  - Importing SGLang can take a minute on a loaded host.
seealso:
  - module: specdec.pivot.sglang_capabilities
"""

EXAMPLES = r"""
- name: Would SGLang accept the new command line? (in the unit's interpreter and environment; nothing starts)
  specdec.pivot.sglang_server_args:
    args: [--model-path, /models/target, --speculative-algorithm, DDTREE, --speculative-num-draft-tokens, "17"]
  vars:
    ansible_python_interpreter: /opt/sglang/venv/bin/python
  environment:
    SGLANG_PLUGINS: ddtree
  register: verdict

- name: Fail before anything is changed
  ansible.builtin.assert:
    that: not verdict.checked or verdict.ok
    fail_msg: "SGLang's parser refuses the command line: {{ verdict.error }}"
"""

RETURN = r"""
msg:
  description: One line summing up the result.
  returned: always
  type: str
  sample: "SGLang's parser in /opt/sglang/venv/bin/python accepts the command line (--speculative-algorithm NEXTN)"
python:
  description: The interpreter whose SGLang was asked (C(sys.executable) of the module's process).
  returned: always
  type: str
  sample: /opt/sglang/venv/bin/python
checked:
  description: Whether SGLang's parser could be imported and asked; false with RV(reason) otherwise.
  returned: always
  type: bool
ok:
  description: Whether the parser accepts O(args); null when not RV(checked).
  returned: always
  type: bool
error:
  description: The parser's message when it refuses O(args), else empty.
  returned: always
  type: str
  sample: "unrecognized arguments: --speculative-budget 16"
reason:
  description: Why nothing was checked, or why RV(algorithm) does not resolve here yet; else empty.
  returned: always
  type: str
algorithm:
  description: The parsed C(--speculative-algorithm), or null.
  returned: always
  type: str
  sample: DDTREE
algorithm_resolved:
  description: The name C(SpeculativeAlgorithm.from_string) resolved RV(algorithm) to, or null (see RV(reason)).
  returned: always
  type: str
  sample: DDTREE
startup_check:
  description:
    - sglang-ddtree's start-up check on the command line, null unless RV(algorithm_resolved) is DDTREE.
    - C(checked) (false when it could not run here, C(reason) says why, e.g. a hub id as a model path), C(ok)
      (null when not checked), C(error) (the plugin's refusal, which names the option and the fix), C(reason).
  returned: always
  type: dict
  sample: {checked: true, ok: false, error: "--page-size=16: ...; pass --page-size 1 (the default)", reason: ""}
abbreviations:
  description:
    - The flags of O(args) that SGLang's parser accepts only as abbreviations (argparse expands a unique prefix,
      C(--max-running 8) to C(--max-running-requests 8)), each mapped to the full name; empty when not RV(checked) or
      refused. C(--tp), the short form SGLang's documentation uses for C(--tp-size), is not listed.
    - The pivot reads the unit's flags by their full names, so role specdec.pivot.sglang_preflight refuses these.
  returned: always
  type: dict
  sample: {"--max-running": "--max-running-requests"}
"""

import json
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.specdec.pivot.plugins.module_utils import _secrets
from ansible_collections.specdec.pivot.plugins.module_utils._server_args import MARKER, child_source
from ansible_collections.specdec.pivot.plugins.module_utils._sglang_probe import parse_probe_output

ARGUMENT_SPEC = {
    "args": {"type": "list", "elements": "str", "required": True, "no_log": True},
}


def summary_message(r: dict) -> str:
    where = f"SGLang's parser in {r['python']}"
    if not r["checked"]:
        return f"{where} was not asked: {r['reason']}"
    if not r["ok"]:
        return f"{where} refuses the command line: {r['error']}"
    algo = f" (--speculative-algorithm {r['algorithm']})" if r["algorithm"] else ""
    return f"{where} accepts the command line{algo}" + (f"; {r['reason']}" if r["reason"] else "")


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    words = module.params["args"]
    # args is no_log, so Ansible would mask every word (--port, 30000, DDTREE) in the whole result; only the
    # secrets are masked in it (by name, {secret:NAME}, and by Ansible), the invocation hides args entirely.
    secrets = _secrets.unit_secrets(words)
    module.no_log_values.clear()
    module.no_log_values.update(v for v in secrets.values() if len(v) >= 4)
    invocation = {"module_args": {"args": "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"}}
    result: dict = {"changed": False, "python": sys.executable}
    # A clean process of this same interpreter (see module_utils/_server_args.py: SGLang's torch cannot be
    # imported inside an AnsibleModule process); it inherits this process's environment. The words go on its
    # stdin: a command line is readable by every user of the host.
    rc, out, err = module.run_command(
        [sys.executable, "-c", child_source()], data=json.dumps(words), expand_user_and_vars=False
    )
    verdict = parse_probe_output(out, MARKER)
    if verdict is None:
        tail = " | ".join((err or out or "no output").strip().splitlines()[-3:])
        result["msg"] = f"{sys.executable} did not run SGLang's parser check (rc={rc}): {tail}"
        module.fail_json(invocation=invocation, **_secrets.mask(result, secrets))
    result.update(verdict)
    result["msg"] = summary_message(result)
    module.exit_json(invocation=invocation, **_secrets.mask(result, secrets))


if __name__ == "__main__":
    main()
