# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The script sglang_capabilities runs INSIDE the SGLang environment's interpreter.

``PROBE_SOURCE`` is passed as ``<python> -c PROBE_SOURCE`` (an argv list, no shell). It:

- reads the interpreter (executable, version, prefix, venv or not) and its site-packages;
- finds sglang WITHOUT importing it first (``importlib.util.find_spec``) and reads versions from
  distribution metadata (sglang, torch, sglang-ddtree), so a broken install is still reported;
- lists the entry points of group ``sglang.srt.plugins`` (name, value, dist, dist version);
- imports ``sglang.srt.plugins`` and calls SGLang's own ``load_plugins()`` (0.5.11+) while capturing
  that module's log records, so each plugin's fate is known (loaded / executed / failed + the error);
- reads ``SpeculativeAlgorithm`` (builtin members), whether ``SpeculativeAlgorithm.register`` exists
  (0.5.12+), the plugin registry (``spec_registry._REGISTRY``) and whether ``from_string("DDTREE")``
  resolves;
- finds which DFLASH worker module exists by module spec only (``dflash_worker_v2`` = v2,
  ``dflash_worker`` = v1, neither = none): the worker modules themselves are never imported;
- reads the DDTree plugin's own supported range from ``sglang_ddtree.sglang.versions`` when importable
  (``MIN_SGLANG``/``MAX_SGLANG`` inclusive, ``unsupported_reason(version)``, ``supported_range_text()``)
  and the plugin's ``last_status`` after ``load_plugins()``.

