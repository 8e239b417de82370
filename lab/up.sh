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
reset=0 provision=1 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --reset) reset=1 ;;
    --no-provision) provision=0 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "up.sh: unknown option $1 (use --reset, --no-provision, -- ANSIBLE_ARGS)" >&2; exit 2 ;;
  esac
  shift
done
lab_lock
log() { printf '[lab/up] %s\n' "$*"; }
start=$(date +%s)

docker info >/dev/null 2>&1 || { echo "up.sh: no docker engine answers; run lab/setup-docker.sh first" >&2; exit 1; }
image_id=$(docker image inspect -f '{{.Id}}' "$LAB_IMAGE" 2>/dev/null) \
  || { echo "up.sh: image $LAB_IMAGE is missing; run lab/setup-docker.sh first" >&2; exit 1; }
docker network inspect "$LAB_NETWORK" >/dev/null 2>&1 \
  || { docker network create --label "$LAB_LABEL" "$LAB_NETWORK" >/dev/null; log "network $LAB_NETWORK created"; }

for name in "$LAB_TRAINING" "$LAB_INFERENCE"; do
  current=$(docker inspect -f '{{.Image}} {{.State.Running}}' "$name" 2>/dev/null || true)
  if [ -n "$current" ] && { [ "$reset" = 1 ] || [ "${current% *}" != "$image_id" ]; }; then
    [ "$reset" = 1 ] || log "$name was made from an older image: recreating it"
    docker rm -f "$name" >/dev/null
    current=""
  fi
  if [ -z "$current" ]; then
    publish=()
    [ "$name" = "$LAB_INFERENCE" ] && publish=(-p "127.0.0.1:$LAB_PORT:30000")
    docker run -d --name "$name" --hostname "$name" --network "$LAB_NETWORK" --label "$LAB_LABEL" \
      --tmpfs /run --tmpfs /run/lock --tmpfs /tmp -v /sys/fs/cgroup:/sys/fs/cgroup:rw \
      "${publish[@]}" "$LAB_IMAGE" >/dev/null
    log "$name started from $LAB_IMAGE"
  elif [ "${current#* }" != true ]; then
    docker start "$name" >/dev/null
    log "$name restarted"
  fi
done

for name in "$LAB_TRAINING" "$LAB_INFERENCE"; do
  state=""
  for _ in $(seq 120); do
    state=$(docker exec "$name" systemctl is-system-running 2>/dev/null || true)
    case "$state" in running|degraded) break ;; esac
    sleep 0.5
  done
  case "$state" in
    running) log "$name: systemd $state" ;;
    degraded) log "$name: systemd degraded; failed units:"; docker exec "$name" systemctl --failed --no-legend || true ;;
    *) echo "up.sh: systemd in $name is '$state' after 60 s" >&2; docker logs --tail 30 "$name" >&2; exit 1 ;;
  esac
done

if [ "$provision" = 1 ]; then
  [ -x "$LAB_ANSIBLE_PLAYBOOK" ] || { echo "up.sh: $LAB_ANSIBLE_PLAYBOOK is missing; run make setup-python" >&2; exit 1; }
  ANSIBLE_CONFIG=${ANSIBLE_CONFIG:-$PWD/ansible.cfg} "$LAB_ANSIBLE_PLAYBOOK" -i inventories/lab lab/provision.yml "${extra[@]}"
fi
log "lab up in $(( $(date +%s) - start )) s: training on $LAB_TRAINING, sglang.service on $LAB_INFERENCE (http://127.0.0.1:$LAB_PORT)"
