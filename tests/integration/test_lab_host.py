"""The lab's parts on this machine, without containers: the lab training job and the lab server stand-in run as
real processes with the controller venv's python (the real sglang 0.5.23; sglang-ddtree installed, so DDTREE
resolves). No docker: a stage of the cpu group of scripts/test.sh (the container tests are tests/integration/
test_lab.py, in the lab group).

Run: ``.venv/bin/python -m pytest -q tests/integration/test_lab_host.py`` (about 2-3 minutes).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from labkit import LAB, STEP_RE, api_key_from_argv, http, server_info, wait_for


# ------------------------------------------------------------------------------------------------ helpers
def wait_http(url: str, deadline_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode} before {url} answered")
        try:
            if http(url, timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} did not answer 200 within {deadline_s} s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------------ host: training job
def start_job(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path, Path]:
    log, ckpt = tmp_path / "train.log", tmp_path / "checkpoints"
    fh = open(log, "ab")  # the job keeps writing to it after this function returns
    proc = subprocess.Popen(
        [
            sys.executable,
            str(LAB / "training" / "train_dflash_pipeline.py"),
            "--nproc-per-node",
            "2",
            "--checkpoint-dir",
            str(ckpt),
            "--step-interval",
            "0.05",
            "--checkpoint-every",
            "0",
            *extra,
        ],
        stdout=fh,
        stderr=subprocess.STDOUT,
    )
    fh.close()
    return proc, log, ckpt


def host_children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], check=False, capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def host_steps(log: Path) -> list[int]:
    return [int(m.group(1)) for m in map(STEP_RE.match, log.read_text().splitlines()) if m]


@pytest.fixture
def job_cleanup() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:  # only what this test started: the launcher and its own children
        for kid in host_children(proc.pid):
            try:
                os.kill(kid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_training_job_checkpoints_on_sigterm_and_resumes(tmp_path: Path, job_cleanup) -> None:
    proc, log, ckpt = start_job(tmp_path)
    job_cleanup.append(proc)
    workers = wait_for(
        lambda: host_children(proc.pid) if len(host_children(proc.pid)) == 2 else None,
        20,
        "two workers under the launcher",
    )
    wait_for(lambda: len(host_steps(log)) >= 3, 30, "step lines in the log")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    last = host_steps(log)[-1]
    state = json.loads((ckpt / f"step-{last}" / "trainer_state.json").read_text())
    assert state["global_step"] == last and state["reason"] == "SIGTERM"
    assert "received SIGTERM" in log.read_text()

    proc2, log, _unused = start_job(tmp_path)
    job_cleanup.append(proc2)
    wait_for(lambda: f"resumed from {ckpt / f'step-{last}'} at step {last}" in log.read_text(), 30, "resume line")
    wait_for(lambda: host_steps(log)[-1] > last, 30, "steps continue after the checkpoint")
    proc2.send_signal(signal.SIGTERM)
    assert proc2.wait(timeout=30) == 0


def test_training_job_stops_cleanly_when_every_process_gets_sigterm_again_and_again(
    tmp_path: Path, job_cleanup
) -> None:
    # systemd's KillMode=control-group sends SIGTERM to the launcher and every worker at once, and the launcher
    # forwards it again: a worker that gets the signal a second time while it checkpoints or tears down must still
    # exit 0 (else the launcher exits 1 and a supervisor unit ends "failed": seen in CI on 12-05).
    proc, log, _unused = start_job(tmp_path)
    job_cleanup.append(proc)
    workers = wait_for(lambda: host_children(proc.pid) if len(host_children(proc.pid)) == 2 else None, 20, "workers")
    wait_for(lambda: len(host_steps(log)) >= 2, 30, "step lines")
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        for pid in (proc.pid, *workers):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        time.sleep(0.002)
    assert proc.wait(timeout=30) == 0, log.read_text()[-1500:]
    assert "workers exited: [0, 0]" in log.read_text()


def test_training_job_worker_ignoring_sigterm_needs_sigkill(tmp_path: Path, job_cleanup) -> None:
    proc, log, _unused = start_job(tmp_path, "--ignore-sigterm-rank", "1", "--stop-timeout", "600")
    job_cleanup.append(proc)
    wait_for(
        lambda: "IGNORES SIGTERM" in log.read_text() and len(host_children(proc.pid)) == 2,
        20,
        "worker 1 announces it ignores SIGTERM",
    )
    wait_for(lambda: len(host_steps(log)) >= 2, 30, "step lines")
    rank0, rank1 = sorted(host_children(proc.pid))
    for pid in (proc.pid, rank0, rank1):
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: rank0 not in host_children(proc.pid), 20, "rank 0 exits on SIGTERM")
    time.sleep(1.0)
    assert rank1 in host_children(proc.pid), "rank 1 must survive SIGTERM"
    assert proc.poll() is None, "the launcher waits for its workers (--stop-timeout)"
    os.kill(rank1, signal.SIGKILL)
    assert proc.wait(timeout=20) == 1  # a worker died by SIGKILL: the launcher reports failure


# ------------------------------------------------------------------------------------------------ host: lab server
@pytest.fixture(scope="module")
def tiny_models() -> Path:
    out = LAB / ".build" / "models"
    proc = subprocess.run(
        [sys.executable, str(LAB / "make_tiny_models.py"), str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return out


def start_server(models: Path, *spec: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "sglang_lab_server",
        "--model-path",
        str(models / "Qwen3-tiny"),
        "--tp-size",
        "2",
        "--mem-fraction-static",
        "0.85",
        "--context-length",
        "256",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *spec,
    ]
    env = dict(os.environ, PYTHONPATH=str(LAB))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, f"http://127.0.0.1:{port}"


def exit_output(proc: subprocess.Popen, timeout: float = 360) -> str:
    """Wait for a server that must exit by itself; its output. The limit is generous: on a 2-CPU CI machine under
    load, SGLang's import alone was seen taking 105 s (the limit only bounds a hang; the assertions are on the
    output)."""
    try:
        out, _err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _err = proc.communicate()
        raise AssertionError(f"the server did not exit within {timeout} s:\n{out[-3000:]}") from None
    return out


def stop_server(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    out, _err = proc.communicate(timeout=30)
    return out


@pytest.fixture(scope="module")
def host_server_procs(tiny_models: Path) -> Iterator[dict[str, tuple[subprocess.Popen, str]]]:
    """The stand-in twice on this host: NEXTN flags (target-only decoding) and DDTREE (reference engine)."""
    nextn, nextn_url = start_server(
        tiny_models,
        "--speculative-algorithm",
        "NEXTN",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    )
    ddtree, ddtree_url = start_server(
        tiny_models,
        "--speculative-algorithm",
        "DDTREE",
        "--speculative-draft-model-path",
        str(tiny_models / "Qwen3-tiny-DFlash"),
        "--speculative-num-draft-tokens",
        "9",
    )
    try:
        wait_http(nextn_url + "/health", 360, nextn)
        wait_http(ddtree_url + "/health", 360, ddtree)
        yield {"NEXTN": (nextn, nextn_url), "DDTREE": (ddtree, ddtree_url)}
    finally:
        stop_server(nextn)
        stop_server(ddtree)


@pytest.fixture(scope="module")
def host_servers(host_server_procs) -> dict[str, str]:
    """The two stand-ins' base URLs, by algorithm."""
    return {name: url for name, (_proc, url) in host_server_procs.items()}


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["python", "-m", "sglang.launch_server", "--model-path", "/m"], None),
        (["python", "-m", "sglang.launch_server", "--api-key", "k1"], "k1"),
        (["python", "-m", "sglang.launch_server", "--api-key=k1"], "k1"),
        (["python", "-m", "sglang.launch_server", "--api-key", "k1", "--admin-api-key", "adm"], "adm"),
        (["python", "-m", "sglang.launch_server", "--admin-api-key=adm"], "adm"),
        (["python", "-m", "sglang.launch_server", "--api-key"], None),  # a dangling flag names no key
    ],
)
def test_labkit_takes_the_key_get_server_info_wants(argv, key) -> None:
    assert api_key_from_argv(argv) == key


