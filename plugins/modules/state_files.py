#!/usr/bin/python
# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: state_files
short_description: Write several of the pivot's own files on a host in one module run
version_added: "0.1.0"
description:
  - Makes O(directories) and writes O(files) on the host, each with its owner, group and mode, in B(one) module
    run. The pivot writes its state (a staged unit, the records of the unit before a switch, the scripts of its
    background jobs, the keys file of the generation probe) this way instead of one C(ansible.builtin.copy) or
    C(ansible.builtin.file) task per path, each of which costs a round trip or three to the host.
  - A file's bytes come from O(files[].content) (text, written as UTF-8), O(files[].content_base64) (bytes) or
    O(files[].src), another file B(on the host). A file is written whole or not at all (a temporary file in the
    same directory, renamed over it); one whose bytes, owner, group and mode already match is left alone.
  - O(files[].force=false) never touches an existing file (a record that must not be overwritten).
    O(files[].scratch=true) writes the file but never reports it as a change (the pivot's own scratch files).
  - The files' contents are C(no_log) (they may hold the server's keys); nothing returned shows them.
author:
  - specdec.pivot maintainers (@specdec)
requirements:
  - Python 3.8 or later on the host.
options:
  directories:
    description:
      - Directories to make when missing (with their parents), before any file is written; an existing one gets
        the owner, group and mode given.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the directory.
        type: path
        required: true
      mode:
        description: Its mode, an octal string such as C("0755").
        type: str
        default: "0755"
      owner:
        description: Its owner (name or uid); default the user the module runs as.
        type: str
      group:
        description: Its group (name or gid); default that user's.
        type: str
  files:
    description: The files to write, in order.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the file; its directory must exist (or be in O(directories)).
        type: path
        required: true
      content:
        description: The file's text. Exactly one of O(files[].content), O(files[].content_base64) and O(files[].src).
        type: str
      content_base64:
        description: The file's bytes, base64-encoded (a wheel, say).
        type: str
      sha256:
        description:
          - The sha256 (hex) the file's bytes must have; other bytes fail the module before anything is written.
        type: str
      src:
        description: A file on the host whose bytes are copied.
        type: path
      mode:
        description: The file's mode, an octal string such as C("0600").
        type: str
        required: true
      owner:
        description: Its owner (name or uid); default the user the module runs as.
        type: str
      group:
        description: Its group (name or gid); default that user's.
        type: str
      force:
        description: When false, an existing file is left exactly as it is.
        type: bool
        default: true
      scratch:
        description: When true, writing the file is not reported as a change.
        type: bool
        default: false
extends_documentation_fragment:
  - specdec.pivot.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports which files and directories would change; writes nothing.
  diff_mode:
    support: none
    details:
      - The files may hold secrets; the result names what changed, not how.
notes:
  - A file given by O(files[].src) that does not exist fails the module before anything is written.
seealso:
  - module: ansible.builtin.copy
"""

EXAMPLES = r"""
- name: Stage the new unit and keep the current one, never overwriting an earlier record
  specdec.pivot.state_files:
    directories:
      - {path: /var/lib/specdec-pivot/units, mode: "0755", owner: root, group: root}
      - {path: /var/lib/specdec-pivot/staged, mode: "0755", owner: root, group: root}
    files:
      - path: /var/lib/specdec-pivot/staged/sglang.service
        content: "{{ lookup('ansible.builtin.template', 'sglang.service.j2') }}"
        mode: "0600"
      - path: /var/lib/specdec-pivot/units/sglang.service.0123456789ab.pre-pivot
        src: /etc/systemd/system/sglang.service
        mode: "0600"
        force: false
"""

RETURN = r"""
files:
  description: One entry per file of O(files), in order.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: The file.
      type: str
    changed:
      description: Whether its bytes, owner, group or mode were (or in check mode would be) changed.
      type: bool
    existed:
      description: Whether it existed before.
      type: bool
    sha1:
      description: SHA-1 of its bytes afterwards (in check mode, of the bytes it would have).
      type: str
directories:
  description: The directories of O(directories) that were (or would be) made or changed.
  returned: always
  type: list
  elements: str
