"""Hooks into SGLang (through ``sglang.srt.plugins.hook_registry.HookRegistry``) that act for DDTREE only.

Every hook calls SGLang's original unchanged unless the algorithm in play is DDTREE, so plain DFLASH (and
every other algorithm) behaves exactly as without the plugin.

* ``spec_utils.spec_need_hidden_states``: SGLang lists the DFLASH family by name ("DFLASH", "DSPARK") as not
  relaying hidden states through the overlap FutureMap; DDTREE (the same family) answers the same.
* ``DecodeCudaGraphRunner.get_spec_info``: the verify input the target's TARGET_VERIFY CUDA graphs are
  CAPTURED with. For the DFLASH family SGLang captures without a custom mask on Triton/FlashInfer/FA3/TRT-LLM
  (``dflash_utils._DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS``: a chain is causal), and Triton bakes "mask or
  causal" into the graph: a graph captured that way ignores the tree mask at replay, so every node attends to
  the nodes before it in flattened order, ancestors or not. DDTREE's target graphs are captured with the mask
  buffer and the tree topk instead (the replay copies each step's mask into that buffer).
* ``spec_info.create_dummy_verify_input``: the same for the warm-up/dummy verify input.
* ``TritonAttnBackend.__init__`` (optional: without it DDTREE is as correct and slower): a target runner's Triton
  backend routes its tree-masked verify attention to the plugin's kernel (verify_attention.py), before the
  target's verify graphs are captured.
* ``allocation_sizing.get_req_to_token_extra_context_len``: the ``req_to_token`` rows of a DDTREE server get room
  for the decode's reservation of two verify widths ahead of a request (``kv_rows.py``: SGLang's rows are one
  width narrower, so a request near the context limit would write into the next request's row).
* ``Scheduler.get_internal_state`` (optional: without it only the budget report is missing): on a DDTREE server,
  ``/get_server_info``'s ``internal_states[i]`` gain ``ddtree_budget``, the worker's budget policy and how many
  tree rounds verified each budget so far (``DDTreeWorker.ddtree_budget_state``), as SGLang's own DSpark adds its
  ``dspark_info_record`` there.
* ``TritonGDNKernel.target_verify`` (opt-in, ``SGLANG_DDTREE_OWN_GDN=1``; DDTREE is as correct without it): a
  DDTREE tree verify of a GatedDeltaNet layer runs the plugin's kernel (``gdn_verify.py``; installed only where
  the method's signature is the one it was written for).

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
GRAPH_GET_SPEC_INFO = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.get_spec_info"
TRITON_BACKEND_INIT = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.__init__"
SCHEDULER_INTERNAL_STATE = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
REQ_TO_TOKEN_EXTRA = "sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len"
#: the hooks DDTREE cannot serve without (check-sglang reports each of them)
REQUIRED = (SPEC_NEED_HIDDEN_STATES, CREATE_DUMMY_VERIFY_INPUT, GRAPH_GET_SPEC_INFO, REQ_TO_TOKEN_EXTRA)

__all__ = ["CREATE_DUMMY_VERIFY_INPUT", "GRAPH_GET_SPEC_INFO", "REQUIRED", "REQ_TO_TOKEN_EXTRA",
           "SCHEDULER_INTERNAL_STATE", "SPEC_NEED_HIDDEN_STATES", "TRITON_BACKEND_INIT", "register_hooks"]


def _configured(args: tuple, kwargs: dict, name: str = "speculative_algorithm") -> Any:
    """A speculative server-arg field as the hooked function sees it: from the ``server_args`` it was given
    (0.5.17), else from SGLang's published spec bag (0.5.18+); None when neither has it."""
    server_args = kwargs.get("server_args", args[0] if args else None)
    if server_args is not None and hasattr(server_args, name):
        return getattr(server_args, name)
    try:
        from sglang.srt.runtime_context import get_spec

        return getattr(get_spec(), name)
    except Exception:
        return None


def spec_need_hidden_states_hook(original, *args: Any, **kwargs: Any) -> bool:
    from .server_args import ALGORITHM_NAME

    name = _configured(args, kwargs)
    if name is not None and str(name).upper() == ALGORITHM_NAME:
        return False
    return original(*args, **kwargs)


def create_dummy_verify_input_hook(original, *args: Any, **kwargs: Any):
    from .server_args import is_ddtree

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


def graph_get_spec_info_hook(original, runner, *args: Any, **kwargs: Any):
    """The target's TARGET_VERIFY graphs of DDTREE are captured reading the custom (tree) mask; see above."""
    from .server_args import is_ddtree

    model_runner = runner.model_runner
    if not is_ddtree(model_runner.spec_algorithm) or model_runner.is_draft_worker:
        return original(runner, *args, **kwargs)
    from .verify_input import dummy_verify_input_for_capture

    return dummy_verify_input_for_capture(
        custom_mask=runner.buffers.custom_mask,
        num_tokens_per_req=int(runner.captured_req_width),
        is_draft_worker=False,
    )


