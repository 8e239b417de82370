# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A systemd unit as ``systemctl show`` prints it and as its unit files write it.

- ``systemctl show``: ``UNIT_PROPERTIES`` (what the module asks for), ``parse_systemctl_show``,
  ``parse_exec_property`` (the ``{ path=... ; argv[]=... }`` form), ``parse_environment_property``,
  ``parse_environment_files_property``, ``unit_info_from_show`` (the unit facts the module returns).
- unit files: ``unit_file_entries``, ``unit_exec_starts`` (the ExecStart values after the drop-ins),
  ``parse_environment_file`` (an ``EnvironmentFile=``).

Text in, data out (tests/unit/plugins/module_utils/test_systemd_unit.py).
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.specdec.pivot.plugins.module_utils._systemd_cmdline import split_command_line

#: Properties the module asks ``systemctl show`` for.
UNIT_PROPERTIES = (
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "FragmentPath",
    "DropInPaths",
    "NeedDaemonReload",
    "ExecStart",
    "ExecStartEx",
    "Environment",
    "EnvironmentFiles",
    "User",
    "Group",
    "WorkingDirectory",
    "MainPID",
)


def parse_systemctl_show(text: str) -> dict[str, Any]:
    """``systemctl show UNIT`` output (``Key=value`` lines) as a dict.

    A key that appears more than once (ExecStart of a unit with several commands) maps to a list of
    its values in order; every other value is the raw string. Lines without ``=`` and lines whose key
    holds a space (comments) are ignored.
    """
    props: dict[str, Any] = {}
    for line in (text or "").splitlines():
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip()
        if not key or " " in key or key.startswith("#"):
            continue
        if key in props:
            if not isinstance(props[key], list):
                props[key] = [props[key]]
            props[key].append(value)
        else:
            props[key] = value
    return props


_EXEC_KEYS = ("path", "argv[]", "flags", "ignore_errors", "start_time", "stop_time", "pid", "code", "status")
_EXEC_SPLIT_RE = re.compile(r" ; (?=(?:" + "|".join(re.escape(k) for k in _EXEC_KEYS) + r")=)")
#: ExecStartEx ``flags=`` names and the ExecStart prefix each stands for (systemd.service(5)).
EXEC_FLAG_PREFIXES = {
    "ignore-failure": "-",
    "privileged": "+",
    "no-setuid": "!",
    "ambient": "!!",
    "no-env-expand": ":",
}


def parse_exec_property(value: str | list[str]) -> list[dict[str, Any]]:
    """The commands of an ExecStart/ExecStartEx property as ``systemctl show`` prints it.

    Each command is one line ``{ path=/usr/bin/python3 ; argv[]=/usr/bin/python3 -m x --a b ;
    ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }``
    (ExecStartEx prints ``flags=ignore-failure ...`` instead of ``ignore_errors=``); ``value`` is one
    such line, several lines, or a list of them (``parse_systemctl_show`` of a unit with several).

    systemctl prints argv[] as the words joined with single spaces, WITHOUT quoting (systemd 252,
    ``strv_join(info.argv, " ")``), so ``argv`` here is that text split at whitespace: a word that held
    a space comes back as several words. Read the unit file (``unit_exec_starts``) for exact words.
    Returns ``[{"path", "argv", "ignore_errors", "flags", "prefix"}]``; ``prefix`` is the ExecStart
    prefix the flags stand for, plus ``@`` when path differs from argv[0].
    Raises ValueError for a line that is not a ``{ ... }`` block or has no argv[].
    """
    values = value if isinstance(value, list) else [value]
    commands: list[dict[str, Any]] = []
    for text in values:
        for line in (text or "").splitlines():
            line = line.strip()
            if not line:
                continue
            if not (line.startswith("{") and line.endswith("}")):
                raise ValueError(f"not an Exec property block {{ path=... ; argv[]=... }}: {line!r}")
            fields: dict[str, str] = {}
            for part in _EXEC_SPLIT_RE.split(line[1:-1].strip()):
                if "=" in part:
                    k, v = part.split("=", 1)
                    fields[k.strip()] = v
            if "argv[]" not in fields:
                raise ValueError(f"no argv[] in the Exec property block {line!r}")
            argv = fields["argv[]"].split()
            flags = fields.get("flags", "").split()
            ignore = fields.get("ignore_errors", "no").strip() == "yes" or "ignore-failure" in flags
            path = fields.get("path", "").strip() or (argv[0] if argv else "")
            prefix = "@" if argv and path != argv[0] else ""
            prefix += "".join(p for f, p in EXEC_FLAG_PREFIXES.items() if f in flags)
            if ignore and "-" not in prefix:
                prefix += "-"
            commands.append({"path": path, "argv": argv, "ignore_errors": ignore, "flags": flags, "prefix": prefix})
    return commands


def parse_environment_property(value: str) -> dict[str, str]:
    """The ``Environment=`` property (``A=1 "B=two words"``; systemctl quotes entries with spaces) as an
    ordered dict; later entries win."""
    env: dict[str, str] = {}
    for word in split_command_line(value or "", separators=False):
        if "=" in word:
            k, v = word.split("=", 1)
            env[k] = v
    return env


