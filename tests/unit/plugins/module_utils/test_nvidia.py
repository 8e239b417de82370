"""Tests for plugins/module_utils/_nvidia.py: parsers on recorded nvidia-smi outputs, error classification, the
timeout runner, the NVML path, and the nvidia-smi stand-in / record.sh / compose scripts that produce and replay
the fixtures."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pynvml  # nvidia-ml-py, installed in .venv: the NVML tests use its real error classes
import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args
from ansible_collections.specdec.pivot.plugins.module_utils import _nvidia
from ansible_collections.specdec.pivot.plugins.module_utils._nvidia import (
    GpuQueryError,
    attach_processes,
    classify_failure,
    classify_nvml_error,
    parse_query_compute_apps,
    parse_query_gpu,
    query_gpus,
    read_gpus,
    read_gpus_nvidia_smi,
    read_gpus_nvml,
    run_with_timeout,
)
from nvidia_recordings import fixture_text, recorded_gpus

REPO = Path(__file__).resolve().parents[4]
FIX = REPO / "tests" / "unit" / "fixtures" / "nvidia_smi"
STAND_IN = REPO / "lab" / "stand-ins" / "nvidia-smi"
RECORDINGS = [FIX / "h200" / "idle", FIX / "h200" / "busy", FIX / "h200x2" / "idle", FIX / "h200x2" / "busy"]


def standin_env(recording: Path | None, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVIDIA_SMI_STANDIN")}
    if recording is not None:
        env["NVIDIA_SMI_STANDIN_DIR"] = str(recording)
    env.update(extra)
    return env


def run_standin(args: list[str], recording: Path | None, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(STAND_IN), *args],
        env=standin_env(recording, **extra),
        capture_output=True,
        check=False,
        text=True,
        timeout=30,
    )


# --------------------------------------------------------------------------------------------- fixtures


@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_fixture_file_says_where_it_came_from(recording):
    for out in recording.glob("*.out"):
        first = out.read_text().splitlines()[0]
        assert first.startswith("#fixture:"), out
        assert any(word in first for word in ("recorded by", "hand-written, provisional", "composed from")), first


def test_two_gpu_fixture_is_labelled_as_composed():
    for out in (FIX / "h200x2" / "busy").glob("*.out"):
        assert "composed from the recorded one-GPU H200 output: duplicated with index/uuid changed" in out.read_text()


# --------------------------------------------------------------------------------------------- parse_query_gpu


UUID_A = "GPU-11111111-2222-3333-4444-555555555555"
UUID_B = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            f"0, {UUID_A}, NVIDIA H200, 143771, 8718, 134469, 37\n",
            [(0, UUID_A, "NVIDIA H200", 143771, 8718, 134469, 37)],
            id="normal",
        ),
        pytest.param(
            f"0, {UUID_A}, NVIDIA H200, 143771, 0, 143187, [N/A]\n",
            [(0, UUID_A, "NVIDIA H200", 143771, 0, 143187, None)],
            id="utilization-n/a",
        ),
        pytest.param(
            f"0, {UUID_A}, NVIDIA A100-SXM4-80GB MIG 1g.10gb, [N/A], [Not Supported], [N/A], [N/A]\n",
            [(0, UUID_A, "NVIDIA A100-SXM4-80GB MIG 1g.10gb", None, None, None, None)],
            id="all-n/a",
        ),
        pytest.param(
            f"0, {UUID_A}, NVIDIA RTX PRO 6000 Blackwell, 97887, 1, 97280, 0\n"
            f"1, {UUID_B}, NVIDIA RTX PRO 6000 Blackwell, 97887, 91000, 6381, 99\n",
            [
                (0, UUID_A, "NVIDIA RTX PRO 6000 Blackwell", 97887, 1, 97280, 0),
                (1, UUID_B, "NVIDIA RTX PRO 6000 Blackwell", 97887, 91000, 6381, 99),
            ],
            id="two-gpus",
        ),
        pytest.param(
            f"\n  0, {UUID_A}, Odd, Name, With Commas, 1000, 10, 990, 5  \n\n",
            [(0, UUID_A, "Odd, Name, With Commas", 1000, 10, 990, 5)],
            id="name-with-commas-and-blank-lines",
        ),
        pytest.param("", [], id="empty"),
    ],
)
def test_parse_query_gpu(text, expected):
    got = [
        (
            g["index"],
            g["uuid"],
            g["name"],
            g["memory_total_mib"],
            g["memory_used_mib"],
            g["memory_free_mib"],
            g["utilization_gpu"],
        )
        for g in parse_query_gpu(text)
    ]
    assert got == expected
    assert all(g["compute_processes"] == [] for g in parse_query_gpu(text))


def test_parse_query_gpu_eight_gpus_keeps_order():
    text = "".join(
        f"{i}, GPU-{i:08d}-0000-0000-0000-000000000000, NVIDIA H200, 143771, {i}, 143000, {i}\n" for i in range(8)
    )
    gpus = parse_query_gpu(text)
    assert [g["index"] for g in gpus] == list(range(8))
    assert [g["memory_used_mib"] for g in gpus] == list(range(8))


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("index, uuid, name, memory.total [MiB], memory.used [MiB]\n", id="header-line"),
        pytest.param("No devices were found\n", id="no-devices-text"),
        pytest.param(f"zero, {UUID_A}, H200, 1, 1, 1, 1\n", id="index-not-a-number"),
        pytest.param(f"0, {UUID_A}, H200, lots, 1, 1, 1\n", id="memory-not-a-number"),
    ],
)
def test_parse_query_gpu_rejects_other_text(text):
    with pytest.raises(ValueError, match="nvidia-smi"):
        parse_query_gpu(text)


@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recorded_query_gpu_agrees_with_the_units_form(recording):
    """The noheader,nounits form and the csv form with units (same recording) carry the same numbers."""
    gpus = parse_query_gpu(fixture_text(recording / "query-gpu.out"))
    csv_lines = fixture_text(recording / "query-gpu-csv.out").strip().splitlines()
    assert csv_lines[0].startswith("index, uuid, name")
    units = parse_query_gpu("\n".join(line.replace(" MiB", "").replace(" %", "") for line in csv_lines[1:]))
    assert gpus == units
    assert len(gpus) >= 1
    for g in gpus:
        assert g["uuid"].startswith("GPU-")
        assert g["memory_total_mib"] >= g["memory_used_mib"] + g["memory_free_mib"] - 1


def test_recorded_list_names_the_same_uuids():
    for recording in RECORDINGS:
        listing = fixture_text(recording / "list.out")
        for g in parse_query_gpu(fixture_text(recording / "query-gpu.out")):
            assert f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})" in listing


# --------------------------------------------------------------------------------------------- compute apps


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", [], id="no-processes-empty"),
        pytest.param("No running processes found\n", [], id="no-processes-text"),
        pytest.param(f"{UUID_A}, 4242, /usr/bin/python3, 8708\n", [(UUID_A, 4242, "/usr/bin/python3", 8708)], id="one"),
        pytest.param(
            f"{UUID_A}, 10, python3, 100\n{UUID_B}, 11, /opt/sglang/bin/python, 70000\n{UUID_A}, 12, torchrun, 5\n",
            [(UUID_A, 10, "python3", 100), (UUID_B, 11, "/opt/sglang/bin/python", 70000), (UUID_A, 12, "torchrun", 5)],
            id="several-on-two-gpus",
        ),
        pytest.param(f"{UUID_A}, 77, python3, [N/A]\n", [(UUID_A, 77, "python3", None)], id="memory-n/a"),
        pytest.param(
            f"{UUID_A}, 78, /srv/a,b/python, 12\n", [(UUID_A, 78, "/srv/a,b/python", 12)], id="name-with-comma"
        ),
    ],
)
def test_parse_query_compute_apps(text, expected):
    got = [(a["gpu_uuid"], a["pid"], a["name"], a["used_mib"]) for a in parse_query_compute_apps(text)]
    assert got == expected


def test_parse_query_compute_apps_rejects_short_lines():
    with pytest.raises(ValueError, match="expected 4"):
        parse_query_compute_apps(f"{UUID_A}, 12\n")


def test_attach_processes_groups_by_uuid_and_drops_unknown():
    gpus = parse_query_gpu(f"0, {UUID_A}, A, 10, 5, 5, 0\n1, {UUID_B}, B, 10, 0, 10, 0\n")
    apps = parse_query_compute_apps(f"{UUID_A}, 1, p1, 2\n{UUID_A}, 2, p2, 3\nGPU-unknown, 3, p3, 4\n")
    merged = attach_processes(gpus, apps)
    assert [p["pid"] for p in merged[0]["compute_processes"]] == [1, 2]
    assert merged[1]["compute_processes"] == []
    assert gpus[0]["compute_processes"] == []  # inputs untouched


def test_recorded_busy_state_lists_the_memory_holder():
    meta = json.loads((FIX / "h200" / "meta.json").read_text())
    holder = meta["busy_holder"]
    gpus = recorded_gpus(FIX / "h200" / "busy")
    pids = [p["pid"] for p in gpus[0]["compute_processes"]]
    if holder["listed_by_nvidia_smi"]:
        assert holder["pid"] in pids
        proc = next(p for p in gpus[0]["compute_processes"] if p["pid"] == holder["pid"])
        assert proc["used_mib"] >= holder["bytes"] // _nvidia.MIB
    idle = recorded_gpus(FIX / "h200" / "idle")
    assert gpus[0]["memory_used_mib"] - idle[0]["memory_used_mib"] >= holder["bytes"] // _nvidia.MIB


# --------------------------------------------------------------------------------------------- classification


def _error_fixture(name: str) -> tuple[int, str]:
    return int((FIX / "errors" / f"{name}.rc").read_text()), fixture_text(FIX / "errors" / f"{name}.out")


@pytest.mark.parametrize(
    ("rc", "stdout", "stderr", "kind", "words"),
    [
        pytest.param(*_error_fixture("no-devices"), "", "no_devices", ["No devices were found"], id="no-devices"),
        pytest.param(
            *_error_fixture("driver-mismatch"), "", "driver_mismatch", ["mismatch", "reboot"], id="driver-mismatch"
        ),
        pytest.param(*_error_fixture("no-driver"), "", "no_gpu", ["no NVIDIA GPU", "communicate"], id="no-driver"),
        pytest.param(
            127,
            "",
            "bash: line 1: nvidia-smi: command not found\n",
            "no_gpu",
            ["no NVIDIA GPU", "not found"],
            id="command-not-found",
        ),
        pytest.param(
            12,
            "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system.\n",
            "",
            "no_gpu",
            ["NVML library"],
            id="nvml-library-missing",
        ),
        pytest.param(
            255, "Failed to initialize NVML: Unknown Error\n", "", "other", ["Unknown Error", "255"], id="unknown-error"
        ),
        pytest.param(4, "", "Insufficient Permissions\n", "other", ["Insufficient Permissions"], id="permissions"),
    ],
)
def test_classify_failure(rc, stdout, stderr, kind, words):
    err = classify_failure(rc, stdout, stderr)
    assert isinstance(err, GpuQueryError)
    assert err.kind == kind
    for word in words:
        assert word in str(err)


def test_gpu_query_error_refuses_unknown_kind():
    with pytest.raises(ValueError):
        raise GpuQueryError("x", kind="bogus")  # the constructor raises ValueError first


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "no_gpu"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "no_gpu"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "driver_mismatch"),
        (pynvml.NVML_ERROR_NOT_FOUND, "no_devices"),
        (pynvml.NVML_ERROR_GPU_IS_LOST, "other"),
    ],
)
def test_classify_nvml_error_with_real_pynvml_errors(code, kind):
    err = pynvml.NVMLError(code)  # pynvml maps the code to its subclass, e.g. NVMLError_LibraryNotFound
    assert classify_nvml_error(err).kind == kind


# --------------------------------------------------------------------------------------------- runner


@pytest.fixture
def module():
    """A real AnsibleModule (no options): the runner and readers call its run_command and get_bin_path."""
    with patch_module_args({}):
        return AnsibleModule(argument_spec={})


@pytest.fixture(params=["coreutils timeout", "timer thread"])
def runner_module(request, module, monkeypatch):
    """The module as the runner sees it on a host with coreutils ``timeout`` and on one without."""
    if request.param == "timer thread":
        real = module.get_bin_path
        monkeypatch.setattr(
            module, "get_bin_path", lambda arg, *a, **kw: None if arg == "timeout" else real(arg, *a, **kw)
        )
    else:
        assert module.get_bin_path("timeout"), "coreutils timeout is not on PATH"
    return module


def test_run_with_timeout_returns_rc_and_both_streams(runner_module):
    rc, out, err = run_with_timeout(
        runner_module,
        [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
        30,
    )
    assert (rc, out, err) == (3, "out\n", "err\n")


def test_run_with_timeout_refuses_a_shell_string(module):
    with pytest.raises(TypeError):
        run_with_timeout(module, "nvidia-smi -L", 5)


def test_run_with_timeout_missing_executable_is_no_gpu(tmp_path, module):
    with pytest.raises(GpuQueryError) as info:
        run_with_timeout(module, [str(tmp_path / "nvidia-smi")], 5)
    assert info.value.kind == "no_gpu"


def test_run_with_timeout_not_executable_is_other(tmp_path, module):
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    with pytest.raises(GpuQueryError) as info:
        run_with_timeout(module, [str(script)], 5)
    assert info.value.kind == "other"


def test_run_with_timeout_does_not_expand_variables_in_arguments(module, monkeypatch):
    monkeypatch.setenv("SPECDEC_SHOULD_NOT_EXPAND", "expanded")
    rc, out, err = run_with_timeout(
        module, [sys.executable, "-c", "import sys; print(sys.argv[1])", "$SPECDEC_SHOULD_NOT_EXPAND"], 30
    )
    assert (rc, out, err) == (0, "$SPECDEC_SHOULD_NOT_EXPAND\n", "")


def test_hung_nvidia_smi_is_killed_and_reported_as_timeout(tmp_path, monkeypatch, runner_module):
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("NVIDIA_SMI_STANDIN_MODE", "hang")
    monkeypatch.setenv("NVIDIA_SMI_STANDIN_PIDFILE", str(pidfile))
    with pytest.raises(GpuQueryError) as info:
        run_with_timeout(runner_module, [sys.executable, str(STAND_IN), "-L"], 1.0)
    assert info.value.kind == "timeout"
    assert "did not answer within 1 s" in str(info.value)
    pid = int(pidfile.read_text().split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped, not left behind


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace(module):
    """coreutils timeout SIGKILLs its group (itself included) KILL_AFTER_S s after the SIGTERM: still a timeout."""
    ignores_term = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
    )
    with pytest.raises(GpuQueryError) as info:
        run_with_timeout(module, [sys.executable, "-c", ignores_term], 0.5)
    assert info.value.kind == "timeout"


def test_timeout_message_names_the_users_limit_not_what_was_left_of_a_shared_deadline(tmp_path, monkeypatch, module):
    """The second of two queries sharing one deadline gets only the leftover (here 0.4 s of the option's 3 s);
    the message must name the option's value, which the user can raise, not the leftover (CI saw '1.99985 s')."""
    monkeypatch.setenv("NVIDIA_SMI_STANDIN_MODE", "hang")
    monkeypatch.setenv("NVIDIA_SMI_STANDIN_PIDFILE", str(tmp_path / "pids"))
    with pytest.raises(GpuQueryError) as info:
        run_with_timeout(module, [sys.executable, str(STAND_IN), "-L"], 0.4, limit=3)
    assert "did not answer within 3 s" in str(info.value)
    assert "0.4" not in str(info.value)


# --------------------------------------------------------------------------------------------- readers


@pytest.fixture
def standin_on_path(tmp_path, monkeypatch):
    """A bin dir holding only the stand-in as ``nvidia-smi``, first on PATH; returns a function selecting the
    recording and mode."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").symlink_to(STAND_IN)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    for key in [k for k in os.environ if k.startswith("NVIDIA_SMI_STANDIN")]:
        monkeypatch.delenv(key)

    def select(recording: Path | None, mode: str = "replay"):
        if recording is not None:
            monkeypatch.setenv("NVIDIA_SMI_STANDIN_DIR", str(recording))
        monkeypatch.setenv("NVIDIA_SMI_STANDIN_MODE", mode)
        return bindir / "nvidia-smi"

    return select


@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_read_gpus_nvidia_smi_through_the_stand_in(standin_on_path, recording, module):
    standin_on_path(recording)
    assert read_gpus_nvidia_smi(module, "nvidia-smi", 30) == recorded_gpus(recording)


@pytest.mark.parametrize(
    ("mode", "kind"),
    [("no-devices", "no_devices"), ("driver-mismatch", "driver_mismatch"), ("no-driver", "no_gpu")],
)
def test_read_gpus_nvidia_smi_error_modes(standin_on_path, mode, kind, module):
    standin_on_path(FIX / "h200" / "idle", mode)
    with pytest.raises(GpuQueryError) as info:
        read_gpus_nvidia_smi(module, "nvidia-smi", 30)
    assert info.value.kind == kind


def test_read_gpus_without_nvidia_smi_is_no_gpu(tmp_path, module):
    with pytest.raises(GpuQueryError) as info:
        read_gpus_nvidia_smi(module, str(tmp_path / "absent" / "nvidia-smi"), 5)
    assert info.value.kind == "no_gpu"
    assert "no NVIDIA GPU" in str(info.value)


def test_auto_backend_falls_back_to_nvidia_smi_when_nvml_cannot_init(standin_on_path, module):
    """pynvml is importable in .venv but this machine has no NVIDIA driver, so nvmlInit fails for real."""
    assert _nvidia.HAS_PYNVML
    with pytest.raises(pynvml.NVMLError):
        pynvml.nvmlInit()
    standin_on_path(FIX / "h200x2" / "busy")
    result = query_gpus(module, "nvidia-smi", 30, backend="auto")
    assert result.backend_used == "nvidia-smi"
    assert result.gpus == recorded_gpus(FIX / "h200x2" / "busy")
    assert any("NVML not used" in note and "fell back to nvidia-smi" in note for note in result.notes)
    assert read_gpus(module, "nvidia-smi", 30) == result.gpus


def test_nvml_backend_reports_the_real_init_failure(standin_on_path):
    standin_on_path(FIX / "h200" / "idle")
    with pytest.raises(GpuQueryError) as info:
        query_gpus(None, backend="nvml")
    assert info.value.kind == "no_gpu"


def test_query_gpus_rejects_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        query_gpus(None, backend="cuda")


class StandInNvml:
    """Stand-in for the pynvml module (there is no NVIDIA driver here): answers the NVML calls that
    read_gpus_nvml makes from the values given to it, raising pynvml's real error classes."""

    NVMLError = pynvml.NVMLError

    def __init__(self, devices: list[dict], init_error: int | None = None):
        self.devices = devices
        self.init_error = init_error
        self.shut_down = False

    def nvmlInit(self):
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shut_down = True

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.devices[i]

    def nvmlDeviceGetIndex(self, h):
        return h["index"]

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]

    def nvmlDeviceGetName(self, h):
        return h["name"].encode()  # older pynvml returns bytes

    def nvmlDeviceGetMemoryInfo(self, h):
        return type("Mem", (), {"total": h["memory_total"], "used": h["memory_used"], "free": h["memory_free"]})

    def nvmlDeviceGetUtilizationRates(self, h):
        if h["utilization_gpu"] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return type("Util", (), {"gpu": h["utilization_gpu"]})

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [type("P", (), {"pid": p["pid"], "usedGpuMemory": p["used_gpu_memory"]}) for p in h["compute_processes"]]

    def nvmlSystemGetProcessName(self, pid):
        names = {p["pid"]: p["name"] for d in self.devices for p in d["compute_processes"]}
        if names.get(pid) is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return names[pid]


