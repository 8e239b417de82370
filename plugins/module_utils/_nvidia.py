# Private module_utils for specdec.pivot: list NVIDIA GPUs and their compute processes (NVML or nvidia-smi).
"""Read the GPUs of a host: memory, utilisation and the compute processes holding memory.

Layout:

* Pure parsers, tested with recorded outputs: :func:`parse_query_gpu` (``--query-gpu=`` CSV),
  :func:`parse_query_compute_apps` (``--query-compute-apps=`` CSV), :func:`attach_processes`,
  :func:`classify_failure` (nvidia-smi's exit status and text -> :class:`GpuQueryError`),
  :func:`classify_nvml_error` (an ``NVMLError`` -> :class:`GpuQueryError`).
* Thin I/O: :func:`run_with_timeout` (``module.run_command`` of an argv list under a wall-clock limit),
  :func:`read_gpus_nvidia_smi`, :func:`read_gpus_nvml`, and :func:`read_gpus` / :func:`query_gpus`, the
  entry points other modules use.

Every GPU is a dict with the keys ``index``, ``uuid``, ``name``, ``memory_total_mib``, ``memory_used_mib``,
``memory_free_mib``, ``utilization_gpu`` (percent, ``None`` where the driver reports ``[N/A]``) and
``compute_processes`` (a list of ``{pid, name, used_mib}``; ``used_mib`` is ``None`` where not reported).

nvidia-smi can hang (a wedged driver, a GPU fallen off the bus), so it always runs with a timeout. Ansible's
``module.run_command`` has none, hence :func:`run_with_timeout`, which runs it there under coreutils ``timeout``.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass, field

try:
    import pynvml

    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None
except ImportError as _err:  # pragma: no cover - depends on the target host
    pynvml = None
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = _err

GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "memory.used",
    "memory.free",
    "utilization.gpu",
)
APP_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
CSV_FORMAT = "csv,noheader,nounits"

QUERY_GPU_ARGS = (f"--query-gpu={','.join(GPU_FIELDS)}", f"--format={CSV_FORMAT}")
QUERY_APPS_ARGS = (f"--query-compute-apps={','.join(APP_FIELDS)}", f"--format={CSV_FORMAT}")

ERROR_KINDS = ("no_gpu", "no_devices", "driver_mismatch", "timeout", "other")
BACKENDS = ("auto", "nvml", "nvidia-smi")

# Values nvidia-smi prints instead of a number.
_NOT_AVAILABLE = {"[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", "[insufficient permissions]"}

MIB = 1 << 20


class GpuQueryError(Exception):
    """Reading the GPUs failed; ``kind`` is one of :data:`ERROR_KINDS`, ``str(err)`` a human message."""

    def __init__(self, message: str, kind: str = "other", output: str = ""):
        if kind not in ERROR_KINDS:
            raise ValueError(f"unknown GpuQueryError kind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.output = output

    @property
    def message(self) -> str:
        return str(self)


@dataclass
class GpuQueryResult:
    """What :func:`query_gpus` found: the GPUs, the backend that produced them, and why NVML was not used."""

    gpus: list[dict]
    backend_used: str
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------- parsers


def _number(text: str, what: str, line: str) -> int | None:
    value = text.strip()
    if value.lower() in _NOT_AVAILABLE:
        return None
    try:
        return int(value)
    except ValueError:
        try:
            return round(float(value))
        except ValueError:
            raise ValueError(f"nvidia-smi output: {what} is not a number ({value!r}) in line {line!r}") from None


def _data_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def parse_query_gpu(text: str) -> list[dict]:
    """Parse ``nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,memory.free,utilization.gpu
    --format=csv,noheader,nounits``.

    A name containing a comma is kept whole (the fields around it are fixed). ``[N/A]`` becomes ``None``.
    Raises ``ValueError`` on a line that does not have the expected shape (for example a header line, or an
    error text such as "No devices were found": classify those with :func:`classify_failure` first).
    """
    gpus = []
    for line in _data_lines(text):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < len(GPU_FIELDS):
            raise ValueError(
                f"nvidia-smi --query-gpu output: expected {len(GPU_FIELDS)} comma-separated fields "
                f"({','.join(GPU_FIELDS)}), got {len(parts)} in line {line!r}"
            )
        index_text, uuid = parts[0], parts[1]
        name = ", ".join(parts[2 : len(parts) - 4])
        total, used, free, util = parts[-4:]
        index = _number(index_text, "index", line)
        if index is None:
            raise ValueError(f"nvidia-smi --query-gpu output: no GPU index in line {line!r}")
        gpus.append(
            {
                "index": index,
                "uuid": uuid,
                "name": name,
                "memory_total_mib": _number(total, "memory.total", line),
                "memory_used_mib": _number(used, "memory.used", line),
                "memory_free_mib": _number(free, "memory.free", line),
                "utilization_gpu": _number(util, "utilization.gpu", line),
                "compute_processes": [],
            }
        )
    return gpus


def parse_query_compute_apps(text: str) -> list[dict]:
    """Parse ``nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits``.

    Returns ``[{gpu_uuid, pid, name, used_mib}]``. No processes is an empty output (some drivers print
    "No running processes found"), both give ``[]``. A process name containing commas is kept whole.
    """
    apps = []
    for line in _data_lines(text):
        if line.lower().startswith("no running processes found"):
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < len(APP_FIELDS):
            raise ValueError(
                f"nvidia-smi --query-compute-apps output: expected {len(APP_FIELDS)} comma-separated fields "
                f"({','.join(APP_FIELDS)}), got {len(parts)} in line {line!r}"
            )
        pid = _number(parts[1], "pid", line)
        apps.append(
            {
                "gpu_uuid": parts[0],
                "pid": pid,
                "name": ",".join(parts[2:-1]).strip(),
                "used_mib": _number(parts[-1], "used_memory", line),
            }
        )
    return apps


def attach_processes(gpus: list[dict], apps: list[dict]) -> list[dict]:
    """Put every compute process under the GPU whose uuid it names (a new list of new dicts).

    A process naming a uuid that no GPU has (a MIG instance, a GPU hidden from this listing) is dropped.
    """
    by_uuid = {g["uuid"]: {**g, "compute_processes": list(g.get("compute_processes", []))} for g in gpus}
    for app in apps:
        gpu = by_uuid.get(app["gpu_uuid"])
        if gpu is not None:
            gpu["compute_processes"].append({"pid": app["pid"], "name": app["name"], "used_mib": app["used_mib"]})
    return [by_uuid[g["uuid"]] for g in gpus]


def classify_failure(rc: int, stdout: str, stderr: str, argv0: str = "nvidia-smi") -> GpuQueryError:
    """Turn a failed nvidia-smi run (exit status and output) into a :class:`GpuQueryError` with a fix."""
    text = "\n".join(t.strip() for t in (stdout, stderr) if t and t.strip())
    low = text.lower()
    first = text.splitlines()[0] if text else f"exit status {rc}"
    if "no devices were found" in low:
        return GpuQueryError(
            f'{argv0} found no NVIDIA devices ("No devices were found"): the driver is loaded but sees no GPU. '
            "Check that the GPU is visible to this host or container (lspci, /dev/nvidia*, the container's "
            "device requests).",
            kind="no_devices",
            output=text,
        )
    if "driver/library version mismatch" in low:
        return GpuQueryError(
            f"{argv0}: NVIDIA driver/library version mismatch ({text.replace(chr(10), '; ')}). The kernel module "
            "and the user-space NVML library differ, usually after a driver upgrade without a reboot: reboot the "
            "host (or reload the nvidia kernel modules) before using the GPU.",
            kind="driver_mismatch",
            output=text,
        )
    if "couldn't communicate with the nvidia driver" in low or "driver not loaded" in low or rc == 9:
        return GpuQueryError(
            f"no NVIDIA GPU usable: {argv0} could not communicate with the NVIDIA driver ({first}). Install and "
            "load the NVIDIA driver, or run this on a host with an NVIDIA GPU.",
            kind="no_gpu",
            output=text,
        )
    if "nvml shared library" in low or rc == 12:
        return GpuQueryError(
            f"no NVIDIA GPU usable: {argv0} could not find the NVML library ({first}). Install the NVIDIA driver's "
            "user-space libraries (libnvidia-ml.so.1).",
            kind="no_gpu",
            output=text,
        )
    if rc == 127:
        return GpuQueryError(
            f"no NVIDIA GPU: {argv0} was not found ({first}). Install the NVIDIA driver or point the nvidia_smi "
            "option at the binary.",
            kind="no_gpu",
            output=text,
        )
    return GpuQueryError(f"{argv0} failed with exit status {rc}: {text or '(no output)'}", kind="other", output=text)


def classify_nvml_error(err: Exception) -> GpuQueryError:
    """Turn an ``NVMLError`` (or anything raised by pynvml) into a :class:`GpuQueryError`."""
    code = getattr(err, "value", None)
    text = str(err) or type(err).__name__
    # Numeric codes from NVML's nvmlReturn_t (nvml.h); pynvml exposes the same numbers as NVML_ERROR_*.
    if code in (9, 12):  # NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIBRARY_NOT_FOUND
        return GpuQueryError(f"no NVIDIA GPU usable through NVML: {text}", kind="no_gpu", output=text)
    if code == 18:  # NVML_ERROR_LIB_RM_VERSION_MISMATCH
        return GpuQueryError(
            f"NVML: driver/library version mismatch ({text}); reboot the host or reload the nvidia kernel modules",
            kind="driver_mismatch",
            output=text,
        )
    if code == 6:  # NVML_ERROR_NOT_FOUND
        return GpuQueryError(f"NVML found no NVIDIA devices ({text})", kind="no_devices", output=text)
    return GpuQueryError(f"NVML failed: {text}", kind="other", output=text)


# --------------------------------------------------------------------------------------------- I/O


# Seconds between the SIGTERM at the time limit and the SIGKILL to a command that is still there.
KILL_AFTER_S = 5


def run_with_timeout(module, argv: list[str], timeout: float, limit: float | None = None) -> tuple[int, str, str]:
    """Run ``argv`` (a list, never a shell string) with ``module.run_command``; return ``(rc, stdout, stderr)``.

    ``run_command`` has no time limit, so the command runs under coreutils ``timeout``, which starts it in a process
    group of its own and, when ``timeout`` seconds pass, sends the group SIGTERM, then SIGKILL ``KILL_AFTER_S`` s
    later (``timeout`` itself goes with that SIGKILL, so ``run_command`` returns even when nvidia-smi sleeps in
    the kernel and cannot die). Where the host has no ``timeout``, a timer thread SIGKILLs the command itself at the
    limit. Either way :class:`GpuQueryError` (kind ``timeout``) is raised. A missing executable is kind ``no_gpu``.
    ``limit`` is the limit the message names (the user's ``timeout`` option when several calls share one
    deadline and ``timeout`` is only what is left of it); it defaults to ``timeout``.
    """
    if isinstance(argv, str):
        raise TypeError("run_with_timeout takes an argv list, not a shell string")
    path = argv[0] if os.sep in argv[0] else shutil.which(argv[0])
    if path is None or not os.path.exists(path):
        raise GpuQueryError(
            f"no NVIDIA GPU: {argv[0]} was not found. Install the NVIDIA driver or point the nvidia_smi option at "
            "the binary.",
            kind="no_gpu",
        )
    if not os.access(path, os.X_OK):
        raise GpuQueryError(f"{argv[0]} cannot be executed: permission denied", kind="other")
    timeout_bin = module.get_bin_path("timeout")
    killed: list[bool] = []
    timers: list[threading.Timer] = []

    def watchdog(proc) -> None:  # only where the host has no `timeout`
        def expire() -> None:
            if proc.poll() is None:
                killed.append(True)
                proc.kill()

        timer = threading.Timer(timeout, expire)
        timer.daemon = True
        timers.append(timer)
        timer.start()

    if timeout_bin:
        cmd = [timeout_bin, "-k", str(KILL_AFTER_S), f"{max(timeout, 0.001):.3f}", path, *argv[1:]]
    else:
        cmd = [path, *argv[1:]]
    start = time.monotonic()
    try:
        rc, out, err = module.run_command(
            cmd,
            environ_update={"LC_ALL": "C", "LANG": "C"},
            expand_user_and_vars=False,
            errors="replace",
            before_communicate_callback=None if timeout_bin else watchdog,
            handle_exceptions=False,
        )
    except OSError as exc:
        raise GpuQueryError(f"{argv[0]} cannot be executed: {exc.strerror}", kind="other") from exc
    finally:
        for timer in timers:
            timer.cancel()
    # timeout(1) exits 124 when the command timed out and went with SIGTERM; it is itself SIGKILLed (rc -9) with a
    # command that outlived the SIGTERM.
    timed_out = rc == 124 or (rc in (-9, 137) and time.monotonic() - start >= timeout)
    if killed or (timeout_bin and timed_out):
        named = timeout if limit is None else limit
        raise GpuQueryError(
            f"{' '.join(argv[:2])} did not answer within {named:g} s and was killed. nvidia-smi hangs when the "
            "driver is wedged or a GPU has fallen off the bus: check `dmesg` for Xid errors; raise the timeout "
            "option only if the host is merely slow.",
            kind="timeout",
        )
    return rc, out, err


def resolve_nvidia_smi(module, nvidia_smi: str) -> str | None:
    """The path of the nvidia-smi executable, or ``None`` when it is nowhere to be found."""
    if os.sep in nvidia_smi:
        return nvidia_smi if os.path.exists(nvidia_smi) else None
    if module is not None:
        found = module.get_bin_path(nvidia_smi, required=False)
        if found:
            return found
    return shutil.which(nvidia_smi)


def read_gpus_nvidia_smi(module, nvidia_smi: str = "nvidia-smi", timeout: float = 15) -> list[dict]:
    """Two nvidia-smi queries (GPUs, then compute processes) sharing one deadline of ``timeout`` seconds."""
    path = resolve_nvidia_smi(module, nvidia_smi)
    if path is None:
        raise GpuQueryError(
            f"no NVIDIA GPU: {nvidia_smi} not found (searched PATH and the usual sbin directories). Install the "
            "NVIDIA driver on this host, or set the nvidia_smi option to the binary's path.",
            kind="no_gpu",
        )
    deadline = time.monotonic() + timeout

    def run(args: tuple[str, ...]) -> str:
        left = max(deadline - time.monotonic(), 0.1)
        rc, out, err = run_with_timeout(module, [path, *args], left, limit=timeout)
        if rc != 0:
            raise classify_failure(rc, out, err, argv0=nvidia_smi)
        low = out.lower()
        if "no devices were found" in low or "failed to initialize nvml" in low:
            raise classify_failure(rc, out, err, argv0=nvidia_smi)
        return out

    try:
        gpus = parse_query_gpu(run(QUERY_GPU_ARGS))
        if not gpus:
            raise GpuQueryError(f"{nvidia_smi} listed no GPUs", kind="no_devices")
        apps = parse_query_compute_apps(run(QUERY_APPS_ARGS))
    except ValueError as err:
        raise GpuQueryError(f"unexpected nvidia-smi output: {err}", kind="other") from err
    return attach_processes(gpus, apps)


def _decode(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def read_gpus_nvml(nvml=None) -> list[dict]:
    """Read the GPUs through NVML (``pynvml`` from nvidia-ml-py, or an object with the same functions)."""
    nvml = nvml if nvml is not None else pynvml
    if nvml is None:
        raise GpuQueryError(
            f"NVML backend needs the Python package nvidia-ml-py (import pynvml failed: {PYNVML_IMPORT_ERROR})",
            kind="other",
        )
    error_type = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except error_type as err:
        raise classify_nvml_error(err) from err
    try:
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            raise GpuQueryError("NVML found no NVIDIA devices", kind="no_devices")
        gpus = []
        for i in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
            except error_type:
                util = None
            procs = []
            try:
                running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except error_type:
                running = []
            for proc in running:
                try:
                    pname = _decode(nvml.nvmlSystemGetProcessName(proc.pid))
                except error_type:
                    pname = ""
                used = getattr(proc, "usedGpuMemory", None)
                procs.append({"pid": int(proc.pid), "name": pname, "used_mib": None if used is None else used // MIB})
            gpus.append(
                {
                    "index": int(nvml.nvmlDeviceGetIndex(handle)) if hasattr(nvml, "nvmlDeviceGetIndex") else i,
                    "uuid": _decode(nvml.nvmlDeviceGetUUID(handle)),
                    "name": _decode(nvml.nvmlDeviceGetName(handle)),
                    "memory_total_mib": int(mem.total) // MIB,
                    "memory_used_mib": int(mem.used) // MIB,
                    "memory_free_mib": int(mem.free) // MIB,
                    "utilization_gpu": None if util is None else int(util),
                    "compute_processes": procs,
                }
            )
        return gpus
    except error_type as err:
        raise classify_nvml_error(err) from err
    finally:
        try:
            nvml.nvmlShutdown()
        except error_type:
            pass


def query_gpus(module, nvidia_smi: str = "nvidia-smi", timeout: float = 15, backend: str = "auto") -> GpuQueryResult:
    """Read the GPUs with the chosen backend; ``auto`` = NVML when importable and ``nvmlInit`` works, else
    nvidia-smi (the NVML failure is kept in ``notes``)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    notes: list[str] = []
    if backend == "nvml":
        return GpuQueryResult(read_gpus_nvml(), "nvml", notes)
    if backend == "auto":
        if not HAS_PYNVML:
            notes.append(f"NVML not used: pynvml is not importable ({PYNVML_IMPORT_ERROR})")
        else:
            try:
                return GpuQueryResult(read_gpus_nvml(), "nvml", notes)
            except GpuQueryError as err:
                notes.append(f"NVML not used: {err} (kind {err.kind}); fell back to nvidia-smi")
    return GpuQueryResult(read_gpus_nvidia_smi(module, nvidia_smi, timeout), "nvidia-smi", notes)


def read_gpus(module, nvidia_smi: str = "nvidia-smi", timeout: float = 15, backend: str = "auto") -> list[dict]:
    """The GPUs of this host (see the module docstring for the keys); raises :class:`GpuQueryError`."""
    return query_gpus(module, nvidia_smi=nvidia_smi, timeout=timeout, backend=backend).gpus
