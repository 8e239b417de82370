"""Tiny random models for tests, labs and GPU smoke runs: no downloads, seconds on a CPU.

``make_tiny_models(out_dir)`` writes

* ``out_dir/target``: a random Hugging Face ``Qwen3ForCausalLM`` (safetensors) with a self-made byte-level BPE
  tokenizer (``PreTrainedTokenizerFast``; special tokens ``<|endoftext|>`` = eos (id 0), ``<|im_start|>``,
  ``<|im_end|>``, ``<|pad|>``, ``<|MASK|>`` (id 4)) and a minimal chat template;
* ``out_dir/drafter``: a matching random DFlash drafter in the z-lab checkpoint layout that SGLang's
  ``DFlashDraftModel`` loads (``architectures=["DFlashDraftModel"]``, ``model_type="qwen3"``,
  ``dflash_config={block_size, target_layer_ids, mask_token, mask_token_id}``, ``layer_types``, weights
  ``layers.N.*``, ``norm``, ``hidden_norm``, ``fc``; no embedding or lm_head), plus a copy of the tokenizer.

The target's lm_head is a permuted copy of its embedding and the init std is large, so greedy margins are large
(bf16 serving engines then agree with float32/float64 references). A random drafter accepts almost nothing;
``aligned=True`` instead builds a drafter that predicts the target's next token at depth 1 most of the time
(so accepted drafts and KV compaction get exercised): the target is made nearly a bigram model (small
attention/MLP branches, a constant embedding feature) and the drafter's attention copies the root token's
embedding into every block position.

``make_tiny_hybrid_models(out_dir)`` writes the same pair for a HYBRID target: a random Hugging Face
``Qwen3NextForCausalLM`` (GatedDeltaNet linear-attention layers plus a full-attention layer every
``full_attention_interval`` layers, sparse-MoE MLPs: the only text-only hybrid architecture whose SGLang 0.5.17
model class can capture DFLASH's aux hidden states, ``Qwen3NextForCausalLM.set_dflash_layers_to_capture``), with
the same tokenizer and the same DFlash drafter layout.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["SPECIAL_TOKENS", "TinyModels", "make_tiny_hybrid_models", "make_tiny_models", "make_tokenizer"]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>", "<|MASK|>"]
EOS_TOKEN_ID = 0
MASK_TOKEN_ID = 4
_BYTE_ALPHABET = 256

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there been one all we their has would when if so no will can more about what up "
    "out them into only other time some could these two may first then do any like my now over such our "
    "man me even most made after also did many before must through back years where much your way well "
    "def return self import class for while if else elif try except with lambda yield none true false "
    "tree draft token model target verify accept budget depth node root bonus block mask cache layer "
    "speculative decoding diffusion sglang server batch graph kernel tensor shape float int list dict"
).split()
_PUNCT = [".", ",", ":", "(", ")", "=", "+", "-", "_", "\n", "    ", "0", "1", "2", "42", "[", "]", "'", '"']

_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _corpus(size: int = 200_000) -> str:
    rng = random.Random(20260412)  # fixed: the tokenizer does not depend on the model seed
    parts: list[str] = []
    total = 0
    while total < size:
        tok = rng.choice(_WORDS) if rng.random() < 0.8 else rng.choice(_PUNCT)
        parts.append(tok)
        parts.append(" " if rng.random() < 0.85 else "")
        total += len(tok) + 1
    return "".join(parts)


def make_tokenizer(vocab_size: int, texts=None):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with exactly ``vocab_size`` tokens (ids 0..4 special).

    Args:
        vocab_size: the vocabulary size (>= 261).
        texts: an iterable of training texts (default: a fixed synthetic corpus).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    minimum = len(SPECIAL_TOKENS) + _BYTE_ALPHABET
    if vocab_size < minimum:
        raise ValueError(f"vocab_size={vocab_size} is too small: the byte-level tokenizer needs >= {minimum}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_corpus()] if texts is None else texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        mask_token="<|MASK|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = _CHAT_TEMPLATE
    # BPE training can stop short of vocab_size on a small corpus; pad with unused tokens to the exact size.
    if len(fast) < vocab_size:
        fast.add_tokens([f"<|unused_{i}|>" for i in range(vocab_size - len(fast))])
    assert fast.convert_tokens_to_ids("<|MASK|>") == MASK_TOKEN_ID
    assert fast.eos_token_id == EOS_TOKEN_ID
    return fast


@dataclass(frozen=True)
class TinyModels:
    """Paths and ids of a tiny model pair written by :func:`make_tiny_models`."""

    target_dir: Path
    drafter_dir: Path
    vocab_size: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int = MASK_TOKEN_ID
    eos_token_id: int = EOS_TOKEN_ID


def _init_target_weights(model, gen, init_std: float, aligned: bool, residual_writers):
    """Random tiny-target weights, in place; returns the embedding Parameter (for the drafter).

    Every >= 2-dim weight (projections, conv1d, experts, router) ~ N(0, init_std); the lm_head is a row
    permutation of the embeddings. With ``aligned``, a near-bigram target: embeddings dominate the residual
    stream (x10; the weights ``residual_writers(layer)`` returns, which write into it, x0.1), and feature 0 is a
    positive constant (negative for the mask token) for the aligned drafter's keys.
    """
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * init_std)
        emb = model.model.embed_tokens.weight
        head_scale = 1.0
        if aligned:
            emb.mul_(10.0)
            emb[:, 0] = 30 * init_std
            emb[MASK_TOKEN_ID, 0] = -30 * init_std
            head_scale = 0.1
            for layer in model.model.layers:
                for weight in residual_writers(layer):
                    weight.mul_(0.1)
        perm = torch.randperm(emb.shape[0], generator=gen)
        model.lm_head.weight.copy_(emb[perm] * head_scale)
    return emb


def _qwen3_next_residual_writers(layer):
    """The weights of a Qwen3-Next layer that write into the residual stream (attention out, MLP down)."""
    yield layer.linear_attn.out_proj.weight if hasattr(layer, "linear_attn") else layer.self_attn.o_proj.weight
    for name, p in layer.mlp.named_parameters():
        if "down_proj" in name:
            yield p


def make_tiny_models(
    out_dir: str | Path,
    seed: int = 0,
    *,
    vocab_size: int = 2000,
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    intermediate_size: int = 512,
    drafter_layers: int = 1,
    block_size: int = 8,
    target_layer_ids: list[int] | None = None,
    dtype: str = "bfloat16",
    aligned: bool = False,
    init_std: float = 0.07,
    with_tokenizer: bool = True,
) -> TinyModels:
    """Write a tiny random Qwen3 target and a matching DFlash drafter under ``out_dir``.

    Args:
        out_dir: directory to create (``target/`` and ``drafter/`` are replaced if present).
        seed: weights seed (the tokenizer is the same for every seed).
        vocab_size: model and tokenizer vocabulary (>= 261).
        block_size: DFlash block size (the DDTree depth limit is block_size - 1).
        target_layer_ids: target layers whose hidden states feed the drafter (default: two middle layers).
        dtype: weights dtype written to disk ("bfloat16", "float16", "float32").
        aligned: build a drafter that usually agrees with the target at depth 1 (see module docstring).
        init_std: standard deviation of the random weights.
        with_tokenizer: write the tokenizer (False allows any vocab_size > 4, for engine-only tests).
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    _check_common(block_size, dtype, num_heads, num_kv_heads)
    if target_layer_ids is None:
        target_layer_ids = [max(0, num_layers // 2 - 1), min(num_layers - 2, num_layers // 2)]
        target_layer_ids = sorted(set(target_layer_ids))
    if any(not 0 <= i < num_layers for i in target_layer_ids):
        raise ValueError(f"target_layer_ids={target_layer_ids} must lie in 0..{num_layers - 1}")
    target_dir, drafter_dir = _fresh_dirs(out_dir)
    tokenizer = _tokenizer_or_none(vocab_size, with_tokenizer)
    torch_dtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(seed)

    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        initializer_range=init_std,
        bos_token_id=None,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=3,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    emb = _init_target_weights(
        model, gen, init_std, aligned, lambda layer: (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight)
    )
    model = model.to(torch_dtype)
    _quiet_save(model, target_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(target_dir)

    drafter_cfg = _drafter_config(
        config, drafter_layers, block_size, target_layer_ids, num_layers, dtype, intermediate_size
    )
    _write_drafter(drafter_dir, drafter_cfg, gen, init_std, aligned, emb.detach().float(), torch_dtype, tokenizer)
    return TinyModels(
        target_dir=target_dir,
        drafter_dir=drafter_dir,
        vocab_size=vocab_size,
        block_size=block_size,
        target_layer_ids=tuple(target_layer_ids),
    )


def make_tiny_hybrid_models(
    out_dir: str | Path,
    seed: int = 0,
    *,
    vocab_size: int = 2000,
    hidden_size: int = 256,
    num_layers: int = 4,
    full_attention_interval: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    linear_num_key_heads: int = 2,
    linear_num_value_heads: int = 4,
    linear_key_head_dim: int = 64,
    linear_value_head_dim: int = 64,
    linear_conv_kernel_dim: int = 4,
    num_experts: int = 4,
    num_experts_per_tok: int = 2,
    moe_intermediate_size: int = 128,
    shared_expert_intermediate_size: int = 256,
    drafter_layers: int = 1,
    drafter_intermediate_size: int = 512,
    block_size: int = 8,
    target_layer_ids: list[int] | None = None,
    dtype: str = "bfloat16",
    aligned: bool = False,
    init_std: float = 0.07,
    with_tokenizer: bool = True,
) -> TinyModels:
    """Write a tiny random hybrid (GatedDeltaNet + full attention) Qwen3-Next target and a DFlash drafter.

    Layer ``i`` is full attention when ``(i + 1) % full_attention_interval == 0``, linear attention otherwise
    (the default: 3 GatedDeltaNet layers, then 1 full-attention layer). Every layer's MLP is a sparse MoE with a
    gated shared expert (SGLang's ``Qwen3HybridLinearDecoderLayer`` has no dense-MLP variant). The default
    ``shared_expert_intermediate_size`` differs from ``moe_intermediate_size``, so SGLang keeps the shared
    expert as its own MLP instead of fusing it into the routed experts. ``config.json`` also carries
    ``full_attention_interval`` and a top-level ``rope_theta``, which SGLang's own ``Qwen3NextConfig`` reads
    (transformers keeps only ``layer_types`` / ``rope_parameters``).

    Args are as for :func:`make_tiny_models`; ``target_layer_ids`` must lie in 0..num_layers-2 (SGLang's
    Qwen3-Next captures the input of layer ``i + 1``). ``aligned=True`` shrinks the linear-attention,
    attention and MoE branches as well, so the aligned drafter agrees with the target at depth 1.
    """
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    _check_common(block_size, dtype, num_heads, num_kv_heads)
    if full_attention_interval < 1 or num_layers < full_attention_interval:
        raise ValueError(
            f"full_attention_interval={full_attention_interval} must be in 1..num_layers={num_layers} "
            "(the model needs at least one full-attention layer)"
        )
    if linear_num_value_heads % linear_num_key_heads:
        raise ValueError(
            f"linear_num_value_heads={linear_num_value_heads} must be a multiple of "
            f"linear_num_key_heads={linear_num_key_heads}"
        )
    if not 1 <= num_experts_per_tok <= num_experts:
        raise ValueError(f"num_experts_per_tok={num_experts_per_tok} must be in 1..num_experts={num_experts}")
    if target_layer_ids is None:
        target_layer_ids = sorted({max(0, num_layers // 2 - 1), min(num_layers - 2, num_layers // 2)})
    if any(not 0 <= i <= num_layers - 2 for i in target_layer_ids):
        raise ValueError(
            f"target_layer_ids={target_layer_ids} must lie in 0..{num_layers - 2} (SGLang's Qwen3-Next captures "
            "the input of layer id + 1)"
        )
    target_dir, drafter_dir = _fresh_dirs(out_dir)
    tokenizer = _tokenizer_or_none(vocab_size, with_tokenizer)
    torch_dtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(seed)

    layer_types = [
        "full_attention" if (i + 1) % full_attention_interval == 0 else "linear_attention" for i in range(num_layers)
    ]
    rope_theta = 1_000_000.0
    config = Qwen3NextConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=shared_expert_intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        linear_num_key_heads=linear_num_key_heads,
        linear_num_value_heads=linear_num_value_heads,
        linear_key_head_dim=linear_key_head_dim,
        linear_value_head_dim=linear_value_head_dim,
        linear_conv_kernel_dim=linear_conv_kernel_dim,
        num_experts=num_experts,
        num_experts_per_tok=num_experts_per_tok,
        moe_intermediate_size=moe_intermediate_size,
        shared_expert_intermediate_size=shared_expert_intermediate_size,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        layer_types=layer_types,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta, "partial_rotary_factor": 0.25},
        partial_rotary_factor=0.25,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        initializer_range=init_std,
        bos_token_id=None,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=3,
    )
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(config).eval()
    # A_log, dt_bias and the norms keep their Qwen3-Next initialisation (zero-centred RMSNorm weights: scale 1).
    emb = _init_target_weights(model, gen, init_std, aligned, _qwen3_next_residual_writers)
    model = model.to(torch_dtype)
    _quiet_save(model, target_dir)
    cfg_path = target_dir / "config.json"
    saved = json.loads(cfg_path.read_text())
    saved.update(full_attention_interval=full_attention_interval, rope_theta=rope_theta, torch_dtype=dtype)
    cfg_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(target_dir)

    drafter_cfg = _drafter_config(
        config, drafter_layers, block_size, target_layer_ids, num_layers, dtype, drafter_intermediate_size
    )
    _write_drafter(drafter_dir, drafter_cfg, gen, init_std, aligned, emb.detach().float(), torch_dtype, tokenizer)
    return TinyModels(
        target_dir=target_dir,
        drafter_dir=drafter_dir,
        vocab_size=vocab_size,
        block_size=block_size,
        target_layer_ids=tuple(target_layer_ids),
    )


def is_hybrid_target(config: dict) -> bool:
    """Whether a target ``config.json`` (as a dict) describes a linear-attention hybrid (e.g. Qwen3-Next)."""
    text = config.get("text_config") or config
    types = text.get("layer_types") or text.get("layers_block_type") or []
    return any(t in ("linear_attention", "mamba") for t in types) or text.get("model_type") in (
        "qwen3_next",
        "qwen3_5_text",
        "qwen3_5_moe_text",
    )


def _check_common(block_size: int, dtype: str, num_heads: int, num_kv_heads: int) -> None:
    if block_size < 2:
        raise ValueError(f"block_size={block_size} is invalid: a DFlash block needs >= 2 tokens (e.g. 8)")
    if dtype not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"dtype={dtype!r} is invalid: use 'bfloat16', 'float16' or 'float32'")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")


def _fresh_dirs(out_dir: str | Path) -> tuple[Path, Path]:
    out = Path(out_dir)
    target_dir, drafter_dir = out / "target", out / "drafter"
    for d in (target_dir, drafter_dir):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    return target_dir, drafter_dir


def _tokenizer_or_none(vocab_size: int, with_tokenizer: bool):
    tokenizer = make_tokenizer(vocab_size) if with_tokenizer else None
    if not with_tokenizer and vocab_size <= MASK_TOKEN_ID:
        raise ValueError(f"vocab_size={vocab_size} is too small: it must exceed the mask token id {MASK_TOKEN_ID}")
    return tokenizer


def _write_drafter(drafter_dir, drafter_cfg, gen, init_std, aligned, emb, torch_dtype, tokenizer) -> None:
    from safetensors.torch import save_file

    weights = _drafter_weights(drafter_cfg, gen, init_std, aligned, emb)
    save_file({k: v.to(torch_dtype).contiguous() for k, v in weights.items()}, str(drafter_dir / "model.safetensors"))
    (drafter_dir / "config.json").write_text(json.dumps(drafter_cfg, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(drafter_dir)


def _quiet_save(model, path: Path) -> None:
    """save_pretrained without progress bars (restores the previous setting)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path, safe_serialization=True)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _drafter_config(config, layers, block_size, layer_ids, num_target_layers, dtype, intermediate) -> dict:
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": config.hidden_size,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "num_target_layers": num_target_layers,
        "block_size": block_size,
        "layer_types": ["full_attention"] * layers,
        "dflash_config": {
            "block_size": block_size,
            "target_layer_ids": list(layer_ids),
            "mask_token": "<|MASK|>",
            "mask_token_id": MASK_TOKEN_ID,
        },
    }


def _drafter_weights(cfg: dict, gen: torch.Generator, std: float, aligned: bool, emb: torch.Tensor) -> dict:
    hidden = cfg["hidden_size"]
    heads, kv_heads, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    inter = cfg["intermediate_size"]
    nctx = len(cfg["dflash_config"]["target_layer_ids"])

    def rnd(*shape):
        return torch.randn(shape, generator=gen) * std

    w: dict[str, torch.Tensor] = {}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        w[p + "self_attn.q_proj.weight"] = rnd(heads * hd, hidden)
        w[p + "self_attn.k_proj.weight"] = rnd(kv_heads * hd, hidden)
        w[p + "self_attn.v_proj.weight"] = rnd(kv_heads * hd, hidden)
        w[p + "self_attn.o_proj.weight"] = rnd(hidden, heads * hd)
        w[p + "self_attn.q_norm.weight"] = torch.ones(hd)
        w[p + "self_attn.k_norm.weight"] = torch.ones(hd)
        w[p + "mlp.gate_proj.weight"] = rnd(inter, hidden)
        w[p + "mlp.up_proj.weight"] = rnd(inter, hidden)
        w[p + "mlp.down_proj.weight"] = rnd(hidden, inter)
        w[p + "input_layernorm.weight"] = torch.ones(hidden)
        w[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    w["norm.weight"] = torch.ones(hidden)
    w["hidden_norm.weight"] = torch.ones(hidden)
    w["fc.weight"] = rnd(hidden, nctx * hidden)
    if aligned:
        _align_drafter(w, cfg, emb)
    return w


def _align_drafter(w: dict, cfg: dict, emb: torch.Tensor) -> None:
    """Make every block position attend (almost) only to the root token and copy its embedding.

    Context features are zeroed (fc = 0 gives zero context keys and values). In each head only the last dim of
    q and k is non-zero (the lowest RoPE frequency, so positions barely matter): q is positive for the mask
    token; k has the sign of embedding feature 0, which the aligned target sets positive for every token but
    the mask. Scores are then about +50 for the root and -50 for mask tokens. The values copy embedding
    features 1..kv_heads*head_dim of the root into the residual stream, amplified, so the output is close to
    the target's own bigram prediction lm_head(norm(emb(root))). Layers after the first are disabled.
    """
    hidden = cfg["hidden_size"]
    heads, kv_heads, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    groups = heads // kv_heads
    mask_vec = emb[MASK_TOKEN_ID]
    mask_ln = mask_vec / mask_vec.pow(2).mean().sqrt()
    w["fc.weight"].zero_()
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            w[p + f"self_attn.{name}.weight"].zero_()
        for name in ("gate_proj", "up_proj", "down_proj"):
            w[p + f"mlp.{name}.weight"].zero_()
        if i > 0:
            continue
        q_norm = torch.ones(hd)
        k_norm = torch.ones(hd)
        q_norm[-1] = 2.5
        k_norm[-1] = 2.5
        w[p + "self_attn.q_norm.weight"] = q_norm
        w[p + "self_attn.k_norm.weight"] = k_norm
        for h in range(heads):
            w[p + "self_attn.q_proj.weight"][h * hd + hd - 1] = mask_ln / hidden
        for g in range(kv_heads):
            w[p + "self_attn.k_proj.weight"][g * hd + hd - 1, 0] = 1.0
        copy_dims = min(kv_heads * hd, hidden - 1)
        for r in range(copy_dims):
            w[p + "self_attn.v_proj.weight"][r, r + 1] = 1.0
        for g in range(kv_heads):
            h = g * groups  # one query head per kv group writes back
            for j in range(hd):
                r = g * hd + j
                if r < copy_dims:
                    w[p + "self_attn.o_proj.weight"][r + 1, h * hd + j] = 10.0
