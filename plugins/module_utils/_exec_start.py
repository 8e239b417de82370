# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""An SGLang server's ExecStart, taken apart and put back together.

- ``parse_exec_start`` reads a unit-file ExecStart value, the ``{ path=... ; argv[]=... }`` form ``systemctl show``
  prints, or an argv list into its parts: prefix, wrappers, interpreter (``is_python``), ``-m`` module or script,
  positional args, flags, trailing args.
- ``exec_start_argv`` and ``render_exec_start`` write a parsed (possibly edited) ExecStart back, as argv or as a
  unit file's ExecStart value.

Text in, data out (tests/unit/plugins/module_utils/test_exec_start.py).
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.specdec.pivot.plugins.module_utils._argv_flags import _flag_words, flag_words, parse_flags
from ansible_collections.specdec.pivot.plugins.module_utils._exec_wrappers import parse_wrappers
from ansible_collections.specdec.pivot.plugins.module_utils._systemd_cmdline import (
    join_continuation_lines,
    render_argv,
    split_command_line,
)
from ansible_collections.specdec.pivot.plugins.module_utils._systemd_unit import parse_exec_property

#: Characters systemd accepts as special prefixes of an Exec line (systemd.service(5), table 1).
EXEC_PREFIX_CHARS = "@-:+!|"
_PYTHON_RE = re.compile(r"^(?:python|pypy)(?:\d+(?:\.\d+)*)?$")
#: Python command-line options that take the next word as their argument.
_PYTHON_OPTS_WITH_ARG = ("-X", "-W", "--check-hash-based-pycs")


def is_python(program: str) -> bool:
    """Whether a program path looks like a Python interpreter (python, python3, python3.11, pypy3)."""
    return bool(_PYTHON_RE.match(program.rsplit("/", 1)[-1]))


def parse_exec_start(value: str | list[str] | dict[str, Any]) -> dict[str, Any]:
    """Parse an SGLang ExecStart into its parts.

    ``value`` is a unit-file ExecStart value (``ExecStart=`` optional, quotes, continuations, prefixes
    ``@ - : + ! !! |``), the ``{ path=... ; argv[]=... }`` form ``systemctl show`` prints (or one command
    of ``parse_exec_property``), or an argv list.
    Returns a dict:
    - ``prefix``: the systemd special prefix characters (``""`` when none); ``path``: the executable
      systemd runs (differs from argv[0] only with the ``@`` prefix, and then it decides ``interpreter``);
    - ``argv``: the words; ``launcher``: words before the program (``/usr/bin/env`` and its options and
      ``NAME=value`` assignments); ``env_assignments``: those assignments as a dict;
    - ``program``: the word that names the program; ``interpreter``: the same when it is a Python
      interpreter (``python3``, ``/opt/venv/bin/python``), else None (a console script such as
      ``/opt/venv/bin/sglang``; the module then reads its ``#!`` line);
    - ``python_options``: interpreter options before ``-m``/the script (``-u``, ``-X dev``);
    - ``module`` (``-m X``) or ``script`` (a Python script path); ``kind``: ``module``, ``script``,
      ``command`` (a non-Python program) or ``interpreter`` (Python with no module or script);
    - ``args``: positional words before the first flag (``serve`` in ``sglang serve``);
    - ``flags``: ``{"--flag": value}`` in first-seen order; ``--flag value`` and ``--flag=value`` give a
      string, a bare flag gives True, a flag followed by several words (argparse ``nargs``) gives a list;
      a flag given more than once gives the list of its values, one per occurrence, and is named in
      ``repeated``; ``order``: the flags in the order they occur (repeats included);
    - ``trailing_args``: the words after a bare ``--``;
    - ``source``: ``unit_file`` (text as written in a unit file: ``%`` specifiers not yet expanded),
      ``systemctl_show`` (the ``{ argv[]=... }`` form) or ``argv`` (a list; taken to be what systemctl
      show reports, i.e. specifiers already expanded). ``render_exec_start`` uses it to decide whether a
      ``%`` must be written ``%%``. ``$VAR`` is never expanded by systemd before ExecStart runs, so it
      stays as it is in every source.
    Raises ValueError for an empty command line, an unterminated quote, several commands.
    """
    prefix, path, argv, source = _exec_words(value)
    if not argv:
        raise ValueError("empty ExecStart: no program to run")
    wrappers, i = parse_wrappers(argv)
    launcher: list[str] = list(argv[:i])
    env_assignments: dict[str, str] = {}
    for wrapper in wrappers:
        env_assignments.update(wrapper["env_assignments"])
    if i >= len(argv):
        raise ValueError(f"ExecStart {render_argv(argv)!r} names no program after {argv[0]}")
    program = argv[i]
    i += 1
    executable = path if ("@" in prefix and path and i == 1) else program
    parsed: dict[str, Any] = {
        "prefix": prefix,
        "path": path or program,
        "argv": list(argv),
        "launcher": launcher,
        "wrappers": wrappers,
        "env_assignments": env_assignments,
        "program": program,
        "interpreter": executable if is_python(executable) else None,
        "python_options": [],
        "module": None,
        "script": None,
        "kind": "command",
        "source": source,
    }
    if parsed["interpreter"]:
        parsed["kind"] = "interpreter"
        while i < len(argv):
            w = argv[i]
            if w == "-m" and i + 1 < len(argv):
                parsed["module"], parsed["kind"] = argv[i + 1], "module"
                i += 2
                break
            if w.startswith("-m") and len(w) > 2 and not w.startswith("--"):
                parsed["module"], parsed["kind"] = w[2:], "module"
                i += 1
                break
            if w in _PYTHON_OPTS_WITH_ARG and i + 1 < len(argv):
                parsed["python_options"] += [w, argv[i + 1]]
                i += 2
                continue
            if w.startswith("-") and w != "-":
                parsed["python_options"].append(w)
                i += 1
                continue
            parsed["script"], parsed["kind"] = w, "script"
            i += 1
            break
    parsed.update(parse_flags(argv[i:]))
    return parsed