@pytest.mark.parametrize(
    ("flags", "sent"),
    [(["--api-key", "lab-key-1"], "lab-key-1"), (["--api-key", "lab-key-1", "--admin-api-key", "adm-2"], "adm-2")],
)
def test_labkit_server_info_authenticates_to_a_keyed_server(tiny_models: Path, flags, sent) -> None:
    # labkit.server_info() sent no key, so against a server started with --api-key it got 401.
    proc, url = start_server(tiny_models, *flags)
    try:
        wait_http(url + "/health", 360, proc)  # /health is open, as in SGLang
        assert http(url + "/get_server_info")[0] == 401
        assert api_key_from_argv(proc.args) == sent
        info = server_info(url, argv=proc.args)
        assert info["model_path"] == str(tiny_models / "Qwen3-tiny"), info
    finally:
        stop_server(proc)


def test_server_greedy_generation_is_deterministic_and_sized(host_servers) -> None:
    body = {
        "text": "the tree of the model",
        "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
    }
    status, raw = http(host_servers["NEXTN"] + "/generate", body)
    assert status == 200, raw
    first = json.loads(raw)
    assert len(first["output_ids"]) == 12 == first["meta_info"]["completion_tokens"]
    assert first["meta_info"]["prompt_tokens"] > 0
    assert isinstance(first["text"], str)
    again = json.loads(http(host_servers["NEXTN"] + "/generate", body)[1])
    assert again["output_ids"] == first["output_ids"]


