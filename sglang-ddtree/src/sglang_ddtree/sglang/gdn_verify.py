"""DDTREE's target verify of GatedDeltaNet layers (hybrid targets such as Qwen3.5/3.6): SGLang's
``TritonGDNKernel.target_verify``, called with a tree (``retrieve_parent_token`` given), runs the plugin's kernel
(``_triton_gdn.gdn_tree_verify``) instead of SGLang's ``fused_sigmoid_gating_delta_rule_update``.

Both compute the same outputs and per-node states (``_triton_gdn.py``: bit for bit under Triton's interpreter,
and with SGLang's tile on a GPU); SGLang's reloads the parent's state from the intermediate-state buffer at every
node, the plugin's only where the tree branches. Every other call (no tree: a chain verify, DFLASH's; another
algorithm's tree, e.g. EAGLE's; a layout the kernel does not take) goes to SGLang's method unchanged.

Opt-in (``SGLANG_DDTREE_OWN_GDN=1``), as it has not been shown faster yet. H100, 2026-12-06, Qwen3.6-27B widths,
fp32 states: bit for bit SGLang's on the GPU (batch 32 x 17 tokens). In a 20-layer hybrid-shape engine at batch 32
(CUDA graphs) its kernel took 10.54 ms of GPU time a step. For comparison:
- DFLASH's chain verify in SGLang's kernel took 9.49 ms (16 tokens a request against 17);
- SGLang's kernel in tree mode took 10.70 ms in an earlier run on an H100 (12-06b), in another engine start;
- DDTREE's step was 1.054x DFLASH's, against 1.051x then.
On 2026-12-07 (H100) the CUDA test timed both kernels as CUDA-graph replays at batch 32 x 17: tree 858.7 against
SGLang's 864.8 us, chain 652.5 against 655.6 us, bit for bit. So the plugin's kernel is as fast as SGLang's, not
faster. A record mode, which stored each node's update inputs instead of its state and replayed the accepted path
before the commit, was tried and removed. At batch 32 its verify and replay took 12.51 ms a step against SGLang's
10.80. Its tokens also left the default engine's, so it was not bit for bit there
(bench/results/step-cost-h100-2026-12-07.md).

Installed once at start-up by ``hooks.register_hooks`` (``register_gdn_hook``) when opted in, and only when the
installed SGLang's method has exactly the signature this hook was written against (SGLang 0.5.17 to 0.5.23 all have
it); otherwise one WARNING line says why and SGLang's kernel stays.
"""

from __future__ import annotations

import inspect
import logging
import os
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

ENV = "SGLANG_DDTREE_OWN_GDN"
TARGET = "sglang.srt.layers.attention.linear.kernels.gdn_triton.TritonGDNKernel.target_verify"
_POS = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KW = inspect.Parameter.KEYWORD_ONLY
#: The hooked method's parameters (name, kind) on every supported SGLang release.
EXPECTED_PARAMETERS: tuple[tuple[str, Any], ...] = (
    *((name, _POS) for name in ("self", "A_log", "dt_bias", "q", "k", "v", "a", "b")),
    *((name, _KW) for name in ("ssm_states", "cache_indices", "query_start_loc", "intermediate_states_buffer",
                               "intermediate_state_indices", "cache_steps", "retrieve_parent_token")),
    ("kwargs", inspect.Parameter.VAR_KEYWORD),
)
_POSITIONAL = tuple(name for name, kind in EXPECTED_PARAMETERS[1:] if kind is _POS)
#: Devices the plugin's kernel is launched on (the interpreted tests add "cpu").
DEVICES = {"cuda"}

__all__ = ["ENV", "EXPECTED_PARAMETERS", "TARGET", "enabled", "install_problem", "make_hook", "register_gdn_hook",
           "signature_problem"]

_ddtree_here: bool | None = None


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """True when ``SGLANG_DDTREE_OWN_GDN`` asks for the plugin's kernel (1, true, yes, on, plugin); unset or anything
    else keeps SGLang's (the default: see the module docstring)."""
    return environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on", "plugin")


def signature_problem(method: Callable[..., Any]) -> str | None:
    """None when ``method`` takes exactly ``EXPECTED_PARAMETERS``, else what differs (one line)."""
    try:
        got = tuple((p.name, p.kind) for p in inspect.signature(method).parameters.values())
    except (TypeError, ValueError) as exc:
        return f"its signature cannot be read ({exc})"
    if got == EXPECTED_PARAMETERS:
        return None
    expected = ", ".join(f"{n}:{k.name}" for n, k in EXPECTED_PARAMETERS)
    return f"its signature ({', '.join(f'{n}:{k.name}' for n, k in got)}) is not the expected ({expected})"


