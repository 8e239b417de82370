"""Wait on the host until an SGLang server answers /health 200, or fail fast when its systemd unit dies.

Usage: wait_healthy.py URL UNIT TIMEOUT_S [INTERVAL_S] [--restart RESTART_TIMEOUT_S]

With --restart it first reloads systemd and restarts the unit itself (``systemctl daemon-reload``, ``systemctl
restart UNIT``, together within RESTART_TIMEOUT_S: the old server's stop, up to the unit's TimeoutStopSec, and the
new one's exec; TIMEOUT_S counts from when the restart returned), so the caller has nothing left to do between the
old server's stop and the new server's first 200 (the pivot's controller then only waits: its own work no longer
competes with the new server's start for the host's CPUs). A reload or restart that fails is the reason
(``restart``: the command, its exit status, its stderr, how long it took).

Polls URL every INTERVAL_S (default 0.25) seconds and, between polls, the unit's systemd state. Stops early with
a reason when the unit is failed, exited, or systemd restarted it (NRestarts grew: the server crashed at start),
instead of waiting for the timeout. Timestamps are taken on the host with CLOCK_MONOTONIC, the clock systemd's
``*TimestampMonotonic`` properties use, so ``downtime_s`` (the old server's SIGTERM, ``ActiveExitTimestamp``, to
the first 200) has no controller/host clock skew in it.

Prints one JSON object: healthy, status, reason, elapsed_s, polls, downtime_s, stop_s, start_to_healthy_s,
the endpoints of those durations as UTC times on the host's clock (stop_began_at: the old server's SIGTERM,
stop_ended_at: the old server gone, start_began_at: the new server's start, first_healthy_at: the first 200,
wait_started_at: this script's start; each duration is the difference of its two endpoints), state (systemd
properties), journal (the unit's last lines when not healthy), ddtree_log (when healthy: what this start's own log
lines say about the DDTREE plugin, :func:`ddtree_log`; the journal of the unit's current invocation). Exit 0 either
way; the caller decides. Read-only.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

ERROR_RE = re.compile(r"error|exception|traceback|failed|exited|killed|refused", re.IGNORECASE)
PROPS = (
    "ActiveState",
    "SubState",
    "Result",
    "MainPID",
    "NRestarts",
    "ActiveExitTimestampMonotonic",
    "InactiveEnterTimestampMonotonic",
    "ExecMainStartTimestampMonotonic",
    "InvocationID",
)


# Which DDTREE hooks the new server applied, from its own log (this start's journal lines).
HOOK_TARGETS = (
    "sglang.srt.speculative.spec_utils.spec_need_hidden_states",
    "sglang.srt.speculative.spec_info.create_dummy_verify_input",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.get_spec_info",
    "sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len",
)
APPLIED_RE = re.compile(r"Applied \d+ hook\(s\) to (\S+) \(from: ([^)]*)\)")
NOT_INSTALLED_RE = re.compile(r"sglang-ddtree: hook on (\S+) not installed \((.*?)\); DDTREE needs it to serve", re.S)
FAILED_APPLY_RE = re.compile(r"Failed to apply hooks to (\S+)")
REGISTERED_RE = re.compile(r"sglang-ddtree: registered speculative algorithm DDTREE")
NOT_REGISTERED_RE = re.compile(
    r"sglang-ddtree: (DDTREE NOT REGISTERED|DDTREE not registered|sglang \S+ ships a native)"
)
WORKER_RE = re.compile(r"DDTREE worker: budget=\d+")


def _clip(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def ddtree_log(lines: list[str]) -> dict:
    """What the server's own log lines (one start) say about the DDTREE plugin: whether register() registered DDTREE
    (``registered``: True, False, or None when the log says neither), each hook target's fate (``hooks``: target ->
    ``applied`` (SGLang's HookRegistry logged "Applied N hook(s) to TARGET"), ``not installed: REASON`` (the plugin's
    own warning), ``failed: ...`` (HookRegistry could not apply it) or ``not in the log``), and the DDTREE worker's
    start-up line (``worker``; only a real SGLang scheduler writes it, after checking the CUDA-graph hook is applied
    unless --disable-cuda-graph). ``lines``: the matching log records, clipped. A record may span several lines (an
    exception message with a newline), so the text is read as a whole."""
    text = "\n".join(str(line) for line in lines)
    hooks = {t: "not in the log" for t in HOOK_TARGETS}
    found = []  # (position, record) in log order
    for m in APPLIED_RE.finditer(text):
        if m.group(1) in hooks:
            hooks[m.group(1)] = "applied"
            found.append((m.start(), m.group(0)))
    for m in NOT_INSTALLED_RE.finditer(text):
        if m.group(1) in hooks and hooks[m.group(1)] != "applied":
            hooks[m.group(1)] = _clip(f"not installed: {m.group(2)}", 240)
        found.append((m.start(), m.group(0)))
    for m in FAILED_APPLY_RE.finditer(text):
        if m.group(1) in hooks:
            hooks[m.group(1)] = "failed: SGLang's HookRegistry could not apply it (see the server's log)"
            found.append((m.start(), m.group(0)))
    registered = None
    for m in REGISTERED_RE.finditer(text):
        registered = True
        found.append((m.start(), m.group(0)))
    for m in NOT_REGISTERED_RE.finditer(text):
        registered = False if registered is None else registered
        found.append((m.start(), text[m.start() : text.find("\n", m.start()) % (len(text) + 1)]))
    workers = [text[m.start() : text.find("\n", m.start()) % (len(text) + 1)] for m in WORKER_RE.finditer(text)]
    found.extend((text.find(w), w) for w in workers)
    return {
        "registered": registered,
        "hooks": hooks,
        "worker": _clip(workers[-1]) if workers else None,
        "lines": [_clip(record) for _pos, record in sorted(found)][-12:],
    }


def this_start_journal(unit: str, invocation: str) -> list[str]:
    """The unit's journal lines of its current invocation (this start), or its last 400 lines without an id."""
    match = [f"_SYSTEMD_INVOCATION_ID={invocation}"] if invocation else ["-n", "400"]
    return subprocess.run(
        ["journalctl", "-u", unit, *match, "--no-pager", "-o", "cat"],
        capture_output=True,
        text=True,
        check=False,
        timeout=15,
    ).stdout.splitlines()


