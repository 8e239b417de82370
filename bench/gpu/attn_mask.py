"""Issue 23: is the target verify's attention slower because of the tree mask or because of the 17th query token?

SGLang's Triton extend attention (``extend_attention_fwd``, the kernel a TARGET_VERIFY runs per full-attention
layer) timed alone at a Qwen3-8B layer's widths (32 query heads, 8 KV heads of 128), four ways at each batch size
and context: causal with 16 query tokens per request (DFLASH's verify), causal with 17, the tree mask with 17
(DDTREE-16's verify: FULL_MASK layout, prefix columns skipped as the verify does) and the tree mask with 16. The
differences separate the cost of the mask path from the cost of one more token. CUDA events, median of
``--repeats`` after a warm-up; inputs random (never zeros).

    python bench/gpu/attn_mask.py [--contexts 128,1024,8192] [--batches 1,8,32] [--out FILE]

Written for the lent H200 with SGLang 0.5.17 on PYTHONPATH (bench/gpu/run_all.sh step attn-mask); not yet run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch


def _tree_mask(bsz: int, m: int, prefix: int, device) -> torch.Tensor:
    """FULL_MASK layout: per request [m, prefix + m], prefix columns allowed, tree block = a random tree's
    ancestor-or-self matrix (node i's parent drawn among 0..i-1)."""
    blocks = []
    gen = torch.Generator().manual_seed(0)
    for _ in range(bsz):
        parent = [-1] + [int(torch.randint(0, i, (), generator=gen)) for i in range(1, m)]
        anc = torch.eye(m, dtype=torch.bool)
        for i in range(1, m):
            anc[i] |= anc[parent[i]]
        block = torch.ones(m, prefix + m, dtype=torch.bool)
        block[:, prefix:] = anc
        blocks.append(block.reshape(-1))
    return torch.cat(blocks).to(device=device, dtype=torch.uint8)


def time_case(bsz: int, prefix: int, m: int, masked: bool, repeats: int) -> float:
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    dev = torch.device("cuda")
    hq, hkv, d = 32, 8, 128
    pool = bsz * (prefix + m) + 1
    k_buffer = torch.randn(pool, hkv, d, device=dev, dtype=torch.bfloat16)
    v_buffer = torch.randn(pool, hkv, d, device=dev, dtype=torch.bfloat16)
    q = torch.randn(bsz * m, hq, d, device=dev, dtype=torch.bfloat16)
    k = torch.randn(bsz * m, hkv, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn(bsz * m, hkv, d, device=dev, dtype=torch.bfloat16)
    o = torch.empty_like(q)
    qo_indptr = torch.arange(0, (bsz + 1) * m, m, device=dev, dtype=torch.int32)
    kv_indptr = torch.arange(0, (bsz + 1) * prefix, prefix, device=dev, dtype=torch.int32)
    kv_indices = torch.randperm(pool - 1, device=dev)[: bsz * prefix].to(torch.int64) + 1
    mask = _tree_mask(bsz, m, prefix, dev) if masked else None
    mask_indptr = torch.arange(0, (bsz + 1) * m * (prefix + m), m * (prefix + m), device=dev, dtype=torch.int64)

    def run():
        extend_attention_fwd(q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, mask, True,
                             mask_indptr, m, 1.0, 1.0, sm_scale=d ** -0.5, skip_prefix_custom_mask=True)

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="128,1024,8192")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    print("| batch | context | causal 16 ms | causal 17 ms | tree 17 ms | tree 16 ms | tree17/causal16 |")
    for context in [int(c) for c in args.contexts.split(",")]:
        for bsz in [int(b) for b in args.batches.split(",")]:
            row = {"batch": bsz, "context": context}
            for name, m, masked in (("causal16", 16, False), ("causal17", 17, False), ("tree17", 17, True),
                                    ("tree16", 16, True)):
                row[f"{name}_ms"] = time_case(bsz, context, m, masked, args.repeats)
            rows.append(row)
            print(f"| {bsz} | {context} | {row['causal16_ms']:.4f} | {row['causal17_ms']:.4f} | "
                  f"{row['tree17_ms']:.4f} | {row['tree16_ms']:.4f} | {row['tree17_ms'] / row['causal16_ms']:.3f} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(0), "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
