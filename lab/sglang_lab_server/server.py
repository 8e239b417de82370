"""LAB STAND-IN for ``sglang.launch_server``: SGLang's own flag parsing and algorithm registry, a tiny
model served on CPU over plain HTTP (stdlib ``http.server``). See the package docstring for the scope.

Endpoints (same paths and field names as SGLang's HTTP server):
  GET  /health              200 once the model is loaded, 503 while loading
  GET  /health_generate     200 after generating one token
  GET  /v1/models           the served model
  GET  /get_server_info     server args + version + ``lab_stand_in: true`` + acceptance stats
       (/server_info is the same)
  GET  /get_model_info      model path, is_generation (/model_info is the same)
  POST /generate            {"text" | "input_ids", "sampling_params": {"max_new_tokens", "temperature",
                            "stop_token_ids", "ignore_eos", "sampling_seed"}} -> {"text", "output_ids", "meta_info"};
                            any other field or sampling parameter: 400 naming it (refuse_unsupported)
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

logger = logging.getLogger("sglang_lab_server")

PROG = "python -m sglang_lab_server"
DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_DDTREE_BUDGET = 16


# --------------------------------------------------------------------------------------------------
# Flags: SGLang's own parser and registry
# --------------------------------------------------------------------------------------------------
def parse_server_args(argv: Sequence[str]) -> tuple[argparse.Namespace, Any]:
    """Parse ``argv`` exactly like ``sglang.launch_server`` does before it builds ServerArgs.

    Loads SGLang's plugins first (entry point group ``sglang.srt.plugins``: this is where sglang-ddtree
    registers DDTREE), parses with ``ServerArgs.add_cli_args`` and resolves ``--speculative-algorithm``
    with ``SpeculativeAlgorithm.from_string``. An unknown algorithm raises SGLang's own ValueError.
    """
    from sglang.srt.plugins import load_plugins

    load_plugins()

    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(list(argv))
    algorithm = SpeculativeAlgorithm.from_string(args.speculative_algorithm)
    return args, algorithm


def algorithm_name(algorithm: Any) -> str:
    """The registry's name for a resolved algorithm (enum member or plugin CustomSpecAlgo)."""
    for attr in ("name", "algorithm_name", "_name"):
        value = getattr(algorithm, attr, None)
        if isinstance(value, str):
            return value
    return str(algorithm)


def ddtree_budget(num_draft_tokens: int | None) -> int:
    """DDTree tree budget from ``--speculative-num-draft-tokens`` (the root is not a draft node)."""
    if num_draft_tokens is None:
        return DEFAULT_DDTREE_BUDGET
    return max(1, int(num_draft_tokens) - 1)


def derive_context_length(requested: int | None, max_position_embeddings: int | None) -> int:
    """The served context length, checked the way SGLang's ``ModelConfig._derive_context_length`` does (0.5.23).

    A ``--context-length`` above the model's ``max_position_embeddings`` makes SGLang refuse to start with a
    ValueError, unless ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN`` is set (then it warns). The flag parses, so
    only the start fails: the kind of fault a pivot's health check and rollback must handle.
    """
    derived = int(max_position_embeddings or 0) or 4096
    if requested is None:
        return derived
    if requested > derived:
        msg = (f"Warning: User-specified context_length ({requested}) is greater than the derived context_length "
               f"({derived}). This may lead to incorrect model outputs or CUDA errors. Note that the derived "
               f"context_length may differ from max_position_embeddings in the model's config.")
        if os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "").lower() in ("1", "true", "yes"):
            logger.warning(msg)
            return int(requested)
        raise ValueError(f"{msg} To allow overriding this maximum, set the env var "
                         f"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")
    return int(requested)


# --------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Generation:
    output_ids: list[int]
    finish_reason: dict[str, Any]
    accept_lengths: list[int] | None  # per verify round, DDTree only


class BadRequest(ValueError):
    """A request the server refuses with HTTP 400."""


