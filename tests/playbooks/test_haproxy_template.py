"""The balancer role's haproxy.cfg as its template renders it for an inventory: a host whose vllm-watchdog runs gets
HAProxy's agent-check on every server (so a wedged instance leaves rotation), one with vllm_watchdog_enabled false
gets none (no agent answers there). No setting can carry configuration: the door refuses them all, naming each, and
the template writes every value through the one renderer."""
import json
import os
import re
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def run_render(tmp_path, hosts, extra=None, balancers=None):
    """balancers: {name: host vars} of a group balancer around localhost (which renders as the first of them)."""
    inventory = tmp_path / "hosts.json"
    groups = {"vllm": {"hosts": hosts}}
    if balancers:
        groups["balancer"] = {"hosts": balancers}
    inventory.write_text(json.dumps({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": os.path.join(ROOT, ".venv", "bin", "python")}}},
        **groups}))
    run = subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", str(inventory),
         "tests/playbooks/render_haproxy.yml", "-e", json.dumps(dict(extra or {}, render_out=str(tmp_path)))],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg")))
    return run


def render(tmp_path, hosts):
    run = run_render(tmp_path, hosts)
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


INJECTION = "\n    server evil 203.0.113.66:80"
# Every setting the template writes, each carrying a server line (the probe of issue 28 used balancer_health_path).
HOSTILE = {name: value + INJECTION for name, value in {
    "balancer_backend_name": "vllm", "balancer_backend_group": "vllm", "balancer_health_path": "/health",
    "balancer_stats_uri": "/", "balancer_prometheus_path": "/metrics", "balancer_socket": "/run/haproxy/admin.sock",
    "balancer_state_file": "/var/lib/haproxy/server-state", "balancer_balance": "leastconn",
    "balancer_check_inter": "1s", "balancer_agent_inter": "2s", "balancer_timeout_check": "3s",
    "balancer_timeout_connect": "5s", "balancer_timeout_client": "10m", "balancer_timeout_server": "10m",
    "balancer_timeout_http_request": "60s", "balancer_timeout_http_keep_alive": "30s", "balancer_timeout_queue": "60s",
    "balancer_stats_bind": "127.0.0.1:8404", "balancer_prometheus_bind": "127.0.0.1:8405"}.items()}
HOSTILE_LISTS = {"balancer_bind": [":80" + INJECTION], "balancer_retry_on": ["503" + INJECTION],
                 "balancer_global_extra": ["maxconn 10" + INJECTION], "balancer_defaults_extra": ["x" + INJECTION],
                 "balancer_backend_extra": ["x" + INJECTION]}


def test_every_setting_that_could_carry_configuration_is_refused_naming_it(tmp_path):
    hostile = dict(HOSTILE, **HOSTILE_LISTS)
    run = run_render(tmp_path, {"gpu-a": {}}, hostile)
    assert run.returncode != 0
    assert not (tmp_path / "haproxy.cfg").exists()
    message = run.stdout + run.stderr
    for name, value in hostile.items():
        assert re.search(r"\b%s(\[0\])? " % name, message), "%s not named in: %s" % (name, message[-3000:])


def test_the_rendered_configuration_keeps_one_setting_a_line(tmp_path):
    """A loop's end tag swallowed the newline after retry-on, gluing "option redispatch" to it (haproxy -c refuses)."""
    render(tmp_path, {"gpu-a": {}})
    lines = (tmp_path / "haproxy.cfg").read_text().splitlines()
    retry = [line.strip() for line in lines if line.strip().startswith("retry-on ")]
    assert retry == ["retry-on conn-failure empty-response response-timeout 500 502 503 504"]
    assert any(line.strip() == "option redispatch 1" for line in lines)


@pytest.mark.parametrize("template, renderer", [
    ("etc/haproxy/haproxy.cfg.j2", r"\|\s*(vllm_fleet\.fleet\.haproxy_word\(|int\b|map\('vllm_fleet\.fleet\.haproxy_word')"),
    ("etc/keepalived/keepalived.conf.j2", r"\|\s*(vllm_fleet\.fleet\.keepalived_word\(|int\b)"),
])
def test_template_writes_every_value_through_the_renderer(template, renderer):
    """Each {{ }} of the balancer's templates is piped through its format's renderer (with a kind) or int, but
    ansible_managed: a new setting written raw fails here."""
    with open(os.path.join(ROOT, "roles", "balancer", "templates", template)) as handle:
        expressions = re.findall(r"{{(.*?)}}", handle.read())
    raw = [e.strip() for e in expressions if e.strip() != "ansible_managed" and not re.search(renderer, e)]
    assert raw == []


