"""``DDTreeWorker``: SGLang's ``DFlashWorkerV2`` with the argmax chain replaced by a DDTree draft tree.

Per decode round (batch of B requests, budget N, drafter block size S = max depth + 1):

1. Drafter pass — DFLASH's own code, unchanged: ``DFlashWorkerV2.forward_batch_generation`` prepares the block
   (root = last verified token + S-1 mask tokens), runs the drafter (CUDA graph when captured) and then asks
   ``_greedy_sample_from_vocab_parallel_head`` for the argmax chain, or, when the drafter ran as a CUDA graph
   with its draft head folded in, reads that head's ``out``. DDTREE takes both: its head (``draft_head.py``; off
   with ``TREE_IN_GRAPH_ENV=0``) builds the tree inside the drafter's graphs, and the round ends DFLASH's at
   either point (``DraftCaptured``, with the hidden states when the pass ran eagerly), so the drafter pass stays
   DFLASH's on every supported SGLang version.
2. Tree: drafter logits through the target's lm_head; ``build_tree`` (TP = 1) or the vocabulary-sharded
   top-k + global log-normaliser gathered across TP ranks and ``build_tree_from_topk`` (TP > 1).
   With ``SGLANG_DDTREE_BUDGET=auto`` (``auto_budget.py``) the step verifies the candidate chosen for it: the
   tree's first n nodes (the budget-n tree) or the drafter's argmax chain, at that width, with CUDA graphs
   captured for each width; the widest tree still gives every candidate's expected acceptance. A chain step is
   DFLASH's own round, whole (its verify at its width's graphs, the causal cells written into the mask buffer
   those graphs read), so it costs what DFLASH's round costs (``_ddtree_dflash_round``).
3. Verify: ``DDTreeVerifyInput`` with N+1 tokens per request (positions prefix + depth, tree mask in the
   backends' FULL layout, retrieve arrays, each node's KV slot: the argmax chain's nodes at their own depth),
   the target's TARGET_VERIFY forward, then the core's greedy walk (or its exactly lossless ``sampling_walk``
   when sampling).
4. Commit: the KV of accepted nodes that are not already at positions prefix..prefix+accept_len is moved there
   (nothing moves when the path follows the chain; data moves, valid for any page size), the recurrent state of
   hybrid linear-attention targets is committed at the last ACCEPTED node's index, and the drafter context is
   materialised from the accepted nodes' hidden states.

On CUDA, steps 2-4 are a handful of kernels: the tree (three Triton launches, captured in the drafter's graphs at
TP = 1), ``_triton_glue.verify_prep`` (all verify arrays and the mask cells), the target's token at every node
(argmax, or a sampled token) and ``_triton_glue.walk_commit`` (the walk, the commit plan: tokens, lengths, moves,
rows; and the KV moves of every layer, only for requests that need one, in one launch), compiled at start-up for
every width the server may verify (``warmup.py``, after the CUDA graphs); outputs of one dtype share one
allocation (``_alloc.carve``). Everything that depends only on the configuration or the SGLang version (TP group,
vocabulary, the verify-preparation call, the mamba tracking interval; the KV pool's buffer table at the first
round) is resolved once, never per step. No per-request
Python loops and no host synchronisation in steps 2-4 (only DFLASH's own host bookkeeping).

GPU-only: this module is imported lazily by the registered worker factory. Its tensor helpers
(``_ddtree_*``) are exercised on CPU by the tests; the full round needs a GPU (see bench/gpu/).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

from ..budget import BUDGET_ENV, CHAIN, fixed_budget_report, parse_budget_option, tree_prefix
from ..tree import DraftTree, build_tree, build_tree_from_topk, chain_tree, resolve_backend
from ..verify import greedy_walk, race_tokens
from . import testing
from .commit import CommitPlan, commit_plan, tree_mamba_commit_indices
from .draft_head import DraftCaptured, TreeDraftHead
from .server_args import DDTreeConfigError, current_block_size, lm_head_refusal
from .tp_topk import resolve_tp_group, sharded_candidates
from .verify_input import build_verify_arrays, mask_numel, write_chain_mask

logger = logging.getLogger(__name__)

__all__ = ["DDTreeWorker"]

#: ``1`` (default): build the draft tree inside the drafter's CUDA graphs where it can go (``draft_head.py``);
#: ``0``: after the drafter pass. On an H100 (12-06, bench/results/step-cost-*-h100-2026-12-06.json) it took the tiny
#: pair's DDTREE-16 step from 1.23x DFLASH's to 1.03x at batch 1, with the same tokens.
TREE_IN_GRAPH_ENV = "SGLANG_DDTREE_TREE_IN_GRAPH"
TREE_IN_GRAPH_DEFAULT = "1"
#: A number d >= 2: the Triton glue's per-round outputs (verify arrays, walk and commit plan) come from d sets per
#: batch shape, reused in turn, instead of an allocation and its views every round (``_triton_glue.reuse_outputs``).
#: Opt-in until a GPU A/B (step_cost.py ``--ab ring:SGLANG_DDTREE_GLUE_RING=4``) and the lossless runs say it pays.
GLUE_RING_ENV = "SGLANG_DDTREE_GLUE_RING"


def glue_ring_depth(value: str | None) -> int | None:
    """``GLUE_RING_ENV``'s depth: None when unset, empty or 0 (allocate each round); a refusal naming the fix
    otherwise."""
    text = (value or "").strip()
    if text in ("", "0"):
        return None
    if not text.isdigit() or int(text) < 2:
        raise ValueError(f"{GLUE_RING_ENV}={value!r}: give the number of output sets to reuse in turn, at least 2 "
                         "(a round's outputs are read during the next round), e.g. 4; 0 or unset allocates each round")
    return int(text)


def lm_head_problem(lm_head: Any) -> str | None:
    """Why the drafter's logits cannot be computed as ``hidden @ lm_head.weight.T``, or None (fine).

    A quantized lm_head (an SGLang quant method other than the unquantized one, or a weight that is not a
    floating-point [vocab, hidden] matrix) would give meaningless tree scores without any error."""
    if lm_head is None:
        return "is missing (the target model has no lm_head attribute)"
    weight = getattr(lm_head, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return f"has no dense [vocab, hidden] weight ({type(weight).__name__})"
    if not weight.dtype.is_floating_point or weight.dtype.itemsize < 2:
        return f"weight is {weight.dtype} (quantized)"
    method = getattr(lm_head, "quant_method", None)
    if method is not None and "unquantized" not in type(method).__name__.lower():
        return f"is quantized ({type(method).__name__})"
    return None


def accepts_keyword(fn: Any, name: str) -> bool:
    """Whether ``fn`` takes the keyword argument ``name`` (SGLang signatures differ between releases); decided
    once at start-up, never per step."""
    import inspect

    params = inspect.signature(fn).parameters
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def slot_move_table(kv_pool: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(data_ptrs u64 [NBUF], data_strides [NBUF] bytes per slot) of a slot-major KV pool whose buffers are all
    the pool holds (SGLang's own move kernel reads the same table), or None: then moves go through
    ``move_kv_cache`` (paged HND layouts, scale buffers, pools without the table)."""
    pool = getattr(kv_pool, "full_kv_pool", None) or kv_pool  # hybrid pools: the full-attention layers' pool
    ptrs, strides = getattr(pool, "data_ptrs", None), getattr(pool, "data_strides", None)
    if not isinstance(ptrs, torch.Tensor) or not isinstance(strides, torch.Tensor) or ptrs.device.type != "cuda":
        return None
    if getattr(pool, "use_hnd", False) or getattr(pool, "k_scale_buffer", None) is not None:
        return None
    if getattr(pool, "use_native_move_kv_cache", False):
        return None
    return ptrs, strides.to(device=ptrs.device, dtype=torch.int64)


