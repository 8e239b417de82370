"""bench/gpu/step_cost.py's pure parts on the CPU: the greedy identity against no speculation that each step-cost
row carries, and the GPU busy time (union of kernel intervals) it reads from a profile."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

GPU_BENCH = Path(__file__).resolve().parents[3] / "bench" / "gpu"
sys.path.insert(0, str(GPU_BENCH))
import step_cost


@pytest.mark.parametrize(
    ("reference", "outputs", "expected"),
    [
        ([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 5, 6]], {"identical": 2, "requests": 2, "first_divergence": []}),
        ([[1, 2, 3], [4, 5, 6]], [[1, 2, 9], [7, 5, 6]], {"identical": 0, "requests": 2, "first_divergence": [0, 2]}),
        ([[1, 2, 3]], [[1, 2]], {"identical": 0, "requests": 1, "first_divergence": [2]}),  # stopped early
        (None, [[1]], None),  # no reference run (cost-8b-context times no `none` engine)
        ([[1]], None, None),
        ([[1], [2]], [[1]], None),  # different request counts: not comparable
    ],
)
def test_greedy_identity(reference, outputs, expected):
    assert step_cost.greedy_identity(reference, outputs) == expected


@pytest.mark.parametrize(
    ("intervals", "busy"),
    [([], 0.0), ([(0, 2), (1, 3)], 3.0), ([(0, 1), (2, 3)], 2.0), ([(0, 10), (2, 3), (4, 5)], 10.0)],
)
def test_busy_time_is_the_union(intervals, busy):
    assert step_cost.busy_time(intervals) == busy


def _gzip_trace(path: Path, events: list) -> bytes:
    import gzip
    import json

    data = gzip.compress(json.dumps({"traceEvents": events}).encode())
    path.write_bytes(data)
    return data


def test_read_traces_waits_for_a_trace_still_being_written(tmp_path):
    """The profiler's process may still be writing its gzip when stop_profile returns (H100, 12-05: EOFError): the
    reader waits until it reads whole, then returns its events."""
    import threading

    path = tmp_path / "batch1" / "trace.json.gz"
    path.parent.mkdir()
    whole = _gzip_trace(path, [{"name": "k", "ph": "X"}])
    path.write_bytes(whole[: len(whole) // 2])  # cut short, as the profiler leaves it for a moment
    writer = threading.Timer(0.3, path.write_bytes, args=(whole,))
    writer.start()
    try:
        assert step_cost.read_traces(tmp_path, wait_s=10, poll_s=0.05) == [{"name": "k", "ph": "X"}]
    finally:
        writer.join()


def test_read_traces_leaves_out_a_file_that_never_reads_whole(tmp_path):
    good = tmp_path / "a.json.gz"
    _gzip_trace(good, [{"name": "a"}])
    broken = tmp_path / "b.json.gz"
    broken.write_bytes(good.read_bytes()[:10])
    assert step_cost.read_traces(tmp_path, wait_s=0.2, poll_s=0.05) == [{"name": "a"}]


def _span(name, ts, dur, cat="python_function", tid=1):
    return {"name": name, "ph": "X", "cat": cat, "ts": ts, "dur": dur, "pid": 7, "tid": tid}


def test_host_times_split_self_from_children():
    """round (0-100) holds tree (10-40, which holds a launch 20-25) and walk (50-60); a kernel (GPU) and an
    instant event are not host time; another thread's frame is counted on its own."""
    events = [
        _span("round", 0, 100),
        _span("tree", 10, 30),
        _span("cudaLaunchKernel", 20, 5, cat="cuda_runtime"),
        _span("walk", 50, 10, cat="cpu_op"),
        {"name": "k", "ph": "X", "cat": "kernel", "ts": 0, "dur": 500, "pid": 0, "tid": 0},
        {"name": "mark", "ph": "i", "cat": "python_function", "ts": 5, "pid": 7, "tid": 1},
        _span("tree", 0, 8, tid=2),
    ]
    own, inclusive = step_cost.host_times(events)
    assert own == {"round": 60.0, "tree": 33.0, "walk": 10.0, "cudaLaunchKernel": 5.0}
    assert inclusive == {"round": 100.0, "tree": 38.0, "walk": 10.0, "cudaLaunchKernel": 5.0}


def test_host_times_count_a_recursive_frame_once_inclusively():
    events = [_span("f", 0, 10), _span("f", 2, 4), _span("g", 20, 1)]
    own, inclusive = step_cost.host_times(events, top=1)
    assert inclusive == {"f": 10.0}  # the inner call is inside the outer one's 10
    assert own == {"f": 10.0}  # 6 outer + 4 inner; top=1 leaves g out


def test_count_trace_carries_the_host_tables():
    counts = step_cost.count_trace([_span("round", 0, 10), _span("cudaLaunchKernel", 1, 2, cat="cuda_runtime")])
    assert counts["launches"] == 1
    assert counts["host_self_us"] == {"round": 8.0, "cudaLaunchKernel": 2.0}


