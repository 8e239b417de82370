"""The fleet pivot (issue 17) in the fleet lab (lab/fleet/): fleet-a/b/c behind HAProxy (fleet-lb), load through the
balancer from lab/fleet/loadgen.py (loopback only), inventories/lab-fleet.

In file order, on one fleet reset once at the start (lab/fleet/up.sh, pivot records cleared: NEXTN everywhere):

1. a canary that fails to start (a context longer than the model's: the new server exits at start) stops the
   rollout: the canary is rolled back to NEXTN and put back into the balancer, the other hosts are never touched
   (same unit, same server process), and the fleet report says so;
2. a rolling pivot under load is interrupted (the controller killed) while the second host is out of the balancer,
   then run again: it converges (every host DDTREE and UP in HAProxy), and through both runs the load generator
   sees 0 failed and 0 truncated requests.

Without a docker engine or the image these are SKIPPED, unless SPECDEC_REQUIRE_LAB is set (CI): then they FAIL.
Run: ``.venv/bin/python -m pytest -q tests/integration/test_fleet.py``. Measured on the 2-CPU VM under load 8-12
from other jobs: 1 ~15 min and 2 ~20 min, reset included (most of it the preflight importing SGLang on three
hosts at once, twice in 2).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "fleet"))
import loadgen

IMAGE = os.environ.get("SPECDEC_LAB_IMAGE", "specdec-pivot-lab:bookworm")
REQUIRE_LAB = bool(os.environ.get("SPECDEC_REQUIRE_LAB"))
HOSTS = ["fleet-a", "fleet-b", "fleet-c"]
LB_URL = f"http://127.0.0.1:{os.environ.get('SPECDEC_FLEET_LB_PORT', '30100')}"
API = f"127.0.0.1:{os.environ.get('SPECDEC_FLEET_API_PORT', '30109')}"
PLAYBOOK = [str(REPO / ".venv/bin/ansible-playbook"), "-i", "inventories/lab-fleet", "playbooks/pivot.yml"]
# The tests are about the rollout, not the comparison: no baseline (the bench runs the full pivot). The plugin
# wheel is built in a directory of this test run's own (ddtree_plugin_build_dir): the shared default is rebuilt by
# any other pivot that runs on this controller at the same time, which fails the checksum-verified copy.
FAST = ["-e", "sglang_service_baseline=false",
        "-e", f"ddtree_plugin_build_dir={tempfile.mkdtemp(prefix='fleet-test-wheels-')}"]


def unavailable(reason: str) -> None:
    if REQUIRE_LAB:
        pytest.fail(f"{reason}; SPECDEC_REQUIRE_LAB is set, so the fleet lab must run here")
    pytest.skip(f"{reason}; set SPECDEC_REQUIRE_LAB=1 to make this a failure")


def sh(host: str, script: str) -> str:
    proc = subprocess.run(["docker", "exec", host, "sh", "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)
    return proc.stdout.strip()


def algorithm(host: str) -> str:
    """The --speculative-algorithm of the unit's running ExecStart, read on the host."""
    argv = sh(host, "systemctl show -p ExecStart --value sglang.service").split()
    return argv[argv.index("--speculative-algorithm") + 1] if "--speculative-algorithm" in argv else "?"


def main_pid(host: str) -> str:
    return sh(host, "systemctl show -p MainPID --value sglang.service")


def states() -> dict[str, str]:
    return {r["svname"]: r["status"] for r in loadgen.show_stat(API, "sglang")}


