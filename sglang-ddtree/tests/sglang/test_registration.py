"""Entry point, registration through SGLang's load_plugins(), the spec class, unsupported versions."""

from __future__ import annotations

import importlib.metadata
import logging
from types import SimpleNamespace

import pytest


def test_entry_point_is_declared_in_sglang_plugin_group():
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    ours = [ep for ep in eps if ep.name == "ddtree"]
    assert len(ours) == 1
    assert ours[0].value == "sglang_ddtree.sglang:register"
    assert ours[0].load().__module__ == "sglang_ddtree.sglang"


def test_load_plugins_registers_ddtree(plugins_loaded):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    import sglang_ddtree.sglang as plugin
    from sglang_ddtree.sglang.spec_algo import DDTreeSpecAlgo

    assert plugin.last_status in ("registered", "already-registered")
    algo = SpeculativeAlgorithm.from_string("DDTREE")
    assert isinstance(algo, DDTreeSpecAlgo)
    assert SpeculativeAlgorithm.from_string("ddtree") is algo
    assert algo.name == "DDTREE"
    assert algo.supports_overlap is True


def test_ddtree_is_dflash_family_where_sglang_asks(plugins_loaded):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string("DDTREE")
    assert algo.is_dflash() and algo.is_dflash_family() and algo.supports_target_verify_for_draft()
    assert not algo.is_eagle() and not algo.is_none() and algo.is_speculative() and algo.is_some()
    assert algo.need_topk() is False and algo.carries_draft_hidden_states() is False
    assert algo.get_platform_worker_cls() is None
    # the target verifies budget+1 nodes; the drafter's TARGET_VERIFY width is the block size (from server args)
    assert algo.get_num_tokens_per_req_for_target_verify(17, False) == 17


def test_spec_class_has_every_predicate_and_method_of_the_builtin_enum(plugins_loaded):
    """SGLang calls these on whatever from_string returns; a missing one is an AttributeError at run time."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string("DDTREE")
    enum_methods = {
        name
        for name, value in vars(SpeculativeAlgorithm).items()
        if callable(value) and not name.startswith("_") and name not in ("from_string", "register")
    }
    missing = sorted(name for name in enum_methods if not callable(getattr(algo, name, None)))
    assert missing == []


def test_builtin_names_still_resolve_to_builtins(plugins_loaded):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    assert SpeculativeAlgorithm.from_string("DFLASH") is SpeculativeAlgorithm.DFLASH
    assert SpeculativeAlgorithm.from_string("EAGLE") is SpeculativeAlgorithm.EAGLE
    with pytest.raises(ValueError, match="Unknown speculative algorithm"):
        SpeculativeAlgorithm.from_string("DDTREE_TYPO")


def test_hooks_are_applied_and_act_for_ddtree_only(plugins_loaded):
    from sglang.srt.speculative import spec_utils

    from sglang_ddtree.sglang.hooks import spec_need_hidden_states_hook

    assert hasattr(spec_utils.spec_need_hidden_states, "__wrapped__")  # HookRegistry wrapped it
    calls = []

    def original(*args, **kwargs):
        calls.append(args)
        return "original"

    dflash = SimpleNamespace(speculative_algorithm="DFLASH")
    ddtree = SimpleNamespace(speculative_algorithm="DDTREE")
    assert spec_need_hidden_states_hook(original, dflash) == "original"
    assert spec_need_hidden_states_hook(original, ddtree) is False
    assert len(calls) == 1


def _dummy_args(spec_algorithm, mask, width):
    """Positional arguments of create_dummy_verify_input for the installed version."""
    import inspect

    from sglang.srt.speculative import spec_info

    params = list(inspect.signature(spec_info.create_dummy_verify_input.__wrapped__).parameters)
    if "server_args" in params:  # 0.5.17
        return (spec_algorithm, None, mask, width, False)
    return (spec_algorithm, mask, width, False)  # 0.5.23


def test_create_dummy_verify_input_hook_passes_dflash_through(plugins_loaded):
    import torch
    from sglang.srt.speculative import spec_info

    from sglang_ddtree.sglang.hooks import create_dummy_verify_input_hook

    assert hasattr(spec_info.create_dummy_verify_input, "__wrapped__")  # HookRegistry wrapped it
    seen = []

    def original(*args, **kwargs):
        seen.append((args, kwargs))
        return "sglang's dummy"

    args = _dummy_args(spec_info.SpeculativeAlgorithm.DFLASH, torch.ones(4, dtype=torch.bool), 4)
    assert create_dummy_verify_input_hook(original, *args) == "sglang's dummy"
    assert seen == [(args, {})]


def test_create_dummy_verify_input_for_ddtree_carries_mask_and_tree_topk(plugins_loaded):
    import torch
    from sglang.srt.speculative import spec_info
    from sglang.srt.speculative.spec_info import SpecInputType, SpeculativeAlgorithm

    from sglang_ddtree.sglang.server_args import TREE_TOPK
    from sglang_ddtree.sglang.verify_spec_input import DDTreeVerifyInput

    algo = SpeculativeAlgorithm.from_string("DDTREE")
    mask = torch.ones(64, dtype=torch.bool)
    dummy = spec_info.create_dummy_verify_input(*_dummy_args(algo, mask, 17))  # through SGLang's patched function
    assert isinstance(dummy, DDTreeVerifyInput)
    assert dummy.custom_mask is mask and dummy.topk == TREE_TOPK and dummy.topk > 1
    assert dummy.draft_token_num == 17 and dummy.spec_input_type == SpecInputType.DFLASH_VERIFY


class TritonAttnBackend:
    """Named like SGLang's Triton backend: ``resolve_dflash_verify_mask_policy`` decides by the class name."""


