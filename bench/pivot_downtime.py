"""Pivot wall time and SGLang service downtime in the lab, against the new server's own cold start.

For each of ``--runs`` runs, against the lab (lab/: ct200 and pro6000; it holds the lab's lock):

1. reset the lab to its initial state with no pivot records (``lab/up.sh -- -e lab_clear_pivot_state=true``):
   training running on ct200, sglang.service serving NEXTN on pro6000, no plugin;
2. run the pivot (``ansible-playbook -i inventories/lab playbooks/pivot.yml``) and read its report: the pivot's
   wall time, the **downtime** (the old server's SIGTERM, systemd's ActiveExitTimestampMonotonic, to the first
   ``/health`` 200, on the host's monotonic clock), how long the old server took to stop, the new server's own
   start to healthy, the controller-measured upper bound;
3. the **cold start of the same unit alone**: ``systemctl stop sglang.service``, then ``systemctl start`` and the
   same health wait the pivot uses (roles/sglang_service/files/wait_healthy.py, same poll interval), so the new
   server's start to its first ``/health`` 200 is measured with nothing else going on.

Prints and writes a markdown report (medians, min-max, every run) to ``--out`` and the raw numbers to
``--json``. The goal it checks: downtime no more than a couple of seconds above the server's own start.

    .venv/bin/python bench/pivot_downtime.py --runs 5            # ~9 min on the 2-CPU lab machine
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INVENTORY = REPO / "inventories" / "lab"
PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
WAIT = REPO / "roles" / "sglang_service" / "files" / "wait_healthy.py"
INFERENCE, UNIT, URL = "pro6000", "sglang.service", "http://127.0.0.1:30000/health"
POLL_S = 0.25  # sglang_service_health_delay's default: the pivot's own poll interval


def run(cmd: list[str], timeout: float = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return proc


def in_lab(*cmd: str, timeout: float = 300) -> str:
    return run(["docker", "exec", INFERENCE, *cmd], timeout=timeout).stdout


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cold_start() -> dict:
    """Stop the unit, start it, wait for /health exactly as the pivot does; the wait script's numbers."""
    in_lab("systemctl", "stop", UNIT)
    in_lab("sh", "-c", f"until [ \"$(systemctl is-active {UNIT})\" = inactive ]; do sleep 0.1; done", timeout=60)
    in_lab("systemctl", "start", UNIT)
    out = in_lab("python3", "/var/tmp/wait_healthy.py", URL, UNIT, "300", str(POLL_S))
    result = json.loads(out)
    if not result["healthy"]:
        raise SystemExit(f"cold start did not become healthy: {result['reason']}")
    return result


def one_run(i: int, env: dict) -> dict:
    t0 = time.monotonic()
    run(["bash", "lab/up.sh", "--", "-e", "lab_clear_pivot_state=true"], env=env)
    reset_s = time.monotonic() - t0
    load_before = loadavg()
    with tempfile.TemporaryDirectory() as reports:
        t0 = time.monotonic()
        run([str(PLAYBOOK), "-i", str(INVENTORY), "playbooks/pivot.yml", "-e", f"pivot_report_dir={reports}"],
            env=env, timeout=1200)
        command_s = time.monotonic() - t0
        report = json.loads((Path(reports) / "pivot-report.json").read_text())
    svc = report["inference"][0]["service"]
    assert report["status"] == "ok" and svc["restarted"], report["status"]
    run(["docker", "cp", str(WAIT), f"{INFERENCE}:/var/tmp/wait_healthy.py"])
    cold = cold_start()
    row = {
        "run": i,
        "reset_s": round(reset_s, 1),
        "pivot_wall_s": report["wall_time_s"],
        "pivot_command_s": round(command_s, 1),
        "downtime_s": svc["downtime_s"],
        "downtime_upper_s": svc["downtime_upper_s"],
        "stop_s": svc["stop_s"],
        "pivot_start_to_healthy_s": svc["start_to_healthy_s"],
        "cold_start_to_healthy_s": cold["start_to_healthy_s"],
        "cold_stop_s": cold["stop_s"],
        "phases": report["phases"],
        "baseline_tokens_per_s": (svc["baseline"]["comparison"] or {}).get("tokens_per_s"),
        "load_before": load_before,
        "load_after": loadavg(),
    }
    row["downtime_minus_cold_start_s"] = round(row["downtime_s"] - row["cold_start_to_healthy_s"], 3)
    print(json.dumps({k: v for k, v in row.items() if k != "phases"}), flush=True)
    return row


