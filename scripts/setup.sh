#!/usr/bin/env bash
# make setup: the Python environments (scripts/setup-python.sh, then the collection link) and the docker lab image
# (lab/setup-docker.sh) at the same time, each to its own log, printed when it ends with its time. Fails when
# either fails (the other is then stopped). Each part alone: make setup-python / make setup-docker.
set -euo pipefail
cd "$(dirname "$0")/.."
logs=$(mktemp -d)
start=$SECONDS
declare -A part_of=()
(bash scripts/setup-python.sh && bash scripts/link-collection.sh) >"$logs/python.log" 2>&1 &
part_of[$!]=python
bash lab/setup-docker.sh >"$logs/docker.log" 2>&1 &
part_of[$!]=docker
echo "[setup] python and docker set-up started (logs: $logs)"
failed=0
while [ ${#part_of[@]} -gt 0 ]; do
  rc=0
  wait -n -p done_pid "${!part_of[@]}" || rc=$?
  part=${part_of[$done_pid]}
  unset "part_of[$done_pid]"
  printf '===== set-up %s: %s after %d s =====\n' "$part" "$([ "$rc" = 0 ] && echo "done" || echo "FAILED (exit $rc)")" \
    $((SECONDS - start))
  cat "$logs/$part.log"
  if [ "$rc" != 0 ]; then
    failed=1
    for pid in "${!part_of[@]}"; do kill "$pid" 2>/dev/null || true; done
  fi
done
exit "$failed"
