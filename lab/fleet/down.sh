#!/usr/bin/env bash
# Removes the fleet lab: containers fleet-a/b/c and fleet-lb and the network specdec-fleet (only those carrying
# the label specdec.lab=fleet). The single-host lab (ct200, pro6000, specdec-lab) is never touched.
# Usage: lab/fleet/down.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/fleet/fleet.env
. lab/fleet/fleet.env
docker info >/dev/null 2>&1 || { echo "down.sh: no docker engine answers; nothing to remove"; exit 0; }
fleet_lock
for name in "${FLEET_HOSTS[@]}" "$FLEET_LB"; do
  label=$(docker inspect -f '{{index .Config.Labels "specdec.lab"}}' "$name" 2>/dev/null || true)
  if [ "$label" = "${FLEET_LABEL#*=}" ]; then
    docker rm -f "$name" >/dev/null && echo "[fleet/down] removed $name"
  elif docker inspect "$name" >/dev/null 2>&1; then
    echo "[fleet/down] $name exists but is not a fleet lab container (no label $FLEET_LABEL): left alone" >&2
  fi
done
if docker network inspect "$FLEET_NETWORK" >/dev/null 2>&1; then
  docker network rm "$FLEET_NETWORK" >/dev/null && echo "[fleet/down] removed network $FLEET_NETWORK" \
    || echo "[fleet/down] network $FLEET_NETWORK still has containers attached: left" >&2
fi
