"""DDTREE against no speculation over SGLang's HTTP API, one row per feature (issue 27, section 1).

Starts two real servers on loopback ports (``python -m sglang.launch_server``, triton attention, CUDA graphs on,
``--enable-custom-logit-processor --enable-metrics``): one with ``--speculative-algorithm DDTREE`` and the same one
without speculation, on the model directory layout of sglang_ddtree_run.py / lossless.py (``MODELS/target``,
``MODELS/drafter``). Then sends the same requests to both, request by request, and writes a table

    feature | endpoint | DDTREE vs none verdict | detail

to ``RESULTS/http-semantics-<gpu>-<date>.md`` and the rows as JSON beside it. Exit status 1 if any row is
"failed", 2 if a server did not start.

Verdicts (``classify``):
  same as no speculation   token ids equal; a first difference at a bf16 near-tie (the baseline's top-1 minus
                           top-2 logprob at that position below --tie-margin, read from the baseline server
                           itself by repeating the request with return_logprob, top_logprobs_num 2: the logits
                           greedy picks from, after penalties, bias and processors; lossless.py's threshold 1.0,
                           which lossless.py applies to an fp32 Hugging Face margin) counts as the same, with
                           the near-tie named in the detail; both servers refusing a request alike (e.g. an empty
                           prompt) is the same too
  differs                  a real difference (first differing position in the detail), or a difference that
                           could not be decided (no logprobs from the baseline)
  clear 400                DDTREE answers 400 with a message naming the option, where no speculation answers 200
  not supported by this server   both servers refuse the option (400 naming it, or 404 for the endpoint): a
                           property of the server, not of DDTREE (the lab stand-in's rows)
  failed                   anything else: 5xx, no answer within --timeout, connection reset, a 400 that does not
                           name the option, malformed JSON

Rows: the request catalogue (``catalogue``: greedy with frequency / presence / repetition penalties, logit_bias,
min_new_tokens, stop token ids, stop strings, a custom logit processor, n = 2, max_new_tokens 1, a regex grammar
(DDTREE verifies grammar batches as DFLASH's round), an empty prompt,
prompts at and past the context limit, return_logprob with top_logprobs_num compared within --logprob-tol) on
``/generate`` and ``/v1/chat/completions``; 64 concurrent mixed requests (streaming, streams closed mid-way,
plain) with ``/health`` and the KV pool's used tokens (``/v1/loads`` ``num_used_tokens`` in SGLang 0.5.17:
max_total_num_tokens - available - evictable, so the radix cache does not count, read after ``/flush_cache``;
``/get_server_info`` has only the capacity, ``internal_states[0].memory_usage.token_capacity``; ``/metrics``'
``sglang:num_used_tokens`` is the fallback) back to their idle value afterwards; the pivot's own generation probe
(roles/sglang_service/files/generation_probe.py, run as the role runs it: one base64 JSON argument) against both
servers and the role's comparison (the ``generation_compare`` filter of plugins/filter/pivot.py).

Every request is built from the baseline's own plain greedy output for the prompt (``catalogue``), so that each
feature changes the output (a stop token the output reaches, a logit bias against a token it emits, ...): a
feature that leaves the baseline's output unchanged says so in the detail ("no effect on the baseline").

    python bench/gpu/http_semantics.py --models DIR --work DIR [--budget 16] [--gpu h200] [--results bench/results]

Both servers run at the same time (started one after the other, ``--mem-fraction-static`` 0.3 and 0.65: SGLang
counts the first's memory as used when the second starts);
``--server-module sglang_lab_server`` runs the LAB STAND-IN instead (the CPU test; it parses the same flags).

A server that stops answering (its process exited, or ``/health`` does not answer 200: refused, reset, timed out,
5xx) is looked for after every row (``Guard``): that row is "failed" with "<server> server crashed" and the last
meaningful lines of its log (``crash_excerpt``: the exception line of the last traceback, then the log's last
line); the server is restarted (same command and port, healthy within --start-timeout) and the run goes on with
the next row, whose detail says "<server> after restart N". After --max-restarts restarts of one server (3), or a
restart that fails, every remaining row is "failed" with "server down: ..." and sends nothing. The Markdown's
summary lines and the JSON's top-level ``restarts`` count the crashes and restarts per server.

The pure parts (HTTP client, catalogue, classification, near-tie accounting, logprob tolerance, KV parsing, the
table, crash handling) are tested on the CPU: tests/unit/bench/test_http_semantics.py, which also runs them over
real HTTP against the LAB STAND-IN server (lab/sglang_lab_server) started twice, and again with its DDTREE side
crashing twice mid-catalogue.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import dataclasses
import datetime
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import types
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "roles" / "sglang_service" / "files" / "generation_probe.py"
ROLE_DEFAULTS = ROOT / "roles" / "sglang_service" / "defaults" / "main.yml"

SAME = "same as no speculation"
DIFFERS = "differs"
CLEAR_400 = "clear 400"
UNSUPPORTED = "not supported by this server"
FAILED = "failed"
VERDICTS = (SAME, DIFFERS, CLEAR_400, UNSUPPORTED, FAILED)

GENERATE = "/generate"
CHAT = "/v1/chat/completions"
NEW_TOKENS = 24
AFTER_FEATURE = "after the concurrent run: /health 200, KV pool back to idle"
PROBE_FEATURE = "pivot generation probe + generation_compare (role defaults' prompts)"


# ------------------------------------------------------------------------------------------------ HTTP client
@dataclasses.dataclass
class Reply:
    """One HTTP exchange: ``status`` None when no answer came (``error`` says why: timeout, reset, refused)."""

    status: int | None
    text: str = ""
    error: str | None = None
    seconds: float = 0.0

    @property
    def data(self) -> Any:
        try:
            return json.loads(self.text)
        except ValueError:
            return None

    def message(self) -> str:
        """The error message of a refusal (SGLang: ``{"error": {"message"}}`` or ``{"message"}`` or text)."""
        data = self.data
        if isinstance(data, dict):
            err = data.get("error")
            if isinstance(err, dict) and err.get("message"):
                return str(err["message"])
            for key in ("message", "detail", "error"):
                if data.get(key):
                    return str(data[key])
        return self.text[:500]


def _split(url: str) -> tuple[str, int, str]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/"


def request(url: str, body: Any = None, timeout: float = 120.0, method: str | None = None) -> Reply:
    """GET (``body`` None) or POST JSON; never raises: a missing answer is a Reply with ``status`` None."""
    host, port, path = _split(url)
    method = method or ("GET" if body is None else "POST")
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        text = resp.read().decode(errors="replace")
        return Reply(resp.status, text, None, time.monotonic() - t0)
    except TimeoutError:
        return Reply(None, "", f"no answer within {timeout:g} s", time.monotonic() - t0)
    except (OSError, http.client.HTTPException) as exc:
        return Reply(None, "", f"{type(exc).__name__}: {exc}", time.monotonic() - t0)
    finally:
        conn.close()


@dataclasses.dataclass
class StreamResult:
    status: int | None
    chunks: list[Any]
    done: bool  # saw ``data: [DONE]``
    aborted: bool  # this client closed the connection after ``abort_after`` chunks
    error: str | None
    text: str = ""  # the body of a non-streamed answer (a refusal)


def parse_sse(lines: Sequence[str]) -> tuple[list[Any], bool]:
    """The JSON events of ``data: ...`` lines and whether ``data: [DONE]`` came (other lines ignored)."""
    chunks, done = [], False
    for line in lines:
        line = line.strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            continue
        try:
            chunks.append(json.loads(payload))
        except ValueError:
            chunks.append({"unparsed": payload[:200]})
    return chunks, done


def stream(url: str, body: Any, timeout: float = 120.0, abort_after: int | None = None) -> StreamResult:
    """POST a streaming request and read its server-sent events; with ``abort_after`` close the connection after
    that many events (the way a client gives up: SGLang must abort the request)."""
    host, port, path = _split(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    lines: list[str] = []
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200 or "text/event-stream" not in (resp.getheader("Content-Type") or ""):
            text = resp.read().decode(errors="replace")
            return StreamResult(resp.status, [], False, False, None, text)
        while True:
            raw = resp.fp.readline()
            if not raw:
                break
            lines.append(raw.decode(errors="replace"))
            chunks, done = parse_sse(lines)
            if done:
                return StreamResult(200, chunks, True, False, None)
            if abort_after is not None and len(chunks) >= abort_after:
                conn.sock.shutdown(socket.SHUT_RDWR)
                return StreamResult(200, chunks, False, True, None)
        chunks, done = parse_sse(lines)
        return StreamResult(200, chunks, done, False, None if done else "the stream ended without [DONE]")
    except TimeoutError:
        chunks, _ = parse_sse(lines)
        return StreamResult(None, chunks, False, False, f"no answer within {timeout:g} s")
    except (OSError, http.client.HTTPException) as exc:
        chunks, _ = parse_sse(lines)
        return StreamResult(None, chunks, False, False, f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------------ responses
def output_ids(endpoint: str, data: Any) -> list[list[int]] | None:
    """Token ids per returned sequence (n > 1 gives several); None when the answer carries none."""
    if endpoint == GENERATE:
        items = data if isinstance(data, list) else [data]
        ids = [i.get("output_ids") if isinstance(i, dict) else None for i in items]
        return ids if ids and all(isinstance(x, list) for x in ids) else None
    if isinstance(data, dict) and isinstance(data.get("choices"), list):
        ids = [c.get("token_ids") for c in data["choices"] if isinstance(c, dict)]
        return ids if ids and all(isinstance(x, list) for x in ids) else None
    return None


def output_texts(endpoint: str, data: Any) -> list[str] | None:
    if endpoint == GENERATE:
        items = data if isinstance(data, list) else [data]
        texts = [i.get("text") if isinstance(i, dict) else None for i in items]
    elif isinstance(data, dict) and isinstance(data.get("choices"), list):
        texts = [((c.get("message") or {}).get("content")) for c in data["choices"] if isinstance(c, dict)]
    else:
        return None
    return texts if texts and all(isinstance(t, str) for t in texts) else None


def first_divergence(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """First position where ``a`` and ``b`` differ (a length difference counts at the shorter length)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top_logprobs_at(endpoint: str, data: Any, pos: int) -> list[tuple[int | str, float]] | None:
    """The (token, logprob) alternatives at output position ``pos`` of the first sequence, best first.

    /generate: ``meta_info.output_top_logprobs[pos]`` = [[logprob, token_id, text], ...]; chat:
    ``choices[0].logprobs.content[pos].top_logprobs`` = [{token, logprob}, ...]."""
    try:
        if endpoint == GENERATE:
            item = data[0] if isinstance(data, list) else data
            entries = item["meta_info"]["output_top_logprobs"][pos]
            pairs = [(int(e[1]), float(e[0])) for e in entries if e and e[0] is not None]
        else:
            entries = data["choices"][0]["logprobs"]["content"][pos]["top_logprobs"]
            pairs = [(str(e["token"]), float(e["logprob"])) for e in entries]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return sorted(pairs, key=lambda p: -p[1])


