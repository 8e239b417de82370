"""Bench-only (bench/gpu/step_cost.py on bench/gpu/shapes.py's config-only models): SGLang's dummy weights with a
wider range. SGLang's ``load_format="dummy"`` draws every weight from U(-1e-3, 1e-3): the logits of such a model
are all within a few bf16 steps of each other, so nearly every vocabulary entry ties, which no trained model does
(and which sends the tree's exact top-k into its tie fallback). With ``SGLANG_BENCH_DUMMY_RANGE=R`` set, every
interpreter that has this folder on PYTHONPATH (the engine's scheduler processes inherit it) draws from U(-R, R)
instead. Nothing else changes."""

import os

_RANGE = os.environ.get("SGLANG_BENCH_DUMMY_RANGE")
if _RANGE:
    try:
        import functools

        from sglang.srt.model_loader import loader as _loader
        from sglang.srt.model_loader import weight_utils as _weight_utils

        _wide = functools.partial(_weight_utils.initialize_dummy_weights, low=-float(_RANGE), high=float(_RANGE))
        _loader.initialize_dummy_weights = _wide
    except Exception as exc:  # never break the interpreter; the run says so
        print(f"sitecustomize: SGLANG_BENCH_DUMMY_RANGE not applied: {exc}", flush=True)
