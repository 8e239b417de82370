"""``DDTreeSpecAlgo``: the registered DDTREE algorithm, which SGLang treats as a member of the DFLASH family.

SGLang dispatches on ``is_*()`` / ``supports_*()`` predicates of whatever ``from_string`` returns. DDTREE
answers like DFLASH wherever SGLang asks "is this the DFlash family?" (the drafter reuses DFLASH's model
runner set-up, target aux-hidden-state capture, KV-pool layout and draft CUDA graphs), and differs where the
tree matters:

* ``get_num_tokens_per_req_for_target_verify``: the target verifies ``budget + 1`` tree nodes per request
  (``speculative_num_draft_tokens``) while the drafter's TARGET_VERIFY pass runs one block of
  ``block_size`` tokens; DFLASH has both equal.
* ``create_worker``: ``DDTreeWorker`` (a ``DFlashWorkerV2`` subclass).
* ``handle_server_args``: ``sglang_ddtree.sglang.server_args.handle_ddtree_server_args``.

Imports SGLang at module import: only ``register()`` imports this module, after the version check.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from .server_args import current_block_size, handle_ddtree_server_args

logger = logging.getLogger(__name__)

__all__ = ["DDTreeSpecAlgo"]


_DFLASH = SpeculativeAlgorithm.DFLASH


class DDTreeSpecAlgo(CustomSpecAlgo):
    """DDTREE: DFlash drafter, tree verification. See the module docstring."""

    #: Read by ``server_args.is_ddtree`` (the hooks ask it without importing this module).
    is_ddtree_algorithm = True

    # --- identity: a member of the DFLASH family, not DFLASH itself where the name is compared ---------------
    def is_dflash(self) -> bool:
        return True

    def is_dflash_family(self) -> bool:
        return True

    def supports_target_verify_for_draft(self) -> bool:
        return True

    def supports_prefill_shared_read_done(self) -> bool:
        # As for the DFLASH family: no speculative reader of the target's extend buffers after the prefill.
        return True

    def supports_mixed_chunk(self) -> bool:
        # The tree verify batch cannot be mixed with prefill chunks (server args switch mixed chunk off).
        return False

    def supports_ragged_verify(self) -> bool:
        return False

    def supports_grammar_overlap(self) -> bool:
        return False

    def has_draft_kv(self) -> bool:
        return True

    def need_topk(self) -> bool:
        # EAGLE relays per-step top-k through the FutureMap; the DFLASH family does not.
        return False

    def carries_draft_hidden_states(self) -> bool:
        return False

    # --- scheduler / runner helpers that the enum has and CustomSpecAlgo lacks -----------------------------
    def create_future_map(self, *args: Any, **kwargs: Any):
        # SpeculativeAlgorithm.create_future_map builds FutureMap(device, self, ...): run it with self = DDTREE.
        return SpeculativeAlgorithm.create_future_map(self, *args, **kwargs)

    def get_platform_worker_cls(self):
        # Out-of-tree platforms (NPU, XPU, ...) are not supported: always the built-in (CUDA) worker.
        return None

    def get_num_tokens_per_req_for_target_verify(self, num_draft_tokens: int, is_draft_worker: bool) -> int:
        if is_draft_worker:
            block_size = current_block_size()
            if block_size is not None:
                return int(block_size)
        return int(num_draft_tokens)

    def get_num_tokens_per_bs_for_target_verify(self, num_draft_tokens: int, is_draft_worker: bool) -> int:
        # Deprecated spelling still present in 0.5.17.
        return self.get_num_tokens_per_req_for_target_verify(num_draft_tokens, is_draft_worker)

    def build_disagg_draft_input(self, *args: Any, **kwargs: Any):
        # PD disaggregation is not supported with DDTREE (rejected at start-up).
        return None

    # --- server args and worker ------------------------------------------------------------------------------
    def handle_server_args(self, server_args: Any) -> None:
        handle_ddtree_server_args(server_args)

    def __repr__(self) -> str:
        return f"DDTreeSpecAlgo({self.name!r})"


def worker_factory(server_args: Any) -> type:
    """The worker class for DDTREE (imported lazily: it pulls SGLang's model-executor stack)."""
    from .worker import DDTreeWorker

    return DDTreeWorker


assert _DFLASH.is_dflash()  # the enum member this class mirrors exists in every supported release
