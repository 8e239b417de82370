"""specdec.pivot.gpu_memory run for real: the module file executes as its own process through AnsibleModule
(arguments as Ansible passes them, JSON on the command line), finds ``nvidia-smi`` on PATH - the stand-in that
replays recorded outputs (lab/stand-ins/nvidia-smi), since this machine has no GPU - and tries NVML through the
real pynvml first."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hybrid_shape import state_per_request, write_hybrid_shape
from module_runner import COLLECTIONS_ROOT, invoke_module
from nvidia_recordings import recorded_gpus

REPO = Path(__file__).resolve().parents[4]
FIX = REPO / "tests" / "unit" / "fixtures"
SMI = FIX / "nvidia_smi"
MODELS = FIX / "models"
STAND_IN = REPO / "lab" / "stand-ins" / "nvidia-smi"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


@pytest.fixture
def run_module(tmp_path):
    """Run the module with ``args``; the stand-in is ``nvidia-smi`` on PATH unless ``standin`` is False."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").symlink_to(STAND_IN)

    def run(
        args: dict,
        recording: Path | None = SMI / "h200x2" / "busy",
        mode: str = "replay",
        standin: bool = True,
        check_mode: bool = False,
        extra_env: dict | None = None,
    ) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NVIDIA_SMI_STANDIN", "ANSIBLE_"))}
        env["PATH"] = f"{bindir}{os.pathsep}{SYSTEM_PATH}" if standin else SYSTEM_PATH
        env["PYTHONPATH"] = str(COLLECTIONS_ROOT)
        env["NVIDIA_SMI_STANDIN_MODE"] = mode
        if recording is not None:
            env["NVIDIA_SMI_STANDIN_DIR"] = str(recording)
        env.update(extra_env or {})
        return invoke_module("gpu_memory", args, env, check_mode=check_mode, cwd=tmp_path, timeout=120)

    return run


def sparse_model(tmp_path: Path, fixture: str, **sizes: int) -> str:
    dest = tmp_path / fixture
    dest.mkdir()
    for src in (MODELS / fixture).iterdir():
        (dest / src.name).write_bytes(src.read_bytes())
    for name, size in sizes.items():
        with open(dest / name, "wb") as fh:
            fh.truncate(size)
    return str(dest)


# --------------------------------------------------------------------------------------------- listing


@pytest.mark.parametrize("recording", ["h200/idle", "h200/busy", "h200x2/busy"])
def test_lists_the_recorded_gpus_through_the_stand_in(run_module, recording):
    result = run_module({}, SMI / recording)
    assert not result.get("failed"), result
    assert result["changed"] is False
    assert result["gpus"] == recorded_gpus(SMI / recording)
    assert result["gpu_count"] == len(result["gpus"])
    assert result["backend_used"] == "nvidia-smi"


def test_auto_backend_falls_back_from_real_nvml_to_nvidia_smi(run_module):
    """pynvml is importable in the venv; nvmlInit fails for real (no driver), so auto must use nvidia-smi."""
    result = run_module({"backend": "auto"})
    assert result["backend_used"] == "nvidia-smi"
    assert result["gpu_count"] == 2
    assert any("NVML not used" in note and "fell back to nvidia-smi" in note for note in result["backend_notes"])


def test_nvml_backend_fails_clearly_without_a_driver(run_module):
    result = run_module({"backend": "nvml"})
    assert result["failed"] is True
    assert result["error_kind"] == "no_gpu"
    assert "NVML" in result["msg"]


def test_nvidia_smi_backend_does_not_try_nvml(run_module):
    result = run_module({"backend": "nvidia-smi"})
    assert result["backend_used"] == "nvidia-smi"
    assert result["backend_notes"] == []


def test_check_mode_returns_the_same_data(run_module):
    normal = run_module(
        {"fit": {"target_model_path": str(MODELS / "qwen3-8b"), "mem_fraction": 0.8, "context_length": 8192}}
    )
    checked = run_module(
        {"fit": {"target_model_path": str(MODELS / "qwen3-8b"), "mem_fraction": 0.8, "context_length": 8192}},
        check_mode=True,
    )
    assert checked["changed"] is False
    assert checked["gpus"] == normal["gpus"]
    assert checked["fit"] == normal["fit"]


def test_explicit_nvidia_smi_path(run_module, tmp_path):
    result = run_module({"nvidia_smi": str(STAND_IN)}, standin=False)
    assert result["gpus"] == recorded_gpus(SMI / "h200x2" / "busy")


