"""Issue 23: the target verify's attention, one layer, timed alone: SGLang's kernel against the plugin's.

SGLang's Triton extend attention (``extend_attention_fwd``, the kernel a TARGET_VERIFY runs per full-attention
layer) five ways at each batch size and context: causal with 16 query tokens per request (DFLASH's verify), causal
with 17, the tree mask with 17 (DDTREE-16's verify through SGLang: FULL_MASK layout, prefix columns skipped) and
the tree mask with 16; then the plugin's ``tree_verify_attention`` (what DDTREE's verify runs, verify_attention.py)
with the tree mask at 17 and 16, checked against SGLang's output on the same inputs. Widths: a Qwen3-8B layer (32
query heads, 8 KV heads of 128) and a Qwen3.6-27B full-attention layer (24 query heads, 4 KV heads of 256). CUDA
events, median of ``--repeats`` after a warm-up; inputs random (never zeros).

    python bench/gpu/attn_mask.py [--contexts 128,1024,8192] [--batches 1,8,32] [--out FILE]

Written for the lent H200 with SGLang 0.5.17 on PYTHONPATH (bench/gpu/run_all.sh step attn-mask).
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


def time_case(bsz: int, prefix: int, m: int, masked: bool, repeats: int, widths: tuple[int, int, int],
              ours: bool = False) -> tuple[float, float]:
    """(median ms, max |difference| from SGLang's kernel on the same inputs: 0 when this is SGLang's kernel)."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    from sglang_ddtree.sglang._triton_attention import tree_verify_attention

    dev = torch.device("cuda")
    hq, hkv, d = widths
    torch.manual_seed(0)
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

    def sglang_run(out):
        extend_attention_fwd(q, k, v, out, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, mask, True,
                             mask_indptr, m, 1.0, 1.0, sm_scale=d ** -0.5, skip_prefix_custom_mask=True)

    def ours_run(out):
        tree_verify_attention(q, k, v, out, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, mask, mask_indptr,
                              m, d ** -0.5)

    def run():
        (ours_run if ours else sglang_run)(o)

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
    diff = 0.0
    if ours:
        theirs = torch.empty_like(q)
        sglang_run(theirs)
        diff = (o.float() - theirs.float()).abs().max().item()
    return statistics.median(times), diff


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="128,1024,8192")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    cases = (("causal16", 16, False, False), ("causal17", 17, False, False), ("tree17", 17, True, False),
             ("tree16", 16, True, False), ("ours17", 17, True, True), ("ours16", 16, True, True))
    print("| widths | batch | context | " + " | ".join(f"{c[0]} ms" for c in cases) + " | ours17/causal16 | "
          "max diff |")
    for label, widths in (("qwen3-8b", (32, 8, 128)), ("qwen36-27b", (24, 4, 256))):
        for context in [int(c) for c in args.contexts.split(",")]:
            for bsz in [int(b) for b in args.batches.split(",")]:
                row = {"widths": label, "batch": bsz, "context": context}
                diff = 0.0
                for name, m, masked, ours in cases:
                    row[f"{name}_ms"], case_diff = time_case(bsz, context, m, masked, args.repeats, widths, ours)
                    diff = max(diff, case_diff)
                row["ours_max_abs_diff"] = diff
                rows.append(row)
                print(f"| {label} | {bsz} | {context} | " + " | ".join(f"{row[c[0] + '_ms']:.4f}" for c in cases)
                      + f" | {row['ours17_ms'] / row['causal16_ms']:.3f} | {diff:.2e} |", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(0), "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
