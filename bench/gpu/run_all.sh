#!/usr/bin/env bash
# Every GPU measurement of sglang-ddtree in one resumable driver, for hosts that give commands a wall-clock
# limit (the lent H200: 10 minutes a call). Run it again with the same STATE dir to continue where the last
# call stopped: finished steps are skipped, the SGLang engines resume per configuration (RESUME=1).
#
#   DEADLINE_S=570 bash bench/gpu/run_all.sh STATE_DIR
#
# Steps, in order: core-stages (bench/gpu/tree_stages.py), core-tests (the core suite on CUDA), core-bench
# (bench/tree_build.py), sglang-setup (unpack BUNDLE into /tmp/site, install the plugin, tiny models),
# measure (sglang_ddtree_gpu.sh measure), lossless and lossless-hybrid (bench/gpu/lossless.py, issue 13),
# hybrid (models-hybrid + measure-hybrid). SKIP="core-bench hybrid"
# leaves steps out. BUNDLE: the SGLang 0.5.17 package set from bench/gpu/make_bundle.sh.
set -uo pipefail
cd "$(dirname "$0")/../.."
STATE=${1:?state directory}
mkdir -p "$STATE"
T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-570}
BUNDLE=${BUNDLE:-.device/sglang-0.5.17-py312.tar.xz}
export PYTHONDONTWRITEBYTECODE=1 STATE BUNDLE

left() { echo $((DEADLINE_S - ($(date +%s) - T0))); }

step() {  # name command...: run unless done, skipped, or out of time
  local name=$1
  shift
  if [ -e "$STATE/done-$name" ]; then echo "== $name: done earlier"; return 0; fi
  case " ${SKIP:-} " in *" $name "*) echo "== $name: skipped (SKIP)"; return 0 ;; esac
  local budget
  budget=$(left)
  if [ "$budget" -lt 30 ]; then echo "== $name: no time left in this call"; return 1; fi
  echo "== $name ($budget s left)"
  local t=$(date +%s)
  timeout "$budget" "$@"
  local rc=$?
  echo "== $name: rc=$rc after $(($(date +%s) - t)) s"
  if [ $rc -eq 0 ]; then touch "$STATE/done-$name"; fi
  return $rc
}

sglang_env() {
  export PYTHONPATH=/tmp/site SITE=/tmp/site
}

sglang_setup() {
  set -e
  if [ ! -d /tmp/site/sglang ]; then
    mkdir -p /tmp/site
    tar -xJf "$BUNDLE" -C /tmp/site
  fi
  rm -rf /tmp/site/sglang_ddtree* # a copy installed by an earlier call would shadow this checkout
  bash bench/gpu/sglang_ddtree_gpu.sh install "$STATE/sglang"
  bash bench/gpu/sglang_ddtree_gpu.sh models "$STATE/sglang"
}

step core-stages env STAGE=stages OUT="$STATE/core" bash bench/gpu/core_tests.sh
step core-tests env STAGE=tests TEST_TIMEOUT=400 OUT="$STATE/core" bash bench/gpu/core_tests.sh
step core-bench env STAGE=bench BENCH_TIMEOUT=500 OUT="$STATE/core" bash bench/gpu/core_tests.sh
sglang_env
export -f sglang_setup
step sglang-setup bash -c sglang_setup
step measure env RESUME=1 bash bench/gpu/sglang_ddtree_gpu.sh measure "$STATE/sglang"
step lossless bash bench/gpu/sglang_ddtree_gpu.sh lossless "$STATE/sglang"
step sampling bash -c "bash bench/gpu/sglang_ddtree_gpu.sh models-flat '$STATE/sglang' && bash bench/gpu/sglang_ddtree_gpu.sh sampling '$STATE/sglang'"
step lossless-hybrid bash -c "RESUME=1 bash bench/gpu/sglang_ddtree_gpu.sh models-hybrid '$STATE/sglang' && bash bench/gpu/sglang_ddtree_gpu.sh lossless-hybrid '$STATE/sglang'"
step hybrid bash -c "RESUME=1 bash bench/gpu/sglang_ddtree_gpu.sh models-hybrid '$STATE/sglang' && RESUME=1 bash bench/gpu/sglang_ddtree_gpu.sh measure-hybrid '$STATE/sglang'"
echo "== run_all: $(ls "$STATE" | grep -c '^done-') steps done; $(($(date +%s) - T0)) s in this call"
