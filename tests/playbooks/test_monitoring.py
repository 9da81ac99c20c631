"""The monitoring role's files rendered by Ansible itself (tests/playbooks/render_monitoring.yml, the role's
export.yml) from an inventory of declared GPUs, then read by the real tools of the Prometheus packages the role
installs (promtool, amtool: `make prometheus-tools` unpacks Debian's packages into the cache): the configuration
and rules are valid, every alert fires and stays quiet where it should (tests/promtool/), every vLLM instance is a
target with its labels."""
import json
import os
import shutil
import subprocess

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOLS = os.path.join(os.environ.get("VLLM_FLEET_PROMETHEUS_TOOLS")
                     or os.path.join(os.environ.get("VLLM_FLEET_CACHE", "/var/cache/vllm-fleet"), "prometheus-tools"),
                     "usr", "bin")
RULES_TEST = os.path.join(ROOT, "tests", "promtool", "vllm-fleet.rules.test.yml")
# A model name that would break YAML written by string concatenation.
ODD_MODEL = 'a "quoted": model # not a comment'

INVENTORY = {"all": {
    "vars": {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"},
    "children": {
        "vllm": {"hosts": {
            # Two instances on a host with two GPU models: each instance is labelled with its own GPUs.
            "gpu-h100-01": {
                "ansible_host": "192.0.2.21", "vllm_model": "Qwen/Qwen3-8B", "vllm_version": "0.32.0",
                "nvidia_gpu_declared": [
                    {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "compute_capability": "9.0",
                     "count": 2},
                    {"name": "NVIDIA L40S", "memory_total_mib": 46068, "compute_capability": "8.9", "count": 2}],
                "vllm_instances": [{"name": "a", "gpus": [0, 1], "port": 8000},
                                   {"name": "b", "gpus": [2, 3], "port": 8001}]},
            # No vllm_instances, no vllm_version: the vllm role's defaults; the balancer's address wins.
            "gpu-a10g-01": {
                "ansible_host": "198.51.100.7", "balancer_backend_address": "192.0.2.11",
                "vllm_model_dir": "/srv/models/tiny", "vllm_served_model_name": ODD_MODEL,
                "nvidia_gpu_declared": [{"name": "NVIDIA A10G", "memory_total_mib": 23028,
                                         "compute_capability": "8.6"}]}}},
        "balancer": {"hosts": {"lb-01": {"ansible_host": "192.0.2.5"}}}}}}


def tool(name):
    path = os.path.join(TOOLS, name)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: run `make prometheus-tools` (Debian's packages, unpacked)")
    return path


def render(tmp, inventory, *extra):
    inv = tmp / "inventory.yml"
    inv.write_text(json.dumps(inventory))
    return subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", str(inv),
         "tests/playbooks/render_monitoring.yml", "-e", f"monitoring_export_dir={tmp / 'out'}", *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0"))


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("monitoring")
    run = render(tmp, INVENTORY)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return tmp / "out"


def check(*argv, cwd):
    run = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


def test_promtool_accepts_the_configuration_and_its_rules(out):
    stdout = check(tool("promtool"), "check", "config", "prometheus.yml", cwd=out)
    assert "1 rule files found" in stdout
    check(tool("promtool"), "check", "rules", "vllm-fleet.rules.yml", cwd=out)


def test_every_alert_fires_and_stays_quiet_where_it_should(out):
    shutil.copy(RULES_TEST, out)
    check(tool("promtool"), "test", "rules", os.path.basename(RULES_TEST), cwd=out)
    # Each alert of the rules has a case where it fires and one where it does not.
    alerts = {rule["alert"] for group in yaml.safe_load((out / "vllm-fleet.rules.yml").read_text())["groups"]
              for rule in group["rules"]}
    cases = [case for test in yaml.safe_load(open(RULES_TEST))["tests"] for case in test["alert_rule_test"]]
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == alerts
    assert {c["alertname"] for c in cases if not c["exp_alerts"]} == alerts


def test_amtool_accepts_alertmanager_yml_and_grafana_files_parse(out):
    check(tool("amtool"), "check-config", "alertmanager.yml", cwd=out)
    datasource = yaml.safe_load((out / "grafana-datasource.yml").read_text())["datasources"][0]
    assert datasource["type"] == "prometheus" and datasource["url"].endswith(":9090")
    provider = yaml.safe_load((out / "grafana-dashboard.yml").read_text())["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards/vllm-fleet"
    assert json.loads((out / "vllm-fleet.json").read_text())["uid"] == "vllm-fleet"


def test_every_instance_is_a_target_with_its_labels(out):
    config = yaml.safe_load((out / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"vllm", "node", "haproxy", "prometheus"}  # DCGM is off by default
    vllm = {tuple(c["targets"]): c["labels"] for c in jobs["vllm"]["static_configs"]}
    assert vllm == {
        ("192.0.2.21:8000",): {"host": "gpu-h100-01", "instance": "gpu-h100-01-a", "gpu_model": "NVIDIA H100 80GB HBM3",
                               "model": "Qwen/Qwen3-8B", "vllm_version": "0.32.0"},
        ("192.0.2.21:8001",): {"host": "gpu-h100-01", "instance": "gpu-h100-01-b", "gpu_model": "NVIDIA L40S",
                               "model": "Qwen/Qwen3-8B", "vllm_version": "0.32.0"},
        ("192.0.2.11:8000",): {"host": "gpu-a10g-01", "instance": "gpu-a10g-01-main", "gpu_model": "NVIDIA A10G",
                               "model": ODD_MODEL, "vllm_version": "0.34.0"},
    }
    assert [c["targets"] for c in jobs["node"]["static_configs"]] == [["192.0.2.21:9100"], ["192.0.2.11:9100"]]
    assert jobs["haproxy"]["static_configs"] == [{"targets": ["192.0.2.5:8405"], "labels": {"host": "lb-01"}}]
    # systemd and HAProxy series of an instance get the same `instance` label as its vLLM series.
    assert jobs["node"]["metric_relabel_configs"][0]["replacement"] == "${1}-${2}"
    assert config["rule_files"] == ["vllm-fleet.rules.yml"]


def test_dcgm_option_adds_a_job_per_vllm_host(tmp_path):
    run = render(tmp_path, INVENTORY, "-e", "monitoring_dcgm_exporter=true")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    jobs = {j["job_name"]: j for j in yaml.safe_load((tmp_path / "out" / "prometheus.yml").read_text())["scrape_configs"]}
    assert [c["targets"] for c in jobs["dcgm"]["static_configs"]] == [["192.0.2.21:9400"], ["192.0.2.11:9400"]]


def test_refuses_an_address_that_is_not_one_word(tmp_path):
    inventory = json.loads(json.dumps(INVENTORY))
    inventory["all"]["children"]["vllm"]["hosts"]["gpu-a10g-01"]["balancer_backend_address"] = "10.0.0.1 #x"
    run = render(tmp_path, inventory)
    assert run.returncode != 0
    assert "address of vLLM host[2] must be a host name or IP address, got '10.0.0.1 #x'" in run.stdout
