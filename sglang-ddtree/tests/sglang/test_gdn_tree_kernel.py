"""The plugin's GatedDeltaNet tree-verify kernel (``sglang_ddtree/sglang/_triton_gdn.py``) against SGLang's own
``fused_sigmoid_gating_delta_rule_update`` in tree mode, and the hook that puts it behind
``TritonGDNKernel.target_verify`` (``gdn_verify.py``).

The kernel comparisons run in Triton's CPU interpreter, in ONE subprocess (TRITON_INTERPRET must be set before
Triton is imported): this file run as a script prints one JSON line per case. Each case fills the intermediate
buffer with noise, runs both kernels on copies, and asserts that the outputs and the WHOLE buffers (every state
written, nothing else touched) are equal bit for bit, and that the state pool was only read. The ``cuda`` test
compares the compiled kernels at Qwen3.6-27B's widths and prints both timings (``SGLANG_DDTREE_TEST_DEVICE=cuda``).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang", reason="needs the real sglang package (its kernel is the reference)")
pytest.importorskip("triton", reason="needs triton (the kernels are Triton kernels)")

HERE = Path(__file__).resolve().parent
SGLANG_KERNEL_MODULES = (
    "sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent",  # 0.5.17 to 0.5.22
    "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent",  # 0.5.23
)
#: (name, key heads, value heads, K, V, activation dtype, state dtype, tokens per request, block_v)
CASES = (
    ("chain", 2, 2, 16, 16, "float32", "float32", (6, 6), None),
    ("tree-varlen-gva", 2, 4, 32, 48, "bfloat16", "float32", (9, 5, 1), None),
    ("tree-bf16-state", 2, 4, 32, 48, "bfloat16", "bfloat16", (9, 5, 1), None),
    ("tree-narrow-tile", 1, 2, 16, 16, "bfloat16", "float32", (9, 5), 4),
    ("strided-padded", 2, 4, 24, 16, "bfloat16", "float32", (7, 4, 6), None),
)
TREES = {  # per request: each node's parent (the root's entry, 0, is not read); siblings and deep branches
    1: [0],
    4: [0, 0, 0, 1],
    5: [0, 0, 1, 0, 3],
    6: [0, 0, 1, 2, 3, 4],  # a chain
    7: [0, 0, 1, 1, 0, 4, 2],
    9: [0, 0, 1, 2, 0, 1, 5, 3, 4],
}


def sglang_reference():
    for name in SGLANG_KERNEL_MODULES:
        try:
            return importlib.import_module(name).fused_sigmoid_gating_delta_rule_update
        except ImportError:
            continue
    raise ImportError(f"none of {SGLANG_KERNEL_MODULES} imports")


def make_inputs(heads, v_heads, k_dim, v_dim, act, state, lens, device="cpu", seed=0, strided=False, trees=None):
    """Random inputs of one tree verify in SGLang's layout (the ``target_verify`` keyword arguments)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    act, state = getattr(torch, act), getattr(torch, state)
    total, n, steps = sum(lens), len(lens), max(lens)

    def rand(*shape, dtype=torch.float32):
        return torch.randn(shape, generator=gen, device=device).to(dtype)

    if strided:  # views of one packed projection, as SGLang >= 0.5.21 hands strided q/k/v to target_verify
        packed = rand(total, (2 * heads * k_dim + v_heads * v_dim) + 8, dtype=act)
        q_end, k_end = heads * k_dim, 2 * heads * k_dim
        q = packed[:, :q_end].view(1, total, heads, k_dim)
        k = packed[:, q_end:k_end].view(1, total, heads, k_dim)
        v = packed[:, k_end : k_end + v_heads * v_dim].view(1, total, v_heads, v_dim)
        ab = rand(total, 2 * v_heads, dtype=act)
        a, b = ab[:, :v_heads], ab[:, v_heads:]
    else:
        q, k = rand(1, total, heads, k_dim, dtype=act), rand(1, total, heads, k_dim, dtype=act)
        v = rand(1, total, v_heads, v_dim, dtype=act)
        a, b = rand(total, v_heads, dtype=act), rand(total, v_heads, dtype=act)
    parents = torch.zeros((n, steps), dtype=torch.int32, device=device)
    for i, length in enumerate(lens):
        parents[i, :length] = torch.tensor((trees or TREES)[length], dtype=torch.int32)
    slots = n + 3
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    ssm = rand(slots, v_heads, v_dim, k_dim, dtype=state)
    cache = torch.arange(n, device=device, dtype=torch.int64).flip(0) + 2  # not the request order
    inter = torch.arange(n, device=device, dtype=torch.int64) + 1
    if n >= 2:
        cache[1] = -1  # no initial state: starts from zeros
    if strided and n >= 3:
        inter[2] = -1  # a padded request: a plain chain, nothing stored
    return {
        "A_log": rand(v_heads), "dt_bias": rand(v_heads), "q": q, "k": k, "v": v, "a": a, "b": b,
        "ssm_states": ssm, "cache_indices": cache, "query_start_loc": cu,
        "intermediate_states_buffer": rand(n + 2, steps, v_heads, v_dim, k_dim, dtype=state),
        "intermediate_state_indices": inter, "cache_steps": steps, "retrieve_parent_token": parents,
    }