def test_server_ddtree_engine_is_lossless_and_reports_acceptance(host_servers) -> None:
    body = {
        "input_ids": [10, 200, 31, 47, 5],
        "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True},
    }
    budget_before = json.loads(http(host_servers["DDTREE"] + "/get_server_info")[1])["internal_states"][0][
        "ddtree_budget"]
    plain = json.loads(http(host_servers["NEXTN"] + "/generate", body)[1])
    tree = json.loads(http(host_servers["DDTREE"] + "/generate", body)[1])
    assert tree["output_ids"] == plain["output_ids"], "greedy DDTree must equal target-only greedy decoding"
    assert not [k for k in plain["meta_info"] if k.startswith("spec_")], "no verify rounds: no spec_* (as SGLang)"
    meta = tree["meta_info"]
    assert meta["speculative_algorithm"] == "DDTREE"
    assert meta["spec_verify_ct"] == len(meta["spec_accept_lengths"]) >= 1
    assert all(n >= 1 for n in meta["spec_accept_lengths"])
    # SGLang 0.5.23's definitions (TokenizerManager): completion tokens per verify round, bonus included;
    # correct drafts / (rounds x (num_draft_tokens - 1)).
    assert meta["spec_accept_length"] == pytest.approx(24 / meta["spec_verify_ct"], abs=1e-3)
    assert meta["spec_num_correct_drafts"] == sum(n - 1 for n in meta["spec_accept_lengths"])
    assert meta["spec_num_proposed_drafts"] == meta["spec_verify_ct"] * 8
    assert meta["spec_accept_rate"] == pytest.approx(
        meta["spec_num_correct_drafts"] / meta["spec_num_proposed_drafts"], abs=1e-3
    )
    info = json.loads(http(host_servers["DDTREE"] + "/get_server_info")[1])
    assert info["speculative_algorithm"] == "DDTREE" and info["lab_stand_in"] is True
    assert info["internal_states"][0]["avg_spec_accept_length"] >= 1.0
    assert "DDTree reference engine" in info["lab_engine"] and "budget 8" in info["lab_engine"]
    # sglang-ddtree's budget report (DDTreeWorker.ddtree_budget_state), as the generation probe reads it: this
    # request's verify rounds, all at the stand-in's one budget
    budget = info["internal_states"][0]["ddtree_budget"]
    assert (budget["policy"], budget["candidates"]) == ("fixed", ["8"])
    assert budget["budget_histogram"]["8"] - budget_before["budget_histogram"]["8"] == meta["spec_verify_ct"]
    assert budget["steps"] == budget["budget_histogram"]["8"]
    assert "ddtree_budget" not in json.loads(http(host_servers["NEXTN"] + "/get_server_info")[1])["internal_states"][0]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"sampling_params": {"max_new_tokens": 4}}, '"text"'),
        ({"text": "hi", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"text": "hi", "sampling_params": {"temperature": -0.5}}, "temperature"),
        ({"input_ids": [1, 99999]}, "outside the vocabulary"),
        ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 300}}, "maximum context length of 256"),
    ],
)
def test_server_rejects_bad_requests_with_the_reason(host_servers, body: dict, needle: str) -> None:
    status, raw = http(host_servers["NEXTN"] + "/generate", body)
    assert status == 400
    assert needle in json.loads(raw)["message"]


@pytest.fixture(scope="module")
def failed_starts(tiny_models: Path) -> dict[str, tuple[int, str]]:
    """Servers that must refuse to start, started together (each start is mostly SGLang's import time)."""
    procs = {
        "algorithm": start_server(tiny_models, "--speculative-algorithm", "NOSUCHALGO")[0],
        "flag": start_server(tiny_models, "--no-such-flag", "1")[0],
        # Parses, then fails at start: SGLang's ModelConfig refuses a context longer than the model's.
        "context": start_server(tiny_models, "--context-length", "65536")[0],
    }
    outputs = {name: exit_output(proc) for name, proc in procs.items()}
    return {name: (procs[name].returncode, outputs[name]) for name in procs}


def test_server_unknown_algorithm_exits_with_sglang_error(failed_starts) -> None:
    returncode, out = failed_starts["algorithm"]
    assert returncode != 0
    assert "Unknown speculative algorithm name: NOSUCHALGO" in out
    assert "sglang/srt/speculative/spec_info.py" in out  # raised by SGLang's registry, not by the stand-in


def test_server_unknown_flag_is_rejected_by_sglang_parser(failed_starts) -> None:
    returncode, out = failed_starts["flag"]
    assert returncode == 2
    assert "unrecognized arguments: --no-such-flag" in out


def test_server_context_longer_than_the_model_fails_at_start(failed_starts) -> None:
    returncode, out = failed_starts["context"]
    assert returncode == 1
    assert "User-specified context_length (65536) is greater than the derived context_length (4096)" in out
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in out


def test_server_stops_on_sigterm_with_exit_0_and_its_log_flushed(host_server_procs) -> None:
    """The stand-in ends with ``os._exit`` after its HTTP server is shut down (lab/sglang_lab_server/__main__.py):
    its exit status and its last log lines must survive that. The test stops the NEXTN server, so it runs after
    the tests that use it (file order)."""
    proc, url = host_server_procs["NEXTN"]
    assert http(url + "/health", timeout=10)[0] == 200
    proc.send_signal(signal.SIGTERM)
    out, _err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out[-3000:]
    tail = out.rstrip().splitlines()[-2:]
    assert "received SIGTERM, shutting down" in tail[0], tail
    assert tail[-1].endswith("server stopped"), tail
