# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Pure parsers for SGLang facts: help texts, ``systemctl show`` output, ExecStart lines, versions.

Everything here is text in, data out: no processes, no files, no imports beyond the standard library,
so it runs in any target interpreter Ansible uses and is tested with tables
(tests/unit/plugins/module_utils/test_sglang.py).

Sections:
- versions: ``parse_version``, ``compare_versions``, ``version_satisfies`` (a PEP 440 subset).
- help: ``parse_help_algorithms`` reads ``--speculative-algorithm`` from ``launch_server --help`` in
  both forms SGLang has printed: argparse choices ``{DFLASH,EAGLE,...}`` (0.5.10, 0.5.11) and the
  free text ``Builtins: ... Or any name registered via SpeculativeAlgorithm.register`` (0.5.12+).
- systemd: ``parse_systemctl_show``, ``parse_exec_property`` (the ``{ path=... ; argv[]=... }`` form),
  ``parse_environment_property``, ``parse_environment_file``, ``unit_info_from_show``.
- ExecStart: ``split_command_line`` (systemd's quoting rules), ``parse_exec_start``,
  ``render_exec_start``, ``exec_start_argv``, ``replace_speculative_flags``.
- capabilities: ``summarize_capabilities`` turns the probe's JSON (plugins/module_utils/_sglang_probe.py)
  and the parsed help into the module's result.
"""

from __future__ import annotations

import re
from typing import Any

# --------------------------------------------------------------------------------------------------
# Facts about SGLang releases (measured from the wheels; see ../shared/notes/sglang.md)
# --------------------------------------------------------------------------------------------------

#: First release with the ``sglang.srt.plugins`` entry-point group and ``load_plugins()``.
ENTRY_POINTS_MIN_VERSION = "0.5.11"
#: First release with ``SpeculativeAlgorithm.register`` (a plugin can add an algorithm name).
PLUGIN_API_MIN_VERSION = "0.5.12"
#: Entry-point group SGLang loads general plugins from.
PLUGIN_GROUP = "sglang.srt.plugins"
#: The algorithm name the sglang-ddtree plugin registers.
DDTREE_ALGORITHM = "DDTREE"
#: The collection's own view of the SGLang versions DDTree supports, used only when the plugin
#: package (``sglang_ddtree.sglang.versions``) cannot be imported in the target interpreter:
#: DFlashWorkerV2 (which DDTree builds on) appeared in 0.5.14; no upper bound is known.
DDTREE_SUPPORTED_SPEC = ">=0.5.14"
#: Versions DDTree was tested with (informational).
DDTREE_TESTED_VERSIONS = ("0.5.17", "0.5.23")
#: PATH systemd gives services that set none (systemd.exec(5), "Environment variables in spawned
#: processes").
SYSTEMD_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# --------------------------------------------------------------------------------------------------
# Versions (a PEP 440 subset: release, a/b/rc, post, dev, local)
# --------------------------------------------------------------------------------------------------

_VERSION_RE = re.compile(
    r"""^\s*v?
    (?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre_l>a|b|rc|c|alpha|beta|pre|preview)[-_.]?(?P<pre_n>\d*))?
    (?:(?:-(?P<post_n1>\d+))|(?:[-_.]?(?:post|rev|r)[-_.]?(?P<post_n2>\d*)))?
    (?:[-_.]?dev[-_.]?(?P<dev_n>\d*))?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    \s*$""",
    re.VERBOSE | re.IGNORECASE,
)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_INF = float("inf")


def parse_version(text: str) -> tuple:
    """Return a sort key for a version string; raise ValueError when it is not a version.

    >>> parse_version("0.5.23") < parse_version("0.5.100")
    True
    """
    m = _VERSION_RE.match(str(text))
    if not m:
        raise ValueError(f"not a version: {text!r}")
    release = [int(p) for p in m.group("release").split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    pre_l, dev_n = m.group("pre_l"), m.group("dev_n")
    post = m.group("post_n1") or m.group("post_n2")
    has_post = m.group("post_n1") is not None or m.group("post_n2") is not None
    has_dev = dev_n is not None
    if pre_l:
        pre: tuple = (_PRE_RANK[pre_l.lower()], int(m.group("pre_n") or 0))
    elif has_dev and not has_post:
        pre = (-_INF,)  # 1.0.dev1 sorts before 1.0a1
    else:
        pre = (_INF,)
    post_key = (int(post or 0),) if has_post else (-_INF,)
    dev_key = (int(dev_n or 0),) if has_dev else (_INF,)
    return (tuple(release), pre, post_key, dev_key)


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as version ``a`` is older than, equal to or newer than ``b``."""
    ka, kb = parse_version(a), parse_version(b)
    return (ka > kb) - (ka < kb)


def _release(text: str) -> list[int]:
    m = _VERSION_RE.match(text)
    if not m:
        raise ValueError(f"not a version: {text!r}")
    return [int(p) for p in m.group("release").split(".")]


