# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""SGLang's speculative-decoding flags: which flags are speculative (``is_speculative_flag``,
``speculative_flags``) and ``replace_speculative_flags``, which swaps them for another algorithm's while every other
flag of the server keeps its place and value.

Data in, data out (tests/unit/plugins/module_utils/test_sglang_flags.py).
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.specdec.pivot.plugins.module_utils._systemd_cmdline import systemd_escape

#: A flag is speculative when it starts with this prefix (every option of SGLang's speculative
#: group does: --speculative-algorithm, -draft-model-path, -num-steps, -eagle-topk, -num-draft-tokens,
#: -dflash-block-size, -attention-mode, -ngram-*, ... in 0.5.10 to 0.5.23) ...
SPECULATIVE_FLAG_PREFIX = "--speculative-"
#: ... or is one of these algorithm-specific switches without the prefix (from the 0.5.23 help:
#: multi-layer EAGLE, the UNO draft LoRA, the ReplaySSM spec-verify). Deployment-wide options that
#: merely mention drafts (--decoupled-spec-*, --spec-trace-dir, --enable-draft-weights-cpu-backup,
#: --decrypted-draft-config-file) are NOT speculative flags here: they are kept.
ALGORITHM_SPECIFIC_FLAGS = frozenset(
    {
        "--enable-multi-layer-eagle",
        "--uno-lora-path",
        "--enable-linear-replayssm-spec",
    }
)


_FLAG_NAME_RE = re.compile(r"^--?[A-Za-z0-9][A-Za-z0-9_-]*$")


def normalize_flag(name: str) -> str:
    """``speculative_algorithm`` / ``speculative-algorithm`` / ``--speculative-algorithm`` -> the flag."""
    name = str(name).strip()
    if not name:
        raise ValueError("empty flag name")
    if name.startswith("-"):
        return name
    return "--" + name.replace("_", "-")


def is_speculative_flag(flag: str) -> bool:
    """Whether ``replace_speculative_flags`` drops this flag (see SPECULATIVE_FLAG_PREFIX)."""
    flag = normalize_flag(flag).split("=", 1)[0]
    return flag.startswith(SPECULATIVE_FLAG_PREFIX) or flag in ALGORITHM_SPECIFIC_FLAGS


def replace_speculative_flags(flags: dict[str, Any], new_spec_flags: dict[str, Any]) -> dict[str, Any]:
    """A new flags dict: the speculative flags of ``flags`` replaced by ``new_spec_flags``.

    - Every speculative flag (``is_speculative_flag``) of ``flags`` is dropped.
    - Every other flag is kept, in order, with its value.
    - ``new_spec_flags`` (keys with or without ``--``, ``_`` or ``-``) are then applied: a key that names
      a kept flag replaces its value in place (e.g. ``disable-overlap-schedule: true``); a value of None
      or False removes that flag; the remaining new flags are inserted, in their given order, where the
      first dropped speculative flag stood (at the end when there was none).
    Values: True for a bare flag, a list for several values, anything else becomes a string (``16`` ->
    ``"16"``), as ``parse_exec_start`` gives them from a unit file: a new value is literal, so its ``%`` and ``$``
    are escaped for systemd (``%%``, ``$$``; the kept flags are as the unit file writes them). ``flags`` is not
    modified. Raises ValueError for a key that is not a flag name.
    """
    new_norm: dict[str, Any] = {}
    for k, v in (new_spec_flags or {}).items():
        flag = normalize_flag(k)
        if not _FLAG_NAME_RE.match(flag):
            raise ValueError(f"{k!r} is not a flag name (letters, digits, - and _, e.g. speculative-algorithm)")
        new_norm[flag] = _flag_value(v)
    kept: list[tuple[str, Any]] = []
    insert_at = None
    for flag, value in (flags or {}).items():
        if is_speculative_flag(flag):
            if insert_at is None:
                insert_at = len(kept)
            continue
        if flag in new_norm:
            value = new_norm.pop(flag)
            if value is None or value is False:
                continue
        kept.append((flag, value))
    added = [(f, v) for f, v in new_norm.items() if v is not None and v is not False]
    if insert_at is None:
        insert_at = len(kept)
    return dict(kept[:insert_at] + added + kept[insert_at:])


def _flag_value(value: Any) -> Any:
    """A new flag value as ``parse_flags`` gives them from a unit file: True, None/False (remove), a list of
    strings, a string; every string escaped for systemd (``systemd_escape``: the value is meant literally)."""
    if value is True or value is False or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [systemd_escape(v) for v in value]
    if isinstance(value, dict):
        raise ValueError(f"a flag's value must be a string, a number, true, null or a list, not a mapping: {value!r}")
    return systemd_escape(value)


def speculative_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """The speculative flags of a flags dict (what ``replace_speculative_flags`` drops)."""
    return {f: v for f, v in (flags or {}).items() if is_speculative_flag(f)}