class DDTreeWorker(DFlashWorkerV2):
    """DFLASH drafter, DDTree tree, tree verification. See the module docstring."""

    # Resolved once by ``_ddtree_resolve_runtime`` (class defaults: the CPU tests' plain torch set-up).
    _ddtree_glue = "torch"  # "triton" on CUDA: the fused glue kernels
    _ddtree_tp_group: Any = None
    _ddtree_vocab_size: int | None = None
    _ddtree_prepare_kwargs: dict | None = None
    _ddtree_move_table: tuple[torch.Tensor, torch.Tensor] | None = None  # resolved at the warm-up or the first
    _ddtree_move_table_resolved = False  # commit (the pool is allocated after the workers are built)
    _ddtree_track_interval_value: int | None = None
    _ddtree_auto: Any = None  # auto_budget.AutoBudget when SGLANG_DDTREE_BUDGET chooses the budget per step
    _ddtree_width_runners: dict | None = None  # {verify width: the target's decode graph runner} (auto budget only)
    _ddtree_rounds = 0  # tree rounds so far (grammar batches, verified as DFLASH's chain, not counted)
    _ddtree_head: TreeDraftHead | None = None  # the tree inside the drafter's CUDA graphs (draft_head.py)
    _ddtree_dflash_samples = False  # SGLang's sampling verify kernel is there (DFLASH verifies sampled chains)
    _ddtree_min_p_renorms = False  # SGLang's sampler renormalises top-k, then top-p, before min-p (flashinfer)
    _ddtree_keep_hidden = False  # a chain step's sample: keep the hidden states DFLASH's greedy head is given
    _ddtree_kept_hidden: torch.Tensor | None = None
    _ddtree_oracle_batch: Any = None  # test-only (testing.ORACLE_FILE): the batch of the DFLASH round running
    _ddtree_oracle_tree: DraftTree | None = None

    def __init__(self, *args: Any, **kwargs: Any):
        server_args = kwargs.get("server_args", args[0] if args else None)
        block_size = current_block_size() or int(getattr(server_args, "speculative_dflash_block_size", 0) or 0)
        # SGLang 0.5.17's DFLASH __init__ takes server_args.speculative_num_draft_tokens as the drafter block size
        # and sizes its draft buffers with it: show it the drafter's block size while it runs, then restore N+1.
        num_nodes_arg = getattr(server_args, "speculative_num_draft_tokens", None)
        swap = server_args is not None and block_size > 0 and num_nodes_arg is not None
        # ServerArgs is read-only once resolved (0.5.17 guards __setattr__); the swap is undone right after.
        if swap:
            object.__setattr__(server_args, "speculative_num_draft_tokens", block_size)
        try:
            super().__init__(*args, **kwargs)
        finally:
            if swap:
                object.__setattr__(server_args, "speculative_num_draft_tokens", num_nodes_arg)
        num_nodes = int(self._spec_value("speculative_num_draft_tokens"))
        block_size = block_size or int(self._spec_value("speculative_dflash_block_size"))
        self.ddtree_num_nodes = num_nodes  # N + 1 verify tokens per request
        self.ddtree_budget = num_nodes - 1
        for attr in ("selector", "lilicorr"):
            if getattr(self, attr, None) is not None:
                raise ValueError(f"DDTREE supports plain DFlash drafters; this drafter has a {attr} head")
        if getattr(self, "_is_domino", False):
            raise ValueError("DDTREE supports plain DFlash drafters; this drafter is a Domino drafter")
        self._ddtree_set_block_size(block_size)
        self._ddtree_capturing = False
        self._ddtree_require_graph_mask_hook()
        problem = lm_head_problem(self._ddtree_lm_head())
        if problem:
            raise DDTreeConfigError(lm_head_refusal(problem))
        self._ddtree_resolve_runtime()
        self._ddtree_setup_auto_budget(block_size)
        logger.info("DDTREE worker: budget=%s, block_size=%d, glue=%s",
                    self.ddtree_budget if self._ddtree_auto is None else
                    f"auto {list(self._ddtree_auto.candidates)} (0 = the chain)", block_size, self._ddtree_glue)

    # --- set-up ----------------------------------------------------------------------------------------------
    def _ddtree_resolve_runtime(self) -> None:
        """Everything the round needs that depends only on the configuration or the SGLang version."""
        from .verify_spec_input import DDTreeVerifyInput

        self._ddtree_glue = resolve_backend(None, torch.device(self.device))
        self._ddtree_tp_group = resolve_tp_group(int(getattr(self.server_args, "tp_size", 1) or 1))
        self._ddtree_vocab_size = int(self.model_runner.model_config.vocab_size)
        # 0.5.23's prepare_for_verify takes defer_metadata_init; 0.5.17's does not.
        takes = accepts_keyword(DDTreeVerifyInput.prepare_for_verify, "defer_metadata_init")
        self._ddtree_prepare_kwargs = {"defer_metadata_init": False} if takes else {}
        if self._need_mamba_verify_commit:
            self._ddtree_track_interval_value = self._ddtree_track_interval()
        try:
            from sglang.srt.speculative.dflash_utils import is_dflash_sampling_verify_available

            self._ddtree_dflash_samples = bool(is_dflash_sampling_verify_available())
        except ImportError:  # pragma: no cover - every supported version has it
            self._ddtree_dflash_samples = False
        self._ddtree_min_p_renorms = sampling_backend(self.server_args) in MIN_P_RENORM_BACKENDS
        try:
            ring = glue_ring_depth(os.environ.get(GLUE_RING_ENV))
        except ValueError as exc:
            raise DDTreeConfigError(str(exc)) from None
        if self._ddtree_glue == "triton":
            from . import _triton_glue

            _triton_glue.reuse_outputs(ring)

    def _ddtree_setup_auto_budget(self, block_size: int) -> None:
        """``SGLANG_DDTREE_BUDGET`` (budget.BUDGET_ENV): a per-step choice among its candidates, or the fixed
        budget (unset). The extra widths' CUDA graphs are captured in :meth:`init_cuda_graphs`."""
        try:
            candidates = parse_budget_option(os.environ.get(BUDGET_ENV), self.ddtree_budget, block_size)
        except ValueError as exc:
            raise DDTreeConfigError(str(exc)) from None
        if candidates is None:
            return
        from .auto_budget import AutoBudget

        self._ddtree_auto = AutoBudget(candidates, block_size, torch.device(self.device), self._ddtree_tp_group)

    def alloc_memory_pool(self, *args: Any, **kwargs: Any):
        """DFLASH's, then a refusal when the target's ``req_to_token`` rows cannot hold DDTREE's reservation near
        the context limit (``kv_rows.py``; the plugin's hook widens them, so this fails only without it)."""
        result = super().alloc_memory_pool(*args, **kwargs)
        pool = kwargs.get("req_to_token_pool") or getattr(self.target_worker.model_runner, "req_to_token_pool", None)
        table = getattr(pool, "req_to_token", None)
        if table is not None:
            from .kv_rows import row_width_problem

            context_len = int(self.target_worker.model_runner.model_config.context_len)
            problem = row_width_problem(int(table.shape[1]), context_len, self.ddtree_num_nodes)
            if problem:
                from .hooks import REQ_TO_TOKEN_EXTRA

                raise RuntimeError(f"DDTREE: {problem}. The plugin's hook on {REQ_TO_TOKEN_EXTRA} widens them; check "
                                   "the server log for why it was not applied")
        return result

    def init_cuda_graphs(self):
        """DFLASH's drafter graphs, then (auto budget) the target's verify graphs of every other candidate width.

        SGLang's scheduler captures the target's graphs (``tp_worker.init_cuda_graphs``, at the widest width) and
        then calls this, after the KV pools exist: the workers are built before either."""
        super().init_cuda_graphs()
        auto = self._ddtree_auto
        runner = getattr(self.target_worker.model_runner, "decode_cuda_graph_runner", None)
        if auto is not None and runner is not None:
            from .auto_budget import capture_verify_widths, verify_width

            widths = [verify_width(c, self.block_size) for c in auto.candidates]
            self._ddtree_width_runners = capture_verify_widths(self.target_worker.model_runner, widths, auto.graphs)
        self._ddtree_warm_glue()

    def _ddtree_warm_glue(self) -> dict | None:
        """Compile the round's Triton glue for every width this server may verify (``warmup.warm_round_kernels``),
        so that no round stalls on a first-use compile; a failure is logged and leaves the kernels to compile at
        their first use, as they would without the warm-up."""
        if self._ddtree_glue != "triton":
            return None
        from .warmup import warm_round_kernels

        candidates = list(self._ddtree_auto.candidates) if self._ddtree_auto is not None else [self.ddtree_budget]
        lm_head = self._ddtree_lm_head()
        try:
            mask = self._ddtree_mask_buffer(1, 1, 2)
            done = warm_round_kernels(
                device=torch.device(self.device),
                budget=self.ddtree_budget,
                candidates=candidates,
                depth=self.block_size - 1,
                vocab_size=int(self._ddtree_vocab_size or lm_head.weight.shape[0]),
                vocab_rows=int(lm_head.weight.shape[0]),
                logits_dtype=lm_head.weight.dtype,
                index_dtype=self.model_runner.req_to_token_pool.req_to_token.dtype,
                mask_dtype=None if mask is None else mask.dtype,
                tp_world=self._ddtree_tp_world(),
                move_kernel=self._ddtree_fused_move_table(self.model_runner.token_to_kv_pool) is not None,
            )
        except Exception as exc:  # the same kernels then compile at their first use, as before
            logger.warning("DDTREE: the glue kernels' warm-up failed (%s: %s); they compile at their first use",
                           type(exc).__name__, exc)
            return None
        logger.info("DDTREE: glue kernels compiled for verify widths %s in %.1f s", done["widths"], done["seconds"])
        return done

    def _ddtree_select_width(self, width: int) -> None:
        if self._ddtree_width_runners:
            from .auto_budget import select_width

            select_width(self.target_worker.model_runner, self._ddtree_width_runners, width)

    def _ddtree_require_graph_mask_hook(self) -> None:
        """Refuse to serve when the target's verify CUDA graphs would be captured without the tree mask.

        Without the plugin's ``DecodeCudaGraphRunner.get_spec_info`` hook, SGLang captures DFLASH-family verify
        graphs causally (issue 13): greedy output silently differs from the target's below the first sibling.
        """
        from sglang.srt.plugins.hook_registry import HookRegistry

        from .hooks import GRAPH_GET_SPEC_INFO

        if bool(getattr(self.server_args, "disable_cuda_graph", False)):
            return
        if "graph_get_spec_info" in testing.skipped_hooks():  # test-only: the defect on purpose
            logger.warning("sglang-ddtree: TEST: target verify graphs captured WITHOUT the tree mask")
            return
        if GRAPH_GET_SPEC_INFO not in getattr(HookRegistry, "_patched", {GRAPH_GET_SPEC_INFO}):
            raise RuntimeError(
                f"DDTREE: the plugin's hook on {GRAPH_GET_SPEC_INFO} is not applied, so the target's verify CUDA "
                "graphs would ignore the tree mask; check the server log for why the hook failed, or start with "
                "--disable-cuda-graph"
            )

    def _spec_value(self, name: str) -> Any:
        try:
            from sglang.srt.runtime_context import get_spec

            return getattr(get_spec(), name)
        except Exception:
            return getattr(self.server_args, name)

    def _ddtree_set_block_size(self, block_size: int) -> None:
        """DFLASH's __init__ took speculative_num_draft_tokens (N+1) as the block size; put the drafter's back."""
        try:  # 0.5.23
            from sglang.srt.speculative.dflash_utils import build_block_pos_offsets, make_draft_block_spec_info
        except ImportError:  # 0.5.17
            from sglang.srt.speculative.draft_worker_common import build_block_pos_offsets, make_draft_block_spec_info

        self.block_size = int(block_size)
        self.speculative_num_draft_tokens = int(block_size)
        if hasattr(self.draft_model, "set_block_size"):
            self.draft_model.set_block_size(self.block_size)
        self._block_pos_offsets = build_block_pos_offsets(length=self.block_size, device=self.device)
        self._draft_block_spec_info = make_draft_block_spec_info(draft_token_num=self.block_size, device=self.device)

    def _maybe_build_draft_sampler(self):
        """DFLASH's draft-sampler slot, folded into the drafter's CUDA graphs: DDTREE's tree head (the tree built
        inside those graphs, ``draft_head.py``), or None (the tree is built after the drafter pass)."""
        reason, max_bs = self._ddtree_head_refusal()
        if reason:
            logger.info("DDTREE: draft tree built after the drafter pass, outside its CUDA graph (%s)", reason)
            self._ddtree_head = None
            return None
        lm_head = self._ddtree_lm_head()
        tp_group = self._ddtree_tp_group if self._ddtree_tp_world() > 1 else None
        self._ddtree_head = TreeDraftHead(
            lambda hidden, bs, out: self._ddtree_tree_from_hidden(hidden, bs, lm_head, tp_group,
                                                                   self._ddtree_vocab_size, out=out),
            block_size=self.block_size, budget=self.ddtree_budget, max_bs=max_bs, device=self.device,
            normalizers=tp_group is None,
        )
        logger.info("DDTREE: draft tree built inside the drafter's CUDA graphs (up to batch %d, TP %d)", max_bs,
                    self._ddtree_tp_world())
        return self._ddtree_head

    def _ddtree_head_refusal(self) -> tuple[str | None, int]:
        """(why the tree cannot be built inside the drafter's graphs, or None; the graphs' largest batch)."""
        setting = os.environ.get(TREE_IN_GRAPH_ENV, TREE_IN_GRAPH_DEFAULT).strip().lower()
        if setting == "0":
            return f"{TREE_IN_GRAPH_ENV}=0", 0
        if self._ddtree_glue != "triton":
            return "no Triton kernels on this device", 0
        if self._ddtree_tp_world() > 1:
            if setting != "all":
                return (f"tensor parallel: the vocabulary-sharded top-k gathers across ranks after the pass ("
                        f"{TREE_IN_GRAPH_ENV}=all gathers inside the graphs, as DFLASH's greedy head does; not yet "
                        "run on GPUs)"), 0
            shard = getattr(self._ddtree_lm_head(), "shard_indices", None)
            if shard is None or int(getattr(shard, "num_added_elements", 0) or 0):
                return "tensor parallel: the target's lm_head has no plain vocabulary shards (shard_indices)", 0
        if testing.ORACLE_FILE:
            return "test oracle: forced draft logits per request", 0
        try:
            from sglang.srt.runtime_context import get_exec

            max_bs = max(get_exec().graph.cuda_graph_config.decode.bs)
        except Exception:
            max_bs = getattr(self.server_args, "cuda_graph_max_bs", None)
        if not max_bs:
            return "the drafter graphs' batch sizes are unknown on this SGLang version", 0
        return None, int(max_bs)

    def _ddtree_tp_world(self) -> int:
        return int(getattr(self._ddtree_tp_group, "world_size", 1) or 1)

    # --- 1) drafter pass: DFLASH's, stopped at its greedy head ----------------------------------------------
    def _greedy_sample_from_vocab_parallel_head(self, *args: Any, **kwargs: Any):
        if self._ddtree_capturing:
            raise DraftCaptured(kwargs.get("hidden_states", args[0] if args else None))
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if self._ddtree_keep_hidden:  # a chain step's sample: its tree is built from them after DFLASH's round
            self._ddtree_kept_hidden = hidden
        if self._ddtree_oracle_batch is not None:  # test-only: DFLASH's round drafts the oracle's chain
            return self._ddtree_oracle_chain(hidden)
        return super()._greedy_sample_from_vocab_parallel_head(*args, **kwargs)

    def _ddtree_oracle_chain(self, hidden: torch.Tensor) -> torch.Tensor:
        """Test-only (``testing.ORACLE_FILE``): int64 [B*D], the drafter's argmax chain with the oracle's tokens
        forced in: the rank-0 tokens of the tree a DDTREE round builds from these hidden states (kept for the chain
        step's sample)."""
        batch = self._ddtree_oracle_batch
        bs, depth = len(batch.seq_lens), self.block_size - 1
        force = testing.oracle_tokens(getattr(batch, "reqs", None), batch.seq_lens, self._draft_block_ids_buf[:bs, 0],
                                      depth)
        self._ddtree_oracle_tree = self._ddtree_tree_from_hidden(hidden, bs, self._ddtree_lm_head(), None,
                                                                 self._ddtree_vocab_size, force)
        return self._ddtree_oracle_tree.top1_tokens.reshape(-1)

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None):
        auto = self._ddtree_auto
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle():
            if auto is not None:
                auto.interrupt()
            return super().forward_batch_generation(batch, on_publish=on_publish, grammar_barrier=grammar_barrier)
        if getattr(batch, "has_grammar", False):
            if auto is not None:
                auto.interrupt()
            # Grammar masks are built for DFLASH's chain: verify such batches as DFLASH does (lossless, no tree).
            return self._ddtree_dflash_round(batch, on_publish, grammar_barrier)
        candidate = None
        if auto is not None:  # times the whole round; sampled rounds have their own calibration and expectations
            greedy = getattr(getattr(batch, "sampling_info", None), "is_all_greedy", True)
            candidate = auto.begin_step(len(batch.seq_lens), greedy=bool(greedy))
            if candidate == CHAIN and self._ddtree_chain_is_dflash(batch):
                result = self._ddtree_dflash_round(batch, on_publish, grammar_barrier, chain_step=True)
                auto.end_step()
                return result
        head = self._ddtree_head
        self._ddtree_capturing = True
        if head is not None:
            head.in_round = True
        try:
            super().forward_batch_generation(batch, on_publish=None, grammar_barrier=grammar_barrier)
        except DraftCaptured as captured:
            draft_hidden = captured.hidden_states
        else:  # pragma: no cover - DFLASH's round always reaches its draft head
            raise RuntimeError("DDTREE: DFLASH's round did not reach the drafter head")
        finally:
            self._ddtree_capturing = False
            if head is not None:
                head.in_round = False
        # No hidden states: the drafter ran as a CUDA graph and the tree head built the tree inside it.
        tree = head.tree(len(batch.seq_lens)) if draft_hidden is None and head is not None else None
        result = self._ddtree_round(batch, draft_hidden, on_publish, candidate, tree=tree)
        if auto is not None:
            auto.end_step()
        return result

    def _ddtree_chain_is_dflash(self, batch) -> bool:
        """Whether an auto-budget chain step runs as DFLASH's own round (:meth:`_ddtree_dflash_round`): at DFLASH's
        cost, without the tree glue around its verify (which cost 0.6-1.1 ms a round more on the host-bound trained
        pair, H100 12-07). Not on hybrid linear-attention targets (their verify graphs also read the tree's parent
        links, which DFLASH's verify does not refill), and not for a sampling batch that DFLASH would verify otherwise
        than the tree walk does:
        - without SGLang's sampling-verify kernel (DFLASH then verifies by argmax);
        - with per-request seeds (the tree walk draws SGLang's seeded tokens, DFLASH's rejection sampling does not);
        - with min-p, or with top-k and top-p together: SGLang 0.5.17's DFLASH verify ignores min-p and takes top-p
          over the renormalised top-k, while SGLang's sampler (and the tree walk) takes both over the whole
          distribution. DFLASH's own sampled tokens at top_k=20, top_p=0.9 fail the chi-square test against no
          speculation on the trained pair (H100 12-07: chi2 332 at 19 df), where DDTREE-16's pass (38).
        A missing filter flag counts as set."""
        if self._need_mamba_verify_commit:
            return False
        info = getattr(batch, "sampling_info", None)
        if info is None or getattr(info, "is_all_greedy", True):
            return True
        if not self._ddtree_dflash_samples or getattr(info, "sampling_seed", None) is not None:
            return False
        if getattr(info, "need_min_p_sampling", True):
            return False
        return not (getattr(info, "need_top_k_sampling", True) and getattr(info, "need_top_p_sampling", True))

    def _ddtree_dflash_round(self, batch, on_publish, grammar_barrier, chain_step: bool = False):
        """DFLASH's own round, whole: a grammar batch, or (``chain_step``) the auto budget's chain.

        DFLASH's verify carries no custom mask (a chain is causal), while every target verify graph of a DDTREE
        server was captured reading the tree-mask buffer (``hooks.graph_get_spec_info_hook``), and SGLang copies a
        mask into that buffer only when the step brings one. So the chain's causal cells are written into the buffer
        first (``verify_input.write_chain_mask``, one launch) and the graphs of DFLASH's width are selected (the
        auto budget captures them; with a fixed budget only block - 1 has that width, other widths' runners decline
        the step and it runs eagerly). Where that cannot be done (no mask buffer, or a hybrid linear-attention
        target, whose graphs also read the tree's parent links) the verify runs without graphs.

        A chain step also feeds the auto budget on its sampling steps: the widest tree of the drafter's pass (built
        inside its graph by the tree head, or from the hidden states DFLASH's greedy head was given) prices every
        candidate (``AutoBudget.expect``), and DFLASH's accepted length calibrates the chain (``observe``)."""
        model_runner = self.target_worker.model_runner
        graphs = model_runner.decode_cuda_graph_runner
        graphed = graphs is not None and not self._need_mamba_verify_commit and self._ddtree_write_chain_mask(batch)
        if graphed:
            self._ddtree_select_width(self.block_size)
        else:
            model_runner.decode_cuda_graph_runner = None  # SGLang's forward replays a graph only when it has a runner
        sample = chain_step and bool(getattr(self._ddtree_auto, "sampling", False))
        head = self._ddtree_head
        if head is not None:
            head.served = False
        self._ddtree_kept_hidden = None
        self._ddtree_keep_hidden = sample
        self._ddtree_oracle_tree = None
        self._ddtree_oracle_batch = batch if testing.ORACLE_FILE else None  # test-only: the oracle's chain
        try:
            result = super().forward_batch_generation(batch, on_publish=on_publish, grammar_barrier=grammar_barrier)
        finally:
            self._ddtree_keep_hidden = False
            self._ddtree_oracle_batch = None
            if not graphed:
                model_runner.decode_cuda_graph_runner = graphs
        if chain_step:
            self._ddtree_chain_observed(batch, result, sample)
        return result

    def _ddtree_write_chain_mask(self, batch) -> bool:
        """Write the causal cells of DFLASH's block verify into the target's mask buffer; False when it has none or
        the batch's mask does not fit in it."""
        bs = len(batch.seq_lens)
        bound = self._ddtree_prefix_sum_bound(batch)
        buffer = self._ddtree_mask_buffer(bs, bound, self.block_size)
        if buffer is None:
            return False
        write_chain_mask(buffer, batch.seq_lens, bound, self.block_size, backend=self._ddtree_glue)
        return True

    def _ddtree_chain_observed(self, batch, result, sample: bool) -> None:
        """After a chain step run as DFLASH's round: on a sampling step, the expectations of the drafter's widest
        tree and the chain's calibration from DFLASH's accepted lengths; the test stats record."""
        bs = len(batch.seq_lens)
        accepted = result.accept_lens.to(torch.int64) - 1  # DFLASH's commit lengths: accepted drafts + the bonus
        tree = None
        if sample:
            head = self._ddtree_head
            if head is not None and head.served:  # the drafter's graph built it
                tree = head.tree(bs)
            elif self._ddtree_oracle_tree is not None:  # test-only: the oracle's chain came from it
                tree = self._ddtree_oracle_tree
            elif self._ddtree_kept_hidden is not None:
                tree = self._ddtree_tree_from_hidden(self._ddtree_kept_hidden, bs, self._ddtree_lm_head(),
                                                     self._ddtree_tp_group, self._ddtree_vocab_size)
            self._ddtree_kept_hidden = self._ddtree_oracle_tree = None
        if tree is not None:
            self._ddtree_auto.expect(tree)
            self._ddtree_auto.observe(CHAIN, chain_tree(tree), None, accepted)
        if testing.STATS_FILE:
            testing.write_stats({
                "bs": bs, "width": self.block_size, "graph": bool(result.can_run_cuda_graph), "tree_in_graph": False,
                "dflash_round": True, "accept_len": accepted.tolist(), "nonfirst": [0] * bs, "moves": 0,
            })

    def ddtree_budget_state(self) -> dict:
        """``/get_server_info``'s ``internal_states[i].ddtree_budget`` (hooks.scheduler_internal_state_hook), from
        host counters only: ``policy`` ("fixed" or "auto"), ``candidates`` (budget names, "chain" for DFLASH's
        chain), ``steps`` (tree rounds so far) and ``budget_histogram`` (rounds that verified each candidate); with
        the auto budget also its measured ``step_ms``, ``expected_mean`` and extra ``graphs``
        (``AutoBudget.stats``)."""
        auto = self._ddtree_auto
        if auto is None:
            return fixed_budget_report(self.ddtree_budget, self._ddtree_rounds)
        stats = auto.stats()
        return {"policy": "fixed" if auto.fixed else "auto", "candidates": list(stats["budget_histogram"]), **stats}

    # --- 2) tree ---------------------------------------------------------------------------------------------
    def _ddtree_lm_head(self):
        target_model = self.target_worker.model_runner.model
        return getattr(target_model, "lm_head", None)

    def _ddtree_tree_from_hidden(self, draft_hidden: torch.Tensor, bs: int, lm_head: Any, tp_group: Any = None,
                                 vocab_size: int | None = None, force: tuple | None = None,
                                 out: DraftTree | None = None):
        """Drafter hidden states [bs*(S-1), H] (block positions 1..S-1) -> DraftTree.

        ``force``: test-only (``testing.forced_draft_logits``: oracle tokens and ranks), TP = 1 only. ``out``:
        fixed storage the tree is written into (``tree.tree_buffers``; the tree head)."""
        depth = self.block_size - 1
        flat_logits = torch.matmul(draft_hidden.to(lm_head.weight.dtype), lm_head.weight.t())  # [bs*depth, V']
        world = 1 if tp_group is None else int(getattr(tp_group, "world_size", 1))
        if world == 1:
            if vocab_size is not None:  # a view: the padded columns are skipped by the row stride, not copied
                flat_logits = flat_logits[:, :vocab_size]
            local_logits = flat_logits.view(bs, depth, -1)
            if force is not None:
                local_logits = testing.forced_draft_logits(local_logits, *force)
            return build_tree(local_logits, self.ddtree_budget, out=out)
        local_logits = flat_logits.view(bs, depth, -1)
        shard = getattr(lm_head, "shard_indices", None)
        vocab_start = int(shard.org_vocab_start_index) if shard is not None else 0
        # this shard's real (unpadded) columns are [0, num_org_elements)
        limit = vocab_start + int(shard.num_org_elements) if shard is not None else vocab_size
        k = min(self.ddtree_budget, int(vocab_size or local_logits.shape[-1] * world))
        logprobs, tokens = sharded_candidates(
            local_logits, vocab_start, k, lambda t: tp_group.all_gather(t.contiguous(), dim=-1), vocab_limit=limit
        )
        return build_tree_from_topk(logprobs, tokens, self.ddtree_budget, out=out)

    # --- 3) verify input -------------------------------------------------------------------------------------
    def _ddtree_prefix_sum_bound(self, batch) -> int:
        """Host-known bound of the batch's prefix lengths' sum (sizes the mask; its layout is computed on device)."""
        if batch.seq_lens_cpu is not None:
            return int(batch.seq_lens_cpu.sum())
        draft_input = batch.spec_info
        return int(getattr(draft_input, "reserved_seq_lens_sum", None)
                   or getattr(draft_input, "nxt_kv_lens_sum", None)
                   or len(batch.seq_lens) * self.model_runner.model_config.context_len)

    def _ddtree_mask_buffer(self, bs: int, prefix_lens_sum: int, num_nodes: int):
        """The target attention backend's verify-mask buffer when this batch's mask (``num_nodes`` tokens per
        request) fits in it (the tree cells are then written into it in place), else None (the whole mask is
        built)."""
        backend = self.target_worker.model_runner.attn_backend
        for _ in range(4):  # hybrid backends wrap the full-attention one
            backend = getattr(backend, "full_attn_backend", None) or backend
        buffer = getattr(getattr(backend, "_verify_mask", None), "buffer", None)
        if buffer is None or mask_numel(prefix_lens_sum, bs, num_nodes) > buffer.numel():
            return None
        return buffer

    def _ddtree_verify_inputs(self, tree, root_tokens, prefix_lens, prefix_lens_sum, req_to_token, req_pool_indices):
        """TreeVerifyArrays (``out_cache_loc``: each node's KV slot, among positions prefix..prefix+N)."""
        mask_buffer = self._ddtree_mask_buffer(root_tokens.shape[0], prefix_lens_sum, tree.budget + 1)
        return build_verify_arrays(tree, root_tokens, prefix_lens, prefix_lens_sum, req_to_token, req_pool_indices,
                                   mask_buffer, backend=self._ddtree_glue)

    # --- 4) accept and commit --------------------------------------------------------------------------------
    def _ddtree_target_tokens(self, arrays, next_token_logits: torch.Tensor, sampling_info: Any) -> torch.Tensor:
        """int64 [bs, M]: the target's token at every node, which the walk follows: the argmax (greedy), the token
        SGLang's seeded sampler draws there (same seed, same position as without speculation), or a draw from the
        node's filtered distribution (``verify.race_tokens``, the exponential race: no float64 CDF of [bs, M, V];
        the walk over these is ``verify.sampling_walk``'s, exactly lossless).

        First SGLang's own DFLASH verify adjustments (``apply_dflash_verify_logits_adjustments``: custom logit
        processors, the penalizers' accumulated penalties of the committed output, min_new_tokens, logit_bias)
        on every node's logits, in place, as DFLASH applies them to every block position (a no-op for requests
        without them). Penalties counting each node's own path are ``logit_adjust.apply_tree_logit_adjustments``
        (not wired yet)."""
        bs, m = arrays.retrieve_index.shape
        if sampling_info is not None:
            from sglang.srt.speculative.dflash_utils import apply_dflash_verify_logits_adjustments

            apply_dflash_verify_logits_adjustments(
                next_token_logits=next_token_logits, sampling_info=sampling_info, draft_token_num=m
            )
        logits = next_token_logits.view(bs, m, -1)
        if sampling_info is None or getattr(sampling_info, "is_all_greedy", True):
            return torch.argmax(logits, dim=-1)
        if getattr(sampling_info, "sampling_seed", None) is not None:
            return _seeded_target_tokens(logits, sampling_info, arrays.positions.view(bs, m))
        return race_tokens(_target_probs(logits, sampling_info, self._ddtree_min_p_renorms))

    def _ddtree_walk_commit(self, tree, arrays, target: torch.Tensor, prefix_lens, kv_pool):
        """(local accept_index [bs, S], accept_len [bs], bonus [bs], CommitPlan) of the walk along ``target``
        (``_ddtree_target_tokens``), the plan's KV moves applied: on the Triton glue one launch walks, plans and
        (with the pool's move table) moves (``_triton_glue.walk_commit``); otherwise the core's walk,
        ``commit.commit_plan`` and the pool's own move (``_ddtree_commit_kv``)."""
        if self._ddtree_glue == "triton":
            from ._triton_glue import walk_commit

            table = self._ddtree_fused_move_table(kv_pool)
            index, length, bonus, fields = walk_commit(
                tree.parents, tree.tokens, target, tree.max_depth, arrays.slots, arrays.out_cache_loc, prefix_lens,
                table,
            )
            plan = CommitPlan(**fields)
        else:
            table = None
            index, length, bonus = greedy_walk(tree, target, backend=self._ddtree_glue)
            plan = commit_plan(index, length, bonus, arrays.slots, arrays.out_cache_loc, tree.tokens, prefix_lens)
        if table is None:
            self._ddtree_commit_kv(kv_pool, plan)
        return index, length, bonus, plan

    def _ddtree_fused_move_table(self, kv_pool) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The buffer table ``walk_commit`` moves the KV of ``kv_pool`` with (``slot_move_table``), or None when
        moves go through the pool's own ``move_kv_cache``; resolved once, at the glue's warm-up or the first round."""
        if not self._ddtree_move_table_resolved:
            # The fused kernel indexes the buffers with the verify's locations as they are: not where SGLang
            # translates virtual KV locations to physical ones (0.5.23's unified pools); the pool's own move does.
            translated = getattr(self.model_runner, "kv_index_translator", None) is not None
            fused = self._ddtree_glue == "triton" and not translated
            self._ddtree_move_table = slot_move_table(kv_pool) if fused else None
            self._ddtree_move_table_resolved = True
        return self._ddtree_move_table

    def _ddtree_commit_kv(self, kv_pool, plan) -> None:
        """Apply the plan's KV moves through the pool's own ``move_kv_cache`` (no-move entries become the padding
        slot 0's 0 -> 0): rounds without a move table for ``walk_commit`` (pools without one, translated KV
        locations, the torch glue)."""
        zero = torch.zeros_like(plan.move_src)
        kv_pool.move_kv_cache(torch.where(plan.move_dst >= 0, plan.move_dst, zero).reshape(-1),
                              torch.where(plan.move_src >= 0, plan.move_src, zero).reshape(-1))

    def _ddtree_mamba_commit(self, batch, accept_index, accept_len, seq_lens_pre_verify, track_interval=None,
                             last=None, replayed=False):
        """Commit the recurrent state of hybrid targets at the last ACCEPTED node (not at accept_len).

        ``replayed``: the verify ran as a CUDA graph; its metadata (the state slots) is then in the backend of the
        graph runner that replayed it, a width's own copy for the auto budget's narrower hybrid widths
        (``auto_budget.hybrid_width_backend``), else the model runner's backend itself."""
        model_runner = self.target_worker.model_runner
        attn_backend = model_runner.attn_backend
        runner = getattr(model_runner, "decode_cuda_graph_runner", None) if replayed else None
        if runner is not None and getattr(runner, "attn_backend", None) is not None:
            attn_backend = runner.attn_backend
        if not hasattr(attn_backend, "update_mamba_state_after_mtp_verify"):
            return None
        tracking = getattr(batch, "mamba_track_indices", None) is not None
        last, steps_to_track = tree_mamba_commit_indices(
            accept_index, accept_len, seq_lens_pre_verify, track_interval if tracking else None, last
        )
        attn_backend.update_mamba_state_after_mtp_verify(
            last_correct_step_indices=last,
            mamba_track_indices=getattr(batch, "mamba_track_indices", None),
            mamba_steps_to_track=steps_to_track,
            model=self.target_worker.model_runner.model,
            req_pool_indices=batch.req_pool_indices[: accept_len.shape[0]],
        )
        return last

    def _ddtree_track_interval(self) -> int | None:
        """The prefix-cache tracking interval of hybrid targets (resolved once, at start-up)."""
        try:
            from sglang.srt.runtime_context import get_exec

            return int(get_exec().mamba.mamba_track_interval)
        except Exception:
            try:
                from sglang.srt.mem_cache.mamba_utils import mamba_track_grid  # 0.5.23 spelling (best effort)

                return int(mamba_track_grid(int(getattr(self.server_args, "page_size", 1) or 1)))
            except Exception:
                return None

    def _ddtree_verified_tree(self, tree: DraftTree, candidate: int | None) -> DraftTree:
        """The tree this step verifies: the widest tree (fixed budget), its first ``candidate`` nodes (the
        budget-``candidate`` tree, budget.tree_prefix) or the argmax chain (CHAIN); the auto budget's expectations
        are taken from the widest tree first, and the graphs of the verified width are selected."""
        if candidate is None:
            return tree
        self._ddtree_auto.expect(tree)
        if candidate == CHAIN:
            verified = chain_tree(tree, backend=self._ddtree_glue)
        elif candidate < tree.budget:
            verified = tree_prefix(tree, candidate)
        else:
            verified = tree
        self._ddtree_select_width(verified.budget + 1)
        return verified

    # --- the round -------------------------------------------------------------------------------------------
    def _ddtree_round(self, batch, draft_hidden: torch.Tensor | None, on_publish, candidate: int | None = None,
                      tree: DraftTree | None = None):
        """One DDTREE round after the drafter pass: ``tree`` (built inside the drafter's graph) or, when None, the
        tree of the drafter's ``draft_hidden``; then verify, accept and commit (the module docstring's 2-4)."""
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        from .verify_spec_input import DDTreeVerifyInput

        self._ddtree_rounds += 1
        bs = len(batch.seq_lens)
        block_size = self.block_size
        draft_input = batch.spec_info
        prefix_lens = batch.seq_lens
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        root_tokens = self._draft_block_ids_buf[:bs, 0]
        block_positions = self._draft_block_positions_buf[:bs].reshape(-1)
        block_loc_2d = self._draft_verify_out_cache_loc_buf[:bs]

        tree_in_graph = tree is not None
        if tree is None:
            force = None
            if testing.ORACLE_FILE:
                force = testing.oracle_tokens(getattr(batch, "reqs", None), prefix_lens, root_tokens, block_size - 1)
            tree = self._ddtree_tree_from_hidden(
                draft_hidden.reshape(bs * (block_size - 1), -1), bs, self._ddtree_lm_head(), self._ddtree_tp_group,
                self._ddtree_vocab_size, force,
            )
        tree = self._ddtree_verified_tree(tree, candidate)
        m = tree.budget + 1

        seq_lens_cpu = batch.seq_lens_cpu
        prefix_sum_bound = self._ddtree_prefix_sum_bound(batch)
        arrays = self._ddtree_verify_inputs(
            tree, root_tokens, prefix_lens, prefix_sum_bound, req_to_token, batch.req_pool_indices
        )
        verify_input = DDTreeVerifyInput(
            draft_token=arrays.tokens,
            positions=arrays.positions,
            draft_token_num=m,
            custom_mask=arrays.custom_mask,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            retrieve_index=arrays.retrieve_index,
            retrieve_next_token=arrays.retrieve_next_token,
            retrieve_next_sibling=arrays.retrieve_next_sibling,
        )
        translator = getattr(self.model_runner, "kv_index_translator", None)
        plan_lens_cpu = seq_lens_cpu if seq_lens_cpu is not None else getattr(draft_input, "nxt_kv_lens_cpu", None)
        if translator is not None:  # 0.5.23: virtual -> physical KV locations
            verify_input.kv_loc_plan = translator.plan(
                req_pool_indices=batch.req_pool_indices,
                seq_lens=prefix_lens,
                seq_lens_cpu=plan_lens_cpu,
                write_virtual=arrays.out_cache_loc,
                read_extent=m,
            )
        batch.out_cache_loc = arrays.out_cache_loc
        seq_lens_pre_verify = batch.seq_lens.clone() if self._need_mamba_verify_commit else None
        backup = (batch.seq_lens_cpu, batch.seq_lens_sum)
        if seq_lens_cpu is not None:
            batch.seq_lens_cpu = seq_lens_cpu + m
            batch.seq_lens_sum = prefix_sum_bound + bs * m  # the sum of seq_lens_cpu + m, without another reduction
        verify_forward_batch, _ = verify_input.prepare_for_verify(
            batch=batch, target_worker=self.target_worker, **(self._ddtree_prepare_kwargs or {})
        )
        batch.seq_lens_cpu, batch.seq_lens_sum = backup
        snapshot = testing.recurrent_state_snapshot(self.target_worker.model_runner) if testing.GRAPH_CHECK else None
        target_out = self.target_worker.forward_batch_generation(
            batch=None, forward_batch=verify_forward_batch, is_verify=True, skip_attn_backend_init=True
        )
        logits_output = target_out.logits_output
        deferred = getattr(self, "_target_logits_processor", None)
        if deferred is not None and deferred.is_deferred_shard(logits_output.next_token_logits):
            logits_output.next_token_logits = deferred.finish_deferred_gather(logits_output.next_token_logits)
        check = None
        if testing.GRAPH_CHECK and target_out.can_run_cuda_graph:
            check = testing.graph_vs_eager(
                self.target_worker.model_runner, verify_forward_batch, logits_output.next_token_logits, snapshot
            )

        target = self._ddtree_target_tokens(arrays, logits_output.next_token_logits, batch.sampling_info)
        accept_index, accept_len, bonus, plan = self._ddtree_walk_commit(
            tree, arrays, target, prefix_lens, self.model_runner.token_to_kv_pool
        )
        if candidate is not None:
            self._ddtree_auto.observe(candidate, tree, accept_index, accept_len)
        if testing.STATS_FILE:
            record = {
                "bs": bs, "width": m, "graph": bool(target_out.can_run_cuda_graph), "tree_in_graph": tree_in_graph,
                "accept_len": accept_len.tolist(),
                "nonfirst": testing.nonfirst_accepts(tree, accept_index, accept_len).tolist(),
                "moves": int((plan.move_src >= 0).sum()),
            }
            if check is not None:
                record["graph_vs_eager_max_abs"], record["graph_vs_eager_argmax_diff"] = check
            testing.write_stats(record)

        if self._need_mamba_verify_commit:
            self._ddtree_mamba_commit(batch, accept_index, accept_len, seq_lens_pre_verify,
                                      self._ddtree_track_interval_value, plan.last_node,
                                      replayed=bool(target_out.can_run_cuda_graph))
        if on_publish is not None:
            on_publish(plan.new_seq_lens)

        # Drafter context: row k of request b is accepted node accept_index[b, k]'s target hidden state (rows past
        # the path: any of the request's rows, never committed), at positions prefix..prefix+block_size-1.
        hidden = torch.index_select(logits_output.hidden_states, 0, plan.hidden_rows)
        block_loc = block_loc_2d.reshape(-1)
        if translator is not None and hasattr(self, "_draft_write_ids"):
            plan_ids = translator.plan(
                req_pool_indices=batch.req_pool_indices, seq_lens=prefix_lens,
                seq_lens_cpu=plan_lens_cpu,
                write_virtual=block_loc, read_extent=block_size,
            )
            block_loc = self._draft_write_ids(plan_ids)
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden,
            cache_loc=block_loc,
            cache_loc_2d=block_loc.view(bs, block_size),
            positions=block_positions,
            commit_lens=plan.commit_lens,
        )
        logits_output.hidden_states = None

        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=plan.out_tokens.reshape(-1),
            accept_lens=plan.commit_lens,
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            next_draft_input=self._make_next_draft_input_decode(bonus_tokens=bonus, new_seq_lens=plan.new_seq_lens),
            speculative_num_draft_tokens=block_size,
            new_seq_lens=plan.new_seq_lens,
        )


