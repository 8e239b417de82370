#!/usr/bin/env bash
# Starts the fleet lab and brings it to its initial state (idempotent; a re-run resets what a pivot changed):
#   containers fleet-a, fleet-b, fleet-c (inference hosts: sglang.service serving NEXTN, the same lab server and
#   provisioning as pro6000) and fleet-lb (HAProxy from Debian's package, backend `sglang` with the three hosts,
#   health-checked on /health) from specdec-pivot-lab:bookworm on the user network specdec-fleet, unprivileged,
#   systemd as PID 1. Published on 127.0.0.1 only: the balancer 30100, its runtime API 30109, the hosts
#   30101-30103. Then lab/fleet/provision.yml. Never touches ct200, pro6000 or the network specdec-lab.
# Usage: lab/fleet/up.sh [--reset] [--no-provision] [-- extra ansible-playbook args]
#   --reset         remove and recreate the four containers (a fresh fleet)
#   --no-provision  only start the containers
# Run lab/setup-docker.sh first (it builds the image; haproxy is in it).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/fleet/fleet.env
. lab/fleet/fleet.env
reset=0 provision=1 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --reset) reset=1 ;;
    --no-provision) provision=0 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "up.sh: unknown option $1 (use --reset, --no-provision, -- ANSIBLE_ARGS)" >&2; exit 2 ;;
  esac
  shift
done
fleet_lock
log() { printf '[fleet/up] %s\n' "$*"; }
start=$(date +%s)

docker info >/dev/null 2>&1 || { echo "up.sh: no docker engine answers; run lab/setup-docker.sh first" >&2; exit 1; }
image_id=$(docker image inspect -f '{{.Id}}' "$FLEET_IMAGE" 2>/dev/null) \
  || { echo "up.sh: image $FLEET_IMAGE is missing; run lab/setup-docker.sh first" >&2; exit 1; }
docker network inspect "$FLEET_NETWORK" >/dev/null 2>&1 \
  || { docker network create --label "$FLEET_LABEL" "$FLEET_NETWORK" >/dev/null; log "network $FLEET_NETWORK created"; }

names=("${FLEET_HOSTS[@]}" "$FLEET_LB")
for i in "${!names[@]}"; do
  name=${names[$i]}
  current=$(docker inspect -f '{{.Image}} {{.State.Running}} {{index .Config.Labels "specdec.lab"}}' "$name" 2>/dev/null || true)
  if [ -n "$current" ] && [ "${current##* }" != "${FLEET_LABEL#*=}" ]; then
    echo "up.sh: a container $name exists that the fleet lab did not make (no label $FLEET_LABEL): left alone" >&2
    exit 1
  fi
  if [ -n "$current" ] && { [ "$reset" = 1 ] || [ "${current%% *}" != "$image_id" ]; }; then
    [ "$reset" = 1 ] || log "$name was made from an older image: recreating it"
    docker rm -f "$name" >/dev/null
    current=""
  fi
  if [ -z "$current" ]; then
    if [ "$name" = "$FLEET_LB" ]; then
      publish=(-p "127.0.0.1:$FLEET_LB_PORT:8080" -p "127.0.0.1:$FLEET_API_PORT:9999")
    else
      publish=(-p "127.0.0.1:$((FLEET_HOST_PORT_BASE + i + 1)):30000")
    fi
    docker run -d --name "$name" --hostname "$name" --network "$FLEET_NETWORK" --label "$FLEET_LABEL" \
      --tmpfs /run --tmpfs /run/lock --tmpfs /tmp -v /sys/fs/cgroup:/sys/fs/cgroup:rw \
      "${publish[@]}" "$FLEET_IMAGE" >/dev/null
    log "$name started from $FLEET_IMAGE"
  else
    read -r _ running _ <<<"$current"
    if [ "$running" != true ]; then docker start "$name" >/dev/null; log "$name restarted"; fi
  fi
done

for name in "${names[@]}"; do
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
  [ -x "$FLEET_ANSIBLE_PLAYBOOK" ] || { echo "up.sh: $FLEET_ANSIBLE_PLAYBOOK is missing; run make setup-python" >&2; exit 1; }
  ANSIBLE_CONFIG=${ANSIBLE_CONFIG:-$PWD/ansible.cfg} "$FLEET_ANSIBLE_PLAYBOOK" -i "$FLEET_INVENTORY" \
    lab/fleet/provision.yml "${extra[@]}"
fi
log "fleet up in $(( $(date +%s) - start )) s: ${FLEET_HOSTS[*]} behind $FLEET_LB (http://127.0.0.1:$FLEET_LB_PORT, runtime API 127.0.0.1:$FLEET_API_PORT)"