"""

import base64
import binascii
import hashlib
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

FILE_SPEC = {
    "path": {"type": "path", "required": True},
    "content": {"type": "str", "no_log": True},
    "content_base64": {"type": "str", "no_log": True},
    "sha256": {"type": "str"},
    "src": {"type": "path"},
    "mode": {"type": "str", "required": True},
    "owner": {"type": "str"},
    "group": {"type": "str"},
    "force": {"type": "bool", "default": True},
    "scratch": {"type": "bool", "default": False},
}
DIR_SPEC = {
    "path": {"type": "path", "required": True},
    "mode": {"type": "str", "default": "0755"},
    "owner": {"type": "str"},
    "group": {"type": "str"},
}
ARGUMENT_SPEC = {
    "directories": {"type": "list", "elements": "dict", "default": [], "options": DIR_SPEC},
    "files": {
        "type": "list",
        "elements": "dict",
        "default": [],
        "options": FILE_SPEC,
        "mutually_exclusive": [("content", "content_base64", "src")],
        "required_one_of": [("content", "content_base64", "src")],
    },
}


class StateFilesError(Exception):
    """A failure to report with fail_json (before anything is written where possible)."""


def read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def file_args(module: AnsibleModule, spec: dict) -> dict:
    return module.load_file_common_arguments(
        {"path": spec["path"], "mode": spec["mode"], "owner": spec.get("owner"), "group": spec.get("group")}
    )


def write_whole(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory, renamed over it."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)  # the final mode is set after the rename, with the owner
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def make_directory(module: AnsibleModule, spec: dict) -> bool:
    path = spec["path"]
    changed = False
    if not os.path.isdir(path):
        if os.path.exists(path):
            raise StateFilesError(f"{path} exists and is not a directory")
        changed = True
        if not module.check_mode:
            os.makedirs(path, exist_ok=True)
    if module.check_mode and changed:
        return True
    return module.set_fs_attributes_if_different(file_args(module, spec), changed)


def put_file(module: AnsibleModule, spec: dict, data: bytes) -> dict:
    path = spec["path"]
    old = read_bytes(path)
    existed = old is not None
    entry = {"path": path, "existed": existed, "changed": False}
    if existed and not spec["force"]:
        entry["sha1"] = hashlib.sha1(old).hexdigest()
        return entry
    entry["sha1"] = hashlib.sha1(data).hexdigest()
    changed = old != data
    if not os.path.isdir(os.path.dirname(path) or "."):
        if module.check_mode:  # its directory would be made by this run (directories) or the run would fail
            entry["changed"] = True
            return entry
        raise StateFilesError(f"the directory of {path} does not exist")
    if changed and not module.check_mode:
        write_whole(path, data)
    if module.check_mode and changed:
        entry["changed"] = True
        return entry
    entry["changed"] = module.set_fs_attributes_if_different(file_args(module, spec), changed)
    return entry


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    result: dict = {"changed": False, "files": [], "directories": []}
    try:
        for spec in module.params["files"]:
            for key in ("path", "src"):
                if spec.get(key) and not os.path.isabs(spec[key]):
                    raise StateFilesError(f"files[].{key}={spec[key]} is not an absolute path")
            if spec["src"] and not os.path.isfile(spec["src"]):
                raise StateFilesError(f"files[].src={spec['src']} is not a file on the host")
        contents = []
        for spec in module.params["files"]:
            if spec["src"]:
                with open(spec["src"], "rb") as fh:
                    data = fh.read()
            elif spec["content_base64"] is not None:
                try:
                    data = base64.b64decode(spec["content_base64"], validate=True)
                except (binascii.Error, ValueError) as exc:
                    raise StateFilesError(f"files[].content_base64 of {spec['path']} is not base64: {exc}") from exc
            else:
                data = spec["content"].encode("utf-8")
            if spec["sha256"] and hashlib.sha256(data).hexdigest() != spec["sha256"].lower():
                raise StateFilesError(
                    f"the bytes for {spec['path']} do not have sha256 {spec['sha256']} (they have "
                    f"{hashlib.sha256(data).hexdigest()}); nothing was written"
                )
            contents.append(data)
        for directory in module.params["directories"]:
            if not os.path.isabs(directory["path"]):
                raise StateFilesError(f"directories[].path={directory['path']} is not an absolute path")
            if make_directory(module, directory):
                result["directories"].append(directory["path"])
                result["changed"] = True
        for spec, data in zip(module.params["files"], contents):  # noqa: B905 (the host's Python 3.8+)
            entry = put_file(module, spec, data)
            result["files"].append(entry)
            if entry["changed"] and not spec["scratch"]:
                result["changed"] = True
    except (StateFilesError, OSError) as exc:
        module.fail_json(msg=str(exc), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
