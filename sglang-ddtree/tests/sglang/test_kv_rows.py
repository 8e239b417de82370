"""The req_to_token rows of a DDTREE server hold the decode's reservation near the context limit (kv_rows.py).

On an H100 (12-05) a DDTREE server stopped with "pool memory leak detected" after a request that ended at the
1024-token context limit: DFLASH's decode reserves ``committed + 2 * num_draft_tokens`` ahead of a request, and
SGLang's rows are ``context_len + 4 + num_draft_tokens`` wide, so the end of the reservation went past the row.
Here: the arithmetic, SGLang's own row-headroom function with the plugin's hook on it (the resolved server args of
a real DDTREE and DFLASH command line), and the worker's refusal of rows that are too narrow."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

from sglang_ddtree.sglang.kv_rows import required_row_headroom, row_width_problem


@pytest.fixture(autouse=True)
def _plugin(plugins_loaded):
    return plugins_loaded


def sglang_row_headroom(num_draft_tokens: int) -> int:
    """SGLang 0.5.17-0.5.23's own headroom at page size 1 (``get_req_to_token_extra_context_len``)."""
    return 4 + num_draft_tokens


@pytest.mark.parametrize("width", [2, 5, 9, 17, 33, 64])
def test_the_furthest_reservation_fits_the_widened_row_and_not_sglangs_for_width_over_5(width):
    context_len = 1024
    furthest = context_len - 1 + 2 * width  # a running request: committed <= context_len - 1, then 2 widths
    assert context_len + required_row_headroom(width) >= furthest
    assert row_width_problem(context_len + required_row_headroom(width), context_len, width) is None
    sglang_fits = context_len + sglang_row_headroom(width) >= furthest
    assert sglang_fits == (width <= 5)
    problem = row_width_problem(context_len + sglang_row_headroom(width), context_len, width)
    assert (problem is None) == sglang_fits
    if problem:
        assert f"reserves up to position {furthest}" in problem and f"tokens {width} " in problem


def test_the_h100_leak_is_the_part_past_sglangs_row():
    # 12-05: --context-length 1024, --speculative-num-draft-tokens 17: rows of 1045; a request whose last prepare
    # saw committed = 1020 reserved up to 1054: 9 positions past the row, the 9 slots SGLang found leaked.
    row = 1024 + sglang_row_headroom(17)
    assert row == 1045 and 1020 + 2 * 17 - row == 9
    assert row_width_problem(row, 1024, 17) is not None


def test_bad_width_is_refused():
    with pytest.raises(ValueError, match="num_draft_tokens must be >= 1"):
        required_row_headroom(0)


def _call_sglang_headroom(server_args, monkeypatch):
    """SGLang's own (hooked) ``get_req_to_token_extra_context_len`` for these resolved server args: 0.5.17 takes
    them as its argument; 0.5.18+ reads SGLang's published config bags, stood in here by the same resolved values
    (page size 1), since publishing a whole server configuration is process-wide."""
    from sglang.srt import runtime_context
    from sglang.srt.mem_cache import allocation_sizing

    from sglang_ddtree.sglang.versions import resolved_field

    fn = allocation_sizing.get_req_to_token_extra_context_len
    if inspect.signature(fn.__wrapped__).parameters:
        return fn(server_args)
    spec = SimpleNamespace(**{name: resolved_field(server_args, name) for name in (
        "speculative_algorithm", "speculative_num_draft_tokens", "speculative_num_steps", "speculative_eagle_topk")})
    monkeypatch.setattr(runtime_context, "get_spec", lambda: spec)
    monkeypatch.setattr(allocation_sizing, "get_spec", lambda: spec)
    width = spec.speculative_num_draft_tokens
    monkeypatch.setattr(allocation_sizing, "max_speculative_num_draft_tokens", lambda: width)
    monkeypatch.setattr(allocation_sizing, "get_schedule", lambda: SimpleNamespace(page_size=1), raising=False)
    monkeypatch.setattr(allocation_sizing, "get_alloc_page_size", lambda: 1, raising=False)
    return fn()


@pytest.mark.parametrize(("algorithm", "num_draft_tokens"), [("DDTREE", 17), ("DFLASH", 8)])
def test_sglangs_row_headroom_is_widened_for_ddtree_only(model_dirs, monkeypatch, algorithm, num_draft_tokens):
    from _resolve import base_argv
    from sglang.srt.mem_cache import allocation_sizing, kv_cache_configurator
    from sglang.srt.server_args import prepare_server_args

    from sglang_ddtree.sglang.hooks import REQ_TO_TOKEN_EXTRA

    assert REQ_TO_TOKEN_EXTRA == f"{allocation_sizing.__name__}.get_req_to_token_extra_context_len"
    fn = allocation_sizing.get_req_to_token_extra_context_len
    assert hasattr(fn, "__wrapped__")  # HookRegistry wrapped it ...
    assert kv_cache_configurator.get_req_to_token_extra_context_len is fn  # ... where the row pools are sized
    server_args = prepare_server_args(base_argv(model_dirs, algorithm))
    if hasattr(server_args, "resolve_once"):
        server_args.resolve_once()
    extra = _call_sglang_headroom(server_args, monkeypatch)
    if algorithm == "DDTREE":  # the default budget 16: 17 verified tokens a step
        assert extra == required_row_headroom(num_draft_tokens) == 38
    else:  # DFLASH: the drafter's block (8 here), SGLang's own value untouched
        assert extra == sglang_row_headroom(num_draft_tokens) == 12


def _worker_with_pool(row_width: int, context_len: int = 1024, num_nodes: int = 17):
    from sglang_ddtree.sglang.worker import DDTreeWorker

    worker = object.__new__(DDTreeWorker)  # no GPU: the attributes alloc_memory_pool reads
    worker.ddtree_num_nodes = num_nodes
    runner = SimpleNamespace(model_config=SimpleNamespace(context_len=context_len), req_to_token_pool=None)
    worker._target_worker = SimpleNamespace(model_runner=runner)
    pool = SimpleNamespace(req_to_token=torch.zeros((3, row_width), dtype=torch.int32))
    return worker, pool


def test_worker_refuses_rows_too_narrow_for_its_reservation(monkeypatch):
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    calls = []
    monkeypatch.setattr(DFlashWorkerV2, "alloc_memory_pool", lambda self, **kw: calls.append(kw))
    worker, pool = _worker_with_pool(1024 + sglang_row_headroom(17))
    with pytest.raises(RuntimeError, match=r"rows hold 1045 positions.*up to position 1057.*get_req_to_token_extra"):
        worker.alloc_memory_pool(req_to_token_pool=pool, token_to_kv_pool_allocator=None)
    assert len(calls) == 1  # DFLASH's own allocation ran first
    worker, pool = _worker_with_pool(1024 + required_row_headroom(17))
    worker.alloc_memory_pool(req_to_token_pool=pool, token_to_kv_pool_allocator=None)
    assert len(calls) == 2
