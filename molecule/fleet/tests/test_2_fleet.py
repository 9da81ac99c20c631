"""Restart without downtime, proven with traffic through HAProxy (127.0.0.1:18080) on real vLLM hosts, and each
restart policy of the vllm unit doing what it claims. Runs after test_1_deployed; each test leaves every server UP
for the next one (pytest runs them in file order)."""
import collections
import csv
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

from fleet import API_KEY, INVENTORY, PROJECT, VLLM_VARS, Load, http, playbook, sh, unit_props, wait_until

VLLM_HOSTS = ["vllm-1", "vllm-2", "vllm-3"]
UNIT = "vllm@main.service"
# A 64k context of tiny-llama-long needs 2 GiB of KV for one request: it fits the A10G the stand-in nvidia-smi
# reports (so the plan passes preflight), but not the 1 GiB KV space of the CPU build (so vLLM refuses at start).
LONG_CONTEXT = {"vllm_model_dir": "/srv/vllm-fleet-cache/models/tiny-llama-long",
                "vllm_workload": {"p99_context": 65536, "peak_concurrency": 1}}
SMALL_GPU = [{"index": 0, "name": "NVIDIA T4", "uuid": "GPU-00000000-0000-0000-0000-000000000000",
              "memory_total_mib": 2048, "compute_capability": "7.5"}]
LOADS = {}  # load reports by test, for the side-by-side comparison


def server_states():
    """{server: UP | DOWN | MAINT} as balancer-1's admin socket reports them."""
    out = balancer("show servers state vllm")
    states = {}
    for line in out.splitlines()[2:]:
        f = line.split()
        if len(f) > 6:  # srv_name, srv_op_state (2 = UP), srv_admin_state (bit 0/1 = MAINT, 8 = DRAIN)
            states[f[3]] = "MAINT" if int(f[6]) & 0x23 else "UP" if f[5] == "2" else "DOWN"
    return states


def all_up():
    return set(server_states().values()) == {"UP"}


def latest_run():
    """The newest roll's directory (report.json, timeline.png, hosts/)."""
    return sorted(glob.glob(os.path.join(PROJECT, "reports", "rolling-restart", "*", "report.json")))[-1][:-12]


def latest_report():
    with open(os.path.join(latest_run(), "report.json")) as f:
        return json.load(f)


def healthy(host):
    return http(host, "/health", key=None, timeout=5)[0] == 200


def kill_engine_core(host):
    pid = sh(host, "pgrep -f '^VLLM::EngineCore'").stdout.split()[0]
    sh(host, f"kill -KILL {pid}")


def invocations():
    return {h: unit_props(h, UNIT, "InvocationID")["InvocationID"] for h in VLLM_HOSTS}


def restore_host(host, host_vars_file):
    """Drop a test's host_vars and roll the host with the inventory's own configuration (in a `finally`: the caller
    asserts on the roll afterwards, so that a failure of the test itself is what it reports)."""
    os.unlink(host_vars_file)
    return playbook("playbooks/rolling_restart.yml", "--limit", f"localhost,{host}",
                    "-e", "rolling_restart_apply_config=true")


def with_host_vars(host, values):
    """Write host_vars for one host into the scenario's inventory; returns the file to remove afterwards."""
    host_vars = os.path.join(os.path.dirname(INVENTORY), "host_vars")
    os.makedirs(host_vars, exist_ok=True)
    path = os.path.join(host_vars, f"{host}.yml")
    with open(path, "w") as f:
        json.dump(values, f)
    return path


# The roll journal of this scenario (molecule/shared/inventory/group_vars/all.yml).
JOURNAL = os.path.join(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY") or "/tmp/vllm-fleet-demo", "roll-journal")


def journal():
    out = {}
    for path in glob.glob(os.path.join(JOURNAL, "*.json")):
        with open(path) as f:
            record = json.load(f)
        out[record["host"]] = record
    return out


def roll_killed_at(step, host, *args):
    """Start playbooks/rolling_restart.yml and kill it, its whole process group at once (a controller that dies),
    as soon as the roll journal says `host` has reached `step`. Returns the journal's record."""
    proc = subprocess.Popen(["ansible-playbook", "-i", INVENTORY, os.path.join(PROJECT, "playbooks", "rolling_restart.yml"),
                             *args], cwd=PROJECT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(PROJECT, "ansible.cfg")))

    def reached():
        record = journal().get(host, {})
        assert proc.poll() is None or record.get("step") == step, f"the roll ended before {host} was {step}"
        return record if record.get("step") == step else None
    try:
        record = wait_until(reached, 600, interval=0.05, what=f"the roll journal to say {host} {step}")
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
    return record