def _exec_words(value: str | list[str] | dict[str, Any]) -> tuple[str, str, list[str], str]:
    """(prefix, path, argv, source) of an ExecStart value in any of the accepted forms."""
    if isinstance(value, dict):
        words = [str(w) for w in value.get("argv", [])]
        path = str(value.get("path") or (words[0] if words else ""))
        return str(value.get("prefix", "")), path, words, "systemctl_show"
    if isinstance(value, (list, tuple)):
        words = [str(w) for w in value]
        return "", words[0] if words else "", words, "argv"
    text = join_continuation_lines(str(value)).strip()
    text = re.sub(r"^ExecStart(?:Ex)?\s*=\s*", "", text)
    if text.startswith("{"):
        commands = parse_exec_property(text)
        if len(commands) != 1:
            raise ValueError(f"expected one command in the ExecStart property, found {len(commands)}")
        return _exec_words(commands[0])
    m = re.match(r"^([" + re.escape(EXEC_PREFIX_CHARS) + r"]*)", text)
    prefix = m.group(1) if m else ""
    words = split_command_line(text[len(prefix) :])
    path = ""
    if "@" in prefix and words:
        path, words = words[0], words[1:]
    return prefix, path, words, "unit_file"


def _head_words(parsed: dict[str, Any]) -> list[str]:
    words: list[str] = [*parsed.get("launcher", []), parsed["program"]]
    if parsed.get("interpreter"):
        words += parsed.get("python_options", [])
        if parsed.get("module"):
            words += ["-m", parsed["module"]]
        elif parsed.get("script"):
            words.append(parsed["script"])
    return words + [str(a) for a in parsed.get("args", [])]


def exec_start_argv(parsed: dict[str, Any]) -> list[str]:
    """The argv a parsed (possibly edited) ExecStart describes.

    Flags come in the order of ``parsed["flags"]``; a flag named in ``repeated`` whose value is a list is
    written once per value, all together at the flag's first position (``--x a --y --x b`` comes back as
    ``--x a --x b --y``: the same arguments for argparse). ``--flag=value`` is written ``--flag value``
    unless the value starts with ``-``. A flag whose value is None or False is left out.
    """
    argv = _head_words(parsed) + flag_words(parsed.get("flags", {}), parsed.get("repeated", []))
    if parsed.get("trailing_args"):
        argv += ["--", *parsed["trailing_args"]]
    return argv


def render_exec_start(
    parsed: dict[str, Any], multiline: bool = False, indent: str = "    ", escape_percent: bool | None = None
) -> str:
    """The ExecStart value (without ``ExecStart=``) for a parsed, possibly edited, ExecStart.

    ``multiline`` puts every flag with its values on its own continuation line (`` \\`` + newline +
    ``indent``), the form the sglang_service role templates. The prefix and, with ``@``, the path are
    kept. ``escape_percent`` (default: True unless ``parsed["source"]`` is ``unit_file``) writes ``%`` as
    ``%%`` so systemd does not read it as a specifier. ``parse_exec_start`` of the result gives back
    ``exec_start_argv(parsed)`` (with ``%%`` where ``%`` was escaped).
    """
    if escape_percent is None:
        escape_percent = parsed.get("source", "unit_file") != "unit_file"
    prefix = parsed.get("prefix", "")
    head = _head_words(parsed)
    if "@" in prefix:
        head = [parsed.get("path") or parsed["program"], *head]
    groups = [head]
    repeated = parsed.get("repeated", [])
    for flag, value in parsed.get("flags", {}).items():
        values = value if flag in repeated and isinstance(value, list) else [value]
        groups += [w for w in (_flag_words(flag, v) for v in values) if w]
    if parsed.get("trailing_args"):
        groups.append(["--", *parsed["trailing_args"]])
    if not multiline:
        groups = [[w for g in groups for w in g]]
    lines = [render_argv(g, escape_percent) for g in groups]
    return prefix + (" \\\n" + indent).join(lines)
