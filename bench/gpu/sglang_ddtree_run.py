"""One SGLang engine on a GPU: greedy outputs (and speed) for one speculative configuration.

Runs the REAL sglang (0.5.17 on the lent H200) with the sglang-ddtree plugin installed, on the tiny models of
``sglang_ddtree.reference.tiny.make_tiny_models`` (made by sglang_ddtree_gpu.sh). Writes one JSON file.

    python bench/gpu/sglang_ddtree_run.py --models DIR --algo none|DFLASH|DDTREE [--budget 16] \
        --mode equality|speed --out FILE

equality: 32 prompts x 64 new tokens, greedy, at batch 1 (one request at a time) and batch 16 (16 at once).
speed: for batch sizes 1, 8 and 32: wall time of a batched generate after a warm-up, repeated ``--repeats``
times; decode steps (``spec_verify_ct``; completion tokens without speculation), ms/step (median, min, max
over the repeats) and emitted tokens/step. ``--mode equality,speed`` runs both on one engine.
CUDA graphs stay on (decode graphs up to batch 32); attention backend triton. A hybrid target
(``make_tiny_hybrid_models``, detected from its config.json) runs with ``disable_radix_cache=True`` unless
``--hybrid-radix-cache``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from engine_run import SAMPLING_SETS


def prompts(vocab: int, count: int, length: int, seed: int = 7) -> list[list[int]]:
    rng = random.Random(seed)
    # ids 5.. avoid the special tokens of the tiny tokenizer (eos 0, mask 4)
    return [[rng.randrange(5, vocab) for _ in range(length)] for _ in range(count)]


def is_hybrid(models: Path) -> bool:
    """Whether the target is a linear-attention hybrid (make_tiny_hybrid_models: Qwen3-Next, GatedDeltaNet)."""
    from sglang_ddtree.reference.tiny import is_hybrid_target

    return is_hybrid_target(json.loads((models / "target" / "config.json").read_text()))


def engine_kwargs(models: Path, algo: str, budget: int, hybrid_radix_cache: bool = False) -> dict:
    kwargs = dict(
        model_path=str(models / "target"),
        skip_tokenizer_init=True,
        attention_backend="triton",
        sampling_backend="pytorch",
        grammar_backend="none",
        mem_fraction_static=0.3,
        cuda_graph_max_bs_decode=32,
        max_running_requests=32,
        disable_prefill_cuda_graph=True,
        log_level="warning",
    )
    if algo != "none":
        kwargs.update(speculative_algorithm=algo, speculative_draft_model_path=str(models / "drafter"))
    if algo == "DDTREE":
        kwargs.update(speculative_num_draft_tokens=budget + 1)
    shape = models / "shape.json"
    if shape.exists():  # bench/gpu/shapes.py: config only, SGLang makes random weights on the GPU
        spec = json.loads(shape.read_text())
        kwargs.update(load_format=spec["load_format"], mem_fraction_static=0.85, **spec.get("engine_kwargs", {}))
        if spec.get("dummy_range"):  # wider dummy weights in the engine's processes (dummy_weights/sitecustomize.py)
            import os

            os.environ["SGLANG_BENCH_DUMMY_RANGE"] = str(spec["dummy_range"])
            here = str(Path(__file__).resolve().parent / "dummy_weights")
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    if is_hybrid(models) and not hybrid_radix_cache:
        # Hybrid target: no prefix cache, so SGLang's mamba radix cache (extra_buffer state tracking with overlap
        # scheduling, or no_buffer without it) stays out of the equality check; --hybrid-radix-cache keeps
        # SGLang's default (extra_buffer on CUDA).
        kwargs.update(disable_radix_cache=True)
    return kwargs


def generate(engine, batch: list[list[int]], new_tokens: int, sampling: dict | None = None,
             top_logprobs: int = 0) -> list[dict]:
    params = {"temperature": 0.0, **(sampling or {}), "max_new_tokens": new_tokens, "ignore_eos": True}
    extra = {"return_logprob": True, "top_logprobs_num": top_logprobs} if top_logprobs else {}
    out = engine.generate(input_ids=batch, sampling_params=params, **extra)
    return out if isinstance(out, list) else [out]


def top2_margins(output: dict) -> list[float | None]:
    """Per output token: the engine's own log-probability gap between its two most likely tokens (``meta_info``'s
    ``output_top_logprobs``: per position a list of (logprob, token id, text) best first); None where missing."""
    margins = []
    for position in output.get("meta_info", {}).get("output_top_logprobs") or []:
        best = [entry[0] for entry in (position or [])[:2] if entry and entry[0] is not None]
        margins.append(round(best[0] - best[1], 4) if len(best) == 2 else None)
    return margins


def mark_phase(name: str) -> None:
    """Tell the worker's test instruments (SGLANG_DDTREE_TEST_STATS) which phase the next rounds belong to."""
    stats = os.environ.get("SGLANG_DDTREE_TEST_STATS")
    if stats:
        with open(stats, "a") as fh:
            fh.write(json.dumps({"phase": name}) + "\n")