class Engine:
    """The tiny target model (and DDTree drafter) on CPU, one request at a time."""

    def __init__(self, args: argparse.Namespace, algorithm: str) -> None:
        self.args = args
        self.algorithm = algorithm
        self.lock = threading.Lock()
        self.target: Any = None
        self.tokenizer: Any = None
        self.drafter: Any = None
        self.ddtree: Any = None  # the sglang_ddtree.reference module when it drives generation
        self.engine_name = "target-only autoregressive decoding (transformers, CPU)"
        self.engine_note = ""
        self.eos_ids: list[int] = []
        self.context_length: int | None = None
        self.stats = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "verify_rounds": 0,
                      "accepted_tokens": 0}

    # ---- loading
    def load(self) -> None:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        transformers.utils.logging.disable_progress_bar()  # \r progress bars are unreadable in journald
        torch.set_num_threads(max(1, int(os.environ.get("SGLANG_LAB_THREADS", "1"))))
        path = self.args.model_path
        if not os.path.isdir(path):
            raise FileNotFoundError(f"--model-path {path!r} is not a directory")
        with open(os.path.join(path, "config.json")) as fh:
            config = json.load(fh)
        # Before any weight is read, like SGLang's ModelConfig.
        self.context_length = derive_context_length(
            self.args.context_length,
            config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings"))
        t0 = time.monotonic()
        if self.algorithm == "DDTREE":
            self._load_ddtree()
        if self.target is None:
            self.target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
            self.target.eval()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.args.tokenizer_path or path, local_files_only=True)
        except Exception as exc:  # a model without a tokenizer serves input_ids only
            logger.warning("no tokenizer loaded from %s (%s): requests must send input_ids", path, exc)
        eos = getattr(self.target.generation_config, "eos_token_id", None)
        if eos is None:
            eos = getattr(self.target.config, "eos_token_id", None)
        self.eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        logger.info("Load weight end. target=%s params=%d dtype=float32 (%.2f s)", path,
                    sum(p.numel() for p in self.target.parameters()), time.monotonic() - t0)

    def _load_ddtree(self) -> None:
        """Target + DFlash drafter through sglang_ddtree.reference (the plugin's own reference engine)."""
        import torch

        draft_path = self.args.speculative_draft_model_path
        if not draft_path:
            raise ValueError("--speculative-draft-model-path is required with --speculative-algorithm DDTREE")
        try:
            ref = importlib.import_module("sglang_ddtree.reference")
        except ImportError as exc:
            self.engine_note = f"sglang_ddtree.reference is not importable ({exc})"
            logger.warning("DDTREE resolved but %s: serving with target-only decoding", self.engine_note)
            return
        self.target, self.drafter = ref.load_models(self.args.model_path, draft_path, dtype=torch.float32)
        self.ddtree = ref
        self.engine_name = (f"DDTree reference engine (sglang_ddtree.reference.generate, "
                            f"budget {ddtree_budget(self.args.speculative_num_draft_tokens)}, CPU)")
        logger.info("Loaded DFlash drafter from %s (block size %s, target layers %s) for DDTree", draft_path,
                    getattr(self.drafter, "block_size", "?"), getattr(self.drafter, "target_layer_ids", "?"))

    # ---- requests
    def encode(self, body: dict[str, Any]) -> list[int]:
        if "input_ids" in body and body["input_ids"] is not None:
            ids = body["input_ids"]
            if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids) or not ids:
                raise BadRequest("input_ids must be a non-empty list of integers")
            vocab = int(self.target.config.vocab_size)
            bad = [i for i in ids if not 0 <= i < vocab]
            if bad:
                raise BadRequest(f"input_ids {bad[:5]} are outside the vocabulary [0, {vocab})")
            return ids
        text = body.get("text")
        if not isinstance(text, str) or not text:
            raise BadRequest('send "text" (a non-empty string) or "input_ids" (a list of integers)')
        if self.tokenizer is None:
            raise BadRequest("this model has no tokenizer: send input_ids instead of text")
        return list(self.tokenizer.encode(text, add_special_tokens=False)) or [0]

    def generate(self, input_ids: list[int], params: dict[str, Any]) -> Generation:
        max_new = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        if not isinstance(max_new, int) or max_new < 0:
            raise BadRequest(f"sampling_params.max_new_tokens must be an integer >= 0, got {max_new!r}")
        temperature = params.get("temperature", 1.0)
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise BadRequest(f"sampling_params.temperature must be a number >= 0, got {temperature!r}")
        context = self.context_length or int(getattr(self.target.config, "max_position_embeddings", 4096))
        if len(input_ids) + max_new > context:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of {context} tokens. "
                f"You requested a total of {len(input_ids) + max_new} tokens: {len(input_ids)} tokens from "
                f"the input messages and {max_new} tokens for the completion.")
        stop = set() if params.get("ignore_eos") else set(self.eos_ids)
        stop |= set(params.get("stop_token_ids") or [])
        with self.lock:
            if self.ddtree is not None:
                gen = self._generate_ddtree(input_ids, max_new, float(temperature), sorted(stop),
                                            params.get("sampling_seed"))
            else:
                gen = self._generate_plain(input_ids, max_new, float(temperature), stop,
                                           params.get("sampling_seed"))
            self.stats["requests"] += 1
            self.stats["prompt_tokens"] += len(input_ids)
            self.stats["completion_tokens"] += len(gen.output_ids)
            if gen.accept_lengths:
                self.stats["verify_rounds"] += len(gen.accept_lengths)
                self.stats["accepted_tokens"] += sum(gen.accept_lengths)
        return gen

    def _generate_plain(self, input_ids: list[int], max_new: int, temperature: float, stop: set[int],
                        seed: int | None) -> Generation:
        import torch

        out_ids: list[int] = []
        generator = torch.Generator().manual_seed(int(seed)) if seed is not None else None
        with torch.no_grad():
            ids = torch.tensor([input_ids], dtype=torch.long)
            out = self.target(input_ids=ids, use_cache=True)
            for _ in range(max_new):
                logits = out.logits[0, -1].float()
                if temperature == 0:
                    tok = int(torch.argmax(logits))
                else:
                    probs = torch.softmax(logits / temperature, dim=-1)
                    tok = int(torch.multinomial(probs, 1, generator=generator))
                out_ids.append(tok)
                if tok in stop:
                    return Generation(out_ids, {"type": "stop", "matched": tok}, None)
                out = self.target(input_ids=torch.tensor([[tok]]), past_key_values=out.past_key_values,
                                  use_cache=True)
        return Generation(out_ids, {"type": "length", "length": max_new}, None)

    def _generate_ddtree(self, input_ids: list[int], max_new: int, temperature: float, stop: list[int],
                         seed: int | None) -> Generation:
        if max_new == 0:
            return Generation([], {"type": "length", "length": 0}, [])
        budget = ddtree_budget(self.args.speculative_num_draft_tokens)
        result = self.ddtree.generate(self.target, self.drafter, input_ids, max_new, budget,
                                      temperature=temperature, stop_token_ids=stop, seed=seed)
        tokens = [int(t) for t in result.tokens]
        accept = [int(a) for a in result.accept_lengths]
        if result.stopped and tokens:
            return Generation(tokens, {"type": "stop", "matched": tokens[-1]}, accept)
        return Generation(tokens, {"type": "length", "length": max_new}, accept)

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def avg_accept_length(self) -> float | None:
        rounds = self.stats["verify_rounds"]
        return round(self.stats["accepted_tokens"] / rounds, 4) if rounds else None


