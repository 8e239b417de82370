# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What an SGLang installation can do, and whether DDTree can run on it.

- Facts about SGLang releases: ``ENTRY_POINTS_MIN_VERSION``, ``PLUGIN_API_MIN_VERSION``, ``PLUGIN_GROUP``, the
  DDTree range the collection assumes when the plugin cannot say (``DDTREE_SUPPORTED_SPEC``).
- ``parse_help_algorithms`` reads ``--speculative-algorithm`` from ``launch_server --help`` in both forms SGLang has
  printed: argparse choices ``{DFLASH,EAGLE,...}`` (0.5.10, 0.5.11) and the free text ``Builtins: ... Or any name
  registered via SpeculativeAlgorithm.register`` (0.5.12+); ``help_option`` names the form.
- ``summarize_capabilities`` turns the probe's JSON (plugins/module_utils/_sglang_probe.py) and the parsed help into
  the module's result.

Data in, data out (tests/unit/plugins/module_utils/test_sglang_caps.py).
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.specdec.pivot.plugins.module_utils._versions import version_satisfies

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
    wheel = ddt.get("wheel") or None
    if is_registered and wheel:
        reasons.append(
            f"DDTREE registers with the plugin wheel {wheel.get('path')} on the path (sglang {version}, sglang-ddtree "
            f"{wheel.get('version')}; installed: {ddt.get('version') or 'none'})"
        )
    elif is_registered:
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
        "wheel": wheel,
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
