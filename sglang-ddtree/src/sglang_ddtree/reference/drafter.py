"""A DFlash block-diffusion drafter (z-lab DFlash checkpoint format) as a plain torch module.

Semantics follow SGLang's ``sglang/srt/models/dflash.py`` (``DFlashDraftModel``) and z-lab/dflash:

* context features: for every committed token, the target's hidden states after the layers in
  ``dflash_config.target_layer_ids`` (Hugging Face ``hidden_states[i + 1]``) are concatenated and projected,
  ``ctx = hidden_norm(fc(concat))``; each draft layer turns ``ctx`` into keys/values with its own k/v
  projections, ``k_norm`` and RoPE at the token's position (no input layernorm on the context);
* one block: the root (last verified) token followed by ``block_size - 1`` mask tokens, embedded with the
  TARGET's embedding, at positions ``start .. start + block_size - 1``; the block attends, without a causal
  mask, to all context keys and to the whole block;
* draft logits: the TARGET's lm_head applied to the final-normed hidden states at block positions 1..D.

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

__all__ = ["DFlashDrafter", "DrafterCache", "default_target_layer_ids", "load_drafter_config"]


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default choice of target layers when ``target_layer_ids`` is absent."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [round(start + (i * span) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def load_drafter_config(path: str | Path) -> dict[str, Any]:
    """Read and validate a DFlash drafter's config.json; raises ValueError naming the bad field."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"drafter directory {str(path)!r} has no config.json; pass a DFlash checkpoint directory")
    cfg = json.loads(cfg_path.read_text())
    archs = cfg.get("architectures") or []
    if not any("DFlash" in a for a in archs):
        raise ValueError(
            f"{cfg_path}: architectures={archs!r} is not a DFlash drafter; expected e.g. ['DFlashDraftModel']"
        )
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads"):
        if key not in cfg:
            raise ValueError(f"{cfg_path}: missing required field {key!r}")
    return cfg


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
    """Per-layer keys/values of the committed context (after k_norm and RoPE): [B, kv_heads, T, head_dim]."""

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[2]) if self.keys else 0


class _Attention(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden = int(cfg["hidden_size"])
        self.num_heads = int(cfg["num_attention_heads"])
        self.num_kv_heads = int(cfg.get("num_key_value_heads", self.num_heads))
        self.head_dim = int(cfg.get("head_dim") or hidden // self.num_heads)
        bias = bool(cfg.get("attention_bias", False))
        eps = float(cfg.get("rms_norm_eps", 1e-6))
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
        probs = torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(bsz, length, self.num_heads * self.head_dim)
        return self.o_proj(out)


class _MLP(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden, inter = int(cfg["hidden_size"]), int(cfg["intermediate_size"])
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"drafter hidden_act={act!r} is not supported by the reference drafter; only 'silu'")
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        eps = float(cfg.get("rms_norm_eps", 1e-6))
        hidden = int(cfg["hidden_size"])
        self.input_layernorm = _RMSNorm(hidden, eps)
        self.self_attn = _Attention(cfg)
        self.post_attention_layernorm = _RMSNorm(hidden, eps)
        self.mlp = _MLP(cfg)


class DFlashDrafter(nn.Module):
    """The DFlash draft network. Embeddings and lm_head are borrowed from the target at call sites."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = dict(config)
        cfg = self.config
        dflash = dict(cfg.get("dflash_config") or {})
        layer_types = cfg.get("layer_types")
        if layer_types and any(t != "full_attention" for t in layer_types):
            raise ValueError(
                f"drafter layer_types={layer_types!r}: the reference drafter supports only 'full_attention' layers"
            )
        self.num_layers = int(cfg["num_hidden_layers"])
        hidden = int(cfg["hidden_size"])
        eps = float(cfg.get("rms_norm_eps", 1e-6))
        block_size = dflash.get("block_size", cfg.get("block_size"))
        if block_size is None or int(block_size) < 2:
            raise ValueError(f"drafter block_size={block_size!r} is invalid: need an int >= 2 in dflash_config")
        self.block_size = int(block_size)
        layer_ids = dflash.get("target_layer_ids", cfg.get("target_layer_ids"))
        if layer_ids is None:
            num_target = int(dflash.get("num_target_layers", cfg.get("num_target_layers", self.num_layers)))
            layer_ids = default_target_layer_ids(num_target, self.num_layers)
        self.target_layer_ids = [int(i) for i in layer_ids]
        mask_id = dflash.get("mask_token_id", cfg.get("mask_token_id"))
        self.mask_token_id = None if mask_id is None else int(mask_id)
        self.mask_token = dflash.get("mask_token", "<|MASK|>")
        self.layers = nn.ModuleList([_Layer(cfg) for _ in range(self.num_layers)])
        self.norm = _RMSNorm(hidden, eps)
        self.hidden_norm = _RMSNorm(hidden, eps)
        self.fc = nn.Linear(len(self.target_layer_ids) * hidden, hidden, bias=False)
        head_dim = int(cfg.get("head_dim") or hidden // int(cfg["num_attention_heads"]))
        self._rope = _make_rope(cfg, head_dim)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
    ) -> DFlashDrafter:
        """Load a z-lab DFlash checkpoint directory (config.json + *.safetensors)."""
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
                    state[name.removeprefix("model.")] = fh.get_tensor(name)
        own = dict(model.named_parameters())
        missing = sorted(set(own) - set(state))
        if missing:
            raise ValueError(f"drafter checkpoint {str(path)!r} lacks weights {missing[:5]}")
        with torch.no_grad():
            for name, param in own.items():
                if tuple(state[name].shape) != tuple(param.shape):
                    raise ValueError(
                        f"drafter weight {name!r} has shape {tuple(state[name].shape)}, expected {tuple(param.shape)}"
                    )
                param.copy_(state[name])
        if dtype is None:
            dtype = _config_dtype(cfg)
        return model.to(device=device, dtype=dtype).eval()

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
        ctx = None
        ctx_rope = None
        if ctx_features is not None and ctx_features.shape[1] > 0:
            if ctx_positions is None:
                raise ValueError("ctx_positions is required with ctx_features")
            ctx = self.hidden_norm(self.fc(ctx_features.to(dtype)))
            ctx_rope = self._rope(ctx_positions, dtype)
        for idx, layer in enumerate(self.layers):
            x = layer.input_layernorm(h)
            h = h + layer.self_attn(x, rope, ctx, ctx_rope, cache, idx)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
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
