"""DDTREE's target verify on SGLang's Triton backend: its tree-masked attention calls go to the plugin's kernel
(``_triton_attention.tree_verify_attention``) instead of SGLang's ``extend_attention_fwd``.

``route_verify_attention(backend)`` replaces the backend instance's ``extend_attention_fwd`` attribute (the
function its ``forward_extend`` calls) by a router, before the target's CUDA graphs are captured (the hook on
``TritonAttnBackend.__init__``, hooks.py). The router sends a call to the plugin's kernel only when everything the
call asks for is something that kernel does: a custom (tree) mask whose prefix columns are skipped, page size 1,
no sliding window, sinks, soft cap, score modifier, KV scale or LSE output, K/V pool in the query's dtype, head
dims up to 256, at most 64 query tokens per request. Every other call (prefill, chunked prefill, DFLASH's causal
verify, the drafter's passes: a draft runner's backend is never routed) goes to SGLang's function unchanged.

``SGLANG_DDTREE_VERIFY_ATTENTION=sglang`` keeps SGLang's kernel for DDTREE too (A/B measurement, or a way out).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

ENV = "SGLANG_DDTREE_VERIFY_ATTENTION"
MAX_TOKENS_PER_REQUEST = 64
MAX_HEAD_DIM = 256

__all__ = ["ENV", "route_verify_attention", "routed_call_problem"]

# name -> value the call must have for the plugin's kernel (SGLang's defaults: "nothing extra asked for")
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "logit_cap": (0, 0.0, None),
    "skip_prefix_custom_mask": (True,),
    "sliding_window_size": (-1, None),
    "sinks": (None,),
    "window_kv_offsets": (None,),
    "xai_temperature_len": (-1, None),
    "lse_extend": (None,),
    "skip_prefix": (False,),
    "skip_extend": (False,),
    "page_size": (1, None),
    "score_mod": (None,),
    "aux_tensors": (None,),
    "identity_kv_indices": (False,),
    "k_scale": (1.0, None),
    "v_scale": (1.0, None),
}


def routed_call_problem(get: Callable[[str, Any], Any]) -> str | None:
    """None when the call ``get(name, default)`` describes is one the plugin's kernel computes, else the first
    reason it is not (host-side checks of arguments and shapes only)."""
    if get("custom_mask", None) is None:
        return "no custom mask"
    for name, allowed in _NEUTRAL.items():
        value = get(name, allowed[0])
        if not (value is None or isinstance(value, (int, float, bool))):
            return f"{name} given"
        if value not in allowed:
            return f"{name}={value!r}"
    q, k, v, kb, vb = (get(n, None) for n in ("q_extend", "k_extend", "v_extend", "k_buffer", "v_buffer"))
    if any(t is None for t in (q, k, v, kb, vb)):
        return "missing tensors"
    if q.dim() != 3 or k.dim() != 3 or kb.dim() != 3 or vb.dim() != 3:
        return "not [tokens, heads, dim] tensors"
    if kb.dtype != q.dtype or vb.dtype != q.dtype:
        return f"KV pool dtype {kb.dtype} differs from the query's {q.dtype}"
    if q.shape[-1] != k.shape[-1] or q.shape[1] % k.shape[1] != 0:
        return "query/key heads or dims do not match"
    if max(q.shape[-1], v.shape[-1]) > MAX_HEAD_DIM:
        return f"head dim {max(q.shape[-1], v.shape[-1])} > {MAX_HEAD_DIM}"
    if int(get("max_len_extend", 0) or 0) > MAX_TOKENS_PER_REQUEST:
        return f"more than {MAX_TOKENS_PER_REQUEST} tokens per request"
    return None


def _router(original: Callable[..., Any]) -> Callable[..., Any]:
    from ._triton_attention import tree_verify_attention

    names = list(inspect.signature(original).parameters)
    position = {name: i for i, name in enumerate(names)}

    def routed(*args: Any, **kwargs: Any) -> Any:
        def get(name: str, default: Any) -> Any:
            i = position.get(name)
            if i is not None and i < len(args):
                return args[i]
            return kwargs.get(name, default)

        if routed_call_problem(get) is not None:
            return original(*args, **kwargs)
        q = get("q_extend", None)
        sm_scale = get("sm_scale", None) or q.shape[-1] ** -0.5
        return tree_verify_attention(
            q, get("k_extend", None), get("v_extend", None), get("o_extend", None), get("k_buffer", None),
            get("v_buffer", None), get("qo_indptr", None), get("kv_indptr", None), get("kv_indices", None),
            get("custom_mask", None), get("mask_indptr", None), int(get("max_len_extend", 0)), sm_scale)

    import torch

    # as SGLang wraps its own: torch.compile (--enable-torch-compile) must not trace the host-side routing
    routed = torch.compiler.disable(routed)
    routed.ddtree_original = original  # type: ignore[attr-defined]
    return routed


def route_verify_attention(backend: Any) -> bool:
    """Route ``backend``'s tree-masked extend attention to the plugin's kernel; True when routed. Idempotent."""
    if os.environ.get(ENV, "").strip().lower() == "sglang":
        logger.info("DDTREE verify attention: SGLang's extend kernel (%s=sglang)", ENV)
        return False
    original = getattr(backend, "extend_attention_fwd", None)
    if original is None:
        logger.warning("DDTREE verify attention: %s has no extend_attention_fwd; SGLang's path is kept",
                       type(backend).__name__)
        return False
    if hasattr(original, "ddtree_original"):
        return True
    backend.extend_attention_fwd = _router(original)
    logger.info("DDTREE verify attention: tree-masked verify calls use the plugin's grouped split-prefix kernel")
    return True