def run_sglang(reference, call):
    """SGLang's tree verify exactly as ``TritonGDNKernel.target_verify`` calls it."""
    return reference(
        A_log=call["A_log"], dt_bias=call["dt_bias"], q=call["q"], k=call["k"], v=call["v"], a=call["a"],
        b=call["b"], initial_state_source=call["ssm_states"], initial_state_indices=call["cache_indices"],
        cu_seqlens=call["query_start_loc"], use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
        softplus_threshold=20.0, is_kda=False, disable_state_update=True,
        intermediate_states_buffer=call["intermediate_states_buffer"],
        intermediate_state_indices=call["intermediate_state_indices"], cache_steps=call["cache_steps"],
        retrieve_parent_token=call["retrieve_parent_token"])


def reciprocal_norm():
    """The installed SGLang's q/k norm formula (``versions.gdn_reciprocal_norm``; the hook decides it once)."""
    from sglang_ddtree.sglang.versions import gdn_reciprocal_norm, installed_sglang_version

    return gdn_reciprocal_norm(installed_sglang_version())


def run_ours(call, **options):
    from sglang_ddtree.sglang._triton_gdn import gdn_tree_verify

    options.setdefault("reciprocal_norm", reciprocal_norm())
    return gdn_tree_verify(
        call["A_log"], call["dt_bias"], call["q"], call["k"], call["v"], call["a"], call["b"],
        initial_states=call["ssm_states"], initial_state_indices=call["cache_indices"],
        cu_seqlens=call["query_start_loc"], intermediate_states=call["intermediate_states_buffer"],
        intermediate_state_indices=call["intermediate_state_indices"], parents=call["retrieve_parent_token"],
        **options)


def with_fresh_buffers(call):
    return dict(call, intermediate_states_buffer=call["intermediate_states_buffer"].clone(),
                ssm_states=call["ssm_states"].clone())


def compare(ours, theirs, call_ours, call_theirs, pool):
    """'' when outputs, buffers and the untouched state pool agree bit for bit, else what differs."""
    import torch

    problems = []
    if ours.shape != theirs.shape or ours.dtype != theirs.dtype:
        problems.append(f"output {tuple(ours.shape)} {ours.dtype} vs {tuple(theirs.shape)} {theirs.dtype}")
    elif not torch.equal(ours, theirs):
        problems.append(f"outputs differ (max {(ours.float() - theirs.float()).abs().max().item():.3g})")
    a, b = call_ours["intermediate_states_buffer"], call_theirs["intermediate_states_buffer"]
    if not torch.equal(a, b):
        problems.append(f"intermediate states differ (max {(a.float() - b.float()).abs().max().item():.3g})")
    if not torch.equal(call_ours["ssm_states"], pool):
        problems.append("the state pool was written")
    return "; ".join(problems)