# --------------------------------------------------------------------------------------------- errors


def test_hang_is_killed_and_reported_as_timeout(run_module, tmp_path):
    pidfile = tmp_path / "standin.pids"
    result = run_module(
        {"timeout": 2, "backend": "nvidia-smi"}, mode="hang", extra_env={"NVIDIA_SMI_STANDIN_PIDFILE": str(pidfile)}
    )
    assert result["failed"] is True
    assert result["error_kind"] == "timeout"
    assert "did not answer within 2 s" in result["msg"]
    for pid in pidfile.read_text().split():
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)


def test_no_nvidia_smi_at_all_is_no_gpu(run_module):
    for directory in [*SYSTEM_PATH.split(os.pathsep), "/sbin", "/usr/sbin", "/usr/local/sbin"]:
        assert not os.path.exists(os.path.join(directory, "nvidia-smi")), "this test needs a host without nvidia-smi"
    result = run_module({}, standin=False)
    assert result["failed"] is True
    assert result["error_kind"] == "no_gpu"
    assert result["msg"].startswith("no NVIDIA GPU")


@pytest.mark.parametrize(
    ("mode", "kind", "words"),
    [
        ("no-devices", "no_devices", "No devices were found"),
        ("driver-mismatch", "driver_mismatch", "driver/library version mismatch"),
        ("no-driver", "no_gpu", "could not communicate with the NVIDIA driver"),
    ],
)
def test_nvidia_smi_failures(run_module, mode, kind, words):
    result = run_module({}, mode=mode)
    assert result["failed"] is True
    assert result["error_kind"] == kind
    assert words in result["msg"]


@pytest.mark.parametrize(
    ("fit", "words"),
    [
        pytest.param(
            {"mem_fraction": 1.5}, ["fit.mem_fraction=1.5", "between 0 and 1", "e.g. 0.85"], id="mem_fraction-1.5"
        ),
        pytest.param({"tp_size": 3}, ["fit.tp_size=3", "num_attention_heads=32"], id="tp-not-dividing-heads"),
        pytest.param(
            {"tp_size": 2, "gpu_indices": [0, 7]},
            ["fit.gpu_indices=[0, 7]", "[7] are not present", "present are [0, 1]"],
            id="gpu-not-present",
        ),
        pytest.param({"tp_size": 4}, ["fit.tp_size=4", "needs 4 GPUs but this host has 2"], id="too-few-gpus"),
        pytest.param({"context_length": 0}, ["fit.context_length=0"], id="context-zero"),
        pytest.param(
            {"max_running_requests": 0}, ["fit.max_running_requests=0", "positive integer"], id="running-zero"
        ),
        pytest.param(
            {"max_mamba_cache_size": -8}, ["fit.max_mamba_cache_size=-8", "positive integer"], id="mamba-cache-negative"
        ),
        pytest.param(
            {"disable_radix_cache": "sometimes"}, ["disable_radix_cache", "'sometimes'", "boolean"], id="radix-not-bool"
        ),
        pytest.param(
            {"target_model_path": "/nonexistent/model"},
            ["fit.target_model_path='/nonexistent/model'", "not a directory"],
            id="no-such-dir",
        ),
    ],
)
def test_bad_fit_input_names_option_value_and_fix(run_module, fit, words):
    args = {"target_model_path": str(MODELS / "qwen3-8b"), "mem_fraction": 0.85, "context_length": 8192, **fit}
    result = run_module({"fit": args})
    assert result["failed"] is True
    for word in words:
        assert word in result["msg"], result["msg"]


def test_missing_config_json(run_module, tmp_path):
    empty = tmp_path / "empty-model"
    empty.mkdir()
    result = run_module({"fit": {"target_model_path": str(empty), "mem_fraction": 0.85, "context_length": 8}})
    assert result["failed"] is True
    assert f"fit.target_model_path='{empty}'" in result["msg"]
    assert "has no config.json" in result["msg"]


def test_bad_input_fails_before_querying_gpus(run_module, tmp_path):
    pidfile = tmp_path / "pids"
    result = run_module(
        {"fit": {"target_model_path": str(MODELS / "qwen3-8b"), "mem_fraction": 2.0, "context_length": 8}},
        extra_env={"NVIDIA_SMI_STANDIN_PIDFILE": str(pidfile)},
    )
    assert result["failed"] is True and "fit.mem_fraction=2.0" in result["msg"]
    assert not pidfile.exists()  # nvidia-smi was never run


