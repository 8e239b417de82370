"""The SGLang versions this plugin supports, declared in ONE place, and the small adapters over their differences.

The plugin was built against the plugin registry (``SpeculativeAlgorithm.register``, the ``sglang.srt.plugins``
entry points, ``HookRegistry``) and the ``DFlashWorkerV2`` of SGLang 0.5.17 and 0.5.23. The declared range is
the closed interval [0.5.17, 0.5.23], every release on PyPI from 0.5.17 to the newest (checked 2026-12-03): CI
runs the registration, server-args, fail-loudly and DFLASH-branch tests against the real wheel of each release
(0.5.17 to 0.5.22 in ``.venv-sglang-<version>``, 0.5.23 in ``.venv``) and the whole glue suite against 0.5.17
and 0.5.23. Anything else (older: no registry or no V2 worker; newer: unaudited internals) makes ``register()``
log one line and register nothing.

Differences handled here (and only here):

* server-args resolution: 0.5.17 mutates ``ServerArgs`` in ``__post_init__``; 0.5.23 records declarations
  (``declare_resolution``) during ``ServerArgs.resolve_once()`` and hands a plugin's ``handle_server_args`` a
  recorder whose attribute writes become declarations. Plain ``getattr``/``setattr`` work on both, which is
  all the plugin's server-arg handling uses.
* reading a resolved field after resolution (``resolution_result`` on 0.5.23, the attribute on 0.5.17).
* attention data parallelism: ``attn_dp_enabled_of`` (0.5.23) versus ``enable_dp_attention`` (0.5.17).
* the q/k L2 norm of SGLang's GatedDeltaNet recurrent kernel: ``x / sqrt(s)`` up to 0.5.21, ``x * (1 / sqrt(s))``
  from 0.5.22 (``gdn_reciprocal_norm``); the plugin's tree-verify kernel (``_triton_gdn.py``) follows the installed
  release so that its results stay SGLang's bit for bit.
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any

#: Inclusive bounds of the supported SGLang releases.
MIN_SGLANG = "0.5.17"
MAX_SGLANG = "0.5.23"

__all__ = [
    "MAX_SGLANG",
    "MIN_SGLANG",
    "attn_dp_enabled",
    "gdn_reciprocal_norm",
    "installed_sglang_version",
    "parse_release",
    "resolved_field",
    "supported_range_text",
    "unsupported_reason",
]


def parse_release(version: str) -> tuple[int, ...] | None:
    """The numeric release tuple of a version string (``"0.5.17.post1"`` -> ``(0, 5, 17)``), or None."""
    match = re.match(r"^\s*v?(\d+(?:\.\d+)*)", str(version))
    if not match:
        return None
    return tuple(int(part) for part in match.group(1).split("."))


def _patch_key(release: tuple[int, ...]) -> tuple[int, ...]:
    """(major, minor, patch) of a parsed release: a post/dev suffix of a patch release is that release."""
    return ((*release, 0, 0, 0))[:3]


def supported_range_text() -> str:
    return f"{MIN_SGLANG} to {MAX_SGLANG} (inclusive)"


def unsupported_reason(version: str | None) -> str | None:
    """None when ``version`` is supported, else one line saying why not and what to do."""
    if version is None:
        return "sglang is not installed in this interpreter"
    release = parse_release(version)
    if release is None:
        return f"cannot read the sglang version {version!r}"
    low, high = parse_release(MIN_SGLANG), parse_release(MAX_SGLANG)
    assert low is not None and high is not None
    key = _patch_key(release)
    if key < low:
        return (
            f"sglang {version} is older than {MIN_SGLANG} (no DFlashWorkerV2 or no plugin algorithm registry); "
            f"upgrade sglang to {supported_range_text()}"
        )
    if key > high:
        return (
            f"sglang {version} is newer than {MAX_SGLANG}, the newest release this plugin was built and tested "
            f"against; use sglang {supported_range_text()} or a newer sglang-ddtree"
        )
    return None


def installed_sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def resolved_field(server_args: Any, name: str) -> Any:
    """A field's final value after SGLang's server-args resolution, on either version."""
    try:
        from sglang.srt.arg_groups.overrides import resolution_result
    except ImportError:  # pragma: no cover - every supported release has it; keep the attribute fallback
        return getattr(server_args, name)
    if hasattr(server_args, "resolve_once"):
        return resolution_result(server_args, name)
    return getattr(server_args, name)


def attn_dp_enabled(cfg: Any) -> bool:
    """Whether attention data parallelism is configured, on either version."""
    try:
        from sglang.srt.runtime_context import attn_dp_enabled_of
    except ImportError:
        attn_dp_enabled_of = None
    if attn_dp_enabled_of is not None:
        try:
            return bool(attn_dp_enabled_of(cfg))
        except Exception:  # a view missing a field the helper reads: fall back to the plain flag
            pass
    return bool(getattr(cfg, "enable_dp_attention", False))


def gdn_reciprocal_norm(version: str | None) -> bool:
    """Whether SGLang ``version``'s GatedDeltaNet recurrent kernel L2-normalises q and k by multiplying with the
    reciprocal root (0.5.22 and later) rather than dividing by the root (0.5.17 to 0.5.21)."""
    release = parse_release(version or "")
    return release is not None and _patch_key(release) >= (0, 5, 22)
