"""The balancer role's haproxy.cfg as its template renders it for an inventory: a host whose vllm-watchdog runs gets
HAProxy's agent-check on every server (so a wedged instance leaves rotation), one with vllm_watchdog_enabled false
gets none (no agent answers there)."""
import json
import os
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def render(tmp_path, hosts):
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": os.path.join(ROOT, ".venv", "bin", "python")}}},
        "vllm": {"hosts": hosts}}))
    run = subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", str(inventory),
         "tests/playbooks/render_haproxy.yml", "-e", json.dumps({"render_out": str(tmp_path)})],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg")))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return [line.strip() for line in (tmp_path / "haproxy.cfg").read_text().splitlines()
            if line.strip().startswith("server ")]


def test_agent_check_only_where_the_watchdog_runs(tmp_path):
    servers = render(tmp_path, {
        "gpu-a": {"vllm_instances": [{"name": "main", "port": 8000, "gpus": [0]},
                                     {"name": "small", "port": 8001, "gpus": [1]}]},
        "gpu-b": {"vllm_watchdog_enabled": False, "vllm_watchdog_agent_port": 9999},
        "gpu-c": {"vllm_watchdog_agent_port": 9100}})
    assert servers == [
        'server gpu-a-main gpu-a:8000 check agent-check agent-port 8990 agent-send "main\\n" agent-inter 2s',
        'server gpu-a-small gpu-a:8001 check agent-check agent-port 8990 agent-send "small\\n" agent-inter 2s',
        "server gpu-b-main gpu-b:8000 check",
        'server gpu-c-main gpu-c:8000 check agent-check agent-port 9100 agent-send "main\\n" agent-inter 2s',
    ]
