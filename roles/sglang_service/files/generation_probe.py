"""Send a fixed set of greedy prompts to an SGLang server on this host and time them (read-only).

Usage: generation_probe.py CONFIG_B64

CONFIG_B64 is base64 of a JSON object: ``url`` (the server's base URL), ``prompts`` (list of strings),
``max_new_tokens``, ``warmup`` (requests sent first and not measured, so a cold server's first-request costs do
not count), ``timeout`` (seconds per request), ``repeats`` (how often the whole set is sent; outputs come from the
first pass, timings from all).

Each request is ``POST /generate`` with ``sampling_params: {temperature: 0, max_new_tokens: N, ignore_eos:
true}``: greedy, and always N tokens, so tokens/s of two servers compare the same work. Requests are sent one
after another; ``wall_s`` is measured here (CLOCK_MONOTONIC) around each request, so it includes HTTP.

Prints one JSON object: ok, error, url, started_at, finished_at, max_new_tokens, warmup, repeats, results
(per prompt: prompt, text, output_ids, completion_tokens, wall_s, e2e_latency, spec_accept_length,
spec_accept_rate, spec_verify_ct, finish_reason), completion_tokens, wall_s, tokens_per_s (completion tokens / wall
time over every measured request), server (speculative_algorithm, avg_spec_accept_length, version, ddtree_budget,
from /get_server_info when it answers), budget (DDTREE's node budget per tree round during the measured requests:
policy, candidates, steps, histogram; from the ``ddtree_budget`` that sglang-ddtree adds to /get_server_info, read
before and after them; null when the server reports none). Exit 0 either way; the caller decides.

A server started with ``--api-key``/``--admin-api-key``: the keys come from the JSON file (mode 0600, written by
the role just before) that the environment variable ``SPECDEC_PIVOT_AUTH_FILE`` names: ``api_key`` (sent with
``/generate``) and ``admin_api_key`` (sent with ``/get_server_info`` when set, else the API key). Never from the
command line, which other users can read, and never from the environment itself: Ansible puts a task's environment
on the remote shell's command line (and prints it at -vvv).
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import sys
import time
import urllib.error
import urllib.request


def iso_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def read_keys() -> dict:
    """The server's keys from the file ``SPECDEC_PIVOT_AUTH_FILE`` names ({} when none is named)."""
    path = os.environ.get("SPECDEC_PIVOT_AUTH_FILE")
    if not path:
        return {}
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def auth_headers(admin: bool = False) -> dict:
    """``Authorization: Bearer KEY`` as SGLang checks it (admin endpoints prefer the admin key)."""
    keys = read_keys()
    key = keys.get("api_key") or ""
    if admin:
        key = keys.get("admin_api_key") or key
    return {"Authorization": f"Bearer {key}"} if key else {}


def post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **auth_headers()},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # the loopback URL from the plan
        return json.loads(resp.read() or b"{}")


def server_info(base: str, timeout: float) -> dict:
    for path in ("/get_server_info", "/server_info"):
        try:
            req = urllib.request.Request(base + path, headers=auth_headers(admin=True))
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                info = json.loads(resp.read() or b"{}")
        except (urllib.error.URLError, OSError, ValueError):
            continue
        states = info.get("internal_states") or [{}]
        state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
        # A stand-in says so itself (the lab's sglang_lab_server: lab_stand_in true, what it is, its engine).
        stand_in = info.get("lab_stand_in") is True
        return {
            "speculative_algorithm": info.get("speculative_algorithm"),
            "avg_spec_accept_length": state.get("avg_spec_accept_length"),
            "version": info.get("version"),
            "stand_in": str(info.get("stand_in") or "lab_stand_in: true") if stand_in else None,
            "engine": str(info.get("lab_engine")) if stand_in and info.get("lab_engine") else None,
            "ddtree_budget": state.get("ddtree_budget") if isinstance(state.get("ddtree_budget"), dict) else None,
        }
    return {"speculative_algorithm": None, "avg_spec_accept_length": None, "version": None, "stand_in": None,
            "engine": None, "ddtree_budget": None}


