"""The reference drafter against z-lab's own implementation (PyPI ``dflash==0.1.0``, ``dflash/model.py``).

The SAME random weights go into z-lab's ``DFlashDraftModel`` (CPU, fp32; strict ``load_state_dict``) and into
``DFlashDrafter``; the drafter outputs and draft logits must agree to ~1e-6 for every config field the reference
honours (plain, ``is_causal``, sliding layers derived from ``use_sliding_window``/``max_window_layers`` or given
by ``layer_types``, ``output_multiplier``, ``final_logit_softcapping``, ``input_embedding_scale``), and z-lab's
``dflash_generate`` must commit the same tokens with the same per-round acceptance as the reference engine's
DFLASH chain mode.

``dflash_generate`` is z-lab's code unchanged except two cache helpers written for transformers 5.15 (the
package's pin), which this environment (transformers 5.12.1, the GPU image's) lacks:
``DynamicCache.activate_past_recording`` (absent in 5.12; only matters for sliding-window caches, which these
runs do not use) and ``cache.crop(-n)`` (5.15: remove n tokens, ``crop(0)`` a no-op; 5.12: ``crop(0)`` empties
the cache). The shim gives ``_make_cache``/``_crop_to`` their 5.15 meaning on plain caches, and ``_cuda_time``
(``torch.cuda.synchronize``) a CPU clock.
"""

from __future__ import annotations

import json
import time

import pytest
import torch

try:
    from dflash import model as zlab
except ImportError as exc:  # a collection error, not a skip: CI installs dflash (requirements/sglang-test.txt)
    raise ImportError(f"z-lab's dflash package is required for this test (pip install dflash==0.1.0): {exc}") from exc
from safetensors.torch import load_file
from transformers import DynamicCache, Qwen3Config

from sglang_ddtree.reference import DFlashDrafter, generate, greedy_generate, load_models, make_tiny_models

pytestmark = pytest.mark.slow

TINY = dict(hidden_size=64, num_layers=6, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128)

