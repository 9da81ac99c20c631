#!/usr/bin/env bash
# Issue 29's first question, asked of real vLLM: does the CPU build run one instance across two hosts (tensor
# parallel 2, one rank per host, vLLM's own multi-node mode without Ray), and how are its members coupled?
# Two containers of the test image on their own Docker network, the controller's vLLM (the fleet's release) mounted
# read-only, the tiny model. Prints each step's outcome and keeps both members' logs in reports/multinode/.
#   make probe-multinode        (about 5 minutes on two cores; needs `make models` and `make image`)
# What it found on 2026-12-07 is in docs/multi-node.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

venv=$(controller_venv "$VLLM_FLEET_RELEASE")
python_home=$(sed -n 's/^home = //p' "$venv/pyvenv.cfg")   # the venv's interpreter lives there: mount it too
python_home=$(dirname "$python_home")
model=$VLLM_FLEET_MODELS/tiny-llama
out=$here/../reports/multinode
net=vllm-fleet-multinode
mkdir -p "$out"

cleanup() {
  docker rm -f mn-head mn-follower >/dev/null 2>&1 || true
  docker network rm "$net" >/dev/null 2>&1 || true
}
trap cleanup EXIT
cleanup
docker network create "$net" >/dev/null
for name in mn-head mn-follower; do
  # shm_size as in molecule/shared/create.yml: the CPU build needs more than Docker's default 64 MiB of /dev/shm.
  docker run -d --name "$name" --hostname "$name" --network "$net" --shm-size 2g \
    -v "$VLLM_FLEET_CACHE:$VLLM_FLEET_CACHE:ro" -v "$python_home:$python_home:ro" \
    -v "$here/vllm_serve_node.py:/opt/vllm_serve_node.py:ro" \
    --entrypoint sleep "$VLLM_FLEET_IMAGE" infinity >/dev/null
done
address() { docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$1"; }
head_ip=$(address mn-head)
log "installing what the vllm role installs for the CPU build (libnuma1; g++ for torch's inductor) in both"
for name in mn-head mn-follower; do
  docker exec "$name" bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libnuma1 g++' \
    >/dev/null 2>&1 &
done
wait

# One member: the same engine arguments on both, its rank, and (the follower) --headless.
member() {  # <container> <rank> [extra args...]
  local name=$1 rank=$2
  shift 2
  docker exec -d -e "VLLM_HOST_IP=$(address "$name")" -e GLOO_SOCKET_IFNAME=eth0 -e VLLM_CPU_KVCACHE_SPACE=1 \
    -e HF_HUB_OFFLINE=1 "$name" bash -c "exec $venv/bin/python /opt/vllm_serve_node.py $model --dtype float16 \
      --max-model-len 512 --enforce-eager --tensor-parallel-size 2 --nnodes 2 --node-rank $rank \
      --master-addr $head_ip --master-port 29500 $* >> /tmp/vllm.log 2>&1"
}
stop_all() {
  for name in mn-head mn-follower; do docker exec "$name" pkill -9 -f 'VLLM::|vllm_serve_node|resource_tracker' || true; done
  sleep 2
}
health() { docker exec mn-head curl -s -m 2 -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health || true; }
complete() {
  docker exec mn-head curl -s -m 60 -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/v1/completions \
    -H 'Content-Type: application/json' -d "{\"model\": \"$model\", \"prompt\": \"Hello\", \"max_tokens\": 8}" || true
}
wait_ready() {  # <seconds>: 0 when the head serves /health within them
  local deadline=$((SECONDS + $1))
  while [ $SECONDS -lt $deadline ]; do [ "$(health)" = 200 ] && return 0; sleep 2; done
  return 1
}
start_group() {  # followers first, then the head
  member mn-follower 1 --headless
  member mn-head 0 --port 8000
  wait_ready 300
}
verdict() { printf '%-72s %s\n' "$1" "$2"; }

start=$SECONDS
if start_group; then verdict "group of two (TP 2 across hosts) starts" "yes, $((SECONDS - start)) s"; else
  verdict "group of two (TP 2 across hosts) starts" "NO (logs: $out)"; fi
verdict "a completion through the head" "HTTP $(complete)"
fallback=$(docker exec mn-head grep -c 'CPU SHM communicator disabled' /tmp/vllm.log || true)
verdict "tensor-parallel group on gloo over TCP (shared memory off across hosts)" \
  "$([ "${fallback:-0}" -gt 0 ] && echo yes || echo no)"

# The follower's engine dies: the head fails its next forward pass and exits.
docker exec mn-follower pkill -9 -f 'VLLM::Worker' || true
sleep 1
verdict "follower's engine killed: the next completion" "HTTP $(complete)"
sleep 5
verdict "... and the head then serves /health" "HTTP $(health)"

# The head dies: the follower stays up, waiting for ever.
stop_all
start_group >/dev/null || true
docker exec mn-head pkill -9 -f 'VLLM::|vllm_serve_node' || true
sleep 30
alive=$(docker exec mn-follower pgrep -c -f 'VLLM::Worker' || true)
verdict "head killed: follower processes still running 30 s later" "${alive:-0}"
# A head restarted alone does not rejoin the follower left running.
member mn-head 0 --port 8000
if wait_ready 120; then verdict "head restarted alone rejoins the running follower" "yes"; else
  verdict "head restarted alone rejoins the running follower" "no (not ready in 120 s)"; fi

# Restarted as a group, in order, it serves again.
stop_all
if start_group; then verdict "group restarted in order (follower, then head)" "HTTP $(complete)"; else
  verdict "group restarted in order (follower, then head)" "NO"; fi
for name in mn-head mn-follower; do docker exec "$name" cat /tmp/vllm.log > "$out/$name.log" 2>&1 || true; done
log "logs: $out"