# Two balancers sharing a VIP: localhost renders, lb-2 is its peer (addresses from balancer_vrrp_address: no facts).
VIP = {"balancer_vip": "10.0.0.100", "balancer_vip_interface": "bond0"}
PAIR = {"localhost": {"balancer_vrrp_address": "10.0.0.11"}, "lb-2": {"balancer_vrrp_address": "10.0.0.12"}}


def test_with_a_vip_keepalived_holds_it_with_unicast_peers_and_haproxy_answers_its_check(tmp_path):
    run = run_render(tmp_path, {"gpu-a": {}}, VIP, PAIR)
    assert run.returncode == 0, run.stdout[-3000:]
    conf = (tmp_path / "keepalived.conf").read_text()
    lines = [line.strip() for line in conf.splitlines()]
    for line in ("state BACKUP", "nopreempt", "interface bond0", "virtual_router_id 51", "priority 200",
                 "unicast_src_ip 10.0.0.11", "10.0.0.12", "check_unicast_src", "10.0.0.100/32 dev bond0",
                 'script "/usr/bin/curl --fail --silent --max-time 1 --output /dev/null '
                 'http://127.0.0.1:80/balancer-health"',
                 'notify "/usr/local/sbin/balancer-vrrp-state /run/keepalived/vllm-fleet.state"'):
        assert line in lines, line
    assert "monitor-uri /balancer-health" in (tmp_path / "haproxy.cfg").read_text()
    # The second balancer gets the next priority down.
    run = run_render(tmp_path, {"gpu-a": {}}, VIP, {"lb-0": {"balancer_vrrp_address": "10.0.0.10"}, **PAIR})
    assert run.returncode == 0, run.stdout[-3000:]
    assert "priority 190" in (tmp_path / "keepalived.conf").read_text()


def test_without_a_vip_nothing_of_it_is_rendered(tmp_path):
    render(tmp_path, {"gpu-a": {}})
    assert not (tmp_path / "keepalived.conf").exists()
    assert "monitor-uri" not in (tmp_path / "haproxy.cfg").read_text()


def test_every_vip_setting_that_is_not_its_kind_is_refused_naming_it(tmp_path):
    hostile = {"balancer_vip": "10.0.0.100" + INJECTION, "balancer_vip_interface": "eth0 peer",
               "balancer_vrrp_router_id": 256, "balancer_vrrp_priority": 255, "balancer_vip_prefix": 33,
               "balancer_monitor_uri": "/ok" + INJECTION, "balancer_vrrp_advert_int": 0, "balancer_bind": ["10.0.0.5:80"]}
    run = run_render(tmp_path, {"gpu-a": {}}, hostile, PAIR)
    assert run.returncode != 0
    assert not (tmp_path / "haproxy.cfg").exists()
    message = run.stdout + run.stderr
    for name in hostile:
        assert re.search(r"\b%s\b" % name, message), "%s not named in: %s" % (name, message[-3000:])
    assert "listen on every address" in message


def test_a_vip_needs_two_balancers_each_with_a_known_address(tmp_path):
    run = run_render(tmp_path, {"gpu-a": {}}, VIP, {"localhost": PAIR["localhost"]})
    assert run.returncode != 0 and "balancer_vip needs two or more balancers" in run.stdout
    run = run_render(tmp_path, {"gpu-a": {}}, VIP, {"localhost": PAIR["localhost"], "lb-2": {}})
    assert run.returncode != 0 and "the VRRP address of lb-2 must be an IPv4 address" in run.stdout, run.stdout[-2000:]
    run = run_render(tmp_path, {"gpu-a": {}}, VIP, {"localhost": PAIR["localhost"],
                                                     "lb-2": {"balancer_vrrp_address": "10.0.0.12 10.0.0.66"}})
    assert run.returncode != 0 and "the VRRP address of lb-2 must be an IPv4 address" in run.stdout