def _graph_runner(algo, is_draft_worker=False, width=17):
    """The attributes of a DecodeCudaGraphRunner that ``get_spec_info`` reads (no GPU, no capture)."""
    import torch

    model_runner = SimpleNamespace(
        spec_algorithm=algo, is_draft_worker=is_draft_worker, attn_backend=TritonAttnBackend(),
        server_args=SimpleNamespace(speculative_eagle_topk=None),
    )
    runner = SimpleNamespace(
        model_runner=model_runner, buffers=SimpleNamespace(custom_mask=torch.ones(64, dtype=torch.bool)),
        captured_req_width=width, speculative_num_steps=None, speculative_num_draft_tokens=width,
    )
    runner._capture_ragged_verify_layout = lambda num_tokens: None
    return runner


def test_target_verify_graphs_of_ddtree_are_captured_with_the_tree_mask(plugins_loaded):
    """Issue 13: SGLang captures DFLASH-family TARGET_VERIFY graphs without a custom mask on Triton (a chain is
    causal); a graph captured so ignores the tree mask at replay. Through SGLang's own (hooked) get_spec_info:
    DDTREE's target runner gets the mask buffer and the tree topk; DFLASH and the drafter's runner keep SGLang's
    choice (no mask)."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.speculative.spec_info import SpecInputType, SpeculativeAlgorithm

    from sglang_ddtree.sglang.server_args import TREE_TOPK
    from sglang_ddtree.sglang.verify_spec_input import DDTreeVerifyInput

    assert hasattr(DecodeCudaGraphRunner.get_spec_info, "__wrapped__")  # HookRegistry wrapped it
    ddtree = SpeculativeAlgorithm.from_string("DDTREE")

    runner = _graph_runner(ddtree)
    info = DecodeCudaGraphRunner.get_spec_info(runner, 17)
    assert isinstance(info, DDTreeVerifyInput)
    assert info.custom_mask is runner.buffers.custom_mask
    assert info.topk == TREE_TOPK > 1 and info.draft_token_num == 17
    assert info.spec_input_type == SpecInputType.DFLASH_VERIFY

    dflash = DecodeCudaGraphRunner.get_spec_info(_graph_runner(SpeculativeAlgorithm.DFLASH, width=8), 8)
    assert not isinstance(dflash, DDTreeVerifyInput) and dflash.custom_mask is None  # SGLang's causal chain

    drafter = DecodeCudaGraphRunner.get_spec_info(_graph_runner(ddtree, is_draft_worker=True, width=8), 8)
    assert not isinstance(drafter, DDTreeVerifyInput) and drafter.custom_mask is None


def test_triton_backend_of_a_ddtree_target_routes_its_tree_verify_attention(plugins_loaded, monkeypatch):
    """The hook on TritonAttnBackend.__init__ routes the extend attention of DDTREE's target runner only: not
    DFLASH's, not the drafter's, not when SGLANG_DDTREE_VERIFY_ATTENTION=sglang."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_ddtree.sglang.hooks import triton_backend_init_hook
    from sglang_ddtree.sglang.verify_attention import ENV

    assert hasattr(TritonAttnBackend.__init__, "__wrapped__")  # HookRegistry wrapped it

    def extend_attention_fwd(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr,
                             kv_indices, custom_mask, is_causal, mask_indptr, max_len_extend, k_scale, v_scale):
        return "sglang"

    def original(backend, model_runner, skip_prefill=False):  # what SGLang's __init__ does that matters here
        backend.extend_attention_fwd = extend_attention_fwd

    def routed(algo, is_draft_worker=False):
        backend = SimpleNamespace()
        runner = SimpleNamespace(spec_algorithm=algo, is_draft_worker=is_draft_worker)
        triton_backend_init_hook(original, backend, runner)
        return hasattr(backend.extend_attention_fwd, "ddtree_original")

    ddtree = SpeculativeAlgorithm.from_string("DDTREE")
    assert routed(ddtree)
    assert not routed(SpeculativeAlgorithm.DFLASH)
    assert not routed(ddtree, is_draft_worker=True)
    monkeypatch.setenv(ENV, "sglang")
    assert not routed(ddtree)


