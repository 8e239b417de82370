#!/usr/bin/env bash
# Prints the lab's state for humans: containers, the training job on ct200 (launcher, workers, last step line),
# sglang.service on pro6000 (state, ExecStart one flag per line, installed plugin) and /health from this host.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=lab/lab.env
. lab/lab.env
docker info >/dev/null 2>&1 || { echo "no docker engine answers (lab/setup-docker.sh starts one)"; exit 1; }
for name in "$LAB_TRAINING" "$LAB_INFERENCE"; do
  printf '== %s: container %s, systemd %s\n' "$name" \
    "$(docker inspect -f '{{.State.Status}}' "$name" 2>/dev/null || echo missing)" \
    "$(docker exec "$name" systemctl is-system-running 2>/dev/null || echo -)"
done
echo "== $LAB_TRAINING training job"
docker exec "$LAB_TRAINING" python3 /usr/local/lib/specdec-lab/lab_training_ctl.py status --config /opt/train/.lab-launch.json 2>/dev/null \
  | python3 -c '
import json, sys
s = json.load(sys.stdin)
if not s["running"]:
    print("   not running")
for j in s["jobs"]:
    print("   launcher pid", j["launcher"], "workers", j["workers"])
print("   last step line:", s["last_step_line"] or "-")' || echo "   (not provisioned)"
docker exec "$LAB_TRAINING" systemctl is-active dflash-train.service >/dev/null 2>&1 && echo "   supervised by dflash-train.service"
docker exec "$LAB_TRAINING" sh -c 'ls -1d /opt/train/checkpoints/step-* 2>/dev/null | sort -t- -k2 -n | tail -1 | sed "s/^/   newest checkpoint: /"'
echo "== $LAB_INFERENCE sglang.service: $(docker exec "$LAB_INFERENCE" systemctl is-active sglang.service 2>/dev/null)"
docker exec "$LAB_INFERENCE" systemctl show -p ExecStart --value sglang.service 2>/dev/null \
  | sed -n 's/.*argv\[\]=\([^;]*\);.*/\1/p' | sed 's/ --/\n      --/g; s/^/   ExecStart: /; 2,$s/^   ExecStart: //'
plugin=$(docker exec "$LAB_INFERENCE" /opt/sglang/venv/bin/python -m pip show sglang-ddtree 2>/dev/null | sed -n 's/^Version: //p')
echo "   sglang-ddtree in the unit's venv: ${plugin:-not installed}"
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "http://127.0.0.1:$LAB_PORT/health" || true)
algo=$(curl -s --max-time 3 "http://127.0.0.1:$LAB_PORT/get_server_info" 2>/dev/null \
  | python3 -c 'import json,sys; print(json.load(sys.stdin).get("speculative_algorithm"))' 2>/dev/null || true)
echo "   http://127.0.0.1:$LAB_PORT/health: ${code:-no answer}; speculative_algorithm: ${algo:--}"