def test_argument_spec_rejects_unknown_dtype(run_module):
    result = run_module(
        {
            "fit": {
                "target_model_path": str(MODELS / "qwen3-8b"),
                "mem_fraction": 0.5,
                "context_length": 8,
                "kv_cache_dtype": "int3",
            }
        }
    )
    assert result["failed"] is True
    assert "kv_cache_dtype" in result["msg"] and "int3" in result["msg"]


def test_non_positive_timeout_is_refused(run_module):
    result = run_module({"timeout": 0})
    assert result["failed"] is True
    assert "timeout=0.0" in result["msg"] and "positive" in result["msg"]


# --------------------------------------------------------------------------------------------- fit


def test_fit_tp2_with_drafter(run_module, tmp_path):
    draft = sparse_model(tmp_path, "qwen3-8b-dflash-b16", **{"model.safetensors": 2_097_252_864})
    result = run_module(
        {
            "fit": {
                "target_model_path": str(MODELS / "qwen3-8b"),
                "draft_model_path": draft,
                "tp_size": 2,
                "gpu_indices": [0, 1],
                "mem_fraction": 0.85,
                "context_length": 32768,
            }
        }
    )
    fit = result["fit"]
    assert fit["fits"] is True
    assert fit["gpu_indices"] == [0, 1]
    assert fit["weights_bytes_total"] == 16_381_470_720
    assert fit["weights_bytes_per_gpu"] == 16_381_470_720 // 2
    assert fit["draft_bytes"] == 2_097_252_864
    assert fit["kv_bytes_per_token"] == (4 * 256 * 36 + 4 * 256 * 5) * 2
    gpus = recorded_gpus(SMI / "h200x2" / "busy")
    assert fit["free_bytes_per_gpu"] == [g["memory_free_mib"] << 20 for g in gpus]
    assert len(fit["budget_bytes_per_gpu"]) == 2
    assert fit["min_kv_tokens_needed"] == 32768


def test_hybrid_fit_counts_full_attention_layers_only(run_module):
    result = run_module(
        {
            "fit": {
                "target_model_path": str(MODELS / "qwen3.6-27b-like"),
                "tp_size": 2,
                "mem_fraction": 0.85,
                "context_length": 262144,
            }
        }
    )
    fit = result["fit"]
    assert (fit["full_attention_layers"], fit["linear_attention_layers"]) == (16, 48)
    assert fit["kv_bytes_per_token"] == 2 * 512 * 16 * 2


@pytest.mark.parametrize("fail_on_no_fit", [False, True])
def test_no_fit_reports_or_fails(run_module, fail_on_no_fit):
    result = run_module(
        {
            "fail_on_no_fit": fail_on_no_fit,
            "fit": {"target_model_path": str(MODELS / "qwen3.6-27b-like"), "mem_fraction": 0.2, "context_length": 4096},
        }
    )
    assert result["fit"]["fits"] is False
    assert "weights alone" in result["fit"]["reason"]
    assert bool(result.get("failed")) is fail_on_no_fit
    if fail_on_no_fit:
        assert result["msg"] == result["fit"]["reason"]


def test_reason_names_the_holder_and_assume_freed_pids_lets_it_fit(run_module):
    """GPU 0 of the busy recording has memory in use; pick a context that fits only on the idle GPU. The reason
    names the processes nvidia-smi listed (or says none is listed, as inside another PID namespace)."""
    gpus = recorded_gpus(SMI / "h200x2" / "busy")
    holders = gpus[0]["compute_processes"]
    fit_args = {"target_model_path": str(MODELS / "qwen3.6-27b-like"), "gpu_indices": [0], "mem_fraction": 0.85}
    probe = run_module({"fit": {**fit_args, "context_length": 1}})["fit"]["per_gpu"][0]
    assert probe["kv_tokens"] < probe["kv_tokens_if_idle"], "the busy recording must have memory in use on GPU 0"
    context = (probe["kv_tokens"] + probe["kv_tokens_if_idle"]) // 2
    result = run_module({"fit": {**fit_args, "context_length": context}})
    reason = result["fit"]["reason"]
    assert result["fit"]["fits"] is False
    assert "stop those processes first" in reason
    if not holders:
        assert "no compute process is listed" in reason
        return
    for proc in holders:
        assert f"pid {proc['pid']} ({proc['name']}" in reason
    freed = run_module(
        {"fit": {**fit_args, "context_length": context, "assume_freed_pids": [p["pid"] for p in holders]}}
    )
    assert freed["fit"]["fits"] is True