# --------------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------------
class LabServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's listen backlog is 5: 64 clients connecting at once (bench/gpu/http_semantics.py's concurrent
    # row) got connection resets. Uvicorn, which SGLang serves with, listens with a backlog of 2048.
    request_queue_size = 2048

    def __init__(self, address: tuple[str, int], args: argparse.Namespace, algorithm: Any,
                 argv: Sequence[str]) -> None:
        super().__init__(address, Handler)
        self.args = args
        self.algorithm = algorithm
        self.algorithm_name = algorithm_name(algorithm)
        self.argv = list(argv)
        self.engine = Engine(args, self.algorithm_name)
        self.ready = threading.Event()
        self.start_time = time.time()

    def server_info(self) -> dict[str, Any]:
        import sglang

        info: dict[str, Any] = json.loads(json.dumps(vars(self.args), default=str))
        info.update({
            "version": sglang.__version__,
            "lab_stand_in": True,
            "stand_in": "sglang_lab_server: LAB STAND-IN for sglang.launch_server on a CPU container",
            "launch_command": " ".join([PROG, *self.argv]),
            "speculative_algorithm": self.args.speculative_algorithm,
            "speculative_algorithm_resolved": self.algorithm_name,
            "lab_engine": self.engine.engine_name,
            "lab_engine_note": self.engine.engine_note,
            "startup_time": self.start_time,
            "pid": os.getpid(),
            "ready": self.ready.is_set(),
            "lab_stats": dict(self.engine.stats),
            "internal_states": [self.internal_state()],
        })
        return info

    def internal_state(self) -> dict[str, Any]:
        """Like SGLang's scheduler internal state: ``avg_spec_accept_length`` (accepted tokens / verify rounds
        since start) only when the server speculates and has verified something."""
        state: dict[str, Any] = {"last_gen_throughput": None}
        avg = self.engine.avg_accept_length()
        if avg is not None:
            state["avg_spec_accept_length"] = avg
        if self.algorithm_name == "DDTREE":
            # what sglang-ddtree adds there (DDTreeWorker.ddtree_budget_state): the stand-in's reference engine
            # verifies one fixed budget every round, whatever SGLANG_DDTREE_BUDGET says
            from sglang_ddtree.budget import fixed_budget_report

            state["ddtree_budget"] = fixed_budget_report(ddtree_budget(self.args.speculative_num_draft_tokens),
                                                         self.engine.stats["verify_rounds"])
        return state


