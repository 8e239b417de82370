"""Reading the recorded SGLang fixtures (``launch_server --help``, ``systemctl show`` and unit files, the probe's
JSON), shared by the tests of the module_utils that parse them.
"""

from __future__ import annotations

import json
from pathlib import Path

FIX = Path(__file__).resolve().parent / "fixtures"
HELP = FIX / "sglang_help"
SHOW = FIX / "systemctl_show"
PROBE = FIX / "sglang_probe"


def help_text(version: str) -> str:
    text = (HELP / f"sglang-{version}.txt").read_text()
    header, sep, body = text.partition("# --- help text below ---\n")
    assert sep and f"# sglang: {version} " in header, "fixture header must say which version it is"
    return body


def show_text(name: str) -> str:
    return "".join(ln for ln in (SHOW / f"{name}.txt").read_text().splitlines(True) if not ln.startswith("# "))


def probe_json(name: str) -> dict:
    return json.loads((PROBE / f"probe-{name}.json").read_text())


def unit_file(name: str) -> str:
    return (SHOW / "units" / f"{name}.service").read_text()
