#!/usr/bin/env bash
# Removes the lab: containers ct200 and pro6000 and the network specdec-lab (only those the lab made: they carry
# the label specdec.lab=pivot). Usage: lab/down.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lab/lab.env
. lab/lab.env
docker info >/dev/null 2>&1 || { echo "down.sh: no docker engine answers; nothing to remove"; exit 0; }
for name in "$LAB_TRAINING" "$LAB_INFERENCE"; do
  label=$(docker inspect -f '{{index .Config.Labels "specdec.lab"}}' "$name" 2>/dev/null || true)
  if [ "$label" = "${LAB_LABEL#*=}" ]; then
    docker rm -f "$name" >/dev/null && echo "[lab/down] removed $name"
  elif docker inspect "$name" >/dev/null 2>&1; then
    echo "[lab/down] $name exists but is not a lab container (no label $LAB_LABEL): left alone" >&2
  fi
done
if docker network inspect "$LAB_NETWORK" >/dev/null 2>&1; then
  docker network rm "$LAB_NETWORK" >/dev/null && echo "[lab/down] removed network $LAB_NETWORK" \
    || echo "[lab/down] network $LAB_NETWORK still has containers attached: left" >&2
fi
