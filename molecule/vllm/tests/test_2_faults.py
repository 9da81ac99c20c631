"""Each restart policy does what it claims, on real vLLM under real systemd. Runs after test_1_deployed (pytest takes files in name order)."""
import json
import os
import tempfile
import time

from fleet import http, playbook, sh, unit_props, wait_until

UNIT = "vllm@main.service"


def healthy(host):
    return http(host, "/health", key=None, timeout=5)[0] == 200


def kill_engine_core(host):
    pid = sh(host, "pgrep -f '^VLLM::EngineCore'").stdout.split()[0]
    sh(host, f"kill -KILL {pid}")
    return pid


def run_site(host, extra_vars):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(extra_vars, f)
    try:
        return playbook("playbooks/site.yml", "--limit", host, "-e", "@" + f.name)
    finally:
        os.unlink(f.name)


def test_engine_death_is_restarted_by_systemd():
    host = "vllm-1"
    before = int(unit_props(host, UNIT, "NRestarts")["NRestarts"])
    since = sh(host, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    kill_engine_core(host)
    wait_until(lambda: not healthy(host), 30, 1, "the API server to notice the dead engine")
    wait_until(lambda: healthy(host), 240, 2, "/health 200 again without anyone restarting it")
    assert int(unit_props(host, UNIT, "NRestarts")["NRestarts"]) == before + 1
    journal = sh(host, f"journalctl -u {UNIT} --since '{since}' --no-pager -o cat").stdout
    # The dead engine made the server exit with status 0: a clean exit that only Restart=always restarts.
    assert "Deactivated successfully" in journal or "status=0/SUCCESS" in journal, journal[-2000:]


def test_restart_on_failure_would_not_have_restarted_it():
    host = "vllm-2"
    dropin = "/run/systemd/system/vllm@main.service.d"
    sh(host, f"mkdir -p {dropin} && printf '[Service]\\nRestart=on-failure\\n' > {dropin}/99-on-failure.conf"
             " && systemctl daemon-reload")
    try:
        before = int(unit_props(host, UNIT, "NRestarts")["NRestarts"])
        kill_engine_core(host)
        wait_until(lambda: unit_props(host, UNIT, "ActiveState")["ActiveState"] == "inactive", 60, 1,
                   "the server to exit after its engine died")
        time.sleep(15)  # longer than RestartSec: nothing brings it back
        p = unit_props(host, UNIT, "ActiveState", "Result", "ExecMainStatus", "NRestarts")
        print(f"with Restart=on-failure after an engine death: {p}")
        assert p == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0",
                     "NRestarts": str(before)}
    finally:
        sh(host, f"rm -rf {dropin} && systemctl daemon-reload && systemctl start {UNIT}", timeout=400)
    assert healthy(host)


def test_stop_leaves_no_process_behind():
    host = "vllm-2"
    sh(host, f"systemctl stop {UNIT}", timeout=120)
    assert sh(host, "pgrep -u vllm", check=False).stdout.strip() == ""
    assert unit_props(host, UNIT, "MainPID", "ActiveState") == {"MainPID": "0", "ActiveState": "inactive"}
    sh(host, f"systemctl start {UNIT}", timeout=400)
    assert healthy(host)


def test_configuration_refused_at_start_stops_after_start_limit():
    """The plan fits the GPU the facts report, but the server has less KV memory: vLLM refuses at start."""
    host = "vllm-2"
    result = run_site(host, {"vllm_model_dir": "/srv/vllm-fleet-cache/models/tiny-llama-long",
                             "vllm_workload": {"p99_context": 65536, "peak_concurrency": 1}})
    out = result.stdout
    assert result.returncode != 0, out[-3000:]
    assert "failure 1 (startup)" in out and "estimated maximum model length is 32640" in out, out[-3000:]
    p = unit_props(host, UNIT, "ActiveState", "Result", "NRestarts")
    print(f"after a configuration vLLM refuses: {p}")
    assert p["ActiveState"] == "failed" and p["Result"] in ("start-limit-hit", "exit-code")
    time.sleep(20)
    assert unit_props(host, UNIT, "ActiveState")["ActiveState"] == "failed"  # stays failed, no thrashing
    # Re-applying the good configuration re-arms the unit and brings it back.
    result = run_site(host, {})
    assert result.returncode == 0, result.stdout[-3000:]
    assert healthy(host)


def test_preflight_refuses_before_any_change():
    host = "vllm-2"
    before = sh(host, "md5sum /etc/systemd/system/vllm@main.service.d/10-plan.conf").stdout
    invocation = unit_props(host, UNIT, "InvocationID")["InvocationID"]
    small_gpu = [{"index": 0, "name": "NVIDIA T4", "uuid": "GPU-00000000-0000-0000-0000-000000000000",
                  "memory_total_mib": 2048, "compute_capability": "7.5"}]
    result = run_site(host, {"vllm_model_dir": "/srv/vllm-fleet-cache/models/tiny-llama-long",
                             "vllm_workload": {"p99_context": 65536, "peak_concurrency": 1},
                             "vllm_gpus": small_gpu})
    out = result.stdout
    assert result.returncode != 0
    assert "vllm-2" in out and "estimated maximum model length" in out, out[-3000:]
    assert sh(host, "md5sum /etc/systemd/system/vllm@main.service.d/10-plan.conf").stdout == before
    assert unit_props(host, UNIT, "InvocationID")["InvocationID"] == invocation  # not restarted
    assert healthy(host)