def interpreted_cases():
    """The script's work (TRITON_INTERPRET=1): yields (case, detail) with detail '' when the case passed."""
    from sglang_ddtree.sglang import gdn_verify

    reference = sglang_reference()
    for name, heads, v_heads, k_dim, v_dim, act, state, lens, block_v in CASES:
        call = make_inputs(heads, v_heads, k_dim, v_dim, act, state, lens, strided=name.startswith("strided"))
        pool = call["ssm_states"].clone()
        theirs_call, ours_call = with_fresh_buffers(call), with_fresh_buffers(call)
        theirs = run_sglang(reference, theirs_call)
        ours = run_ours(ours_call, block_v=block_v)
        yield name, compare(ours, theirs, ours_call, theirs_call, pool)

    # the hook end to end: SGLang's own target_verify (the original) against the hooked call of a DDTREE tree
    from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel

    gdn_verify.DEVICES.add("cpu")
    gdn_verify._ddtree_here = True
    original = getattr(TritonGDNKernel.target_verify, "__wrapped__", TritonGDNKernel.target_verify)
    hook = gdn_verify.make_hook(reciprocal_norm())
    call = make_inputs(2, 4, 16, 16, "bfloat16", "float32", (9, 5), seed=1)
    pool = call["ssm_states"].clone()
    theirs_call, ours_call = with_fresh_buffers(call), with_fresh_buffers(call)
    theirs = original(TritonGDNKernel(), **theirs_call)
    routed = []
    ours = hook(lambda *a, **k: routed.append(1) or original(*a, **k), TritonGDNKernel(), **ours_call)
    yield "hook", ("the hook called SGLang's kernel; " if routed else "") + compare(
        ours, theirs, ours_call, theirs_call, pool)


@pytest.fixture(scope="module")
def interpreted():
    from ddtree_testlib import run_interpreted

    return {case: row["detail"] for case, row in run_interpreted(Path(__file__)).items()}


@pytest.mark.parametrize("case", [c[0] for c in CASES] + ["hook"])
def test_interpreted_kernel_matches_sglang_bit_for_bit(case, interpreted):
    assert case in interpreted, f"case {case} did not run"
    assert interpreted[case] == "", interpreted[case]


# --- the hook (in process, no kernel runs) ----------------------------------------------------------------------


class _Tensor:
    """Enough of a tensor for the hook's host-side checks."""

    def __init__(self, *shape, device="cuda"):
        self.shape = shape
        self.device = type("Device", (), {"type": device})()

    def dim(self):
        return len(self.shape)


def _call(parents=True):
    return {"A_log": "A", "dt_bias": "dt", "q": _Tensor(1, 34, 2, 16), "k": "k", "v": "v", "a": "a", "b": "b",
            "ssm_states": _Tensor(4, 4, 16, 16), "cache_indices": "ci", "query_start_loc": "cu",
            "intermediate_states_buffer": _Tensor(3, 17, 4, 16, 16), "intermediate_state_indices": "ii",
            "cache_steps": 17, "retrieve_parent_token": "parents" if parents else None, "stable_rows": False}


@pytest.fixture
def hooked(monkeypatch):
    """(hook, calls of SGLang's kernel, calls of the plugin's) with the plugin's kernel replaced by a recorder."""
    from sglang_ddtree.sglang import _triton_gdn, gdn_verify

    ours = []
    monkeypatch.setattr(_triton_gdn, "gdn_tree_verify", lambda *a, **k: ours.append((a, k)) or "ours")
    monkeypatch.setattr(gdn_verify, "_ddtree_here", True)
    theirs = []
    return gdn_verify.make_hook(False), (lambda *a, **k: theirs.append((a, k)) or "sglang"), theirs, ours


def test_a_ddtree_tree_goes_to_the_plugins_kernel(hooked):
    hook, original, theirs, ours = hooked
    assert hook(original, "kernel", **_call()) == "ours"
    assert theirs == [] and len(ours) == 1
    args, kwargs = ours[0]
    assert args[:2] == ("A", "dt") and isinstance(args[2], _Tensor) and args[3:] == ("k", "v", "a", "b")
    assert kwargs["parents"] == "parents" and kwargs["intermediate_state_indices"] == "ii"
    assert kwargs["cu_seqlens"] == "cu" and kwargs["initial_state_indices"] == "ci"
    assert kwargs["reciprocal_norm"] is False


def test_no_tree_another_algorithm_or_another_device_goes_to_sglang(hooked, monkeypatch):
    from sglang_ddtree.sglang import gdn_verify

    hook, original, theirs, ours = hooked
    assert hook(original, "kernel", **_call(parents=False)) == "sglang"  # a chain verify (DFLASH's)
    cpu = dict(_call(), q=_Tensor(1, 34, 2, 16, device="cpu"))
    assert hook(original, "kernel", **cpu) == "sglang"
    monkeypatch.setattr(gdn_verify, "_ddtree_here", False)  # e.g. EAGLE's tree on a hybrid target
    assert hook(original, "kernel", **_call()) == "sglang"
    assert len(theirs) == 3 and ours == []
    assert theirs[0][0] == ("kernel",) and theirs[0][1]["stable_rows"] is False  # passed through as given