def test_read_gpus_nvml_converts_bytes_to_mib_and_names_processes():
    dev = {
        "index": 0,
        "uuid": UUID_A,
        "name": "NVIDIA H200",
        "memory_total": 143771 * _nvidia.MIB + 5,
        "memory_used": 9 * _nvidia.MIB,
        "memory_free": 100 * _nvidia.MIB + _nvidia.MIB - 1,
        "utilization_gpu": None,
        "compute_processes": [
            {"pid": 7, "name": "/usr/bin/python3", "used_gpu_memory": 8708 * _nvidia.MIB},
            {"pid": 8, "name": None, "used_gpu_memory": None},
        ],
    }
    nvml = StandInNvml([dev])
    gpus = read_gpus_nvml(nvml)
    assert nvml.shut_down
    assert gpus == [
        {
            "index": 0,
            "uuid": UUID_A,
            "name": "NVIDIA H200",
            "memory_total_mib": 143771,
            "memory_used_mib": 9,
            "memory_free_mib": 100,
            "utilization_gpu": None,
            "compute_processes": [
                {"pid": 7, "name": "/usr/bin/python3", "used_mib": 8708},
                {"pid": 8, "name": "", "used_mib": None},
            ],
        }
    ]


@pytest.mark.parametrize(
    ("devices", "init_error", "kind"),
    [
        ([], None, "no_devices"),
        ([], pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "driver_mismatch"),
        ([], pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "no_gpu"),
    ],
)
def test_read_gpus_nvml_errors(devices, init_error, kind):
    with pytest.raises(GpuQueryError) as info:
        read_gpus_nvml(StandInNvml(devices, init_error))
    assert info.value.kind == kind


