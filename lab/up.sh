#!/usr/bin/env bash
# Starts the lab and brings it to its initial state (idempotent; ~1 min when the containers exist):
#   containers ct200 (training host) and pro6000 (inference host) from specdec-pivot-lab:bookworm on the user
#   network specdec-lab, unprivileged, systemd as PID 1; pro6000's port 30000 published on 127.0.0.1 only;
#   then lab/provision.yml: the training job runs on ct200, sglang.service serves NEXTN on pro6000.
# Usage: lab/up.sh [--reset] [--no-provision] [-- extra ansible-playbook args]
#   --reset         remove and recreate both containers (a fresh lab)
#   --no-provision  only start the containers
# A container made from an older image is recreated. Run lab/setup-docker.sh first (make setup does).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lab/lab.env
. lab/lab.env
# shellcheck source=lab/containers.sh
. lab/containers.sh
lab_up_args "$0" 2,10 "$@"
lab_lock
log() { printf '[lab/up] %s\n' "$*"; }
start=$(date +%s)

image_id=$(lab_image_id "$LAB_IMAGE")
lab_network "$LAB_NETWORK" "$LAB_LABEL"
lab_container "$LAB_TRAINING" "$LAB_IMAGE" "$image_id" "$LAB_NETWORK" "$LAB_LABEL" "$reset"
lab_container "$LAB_INFERENCE" "$LAB_IMAGE" "$image_id" "$LAB_NETWORK" "$LAB_LABEL" "$reset" \
  -p "127.0.0.1:$LAB_PORT:30000"
lab_wait_systemd "$LAB_TRAINING" "$LAB_INFERENCE"

if [ "$provision" = 1 ]; then
  [ -x "$LAB_ANSIBLE_PLAYBOOK" ] || { echo "up.sh: $LAB_ANSIBLE_PLAYBOOK is missing; run make setup-python" >&2; exit 1; }
  ANSIBLE_CONFIG=${ANSIBLE_CONFIG:-$PWD/ansible.cfg} "$LAB_ANSIBLE_PLAYBOOK" -i inventories/lab lab/provision.yml "${extra[@]}"
fi
log "lab up in $(( $(date +%s) - start )) s: training on $LAB_TRAINING, sglang.service on $LAB_INFERENCE (http://127.0.0.1:$LAB_PORT)"
