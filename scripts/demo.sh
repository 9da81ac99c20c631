#!/usr/bin/env bash
# make demo: the main job on a local fleet. Bring up HAProxy + three vLLM hosts (systemd containers, real vLLM CPU
# build) with playbooks/site.yml, show the plan, roll the fleet under load, then summarise what happened.
# The fleet stays up afterwards for playing with (`make clean` removes it).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
export ANSIBLE_CONFIG=$PWD/ansible.cfg ANSIBLE_FORCE_COLOR=${ANSIBLE_FORCE_COLOR:-1}
inventory=molecule/shared/inventory/fleet.yml
key=test-key-not-a-secret   # molecule/shared/inventory/group_vars/vllm.yml
out=reports/demo/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"

log "1/4 deploying the fleet with playbooks/site.yml (Molecule creates the hosts; about 6 minutes the first time)"
molecule converge -s fleet > "$out/site.log" 2>&1 || { tail -50 "$out/site.log"; die "site.yml failed: $out/site.log"; }

log "2/4 the plan each host runs (playbooks/plan.yml)"
ansible-playbook -i "$inventory" playbooks/plan.yml -e plan_out="$PWD/$out/plan.json" \
  | sed -n '/One row per host/,/^$/p'

log "3/4 rolling restart under load: 4 clients (2 streaming) through HAProxy on 127.0.0.1:18080"
LOADGEN_API_KEY=$key python tools/loadgen.py http://127.0.0.1:18080/v1/completions --model tiny-llama \
  --clients 4 --streaming-clients 2 --max-tokens 8 --pause 0.25 --duration 1800 --stop-file "$out/load.stop" \
  --report "$out/load.json" --events "$out/load.jsonl" 2> "$out/load.log" &
load_pid=$!
sleep 5
roll_rc=0
ansible-playbook -i "$inventory" playbooks/rolling_restart.yml > "$out/roll.log" 2>&1 || roll_rc=$?
sleep 5
touch "$out/load.stop"; wait "$load_pid" || true
report=$(ls -d reports/rolling-restart/*/ | sort | tail -1)report.json
cp "$report" "$out/rolling-restart.json"

log "4/4 summary"
python tools/timeline.py --requests "$out/load.jsonl" --hosts "$out/rolling-restart.json" --out "$out/timeline.png" \
  --title "vllm-fleet demo: rolling restart of 3 vLLM hosts under load" >/dev/null
python - "$out" "$roll_rc" <<'PY'
import json, sys
out, roll_rc = sys.argv[1], int(sys.argv[2])
plans = json.load(open(f"{out}/plan.json"))
load = json.load(open(f"{out}/load.json"))["totals"]
roll = json.load(open(f"{out}/rolling-restart.json"))
print("\nDeployed: HAProxy on balancer-1 (127.0.0.1:18080) in front of")
for host, inst in sorted(plans.items()):
    for name, p in sorted((inst or {}).items()):
        a = p["engine_args"]
        print(f"  {host}/{name}: {p['model']} on {p['gpus']['used']}x {p['gpus']['name']} (stand-in GPU; vLLM CPU build)"
              f" max_model_len {a['max_model_len']}, max_num_seqs {a['max_num_seqs']}, utilization"
              f" {a['gpu_memory_utilization']}, fits: {p['fits']}")
print(f"\nRolling restart: {roll['outcome']} (playbook exit {roll_rc})")
print(f"  {'host':8} {'drain':>7} {'stop':>7} {'start->ready':>13} {'vLLM own':>9} {'enable':>7} {'total':>7} {'overhead':>9}")
for host, r in sorted(roll["hosts"].items()):
    f = lambda v: "-" if v is None else f"{v:.1f}s"
    print(f"  {host:8} {f(r['drain_wait_s']):>7} {f(r['stop_s']):>7} {f(r['start_to_ready_s']):>13}"
          f" {f(r['vllm_start_to_ready_s']):>9} {f(r['enable_s']):>7} {f(r['total_s']):>7} {f(r['overhead_s']):>9}")
print(f"\nRequests through HAProxy during the roll: {load['sent']} sent, {load['failed']} failed"
      f" ({load['failed_streaming']} streaming, {load['failed_non_streaming']} non-streaming)")
print(f"Files: {out}/rolling-restart.json, {out}/load.json, {out}/timeline.png, {out}/plan.json")
PY
log "the fleet is still up: ansible-playbook -i $inventory playbooks/<playbook>.yml; make clean removes it"
exit "$roll_rc"