@pytest.mark.parametrize("recording", [FIX / "h200" / "idle", FIX / "h200" / "busy"], ids=["idle", "busy"])
def test_recorded_nvml_values_agree_with_nvidia_smi(recording):
    """When the recording holds NVML values, NVML (through read_gpus_nvml) and nvidia-smi (through the parsers)
    describe the same GPUs; a recording without them must say why."""
    nvml = json.loads((recording / "nvml.json").read_text())
    if not nvml.get("devices"):
        assert nvml.get("error"), "nvml.json without devices must record why (pynvml missing, NVML error)"
        return
    from_nvml = read_gpus_nvml(StandInNvml(nvml["devices"]))
    from_smi = recorded_gpus(recording)
    assert [(g["index"], g["uuid"], g["memory_total_mib"]) for g in from_nvml] == [
        (g["index"], g["uuid"], g["memory_total_mib"]) for g in from_smi
    ]


# --------------------------------------------------------------------------------------------- the stand-in


def test_stand_in_says_what_it_is():
    text = STAND_IN.read_text()
    assert "stand-in" in STAND_IN.parent.name
    assert "STAND-IN" in text.split('"""')[1] and "REPLAYS" in text.split('"""')[1]
    assert STAND_IN.stat().st_mode & stat.S_IXUSR
    imports = [line for line in text.splitlines() if line.startswith(("import ", "from "))]
    assert imports == ["import json", "import os", "import sys", "import time"]  # standard library only


