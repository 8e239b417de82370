# shellcheck shell=bash
# Container steps shared by the single-host lab (lab/up.sh, lab/down.sh) and the fleet lab (lab/fleet/up.sh,
# lab/fleet/down.sh). Sourced. Every name, label and network is an argument, so neither lab's scripts can touch
# the other's containers; a container of the same name that lacks the caller's label is never removed.
# The caller defines `log MESSAGE` (its own prefix).

# lab_up_args SCRIPT HELP_LINES ARGS...: the options of both up.sh scripts. Sets reset, provision and extra.
# shellcheck disable=SC2034  # reset, provision and extra are the caller's
lab_up_args() {
  local script=$1 help_lines=$2
  shift 2
  reset=0 provision=1 extra=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --reset) reset=1 ;;
      --no-provision) provision=0 ;;
      --) shift; extra=("$@"); break ;;
      -h|--help) sed -n "${help_lines}p" "$script"; exit 0 ;;
      *) echo "up.sh: unknown option $1 (use --reset, --no-provision, -- ANSIBLE_ARGS)" >&2; exit 2 ;;
    esac
    shift
  done
}

# lab_image_id IMAGE: prints the image's id; exits naming the fix when no docker engine answers or it is missing.
lab_image_id() {
  docker info >/dev/null 2>&1 || { echo "up.sh: no docker engine answers; run lab/setup-docker.sh first" >&2; exit 1; }
  docker image inspect -f '{{.Id}}' "$1" 2>/dev/null \
    || { echo "up.sh: image $1 is missing; run lab/setup-docker.sh first" >&2; exit 1; }
}

# lab_network NETWORK LABEL: creates the user network (with the label) unless it exists.
lab_network() {
  docker network inspect "$1" >/dev/null 2>&1 \
    || { docker network create --label "$2" "$1" >/dev/null; log "network $1 created"; }
}

# lab_container NAME IMAGE IMAGE_ID NETWORK LABEL RESET [PUBLISH ARGS...]: the container NAME running systemd as
# PID 1 (unprivileged), made from IMAGE: created when missing, recreated on RESET=1 or when made from an older
# image, started when stopped. A container NAME without LABEL was not made by this lab: exit, left alone.
lab_container() {
  local name=$1 image=$2 image_id=$3 network=$4 label=$5 reset=$6 current
  shift 6
  current=$(docker inspect -f '{{.Image}} {{.State.Running}} {{index .Config.Labels "specdec.lab"}}' "$name" \
    2>/dev/null || true)
  if [ -n "$current" ] && [ "${current##* }" != "${label#*=}" ]; then
    echo "up.sh: a container $name exists that this lab did not make (no label $label): left alone" >&2
    exit 1
  fi
  if [ -n "$current" ] && { [ "$reset" = 1 ] || [ "${current%% *}" != "$image_id" ]; }; then
    [ "$reset" = 1 ] || log "$name was made from an older image: recreating it"
    docker rm -f "$name" >/dev/null
    current=""
  fi
  if [ -z "$current" ]; then
    docker run -d --name "$name" --hostname "$name" --network "$network" --label "$label" \
      --tmpfs /run --tmpfs /run/lock --tmpfs /tmp -v /sys/fs/cgroup:/sys/fs/cgroup:rw \
      "$@" "$image" >/dev/null
    log "$name started from $image"
  else
    local running
    read -r _ running _ <<<"$current"
    if [ "$running" != true ]; then docker start "$name" >/dev/null; log "$name restarted"; fi
  fi
}

# lab_wait_systemd NAME...: waits (60 s each) until systemd in every container is running or degraded.
lab_wait_systemd() {
  local name state
  for name in "$@"; do
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
}

# lab_remove LABEL NETWORK NAME...: stops and removes the named containers that carry LABEL, then the network if it is
# empty; says so when there was nothing to remove (a second run).
lab_remove() {
  local label=$1 network=$2 name found removed=0
  shift 2
  for name in "$@"; do
    found=$(docker inspect -f '{{index .Config.Labels "specdec.lab"}}' "$name" 2>/dev/null || true)
    if [ "$found" = "${label#*=}" ]; then
      docker rm -f "$name" >/dev/null
      log "removed $name"
      removed=1
    elif docker inspect "$name" >/dev/null 2>&1; then
      log "$name exists but was not made by this lab (no label $label): left alone" >&2
    fi
  done
  if docker network inspect "$network" >/dev/null 2>&1; then
    if docker network rm "$network" >/dev/null; then
      log "removed network $network"
      removed=1
    else
      log "network $network still has containers attached: left" >&2
    fi
  fi
  [ "$removed" = 1 ] || log "nothing to remove: no container of this lab ($*), no network $network"
}