def test_1_a_roll_killed_after_a_drain_and_after_a_stop_is_resumed_and_loses_no_request(tmp_path):
    """The roll under load, its controller killed twice: after vllm-1's drain, then (in the next run, which brings
    vllm-1 back first) after vllm-2's stop. Each time the roll journal on the controller says where the host was,
    the lock dies with the run, and the next run brings the host back before anything else. Meanwhile another
    playbook that changes rotation is refused by the lock. Every host is restarted once, no request is lost."""
    before = invocations()
    with Load(str(tmp_path), "roll") as load:
        first = roll_killed_at("drained", "vllm-1")
        assert server_states()["vllm-1-main"] == "MAINT" and set(journal()) == {"vllm-1"}
        assert first["playbook"] == "Roll the vLLM fleet" and first["steps"][:3] == ["start", "draining", "drained"]
        second = roll_killed_at("stopped", "vllm-2")
        assert server_states()["vllm-1-main"] == "UP" and set(journal()) == {"vllm-2"}, journal()
        assert sh("vllm-2", f"systemctl is-active {UNIT}", check=False).stdout.strip() != "active"
        # The last run: vllm-2 first, then vllm-3; a drain asked for meanwhile is refused by the lock.
        last = subprocess.Popen(["ansible-playbook", "-i", INVENTORY, os.path.join(PROJECT, "playbooks", "rolling_restart.yml"),
                                 "--limit", "vllm-2,vllm-3"], cwd=PROJECT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(PROJECT, "ansible.cfg")))
        wait_until(lambda: journal().get("vllm-2", {}).get("at", 0) > second["at"], 300, interval=0.2,
                   what="the last run to take vllm-2 through the runbook")
        refused = playbook("playbooks/drain_host.yml", "-e", "target=vllm-3")
        out, _ = last.communicate(timeout=1200)
    out = " ".join(out.split())
    assert refused.returncode != 0 and "holds the roll lock" in refused.stdout, refused.stdout[-2000:]
    assert "rolling_restart.yml --limit vllm-2,vllm-3" in refused.stdout
    assert last.returncode == 0, out[-3000:]
    assert "vllm-2 was left out of rotation by" in out and "last step stopped" in out
    LOADS["rolling_restart.yml"] = {**load.report["totals"], "hosts_restarted": len(VLLM_HOSTS)}
    totals = load.report["totals"]
    assert totals["sent"] > 50 and totals["failed"] == 0, load.report["errors"]
    assert journal() == {} and all_up()
    after = invocations()
    assert all(after[h] != before[h] for h in VLLM_HOSTS)
    report = latest_report()
    assert report["outcome"] == "ok" and sorted(report["hosts"]) == ["vllm-2", "vllm-3"]
    assert report["hosts"]["vllm-2"]["resumed"]["step"] == "stopped" and report["hosts"]["vllm-3"]["resumed"] is None
    # The roll ends with its table and its timeline (tools/timeline.py) next to report.json.
    assert "2 host(s), outcome ok" in out and "start->ready" in out, out[-3000:]
    with open(os.path.join(latest_run(), "timeline.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    for host, rec in report["hosts"].items():
        print(f"{host}: drain {rec['drain_wait_s']} s, stop {rec['stop_s']} s, start-to-ready {rec['start_to_ready_s']}"
              f" s (vLLM itself {rec['vllm_start_to_ready_s']} s), enable {rec['enable_s']} s, total {rec['total_s']}"
              f" s, overhead {rec['overhead_s']} s")
        assert rec["outcome"] == "ok" and rec["vllm_start_to_ready_s"] > 0
        assert abs(rec["total_s"] - rec["overhead_s"] - rec["vllm_start_to_ready_s"]) < 0.1
        # The model's files were read into the page cache while the host drained (the tiny model: weights, config,
        # tokenizer), none skipped.
        assert rec["prefetch"]["files"] >= 3 and rec["prefetch"]["bytes"] > 0, rec["prefetch"]
        assert rec["prefetch"]["skipped_bytes"] == 0, rec["prefetch"]
        # Where vLLM's start went, from its log and the first completion: on the CPU build, the rest (imports,
        # processes) is most of it; weights and engine init are what it printed.
        phases = rec["start_phases"]["main"]
        print(f"{host}: start phases {phases}")
        assert phases["weights_s"] is not None and phases["engine_init_s"] > 0 and phases["first_completion_s"] > 0
        assert phases["other_s"] > phases["weights_s"] + phases["engine_init_s"], phases
    assert "vLLM's start (seconds" in out and "vllm-3/main" in out, out[-3000:]


def test_1b_a_failure_domain_leaves_together_and_the_capacity_guard_counts_it_out():
    """Batches by failure domain (rolling_restart_batch_by): vllm-1 and vllm-2 share a rack, so they would leave
    rotation together, and the capacity guard counts both out. With rolling_restart_min_healthy 2 only vllm-3 would
    serve, so the roll is refused before either is drained (a guard that counts each host alone sees two others UP
    and drains both). Nothing restarts: this costs seconds."""
    racks = [with_host_vars(host, {"fleet_test_rack": rack})
             for host, rack in (("vllm-1", "r1"), ("vllm-2", "r1"), ("vllm-3", "r2"))]
    before = invocations()
    try:
        roll = playbook("playbooks/rolling_restart.yml", "-e", "rolling_restart_batch_by=fleet_test_rack",
                        "-e", "rolling_restart_min_healthy=2")
    finally:
        for path in racks:
            os.unlink(path)
    out = " ".join(roll.stdout.split())
    assert roll.returncode != 0, out[-3000:]
    for host, other in (("vllm-1", "vllm-2"), ("vllm-2", "vllm-1")):
        assert f"Not taking {host} out with {other}: servers UP on other hosts per balancer" in out, out[-3000:]
    assert "'balancer-1': 1" in out and "rolling_restart_min_healthy is 2" in out
    assert all_up() and invocations() == before and journal() == {}
    report = latest_report()
    assert report["outcome"] == "failed" and sorted(report["hosts"]) == ["vllm-1", "vllm-2"]  # vllm-3: next batch
    assert "2 host(s), outcome failed" in out


def test_2_naive_restart_side_by_side(tmp_path):
    """The same load during the common pattern on one host: `systemctl restart`, no drain, not waiting for the
    balancer to see it UP again. One host keeps the suite inside its time budget (all three add ~2 min);
    `make demo` runs the pattern across the whole fleet, beside the roll."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(PROJECT, "ansible.cfg"))
    with Load(str(tmp_path), "naive") as load:
        naive = subprocess.run(["ansible", "-i", INVENTORY, "vllm-1", "-m",
                                "ansible.builtin.systemd_service", "-a", f"name={UNIT} state=restarted"],
                               capture_output=True, text=True, env=env, cwd=PROJECT, timeout=1200, check=False)
    assert naive.returncode == 0, naive.stdout[-2000:] + naive.stderr[-2000:]
    LOADS["naive restart"] = {**load.report["totals"], "hosts_restarted": 1}
    print(f"\n{'restart pattern':22} {'hosts':>6} {'sent':>6} {'failed':>7} {'streaming':>10} {'non-streaming':>14}")
    for name, t in LOADS.items():
        print(f"{name:22} {t['hosts_restarted']:>6} {t['sent']:>6} {t['failed']:>7} {t['failed_streaming']:>10}"
              f" {t['failed_non_streaming']:>14}")
    with open(os.path.join(PROJECT, "reports", "restart-comparison.json"), "w") as f:
        json.dump(LOADS, f, indent=2)
    # A measurement, not a pass mark: with this project's unit (vLLM drains for --shutdown-timeout, the unit is
    # active only once /health answers) and HAProxy's retries, short requests survive even this pattern. What it
    # lacks is the roll's guards: it restarts the next host whether or not the last one came back, and it cuts
    # generations that outlast the shutdown timeout, which a drain in the balancer lets finish.
    wait_until(all_up, 120, 2, "every server UP after the naive restart")


def test_3_engine_death_under_load_fails_no_request_and_systemd_restarts_it(tmp_path):
    host = "vllm-2"
    before = int(unit_props(host, UNIT, "NRestarts")["NRestarts"])
    since = sh(host, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    with Load(str(tmp_path), "kill", streaming=0) as load:
        kill_engine_core(host)
        wait_until(lambda: server_states().get("vllm-2-main") == "DOWN", 30, 1, "HAProxy to see vllm-2 DOWN")
        wait_until(lambda: server_states().get("vllm-2-main") == "UP", 300, 2, "vllm-2 back UP by itself")
    # Non-streaming requests are retried on another server; a stream already under way could not be (none here).
    assert load.report["totals"]["failed"] == 0, load.report["errors"]
    assert int(unit_props(host, UNIT, "NRestarts")["NRestarts"]) == before + 1
    journal = sh(host, f"journalctl -u {UNIT} --since '{since}' --no-pager -o cat").stdout
    # The dead engine made the server exit with status 0: a clean exit that only Restart=always restarts.
    assert "Deactivated successfully" in journal or "status=0/SUCCESS" in journal, journal[-2000:]


def prometheus(path, query=None):
    """A GET on the Prometheus API of balancer-1 (playbooks/monitoring.yml put it there), from that host itself."""
    url = f"http://127.0.0.1:9090/api/v1/{path}" + (f"?query={urllib.parse.quote(query)}" if query else "")
    out = json.loads(sh("balancer-1", f"curl -sf -m 10 '{url}'").stdout)
    assert out["status"] == "success", out
    return out["data"]


def test_3_prometheus_alerts_on_that_engine_death_and_sees_every_instance():
    """After test_3's SIGKILL of vllm-2's EngineCore, the restart alert is pending or firing in a real Prometheus,
    from node exporter's systemd collector; every instance has KV and queue series and a runtime-OOM counter (0: the
    death was no OOM), and HAProxy's exporter reports every server UP."""
    def engine_died():
        return [a for a in prometheus("alerts")["alerts"]
                if a["labels"]["alertname"] == "VllmEngineDied" and a["state"] in ("pending", "firing")]
    alerts = wait_until(engine_died, 90, 5, "VllmEngineDied in Prometheus")
    print(f"Prometheus alerts after the engine kill: {alerts}")
    assert {(a["labels"]["host"], a["labels"]["instance"], a["labels"]["name"]) for a in alerts} == {
        ("vllm-2", "vllm-2-main", UNIT)}
    for metric in ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"):
        series = prometheus("query", metric)["result"]
        assert {r["metric"]["instance"] for r in series} == {h + "-main" for h in VLLM_HOSTS}, (metric, series)
        # The labels built from the inventory: model, GPU model (the stand-in's A10G), version.
        assert {(r["metric"]["model"], r["metric"]["vllm_version"]) for r in series} == {("tiny-llama", "0.32.0")}
        assert all("A10G" in r["metric"]["gpu_model"] for r in series), series
    # The runtime-OOM counter read vllm-2's journal with the engine death in it: a death is not an OOM.
    ooms = wait_until(lambda: prometheus("query", "vllm_fleet_runtime_oom_total")["result"], 60, 5,
                      "vllm-oom-counter's series in Prometheus")
    assert {(r["metric"]["instance"], r["value"][1]) for r in ooms} == {(h + "-main", "0") for h in VLLM_HOSTS}, ooms
    assert not [a for a in prometheus("alerts")["alerts"] if a["labels"]["alertname"] == "VllmRuntimeOutOfMemory"]
    up = wait_until(lambda: prometheus("query", 'haproxy_server_status{state="UP"} == 1')["result"], 30, 5,
                    "HAProxy's exporter in Prometheus")
    assert {r["metric"]["instance"] for r in up} == {h + "-main" for h in VLLM_HOSTS}, up
    targets = prometheus("targets")["activeTargets"]
    assert {t["health"] for t in targets} == {"up"}, [(t["scrapeUrl"], t["lastError"]) for t in targets]


def test_4_restart_on_failure_would_not_restart_a_dead_engine():
    """The counter-proof for Restart=always: the same engine death under Restart=on-failure (a runtime drop-in,
    which systemd applies to the running unit at daemon-reload) leaves the service down, with exit status 0."""
    host = "vllm-3"
    dropin = "/run/systemd/system/vllm@main.service.d"
    sh(host, f"mkdir -p {dropin} && printf '[Service]\\nRestart=on-failure\\n' > {dropin}/99-on-failure.conf"
             " && systemctl daemon-reload")
    try:
        assert unit_props(host, UNIT, "Restart")["Restart"] == "on-failure"
        before = int(unit_props(host, UNIT, "NRestarts")["NRestarts"])
        kill_engine_core(host)
        wait_until(lambda: unit_props(host, UNIT, "ActiveState")["ActiveState"] == "inactive", 60, 1,
                   "the server to exit after its engine died")
        time.sleep(15)  # longer than RestartSec: nothing brings it back
        p = unit_props(host, UNIT, "ActiveState", "Result", "ExecMainStatus", "NRestarts")
        print(f"with Restart=on-failure after an engine death: {p}")
        assert p == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0", "NRestarts": str(before)}
    finally:
        sh(host, f"rm -rf {dropin} && systemctl daemon-reload && systemctl start {UNIT}", timeout=400)
    assert unit_props(host, UNIT, "Restart")["Restart"] == "always"
    assert healthy(host)
    wait_until(all_up, 60, 2, "vllm-3 UP again in HAProxy")


def test_5_preflight_refuses_before_any_change():
    """A plan that cannot fit the host's GPU is refused by site.yml before anything on the host changes."""
    host = "vllm-2"
    before = sh(host, "md5sum /etc/systemd/system/vllm@main.service.d/10-plan.conf").stdout
    invocation = unit_props(host, UNIT, "InvocationID")["InvocationID"]
    with tempfile.NamedTemporaryFile("w", suffix=".json") as extra:
        json.dump({**LONG_CONTEXT, "vllm_gpus": SMALL_GPU}, extra)
        extra.flush()
        result = playbook("playbooks/site.yml", "--limit", host, "-e", "@" + extra.name)
    assert result.returncode != 0
    assert "vllm-2" in result.stdout and "estimated maximum model length" in result.stdout, result.stdout[-3000:]
    assert sh(host, "md5sum /etc/systemd/system/vllm@main.service.d/10-plan.conf").stdout == before
    assert unit_props(host, UNIT, "InvocationID")["InvocationID"] == invocation  # not restarted
    assert healthy(host)


def test_6_host_vllm_refuses_at_start_stops_the_roll_with_that_host_drained(tmp_path):
    """vllm-2 gets a plan that passes preflight but that vLLM refuses at start (its KV check). The roll of vllm-2
    and vllm-3 (rolling vllm-1 first would prove nothing more and cost minutes on two cores) stops at vllm-2: its unit
    gives up after the start limit and stays failed, it stays drained, vllm-3 is never touched, nothing is lost."""
    # A burst of 1 reaches the start limit as the default 3 would, minutes sooner: each failed start of the CPU build
    # takes ~100 s on two cores.
    bad = with_host_vars("vllm-2", {**LONG_CONTEXT, "vllm_start_limit_burst": 1})
    untouched = unit_props("vllm-3", UNIT, "InvocationID")
    since = sh("vllm-2", "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    try:
        with Load(str(tmp_path), "failing") as load:
            roll = playbook("playbooks/rolling_restart.yml", "--limit", "localhost,vllm-2,vllm-3",
                            "-e", "rolling_restart_apply_config=true")
        out = roll.stdout
        assert roll.returncode != 0
        stopped = [line for line in out.splitlines() if "Rolling restart stopped at vllm-2" in line]
        assert stopped, out[-3000:]
        # The roll's last word carries vLLM's reason and the diagnosis, not just "One or more items failed".
        assert "failure 1 (startup)" in stopped[0] and "estimated maximum model length is 32640" in stopped[0], stopped
        # The wait said, every vllm_ready_progress_every (30 s), what it waited for, how long so far and the limit.
        waiting = [line for line in out.splitlines()
                   if "vllm-2: waiting for vllm@main.service (port 8000) to serve a completion: " in line]
        assert waiting and all(", at most 600 s; unit " in line for line in waiting), out[-3000:]
        p = unit_props("vllm-2", UNIT, "ActiveState", "Result", "NRestarts")
        print(f"after a configuration vLLM refuses: {p}")
        assert p["ActiveState"] == "failed" and p["Result"] in ("start-limit-hit", "exit-code")
        time.sleep(15)
        assert unit_props("vllm-2", UNIT, "ActiveState")["ActiveState"] == "failed"  # stays failed, no thrashing
        # Exactly vllm_start_limit_burst starts: nothing in the roll reloads systemd while a start is under way
        # (in systemd 252 a reload forgets the start-limit count, which once gave one start more).
        starts = sh("vllm-2", f"journalctl -u {UNIT} --since '{since}' --no-pager -o cat"
                              " | grep -c '^Starting vllm@main.service'", check=False).stdout.strip()
        assert starts == "1", starts
        states = server_states()
        assert states["vllm-2-main"] == "MAINT" and states["vllm-1-main"] == states["vllm-3-main"] == "UP", states
        assert unit_props("vllm-3", UNIT, "InvocationID") == untouched
        assert load.report["totals"]["failed"] == 0, load.report["errors"]
        report = latest_report()
        assert report["outcome"] == "failed" and sorted(report["hosts"]) == ["vllm-2"]  # vllm-3 never started
        # What an operator runs next: diagnose.yml reads the refusal from the journal and plans again.
        diagnosis = playbook("playbooks/diagnose.yml", "--limit", "vllm-2")
        assert diagnosis.returncode == 0, diagnosis.stdout[-3000:]
        assert "vllm-2 instance main (failed," in diagnosis.stdout and "[startup_kv_cache]" in diagnosis.stdout
        assert "New plan from the sizing filter: max_model_len" in diagnosis.stdout, diagnosis.stdout[-3000:]
    finally:
        # The fix is in: rolling the one host again re-arms its unit and brings it back (also when an assertion
        # above failed, so that the tests after this one find a whole fleet).
        roll = restore_host("vllm-2", bad)
    assert roll.returncode == 0, roll.stdout[-3000:]
    assert all_up()


LOADTESTS = os.path.join(PROJECT, "reports", "loadtest", "*")  # loadtest.yml's runs; a roll's: <run>/loadtest


def latest_loadtest(host, runs=LOADTESTS):
    """The newest load-test report of a host's instance in the run directories `runs` (a glob), and its PNG's path."""
    newest = sorted(glob.glob(os.path.join(runs, f"{host}-main.json")))[-1]
    with open(newest) as f:
        return json.load(f), newest[:-len(".json")] + ".png"


def passed_loadtest_before_enable(run, host, runs):
    """The playbook run load-tested the host's instance before it put the host in READY, and the test measured
    real traffic (every request of every stage completed)."""
    enable = run.stdout.index("TASK [vllm_fleet.fleet.balancer : Put the host's servers in READY")
    assert run.stdout.index(f"{host} instance main: load test PASSED") < enable, run.stdout[-3000:]
    report, _ = latest_loadtest(host, runs)
    assert report["verdict"]["passed"] and all(s["completed"] == s["requests"] > 0 for s in report["stages"])


# Small scale (CI cost): 16 generated tokens per request, two stages, two requests per slot.
LOADTEST_ARGS = ("-e", "vllm_loadtest_output_len=16", "-e", '{"vllm_loadtest_concurrency": [4, 8]}',
                 # Two cores shared by every host: latency is not what these tests measure.
                 "-e", "vllm_loadtest_ttft_p99_ms=120000", "-e", "vllm_loadtest_itl_p99_ms=30000")


def test_6b_loadtest_proves_the_plan_on_a_drained_host():
    """playbooks/loadtest.yml drains vllm-3, drives it on its loopback with vLLM's benchmark client at the workload's
    p99 context (2048) up to the plan's max_num_seqs (8), passes it and puts it back; every figure is measured. What
    it held is recorded in the calibration store, in loadtest/ under the key of the plan vllm-3 runs (beside its start
    entry), for the next plan of that configuration."""
    # 64 generated tokens (1984 prompt), as test_6c: with 16 a stage of 8 requests was over in half a second, seen
    # running in one or two /metrics samples of 4 a second (a CI run saw 1 running at concurrency 4, and failed).
    run = playbook("playbooks/loadtest.yml", "-e", "target=vllm-3", *LOADTEST_ARGS, "-e", "vllm_loadtest_output_len=64")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "load test PASSED" in run.stdout, run.stdout[-3000:]
    report, png = latest_loadtest("vllm-3")
    print(json.dumps(report["stages"], indent=1))
    assert report["verdict"] == {"passed": True, "held_concurrency": 8, "broken": []}
    assert report["p99_context"] == 2048 and report["input_len"] == 1984 and report["plan"]["max_num_seqs"] == 8
    assert [s["concurrency"] for s in report["stages"]] == [4, 8]
    for stage in report["stages"]:
        # Counted by the client, read from vLLM's /metrics: the engine really ran that many at once.
        assert stage["completed"] == stage["requests"] == 2 * stage["concurrency"] and stage["failed"] == 0
        assert stage["peak_running"] >= stage["concurrency"] / 2 and stage["peak_kv_cache_usage"] > 0
        assert 0 < stage["median_ttft_ms"] <= stage["p99_ttft_ms"] and stage["p99_itl_ms"] > 0
    assert len(report["samples"]) > 4 and report["oom_failures"] == []
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    store = os.path.join(os.path.dirname(INVENTORY), "calibration")
    entries = glob.glob(os.path.join(store, "*", "*", "*", "*", "loadtest", "vllm-3-main.json"))
    assert len(entries) == 1, entries
    with open(entries[0]) as f:
        entry = json.load(f)
    key_dir = os.path.dirname(os.path.dirname(entries[0]))
    assert entry == {"key": os.path.relpath(key_dir, store), "host": "vllm-3", "instance": "main",
                     "started": report["started"], "p99_context": 2048, "max_num_seqs": 8, "held_concurrency": 8,
                     "passed": True, "broken": [], "capped_by": None}
    assert os.path.exists(os.path.join(key_dir, "vllm-3-main.json"))  # the start entry of the same configuration
    assert all_up()


def test_6c_loadtest_fails_a_plan_whose_kv_cache_cannot_hold_max_num_seqs():
    """vllm-3 runs a plan the sizing filter accepts but whose KV cache (pinned to 40 blocks of 128 tokens) holds 4
    requests at the p99 context of 1024 while max_num_seqs says 8 (set by the operator, no peak given). The load
    test fails it naming max_num_seqs, the sizing filter's plan at the held concurrency is the fix, and the host
    stays out of rotation."""
    small = with_host_vars("vllm-3", {
        # max_context: requests may be longer than the p99 (test_6d sends such), up to 2048 tokens.
        "vllm_workload": {"p99_context": 1024, "max_context": 2048},
        "vllm_policy": {"enforce_eager": True, "block_size": 128, "max_num_seqs": 8},
        "vllm_serve_options": {"dtype": "float16", "num_gpu_blocks_override": 40},
        # The calibration key does not tell a pinned KV cache apart: keep this start out of the store.
        "vllm_calibration_enabled": False})
    try:
        roll = playbook("playbooks/rolling_restart.yml", "--limit", "localhost,vllm-3",
                        "-e", "rolling_restart_apply_config=true")
        assert roll.returncode == 0, roll.stdout[-3000:]
        # 64 generated tokens (896 prompt): a stage of a few seconds, not half of one, so the queue behind the full
        # cache is in many /metrics samples.
        run = playbook("playbooks/loadtest.yml", "-e", "target=vllm-3", *LOADTEST_ARGS, "-e", "vllm_loadtest_output_len=64")
        assert run.returncode != 0 and "vllm-3 did not hold its plan under load (" in run.stdout, \
            run.stdout[-3000:]
        report, png = latest_loadtest("vllm-3")
        print(json.dumps({k: report[k] for k in ("verdict", "stages", "fix_plan")}, indent=1))
        assert report["plan"]["max_num_seqs"] == 8 and report["p99_context"] == 1024
        broken = {b["limit"]: b for b in report["verdict"]["broken"]}
        assert not report["verdict"]["passed"] and "max_num_seqs" in broken, broken
        at_8 = report["stages"][-1]
        assert at_8["preemptions"] > 0 or (at_8["peak_waiting"] > 0 and at_8["peak_running"] < 8), at_8
        held = report["verdict"]["held_concurrency"]
        assert 1 <= held < 8 and broken["max_num_seqs"]["suggest_max_num_seqs"] == held
        assert report["fix_plan"]["fits"] and report["fix_plan"]["engine_args"]["max_num_seqs"] == held
        assert os.path.getsize(png) > 0
        assert server_states()["vllm-3-main"] == "MAINT"
        PINNED["vllm-3"] = small  # test_6d uses this start, then restores the host
    finally:
        if "vllm-3" not in PINNED:
            roll = restore_host("vllm-3", small)
            assert roll.returncode == 0, roll.stdout[-3000:]


PINNED = {}
# 6 clients of requests longer than vllm-3's p99 context of 1024 (and within its max_model_len, its workload's
# max_context of 2048): 900 prompt tokens and 1100 generated (ignore_eos), 16 blocks of 128 each. 4 of them (the
# plan's concurrency_limit at 1024 tokens, 8 blocks) outgrow its 40 blocks even started apart, so vLLM preempts;
# 2 need 32.
LONG = {"clients": 6, "prompt": "word " * 900, "max_tokens": "1100", "extra_body": {"ignore_eos": True}}


def test_6d_the_valve_eases_a_server_under_real_pressure_and_brings_it_back(tmp_path):
    """vllm-3 still runs 6c's plan (KV cache pinned to 40 blocks; concurrency_limit 4 at the p99 context of 1024),
    alone in rotation. Requests longer than that context make vLLM preempt; its watchdog halves the limit in every
    balancer within a few agent intervals while it keeps serving, preemptions stop, and after the calm period
    (vllm_valve_calm 20 s, group_vars) it is back at its plan. vLLM's runtime OOM lines in the unit's journal (what
    vllm-oom-counter reads) ease it too; the manual lever round-trips through the watchdog; the roll that restores
    the host starts it again from its (new) plan."""
    assert "vllm-3" in PINNED, "test_6c did not leave vllm-3 on its pinned plan"
    host, server = "vllm-3", "vllm-3-main"
    since = sh(host, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    others = [s for s in server_states() if s != server]

    def limit():
        return int(haproxy_rows()[server]["slim"] or 0)

    try:
        assert playbook("playbooks/enable_host.yml", "-e", f"target={host}").returncode == 0
        wait_until(lambda: limit() == 4, 20, 0.5, "vllm-3 held to its plan's 4")
        for other in others:
            balancer(f"set server vllm/{other} state maint")
        stop = tmp_path / "long.stop"
        load = subprocess.Popen(
            [sys.executable, os.path.join(PROJECT, "tools", "loadgen.py"), "http://127.0.0.1:18080/v1/completions",
             "--model", "tiny-llama", "--clients", str(LONG["clients"]), "--streaming-clients", "0", "--prompt",
             LONG["prompt"], "--max-tokens", LONG["max_tokens"], "--extra-body", json.dumps(LONG["extra_body"]),
             "--duration", "600", "--timeout", "120", "--stop-file", str(stop), "--report", str(tmp_path / "long.json"),
             "--events", str(tmp_path / "long.jsonl")],
            env=dict(os.environ, LOADGEN_API_KEY=API_KEY), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            started = time.time()
            wait_until(lambda: limit() == 2, 90, 0.5, "the valve to halve vllm-3's limit")
            eased = time.time() - started
            # Once the engine holds no more than the new limit, vLLM preempts no more.
            wait_until(lambda: engine_pressure(host)[0] <= 2, 60, 0.5, "vllm-3 down to 2 requests")
            before = engine_pressure(host)[1]
            time.sleep(15)
            after = engine_pressure(host)[1]
        finally:
            stop.touch()
            load.wait(timeout=240)
        with open(tmp_path / "long.jsonl") as f:
            records = [json.loads(line) for line in f]
        back = wait_until(lambda: limit() == 4 and time.time(), 90, 1, "the limit back at the plan after calm")
        journal = watchdog_journal(host, since)
        print(f"\nlimit 4 -> 2 {eased:.1f} s into the load; preemptions {before} -> {after} in the 15 s after; "
              f"{sum(r['ok'] for r in records)} of {len(records)} requests served, failures "
              f"{collections.Counter(r.get('status') for r in records if not r['ok'])}\n{journal}")
        assert "valve: limit 4 -> 2: " in journal and "preemptions" in journal
        assert after == before  # the engine no longer preempts at the eased limit
        # Back to the plan by calm steps (the in-flight requests may have preempted once more after the first
        # halving, before the engine held no more than the new limit: halved again after the cooldown).
        assert re.search(r"valve: limit \d+ -> 4: calm for", journal) and back
        assert all(r["ok"] or r.get("status") == 503 for r in records) and sum(r["ok"] for r in records) > 0

        # A runtime OOM, as vllm-oom-counter reads it: vLLM's lines in the unit's journal (OBJECT_PID: journald
        # files them under the unit of that process, as it does vLLM's own).
        pid = unit_props(host, UNIT, "MainPID")["MainPID"]
        fixture = os.path.join(PROJECT, "tests", "fixtures", "vllm-logs", "club-3090-16-hint-not-fragmentation.log")
        # On stdin: `docker cp` into the host's /tmp lands under its tmpfs, where nothing in the host sees it.
        with open(fixture) as f:
            subprocess.run(["docker", "exec", "-i", host, "sh", "-c",
                            "grep -v '^# ' | while IFS= read -r line; do printf 'MESSAGE=%s\\nOBJECT_PID=%s\\n"
                            f"SYSLOG_IDENTIFIER=vllm\\n' \"$line\" {pid} | logger --journald; done"],
                           stdin=f, check=True, capture_output=True)
        sh(host, "systemctl start vllm-oom-counter.service")
        wait_until(lambda: limit() == 2, 30, 0.5, "the valve to halve the limit after a runtime OOM")
        assert "1 runtime OOM" in watchdog_journal(host, since)

        # The operator's lever, through the watchdog: a ceiling, then back to the plan (the valve may hold lower).
        run = playbook("playbooks/server_limit.yml", "-e", f"target={host}", "-e", "maxconn=1")
        assert run.returncode == 0 and limit() == 1, run.stdout[-3000:]
        assert "operator's ceiling 1" in watchdog_journal(host, since)
        run = playbook("playbooks/server_limit.yml", "-e", f"target={host}", "-e", "maxconn=plan")
        assert run.returncode == 0 and limit() in (2, 4), run.stdout[-3000:]
    finally:
        for other in others:
            balancer(f"set server vllm/{other} state ready")
        if '"main"' in sh(host, "cat /var/lib/vllm-fleet/server-limits.json 2>/dev/null").stdout:  # failed midway
            playbook("playbooks/server_limit.yml", "-e", f"target={host}", "-e", "maxconn=plan")
        roll = restore_host(host, PINNED.pop(host))
    assert roll.returncode == 0, roll.stdout[-3000:]
    # The restart starts again from the new plan's limit, whatever the valve had eased the old one to.
    wait_until(lambda: limit() == PLAN_LIMIT, 20, 0.5, "vllm-3 held to its new plan's limit")
    assert all_up()


def test_7_adding_a_gpu_host_restarts_no_existing_host(tmp_path):
    """vllm-4 (bare, with runtime LoRA on) joins: its server appears in MAINT, it deploys, it passes a load test
    while still in MAINT (add_gpu_host_require_loadtest), it is enabled; no traffic is lost and no existing vLLM
    process restarts."""
    extra = tmp_path / "new-host.yml"
    extra.write_text(json.dumps({"vllm": {"hosts": {"vllm-4": {
        "vllm_runtime_lora": True,
        "vllm_lora_adapters": [{"name": "tiny-lora", "path": "/srv/vllm-fleet-cache/models/tiny-llama-lora"}]}}}}))
    before = invocations()
    # A lighter load than the default: for the minutes vllm-4 installs, every request keeps a CPU-build worker
    # spinning for 1 s (Load's comment), and both cores are what the install needs.
    with Load(str(tmp_path), "add-host", pause=4) as load:
        added = playbook("playbooks/add_gpu_host.yml", "-i", str(extra), "-e", "new_hosts=vllm-4",
                         "-e", "add_gpu_host_require_loadtest=true", *LOADTEST_ARGS)
    assert added.returncode == 0, added.stdout[-3000:]
    passed_loadtest_before_enable(added, "vllm-4", LOADTESTS)
    assert invocations() == before
    assert server_states() == {f"{h}-main": "UP" for h in VLLM_HOSTS + ["vllm-4"]}
    assert load.report["totals"]["failed"] == 0, load.report["errors"]


def lora_completion(host):
    return http(host, "/v1/completions", {"model": "tiny-lora", "prompt": "the model", "max_tokens": 2})[0]


def test_8_lora_adapters_load_and_unload_at_runtime(tmp_path):
    """vllm-4 loaded its adapter when it became ready; lora_adapters.yml unloads and loads it without a restart."""
    extra = tmp_path / "lora-host.yml"
    extra.write_text(json.dumps({"vllm": {"hosts": {"vllm-4": {"vllm_runtime_lora": True}}}}))
    invocation = unit_props("vllm-4", UNIT, "InvocationID")
    assert lora_completion("vllm-4") == 200
    adapter = {"name": "tiny-lora", "path": "/srv/vllm-fleet-cache/models/tiny-llama-lora"}
    for state, status in (("absent", 404), ("present", 200)):
        args = ["-i", str(extra), "--limit", "vllm-4", "-e", json.dumps({"vllm_lora_adapters": [{**adapter, "state": state}]})]
        run = playbook("playbooks/lora_adapters.yml", *args)
        assert run.returncode == 0 and "changed=1" in run.stdout, run.stdout[-3000:]
        assert lora_completion("vllm-4") == status
        again = playbook("playbooks/lora_adapters.yml", *args)
        assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]  # idempotent
    assert unit_props("vllm-4", UNIT, "InvocationID") == invocation
    # A host without runtime LoRA refuses, saying what to change.
    refused = playbook("playbooks/lora_adapters.yml", "--limit", "vllm-1", "-e", json.dumps({"vllm_lora_adapters": [adapter]}))
    assert refused.returncode != 0 and "vllm_runtime_lora is false" in refused.stdout, refused.stdout[-3000:]


# The driver scenario's NVIDIA-like repository (molecule/driver/files), served by balancer-1 for test_8b.
DRIVER_FILES = os.path.join(PROJECT, "molecule", "driver", "files")
DRIVER_REPO = "http://balancer-1:8081/compute/cuda/repos"
DRIVER_VARS = {"nvidia_gpu_cuda_repo_url": DRIVER_REPO, "nvidia_gpu_driver_branch": "550",
               "nvidia_gpu_driver_version": "550.127.08", "nvidia_gpu_install_kernel_headers": False,
               # A container cannot reboot: the role records the reboot as pending instead.
               "nvidia_gpu_reboot": False}


def serve_driver_repository(host):
    """Build molecule/driver's signed repository on `host` and serve it on the test network (port 8081)."""
    sh(host, "apt-get update -qq"
             " && apt-get install -y -qq --no-install-recommends apt-utils gpg gpg-agent >/dev/null", timeout=300)
    for src, dest in ((os.path.join(DRIVER_FILES, "build-nvidia-repo.sh"), "/usr/local/bin/build-nvidia-repo"),
                      (os.path.join(DRIVER_FILES, "standins"), "/usr/local/share/nvidia-standins"),
                      (os.path.join(PROJECT, "tests", "fixtures", "nvidia-smi"),
                       "/usr/local/share/nvidia-standins/nvidia-smi")):
        subprocess.run(["docker", "cp", src, f"{host}:{dest}"], check=True)
    sh(host, f"build-nvidia-repo /srv/nvidia-repo {DRIVER_REPO} /usr/local/share/nvidia-standins"
             " && { systemctl is-active -q nvidia-repo || systemd-run --unit nvidia-repo"
             " /usr/bin/python3 -m http.server 8081 --directory /srv/nvidia-repo; }")


def test_8b_a_driver_change_goes_through_the_roll_host_by_host(tmp_path):
    """vllm-4 runs driver 550.144.03; the roll applies 550.127.08 (rolling_restart_apply_driver): drained and stopped
    first, then the nvidia_gpu role installs it from the driver scenario's NVIDIA-like repository. The new module
    loads only at a reboot, which a container cannot do (nvidia_gpu_reboot false): the roll stops there, the host
    drained and its vLLM stopped, the others serving. After the "reboot" (the module's sysfs file, as in
    molecule/driver) the same roll starts vLLM on the new driver and puts the host back UP."""
    host = "vllm-4"
    serve_driver_repository("balancer-1")
    # The host as a real one with 550.144.03 loaded: the GPUs described without a driver, the module in sysfs
    # (the stand-in nvidia-smi then reports what is loaded), and Debian's initramfs tooling.
    sh(host, "python3 -c 'import json; p=\"/etc/nvidia-smi-standin.json\"; d=json.load(open(p));"
             " d.pop(\"driver_version\"); json.dump(d, open(p, \"w\"))'"
             " && mkdir -p /sys/module/nvidia && echo 550.144.03 > /sys/module/nvidia/version"
             " && apt-get update -qq && apt-get install -y -qq initramfs-tools >/dev/null", timeout=300)
    assert "550.144.03" in sh(host, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout
    extra = tmp_path / "driver-host.yml"
    extra.write_text(json.dumps({"vllm": {"hosts": {host: {"vllm_runtime_lora": True}}}}))
    args = ["-i", str(extra), "--limit", f"localhost,{host}", "-e", "rolling_restart_apply_driver=true",
            "-e", json.dumps(DRIVER_VARS)]
    others = invocations()

    roll = playbook("playbooks/rolling_restart.yml", *args)
    assert roll.returncode != 0, roll.stdout[-3000:]
    stopped = roll.stdout.split(f"Rolling restart stopped at {host}: ", 1)[-1]
    assert stopped.startswith("Refuse to start vLLM before the new driver is loaded: vllm-4: NVIDIA driver installed "
                              "but not loaded, and nvidia_gpu_reboot is false: reboot the host, then re-run the roll "
                              "for it"), roll.stdout[-3000:]
    assert sh(host, "dpkg-query -W -f '${Version}' nvidia-smi").stdout == "550.127.08-1"
    assert "nvidia-smi" in sh(host, "apt-mark showhold").stdout.split()
    assert sh(host, "cat /run/nvidia-gpu-reboot-pending").stdout == "installed=550.127.08\nloaded=550.144.03\n"
    states = server_states()
    assert states[f"{host}-main"] == "MAINT" and all(states[f"{h}-main"] == "UP" for h in VLLM_HOSTS), states
    assert unit_props(host, UNIT, "ActiveState")["ActiveState"] == "inactive"
    assert [e["state"] for e in latest_report()["events"] if e["host"] == host] == ["start", "draining", "drained", "stopped",
                                                                                    "failed"]

    sh(host, "echo 550.127.08 > /sys/module/nvidia/version")  # the reboot
    roll = playbook("playbooks/rolling_restart.yml", *args)
    assert roll.returncode == 0, roll.stdout[-3000:]
    assert sh(host, "test -e /run/nvidia-gpu-reboot-pending", check=False).returncode == 1
    assert "550.127.08" in sh(host, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout
    events = [e["state"] for e in latest_report()["events"] if e["host"] == host]
    # The failed roll left vllm-4 in the roll journal: this run brings it back first, with that roll's options.
    assert events[:5] == ["start", "draining", "drained", "stopped", "driver"] and "ready" in events, events
    assert healthy(host) and all_up()
    assert invocations() == others  # no other host restarted


def test_9_a_roll_starts_a_host_whose_start_limit_is_spent():
    """Starts count toward StartLimitBurst whoever makes them. A host restarted by hand once too often in the window
    refuses the next start; the roll's start re-arms the limit, so the deliberate start goes through. The roll also
    load-tests the host before it enables it (rolling_restart_loadtest), reports in the roll's run directory."""
    host = "vllm-3"
    dropin = "/run/systemd/system/vllm@main.service.d"
    sh(host, f"mkdir -p {dropin} && printf '[Unit]\\nStartLimitBurst=1\\n' > {dropin}/99-burst.conf"
             " && systemctl daemon-reload")
    try:
        sh(host, f"systemctl restart {UNIT}", timeout=400)  # the one start the window allows
        refused = sh(host, f"systemctl restart {UNIT}", check=False, timeout=400)
        assert refused.returncode != 0 and "too often" in refused.stderr, refused.stderr
        assert unit_props(host, UNIT, "ActiveState", "Result") == {"ActiveState": "failed", "Result": "start-limit-hit"}
        roll = playbook("playbooks/rolling_restart.yml", "--limit", f"localhost,{host}",
                        "-e", "rolling_restart_loadtest=true", *LOADTEST_ARGS)
        assert roll.returncode == 0, roll.stdout[-3000:]
        assert healthy(host) and server_states()[f"{host}-main"] == "UP"
        passed_loadtest_before_enable(roll, host, os.path.join(PROJECT, "reports", "rolling-restart", "*", "loadtest"))
    finally:
        sh(host, f"rm -rf {dropin} && systemctl daemon-reload")


def agent(host, instance="main"):
    """What the host's vllm-watchdog answers HAProxy's agent-check, asked from the balancer as HAProxy asks it."""
    return sh("balancer-1", f"exec 3<>/dev/tcp/{host}/8990 && printf '{instance}\\n' >&3 && cat <&3").stdout


def engine_core(host, signal):
    sh(host, f"kill -{signal} $(pgrep -f '^VLLM::EngineCore')")


def generated(host):
    """vllm:generation_tokens_total of the host's instance, as its /metrics says."""
    text = http(host, "/metrics", key=None)[1]
    return float(re.search(r"^vllm:generation_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M).group(1))


def watchdog_journal(host, since):
    return sh(host, f"journalctl -t vllm-watchdog --since '{since}' --no-pager -o cat").stdout


# An engine wedged between requests shows no request running (its gauges stop with it): only a probe tells, after
# probe_interval without progress and probe_timeout without an answer; HAProxy's next agent check (1 s) acts on it.
WEDGE_SEEN_WITHIN = VLLM_VARS["vllm_watchdog_probe_interval"] + VLLM_VARS["vllm_watchdog_probe_timeout"] + 3


def test_10_a_wedged_engine_leaves_rotation_within_seconds_and_the_watchdog_restarts_it(tmp_path):
    """SIGSTOP on one backend's EngineCore under load: /health stays 200, but its watchdog says "down" to HAProxy's
    agent-check; playbooks/watchdog.yml restarts it through the roll's runbook and it comes back UP. Only requests
    sent to the wedged engine before it left rotation may fail; they are counted and reported."""
    host, server = "vllm-1", "vllm-1-main"
    assert agent(host) == "up maxconn:8\n"  # the plan's concurrency_limit: p99 2048, peak 8
    pid = unit_props(host, UNIT, "MainPID")["MainPID"]
    since = sh(host, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    try:
        with Load(str(tmp_path), "wedge") as load:
            engine_core(host, "STOP")
            stopped = time.time()
            wait_until(lambda: server_states().get(server) == "DOWN", WEDGE_SEEN_WITHIN, 0.5,
                       "HAProxy to take the wedged server out")
            out = time.time()
            assert healthy(host)  # the blind spot: /health still 200
            reply = agent(host)
            # Its verdict for Prometheus (VllmEngineWedged), in node exporter's textfile directory on the host.
            textfile = "cat /var/lib/prometheus/node-exporter/vllm-watchdog.prom"
            wait_until(lambda: f'vllm_fleet_watchdog_wedged{{name="{UNIT}"}} 1' in sh(host, textfile).stdout, 5, 0.5,
                       "the watchdog's verdict in its textfile")
            run = playbook("playbooks/watchdog.yml")
    finally:
        if server_states().get(server) != "UP":  # failed: let the next tests find a serving fleet
            engine_core(host, "CONT")
    assert run.returncode == 0, run.stdout[-3000:]
    assert server_states()[server] == "UP" and unit_props(host, UNIT, "MainPID")["MainPID"] != pid
    assert agent(host) == "up maxconn:8\n"
    journal = watchdog_journal(host, since)
    print(f"\nout of rotation {out - stopped:.1f} s after SIGSTOP; agent said {reply.strip()!r}\n{journal}")
    assert reply.startswith("down maxconn:8 #wedged: ")
    assert "main: WEDGED (MainPID " in journal and f"restarting {host}" in journal and f"restarted {host}" in journal
    with open(load.events_file) as f:
        records = [json.loads(line) for line in f]
    failed = [r for r in records if not r["ok"]]
    # Requests that hung on the wedged engine (sent there between the SIGSTOP and its leaving rotation) end when it
    # is stopped: HAProxy sends the non-streaming ones again, elsewhere; a stream that had started cannot be.
    hung = [r for r in records if r["start"] < out + 1 and r["end"] - r["start"] > 5]
    print(f"load {load.report['totals']}; {len(hung)} request(s) hung on the wedged engine, {len(failed)} failed: "
          f"{[r.get('error') for r in failed]}")
    assert all(r["start"] < out + 1 and r["end"] > out for r in failed), failed
    assert len(failed) <= len(hung)


def test_11_busy_servers_are_left_alone_and_a_wedge_without_capacity_waits(tmp_path):
    """A busier load (counters advancing on every server) never makes a watchdog say "down". Then vllm-1 and vllm-2
    wedge: one run picks at most one host, and with rolling_restart_min_healthy one more than the servers still UP
    (vllm-3's, and vllm-4's since test_7 added it) even that one would leave too few servers UP, so it says "not
    restarting: capacity", the other that it waits, and nothing is restarted."""
    since = sh("vllm-1", "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    pids = {h: unit_props(h, UNIT, "MainPID")["MainPID"] for h in VLLM_HOSTS}
    with Load(str(tmp_path), "busy", clients=3, pause=0.2):
        before = {h: generated(h) for h in VLLM_HOSTS}
        for _ in range(15):  # three times the stall threshold
            assert all_up() and all(agent(h) == "up maxconn:8\n" for h in VLLM_HOSTS)
            time.sleep(1)
        after = {h: generated(h) for h in VLLM_HOSTS}
    print(f"\ngenerated tokens before and after 15 s of busy load: {before} {after}")
    for h in VLLM_HOSTS:
        assert after[h] > before[h]  # the counters moved: busy, and left alone
        assert "WEDGED" not in watchdog_journal(h, since)
    quiet = playbook("playbooks/watchdog.yml")
    assert quiet.returncode == 0 and "No wedged vLLM instance" in quiet.stdout, quiet.stdout[-3000:]

    try:
        engine_core("vllm-1", "STOP")
        time.sleep(2)
        engine_core("vllm-2", "STOP")
        # Idle engines: each watchdog knows only when its next probe (vllm_watchdog_probe_interval) gets no answer.
        wait_until(lambda: server_states().get("vllm-1-main") == server_states().get("vllm-2-main") == "DOWN", 30,
                   0.5, "both wedged servers out of rotation")
        needed = list(server_states().values()).count("UP") + 1
        run = playbook("playbooks/watchdog.yml", "-e", f"rolling_restart_min_healthy={needed}")
        assert run.returncode == 0, run.stdout[-3000:]
        assert "not restarting: capacity" in run.stdout and f"rolling_restart_min_healthy is {needed}" in run.stdout, \
            run.stdout[-3000:]
        # The run picks the host its watchdog saw wedged first. Which one that is depends on where each watchdog's
        # probe cycle was when its engine stopped, not on the 2 s between the stops: either may be the one.
        journals = {h: watchdog_journal(h, since) for h in ("vllm-1", "vllm-2")}
        picked = [h for h, j in journals.items() if "not restarting: capacity" in j]
        assert len(picked) == 1, journals
        waits = "vllm-2" if picked == ["vllm-1"] else "vllm-1"
        assert f"this run restarts {picked[0]}" in journals[waits] and \
            "one wedged host at a time fleet-wide" in journals[waits], journals
        assert {h: unit_props(h, UNIT, "MainPID")["MainPID"] for h in VLLM_HOSTS} == pids  # nothing restarted
    finally:
        engine_core("vllm-1", "CONT")
        engine_core("vllm-2", "CONT")
    # Its engine moves again: the watchdog says so and HAProxy takes it back, with nobody restarting anything.
    wait_until(all_up, 60, 1, "both servers UP again once their engines run")
    assert "progressing again" in watchdog_journal("vllm-1", since)


# --- The live lever (issue 25): each server held to its plan; eased under real pressure --------------------------

PLAN_LIMIT = 8  # the fleet's plans: p99 2048, peak 8 on the stand-in A10G: concurrency_limit 8


def balancer(cmd):
    # socat's default gives HAProxy 0.5 s to answer after the command is sent: under load it may answer later, and
    # the reply would be cut.
    return sh("balancer-1", f"echo '{cmd}' | socat -t 5 - UNIX-CONNECT:/run/haproxy/admin.sock").stdout


def haproxy_rows():
    """{svname: show stat row} of the vllm backend, its BACKEND row included."""
    text = balancer("show stat").lstrip("# ")
    return {r["svname"]: r for r in csv.DictReader(text.splitlines()) if r["pxname"] == "vllm"}


def engine_pressure(host):
    """(running + waiting, preemptions so far) of the host's instance, from its /metrics."""
    found = dict(re.findall(r"^(vllm:num_requests_running|vllm:num_requests_waiting|vllm:num_preemptions_total)"
                            r"(?:\{[^}]*\})? (\S+)$", http(host, "/metrics", key=None)[1], re.M))
    return (float(found.get("vllm:num_requests_running", 0)) + float(found.get("vllm:num_requests_waiting", 0)),
            float(found.get("vllm:num_preemptions_total", 0)))


class Engines:
    """Every 0.5 s, each host's running + waiting and preemptions, in a thread, for the span of a `with` block."""

    def __init__(self, hosts):
        self.hosts, self.samples, self.done = hosts, {h: [] for h in hosts}, threading.Event()

    def run(self):
        while not self.done.is_set():
            for host in self.hosts:
                self.samples[host].append((time.time(),) + engine_pressure(host))
            time.sleep(0.5)

    def __enter__(self):
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(30)
        return False

    def held(self):
        return {h: max(s[1] for s in samples) for h, samples in self.samples.items()}

    def preemptions(self):
        return {h: samples[-1][2] - samples[0][2] for h, samples in self.samples.items()}


def overload(tmp_path, name, clients, seconds, **extra):
    """tools/loadgen.py through the balancer, no pause: (its report, its per-request records)."""
    report, events = tmp_path / f"{name}.json", tmp_path / f"{name}.jsonl"
    cmd = [sys.executable, os.path.join(PROJECT, "tools", "loadgen.py"), "http://127.0.0.1:18080/v1/completions",
           "--model", "tiny-llama", "--clients", str(clients), "--streaming-clients", "0", "--duration",
           str(seconds), "--timeout", "90", "--report", str(report), "--events", str(events)]
    for key, value in extra.items():
        cmd += ["--" + key.replace("_", "-"), value if isinstance(value, str) else json.dumps(value)]
    subprocess.run(cmd, env=dict(os.environ, LOADGEN_API_KEY=API_KEY), check=True, capture_output=True,
                   timeout=seconds + 150)
    with open(events) as f:
        return json.loads(report.read_text()), [json.loads(line) for line in f]


def figures(records, engines):
    seconds = sorted(r["end"] - r["start"] for r in records if r["ok"])
    refused = [r for r in records if r.get("status") == 503]
    return {"sent": len(records), "ok": len(seconds), "503": len(refused),
            "other failures": sum(1 for r in records if not r["ok"] and r.get("status") != 503),
            "p99 s": round(seconds[int(0.99 * (len(seconds) - 1))], 1) if seconds else None,
            "slowest 503 s": round(max((r["end"] - r["start"] for r in refused), default=0), 1),
            "most held by a server": max(engines.held().values()),
            "preemptions": sum(engines.preemptions().values())}


def test_13_an_overloaded_fleet_queues_in_haproxy_and_no_server_holds_more_than_its_plan(tmp_path):
    """Load several times the fleet's planned concurrency through the balancer: no vLLM instance holds more requests
    (running + waiting) than its plan's limit, HAProxy's queue holds the rest, requests that wait longer than the
    queue timeout get 503 at once, nothing else fails. Then the same load without the limits (the watchdogs stopped,
    maxconn 0), for the figures side by side."""
    hosts = VLLM_HOSTS
    # vllm-4 (test_7) runs another plan: out of rotation here, so that every server has the same limit.
    extra = [s for s in server_states() if s[:-len("-main")] not in hosts]
    for server in extra:
        balancer(f"set server vllm/{server} state maint")
    slots = PLAN_LIMIT * len(hosts)
    assert {r["slim"] for name, r in haproxy_rows().items() if name[:-len("-main")] in hosts} == {str(PLAN_LIMIT)}
    body = {"clients": 5 * slots, "seconds": 20, "max_tokens": "32", "extra_body": {"ignore_eos": True}}
    balancer("clear counters")
    with Engines(hosts) as limited:
        report, records = overload(tmp_path, "limited", body["clients"], body["seconds"],
                                   max_tokens=body["max_tokens"], extra_body=body["extra_body"])
    queued = int(haproxy_rows()["BACKEND"]["qmax"])
    with_limits = dict(figures(records, limited), **{"most queued in HAProxy": queued})
    try:
        for host in hosts:
            sh(host, "systemctl stop vllm-watchdog")
        for host in hosts:
            balancer(f"set maxconn server vllm/{host}-main 0")
        balancer("clear counters")
        with Engines(hosts) as free:
            _, free_records = overload(tmp_path, "free", body["clients"], body["seconds"],
                                       max_tokens=body["max_tokens"], extra_body=body["extra_body"])
        without = dict(figures(free_records, free), **{"most queued in HAProxy": int(haproxy_rows()["BACKEND"]["qmax"])})
    finally:
        for host in hosts:
            sh(host, "systemctl start vllm-watchdog")
        for server in extra:
            balancer(f"set server vllm/{server} state ready")
    wait_until(lambda: {r["slim"] for name, r in haproxy_rows().items() if name[:-len("-main")] in hosts}
               == {str(PLAN_LIMIT)}, 20, 0.5, "every server's limit back from its agent")
    print(f"\n{body['clients']} clients on {slots} planned slots for {body['seconds']} s:\n"
          f"  with the limits:    {with_limits}\n  without the limits: {without}")
    assert with_limits["most held by a server"] <= PLAN_LIMIT, limited.held()
    assert with_limits["preemptions"] == 0 and with_limits["other failures"] == 0, report["errors"]
    assert with_limits["most queued in HAProxy"] > 0
    # A refusal comes when the queue timeout (10 s, group_vars/balancer.yml) is over, not after minutes.
    assert with_limits["slowest 503 s"] <= 12
    assert without["most held by a server"] > PLAN_LIMIT  # the comparison means something
    assert all_up()


# Real NVRM lines (tests/fixtures/nvidia-kmsg/nvrm-lines.txt names their sources), on the PCI address of the
# stand-in A10G (00000000:00:1E.0, the kernel's "0000:00:1e").
XID_13 = ("NVRM: Xid (PCI:0000:00:1e): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, "
          "TPC 7, SM 0): Illegal Instruction Parameter")
XID_119 = ("NVRM: Xid (PCI:0000:00:1e): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC "
           "response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).")


def gpu_health(host):
    return json.loads(sh(host, "cat /var/lib/nvidia-gpu-health/state.json").stdout)


def test_14_a_fatal_xid_fences_its_gpu_an_application_xid_does_not_and_the_roll_brings_it_back(tmp_path):
    """The kernel (its stand-in: real NVRM lines in /dev/kmsg's format) reports Xid 13 on vllm-1's GPU (NVIDIA:
    RESTART_APP) and Xid 119, a GSP timeout (RESET_GPU), on vllm-2's. Under load: vllm-1 is left alone; vllm-2's
    GPU is quarantined, its instance stopped and out of every balancer within seconds, a start is skipped (no
    restart loop), Prometheus alerts naming the GPU, the Xid and the action, diagnose.yml says it is a GPU fault;
    then the roll resets the GPU (nvidia-smi -r), clears the quarantine and brings vllm-2 back."""
    counted = gpu_health("vllm-1")["counts"].get("0|Xid 13|application", 0)
    with Load(str(tmp_path), "gpu-fault") as load:
        sh("vllm-1", "kernel-log " + shlex.quote(XID_13))
        sh("vllm-2", "kernel-log " + shlex.quote(XID_119))
        wait_until(lambda: "0" in gpu_health("vllm-2")["quarantine"], 30, 0.5, "vllm-2's GPU in quarantine")
        fenced = time.monotonic()
        wait_until(lambda: server_states()["vllm-2-main"] != "UP", 30, 0.5, "vllm-2 out of rotation")
        print(f"GPU fault to out of rotation: {time.monotonic() - fenced:.1f} s after the quarantine")
        wait_until(lambda: sh("vllm-2", f"systemctl is-active {UNIT}", check=False).stdout.strip() == "inactive", 60,
                   1, "vllm-2's instance stopped")
        sh("vllm-2", f"systemctl start {UNIT}", check=False)
        assert sh("vllm-2", f"systemctl is-active {UNIT}", check=False).stdout.strip() == "inactive"
        assert "gpus-healthy: GPU 0 is quarantined (needs a reset: Xid 119" in sh(
            "vllm-2", f"journalctl -u {UNIT} -n 20 --no-pager").stdout
        held = gpu_health("vllm-2")["quarantine"]["0"]
        assert (held["class"], held["fault"], held["line"]) == ("reset", "Xid 119", XID_119)
        wait_until(lambda: gpu_health("vllm-1")["counts"].get("0|Xid 13|application", 0) == counted + 1, 10, 0.5,
                   "vllm-1's Xid 13 counted")
        assert gpu_health("vllm-1")["quarantine"] == {}
        assert sh("vllm-1", f"systemctl is-active {UNIT}").stdout.strip() == "active"
        alerts = wait_until(lambda: [a for a in prometheus("alerts")["alerts"]
                                     if a["labels"]["alertname"] == "NvidiaGpuQuarantined"], 120, 5,
                            "NvidiaGpuQuarantined in Prometheus")
        print(f"Prometheus: {alerts[0]['labels']} {alerts[0]['annotations']['summary']}")
        assert (alerts[0]["labels"]["host"], alerts[0]["labels"]["gpu"], alerts[0]["labels"]["fault"],
                alerts[0]["labels"]["class"]) == ("vllm-2", "0", "Xid 119", "reset")
        diagnosis = playbook("playbooks/diagnose.yml", "--limit", "vllm-2")
        assert diagnosis.returncode == 0 and "GPU 0 is QUARANTINED since" in diagnosis.stdout, diagnosis.stdout[-3000:]
        assert "resets the GPU and brings it back" in diagnosis.stdout
        roll = playbook("playbooks/rolling_restart.yml", "--limit", "localhost,vllm-2")
    assert roll.returncode == 0, roll.stdout[-3000:]
    assert "Reset the GPU" in roll.stdout
    assert json.loads(sh("vllm-2", "cat /etc/nvidia-smi-standin.json").stdout)["gpus"][0]["resets"] == 1
    assert gpu_health("vllm-2")["quarantine"] == {} and all_up()
    assert "back in service (reset by the rolling restart)" in sh(
        "vllm-2", "journalctl -t nvidia-gpu-health --no-pager").stdout
    totals = load.report["totals"]
    print(f"load during the fault and the roll: {totals} errors={load.report['errors']}")
    assert totals["failed_non_streaming"] == 0, load.report["errors"]


def test_12_stop_leaves_no_process_behind():
    """Last, as nothing needs the host afterwards: a stop ends every process of the unit (API server, EngineCore,
    worker), so nothing is left holding the GPU for the next start."""
    host = "vllm-3"
    assert sh(host, "pgrep -u vllm", check=False).stdout.strip() != ""
    sh(host, f"systemctl stop {UNIT}", timeout=120)
    assert sh(host, "pgrep -u vllm", check=False).stdout.strip() == ""
    assert unit_props(host, UNIT, "MainPID", "ActiveState") == {"MainPID": "0", "ActiveState": "inactive"}