class Handler(BaseHTTPRequestHandler):
    server: LabServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        logger.info("%s %s", self.address_string(), format % args)

    def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"object": "error", "message": message, "type": "BadRequestError"
                            if status == 400 else "Error", "code": status})

    def _not_ready(self) -> bool:
        if self.server.ready.is_set():
            return False
        self._error(503, "the model is still loading")
        return True

    def _denied(self, path: str) -> bool:
        """SGLang's own API-key rule (sglang.srt.utils.auth.decide_request_auth): /health, /ready, /metrics are
        open; /generate needs --api-key; /get_server_info (ADMIN_OPTIONAL) the admin key when set, else --api-key."""
        args = self.server.args
        api_key, admin_key = getattr(args, "api_key", None), getattr(args, "admin_api_key", None)
        if not api_key and not admin_key:
            return False
        from sglang.srt.utils.auth import AuthLevel, decide_request_auth

        level = AuthLevel.ADMIN_OPTIONAL if path in ("/get_server_info", "/server_info") else AuthLevel.NORMAL
        decision = decide_request_auth(method=self.command, path=path,
                                       authorization_header=self.headers.get("Authorization"),
                                       api_key=api_key, admin_api_key=admin_key, auth_level=level)
        if decision.allowed:
            return False
        status = getattr(decision, "error_status_code", None) or 401
        self._send(status, {"error": "Unauthorized"})
        return True

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        srv = self.server
        if self._denied(path):
            return
        if path == "/health":
            if not self._not_ready():
                self._send(200, b"", "text/plain")
        elif path == "/health_generate":
            if not self._not_ready():
                srv.engine.generate([0], {"max_new_tokens": 1, "temperature": 0})
                self._send(200, b"", "text/plain")
        elif path in ("/get_server_info", "/server_info"):
            self._send(200, srv.server_info())
        elif path in ("/get_model_info", "/model_info"):
            self._send(200, {"model_path": srv.args.model_path, "tokenizer_path": srv.args.tokenizer_path,
                             "is_generation": True, "lab_stand_in": True})
        elif path == "/v1/models":
            name = srv.args.served_model_name or srv.args.model_path
            self._send(200, {"object": "list", "data": [{
                "id": name, "object": "model", "created": int(srv.start_time), "owned_by": "sglang",
                "root": srv.args.model_path, "max_model_len": srv.args.context_length}]})
        else:
            self._error(404, f"no route {path}")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if self._denied(path):
            return
        if path != "/generate":
            self._error(404, f"no route {path}")
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
        except (ValueError, json.JSONDecodeError) as exc:
            self._error(400, f"the body is not JSON: {exc}")
            return
        if self._not_ready():
            return
        if not isinstance(body, dict):
            self._error(400, "the body must be a JSON object")
            return
        try:
            batch = _split_batch(body)
            results = [self._generate_one(item) for item in batch]
        except BadRequest as exc:
            self._error(400, str(exc))
            return
        except Exception as exc:  # a bug in generation must answer, and be in the journal
            logger.error("generation failed: %s\n%s", exc, traceback.format_exc())
            self._error(500, f"generation failed: {exc}")
            return
        self._send(200, results if _is_batch(body) else results[0])

    def _generate_one(self, body: dict[str, Any]) -> dict[str, Any]:
        engine = self.server.engine
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params must be a JSON object")
        refuse_unsupported(body, params)
        input_ids = engine.encode(body)
        t0 = time.monotonic()
        gen = engine.generate(input_ids, params)
        latency = time.monotonic() - t0
        tps = len(gen.output_ids) / latency if latency > 0 else 0.0
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(gen.output_ids),
            "finish_reason": gen.finish_reason,
            "e2e_latency": latency,
        }
        meta.update(spec_meta_info(gen, len(gen.output_ids), self.server.args.speculative_num_draft_tokens))
        meta.update({
            "speculative_algorithm": (self.server.args.speculative_algorithm or "").upper() or None,
            "speculative_algorithm_resolved": self.server.algorithm_name,
            "lab_engine": engine.engine_name,
        })
        logger.info("Generate: prompt_tokens=%d completion_tokens=%d spec_accept_length=%s "
                    "gen_throughput=%.1f tok/s algorithm=%s", len(input_ids), len(gen.output_ids),
                    meta.get("spec_accept_length"), tps, self.server.algorithm_name)
        return {"text": engine.decode(gen.output_ids), "output_ids": gen.output_ids, "meta_info": meta}