def run_equality(
    engine, vocab: int, batches: list[int], sampling: dict | None = None, given: list[list[int]] | None = None,
    margins: bool = False,
) -> dict:
    """Greedy (or ``sampling``) outputs of 32 prompts x 64 tokens, ``batch`` requests at a time, per batch size
    (``given``: these prompts instead, e.g. a trained pair's held-out ones). ``margins``: also each output token's
    top-2 log-probability gap (``margins<bs>``, ``top2_margins``), the near-tie measure of targets without weights
    on disk (bench/gpu/lossless.py)."""
    ps = given or prompts(vocab, 32, 24)
    result = {"prompts": ps}
    for bs in batches:
        mark_phase(f"batch{bs}")
        outs, gaps = [], []
        for start in range(0, len(ps), bs):
            for o in generate(engine, ps[start : start + bs], 64, sampling, top_logprobs=2 if margins else 0):
                outs.append(o["output_ids"])
                gaps.append(top2_margins(o))
        result[f"batch{bs}"] = outs
        if margins:
            result[f"margins{bs}"] = gaps
    return result


def run_sampling(engine, vocab: int, samples: int, params: dict, prompt: list[int] | None = None,
                 key: str = "sampling") -> dict:
    """``samples`` continuations of 4 tokens of ONE fixed prompt at the given sampling parameters (each request
    request an independent draw): the first token comes from the prefill, tokens 2-4 from speculative rounds."""
    mark_phase(key)
    prompt = prompt or prompts(vocab, 1, 24, seed=11)[0]
    outs = []
    for start in range(0, samples, 32):
        n = min(32, samples - start)
        out = engine.generate(input_ids=[prompt] * n, sampling_params=dict(params, max_new_tokens=4, ignore_eos=True))
        outs += [o["output_ids"] for o in (out if isinstance(out, list) else [out])]
    return {key: {"prompt": prompt, "params": params, "outputs": outs}}


def budget_histogram(engine) -> dict[str, int] | None:
    """How many tree rounds verified each budget so far: the DDTREE worker's report in ``/get_server_info``'s
    ``internal_states[0]["ddtree_budget"]`` (the plugin's scheduler hook), or None where there is none."""
    states = engine.get_server_info().get("internal_states") or [{}]
    return ((states[0] or {}).get("ddtree_budget") or {}).get("budget_histogram")


def histogram_delta(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int] | None:
    """The rounds per budget between two :func:`budget_histogram` readings (None if either is missing)."""
    if before is None or after is None:
        return None
    return {name: n - before.get(name, 0) for name, n in after.items()}


def force_budget(path: str, mode: str, stamp: list[int]) -> None:
    """Write ``mode`` (``auto``, ``chain`` or a budget) to the plugin's test budget file (SGLANG_DDTREE_TEST_BUDGET),
    with a modification time after the last one written (``stamp``), so that the worker reads it again even within
    the file system's timestamp granularity."""
    Path(path).write_text(mode)
    stamp[0] = max(stamp[0] + 1, time.time_ns())
    os.utime(path, ns=(stamp[0], stamp[0]))


