#!/usr/bin/env bash
# Removes the fleet lab: containers fleet-a/b/c and fleet-lb and the network specdec-fleet (only those carrying
# the label specdec.lab=fleet). The single-host lab (ct200, pro6000, specdec-lab) is never touched.
# Usage: lab/fleet/down.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/fleet/fleet.env
. lab/fleet/fleet.env
# shellcheck source=lab/containers.sh
. lab/containers.sh
log() { printf '[fleet/down] %s\n' "$*"; }
docker info >/dev/null 2>&1 || { echo "down.sh: no docker engine answers; nothing to remove"; exit 0; }
fleet_lock
lab_remove "$FLEET_LABEL" "$FLEET_NETWORK" "${FLEET_HOSTS[@]}" "$FLEET_LB"