def parse_environment_files_property(value: str) -> list[dict[str, Any]]:
    """``EnvironmentFiles=/etc/default/x (ignore_errors=no) /etc/y (ignore_errors=yes)`` as a list."""
    out = []
    for m in re.finditer(r"(\S+) \(ignore_errors=(yes|no)\)", value or ""):
        out.append({"path": m.group(1), "ignore_errors": m.group(2) == "yes"})
    return out


def parse_environment_file(text: str) -> dict[str, str]:
    """An ``EnvironmentFile=`` (``KEY=value`` lines, ``#``/``;`` comments, optional ``export``, quotes)."""
    env: dict[str, str] = {}
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        if "=" not in line:
            continue
        k, v = line.split("=", 1)
        k, v = k.strip(), v.strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
            quote, v = v[0], v[1:-1]
            if quote == '"':
                v = re.sub(r'\\(["\\$`])', r"\1", v)
        env[k] = v
    return env


def unit_file_entries(text: str) -> list[tuple[str, str, str]]:
    """``(section, key, value)`` of every assignment in a unit file, in order.

    Comment lines (``#``, ``;``) and blank lines are skipped; a trailing backslash continues the value on
    the next line (joined with a space, comment lines inside are skipped), as systemd reads unit files.
    """
    entries: list[tuple[str, str, str]] = []
    section = ""
    lines = (text or "").splitlines()
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        i += 1
        if not stripped or stripped[0] in "#;":
            continue
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped[1:-1].strip()
            continue
        logical = stripped
        while _continues(logical) and i < len(lines):
            nxt = lines[i].strip()
            i += 1
            if nxt[:1] in ("#", ";"):
                continue
            logical = logical[:-1] + " " + nxt
        if _continues(logical):
            logical = logical[:-1]
        if "=" in logical:
            key, value = logical.split("=", 1)
            entries.append((section, key.strip(), value.strip()))
    return entries


def _continues(line: str) -> bool:
    return line.endswith("\\") and not line.endswith("\\\\")


def unit_exec_starts(texts: list[str]) -> list[str]:
    """The ExecStart values in effect after reading a unit file and then its drop-ins (``texts`` in that
    order): each ``ExecStart=`` in [Service] appends a command, an empty one clears the list."""
    commands: list[str] = []
    for text in texts:
        for section, key, value in unit_file_entries(text):
            if section == "Service" and key == "ExecStart":
                if value:
                    commands.append(value)
                else:
                    commands = []
    return commands


def unit_info_from_show(props: dict[str, Any], name: str) -> dict[str, Any]:
    """The unit facts the module returns, from ``parse_systemctl_show`` output.

    ``argv``/``exec_start`` come from ExecStartEx (or ExecStart) and so have the whitespace caveat of
    ``parse_exec_property``; the module replaces them with the unit file's exact words when it can read
    the file. Raises ValueError when the unit does not exist or has no ExecStart.
    """
    load_state = _first(props.get("LoadState", ""))
    if load_state in ("not-found", "") and not _first(props.get("FragmentPath", "")):
        raise ValueError(f"systemd unit {name!r} not found (LoadState={load_state or 'unknown'})")
    raw = props.get("ExecStartEx") or props.get("ExecStart")
    commands = parse_exec_property(raw) if raw else []
    if not commands:
        raise ValueError(f"systemd unit {name!r} has no ExecStart")
    workdir = _first(props.get("WorkingDirectory", "")).strip()
    workdir = workdir.lstrip("-!") if workdir not in ("", "!") else ""
    main_pid = _first(props.get("MainPID", "0")).strip()
    cmd = commands[0]
    return {
        "name": _first(props.get("Id", "")) or name,
        "load_state": load_state,
        "active_state": _first(props.get("ActiveState", "")),
        "sub_state": _first(props.get("SubState", "")),
        "fragment_path": _first(props.get("FragmentPath", "")),
        "drop_in_paths": _first(props.get("DropInPaths", "")).split(),
        "need_daemon_reload": _first(props.get("NeedDaemonReload", "")) == "yes",
        "exec_start": cmd["prefix"] + " ".join(([cmd["path"]] if "@" in cmd["prefix"] else []) + cmd["argv"]),
        "exec_start_source": "systemctl show",
        "exec_path": cmd["path"],
        "exec_prefix": cmd["prefix"],
        "argv": cmd["argv"],
        "exec_commands": len(commands),
        "environment": parse_environment_property(_first(props.get("Environment", ""))),
        "environment_files": parse_environment_files_property(_first(props.get("EnvironmentFiles", ""))),
        "user": _first(props.get("User", "")),
        "group": _first(props.get("Group", "")),
        "working_directory": workdir,
        "main_pid": int(main_pid) if main_pid.isdigit() else 0,
    }


def _first(value: Any) -> str:
    return value[0] if isinstance(value, list) else (value or "")