def run_tau(
    engine, prompt_ids: list[list[int]], batches: list[int], temperatures: list[float], new_tokens: int, algo: str,
    repeats: int = 3, forced: list[str] | None = None,
) -> dict:
    """Accepted tokens per verify round and tokens/s on held-out prompts (issue 15's table).

    For each batch size B and temperature, a pass: every prompt once, B requests at a time (the prompt list is
    cycled so the last group is full), ``new_tokens`` each, eos ignored (the reference engine never stops early
    either). One untimed pass first (kernels compiled at a first use, the auto budget's exploration of this batch
    size: on the tiny pair a single 0.9 s compile outweighs a whole timed pass), then ``repeats`` timed ones.
    tau = sum(completion - 1) / sum(verify rounds) over the timed passes: the first completion token comes from the
    prefill, every other one from a round (bonus included), as the reference's ``tau_emitted``; tok_s = the median
    over the timed passes of a pass's completion tokens / its wall time. A DDTREE row also has ``budget_histogram``,
    the rounds of its timed passes per budget (read from the server between passes, outside the timed calls).

    ``forced`` (an auto-budget DDTREE engine started with SGLANG_DDTREE_TEST_BUDGET=FILE): after auto's row of each
    batch size and temperature, one row per candidate named (``chain`` or a budget) with the engine held at it
    (``forced`` in the row): every fixed budget timed in auto's own engine, its graphs and its process."""
    mark_phase("tau")
    budget_file = os.environ.get("SGLANG_DDTREE_TEST_BUDGET") if forced else None
    if forced and not budget_file:
        raise SystemExit("--force-budgets needs SGLANG_DDTREE_TEST_BUDGET=FILE in the engine's environment")
    stamp = [0]
    rows = []
    for temp in temperatures:
        params = {"temperature": temp, "max_new_tokens": new_tokens, "ignore_eos": True}
        for bs in batches:
            for mode in [None, *(forced or [])]:
                if budget_file:
                    force_budget(budget_file, mode or "auto", stamp)
                row = _tau_cell(engine, prompt_ids, bs, params, algo, repeats)
                rows.append(row if mode is None else {**row, "forced": mode})
    if budget_file:
        force_budget(budget_file, "auto", stamp)
    return {"tau": rows}


