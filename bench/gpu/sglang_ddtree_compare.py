"""Compare DDTREE greedy outputs with no speculation (files of sglang_ddtree_run.py --mode equality).

A mismatch at a position where the float32 reference (Hugging Face transformers on the same GPU) has a
top-1/top-2 logit margin below --tie-margin is reported as a bf16 near-tie and not counted as a failure
(notes/gpu-sglang.md: bf16 engines may legitimately pick either token there). Exit status 1 on any real
mismatch.

    python bench/gpu/sglang_ddtree_compare.py --models DIR BASELINE.json DDTREE.json [DDTREE.json ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def fp32_margin(model, prompt: list[int], prefix: list[int]) -> float:
    import torch

    ids = torch.tensor([prompt + prefix], device=model.device)
    with torch.no_grad():
        logits = model(ids).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True, type=Path)
    ap.add_argument("--tie-margin", type=float, default=1.0)
    ap.add_argument("baseline", type=Path)
    ap.add_argument("candidates", type=Path, nargs="+")
    args = ap.parse_args()

    base = json.loads(args.baseline.read_text())
    model = None
    failures = 0
    for path in args.candidates:
        cand = json.loads(path.read_text())
        for batch in sorted((k for k in base if k.startswith("batch") and k in cand), key=lambda k: int(k[5:])):
            real, ties = 0, 0
            for idx, (ref, got) in enumerate(zip(base[batch], cand[batch], strict=True)):
                pos = first_divergence(ref, got)
                if pos is None:
                    continue
                if model is None:
                    import torch
                    from transformers import AutoModelForCausalLM

                    model = AutoModelForCausalLM.from_pretrained(args.models / "target", torch_dtype=torch.float32).to(
                        "cuda" if torch.cuda.is_available() else "cpu"
                    )
                margin = fp32_margin(model, base["prompts"][idx], ref[:pos])
                kind = "near-tie" if margin < args.tie_margin else "MISMATCH"
                print(
                    f"{path.name} {batch} prompt {idx}: first divergence at token {pos} "
                    f"(fp32 margin {margin:.3f}) -> {kind}"
                )
                if kind == "MISMATCH":
                    real += 1
                else:
                    ties += 1
            total = len(base[batch])
            print(
                f"{path.name} budget={cand.get('budget')} {batch}: {total - real - ties}/{total} identical, "
                f"{ties} near-ties, {real} mismatches"
            )
            failures += real
    print("RESULT:", "PASS" if failures == 0 else f"FAIL ({failures} mismatching prompts)")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