def tie_margin(alternatives: list[tuple[Any, float]] | None) -> float | None:
    """Top-1 minus top-2 logprob (= the logit margin: log-softmax subtracts one constant); None without two."""
    if not alternatives or len(alternatives) < 2:
        return None
    return alternatives[0][1] - alternatives[1][1]


def token_logprobs(endpoint: str, data: Any) -> list[float] | None:
    try:
        if endpoint == GENERATE:
            item = data[0] if isinstance(data, list) else data
            return [float(e[0]) for e in item["meta_info"]["output_token_logprobs"]]
        return [float(e["logprob"]) for e in data["choices"][0]["logprobs"]["content"]]
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def compare_logprobs(endpoint: str, base: Any, cand: Any, tol: float) -> tuple[bool, str]:
    """Chosen-token logprobs and top-k alternatives equal within ``tol`` (absolute, per value).

    A top-k entry present on one side only is allowed when its logprob is within ``tol`` of the other side's
    last (k-th) value: the edge of the top-k at a bf16 near-tie."""
    a, b = token_logprobs(endpoint, base), token_logprobs(endpoint, cand)
    if a is None or b is None:
        return False, f"no logprobs in the {'baseline' if a is None else 'DDTREE'} answer"
    if len(a) != len(b):
        return False, f"{len(a)} logprobs without speculation, {len(b)} with DDTREE"
    worst = max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)
    if worst > tol:
        return False, f"chosen-token logprob differs by {worst:.4f} > {tol:g}"
    top_worst = 0.0
    for pos in range(len(a)):
        ta, tb = top_logprobs_at(endpoint, base, pos), top_logprobs_at(endpoint, cand, pos)
        if ta is None or tb is None:
            return False, f"no top logprobs at position {pos}"
        da, db = dict(ta), dict(tb)
        for tok in set(da) | set(db):
            if tok in da and tok in db:
                top_worst = max(top_worst, abs(da[tok] - db[tok]))
            else:
                here, other = (da, tb) if tok in da else (db, ta)
                if not other or abs(here[tok] - other[-1][1]) > tol:
                    return False, f"top logprobs at position {pos}: token {tok} on one side only"
    if top_worst > tol:
        return False, f"top logprobs differ by {top_worst:.4f} > {tol:g}"
    return True, f"max |diff| chosen {worst:.4f}, top-k {top_worst:.4f} (tolerance {tol:g})"


# ------------------------------------------------------------------------------------------------ catalogue
@dataclasses.dataclass
class Case:
    feature: str
    endpoint: str
    body: dict
    option: str  # the field a clear 400 must name
    logprobs: bool = False  # compare logprobs within the tolerance instead of token ids
    changes_plain: bool = True  # the feature is expected to change the plain greedy output


def serialized_disallowed_tokens_processor() -> str:
    """SGLang's DisallowedTokensLogitsProcessor serialized as its docs say (``to_str()``: dill, JSON); it ships in
    sglang itself, so the server can load it (needs sglang and dill importable here)."""
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    return DisallowedTokensLogitsProcessor.to_str()


