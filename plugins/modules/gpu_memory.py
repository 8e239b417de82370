#!/usr/bin/python
# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_memory
short_description: List NVIDIA GPUs with their memory and compute processes, and estimate whether a model fits
version_added: "0.1.0"
description:
  - Reads every NVIDIA GPU of the target host - index, uuid, name, total/used/free memory in MiB, utilisation,
    and the compute processes holding memory (pid, name, MiB) - through NVML (the C(pynvml) module of
    nvidia-ml-py) when it is importable and C(nvmlInit) works, else through
    C(nvidia-smi --query-gpu=... --format=csv,noheader,nounits) and C(nvidia-smi --query-compute-apps=...).
  - C(nvidia-smi) runs with a time limit (O(timeout)); a hung C(nvidia-smi) is killed and reported.
    "No devices were found", a driver/library version mismatch, an unreachable driver and a missing
    C(nvidia-smi) each give a clear error with RV(error_kind).
  - With O(fit), also estimates whether an SGLang server for O(fit.target_model_path) (plus the drafter
    O(fit.draft_model_path)) fits on the selected GPUs with O(fit.context_length) tokens of KV cache.
  - The estimate follows SGLang's C(--mem-fraction-static) semantics. SGLang measures the memory free on each
    GPU when the server starts (RV(fit.available_bytes_per_gpu); on an idle GPU that is the total memory minus
    the CUDA context) and keeps O(fit.mem_fraction) of it for static allocations, the weights (target and
    drafter) and the KV pool; the remaining C(1 - mem_fraction) is left for activations and CUDA graphs.
  - "Formula, per selected GPU: budget = mem_fraction x available;
    rest = budget - weights_total / tp_size - draft_total / tp_size;
    kv_tokens = floor((rest - linear_state) / kv_bytes_per_token).
    RV(fit.kv_tokens_fit) is the smallest kv_tokens over the selected GPUs, and RV(fit.fits) is true when
    kv_tokens_fit >= context_length (room for one request of full length)."
  - "kv_bytes_per_token counts only layers with a per-token KV cache:
    2 x max(1, num_key_value_heads // tp_size) x head_dim x layers x bytes of O(fit.kv_cache_dtype),
    over the target's full-attention layers plus every drafter layer (DFLASH keeps its own draft KV pool).
    Hybrid linear-attention layers (Qwen3.5/3.6 GatedDeltaNet, Qwen3-Next; the C(layer_types),
    C(full_attention_interval) and C(linear_*) config keys) hold a fixed state per request instead, not per
    token; SGLang reserves rest x r / (1 + r) for that state, r being O(fit.mamba_full_memory_ratio), unless
    O(fit.max_mamba_cache_size) fixes the number of request slots, or O(fit.disable_radix_cache) with
    O(fit.max_running_requests) does."
  - "With a fixed number of slots (O(fit.max_mamba_cache_size), or O(fit.max_running_requests) under
    O(fit.disable_radix_cache)) the state is (slots + 1) x state per request, plus up to (slots + 1) x state per
    request x O(fit.speculative_num_draft_tokens) for the verify step, whatever the weights leave: when it is more
    than that, SGLang stops at start with 'Loaded weights leave no GPU memory for the KV cache'.
    RV(fit.linear_state_rule) says which rule applied (SGLang's C(_handle_max_mamba_cache), the same in SGLang 0.5.17
    and 0.5.23)."
  - Weights are the C(metadata.total_size) of C(model.safetensors.index.json), else the size of the
    C(*.safetensors) files, divided evenly by O(fit.tp_size).
  - This is an ESTIMATE. Norms (and K/V projections when O(fit.tp_size) exceeds the KV heads) are replicated
    rather than split, SGLang versions differ in details, and CUDA graphs, NCCL buffers and allocator
    fragmentation may need more than the slack. Use it to refuse a plan that cannot work.
  - Read-only. It never changes anything on the host.
author:
  - specdec.pivot maintainers (@specdec)
requirements:
  - NVIDIA driver with C(nvidia-smi) on the target host, or nvidia-ml-py (C(pynvml)) for the NVML backend
