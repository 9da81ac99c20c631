#!/usr/bin/env bash
# make demo: the main job on a local fleet. Bring up HAProxy + three vLLM hosts (systemd containers, real vLLM CPU
# build) with playbooks/site.yml, show the plan, load-test one host against it, overload the fleet through HAProxy
# (each server held to its plan), roll the fleet under load beside the naive restart loop, then apply a configuration
# vLLM refuses both ways, restore the fleet and summarise.
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

log "1/7 deploying the fleet with playbooks/site.yml (Molecule creates the hosts; about 5 minutes the first time)"
molecule converge -s fleet > "$out/site.log" 2>&1 || { tail -50 "$out/site.log"; die "site.yml failed: $out/site.log"; }

log "2/7 the plan each host runs (playbooks/plan.yml)"
ansible-playbook -i "$inventory" playbooks/plan.yml -e plan_out="$PWD/$out/plan.json" \
  | sed -n '/"msg": \[/,/^[^"]*\]/p' | sed -n 's/^[^"]*"\(.*\)",\{0,1\}[^"]*$/  \1/p' | grep -v '^  msg$'  # the table rows

log "3/7 load test of vllm-3 against its plan, out of rotation (playbooks/loadtest.yml)"
# Small scale, as in the fleet tests: 16 generated tokens per request, concurrency 4 then 8 (the plan's
# max_num_seqs) at the workload's p99 context. Latency bounds are relaxed: every host shares two CPU cores.
loadtest_rc=0
# Its reports go to this demo's directory, so that an earlier run's can never stand in for this one's.
ansible-playbook -i "$inventory" playbooks/loadtest.yml -e target=vllm-3 -e vllm_loadtest_output_len=16 \
  -e '{"vllm_loadtest_concurrency": [4, 8]}' -e vllm_loadtest_ttft_p99_ms=120000 -e vllm_loadtest_itl_p99_ms=30000 \
  -e vllm_loadtest_reports_dir="$PWD/$out" -e vllm_loadtest_run=loadtest > "$out/loadtest.log" 2>&1 || loadtest_rc=$?
lt=$out/loadtest/vllm-3-main.json
[ -f "$lt" ] || { tail -30 "$out/loadtest.log"; die "the load test wrote no report: $out/loadtest.log"; }
cp "$lt" "$out/loadtest-vllm-3.json"; cp "${lt%.json}.png" "$out/loadtest-vllm-3.png"

log "4/7 five times the fleet's planned concurrency through HAProxy: each server held to its plan (maxconn)"
# Each server's maxconn is its plan's concurrency_limit, said by its vllm-watchdog's agent; HAProxy queues the rest
# for the first free slot and answers 503 (Retry-After) to what waited longer than timeout queue. Its counters are
# cleared first, so each server's most sessions at once (smax) is this run's.
ansible -i "$inventory" balancer-1 -m ansible.builtin.shell -a "echo 'clear counters' | socat stdio /run/haproxy/admin.sock" \
  > /dev/null
slots=$(python -c 'import json,sys; print(sum(p["concurrency_limit"] for i in json.load(open(sys.argv[1])).values()
                                            for p in (i or {}).values()))' "$out/plan.json")
LOADGEN_API_KEY="$key" python tools/loadgen.py http://127.0.0.1:18080/v1/completions --model tiny-llama \
  --clients $((5 * slots)) --streaming-clients 0 --max-tokens 32 --extra-body '{"ignore_eos": true}' --duration 20 \
  --report "$out/overload-load.json" --events "$out/overload-load.jsonl" 2> "$out/overload-load.log" || true
ansible-playbook -i "$inventory" playbooks/balancer_status.yml -e status_out="$PWD/$out/overload-status.json" \
  > "$out/overload-status.log" 2>&1 || log "   balancer_status.yml failed: $out/overload-status.log"

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

log "5/7 rolling restart under load (playbooks/rolling_restart.yml), then the naive pattern under the same load"
roll_rc=0
# The roll draws its own timeline.png (tools/timeline.py) with the load's requests above its hosts' states.
under_load roll ansible-playbook -i "$inventory" playbooks/rolling_restart.yml \
  -e "rolling_restart_load_events=$PWD/$out/roll-load.jsonl" || roll_rc=$?
