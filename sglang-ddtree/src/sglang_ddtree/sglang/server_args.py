"""Server-argument handling for ``--speculative-algorithm DDTREE``.

Equivalent to SGLang's DFLASH handling (``arg_groups/speculative_hook._handle_dflash``) with these differences:

* ``--speculative-num-draft-tokens`` is the verify width ``budget + 1`` (default budget 16, so 17), not the
  drafter's block size; the block size always comes from the drafter's config (``dflash_config.block_size``
  or a top-level ``block_size``) and is carried to the worker processes in ``speculative_dflash_block_size``.
* ``speculative_num_steps`` = block size - 1 (the deepest node a tree can have) and ``speculative_eagle_topk``
  = ``TREE_TOPK`` (> 1), so SGLang's attention and linear-attention backends take their tree paths (custom
  mask, ``retrieve_next_token`` / ``retrieve_next_sibling`` parents) and the KV reservation per decode step
  covers both the drafter block and the tree.
* configurations DDTREE does not support fail here, at start-up, with a message naming the option.

Only ``getattr``/``setattr`` are used on the object SGLang passes, which is the ``ServerArgs`` itself on 0.5.17
and a recorder that turns writes into resolution declarations on 0.5.23 (see ``versions.py``). SGLang is
imported lazily, so this module imports without SGLang.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

ALGORITHM_NAME = "DDTREE"

#: Default node budget N (draft nodes per tree, the root excluded): --speculative-num-draft-tokens 17.
DEFAULT_BUDGET = 16
#: Supported node budgets. The verify pass has budget + 1 tokens per request; 63 keeps it at 64 tokens, the
#: width up to which the tree mask buffers stay small next to the KV cache.
MIN_BUDGET = 1
MAX_BUDGET = 63
#: speculative_eagle_topk announced to SGLang: any value > 1 switches the backends to tree metadata.
TREE_TOPK = 2
#: Target attention backends whose TARGET_VERIFY is PROVEN to apply DDTREE's per-request tree mask (layout
#: [num_nodes, prefix_len + num_nodes] per request, row-major, requests concatenated) both eagerly and in the
#: captured CUDA graphs (graph replay vs eager logits, bench/gpu/lossless.py). Triton only: FlashInfer reads the
#: mask through ``DFlashVerifyInput.generate_attn_arg_prefill`` eagerly, but its captured graphs were never run
#: with a tree on a GPU (its JIT build outlasts the test machine's call limit), so it is refused, not assumed.
SUPPORTED_ATTENTION_BACKENDS = ("triton",)
#: Drafter attention backends (the drafter pass is DFLASH's, unchanged).
SUPPORTED_DRAFT_ATTENTION_BACKENDS = ("triton", "flashinfer", "fa3", "fa4", "trtllm_mha")
#: Architectures of DFlash drafters.
DFLASH_DRAFTER_ARCHITECTURES = ("DFlashDraftModel",)
#: Default max running requests when unset (as DFLASH).
DEFAULT_MAX_RUNNING_REQUESTS = 48

__all__ = [
    "ALGORITHM_NAME",
    "DEFAULT_BUDGET",
    "MAX_BUDGET",
    "MIN_BUDGET",
    "SUPPORTED_ATTENTION_BACKENDS",
    "TREE_TOPK",
    "DDTreeConfigError",
    "DrafterInfo",
    "budget_from_num_draft_tokens",
    "current_block_size",
    "handle_ddtree_server_args",
    "is_ddtree",
    "lm_head_refusal",
    "page_size_message",
    "read_drafter_info",
]


class DDTreeConfigError(ValueError):
    """A DDTREE start-up configuration error (a ValueError, like SGLang's own server-arg errors)."""


@dataclass(frozen=True)
class DrafterInfo:
    architectures: tuple[str, ...]
    block_size: int


def is_ddtree(spec_algorithm: Any) -> bool:
    """True only for the registered DDTREE algorithm object (``spec_algo.DDTreeSpecAlgo``; never for DFLASH or any
    other): it carries the class attribute ``is_ddtree_algorithm = True``, so the hooks ask without importing
    the spec module (which imports the worker, which reads the hooks' target names)."""
    return getattr(type(spec_algorithm), "is_ddtree_algorithm", False) is True


def budget_from_num_draft_tokens(num_draft_tokens: Any) -> int:
    """The node budget for a ``--speculative-num-draft-tokens`` value (None: the default budget)."""
    if num_draft_tokens is None:
        return DEFAULT_BUDGET
    try:
        value = int(num_draft_tokens)
    except (TypeError, ValueError):
        raise DDTreeConfigError(
            f"--speculative-num-draft-tokens={num_draft_tokens!r} is not an integer; DDTREE takes the node budget "
            f"plus one, e.g. --speculative-num-draft-tokens {DEFAULT_BUDGET + 1} for the default budget "
            f"{DEFAULT_BUDGET}"
        ) from None
    budget = value - 1
    if not MIN_BUDGET <= budget <= MAX_BUDGET:
        raise DDTreeConfigError(
            f"--speculative-num-draft-tokens={value} gives a DDTREE node budget of {budget}; DDTREE supports budgets "
            f"{MIN_BUDGET}..{MAX_BUDGET}, i.e. --speculative-num-draft-tokens {MIN_BUDGET + 1}..{MAX_BUDGET + 1} "
            f"(budget + 1; default {DEFAULT_BUDGET + 1})"
        )
    return budget


def _load_draft_hf_config(cfg: Any) -> Any:
    from sglang.srt.utils.hf_transformers_utils import get_config

    override = getattr(cfg, "json_model_override_args", None) or "{}"
    return get_config(
        cfg.speculative_draft_model_path,
        trust_remote_code=bool(getattr(cfg, "trust_remote_code", False)),
        revision=getattr(cfg, "speculative_draft_model_revision", None),
        model_override_args=json.loads(override),
    )


def read_drafter_info(cfg: Any) -> DrafterInfo:
    """Architectures and block size of the drafter at ``cfg.speculative_draft_model_path``; errors if not DFlash."""
    path = cfg.speculative_draft_model_path
    try:
        hf_config = _load_draft_hf_config(cfg)
    except ImportError:  # this environment cannot run SGLang's config reader: not a fault of the drafter's config
        raise
    except Exception as exc:
        raise DDTreeConfigError(
            f"--speculative-draft-model-path={path!r}: cannot read the drafter's config ({type(exc).__name__}: "
            f"{exc}); DDTREE needs a DFlash drafter checkpoint (config.json with architectures "
            f"{list(DFLASH_DRAFTER_ARCHITECTURES)})"
        ) from exc
    architectures = tuple(getattr(hf_config, "architectures", None) or ())
    if any("DFlash" in arch for arch in architectures):  # DFlash2, unknown layers, fields DDTREE does not apply
        from ..drafter_config import check_drafter_config

        problems = check_drafter_config(hf_config.to_dict(), "sglang")
        if problems:
            raise DDTreeConfigError(f"--speculative-draft-model-path={path!r}: " + "; ".join(problems))
    if not any(arch in DFLASH_DRAFTER_ARCHITECTURES for arch in architectures):
        raise DDTreeConfigError(
            f"--speculative-draft-model-path={path!r} is not a DFlash drafter: its config has architectures "
            f"{list(architectures)}, DDTREE needs one of {list(DFLASH_DRAFTER_ARCHITECTURES)} (an EAGLE/MTP "
            "drafter or a plain LM does not draft blocks)"
        )
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

    try:
        block_size = parse_dflash_draft_config(draft_hf_config=hf_config).resolve_block_size(default=None)
    except Exception as exc:
        raise DDTreeConfigError(
            f"--speculative-draft-model-path={path!r}: invalid DFlash config ({exc}); fix the drafter's "
            "dflash_config"
        ) from exc
    if block_size is None:
        raise DDTreeConfigError(
            f"--speculative-draft-model-path={path!r}: the DFlash drafter config has no block_size "
            "(dflash_config.block_size or block_size); DDTREE reads the draft depth from it"
        )
    if int(block_size) < 2:
        raise DDTreeConfigError(
            f"--speculative-draft-model-path={path!r}: block_size={block_size}; DDTREE needs a drafter block "
            "size >= 2 (at least one drafted token per block)"
        )
    return DrafterInfo(architectures=architectures, block_size=int(block_size))


def sliding_window_problem(config: dict) -> str | None:
    """Why a target with this HF config (a dict; a multimodal one's ``text_config`` too) cannot run DDTREE, or
    None. DDTREE's tree mask (``verify_input``) is an ancestor mask over full attention: a sliding-window layer
    would need the window applied per tree node. Qwen3's ``sliding_window`` with ``use_sliding_window: false``
    and hybrids' ``linear_attention`` layers are not sliding windows."""
    for where, cfg in (("", config), ("text_config.", config.get("text_config") or {})):
        if not isinstance(cfg, dict):
            continue
        layer_types = [str(t) for t in cfg.get("layer_types") or []]
        sliding = [i for i, t in enumerate(layer_types) if "sliding" in t]
        if sliding:
            return f"{where}layer_types has sliding-window layers {sliding[:8]}{' ...' if len(sliding) > 8 else ''}"
        window = cfg.get("sliding_window")
        if window and cfg.get("use_sliding_window", True) and not layer_types:
            return f"{where}sliding_window={window}" + (
                " with use_sliding_window=true" if "use_sliding_window" in cfg else ""
            )
    return None


def _target_hf_config(cfg: Any) -> dict | None:
    """The target's HF config as SGLang reads it (None when it cannot be read: SGLang reports that itself)."""
    try:
        from sglang.srt.utils.hf_transformers_utils import get_config

        hf = get_config(
            cfg.model_path,
            trust_remote_code=bool(getattr(cfg, "trust_remote_code", False)),
            revision=getattr(cfg, "revision", None),
        )
        return hf.to_dict()
    except Exception:  # the target's own loading names the problem
        return None


def _backend_pair(cfg: Any) -> tuple[Any, Any]:
    base = getattr(cfg, "attention_backend", None)
    prefill = getattr(cfg, "prefill_attention_backend", None) or base
    decode = getattr(cfg, "decode_attention_backend", None) or base
    return prefill, decode


def _resolved(cfg: Any, name: str) -> Any:
    """A field as SGLang's resolution sees it at this point: through ``resolved_view`` (0.5.17's ServerArgs keeps
    ``page_size=None`` on the object while a pass has already declared 1, or 64 for a trtllm_mha drafter), else
    the attribute."""
    try:
        from sglang.srt.arg_groups.overrides import resolved_view

        return getattr(resolved_view(cfg), name)
    except Exception:
        return getattr(cfg, name, None)


def page_size_message(page_size: int, draft_backend: Any = None) -> str:
    """Why DDTREE refuses ``--page-size`` > 1, and the fix.

    Not proven correct, so refused. DDTREE verifies into one KV slot per tree node and commits by moving single
    slots without touching ``req_to_token`` (``verify_input.chain_first_slots``, ``commit.commit_plan``): page-
    agnostic on paper, and tested only against a simulated page allocator (tests/sglang/test_verify_commit.py).
    What no test covers: with pages SGLang 0.5.17 reserves DFLASH's ``committed + 2 * num_draft_tokens`` without
    page rounding (``dflash_info_v2.prepare_for_decode``, unlike ``eagle_utils.eagle_prepare_for_decode``, which
    rounds up to a page), and because DDTREE announces ``speculative_eagle_topk`` > 1 it sizes the per-decode
    footprint with EAGLE's per-branch page formula (``mem_cache/allocation_sizing.get_alloc_len_per_decode``);
    the Triton verify's paged K/V addressing (``extend_attention``'s PAGE_SIZE branch) has never run a tree.
    SGLang snaps the page size to 64 for a trtllm_mha backend (``overrides._mla_backend_page_constraints``)."""
    reason = (
        "DDTREE supports only --page-size 1: its tree verify writes one KV slot per tree node and its commit moves "
        "single slots, and a tree round with KV pages larger than one token has not been verified lossless on a GPU"
    )
    if draft_backend == "trtllm_mha":
        return (
            f"--page-size={page_size}, set by SGLang for --speculative-draft-attention-backend trtllm_mha (which "
            f"runs only with pages of 16-128 tokens): {reason}; use --speculative-draft-attention-backend triton "
            "(and --page-size 1)"
        )
    return f"--page-size={page_size}: {reason}; pass --page-size 1 (the default)"


def lm_head_refusal(problem: str) -> str:
    """The start-up error for a target lm_head that ``worker.lm_head_problem`` finds unusable (``problem``)."""
    return (
        f"DDTREE: the target's lm_head {problem}; the tree scores the drafter's hidden states as log-probabilities "
        "through the target's lm_head weight read as a dense floating-point [vocab, hidden] matrix, so a quantized "
        "lm_head cannot be used. Serve a checkpoint whose lm_head is not quantized (lm_head in the quantization "
        "config's exclude_modules / ignored layers, or \"lm_head\": false for GPTQ/AWQ), or serve without "
        "speculative decoding (SGLang's DFLASH reads the same weight as a dense matrix too)"
    )


def handle_ddtree_server_args(cfg: Any) -> None:
    """Validate and complete the server args for DDTREE in place (see the module docstring). Raises
    ``DDTreeConfigError`` (a ``ValueError``) naming the option, the bad value and the fix."""
    from .versions import attn_dp_enabled

    device = str(getattr(cfg, "device", None) or "")
    if not device.startswith("cuda"):
        raise DDTreeConfigError(
            f"--device={device or None!r}: DDTREE speculative decoding runs on CUDA GPUs only (its tree verify uses "
            "SGLang's CUDA/Triton kernels); pass --device cuda on a host with an NVIDIA GPU"
        )
    if getattr(cfg, "speculative_draft_model_path", None) is None:
        raise DDTreeConfigError(
            "--speculative-draft-model-path is missing: DDTREE needs a DFlash drafter checkpoint "
            f"(config architectures {list(DFLASH_DRAFTER_ARCHITECTURES)}), e.g. "
            "--speculative-draft-model-path z-lab/Qwen3-8B-DFlash-b16"
        )
    pp_size = int(getattr(cfg, "pp_size", 1) or 1)
    if pp_size != 1:
        raise DDTreeConfigError(
            f"--pp-size={pp_size}: DDTREE does not support pipeline parallelism; use --pp-size 1 (tensor parallel "
            "--tp-size N is supported)"
        )
    if attn_dp_enabled(cfg):
        raise DDTreeConfigError(
            "--enable-dp-attention: DDTREE does not support data-parallel attention; drop --enable-dp-attention "
            "(tensor parallel --tp-size N is supported)"
        )
    attn_cp = int(getattr(cfg, "attn_cp_size", 1) or 1)
    if attn_cp != 1:
        raise DDTreeConfigError(
            f"--attn-cp-size={attn_cp}: DDTREE's tree verify under attention context parallelism is untested (the "
            "drafter's KV width and the tree mask both depend on it); use --attn-cp-size 1"
        )
    if getattr(cfg, "mamba_radix_cache_strategy", None) == "extra_buffer_lazy":
        raise DDTreeConfigError(
            "--mamba-radix-cache-strategy=extra_buffer_lazy: its lazy state tracking follows a chain, not DDTREE's "
            "tree (SGLang refuses it for DFLASH too); use the default strategy or --disable-radix-cache"
        )
    if getattr(cfg, "disaggregation_mode", "null") not in (None, "null"):
        raise DDTreeConfigError(
            f"--disaggregation-mode={cfg.disaggregation_mode!r}: DDTREE does not support prefill/decode "
            "disaggregation; drop --disaggregation-mode"
        )
    if getattr(cfg, "speculative_draft_window_size", None) is not None:
        raise DDTreeConfigError(
            f"--speculative-draft-window-size={cfg.speculative_draft_window_size}: DDTREE does not support the "
            "compact (windowed) drafter cache; drop --speculative-draft-window-size"
        )
    if getattr(cfg, "enable_lora", None) or getattr(cfg, "lora_paths", None):
        raise DDTreeConfigError("--enable-lora / --lora-paths: DDTREE does not support LoRA adapters; drop them")

    target_config = _target_hf_config(cfg)
    problem = sliding_window_problem(target_config) if target_config else None
    if problem:
        raise DDTreeConfigError(
            f"--model-path={cfg.model_path!r}: the target uses sliding-window attention ({problem}); DDTREE's tree "
            "verify applies an ancestor mask over full attention only, so a windowed layer would attend outside its "
            "window; serve this target with --speculative-algorithm DFLASH or without speculation"
        )

    budget = budget_from_num_draft_tokens(getattr(cfg, "speculative_num_draft_tokens", None))
    drafter = read_drafter_info(cfg)
    explicit_block = getattr(cfg, "speculative_dflash_block_size", None)
    if explicit_block is not None and int(explicit_block) != drafter.block_size:
        raise DDTreeConfigError(
            f"--speculative-dflash-block-size={explicit_block} differs from the drafter's block_size "
            f"{drafter.block_size}; DDTREE reads the block size from the drafter config, drop the flag"
        )

    from ..budget import BUDGET_ENV, least_widest_budget, parse_budget_option

    if budget < least_widest_budget(drafter.block_size):
        least = least_widest_budget(drafter.block_size) + 1
        raise DDTreeConfigError(
            f"--speculative-num-draft-tokens={budget + 1} (node budget {budget}) is too small for the drafter's "
            f"block_size {drafter.block_size}: SGLang's DFLASH decode reserves 2 x num_draft_tokens = "
            f"{2 * (budget + 1)} KV slots ahead of each request per step, and the drafter's block writes "
            f"{drafter.block_size}, so its last positions would land in slots the request does not own; use "
            f"--speculative-num-draft-tokens >= {least} (a budget of at least {least - 1}); to verify "
            f"{budget} nodes a step all the same, set --speculative-num-draft-tokens {least} and "
            f"{BUDGET_ENV}={budget}"
        )

    try:
        candidates = parse_budget_option(os.environ.get(BUDGET_ENV), budget, drafter.block_size)
    except ValueError as exc:
        raise DDTreeConfigError(str(exc)) from None

    raw = getattr(cfg, "_raw_input", None)  # 0.5.23: the user's own inputs; 0.5.17: none kept
    raw = raw if isinstance(raw, dict) else None
    for field in ("attention_backend", "prefill_attention_backend", "decode_attention_backend"):
        backend = getattr(cfg, field, None)
        if backend is None or backend in SUPPORTED_ATTENTION_BACKENDS:
            continue
        if raw is not None and raw.get(field) is None:
            # SGLang chose it (e.g. fa3 on Hopper), the user did not: use a backend that applies the tree mask.
            setattr(cfg, field, SUPPORTED_ATTENTION_BACKENDS[0])
            logger.warning(
                "DDTREE: SGLang picked %s=%s, which cannot apply a tree mask; using %s",
                field, backend, SUPPORTED_ATTENTION_BACKENDS[0],
            )
            continue
        raise DDTreeConfigError(
            f"--{field.replace('_', '-')}={backend!r} (set explicitly or chosen by SGLang for this GPU): DDTREE's "
            f"tree verify needs a target attention backend proven to apply the tree mask in eager and CUDA-graph "
            f"verify, one of {list(SUPPORTED_ATTENTION_BACKENDS)}; pass --attention-backend triton"
        )
    prefill_backend, decode_backend = _backend_pair(cfg)
    if prefill_backend is None and decode_backend is None:
        cfg.attention_backend = SUPPORTED_ATTENTION_BACKENDS[0]
        logger.info("DDTREE: --attention-backend not set; using %s", SUPPORTED_ATTENTION_BACKENDS[0])
        prefill_backend = decode_backend = SUPPORTED_ATTENTION_BACKENDS[0]

    draft_backend = getattr(cfg, "speculative_draft_attention_backend", None)
    if draft_backend is None:
        draft_backend = prefill_backend
    if draft_backend not in SUPPORTED_DRAFT_ATTENTION_BACKENDS:
        raise DDTreeConfigError(
            f"--speculative-draft-attention-backend={draft_backend!r} is not supported by the DFlash drafter; use "
            f"one of {list(SUPPORTED_DRAFT_ATTENTION_BACKENDS)}"
        )

    page_size = _resolved(cfg, "page_size")
    if page_size is not None and int(page_size) != 1:
        raise DDTreeConfigError(page_size_message(int(page_size), draft_backend))

    cfg.speculative_num_draft_tokens = budget + 1
    cfg.speculative_dflash_block_size = drafter.block_size
    cfg.speculative_num_steps = drafter.block_size - 1
    cfg.speculative_eagle_topk = TREE_TOPK
    cfg.speculative_draft_attention_backend = draft_backend
    if getattr(cfg, "enable_mixed_chunk", False):
        cfg.enable_mixed_chunk = False
        logger.warning("DDTREE: mixed chunked prefill is disabled (tree verify batches are not mixed)")
    if getattr(cfg, "max_running_requests", None) is None:
        cfg.max_running_requests = DEFAULT_MAX_RUNNING_REQUESTS
        logger.warning(
            "DDTREE: --max-running-requests not set; using %d (as DFLASH)", DEFAULT_MAX_RUNNING_REQUESTS
        )
    logger.info(
        "DDTREE: budget=%s (verify width %d), drafter block_size=%d (max depth %d), attention=%s, draft attention=%s",
        budget if candidates is None else (
            f"{candidates[0] or 'the chain'} every step ({BUDGET_ENV}; KV and graphs for {budget})"
            if len(candidates) == 1 else f"chosen per step among {list(candidates)} (0 = the chain; widest {budget})"),
        budget + 1,
        drafter.block_size,
        drafter.block_size - 1,
        prefill_backend,
        draft_backend,
    )


def current_block_size() -> int | None:
    """The drafter block size of the running server (``speculative_dflash_block_size`` set above), or None."""
    try:
        from sglang.srt.runtime_context import get_spec

        value = get_spec().speculative_dflash_block_size
    except Exception:
        try:
            from sglang.srt.server_args import get_global_server_args

            value = get_global_server_args().speculative_dflash_block_size
        except Exception:
            return None
    return None if value is None else int(value)
