"""Integration tests of the lab (lab/): real systemd containers, a real training process tree, the lab server
stand-in with SGLang's own parser and registry, real HTTP.

Two groups:

* host-side tests (no docker): the lab training job and the lab server stand-in run as real processes on this
  machine with the controller venv's python (the real sglang 0.5.23; sglang-ddtree installed, so DDTREE resolves);
* lab tests: ``lab/up.sh`` brings the containers ct200 and pro6000 up (or reuses them) in their initial state,
  then the tests look at them from the host. Without a docker engine or the image these are SKIPPED with the
  reason, unless SPECDEC_REQUIRE_LAB is set (CI sets it): then they FAIL.

Run: ``.venv/bin/python -m pytest -q tests/integration/test_lab.py`` (about 2-3 minutes when the image exists).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import labkit
import pytest
from labkit import INFERENCE, LAB, PORT, REPO, TRAIN_SCRIPT, TRAINING, api_key_from_argv, docker, server_info, wait_for

IMAGE = os.environ.get("SPECDEC_LAB_IMAGE", "specdec-pivot-lab:bookworm")
REQUIRE_LAB = bool(os.environ.get("SPECDEC_REQUIRE_LAB"))
CTL = ["python3", "/usr/local/lib/specdec-lab/lab_training_ctl.py", "--config", "/opt/train/.lab-launch.json"]
STEP_RE = re.compile(r"^step (\d+) \| loss (\d+\.\d+) \| (\d+\.\d)K tok/s$")
SEED_FLAGS = [
    "--speculative-algorithm NEXTN",
    "--speculative-num-steps 3",
    "--speculative-eagle-topk 1",
    "--tp-size 2",
    "--mem-fraction-static 0.85",
    "--context-length 4096",
    "--port 30000",
]


# ------------------------------------------------------------------------------------------------ helpers
def http(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


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


def in_container(name: str, *cmd: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    return docker("exec", name, *cmd, check=check, timeout=timeout)


def processes(name: str) -> list[tuple[int, int, str]]:
    out = in_container(name, "ps", "-eo", "pid=,ppid=,args=").stdout
    rows = []
    for line in out.splitlines():
        pid, ppid, args = line.strip().split(None, 2)
        rows.append((int(pid), int(ppid), args))
    return rows


def training_tree(name: str = TRAINING) -> tuple[int, list[int]]:
    """(launcher pid, worker pids) of the one lab training job in the container."""
    rows = [r for r in processes(name) if TRAIN_SCRIPT in r[2]]
    launchers = [pid for pid, _ppid, args in rows if "--worker" not in args]
    assert len(launchers) == 1, f"expected one launcher of {TRAIN_SCRIPT}, found {rows}"
    workers = [pid for pid, ppid, args in rows if ppid == launchers[0] and "--worker" in args]
    return launchers[0], workers


def step_lines(name: str = TRAINING) -> list[int]:
    text = in_container(name, "tail", "-n", "50", "/opt/train/logs/train.log").stdout
    return [int(m.group(1)) for m in map(STEP_RE.match, text.splitlines()) if m]


def up(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["bash", str(LAB / "up.sh"), *args], check=False, capture_output=True, text=True, timeout=900, cwd=REPO
    )
    assert proc.returncode == 0, (
        f"lab/up.sh {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    )
    return proc


def lab_unavailable(reason: str) -> None:
    if REQUIRE_LAB:
        pytest.fail(f"{reason}; SPECDEC_REQUIRE_LAB is set, so the lab must run here")
    pytest.skip(f"{reason}; set SPECDEC_REQUIRE_LAB=1 to make this a failure")


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
def host_servers(tiny_models: Path) -> Iterator[dict[str, str]]:
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
        wait_http(nextn_url + "/health", 180, nextn)
        wait_http(ddtree_url + "/health", 180, ddtree)
        yield {"NEXTN": nextn_url, "DDTREE": ddtree_url}
    finally:
        stop_server(nextn)
        stop_server(ddtree)


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
        wait_http(url + "/health", 180, proc)  # /health is open, as in SGLang
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


# ------------------------------------------------------------------------------------------------ the lab
@pytest.fixture(scope="module")
def lab() -> Iterator[dict[str, str]]:
    if shutil.which("docker") is None:
        lab_unavailable("no docker client on PATH (lab/setup-docker.sh installs docker.io)")
    if docker("info", check=False, timeout=30).returncode != 0:
        lab_unavailable("no docker engine answers (lab/setup-docker.sh starts one)")
    if docker("image", "inspect", IMAGE, check=False).returncode != 0:
        lab_unavailable(f"the lab image {IMAGE} is missing (lab/setup-docker.sh builds it)")
    if not (REPO / ".venv" / "bin" / "ansible-playbook").exists():
        lab_unavailable(".venv/bin/ansible-playbook is missing (make setup-python)")
    # The lab is shared: hold its lock (the one lab/up.sh and lab/run-pivot.sh take) while these tests change it.
    with open(os.environ.get("SPECDEC_LAB_LOCK", "/tmp/specdec-lab.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.environ["SPECDEC_LAB_LOCKED"] = "1"
        try:
            up()
            yield {"url": f"http://127.0.0.1:{PORT}"}
        finally:
            os.environ.pop("SPECDEC_LAB_LOCKED", None)
            fcntl.flock(lock, fcntl.LOCK_UN)


def test_containers_run_systemd_as_pid1(lab) -> None:
    for name in (TRAINING, INFERENCE):
        assert in_container(name, "cat", "/proc/1/comm").stdout.strip() == "systemd"
        state = in_container(name, "systemctl", "is-system-running", check=False).stdout.strip()
        assert state in ("running", "degraded"), f"{name}: systemd is {state}"
        assert docker("inspect", "-f", "{{.HostConfig.Privileged}}", name).stdout.strip() == "false"


def test_inference_port_is_published_on_loopback_only(lab) -> None:
    mappings = docker("port", INFERENCE, "30000/tcp").stdout.split()
    assert mappings == [f"127.0.0.1:{PORT}"]
    assert docker("port", TRAINING, check=False).stdout.strip() == ""


def test_training_tree_runs_and_logs_steps(lab) -> None:
    launcher, workers = training_tree()
    assert len(workers) == 2
    args = dict((pid, a) for pid, _pp, a in processes(TRAINING))
    assert "--nproc-per-node 2" in args[launcher]
    first = step_lines()
    assert first, "no 'step N | loss X | 19.5K tok/s' lines in /opt/train/logs/train.log"
    wait_for(lambda: step_lines()[-1] > first[-1], 20, "the job keeps logging new steps")
    assert training_tree() == (launcher, workers)  # the same processes, still running


def test_sglang_service_active_with_the_seed_flags(lab) -> None:
    assert in_container(INFERENCE, "systemctl", "is-active", "sglang.service").stdout.strip() == "active"
    unit = in_container(INFERENCE, "cat", "/etc/systemd/system/sglang.service").stdout
    exec_lines = unit[unit.index("ExecStart=") :].split("\nRestart=")[0].splitlines()
    assert exec_lines[0] == "ExecStart=/opt/sglang/venv/bin/python -m sglang_lab_server \\"
    assert len(exec_lines) > len(SEED_FLAGS)  # one flag per line
    for flag in SEED_FLAGS:
        assert any(line.strip().rstrip(" \\") == flag for line in exec_lines), flag
    plugin = in_container(INFERENCE, "/opt/sglang/venv/bin/python", "-m", "pip", "show", "sglang-ddtree", check=False)
    assert plugin.returncode != 0, "the initial state has no sglang-ddtree plugin"


def test_health_and_generation_from_the_host(lab) -> None:
    assert http(lab["url"] + "/health")[0] == 200
    status, raw = http(
        lab["url"] + "/generate",
        {
            "text": "The capital of France is",
            "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
        },
    )
    assert status == 200, raw
    out = json.loads(raw)
    assert len(out["output_ids"]) == 8 == out["meta_info"]["completion_tokens"]
    models = json.loads(http(lab["url"] + "/v1/models")[1])
    assert models["data"][0]["id"] == "/models/Qwen3-tiny"


def test_server_info_says_nextn(lab) -> None:
    info = json.loads(http(lab["url"] + "/get_server_info")[1])
    assert info["speculative_algorithm"] == "NEXTN"
    assert info["lab_stand_in"] is True
    assert info["version"] == "0.5.23"
    assert info["tp_size"] == 2 and info["speculative_num_steps"] == 3


PREFLIGHT_TMP = "/tmp/specdec-pivot-preflight.*"


def _preflight_leftovers() -> str:
    return labkit.sh(INFERENCE, f"ls -d {PREFLIGHT_TMP} 2>/dev/null", check=False).strip()


def test_preflight_runs_the_plugin_checks_and_changes_nothing(lab, tmp_path: Path) -> None:
    # Preflight runs the plugin's own CLI in the unit's interpreter (python -m sglang_ddtree check-drafter and
    # check-sglang, the wheel on PYTHONPATH from a temporary copy) and records which DDTREE the server will run.
    before = labkit.state()
    run = labkit.playbook("pivot.yml", "--check", report_dir=tmp_path / "reports")
    assert run.rc == 0, run.tail()
    plan = run.report()["inference"][0]["plan"]
    assert plan["ddtree"]["implementation"] == "plugin", plan["ddtree"]
    assert plan["ddtree"]["detail"] == "sglang_ddtree.sglang.spec_algo.DDTreeSpecAlgo"
    assert plan["ddtree"]["plugin_status"] == "registered" and plan["ddtree"]["sglang"] == "0.5.23"
    check = plan["drafter"]["check"]
    assert check["ok"] is True and check["consumer"] == "sglang" and check["problems"] == [], check
    assert check["path"] == "/models/Qwen3-tiny-DFlash" and check["weights_checked"] is True
    assert "DDTREE the server will run: plugin (sglang_ddtree.sglang.spec_algo.DDTreeSpecAlgo)" in run.out
    md = (run.report_dir / "pivot-report.md").read_text()
    assert "DDTREE the server will run: **plugin** (`sglang_ddtree.sglang.spec_algo.DDTreeSpecAlgo`)" in md
    assert _preflight_leftovers() == "", "the temporary copy of the plugin must be gone"
    assert labkit.plugin_version() is None, "preflight installs nothing"
    # preflight reports no change (a second pivot run must say changed=0): not even the background checks
    changed = [b.splitlines()[0] for b in run.out.split("TASK [")[1:]
               if b.startswith("specdec.pivot.sglang_preflight :") and "\nchanged:" in b]
    assert changed == [], changed
    assert labkit.state() == before


def test_preflight_stops_on_a_drafter_the_plugin_refuses(lab, tmp_path: Path) -> None:
    # A drafter whose config.json the old config-only check accepted, but DDTREE in SGLang does not honour
    # (output_multiplier != 1): preflight stops with the plugin's own message, before anything changes.
    bad = "/tmp/lab-drafter-refused"
    labkit.sh(INFERENCE, f"rm -rf {bad} && cp -a /models/Qwen3-tiny-DFlash {bad} && python3 -c \"import json; "
                         f"p='{bad}/config.json'; c=json.load(open(p)); c['output_multiplier']=2.0; "
                         "json.dump(c, open(p, 'w'))\"")
    try:
        before = labkit.state()
        run = labkit.playbook("pivot.yml", "-e", f"sglang_preflight_drafter_path={bad}", report_dir=tmp_path / "r")
        assert run.rc != 0
        assert f"the DDTREE plugin refuses the drafter {bad} on {INFERENCE}" in run.out, run.tail()
        assert "output_multiplier=2.0: DDTREE in SGLang does not apply it" in run.out, run.tail()
        assert "only 1.0 is supported" in run.out and "Nothing was changed" in run.out
        assert _preflight_leftovers() == ""
        assert labkit.state() == before
    finally:
        labkit.sh(INFERENCE, f"rm -rf {bad}", check=False)


def test_ddtree_without_plugin_exits_with_sglang_error(lab) -> None:
    proc = in_container(
        INFERENCE,
        "/opt/sglang/venv/bin/python",
        "-m",
        "sglang_lab_server",
        "--model-path",
        "/models/Qwen3-tiny",
        "--port",
        "30099",
        "--speculative-algorithm",
        "DDTREE",
        "--speculative-draft-model-path",
        "/models/Qwen3-tiny-DFlash",
        check=False,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "Unknown speculative algorithm name: DDTREE" in proc.stdout + proc.stderr


def test_nvidia_smi_stand_in_replays_two_gpus(lab) -> None:
    for name in (TRAINING, INFERENCE):
        out = in_container(name, "nvidia-smi", "-L").stdout.splitlines()
        assert [line.split(":")[0] for line in out] == ["GPU 0", "GPU 1"]


def test_supervisor_mode_restarts_the_job(lab) -> None:
    up("--", "--limit", TRAINING, "-e", "lab_training_supervisor=true")
    assert in_container(TRAINING, "systemctl", "is-active", "dflash-train.service").stdout.strip() == "active"
    launcher, workers = training_tree()
    assert len(workers) == 2
    main_pid = in_container(TRAINING, "systemctl", "show", "-p", "MainPID", "--value", "dflash-train.service")
    assert int(main_pid.stdout) == launcher
    in_container(TRAINING, "kill", "-KILL", str(launcher), *map(str, workers))
    new = wait_for(
        lambda: (t := _tree_or_none()) and t[0] != launcher and len(t[1]) == 2 and t,
        30,
        "Restart=always starts a new launcher",
    )
    assert new[0] != launcher


def _tree_or_none():
    try:
        return training_tree()
    except AssertionError:
        return None


def test_up_resets_the_lab_to_its_initial_state(lab) -> None:
    # What a pivot leaves behind: training halted, the unit switched to DDTREE (crash-looping without plugin).
    in_container(TRAINING, "systemctl", "disable", "--now", "dflash-train.service", check=False)
    in_container(TRAINING, *CTL, "stop")
    assert not [r for r in processes(TRAINING) if TRAIN_SCRIPT in r[2]]
    in_container(
        INFERENCE,
        "sed",
        "-i",
        "s/--speculative-algorithm NEXTN/--speculative-algorithm DDTREE/",
        "/etc/systemd/system/sglang.service",
    )
    in_container(INFERENCE, "systemctl", "daemon-reload")
    in_container(INFERENCE, "systemctl", "restart", "sglang.service")
    wait_for(lambda: not _serving(lab["url"]), 30, "the DDTREE unit without the plugin does not serve")

    up()
    _launcher, workers = training_tree()
    assert len(workers) == 2
    assert (
        in_container(TRAINING, "test", "!", "-e", "/etc/systemd/system/dflash-train.service", check=False).returncode
        == 0
    )
    assert json.loads(http(lab["url"] + "/get_server_info")[1])["speculative_algorithm"] == "NEXTN"
    assert http(lab["url"] + "/health")[0] == 200


def _serving(url: str) -> bool:
    try:
        return http(url + "/health", timeout=2)[0] == 200
    except OSError:
        return False
