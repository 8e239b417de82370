# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The flags of a command line, argparse style: ``parse_flags`` reads the words after the program into ``args``,
``flags`` (``{"--flag": value}``), ``order``, ``repeated`` and ``trailing_args``; ``flag_words`` writes a flags dict
back as words. A word such as ``-1`` or ``-0.5`` is a value (a negative number), not a flag.

Data in, data out, standard library only (tested through ``parse_exec_start``:
tests/unit/plugins/module_utils/test_exec_start.py).
"""

from __future__ import annotations

import re
from typing import Any

_NEGATIVE_NUMBER_RE = re.compile(r"^-(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")


def _is_flag(word: str) -> bool:
    return word.startswith("-") and word != "-" and not _NEGATIVE_NUMBER_RE.match(word)


def parse_flags(words: list[str]) -> dict[str, Any]:
    """Split the words after the program/module into ``args``, ``flags``, ``order``, ``repeated`` and
    ``trailing_args`` (see ``parse_exec_start``)."""
    args: list[str] = []
    i = 0
    while i < len(words) and not _is_flag(words[i]):
        args.append(words[i])
        i += 1
    occurrences: list[tuple[str, Any]] = []
    trailing: list[str] = []
    while i < len(words):
        w = words[i]
        i += 1
        if w == "--":
            trailing = words[i:]
            break
        if w.startswith("--") and "=" in w:
            flag, val = w.split("=", 1)
            occurrences.append((flag, val))
            continue
        vals = []
        while i < len(words) and not _is_flag(words[i]):
            vals.append(words[i])
            i += 1
        occurrences.append((w, True if not vals else vals[0] if len(vals) == 1 else vals))
    flags: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for flag, val in occurrences:
        counts[flag] = counts.get(flag, 0) + 1
        if counts[flag] == 1:
            flags[flag] = val
        elif counts[flag] == 2:
            flags[flag] = [flags[flag], val]
        else:
            flags[flag].append(val)
    return {
        "args": args,
        "flags": flags,
        "order": [occurrence[0] for occurrence in occurrences],
        "repeated": [f for f, c in counts.items() if c > 1],
        "trailing_args": trailing,
    }


def _flag_words(flag: str, value: Any) -> list[str]:
    if value is True:
        return [flag]
    if value is False or value is None:
        return []
    if isinstance(value, (list, tuple)):
        vals = [str(v) for v in value]
        if not vals:
            return [flag]
        bad = [v for v in vals if _is_flag(v)]
        if bad:
            raise ValueError(f"cannot render {flag} with several values when one starts with '-': {bad}")
        return [flag, *vals]
    val = str(value)
    if _is_flag(val) or val == "--":
        return [f"{flag}={val}"]
    return [flag, val]


def flag_words(flags: dict[str, Any], repeated: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The argv words of a flags dict, in dict order (see ``parse_exec_start`` for value meanings)."""
    words: list[str] = []
    for flag, value in flags.items():
        if flag in repeated and isinstance(value, list):
            for v in value:
                words += _flag_words(flag, v)
        else:
            words += _flag_words(flag, value)
    return words
