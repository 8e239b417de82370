# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Version strings compared as pip compares them: ``parse_version``, ``compare_versions``, ``version_satisfies``
(a PEP 440 subset: release, a/b/rc, post, dev, local; specifiers such as ``>=0.5.14,<0.6``).

Text in, data out, standard library only (tests/unit/plugins/module_utils/test_versions.py).
"""

from __future__ import annotations

import re

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