def _clause_ok(version: str, op: str, target: str) -> bool:
    if target.endswith(".*"):
        if op not in ("==", "!="):
            raise ValueError(f"a wildcard version needs == or !=, got {op}{target}")
        prefix = [int(p) for p in target[:-2].split(".")]
        rel = _release(version)
        rel += [0] * max(0, len(prefix) - len(rel))
        same = rel[: len(prefix)] == prefix
        return same if op == "==" else not same
    c = compare_versions(version, target)
    if op == "~=":
        rel = _release(target)
        if len(rel) < 2:
            raise ValueError(f"~= needs at least two release parts, got {target}")
        return c >= 0 and _clause_ok(version, "==", ".".join(str(p) for p in rel[:-1]) + ".*")
    return {
        ">=": c >= 0,
        "<=": c <= 0,
        ">": c > 0,
        "<": c < 0,
        "==": c == 0,
        "===": version.strip() == target,
        "!=": c != 0,
    }[op]


_CLAUSE_RE = re.compile(r"^\s*(===|~=|==|!=|>=|<=|>|<)\s*([^\s,;]+)\s*$")


def version_satisfies(version: str, spec: str) -> bool:
    """Whether ``version`` satisfies a specifier such as ``>=0.5.14,<0.6`` (empty spec: any).

    Raises ValueError naming the bad clause when ``spec`` or ``version`` cannot be read.
    """
    parse_version(version)
    for clause in (spec or "").split(","):
        if not clause.strip():
            continue
        m = _CLAUSE_RE.match(clause)
        if not m:
            raise ValueError(f"not a version specifier clause: {clause.strip()!r} (in {spec!r})")
        if not _clause_ok(version, m.group(1), m.group(2)):
            return False
    return True


# --------------------------------------------------------------------------------------------------
# launch_server --help
# --------------------------------------------------------------------------------------------------

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ALGO_OPTION = "--speculative-algorithm"
_CHOICES_RE = re.compile(re.escape(_ALGO_OPTION) + r"[ =]\{([^}]*)\}")
_NAME_RE = re.compile(r"\b[A-Za-z][A-Za-z0-9_]*\b")
_OPTION_LINE_RE = re.compile(r"^ {1,8}-")


def _option_help_paragraph(text: str, option: str) -> str | None:
    """The help text of ``option`` in argparse's options section, joined into one line.

    None when the option has no entry there. Usage lines (``[--option ...]``) are not entries.
    """
    lines = text.splitlines()
    head_re = re.compile(r"^ {1,8}(?:-\S+(?: \S+)?, )*" + re.escape(option) + r"(?=[\s,=]|$)")
    for i, line in enumerate(lines):
        if not head_re.match(line):
            continue
        parts = [re.split(r"\s{2,}", line.strip(), maxsplit=1)[1]] if re.search(r"\S\s{2,}\S", line) else []
        for nxt in lines[i + 1 :]:
            if not nxt.strip() or _OPTION_LINE_RE.match(nxt) or not nxt.startswith("    "):
                break
            parts.append(nxt.strip())
        return " ".join(parts)
    return None


def parse_help_algorithms(text: str) -> dict[str, Any]:
    """Read the speculative algorithms ``python -m sglang.launch_server --help`` lists.

    Returns ``{"algorithms": [...], "form": "choices" | "free_text" | None, "accepts_registered": bool,
    "option_present": bool}``:
    - ``choices``: argparse's brace list ``--speculative-algorithm {DFLASH,EAGLE,...}`` (0.5.10, 0.5.11):
      a static list, so no plugin can add a name there.
    - ``free_text``: ``Builtins: EAGLE, ..., DFLASH. Or any name registered via
      `SpeculativeAlgorithm.register`.`` (0.5.12 and later); ``accepts_registered`` is True when the
      text says registered names are accepted.
    - ``unlisted``: the option is there but its help names no choices (free text without a ``Builtins:`` list,
      or no help text at all): present, choices unknown - any name may be accepted, ``algorithms`` is empty.
    - ``None``: the option is missing (very old SGLang): absent.
    Names keep SGLang's order and spelling; duplicates are dropped.
    """
    text = _ANSI_RE.sub("", text or "")
    result: dict[str, Any] = {
        "algorithms": [],
        "form": None,
        "accepts_registered": False,
        "option_present": _ALGO_OPTION in text,
    }
    m = _CHOICES_RE.search(text)
    if m:
        result["algorithms"] = _unique(n.strip() for n in m.group(1).split(",") if n.strip())
        result["form"] = "choices"
        return result
    paragraph = _option_help_paragraph(text, _ALGO_OPTION)
    if paragraph is None:
        if result["option_present"]:  # only in the usage line, or an unusual layout: there, choices unknown
            result["form"] = "unlisted"
        return result
    result["form"] = "unlisted"
    result["accepts_registered"] = bool(re.search(r"\bany name\b.*\bregister", paragraph, re.IGNORECASE))
    m = re.search(r"\bBuiltins?\s*:\s*(.*?)(?:\.(?:\s|$)|$)", paragraph, re.IGNORECASE)
    if m:
        names = [n for n in _NAME_RE.findall(m.group(1)) if n.lower() not in ("and", "or")]
        if names:
            result["algorithms"] = _unique(names)
            result["form"] = "free_text"
    return result


