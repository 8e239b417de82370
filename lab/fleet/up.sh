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
# shellcheck source=lab/containers.sh
. lab/containers.sh
lab_up_args "$0" 2,11 "$@"
fleet_lock
log() { printf '[fleet/up] %s\n' "$*"; }
start=$(date +%s)

image_id=$(lab_image_id "$FLEET_IMAGE")
lab_network "$FLEET_NETWORK" "$FLEET_LABEL"
for i in "${!FLEET_HOSTS[@]}"; do
  lab_container "${FLEET_HOSTS[$i]}" "$FLEET_IMAGE" "$image_id" "$FLEET_NETWORK" "$FLEET_LABEL" "$reset" \
    -p "127.0.0.1:$((FLEET_HOST_PORT_BASE + i + 1)):30000"
done
lab_container "$FLEET_LB" "$FLEET_IMAGE" "$image_id" "$FLEET_NETWORK" "$FLEET_LABEL" "$reset" \
  -p "127.0.0.1:$FLEET_LB_PORT:8080" -p "127.0.0.1:$FLEET_API_PORT:9999"
lab_wait_systemd "${FLEET_HOSTS[@]}" "$FLEET_LB"

if [ "$provision" = 1 ]; then
  [ -x "$FLEET_ANSIBLE_PLAYBOOK" ] || { echo "up.sh: $FLEET_ANSIBLE_PLAYBOOK is missing; run make setup-python" >&2; exit 1; }
  ANSIBLE_CONFIG=${ANSIBLE_CONFIG:-$PWD/ansible.cfg} "$FLEET_ANSIBLE_PLAYBOOK" -i "$FLEET_INVENTORY" \
    lab/fleet/provision.yml "${extra[@]}"
fi
log "fleet up in $(( $(date +%s) - start )) s: ${FLEET_HOSTS[*]} behind $FLEET_LB (http://127.0.0.1:$FLEET_LB_PORT, runtime API 127.0.0.1:$FLEET_API_PORT)"