def stats(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


METRICS = [
    ("pivot_wall_s", "pivot wall time (report: preflight start to report), s"),
    ("pivot_command_s", "pivot command wall time (ansible-playbook start to exit), s"),
    ("downtime_s", "**downtime**: old server's SIGTERM to the new server's first /health 200, s"),
    ("stop_s", "of which: the old (NEXTN) server's stop, s"),
    ("pivot_start_to_healthy_s", "of which: the new server's own start to healthy, during the pivot, s"),
    ("cold_start_to_healthy_s", "**the same unit's cold start alone** (start to first /health 200), s"),
    ("downtime_minus_cold_start_s", "downtime minus the cold start alone, s"),
    ("downtime_upper_s", "downtime upper bound (controller clock: restart task to 200 seen), s"),
]


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"# Pivot downtime in the lab ({meta['date']})",
        "",
        f"`bench/pivot_downtime.py --runs {len(rows)}` at commit `{meta['commit']}` on {meta['machine']}; the lab's "
        "two systemd containers (ct200: the lab training job; pro6000: sglang.service running the lab server "
        "stand-in, the real SGLang 0.5.23 parser and registry, tiny models on CPU). Each run: reset (training "
        "running, NEXTN serving, no plugin, no pivot records), the whole `playbooks/pivot.yml`, then the same "
        f"DDTREE unit stopped and cold-started alone, health polled every {POLL_S} s as in the pivot. Load average "
        f"before the runs {meta['load_start']}, after {meta['load_end']}.",
        "",
        "Median (min-max) over the runs:",
        "",
        "| metric | median (min-max) |",
        "|---|---|",
    ]
    for key, label in METRICS:
        lines.append(f"| {label} | {stats([r[key] for r in rows])} |")
    lines += [
        "",
        "Every run:",
        "",
        "| run | pivot wall s | downtime s | old stop s | new start (pivot) s | cold start alone s | downtime - cold "
        "start s | upper bound s | load before |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['pivot_wall_s']} | {r['downtime_s']} | {r['stop_s']} | "
            f"{r['pivot_start_to_healthy_s']} | {r['cold_start_to_healthy_s']} | {r['downtime_minus_cold_start_s']} "
            f"| {r['downtime_upper_s']} | {r['load_before']} |"
        )
    phases = ["preflight", "training_halt", "plugin", "switch"]
    lines += ["", "Where the pivot's wall time goes (median s per phase, from the reports' phase times):", "",
              "| " + " | ".join(phases) + " |", "|" + "---|" * len(phases)]

    def secs(span: dict) -> float:
        def ts(s: str) -> float:
            return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
        return ts(span["finished_at"]) - ts(span["started_at"])

    lines.append("| " + " | ".join(f"{statistics.median(secs(r['phases'][p]) for r in rows):.1f}" for p in phases)
                 + " |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    today = datetime.date.today().isoformat()
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / f"pivot_downtime-lab-{today}.md")
    ap.add_argument("--json", type=Path, default=None, help="raw numbers (default: --out with .json)")
    args = ap.parse_args(argv)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), SPECDEC_LAB_LOCKED="1")
    env.pop("PIVOT_REPORT_DIR", None)
    commit = run(["git", "rev-parse", "--short", "HEAD"]).stdout.strip()
    dirty = run(["git", "status", "--porcelain", "--", "roles", "playbooks", "lab"]).stdout.strip()
    meta = {
        "date": today,
        "commit": commit + (" (+ uncommitted changes in roles/playbooks/lab)" if dirty else ""),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "load_start": loadavg(),
    }
    rows = []
    with open(os.environ.get("SPECDEC_LAB_LOCK", "/tmp/specdec-lab.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for i in range(1, args.runs + 1):
            rows.append(one_run(i, env))
    meta["load_end"] = loadavg()
    text = markdown(rows, meta)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    (args.json or args.out.with_suffix(".json")).write_text(json.dumps({"meta": meta, "runs": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
