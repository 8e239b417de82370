"""Integration tests of the lab (lab/) in its containers: real systemd, a real training process tree, the lab
server stand-in with SGLang's own parser and registry, real HTTP.

``lab/up.sh`` brings the containers ct200 and pro6000 up (or reuses them) in their initial state, then the tests
look at them from the host. Without a docker engine or the image these are SKIPPED with the reason, unless
SPECDEC_REQUIRE_LAB is set (CI sets it): then they FAIL. The same parts run on this machine without containers
in tests/integration/test_lab_host.py.

Run: ``.venv/bin/python -m pytest -q tests/integration/test_lab.py`` (about 2-3 minutes when the image exists).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import labkit
import pytest
from labkit import INFERENCE, LAB, PORT, REPO, STEP_RE, TRAIN_SCRIPT, TRAINING, docker, http, wait_for

IMAGE = os.environ.get("SPECDEC_LAB_IMAGE", "specdec-pivot-lab:bookworm")
REQUIRE_LAB = bool(os.environ.get("SPECDEC_REQUIRE_LAB"))
CTL = ["python3", "/usr/local/lib/specdec-lab/lab_training_ctl.py", "--config", "/opt/train/.lab-launch.json"]
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
        assert labkit.preflight_leftovers() == ""
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