def help_option(help_result: dict[str, Any]) -> str:
    """``absent``, ``choices``, ``free_text`` or ``unknown_choices`` from ``parse_help_algorithms`` output."""
    if not help_result.get("option_present"):
        return "absent"
    form = help_result.get("form")
    return form if form in ("choices", "free_text") else "unknown_choices"


def _unique(items) -> list:
    seen: list = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return seen


# --------------------------------------------------------------------------------------------------
# systemctl show, unit files
# --------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------
# ExecStart: systemd command-line syntax
# --------------------------------------------------------------------------------------------------

#: Characters systemd accepts as special prefixes of an Exec line (systemd.service(5), table 1).
EXEC_PREFIX_CHARS = "@-:+!|"
_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "s": " ",
    ";": ";",
}


def join_continuation_lines(text: str) -> str:
    """Join a unit-file value continued with a trailing backslash; drop comment lines inside it."""
    out: list[str] = []
    lines = (text or "").splitlines() or [""]
    continuing = False
    for line in lines:
        stripped = line.strip()
        if continuing and stripped[:1] in ("#", ";") and stripped[:2] != ";\\":
            continue
        if line.rstrip().endswith("\\") and not line.rstrip().endswith("\\\\"):
            out.append(line.rstrip()[:-1])
            continuing = True
        else:
            out.append(line)
            continuing = False
    return " ".join(out)


def split_command_line(text: str, separators: bool = True) -> list[str]:
    """Split a command line the way systemd splits ExecStart (systemd.syntax(7), systemd.service(5)).

    Words are separated by whitespace; double or single quotes group (also inside a word); C escapes
    (\\n, \\t, \\", \\\\, \\xHH, \\ooo, \\uXXXX, \\UXXXXXXXX, \\s) are decoded everywhere; a trailing
    backslash continues the line. ``$VAR``, ``${VAR}`` and ``%`` specifiers are kept literally (systemd
    expands them when it starts the command). With ``separators``, a lone ``;`` word (several commands)
    raises ValueError; ``\\;`` is a literal semicolon word.
    Raises ValueError on an unterminated quote.
    """
    text = join_continuation_lines(text)
    words: list[str] = []
    cur: list[str] = []
    in_word = False
    quote = ""
    escaped_semicolon = False
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n:
            decoded, i = _unescape(text, i)
            if decoded == ";" and not cur and not quote:
                escaped_semicolon = True
            cur.append(decoded)
            in_word = True
            continue
        if quote:
            if ch == quote:
                quote = ""
            else:
                cur.append(ch)
            i += 1
            continue
        if ch in "\"'":
            quote = ch
            in_word = True
            i += 1
            continue
        if ch.isspace():
            if in_word:
                words.append(_finish_word(cur, escaped_semicolon, separators, len(words)))
                cur, in_word, escaped_semicolon = [], False, False
            i += 1
            continue
        cur.append(ch)
        in_word = True
        i += 1
    if quote:
        raise ValueError(f"unterminated {quote} quote in command line: {text!r}")
    if in_word:
        words.append(_finish_word(cur, escaped_semicolon, separators, len(words)))
    return words


def _finish_word(cur: list[str], escaped_semicolon: bool, separators: bool, index: int) -> str:
    word = "".join(cur)
    if separators and word == ";" and not escaped_semicolon:
        raise ValueError(
            f"the command line holds several commands separated by ';' (word {index + 1}); "
            "only one command per ExecStart is supported"
        )
    return word


def _unescape(text: str, i: int) -> tuple[str, int]:
    """Decode the C escape at ``text[i]`` (a backslash); return (characters, next index)."""
    nxt = text[i + 1]
    if nxt in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[nxt], i + 2
    for letter, width in (("x", 2), ("u", 4), ("U", 8)):
        if nxt == letter:
            digits = text[i + 2 : i + 2 + width]
            if len(digits) == width and all(c in "0123456789abcdefABCDEF" for c in digits):
                return chr(int(digits, 16)), i + 2 + width
    digits = text[i + 1 : i + 4]
    if len(digits) == 3 and all(c in "01234567" for c in digits):
        return chr(int(digits, 8)), i + 4
    return "\\" + nxt, i + 2  # unknown escape: kept as written


_SAFE_WORD_RE = re.compile(r"^[A-Za-z0-9_@%+=:,./${}~^\[\]-]+$")


