#!/usr/bin/env bash
# sglang-ddtree core on the lent H200: the core test suite on CUDA, then bench/tree_build.py.
#
# Assumes the GPU image: torch 2.11 (CUDA) and transformers 5.17 preinstalled (with tokenizers, safetensors,
# numpy, tqdm), NO network, and does not need sglang. pytest is used from the image if importable, else
# installed offline from .device/wheels/ (carry pytest, pluggy, iniconfig and packaging wheels there).
#
#   bash bench/gpu/core_tests.sh            # from the repository root; results under $OUT (default /tmp/sglang-ddtree-core)
#   DEVICE=cpu BENCH_ARGS="--small --device cpu" bash bench/gpu/core_tests.sh   # smoke run without a GPU
#   STAGE=tests|stages|bench bash bench/gpu/core_tests.sh   # one part (stages: bench/gpu/tree_stages.py)
#
# Budget: one device call runs at most 600 s, so TEST_TIMEOUT=330 and BENCH_TIMEOUT=250 by default. The tests
# take about 1-3 minutes on the H200 (Triton compiles a few dozen kernel variants; its cache ~/.triton persists
# while the machine stays warm), the full benchmark grid a few minutes.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/sglang-ddtree-core}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
STAGE=${STAGE:-all}
read -r -a bench_args <<<"${BENCH_ARGS:-}"
read -r -a stages_args <<<"${STAGES_ARGS:-}"
export PYTHONPATH="$PWD/sglang-ddtree/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1

"$PY" - >"$OUT/env.txt" 2>&1 <<'PYEOF'
import platform, torch
print("python", platform.python_version())
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0))
for mod in ("transformers", "tokenizers", "safetensors", "numpy", "tqdm", "triton", "pytest"):
    try:
        print(mod, __import__(mod).__version__)
    except Exception as exc:  # noqa: BLE001
        print(mod, "MISSING", type(exc).__name__, exc)
PYEOF
cat "$OUT/env.txt"

if ! "$PY" -c "import pytest" 2>/dev/null; then
    shopt -s nullglob
    wheels=(.device/wheels/pytest-*.whl .device/wheels/pluggy-*.whl .device/wheels/iniconfig-*.whl .device/wheels/packaging-*.whl)
    if [ ${#wheels[@]} -lt 1 ]; then
        echo "core_tests.sh: pytest is not importable and .device/wheels has no pytest wheel; carry one" >&2
        exit 2
    fi
    "$PY" -m pip install -q --no-index --no-deps --target /tmp/ddtree-pytest "${wheels[@]}" || exit 2
    export PYTHONPATH="/tmp/ddtree-pytest:$PYTHONPATH"
fi

status=0
if [ "$STAGE" = all ] || [ "$STAGE" = tests ]; then
echo "== core tests on $DEVICE"
# pytest-xdist (in the GPU image) spreads the suite over processes sharing the GPU; TEST_WORKERS=0 turns it off.
workers=()
if [ "${TEST_WORKERS:-8}" != 0 ] && "$PY" -c "import xdist" 2>/dev/null; then workers=(-n "${TEST_WORKERS:-8}"); fi
SGLANG_DDTREE_TEST_DEVICE=$DEVICE timeout "${TEST_TIMEOUT:-330}" "$PY" -m pytest sglang-ddtree/tests "${workers[@]}" \
    --ignore=sglang-ddtree/tests/sglang -m "not sglang" -p no:cacheprovider -q -rs --durations=10 \
    --junitxml="$OUT/junit-$DEVICE.xml" 2>&1 | tee "$OUT/pytest-$DEVICE.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ "$STAGE" = all ] || [ "$STAGE" = stages ]; then
echo "== bench/gpu/tree_stages.py (where the time goes at B=64, N=16, V=151936)"
timeout "${STAGES_TIMEOUT:-200}" "$PY" bench/gpu/tree_stages.py "${stages_args[@]}" --out "$OUT/tree_stages.json" 2>&1 | tee "$OUT/tree_stages.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ "$STAGE" = all ] || [ "$STAGE" = bench ]; then
echo "== bench/tree_build.py"
timeout "${BENCH_TIMEOUT:-250}" "$PY" bench/tree_build.py "${bench_args[@]}" --out "$OUT/tree_build.json" 2>"$OUT/tree_build.stderr" | tee "$OUT/tree_build.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
exit $status