def triton_backend_init_hook(original, backend, *args: Any, **kwargs: Any):
    """A target runner's Triton backend under DDTREE sends its tree-masked verify attention to the plugin's
    kernel (verify_attention.py); every other backend is left as SGLang made it."""
    from .server_args import is_ddtree

    result = original(backend, *args, **kwargs)
    model_runner = kwargs.get("model_runner", args[0] if args else None)
    if (model_runner is not None and is_ddtree(getattr(model_runner, "spec_algorithm", None))
            and not getattr(model_runner, "is_draft_worker", False)):
        from .verify_attention import route_verify_attention

        route_verify_attention(backend)
    return result


def req_to_token_extra_hook(original, *args: Any, **kwargs: Any) -> int:
    """SGLang's row headroom, widened on a DDTREE server to hold two verify widths (``kv_rows.py``)."""
    from .kv_rows import required_row_headroom
    from .server_args import ALGORITHM_NAME

    extra = original(*args, **kwargs)
    name = _configured(args, kwargs)
    width = _configured(args, kwargs, "speculative_num_draft_tokens")
    if name is None or str(name).upper() != ALGORITHM_NAME or not width:
        return extra
    return max(int(extra), required_row_headroom(int(width)))


def scheduler_internal_state_hook(original, scheduler, *args: Any, **kwargs: Any):
    """SGLang's internal state (``GetInternalStateReqOutput``), with ``ddtree_budget`` added to its dict when the
    scheduler's speculative worker is DDTREE's. Every other server's answer is SGLang's, untouched."""
    result = original(scheduler, *args, **kwargs)
    budget_state = getattr(getattr(scheduler, "draft_worker", None), "ddtree_budget_state", None)
    state = getattr(result, "internal_state", None)
    if callable(budget_state) and isinstance(state, dict):
        try:
            state["ddtree_budget"] = budget_state()
        except Exception:  # a report must never break the endpoint that carries it
            logger.exception("sglang-ddtree: the budget report for /get_server_info failed")
    return result


def _resolve_owner(owner: str) -> Any:
    """The module ``owner`` names, or the class ``module.Class`` (its module's own import errors propagate)."""
    try:
        return importlib.import_module(owner)
    except ModuleNotFoundError as exc:
        if exc.name != owner:
            raise
        module, _, attr = owner.rpartition(".")
        if not module:
            raise
        try:
            return getattr(importlib.import_module(module), attr)
        except AttributeError:
            raise exc from None


def _target_importable(target: str) -> str | None:
    """None when ``target``'s owner (module or class) resolves as HookRegistry.apply_hooks resolves it, else why
    not."""
    try:
        _resolve_owner(target.rsplit(".", 1)[0])
    except Exception as exc:  # an environment without the module's own imports: no hook, one clear line
        return f"{type(exc).__name__}: {exc}"
    return None


def register_hooks() -> list[str]:
    """Register the DDTREE hooks whose targets import here; returns the targets registered."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .testing import skipped_hooks

    registered = []
    skip = skipped_hooks()  # test-only (SGLANG_DDTREE_TEST_SKIP_HOOKS); empty in production
    for target, hook in (
        (SPEC_NEED_HIDDEN_STATES, spec_need_hidden_states_hook),
        (CREATE_DUMMY_VERIFY_INPUT, create_dummy_verify_input_hook),
        (GRAPH_GET_SPEC_INFO, graph_get_spec_info_hook),
        (TRITON_BACKEND_INIT, triton_backend_init_hook),
        (SCHEDULER_INTERNAL_STATE, scheduler_internal_state_hook),
        (REQ_TO_TOKEN_EXTRA, req_to_token_extra_hook),
    ):
        if hook.__name__.removesuffix("_hook") in skip:
            logger.warning("sglang-ddtree: TEST: hook on %s left out (SGLANG_DDTREE_TEST_SKIP_HOOKS)", target)
            continue
        problem = _target_importable(target)
        if problem is not None:
            need = {TRITON_BACKEND_INIT: "DDTREE's verify attention stays SGLang's",
                    SCHEDULER_INTERNAL_STATE: "/get_server_info does not report DDTREE's budget choices"}.get(
                        target, "DDTREE needs it to serve")
            logger.warning("sglang-ddtree: hook on %s not installed (%s); %s", target, problem, need)
            continue
        HookRegistry.register(target, hook, HookType.AROUND)
        registered.append(target)
    from .gdn_verify import register_gdn_hook

    return registered + register_gdn_hook()
