#!/usr/bin/env bash
# Every GPU measurement of sglang-ddtree in one resumable driver, for hosts that give commands a wall-clock
# limit (the lent H200: 10 minutes a call). Run it again with the same STATE dir to continue where the last
# call stopped: finished steps are skipped, the SGLang engines resume per configuration (RESUME=1).
#
#   DEADLINE_S=570 bash bench/gpu/run_all.sh STATE_DIR
#   STEPS="sglang-setup train-start lossless-hybrid" DEADLINE_S=570 bash bench/gpu/run_all.sh STATE_DIR
#   STEPS=issue23 DEADLINE_S=7200 bash bench/gpu/run_all.sh STATE_DIR     # issue 23's table, on a GPU without limits
#   STEPS=issue24 DEADLINE_S=570 bash bench/gpu/run_all.sh STATE_DIR      # issue 24's pair and tau table (3 calls)
#
# STEPS picks steps, run in its order (default: the core's and the tiny pairs' checks, none of the trained pair's);
# SKIP="core-bench hybrid" leaves some out. The steps, with the variables each reads:
#   core-stages, core-tests, core-bench  bench/gpu/core_tests.sh: tree_stages.py, the core suite on CUDA, tree_build.py
#   sglang-setup      unpack BUNDLE (bench/gpu/make_bundle.sh's SGLang 0.5.17) into /tmp/site, install the plugin and
#                     z-lab's dflash wheel if carried, make the tiny models
#   glue-check        the fused glue kernels on the GPU against their torch references; the start-up warm-up covers
#                     later rounds (no new kernel variant after it)
#   gdn-kernel        the plugin's GatedDeltaNet tree-verify kernel against SGLang's on the GPU at Qwen3.6-27B's
#                     widths (bit for bit, both timed; sglang-ddtree/tests/sglang/test_gdn_tree_kernel.py -k cuda)
#   measure           sglang_ddtree_gpu.sh measure (tiny pair)
#   lossless, lossless-hybrid  bench/gpu/lossless.py, oracle-forced deep and branching drafts, graph vs eager
#                     (LOSSLESS_BUDGETS, HYBRID_BUDGETS; AUTO=1 adds SGLANG_DDTREE_BUDGET=auto)
#   sampling          temperature 1 on a flat target (chi-square)
#   hybrid            models-hybrid + measure-hybrid
#   lossless-shape    lossless.py on the Qwen3.6-27B hybrid shape (SHAPE_BUDGETS, 16)
#   train-start       bench/gpu/train_pair.py in the background, in its own process session so that it outlives the
#                     call while the machine is held; a failed training is started again (TRAIN_SET: Settings
#                     overrides, e.g. "budgets=32 temperatures=0" evaluates fewer reference rows: a shorter train-wait)
#   pair-wait         until the pair is saved (train_pair.py then still evaluates it in its reference engine)
#   train-wait        until train_pair.py has ended
#   lossless-trained  lossless.py on the trained pair, natural drafts, temperature-1 test (TRAINED_BUDGETS, 8,16; AUTO:
#                     also auto, and the chain alone: every step DFLASH's round on the chain width's graphs)
#   tau               bench/gpu/tau.py: issue 24's table, goal and clock check (TAU_CONFIGS: a subset of its
#                     engines, e.g. none,DFLASH,auto: auto and its candidates held fixed in one engine)
#   cost-tiny, cost-8b, cost-hybrid, cost-8b-context  bench/gpu/step_cost.py on the tiny pair and on
#                     bench/gpu/shapes.py's config-only Qwen3-8B and Qwen3.6-27B hybrid shapes (COST_REPEATS, 5;
#                     COST_BUDGETS, 16; COST_ALGOS; COST_BATCHES (tiny); HYBRID_LAYERS, 40 on a GPU of 130 GB or
#                     more, else 20; CONTEXTS and CONTEXT_BATCHES (context), 32768=1,8; the context step's COST_ALGOS
#                     default is DFLASH,DDTREE; COST_BUDGETS=15,16 on cost-hybrid also times the tree exactly as
#                     wide as the block-16 chain's verify, 16 tokens). COST_AB=1: cost-8b also
#                     times SGLang's own verify attention; COST_AB_TREE=1: cost-8b and cost-tiny also the tree built
#                     after the drafter pass; COST_AB_ARGS: more step_cost.py arguments (cost-8b, cost-hybrid,
#                     cost-tiny, cost-pair), e.g. "--ab own-gdn:SGLANG_DDTREE_OWN_GDN=1" on cost-hybrid: DDTREE
#                     also with the plugin's GatedDeltaNet tree kernel (opt-in) instead of SGLang's. An
#                     SGLANG_DDTREE_* variable exported around run_all reaches every engine
#   cost-pair         step_cost.py on the trained pair (PAIR_BUDGETS, 16,32; PAIR_BATCHES, 1,8,32): wall ms per step
#                     beside the profile's GPU time ("--ab auto:SGLANG_DDTREE_BUDGET=auto" ranks what auto adds)
#   step-cost         sglang_ddtree_gpu.sh step-cost (issue 18's layout; CONTEXTS)
#   attn-mask         bench/gpu/attn_mask.py: Triton verify attention with and without the tree mask
#   http-semantics    bench/gpu/http_semantics.py, DDTREE vs none over HTTP on the tiny pair (HTTP_BUDGET, 16)
# Named sets: issue23 and issue24 (below). With OUT set (the lent GPU host), the results and logs of STATE (not the
# models) are packed into $OUT/run_all-state.tgz at the end of every call.
set -uo pipefail
cd "$(dirname "$0")/../.."
STATE=${1:?state directory}
mkdir -p "$STATE"
T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-570}
BUNDLE=${BUNDLE:-.device/sglang-0.5.17-py312.tar.xz}
# TQDM_DISABLE: no progress bars (CUDA-graph capture) in the output, which the lent GPU host cuts to its last 12 kB.
# Bytecode goes to one cache outside the checkout (PYTHONPYCACHEPREFIX): every engine process imports SGLang from the
# unpacked bundle, which ships no .pyc, and without a cache each import compiled it anew (15 s against 7 s per import
# on the CPU VM; an engine start spawns three such processes).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache STATE BUNDLE TQDM_DISABLE=1