def budget_between(before: dict | None, after: dict | None) -> dict | None:
    """DDTREE's budget choices between two of the server's ``ddtree_budget`` reports (sglang-ddtree's counters
    since the server started: ``policy``, ``candidates``, ``budget_histogram`` of tree rounds per budget): the
    rounds in between per budget. None when ``after`` is not such a report; without ``before``, the counts since
    the server's start (``since`` says which)."""
    if not isinstance(after, dict) or not isinstance(after.get("budget_histogram"), dict):
        return None
    first = before.get("budget_histogram") if isinstance(before, dict) else None
    since = "the measured requests" if isinstance(first, dict) else "the server's start"
    first = first if isinstance(first, dict) else {}
    histogram = {str(name): int(n) - int(first.get(name, 0)) for name, n in after["budget_histogram"].items()}
    return {"policy": after.get("policy"), "candidates": [str(c) for c in after.get("candidates") or histogram],
            "steps": sum(histogram.values()), "histogram": histogram, "since": since}


def one(base: str, prompt: str, max_new: int, timeout: float) -> dict:
    body = {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}}
    t0 = time.monotonic()
    reply = post(base + "/generate", body, timeout)
    wall = time.monotonic() - t0
    if isinstance(reply, list):  # a server that answers a single prompt with a batch of one
        reply = reply[0] if reply else {}
    meta = reply.get("meta_info") or {}
    ids = reply.get("output_ids")
    tokens = meta.get("completion_tokens", len(ids) if isinstance(ids, list) else None)
    return {
        "prompt": prompt,
        "text": reply.get("text"),
        "output_ids": ids if isinstance(ids, list) else None,
        "completion_tokens": tokens,
        "wall_s": round(wall, 4),
        "e2e_latency": meta.get("e2e_latency"),
        "spec_accept_length": meta.get("spec_accept_length"),
        "spec_accept_rate": meta.get("spec_accept_rate"),
        "spec_verify_ct": meta.get("spec_verify_ct"),
        "finish_reason": meta.get("finish_reason"),
    }


def main(argv: list[str]) -> int:
    cfg = json.loads(base64.b64decode(argv[1]))
    base = str(cfg["url"]).rstrip("/")
    prompts = [str(p) for p in cfg["prompts"]]
    max_new = int(cfg.get("max_new_tokens", 32))
    warmup = int(cfg.get("warmup", 1))
    timeout = float(cfg.get("timeout", 120))
    repeats = max(1, int(cfg.get("repeats", 1)))
    out: dict = {
        "ok": False,
        "error": "",
        "url": base,
        "started_at": iso_now(),
        "max_new_tokens": max_new,
        "warmup": warmup,
        "repeats": repeats,
        "results": [],
    }
    budget_before = None
    try:
        if not prompts:
            raise ValueError("no prompts")
        for i in range(warmup):
            one(base, prompts[i % len(prompts)], max_new, timeout)
        budget_before = server_info(base, min(timeout, 10.0))["ddtree_budget"]
        tokens, wall = 0, 0.0
        for rep in range(repeats):
            for prompt in prompts:
                r = one(base, prompt, max_new, timeout)
                if not r["completion_tokens"]:
                    raise ValueError(f"no tokens for prompt {prompt!r}: {json.dumps(r)[:300]}")
                tokens += int(r["completion_tokens"])
                wall += r["wall_s"]
                if rep == 0:
                    out["results"].append(r)
        out.update(
            ok=True,
            completion_tokens=tokens,
            wall_s=round(wall, 4),
            tokens_per_s=round(tokens / wall, 2) if wall > 0 else None,
        )
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode(errors="replace")
        out["error"] = f"HTTP {exc.code} from {base}/generate: {detail}"
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as exc:
        out["error"] = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
    out["server"] = server_info(base, min(timeout, 10.0))
    out["budget"] = budget_between(budget_before, out["server"]["ddtree_budget"]) if out["ok"] else None
    out["finished_at"] = iso_now()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
