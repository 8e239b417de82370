#!/usr/bin/env bash
# The README's lab command (make lab): sets up docker and the image, starts the lab in its initial state, runs
# the pivot (playbooks/pivot.yml) against it and says where the report is.
# Usage: lab/run-pivot.sh [extra ansible-playbook args, e.g. --check --diff]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lab/lab.env
. lab/lab.env
lab_lock
bash lab/setup-docker.sh
bash lab/up.sh
if [ ! -f playbooks/pivot.yml ]; then
  echo "[lab/run-pivot] playbooks/pivot.yml does not exist yet: the lab is up (lab/status.sh shows it), the pivot" >&2
  echo "[lab/run-pivot] cannot run until the playbooks are written." >&2
  exit 2
fi
start=$(date +%s)
ANSIBLE_CONFIG=${ANSIBLE_CONFIG:-$PWD/ansible.cfg} "$LAB_ANSIBLE_PLAYBOOK" -i inventories/lab playbooks/pivot.yml "$@"
echo "[lab/run-pivot] pivot finished in $(( $(date +%s) - start )) s"
bash lab/status.sh || true
for f in reports/pivot-report.md reports/pivot-report.json; do
  [ -f "$f" ] && echo "[lab/run-pivot] report: $PWD/$f"
done