#: SGLang's sampling backends whose sampler, for a batch with min-p, renormalises after top-k and again after top-p
#: (``top_k_renorm_prob``, ``top_p_renorm_prob``, ``min_p_sampling_from_probs``) instead of cutting all three jointly
MIN_P_RENORM_BACKENDS = ("flashinfer", "intel_xpu")


def sampling_backend(server_args: Any) -> str | None:
    """The sampling backend SGLang's sampler reads (``get_exec().kernel.sampling_backend``; ServerArgs' resolved
    ``sampling_backend`` where the runtime context has none), once at start-up."""
    try:
        from sglang.srt.runtime_context import get_exec

        return get_exec().kernel.sampling_backend
    except Exception:  # no runtime context yet (or none in this version): the resolved argument
        return getattr(server_args, "sampling_backend", None)


def _target_probs(logits: torch.Tensor, sampling_info: Any, min_p_renorms: bool = False) -> torch.Tensor:
    """Target probabilities per node, float32 [bs, M, V] (unnormalised where top-k/top-p/min-p cut), filtered as
    SGLang's own sampler filters them (``top_k_top_p_min_p_sampling_from_probs_torch``): softmax of logits /
    temperature; in descending order, ranks >= top_k dropped, and tokens whose preceding cumulative probability
    (over the whole distribution) exceeds top_p dropped; then min_p relative to the most likely token.

    ``min_p_renorms`` (the flashinfer backend, :data:`MIN_P_RENORM_BACKENDS`): a batch with min-p is filtered as
    that backend's sampler filters it, top-p over the top-k renormalised (the preceding cumulative probability
    compared with top_p times the top-k's mass); min-p's ratio to the most likely token is the same either way.

    A batch whose requests set none of the three (SGLang's host flags ``need_top_k_sampling``,
    ``need_top_p_sampling``, ``need_min_p_sampling`` all False; a missing flag counts as set) gets the softmax as it
    is: the sort over the vocabulary of every node, its cumulative sum and the scatter back would drop nothing."""
    bs = logits.shape[0]
    temps = sampling_info.temperatures.view(bs, 1, 1).float()
    probs = torch.softmax(logits.float() / temps.clamp(min=1e-6), dim=-1)
    if not any(getattr(sampling_info, flag, True)
               for flag in ("need_top_k_sampling", "need_top_p_sampling", "need_min_p_sampling")):
        return probs
    vocab = probs.shape[-1]
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    cumulative = torch.cumsum(sorted_probs, dim=-1)
    ranks = torch.arange(vocab, device=logits.device).view(1, 1, vocab)
    top_ks = sampling_info.top_ks.view(bs, 1, 1).to(torch.int64).clamp(min=1, max=vocab)
    top_ps = sampling_info.top_ps.view(bs, 1, 1).float()
    min_p = bool(getattr(sampling_info, "need_min_p_sampling", False))
    if min_p and min_p_renorms:
        top_ps = top_ps * cumulative.gather(-1, (top_ks - 1).expand(bs, cumulative.shape[1], 1))
    drop = (ranks >= top_ks) | ((cumulative - sorted_probs) > top_ps)
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    if min_p:
        min_ps = sampling_info.min_ps.view(bs, 1, 1).float()
        sorted_probs = sorted_probs.masked_fill(sorted_probs < sorted_probs[..., :1] * min_ps, 0.0)
    return torch.zeros_like(sorted_probs).scatter(-1, order, sorted_probs)