FORMS = [
    ([], "plain"),
    (["-L"], "list"),
    (["--list-gpus"], "list"),
    (list(_nvidia.QUERY_GPU_ARGS), "query-gpu"),
    (list(reversed(_nvidia.QUERY_GPU_ARGS)), "query-gpu"),
    ([f"--query-gpu={','.join(_nvidia.GPU_FIELDS)}", "--format=csv"], "query-gpu-csv"),
    (list(_nvidia.QUERY_APPS_ARGS), "query-compute-apps"),
    (["--version"], "version"),
]


@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda p: f"{p.parent.name}/{p.name}")
@pytest.mark.parametrize(("args", "name"), FORMS, ids=[f"{form[1]}-{i}" for i, form in enumerate(FORMS)])
def test_stand_in_replays_each_recorded_form(recording, args, name):
    proc = run_standin(args, recording)
    assert proc.stdout == fixture_text(recording / f"{name}.out")
    assert proc.returncode == int((recording / f"{name}.rc").read_text())


def test_stand_in_refuses_what_was_not_recorded():
    proc = run_standin(["--query-gpu=index,temperature.gpu", "--format=csv"], FIX / "h200" / "idle")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "were not recorded" in proc.stderr


@pytest.mark.parametrize("mode", ["no-devices", "driver-mismatch", "no-driver"])
def test_stand_in_error_modes_print_the_fixture_texts(mode):
    rc, text = _error_fixture(mode)
    proc = run_standin(list(_nvidia.QUERY_GPU_ARGS), FIX / "h200" / "idle", NVIDIA_SMI_STANDIN_MODE=mode)
    assert (proc.returncode, proc.stdout) == (rc, text)


