"""Tables for plugins/module_utils/_versions.py (a PEP 440 subset)."""

from __future__ import annotations

import pytest
from ansible_collections.specdec.pivot.plugins.module_utils import _versions as s

# ------------------------------------------------------------------------------------------------------ versions

VERSION_ORDER = [
    "0.5.9",
    "0.5.10.dev1",
    "0.5.10a1",
    "0.5.10rc2",
    "0.5.10",
    "0.5.10.post1",
    "0.5.11",
    "0.5.17",
    "0.5.23",
    "0.5.100",
    "0.6",
    "1.0.0",
]


@pytest.mark.parametrize("i", range(len(VERSION_ORDER) - 1))
def test_versions_sort_like_pep440(i):
    older, newer = VERSION_ORDER[i], VERSION_ORDER[i + 1]
    assert s.compare_versions(older, newer) == -1
    assert s.compare_versions(newer, older) == 1


@pytest.mark.parametrize(
    ("a", "b"), [("0.5", "0.5.0"), ("1.0", "1.0.0.0"), ("v0.5.17", "0.5.17"), ("2.13.0+cpu", "2.13.0+cu130")]
)
def test_equal_versions(a, b):
    assert s.compare_versions(a, b) == 0


@pytest.mark.parametrize("bad", ["", "latest", "0.5.x", "abc1.0"])
def test_not_a_version(bad):
    with pytest.raises(ValueError, match="not a version"):
        s.parse_version(bad)


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("0.5.17", ">=0.5.14", True),
        ("0.5.12", ">=0.5.14", False),
        ("0.5.23", ">=0.5.17,<=0.5.23", True),
        ("0.5.24", ">=0.5.17,<=0.5.23", False),
        ("0.5.23.post1", ">=0.5.17,<=0.5.23", False),  # PEP 440: a post release is newer
        ("0.5.17", ">0.5.17", False),
        ("0.5.17", "!=0.5.17", False),
        ("0.5.18", "==0.5.*", True),
        ("0.6.0", "==0.5.*", False),
        ("0.6.0", "!=0.5.*", True),
        ("0.5.20", "~=0.5.14", True),
        ("0.6.0", "~=0.5.14", False),
        ("0.5.13", "~=0.5.14", False),
        ("0.5.17", "", True),
        ("0.5.17", " >= 0.5.14 , < 0.6 ", True),
    ],
)
def test_version_satisfies(version, spec, ok):
    assert s.version_satisfies(version, spec) is ok


@pytest.mark.parametrize(
    ("spec", "match"),
    [("=>0.5", "specifier clause"), (">=0.5.x", "not a version"), ("<0.5.*", "wildcard"), ("~=1", "two release parts")],
)
def test_bad_specifiers_name_the_clause(spec, match):
    with pytest.raises(ValueError, match=match):
        s.version_satisfies("0.5.17", spec)
