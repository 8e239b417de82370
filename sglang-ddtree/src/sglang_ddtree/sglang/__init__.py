"""SGLang plugin entry point: ``register()`` makes ``--speculative-algorithm DDTREE`` available.

Declared in ``pyproject.toml`` under the entry-point group ``sglang.srt.plugins`` (``ddtree =
"sglang_ddtree.sglang:register"``); SGLang's ``load_plugins()`` calls ``register()`` in every process (launcher,
engine, schedulers, detokenizer). ``register()`` never raises: on an unsupported SGLang version, or if SGLang's
plugin API is missing, it logs one line and registers nothing, so SGLang starts exactly as without the plugin.
This module imports nothing from SGLang at import time.
"""

from __future__ import annotations

import logging

from .server_args import ALGORITHM_NAME
from .versions import installed_sglang_version, supported_range_text, unsupported_reason

logger = logging.getLogger("sglang_ddtree")

__all__ = ["ALGORITHM_NAME", "register"]

#: What the last register() call did: "registered", "already-registered", "skipped: <reason>" or "failed: <error>".
last_status: str | None = None


def register() -> None:
    """Register DDTREE with SGLang's speculative-algorithm registry and hook registry. Never raises."""
    global last_status
    try:
        last_status = _register()
    except Exception as exc:  # never break SGLang's start-up
        last_status = f"failed: {type(exc).__name__}: {exc}"
        logger.error(
            "sglang-ddtree: not registering DDTREE (%s); SGLang runs without it", last_status, exc_info=True
        )


def _register() -> str:
    version = installed_sglang_version()
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
    existing = spec_registry.get_spec(ALGORITHM_NAME)
    if existing is not None:
        return "already-registered"

    from .hooks import register_hooks
    from .spec_algo import DDTreeSpecAlgo, worker_factory

    SpeculativeAlgorithm.register(ALGORITHM_NAME, supports_overlap=True, spec_class=DDTreeSpecAlgo)(worker_factory)
    register_hooks()
    logger.info("sglang-ddtree: registered speculative algorithm %s (sglang %s)", ALGORITHM_NAME, version)
    return "registered"
