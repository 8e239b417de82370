"""Tables for plugins/module_utils/_sglang_caps.py: ``launch_server --help`` and the capability summary.

Inputs are recorded from real software: ``launch_server --help`` of the real sglang wheels 0.5.10 - 0.5.23
(tests/unit/fixtures/sglang_help, see record.sh there) and the probe's JSON from real SGLang environments
(tests/unit/fixtures/sglang_probe).
"""

from __future__ import annotations

import pytest
from ansible_collections.specdec.pivot.plugins.module_utils import _sglang_caps as s
from sglang_recordings import help_text, probe_json

# ------------------------------------------------------------------------------------------------------ help


@pytest.mark.parametrize(
    ("version", "algorithms", "form", "accepts_registered"),
    [
        # argparse choices=[...] in server_args.py of these wheels
        ("0.5.10", ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"], "choices", False),
        ("0.5.11", ["DFLASH", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"], "choices", False),
        # help="Speculative algorithm. Builtins: ... Or any name registered via `SpeculativeAlgorithm.register`."
        ("0.5.12", ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH"], "free_text", True),
        ("0.5.17", ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK"], "free_text", True),
        ("0.5.23", ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO"], "free_text", True),
    ],
)
def test_help_of_each_recorded_version(version, algorithms, form, accepts_registered):
    got = s.parse_help_algorithms(help_text(version))
    assert got == {
        "algorithms": algorithms,
        "form": form,
        "accepts_registered": accepts_registered,
        "option_present": True,
    }


@pytest.mark.parametrize("version", ["0.5.12", "0.5.17", "0.5.23"])
def test_free_text_help_read_at_any_width(version):
    """The recorded help wraps at 80 columns; the same paragraph on one line (COLUMNS=200) reads the same."""
    body = help_text(version)
    start = body.index("  --speculative-algorithm SPECULATIVE_ALGORITHM\n")
    end = body.index("\n  -", start + 10)
    paragraph = " ".join(ln.strip() for ln in body[start:end].splitlines()[1:])
    wide = f"options:\n  --speculative-algorithm SPECULATIVE_ALGORITHM    {paragraph}\n  --other X   y\n"
    assert s.parse_help_algorithms(wide)["algorithms"] == s.parse_help_algorithms(body)["algorithms"]


HELP_CASES = {
    "ansi colours (python 3.14 argparse)": (
        "usage: x [\x1b[36m--speculative-algorithm\x1b[0m {\x1b[33mEAGLE\x1b[0m,DFLASH}]\n",
        ["EAGLE", "DFLASH"],
        "choices",
    ),
    "choices only in the options section": (
        "options:\n  --speculative-algorithm {NGRAM,EAGLE}\n                        Speculative algorithm.\n",
        ["NGRAM", "EAGLE"],
        "choices",
    ),
    "another option's braces are not the algorithms": (
        "usage: x [--speculative-draft-load-format {auto,pt}]\n"
        "  --speculative-algorithm SPECULATIVE_ALGORITHM\n                        Builtins: EAGLE, NGRAM. Or any\n"
        "                        name registered.\n",
        ["EAGLE", "NGRAM"],
        "free_text",
    ),
    "builtins joined with and": (
        "  --speculative-algorithm SPECULATIVE_ALGORITHM\n      Builtins: EAGLE, NGRAM and DFLASH.\n",
        ["EAGLE", "NGRAM", "DFLASH"],
        "free_text",
    ),
    "option without a list": (
        "  --speculative-algorithm SPECULATIVE_ALGORITHM\n                        Speculative algorithm.\n",
        [],
        "unlisted",
    ),
    "free text naming examples, not a list": (
        "  --speculative-algorithm SPECULATIVE_ALGORITHM\n      The speculative decoding algorithm, e.g. EAGLE.\n",
        [],
        "unlisted",
    ),
    "option with a short metavar and no help": (
        "options:\n  --speculative-algorithm ALGO\n  --other X  y\n",
        [],
        "unlisted",
    ),
    "option with = and no help": ("options:\n  --speculative-algorithm=NAME\n", [], "unlisted"),
    "option only in the usage line": ("usage: x [--speculative-algorithm SPECULATIVE_ALGORITHM]\n", [], "unlisted"),
    "option with an alias first": (
        "  --spec-algo, --speculative-algorithm SPECULATIVE_ALGORITHM\n      Which algorithm; see the docs.\n",
        [],
        "unlisted",
    ),
    "option help wrapped over lines without names": (
        "  --speculative-algorithm SPECULATIVE_ALGORITHM\n                        Speculative algorithm (registered\n"
        "                        by plugins at start-up).\n  --speculative-draft-model-path P\n",
        [],
        "unlisted",
    ),
    "option missing (very old sglang)": ("usage: x [--model-path MODEL_PATH]\n", [], None),
    "empty": ("", [], None),
}


@pytest.mark.parametrize("case", HELP_CASES)
def test_help_variants(case):
    text, algorithms, form = HELP_CASES[case]
    got = s.parse_help_algorithms(text)
    assert (got["algorithms"], got["form"]) == (algorithms, form)
    assert got["option_present"] == ("--speculative-algorithm" in text.replace("\x1b[36m", "").replace("\x1b[0m", ""))


@pytest.mark.parametrize("case", HELP_CASES)
def test_help_option_is_absent_only_when_the_help_has_no_such_option(case):
    """Free text with no {...} choices is "present, choices unknown", never "absent" (issue 16, point 4)."""
    text, _algorithms, form = HELP_CASES[case]
    expected = {"choices": "choices", "free_text": "free_text", "unlisted": "unknown_choices", None: "absent"}[form]
    assert s.help_option(s.parse_help_algorithms(text)) == expected
    caps = s.summarize_capabilities({"sglang": {"installed": True, "version": "0.5.17"}}, s.parse_help_algorithms(text))
    assert caps["help_option"] == expected
    assert (caps["help_option"] == "absent") is ("--speculative-algorithm" not in text)


# ------------------------------------------------------------------------------------------------------ summary

SUMMARY_CASES = {
    # name: (plugin_api entry_points, register, dflash_worker, supported, registered, reason contains)
    "0.5.10": (False, False, "none", False, False, "no plugin loader"),
    "0.5.11": (True, False, "v1", False, False, "no SpeculativeAlgorithm.register"),
    "0.5.12": (True, True, "v1", False, False, "older than 0.5.17"),
    "no-sglang": (False, False, "none", False, False, "not installed"),
}


@pytest.mark.parametrize("name", SUMMARY_CASES)
def test_summary_of_recorded_probes_of_old_versions(name):
    eps, register, worker, supported, registered, reason = SUMMARY_CASES[name]
    caps = s.summarize_capabilities(probe_json(name))
    assert caps["plugin_api"]["entry_points"] is eps
    assert caps["plugin_api"]["register"] is register
    assert caps["plugin_api"]["available"] is (eps and register)
    assert caps["plugin_api"]["min_version"] == "0.5.12"
    assert caps["dflash_worker"] == worker
    assert caps["ddtree"]["supported"] is supported
    assert caps["ddtree"]["registered"] is registered
    assert reason in caps["ddtree"]["reason"]
    assert caps["help_algorithms"] is None and caps["help_form"] is None


@pytest.mark.parametrize("name", ["0.5.17", "0.5.23"])
def test_summary_of_recorded_probes_of_supported_versions(name):
    probe = probe_json(name)
    caps = s.summarize_capabilities(probe, s.parse_help_algorithms(help_text(name)))
    assert caps["sglang"]["version"] == name
    assert caps["plugin_api"]["available"] is True
    assert caps["dflash_worker"] == "v2"
    assert caps["ddtree"]["supported"] is True
    assert caps["ddtree"]["registered"] is ("DDTREE" in probe["plugin_algorithms"] and probe["ddtree"]["resolves"])
    assert caps["registered_algorithms"] == probe["builtin_algorithms"] + probe["plugin_algorithms"]
    assert "DFLASH" in caps["help_algorithms"] and caps["help_form"] == "free_text"


def test_summary_when_the_plugin_is_not_installed():
    probe = probe_json("0.5.23")
    probe["entry_points"] = []
    probe["plugin_algorithms"] = []
    probe["ddtree"] = {"installed": False, "version": None, "declared": {}, "last_status": None, "resolves": False}
    caps = s.summarize_capabilities(probe)
    assert caps["ddtree"]["supported"] is True  # by the collection's fallback range >=0.5.14
    assert caps["ddtree"]["range_source"].startswith("specdec.pivot")
    assert caps["ddtree"]["registered"] is False
    assert "not installed" in caps["ddtree"]["reason"]


def test_summary_when_the_plugin_fails_to_load():
    probe = probe_json("0.5.23")
    probe["plugin_algorithms"] = []
    probe["ddtree"]["resolves"] = False
    probe["entry_points"][0].update(loaded=False, error="ModuleNotFoundError: No module named 'sglang_ddtree.sglang'")
    caps = s.summarize_capabilities(probe)
    assert caps["ddtree"]["registered"] is False
    assert "failed: ModuleNotFoundError" in caps["ddtree"]["reason"]


def test_summary_of_a_version_outside_the_plugin_range():
    probe = probe_json("0.5.23")
    probe["sglang"]["version"] = "0.5.30"
    probe["ddtree"]["declared"] = {"spec": ">=0.5.17,<=0.5.23"}  # no unsupported_reason: the spec decides
    caps = s.summarize_capabilities(probe)
    assert caps["ddtree"]["supported"] is False
    assert "outside the DDTree range >=0.5.17,<=0.5.23" in caps["ddtree"]["reason"]


def test_summary_reports_a_failed_help_run():
    caps = s.summarize_capabilities(probe_json("0.5.23"), {"error": "launch_server --help failed (rc=1): boom"})
    assert caps["help_algorithms"] is None
    assert caps["help_error"].endswith("boom")


def test_summary_reports_a_broken_import():
    probe = probe_json("0.5.23")
    probe["sglang"]["error"] = "import sglang failed: PermissionError: [Errno 13] Permission denied: '/nonexistent'"
    caps = s.summarize_capabilities(probe)
    assert caps["ddtree"]["supported"] is False
    assert "PermissionError" in caps["ddtree"]["reason"]