def test_stand_in_reads_its_settings_file_and_env_wins(tmp_path):
    copy = tmp_path / "bin" / "nvidia-smi"
    copy.parent.mkdir()
    shutil.copy2(STAND_IN, copy)
    shutil.copytree(FIX / "h200x2" / "busy", tmp_path / "bin" / "rec")
    (tmp_path / "bin" / "nvidia-smi.standin.json").write_text(json.dumps({"fixture_dir": "rec"}))
    env = standin_env(None)
    proc = subprocess.run([str(copy), "-L"], env=env, capture_output=True, check=False, text=True, timeout=30)
    assert proc.returncode == 0
    assert proc.stdout == fixture_text(FIX / "h200x2" / "busy" / "list.out")
    env["NVIDIA_SMI_STANDIN_DIR"] = str(FIX / "h200" / "idle")
    proc = subprocess.run([str(copy), "-L"], env=env, capture_output=True, check=False, text=True, timeout=30)
    assert proc.stdout == fixture_text(FIX / "h200" / "idle" / "list.out")
    (tmp_path / "bin" / "nvidia-smi.standin.json").write_text(json.dumps({"fixture_dir": "rec", "mode": "no-devices"}))
    proc = subprocess.run(
        [str(copy), "-L"], env=standin_env(None), capture_output=True, check=False, text=True, timeout=30
    )
    assert (proc.returncode, proc.stdout) == (6, "No devices were found\n")