def _tau_cell(engine, prompt_ids: list[list[int]], bs: int, params: dict, algo: str, repeats: int) -> dict:
    """run_tau's row of one batch size and temperature (``params``)."""
    new_tokens = params["max_new_tokens"]
    groups = -(-len(prompt_ids) // bs)
    cycled = [prompt_ids[i % len(prompt_ids)] for i in range(groups * bs)]
    emitted, rounds, tokens, rates = 0, 0, 0, []
    histogram = None
    for rep in range(repeats + 1):
        if rep == 1 and algo == "DDTREE":
            histogram = budget_histogram(engine)
        pass_tokens, wall, pass_rounds = 0, 0.0, []
        for g in range(groups):
            t0 = time.perf_counter()
            outs = generate(engine, cycled[g * bs : (g + 1) * bs], new_tokens, params)
            wall += time.perf_counter() - t0
            if rep == 0:
                continue  # the warm-up pass
            for o in outs:
                completion = o["meta_info"]["completion_tokens"]
                pass_tokens += completion
                emitted += completion - 1
                pass_rounds.append(o["meta_info"].get("spec_verify_ct", completion - 1) if algo != "none"
                                   else completion - 1)
                rounds += pass_rounds[-1]
        if rep:
            tokens += pass_tokens
            rates.append(pass_tokens / wall)
    return {
        "batch": bs,
        "temperature": params["temperature"],
        "requests": len(cycled),
        "repeats": repeats,
        "tau": emitted / max(rounds, 1),
        "rounds": rounds,
        "tokens": tokens,
        "tok_s": statistics.median(rates),
        "tok_s_min": min(rates),
        "tok_s_max": max(rates),
        # the last timed pass's verify rounds per request, in prompt order (cycled): beside the reference's
        # per-prompt rounds, it says which prompts an engine difference is in
        "rounds_per_request": pass_rounds,
        **({"budget_histogram": histogram_delta(histogram, budget_histogram(engine))} if algo == "DDTREE" else {}),
    }


def run_profile(engine, vocab: int, algo: str, context: int, new_tokens: int, directory: Path,
                batches: tuple[int, ...] = (1, 8, 32)) -> dict:
    """One profiled generate per batch size (SGLang's own torch-profiler hook): launches, syncs and GPU busy time
    per step."""
    from step_cost import count_trace, read_traces

    rows = []
    for bs in batches:
        batch = prompts(vocab, bs, context, seed=100 + bs)
        generate(engine, batch, 16)  # warm-up
        out_dir = directory / f"batch{bs}"
        out_dir.mkdir(parents=True, exist_ok=True)
        engine.start_profile(output_dir=str(out_dir), activities=["CPU", "GPU"])
        outs = generate(engine, batch, new_tokens)
        engine.stop_profile()
        steps = max(
            o["meta_info"].get("spec_verify_ct", o["meta_info"]["completion_tokens"])
            if algo != "none"
            else o["meta_info"]["completion_tokens"]
            for o in outs
        )
        counts = count_trace(read_traces(out_dir))
        rows.append(
            {
                "batch": bs,
                "steps": steps,
                **{k: v for k, v in counts.items() if not k.endswith("_us") or k == "gpu_busy_us"},
                "launches_per_step": counts["launches"] / steps,
                "syncs_per_step": counts["syncs"] / steps,
                "gpu_busy_ms_per_step": counts["gpu_busy_us"] / 1000.0 / steps,
                **{f"{table}_per_step": {k: round(v / steps, 2) for k, v in counts[table].items()}
                   for table in ("kernel_us", "host_self_us", "host_inclusive_us")},
            }
        )
    return {"profile": rows}


def run_speed(engine, vocab: int, algo: str, repeats: int, context: int = 32,
              batches: tuple[int, ...] = (1, 8, 32)) -> dict:
    """ms per decode step per batch size: the warm-up generate fills the prefix cache with the same prompts, so the
    timed generates prefill almost nothing (a hybrid target without radix cache prefills every time). Each row keeps
    the first timed generate's greedy tokens (``outputs``, one list per request)."""
    rows = []
    for bs in batches:
        batch = prompts(vocab, bs, context, seed=100 + bs)
        generate(engine, batch, 16)  # warm-up (graphs, allocator)
        per_step, per_token, first = [], [], None
        for _ in range(repeats):
            t0 = time.perf_counter()
            outs = generate(engine, batch, 128)
            wall = time.perf_counter() - t0
            first = first or [o["output_ids"] for o in outs]
            completion = [o["meta_info"]["completion_tokens"] for o in outs]
            # decode steps per request: verify rounds with speculation, one per token without
            steps = [
                o["meta_info"].get("spec_verify_ct", c) if algo != "none" else c
                for o, c in zip(outs, completion, strict=True)
            ]
            per_step.append(1000.0 * wall / max(steps))
            per_token.append(sum(c / s for c, s in zip(completion, steps, strict=True)) / bs)
        rows.append(
            {
                "batch": bs,
                "repeats": repeats,
                "steps": max(steps),
                "ms_per_step": statistics.median(per_step),
                "ms_per_step_min": min(per_step),
                "ms_per_step_max": max(per_step),
                "tokens_per_step": statistics.median(per_token),
                "accept_length_meta": [o["meta_info"].get("spec_accept_length") for o in outs][:4],
                "outputs": first,  # greedy tokens of the first timed generate: step_cost.py's identity check
            }
        )
    return {"speed": rows}


def _gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True, type=Path)
    ap.add_argument("--algo", required=True, choices=["none", "DFLASH", "DDTREE"])
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--mode", required=True, help="equality, speed, sampling, comma-separated")
    ap.add_argument("--batches", default="1,16", help="equality: batch sizes (requests at a time)")
    ap.add_argument("--margins", action="store_true",
                    help="equality: also every output token's top-2 log-probability gap (needs return_logprob: none)")
    ap.add_argument("--samples", type=int, default=4000, help="sampling: continuations of one prompt")
    ap.add_argument(
        "--prompts-file",
        type=Path,
        help="JSON list of {ids: [...]} (train_pair's eval_prompts): tau's prompts; equality/sampling's instead of "
        "random ids",
    )
    ap.add_argument("--temperatures", default="0,1", help="tau: temperatures")
    ap.add_argument("--new-tokens", type=int, default=128, help="tau: new tokens per request")
    ap.add_argument("--force-budgets", default="",
                    help="tau, auto budget: also time these candidates (chain,4,...) in the same engine, held through "
                    "SGLANG_DDTREE_TEST_BUDGET=FILE")
    ap.add_argument("--context", type=int, default=32, help="speed/profile: prompt length in tokens")
    ap.add_argument("--profile-dir", type=Path, help="profile: where SGLang writes the traces")
    ap.add_argument("--profile-tokens", type=int, default=64, help="profile: new tokens of the profiled generate")
    ap.add_argument("--speed-batches", default="1,8,32", help="speed/profile: batch sizes")
    ap.add_argument("--disable-cuda-graph", action="store_true", help="eager target/drafter (no CUDA graphs)")
    ap.add_argument("--repeats", type=int, default=5, help="timed generates per batch size (speed)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--tp", type=int, default=1, help="tensor parallel size (GPUs); 2 for the TP-2 run")
    ap.add_argument(
        "--hybrid-radix-cache",
        action="store_true",
        help="hybrid target: keep SGLang's radix (mamba extra_buffer) cache instead of disabling it",
    )
    args = ap.parse_args()
    modes = args.mode.split(",")
    speed_batches = tuple(int(b) for b in args.speed_batches.split(","))
    if not modes or set(modes) - {"equality", "speed", "sampling", "tau", "profile"}:
        ap.error(f"--mode {args.mode!r}: use equality, speed, sampling (comma-separated)")

    import sglang as sgl

    config = json.loads((args.models / "target" / "config.json").read_text())
    vocab = config.get("vocab_size") or config["text_config"]["vocab_size"]  # Qwen3.5/3.6: in text_config
    t0 = time.perf_counter()
    kwargs = engine_kwargs(args.models, args.algo, args.budget, args.hybrid_radix_cache)
    if args.tp != 1:
        kwargs["tp_size"] = args.tp
    if args.disable_cuda_graph:
        kwargs["disable_cuda_graph"] = True
    engine = sgl.Engine(**kwargs)
    start_s = time.perf_counter() - t0
    load_before = os.getloadavg()  # a loaded host's timings are not comparable: recorded beside them
    try:
        body = {}
        ids = [p["ids"] for p in json.loads(args.prompts_file.read_text())] if args.prompts_file else None
        if "equality" in modes:
            body.update(run_equality(engine, vocab, [int(b) for b in args.batches.split(",")], given=ids,
                                     margins=args.margins))
        if "sampling" in modes:
            for key, params in SAMPLING_SETS.items():
                body.update(run_sampling(engine, vocab, args.samples, params, prompt=ids[0] if ids else None, key=key))
        if "tau" in modes:
            if ids is None:
                ap.error("--mode tau needs --prompts-file")
            temps = [float(t) for t in args.temperatures.split(",")]
            body.update(
                run_tau(engine, ids, [int(b) for b in args.batches.split(",")], temps, args.new_tokens, args.algo,
                        forced=[m for m in args.force_budgets.split(",") if m] or None)
            )
        if "speed" in modes:
            body.update(run_speed(engine, vocab, args.algo, args.repeats, args.context, speed_batches))
        if "profile" in modes:
            body.update(run_profile(engine, vocab, args.algo, args.context, args.profile_tokens, args.profile_dir,
                                    speed_batches))
    finally:
        engine.shutdown()
    record = {
        "algo": args.algo,
        "budget": args.budget if args.algo == "DDTREE" else None,
        "mode": args.mode,
        "sglang": sgl.__version__,
        "gpu": _gpu_name(),
        "engine_start_s": start_s,
        # 1-minute load average of the host once the engine had started and when it was shut down (the engine's own
        # processes count: about 2 while it serves)
        "host_load": [round(load_before[0], 2), round(os.getloadavg()[0], 2), os.cpu_count()],
        "hybrid": is_hybrid(args.models),
        "disable_radix_cache": kwargs.get("disable_radix_cache", False),
        "disable_cuda_graph": bool(kwargs.get("disable_cuda_graph", False)),
        **body,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record))
    print(f"{args.algo} budget={record['budget']} {args.mode}: wrote {args.out} (engine start {start_s:.0f} s)")
    for row in body.get("speed", []):
        ms, lo, hi, tps = (row[k] for k in ("ms_per_step", "ms_per_step_min", "ms_per_step_max", "tokens_per_step"))
        print(f"  batch {row['batch']:>2}: {ms:.3f} ms/step ({lo:.3f}-{hi:.3f}), {tps:.2f} tokens/step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