With ``--request-stdin`` (after ``-c PROBE_SOURCE``) it reads a JSON request on stdin (never the command line:
it may hold the server's keys) and, in the same process, so that SGLang is imported once for all of them:

- ``wheel``: puts that plugin wheel first on ``sys.path`` after the facts of what is installed are read
  (``ddtree.installed``/``version``) and before SGLang is imported: ``load_plugins()`` and the rest see the plugin
  the pivot will install, as ``PYTHONPATH=WHEEL python -m sglang_ddtree ...`` would (nothing is installed);
- ``drafter``: the plugin's ``check-drafter PATH --consumer sglang`` (``sglang_ddtree.drafter_config``);
- ``check_sglang``: the plugin's ``check-sglang --expect any`` (``sglang_ddtree.sglang.check_sglang``);
- ``server_args``: ``{"source": ..., "words": [...]}``: ``check_server_args(words)`` of module_utils
  ``_server_args`` (its source, run here) on the new command line.

Each check's outcome is ``plugin_checks.NAME``: ``{"rc", "stdout", "stderr"}`` as the CLI command would print
them (its JSON report on stdout, exit status 0 or 1), or for ``server_args`` the verdict itself.

Every step is guarded: on an old or broken SGLang the step's fact is null/false and a line is added to
``errors``; the script always prints exactly one line ``SPECDEC_SGLANG_PROBE_JSON:{...}`` on the original
stdout (everything the imported code prints is moved to stderr) and exits 0. It needs Python 3.8+
(f-strings, importlib.metadata) and nothing outside the standard library except what it probes.
"""

from __future__ import annotations

#: The line prefix of the probe's JSON on stdout.
PROBE_MARKER = "SPECDEC_SGLANG_PROBE_JSON:"

PROBE_SOURCE = r"""
import json
import os
import sys

MARKER = "SPECDEC_SGLANG_PROBE_JSON:"
_out = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # whatever imported code prints goes to stderr; stdout carries only the JSON line

result = {"probe_version": 1, "errors": []}
REQUEST = {}


def _err(where, exc):
    result["errors"].append(f"{where}: {type(exc).__name__}: {exc}")


def _exc_line(exc_info):
    if not exc_info or exc_info[1] is None:
        return None
    exc = exc_info[1]
    return f"{type(exc).__name__}: {exc}"


def _main():
    import importlib
    import importlib.util
    import platform
    import site
    import sysconfig

    try:
        import importlib.metadata as md
    except ImportError:  # Python < 3.8
        md = None

    def dist_version(name):
        if md is None:
            return None
        try:
            return md.version(name)
        except Exception:
            return None

    def find(name):
        try:
            return importlib.util.find_spec(name)
        except Exception as exc:  # a parent package failed to import
            _err(f"find_spec({name})", exc)
            return None

    result["python"] = {
        "path": sys.executable,
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "prefix": sys.prefix,
        "base_prefix": getattr(sys, "base_prefix", sys.prefix),
        "in_venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
    }
    paths = []
    try:
        paths.append(sysconfig.get_paths()["purelib"])
    except Exception as exc:
        _err("sysconfig", exc)
    try:
        paths.extend(site.getsitepackages())
    except Exception as exc:
        _err("site.getsitepackages", exc)
    seen = []
    for p in paths:
        if p not in seen and os.path.isdir(p):
            seen.append(p)
    result["site_packages"] = seen
    result["torch_version"] = dist_version("torch")

    # What is installed, before a requested wheel is put on sys.path.
    ddt = {
        "installed": find("sglang_ddtree") is not None,
        "version": dist_version("sglang-ddtree"),
        "declared": {},
        "last_status": None,
        "resolves": False,
        "wheel": None,
    }
    wheel = REQUEST.get("wheel")
    if wheel:
        if os.path.isfile(wheel):
            sys.path.insert(0, wheel)
            importlib.invalidate_caches()
            ddt["wheel"] = {"path": wheel, "version": dist_version("sglang-ddtree")}
        else:
            _err("wheel", FileNotFoundError(f"{wheel} is not a file"))

    spec = find("sglang")
    sg = {"installed": spec is not None, "version": dist_version("sglang"), "location": None, "error": None}
    result["sglang"] = sg
    if spec is not None:
        locs = list(spec.submodule_search_locations or [])
        sg["location"] = locs[0] if locs else spec.origin
    if sg["installed"] and sg["version"] is None:
        try:
            from sglang.version import __version__

            sg["version"] = __version__
        except Exception as exc:
            _err("sglang.version", exc)

    group = "sglang.srt.plugins"
    eps = []
    if md is not None:
        try:
            all_eps = md.entry_points()
            selected = all_eps.select(group=group) if hasattr(all_eps, "select") else all_eps.get(group, [])
            for ep in selected:
                dist = getattr(ep, "dist", None)
                eps.append({
                    "group": group,
                    "name": ep.name,
                    "value": ep.value,
                    "dist": dist.metadata["Name"] if dist is not None else None,
                    "dist_version": dist.version if dist is not None else None,
                    "loaded": None,
                    "executed": None,
                    "error": None,
                })
        except Exception as exc:
            _err("entry_points", exc)
    result["entry_points"] = eps

    result["plugins_module"] = False
    result["load_plugins"] = None
    result["register_api"] = False
    result["builtin_algorithms"] = []
    result["plugin_algorithms"] = []
    result["dflash_worker"] = "none"
    result["dflash_worker_module"] = None
    result["ddtree"] = ddt
    if not sg["installed"]:
        return

    # sglang itself: importing any submodule runs sglang/__init__ (heavy, but it is what the server does)
    try:
        import sglang  # noqa: F401
    except BaseException as exc:
        sg["error"] = f"import sglang failed: {type(exc).__name__}: {exc}"
        return

    plugins = None
    if find("sglang.srt.plugins") is not None:
        try:
            plugins = importlib.import_module("sglang.srt.plugins")
            result["plugins_module"] = hasattr(plugins, "load_plugins")
        except BaseException as exc:
            _err("import sglang.srt.plugins", exc)

    if result["plugins_module"]:
        import logging

        records = []

        class _Capture(logging.Handler):
            def emit(self, record):
                records.append(record)

        logger = logging.getLogger(plugins.__name__)
        handler = _Capture(level=logging.DEBUG)
        old_level = logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        try:
            plugins.load_plugins()
            result["load_plugins"] = "ok"
        except BaseException as exc:
            result["load_plugins"] = "failed"
            _err("load_plugins", exc)
        finally:
            logger.removeHandler(handler)
            logger.setLevel(old_level)
        by_name = {ep["name"]: ep for ep in eps}
        for rec in records:
            msg = str(rec.msg)
            name = rec.args[0] if isinstance(rec.args, tuple) and rec.args else None
            ep = by_name.get(name)
            if ep is None:
                continue
            if msg.startswith("Loaded plugin"):
                ep["loaded"] = True
            elif msg.startswith("Failed to load plugin"):
                ep["loaded"] = False
                ep["error"] = _exc_line(rec.exc_info) or rec.getMessage()
            elif msg.startswith("Executed general plugin"):
                ep["executed"] = True
            elif msg.startswith("Failed to execute general plugin"):
                ep["executed"] = False
                ep["error"] = _exc_line(rec.exc_info) or rec.getMessage()
            elif msg.startswith("Skipping plugin"):
                ep["loaded"] = False
                ep["error"] = rec.getMessage()

    algo = None
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm as algo
    except BaseException as exc:
        _err("import SpeculativeAlgorithm", exc)
    if algo is not None:
        try:
            result["builtin_algorithms"] = [m.name for m in algo if m.name != "NONE"]
        except Exception as exc:
            _err("SpeculativeAlgorithm members", exc)
        result["register_api"] = callable(getattr(algo, "register", None))
        registry = None
        if find("sglang.srt.speculative.spec_registry") is not None:
            try:
                registry = importlib.import_module("sglang.srt.speculative.spec_registry")
            except BaseException as exc:
                _err("import spec_registry", exc)
        if registry is not None:
            aliases = getattr(registry, "_RESERVED_ALIASES", None)
            if aliases is None:
                aliases = getattr(registry, "_RESERVED_NAMES", ())
            for name in sorted(aliases):
                if name != "NONE" and name not in result["builtin_algorithms"]:
                    result["builtin_algorithms"].append(name)
            result["plugin_algorithms"] = sorted(getattr(registry, "_REGISTRY", {}) or {})
        try:
            algo.from_string("DDTREE")
            ddt["resolves"] = True
        except Exception:
            ddt["resolves"] = False

    if find("sglang.srt.speculative.dflash_worker_v2") is not None:
        result["dflash_worker"] = "v2"
        result["dflash_worker_module"] = "sglang.srt.speculative.dflash_worker_v2"
    elif find("sglang.srt.speculative.dflash_worker") is not None:
        result["dflash_worker"] = "v1"
        result["dflash_worker_module"] = "sglang.srt.speculative.dflash_worker"

    if ddt["installed"] or ddt["wheel"]:
        try:
            glue = sys.modules.get("sglang_ddtree.sglang")
            if glue is not None:
                ddt["last_status"] = getattr(glue, "last_status", None)
        except Exception as exc:
            _err("sglang_ddtree.sglang.last_status", exc)
        try:
            versions = importlib.import_module("sglang_ddtree.sglang.versions")
            declared = {}
            low = getattr(versions, "MIN_SGLANG", None)
            high = getattr(versions, "MAX_SGLANG", None)
            if low and high:
                declared["spec"] = f">={low},<={high}"
            elif low:
                declared["spec"] = f">={low}"
            declared["min"] = low
            declared["max"] = high
            if callable(getattr(versions, "supported_range_text", None)):
                declared["range_text"] = versions.supported_range_text()
            if callable(getattr(versions, "unsupported_reason", None)):
                declared["unsupported_reason"] = versions.unsupported_reason(sg["version"])
                declared["has_unsupported_reason"] = True
            tested = getattr(versions, "TESTED_SGLANG", None)
            if tested:
                declared["tested"] = list(tested)
            ddt["declared"] = declared
        except BaseException as exc:
            _err("sglang_ddtree.sglang.versions", exc)


def _tail(text, lines=6):
    return "\n".join(str(text).strip().splitlines()[-lines:])


# The environment's SGLANG_DDTREE_BUDGET against the widest budget and the drafter's block size, with the plugin's
# own parser (what the server runs at start).
def _budget_check(drafter):
    import os

    out = {"checked": False, "ok": None, "value": os.environ.get("SGLANG_DDTREE_BUDGET"), "candidates": None,
           "error": "", "reason": ""}
    try:
        from sglang_ddtree.budget import BUDGET_ENV, parse_budget_option
    except ImportError as exc:
        out["reason"] = "this plugin has no per-step budget (" + type(exc).__name__ + ": " + str(exc) + ")"
        return out
    out["value"] = os.environ.get(BUDGET_ENV)
    try:
        block = int(json.loads((drafter or {}).get("stdout") or "{}").get("spec", {}).get("block_size") or 0)
    except (TypeError, ValueError):
        block = 0
    if block < 1:
        out["reason"] = "the drafter's block size is unknown (its check gave no spec)"
        return out
    out["checked"] = True
    try:
        candidates = parse_budget_option(out["value"], int(REQUEST["budget"]), block)
    except ValueError as exc:
        out.update(ok=False, error=str(exc))
        return out
    out.update(ok=True, candidates=None if candidates is None else list(candidates))
    return out


def _plugin_checks():
    import traceback

    checks = {}
    result["plugin_checks"] = checks
    if REQUEST.get("drafter"):
        try:
            import pathlib

            from sglang_ddtree.drafter_config import check_drafter_dir

            report = check_drafter_dir(pathlib.Path(REQUEST["drafter"]), "sglang")
            checks["drafter"] = {"rc": 0 if report.get("ok") else 1, "stderr": "",
                                 "stdout": json.dumps(report, sort_keys=True, default=str)}
        except BaseException:
            checks["drafter"] = {"rc": 1, "stdout": "", "stderr": _tail(traceback.format_exc())}
    if REQUEST.get("budget") is not None:
        checks["budget"] = _budget_check(checks.get("drafter"))
    if REQUEST.get("check_sglang"):
        try:
            from sglang_ddtree.sglang import check_sglang

            status, report = check_sglang("any")
            problem = report.get("problem")
            checks["sglang"] = {"rc": status, "stdout": json.dumps(report, sort_keys=True, default=str),
                                "stderr": f"sglang-ddtree: {problem}" if problem else ""}
        except BaseException:
            checks["sglang"] = {"rc": 1, "stdout": "", "stderr": _tail(traceback.format_exc())}
    args = REQUEST.get("server_args")
    if isinstance(args, dict):
        try:
            namespace = {"__name__": "specdec_server_args"}
            exec(compile(args["source"], "_server_args.py", "exec"), namespace)
            checks["server_args"] = namespace["check_server_args"]([str(w) for w in args["words"]])
        except BaseException as exc:
            checks["server_args"] = {"checked": False, "ok": None, "error": "", "algorithm": None,
                                     "algorithm_resolved": None,
                                     "reason": f"the check did not run: {type(exc).__name__}: {exc}"}


if "--request-stdin" in sys.argv[1:]:
    try:
        REQUEST = json.loads(sys.stdin.read() or "{}")
    except BaseException as exc:
        _err("request", exc)
try:
    _main()
except BaseException as exc:  # never crash: report what broke
    _err("probe", exc)
if REQUEST:
    try:
        _plugin_checks()
    except BaseException as exc:
        _err("plugin_checks", exc)
_out.write(MARKER + json.dumps(result, default=str) + "\n")
_out.flush()
"""


def parse_probe_output(stdout: str, marker: str = PROBE_MARKER) -> dict | None:
    """The JSON object on a child's stdout: its last ``marker`` line (the SGLang probe's by default; the server-args
    check's with ``_server_args.MARKER``), or None when that line is missing/unreadable."""
    import json

    for line in reversed((stdout or "").splitlines()):
        if line.startswith(marker):
            try:
                data = json.loads(line[len(marker) :])
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None