def quote_word(word: str) -> str:
    """Quote one word for a systemd command line so ``split_command_line`` reads it back unchanged."""
    if word == ";":
        return "\\;"  # systemd reads a lone ; (quoted or not) as a command separator; \; is the literal word
    if word and _SAFE_WORD_RE.match(word):
        return word
    out = []
    for ch in word:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def systemd_escape(value: str) -> str:
    """A literal value as a word of a unit file's ExecStart: ``%`` -> ``%%`` (a specifier) and ``$`` -> ``$$``
    (a variable reference), so that systemd runs the value itself (systemd.service(5), "Command lines")."""
    return str(value).replace("%", "%%").replace("$", "$$")


def render_argv(argv: list[str], escape_percent: bool = False) -> str:
    """argv as one systemd command line (each word quoted only when needed).

    ``escape_percent`` writes ``%`` as ``%%``: needed when the words are final values (from
    ``systemctl show`` or an argv list) going into a unit file, where ``%`` starts a specifier.
    """
    words = [str(w) for w in argv]
    if escape_percent:
        words = [w.replace("%", "%%") for w in words]
    return " ".join(quote_word(w) for w in words)


# --------------------------------------------------------------------------------------------------
# ExecStart: python / sglang structure
# --------------------------------------------------------------------------------------------------

_PYTHON_RE = re.compile(r"^(?:python|pypy)(?:\d+(?:\.\d+)*)?$")
_NEGATIVE_NUMBER_RE = re.compile(r"^-(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")
#: Python command-line options that take the next word as their argument.
_PYTHON_OPTS_WITH_ARG = ("-X", "-W", "--check-hash-based-pycs")
_ENV_OPTS_WITH_ARG = ("-u", "--unset", "-C", "--chdir", "-S", "--split-string")


def is_python(program: str) -> bool:
    """Whether a program path looks like a Python interpreter (python, python3, python3.11, pypy3)."""
    return bool(_PYTHON_RE.match(program.rsplit("/", 1)[-1]))


def _is_flag(word: str) -> bool:
    return word.startswith("-") and word != "-" and not _NEGATIVE_NUMBER_RE.match(word)


# Programs an ExecStart may run in front of the interpreter; each starts the rest of the command line.
#: Options (of the wrapper) that take the next word as their value.
_WRAPPER_VALUE_OPTS: dict[str, frozenset] = {
    "env": frozenset({"-u", "--unset", "-C", "--chdir"}),
    "nice": frozenset({"-n", "--adjustment"}),
    "ionice": frozenset({"-c", "--class", "-n", "--classdata"}),
    "taskset": frozenset(),
    "numactl": frozenset(
        {
            "-N",
            "--cpunodebind",
            "-m",
            "--membind",
            "-i",
            "--interleave",
            "-C",
            "--physcpubind",
            "-p",
            "--preferred",
            "-w",
            "--weighted-interleave",
            "-P",
            "--preferred-many",
        }
    ),
    "chrt": frozenset({"-T", "--sched-runtime", "-P", "--sched-period", "-D", "--sched-deadline"}),
    "conda": frozenset({"-n", "--name", "-p", "--prefix", "--cwd"}),
    "micromamba": frozenset({"-n", "--name", "-p", "--prefix", "--cwd", "-r", "--root-prefix", "-a", "--attach"}),
    "uv": frozenset(
        {
            "--project",
            "--directory",
            "--python",
            "-p",
            "--env-file",
            "--extra",
            "--group",
            "--package",
            "--index-url",
            "--extra-index-url",
            "--index",
            "--default-index",
            "--cache-dir",
            "--config-file",
        }
    ),
    "poetry": frozenset({"-C", "--directory", "-P", "--project"}),
    "pipenv": frozenset({"--python", "--site-packages"}),
}
#: Flags (no value) each wrapper accepts before the program; any other option is refused (not guessed).
_WRAPPER_FLAGS: dict[str, frozenset] = {
    "env": frozenset({"-i", "--ignore-environment", "-0", "--null", "-", "--debug", "-v"}),
    "nice": frozenset(),
    "ionice": frozenset({"-t", "--ignore"}),
    "taskset": frozenset({"-a", "--all-tasks", "-c", "--cpu-list"}),
    "numactl": frozenset(
        {"-l", "--localalloc", "-a", "--all", "-b", "--balancing", "--huge", "--touch", "--strict", "-t", "--offset"}
    ),
    "chrt": frozenset(
        {
            "-f",
            "--fifo",
            "-r",
            "--rr",
            "-o",
            "--other",
            "-b",
            "--batch",
            "-i",
            "--idle",
            "-d",
            "--deadline",
            "-R",
            "--reset-on-fork",
            "-a",
            "--all-tasks",
            "-v",
            "--verbose",
        }
    ),
    "conda": frozenset(
        {"--no-capture-output", "--live-stream", "-v", "--verbose", "--debug-wrapper-scripts", "--dev", "-q", "--quiet"}
    ),
    "micromamba": frozenset({"--clean-env", "-q", "--quiet", "-v", "--verbose", "-y", "--yes"}),
    "uv": frozenset(
        {
            "--frozen",
            "--locked",
            "--no-sync",
            "--offline",
            "-q",
            "--quiet",
            "-v",
            "--verbose",
            "--no-dev",
            "--all-extras",
            "--no-env-file",
            "--exact",
            "--inexact",
            "--native-tls",
            "--no-progress",
            "--compile-bytecode",
            "--all-groups",
            "--no-config",
        }
    ),
    "poetry": frozenset(
        {
            "-q",
            "--quiet",
            "-n",
            "--no-interaction",
            "--no-ansi",
            "--ansi",
            "-v",
            "-vv",
            "-vvv",
            "--no-plugins",
            "--no-cache",
        }
    ),
    "pipenv": frozenset({"-q", "--quiet", "-v", "--verbose", "--system"}),
}
#: uv run options that make it run something other than the project's environment: refused.
_UV_OTHER_ENV = frozenset(
    {
        "--with",
        "--with-requirements",
        "--with-editable",
        "--isolated",
        "--no-project",
        "--active",
        "--script",
        "--gui-script",
        "--module",
        "-m",
        "-s",
    }
)
_ENV_MANAGERS = {
    "conda": "conda",
    "mamba": "conda",
    "micromamba": "micromamba",
    "uv": "uv",
    "poetry": "poetry",
    "pipenv": "pipenv",
}
_PLAIN_WRAPPERS = ("env", "nice", "ionice", "taskset", "numactl", "chrt")
_SUBCOMMAND_RUN = ("conda", "micromamba", "uv", "poetry", "pipenv")