def test_server_info_of_a_ddtree_scheduler_carries_its_budget_report_and_no_other(plugins_loaded, caplog):
    """The hook on Scheduler.get_internal_state adds the DDTREE worker's ``ddtree_budget_state()`` to the state
    dict SGLang answers /get_server_info with (its own GetInternalStateReqOutput); a scheduler with another worker
    (or none) answers exactly as SGLang does, and a failing report leaves the endpoint's answer intact."""
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.managers.scheduler import Scheduler

    from sglang_ddtree.sglang.hooks import scheduler_internal_state_hook

    assert hasattr(Scheduler.get_internal_state, "__wrapped__")  # HookRegistry wrapped it

    def original(scheduler, recv_req):
        return GetInternalStateReqOutput(internal_state={"avg_spec_accept_length": 2.5, "req": recv_req})

    report = {"policy": "fixed", "candidates": ["16"], "steps": 3, "budget_histogram": {"16": 3}}
    ddtree = SimpleNamespace(draft_worker=SimpleNamespace(ddtree_budget_state=lambda: report))
    out = scheduler_internal_state_hook(original, ddtree, "req")
    assert out.internal_state == {"avg_spec_accept_length": 2.5, "req": "req", "ddtree_budget": report}
    for other in (SimpleNamespace(draft_worker=SimpleNamespace()), SimpleNamespace(draft_worker=None),
                  SimpleNamespace()):
        assert scheduler_internal_state_hook(original, other, "req").internal_state == {
            "avg_spec_accept_length": 2.5, "req": "req"}

    def broken():
        raise RuntimeError("boom")

    failing = SimpleNamespace(draft_worker=SimpleNamespace(ddtree_budget_state=broken))
    with caplog.at_level("ERROR"):
        out = scheduler_internal_state_hook(original, failing, "req")
    assert out.internal_state == {"avg_spec_accept_length": 2.5, "req": "req"}
    assert "the budget report for /get_server_info failed" in caplog.text


