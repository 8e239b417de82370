# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A systemd command line (systemd.syntax(7), systemd.service(5) "Command lines"), read and written word by word.

- ``split_command_line`` splits it as systemd splits ExecStart (quotes, C escapes, continuations, ``;``);
  ``join_continuation_lines`` joins a value continued with a trailing backslash.
- ``quote_word``, ``render_argv`` write words back so that ``split_command_line`` reads them unchanged;
  ``systemd_escape`` writes a literal value (``%`` -> ``%%``, ``$`` -> ``$$``).

Text in, data out, standard library only (tests/unit/plugins/module_utils/test_systemd_cmdline.py).
"""

from __future__ import annotations

import re

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


def split_command_line(text: str, separators: bool = True, partial: bool = False) -> list[str]:
    """Split a command line the way systemd splits ExecStart (systemd.syntax(7), systemd.service(5)).

    Words are separated by whitespace; double or single quotes group (also inside a word); C escapes
    (\\n, \\t, \\", \\\\, \\xHH, \\ooo, \\uXXXX, \\UXXXXXXXX, \\s) are decoded everywhere; a trailing
    backslash continues the line. ``$VAR``, ``${VAR}`` and ``%`` specifiers are kept literally (systemd
    expands them when it starts the command). With ``separators``, a lone ``;`` word (several commands)
    raises ValueError; ``\\;`` is a literal semicolon word.
    Raises ValueError on an unterminated quote; with ``partial``, returns the words before it instead (systemd keeps
    them from an ``Environment=`` line and ignores the rest, "Invalid syntax").
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
        if partial:
            return words
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