@pytest.mark.parametrize(
    ("base", "other", "expected"),
    [
        ({"a": 5.0, "b": 1.0}, {"a": 7.0, "b": 1.0, "c": 3.0}, [("c", 3.0), ("a", 2.0)]),
        ({"a": 5.0}, {"a": 4.0}, []),  # shrank: not listed
        (None, {"a": 1.0}, []),
        ({"a": 1.0}, {}, []),
        # the profiler's own stop runs inside this span: not a step's work
        ({"scheduler.process_input_requests": 10.0}, {"scheduler.process_input_requests": 300.0, "a": 1.0},
         [("a", 1.0)]),
    ],
)
def test_host_difference_lists_what_grew(base, other, expected):
    assert step_cost.host_difference(base, other) == expected


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"dflash_ms": 2.0, "ddtree_ms": 2.1, "dflash_launches": 40.0, "ddtree_launches": 50.0}, True),
        ({"dflash_ms": 2.0, "ddtree_ms": 2.11, "dflash_launches": 40.0, "ddtree_launches": 41.0}, False),  # 1.055x
        ({"dflash_ms": 2.0, "ddtree_ms": 1.5, "dflash_launches": 40.0, "ddtree_launches": 50.5}, False),  # +10.5
        ({"dflash_ms": 2.0, "ddtree_ms": None, "dflash_launches": 40.0, "ddtree_launches": 41.0}, None),
    ],
)
def test_meets_goal_takes_time_and_launches(row, expected):
    assert step_cost.meets_goal(row) is expected


def test_parse_ab_reads_label_and_environment():
    assert step_cost.parse_ab(["tree-after-pass:SGLANG_DDTREE_TREE_IN_GRAPH=0", "x:A=b=c"]) == [
        ("tree-after-pass", {"SGLANG_DDTREE_TREE_IN_GRAPH": "0"}), ("x", {"A": "b=c"})]
    for bad in ("no-colon", "label:NOEQUALS", ":A=1", "l:=1"):
        with pytest.raises(SystemExit, match="LABEL:ENV=VALUE"):
            step_cost.parse_ab([bad])


def _record(ms: float, outputs: list[list[int]], launches: float, host: dict | None = None) -> dict:
    return {"sglang": "0.5.17", "gpu": "stand-in", "speed": [{"batch": 1, "ms_per_step": ms, "outputs": outputs}],
            "profile": [{"batch": 1, "launches_per_step": launches, "syncs_per_step": 1.0,
                         "gpu_busy_ms_per_step": 0.3, "kernel_us_per_step": {},
                         "host_self_us_per_step": host or {"a": 1.0}, "host_inclusive_us_per_step": {}}]}


def test_ab_engine_rows_carry_time_and_identity_to_ddtree(tmp_path, monkeypatch, capsys):
    """main() over finished engine records (run_config skips a configuration whose JSON exists): an --ab engine's
    row fields hold its time and launches beside DDTREE's, and whether its greedy tokens equal DDTREE's."""
    import json

    work = tmp_path / "work"
    work.mkdir()
    records = {
        "cost-DFLASH-128.json": _record(2.0, [[1, 2, 3]], 40.0),
        "cost-DDTREE16-128.json": _record(3.0, [[1, 2, 3]], 50.0),
        "cost-DDTREE16-128-tree-after-pass.json": _record(2.5, [[1, 2, 9]], 45.0, {"a": 1.0, "build_tree": 5.0}),
    }
    for name, rec in records.items():
        (work / name).write_text(json.dumps(rec))
    monkeypatch.setattr(sys, "argv", ["step_cost.py", "--models", str(tmp_path), "--work", str(work), "--label", "tiny",
                                      "--contexts", "128", "--batches", "1", "--algos", "DFLASH,DDTREE",
                                      "--ab-tree-after-pass"])
    assert step_cost.main() == 0
    (row,) = json.loads((work / "step-cost-tiny.json").read_text())["rows"]
    assert (row["dflash_ms"], row["ddtree_ms"], row["ddtree_tree_after_pass_ms"]) == (2.0, 3.0, 2.5)
    assert row["ddtree_tree_after_pass_launches"] == 45.0
    assert row["meets_goal"] is False  # 1.5x DFLASH's step
    assert row["ddtree_tree_after_pass_greedy_vs_ddtree"] == {"identical": 0, "requests": 1, "first_divergence": [2]}
    out = capsys.readouterr().out
    assert "host self time DDTREE tree-after-pass - DDTREE per step (us, under the profiler): build_tree +5.0" in out
    assert "DDTREE tree-after-pass: batch 1 context 128: 2.50 ms (1.250 of DFLASH), launches 45.0" in out