def _wrapper_tool(word: str) -> str | None:
    name = word.rsplit("/", 1)[-1]
    if name in _PLAIN_WRAPPERS:
        return name
    return _ENV_MANAGERS.get(name)


def _parse_wrapper(argv: list[str], i: int) -> tuple[dict[str, Any], int]:
    """The wrapper at ``argv[i]`` (env, nice, ionice, taskset, numactl, chrt, conda/mamba/micromamba/uv/poetry/pipenv
    ``run``): ``({"tool", "program", "words", "options", "env_assignments"}, index of the wrapped program)``.

    Raises ValueError naming the word and the fix when the wrapper is used in a way that runs no program (``-p``
    modes, no ``run``), or with an option this parser does not know (it refuses rather than guessing).
    """
    word = argv[i]
    tool = _wrapper_tool(word)
    start = i
    i += 1
    global_opts: dict[str, Any] = {}
    if tool in _SUBCOMMAND_RUN:
        # global options of pipenv/poetry/uv may come before "run"
        while i < len(argv) and argv[i] != "run" and argv[i].startswith("-"):
            name, eq, val = argv[i].partition("=")
            if name in _WRAPPER_VALUE_OPTS[tool] and not eq:
                global_opts[name] = argv[i + 1] if i + 1 < len(argv) else ""
                i += 2
            else:
                global_opts[name] = val if eq else True
                i += 1
        if i >= len(argv) or argv[i] != "run":
            raise ValueError(f"{word} without `run` does not start a program")
        i += 1
    options: dict[str, Any] = dict(global_opts)
    assignments: dict[str, str] = {}
    values, flags = _WRAPPER_VALUE_OPTS[tool], _WRAPPER_FLAGS[tool]
    positional_left = {"taskset": 1, "chrt": 1}.get(tool, 0)  # taskset MASK, chrt PRIORITY
    while i < len(argv):
        w = argv[i]
        if w == "--" and tool not in ("env",):
            i += 1
            break
        if tool == "env" and "=" in w and not w.startswith("-"):
            k, v = w.split("=", 1)
            assignments[k] = v
            i += 1
            continue
        if w.startswith("-") and w != "-" and not (tool == "nice" and _NEGATIVE_NUMBER_RE.match(w)):
            name, eq, val = w.partition("=")
            if tool == "uv" and name in _UV_OTHER_ENV:
                raise ValueError(f"`uv run {name}` runs outside the project's environment")
            if name in ("-p", "--pid", "-P", "--pgrp", "-u", "--uid") and tool in ("taskset", "chrt", "ionice"):
                if not (tool == "chrt" and name == "-P"):
                    raise ValueError(f"{word} {name} changes a running process; it starts no program")
            if name in ("-s", "--show", "-H", "--hardware") and tool == "numactl":
                raise ValueError(f"{word} {name} starts no program")
            if name in values:
                if eq:
                    options[name] = val
                    i += 1
                elif i + 1 < len(argv):
                    options[name] = argv[i + 1]
                    i += 2
                else:
                    raise ValueError(f"{word} option {name} has no value")
                continue
            if len(name) > 2 and not name.startswith("--") and name[:2] in values:  # -n10, -N0, -nENV
                options[name[:2]] = name[2:]
                i += 1
                continue
            if name in flags:
                options[name] = True
                i += 1
                continue
            raise ValueError(
                f"{word}'s option {w!r} is not one this module reads; it cannot tell which program the unit runs"
            )
        if tool == "nice" and _NEGATIVE_NUMBER_RE.match(w):  # nice -10 cmd
            options["-n"] = w[1:]
            i += 1
            continue
        if positional_left:
            options["_" + ("mask" if tool == "taskset" else "priority")] = w
            positional_left -= 1
            i += 1
            continue
        break
    if i >= len(argv):
        raise ValueError(f"{word} names no program to run after it")
    return (
        {"tool": tool, "program": word, "words": argv[start:i], "options": options, "env_assignments": assignments},
        i,
    )


