#!/usr/bin/env python3
"""Fleet pivot under load (issue 17): the rolling pivot vs all hosts at once, measured in the fleet lab.

    .venv/bin/python bench/fleet_pivot.py --serial 1 --serial 100%      # ~8 min per run on a 2-CPU VM

For each `--serial` value: reset the fleet lab (lab/fleet/up.sh, pivot records cleared: NEXTN everywhere),
start the bounded load generator (lab/fleet/loadgen.py: POST /generate through HAProxy, loopback only) and the
runtime-API watcher (HAProxy `show stat` every 0.2 s: each server's time not UP), run
`playbooks/pivot.yml -i inventories/lab-fleet -e pivot_switch_serial=SERIAL`, stop the load 2 s after the pivot
ends, and write `bench/results/fleet-serial-<S>-<date>.json` with the keys serial, sent, ok, failed, truncated,
wall_s (the pivot's wall time), out_of_rotation_s (per host, as HAProxy saw it), plus the pivot's exit status,
the fleet report (which host runs which algorithm) and the error kinds. `--markdown` writes a summary table.
Touches only the fleet lab's containers (fleet-a/b/c, fleet-lb) and 127.0.0.1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "lab" / "fleet"))
import loadgen

LB_URL = f"http://127.0.0.1:{os.environ.get('SPECDEC_FLEET_LB_PORT', '30100')}"
API = f"127.0.0.1:{os.environ.get('SPECDEC_FLEET_API_PORT', '30109')}"


def reset_fleet() -> None:
    proc = subprocess.run(["bash", "lab/fleet/up.sh", "--", "-e", "lab_clear_pivot_state=true"], cwd=REPO,
                          capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"lab/fleet/up.sh failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")


def measure(serial: str, concurrency: int, max_requests: int, max_duration: float,
            extra: list[str]) -> dict:
    report_dir = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    stop = threading.Event()
    result: dict = {}
    watcher = loadgen.RotationWatcher(API, "sglang", 0.2)
    watcher.start()
    load = threading.Thread(target=lambda: result.update(loadgen.run_load(
        LB_URL, max_requests, max_duration, concurrency, 8, 60.0, stop)), daemon=True)
    load.start()
    time.sleep(2)
    t0 = time.monotonic()
    cmd = [str(REPO / ".venv/bin/ansible-playbook"), "-i", "inventories/lab-fleet", "playbooks/pivot.yml",
           "-e", f"pivot_switch_serial={serial}", "-e", f"pivot_report_dir={report_dir}",
           # its own wheel directory: another pivot on this controller rebuilds the shared one (checksum failure)
           "-e", f"ddtree_plugin_build_dir={report_dir / 'wheels'}", *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800, check=False)
    wall = time.monotonic() - t0
    time.sleep(2)
    stop.set()
    load.join(120)
    out = watcher.stop()
    fleet_report = report_dir / "pivot-fleet.json"
    fleet = json.loads(fleet_report.read_text()) if fleet_report.exists() else None
    (report_dir / "ansible.log").write_text(proc.stdout + proc.stderr)
    return {
        "serial": serial,
        "sent": result.get("sent"),
        "ok": result.get("ok"),
        "failed": result.get("failed"),
        "truncated": result.get("truncated"),
        "wall_s": round(wall, 1),
        "out_of_rotation_s": out,
        "pivot_rc": proc.returncode,
        "errors": result.get("errors"),
        "load_s": result.get("load_s"),
        # False when a load bound (--max-requests, --max-duration) ended the load before the pivot did: the counts
        # then miss the pivot's end (an all-at-once pivot's 503s come back in milliseconds, ~300 a second).
        "load_covered_pivot": (result.get("load_s") or 0) >= wall,
        "concurrency": concurrency,
        "max_new_tokens": 8,
        "hosts": [{k: h[k] for k in ("host", "algorithm", "result", "out_of_rotation_s")}
                  for h in (fleet or {}).get("hosts", [])],
        "rotation_transitions": watcher.transitions,
        "report_dir": str(report_dir),
        "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def markdown(runs: list[dict]) -> str:
    lines = ["| serial | sent | ok | failed | truncated | pivot wall s | out of rotation s (HAProxy) | pivot rc |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        out = ", ".join(f"{h} {s}" for h, s in r["out_of_rotation_s"].items())
        lines.append(f"| {r['serial']} | {r['sent']} | {r['ok']} | {r['failed']} | {r['truncated']} | "
                     f"{r['wall_s']} | {out} | {r['pivot_rc']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serial", action="append", help="pivot_switch_serial values (default: 1 and 100%%)")
    ap.add_argument("--concurrency", type=int, default=2)
    # The duration is the bound that matters: with no server in rotation HAProxy answers 503 at once, and a
    # request bound of 20,000 ended an all-at-once run's load 66 s into its 245-s outage.
    ap.add_argument("--max-requests", type=int, default=1_000_000, help="load bound: requests")
    ap.add_argument("--max-duration", type=float, default=1500, help="load bound: seconds")
    ap.add_argument("--out-dir", default=str(REPO / "bench" / "results"))
    ap.add_argument("--no-reset", action="store_true", help="do not reset the fleet lab before each run")
    ap.add_argument("--markdown", help="also write the table of every run to this file")
    ap.add_argument("extra", nargs="*", help="more ansible-playbook arguments (after --)")
    args = ap.parse_args()
    runs = []
    date = dt.date.today().isoformat()
    for serial in args.serial or ["1", "100%"]:
        if not args.no_reset:
            reset_fleet()
        run = measure(serial, args.concurrency, args.max_requests, args.max_duration, args.extra)
        name = "serial-" + serial.replace("%", "pct")
        path = Path(args.out_dir) / f"fleet-{name}-{date}.json"
        path.write_text(json.dumps(run, indent=2) + "\n")
        print(json.dumps({k: run[k] for k in ("serial", "sent", "ok", "failed", "truncated", "wall_s",
                                              "out_of_rotation_s", "pivot_rc")}), flush=True)
        runs.append(run)
    if args.markdown:
        Path(args.markdown).write_text(markdown(runs))
    print(markdown(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