left() { echo $((DEADLINE_S - ($(date +%s) - T0))); }

# The host's load when a step starts, and its busiest processes when the load is more than a quarter of the CPUs:
# timings of a loaded host are not comparable (the H100 of 12-07, second session, ran every engine about 2x slower
# than the H100 of the morning, for no reason the log could show).
host_load() {
  local one _rest cpus
  read -r one _rest </proc/loadavg
  cpus=$(nproc)
  printf 'load %s on %s CPUs' "$one" "$cpus"
  if awk -v l="$one" -v c="$cpus" 'BEGIN { exit !(l > c / 4) }'; then
    printf '; busiest: %s' "$(ps -eo pcpu=,comm= --sort=-pcpu | head -n 3 | awk '{ printf "%s %s%%, ", $2, $1 }')"
  fi
}

# Seconds a step needs to finish (measured on the lent H100/H200, 12-05): a step that cannot finish in the time
# left is not started, so that the call's time goes to a step that can (a step cut off measures nothing).
step_need() {
  case "$1" in
    http-semantics) echo 330 ;;
    cost-hybrid) echo 300 ;;
    lossless-shape) echo 300 ;;
    *) echo 30 ;;
  esac
}

step() {  # name command...: run unless done, skipped, or out of time
  local name=$1
  shift
  if [ -e "$STATE/done-$name" ]; then echo "== $name: done earlier"; return 0; fi
  case " ${SKIP:-} " in *" $name "*) echo "== $name: skipped (SKIP)"; return 0 ;; esac
  local budget need
  budget=$(left)
  need=$(step_need "$name")
  if [ "$budget" -lt "$need" ]; then echo "== $name: needs about $need s, $budget s left in this call"; return 1; fi
  echo "== $name ($budget s left; $(host_load))"
  local t
  t=$(date +%s)
  # timeout runs the step in a process group of its own; whatever is left in that group when the step ends (an
  # SGLang engine that outlived TERM held the call's output open past the call's limit on 12-06c; an engine's
  # scheduler left spinning would slow every later step) is the step's own and is killed. train-start's training
  # runs in a session of its own, outside the group, and outlives the step as it should.
  timeout --kill-after=15 "$budget" "$@" &
  local pid=$!
  wait "$pid"
  local rc=$?
  local left_over
  left_over=$(pgrep -g "$pid" 2>/dev/null | tr '\n' ' ')
  if [ -n "$left_over" ]; then
    echo "== $name: killing what the step left running in its process group: $left_over"
    kill -KILL -- "-$pid" 2>/dev/null
  fi
  echo "== $name: rc=$rc after $(($(date +%s) - t)) s"
  if [ $rc -eq 0 ]; then touch "$STATE/done-$name"; fi
  return $rc
}