def unit_state(unit: str) -> dict[str, str]:
    out = subprocess.run(
        ["systemctl", "show", unit, *[f"--property={p}" for p in PROPS]],
        capture_output=True,
        text=True,
        check=False,
        timeout=15,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def health(url: str, timeout: float) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # the loopback URL from the plan
            return resp.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, str(exc.reason)
    except (urllib.error.URLError, OSError) as exc:
        return -1, str(getattr(exc, "reason", exc))


def seconds(state: dict[str, str], key: str) -> float | None:
    value = state.get(key, "0")
    return int(value) / 1e6 if value.isdigit() and int(value) > 0 else None


def wall_clock(offset: float):
    """CLOCK_MONOTONIC seconds -> UTC ISO time (host clock), with one offset for every endpoint of a run, so the
    difference of two printed times is the duration computed from the same two monotonic readings."""

    def iso(mono: float | None) -> str | None:
        if mono is None:
            return None
        return datetime.fromtimestamp(mono + offset, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    return iso


def dead_reason(state: dict[str, str], baseline_restarts: int) -> str:
    active, sub = state.get("ActiveState", ""), state.get("SubState", "")
    restarts = int(state.get("NRestarts", "0") or 0)
    if active == "failed":
        return f"the unit failed (Result={state.get('Result', '?')})"
    if restarts > baseline_restarts:
        return f"the server exited and systemd restarted it ({restarts - baseline_restarts} times): it crashes at start"
    if sub == "auto-restart":
        return f"the server exited (Result={state.get('Result', '?')}) and systemd is about to restart it"
    if active in ("inactive", "deactivating"):
        return f"the unit is {active} (Result={state.get('Result', '?')}): the server exited"
    return ""


def restart(unit: str, timeout: float) -> dict:
    """``systemctl daemon-reload`` (systemd reads the unit file the switch just wrote), then ``systemctl restart
    UNIT``: the command that failed (or the restart), its exit status, stderr and how long both took."""
    t0 = time.monotonic()
    for command in (["systemctl", "daemon-reload"], ["systemctl", "restart", unit]):
        try:
            proc = subprocess.run(command, capture_output=True, text=True, check=False,
                                  timeout=max(timeout - (time.monotonic() - t0), 1.0))
            rc, err = proc.returncode, proc.stderr.strip()
        except subprocess.TimeoutExpired:
            rc, err = None, f"did not return within {timeout:g} s"
        if rc != 0:
            break
    return {"command": " ".join(command), "rc": rc, "stderr": err[-500:], "s": round(time.monotonic() - t0, 3)}


def main(argv: list[str]) -> int:
    restart_timeout = None
    if "--restart" in argv:
        at = argv.index("--restart")
        restart_timeout = float(argv[at + 1])
        argv = argv[:at] + argv[at + 2 :]
    url, unit, timeout = argv[1], argv[2], float(argv[3])
    interval = float(argv[4]) if len(argv) > 4 else 0.25
    iso = wall_clock(time.time() - time.monotonic())
    restarted = restart(unit, restart_timeout) if restart_timeout is not None else None
    start = time.monotonic()  # the deadline counts from here: after the restart returned
    baseline = unit_state(unit)
    baseline_restarts = int(baseline.get("NRestarts", "0") or 0)
    polls, status, reason, detail = 0, -1, "", ""
    state = baseline
    if restarted is not None and restarted["rc"] != 0:
        reason = f"{restarted['command']} failed (exit status {restarted['rc']}): {restarted['stderr']}"
    while not reason:
        polls += 1
        status, detail = health(url, timeout=min(5.0, max(interval * 4, 1.0)))
        now = time.monotonic()
        if status == 200:
            break
        state = unit_state(unit)
        reason = dead_reason(state, baseline_restarts)
        if reason:
            break
        if now - start > timeout:
            reason = f"no 200 from {url} within {timeout:g} s (last: {status} {detail})".strip()
            break
        time.sleep(interval)
    healthy_at = time.monotonic()
    if status == 200:
        state = unit_state(unit)
    stop_began, old_gone, new_started = (
        seconds(state, "ActiveExitTimestampMonotonic"),
        seconds(state, "InactiveEnterTimestampMonotonic"),
        seconds(state, "ExecMainStartTimestampMonotonic"),
    )
    result = {
        "healthy": status == 200,
        "status": status,
        "reason": "" if status == 200 else reason,
        "elapsed_s": round(healthy_at - start, 3),
        "polls": polls,
        "downtime_s": round(healthy_at - stop_began, 3) if status == 200 and stop_began else None,
        "stop_s": round(old_gone - stop_began, 3) if stop_began and old_gone and old_gone >= stop_began else None,
        "start_to_healthy_s": round(healthy_at - new_started, 3) if status == 200 and new_started else None,
        "wait_started_at": iso(start),
        "stop_began_at": iso(stop_began),
        "stop_ended_at": iso(old_gone) if stop_began and old_gone and old_gone >= stop_began else None,
        "start_began_at": iso(new_started) if status == 200 and new_started else None,
        "first_healthy_at": iso(healthy_at) if status == 200 else None,
        "state": state,
        "journal": [],
        "ddtree_log": None,
        "restart": restarted,
    }
    if status == 200:
        result["ddtree_log"] = ddtree_log(this_start_journal(unit, state.get("InvocationID", "")))
    if status != 200:
        lines = subprocess.run(
            ["journalctl", "-u", unit, "-n", "25", "--no-pager", "-o", "cat"],
            capture_output=True,
            text=True,
            check=False,
            timeout=15,
        ).stdout.splitlines()
        result["journal"] = lines
        # The lines worth a failure message: errors first (argparse, tracebacks, systemd's exit status).
        result["journal_errors"] = [ln for ln in lines if ERROR_RE.search(ln)][-6:] or lines[-6:]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
