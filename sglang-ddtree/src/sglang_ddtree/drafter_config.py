"""Which DFlash drafter checkpoints DDTREE serves exactly: ONE pure check of a drafter's config (and weight names).

z-lab's ``dflash`` package (``DFlashDraftModel``, ``dflash/model.py`` of dflash 0.1.0) is the definition. A field
is either honoured the way z-lab honours it, or the checkpoint is refused with a message naming the field:

* ``architectures`` must hold ``DFlashDraftModel``; a DFlash2 checkpoint (``DFlash2DraftModel``, or its
  ``conv_kernel_size``/``conv_group_size``/``selector_rank``/``selector_top_k`` fields, or its
  ``candidate_selector.*`` / ``*.attention_conv.*`` / ``*.mlp_conv.*`` weights) is refused: DDTREE does not
  build trees over DFlash2's candidate selector yet;
* ``target_layer_ids`` (``dflash_config`` first, then top level, as z-lab's ``_draft_value``); without it,
  z-lab's default from ``num_target_layers``; with neither the checkpoint is refused (no invented ids);
* the layer shapes (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
  ``head_dim``, ``intermediate_size``) must be present: transformers' ``Qwen3Config`` would otherwise fill in
  defaults (head_dim 128, 32 kv heads, ...) that silently differ from ``hidden_size // heads``;
* ``block_size`` (>= 2) and ``mask_token_id`` must be present;
* per layer attention, as z-lab's ``Qwen3DFlashAttention``: the layer type comes from ``layer_types`` or, when
  absent, from ``use_sliding_window``/``sliding_window``/``max_window_layers`` (transformers' ``Qwen3Config``:
  layer i slides iff the window is on and i >= max_window_layers); a layer is causal iff ``is_causal`` is
  true, or ``is_causal`` is unset and the layer slides; a sliding layer sees keys with
  ``q_pos - k_pos < sliding_window`` (and, when not causal, ``k_pos - q_pos < sliding_window``);
* ``input_embedding_scale`` multiplies the block embeddings, ``output_multiplier`` the draft logits, and
  ``final_logit_softcapping`` (when > 0) caps them: ``tanh(x / c) * c``.

The ``"reference"`` consumer (the reference drafter) honours all of the above. The ``"sglang"`` consumer (the
DDTREE plugin in SGLang) refuses what its verified path does not apply: the plugin's tree logits are
``hidden @ lm_head`` (no multiplier, no softcap), SGLang's DFLASH does not read the drafter's
``input_embedding_scale``, and causal or sliding drafter layers are not verified against the reference.

Only the standard library is used, so a preflight can run it without torch.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CONSUMERS",
    "DFLASH2_MESSAGE",
    "DrafterConfigError",
    "DrafterSpec",
    "check_drafter_config",
    "check_drafter_dir",
    "check_drafter_weights",
    "default_target_layer_ids",
    "draft_value",
    "expected_weight_shapes",
    "read_safetensors_shapes",
    "resolve_drafter_config",
]

#: Who serves the drafter: the reference drafter, or the DDTREE plugin inside SGLang.
CONSUMERS = ("reference", "sglang")

DFLASH2_MESSAGE = (
    "DDTREE does not support DFlash2 drafters yet (a tree over DFlash2's candidate selector is future work); "
    "serve this drafter with SGLang's DFLASH, or use a DFlash (v1) DFlashDraftModel checkpoint"
)
_DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
_DFLASH2_WEIGHT_MARKERS = ("candidate_selector.", ".attention_conv.", ".mlp_conv.")
#: Fields of DFlash variants that SGLang knows but z-lab's DFlashDraftModel does not (refused when set).
_VARIANT_FIELDS = (
    "projector_type",
    "attention_sink_bias",
    "attention_value_scale",
    "shift_label",
    "pure_draft_prefix_len",
    "gru_hidden_dim",
    "emb_dim",
)
_SHAPE_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
)
_LAYER_TYPES = ("full_attention", "sliding_attention")


class DrafterConfigError(ValueError):
    """A drafter checkpoint DDTREE cannot serve exactly; ``problems`` lists every reason (each names a field)."""

    def __init__(self, problems: Sequence[str], where: str = "") -> None:
        self.problems = list(problems)
        prefix = f"{where}: " if where else ""
        super().__init__(prefix + "; ".join(self.problems))


@dataclass(frozen=True)
class DrafterSpec:
    """The resolved drafter configuration (every field the reference drafter uses)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    attention_bias: bool
    block_size: int
    mask_token_id: int
    mask_token: str
    target_layer_ids: tuple[int, ...]
    layer_types: tuple[str, ...]
    causal: tuple[bool, ...]
    sliding_window: int | None
    input_embedding_scale: float
    output_multiplier: float
    final_logit_softcapping: float | None