sglang_env() {  # this checkout's plugin first (a copy installed by an earlier call may be stale), then the bundle
  export PYTHONPATH="$PWD/sglang-ddtree/src:/tmp/site" SITE=/tmp/site
}

sglang_setup() {
  set -e
  if [ ! -d /tmp/site/sglang ]; then
    mkdir -p /tmp/site
    tar -xJf "$BUNDLE" -C /tmp/site
  fi
  rm -rf /tmp/site/sglang_ddtree* # a copy installed by an earlier call would shadow this checkout
  for whl in .device/dflash-*.whl; do  # z-lab's dflash (train_pair.py's external chain cross-check), if carried
    [ -e "$whl" ] && python3 -m pip install -q --no-deps --no-index --target /tmp/site "$whl"
  done
  bash bench/gpu/sglang_ddtree_gpu.sh install "$STATE/sglang"
  bash bench/gpu/sglang_ddtree_gpu.sh models "$STATE/sglang"
}

gpu() { bash bench/gpu/sglang_ddtree_gpu.sh "$@"; }

# The Qwen3.6-27B hybrid shape's depth for this GPU. Besides the weights (about 0.77 GB a layer, 8 GB of
# embeddings and drafter), SGLang reserves every GatedDeltaNet layer's recurrent state (3.2 MB a request at these
# widths) for each of the verify's tokens of each running request, 17 x 33 at budget 16 and batch 32: 32 layers
# left no KV cache on an H100 (12-05, "Loaded weights leave no GPU memory for the KV cache").
hybrid_layers() {
  local mib
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
  if [ "${mib:-0}" -ge 130000 ]; then echo 40; else echo 20; fi
}

train_start() {  # train_pair.py in its own process session, so that it outlives this call while the machine is held
  local item settings=""
  for item in ${TRAIN_SET:-}; do settings+=" --set '$item'"; done  # e.g. TRAIN_SET="budgets=32 temperatures=0"
  setsid nohup bash -c "python3 bench/gpu/train_pair.py --out '$STATE/pair'$settings >'$STATE/train.log' 2>&1;
    echo \$? >'$STATE/train.rc'" </dev/null >/dev/null 2>&1 &
  echo "bench/gpu/train_pair.py --out $STATE/pair in the background (log $STATE/train.log)"
}

wait_training() {  # FILE: until train_pair.py (train-start) has written it, within this call's time
  if [ ! -e "$1" ] && [ ! -e "$STATE/train.log" ]; then echo "no training in $STATE: run train-start first"; return 1; fi
  while [ ! -e "$1" ]; do
    if [ -e "$STATE/train.rc" ]; then tail -n 5 "$STATE/train.log"; return 1; fi  # it ended without writing FILE
    if [ "$(left)" -lt 40 ]; then echo "training still running: $(tail -n 1 "$STATE/train.log")"; return 1; fi
    sleep 10
  done
}

train_wait() {  # until train_pair.py has ended; its exit status
  wait_training "$STATE/train.rc" || return 1
  tail -n 5 "$STATE/train.log"
  return "$(cat "$STATE/train.rc")"
}

pair_wait() {  # until the pair is saved: train_pair.py writes eval_prompts.json after both models, then evaluates
  wait_training "$STATE/pair/eval_prompts.json"
}