def parse_wrappers(argv: list[str]) -> tuple[list[dict[str, Any]], int]:
    """The chain of wrappers before the program (``nice -n 5 env A=1 conda run -n sg python ...``), and the
    index of the program they finally run. See :func:`_parse_wrapper`."""
    wrappers: list[dict[str, Any]] = []
    i = 0
    while i < len(argv) and _wrapper_tool(argv[i]) and len(wrappers) < 8:
        wrapper, i = _parse_wrapper(argv, i)
        wrappers.append(wrapper)
    return wrappers, i


def _search(name: str, path_var: str, is_executable) -> str | None:
    for d in (path_var or "").split(":"):
        if d and is_executable(d.rstrip("/") + "/" + name):
            return d.rstrip("/") + "/" + name
    return None


def _project_root(start: str, markers: tuple[str, ...], exists) -> str | None:
    d = start.rstrip("/") or "/"
    while True:
        if any(exists(f"{d.rstrip('/')}/{m}") for m in markers):
            return d
        if d == "/":
            return None
        d = d.rsplit("/", 1)[0] or "/"


def resolve_exec_program(
    parsed: dict[str, Any], unit_env: dict[str, str], working_directory: str, is_executable, exists
) -> dict[str, Any]:
    """Which executable the unit's ExecStart finally runs, found as systemd and each wrapper find it.

    - The first word, when it is a bare name, is looked up in systemd's fixed search path
      (:data:`SYSTEMD_DEFAULT_PATH`); a unit's ``Environment=PATH`` does NOT change that lookup.
    - A program started by ``env``, ``nice``, ``ionice``, ``taskset``, ``numactl`` or ``chrt`` is looked up in
      the service's PATH (``Environment=``/``EnvironmentFile=`` PATH, else systemd's default), with ``env``'s
      own ``PATH=`` assignment applied.
    - ``conda``/``mamba``/``micromamba run -n ENV|-p PREFIX`` run it in that environment (its ``bin/``); ``uv run``,
      ``poetry run`` and ``pipenv run`` in the project's in-project ``.venv`` (project: ``--project``/
      ``--directory``/``-C``, else WorkingDirectory, walking up to ``pyproject.toml``/``Pipfile``).
    ``is_executable(path)`` and ``exists(path)`` look at the host's filesystem (tables in tests).
    Returns ``{"path", "how", "wrappers", "env_prefix"}``; raises ValueError naming the reason and the fix.
    """
    wrappers = parsed.get("wrappers") or []
    service_path = unit_env.get("PATH") or SYSTEMD_DEFAULT_PATH
    path_var = SYSTEMD_DEFAULT_PATH  # systemd's own lookup of the first word
    how = "systemd's search path"
    env_prefix = None

    def find(word: str, where: str, what: str) -> str:
        if any(c in word for c in "$%"):
            raise ValueError(f"{what} {word!r} uses a variable or specifier this module does not expand")
        if "/" in word:
            if not is_executable(word):
                raise ValueError(f"{what} {word} is not an executable file on this host")
            return word
        found = _search(word, where, is_executable)
        if not found:
            raise ValueError(f"{what} {word!r} is not found in {where} ({how})")
        return found

    for wrapper in wrappers:
        program = find(wrapper["program"], path_var, "the wrapper")
        tool, opts = wrapper["tool"], wrapper["options"]
        if tool == "env":
            path_var = wrapper["env_assignments"].get(
                "PATH", service_path if not opts.get("-i") and not opts.get("--ignore-environment") else ""
            )
            how = "env's PATH (the unit's Environment=PATH or systemd's default)"
            if "$" in path_var:
                raise ValueError(f"env's PATH={path_var!r} uses a variable this module does not expand")
        elif tool in ("conda", "micromamba"):
            prefix = opts.get("-p") or opts.get("--prefix")
            name = opts.get("-n") or opts.get("--name")
            if not prefix:
                if tool == "conda":
                    root = program.rsplit("/", 2)[0]  # ROOT/bin/conda or ROOT/condabin/conda
                else:
                    root = opts.get("-r") or opts.get("--root-prefix") or unit_env.get("MAMBA_ROOT_PREFIX")
                    if not root:
                        raise ValueError(
                            "micromamba run -n names an environment under a root prefix that the unit does not set "
                            "(-r/--root-prefix or MAMBA_ROOT_PREFIX)"
                        )
                prefix = root if (not name or name == "base") else f"{root}/envs/{name}"
            if not exists(f"{prefix}/conda-meta"):
                raise ValueError(f"{tool} run's environment {prefix} is not a conda environment on this host")
            env_prefix, path_var, how = prefix, f"{prefix}/bin", f"the {tool} environment {prefix}"
        elif tool in ("uv", "poetry", "pipenv"):
            start = (
                opts.get("--project")
                or opts.get("--directory")
                or opts.get("-C")
                or opts.get("-P")
                or working_directory
                or ""
            )
            if not start.startswith("/"):
                raise ValueError(
                    f"{tool} run's project directory is unknown (no WorkingDirectory= or absolute "
                    f"--project/--directory)"
                )
            markers = ("Pipfile",) if tool == "pipenv" else ("pyproject.toml",)
            root = _project_root(start, markers, exists)
            if root is None:
                raise ValueError(f"{tool} run finds no project ({markers[0]}) in {start} or above it")
            venv = unit_env.get("UV_PROJECT_ENVIRONMENT") if tool == "uv" else None
            venv = venv if venv and venv.startswith("/") else f"{root}/{venv or '.venv'}"
            if not exists(f"{venv}/pyvenv.cfg"):
                raise ValueError(
                    f"{tool} run uses a virtualenv this module cannot locate ({venv} is not one; "
                    f"{tool} may keep it elsewhere)"
                )
            env_prefix, path_var, how = venv, f"{venv}/bin", f"the {tool} project environment {venv}"
        else:
            path_var, how = service_path, f"{tool}'s PATH (the unit's Environment=PATH or systemd's default)"
    program = parsed["program"]
    word = parsed["path"] if ("@" in parsed.get("prefix", "") and not wrappers) else program
    found = find(word, path_var, "the program")
    if env_prefix and "/" not in word and not found.startswith(env_prefix + "/"):
        raise ValueError(f"the program {word!r} is not in {env_prefix}/bin")
    return {"path": found, "how": how, "wrappers": [w["tool"] for w in wrappers], "env_prefix": env_prefix}


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


