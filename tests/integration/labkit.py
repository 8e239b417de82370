"""Helpers for tests that drive the pivot's playbooks against the lab (lab/: containers ct200 and pro6000).

Everything here touches only the local lab containers (docker exec) and loopback; inventories/lab only.
"""

from __future__ import annotations

import base64
import codecs
import csv
import dataclasses
import hashlib
import io
import json
import os
import re
import select
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "lab"
PLAYBOOK_BIN = REPO / ".venv" / "bin" / "ansible-playbook"
INVENTORY = REPO / "inventories" / "lab"
TRAINING, INFERENCE = "ct200", "pro6000"
UNIT = "sglang.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
STATE_DIR = "/var/lib/specdec-pivot"
VENV_PY = "/opt/sglang/venv/bin/python"
TRAIN_SCRIPT = "/opt/train/train_dflash_pipeline.py"
REPORT_SCHEMA = REPO / "playbooks" / "schemas" / "pivot-report.schema.json"
PORT = int(os.environ.get("SPECDEC_LAB_PORT", "30000"))
URL = f"http://127.0.0.1:{PORT}"
# A step line of the lab training job's log (lab/training/train_dflash_pipeline.py).
STEP_RE = re.compile(r"^step (\d+) \| loss (\d+\.\d+) \| (\d+\.\d)K tok/s$")
RECAP_RE = re.compile(r"^(\S+)\s*: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)"
                      r"\s+rescued=(\d+)\s+ignored=(\d+)", re.M)


