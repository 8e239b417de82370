"""Command line: ``python -m sglang_ddtree {generate,stats,make-tiny,check-drafter}``.

* ``make-tiny OUT``: write a tiny random Qwen3 target and DFlash drafter (see ``reference.tiny``).
* ``generate``: DDTree-decode one prompt with the reference engine on local model directories; prints the
  text and acceptance statistics (``--check`` also runs plain greedy decoding and compares).
* ``stats``: run many prompts (a text file, one prompt per line, or JSONL with a "prompt" field) for one or
  more budgets and print acceptance-length statistics (mean tokens per verify pass, histogram); ``--dflash``
  adds the drafter's argmax chain (DFLASH) as a row.
* ``check-drafter PATH``: can this DFlash drafter checkpoint be served exactly (``--consumer reference`` or
  ``sglang``)? Prints one JSON object (``ok``, ``problems``, the resolved ``spec``); exit status 1 on a refusal,
  2 on a usage error. Reads config.json and the safetensors headers only (no torch, no tensor data).
* ``check-sglang``: runs SGLang's ``load_plugins()`` in this interpreter and prints one JSON object: which
  DDTREE a server started here runs (``implementation``: "plugin", "native" or null), the plugin's status, the
  hooks applied, ``ok``; exit status 1 when DDTREE is not available (or not the ``--expect``-ed one).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]

_DTYPES = ("auto", "float32", "float64", "bfloat16", "float16")


def _parse_budgets(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(
            f"--budgets {text!r} is invalid: give a comma-separated list of ints >= 1, e.g. 4,8,16"
        )
    return values


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected an int >= 1")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected a number >= 0")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sglang_ddtree", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    tiny = sub.add_parser("make-tiny", help="write a tiny random Qwen3 target + DFlash drafter")
    tiny.add_argument("out_dir", type=Path)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--vocab-size", type=_positive_int, default=2000)
    tiny.add_argument("--block-size", type=_positive_int, default=8)
    tiny.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    tiny.add_argument("--aligned", action="store_true", help="drafter that often agrees with the target")

    def model_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--target", type=Path, required=True, help="local HF target model directory")
        p.add_argument("--drafter", type=Path, required=True, help="local DFlash drafter directory")
        p.add_argument("--dtype", choices=_DTYPES, default="auto")
        p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
        p.add_argument("--max-new-tokens", type=_positive_int, default=64)
        p.add_argument("--temperature", type=_non_negative_float, default=0.0)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--chat", action="store_true", help="wrap prompts with the tokenizer's chat template")
        p.add_argument("--no-stop", action="store_true", help="ignore the tokenizer's eos token")
        p.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    gen = sub.add_parser("generate", help="decode one prompt and print acceptance statistics")
    model_args(gen)
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (tokenized with the target's tokenizer)")
    src.add_argument("--prompt-ids", help="comma-separated prompt token ids")
    gen.add_argument("--budget", type=_positive_int, default=16)
    gen.add_argument("--check", action="store_true", help="compare with plain greedy decoding (temperature 0)")

    stats = sub.add_parser("stats", help="acceptance-length statistics over a prompt file")
    model_args(stats)
    stats.add_argument("--prompts", type=Path, required=True, help="text file (one prompt per line) or .jsonl")
    stats.add_argument("--budgets", type=_parse_budgets, default=[16])
    stats.add_argument("--limit", type=_positive_int, default=None, help="use only the first LIMIT prompts")
    stats.add_argument("--dflash", action="store_true", help="also measure DFLASH's argmax chain (row 'dflash')")

    check = sub.add_parser("check-drafter", help="can this DFlash drafter checkpoint be served exactly? (JSON)")
    check.add_argument("path", type=Path, help="drafter checkpoint directory (config.json, *.safetensors)")
    check.add_argument(
        "--consumer",
        choices=("reference", "sglang"),
        default="sglang",
        help="who serves it: the DDTREE plugin in SGLang (default) or the reference drafter",
    )
    sglang_check = sub.add_parser(
        "check-sglang", help="is --speculative-algorithm DDTREE available in this SGLang, and which one? (JSON)"
    )
    sglang_check.add_argument(
        "--expect",
        choices=("any", "plugin", "native"),
        default="any",
        help="implementation required for exit status 0 (default: any)",
    )
    return parser


def _torch_dtype(name: str):
    import torch

    return None if name == "auto" else getattr(torch, name)


def _load(args):
    from .reference import load_models

    try:
        target, drafter = load_models(args.target, args.drafter, dtype=_torch_dtype(args.dtype), device=args.device)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    tokenizer = None
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(args.target), local_files_only=True)
    except (OSError, ValueError):
        tokenizer = None
    return target, drafter, tokenizer


def _encode(tokenizer, text: str, chat: bool) -> list[int]:
    if tokenizer is None:
        raise SystemExit("error: the target directory has no tokenizer; use --prompt-ids")
    if chat:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
    return tokenizer.encode(text, add_special_tokens=False)


def _stop_ids(tokenizer, args) -> list[int]:
    if args.no_stop or tokenizer is None or tokenizer.eos_token_id is None:
        return []
    return [int(tokenizer.eos_token_id)]


def _summary(lengths: Sequence[int]) -> dict:
    hist = Counter(lengths)
    rounds = len(lengths)
    return {
        "rounds": rounds,
        "mean_accept_length": (sum(lengths) / rounds) if rounds else 0.0,
        "histogram": {str(k): hist[k] for k in sorted(hist)},
    }


def _cmd_make_tiny(args) -> int:
    from .reference import make_tiny_models

    try:
        models = make_tiny_models(
            args.out_dir,
            seed=args.seed,
            vocab_size=args.vocab_size,
            block_size=args.block_size,
            dtype=args.dtype,
            aligned=args.aligned,
        )
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"target:  {models.target_dir}")
    print(f"drafter: {models.drafter_dir}")
    print(f"vocab {models.vocab_size}, block size {models.block_size}, target layers {list(models.target_layer_ids)}")
    return 0


def _cmd_generate(args) -> int:
    from tqdm import tqdm

    from .reference import generate, greedy_generate

    target, drafter, tokenizer = _load(args)
    if args.prompt_ids is not None:
        try:
            prompt = [int(v) for v in args.prompt_ids.split(",") if v.strip()]
        except ValueError:
            raise SystemExit(f"error: --prompt-ids {args.prompt_ids!r} must be comma-separated ints") from None
    else:
        prompt = _encode(tokenizer, args.prompt, args.chat)
    stops = _stop_ids(tokenizer, args)
    with tqdm(total=args.max_new_tokens, desc="tokens", unit="tok", file=sys.stderr, disable=args.json) as bar:

        def on_round(committed: int, total: int) -> None:
            bar.update(min(total, args.max_new_tokens) - bar.n)

        result = generate(
            target,
            drafter,
            prompt,
            args.max_new_tokens,
            args.budget,
            temperature=args.temperature,
            stop_token_ids=stops,
            seed=args.seed,
            on_round=on_round,
        )
    report = {"budget": args.budget, "tokens": result.tokens, "stopped": result.stopped}
    report.update(_summary(result.accept_lengths))
    if tokenizer is not None:
        report["text"] = tokenizer.decode(result.tokens)
    if args.check:
        if args.temperature > 0:
            raise SystemExit("error: --check compares with greedy decoding; use it with --temperature 0")
        reference = greedy_generate(target, prompt, args.max_new_tokens, stops)
        report["matches_greedy"] = reference == result.tokens
    if args.json:
        print(json.dumps(report))
    else:
        if "text" in report:
            print(report["text"])
        print(f"tokens: {len(result.tokens)}  rounds: {report['rounds']}  budget: {args.budget}")
        print(f"mean acceptance length (tokens per target pass): {report['mean_accept_length']:.3f}")
        print("histogram: " + ", ".join(f"{k}: {v}" for k, v in report["histogram"].items()))
        if args.check:
            print(f"matches plain greedy decoding: {report['matches_greedy']}")
    return 1 if args.check and not report["matches_greedy"] else 0


def _read_prompts(path: Path) -> list[str]:
    if not path.is_file():
        raise SystemExit(f"error: --prompts {str(path)!r} is not a file")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if path.suffix == ".jsonl":
        prompts = []
        for n, line in enumerate(lines, 1):
            obj = json.loads(line)
            if not isinstance(obj, dict) or "prompt" not in obj:
                raise SystemExit(f"error: {path}:{n}: each JSONL line needs a 'prompt' field")
            prompts.append(str(obj["prompt"]))
        return prompts
    return lines


def _cmd_stats(args) -> int:
    from tqdm import tqdm

    from .reference import generate

    prompts = _read_prompts(args.prompts)[: args.limit]
    if not prompts:
        raise SystemExit(f"error: --prompts {str(args.prompts)!r} contains no prompts")
    target, drafter, tokenizer = _load(args)
    stops = _stop_ids(tokenizer, args)
    encoded = [_encode(tokenizer, p, args.chat) for p in prompts]
    rows: list[int | str] = (["dflash"] if args.dflash else []) + list(args.budgets)
    per_row: dict[int | str, list[int]] = {r: [] for r in rows}
    tokens: dict[int | str, int] = {r: 0 for r in rows}
    jobs = [(r, ids) for r in rows for ids in encoded]
    for row, ids in tqdm(jobs, desc="prompts", unit="prompt", file=sys.stderr, disable=args.json):
        mode, budget = ("dflash", None) if row == "dflash" else ("ddtree", row)
        result = generate(
            target, drafter, ids, args.max_new_tokens, budget, args.temperature, stops, seed=args.seed, mode=mode
        )
        per_row[row].extend(result.accept_lengths)
        tokens[row] += len(result.tokens)
    report = {
        "prompts": len(prompts),
        "budgets": {str(r): {"tokens": tokens[r], **_summary(per_row[r])} for r in rows},
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(f"prompts: {len(prompts)}  max_new_tokens: {args.max_new_tokens}  temperature: {args.temperature}")
        print("| budget | rounds | tokens | mean acceptance length |")
        print("|---:|---:|---:|---:|")
        for r in rows:
            s = report["budgets"][str(r)]
            print(f"| {r} | {s['rounds']} | {s['tokens']} | {s['mean_accept_length']:.3f} |")
    return 0


def _cmd_check_drafter(args) -> int:
    from .drafter_config import check_drafter_dir

    report = check_drafter_dir(args.path, args.consumer)
    print(json.dumps(report, indent=1, sort_keys=True))
    return 0 if report["ok"] else 1


def _cmd_check_sglang(args) -> int:
    from .sglang import check_sglang

    status, report = check_sglang(args.expect)
    print(json.dumps(report, indent=1, sort_keys=True))
    if report["problem"]:
        print(f"sglang-ddtree: {report['problem']}", file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    handlers = {
        "make-tiny": _cmd_make_tiny,
        "generate": _cmd_generate,
        "stats": _cmd_stats,
        "check-drafter": _cmd_check_drafter,
        "check-sglang": _cmd_check_sglang,
    }
    return handlers[args.command](args)