#: A constrained-decoding request's grammar (SGLang's ``regex`` sampling parameter): digits and spaces, which a plain
#: answer of a language model rarely is, so the grammar changes it.
GRAMMAR_REGEX = "[0-9]+( [0-9]+)*"


def _generate(prompt: list[int], **params: Any) -> dict:
    extra = {k: params.pop(k) for k in list(params) if k in ("return_logprob", "top_logprobs_num",
                                                             "custom_logit_processor", "input_ids", "text")}
    body = {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS, **params}}
    body.update(extra)
    if "text" in extra:
        body.pop("input_ids")
    return body


def _chat(content: str, **params: Any) -> dict:
    return {"model": "default", "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": NEW_TOKENS, "return_token_ids": True, **params}


def _shared_cases(endpoint: str, request: Any, ids: list[int], processor: str | None, min_key: str,
                  min_option: str) -> list[Case]:
    """The features both endpoints take, in the catalogue's order: greedy, the three penalties, logit_bias,
    ``min_key`` 12 with a stop token, stop_token_ids, the custom logit processor, n 2. ``request(**params)``
    builds the endpoint's body; ``ids``: the plain greedy answer's token ids."""
    return [
        Case("greedy", endpoint, request(ignore_eos=True), "", changes_plain=False),
        *(Case(f"{name} 1.5", endpoint, request(ignore_eos=True, **{name: 1.5}), name)
          for name in ("frequency_penalty", "presence_penalty", "repetition_penalty")),
        Case(f"logit_bias -100 on token {ids[2]}", endpoint,
             request(ignore_eos=True, logit_bias={str(ids[2]): -100.0}), "logit_bias"),
        Case(f"{min_key} 12, stop token {ids[3]}", endpoint, request(stop_token_ids=[ids[3]], **{min_key: 12}),
             min_option),
        Case(f"stop_token_ids [{ids[5]}]", endpoint, request(stop_token_ids=[ids[5]]), "stop_token_ids"),
        Case(f"custom logit processor (disallow {ids[1]}, {ids[4]})", endpoint,
             request(ignore_eos=True, custom_logit_processor=processor, custom_params={"token_ids": [ids[1], ids[4]]}),
             "custom_logit_processor"),
        Case("n 2", endpoint, request(ignore_eos=True, n=2), "n", changes_plain=False),
    ]


