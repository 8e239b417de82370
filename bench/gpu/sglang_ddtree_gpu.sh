#!/usr/bin/env bash
# DDTREE in the real SGLang on a GPU host (written for the lent H200 with SGLang 0.5.17; see
# ../shared/notes/gpu-sglang.md for the package set that has to travel there).
#
#   bash bench/gpu/sglang_ddtree_gpu.sh STAGE OUT_DIR
#
# STAGE: install | models | measure | all | models-hybrid | measure-hybrid | measure-hybrid-extra | lossless |
# lossless-hybrid (bench/gpu/lossless.py: issue 13's forced-branch equality + graph-vs-eager check; BUDGETS, BEFORE=1, AUTO=1: also SGLANG_DDTREE_BUDGET=auto and =chain)
# | models-flat | sampling (the temperature-1 test on a flat target) | train-pair | tau (issue 15) | step-cost (issue 18). measure starts
# 5 engines (the first about 100 s, mostly Triton JIT and CUDA-graph capture, later ones about 35 s): run it as its
# own command to stay under a 10-minute limit (likewise each measure-hybrid* stage: 2 engines each).
#   install   make the sglang-ddtree plugin visible to SGLang's entry-point discovery (pip into $SITE or the
#             interpreter; falls back to a hand-written dist-info when pip cannot build offline)
#   models    tiny aligned Qwen3 target + DFlash drafter (block size 8) via sglang_ddtree.reference.tiny
#   measure   engines: none, DDTREE 4, 8, 16, DFLASH. equality: greedy outputs of 32 prompts x 64 tokens at
#             batch 1 and 16 of every speculative engine against no speculation, token for token (fp32
#             near-ties flagged, not failed); speed (none, DFLASH, DDTREE 16): ms per decode step (median,
#             min, max of 5) and emitted tokens per step at batch 1/8/32
#   models-hybrid  tiny aligned HYBRID target (Qwen3-Next: 3 GatedDeltaNet + 1 full-attention layer, MoE MLPs)
#             + DFlash drafter (block size 8) via make_tiny_hybrid_models, in $OUT/models-hybrid
#   measure-hybrid  engines none and DDTREE 16 on the hybrid (radix cache off), equality only, compared
#   measure-hybrid-extra  controls on the hybrid: DFLASH, and DDTREE 16 with SGLang's default radix cache
#             (mamba extra_buffer); run after measure-hybrid (compares against its run-hybrid-none-0.json)
# Environment: PYTHON (default python3), SITE (optional target dir already on PYTHONPATH), TP (tensor parallel
# size of the measure engines, default 1; TP=2 on a 2-GPU host).
set -euo pipefail
cd "$(dirname "$0")/../.."
STAGE=${1:?stage: install|models|measure|all}
OUT=${2:?output directory}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/sglang-ddtree/src${PYTHONPATH:+:$PYTHONPATH}"

install_plugin() {
  local dest=${SITE:-}
  if [ -n "$dest" ]; then
    "$PY" -m pip install -q --no-deps --no-build-isolation --no-index --target "$dest" ./sglang-ddtree && return 0
  else
    "$PY" -m pip install -q --no-deps --no-build-isolation --no-index ./sglang-ddtree && return 0
  fi
  # Offline fallback: the package is on PYTHONPATH (src/); only the entry point needs a dist-info.
  dest=${dest:-$PWD/sglang-ddtree/src}
  local info="$dest/sglang_ddtree-0.1.0.dist-info"
  mkdir -p "$info"
  printf 'Metadata-Version: 2.1\nName: sglang-ddtree\nVersion: 0.1.0\n' > "$info/METADATA"
  printf '[sglang.srt.plugins]\nddtree = sglang_ddtree.sglang:register\n' > "$info/entry_points.txt"
  echo "sglang-ddtree: entry point registered through $info"
}

check_plugin() {
  "$PY" - <<'PY'
from sglang.srt.plugins import load_plugins
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
import sglang, sglang_ddtree.sglang as plugin
load_plugins()
algo = SpeculativeAlgorithm.from_string("DDTREE")
print(f"sglang {sglang.__version__}: DDTREE -> {algo!r} ({plugin.last_status})")
PY
}

make_models() {
  "$PY" - "$OUT/models" <<'PY'
import sys
from sglang_ddtree.reference.tiny import make_tiny_models
m = make_tiny_models(sys.argv[1], aligned=True, block_size=8)
print("models:", m.target_dir, m.drafter_dir, "block", m.block_size)
PY
}

make_hybrid_models() {
  "$PY" - "$OUT/models-hybrid" <<'PY'
import sys
from sglang_ddtree.reference.tiny import make_tiny_hybrid_models
m = make_tiny_hybrid_models(sys.argv[1], aligned=True, block_size=8)
print("hybrid models:", m.target_dir, m.drafter_dir, "block", m.block_size, "target layers", m.target_layer_ids)
PY
}

run_hybrid() {  # algo budget out-name [extra args] (RESUME=1 as for run)
  if [ "${RESUME:-0}" = 1 ] && [ -s "$OUT/$3.json" ]; then echo "$3.json exists: skipped"; return 0; fi
  "$PY" bench/gpu/sglang_ddtree_run.py --models "$OUT/models-hybrid" --algo "$1" --budget "$2" --mode equality \
    --out "$OUT/$3.json" "${@:4}"
}

