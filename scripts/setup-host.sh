#!/usr/bin/env bash
# Installs what the test fleet needs on this machine (Debian 12) and makes sure the Docker engine runs.
# Idempotent: installs only what is missing; starts dockerd only when `docker info` fails
# (these machines have no service manager that would start it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  log "installing Debian packages: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  log "starting dockerd"
  # The daemon outlives this script: it must not inherit the caller's open files (a `flock` around `make` would
  # otherwise stay held by dockerd for good).
  (
    for fd in $(ls /proc/$BASHPID/fd); do [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done
    exec nohup dockerd >/var/log/vllm-fleet-dockerd.log 2>&1 </dev/null
  ) &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || die "dockerd did not start; see /var/log/vllm-fleet-dockerd.log"
fi
log "docker engine $(docker version -f '{{.Server.Version}}') is running"