#: What the stand-in implements of /generate; anything else is refused with a 400 naming it (SGLang would apply
#: it: silently ignoring a penalty, a stop string or ``stream`` would make a client believe it had been applied).
SUPPORTED_FIELDS = frozenset({"text", "input_ids", "sampling_params"})
SUPPORTED_SAMPLING_PARAMS = frozenset(
    {"max_new_tokens", "temperature", "stop_token_ids", "ignore_eos", "sampling_seed"}
)


def refuse_unsupported(body: dict[str, Any], params: dict[str, Any]) -> None:
    """BadRequest naming the first request field or sampling parameter the stand-in does not implement."""
    for key in body:
        if key not in SUPPORTED_FIELDS:
            raise BadRequest(f"{key} is not supported by this LAB STAND-IN (it implements "
                             f"{', '.join(sorted(SUPPORTED_FIELDS))})")
    for key in params:
        if key not in SUPPORTED_SAMPLING_PARAMS:
            raise BadRequest(f"sampling_params.{key} is not supported by this LAB STAND-IN (it implements "
                             f"{', '.join(sorted(SUPPORTED_SAMPLING_PARAMS))})")


def spec_meta_info(gen: Generation, completion_tokens: int, num_draft_tokens: int | None) -> dict[str, Any]:
    """Speculative fields of ``meta_info``, named and computed as SGLang 0.5.23's TokenizerManager does.

    SGLang adds them only for requests that ran verify rounds (``spec_verify_ct > 0``):
    ``spec_accept_length`` = completion_tokens / spec_verify_ct (the bonus token included),
    ``spec_accept_rate`` = correct drafts / proposed drafts (verify rounds x (num_draft_tokens - 1)),
    ``spec_num_correct_drafts``, ``spec_num_proposed_drafts``, ``spec_verify_ct``. Target-only decoding (NEXTN
    here: the tiny model has no MTP head) reports none of them, like SGLang. ``spec_accept_lengths`` (the
    tokens each round committed) is a LAB extension.
    """
    rounds = gen.accept_lengths or []
    if not rounds:
        return {}
    verify_ct = len(rounds)
    correct = sum(n - 1 for n in rounds)
    proposed = verify_ct * (ddtree_budget(num_draft_tokens))
    return {
        "spec_accept_rate": round(correct / proposed, 4) if proposed else 0.0,
        "spec_accept_length": round(completion_tokens / verify_ct, 4),
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": proposed,
        "spec_verify_ct": verify_ct,
        "spec_accept_lengths": list(rounds),
    }