def catalogue(
    prompt: list[int],
    plain: list[int],
    plain_text: str,
    chat_content: str,
    chat_plain: list[int] | None,
    context_length: int,
    processor: str | None,
) -> list[Case]:
    """The request catalogue, built from the baseline's plain greedy answer (``plain``: /generate output ids of
    ``prompt``, NEW_TOKENS tokens, eos ignored; ``chat_plain``: the chat answer's ids) so that each feature acts."""
    if len(plain) < 8:
        raise ValueError(f"the plain greedy answer has {len(plain)} tokens; the catalogue needs >= 8")
    cp = chat_plain if chat_plain and len(chat_plain) >= 8 else plain
    stop_text = plain_text[len(plain_text) // 2 : len(plain_text) // 2 + 3].strip() or None
    cases = [
        *_shared_cases(GENERATE, lambda **p: _generate(prompt, **p), plain, processor, "min_new_tokens",
                       "min_new_tokens"),
        Case("max_new_tokens 1", GENERATE, _generate(prompt, ignore_eos=True, max_new_tokens=1), "max_new_tokens"),
        # a grammar batch: DDTREE verifies it as DFLASH's round (the drafter's chain, the grammar's mask)
        Case(f"regex {GRAMMAR_REGEX!r} (grammar)", GENERATE, _generate(prompt, regex=GRAMMAR_REGEX), "regex"),
        Case("empty prompt", GENERATE, _generate(prompt, ignore_eos=True, text=""), "text", changes_plain=False),
        Case(f"prompt at the context limit ({context_length} tokens in all)", GENERATE,
             _generate((prompt * (context_length // len(prompt) + 1))[: context_length - NEW_TOKENS],
                       ignore_eos=True), "context", changes_plain=False),
        Case("prompt past the context limit (prompt alone = limit)", GENERATE,
             _generate((prompt * (context_length // len(prompt) + 1))[:context_length], ignore_eos=True),
             "context", changes_plain=False),
        Case("return_logprob, top_logprobs_num 5", GENERATE,
             _generate(prompt, ignore_eos=True, return_logprob=True, top_logprobs_num=5), "return_logprob",
             logprobs=True, changes_plain=False),
        *_shared_cases(CHAT, lambda **p: _chat(chat_content, **p), cp, processor, "min_tokens",
                       "min_tokens|min_new_tokens"),
        Case("max_tokens 1", CHAT, _chat(chat_content, ignore_eos=True, max_tokens=1), "max_tokens|max_new_tokens"),
        Case("empty message", CHAT, _chat("", ignore_eos=True), "content", changes_plain=False),
        Case("logprobs, top_logprobs 5", CHAT, _chat(chat_content, ignore_eos=True, logprobs=True, top_logprobs=5),
             "logprobs|top_logprobs|return_logprob", logprobs=True, changes_plain=False),
    ]
    if stop_text:
        cases.insert(7, Case(f"stop string {stop_text!r}", GENERATE, _generate(prompt, stop=[stop_text]), "stop"))
    if processor is None:  # no sglang here to serialize the processor: the row says so instead of a request
        cases = [c for c in cases if c.option != "custom_logit_processor"]
    return cases


def margin_if_same_prefix(endpoint: str, base_data: Any, probe: Reply, pos: int) -> float | None:
    """The tie margin at ``pos`` of the baseline's logprob-carrying repeat of a request (``probe``), provided it
    produced the same ids up to and including ``pos`` as the baseline's answer ``base_data`` (else the margin
    would be of another prefix): None otherwise. The margin is of the logits greedy picks from: SGLang's Sampler
    takes log_softmax of the logits after penalties, logit_bias and custom processors."""
    if probe.status != 200:
        return None
    base_ids, probe_ids = output_ids(endpoint, base_data), output_ids(endpoint, probe.data)
    if not base_ids or not probe_ids or base_ids[0][: pos + 1] != probe_ids[0][: pos + 1]:
        return None
    return tie_margin(top_logprobs_at(endpoint, probe.data, pos))


def tie_probe_body(case: Case) -> dict:
    """The baseline request again, asking for the top-2 logprobs at every output position."""
    body = json.loads(json.dumps(case.body))
    if case.endpoint == GENERATE:
        body.update(return_logprob=True, top_logprobs_num=2)
    else:
        body.update(logprobs=True, top_logprobs=2)
    return body


# ------------------------------------------------------------------------------------------------ comparison
@dataclasses.dataclass
class Row:
    feature: str
    endpoint: str
    verdict: str
    detail: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def names_option(message: str, option: str) -> bool:
    """Whether a refusal names the option (``sampling_params.n`` / ``n`` as a word, case-insensitive). ``option``
    may list the names it goes by, ``|``-separated: the chat API's ``logprobs`` reaches SGLang's check as
    ``return_logprob`` (whose refusal names that)."""
    return any(
        re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message, re.IGNORECASE) is not None
        for name in option.split("|")
        if name
    )


def _answer(reply: Reply) -> str:
    if reply.status is None:
        return f"no answer ({reply.error})"
    return f"HTTP {reply.status}: {reply.message()[:160]}"


def classify(
    case: Case,
    base: Reply,
    cand: Reply,
    margin_at: Callable[[int], float | None] | None = None,
    tie_threshold: float = 1.0,
    logprob_tol: float = 0.1,
    plain: list[int] | None = None,
) -> Row:
    """One row: DDTREE's answer ``cand`` against the baseline's ``base`` to the same request.

    ``margin_at(pos)``: the baseline's top-1 minus top-2 logprob at output position ``pos`` of this request (None
    when it cannot be had); ``plain``: the baseline's plain greedy ids (to say whether the feature acted)."""
    row = Row(case.feature, case.endpoint, FAILED, "")
    if cand.status is None or cand.status >= 500:
        row.detail = f"DDTREE: {_answer(cand)}; no speculation: {_answer(base)}"
        return row
    if base.status is None or base.status >= 500:
        row.detail = f"no speculation failed: {_answer(base)} (DDTREE: {_answer(cand)})"
        return row
    if base.status == 404 and cand.status == 404:
        row.verdict, row.detail = UNSUPPORTED, f"both 404 for {case.endpoint}: {base.message()[:120]}"
        return row
    if base.status != 200 and cand.status != 200:
        if base.status == 400 and cand.status == 400 and names_option(base.message(), case.option) and \
                names_option(cand.message(), case.option) and case.option not in ("text", "content", "context"):
            row.verdict = UNSUPPORTED
            row.detail = f"both 400 naming {case.option.replace('|', ' or ')}: {cand.message()[:160]}"
        elif base.status == cand.status == 400:
            row.verdict, row.detail = SAME, f"both refuse it: DDTREE {_answer(cand)}; none {_answer(base)}"
        else:
            row.detail = f"DDTREE: {_answer(cand)}; no speculation: {_answer(base)}"
        return row
    if base.status == 200 and cand.status != 200:
        if cand.status == 400 and names_option(cand.message(), case.option):
            row.verdict, row.detail = CLEAR_400, cand.message()[:200]
        else:
            named = case.option.replace("|", " or ") or "the option"
            row.detail = f"DDTREE {_answer(cand)} (does not name {named}); none answers 200"
        return row
    if cand.status == 200 and base.status != 200:
        row.verdict, row.detail = DIFFERS, f"DDTREE answers 200, no speculation {_answer(base)}"
        return row
    b_data, c_data = base.data, cand.data
    if b_data is None or c_data is None:
        row.detail = "an answer is not JSON"
        return row
    b_ids, c_ids = output_ids(case.endpoint, b_data), output_ids(case.endpoint, c_data)
    unit = "token"
    if b_ids is None or c_ids is None:
        b_ids, c_ids, unit = output_texts(case.endpoint, b_data), output_texts(case.endpoint, c_data), "char"
        if b_ids is None or c_ids is None:
            row.detail = "no output ids or text in an answer"
            return row
    if len(b_ids) != len(c_ids):
        row.verdict, row.detail = DIFFERS, f"{len(b_ids)} sequences without speculation, {len(c_ids)} with DDTREE"
        return row
    notes = []
    effect = ""
    if plain is not None and case.changes_plain and unit == "token":
        effect = "; no effect on the baseline (same ids as plain greedy)" if b_ids[0] == plain else ""
    for k, (b, c) in enumerate(zip(b_ids, c_ids, strict=True)):
        pos = first_divergence(b, c)
        if pos is None:
            continue
        where = f"sequence {k} " if len(b_ids) > 1 else ""
        if unit == "token" and k == 0 and pos < min(len(b), len(c)) and margin_at is not None:
            margin = margin_at(pos)
            if margin is not None and margin < tie_threshold:
                notes.append(f"{where}bf16 near-tie at token {pos} (baseline margin {margin:.3f} < {tie_threshold:g})")
                continue
            why = "no logprobs to decide" if margin is None else f"baseline margin {margin:.3f}"
        else:
            why = "not decidable here"
        row.verdict = DIFFERS
        row.detail = (f"{where}first difference at {unit} {pos} ({why}): none {b[pos:pos + 4]} vs DDTREE "
                      f"{c[pos:pos + 4]}")
        return row
    if case.logprobs:
        ok, detail = compare_logprobs(case.endpoint, b_data, c_data, logprob_tol)
        row.verdict, row.detail = (SAME if ok else DIFFERS), detail
        return row
    lengths = sorted({len(b) for b in b_ids})
    row.verdict = SAME
    row.detail = (f"{len(b_ids)} x {'/'.join(map(str, lengths))} {unit}s equal" + (
        "; " + "; ".join(notes) if notes else "") + effect)
    return row


# ------------------------------------------------------------------------------------------------ concurrency
def concurrent_plan(prompts: list[list[int]], count: int = 64) -> list[dict]:
    """``count`` mixed requests: every 4th streams to the end, every 4th (offset 1) streams and is closed after 2
    events, the rest are plain; max_new_tokens cycles 8..64 (eos ignored, so each must come back complete)."""
    plan = []
    for i in range(count):
        kind = ("stream", "abort", "plain", "plain")[i % 4]
        new = 8 + (i * 7) % 57
        body = {"input_ids": prompts[i % len(prompts)],
                "sampling_params": {"temperature": 0, "max_new_tokens": new, "ignore_eos": True}}
        if kind != "plain":
            body["stream"] = True
        plan.append({"index": i, "kind": kind, "max_new_tokens": new, "body": body})
    return plan


def run_concurrent(base_url: str, plan: list[dict], timeout: float) -> list[dict]:
    def one(item: dict) -> dict:
        url = base_url + GENERATE
        if item["kind"] == "plain":
            r = request(url, item["body"], timeout)
            ids = output_ids(GENERATE, r.data) if r.status == 200 else None
            return {"status": r.status, "error": r.error, "message": r.message() if r.status != 200 else "",
                    "output_ids": ids[0] if ids else None}
        s = stream(url, item["body"], timeout, abort_after=2 if item["kind"] == "abort" else None)
        last = s.chunks[-1] if s.chunks else {}
        return {"status": s.status, "error": s.error, "message": s.text[:300], "done": s.done, "aborted": s.aborted,
                "events": len(s.chunks), "output_ids": last.get("output_ids") if isinstance(last, dict) else None,
                "completion_tokens": ((last.get("meta_info") or {}).get("completion_tokens"))
                if isinstance(last, dict) else None}

    with concurrent.futures.ThreadPoolExecutor(len(plan)) as pool:
        results = list(pool.map(one, plan))
    return [dict(r, index=p["index"], kind=p["kind"], max_new_tokens=p["max_new_tokens"]) for p, r in
            zip(plan, results, strict=True)]


def judge_concurrency(results: list[dict]) -> tuple[str, str, dict[str, int]]:
    """(state, detail, counts) of one server's concurrent run: state "ok", "stream refused" (every streaming request
    answered 400 naming ``stream``: the server does not stream) or "failed"."""
    counts = {"complete": 0, "aborted": 0, "refused_stream": 0, "bad": 0}
    bad = []
    for r in results:
        if r["kind"] != "plain" and r["status"] == 400 and names_option(r.get("message") or "", "stream"):
            counts["refused_stream"] += 1
        elif r["status"] != 200:
            counts["bad"] += 1
            bad.append(f"#{r['index']} {r['kind']}: {r['status']} {r.get('error') or r.get('message', '')[:80]}")
        elif r["kind"] == "abort":
            ok = r.get("aborted") and r.get("events", 0) >= 2 and not r.get("error")
            counts["aborted" if ok else "bad"] += 1
            if not ok:
                bad.append(f"#{r['index']} abort: events {r.get('events')}, done {r.get('done')} {r.get('error')}")
        else:
            # a stream's last event: completion_tokens counts the whole answer (its output_ids are only the last
            # piece when the server streams incrementally, --incremental-streaming-output)
            ids = r.get("output_ids")
            got = len(ids) if isinstance(ids, list) else None
            if r["kind"] == "stream":
                got = r.get("completion_tokens") if r.get("completion_tokens") is not None else got
            ok = got == r["max_new_tokens"] and (r["kind"] == "plain" or bool(r.get("done")))
            counts["complete" if ok else "bad"] += 1
            if not ok:
                bad.append(f"#{r['index']} {r['kind']}: {got} of {r['max_new_tokens']} tokens, done {r.get('done')}")
    state = "failed" if bad else ("stream refused" if counts["refused_stream"] else "ok")
    detail = ", ".join(f"{v} {k}" for k, v in counts.items() if v) + (f"; {'; '.join(bad[:4])}" if bad else "")
    return state, detail, counts


def concurrency_row(base: list[dict], cand: list[dict]) -> Row:
    b_state, b_detail, _ = judge_concurrency(base)
    c_state, c_detail, _ = judge_concurrency(cand)
    row = Row(f"{len(cand)} concurrent mixed requests (stream, stream closed after 2 events, plain)", GENERATE,
              FAILED, f"DDTREE: {c_detail}; none: {b_detail}")
    if c_state == "failed" or b_state == "failed":
        return row
    pairs = [(b, c) for b, c in zip(base, cand, strict=True)
             if b["kind"] == "plain" and b.get("output_ids") is not None and c.get("output_ids") is not None]
    diffs = [b["index"] for b, c in pairs if b["output_ids"] != c["output_ids"]]
    row.detail += f"; {len(pairs) - len(diffs)}/{len(pairs)} plain outputs equal"
    if diffs:
        row.verdict = DIFFERS
        row.detail += f" (differ: {diffs[:8]})"
    elif c_state == "stream refused" and b_state == "stream refused":
        row.verdict = UNSUPPORTED
        row.detail += "; both refuse stream with a 400 naming it"
    elif c_state == b_state:
        row.verdict = SAME
    else:
        row.verdict = DIFFERS
    return row


def used_tokens_from_loads(data: Any) -> int | None:
    """KV tokens in use (SGLang 0.5.17 ``/v1/loads``: ``loads[].num_used_tokens``, summed over DP ranks)."""
    if not isinstance(data, dict) or not isinstance(data.get("loads"), list) or not data["loads"]:
        return None
    try:
        return sum(int(load["num_used_tokens"]) for load in data["loads"])
    except (KeyError, TypeError, ValueError):
        return None


def used_tokens_from_metrics(text: str) -> int | None:
    """The same from ``/metrics`` (``--enable-metrics``): the ``sglang:num_used_tokens`` gauge(s), summed."""
    values = [float(m.group(1)) for m in re.finditer(r"^sglang:num_used_tokens(?:\{[^}]*\})?\s+(\S+)$", text, re.M)]
    return int(sum(values)) if values else None


def used_tokens(url: str, timeout: float = 10.0) -> tuple[int | None, str]:
    r = request(url + "/v1/loads?include=core", timeout=timeout)
    if r.status == 200 and used_tokens_from_loads(r.data) is not None:
        return used_tokens_from_loads(r.data), "/v1/loads num_used_tokens"
    m = request(url + "/metrics", timeout=timeout)
    if m.status == 200 and used_tokens_from_metrics(m.text) is not None:
        return used_tokens_from_metrics(m.text), "/metrics sglang:num_used_tokens"
    return None, f"/v1/loads: {_answer(r)}; /metrics: {_answer(m)}"


def wait_idle(url: str, idle: int, deadline_s: float) -> tuple[int | None, float]:
    """Poll the used KV tokens until they are back to ``idle`` (or the deadline): (last value, seconds)."""
    t0 = time.monotonic()
    value = None
    while time.monotonic() - t0 < deadline_s:
        value, _ = used_tokens(url)
        if value is not None and value <= idle:
            break
        time.sleep(0.5)
    return value, time.monotonic() - t0


def after_row(name: str, health: dict[str, int | None], kv: dict[str, tuple[int | None, int | None, str]]) -> Row:
    """/health and the KV pool after the concurrent run; ``kv[server] = (idle before, after, source)``."""
    row = Row(AFTER_FEATURE, name, FAILED, "")
    parts, unsupported = [], []
    ok = True
    for server in ("DDTREE", "none"):
        idle, after, source = kv[server]
        parts.append(f"{server}: /health {health[server]}, used KV tokens idle {idle} -> after {after} ({source})")
        ok = ok and health[server] == 200
        if idle is None or after is None:
            unsupported.append(server)
        elif after > idle:
            ok = False
    row.detail = "; ".join(parts)
    if not ok:
        return row
    if unsupported:
        row.verdict = UNSUPPORTED if set(unsupported) == {"DDTREE", "none"} else FAILED
        row.detail += "; KV use not readable" + (" on both" if row.verdict == UNSUPPORTED else "")
        return row
    row.verdict = SAME
    return row


# ------------------------------------------------------------------------------------------------ pivot's probe
def role_prompts(path: Path = ROLE_DEFAULTS) -> tuple[list[str], int]:
    """sglang_service_baseline_prompts and _max_new_tokens from the role's defaults (the role's own settings);
    without PyYAML (the GPU host's bundle does not list it) the two keys are read by ``role_prompts_plain``."""
    try:
        import yaml
    except ImportError:
        return role_prompts_plain(path.read_text())
    data = yaml.safe_load(path.read_text())
    return list(data["sglang_service_baseline_prompts"]), int(data["sglang_service_baseline_max_new_tokens"])


def role_prompts_plain(text: str) -> tuple[list[str], int]:
    """The two keys from the defaults file as it is written: a block list of double-quoted strings, an int."""
    lines = text.splitlines()
    start = lines.index("sglang_service_baseline_prompts:")
    prompts = []
    for line in lines[start + 1 :]:
        m = re.match(r'^\s+-\s+(".*")\s*$', line)
        if not m:
            break
        prompts.append(json.loads(m.group(1)))
    max_new = re.search(r"^sglang_service_baseline_max_new_tokens:\s*(\d+)", text, re.M)
    if not prompts or not max_new:
        raise ValueError("sglang_service_baseline_prompts / _max_new_tokens not found as expected")
    return prompts, int(max_new.group(1))


def run_probe(url: str, prompts: list[str], max_new: int, timeout: float = 120.0) -> dict:
    """generation_probe.py as the role runs it: one argument, base64 of its JSON config; prints one JSON object."""
    cfg = {"url": url, "prompts": prompts, "max_new_tokens": max_new, "warmup": 1, "repeats": 1, "timeout": timeout}
    arg = base64.b64encode(json.dumps(cfg).encode()).decode()
    proc = subprocess.run([sys.executable, str(PROBE), arg], capture_output=True, text=True,
                          timeout=timeout * (len(prompts) + 3) + 30, check=False)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ok": False, "error": f"probe exit {proc.returncode}: {proc.stderr[-300:]}", "results": []}


def load_generation_compare() -> Callable[..., dict]:
    """The role's ``generation_compare`` filter from this checkout's plugins/filter/pivot.py. Where ansible is not
    installed (the GPU host), ``ansible.errors`` is stubbed with the one class the filter module imports; the
    collection's own module_utils are imported from this checkout either way."""
    tmp = Path(tempfile.mkdtemp(prefix="http-semantics-coll-"))
    (tmp / "ansible_collections" / "specdec").mkdir(parents=True)
    (tmp / "ansible_collections" / "specdec" / "pivot").symlink_to(ROOT)
    for name in [n for n in sys.modules if n.startswith("ansible_collections.specdec.pivot")]:
        del sys.modules[name]  # an installed copy of the collection must not shadow this checkout's
    sys.path.insert(0, str(tmp))
    try:
        import ansible.errors  # noqa: F401
    except ImportError:
        stub = types.ModuleType("ansible.errors")
        stub.AnsibleFilterError = type("AnsibleFilterError", (Exception,), {})
        if not isinstance(sys.modules.get("ansible"), types.ModuleType):
            sys.modules["ansible"] = types.ModuleType("ansible")
        sys.modules["ansible.errors"] = stub
    import importlib

    module = importlib.import_module("ansible_collections.specdec.pivot.plugins.filter.pivot")
    if Path(module.__file__).resolve() != (ROOT / "plugins" / "filter" / "pivot.py").resolve():
        raise RuntimeError(f"generation_compare came from {module.__file__}, not this checkout")
    return module.generation_compare


def probe_row(before: dict, after: dict, comparison: dict | None, margin_at: Callable[[int, int], float | None],
              tie_threshold: float = 1.0) -> Row:
    """The pivot's generation probe against both servers and the role's comparison (generation_compare, gate
    limits max_disagreements 0): same when every prompt agrees or diverges first at a bf16 near-tie."""
    row = Row(PROBE_FEATURE, GENERATE, FAILED, "")
    if not before.get("ok") or not after.get("ok") or comparison is None:
        row.detail = f"probe none: {before.get('error') or 'ok'}; probe DDTREE: {after.get('error') or 'ok'}"
        return row
    ties, real = [], []
    for p in comparison["per_prompt"]:
        if p["agree"]:
            continue
        margin = margin_at(p["index"], p["first_divergence"]) if p["unit"] == "token" else None
        (ties if margin is not None and margin < tie_threshold else real).append(
            f"prompt {p['index']} at {p['unit']} {p['first_divergence']} (margin "
            f"{'n/a' if margin is None else f'{margin:.3f}'})")
    gate = comparison.get("gate") or {}
    row.detail = (f"{comparison['agreeing']}/{comparison['prompts']} prompts agree; gate (max_disagreements 0) "
                  f"{'passed' if gate.get('passed') else 'failed: ' + '; '.join(gate.get('failures') or [])}; "
                  f"speedup {comparison.get('speedup')}; accept length {comparison['accept_length']['value']}")
    if ties:
        row.detail += "; near-ties: " + ", ".join(ties)
    if real:
        row.verdict, row.detail = DIFFERS, row.detail + "; differ: " + ", ".join(real)
    else:
        row.verdict = SAME
    return row


# ------------------------------------------------------------------------------------------------ the table
def render(rows: list[Row], meta: dict) -> str:
    lines = [f"# HTTP semantics: DDTREE vs no speculation ({meta.get('gpu')}, {meta.get('date')})", ""]
    for key in ("sglang", "models", "budget", "servers", "tie_margin", "logprob_tol"):
        if key in meta:
            lines.append(f"- {key}: {meta[key]}")
    for name, n in (meta.get("restarts") or {}).items():
        lines.append(f"- server {name}: {n['crashes']} crash(es), {n['restarts']} restart(s)"
                     + (f"; down from then on: {n['down']}" if n.get("down") else ""))
    counts = {v: sum(1 for r in rows if r.verdict == v) for v in VERDICTS}
    lines += ["- rows: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n), "",
              "| feature | endpoint | DDTREE vs none verdict | detail |", "|---|---|---|---|"]
    for r in rows:
        cells = [r.feature, r.endpoint, r.verdict, r.detail]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def exit_status(rows: list[Row]) -> int:
    return 1 if any(r.verdict == FAILED for r in rows) else 0


# ------------------------------------------------------------------------------------------------ driving
def compare_all(base_url: str, cand_url: str, prompt: list[int], chat_content: str, context_length: int,
                processor: str | None, timeout: float = 120.0, tie_threshold: float = 1.0,
                logprob_tol: float = 0.1, concurrency: int = 64, probe: bool = True,
                log: Callable[[str], None] = print, vocab: int = 1005, guard: Guard | None = None) -> list[Row]:
    """Every row, against two running servers (the baseline ``base_url`` without speculation, ``cand_url``);
    ``guard`` looks for a crashed server after each row and restarts it (``Guard``)."""
    guard = guard or Guard({})
    rows: list[Row] = []

    def add(row: Row, measured: bool = True) -> None:
        rows.append(guard.check(row) if measured else row)
        log(f"{row.endpoint} {row.feature}: {row.verdict} ({row.detail})")

    plain_body = _generate(prompt, ignore_eos=True)
    plain_reply = request(base_url + GENERATE, plain_body, timeout)
    if plain_reply.status != 200 or not output_ids(GENERATE, plain_reply.data):
        return [Row("plain greedy on the baseline (needed for the catalogue)", GENERATE, FAILED,
                    _answer(plain_reply))]
    plain = output_ids(GENERATE, plain_reply.data)[0]
    plain_text = (output_texts(GENERATE, plain_reply.data) or [""])[0]
    models = request(base_url + "/v1/models", timeout=30).data
    try:  # the served model's name, as an OpenAI client would send it
        model = str(models["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        model = "default"
    chat_reply = request(base_url + CHAT, dict(_chat(chat_content, ignore_eos=True), model=model), timeout)
    chat_ids = output_ids(CHAT, chat_reply.data) if chat_reply.status == 200 else None
    cases = catalogue(prompt, plain, plain_text, chat_content, chat_ids[0] if chat_ids else None,
                      context_length, processor)
    for case in cases:
        if case.endpoint == CHAT:
            case.body["model"] = model
    if processor is None:
        rows.append(Row("custom logit processor", GENERATE, FAILED,  # not measured: the run must say so
                        "not sent: sglang is not importable by this client, so the processor cannot be serialized"))
    for case in cases:
        if down := guard.down():
            add(Row(case.feature, case.endpoint, FAILED, down), measured=False)
            continue
        base = request(base_url + case.endpoint, case.body, timeout)
        cand = request(cand_url + case.endpoint, case.body, timeout)

        def margin_at(pos: int, case: Case = case, base: Reply = base) -> float | None:
            probe_reply = request(base_url + case.endpoint, tie_probe_body(case), timeout)
            return margin_if_same_prefix(case.endpoint, base.data, probe_reply, pos)

        try:
            row = classify(case, base, cand, margin_at, tie_threshold, logprob_tol,
                           plain=plain if case.endpoint == GENERATE else (chat_ids[0] if chat_ids else None))
        except Exception as exc:  # an answer of a shape classify does not know: the row says so
            row = Row(case.feature, case.endpoint, FAILED, f"classify raised {type(exc).__name__}: {exc}")
        add(row)

    # concurrency, then /health and the KV pool
    idle, restarts = {}, dict(guard.restarts)

    def concurrent() -> Row:
        for name, url in (("DDTREE", cand_url), ("none", base_url)):
            request(url + "/flush_cache", {}, 30)
            idle[name] = used_tokens(url)
        prompts = [[(t * (k + 3) + k) % (vocab - 5) + 5 for t in prompt] for k in range(8)]  # ids 0-4: specials
        plan = concurrent_plan(prompts, concurrency)
        results = {name: run_concurrent(url, plan, timeout) for name, url in (("DDTREE", cand_url), ("none", base_url))}
        return concurrency_row(results["none"], results["DDTREE"])

    def after_run() -> Row:
        if guard.restarts != restarts:  # the idle values are the crashed server's
            return Row(AFTER_FEATURE, GENERATE, FAILED, "not measured: a server crashed in the concurrent run")
        health, kv = {}, {}
        for name, url in (("DDTREE", cand_url), ("none", base_url)):
            health[name] = request(url + "/health", timeout=30).status
            before, source = idle[name]
            after, _waited = wait_idle(url, before, 60) if before is not None else (None, 0.0)
            kv[name] = (before, after, source if before is not None else source[:120])
        return after_row(GENERATE, health, kv)

    def measure(feature: str, make: Callable[[], Row], catch: bool = False) -> None:
        """The row ``make`` returns, unless a server is down for good; with ``catch`` an exception is the row."""
        if down := guard.down():
            add(Row(feature, GENERATE, FAILED, down), measured=False)
            return
        try:
            row = make()
        except Exception as exc:  # e.g. no yaml to read the role's defaults with: the row says so
            if not catch:
                raise
            row = Row(feature, GENERATE, FAILED, f"{type(exc).__name__}: {exc}")
        add(row)

    measure(f"{concurrency} concurrent mixed requests (stream, stream closed after 2 events, plain)", concurrent)
    measure(AFTER_FEATURE, after_run)
    if probe:
        measure(PROBE_FEATURE, lambda: probe_rows(base_url, cand_url, timeout, tie_threshold), catch=True)
    return rows


def probe_rows(base_url: str, cand_url: str, timeout: float, tie_threshold: float) -> Row:
    """The pivot's generation probe against both servers, compared by the role's filter."""
    prompts_text, max_new = role_prompts()
    before_run, after_run = run_probe(base_url, prompts_text, max_new), run_probe(cand_url, prompts_text, max_new)
    try:
        comparison = load_generation_compare()(before_run, after_run, 0, 0, 0)
    except Exception as exc:  # the row says so
        comparison = None
        before_run = dict(before_run, ok=False, error=f"generation_compare raised {type(exc).__name__}: {exc}")

    def probe_margin(index: int, pos: int) -> float | None:
        body = {"text": prompts_text[index], "return_logprob": True, "top_logprobs_num": 2,
                "sampling_params": {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}}
        r = request(base_url + GENERATE, body, timeout)
        return margin_if_same_prefix(GENERATE, before_run["results"][index], r, pos)

    return probe_row(before_run, after_run, comparison, probe_margin, tie_threshold)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sglang_argv(models: Path, port: int, algo: str, budget: int, context_length: int,
                module: str = "sglang.launch_server", mem_fraction: float = 0.3) -> list[str]:
    """``python -m sglang.launch_server`` for one of the two servers (CUDA graphs on: nothing disables them)."""
    argv = [sys.executable, "-m", module, "--model-path", str(models / "target"),
            "--host", "127.0.0.1", "--port", str(port), "--attention-backend", "triton",
            "--sampling-backend", "pytorch", "--enable-custom-logit-processor", "--enable-metrics",
            "--mem-fraction-static", str(mem_fraction), "--context-length", str(context_length),
            "--max-running-requests", "64", "--cuda-graph-max-bs-decode", "64", "--log-level", "warning"]
    if algo == "DDTREE":
        argv += ["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", str(models / "drafter"),
                 "--speculative-num-draft-tokens", str(budget + 1)]
    return argv


class Server:
    """A server process this script started (its output appended to ``log``); ``stop()`` ends it and its process
    group, ``restart()`` starts the same command again (same port)."""

    def __init__(self, argv: list[str], url: str, log: Path, env: dict[str, str] | None = None) -> None:
        self.url, self.log, self.argv, self.env = url, log, argv, env
        self.start()

    def start(self) -> None:
        self.log_offset = self.log.stat().st_size if self.log.exists() else 0  # this run's part of the log
        self.fh = open(self.log, "ab")
        self.stopped = False
        self.proc = subprocess.Popen(self.argv, stdout=self.fh, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)

    def wait_ready(self, deadline_s: float) -> str | None:
        """None once /health answers 200 and one generation succeeded; else why not."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < deadline_s:
            if self.proc.poll() is not None:
                return f"exited with {self.proc.returncode} (log {self.log})"
            if request(self.url + "/health", timeout=5).status == 200:
                return None
            time.sleep(1.0)
        return f"not healthy within {deadline_s:g} s (log {self.log})"

    def trouble(self, timeout: float = 30.0) -> str | None:
        """None while the process runs and ``/health`` answers 200 (as at start-up); else what was seen."""
        if self.proc.poll() is not None:
            return f"exited with {self.proc.returncode}"
        health = request(self.url + "/health", timeout=timeout)
        return None if health.status == 200 else f"/health: {_answer(health)}"

    def log_since_start(self) -> str:
        with open(self.log, "rb") as fh:
            fh.seek(self.log_offset)
            return fh.read().decode(errors="replace")

    def restart(self, deadline_s: float) -> str | None:
        """Stop what is left of it, start the same command again; None once healthy, else why not (stopped)."""
        self.stop()
        self.start()
        problem = self.wait_ready(deadline_s)
        if problem:
            self.stop()
        return problem

    def stop(self) -> None:
        import signal

        if self.stopped:  # once per start: the group's id must not be signalled after it may have been reused
            return
        self.stopped = True
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:  # what is left of the group: all of it after a timeout, a crashed server's children (GPU memory)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.fh.close()


TRACEBACK = "Traceback (most recent call last):"
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def crash_excerpt(log_text: str, width: int = 300) -> str:
    """The last meaningful lines of a crashed server's log, `` / ``-joined: the exception line of the last
    traceback (``ValueError: pool memory leak detected! ...``: the first unindented line after it that names an
    exception, else the first unindented one) and the log's last line when that is another (SGLang: "Received
    sigquit from a child process..."); without a traceback the last two lines. '' for an empty log."""
    lines = [line.rstrip() for line in log_text.splitlines()]
    filled = [line for line in lines if line.strip()]
    if not filled:
        return ""
    start = max((i for i, line in enumerate(lines) if TRACEBACK in line), default=-1)
    picked = filled[-2:]
    after = lines[start + 1 :] if start >= 0 else []
    unindented = [line for line in after if line.strip() and not line[0].isspace()]
    if unindented:
        exc = next((line for line in unindented if EXCEPTION_LINE.match(line)), unindented[0])
        picked = [exc] if exc == filled[-1] else [exc, filled[-1]]
    return " / ".join(line.strip()[:width] for line in picked)


class Guard:
    """Crash handling between rows (the module docstring says what it does): ``servers`` by name (``Server`` or
    anything with its ``trouble``, ``stop``, ``log_since_start``, ``restart`` and ``log``); none: it does nothing."""

    def __init__(self, servers: dict[str, Any], max_restarts: int = 3, start_timeout: float = 420.0,
                 health_timeout: float = 30.0, log: Callable[[str], None] = print) -> None:
        self.servers, self.max_restarts, self.log = servers, max_restarts, log
        self.start_timeout, self.health_timeout = start_timeout, health_timeout
        self.crashes = dict.fromkeys(servers, 0)
        self.restarts = dict.fromkeys(servers, 0)
        self.gone: dict[str, str] = {}  # server -> why it is down for good

    def down(self) -> str | None:
        """Why the next row cannot be measured (a server down for good), or None."""
        return "server down: " + "; ".join(f"{n} {why}" for n, why in self.gone.items()) if self.gone else None

    def check(self, row: Row) -> Row:
        """After a row: say which servers it was measured after a restart of; a server that stopped answering
        makes the row failed with its log's last lines, and is restarted (or given up)."""
        row.detail += "".join(f"; {n} after restart {k}" for n, k in self.restarts.items() if k)
        for name, server in self.servers.items():
            if name in self.gone or not (seen := server.trouble(self.health_timeout)):
                continue
            self.crashes[name] += 1
            server.stop()
            excerpt = crash_excerpt(server.log_since_start()) or "empty"
            what = f"{name} server crashed ({seen}; {server.log.name}: {excerpt})"
            self.log(what)
            if self.restarts[name] >= self.max_restarts:
                self.gone[name] = f"crashed {self.crashes[name]} times, no restart left (at most {self.max_restarts})"
                what += f"; not restarted (at most {self.max_restarts} restarts)"
            elif problem := server.restart(self.start_timeout):
                self.gone[name] = f"restart failed: {problem}"
                what += f"; restart failed: {problem}"
            else:
                self.restarts[name] += 1
                what += f"; restarted (restart {self.restarts[name]} of at most {self.max_restarts})"
            row.verdict, row.detail = FAILED, what + "; " + row.detail
        return row

    def summary(self) -> dict[str, dict]:
        return {n: {"crashes": self.crashes[n], "restarts": self.restarts[n], "down": self.gone.get(n)}
                for n in self.servers}


def gpu_label() -> str:
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, check=False, timeout=30).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown"
    m = re.search(r"\b([A-Z]+\d+[A-Za-z]*)\b", name)
    return (m.group(1) if m else name.split()[-1]).lower()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True, type=Path, help="MODELS/target and MODELS/drafter")
    ap.add_argument("--work", required=True, type=Path, help="server logs, and a copy of the table")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--context-length", type=int, default=1024)
    ap.add_argument("--gpu", default=None, help="label in the file name (default: from nvidia-smi)")
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    ap.add_argument("--start-timeout", type=float, default=420.0)
    ap.add_argument("--tie-margin", type=float, default=1.0)
    ap.add_argument("--logprob-tol", type=float, default=0.1)
    ap.add_argument("--max-restarts", type=int, default=3, help="restarts of a crashed server, each")
    ap.add_argument("--server-module", default="sglang.launch_server",
                    help="the module both servers run (the CPU test: sglang_lab_server, the LAB STAND-IN, which "
                    "parses the same flags)")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    import sglang

    servers: dict[str, Server] = {}
    try:
        # One after the other: SGLang counts the memory the first server holds as used, so the second's static
        # fraction (of the whole GPU) covers the first's 0.3 as well as its own.
        for name, algo, fraction in (("none", "none", 0.3), ("DDTREE", "DDTREE", 0.65)):
            port = free_port()
            server = servers[name] = Server(
                sglang_argv(args.models, port, algo, args.budget, args.context_length, args.server_module, fraction),
                f"http://127.0.0.1:{port}", args.work / f"server-{name}.log")
            problem = server.wait_ready(args.start_timeout)
            if problem:
                print(f"server {name} did not start: {problem}", flush=True)
                print(server.log.read_text(errors="replace")[-3000:], flush=True)
                return 2
        try:
            processor = serialized_disallowed_tokens_processor()
        except ImportError:
            processor = None
        vocab = int(json.loads((args.models / "target" / "config.json").read_text())["vocab_size"])
        prompt = [(37 * i + 11) % (min(vocab, 1005) - 5) + 5 for i in range(24)]  # ids 0-4: the tiny specials
        guard = Guard(servers, args.max_restarts, args.start_timeout)
        rows = compare_all(servers["none"].url, servers["DDTREE"].url, prompt,
                           "Tell me a short story about a tree.", args.context_length, processor, args.timeout,
                           args.tie_margin, args.logprob_tol, vocab=vocab, guard=guard)
    finally:
        for server in servers.values():
            server.stop()
    date = datetime.date.today().isoformat()
    gpu = args.gpu or gpu_label()
    meta = {"gpu": gpu, "date": date, "sglang": sglang.__version__, "models": str(args.models),
            "budget": args.budget, "tie_margin": args.tie_margin, "logprob_tol": args.logprob_tol,
            "servers": {name: " ".join(s.argv[1:]) for name, s in servers.items()}, "restarts": guard.summary()}
    # Also beside the server logs: on the lent GPU host only the work directory comes back (run_all.sh's archive).
    for folder in (args.results, args.work):
        folder.mkdir(parents=True, exist_ok=True)
        stem = folder / f"http-semantics-{gpu}-{date}"
        stem.with_suffix(".md").write_text(render(rows, meta))
        stem.with_suffix(".json").write_text(json.dumps({**meta, "rows": [r.as_dict() for r in rows]}, indent=1))
        print(f"written {stem}.md and .json")
    print(render(rows, meta))
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
