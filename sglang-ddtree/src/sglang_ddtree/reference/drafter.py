"""A DFlash block-diffusion drafter (z-lab DFlash checkpoint format) as a plain torch module.

Semantics follow z-lab's ``dflash`` package (``DFlashDraftModel`` in ``dflash/model.py``, dflash 0.1.0; a CI test
loads the same weights into both and compares logits) and SGLang's ``sglang/srt/models/dflash.py``:

* context features: for every committed token, the target's hidden states after the layers in
  ``dflash_config.target_layer_ids`` (Hugging Face ``hidden_states[i + 1]``) are concatenated and projected,
  ``ctx = hidden_norm(fc(concat))``; each draft layer turns ``ctx`` into keys/values with its own k/v
  projections, ``k_norm`` and RoPE at the token's position (no input layernorm on the context);
* one block: the root (last verified) token followed by ``block_size - 1`` mask tokens, embedded with the
  TARGET's embedding matrix times ``input_embedding_scale``, at positions ``start .. start + block_size - 1``;
  the block attends to all context keys and to the whole block (without a mask unless the config makes a layer
  causal or sliding, see :mod:`sglang_ddtree.drafter_config`);
* draft logits (:meth:`DFlashDrafter.compute_logits`): the TARGET's lm_head applied to the final-normed hidden
  states at block positions 1..D, times ``output_multiplier``, soft-capped by ``final_logit_softcapping``.

Which checkpoints load is decided by :func:`sglang_ddtree.drafter_config.check_drafter_config` (config) and
:func:`~sglang_ddtree.drafter_config.check_drafter_weights` (weights): DFlash2 checkpoints, extra or missing
weights and configs without target layers are refused with a message naming the field.

Weight names (as SGLang loads them): ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
``layers.{i}.self_attn.{q,k}_norm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``,
``layers.{i}.{input,post_attention}_layernorm.weight``, ``norm.weight``, ``hidden_norm.weight``,
``fc.weight`` [hidden, len(target_layer_ids) * hidden]; a leading ``model.`` is accepted. No embedding and no
lm_head (they are the target's).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..drafter_config import (
    DrafterConfigError,
    DrafterSpec,
    check_drafter_config,
    check_drafter_weights,
    default_target_layer_ids,
    resolve_drafter_config,
)

__all__ = ["DFlashDrafter", "DrafterCache", "attention_visibility", "default_target_layer_ids", "load_drafter_config"]


def load_drafter_config(path: str | Path) -> dict[str, Any]:
    """Read a DFlash drafter's config.json; raises ValueError (DrafterConfigError) naming every bad field."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"drafter directory {str(path)!r} has no config.json; pass a DFlash checkpoint directory")
    cfg = json.loads(cfg_path.read_text())
    problems = check_drafter_config(cfg, "reference")
    if problems:
        raise DrafterConfigError(problems, str(cfg_path))
    return cfg


def attention_visibility(
    q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, sliding_window: int | None
) -> torch.Tensor | None:
    """Which keys each block query sees (z-lab's ``_attention_mask``), or None when it sees all of them.

    Args:
        q_pos: int [B, L] positions of the block queries; k_pos: int [B, K] positions of the keys (context then
            block). z-lab compares cache indices, which equal positions when the context starts at position 0.

    Returns:
        bool [B, 1, L, K]: causal keeps ``k <= q``; a window keeps ``q - k < W`` (and ``k - q < W`` when not
        causal).
    """
    if not causal and sliding_window is None:
        return None
    q = q_pos[:, None, :, None]
    k = k_pos[:, None, None, :]
    visible = torch.ones(torch.broadcast_shapes(q.shape, k.shape), dtype=torch.bool, device=q_pos.device)
    if causal:
        visible &= k <= q
    if sliding_window is not None:
        visible &= q - k < sliding_window
        if not causal:
            visible &= k - q < sliding_window
    return visible


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.to(torch.promote_types(dtype, torch.float32))
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [B, H, L, hd]; cos/sin [B, L, hd]
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]


@dataclass
class DrafterCache:
    """Per-layer keys/values of the committed context (after k_norm and RoPE): [B, kv_heads, T, head_dim], and
    their positions, int [B, T] (for causal / sliding-window drafter layers)."""

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    positions: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[2]) if self.keys else 0


