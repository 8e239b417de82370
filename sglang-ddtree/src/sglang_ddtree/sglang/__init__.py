"""SGLang plugin entry point: ``register()`` makes ``--speculative-algorithm DDTREE`` available.

Declared in ``pyproject.toml`` under the entry-point group ``sglang.srt.plugins`` (``ddtree =
"sglang_ddtree.sglang:register"``); SGLang's ``load_plugins()`` calls ``register()`` in every process (launcher,
engine, schedulers, detokenizer). ``register()`` never raises: on an unsupported SGLang version, or if SGLang's
plugin API is missing, it logs one line and registers nothing, so SGLang starts exactly as without the plugin.
If registration itself raises, the log's FIRST line says so in one line ("sglang-ddtree: DDTREE NOT REGISTERED:
..."), followed by the traceback. Should the installed SGLang ship a native DDTREE (a ``SpeculativeAlgorithm``
member or a registry entry that is not this plugin's), the plugin steps aside with one line and registers
nothing (no algorithm, no hooks). ``ddtree_implementation()`` says which implementation a server will run;
``python -m sglang_ddtree check-sglang`` prints it and exits non-zero when DDTREE is not available.
This module imports nothing from SGLang at import time.
"""

from __future__ import annotations

import logging

from .server_args import ALGORITHM_NAME
from .versions import installed_sglang_version, supported_range_text, unsupported_reason

logger = logging.getLogger("sglang_ddtree")

__all__ = ["ALGORITHM_NAME", "ddtree_implementation", "native_ddtree", "register"]

#: What the last register() call did: "registered", "already-registered", "native: <what>", "skipped: <reason>"
#: or "failed: <error>".
last_status: str | None = None


def _one_line(text: object, limit: int = 300) -> str:
    """``text`` on one line (a multi-line exception message would split the log's first line)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def register() -> None:
    """Register DDTREE with SGLang's speculative-algorithm registry and hook registry. Never raises."""
    global last_status
    try:
        last_status = _register()
    except Exception as exc:  # never break SGLang's start-up, but say so in the log's first line
        last_status = f"failed: {type(exc).__name__}: {_one_line(exc)}"
        logger.error(
            "sglang-ddtree: DDTREE NOT REGISTERED: register() raised %s: %s; --speculative-algorithm DDTREE will "
            "be rejected as unknown, other algorithms are unaffected (traceback follows)",
            type(exc).__name__,
            _one_line(exc),
            exc_info=True,
        )


def native_ddtree() -> str | None:
    """What SGLang itself provides under the name DDTREE, or None: ``"SpeculativeAlgorithm.DDTREE"`` for an enum
    member (a built-in; ``from_string`` resolves it before any registry entry, and the name is reserved), or
    ``"registry entry <class>"`` for a registry entry that is not this plugin's spec class. Imports SGLang."""
    from sglang.srt.speculative import spec_registry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    if ALGORITHM_NAME in SpeculativeAlgorithm.__members__:
        return f"SpeculativeAlgorithm.{ALGORITHM_NAME}"
    existing = spec_registry.get_spec(ALGORITHM_NAME)
    if existing is not None and not _is_plugin_spec(existing):
        return f"registry entry {type(existing).__module__}.{type(existing).__qualname__}"
    return None


def _is_plugin_spec(spec: object) -> bool:
    # By module, so that a spec object of this plugin is recognised without importing spec_algo (which needs the
    # registry API) first.
    return type(spec).__module__ == f"{__name__}.spec_algo"


def ddtree_implementation() -> dict:
    """Which DDTREE a server started from this interpreter runs, as SGLang resolves the name NOW (call after
    ``sglang.srt.plugins.load_plugins()``; the check command does). Returns a JSON-able dict:

    * ``implementation``: ``"plugin"`` (this package's DDTreeSpecAlgo), ``"native"`` (SGLang's own) or ``None``
      (``--speculative-algorithm DDTREE`` would be rejected as unknown);
    * ``detail``: the resolved object's class, or the reason it does not resolve;
    * ``plugin_status``: ``last_status`` of ``register()`` in this process (None: never called, e.g. excluded
      by ``SGLANG_PLUGINS``);
    * ``sglang``, ``supported``: the installed SGLang version and the plugin's supported range.
    Never raises.
    """
    from .versions import installed_sglang_version

    report: dict = {
        "algorithm": ALGORITHM_NAME,
        "implementation": None,
        "detail": None,
        "plugin_status": last_status,
        "sglang": installed_sglang_version(),
        "supported": supported_range_text(),
    }
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        algo = SpeculativeAlgorithm.from_string(ALGORITHM_NAME)
    except Exception as exc:
        report["detail"] = f"{type(exc).__name__}: {_one_line(exc)}"
        return report
    if _is_plugin_spec(algo):
        report["implementation"] = "plugin"
        report["detail"] = f"{type(algo).__module__}.{type(algo).__qualname__}"
    else:
        report["implementation"] = "native"
        report["detail"] = f"{type(algo).__module__}.{type(algo).__qualname__}: {algo!r}"
    return report