def _seeded_target_tokens(logits: torch.Tensor, sampling_info: Any, positions: torch.Tensor) -> torch.Tensor:
    """int64 [bs, M]: the token SGLang's seeded sampler (Gumbel-max keyed by seed, position and token id) draws at
    every node: the same draw as without speculation when the node's path is the emitted one.

    ``positions`` [bs, M]: each node's position (prefix + depth), the position SGLang's sampler is given for the
    token that follows it."""
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    bs, m, vocab = logits.shape
    temps = sampling_info.temperatures.view(bs, 1, 1).float()
    probs = torch.softmax(logits.float() / temps.clamp(min=1e-6), dim=-1).view(bs * m, vocab)
    per_node = lambda t: t.view(bs, -1)[:, :1].repeat_interleave(m, dim=0).view(-1)  # noqa: E731
    tokens = top_k_top_p_min_p_sampling_from_probs_torch(
        probs,
        per_node(sampling_info.top_ks),
        per_node(sampling_info.top_ps),
        per_node(sampling_info.min_ps) if getattr(sampling_info, "min_ps", None) is not None else None,
        bool(getattr(sampling_info, "need_min_p_sampling", False)),
        per_node(sampling_info.sampling_seed),
        positions.reshape(-1),
    )
    return tokens.view(bs, m).to(torch.int64)