@pytest.mark.parametrize(
    ("extra", "rc", "words"),
    [
        ({}, 255, "no recording selected"),
        ({"NVIDIA_SMI_STANDIN_MODE": "explode"}, 255, "unknown mode 'explode'"),
    ],
)
def test_stand_in_misconfiguration_is_explained(extra, rc, words):
    proc = run_standin(["-L"], None, **extra)
    assert proc.returncode == rc
    assert words in proc.stderr


# --------------------------------------------------------------------------------------------- fixture scripts


def test_composed_two_gpu_fixture_is_reproducible_from_the_one_gpu_recording(tmp_path):
    subprocess.run(
        [sys.executable, str(FIX / "compose_two_gpu.py"), str(FIX / "h200"), str(tmp_path / "x2")],
        check=True,
        timeout=60,
    )
    for state in ("idle", "busy"):
        for path in sorted((FIX / "h200x2" / state).iterdir()):
            assert (tmp_path / "x2" / state / path.name).read_text() == path.read_text(), path
    gpus = recorded_gpus(tmp_path / "x2" / "busy")
    one = recorded_gpus(FIX / "h200" / "busy")
    idle = recorded_gpus(FIX / "h200" / "idle")
    assert gpus[0] == one[0]
    assert gpus[1]["index"] == 1 and gpus[1]["uuid"] != one[0]["uuid"]
    assert {k: v for k, v in gpus[1].items() if k not in ("index", "uuid")} == {
        k: v for k, v in idle[0].items() if k not in ("index", "uuid")
    }