keep_roll_report() {  # the newest roll's report, table and timeline (run directories are named after their start)
  local run
  run=$(ls -d reports/rolling-restart/*/ | sort | tail -1)
  cp "${run}report.json" "$out/$1.json"
  cp "${run}table.txt" "$out/$1-table.txt"
  cp "${run}timeline.png" "$out/$2"
}
keep_roll_report rolling-restart timeline.png
# The common pattern: restart each host in turn, no drain, not waiting for the balancer. Its host events (for the
# timeline) are when each `systemctl restart` began and returned.
naive_restart() {
  local host
  for host in $(ansible -i "$inventory" vllm --list-hosts | tail -n +2); do
    host_event naive "$host" "restart (no drain)"
    ansible -i "$inventory" "$host" -m ansible.builtin.systemd_service -a "name=vllm@main.service state=restarted" \
      || return 1
    host_event naive "$host" "active again"
  done
}
host_event() {  # <file> <host> <state>
  printf '{"time": %s, "host": "%s", "state": "%s"}\n' "$(date +%s.%N)" "$2" "$3" >> "$out/$1-hosts.jsonl"
}
under_load naive naive_restart || log "the naive restart failed: $out/naive.log"

log "6/7 a configuration vLLM refuses at start, applied by the roll and by the naive loop, under the same load"
# A 64k context of tiny-llama-long: it fits the stand-in A10G, so the plan passes preflight, but not the CPU build's
# 1 GiB of KV, so vLLM refuses at start (the mistake sizing cannot see on a machine it does not model). A start limit
# of 1 makes each refusal final after one start (~100 s here) instead of three.
bad=$out/bad-config.json
printf '%s\n' '{"vllm_model_dir": "/srv/vllm-fleet-cache/models/tiny-llama-long",' \
  ' "vllm_workload": {"p99_context": 65536, "peak_concurrency": 1}, "vllm_start_limit_burst": 1}' > "$bad"
servers() {  # HAProxy's view on balancer-1, read by the balancer role's own module: {"vllm-1-main": "UP", ...}
  ANSIBLE_LOAD_CALLBACK_PLUGINS=1 ANSIBLE_STDOUT_CALLBACK=ansible.posix.json \
    ansible -i "$inventory" balancer-1 -m vllm_fleet.fleet.haproxy_servers -a backend=vllm 2>/dev/null | python -c '
import json, sys
text = sys.stdin.read()  # the JSON run, between the task-timing lines of profile_tasks
run = json.JSONDecoder().raw_decode(text[text.index("{"):])[0]
print(json.dumps({s["name"]: s["state"] for s in run["plays"][0]["tasks"][0]["hosts"]["balancer-1"]["servers"]}))' \
    > "$out/$1-servers.json"
}
bad_roll_rc=0
under_load bad-roll ansible-playbook -i "$inventory" playbooks/rolling_restart.yml -e rolling_restart_apply_config=true \
  -e "@$bad" -e "rolling_restart_load_events=$PWD/$out/bad-roll-load.jsonl" || bad_roll_rc=$?
servers bad-roll
keep_roll_report bad-roll timeline-bad-roll.png
log "   the roll stopped at its first host (exit $bad_roll_rc); putting that host back with the inventory's configuration"
first=$(python -c 'import json,sys; print(sorted(json.load(open(sys.argv[1]))["hosts"])[0])' "$out/bad-roll.json")
ansible-playbook -i "$inventory" playbooks/rolling_restart.yml --limit "localhost,$first" \
  -e rolling_restart_apply_config=true > "$out/restore-$first.log" 2>&1 || die "restoring $first failed: $out/restore-$first.log"
# The naive loop: the new configuration and a restart on every host in turn (site.yml per host), going on whatever
# happened to the one before. Its host events are when each host's run began and ended.
naive_apply() {
  local host rc
  for host in $(ansible -i "$inventory" vllm --list-hosts | tail -n +2); do
    host_event bad-naive "$host" "apply + restart (no drain)"
    rc=0; ansible-playbook -i "$inventory" playbooks/site.yml --limit "$host" -e "@$bad" || rc=$?
    host_event bad-naive "$host" "$([ "$rc" = 0 ] && echo serving || echo failed)"
  done
}
under_load bad-naive naive_apply || true
servers bad-naive
log "   every host is down: restoring the fleet with playbooks/site.yml (nothing left in rotation to protect)"
ansible-playbook -i "$inventory" playbooks/site.yml > "$out/restore-fleet.log" 2>&1 \
  || die "restoring the fleet failed: $out/restore-fleet.log"
for _ in $(seq 30); do  # HAProxy's health checks see the servers UP within seconds
  servers restored
  python -c 'import json,sys; sys.exit(set(json.load(open(sys.argv[1])).values()) != {"UP"})' "$out/restored-servers.json" \
    && break
  sleep 2
done

log "7/7 summary"
python tools/timeline.py --requests "$out/naive-load.jsonl" --hosts "$out/naive-hosts.jsonl" --out "$out/timeline-naive.png" \
  --title "the naive pattern: serial systemctl restart, no drain, same load" >/dev/null
python tools/timeline.py --requests "$out/bad-naive-load.jsonl" --hosts "$out/bad-naive-hosts.jsonl" \
  --out "$out/timeline-bad-naive.png" --title "the same configuration, applied by the naive loop" >/dev/null
python - "$out" "$roll_rc" "$loadtest_rc" "$bad_roll_rc" <<'PY'
import json, sys
out, roll_rc, loadtest_rc, bad_roll_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
load = lambda name: json.load(open(f"{out}/{name}"))
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
                  f" ({'the CPU build: not comparable' if cal['error_percent'] is None else format(cal['error_percent'], '+.0f') + '%'}):"
                  " the plan now uses the measured figure")
lt = load("loadtest-vllm-3.json")
v = lt["verdict"]
print(f"\nLoad test of vllm-3 (playbooks/loadtest.yml, exit {loadtest_rc}): {'PASSED' if v['passed'] else 'FAILED'},"
      f" held concurrency {v['held_concurrency']} at a p99 context of {lt['p99_context']} tokens"
      f" (plan: max_num_seqs {lt['plan']['max_num_seqs']})")
for st in lt["stages"]:
    print(f"  concurrency {st['concurrency']:>3}: {st['completed']}/{st['requests']} completed, {st['failed']} failed,"
          f" peak KV usage {st['peak_kv_cache_usage']:.0%}, preemptions {st['preemptions']:.0f},"
          f" TTFT p99 {st['p99_ttft_ms'] / 1000:.1f} s")
for b in v["broken"]:
    print(f"  broken: {b['limit']}: {b['message']}")
print(f"  picture: {out}/loadtest-vllm-3.png")
over, status = load("overload-load.json"), load("overload-status.json")
records = [json.loads(line) for line in open(f"{out}/overload-load.jsonl")]
times = sorted(r["end"] - r["start"] for r in records if r["ok"])
refused = [r["end"] - r["start"] for r in records if r.get("status") == 503]
others = [r for r in records if not r["ok"] and r.get("status") != 503]
print(f"\nOverload through HAProxy ({over['clients']} clients, no pause, 20 s; each server held to its plan's"
      f" concurrency by its watchdog's agent):")
for s in sorted(status["balancer_status"]["balancer-1"], key=lambda s: s["name"]):
    print(f"  {s['name']:14} maxconn {s['slim']:>3}, most at once {s['smax']:>3}")
queue = status["balancer_queues"]["balancer-1"][0]
print(f"  {len(records)} sent, {len(times)} served (p99 {times[int(0.99 * (len(times) - 1))]:.1f} s),"
      f" {len(refused)} answered 503 after at most {max(refused, default=0):.1f} s, {len(others)} other failures;"
      f" HAProxy queued at most {queue['qmax']} at once")
print(f"\nRolling restart: {roll['outcome']} (playbook exit {roll_rc}); the roll's own table (seconds):")
print("".join("  " + line for line in open(f"{out}/rolling-restart-table.txt")), end="")
print(f"\nRequests through HAProxy, side by side (same load):")
print(f"  {'restart pattern':22} {'sent':>6} {'failed':>7} {'streaming':>10} {'non-streaming':>14}")
for name, t in loads.items():
    print(f"  {name:22} {t['sent']:>6} {t['failed']:>7} {t['failed_streaming']:>10} {t['failed_non_streaming']:>14}")
bad = {"rolling_restart.yml": ("bad-roll", f"stopped at its first host (exit {bad_roll_rc})"),
       "naive loop (site.yml)": ("bad-naive", "restarted every host in turn")}
print("\nA configuration vLLM refuses at start (64k context of tiny-llama-long: passes preflight for the stand-in"
      " A10G, not the CPU build's 1 GiB KV), side by side (same load):")
print(f"  {'applied by':22} {'sent':>6} {'failed':>7}  {'servers UP after':>17}  what it did")
for name, (f, did) in bad.items():
    t, states = load(f"{f}-load.json")["totals"], load(f"{f}-servers.json")
    up = sum(st == "UP" for st in states.values())
    print(f"  {name:22} {t['sent']:>6} {t['failed']:>7}  {f'{up} of {len(states)}':>17}  {did}")
restored = load("restored-servers.json")
print(f"  afterwards, with the inventory's configuration: {sum(st == 'UP' for st in restored.values())} of"
      f" {len(restored)} servers UP")
print(f"Files in {out}: rolling-restart.json (and -table.txt), roll-load.json, naive-load.json, naive-hosts.jsonl, timeline*.png,"
      f" loadtest-vllm-3.json/.png, bad-roll.json, bad-*-load.json, plan.json, calibration/ (what each start measured),"
      f" *.log")
PY
log "the fleet is still up: ansible-playbook -i $inventory playbooks/<playbook>.yml; make clean removes it"
exit "$roll_rc"