def _register() -> str:
    version = installed_sglang_version()
    # A native DDTREE first, on any version: SGLang's own implementation wins and the plugin must not hook it.
    native = _native_or_none() if version is not None else None
    if native is not None:
        logger.warning(
            "sglang-ddtree: sglang %s ships a native %s (%s); the plugin steps aside and registers nothing, "
            "--speculative-algorithm %s runs SGLang's own implementation",
            version, ALGORITHM_NAME, native, ALGORITHM_NAME,
        )
        return f"native: {native}"
    reason = unsupported_reason(version)
    if reason is not None:
        logger.warning("sglang-ddtree: DDTREE not registered: %s (supported: %s)", reason, supported_range_text())
        return f"skipped: {reason}"

    from sglang.srt.speculative import spec_registry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    if not hasattr(SpeculativeAlgorithm, "register"):
        reason = f"sglang {version} has no SpeculativeAlgorithm.register"
        logger.warning("sglang-ddtree: DDTREE not registered: %s", reason)
        return f"skipped: {reason}"
    if spec_registry.get_spec(ALGORITHM_NAME) is not None:
        return "already-registered"

    from .hooks import register_hooks
    from .spec_algo import DDTreeSpecAlgo, worker_factory

    SpeculativeAlgorithm.register(ALGORITHM_NAME, supports_overlap=True, spec_class=DDTreeSpecAlgo)(worker_factory)
    register_hooks()
    logger.info("sglang-ddtree: registered speculative algorithm %s (sglang %s)", ALGORITHM_NAME, version)
    return "registered"


def _native_or_none() -> str | None:
    try:
        return native_ddtree()
    except Exception:  # e.g. a release without the registry module: no native DDTREE either
        return None


def check_sglang(expect: str = "any") -> tuple[int, dict]:
    """The check command's work: run SGLang's own ``load_plugins()`` in this interpreter (as every SGLang
    process does), then report ``ddtree_implementation()`` plus ``ok`` and, for the plugin, which hooks are
    applied. ``expect``: ``"any"`` (plugin or native), ``"plugin"`` or ``"native"``. Returns (exit status,
    report): 0 when DDTREE resolves to the expected implementation, 1 otherwise. Never raises."""
    loaded_error = None
    try:
        from sglang.srt.plugins import load_plugins

        load_plugins()
    except Exception as exc:
        loaded_error = f"load_plugins() failed: {type(exc).__name__}: {_one_line(exc)}"
    report = ddtree_implementation()
    impl = report["implementation"]
    if impl == "plugin":
        report["hooks"] = _applied_hooks()
    ok = impl is not None and (expect == "any" or impl == expect)
    problem = None
    if loaded_error is not None:
        problem = loaded_error
    elif impl is None and report["plugin_status"] is None:
        problem = (
            "load_plugins() never called sglang-ddtree's register(): the plugin is not installed in this "
            "interpreter, SGLANG_PLUGINS is set and does not list 'ddtree', or importing it failed (SGLang then "
            "logs 'Failed to load plugin ddtree')"
        )
    elif impl is None:
        problem = f"DDTREE is not registered: {report['plugin_status']}"
    elif not ok:
        problem = f"DDTREE resolves to the {impl} implementation, expected {expect}"
    elif impl == "plugin" and not all(report["hooks"].values()):
        from .hooks import _target_importable

        missing = sorted(t for t, on in report["hooks"].items() if not on)
        # A hook whose target does not even import in this interpreter (e.g. a CUDA-graph module on a host
        # without a GPU) cannot be judged here: the server imports it at start-up and applies the hook then, and
        # refuses to start without the graph hook (its worker checks). One that imports but is not wrapped failed.
        reasons = {t: _target_importable(t) for t in missing}
        failed = [t for t in missing if reasons[t] is None]
        if failed:
            problem = f"DDTREE is registered but hooks are not applied: {failed}"
            ok = False
        else:
            report["undecided"] = (
                f"cannot be decided on this host: the hook targets {missing} do not import in this interpreter "
                f"({'; '.join(sorted(set(str(r) for r in reasons.values())))}); the server applies them when it "
                "starts, and its DDTREE worker refuses to start without the CUDA-graph hook"
            )
    report["expect"] = expect
    report["ok"] = ok
    report["problem"] = problem
    return (0 if ok else 1), report


def _applied_hooks() -> dict:
    """For each DDTREE hook target: whether SGLang's HookRegistry has wrapped it in this process."""
    from . import hooks

    applied = {}
    for target in hooks.REQUIRED:
        owner, _, attr = target.rpartition(".")
        try:
            applied[target] = hasattr(getattr(hooks._resolve_owner(owner), attr), "__wrapped__")
        except Exception:
            applied[target] = False
    return applied