run_step() {
  local S="$STATE/sglang"
  case "$1" in
    core-stages) step core-stages env STAGE=stages OUT="$STATE/core" bash bench/gpu/core_tests.sh ;;
    core-tests) step core-tests env STAGE=tests TEST_TIMEOUT=400 OUT="$STATE/core" bash bench/gpu/core_tests.sh ;;
    core-bench) step core-bench env STAGE=bench BENCH_TIMEOUT=500 OUT="$STATE/core" bash bench/gpu/core_tests.sh ;;
    sglang-setup) step sglang-setup bash -c sglang_setup ;;
    measure) step measure env RESUME=1 bash bench/gpu/sglang_ddtree_gpu.sh measure "$S" ;;
    lossless) step lossless env BUDGETS="${LOSSLESS_BUDGETS:-4,8,16}" bash bench/gpu/sglang_ddtree_gpu.sh lossless "$S" ;;
    sampling) step sampling bash -c "$(declare -f gpu); gpu models-flat '$S' && gpu sampling '$S'" ;;
    lossless-hybrid)
      step lossless-hybrid bash -c "$(declare -f gpu); RESUME=1 gpu models-hybrid '$S' &&
        BUDGETS='${HYBRID_BUDGETS:-4,8,16}' gpu lossless-hybrid '$S'" ;;
    hybrid) step hybrid bash -c "$(declare -f gpu); RESUME=1 gpu models-hybrid '$S' && RESUME=1 gpu measure-hybrid '$S'" ;;
    train-start)
      if [ -e "$STATE/train.rc" ] && [ "$(cat "$STATE/train.rc")" != 0 ]; then  # it failed: start it again
        echo "== train-start: the last training failed (rc $(cat "$STATE/train.rc")), starting it again:"
        tail -n 3 "$STATE/train.log"
        rm -f "$STATE/train.rc" "$STATE/done-train-start" "$STATE/done-train-wait" "$STATE/done-pair-wait"
      fi
      step train-start bash -c train_start ;;
    train-wait) step train-wait bash -c train_wait ;;
    pair-wait) step pair-wait bash -c pair_wait ;;
    lossless-trained)
      step lossless-trained python3 bench/gpu/lossless.py --models "$STATE/pair" --work "$STATE/lossless-trained" \
        --label pure --natural --prompts-file "$STATE/pair/eval_prompts.json" --budgets "${TRAINED_BUDGETS:-8,16}" \
        --sampling ${AUTO:+--auto --chain} ;;
    tau) step tau python3 bench/gpu/tau.py --pair "$STATE/pair" --work "$STATE/tau" --result "$STATE/tau/tau-result.json" \
        ${TAU_CONFIGS:+--configs "$TAU_CONFIGS"} ;;
    step-cost) step step-cost env CONTEXTS="${CONTEXTS:-1024,8192}" bash bench/gpu/sglang_ddtree_gpu.sh step-cost "$S" ;;
    attn-mask) step attn-mask python3 bench/gpu/attn_mask.py --out "$STATE/attn-mask.json" ;;
    glue-check) step glue-check python3 sglang-ddtree/tests/triton_interpreted_check.py --glue-device cuda ;;
    gdn-kernel) step gdn-kernel bash -c "set -o pipefail; cd sglang-ddtree && SGLANG_DDTREE_TEST_DEVICE=cuda python3 -m pytest -q -s \
        -p no:cacheprovider tests/sglang/test_gdn_tree_kernel.py -k cuda 2>&1 | tee '$STATE/gdn-kernel.log'" ;;
    cost-8b) step cost-8b bash -c "python3 bench/gpu/shapes.py qwen3-8b-shape '$STATE/shape-8b' &&
        python3 bench/gpu/step_cost.py --models '$STATE/shape-8b' --work '$STATE/cost-8b' --label qwen3-8b-shape \
          --contexts 128 --budgets ${COST_BUDGETS:-16} --algos ${COST_ALGOS:-none,DFLASH,DDTREE} --repeats ${COST_REPEATS:-5} ${COST_AB:+--ab-attention} \
          ${COST_AB_TREE:+--ab-tree-after-pass} ${COST_AB_ARGS:-}" ;;
    cost-hybrid) step cost-hybrid bash -c "python3 bench/gpu/shapes.py qwen36-27b-hybrid-shape '$STATE/shape-hybrid' \
          --layers ${HYBRID_LAYERS:-$(hybrid_layers)} &&
        python3 bench/gpu/step_cost.py --models '$STATE/shape-hybrid' --work '$STATE/cost-hybrid' \
          --label qwen36-27b-hybrid-shape --contexts 128 --budgets ${COST_BUDGETS:-16} \
          --algos ${COST_ALGOS:-none,DFLASH,DDTREE} --repeats ${COST_REPEATS:-5} ${COST_AB_ARGS:-}" ;;
    cost-8b-context) step cost-8b-context bash -c "python3 bench/gpu/shapes.py qwen3-8b-shape '$STATE/shape-8b' &&
        python3 bench/gpu/step_cost.py --models '$STATE/shape-8b' --work '$STATE/cost-8b-context' \
          --label qwen3-8b-shape --contexts ${CONTEXTS:-1024,8192,32768} --context-batches '${CONTEXT_BATCHES:-32768=1,8}' --algos ${COST_ALGOS:-DFLASH,DDTREE} \
          --repeats ${COST_REPEATS:-3}" ;;
    cost-tiny) read -r -a ab_args <<<"${COST_AB_ARGS:-}"  # several arguments
      step cost-tiny python3 bench/gpu/step_cost.py --models "$S/models" --work "$STATE/cost-tiny" --label tiny \
        --contexts 128 --budgets "${COST_BUDGETS:-16}" --repeats "${COST_REPEATS:-5}" --batches "${COST_BATCHES:-1,8,32}" \
        --algos "${COST_ALGOS:-none,DFLASH,DDTREE}" ${COST_AB_TREE:+--ab-tree-after-pass} "${ab_args[@]}" ;;
    lossless-shape) step lossless-shape bash -c "python3 bench/gpu/shapes.py qwen36-27b-hybrid-shape '$STATE/shape-hybrid' \
          --layers ${HYBRID_LAYERS:-$(hybrid_layers)} &&
        python3 bench/gpu/lossless.py --models '$STATE/shape-hybrid' --work '$STATE/lossless-shape' --label hybrid \
          --budgets ${SHAPE_BUDGETS:-16} --result '$STATE/lossless-shape/lossless-qwen36-27b-hybrid-shape.json'" ;;
    cost-pair) read -r -a ab_args <<<"${COST_AB_ARGS:-}"  # e.g. "--ab auto:SGLANG_DDTREE_BUDGET=auto"
      step cost-pair python3 bench/gpu/step_cost.py --models "$STATE/pair" --work "$STATE/cost-pair" \
        --label trained-pair --contexts 128 --batches "${PAIR_BATCHES:-1,8,32}" --budgets "${PAIR_BUDGETS:-16,32}" --algos DFLASH,DDTREE \
        --repeats 3 "${ab_args[@]}" ;;
    http-semantics) step http-semantics python3 bench/gpu/http_semantics.py --models "$S/models" --work "$STATE/http-semantics" --budget "${HTTP_BUDGET:-16}" ;;
    *) echo "unknown step $1" >&2; return 2 ;;
  esac
}