# ------------------------------------------------------------------------------------------------ processes
def docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(["docker", *args], check=False, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def sh(name: str, script: str, check: bool = True, timeout: float = 120) -> str:
    return docker("exec", name, "sh", "-c", script, check=check, timeout=timeout).stdout


def up(*ansible_args: str) -> None:
    """lab/up.sh: the lab's initial state (the caller holds the lab lock)."""
    proc = subprocess.run(["bash", str(LAB / "up.sh"), "--", *ansible_args], check=False, capture_output=True,
                          text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, f"lab/up.sh failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"


def reset(*ansible_args: str) -> None:
    """A host the pivot never touched: the initial state and no records, backups or plugin."""
    up("-e", "lab_clear_pivot_state=true", *ansible_args)


@dataclasses.dataclass
class Run:
    rc: int
    out: str
    report_dir: Path
    seconds: float

    @property
    def recap(self) -> dict[str, dict[str, int]]:
        keys = ("ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored")
        return {m.group(1): dict(zip(keys, map(int, m.groups()[1:]), strict=True)) for m in RECAP_RE.finditer(self.out)}

    def report(self, name: str = "pivot-report.json") -> dict:
        """A report this run wrote; pivot-report.json is validated against its documented schema."""
        path = self.report_dir / name
        assert path.exists(), f"no {path}; output:\n{self.out[-3000:]}"
        data = json.loads(path.read_text())
        if name == "pivot-report.json":
            import jsonschema

            jsonschema.validate(data, json.loads(REPORT_SCHEMA.read_text()))
        return data

    def tail(self, n: int = 6000) -> str:
        return self.out[-n:]


STEP_PROMPT = "(N)o/(y)es/(c)ontinue: "
INTERRUPT_GRACE_S = 120  # an interrupted ansible-playbook ends within seconds; past this it has hung


def playbook(name: str, *args: str, report_dir: Path, timeout: float = 900,
             interrupt_on: str | None = None, interrupt_signal: int = signal.SIGINT,
             interrupt_before: str | None = None) -> Run:
    """ansible-playbook -i inventories/lab playbooks/NAME ARGS. With ``interrupt_on``, the run is interrupted
    (``interrupt_signal`` to its process group, like Ctrl-C or a lost session) as soon as that text appears in its
    output; the result's rc is then whatever the interrupted run returned.

    ``interrupt_before`` ("role : task name", as Ansible names a task) interrupts at a known point instead: the
    run is started with ``--step``, which asks before each task and waits for the answer; every task is answered
    "y" until Ansible asks about this one, and the signal is sent while it waits there. Every task before it has
    ended on every host and this one has started on none (a header seen in the output is no such point: the task
    may already run on the host when the signal lands). ``--step`` is Ansible's own; the playbooks have no hook.

    An interrupted run that is still alive :data:`INTERRUPT_GRACE_S` after the signal has hung in Ansible's own
    clean-up (seen once in CI, at the --step question, never here): it gets SIGABRT, which Python's fault handler
    (PYTHONFAULTHANDLER, set for interrupted runs) answers by printing every thread's stack into the output before
    the process dies, as an operator's second Ctrl-C would end it. The test goes on (what it checks is the state
    the interruption left), and a warning carries the stacks into pytest's summary."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               PYTHONUNBUFFERED="1")
    env.pop("PIVOT_REPORT_DIR", None)
    if interrupt_on or interrupt_before:
        env["PYTHONFAULTHANDLER"] = "1"
    cmd = [str(PLAYBOOK_BIN), "-i", str(INVENTORY), str(REPO / "playbooks" / name),
           "-e", f"pivot_report_dir={report_dir}", *args]
    if interrupt_before:
        cmd.append("--step")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.PIPE if interrupt_before else None,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = t0 + timeout
    assert proc.stdout is not None
    interrupted = False
    hung_at = -1  # where in ``out`` the stacks of a run that hung after its interrupt begin
    out = ""
    answered = 0
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode  # a character may span two reads

    def interrupt() -> None:
        nonlocal interrupted, deadline
        os.killpg(proc.pid, interrupt_signal)
        interrupted = True
        deadline = min(deadline, time.monotonic() + INTERRUPT_GRACE_S)

    while True:
        # Raw reads, not lines: --step's question has no newline, and Ansible waits for the answer after it.
        # select: a run that waits for an answer never given still ends at the deadline.
        if select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            out += decode(chunk)
            if interrupt_on and not interrupted and interrupt_on in out:
                interrupt()
            if interrupt_before and not interrupted and out.endswith(STEP_PROMPT):
                question = out[out.rfind("Perform task: "):]  # a task's raw name may span lines
                if question == f"Perform task: TASK: {interrupt_before} {STEP_PROMPT}":
                    interrupt()  # Ansible waits on its question: nothing of it has run
                elif question.startswith("Perform task: ") and out.count(STEP_PROMPT) > answered:
                    assert proc.stdin is not None
                    proc.stdin.write(b"y\n")
                    proc.stdin.flush()
                    answered = out.count(STEP_PROMPT) + 1  # Ansible echoes the question in the banner after it
        if time.monotonic() < deadline:
            continue
        if interrupted and hung_at < 0:  # hung after the interrupt: its stacks, then its end
            hung_at = len(out)
            os.kill(proc.pid, signal.SIGABRT)
            deadline = time.monotonic() + 30
            continue
        os.killpg(proc.pid, signal.SIGKILL)
        if hung_at >= 0:  # the stacks were printed; what holds the output open is its process group
            break
        raise AssertionError(f"{name} ran over {timeout} s:\n{out[-4000:]}")
    rc = proc.wait(timeout=60)
    if hung_at >= 0:
        warnings.warn(f"{name} was still running {INTERRUPT_GRACE_S} s after its interrupt and was ended with "
                      f"SIGABRT (rc {rc}); its threads' stacks:\n{out[hung_at:][-6000:]}", stacklevel=2)
    if interrupt_on:
        assert interrupted, f"{name} never printed {interrupt_on!r}:\n{out[-4000:]}"
    if interrupt_before:
        assert interrupted, f"{name} never asked about the task {interrupt_before!r}:\n{out[-4000:]}"
    return Run(rc, out, report_dir, time.monotonic() - t0)


# ------------------------------------------------------------------------------------------------ state
def preflight_leftovers() -> str:
    """The temporary copies of the plugin that preflight makes on the inference host (none once it ended)."""
    return sh(INFERENCE, "ls -d /tmp/specdec-pivot-preflight.* 2>/dev/null", check=False).strip()


def unit_show(*props: str) -> dict[str, str]:
    out = sh(INFERENCE, f"systemctl show {UNIT} " + " ".join(f"-p {p}" for p in props))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def training_pids() -> list[int]:
    """Pids of the lab training job: python processes running the script (not look-alikes that name it)."""
    out = sh(TRAINING, "ps -eo pid=,args=")
    pids = []
    for line in out.splitlines():
        pid, _sep, args = line.strip().partition(" ")
        argv = args.split()
        script = next((a for a in argv[1:] if not a.startswith("-")), None)  # python [-u] SCRIPT ...
        if argv and argv[0].rsplit("/", 1)[-1].startswith("python") and script == TRAIN_SCRIPT:
            pids.append(int(pid))
    return sorted(pids)


# Processes on the training host whose command line names the training script without running it.
LOOKALIKES = {
    "tail -f": f"exec tail -f {TRAIN_SCRIPT}",
    "less": f"exec -a less tail -F {TRAIN_SCRIPT}",
    "vim": f"exec -a vim tail -F {TRAIN_SCRIPT}",
    "grep": f"exec -a grep tail -F {TRAIN_SCRIPT}",
    "watch": f"exec -a watch tail -F -n1 'pgrep -af {TRAIN_SCRIPT}'",
    "ssh": f"exec -a ssh tail -F pro6000 python3 {TRAIN_SCRIPT}",
    "python -c": f"exec python3 -c 'import time; time.sleep(3600)' {TRAIN_SCRIPT}",
}


def start_lookalikes() -> dict[str, int]:
    """Start :data:`LOOKALIKES` on the training host (bash ``exec -a`` shapes argv); label -> pid."""
    pids = {}
    for label, command in LOOKALIKES.items():
        out = sh(TRAINING, f"nohup bash -c {shlex.quote(command)} >/dev/null 2>&1 </dev/null & echo $!")
        pids[label] = int(out.strip())
    wait_for(lambda: all(TRAIN_SCRIPT in sh(TRAINING, f"tr '\\0' ' ' < /proc/{pid}/cmdline", check=False)
                         for pid in pids.values()), 10, "look-alikes started")
    return pids


def alive_in_training(pids: dict[str, int]) -> dict[str, bool]:
    return {label: sh(TRAINING, f"kill -0 {pid} 2>/dev/null && echo yes", check=False).strip() == "yes"
            for label, pid in pids.items()}


def stop_lookalikes(pids: dict[str, int]) -> None:
    sh(TRAINING, "kill " + " ".join(str(p) for p in pids.values()) + " 2>/dev/null", check=False)


def plugin_version() -> str | None:
    out = sh(INFERENCE, f"{VENV_PY} -m pip show sglang-ddtree 2>/dev/null | sed -n 's/^Version: //p'", check=False)
    return out.strip() or None


def files_with_hashes(name: str, pattern: str) -> dict[str, str]:
    """path -> 'sha1 mtime' of the files matching a shell glob/dir in the container (missing: empty)."""
    out = sh(name, f"for f in $(find {pattern} -type f 2>/dev/null | sort); do "
                   "printf '%s %s %s\\n' \"$f\" \"$(sha1sum < \"$f\" | cut -c1-40)\" \"$(stat -c %Y \"$f\")\"; done",
             check=False)
    return {p: f"{h} {m}" for p, h, m in (line.split(" ", 2) for line in out.splitlines() if line.strip())}


def unit_backups() -> dict[str, str]:
    return {p: v for p, v in files_with_hashes(INFERENCE, "/etc/systemd/system").items()
            if p.startswith(UNIT_PATH + ".") and p.endswith("~")}


def state() -> dict:
    """Everything a pivot could change, on both hosts."""
    svc = unit_show("MainPID", "ActiveState", "NRestarts", "ActiveEnterTimestampMonotonic", "ExecMainPID")
    return {
        "training_pids": training_pids(),
        "supervisor": sh(TRAINING, "systemctl is-enabled dflash-train.service 2>/dev/null; "
                                   "systemctl is-active dflash-train.service 2>/dev/null", check=False).split(),
        "unit_sha1": sh(INFERENCE, f"sha1sum {UNIT_PATH}").split()[0],
        "service": svc,
        "plugin": plugin_version(),
        "state_dir": files_with_hashes(INFERENCE, STATE_DIR),
        "backups": unit_backups(),
    }


def api_key_from_argv(argv: list[str]) -> str | None:
    """The key /get_server_info wants from a server started with ``argv`` (SGLang's rule for an ADMIN_OPTIONAL
    endpoint: the --admin-api-key when set, else the --api-key), or None for a server without keys."""
    keys: dict[str, str] = {}
    for i, word in enumerate(argv):
        for flag in ("--api-key", "--admin-api-key"):
            if word == flag and i + 1 < len(argv):
                keys[flag] = argv[i + 1]
            elif word.startswith(flag + "="):
                keys[flag] = word.split("=", 1)[1]
    return keys.get("--admin-api-key") or keys.get("--api-key") or None


def running_server_argv() -> list[str]:
    """The lab server's command line as it runs now (the unit's main process), [] when it does not run."""
    pid = unit_show("MainPID").get("MainPID", "0")
    if not pid.isdigit() or int(pid) == 0:
        return []
    raw = docker("exec", INFERENCE, "cat", f"/proc/{pid}/cmdline", check=False).stdout
    return [w for w in raw.split("\0") if w]


def server_info(url: str = URL, argv: list[str] | None = None) -> dict:
    """/get_server_info of the lab server (or of ``url``), sending the key its command line (``argv``, default the
    running unit's) names, as the pivot's own probes do; a server without a key gets no Authorization header."""
    key = api_key_from_argv(running_server_argv() if argv is None else argv)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    req = urllib.request.Request(url + "/get_server_info", headers=headers)
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def healthy() -> bool:
    """/health answers 200 (a slow answer is waited for: on a loaded 2-CPU machine a 5-s limit was too short)."""
    try:
        with urllib.request.urlopen(URL + "/health", timeout=30) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def http(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, bytes]:
    """(status, body) of a GET, or of a POST of ``body`` as JSON; an HTTP error status is returned, not raised."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_for(predicate: Callable[[], object], seconds: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not true within {seconds} s (last value {last!r})")


# ------------------------------------------------------------------------------------------------ wheels
def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def rewrite_wheel(src: Path, out_dir: Path, version: str | None = None,
                  entry_points: str | None = None, requires_python: str | None = None) -> Path:
    """A copy of a wheel with another version, entry_points.txt and/or Requires-Python, its RECORD recomputed (a
    valid wheel)."""
    name, old_version = src.name.split("-")[:2]
    version = version or old_version
    old_info, new_info = f"{name}-{old_version}.dist-info/", f"{name}-{version}.dist-info/"
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(src) as zf:
        for item in zf.namelist():
            data = zf.read(item)
            new = item.replace(old_info, new_info, 1) if item.startswith(old_info) else item
            if new == new_info + "METADATA":
                data = re.sub(rb"(?m)^Version: .*$", b"Version: " + version.encode(), data)
                if requires_python is not None:
                    data = re.sub(rb"(?m)^Requires-Python: .*\n", b"", data)
                    data = data.replace(b"\n", b"\nRequires-Python: " + requires_python.encode() + b"\n", 1)
            if new == new_info + "entry_points.txt" and entry_points is not None:
                data = entry_points.encode()
            files[new] = data
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, data in files.items():
        if path != new_info + "RECORD":
            writer.writerow([path, _record_hash(data), len(data)])
    writer.writerow([new_info + "RECORD", "", ""])
    files[new_info + "RECORD"] = record.getvalue().encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / src.name.replace(f"-{old_version}-", f"-{version}-", 1)
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return dest


def built_wheel() -> Path:
    """The wheel the pivot builds (the controller's cache; built by the first pivot run of the session)."""
    out = subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), str(REPO / "roles/ddtree_plugin/files/build_wheel.py"),
         str(REPO / "sglang-ddtree"),
         str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdec.pivot" / "wheels")],
        check=True, capture_output=True, text=True, timeout=600,
    ).stdout
    return Path(json.loads(out)["wheel"])
