#!/usr/bin/python
# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: read_files
short_description: Read several files on a host, and what the play may do there, in one module run (read-only)
version_added: "0.1.0"
description:
  - Reads O(files) (each as base64, like C(ansible.builtin.slurp)), the files of O(find), the metadata of O(stat)
    and whether the play may write each path of O(access), in B(one) module run. Preflight asks these questions
    of a host before anything changes; one C(slurp), C(stat), C(find) or C(command) task each cost a round trip
    to the host.
  - A file that is missing or cannot be read is a result (RV(files) says why), not a failure; the caller decides
    which ones it needs.
  - Also returns the user the module runs as (RV(euid)).
author:
  - specdec.pivot maintainers (@specdec)
requirements:
  - Python 3.8 or later on the host.
options:
  files:
    description: Files to read, each up to O(max_bytes). A path that is not absolute is an error in RV(files).
    type: list
    elements: path
    default: []
  stat:
    description: Paths whose owner, group, mode, SHA-1 (regular files) and access are returned (RV(stat)).
    type: list
    elements: path
    default: []
  access:
    description:
      - Paths for which RV(access) says C(w) (it exists and the module may write it, as C(test -w) and
        C(access(2)) decide), C(r) (it exists and may not be written) or C(-) (it does not exist).
    type: list
    elements: path
    default: []
  find:
    description:
      - Directories and a file name pattern (C(fnmatch), not a path) each; the regular files matching in that
        directory (not below it) are listed in RV(found) and read like O(files). A missing directory finds nothing.
    type: list
    elements: dict
    default: []
    suboptions:
      dir:
        description: The directory (taken as written, no pattern).
        type: path
        required: true
      pattern:
        description: The file name pattern, for example C(sglang.service.*.json).
        type: str
        required: true
  max_bytes:
    description: The most bytes read of one file; a longer file is an error (RV(files)), not read in part.
    type: int
    default: 1048576
extends_documentation_fragment:
  - specdec.pivot.attributes
  - specdec.pivot.attributes.read_only
attributes:
  check_mode:
    details:
      - Read-only; check mode reads and returns the same data.
notes:
  - The contents may hold secrets (a unit's C(Environment=), a process's command line); run the task with
    C(no_log) where they might.
seealso:
  - module: ansible.builtin.slurp
  - module: ansible.builtin.stat
"""

EXAMPLES = r"""
- name: The unit file, its metadata, the server's command line and the pivot's records, in one run
  specdec.pivot.read_files:
    files: [/etc/systemd/system/sglang.service, /proc/1234/cmdline]
    stat: [/etc/systemd/system/sglang.service]
    access: [/etc/systemd/system]
    find:
      - {dir: /var/lib/specdec-pivot/units, pattern: "sglang.service.*.json"}
  register: host_files
  no_log: true  # the unit may hold a secret

- name: Use one file's content
  ansible.builtin.debug:
    msg: "{{ host_files.files['/etc/systemd/system/sglang.service'].content | b64decode }}"
"""

RETURN = r"""
euid:
  description: The effective uid the module ran as.
  returned: always
  type: int
  sample: 0
files:
  description:
    - One entry per path of O(files) and per file of RV(found), keyed by the path - C(exists), C(content) (base64,
      when read) and C(error) (why it was not read, else null).
  returned: always
  type: dict
  sample: {/proc/1234/cmdline: {exists: true, content: "cHl0aG9uAA==", error: null}}
stat:
  description:
    - One entry per path of O(stat) - C(exists), C(isdir), C(owner), C(group) (names, or the ids when unnamed),
      C(mode) (octal string), C(sha1) (regular files), C(writeable) (C(access(2))), C(roth) (readable by others).
  returned: always
  type: dict
  sample: {/etc/systemd/system/sglang.service: {exists: true, isdir: false, owner: root, group: root,
           mode: "0644", sha1: "f15d5dd659744e49e62c8e9e0fc837464113916b", writeable: true, roth: true}}
access:
  description: One entry per path of O(access) - C(w), C(r) or C(-).
  returned: always
  type: dict
  sample: {/etc/systemd/system: w}
found:
  description: The files each O(find) entry matched (sorted paths), in the order given.
  returned: always
  type: list
  elements: list
  sample: [[/var/lib/specdec-pivot/units/sglang.service.0123456789ab.json]]
"""

import base64
import fnmatch
import grp
import hashlib
import os
import pwd
import stat as st

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = {
    "files": {"type": "list", "elements": "path", "default": []},
    "stat": {"type": "list", "elements": "path", "default": []},
    "access": {"type": "list", "elements": "path", "default": []},
    "find": {
        "type": "list",
        "elements": "dict",
        "default": [],
        "options": {"dir": {"type": "path", "required": True}, "pattern": {"type": "str", "required": True}},
    },
    "max_bytes": {"type": "int", "default": 1 << 20},
}


def read_one(path: str, max_bytes: int) -> dict:
    if not os.path.isabs(path):
        return {"exists": False, "content": None, "error": "not an absolute path"}
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except FileNotFoundError:
        return {"exists": False, "content": None, "error": "no such file"}
    except OSError as exc:
        return {"exists": os.path.lexists(path), "content": None, "error": exc.strerror or str(exc)}
    if len(data) > max_bytes:
        return {"exists": True, "content": None, "error": f"longer than max_bytes={max_bytes}"}
    return {"exists": True, "content": base64.b64encode(data).decode("ascii"), "error": None}


def name_of(getter, ident: int) -> str:
    try:
        return getter(ident)[0]
    except KeyError:
        return str(ident)


def stat_one(path: str) -> dict:
    try:
        info = os.stat(path)
    except OSError:
        return {"exists": False}
    out = {
        "exists": True,
        "isdir": st.S_ISDIR(info.st_mode),
        "owner": name_of(pwd.getpwuid, info.st_uid),
        "group": name_of(grp.getgrgid, info.st_gid),
        "mode": f"{st.S_IMODE(info.st_mode):04o}",
        "writeable": os.access(path, os.W_OK),
        "roth": bool(info.st_mode & st.S_IROTH),
        "sha1": None,
    }
    if st.S_ISREG(info.st_mode):
        sha = hashlib.sha1()
        try:
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    sha.update(chunk)
            out["sha1"] = sha.hexdigest()
        except OSError:
            pass
    return out


def access_one(path: str) -> str:
    if not os.path.lexists(path):
        return "-"
    return "w" if os.access(path, os.W_OK) else "r"


def find_one(directory: str, pattern: str) -> list:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(
        os.path.join(directory, n)
        for n in names
        if fnmatch.fnmatchcase(n, pattern) and os.path.isfile(os.path.join(directory, n))
    )


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    if p["max_bytes"] < 1:
        module.fail_json(msg=f"max_bytes={p['max_bytes']} must be at least 1")
    for key in ("stat", "access"):
        for path in p[key]:
            if not os.path.isabs(path):
                module.fail_json(msg=f"{key}: {path} is not an absolute path")
    for entry in p["find"]:
        if not os.path.isabs(entry["dir"]) or "/" in entry["pattern"]:
            module.fail_json(msg=f"find: dir must be absolute and pattern a file name pattern (got {entry})")
    found = [find_one(e["dir"], e["pattern"]) for e in p["find"]]
    files = {path: read_one(path, p["max_bytes"]) for path in [*p["files"], *(f for group in found for f in group)]}
    module.exit_json(
        changed=False,
        euid=os.geteuid(),
        files=files,
        stat={path: stat_one(path) for path in p["stat"]},
        access={path: access_one(path) for path in p["access"]},
        found=found,
    )


if __name__ == "__main__":
    main()