class _Attention(nn.Module):
    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        hidden = spec.hidden_size
        self.num_heads = spec.num_attention_heads
        self.num_kv_heads = spec.num_key_value_heads
        self.head_dim = spec.head_dim
        bias = spec.attention_bias
        eps = spec.rms_norm_eps
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = _RMSNorm(self.head_dim, eps)
        self.k_norm = _RMSNorm(self.head_dim, eps)

    def _kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bsz, length, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(bsz, length, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(bsz, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return _apply_rope(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        ctx: torch.Tensor | None,
        ctx_rope: tuple[torch.Tensor, torch.Tensor] | None,
        cache: DrafterCache | None,
        layer_idx: int,
        visible: torch.Tensor | None = None,
    ) -> torch.Tensor:
        bsz, length, _ = x.shape
        cos, sin = rope
        q = self.q_norm(self.q_proj(x).view(bsz, length, self.num_heads, self.head_dim)).transpose(1, 2)
        q = _apply_rope(q, cos, sin)
        k_blk, v_blk = self._kv(x, cos, sin)
        keys, values = [], []
        if cache is not None and layer_idx < len(cache.keys):
            keys.append(cache.keys[layer_idx])
            values.append(cache.values[layer_idx])
        if ctx is not None and ctx.shape[1] > 0:
            assert ctx_rope is not None
            k_ctx, v_ctx = self._kv(ctx, *ctx_rope)
            keys.append(k_ctx)
            values.append(v_ctx)
            if cache is not None:
                if layer_idx < len(cache.keys):
                    cache.keys[layer_idx] = torch.cat([cache.keys[layer_idx], k_ctx], dim=2)
                    cache.values[layer_idx] = torch.cat([cache.values[layer_idx], v_ctx], dim=2)
                else:
                    cache.keys.append(k_ctx)
                    cache.values.append(v_ctx)
        keys.append(k_blk)
        values.append(v_blk)
        k = torch.cat(keys, dim=2)
        v = torch.cat(values, dim=2)
        groups = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(bsz, length, self.num_heads * self.head_dim)
        return self.o_proj(out)


class _MLP(nn.Module):
    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        hidden, inter = spec.hidden_size, spec.intermediate_size
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        self.input_layernorm = _RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = _Attention(spec)
        self.post_attention_layernorm = _RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = _MLP(spec)


class DFlashDrafter(nn.Module):
    """The DFlash draft network. Embeddings and lm_head are borrowed from the target at call sites."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = dict(config)
        spec = resolve_drafter_config(self.config)
        self.spec = spec
        self.num_layers = spec.num_hidden_layers
        self.block_size = spec.block_size
        self.target_layer_ids = list(spec.target_layer_ids)
        self.mask_token_id = spec.mask_token_id
        self.mask_token = spec.mask_token
        self.layers = nn.ModuleList([_Layer(spec) for _ in range(self.num_layers)])
        self.norm = _RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.hidden_norm = _RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.fc = nn.Linear(len(self.target_layer_ids) * spec.hidden_size, spec.hidden_size, bias=False)
        self._rope = _make_rope(self.config, spec.head_dim)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
    ) -> DFlashDrafter:
        """Load a z-lab DFlash checkpoint directory (config.json + *.safetensors); refuses what it cannot serve
        exactly (DFlash2, unexpected or missing weights, unknown target layers, ...) with a ValueError."""
        from safetensors import safe_open

        cfg = load_drafter_config(path)
        model = cls(cfg)
        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise ValueError(f"drafter directory {str(path)!r} has no *.safetensors weights")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():
                    state[name] = fh.get_tensor(name)
        problems = check_drafter_weights(model.spec, {name: tuple(t.shape) for name, t in state.items()})
        if problems:
            raise DrafterConfigError(problems, f"drafter checkpoint {str(path)!r}")
        state = {name.removeprefix("model."): t for name, t in state.items()}
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(state[name])
        if dtype is None:
            dtype = _config_dtype(cfg)
        return model.to(device=device, dtype=dtype).eval()

    def noise_embedding(self, embed_weight: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
        """[B, L, H] block embeddings: the target's embedding rows times ``input_embedding_scale`` (as z-lab).

        Args:
            embed_weight: [V, H] the target's input embedding matrix; block_ids: int [B, L].
        """
        return F.embedding(block_ids, embed_weight) * self.spec.input_embedding_scale

    def compute_logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """[..., V] draft logits of hidden states [..., H]: lm_head, ``output_multiplier``, soft-capping (z-lab)."""
        logits = lm_head(hidden) * self.spec.output_multiplier
        cap = self.spec.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def new_cache(self) -> DrafterCache:
        return DrafterCache()

    def context_features(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Concatenate the target's per-layer hidden states ([B, T, H] each, HF ``output_hidden_states``)."""
        return torch.cat([hidden_states[i + 1] for i in self.target_layer_ids], dim=-1)

    def forward(
        self,
        noise_embedding: torch.Tensor,
        positions: torch.Tensor,
        ctx_features: torch.Tensor | None = None,
        ctx_positions: torch.Tensor | None = None,
        cache: DrafterCache | None = None,
    ) -> torch.Tensor:
        """One block pass.

        Args:
            noise_embedding: [B, L, H] target embeddings of the block (root token + mask tokens).
            positions: int [B, L] positions of the block tokens.
            ctx_features: [B, C, len(target_layer_ids) * H] raw target features of context tokens not yet in
                ``cache`` (they are appended to it), or None.
            ctx_positions: int [B, C] their positions.
            cache: context keys/values (updated in place); None to use only ``ctx_features``.

        Returns:
            [B, L, H] final-normed hidden states (apply the target's lm_head to positions 1..L-1).
        """
        dtype = self.fc.weight.dtype
        h = noise_embedding.to(dtype)
        rope = self._rope(positions, dtype)
        if positions.dim() == 1:
            positions = positions[None]
        ctx = None
        ctx_rope = None
        key_pos = [] if cache is None or cache.positions is None else [cache.positions]
        if ctx_features is not None and ctx_features.shape[1] > 0:
            if ctx_positions is None:
                raise ValueError("ctx_positions is required with ctx_features")
            if ctx_positions.dim() == 1:
                ctx_positions = ctx_positions[None]
            ctx = self.hidden_norm(self.fc(ctx_features.to(dtype)))
            ctx_rope = self._rope(ctx_positions, dtype)
            key_pos.append(ctx_positions.to(positions.device))
        key_pos = torch.cat([*key_pos, positions], dim=1)
        for idx, layer in enumerate(self.layers):
            sliding = self.spec.layer_types[idx] == "sliding_attention"
            window = self.spec.sliding_window if sliding else None
            visible = attention_visibility(positions, key_pos, self.spec.causal[idx], window)
            x = layer.input_layernorm(h)
            h = h + layer.self_attn(x, rope, ctx, ctx_rope, cache, idx, visible)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        if cache is not None and ctx is not None:
            cache.positions = key_pos[:, : key_pos.shape[1] - positions.shape[1]]
        return self.norm(h)


def _config_dtype(cfg: dict[str, Any]) -> torch.dtype:
    name = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
    return getattr(torch, str(name).replace("torch.", ""), torch.float32)


class _Rope:
    """RoPE cos/sin for the drafter, built by transformers' Qwen3 rotary embedding (all rope types)."""

    def __init__(self, cfg: dict[str, Any], head_dim: int) -> None:
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        keys = (
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rope_theta",
            "rope_scaling",
            "rope_parameters",
            "max_position_embeddings",
            "partial_rotary_factor",
        )
        kwargs = {k: cfg[k] for k in keys if k in cfg and cfg[k] is not None}
        kwargs["head_dim"] = head_dim
        self.rotary = Qwen3RotaryEmbedding(Qwen3Config(**kwargs))

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        positions = positions.to(torch.long)
        if positions.dim() == 1:
            positions = positions[None]
        self.rotary.to(positions.device)
        dummy = torch.empty(0, dtype=torch.float32, device=positions.device)
        cos, sin = self.rotary(dummy, positions)
        return cos.to(dtype), sin.to(dtype)


def _make_rope(cfg: dict[str, Any], head_dim: int) -> _Rope:
    return _Rope(cfg, head_dim)
