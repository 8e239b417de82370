#!/usr/bin/env bash
# Removes the lab: containers ct200 and pro6000 and the network specdec-lab (only those the lab made: they carry
# the label specdec.lab=pivot). Waits for the lab's lock (a test or pivot using the lab ends first). Idempotent: a
# second run says there is nothing to remove. `make lab-down` runs it and lab/fleet/down.sh. Usage: lab/down.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lab/lab.env
. lab/lab.env
# shellcheck source=lab/containers.sh
. lab/containers.sh
log() { printf '[lab/down] %s\n' "$*"; }
docker info >/dev/null 2>&1 || { echo "down.sh: no docker engine answers; nothing to remove"; exit 0; }
lab_lock
lab_remove "$LAB_LABEL" "$LAB_NETWORK" "$LAB_TRAINING" "$LAB_INFERENCE"
