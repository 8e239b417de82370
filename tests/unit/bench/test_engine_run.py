"""bench/gpu/engine_run.py on the CPU: under run_all.sh's call limit no engine is started too close to its end (the
call ends early instead of holding the GPU for an engine that would be cut off), a finished configuration is read
back without a start, and tau.py reports such a call as unfinished so that run_all does not mark its step done."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

GPU_BENCH = Path(__file__).resolve().parents[3] / "bench" / "gpu"
sys.path.insert(0, str(GPU_BENCH))
import engine_run


def test_seconds_left_reads_run_alls_deadline_only():
    assert engine_run.seconds_left({"RUN_ALL_DEADLINE": "1000"}, now=940.0) == 60.0
    assert engine_run.seconds_left({}, now=940.0) is None  # outside run_all.sh: no limit
    assert engine_run.seconds_left({"RUN_ALL_DEADLINE": "soon"}, now=940.0) is None


def test_no_engine_is_started_too_close_to_the_calls_end(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(engine_run.subprocess, "run", lambda *a, **k: started.append(a) or None)
    monkeypatch.setenv("RUN_ALL_DEADLINE", str(engine_run.time.time() + 30))
    with pytest.raises(engine_run.OutOfTime, match=r"(29|30) s left"):
        engine_run.run_config(tmp_path / "cfg.json", tmp_path, "DDTREE", 16, "tau")
    assert started == []
    done = tmp_path / "done.json"
    done.write_text(json.dumps({"tau": []}))
    assert engine_run.run_config(done, tmp_path, "DDTREE", 16, "tau") == {"tau": []}  # finished: read, not run
    monkeypatch.setenv("ENGINE_NEED_S", "10")
    monkeypatch.setattr(engine_run.subprocess, "run",
                        lambda cmd, env: started.append(cmd) or type("P", (), {"returncode": 1})())
    assert engine_run.run_config(tmp_path / "cfg.json", tmp_path, "DDTREE", 16, "tau") is None  # started, failed
    assert len(started) == 1
    with pytest.raises(engine_run.OutOfTime, match="an engine needs about 240 s"):  # a longer configuration's own
        engine_run.run_config(tmp_path / "cfg.json", tmp_path, "DDTREE", 16, "tau", need_s=240)
    assert len(started) == 1


def test_tau_stops_at_the_calls_end_with_a_partial_table_and_a_failed_step(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("tau_bench_time", GPU_BENCH / "tau.py")
    tau = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tau)
    pair, work = tmp_path / "pair", tmp_path / "work"
    (pair / "drafter").mkdir(parents=True)
    (pair / "drafter" / "config.json").write_text(json.dumps({"block_size": 16}))
    work.mkdir()
    # auto (the first configuration, 240 s) is out of time; none finished in an earlier call (constructed record)
    # and is in the table; every other engine is out of time too
    (work / "tau-none-0.json").write_text(json.dumps({"sglang": "0.5.17", "tau": [
        {"batch": 1, "temperature": 0.0, "tau": 1.0, "tok_s": 100.0}]}))
    monkeypatch.setenv("RUN_ALL_DEADLINE", str(engine_run.time.time() + 5))
    monkeypatch.setattr(sys, "argv", ["tau.py", "--pair", str(pair), "--work", str(work), "--new-tokens", "8"])
    assert tau.main() == 1
    table = json.loads((work / "tau.json").read_text())
    assert [r["method"] for r in table["rows"]] == ["none"]
