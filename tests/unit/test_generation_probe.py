"""generation_probe.py (the role's baseline and comparison requests): DDTREE's budget choices during the measured
requests, read from the ``ddtree_budget`` that sglang-ddtree adds to /get_server_info before and after them."""

from __future__ import annotations

import base64
import importlib.util
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("generation_probe",
                                              REPO / "roles/sglang_service/files/generation_probe.py")
probe = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(probe)


def report(policy: str, histogram: dict[str, int]) -> dict:
    return {"policy": policy, "candidates": list(histogram), "steps": sum(histogram.values()),
            "budget_histogram": histogram}


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        # the server reports nothing (no plugin, another algorithm, an older sglang-ddtree): no budget
        (None, None, None),
        (report("fixed", {"16": 4}), None, None),
        (None, {"policy": "auto"}, None),
        # fixed budget: every round since the first read at that budget
        (report("fixed", {"16": 40}), report("fixed", {"16": 52}),
         {"policy": "fixed", "candidates": ["16"], "steps": 12, "histogram": {"16": 12},
          "since": "the measured requests"}),
        # auto: the difference per candidate, a candidate not chosen in between included with 0
        (report("auto", {"chain": 3, "8": 10, "16": 2}), report("auto", {"chain": 3, "8": 25, "16": 7}),
         {"policy": "auto", "candidates": ["chain", "8", "16"], "steps": 20,
          "histogram": {"chain": 0, "8": 15, "16": 5}, "since": "the measured requests"}),
        # no first read (the server did not answer it): the counts since the server's start, said so
        (None, report("auto", {"chain": 1, "32": 9}),
         {"policy": "auto", "candidates": ["chain", "32"], "steps": 10, "histogram": {"chain": 1, "32": 9},
          "since": "the server's start"}),
    ],
)
def test_budget_between(before, after, expected) -> None:
    assert probe.budget_between(before, after) == expected


class _Server(ThreadingHTTPServer):
    """A loopback HTTP server answering /generate and /get_server_info as an SGLang server with sglang-ddtree
    does: every /generate runs ``rounds_per_request`` tree rounds at the budgets of ``pattern`` in turn."""

    daemon_threads = True

    def __init__(self, pattern: list[str] | None, rounds_per_request: int = 3) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.pattern = pattern
        self.rounds_per_request = rounds_per_request
        self.histogram: dict[str, int] = dict.fromkeys(pattern or [], 0)
        self.rounds = 0


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args) -> None:
        pass

    def _json(self, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        state: dict = {"avg_spec_accept_length": 2.0}
        if self.server.pattern is not None:
            state["ddtree_budget"] = report("auto", dict(self.server.histogram))
        self._json({"speculative_algorithm": "DDTREE", "version": "0.5.23", "internal_states": [state]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = body["sampling_params"]["max_new_tokens"]
        if self.server.pattern is not None:
            for _round in range(self.server.rounds_per_request):
                name = self.server.pattern[self.server.rounds % len(self.server.pattern)]
                self.server.histogram[name] += 1
                self.server.rounds += 1
        self._json({"text": "x" * n, "output_ids": list(range(n)),
                    "meta_info": {"completion_tokens": n, "finish_reason": {"type": "length"}}})


@pytest.fixture
def serve() -> Iterator:
    servers = []

    def start(pattern, rounds_per_request=3):
        server = _Server(pattern, rounds_per_request)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def run_probe(server, capsys, warmup: int, prompts: int = 2, repeats: int = 2) -> dict:
    cfg = {"url": f"http://127.0.0.1:{server.server_address[1]}", "prompts": [f"p{i}" for i in range(prompts)],
           "max_new_tokens": 4, "warmup": warmup, "repeats": repeats, "timeout": 10}
    assert probe.main(["generation_probe.py", base64.b64encode(json.dumps(cfg).encode()).decode()]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_probe_reports_the_rounds_of_its_measured_requests_only(serve, capsys) -> None:
    server = serve(["8", "8", "16", "chain"])
    out = run_probe(server, capsys, warmup=1)
    assert out["ok"], out["error"]
    # 1 warm-up request (3 rounds, not counted), then 2 prompts x 2 repeats x 3 rounds = 12 rounds
    assert out["budget"] == {"policy": "auto", "candidates": ["8", "16", "chain"], "steps": 12,
                             "histogram": {"8": 6, "16": 3, "chain": 3}, "since": "the measured requests"}
    assert out["server"]["ddtree_budget"]["steps"] == 15  # the server's own totals, warm-up included


def test_a_server_without_the_report_gives_no_budget(serve, capsys) -> None:
    out = run_probe(serve(None), capsys, warmup=0)
    assert out["ok"], out["error"]
    assert out["budget"] is None and out["server"]["ddtree_budget"] is None
