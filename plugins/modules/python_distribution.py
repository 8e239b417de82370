#!/usr/bin/python
# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: python_distribution
short_description: Report whether a Python distribution is installed, and whether it holds a wheel's exact files
version_added: "0.1.0"
description:
  - Reports whether the distribution O(name) is installed in B(the Python interpreter this module runs in), its
    version and its C(direct_url.json), read with C(importlib.metadata).
  - With O(wheel), also compares the sha256 of every file of the wheel, computed from the wheel's own files, with
    the sha256 of the installed files themselves, so a rebuilt wheel with the same version but other bytes counts
    as different and an unchanged one as the same (pip does not always record the archive's hash in
    C(direct_url.json)). Neither RECORD is trusted - the wheel's C(*.dist-info/RECORD) must list exactly the
    wheel's files with their hashes (a malformed or inconsistent RECORD, or a path that leaves the install
    directory, is an error naming the wheel). C(RECORD), C(INSTALLER), C(REQUESTED), C(direct_url.json), C(.pyc)
    files and C(*.data/scripts|headers|data) members are not compared; they are written or rewritten by the
    installer.
  - To inspect another environment's interpreter (the one a systemd unit runs, say), run the module with that
    interpreter - set C(ansible_python_interpreter) on the task (see the examples). The module never starts
    another interpreter; RV(python) says which one it inspected.
  - Read-only. A distribution that is not installed is a result (RV(installed=false)), not a failure.
author:
  - specdec.pivot maintainers (@specdec)
requirements:
  - Python 3.8 or later (the interpreter under inspection runs the module).
options:
  name:
    description:
      - The distribution's name as pip knows it, for example C(sglang-ddtree) (letters, digits, C(.), C(_), C(-);
        an empty or other name is refused).
    type: str
    required: true
  wheel:
    description:
      - Path on the target of a wheel (C(.whl)) to compare the installed files with.
      - Without it RV(same_content) is false and RV(differing) holds one entry saying that no wheel was given.
      - Read only when the distribution is installed (there is nothing to compare it with otherwise).
    type: path
extends_documentation_fragment:
  - specdec.pivot.attributes
  - specdec.pivot.attributes.read_only
attributes:
  check_mode:
    details:
      - Read-only; check mode reads and returns the same data.
seealso:
  - module: specdec.pivot.sglang_capabilities
"""

EXAMPLES = r"""
- name: Is this wheel's content installed in the SGLang unit's interpreter?
  specdec.pivot.python_distribution:
    name: sglang-ddtree
    wheel: /var/lib/specdec-pivot/wheels/sglang_ddtree-0.1.0-py3-none-any.whl
  vars:
    ansible_python_interpreter: /opt/sglang/venv/bin/python
  register: plugin_state

- name: Install only when the version or the bytes differ
  ansible.builtin.debug:
    msg: "needs install: {{ not plugin_state.installed or not plugin_state.same_content }}"

- name: Which version is installed there now?
  specdec.pivot.python_distribution:
    name: sglang-ddtree
  vars:
    ansible_python_interpreter: /opt/sglang/venv/bin/python
  register: plugin_now
"""

RETURN = r"""
msg:
  description: One line summing up the result.
  returned: always
  type: str
  sample: "sglang-ddtree 0.1.0 in /opt/sglang/venv/bin/python: the wheel's files are installed as built"
python:
  description: The interpreter that was inspected (C(sys.executable) of the module's process).
  returned: always
  type: str
  sample: /opt/sglang/venv/bin/python
installed:
  description: Whether the distribution is installed in that interpreter.
  returned: always
  type: bool
version:
  description: Its version from the distribution metadata, or null when it is not installed.
  returned: always
  type: str
  sample: 0.1.0
same_content:
  description:
    - Whether every file the wheel's RECORD lists is installed with the same sha256 (false when not installed or
      no O(wheel) was given).
  returned: always
  type: bool
differing:
  description:
    - The wheel's files whose installed file has another hash (changed) or is missing, sorted, at most 20;
      one entry saying that no wheel was given without O(wheel); empty when not installed.
  returned: always
  type: list
  elements: str
  sample: [sglang_ddtree/worker.py]
direct_url:
  description: The distribution's C(direct_url.json) (PEP 610) as a mapping, or null.
  returned: always
  type: dict
  sample: {url: "file:///var/lib/specdec-pivot/wheels/sglang_ddtree-0.1.0-py3-none-any.whl", archive_info: {}}