def draft_value(config: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """z-lab's ``_draft_value``: ``dflash_config[name]`` if the key is there, else ``config[name]``, else default."""
    dflash = config.get("dflash_config") or {}
    if isinstance(dflash, Mapping) and name in dflash:
        return dflash[name]
    return config.get(name, default)


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's ``build_target_layer_ids``: the target layers used when ``target_layer_ids`` is absent."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [round(start + (i * span) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _resolve(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Resolved fields and the problems found (empty when the reference drafter can serve it exactly)."""
    problems: list[str] = []
    out: dict[str, Any] = {}
    archs = config.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    archs = list(archs)
    if any("DFlash2" in str(a) for a in archs):
        problems.append(f"architectures={archs!r}: {DFLASH2_MESSAGE}")
    elif "DFlashDraftModel" not in archs:
        problems.append(f"architectures={archs!r} is not a DFlash drafter; expected ['DFlashDraftModel']")
    for name in _DFLASH2_FIELDS:
        value = draft_value(config, name)
        if value:
            problems.append(f"{name}={value!r} marks a DFlash2 drafter: {DFLASH2_MESSAGE}")
    for name in _VARIANT_FIELDS:
        value = draft_value(config, name)
        if value:
            problems.append(
                f"{name}={value!r} belongs to a DFlash variant that z-lab's DFlashDraftModel does not define; "
                "DDTREE supports plain DFlash (v1) drafters only"
            )

    for name in _SHAPE_FIELDS:
        value = config.get(name)
        if value is None:
            problems.append(
                f"missing required field {name!r} (transformers' Qwen3Config would substitute its own default, "
                "which need not match the weights); write it into config.json"
            )
        elif not _is_int(value) or value < 1:
            problems.append(f"{name}={value!r} is invalid: expected an int >= 1")
        else:
            out[name] = value
    heads, kv_heads = out.get("num_attention_heads"), out.get("num_key_value_heads")
    if heads and kv_heads and heads % kv_heads:
        problems.append(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        problems.append(f"hidden_act={act!r} is not supported; DFlash drafters use 'silu'")
    eps = _as_float(config.get("rms_norm_eps", 1e-6))
    if eps is None or eps <= 0:
        problems.append(f"rms_norm_eps={config.get('rms_norm_eps')!r} is invalid: expected a number > 0")
    out["rms_norm_eps"] = eps
    out["attention_bias"] = bool(config.get("attention_bias", False))

    block = draft_value(config, "block_size")
    if block is None:
        problems.append("no block_size (dflash_config.block_size or block_size); the draft depth comes from it")
    elif not _is_int(block) or block < 2:
        problems.append(f"block_size={block!r} is invalid: need an int >= 2 in dflash_config")
    else:
        out["block_size"] = block
    mask_id = draft_value(config, "mask_token_id")
    if mask_id is None:
        problems.append("no mask_token_id (dflash_config.mask_token_id); the block's mask token must be named")
    elif not _is_int(mask_id) or mask_id < 0:
        problems.append(f"mask_token_id={mask_id!r} is invalid: expected an int >= 0")
    else:
        out["mask_token_id"] = mask_id
    out["mask_token"] = str(draft_value(config, "mask_token", "<|MASK|>"))

    _resolve_target_layers(config, out, problems)
    _resolve_attention(config, out, problems)

    for name in ("input_embedding_scale", "output_multiplier"):
        raw = draft_value(config, name, 1.0)
        value = _as_float(raw)
        if value is None:
            problems.append(f"{name}={raw!r} is invalid: expected a finite number")
        out[name] = value
    raw = draft_value(config, "final_logit_softcapping")
    cap = None if raw is None else _as_float(raw)
    if raw is not None and cap is None:
        problems.append(f"final_logit_softcapping={raw!r} is invalid: expected a finite number or null")
    out["final_logit_softcapping"] = cap if cap is not None and cap > 0 else None
    return out, problems


def _resolve_target_layers(config: Mapping[str, Any], out: dict[str, Any], problems: list[str]) -> None:
    ids = draft_value(config, "target_layer_ids")
    num_target = draft_value(config, "num_target_layers")
    if num_target is not None and (not _is_int(num_target) or num_target < 1):
        problems.append(f"num_target_layers={num_target!r} is invalid: expected an int >= 1")
        num_target = None
    if ids is None:
        if draft_value(config, "num_target_layers") is None:
            problems.append(
                "neither dflash_config.target_layer_ids nor num_target_layers is set: the target layers the "
                "drafter was trained on are unknown (refusing to guess them); add dflash_config.target_layer_ids"
            )
            return
        if num_target is None or "num_hidden_layers" not in out:
            return
        ids = default_target_layer_ids(num_target, out["num_hidden_layers"])
    if not isinstance(ids, (list, tuple)) or not ids or not all(_is_int(i) and i >= 0 for i in ids):
        problems.append(f"target_layer_ids={ids!r} is invalid: expected a non-empty list of ints >= 0")
        return
    if num_target is not None and max(ids) >= num_target:
        problems.append(f"target_layer_ids={list(ids)!r} has ids >= num_target_layers={num_target}")
        return
    out["target_layer_ids"] = tuple(int(i) for i in ids)


def _resolve_attention(config: Mapping[str, Any], out: dict[str, Any], problems: list[str]) -> None:
    layers = out.get("num_hidden_layers")
    if layers is None:
        return
    use_sliding = config.get("use_sliding_window", False)
    window = config.get("sliding_window") if use_sliding else None
    if use_sliding and (not _is_int(window) or window < 1):
        problems.append(
            f"use_sliding_window is true but sliding_window={config.get('sliding_window')!r}: expected an int >= 1"
        )
        return
    types = config.get("layer_types")
    if types is None:
        if use_sliding:
            max_window = config.get("max_window_layers")
            if not _is_int(max_window) or max_window < 0:
                problems.append(
                    f"use_sliding_window is true but max_window_layers={max_window!r}: the sliding layers "
                    "(i >= max_window_layers) cannot be derived; set max_window_layers or layer_types"
                )
                return
            types = ["sliding_attention" if i >= max_window else "full_attention" for i in range(layers)]
        else:
            types = ["full_attention"] * layers
    if isinstance(types, str) or not isinstance(types, (list, tuple)) or len(types) != layers:
        problems.append(f"layer_types={types!r} must list one entry per drafter layer ({layers})")
        return
    bad = [t for t in types if t not in _LAYER_TYPES]
    if bad:
        problems.append(f"layer_types={list(types)!r}: {bad[0]!r} is not one of {list(_LAYER_TYPES)}")
        return
    if "sliding_attention" in types and window is None:
        problems.append(
            f"layer_types={list(types)!r} has sliding_attention layers but use_sliding_window is not true (so "
            "transformers sets sliding_window to None); set use_sliding_window and sliding_window"
        )
        return
    is_causal = config.get("is_causal")
    if is_causal is not None and not isinstance(is_causal, bool):
        problems.append(f"is_causal={is_causal!r} is invalid: expected true, false or null")
        return
    out["layer_types"] = tuple(types)
    out["causal"] = tuple(bool(is_causal) if is_causal is not None else t == "sliding_attention" for t in types)
    out["sliding_window"] = window if "sliding_attention" in types else None


def _consumer_problems(out: Mapping[str, Any], consumer: str) -> list[str]:
    if consumer == "reference":
        return []
    problems = []
    for name in ("input_embedding_scale", "output_multiplier"):
        if out.get(name) not in (None, 1.0):
            problems.append(
                f"{name}={out[name]!r}: DDTREE in SGLang does not apply it (its tree logits are hidden @ lm_head "
                "and SGLang's DFLASH ignores the drafter's input_embedding_scale); only 1.0 is supported"
            )
    if out.get("final_logit_softcapping") is not None:
        problems.append(
            f"final_logit_softcapping={out['final_logit_softcapping']!r}: DDTREE in SGLang does not cap the draft "
            "logits; only null or 0 is supported"
        )
    if any(out.get("causal", ())):
        problems.append(
            f"is_causal={out.get('causal')!r} (per layer): causal drafter attention is not verified for DDTREE in "
            "SGLang; only bidirectional full-attention drafter layers are supported"
        )
    if "sliding_attention" in out.get("layer_types", ()):
        problems.append(
            f"layer_types={list(out['layer_types'])!r}: sliding-window drafter layers are not verified for DDTREE "
            "in SGLang; only full_attention drafter layers are supported"
        )
    return problems


def check_drafter_config(config: Mapping[str, Any], consumer: str = "reference") -> list[str]:
    """Every reason why ``consumer`` cannot serve this DFlash drafter config exactly; [] when it can.

    Args:
        config: the drafter's config.json as a dict (or ``PretrainedConfig.to_dict()``).
        consumer: ``"reference"`` (the reference drafter) or ``"sglang"`` (the DDTREE plugin in SGLang).
    """
    if consumer not in CONSUMERS:
        raise ValueError(f"consumer={consumer!r} is invalid: expected one of {list(CONSUMERS)}")
    out, problems = _resolve(config)
    return problems + (_consumer_problems(out, consumer) if not problems else [])


def resolve_drafter_config(config: Mapping[str, Any], where: str = "") -> DrafterSpec:
    """The resolved :class:`DrafterSpec` for the reference drafter; raises :class:`DrafterConfigError`."""
    out, problems = _resolve(config)
    if problems:
        raise DrafterConfigError(problems, where)
    return DrafterSpec(**out)


def expected_weight_shapes(spec: DrafterSpec) -> dict[str, tuple[int, ...]]:
    """Weight name -> shape of a DFlash (v1) drafter (no ``model.`` prefix, no embedding, no lm_head)."""
    hidden, hd, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    q_out, kv_out = spec.num_attention_heads * hd, spec.num_key_value_heads * hd
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(spec.num_hidden_layers):
        p = f"layers.{i}."
        for name, shape in (
            ("self_attn.q_proj", (q_out, hidden)),
            ("self_attn.k_proj", (kv_out, hidden)),
            ("self_attn.v_proj", (kv_out, hidden)),
            ("self_attn.o_proj", (hidden, q_out)),
        ):
            shapes[p + name + ".weight"] = shape
            if spec.attention_bias:
                shapes[p + name + ".bias"] = (shape[0],)
        shapes[p + "self_attn.q_norm.weight"] = (hd,)
        shapes[p + "self_attn.k_norm.weight"] = (hd,)
        shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
    shapes["norm.weight"] = (hidden,)
    shapes["hidden_norm.weight"] = (hidden,)
    shapes["fc.weight"] = (hidden, len(spec.target_layer_ids) * hidden)
    return shapes


def check_drafter_weights(spec: DrafterSpec, shapes: Mapping[str, Sequence[int]]) -> list[str]:
    """Problems of a checkpoint's weights (name -> shape; a leading ``model.`` is accepted); [] when exact."""
    got = {name.removeprefix("model."): tuple(int(d) for d in shape) for name, shape in shapes.items()}
    want = expected_weight_shapes(spec)
    problems = []
    dflash2 = sorted(n for n in got if any(m in "." + n for m in _DFLASH2_WEIGHT_MARKERS))
    if dflash2:
        problems.append(f"DFlash2 weights {dflash2[:4]} ({len(dflash2)} in all): {DFLASH2_MESSAGE}")
    extra = sorted(n for n in set(got) - set(want) if n not in dflash2)
    if extra:
        problems.append(
            f"unexpected weights {extra[:8]} ({len(extra)} in all): the DFlash drafter does not use them; a "
            "checkpoint with weights the drafter would drop is refused"
        )
    missing = sorted(set(want) - set(got))
    if missing:
        problems.append(f"the checkpoint lacks weights {missing[:8]} ({len(missing)} in all)")
    for name in sorted(set(want) & set(got)):
        if got[name] != want[name]:
            problems.append(f"weight {name!r} has shape {got[name]}, expected {want[name]}")
    return problems


def read_safetensors_shapes(files: Iterable[str | Path]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from the headers of ``*.safetensors`` files (no tensor data is read)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        with open(f, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, meta in header.items():
            if name != "__metadata__":
                shapes[name] = tuple(int(d) for d in meta["shape"])
    return shapes


def check_drafter_dir(path: str | Path, consumer: str = "reference") -> dict[str, Any]:
    """Check a drafter checkpoint directory (config.json, and the weight names when *.safetensors exist).

    Returns ``{"path", "consumer", "ok", "problems", "weights_checked", "spec"}`` (``spec`` when resolvable).
    """
    path = Path(path)
    report: dict[str, Any] = {"path": str(path), "consumer": consumer, "ok": False, "problems": []}
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        report["problems"] = [f"{str(path)!r} has no config.json; pass a DFlash checkpoint directory"]
        return report
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        report["problems"] = [f"{cfg_path}: not readable JSON ({exc})"]
        return report
    problems = check_drafter_config(config, consumer)
    files = sorted(path.glob("*.safetensors"))
    report["weights_checked"] = bool(files)
    try:
        spec = resolve_drafter_config(config)
    except DrafterConfigError:
        spec = None
    if spec is not None:
        report["spec"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec.__dict__.items()}
        if files:
            problems += check_drafter_weights(spec, read_safetensors_shapes(files))
    report["problems"] = problems
    report["ok"] = not problems
    return report
