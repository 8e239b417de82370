"""Hooks into SGLang (through ``sglang.srt.plugins.hook_registry.HookRegistry``) that act for DDTREE only.

Every hook calls SGLang's original unchanged unless the algorithm in play is DDTREE, so plain DFLASH (and
every other algorithm) behaves exactly as without the plugin.

* ``spec_utils.spec_need_hidden_states``: SGLang lists the DFLASH family by name ("DFLASH", "DSPARK") as not
  relaying hidden states through the overlap FutureMap; DDTREE (the same family) answers the same.
* ``spec_info.create_dummy_verify_input``: the CUDA-graph capture of the target's TARGET_VERIFY pass must see
  a verify input WITH a custom mask (Triton bakes "mask or no mask" into the captured graph) and the tree's
  topk; DFLASH's dummy has neither.

Other places that compare the literal "DFLASH" gate features DDTREE rejects at start-up or does not offer
(unified-memory pools, replay-SSM, PD disaggregation, aux-hidden-state export, LoRA); see SGLANG.md.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

logger = logging.getLogger(__name__)

SPEC_NEED_HIDDEN_STATES = "sglang.srt.speculative.spec_utils.spec_need_hidden_states"
CREATE_DUMMY_VERIFY_INPUT = "sglang.srt.speculative.spec_info.create_dummy_verify_input"

__all__ = ["CREATE_DUMMY_VERIFY_INPUT", "SPEC_NEED_HIDDEN_STATES", "register_hooks"]


def _configured_algorithm_name(args: tuple, kwargs: dict) -> str | None:
    server_args = kwargs.get("server_args", args[0] if args else None)
    if server_args is not None and hasattr(server_args, "speculative_algorithm"):
        return server_args.speculative_algorithm
    try:
        from sglang.srt.runtime_context import get_spec

        return get_spec().speculative_algorithm
    except Exception:
        return None


def spec_need_hidden_states_hook(original, *args: Any, **kwargs: Any) -> bool:
    from .server_args import ALGORITHM_NAME

    name = _configured_algorithm_name(args, kwargs)
    if name is not None and str(name).upper() == ALGORITHM_NAME:
        return False
    return original(*args, **kwargs)


def create_dummy_verify_input_hook(original, *args: Any, **kwargs: Any):
    from .spec_algo import is_ddtree

    spec_algorithm = kwargs.get("spec_algorithm", args[0] if args else None)
    if not is_ddtree(spec_algorithm):
        return original(*args, **kwargs)
    from .verify_input import dummy_verify_input_for_capture

    # 0.5.17: (spec_algorithm, server_args, custom_mask, num_tokens_per_req, is_draft_worker);
    # 0.5.23: (spec_algorithm, custom_mask, num_tokens_per_req, is_draft_worker).
    names = ["spec_algorithm", "custom_mask", "num_tokens_per_req", "is_draft_worker"]
    if len(args) == 5 or "server_args" in kwargs:
        names.insert(1, "server_args")
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    return dummy_verify_input_for_capture(
        custom_mask=bound.get("custom_mask"),
        num_tokens_per_req=int(bound["num_tokens_per_req"]),
        is_draft_worker=bool(bound["is_draft_worker"]),
    )


def _target_importable(target: str) -> str | None:
    """None when ``target``'s module imports (HookRegistry.apply_hooks imports it the same way), else why not."""
    module = target.rsplit(".", 1)[0]
    try:
        importlib.import_module(module)
    except Exception as exc:  # an environment without the module's own imports: no hook, one clear line
        return f"{type(exc).__name__}: {exc}"
    return None


def register_hooks() -> list[str]:
    """Register the DDTREE hooks whose targets import here; returns the targets registered."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    registered = []
    for target, hook in (
        (SPEC_NEED_HIDDEN_STATES, spec_need_hidden_states_hook),
        (CREATE_DUMMY_VERIFY_INPUT, create_dummy_verify_input_hook),
    ):
        problem = _target_importable(target)
        if problem is not None:
            logger.warning("sglang-ddtree: hook on %s not installed (%s); DDTREE needs it to serve", target, problem)
            continue
        HookRegistry.register(target, hook, HookType.AROUND)
        registered.append(target)
    return registered