def foreign_on_gpu1(tmp_path: Path, mib: int, pid: int = 4242) -> Path:
    """The recorded idle H200 pair with one foreign compute process holding ``mib`` MiB on GPU 1, written in the
    shapes nvidia-smi printed (the query-gpu and query-compute-apps lines of the recording, edited)."""
    src = SMI / "h200x2" / "idle"
    dest = tmp_path / "foreign"
    shutil.copytree(src, dest)
    lines = (dest / "query-gpu.out").read_text().splitlines()
    out = []
    uuid1 = None
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        if not line.startswith("#fixture:") and fields[0] == "1":
            uuid1 = fields[1]
            fields[4] = str(int(fields[4]) + mib)
            fields[5] = str(int(fields[5]) - mib)
            line = ", ".join(fields)
        out.append(line)
    (dest / "query-gpu.out").write_text("\n".join(out) + "\n")
    with open(dest / "query-compute-apps.out", "a", encoding="utf-8") as fh:
        fh.write(f"{uuid1}, {pid}, /opt/other/bin/python, {mib}\n")
    return dest


@pytest.mark.parametrize(
    ("env_check", "fits"),
    [(None, False), (False, True)],
    ids=["balance-check-on", "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=false"],
)
def test_tp2_with_a_foreign_40gb_process_on_gpu1_does_not_fit_as_sglang_decides(run_module, tmp_path, env_check, fits):
    """Issue 16, point 3: the memory budget holds the model, but SGLang's TP memory-balance check refuses to start."""
    recording = foreign_on_gpu1(tmp_path, 40 * 1024)
    fit = {
        "target_model_path": str(MODELS / "qwen3-8b"),
        "tp_size": 2,
        "mem_fraction": 0.85,
        "context_length": 32768,
    }
    if env_check is not None:
        fit["tp_memory_balance_check"] = env_check
    result = run_module({"fit": fit}, recording=recording)
    got = result["fit"]
    assert got["fits"] is fits, got["reason"]
    assert got["tp_memory_balance"]["unbalanced"] is True
    assert got["kv_tokens_fit"] >= 32768  # the budget alone would hold it
    if not fits:
        assert "SGLang refuses to start" in got["reason"] and "GPU 1 has" in got["reason"]
        assert "pid 4242 (/opt/other/bin/python, 40960 MiB)" in got["reason"]
    else:
        assert "only warns" in got["tp_memory_balance"]["warning"]


@pytest.mark.parametrize("check_mode", [False, True])
def test_disable_radix_cache_reserves_the_state_of_every_running_request(run_module, tmp_path, check_mode):
    """The Qwen3.6-27B shape at 32 layers with its drafter on the recorded idle H200, 17 draft tokens: with
    --disable-radix-cache SGLang reserves (96 + 1) x (1 + 17) request states for --max-running-requests 96, more
    than the weights leave; with the radix cache it sizes the state from mamba_full_memory_ratio and fits. Check
    mode returns the same (the module only reads)."""
    target, drafter = write_hybrid_shape(tmp_path / "shape", 32)
    fit = {
        "target_model_path": str(target),
        "draft_model_path": str(drafter),
        "mem_fraction": 0.85,
        "context_length": 40960,
        "speculative_num_draft_tokens": 17,
        "max_running_requests": 96,
    }
    recording = SMI / "h200" / "idle"
    off = run_module({"fit": {**fit, "disable_radix_cache": True}}, recording, check_mode=check_mode)
    on = run_module({"fit": fit}, recording, check_mode=check_mode)
    assert off["changed"] is False and on["changed"] is False
    state = 97 * 18 * state_per_request(24)
    assert (off["fit"]["linear_state_rule"], off["fit"]["linear_state_bytes_per_gpu"]) == ("disable_radix_cache", state)
    assert (off["fit"]["disable_radix_cache"], off["fit"]["max_running_requests"]) == (True, 96)
    assert off["fit"]["fits"] is False and off["fit"]["kv_tokens_fit"] == 0
    assert "Loaded weights leave no GPU memory for the KV cache" in off["fit"]["reason"]
    assert (on["fit"]["linear_state_rule"], on["fit"]["disable_radix_cache"]) == ("mamba_full_memory_ratio", False)
    assert on["fit"]["fits"] is True