def test_record_script_records_every_form_the_stand_in_replays(tmp_path):
    """record.sh run against the stand-in (there is no GPU here): every form lands in idle/ with a provenance
    header, stdout/stderr/rc, and parses to the GPUs it was given. Without CUDA it says the busy state was
    skipped."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").symlink_to(STAND_IN)
    env = standin_env(FIX / "h200x2" / "idle")
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    out = tmp_path / "rec"
    proc = subprocess.run(
        ["bash", str(FIX / "record.sh"), str(out)], env=env, capture_output=True, check=False, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    names = {"plain", "list", "query-gpu", "query-gpu-csv", "query-compute-apps", "version"}
    for name in names:
        for ext in ("out", "err", "rc"):
            assert (out / "idle" / f"{name}.{ext}").is_file()
        assert (out / "idle" / f"{name}.out").read_text().startswith("#fixture: recorded by")
    assert {form[1] for form in FORMS} == names
    assert recorded_gpus(out / "idle") == recorded_gpus(FIX / "h200x2" / "idle")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["forms"]["query-gpu"] == list(_nvidia.QUERY_GPU_ARGS)
    assert meta["forms"]["query-compute-apps"] == list(_nvidia.QUERY_APPS_ARGS)
    nvml = json.loads((out / "idle" / "nvml.json").read_text())
    assert "recorded_at" in nvml and ("devices" in nvml or nvml["error"])
    if not (out / "busy").exists():
        assert "busy state not recorded" in meta["busy_holder"]["note"]