def install_problem(environ: Mapping[str, str] = os.environ) -> str | None:
    """None when the hook should be installed in this interpreter, else why not (one line)."""
    if not enabled(environ):
        return f"{ENV}={environ.get(ENV, '')!r} (1 opts in to the plugin's kernel)"
    owner, _, attr = TARGET.rpartition(".")
    try:
        method = getattr(pkgutil.resolve_name(owner), attr)  # as HookRegistry.apply_hooks resolves it
    except Exception as exc:  # a release without the class or the method, or a module that does not import here
        return f"{TARGET} is not available ({type(exc).__name__}: {exc})"
    problem = signature_problem(method)
    if problem is not None:
        return f"{TARGET}: {problem}"
    try:
        from . import _triton_gdn  # noqa: F401  (Triton present)
    except Exception as exc:
        return f"the plugin's kernel does not import ({type(exc).__name__}: {exc})"
    return None


def _spec_algorithm() -> Any:
    """The speculative algorithm this process serves, as SGLang published it (None: not published yet)."""
    try:
        from sglang.srt.runtime_context import get_spec

        return get_spec().speculative_algorithm
    except Exception:
        return None


def ddtree_in_play() -> bool:
    """Whether this process serves DDTREE (decided once SGLang has published its server arguments)."""
    global _ddtree_here
    if _ddtree_here is None:
        from .server_args import ALGORITHM_NAME

        name = _spec_algorithm()
        if name is None:
            return False
        _ddtree_here = str(name).upper() == ALGORITHM_NAME
    return _ddtree_here


def _routed_problem(call: Mapping[str, Any]) -> str | None:
    """None when the plugin's kernel computes this call, else why not (host-side checks only)."""
    if call.get("retrieve_parent_token") is None:
        return "no tree"
    q, state, buffer, slots = (call.get(n) for n in ("q", "ssm_states", "intermediate_states_buffer",
                                                     "intermediate_state_indices"))
    if state is None or buffer is None or slots is None or call.get("query_start_loc") is None:
        return "no state, intermediate buffer or sequence offsets"
    if q.dim() != 4 or q.shape[0] != 1 or q.device.type not in DEVICES:
        return "not a flattened [1, T, H, K] batch on a supported device"
    if state.dim() != 4 or buffer.dim() != 5:
        return "state pools not [slots, HV, V, K] / [slots, steps, HV, V, K]"
    return None


def make_hook(reciprocal_norm: bool) -> Callable[..., Any]:
    """The AROUND hook of ``TritonGDNKernel.target_verify``; ``reciprocal_norm``: ``versions.gdn_reciprocal_norm``
    of the installed SGLang (decided once, at start-up)."""
    from ._triton_gdn import gdn_tree_verify

    announced = []

    def gdn_tree_verify_hook(original: Callable[..., Any], kernel: Any, *args: Any, **kwargs: Any) -> Any:
        call = dict(zip(_POSITIONAL, args, strict=False))
        call.update(kwargs)
        if _routed_problem(call) is not None or not ddtree_in_play():
            return original(kernel, *args, **kwargs)
        if not announced:
            announced.append(True)
            logger.info("DDTREE GatedDeltaNet tree verify: the plugin's kernel (%s=0 keeps SGLang's)", ENV)
        return gdn_tree_verify(
            call["A_log"], call["dt_bias"], call["q"], call["k"], call["v"], call["a"], call["b"],
            initial_states=call["ssm_states"], initial_state_indices=call["cache_indices"],
            cu_seqlens=call["query_start_loc"], intermediate_states=call["intermediate_states_buffer"],
            intermediate_state_indices=call["intermediate_state_indices"],
            parents=call["retrieve_parent_token"], reciprocal_norm=reciprocal_norm)

    return gdn_tree_verify_hook


def register_gdn_hook() -> list[str]:
    """Register the hook with SGLang's HookRegistry when ``install_problem()`` finds nothing against it; returns the
    targets registered (``[TARGET]`` or ``[]``). A refusal is one log line here, at start-up, never per call."""
    problem = install_problem()
    if problem is not None:
        level = logging.INFO if not enabled() else logging.WARNING
        logger.log(level, "sglang-ddtree: DDTREE's GatedDeltaNet tree verify stays SGLang's kernel: %s", problem)
        return []
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .versions import gdn_reciprocal_norm, installed_sglang_version

    HookRegistry.register(TARGET, make_hook(gdn_reciprocal_norm(installed_sglang_version())), HookType.AROUND)
    return [TARGET]