compare_hybrid() {  # candidate out-names
  local files=()
  for name in "$@"; do files+=("$OUT/$name.json"); done
  "$PY" bench/gpu/sglang_ddtree_compare.py --models "$OUT/models-hybrid" "$OUT/run-hybrid-none-0.json" "${files[@]}"
}

run() {  # algo budget modes (with RESUME=1 a configuration whose JSON exists is not run again)
  if [ "${RESUME:-0}" = 1 ] && [ -s "$OUT/run-$1-$2.json" ]; then echo "run-$1-$2.json exists: skipped"; return 0; fi
  "$PY" bench/gpu/sglang_ddtree_run.py --models "$OUT/models" --algo "$1" --budget "$2" --mode "$3" \
    --tp "${TP:-1}" --out "$OUT/run-$1-$2.json"
}

case "$STAGE" in
  install) install_plugin; check_plugin ;;
  models) make_models ;;
  measure)
    run none 0 equality,speed
    for b in 4 8; do run DDTREE "$b" equality; done
    run DDTREE 16 equality,speed
    run DFLASH 0 equality,speed
    "$PY" bench/gpu/sglang_ddtree_compare.py --models "$OUT/models" "$OUT/run-none-0.json" \
      "$OUT"/run-DDTREE-{4,8,16}.json "$OUT/run-DFLASH-0.json" | tee "$OUT/equality-summary.txt"
    "$PY" - "$OUT" <<'PY' | tee "$OUT/speed-summary.txt"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
print("| algo | batch | ms/step median | min | max | tokens/step | ms/token |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name in ("run-none-0", "run-DFLASH-0", "run-DDTREE-16"):
    rec = json.loads((out / f"{name}.json").read_text())
    for row in rec["speed"]:
        label = rec["algo"] + (f" ({rec['budget']})" if rec["budget"] else "")
        ms, tps = row["ms_per_step"], row["tokens_per_step"]
        print(f"| {label} | {row['batch']} | {ms:.3f} | {row['ms_per_step_min']:.3f} | {row['ms_per_step_max']:.3f} "
              f"| {tps:.2f} | {ms / tps:.3f} |")
PY
    ;;
  all) install_plugin; check_plugin; make_models; "$0" measure "$OUT" ;;
  models-hybrid) make_hybrid_models ;;
  lossless)  # issue 13 on the pure-attention target: forced deep/branching acceptance, graph vs eager, before/after
    "$PY" bench/gpu/lossless.py --models "$OUT/models" --work "$OUT/lossless-pure" --label pure \
      --budgets "${BUDGETS:-4,8,16}" ${BEFORE:+--before} ${AUTO:+--auto --chain} ;;
  lossless-hybrid)  # the same on the hybrid GatedDeltaNet target (models-hybrid first)
    "$PY" bench/gpu/lossless.py --models "$OUT/models-hybrid" --work "$OUT/lossless-hybrid" --label hybrid \
      --budgets "${BUDGETS:-4,8,16}" ${BEFORE:+--before} ${AUTO:+--auto --chain} ;;
  train-pair)  # issue 15: the trained target + DFlash drafter (bench/gpu/train_pair.py; ~8 min on the H200)
    "$PY" bench/gpu/train_pair.py --out "$OUT/pair" ;;
  tau)  # issue 15's table on the trained pair (train-pair first, in the same machine session)
    "$PY" bench/gpu/tau.py --pair "$OUT/pair" --work "$OUT/tau" --result "$OUT/tau/tau-result.json" ;;
  step-cost)  # issue 18 on the tiny target at block 16: ms/step, launches and syncs per step (step_cost.py)
    "$PY" -c "import sys; from sglang_ddtree.reference.tiny import make_tiny_models as m; m(sys.argv[1], aligned=True, block_size=16)" \
      "$OUT/models16"
    "$PY" bench/gpu/step_cost.py --models "$OUT/models16" --work "$OUT/step-cost" --label tiny --contexts "${CONTEXTS:-1024,3072}" ;;
  models-flat)  # random (non-aligned) pair: nearly flat target distributions, for the sampling test
    "$PY" -c "import sys; from sglang_ddtree.reference.tiny import make_tiny_models as m; m(sys.argv[1], block_size=8)" \
      "$OUT/models-flat" ;;
  sampling)  # temperature 1 (with top_k 20 and top_p 0.9, top_k 20 alone, alone): tokens 2-4 of DDTREE 16 vs none
    "$PY" bench/gpu/lossless.py --models "$OUT/models-flat" --work "$OUT/sampling-flat" --label pure --budgets 16 \
      --sampling --no-equality ;;
  measure-hybrid)
    run_hybrid none 0 run-hybrid-none-0
    run_hybrid DDTREE 16 run-hybrid-DDTREE-16
    compare_hybrid run-hybrid-DDTREE-16 | tee "$OUT/equality-hybrid-summary.txt"
    ;;
  measure-hybrid-extra)
    status=0
    run_hybrid DFLASH 0 run-hybrid-DFLASH-0 || status=1
    run_hybrid DDTREE 16 run-hybrid-DDTREE-16-radix --hybrid-radix-cache || status=1
    done_runs=()
    for name in run-hybrid-DFLASH-0 run-hybrid-DDTREE-16-radix; do
      [ -f "$OUT/$name.json" ] && done_runs+=("$name")
    done
    if [ ${#done_runs[@]} -gt 0 ]; then
      compare_hybrid "${done_runs[@]}" | tee "$OUT/equality-hybrid-extra-summary.txt" || status=1
    fi
    exit $status
    ;;
  *) echo "unknown stage $STAGE" >&2; exit 2 ;;
esac