#: Config variants (applied to both models' config): each honoured field, alone or combined.
VARIANTS = {
    "plain": {},
    "is_causal": {"is_causal": True},
    "sliding_derived_causal": {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
    "sliding_bidirectional": {
        "use_sliding_window": True,
        "sliding_window": 3,
        "max_window_layers": 0,
        "is_causal": False,
    },
    "layer_types": {
        "use_sliding_window": True,
        "sliding_window": 5,
        "layer_types": ["full_attention", "sliding_attention"],
    },
    "logit_scaling": {"output_multiplier": 0.7, "final_logit_softcapping": 2.5},
    "dflash_config_fields": {"dflash_config": {"output_multiplier": 1.3, "input_embedding_scale": 0.5}},
}


def _pair(tmp_path_factory, aligned: bool):
    models = make_tiny_models(
        tmp_path_factory.mktemp("zlab_pair"),
        seed=3,
        vocab_size=64 if not aligned else 96,
        block_size=6,
        dtype="float32",
        with_tokenizer=False,
        drafter_layers=2,
        target_layer_ids=[1, 3],
        aligned=aligned,
        **TINY,
    )
    target, _ = load_models(models.target_dir, models.drafter_dir, dtype=torch.float32)
    cfg = json.loads((models.drafter_dir / "config.json").read_text())
    weights = load_file(str(models.drafter_dir / "model.safetensors"))
    return target, cfg, weights


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny random target (fp32) and a 2-layer random drafter written to disk (target layers [1, 3])."""
    return _pair(tmp_path_factory, aligned=False)


@pytest.fixture(scope="module")
def aligned_pair(tmp_path_factory):
    """The same sizes with the drafter that usually predicts the target's next token (accepts more)."""
    return _pair(tmp_path_factory, aligned=True)


def _variant_config(cfg: dict, variant: dict) -> dict:
    cfg = json.loads(json.dumps(cfg))
    for key, value in variant.items():
        if key == "dflash_config":
            cfg["dflash_config"].update(value)
        else:
            cfg[key] = value
    if "layer_types" not in variant and ("use_sliding_window" in variant or "is_causal" in variant):
        cfg.pop("layer_types", None)  # let use_sliding_window / max_window_layers derive them
    return cfg


def _both(cfg: dict, weights: dict) -> tuple[DFlashDrafter, torch.nn.Module]:
    ref = DFlashDrafter(cfg)
    with torch.no_grad():
        for name, param in ref.named_parameters():
            param.copy_(weights[name])
    ref = ref.float().eval()
    zcfg = Qwen3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    zmodel = zlab.DFlashDraftModel(zcfg)
    zmodel.load_state_dict(weights, strict=True)  # the same tensors, every key used, none missing
    return ref, zmodel.float().eval()


def _inputs(cfg: dict, ctx_len: int, block: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    hidden = cfg["hidden_size"]
    feats = torch.randn((1, ctx_len, 2 * hidden), generator=gen)
    noise = torch.randn((1, block, hidden), generator=gen)
    return feats, noise


def _zlab_hidden(zmodel, feats, noise):
    ctx_len, block = feats.shape[1], noise.shape[1]
    with torch.no_grad():
        return zmodel(position_ids=torch.arange(ctx_len + block)[None], noise_embedding=noise, target_hidden=feats)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_match_zlab(variant, pair):
    target, cfg, weights = pair
    cfg = _variant_config(cfg, VARIANTS[variant])
    ref, zmodel = _both(cfg, weights)
    assert ref.target_layer_ids == list(zmodel.target_layer_ids)
    feats, noise = _inputs(cfg, 11, ref.block_size, seed=7)
    want_hidden = _zlab_hidden(zmodel, feats, noise)
    with torch.no_grad():
        got_hidden = ref(noise, torch.arange(11, 11 + ref.block_size)[None], feats, torch.arange(11)[None])
        # the same block through the context cache, fed in two rounds
        cache = ref.new_cache()
        ref(noise, torch.arange(6, 6 + ref.block_size)[None], feats[:, :6], torch.arange(6)[None], cache)
        cached_hidden = ref(
            noise, torch.arange(11, 11 + ref.block_size)[None], feats[:, 6:], torch.arange(6, 11)[None], cache
        )
        want = zmodel.compute_logits(want_hidden[:, 1:], target.lm_head)
        got = ref.compute_logits(got_hidden[:, 1:], target.lm_head)
        ids = torch.tensor([[5, 4, 4, 4, 4, 4]])
        scale = float(zlab._draft_value(zmodel.config, "input_embedding_scale", 1.0))
        want_noise = zlab._raw_input_embeddings(target, ids, scale)
        got_noise = ref.noise_embedding(target.get_input_embeddings().weight, ids)
    print(
        f"{variant}: max |hidden diff| {_max_diff(got_hidden, want_hidden):.2e}, "
        f"max |logit diff| {_max_diff(got, want):.2e} (logit scale {float(want.abs().max()):.2f})"
    )
    torch.testing.assert_close(got_hidden, want_hidden, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(cached_hidden, want_hidden, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(got_noise, want_noise, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("variant", "drop"),
    [("is_causal", "is_causal"), ("sliding_bidirectional", "sliding_window"), ("logit_scaling", "output_multiplier")],
)
def test_comparison_has_power(variant, drop, pair):
    """Ignoring one honoured field (as the old loader did) makes the comparison fail."""
    target, cfg, weights = pair
    zcfg = _variant_config(cfg, VARIANTS[variant])
    refcfg = dict(zcfg)
    refcfg.pop(drop)
    if drop == "sliding_window":
        refcfg["use_sliding_window"] = False
    ref, _ = _both(refcfg, weights)
    _, zmodel = _both(zcfg, weights)
    feats, noise = _inputs(cfg, 11, ref.block_size, seed=7)
    with torch.no_grad():
        want = zmodel.compute_logits(_zlab_hidden(zmodel, feats, noise)[:, 1:], target.lm_head)
        got = ref.compute_logits(
            ref(noise, torch.arange(11, 11 + ref.block_size)[None], feats, torch.arange(11)[None])[:, 1:],
            target.lm_head,
        )
    assert _max_diff(got, want) > 1e-3


@pytest.fixture()
def zlab_generate(monkeypatch):
    """z-lab's dflash_generate on CPU with transformers 5.12 (see the module docstring for the shim)."""
    monkeypatch.setattr(zlab, "_cuda_time", time.perf_counter)
    monkeypatch.setattr(zlab, "_make_cache", lambda config: DynamicCache(config=config))
    monkeypatch.setattr(zlab, "_crop_to", lambda cache, length: cache.crop(length))

    def run(zmodel, target, prompt, max_new_tokens):
        out = zlab.dflash_generate(zmodel, target, torch.tensor([prompt]), max_new_tokens, None, return_stats=True)
        return out.output_ids[0, len(prompt) :].tolist(), list(out.acceptance_lengths)

    return run


PROMPTS = [[7, 21, 33, 8, 15, 40, 2, 19], [3, 9], [50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61]]


@pytest.mark.parametrize(
    ("variant", "kind"), [("plain", "pair"), ("dflash_config_fields", "pair"), ("plain", "aligned_pair")]
)
def test_chain_acceptance_matches_zlab(variant, kind, request, zlab_generate):
    """Same committed tokens and the same tokens per round as z-lab's DFLASH chain, on several prompts.

    z-lab shortens the last block(s) when fewer than block_size tokens remain; rounds are compared while a full
    block fits (the reference always drafts a full block and truncates to max_new_tokens).
    """
    target, cfg, weights = request.getfixturevalue(kind)
    cfg = _variant_config(cfg, VARIANTS[variant])
    ref, zmodel = _both(cfg, weights)
    max_new = 40
    lengths = []
    for prompt in PROMPTS:
        z_tokens, z_rounds = zlab_generate(zmodel, target, prompt, max_new)
        result = generate(target, ref, prompt, max_new, None, mode="dflash")
        assert result.tokens == z_tokens == greedy_generate(target, prompt, max_new)
        full_rounds, done = 0, 1  # the first token comes from the prefill
        for n in z_rounds:
            if len(prompt) + done + ref.block_size > len(prompt) + max_new:
                break
            full_rounds += 1
            done += n
        assert full_rounds >= 3
        assert result.accept_lengths[:full_rounds] == z_rounds[:full_rounds]
        lengths += z_rounds[:full_rounds]
    print(f"{variant}/{kind}: z-lab chain tokens per round {lengths}")
    assert max(lengths) >= 2, "no draft token was ever accepted: the acceptance comparison would have no power"