def pivot(tmp_path: Path, *args: str, name: str = "run") -> tuple[subprocess.CompletedProcess, dict]:
    report_dir = tmp_path / name
    proc = subprocess.run([*PLAYBOOK, "-e", f"pivot_report_dir={report_dir}", *FAST, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=1500, check=False)
    fleet_path = report_dir / "pivot-fleet.json"
    assert fleet_path.exists(), f"no fleet report; output:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    return proc, json.loads(fleet_path.read_text())


@pytest.fixture(scope="module")
def fleet() -> Iterator[None]:
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        unavailable("no docker engine answers (lab/setup-docker.sh starts one)")
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, check=False).returncode != 0:
        unavailable(f"the lab image {IMAGE} is missing (lab/setup-docker.sh builds it)")
    proc = subprocess.run(["bash", "lab/fleet/up.sh", "--", "-e", "lab_clear_pivot_state=true"], cwd=REPO,
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, f"lab/fleet/up.sh failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    assert states() == dict.fromkeys(HOSTS, "UP")
    assert [algorithm(h) for h in HOSTS] == ["NEXTN"] * 3
    yield


def test_failing_canary_stops_the_rollout_and_is_rolled_back(fleet, tmp_path) -> None:
    untouched = {h: main_pid(h) for h in HOSTS[1:]}
    units = {h: sh(h, "sha1sum /etc/systemd/system/sglang.service") for h in HOSTS[1:]}
    # Parses, then SGLang's ModelConfig refuses a context longer than the model's 4096 at start: on every host,
    # so a rollout that went on after the canary would fail (and restart) the others too.
    proc, fleet_report = pivot(tmp_path, "-e", "pivot_switch_serial=100%",
                               "-e", '{"sglang_preflight_extra_args": ["--context-length", "65536"]}')
    assert proc.returncode != 0
    assert "User-specified context_length (65536) is greater than the derived context_length (4096)" in proc.stdout
    hosts = {h["host"]: h for h in fleet_report["hosts"]}
    assert hosts["fleet-a"]["result"] == "failed, rolled back"
    assert hosts["fleet-a"]["algorithm"] == "NEXTN"
    assert hosts["fleet-a"]["in_rotation"] is True
    assert hosts["fleet-a"]["out_of_rotation_s"] > 0
    for h in HOSTS[1:]:
        assert hosts[h]["result"].startswith("not switched"), hosts[h]
        assert hosts[h]["algorithm"] == "NEXTN"
        assert main_pid(h) == untouched[h], f"{h}'s server was restarted"
        assert sh(h, "sha1sum /etc/systemd/system/sglang.service") == units[h]
    assert [algorithm(h) for h in HOSTS] == ["NEXTN"] * 3
    assert states() == dict.fromkeys(HOSTS, "UP")


def test_interrupted_rolling_pivot_under_load_converges_with_zero_failed_requests(fleet, tmp_path) -> None:
    stop = threading.Event()
    load: dict = {}
    loader = threading.Thread(target=lambda: load.update(loadgen.run_load(LB_URL, 20000, 1200, 2, 8, 60.0, stop)),
                              daemon=True)
    loader.start()
    try:
        # Run 1: killed (the whole controller process group) once fleet-a is switched and fleet-b has left the
        # balancer, i.e. in the middle of the second host.
        run1 = subprocess.Popen([*PLAYBOOK, "-e", f"pivot_report_dir={tmp_path / 'run1'}", *FAST], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        deadline = time.monotonic() + 900
        seen = None
        while time.monotonic() < deadline and run1.poll() is None:
            seen = states()
            if seen["fleet-b"] == "MAINT" and algorithm("fleet-a") == "DDTREE":
                break
            time.sleep(0.3)
        assert run1.poll() is None, f"run 1 ended before fleet-b left the balancer:\n{run1.stdout.read()[-4000:]}"
        assert seen is not None and seen["fleet-b"] == "MAINT", seen
        os.killpg(run1.pid, signal.SIGKILL)
        run1.wait(30)
        assert algorithm("fleet-c") == "NEXTN"

        # Run 2: the same command converges: fleet-a already switched, fleet-b back and switched, then fleet-c.
        proc, fleet_report = pivot(tmp_path, name="run2")
        assert proc.returncode == 0, proc.stdout[-4000:]
    finally:
        time.sleep(1)
        stop.set()
        loader.join(120)
    hosts = {h["host"]: h for h in fleet_report["hosts"]}
    assert hosts["fleet-a"]["result"] == "already on the planned unit"
    assert hosts["fleet-c"]["result"] == "switched"
    assert all(h["algorithm"] == "DDTREE" and h["in_rotation"] for h in hosts.values()), hosts
    assert [algorithm(h) for h in HOSTS] == ["DDTREE"] * 3
    assert states() == dict.fromkeys(HOSTS, "UP")
    assert load["sent"] > 100 and load["ok"] == load["sent"], load
    assert load["failed"] == 0 and load["truncated"] == 0, load
