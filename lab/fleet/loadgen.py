#!/usr/bin/env python3
"""The fleet lab's bounded load generator and HAProxy runtime-API reader (loopback only).

    loadgen.py run  --url http://127.0.0.1:30100 --requests 400 --duration 120 [--concurrency 2] [--out F.json]
    loadgen.py stat --api 127.0.0.1:30109           # HAProxy `show stat` of the backend, one server a line

`run` sends POST /generate requests through the balancer from `--concurrency` workers until `--requests` have been
sent or `--duration` seconds have passed, whichever comes first (also on SIGINT/SIGTERM: no new request, the
in-flight ones finish), and prints (or writes) one JSON summary. Each request is classified:

- ok:        HTTP 200, the whole body (Content-Length) read, JSON with `text` and `meta_info.completion_tokens`;
- truncated: HTTP 200 but the body ended early or is not the JSON above (a server that stopped mid-answer);
- failed:    anything else: connection refused/reset, timeout, a non-200 status (HAProxy's 503 "no server").

With `--api HOST:PORT` it also polls HAProxy's runtime API (`show stat`) every `--poll` s and reports, per
server, the seconds it was not UP (out of rotation: DRAIN, MAINT, DOWN). Only loopback addresses are accepted:
the generator never leaves this machine (the fleet lab's ports are published on 127.0.0.1).
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import signal
import socket
import sys
import threading
import time
import urllib.parse
from collections import Counter
from typing import Any

PROMPTS = ["The capital of France is", "Speculative decoding works by", "A tree of draft tokens",
           "Once upon a time", "The quick brown fox"]


def _loopback(host: str) -> str:
    if host == "localhost":
        return "127.0.0.1"
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise SystemExit(f"loadgen: {host} is not a loopback address; the load generator only talks to the local lab")


# ---------------------------------------------------------------------------------------------------- HAProxy
def haproxy_command(api: str, command: str, timeout: float = 3.0) -> str:
    host, _, port = api.rpartition(":")
    with socket.create_connection((_loopback(host), int(port)), timeout=timeout) as conn:
        conn.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            data = conn.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def show_stat(api: str, backend: str | None = None) -> list[dict[str, str]]:
    """`show stat` as dicts, the servers only (not FRONTEND/BACKEND lines), of `backend` when given."""
    text = haproxy_command(api, "show stat")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        raise RuntimeError(f"unexpected answer to 'show stat': {text[:200]!r}")
    keys = lines[0][2:].split(",")
    rows = [dict(zip(keys, line.split(","), strict=False)) for line in lines[1:]]
    return [r for r in rows if r.get("svname") not in ("FRONTEND", "BACKEND")
            and (backend is None or r.get("pxname") == backend)]


class RotationWatcher(threading.Thread):
    """Polls `show stat` and sums, per server, the time its status was not UP (out of rotation)."""

    def __init__(self, api: str, backend: str | None = None, poll: float = 0.2) -> None:
        super().__init__(name="rotation-watcher", daemon=True)
        self.api, self.backend, self.poll = api, backend, poll
        self.stop_event = threading.Event()
        self.out_s: dict[str, float] = {}
        self.states: dict[str, str] = {}
        self.transitions: list[dict[str, Any]] = []
        self.errors = 0
        self.t0 = time.monotonic()

    def run(self) -> None:
        last = time.monotonic()
        while not self.stop_event.is_set():
            try:
                rows = show_stat(self.api, self.backend)
            except (OSError, RuntimeError):
                self.errors += 1
                rows = None
            now = time.monotonic()
            if rows is not None:
                for r in rows:
                    name, status = r["svname"], r.get("status", "?")
                    self.out_s.setdefault(name, 0.0)
                    previous = self.states.get(name)
                    if previous is not None and not previous.startswith("UP"):
                        self.out_s[name] += now - last
                    if previous != status:
                        self.transitions.append({"t": round(now - self.t0, 2), "server": name, "status": status})
                    self.states[name] = status
            last = now
            self.stop_event.wait(self.poll)

    def stop(self) -> dict[str, float]:
        self.stop_event.set()
        self.join(timeout=5)
        return {k: round(v, 2) for k, v in sorted(self.out_s.items())}


# ------------------------------------------------------------------------------------------------------ load
def one_request(host: str, port: int, max_new_tokens: int, prompt: str, timeout: float) -> tuple[str, str]:
    body = json.dumps({"text": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}})
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            resp.read()
            return "failed", f"HTTP {resp.status}"
        try:
            data = resp.read()
        except (http.client.IncompleteRead, OSError) as exc:
            return "truncated", f"body cut: {type(exc).__name__}"
        try:
            reply = json.loads(data)
            tokens = reply["meta_info"]["completion_tokens"]
            if not isinstance(reply["text"], str) or not isinstance(tokens, int) or tokens <= 0:
                raise ValueError("no completion")
        except (ValueError, KeyError, TypeError) as exc:
            return "truncated", f"bad body: {exc}"
        return "ok", ""
    except (OSError, http.client.HTTPException) as exc:
        return "failed", type(exc).__name__
    finally:
        conn.close()


def run_load(url: str, requests: int, duration: float, concurrency: int = 2, max_new_tokens: int = 8,
             timeout: float = 60.0, stop: threading.Event | None = None) -> dict[str, Any]:
    """Sends at most `requests` requests for at most `duration` s (or until `stop` is set); returns the summary."""
    parsed = urllib.parse.urlsplit(url)
    host, port = _loopback(parsed.hostname or ""), parsed.port or 80
    stop = stop or threading.Event()
    lock = threading.Lock()
    counts: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    sent = 0
    t0 = time.monotonic()

    def worker(index: int) -> None:
        nonlocal sent
        while not stop.is_set() and time.monotonic() - t0 < duration:
            with lock:
                if sent >= requests:
                    return
                sent += 1
                n = sent
            outcome, why = one_request(host, port, max_new_tokens, PROMPTS[n % len(PROMPTS)], timeout)
            with lock:
                counts[outcome] += 1
                if why:
                    errors[f"{outcome}: {why}"] += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration + timeout + 5)
    return {"url": url, "sent": sent, "ok": counts["ok"], "failed": counts["failed"],
            "truncated": counts["truncated"], "errors": dict(errors), "concurrency": concurrency,
            "max_new_tokens": max_new_tokens, "load_s": round(time.monotonic() - t0, 2),
            "stopped_by": ("signal" if stop.is_set() else "requests" if sent >= requests else "duration")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="send a bounded load through the balancer")
    r.add_argument("--url", default="http://127.0.0.1:30100")
    r.add_argument("--requests", type=int, required=True, help="at most this many requests")
    r.add_argument("--duration", type=float, required=True, help="at most this many seconds")
    r.add_argument("--concurrency", type=int, default=2)
    r.add_argument("--max-new-tokens", type=int, default=8)
    r.add_argument("--timeout", type=float, default=60.0, help="per request, s")
    r.add_argument("--api", help="HAProxy runtime API HOST:PORT: also report each server's time out of rotation")
    r.add_argument("--backend", default="sglang")
    r.add_argument("--poll", type=float, default=0.2)
    r.add_argument("--out", help="write the JSON summary here (else stdout)")
    s = sub.add_parser("stat", help="print HAProxy's view of the backend's servers")
    s.add_argument("--api", default="127.0.0.1:30109")
    s.add_argument("--backend", default="sglang")
    args = ap.parse_args(argv)
    if args.cmd == "stat":
        for row in show_stat(args.api, args.backend):
            print(f"{row['pxname']}/{row['svname']}: {row['status']} weight {row.get('weight')} "
                  f"sessions {row.get('scur')} (total {row.get('stot')})")
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    watcher = RotationWatcher(args.api, args.backend, args.poll) if args.api else None
    if watcher:
        watcher.start()
    summary = run_load(args.url, args.requests, args.duration, args.concurrency, args.max_new_tokens,
                       args.timeout, stop)
    if watcher:
        summary["out_of_rotation_s"] = watcher.stop()
        summary["rotation_transitions"] = watcher.transitions
    text = json.dumps(summary, indent=2)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