# --------------------------------------------------------------------------------------------------
# Speculative flags
# --------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------
# Capabilities: the probe's JSON + the parsed help -> the module's result
# --------------------------------------------------------------------------------------------------


def ddtree_supported_spec(probe: dict[str, Any]) -> tuple[str, str]:
    """(specifier, source) of the SGLang versions DDTree supports.

    The plugin's own declaration (``sglang_ddtree.sglang.versions`` MIN_SGLANG/MAX_SGLANG, inclusive, as
    the probe read it in the target interpreter) wins; else the collection's DDTREE_SUPPORTED_SPEC.
    """
    declared = (probe.get("ddtree") or {}).get("declared") or {}
    spec = declared.get("spec")
    if spec:
        return str(spec), "sglang_ddtree.sglang.versions"
    return DDTREE_SUPPORTED_SPEC, "specdec.pivot (the plugin's sglang_ddtree.sglang.versions is not importable)"


def _ddtree_version_check(probe: dict[str, Any], version: str, spec: str) -> tuple[bool | None, str | None]:
    """(version in range, reason when not). The plugin's own ``unsupported_reason`` decides when the probe
    could call it (it compares major.minor.patch, so 0.5.23.post1 counts as 0.5.23); else ``spec``."""
    declared = (probe.get("ddtree") or {}).get("declared") or {}
    if declared.get("has_unsupported_reason"):
        reason = declared.get("unsupported_reason")
        return reason is None, (f"{reason} (sglang_ddtree.sglang.versions)" if reason else None)
    try:
        ok = version_satisfies(version, spec)
    except ValueError as exc:
        return None, f"cannot compare sglang {version} with {spec!r}: {exc}"
    return ok, None if ok else f"sglang {version} is outside the DDTree range {spec}"