def _is_batch(body: dict[str, Any]) -> bool:
    text, ids = body.get("text"), body.get("input_ids")
    return isinstance(text, list) or (isinstance(ids, list) and bool(ids) and isinstance(ids[0], list))


def _split_batch(body: dict[str, Any]) -> list[dict[str, Any]]:
    if not _is_batch(body):
        return [body]
    key = "text" if isinstance(body.get("text"), list) else "input_ids"
    return [{**body, key: item} for item in body[key]]


# --------------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    started = time.time()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, force=True,
                        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    logger.info("sglang_lab_server: LAB STAND-IN for sglang.launch_server on a CPU container (pid %d)",
                os.getpid())
    try:
        args, algorithm = parse_server_args(argv)
    except ValueError as exc:
        # SGLang's own error (e.g. "Unknown speculative algorithm name: DDTREE" before the plugin exists).
        traceback.print_exc()
        logger.error("invalid server arguments: %s", exc)
        return 1
    import sglang

    name = algorithm_name(algorithm)
    logger.info("sglang %s; server_args: model_path=%s tp_size=%s mem_fraction_static=%s context_length=%s "
                "speculative_algorithm=%s (resolved %s) num_steps=%s eagle_topk=%s num_draft_tokens=%s "
                "draft_model_path=%s", sglang.__version__, args.model_path, args.tp_size,
                args.mem_fraction_static, args.context_length, args.speculative_algorithm, name,
                args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens,
                args.speculative_draft_model_path)
    if args.tp_size and args.tp_size > 1:
        logger.info("tp_size=%d is recorded only: the stand-in runs one CPU process", args.tp_size)
    try:
        server = LabServer((args.host, args.port), args, algorithm, argv)
    except OSError as exc:
        logger.error("cannot listen on %s:%s: %s", args.host, args.port, exc)
        return 1
    server.start_time = started
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        logger.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # serve_forever checks for shutdown() every poll_interval (0.5 s by default): a stop waited up to that long
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="http",
                              daemon=True)
    thread.start()
    logger.info("Uvicorn-equivalent HTTP server listening on http://%s:%d (503 until the model is loaded)",
                args.host, args.port)
    try:
        server.engine.load()
    except Exception as exc:
        traceback.print_exc()
        logger.error("failed to load the model: %s", exc)
        server.shutdown()
        return 1
    server.ready.set()
    logger.info("engine: %s", server.engine.engine_name)
    logger.info("The server is fired up and ready to roll! (%.1f s after start)", time.time() - server.start_time)
    stop.wait()
    server.shutdown()
    server.server_close()
    logger.info("server stopped")
    return 0
