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
The stand-alone timing of that run (1.1-2.1 ms a call against SGLang's 0.66-0.87 ms) launched both kernels eagerly.
The plugin's launcher looked up SGLang's version on every call, so that timing was most likely host time, not GPU
time. The test now replays CUDA graphs. The deciding measurement is the same engine with and without the opt-in
(``step_cost.py --ab own-gdn:SGLANG_DDTREE_OWN_GDN=1``).

Two modes (``SGLANG_DDTREE_OWN_GDN``): ``1`` stores every node's state as SGLang's kernel does (the store mode);
``replay`` (the record mode) stores none, only each node's inputs to the update (``ReplayRecords``), and the DDTREE
worker's commit calls :func:`replay_before_commit` to rebuild the two states SGLang's commit reads (the last
accepted node's, the tracked node's) before it reads them. A step where SGLang's kernel verified a tree (another
algorithm's, or buffers the record mode does not take: one WARNING line) forgets the records, so the commit never
replays what was not recorded. The record mode needs an fp32 ``intermediate_ssm`` and is not measured on a GPU yet.

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

__all__ = ["ENV", "EXPECTED_PARAMETERS", "RECORDS", "TARGET", "enabled", "install_problem", "make_hook", "mode",
           "register_gdn_hook", "replay_before_commit", "signature_problem"]

_ddtree_here: bool | None = None


def mode(environ: Mapping[str, str] = os.environ) -> str:
    """``SGLANG_DDTREE_OWN_GDN``: "replay" (replay), "store" (1, true, yes, on, plugin) or "sglang" (unset or
    anything else: SGLang's kernel, the default; see the module docstring)."""
    value = environ.get(ENV, "").strip().lower()
    if value == "replay":
        return "replay"
    return "store" if value in ("1", "true", "yes", "on", "plugin") else "sglang"


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """True when ``SGLANG_DDTREE_OWN_GDN`` asks for the plugin's kernel (either mode)."""
    return mode(environ) != "sglang"


def _layer_of(view: Any, base: Any) -> int | None:
    """``l`` when ``view`` is ``base[l]`` (same dtype, shape and strides past the first axis), else None."""
    if base is None or base.dim() != view.dim() + 1 or base.dtype != view.dtype:
        return None
    if tuple(base.shape[1:]) != tuple(view.shape) or tuple(base.stride()[1:]) != tuple(view.stride()):
        return None
    offset, step = view.data_ptr() - base.data_ptr(), base.stride(0) * base.element_size()
    if offset < 0 or offset % step or offset // step >= base.shape[0]:
        return None
    return offset // step


#: Requests of one verify the record mode takes (the row table's length; SGLang pads a graph's batch past its state
#: pool, onto the pool's padding row, so the pool's row count is no bound).
MAX_VERIFY_REQUESTS = 4096


class ReplayRecords:
    """The record mode's buffers, one group per pool of intermediate states (SGLang's ``intermediate_ssm``, all
    layers ``[L, rows, steps, HV, V, K]``, of which each layer's verify gets the view ``[l]``): the records
    ``[L, rows, steps, HV, K + V + 2]`` fp32, ``[L, rows, 2]`` int32 (set, initial-state slot) and each request's
    row (``[MAX_VERIFY_REQUESTS]`` int32, shared by the layers), allocated at the
    first verify of the pool (outside a CUDA graph capture: SGLang's capture runs each width eagerly first). Memory:
    ``(K + V + 2) / (V * K)`` of the intermediate pool, 1.6% at K = V = 128."""

    def __init__(self) -> None:
        self.groups: dict[int, dict[str, Any]] = {}  # intermediate pool's data_ptr -> its tensors
        self.layers: dict[tuple[int, int], tuple[dict[str, Any], int] | None] = {}  # (view ptrs) -> (group, l)

    def for_layer(self, intermediate: Any, states: Any) -> tuple[Any, Any, Any] | None:
        """(records[l], meta[l], rows) for this layer's verify, or None when its buffers are not layer views of one
        fp32 intermediate pool and one state pool (or when a first allocation would fall in a graph capture)."""
        import torch

        key = (intermediate.data_ptr(), states.data_ptr())
        if key not in self.layers:
            pool = intermediate._base if intermediate._base is not None else intermediate.unsqueeze(0)
            state_pool = states._base if states._base is not None else states.unsqueeze(0)
            layer = _layer_of(intermediate, pool)
            if layer is None or layer != _layer_of(states, state_pool) or pool.dtype != torch.float32:
                self.layers[key] = None
                return None
            group = self.groups.get(pool.data_ptr())
            if group is None:
                if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                    return None
                from ._triton_gdn import record_width

                try:
                    group = {"pool": pool, "states": state_pool, "meta": torch.zeros(
                        (*pool.shape[:2], 2), dtype=torch.int32, device=pool.device), "records": torch.empty(
                        (*pool.shape[:4], record_width(pool.shape[-1], pool.shape[-2])), dtype=torch.float32,
                        device=pool.device), "rows": torch.full(
                        (max(pool.shape[1], MAX_VERIFY_REQUESTS),), -1, dtype=torch.int32, device=pool.device)}
                except torch.cuda.OutOfMemoryError:
                    logger.warning("DDTREE GatedDeltaNet record mode: no GPU memory for its records (%s of the "
                                   "intermediate pool's): SGLang's kernel", "1.6%")
                    self.layers[key] = None
                    return None
                self.groups[pool.data_ptr()] = group
            self.layers[key] = (group, layer)
        found = self.layers[key]
        if found is None:
            return None
        group, layer = found
        return group["records"][layer], group["meta"][layer], group["rows"]

    def invalidate(self) -> None:
        """Forget every recorded row (SGLang's kernel stored this step's states: the commit must not replay)."""
        for group in self.groups.values():
            group["meta"].zero_()


#: This process's record-mode buffers (the hook writes them, the DDTREE worker's commit replays them).
RECORDS = ReplayRecords()


def replay_before_commit(path: Any, path_len: Any, last: Any, track: Any = None) -> int:
    """Before SGLang's ``update_mamba_state_after_mtp_verify``: rebuild, in every recorded pool, the states the
    commit reads (``_triton_gdn.gdn_tree_replay``), then forget the records. Returns the launches (0: no record
    mode in this process)."""
    if not RECORDS.groups:
        return 0
    from ._triton_gdn import gdn_tree_replay

    launches = 0
    for group in RECORDS.groups.values():
        gdn_tree_replay(group["records"], group["meta"], group["rows"], group["states"], group["pool"], path, path_len,
                        last, track)
        group["meta"].zero_()
        launches += 2
    return launches


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


def make_hook(reciprocal_norm: bool, replay: bool = False) -> Callable[..., Any]:
    """The AROUND hook of ``TritonGDNKernel.target_verify``; ``reciprocal_norm``: ``versions.gdn_reciprocal_norm``
    of the installed SGLang (decided once, at start-up); ``replay``: the record mode (``RECORDS``), else the store
    mode."""
    from ._triton_gdn import gdn_tree_verify

    announced, refused = [], []

    def gdn_tree_verify_hook(original: Callable[..., Any], kernel: Any, *args: Any, **kwargs: Any) -> Any:
        call = dict(zip(_POSITIONAL, args, strict=False))
        call.update(kwargs)
        routed = _routed_problem(call) is None and ddtree_in_play()
        recorded = RECORDS.for_layer(call["intermediate_states_buffer"], call["ssm_states"]) if routed and replay \
            else None
        if not routed or (replay and recorded is None):
            if routed and not refused:
                refused.append(True)
                logger.warning("DDTREE GatedDeltaNet tree verify: no record mode (%s=replay) for these buffers "
                               "(not layer views of one fp32 intermediate pool): SGLang's kernel", ENV)
            if replay and call.get("retrieve_parent_token") is not None:
                RECORDS.invalidate()  # SGLang's kernel stores this step's states: the commit must not replay
            return original(kernel, *args, **kwargs)
        if not announced:
            announced.append(True)
            logger.info("DDTREE GatedDeltaNet tree verify: the plugin's kernel, %s mode (%s=0 keeps SGLang's)",
                        "record" if replay else "store", ENV)
        extra = {} if recorded is None else dict(zip(("records", "record_meta", "record_rows"), recorded, strict=True))
        return gdn_tree_verify(
            call["A_log"], call["dt_bias"], call["q"], call["k"], call["v"], call["a"], call["b"],
            initial_states=call["ssm_states"], initial_state_indices=call["cache_indices"],
            cu_seqlens=call["query_start_loc"], intermediate_states=call["intermediate_states_buffer"],
            intermediate_state_indices=call["intermediate_state_indices"],
            parents=call["retrieve_parent_token"], reciprocal_norm=reciprocal_norm, **extra)

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

    hook = make_hook(gdn_reciprocal_norm(installed_sglang_version()), replay=mode() == "replay")
    HookRegistry.register(TARGET, hook, HookType.AROUND)
    return [TARGET]
