# Private module_utils for specdec.pivot: will a target model (+ drafter) and its KV cache fit on the GPUs?
"""Estimate whether an SGLang server fits on the chosen GPUs: weights, KV cache, linear-attention state.

Pure functions over plain data (config dicts, byte counts, GPU dicts from ``_nvidia``), tested with tables;
the only I/O is :func:`read_model_dir` (config.json, the safetensors index, file sizes).

The estimate follows SGLang's static memory split (``--mem-fraction-static``, SGLang 0.5.23's
``KVCacheConfigurator._profile_available_bytes`` and ``pool_configurator``):

* SGLang measures the GPU memory free when the server starts (``available``; on an idle GPU that is the
  total minus the CUDA context) and keeps ``mem_fraction * available`` for static allocations, the model
  weights (target and drafter) plus the KV pool. The rest, ``(1 - mem_fraction) * available``, is left for
  activations and CUDA graphs.
* ``budget = mem_fraction * available``; ``rest = budget - weights_per_gpu - draft_weights_per_gpu``.
* Hybrid models (Qwen3.5/3.6 GatedDeltaNet, Qwen3-Next): linear-attention layers keep a fixed-size state per
  request, not per token (SGLang's ``_handle_max_mamba_cache``, see :func:`_state_reservation`). SGLang gives that
  state pool ``rest * r / (1 + r)`` with ``r`` = ``mamba_full_memory_ratio`` (default 0.9), unless
  ``max_mamba_cache_size`` fixes the number of slots, or ``disable_radix_cache`` with ``max_running_requests`` does:
  then the state is a fixed ``(slots + 1) * per_request``, plus ``(slots + 1) * per_request *
  speculative_num_draft_tokens`` with speculative decoding, however little is left for the KV cache.
* ``kv_tokens_fit = (rest - linear_state) // kv_bytes_per_token`` on every selected GPU (the smallest wins),
  where ``kv_bytes_per_token`` counts only layers with a per-token KV cache (full attention; sliding-window
  layers are counted as full, an upper bound) of the target plus every layer of the drafter (DFLASH keeps
  its own draft KV pool of the same token capacity).
* ``fits`` when ``kv_tokens_fit >= context_length`` (room for at least one request of full length).
* TP > 1 (SGLang 0.5.17/0.5.23 ``distributed/bootstrap.py``: ``measure_pre_model_load_memory`` and
  ``_check_tp_memory_balance``): every rank measures its free memory, the group takes the MINIMUM over the ranks
  (``pre_model_load_memory``) and sizes every rank's static budget from it; a rank whose own free memory is more
  than 1/0.9 of that minimum makes SGLang refuse to start ("The memory capacity is unbalanced"), unless the
  unit sets ``SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=false`` (then it only warns). A foreign process on one GPU
  of the group therefore stops the server even when the budget would still hold the model.

It is an ESTIMATE: norms and (when ``tp_size`` > KV heads) K/V projections are replicated rather than
sharded, SGLang versions differ in details, and CUDA graphs, NCCL buffers and the allocator can take more
than the slack. Use it to refuse plans that cannot work, not to promise that one will.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

GIB = 1 << 30
MIB = 1 << 20

# bytes per element; "fp8" names the 1-byte float formats SGLang accepts for weights (--quantization fp8)
# and the KV cache (--kv-cache-dtype fp8_e4m3 / fp8_e5m2).
DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "fp4_e2m1": 0.5,
    "float64": 8,
}
DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32", "fp8")
KV_CACHE_DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2")
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9
#: The max_running_requests SGLang's speculative algorithms (DFLASH, EAGLE, NGRAM, ... in 0.5.17 and 0.5.23's
#: arg_groups/speculative_hook.py) and sglang-ddtree's DDTREE set when the command line leaves it unset.
SPEC_DEFAULT_MAX_RUNNING_REQUESTS = 48


class FitInputError(ValueError):
    """Bad input for the planner; the message names the option, the bad value and the fix."""

    def __init__(self, option: str, value, fix: str):
        self.option = option
        self.value = value
        super().__init__(f"{option}={value!r}: {fix}")


@dataclass
class ModelFiles:
    """What :func:`read_model_dir` found in a model directory."""

    path: str
    config: dict
    index: dict | None = None
    safetensors_bytes: int | None = None
    safetensors_files: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------- I/O


def read_model_dir(path: str, option: str) -> ModelFiles:
    """Read ``config.json``, ``model.safetensors.index.json`` (if any) and the sizes of ``*.safetensors``.

    ``option`` names the option the path came from, for the error messages.
    """
    if not path or not os.path.isdir(path):
        raise FitInputError(option, path, "not a directory; give the local model directory (the one with config.json)")
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise FitInputError(
            option, path, "has no config.json; point it at the model directory itself (a Hugging Face snapshot)"
        )
    try:
        with open(config_path, encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError) as err:
        raise FitInputError(option, path, f"config.json cannot be read as JSON ({err})") from err
    if not isinstance(config, dict):
        raise FitInputError(option, path, "config.json is not a JSON object")
    problem = config_problem(config)
    if problem:
        raise FitInputError(option, path, f"config.json {problem}; fix the model's config.json (or the path)")
    index = None
    index_path = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        try:
            with open(index_path, encoding="utf-8") as fh:
                index = json.load(fh)
        except (OSError, ValueError) as err:
            raise FitInputError(option, path, f"model.safetensors.index.json cannot be read ({err})") from err
    if index is not None:
        total = (index.get("metadata") or {}).get("total_size") if isinstance(index, dict) else None
        if not isinstance(index, dict) or (total is not None and not _sane_number(total, MAX_WEIGHTS_BYTES)):
            raise FitInputError(
                option,
                path,
                f"model.safetensors.index.json has no sane metadata.total_size (got {total!r}: a number of bytes "
                f"from 1 to {MAX_WEIGHTS_BYTES}); fix or remove the index",
            )
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    size = sum(os.path.getsize(os.path.join(path, f)) for f in files) if files else None
    return ModelFiles(path=path, config=config, index=index, safetensors_bytes=size, safetensors_files=files)


#: The largest config integer taken for a model dimension (heads, sizes, layers); larger is a broken config.
MAX_CONFIG_INT = 1 << 24
#: The largest checkpoint size taken (1 PiB).
MAX_WEIGHTS_BYTES = 1 << 50
#: config.json integers the planner reads: each, when present, must be an integer in [minimum, MAX_CONFIG_INT].
CONFIG_INTS = {
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": 1,
    "v_head_dim": 1,
    "hidden_size": 1,
    "kv_lora_rank": 0,
    "qk_rope_head_dim": 0,
    "full_attention_interval": 1,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 1,
    "linear_key_head_dim": 1,
    "linear_value_head_dim": 1,
    "linear_conv_kernel_dim": 1,
}
#: config.json dtype names the planner reads: each, when present, must be one of DTYPE_BYTES.
CONFIG_DTYPES = ("torch_dtype", "dtype", "mamba_ssm_dtype")


def _sane_number(value, maximum: float) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= maximum
    )


def config_problem(config: dict) -> str | None:
    """What makes a model's config.json unusable for the planner (checked for the top level and its
    ``text_config``), or None: a dimension that is not an integer in range (a bool, a float, a string, negative,
    absurdly large), a dtype name SGLang does not have, ``layer_types`` that is not a list of names."""
    scopes = [("", config)]
    if "text_config" in config:
        if not isinstance(config["text_config"], dict):
            return f"has a text_config that is not an object (got {type(config['text_config']).__name__})"
        scopes.append(("text_config.", config["text_config"]))
    for prefix, scope in scopes:
        for key, minimum in CONFIG_INTS.items():
            value = scope.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_CONFIG_INT:
                return (
                    f"has {prefix}{key}={value!r}, not an integer from {minimum} to {MAX_CONFIG_INT}"
                )
        for key in CONFIG_DTYPES:
            value = scope.get(key)
            if value is not None and str(value) not in DTYPE_BYTES:
                return f"has {prefix}{key}={value!r}, not a dtype name ({', '.join(sorted(DTYPE_BYTES))})"
        types = scope.get("layer_types")
        if types is not None and (not isinstance(types, list) or not all(isinstance(t, str) for t in types)):
            return f"has {prefix}layer_types={str(types)[:80]!r}, not a list of layer type names"
    return None


# --------------------------------------------------------------------------------------------- config


def text_config(config: dict) -> dict:
    """The language model's config: ``text_config`` (multimodal wrappers such as Qwen3_5ForConditionalGeneration)
    overlaid on the top level, else the top level itself."""
    inner = config.get("text_config")
    if isinstance(inner, dict):
        return {**{k: v for k, v in config.items() if k != "text_config"}, **inner}
    return config


def checkpoint_dtype(config: dict) -> str | None:
    tc = text_config(config)
    value = tc.get("torch_dtype") or tc.get("dtype")
    return str(value) if value else None


def layer_kinds(tc: dict) -> dict:
    """Which layers keep a per-token KV cache.

    Returns ``{"full": [...], "linear": [...], "sliding": [...], "source": str}`` with layer indices.
    ``layer_types`` (Hugging Face) wins; else ``full_attention_interval`` (Qwen3-Next/3.5: layer ``i`` is full
    attention when ``(i + 1) % interval == 0``, as SGLang's config does); else every layer is full attention.
    """
    n = tc.get("num_hidden_layers")
    if not isinstance(n, int) or n <= 0:
        raise ValueError(f"config has no positive num_hidden_layers (got {n!r})")
    types = tc.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != n:
            raise ValueError(f"layer_types has {len(types)} entries but num_hidden_layers is {n}")
        source = "layer_types"
    elif isinstance(tc.get("full_attention_interval"), int) and tc["full_attention_interval"] > 0:
        k = tc["full_attention_interval"]
        types = ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(n)]
        source = f"full_attention_interval={k}"
    else:
        types = ["full_attention"] * n
        source = "all layers (no layer_types / full_attention_interval)"
    out: dict = {"full": [], "linear": [], "sliding": [], "source": source}
    for i, kind in enumerate(types):
        kind = str(kind)
        if kind in ("linear_attention", "mamba", "gated_delta_net", "linear"):
            out["linear"].append(i)
        elif "sliding" in kind:
            out["sliding"].append(i)
        else:
            out["full"].append(i)
    return out


def _int(tc: dict, key: str, label: str) -> int:
    value = tc.get(key)
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{label} config.json has no positive integer {key} (got {value!r})")
    return value


def attention_geometry(tc: dict, label: str) -> dict:
    heads = _int(tc, "num_attention_heads", label)
    kv_heads = tc.get("num_key_value_heads") or heads
    head_dim = tc.get("head_dim") or (_int(tc, "hidden_size", label) // heads)
    geo = {"heads": heads, "kv_heads": int(kv_heads), "head_dim": int(head_dim), "v_head_dim": int(head_dim)}
    if tc.get("kv_lora_rank"):  # MLA (DeepSeek): one latent vector per token and layer, not split by TP
        geo["mla_dim"] = int(tc["kv_lora_rank"]) + int(tc.get("qk_rope_head_dim") or 0)
    if tc.get("v_head_dim") and not geo.get("mla_dim"):
        geo["v_head_dim"] = int(tc["v_head_dim"])
    return geo


def check_tp(tc: dict, tp_size: int, label: str) -> None:
    """Raise :class:`FitInputError` (option tp_size) when the model's heads cannot be split ``tp_size`` ways."""
    geo = attention_geometry(tc, label)
    if geo["heads"] % tp_size:
        raise FitInputError(
            "tp_size",
            tp_size,
            f"does not divide num_attention_heads={geo['heads']} of the {label}; choose a tp_size that divides it "
            f"(e.g. {', '.join(str(d) for d in _divisors(geo['heads'])[:6])})",
        )
    kv = geo["kv_heads"]
    if "mla_dim" not in geo and kv % tp_size and tp_size % kv:
        raise FitInputError(
            "tp_size",
            tp_size,
            f"and num_key_value_heads={kv} of the {label} do not divide one another; SGLang needs one to divide the "
            "other (KV heads are split, or replicated when tp_size is larger)",
        )
    kinds = layer_kinds(tc)
    if kinds["linear"]:
        for key in ("linear_num_value_heads", "linear_num_key_heads"):
            value = tc.get(key)
            if isinstance(value, int) and value % tp_size:
                raise FitInputError(
                    "tp_size", tp_size, f"does not divide {key}={value} of the {label}'s linear-attention layers"
                )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def kv_heads_per_gpu(kv_heads: int, tp_size: int) -> int:
    """SGLang's ``get_num_kv_heads``: split across TP ranks, at least one (replicated) per rank."""
    return max(1, kv_heads // tp_size)


def kv_bytes_per_token(tc: dict, layers: int, tp_size: int, kv_elem_bytes: float, label: str = "model") -> int:
    """Bytes of KV cache one token takes on one GPU for ``layers`` attention layers."""
    if layers <= 0:
        return 0
    geo = attention_geometry(tc, label)
    if "mla_dim" in geo:
        return math.ceil(geo["mla_dim"] * layers * kv_elem_bytes)
    n = kv_heads_per_gpu(geo["kv_heads"], tp_size)
    return math.ceil(n * (geo["head_dim"] + geo["v_head_dim"]) * layers * kv_elem_bytes)


def linear_state_bytes_per_request(tc: dict, layers: int, tp_size: int) -> int:
    """Per-request state of GatedDeltaNet layers on one GPU (SGLang's Mamba2StateShape for Qwen3-Next/3.5):
    a conv state ``(key_dim * 2 + value_dim) / tp x (kernel - 1)`` in bfloat16 and an SSM state
    ``(num_value_heads / tp) x value_head_dim x key_head_dim`` in ``mamba_ssm_dtype`` (default float32)."""
    if layers <= 0:
        return 0
    nk = tc.get("linear_num_key_heads")
    nv = tc.get("linear_num_value_heads")
    dk = tc.get("linear_key_head_dim")
    dv = tc.get("linear_value_head_dim")
    kernel = tc.get("linear_conv_kernel_dim") or 4
    if not all(isinstance(v, int) and v > 0 for v in (nk, nv, dk, dv)):
        raise ValueError(
            "config has linear-attention layers but not linear_num_key_heads / linear_num_value_heads / "
            "linear_key_head_dim / linear_value_head_dim"
        )
    ssm_bytes = DTYPE_BYTES.get(str(tc.get("mamba_ssm_dtype") or "float32"), 4)
    conv_dim = nv * dv + 2 * nk * dk
    conv = (conv_dim // tp_size) * (kernel - 1) * 2
    ssm = (nv // tp_size) * dv * dk * ssm_bytes
    return int((conv + ssm) * layers)


def weights_bytes(files: ModelFiles) -> tuple[int, str]:
    """Checkpoint bytes: the index's ``metadata.total_size``, else the sum of ``*.safetensors`` file sizes."""
    if files.index:
        total = (files.index.get("metadata") or {}).get("total_size")
        if isinstance(total, (int, float)) and total > 0:
            return int(total), "model.safetensors.index.json metadata.total_size"
    if files.safetensors_bytes:
        return int(files.safetensors_bytes), f"size of {len(files.safetensors_files)} *.safetensors file(s)"
    raise ValueError(
        f"{files.path} has neither model.safetensors.index.json with metadata.total_size nor *.safetensors files"
    )


def loaded_weights_bytes(files: ModelFiles, dtype: str) -> tuple[int, str]:
    """Bytes the weights take once loaded with ``dtype`` (``auto`` = as stored). A checkpoint that is already
    quantized (``quantization_config``) is taken as stored."""
    stored, source = weights_bytes(files)
    tc = text_config(files.config)
    if dtype == "auto" or tc.get("quantization_config") or files.config.get("quantization_config"):
        return stored, source
    ckpt = checkpoint_dtype(files.config) or "bfloat16"
    ckpt_bytes = DTYPE_BYTES.get(ckpt)
    want = DTYPE_BYTES[dtype]
    if not ckpt_bytes or ckpt_bytes == want:
        return stored, source
    return int(stored * want / ckpt_bytes), f"{source}, converted {ckpt} -> {dtype}"


# --------------------------------------------------------------------------------------------- options


def validate_options(opts: dict) -> None:
    """Raise :class:`FitInputError` for the first bad option value (ranges the argument spec cannot express)."""
    mf = opts.get("mem_fraction")
    if mf is None or not (0 < float(mf) < 1):
        raise FitInputError(
            "mem_fraction", mf, "must be between 0 and 1 (exclusive), SGLang's --mem-fraction-static, e.g. 0.85"
        )
    tp = opts.get("tp_size")
    if not isinstance(tp, int) or tp < 1:
        raise FitInputError("tp_size", tp, "must be a positive integer (the number of GPUs one server spans)")
    cl = opts.get("context_length")
    if not isinstance(cl, int) or cl < 1:
        raise FitInputError("context_length", cl, "must be a positive number of tokens (SGLang's --context-length)")
    for name in ("max_running_requests", "max_mamba_cache_size", "speculative_num_draft_tokens"):
        value = opts.get(name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise FitInputError(name, value, "must be a positive integer or left unset")
    drc = opts.get("disable_radix_cache")
    if drc is not None and not isinstance(drc, bool):
        raise FitInputError(
            "disable_radix_cache",
            drc,
            "must be true or false (true when the server runs with --disable-radix-cache), or left unset",
        )
    if mf is not None and not math.isfinite(float(mf)):
        raise FitInputError("mem_fraction", mf, "must be a finite number between 0 and 1, e.g. 0.85")
    r = opts.get("mamba_full_memory_ratio")
    if r is not None and (not math.isfinite(float(r)) or float(r) <= 0 or float(r) > 1e6):
        raise FitInputError("mamba_full_memory_ratio", r, "must be a positive finite number (SGLang's default is 0.9)")
    dtype = opts.get("dtype", "auto")
    if dtype not in DTYPE_CHOICES:
        raise FitInputError("dtype", dtype, f"choose one of {', '.join(DTYPE_CHOICES)}")
    kvd = opts.get("kv_cache_dtype", "auto")
    if kvd not in KV_CACHE_DTYPE_CHOICES:
        raise FitInputError("kv_cache_dtype", kvd, f"choose one of {', '.join(KV_CACHE_DTYPE_CHOICES)}")


def select_gpus(gpus: list[dict], gpu_indices: list[int] | None, tp_size: int) -> list[dict]:
    """The GPUs the server will use: ``gpu_indices`` (one per TP rank) or, when unset, the first ``tp_size``."""
    by_index = {g["index"]: g for g in gpus}
    present = sorted(by_index)
    if gpu_indices is None:
        if len(gpus) < tp_size:
            raise FitInputError(
                "tp_size", tp_size, f"needs {tp_size} GPUs but this host has {len(gpus)} (indices {present})"
            )
        return sorted(gpus, key=lambda g: g["index"])[:tp_size]
    if len(set(gpu_indices)) != len(gpu_indices):
        raise FitInputError("gpu_indices", gpu_indices, "lists a GPU twice; give each GPU once")
    missing = [i for i in gpu_indices if i not in by_index]
    if missing:
        raise FitInputError(
            "gpu_indices", gpu_indices, f"GPU(s) {missing} are not present on this host; present are {present}"
        )
    if len(gpu_indices) != tp_size:
        raise FitInputError(
            "gpu_indices", gpu_indices, f"has {len(gpu_indices)} GPU(s) but tp_size is {tp_size}; give one per TP rank"
        )
    return [by_index[i] for i in gpu_indices]


# --------------------------------------------------------------------------------------------- planner


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _holders(gpu: dict, exclude: set[int]) -> str:
    procs = [p for p in gpu.get("compute_processes", []) if p.get("pid") not in exclude]
    if not procs:
        return "no compute process is listed (the memory may belong to processes in another container or PID namespace)"
    procs = sorted(procs, key=lambda p: -(p.get("used_mib") or 0))
    parts = [
        f"pid {p['pid']} ({p.get('name') or '?'}, {p['used_mib'] if p.get('used_mib') is not None else '?'} MiB)"
        for p in procs
    ]
    return "held by " + ", ".join(parts)


def _model_summary(files: ModelFiles, label: str, tp_size: int, dtype: str, kv_elem: float) -> dict:
    tc = text_config(files.config)
    check_tp(tc, tp_size, label)
    kinds = layer_kinds(tc)
    total, source = loaded_weights_bytes(files, dtype)
    kv_layers = len(kinds["full"]) + len(kinds["sliding"])
    return {
        "tc": tc,
        "kinds": kinds,
        "weights_total": total,
        "weights_source": source,
        "kv_per_token": kv_bytes_per_token(tc, kv_layers, tp_size, kv_elem, label),
        "state_per_request": linear_state_bytes_per_request(tc, len(kinds["linear"]), tp_size),
    }


def plan_fit(
    target: ModelFiles,
    draft: ModelFiles | None,
    gpus: list[dict],
    *,
    tp_size: int,
    mem_fraction: float,
    context_length: int,
    dtype: str = "auto",
    kv_cache_dtype: str = "auto",
    max_running_requests: int | None = None,
    max_mamba_cache_size: int | None = None,
    mamba_full_memory_ratio: float | None = None,
    speculative_num_draft_tokens: int | None = None,
    assume_freed_pids: list[int] | None = None,
    tp_memory_balance_check: bool = True,
    disable_radix_cache: bool | None = None,
) -> dict:
    """The fit estimate for ``gpus`` (the selected GPUs, one per TP rank). See the module docstring."""
    validate_options(
        {
            "mem_fraction": mem_fraction,
            "tp_size": tp_size,
            "context_length": context_length,
            "dtype": dtype,
            "kv_cache_dtype": kv_cache_dtype,
            "max_running_requests": max_running_requests,
            "max_mamba_cache_size": max_mamba_cache_size,
            "mamba_full_memory_ratio": mamba_full_memory_ratio,
            "speculative_num_draft_tokens": speculative_num_draft_tokens,
            "disable_radix_cache": disable_radix_cache,
        }
    )
    if len(gpus) != tp_size:
        raise FitInputError("gpu_indices", [g["index"] for g in gpus], f"must select exactly tp_size={tp_size} GPUs")
    ratio = DEFAULT_MAMBA_FULL_MEMORY_RATIO if mamba_full_memory_ratio is None else float(mamba_full_memory_ratio)
    freed = set(assume_freed_pids or [])

    if kv_cache_dtype == "auto":
        kv_dtype_name = dtype if dtype != "auto" else (checkpoint_dtype(target.config) or "bfloat16")
    else:
        kv_dtype_name = kv_cache_dtype
    kv_elem = DTYPE_BYTES.get(kv_dtype_name, 2)

    notes: list[str] = []
    t = _model_summary(target, "target model", tp_size, dtype, kv_elem)
    d = _model_summary(draft, "draft model", tp_size, dtype, kv_elem) if draft is not None else None
    if t["kinds"]["sliding"]:
        notes.append(f"{len(t['kinds']['sliding'])} sliding-window layer(s) counted as full attention (upper bound)")
    if d is not None:
        n_target = d["tc"].get("num_target_layers")
        if isinstance(n_target, int) and n_target != t["tc"].get("num_hidden_layers"):
            notes.append(
                f"draft model was built for a target with {n_target} layers; the target has "
                f"{t['tc'].get('num_hidden_layers')}"
            )
        if d["tc"].get("hidden_size") != t["tc"].get("hidden_size"):
            notes.append(
                f"draft hidden_size {d['tc'].get('hidden_size')} differs from the target's {t['tc'].get('hidden_size')}"
            )

    weights_per_gpu = math.ceil(t["weights_total"] / tp_size)
    draft_total = d["weights_total"] if d else 0
    draft_per_gpu = math.ceil(draft_total / tp_size)
    kv_target = t["kv_per_token"]
    kv_draft = d["kv_per_token"] if d else 0
    kv_per_token = kv_target + kv_draft
    state_per_req = t["state_per_request"]
    draft_tokens = speculative_num_draft_tokens
    if draft_tokens is None and d is not None:
        dcfg = d["tc"].get("dflash_config") or {}
        draft_tokens = dcfg.get("block_size") or d["tc"].get("block_size")
    spec_tokens = int(draft_tokens or 0)
    # SGLang's speculative algorithms fill in max_running_requests before the memory pool is sized
    running = max_running_requests
    if running is None and spec_tokens:
        running = SPEC_DEFAULT_MAX_RUNNING_REQUESTS

    measured = []
    for gpu in gpus:
        total_b = int(gpu["memory_total_mib"] or 0) * MIB
        free_b = int(gpu["memory_free_mib"] or 0) * MIB
        released = sum((p.get("used_mib") or 0) for p in gpu.get("compute_processes", []) if p.get("pid") in freed)
        available = min(free_b + released * MIB, total_b) if total_b else free_b + released * MIB
        measured.append((gpu, total_b, free_b, available))
    balance = tp_balance([(g["index"], a) for g, _t, _f, a in measured], tp_size, tp_memory_balance_check)
    per_gpu = []
    for gpu, total_b, free_b, own_available in measured:
        # SGLang sizes every rank from the group's minimum free memory (pre_model_load_memory)
        available = balance["min_available_bytes"] if tp_size > 1 else own_available
        per_gpu.append(
            _gpu_fit(
                gpu,
                available,
                total_b,
                free_b,
                mem_fraction,
                weights_per_gpu,
                draft_per_gpu,
                kv_per_token,
                state_per_req,
                spec_tokens,
                ratio,
                max_mamba_cache_size,
                running,
                bool(disable_radix_cache),
            )
        )
    tightest = min(per_gpu, key=lambda g: g["kv_tokens"])
    kv_tokens_fit = tightest["kv_tokens"]
    fits = kv_tokens_fit >= context_length and all(g["state_ok"] for g in per_gpu)
    if max_mamba_cache_size is not None:
        state_words = f"max_mamba_cache_size {max_mamba_cache_size}"
    else:
        state_words = f"disable_radix_cache with max_running_requests {running}"
    if spec_tokens:
        state_words += f", one more state per request for each of {spec_tokens} draft tokens"
    reason = _reason(per_gpu, fits, kv_tokens_fit, context_length, mem_fraction, freed, tp_size, state_words)
    if not balance["ok"]:
        fits = False
        reason = _balance_reason(balance, measured, freed, tp_size) + (
            "" if reason.startswith("fits") else " | also " + reason
        )

    return {
        "weights_bytes_total": t["weights_total"],
        "weights_bytes_per_gpu": weights_per_gpu,
        "weights_source": t["weights_source"],
        "draft_bytes": draft_total,
        "draft_bytes_per_gpu": draft_per_gpu,
        "draft_source": d["weights_source"] if d else None,
        "kv_cache_dtype_used": kv_dtype_name,
        "kv_bytes_per_token": kv_per_token,
        "target_kv_bytes_per_token": kv_target,
        "draft_kv_bytes_per_token": kv_draft,
        "full_attention_layers": len(t["kinds"]["full"]) + len(t["kinds"]["sliding"]),
        "linear_attention_layers": len(t["kinds"]["linear"]),
        "layer_types_source": t["kinds"]["source"],
        "draft_layers": (len(d["kinds"]["full"]) + len(d["kinds"]["sliding"])) if d else 0,
        "linear_state_bytes_per_request": state_per_req,
        "linear_state_bytes_per_gpu": tightest["linear_state_bytes"],
        "linear_state_slots": tightest["linear_state_slots"],
        "linear_state_rule": tightest["linear_state_rule"],
        "max_running_requests": running,
        "max_mamba_cache_size": max_mamba_cache_size,
        "mamba_full_memory_ratio": ratio,
        "disable_radix_cache": bool(disable_radix_cache),
        "speculative_num_draft_tokens": spec_tokens or None,
        "kv_tokens_fit": kv_tokens_fit,
        "min_kv_tokens_needed": context_length,
        "budget_bytes_per_gpu": [g["budget_bytes"] for g in per_gpu],
        "free_bytes_per_gpu": [g["free_bytes"] for g in per_gpu],
        "available_bytes_per_gpu": [g["available_bytes"] for g in per_gpu],
        "gpu_indices": [g["index"] for g in per_gpu],
        "per_gpu": [{k: v for k, v in g.items() if k not in ("state_ok", "gpu")} for g in per_gpu],
        "tp_size": tp_size,
        "mem_fraction": mem_fraction,
        "tp_memory_balance": balance,
        "fits": fits,
        "reason": reason,
        "notes": notes,
        "estimate": True,
    }


#: SGLang's _check_tp_memory_balance: the group's minimum free memory must be >= this x a rank's own.
TP_BALANCE_RATIO = 0.9


def tp_balance(available: list[tuple[int, int]], tp_size: int, enabled: bool = True) -> dict:
    """SGLang's TP memory-balance check over ``[(gpu index, available bytes)]`` of one TP group.

    ``ok`` is False when the check is enabled, ``tp_size > 1`` and the smallest available memory is below
    :data:`TP_BALANCE_RATIO` x the largest (the rank with the most free memory raises). With the check disabled
    (``SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=false``) SGLang only warns: ``ok`` stays True, ``warning`` says so.
    """
    values = [a for _i, a in available] or [0]
    lo, hi = min(values), max(values)
    threshold = int(TP_BALANCE_RATIO * hi)
    unbalanced = tp_size > 1 and lo < threshold
    return {
        "checked": tp_size > 1,
        "enabled": bool(enabled),
        "ok": not (unbalanced and enabled),
        "unbalanced": unbalanced,
        "min_available_bytes": lo,
        "max_available_bytes": hi,
        "threshold_bytes": threshold,
        "min_gpu": next((i for i, a in available if a == lo), None),
        "max_gpu": next((i for i, a in available if a == hi), None),
        "warning": (
            "the TP group's free memory is unbalanced; SGLang's balance check is off, so it only warns and sizes "
            f"every rank from the smallest ({_gib(lo)})"
        )
        if unbalanced and not enabled
        else None,
    }


def _balance_reason(balance: dict, measured: list, freed: set, tp_size: int) -> str:
    lo_gpu = balance["min_gpu"]
    short = [g for g, t, _f, a in measured if a < balance["threshold_bytes"]]
    held = "; ".join(
        f"GPU {g['index']}: {_gib(t - a)} of {_gib(t)} in use, {_holders(g, freed)}"
        for g, t, _f, a in measured
        if g in short
    )
    return (
        f"does not fit (SGLang's start-up rules): at tp_size {tp_size} SGLang refuses to start - its TP "
        f"memory-balance check needs every GPU of the group to have at least {TP_BALANCE_RATIO} x the free memory "
        f"of the freest one, but GPU {lo_gpu} has {_gib(balance['min_available_bytes'])} available and GPU "
        f"{balance['max_gpu']} {_gib(balance['max_available_bytes'])} (needs >= {_gib(balance['threshold_bytes'])}); "
        f"{held}. Stop those processes, serve on other GPUs (CUDA_VISIBLE_DEVICES / --base-gpu-id), or set "
        "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=false in the unit (SGLang then only warns and sizes every rank "
        "from the smallest)"
    )


#: Which of SGLang's three ways sized the linear-attention state (RV ``linear_state_rule``).
STATE_RULES = ("max_mamba_cache_size", "disable_radix_cache", "mamba_full_memory_ratio")


def _state_reservation(
    rest: int,
    state_per_req: int,
    spec_tokens: int,
    ratio: float,
    max_mamba_cache_size: int | None,
    max_running_requests: int | None,
    disable_radix_cache: bool = False,
) -> tuple[int, int, str | None]:
    """(bytes reserved for linear-attention state, request slots it holds, which rule of :data:`STATE_RULES`) on
    one GPU; ``(0, 0, None)`` for a model without linear-attention layers.

    SGLang's ``KVCacheConfigurator._handle_max_mamba_cache`` (mem_cache/kv_cache_configurator.py, the same three
    branches in 0.5.17 and 0.5.23; the first that applies wins). ``per_req`` is the state of one request, ``D`` the
    speculative draft tokens (0 without speculative decoding), and every pool has one padding slot (the ``+ 1``):

    1. ``--max-mamba-cache-size K``: K slots, ``(K + 1) * per_req``; with speculative decoding also the verify's
       intermediate state ``per_req * (min(max_running_requests, K // m) + 1) * D``, where ``m`` is
       ``_calculate_mamba_ratio()``: 1 with ``--disable-radix-cache``, else 3 by default (other values with the
       mamba extra buffer or ``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK``). Modelled with ``m = 1``: exact with
       ``--disable-radix-cache``, an upper bound otherwise.
    2. ``--disable-radix-cache`` with ``max_running_requests`` set (the unit's ``--max-running-requests``, or the 48
       the speculative algorithms set when it is unset: :data:`SPEC_DEFAULT_MAX_RUNNING_REQUESTS`):
       ``max_running_requests`` slots, ``(slots + 1) * per_req``, and with speculative decoding the intermediate
       state ``per_req * (slots + 1) * D`` besides. Neither is bounded by ``mamba_full_memory_ratio``: with many
       verify tokens the state alone can take all that the weights leave (SGLang then stops with "Loaded weights
       leave no GPU memory for the KV cache"). 0.5.23 takes ``max(1, max_running_requests // attn_dp_size)``
       slots, 0.5.17 ``max_running_requests // attn_dp_size`` (0 when attention DP is wider, and then "Not enough
       GPU memory for hybrid (mamba/linear-attention) state cache"), and likewise in branch 1's ``min``; with
       ``attn_dp_size`` 1, as planned here, and ``max_running_requests >= 1`` both give ``max_running_requests``.
    3. Otherwise the ratio budget ``rest * r / (1 + r)`` (``r`` = ``mamba_full_memory_ratio``), which SGLang splits
       into slots and (with speculative decoding) their verify state; the whole budget is counted as reserved (an
       upper bound: SGLang leaves the part its capped intermediate state does not use to the KV cache).

    Not modelled (both releases, or 0.5.23 only where said): ReplaySSM (``--enable-linear-replayssm-spec``: no
    intermediate state, a ring per request instead), the extra per-slot bytes of the mamba extra buffer, a PD
    prefill server (0.5.23: no intermediate state), a draft state fused into the slots (0.5.23), pipeline
    parallelism (each stage keeps its own layers' share).
    """
    if state_per_req <= 0:
        return 0, 0, None
    if max_mamba_cache_size is not None:
        slots = max_mamba_cache_size
        reserved = (slots + 1) * state_per_req
        if spec_tokens:
            capped = min(max_running_requests or slots, slots)
            reserved += state_per_req * (capped + 1) * spec_tokens
        return reserved, slots, "max_mamba_cache_size"
    if disable_radix_cache and max_running_requests is not None:
        slots = max(1, max_running_requests)
        reserved = (slots + 1) * state_per_req + state_per_req * (slots + 1) * spec_tokens
        return reserved, slots, "disable_radix_cache"
    budget = int(max(rest, 0) * ratio / (1 + ratio))
    per_slot = state_per_req * (1 + spec_tokens)
    slots = max((budget - per_slot) // per_slot, 0) if spec_tokens else max(budget // state_per_req - 1, 0)
    return budget, int(slots), "mamba_full_memory_ratio"


def _gpu_fit(
    gpu,
    available,
    total_b,
    free_b,
    mem_fraction,
    weights,
    draft,
    kv_per_token,
    state_per_req,
    spec_tokens,
    ratio,
    max_mamba_cache_size,
    max_running_requests,
    disable_radix_cache,
) -> dict:
    budget = int(mem_fraction * available)
    rest = budget - weights - draft
    state, slots, rule = _state_reservation(
        rest, state_per_req, spec_tokens, ratio, max_mamba_cache_size, max_running_requests, disable_radix_cache
    )
    kv_room = rest - state
    kv_tokens = max(kv_room // kv_per_token, 0) if kv_per_token and kv_room > 0 else 0
    if not kv_per_token and kv_room > 0:
        kv_tokens = 2**62  # no per-token KV at all (a pure linear-attention model)
    idle_budget = int(mem_fraction * total_b) if total_b else budget
    idle_rest = idle_budget - weights - draft
    idle_state = _state_reservation(
        idle_rest, state_per_req, spec_tokens, ratio, max_mamba_cache_size, max_running_requests, disable_radix_cache
    )[0]
    idle_tokens = max((idle_rest - idle_state) // kv_per_token, 0) if kv_per_token else 0
    return {
        "index": gpu["index"],
        "uuid": gpu.get("uuid"),
        "total_bytes": total_b,
        "free_bytes": free_b,
        "available_bytes": available,
        "budget_bytes": budget,
        "weights_bytes": weights,
        "draft_bytes": draft,
        "rest_bytes": rest,
        "linear_state_bytes": state,
        "linear_state_slots": slots,
        "linear_state_rule": rule,
        "kv_tokens": int(kv_tokens),
        "kv_tokens_if_idle": int(idle_tokens),
        "state_ok": state_per_req <= 0 or (rest > 0 and slots >= 1),
        "gpu": gpu,
    }


def _either(options: list[str]) -> str:
    return options[0] if len(options) == 1 else ", ".join(options[:-1]) + ", or " + options[-1]


def _reason(per_gpu, fits, kv_tokens_fit, context_length, mem_fraction, freed, tp_size, state_words="") -> str:
    if fits:
        return (
            f"fits (estimate): room for {kv_tokens_fit:,} KV tokens >= context_length {context_length:,} on every "
            f"selected GPU ({', '.join(str(g['index']) for g in per_gpu)})"
        )
    problems = []
    for g in per_gpu:
        if g["kv_tokens"] >= context_length and g["state_ok"]:
            continue
        rule = g["linear_state_rule"]
        fixed_state = rule in STATE_RULES[:2]  # a number of slots, not a share of what is left
        no_kv_room = g["rest_bytes"] > 0 and g["linear_state_bytes"] >= g["rest_bytes"]
        i = g["index"]
        in_use = g["total_bytes"] - g["available_bytes"]
        occupied = g["total_bytes"] and in_use > 0.05 * g["total_bytes"]
        held = _holders(g["gpu"], freed) if occupied else ""
        head = (
            f"GPU {i}: budget {_gib(g['budget_bytes'])} "
            f"(mem_fraction {mem_fraction} x {_gib(g['available_bytes'])} available"
            + (f"; {_gib(in_use)} of {_gib(g['total_bytes'])} in use, {held}" if occupied else "")
            + ")"
        )
        state = f"{_gib(g['linear_state_bytes'])} of linear-attention state for {g['linear_state_slots']} request slots"
        if g["rest_bytes"] <= 0:
            what = (
                f"the weights alone ({_gib(g['weights_bytes'])} target"
                + (f" + {_gib(g['draft_bytes'])} drafter" if g["draft_bytes"] else "")
                + f" per GPU at tp_size {tp_size}) exceed it"
            )
        elif not g["state_ok"]:
            what = "no room for the linear-attention state of even one request"
        elif fixed_state and no_kv_room:
            what = (
                f"SGLang reserves {state} ({state_words}), more than the {_gib(g['rest_bytes'])} the weights leave: "
                'no KV cache at all (SGLang stops with "Loaded weights leave no GPU memory for the KV cache")'
            )
        else:
            what = f"room for {g['kv_tokens']:,} KV tokens, context_length needs {context_length:,}"
            if fixed_state:
                what += f" (after {state}: {state_words})"
        if occupied and g["kv_tokens_if_idle"] >= context_length:
            fix = (
                "it would fit on an idle GPU: stop those processes first (or list them in assume_freed_pids if the "
                "pivot stops them before the server starts)"
            )
        elif g["rest_bytes"] <= 0:
            fix = "raise mem_fraction or tp_size, or load the weights in fp8 (dtype fp8)"
        elif fixed_state:
            options = [
                ("lower max_mamba_cache_size, " if rule == "max_mamba_cache_size" else "lower ")
                + "max_running_requests or speculative_num_draft_tokens (the server's "
                + ("--max-mamba-cache-size, " if rule == "max_mamba_cache_size" else "")
                + "--max-running-requests, --speculative-num-draft-tokens)"
            ]
            if rule == "disable_radix_cache":
                options.append(
                    "drop --disable-radix-cache (disable_radix_cache false: SGLang then sizes the state from "
                    "mamba_full_memory_ratio)"
                )
            options.append("raise mem_fraction or tp_size")
            if not no_kv_room:
                options += ["lower context_length", "use an fp8 KV cache (kv_cache_dtype fp8)"]
            fix = _either(options)
        else:
            fix = "raise mem_fraction or tp_size, lower context_length, or use an fp8 KV cache (kv_cache_dtype fp8)"
        problems.append(f"{head}: {what}; {fix}")
    return "does not fit (estimate): " + " | ".join(problems)
