#!/usr/bin/env bash
# Builds .device/sglang-0.5.17-py312.tar.xz: SGLang 0.5.17 and the packages the lent H200's image lacks
# (it has torch 2.11.0+cu130, Python 3.12, no network), installed flat with --target and trimmed
# (no FA3 library, no sm100 kernels, no Rust server extensions), so one device call can carry it.
# The GPU scripts unpack it with `tar -xJf .device/sglang-*.tar.xz -C /tmp/site` and PYTHONPATH=/tmp/site.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.device
mkdir -p "$out/wheels"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_34_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_35_x86_64
      --platform any)
pkgs=(sglang==0.5.17 sglang-kernel==0.4.5 flashinfer-python==0.6.15.post1 transformers==5.12.1 tokenizers==0.22.2
      xgrammar==0.2.1 apache-tvm-ffi==0.1.11 pydantic pydantic-core annotated-types typing-inspection
      fastapi==0.165.0 opentelemetry-api starlette uvicorn python-multipart sniffio orjson msgspec pyzmq pybase64
      setproctitle partial-json-parser openai==2.6.1 httpx jiter h11 httpcore anyio compressed-tensors gguf dill distro loguru ipython traitlets
      soundfile cffi jsonschema referencing rpds-py jsonschema-specifications interegular outlines-core
      llguidance blobfile jiter importlib-metadata decorator jedi parso pexpect ptyprocess prompt-toolkit
      wcwidth stack-data executing asttokens pure-eval matplotlib-inline ipython-pygments-lexers
      watchfiles sentencepiece einops pycparser)
[ -n "${SKIP_DOWNLOAD:-}" ] || python3 -m pip download -q --no-deps "${plat[@]}" -d "$out/wheels" "${pkgs[@]}" 2>&1 | grep -v "is ignored" || true
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$out"/wheels/*.whl \
  --python-version 3.12 --implementation cp --abi cp312 --only-binary=:all: 2>&1 | grep -v "is ignored" || true
rm -rf "$site"/sgl_kernel/flash_ops*.so "$site"/sgl_kernel/sm100 "$site"/sgl_kernel/infllm_ops*.so "$site"/sgl_kernel/flashmla_ops*.so \
       "$site"/xgrammar/lib/libxgrammar.a "$site"/sglang/multimodal_gen "${site:?}"/bin
find "$site" -name '_core*.so' -path '*sglang*' -delete
find "$site" -name '__pycache__' -prune -exec rm -rf {} +
tar -C "$site" -cJf "$out/sglang-0.5.17-py312.tar.xz" .
du -sh "$site" "$out/sglang-0.5.17-py312.tar.xz"
rm -rf "$site"
