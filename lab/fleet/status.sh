#!/usr/bin/env bash
# Prints the fleet lab's state for humans: each container, each host's sglang.service (state, algorithm, plugin,
# /health on its published port) and the balancer's view (HAProxy `show stat` over the runtime API).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=lab/fleet/fleet.env
. lab/fleet/fleet.env
docker info >/dev/null 2>&1 || { echo "no docker engine answers (lab/setup-docker.sh starts one)"; exit 1; }
for i in "${!FLEET_HOSTS[@]}"; do
  name=${FLEET_HOSTS[$i]} port=$((FLEET_HOST_PORT_BASE + i + 1))
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "http://127.0.0.1:$port/health" || true)
  algo=$(curl -s --max-time 3 "http://127.0.0.1:$port/get_server_info" 2>/dev/null \
    | python3 -c 'import json,sys; print(json.load(sys.stdin).get("speculative_algorithm"))' 2>/dev/null || true)
  plugin=$(docker exec "$name" /opt/sglang/venv/bin/python -m pip show sglang-ddtree 2>/dev/null | sed -n 's/^Version: //p')
  printf '== %s: container %s; sglang.service %s; /health %s; algorithm %s; sglang-ddtree %s\n' "$name" \
    "$(docker inspect -f '{{.State.Status}}' "$name" 2>/dev/null || echo missing)" \
    "$(docker exec "$name" systemctl is-active sglang.service 2>/dev/null || echo -)" "${code:-no answer}" \
    "${algo:--}" "${plugin:-not installed}"
done
printf '== %s: container %s; haproxy.service %s; frontend http://127.0.0.1:%s\n' "$FLEET_LB" \
  "$(docker inspect -f '{{.State.Status}}' "$FLEET_LB" 2>/dev/null || echo missing)" \
  "$(docker exec "$FLEET_LB" systemctl is-active haproxy.service 2>/dev/null || echo -)" "$FLEET_LB_PORT"
.venv/bin/python lab/fleet/loadgen.py stat --api "127.0.0.1:$FLEET_API_PORT" 2>/dev/null | sed 's/^/   /' \
  || echo "   (runtime API 127.0.0.1:$FLEET_API_PORT does not answer)"