options:
  nvidia_smi:
    description:
      - The C(nvidia-smi) executable, a name looked up on PATH (and the usual sbin directories) or a path.
    type: str
    default: nvidia-smi
  timeout:
    description:
      - Seconds both C(nvidia-smi) queries together may take; then C(nvidia-smi) is killed and the task fails
        with RV(error_kind=timeout).
    type: float
    default: 15.0
  backend:
    description:
      - C(auto) uses NVML when C(pynvml) is importable and C(nvmlInit) succeeds, else C(nvidia-smi); why NVML was
        not used is returned in RV(backend_notes).
      - C(nvml) requires nvidia-ml-py on the target host; C(nvidia-smi) never tries NVML.
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  fit:
    description:
      - Estimate whether a model (and drafter) fits on the GPUs; see the description for the formula.
      - Omit it to only list the GPUs.
      - The models' C(config.json) is checked before the GPUs are asked - a dimension that is not an integer in range
        (a bool, a float, a string, negative, absurdly large), an unknown dtype name or a malformed index is an error
        naming the option and the file; so is a non-finite number option.
    type: dict
    suboptions:
      target_model_path:
        description:
          - Local directory of the target model (a Hugging Face snapshot with C(config.json) and
            C(*.safetensors) or C(model.safetensors.index.json)) on the target host.
        type: path
        required: true
      draft_model_path:
        description:
          - Local directory of the draft model (e.g. a DFlash drafter), if speculative decoding is planned.
        type: path
      tp_size:
        description:
          - Tensor-parallel size, the number of GPUs one server spans (SGLang's C(--tp-size)).
          - Must divide the model's attention heads.
        type: int
        default: 1
      gpu_indices:
        description:
          - The GPUs (nvidia-smi indices) the server will use, one per TP rank. Default the first O(fit.tp_size).
        type: list
        elements: int
      mem_fraction:
        description:
          - SGLang's C(--mem-fraction-static), between 0 and 1 (exclusive).
        type: float
        required: true
      context_length:
        description:
          - Tokens one request may hold (SGLang's C(--context-length)); the KV cache must hold at least this many.
        type: int
        required: true
      dtype:
        description:
          - Dtype the weights are loaded in. C(auto) keeps the checkpoint's; other values scale the checkpoint's
            bytes by the element size (a checkpoint with C(quantization_config) is always taken as stored).
            C(fp8) means 1-byte weights (C(--quantization fp8)).
        type: str
        choices: [auto, bfloat16, float16, float32, fp8]
        default: auto
      kv_cache_dtype:
        description:
          - SGLang's C(--kv-cache-dtype). C(auto) is the weights' dtype; the fp8 choices take 1 byte per element.
        type: str
        choices: [auto, bfloat16, float16, float32, fp8, fp8_e4m3, fp8_e5m2]
        default: auto
      max_running_requests:
        description:
          - SGLang's C(--max-running-requests); caps the speculative linear-attention state reserved with
            O(fit.max_mamba_cache_size), and with O(fit.disable_radix_cache) sets the number of state slots.
          - Unset with speculative decoding (O(fit.speculative_num_draft_tokens) or a drafter), 48, the value SGLang's
            speculative algorithms (and DDTREE) set when the command line leaves it unset.
        type: int
      speculative_num_draft_tokens:
        description:
          - Draft tokens per step; hybrid models keep that many extra state copies per request while verifying.
            Default the drafter's block size (C(dflash_config.block_size) or C(block_size)) when a drafter is given.
        type: int
      max_mamba_cache_size:
        description:
          - SGLang's C(--max-mamba-cache-size), request slots of linear-attention state. Unset, SGLang gives the
            state C(rest * r / (1 + r)).
        type: int
      mamba_full_memory_ratio:
        description:
          - SGLang's C(--mamba-full-memory-ratio) C(r), state memory relative to KV memory for hybrid models.
        type: float
        default: 0.9
      disable_radix_cache:
        description:
          - V(true) when the server runs with C(--disable-radix-cache). For hybrid models SGLang then takes the number
            of linear-attention state slots from O(fit.max_running_requests) (when that is set) instead of sizing
            the state from O(fit.mamba_full_memory_ratio), and reserves it whatever is left for the KV cache.
        type: bool
        default: false
      assume_freed_pids:
        description:
          - Pids whose GPU memory counts as free because they will be stopped before the server starts (the old
            SGLang server, a training run the pivot halts). Only their listed compute memory is added back.
        type: list
        elements: int
        default: []
      tp_memory_balance_check:
        description:
          - SGLang's TP memory-balance check at start-up (C(SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK), on by
            default) - with O(fit.tp_size) > 1 SGLang refuses to start when the smallest free memory of the TP
            group is below 0.9 x the largest, and sizes every rank from the smallest. V(false) when the unit sets
            C(SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=false) (SGLang then only warns).
        type: bool
        default: true
  fail_on_no_fit:
    description:
      - Fail the task when RV(fit.fits) is false. Default C(false) - the module reports and the caller decides.
    type: bool
    default: false
extends_documentation_fragment:
  - specdec.pivot.attributes
  - specdec.pivot.attributes.read_only
attributes:
  check_mode:
    details:
      - Read-only; check mode runs the same queries and returns the same data.
notes:
  - A stand-in C(nvidia-smi) that replays recorded output (C(lab/stand-ins/nvidia-smi) in the collection's
    source tree) is what the lab and the unit tests use; on real hosts the module runs NVIDIA's tools.
  - Inside a container or another PID namespace, C(nvidia-smi) may not list processes of other namespaces;
    their memory still shows as used.
seealso:
  - module: specdec.pivot.training_process
"""

EXAMPLES = r"""
- name: List the GPUs
  specdec.pivot.gpu_memory:
  register: gpus

- name: Will Qwen3-8B with its DFlash drafter fit at TP 2 with 32k context?
  specdec.pivot.gpu_memory:
    fit:
      target_model_path: /models/Qwen3-8B
      draft_model_path: /models/Qwen3-8B-DFlash-b16
      tp_size: 2
      gpu_indices: [0, 1]
      mem_fraction: 0.85
      context_length: 32768
      kv_cache_dtype: auto
      assume_freed_pids: "{{ old_server_pids | default([]) }}"
  register: plan

- name: Refuse the pivot when it cannot fit
  ansible.builtin.assert:
    that: plan.fit.fits
    fail_msg: "{{ plan.fit.reason }}"

- name: Query with nvidia-smi only, with a short time limit
  specdec.pivot.gpu_memory:
    backend: nvidia-smi
    nvidia_smi: /usr/bin/nvidia-smi
    timeout: 5
"""

RETURN = r"""
gpus:
  description: Every GPU of the host, in index order.
  returned: success
  type: list
  elements: dict
  contains:
    index:
      description: nvidia-smi / NVML index.
      type: int
    uuid:
      description: GPU uuid (C(GPU-...)).
      type: str
    name:
      description: Product name.
      type: str
    memory_total_mib:
      description: Total memory in MiB.
      type: int
    memory_used_mib:
      description: Used memory in MiB.
      type: int
    memory_free_mib:
      description: Free memory in MiB (drivers keep some memory reserved, so used + free may be below total).
      type: int
    utilization_gpu:
      description: GPU utilisation in percent; null where the driver reports C([N/A]).
      type: int
    compute_processes:
      description: Compute processes holding memory on this GPU.
      type: list
      elements: dict
      contains:
        pid:
          description: Process id (as seen from the GPU driver's PID namespace).
          type: int
        name:
          description: Process name or path.
          type: str
        used_mib:
          description: Memory it holds in MiB; null where not reported.
          type: int
  sample:
    - index: 0
      uuid: GPU-5e2f8a41-7c3d-4b9e-a1f0-3b6d2c9e7a10
      name: NVIDIA H200
      memory_total_mib: 143771
      memory_used_mib: 8718
      memory_free_mib: 134469
      utilization_gpu: 0
      compute_processes: [{pid: 4242, name: /usr/bin/python3, used_mib: 8708}]
gpu_count:
  description: Number of GPUs.
  returned: success
  type: int
  sample: 2
backend_used:
  description: C(nvml) or C(nvidia-smi).
  returned: success
  type: str
  sample: nvidia-smi
backend_notes:
  description: Why NVML was not used when O(backend=auto) fell back to nvidia-smi.
  returned: success
  type: list
  elements: str
  sample:
    - "NVML not used: no NVIDIA GPU usable through NVML: NVML Shared Library Not Found (kind no_gpu);
      fell back to nvidia-smi"
error_kind:
  description:
    - On failure to read the GPUs, one of C(no_gpu), C(no_devices), C(driver_mismatch), C(timeout), C(other).
  returned: failure
  type: str
  sample: no_gpu
fit:
  description: The fit estimate, when O(fit) was given. Byte counts are per GPU unless named C(_total).
  returned: when O(fit) is given
  type: dict
  contains:
    tp_memory_balance:
      description:
        - SGLang's TP memory-balance check - C(checked) (tp_size > 1), C(enabled), C(ok), C(unbalanced),
          C(min_available_bytes), C(max_available_bytes), C(threshold_bytes) (0.9 x the largest), C(min_gpu),
          C(max_gpu), C(warning) (set when unbalanced with the check off).
      type: dict
    fits:
      description: Whether C(kv_tokens_fit >= context_length) on every selected GPU (and hybrid models have room
        for the state of one request).
      type: bool
    reason:
      description: Human explanation. When it does not fit, names the GPU, the budget, what is short, which
        processes hold the memory when other processes are the problem, and a fix.
      type: str
    weights_bytes_total:
      description: Target weights as loaded (all ranks together).
      type: int
    weights_bytes_per_gpu:
      description: Target weights per GPU (C(weights_bytes_total / tp_size), rounded up).
      type: int
    weights_source:
      description: Where the weights size came from.
      type: str
    draft_bytes:
      description: Drafter weights (all ranks together); 0 without a drafter.
      type: int
    draft_bytes_per_gpu:
      description: Drafter weights per GPU.
      type: int
    kv_bytes_per_token:
      description: KV cache bytes one token takes on one GPU, target plus drafter.
      type: int
    target_kv_bytes_per_token:
      description: The target's part of RV(fit.kv_bytes_per_token).
      type: int
    draft_kv_bytes_per_token:
      description: The drafter's part of RV(fit.kv_bytes_per_token).
      type: int
    kv_cache_dtype_used:
      description: The KV element type the estimate used (C(auto) resolved).
      type: str
    full_attention_layers:
      description: Target layers with a per-token KV cache.
      type: int
    linear_attention_layers:
      description: Target layers with per-request state instead (GatedDeltaNet and similar).
      type: int
    layer_types_source:
      description: Which config key decided the layer kinds.
      type: str
    linear_state_bytes_per_request:
      description: Linear-attention state of one request on one GPU (0 for dense models).
      type: int
    linear_state_bytes_per_gpu:
      description: Memory reserved for linear-attention state on the tightest GPU.
      type: int
    linear_state_slots:
      description: Request slots of linear-attention state on the tightest GPU (0 for dense models).
      type: int
    linear_state_rule:
      description:
        - How SGLang sized the linear-attention state - C(max_mamba_cache_size), C(disable_radix_cache) (slots =
          max_running_requests) or C(mamba_full_memory_ratio); null for dense models.
      type: str
    max_running_requests:
      description: The max_running_requests the estimate used (O(fit.max_running_requests), else 48 with speculative
        decoding, else null).
      type: int
    max_mamba_cache_size:
      description: O(fit.max_mamba_cache_size) as used.
      type: int
    mamba_full_memory_ratio:
      description: O(fit.mamba_full_memory_ratio) as used.
      type: float
    disable_radix_cache:
      description: O(fit.disable_radix_cache) as used.
      type: bool
    speculative_num_draft_tokens:
      description: The draft tokens per verify step the estimate used (O(fit.speculative_num_draft_tokens), else the
        drafter's block size); null without speculative decoding.
      type: int
    kv_tokens_fit:
      description: KV cache tokens that fit, the smallest over the selected GPUs.
      type: int
    min_kv_tokens_needed:
      description: The tokens needed, O(fit.context_length).
      type: int
    budget_bytes_per_gpu:
      description: C(mem_fraction * available) per selected GPU.
      type: list
      elements: int
    free_bytes_per_gpu:
      description: Free memory now, per selected GPU.
      type: list
      elements: int
    available_bytes_per_gpu:
      description: Free memory plus the memory of O(fit.assume_freed_pids), per selected GPU.
      type: list
      elements: int
    gpu_indices:
      description: The selected GPUs.
      type: list
      elements: int
    per_gpu:
      description: The numbers behind the estimate, per selected GPU.
      type: list
      elements: dict
    notes:
      description: Caveats found while estimating (sliding-window layers, drafter/target mismatch).
      type: list
      elements: str
    estimate:
      description: Always true - this is an estimate.
      type: bool
  sample:
    fits: true
    reason: "fits (estimate): room for 1,317,304 KV tokens >= context_length 32,768 on every selected GPU (0, 1)"
    weights_bytes_total: 16381470720
    weights_bytes_per_gpu: 8190735360
    draft_bytes: 2097252864
    kv_bytes_per_token: 83968
    full_attention_layers: 36
    linear_attention_layers: 0
    kv_tokens_fit: 1317304
    min_kv_tokens_needed: 32768
"""

import math

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.specdec.pivot.plugins.module_utils import _model_fit, _nvidia

FIT_SPEC = dict(
    target_model_path=dict(type="path", required=True),
    draft_model_path=dict(type="path"),
    tp_size=dict(type="int", default=1),
    gpu_indices=dict(type="list", elements="int"),
    mem_fraction=dict(type="float", required=True),
    context_length=dict(type="int", required=True),
    dtype=dict(type="str", choices=list(_model_fit.DTYPE_CHOICES), default="auto"),
    kv_cache_dtype=dict(type="str", choices=list(_model_fit.KV_CACHE_DTYPE_CHOICES), default="auto"),
    max_running_requests=dict(type="int"),
    speculative_num_draft_tokens=dict(type="int", no_log=False),
    max_mamba_cache_size=dict(type="int"),
    mamba_full_memory_ratio=dict(type="float", default=_model_fit.DEFAULT_MAMBA_FULL_MEMORY_RATIO),
    disable_radix_cache=dict(type="bool", default=False),
    assume_freed_pids=dict(type="list", elements="int", default=[]),
    tp_memory_balance_check=dict(type="bool", default=True),
)

ARGUMENT_SPEC = dict(
    nvidia_smi=dict(type="str", default="nvidia-smi"),
    timeout=dict(type="float", default=15.0),
    backend=dict(type="str", choices=list(_nvidia.BACKENDS), default="auto"),
    fit=dict(type="dict", options=FIT_SPEC),
    fail_on_no_fit=dict(type="bool", default=False),
)


def fail_input(module: AnsibleModule, err: _model_fit.FitInputError) -> None:
    module.fail_json(msg=f"fit.{err}", changed=False, option=f"fit.{err.option}")


def load_models(module: AnsibleModule, fit: dict):
    """Validate the fit options and read the model directories (before touching the GPUs)."""
    try:
        _model_fit.validate_options(fit)
        target = _model_fit.read_model_dir(fit["target_model_path"], "target_model_path")
        draft = (
            _model_fit.read_model_dir(fit["draft_model_path"], "draft_model_path") if fit["draft_model_path"] else None
        )
        _model_fit.check_tp(_model_fit.text_config(target.config), fit["tp_size"], "target model")
        if draft is not None:
            _model_fit.check_tp(_model_fit.text_config(draft.config), fit["tp_size"], "draft model")
    except _model_fit.FitInputError as err:
        fail_input(module, err)
    except ValueError as err:
        module.fail_json(msg=f"fit: {err}", changed=False)
    return target, draft


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    if not math.isfinite(params["timeout"]) or params["timeout"] <= 0:
        module.fail_json(msg=f"timeout={params['timeout']!r}: must be a positive number of seconds, e.g. 15")
    if params["backend"] == "nvml" and not _nvidia.HAS_PYNVML:
        module.fail_json(
            msg=missing_required_lib("nvidia-ml-py"), exception=str(_nvidia.PYNVML_IMPORT_ERROR), error_kind="other"
        )

    fit = params["fit"]
    models = load_models(module, fit) if fit else None

    try:
        found = _nvidia.query_gpus(
            module, nvidia_smi=params["nvidia_smi"], timeout=params["timeout"], backend=params["backend"]
        )
    except _nvidia.GpuQueryError as err:
        module.fail_json(msg=str(err), error_kind=err.kind, changed=False)

    result = dict(
        changed=False,
        gpus=found.gpus,
        gpu_count=len(found.gpus),
        backend_used=found.backend_used,
        backend_notes=found.notes,
    )
    if fit:
        target, draft = models
        try:
            selected = _model_fit.select_gpus(found.gpus, fit["gpu_indices"], fit["tp_size"])
            result["fit"] = _model_fit.plan_fit(
                target,
                draft,
                selected,
                tp_size=fit["tp_size"],
                mem_fraction=fit["mem_fraction"],
                context_length=fit["context_length"],
                dtype=fit["dtype"],
                kv_cache_dtype=fit["kv_cache_dtype"],
                max_running_requests=fit["max_running_requests"],
                max_mamba_cache_size=fit["max_mamba_cache_size"],
                mamba_full_memory_ratio=fit["mamba_full_memory_ratio"],
                speculative_num_draft_tokens=fit["speculative_num_draft_tokens"],
                assume_freed_pids=fit["assume_freed_pids"],
                tp_memory_balance_check=fit["tp_memory_balance_check"],
                disable_radix_cache=fit["disable_radix_cache"],
            )
        except _model_fit.FitInputError as err:
            module.fail_json(msg=f"fit.{err}", option=f"fit.{err.option}", **result)
        except ValueError as err:
            module.fail_json(msg=f"fit: {err}", **result)
        if params["fail_on_no_fit"] and not result["fit"]["fits"]:
            module.fail_json(msg=result["fit"]["reason"], **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