sglang_env
export -f sglang_setup
export -f train_start wait_training train_wait pair_wait left
export T0 DEADLINE_S
export RUN_ALL_DEADLINE=$((T0 + DEADLINE_S))  # bench/gpu/engine_run.py starts no engine too close to it
# Named sets of steps: issue23 is every measurement of issue 23's table (the three targets' step cost, the 8B shape
# at 1k, 8k and 32k tokens of context, greedy identity on the pure and hybrid pairs and the 27B hybrid shape).
ISSUE23="sglang-setup glue-check gdn-kernel cost-tiny cost-8b cost-hybrid lossless lossless-hybrid lossless-shape cost-8b-context"
# issue24: the trained pair and its tau table (auto with both clocks beside every fixed budget). Untimed checks run
# while the pair trains (the tiny pair's greedy identity) and while train_pair.py evaluates the saved pair in its
# reference engine (the trained pair's, lossless-trained); nothing timed does. About 1400 s on the lent H100 (12-06b:
# set-up 65 s, training 355 s and evaluation 122 s, an engine 20-30 s to start and 30 s to time, the auto engine
# with its held candidates about 200 s): 30 minutes, in three calls.
ISSUE24="sglang-setup train-start lossless pair-wait lossless-trained train-wait tau"
steps=${STEPS:-core-stages core-tests core-bench sglang-setup measure lossless sampling lossless-hybrid hybrid}
steps=${steps//issue23/$ISSUE23}
for name in ${steps//issue24/$ISSUE24}; do
  case "$name" in core-*) ;; *) sglang_env ;; esac
  run_step "$name" && continue
  case "$name" in *-wait) echo "== run_all: $name did not finish; the steps after it wait for the next call"; break ;; esac
done
shopt -s nullglob
done_steps=("$STATE"/done-*)
shopt -u nullglob
echo "== run_all: ${#done_steps[@]} steps done; $(($(date +%s) - T0)) s in this call"
# On the lent GPU host, $OUT comes back: every result and log of the state dir (not the models) in one archive.
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  (cd "$STATE" && find . \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' -o -name '*.md' \) -size -8M \
    -not -path './*/models*' -not -path './shape-*' -not -path './pair/target/*' -not -path './pair/drafter/*' \
    -print0 | tar -czf "$OUT/run_all-state.tgz" --null -T -) && echo "== run_all: results in \$OUT/run_all-state.tgz"
fi