def test_unsupported_version_logs_one_line_and_registers_nothing(monkeypatch, caplog):
    from sglang.srt.speculative import spec_registry

    import sglang_ddtree.sglang as plugin

    monkeypatch.setattr(spec_registry, "_REGISTRY", {})
    monkeypatch.setattr(plugin, "installed_sglang_version", lambda: "0.5.12")
    with caplog.at_level(logging.INFO, logger="sglang_ddtree"):
        plugin.register()
    assert spec_registry.get_spec("DDTREE") is None
    records = [r for r in caplog.records if r.name.startswith("sglang_ddtree")]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    assert "0.5.12" in records[0].getMessage() and "0.5.17" in records[0].getMessage()
    assert plugin.last_status.startswith("skipped")


def test_register_never_raises(monkeypatch, caplog):
    from sglang.srt.speculative import spec_registry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    import sglang_ddtree.sglang as plugin

    def boom(*args, **kwargs):
        raise RuntimeError("registry exploded")

    monkeypatch.setattr(spec_registry, "_REGISTRY", {})
    monkeypatch.setattr(SpeculativeAlgorithm, "register", classmethod(boom), raising=False)
    with caplog.at_level(logging.ERROR, logger="sglang_ddtree"):
        plugin.register()  # must not raise
    assert plugin.last_status.startswith("failed") and "registry exploded" in plugin.last_status
    assert spec_registry.get_spec("DDTREE") is None


@pytest.mark.parametrize(
    ("version", "supported"),
    [("0.5.16", False), ("0.5.17", True), ("0.5.17.post1", True), ("0.5.20", True), ("0.5.23", True),
     ("0.5.24", False), ("0.6.0", False), ("0.4.9", False), ("garbage", False)],
)
def test_supported_range_is_the_declared_closed_interval(version, supported):
    from sglang_ddtree.sglang.versions import unsupported_reason

    assert (unsupported_reason(version) is None) is supported


def test_installed_sglang_is_supported():
    from sglang_ddtree.sglang.versions import installed_sglang_version, unsupported_reason

    assert unsupported_reason(installed_sglang_version()) is None


def test_a_hook_whose_target_cannot_import_is_skipped_with_one_line(monkeypatch, caplog):
    """Seen in the lab's minimal SGLang venv: spec_utils fails to import there; the hook is skipped, not broken."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_ddtree.sglang import gdn_verify, hooks

    recorded = []
    monkeypatch.setattr(HookRegistry, "register", classmethod(lambda cls, target, *a, **k: recorded.append(target)))
    monkeypatch.setenv(gdn_verify.ENV, "1")  # the opt-in hook is registered with the others
    assert hooks._target_importable(hooks.CREATE_DUMMY_VERIFY_INPUT) is None
    assert hooks._target_importable(hooks.GRAPH_GET_SPEC_INFO) is None  # a method: module + class resolve
    bogus = "sglang.srt.speculative.no_such_module_here.spec_need_hidden_states"
    assert "ModuleNotFoundError" in hooks._target_importable(bogus)
    monkeypatch.setattr(hooks, "SPEC_NEED_HIDDEN_STATES", bogus)
    with caplog.at_level("WARNING", logger=hooks.__name__):
        registered = hooks.register_hooks()
    assert registered == recorded == [hooks.CREATE_DUMMY_VERIFY_INPUT, hooks.GRAPH_GET_SPEC_INFO,
                                      hooks.TRITON_BACKEND_INIT, hooks.SCHEDULER_INTERNAL_STATE,
                                      hooks.REQ_TO_TOKEN_EXTRA, gdn_verify.TARGET]
    assert [r.getMessage() for r in caplog.records if bogus in r.getMessage() and "needs it to serve" in r.getMessage()]
