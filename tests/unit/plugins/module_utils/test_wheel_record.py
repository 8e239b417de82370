"""Tables for the RECORD parsing and comparison behind specdec.pivot.python_distribution."""

from __future__ import annotations

import pytest
from ansible_collections.specdec.pivot.plugins.module_utils import _wheel_record as wr

H1 = "sha256=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
H2 = "sha256=BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
H3 = "sha256=CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC"

# A wheel's RECORD: the RECORD row itself has no hash; everything else does.
WHEEL = f"""pkg/__init__.py,{H1},10
pkg/core.py,{H2},20
pkg-1.0.dist-info/METADATA,{H3},30
pkg-1.0.dist-info/RECORD,,
"""

# ------------------------------------------------------------------------------------------- record_hashes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (WHEEL, {"pkg/__init__.py": H1, "pkg/core.py": H2, "pkg-1.0.dist-info/METADATA": H3}),
        # what pip writes beside the files: .pyc (compiled on install), INSTALLER, REQUESTED, direct_url.json
        (
            f"pkg/core.py,{H2},20\n"
            f"pkg/__pycache__/core.cpython-311.pyc,{H1},99\n"
            f"pkg-1.0.dist-info/INSTALLER,{H1},4\n"
            "pkg-1.0.dist-info/REQUESTED,,\n"
            f"pkg-1.0.dist-info/direct_url.json,{H3},80\n"
            "pkg-1.0.dist-info/RECORD,,\n",
            {"pkg/core.py": H2},
        ),
        ('"pkg/a, b.py",' + H1 + ",3\n", {"pkg/a, b.py": H1}),  # csv quoting: a comma in a path
        ("pkg/core.py\n\n", {}),  # a short row and an empty line
        ("", {}),
    ],
    ids=["wheel", "install-written-skipped", "quoted-path", "short-rows", "empty"],
)
def test_record_hashes(text, expected):
    assert wr.record_hashes(text) == expected


# ------------------------------------------------------------------------------------------- differing_files

INSTALLED_SAME = WHEEL + (
    f"pkg/__pycache__/__init__.cpython-311.pyc,{H3},50\npkg-1.0.dist-info/INSTALLER,{H1},4\n"
    "pkg-1.0.dist-info/REQUESTED,,\npkg-1.0.dist-info/RECORD,,\n"
)


@pytest.mark.parametrize(
    ("wheel", "installed", "expected"),
    [
        (WHEEL, WHEEL, []),
        (WHEEL, INSTALLED_SAME, []),  # .pyc, INSTALLER, REQUESTED added by pip: still the same
        (WHEEL, WHEEL.replace(f"pkg/core.py,{H2}", f"pkg/core.py,{H3}"), ["pkg/core.py"]),  # a changed hash
        (WHEEL, WHEEL.replace(f"pkg/core.py,{H2},20\n", ""), ["pkg/core.py"]),  # a missing file
        (WHEEL, "", sorted(["pkg/__init__.py", "pkg/core.py", "pkg-1.0.dist-info/METADATA"])),  # no RECORD
        (WHEEL, WHEEL + f"pkg/extra.py,{H1},1\n", []),  # installed has more files: the wheel's are all there
        (WHEEL.replace("pkg-1.0.dist-info/RECORD,,", f"pkg-1.0.dist-info/RECORD,{H1},9"), WHEEL, []),  # RECORD
    ],
    ids=["same", "pip-additions", "changed-hash", "missing-file", "no-installed-record", "extra-installed",
         "record-row-hashed"],
)
def test_differing_files(wheel, installed, expected):
    assert wr.differing_files(wr.record_hashes(wheel), wr.record_hashes(installed)) == expected


# ------------------------------------------------------------------------------------------- find_record_name


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["pkg/__init__.py", "pkg-1.0.dist-info/METADATA", "pkg-1.0.dist-info/RECORD"], "pkg-1.0.dist-info/RECORD"),
        (["pkg/__init__.py", "pkg/vendored/x-1.dist-info/RECORD"], None),  # nested: not the wheel's own
        (["pkg/RECORD", "RECORD"], None),
        ([], None),
    ],
)
def test_find_record_name(names, expected):
    assert wr.find_record_name(names) == expected


# ------------------------------------------------------------------------------------------- distribution_state


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            (None, None, WHEEL, None),
            {"installed": False, "version": None, "same_content": False, "differing": [], "direct_url": None},
        ),
        (
            ("1.0", WHEEL, None, {"url": "file:///w.whl"}),
            {"installed": True, "version": "1.0", "same_content": False, "differing": ["(no wheel given)"],
             "direct_url": {"url": "file:///w.whl"}},
        ),
        (
            ("1.0", INSTALLED_SAME, WHEEL, None),
            {"installed": True, "version": "1.0", "same_content": True, "differing": [], "direct_url": None},
        ),
        (
            ("1.0", None, WHEEL, None),  # installed without a RECORD (a distutils install): nothing matches
            {"installed": True, "version": "1.0", "same_content": False,
             "differing": ["pkg-1.0.dist-info/METADATA", "pkg/__init__.py", "pkg/core.py"], "direct_url": None},
        ),
    ],
    ids=["not-installed", "no-wheel", "same", "no-installed-record"],
)
def test_distribution_state(args, expected):
    assert wr.distribution_state(*args) == expected


def test_differing_is_capped():
    wheel = "".join(f"pkg/m{i:02d}.py,{H1},1\n" for i in range(30))
    state = wr.distribution_state("1.0", "", wheel)
    assert state["same_content"] is False
    assert state["differing"] == [f"pkg/m{i:02d}.py" for i in range(wr.DIFFERING_LIMIT)]