def summarize_capabilities(probe: dict[str, Any], help_result: dict[str, Any] | None = None) -> dict[str, Any]:
    """Turn the probe's JSON (see _sglang_probe.py) and the parsed help into the module's result keys.

    ``help_result``: ``parse_help_algorithms`` output of a help run that worked, or ``{"error": "..."}``,
    or None when the help was not run.

    Decisions:
    - ``plugin_api``: ``entry_points`` = ``sglang.srt.plugins.load_plugins`` exists (0.5.11+),
      ``register`` = ``SpeculativeAlgorithm.register`` exists (0.5.12+), ``available`` = both.
    - ``ddtree.supported`` = sglang installed and importable, plugin API available, a DFlashWorkerV2
      (which DDTree builds on) present, and the version in the supported range (``ddtree_supported_spec``).
    - ``ddtree.registered`` = ``DDTREE`` is in SGLang's plugin registry after ``load_plugins()`` and
      ``SpeculativeAlgorithm.from_string("DDTREE")`` resolves.
    - ``ddtree.reason``: why it is not supported, or why it is supported but not registered (plugin not
      installed, failed to load, skipped), or that it is registered.
    """
    sg = probe.get("sglang") or {}
    installed = bool(sg.get("installed"))
    version = sg.get("version")
    plugin_eps = [ep for ep in probe.get("entry_points") or [] if ep.get("group", PLUGIN_GROUP) == PLUGIN_GROUP]
    has_loader = bool(probe.get("plugins_module"))
    has_register = bool(probe.get("register_api"))
    worker = probe.get("dflash_worker") or "none"
    builtin = list(probe.get("builtin_algorithms") or [])
    plugin_algos = list(probe.get("plugin_algorithms") or [])
    ddt = probe.get("ddtree") or {}
    declared = ddt.get("declared") or {}
    spec, spec_source = ddtree_supported_spec(probe)

    reasons: list[str] = []
    version_ok: bool | None = None
    if not installed:
        reasons.append("sglang is not installed in this interpreter")
    elif sg.get("error"):
        reasons.append(sg["error"])
    elif not version:
        reasons.append("the sglang version could not be read")
    else:
        version_ok, why = _ddtree_version_check(probe, version, spec)
        if not has_loader:
            reasons.append(
                f"sglang {version} has no plugin loader (sglang.srt.plugins.load_plugins, "
                f"since {ENTRY_POINTS_MIN_VERSION})"
            )
        if not has_register:
            reasons.append(f"sglang {version} has no SpeculativeAlgorithm.register (since {PLUGIN_API_MIN_VERSION})")
        if worker != "v2":
            reasons.append(f"sglang {version} has no DFlashWorkerV2 (dflash_worker: {worker}), which DDTree builds on")
        if why:
            reasons.append(why)
    supported = bool(
        installed and not sg.get("error") and has_loader and has_register and worker == "v2" and version_ok
    )

    is_registered = DDTREE_ALGORITHM in plugin_algos and bool(ddt.get("resolves"))
    ep = next((e for e in plugin_eps if str(e.get("value", "")).startswith("sglang_ddtree")), None)
    if is_registered:
        reasons.append(f"DDTREE is registered (sglang {version}, sglang-ddtree {ddt.get('version')})")
    elif supported:
        if ep is None:
            reasons.append("the sglang-ddtree plugin is not installed (no sglang.srt.plugins entry point)")
        elif ep.get("error"):
            reasons.append(f"the sglang-ddtree plugin failed: {ep['error']}")
        elif ddt.get("last_status") and ddt["last_status"] != "registered":
            reasons.append(f"the sglang-ddtree plugin did not register DDTREE: {ddt['last_status']}")
        else:
            reasons.append("the sglang-ddtree entry point ran but DDTREE is not in the registry")
    ddtree = {
        "supported": supported,
        "registered": is_registered,
        "plugin_installed": bool(ddt.get("installed")),
        "plugin_version": ddt.get("version"),
        "plugin_status": ddt.get("last_status"),
        "entry_point": ep,
        "supported_range": spec,
        "range_text": declared.get("range_text"),
        "range_source": spec_source,
        "tested_versions": list(declared.get("tested") or DDTREE_TESTED_VERSIONS),
        "reason": "; ".join(reasons),
    }
    ran_help = bool(help_result) and "error" not in help_result
    return {
        "sglang": {
            "installed": installed,
            "version": version,
            "location": sg.get("location"),
            "error": sg.get("error"),
        },
        "python": probe.get("python") or {},
        "site_packages": probe.get("site_packages") or [],
        "torch_version": probe.get("torch_version"),
        "help_algorithms": list(help_result["algorithms"]) if ran_help else None,
        "help_form": help_result.get("form") if ran_help else None,
        "help_option": help_option(help_result) if ran_help else None,
        "help_accepts_registered": bool(help_result.get("accepts_registered")) if ran_help else None,
        "help_error": help_result.get("error") if help_result and not ran_help else None,
        "builtin_algorithms": builtin,
        "plugin_algorithms": plugin_algos,
        "registered_algorithms": _unique(builtin + plugin_algos),
        "plugins_loaded": plugin_eps,
        "plugin_api": {
            "entry_points": has_loader,
            "register": has_register,
            "available": has_loader and has_register,
            "min_version": PLUGIN_API_MIN_VERSION,
            "group": PLUGIN_GROUP,
        },
        "dflash_worker": worker,
        "ddtree": ddtree,
        "probe_errors": probe.get("errors") or [],
    }