"""

import hashlib
import json
import os
import re
import sys
import zipfile
import zlib

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.specdec.pivot.plugins.module_utils._wheel_record import (
    distribution_state,
    find_record_name,
    record_digest,
    wheel_hashes,
)

try:
    from importlib import metadata
except ImportError:  # Python < 3.8: the requirements say 3.8+; fail with that, not a traceback
    metadata = None

ARGUMENT_SPEC = {
    "name": {"type": "str", "required": True},
    "wheel": {"type": "path"},
}


#: A distribution name (PEP 508), as pip takes it.
NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")


class InspectError(Exception):
    """A failure to report with fail_json; the message names the option and the fix."""


def _stream_digest(handle) -> str:
    """The RECORD digest of an open binary file, read 1 MiB at a time."""
    sha = hashlib.sha256()
    for chunk in iter(lambda: handle.read(1 << 20), b""):
        sha.update(chunk)
    return record_digest(sha.digest())


def read_wheel(wheel: str) -> dict:
    """``{install path: digest}`` of the wheel's files, hashed from the files themselves (RECORD checked)."""
    if not os.path.isfile(wheel):
        raise InspectError(f"wheel={wheel} is not a file on the target; copy the wheel there first")
    try:
        with zipfile.ZipFile(wheel) as zf:
            record = find_record_name(zf.namelist())
            if record is None:
                raise InspectError(f"wheel={wheel} has no *.dist-info/RECORD: not a wheel built by pip/build")
            members = {}
            for info in zf.infolist():
                if not info.is_dir():
                    with zf.open(info) as fh:
                        members[info.filename] = _stream_digest(fh)
            text = zf.read(record).decode("utf-8")
            return wheel_hashes(text, members)
    except zipfile.BadZipFile as exc:
        raise InspectError(f"wheel={wheel} is not a zip archive ({exc}): not a wheel") from exc
    except (zlib.error, EOFError, RuntimeError, NotImplementedError) as exc:  # a damaged or encrypted member
        raise InspectError(f"wheel={wheel} cannot be read ({type(exc).__name__}: {exc}); rebuild the wheel") from exc
    except UnicodeDecodeError as exc:
        raise InspectError(f"wheel={wheel}: its RECORD is not UTF-8 text; rebuild the wheel") from exc
    except ValueError as exc:
        raise InspectError(f"wheel={wheel}: {exc}; rebuild the wheel (pip wheel / python -m build)") from exc


def installed_digests(dist, paths) -> dict:
    """``{path: digest}`` of the installed files at ``paths`` (relative to the distribution's location), hashed
    from the files themselves; a missing or unreadable file is left out (so it differs)."""
    out = {}
    for path in paths:
        try:
            with open(str(dist.locate_file(path)), "rb") as fh:
                out[path] = _stream_digest(fh)
        except OSError:
            continue
    return out


def inspect(name: str, wheel: str | None) -> dict:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return distribution_state(None, None, None)  # nothing to compare the wheel with
    wanted = read_wheel(wheel) if wheel else None
    direct_url_text = dist.read_text("direct_url.json")
    try:
        direct_url = json.loads(direct_url_text) if direct_url_text else None
    except ValueError:
        direct_url = None  # an unreadable direct_url.json says nothing about where it came from
    have = installed_digests(dist, wanted) if wanted is not None else {}
    return distribution_state(dist.version, have, wanted, direct_url)


def summary_message(name: str, r: dict, wheel: str | None) -> str:
    where = f"in {r['python']}"
    if not r["installed"]:
        return f"{name} is not installed {where}"
    head = f"{name} {r['version']} {where}"
    if not wheel:
        return head
    if r["same_content"]:
        return f"{head}: the wheel's files are installed as built"
    return f"{head}: differs from the wheel ({', '.join(r['differing'][:5])})"


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    name, wheel = module.params["name"], module.params["wheel"]
    result: dict = {"changed": False, "python": sys.executable}
    if metadata is None:
        module.fail_json(msg=f"{sys.executable} is Python {sys.version.split()[0]}; this module needs 3.8+", **result)
    if not isinstance(name, str) or not NAME_RE.match(name):
        module.fail_json(
            msg=(
                f"name={str(name)[:80]!r} is not a distribution name; give the name pip knows it by (letters, digits, "
                "'.', '_', '-'), e.g. name=sglang-ddtree"
            ),
            **result,
        )
    if wheel is not None and not str(wheel).strip():
        module.fail_json(msg="wheel is empty; give the wheel's path on the target, or leave wheel out", **result)
    try:
        result.update(inspect(name, wheel))
    except InspectError as exc:
        module.fail_json(msg=str(exc), **result)
    result["msg"] = summary_message(name, result, wheel)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