def test_sglangs_kernel_stays_unless_the_env_var_opts_in(monkeypatch, caplog):
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_ddtree.sglang import gdn_verify

    recorded = []
    monkeypatch.setattr(HookRegistry, "register", classmethod(lambda cls, target, *a, **k: recorded.append(target)))
    assert gdn_verify.install_problem({gdn_verify.ENV: "1"}) is None
    for on in ("1", "on", "plugin"):
        assert gdn_verify.enabled({gdn_verify.ENV: on})
    for off in ({}, {gdn_verify.ENV: "0"}, {gdn_verify.ENV: "off"}, {gdn_verify.ENV: "sglang"}):
        assert not gdn_verify.enabled(off)
        assert gdn_verify.ENV in gdn_verify.install_problem(off)
    monkeypatch.delenv(gdn_verify.ENV, raising=False)
    with caplog.at_level("INFO", logger=gdn_verify.__name__):
        assert gdn_verify.register_gdn_hook() == []
    assert recorded == []
    assert [r for r in caplog.records if "stays SGLang's kernel" in r.getMessage() and r.levelname == "INFO"]
    monkeypatch.setenv(gdn_verify.ENV, "1")
    assert gdn_verify.register_gdn_hook() == [gdn_verify.TARGET] == recorded


def test_the_installed_sglang_has_the_expected_method_and_the_opted_in_hook_is_applied(monkeypatch):
    import collections

    from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_ddtree.sglang import gdn_verify

    original = getattr(TritonGDNKernel.target_verify, "__wrapped__", TritonGDNKernel.target_verify)
    assert gdn_verify.signature_problem(original) is None
    # a registry of this test's own, and SGLang's method put back afterwards
    monkeypatch.setattr(TritonGDNKernel, "target_verify", original)
    monkeypatch.setattr(HookRegistry, "_hooks", collections.defaultdict(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    monkeypatch.setenv(gdn_verify.ENV, "1")
    assert gdn_verify.register_gdn_hook() == [gdn_verify.TARGET]
    HookRegistry.apply_hooks()
    assert TritonGDNKernel.target_verify is not original
    assert TritonGDNKernel.target_verify.__wrapped__ is original  # HookRegistry wrapped SGLang's method


def test_another_signature_is_refused_once_at_start_up(monkeypatch, caplog):
    import pkgutil

    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_ddtree.sglang import gdn_verify

    class Changed:
        def target_verify(self, A_log, dt_bias, q, k, v, a, b, *, ssm_states, cache_indices, query_start_loc,
                          intermediate_states_buffer, intermediate_state_indices, retrieve_parent_token, **kwargs):
            raise AssertionError("never called")

    recorded = []
    monkeypatch.setattr(HookRegistry, "register", classmethod(lambda cls, target, *a, **k: recorded.append(target)))
    resolve = pkgutil.resolve_name
    owner = gdn_verify.TARGET.rpartition(".")[0]
    monkeypatch.setattr(pkgutil, "resolve_name", lambda name: Changed if name == owner else resolve(name))
    monkeypatch.setenv(gdn_verify.ENV, "1")
    with caplog.at_level("WARNING", logger=gdn_verify.__name__):
        assert gdn_verify.register_gdn_hook() == []
    assert recorded == []
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "stays SGLang's kernel" in line and "cache_steps" in line
    monkeypatch.setattr(pkgutil, "resolve_name", lambda name: object if name == owner else resolve(name))
    assert "not available" in gdn_verify.install_problem({gdn_verify.ENV: "1"})


@pytest.mark.parametrize(("version", "reciprocal"), [("0.5.17", False), ("0.5.21", False), ("0.5.22", True),
                                                     ("0.5.23.post1", True), (None, False)])
def test_the_norm_formula_follows_the_sglang_release(version, reciprocal):
    from sglang_ddtree.sglang.versions import gdn_reciprocal_norm

    assert gdn_reciprocal_norm(version) is reciprocal


def test_the_tile_is_sglangs_launch_rule(monkeypatch):
    import torch

    from sglang_ddtree.sglang import _triton_gdn

    cuda = torch.device("cuda")
    for capability, requests, dims, tile in (((9, 0), 32, (128, 128), 4), ((9, 0), 64, (128, 128), 4),
                                             ((9, 0), 65, (128, 128), 32), ((8, 0), 32, (128, 128), 32),
                                             ((9, 0), 32, (64, 128), 32), (None, 32, (128, 48), 32),
                                             (None, 2, (16, 16), 16)):
        monkeypatch.setattr(_triton_gdn, "_capability", lambda device, c=capability: c)
        assert _triton_gdn.default_block_v(*dims, requests, cuda) == tile, (capability, requests, dims)


# --- on a GPU: Qwen3.6-27B's widths -------------------------------------------------------------------------------


#: a DDTREE-like 17-node tree: the greedy chain first (nodes 1-8), then branches off it and off each other
GPU_TREE = [0, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 10, 2, 12, 3, 9, 5]


def _graph_ms(fn, repeats=50):
    """GPU ms of one ``fn()`` replayed from a CUDA graph, as the engine runs the verify (no host time: the
    launchers' Python, e.g. the version lookup, does not count)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # compiled and warm outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def test_the_kernel_compiles_for_hopper():
    """Compiled for sm_90 on this machine (no GPU): the interpreted tests above never type-check the compiled
    language (its control flow in particular)."""
    from ddtree_testlib import compile_for_sm90

    from sglang_ddtree.sglang import _triton_gdn

    ptx = compile_for_sm90(_triton_gdn._tree_gated_delta_kernel, {
        **{n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "a_ptr", "b_ptr", "o_ptr")},
        **{n: "*fp32" for n in ("a_log_ptr", "dt_bias_ptr", "h0_ptr", "buf_ptr")},
        **{n: "*i64" for n in ("h0_idx_ptr", "buf_idx_ptr")},
        **{n: "*i32" for n in ("parent_ptr", "cu_ptr")},
        **{n: "fp32" for n in ("scale", "softplus_beta", "softplus_threshold")},
    }, {"H": 16, "HV": 48, "K": 128, "V": 128, "BK": 128, "BV": 4, "RECIPROCAL_NORM": False,
        "ROUND_KEPT_STATE": False})
    assert ".entry _tree_gated_delta_kernel" in ptx


@pytest.mark.cuda
@pytest.mark.parametrize("block_v", [None, 4, 32], ids=["tile-default", "tile-4", "tile-32"])
@pytest.mark.parametrize("tree", ["ddtree", "chain"])
def test_cuda_matches_sglang_at_qwen36_27b_widths_and_times_both(device, tree, block_v):
    """Batch 32, 17 tokens each, 16 key / 48 value heads of 128 (Qwen3.6-27B's GatedDeltaNet,
    tests/unit/fixtures/models/qwen3.6-27b-like), fp32 states as its ``mamba_ssm_dtype``: bit for bit SGLang's at
    every tile (``_triton_gdn.default_block_v``: 4 on Hopper; SGLang up to 0.5.21 launches 32), timings printed."""
    import torch

    trees = {17: GPU_TREE if tree == "ddtree" else [0, *range(16)]}
    call = make_inputs(16, 48, 128, 128, "bfloat16", "float32", (17,) * 32, device=device, trees=trees)
    reference = sglang_reference()
    pool = call["ssm_states"].clone()
    theirs_call, ours_call = with_fresh_buffers(call), with_fresh_buffers(call)
    theirs = run_sglang(reference, theirs_call)
    ours = run_ours(ours_call, block_v=block_v)
    torch.cuda.synchronize()
    detail = compare(ours, theirs, ours_call, theirs_call, pool)
    norm = reciprocal_norm()
    sglang_ms = _graph_ms(lambda: run_sglang(reference, theirs_call))
    ours_ms = _graph_ms(lambda: run_ours(ours_call, block_v=block_v, reciprocal_norm=norm))
    print(f"\nGDN tree verify ({tree}, batch 32 x 17, HV 48, K=V 128, fp32 states, tile {block_v or 'default'}) on "
          f"{torch.cuda.get_device_name()}: SGLang {sglang_ms * 1e3:.1f} us, plugin {ours_ms * 1e3:.1f} us "
          f"({ours_ms / sglang_ms:.3f}x); {'bit for bit' if not detail else detail}")
    assert detail == "", detail


if __name__ == "__main__":  # the interpreted run (TRITON_INTERPRET=1), started by the ``interpreted`` fixture
    sys.path.insert(0, str(HERE.parents[1] / "src"))
    for case_name, case_detail in interpreted_cases():
        print(json.dumps({"case": case_name, "detail": case_detail}), flush=True)
