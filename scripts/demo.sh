#!/usr/bin/env bash
# make demo: the main job on a local fleet. Bring up HAProxy + three vLLM hosts (systemd containers, real vLLM CPU
# build) with playbooks/site.yml, show the plan, roll the fleet under load, then summarise what happened.
# The fleet stays up afterwards for playing with (`make clean` removes it).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
export ANSIBLE_CONFIG=$PWD/ansible.cfg ANSIBLE_FORCE_COLOR=${ANSIBLE_FORCE_COLOR:-1}
inventory=molecule/shared/inventory/fleet.yml
key='k3y\with "quotes" $HOME %i and spaces'   # molecule/shared/inventory/group_vars/vllm.yml
out=reports/demo/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
# What each start measured (the calibration store): site.yml records it, plan.yml plans with it.
export VLLM_FLEET_CALIBRATION_DIR=$PWD/$out/calibration

log "1/4 deploying the fleet with playbooks/site.yml (Molecule creates the hosts; about 5 minutes the first time)"
molecule converge -s fleet > "$out/site.log" 2>&1 || { tail -50 "$out/site.log"; die "site.yml failed: $out/site.log"; }

log "2/4 the plan each host runs (playbooks/plan.yml)"
ansible-playbook -i "$inventory" playbooks/plan.yml -e plan_out="$PWD/$out/plan.json" \
  | sed -n '/"msg": \[/,/^[^"]*\]/p' | sed -n 's/^[^"]*"\(.*\)",\{0,1\}[^"]*$/  \1/p' | grep -v '^  msg$'  # the table rows

# The same load around a command: 2 clients (1 streaming) through HAProxy on 127.0.0.1:18080. Light on purpose:
# the CPU build's workers busy-poll for 1 s after every step and starve a restarting host on two cores (see Load in
# molecule/shared/tests/fleet.py, which the tests use with the same figures).
under_load() {
  local name=$1; shift
  LOADGEN_API_KEY="$key" python tools/loadgen.py http://127.0.0.1:18080/v1/completions --model tiny-llama \
    --clients 2 --streaming-clients 1 --max-tokens 8 --pause 1.5 --duration 3600 --stop-file "$out/$name.stop" \
    --report "$out/$name-load.json" --events "$out/$name-load.jsonl" 2> "$out/$name-load.log" &
  local load_pid=$! rc=0
  sleep 5
  "$@" > "$out/$name.log" 2>&1 || rc=$?
  sleep 5
  touch "$out/$name.stop"; wait "$load_pid" || true
  return "$rc"
}

log "3/4 rolling restart under load (playbooks/rolling_restart.yml), then the naive pattern under the same load"
roll_rc=0
under_load roll ansible-playbook -i "$inventory" playbooks/rolling_restart.yml || roll_rc=$?
report=$(ls -d reports/rolling-restart/*/ | sort | tail -1)report.json
cp "$report" "$out/rolling-restart.json"
# The common pattern: restart each host in turn, no drain, not waiting for the balancer. Its host events (for the
# timeline) are when each `systemctl restart` began and returned.
naive_restart() {
  local host
  for host in $(ansible -i "$inventory" vllm --list-hosts | tail -n +2); do
    host_event "$host" "restart (no drain)"
    ansible -i "$inventory" "$host" -m ansible.builtin.systemd_service -a "name=vllm@main.service state=restarted" \
      || return 1
    host_event "$host" "active again"
  done
}
host_event() {
  printf '{"time": %s, "host": "%s", "state": "%s"}\n' "$(date +%s.%N)" "$1" "$2" >> "$out/naive-hosts.jsonl"
}
under_load naive naive_restart || log "the naive restart failed: $out/naive.log"

log "4/4 summary"
python tools/timeline.py --requests "$out/roll-load.jsonl" --hosts "$out/rolling-restart.json" --out "$out/timeline.png" \
  --title "vllm-fleet demo: rolling restart of 3 vLLM hosts under load" >/dev/null
python tools/timeline.py --requests "$out/naive-load.jsonl" --hosts "$out/naive-hosts.jsonl" --out "$out/timeline-naive.png" \
  --title "the naive pattern: serial systemctl restart, no drain, same load" >/dev/null
python - "$out" "$roll_rc" <<'PY'
import json, sys
out, roll_rc = sys.argv[1], int(sys.argv[2])
plans = json.load(open(f"{out}/plan.json"))
loads = {"rolling_restart.yml": json.load(open(f"{out}/roll-load.json"))["totals"],
         "naive serial restart": json.load(open(f"{out}/naive-load.json"))["totals"]}
roll = json.load(open(f"{out}/rolling-restart.json"))
print("\nDeployed: HAProxy on balancer-1 (127.0.0.1:18080) in front of")
for host, inst in sorted(plans.items()):
    for name, p in sorted((inst or {}).items()):
        a = p["engine_args"]
        print(f"  {host}/{name}: {p['model']} on {p['gpus']['used']}x {p['gpus']['name']} (stand-in GPU; vLLM CPU build)"
              f" max_model_len {a['max_model_len']}, max_num_seqs {a['max_num_seqs']}, utilization"
              f" {a['gpu_memory_utilization']}, fits: {p['fits']}")
        cal = p.get("calibration")
        if cal and cal.get("measured_kv_cache_bytes") is not None:
            print(f"    KV cache: predicted {cal['predicted_kv_cache_bytes'] / 2**30:.2f} GiB for the stand-in GPU, vLLM had"
                  f" {cal['measured_kv_cache_bytes'] / 2**30:.2f} GiB at its start of {cal['source'].get('started_at')}"
                  f" ({cal['error_percent']:+.0f}%): the plan now uses the measured figure")
print(f"\nRolling restart: {roll['outcome']} (playbook exit {roll_rc})")
print(f"  {'host':8} {'drain':>7} {'stop':>7} {'start->ready':>13} {'vLLM own':>9} {'enable':>7} {'total':>7} {'overhead':>9}")
for host, r in sorted(roll["hosts"].items()):
    f = lambda v: "-" if v is None else f"{v:.1f}s"
    print(f"  {host:8} {f(r['drain_wait_s']):>7} {f(r['stop_s']):>7} {f(r['start_to_ready_s']):>13}"
          f" {f(r['vllm_start_to_ready_s']):>9} {f(r['enable_s']):>7} {f(r['total_s']):>7} {f(r['overhead_s']):>9}")
print(f"\nRequests through HAProxy, side by side (same load):")
print(f"  {'restart pattern':22} {'sent':>6} {'failed':>7} {'streaming':>10} {'non-streaming':>14}")
for name, t in loads.items():
    print(f"  {name:22} {t['sent']:>6} {t['failed']:>7} {t['failed_streaming']:>10} {t['failed_non_streaming']:>14}")
print(f"Files in {out}: rolling-restart.json, roll-load.json, naive-load.json, naive-hosts.jsonl, timeline.png,"
      f" timeline-naive.png, plan.json, calibration/ (what each start measured), *.log")
PY
log "the fleet is still up: ansible-playbook -i $inventory playbooks/<playbook>.yml; make clean removes it"
exit "$roll_rc"
