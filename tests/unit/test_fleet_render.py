"""The renderers of filter_plugins/fleet_render.py and its fleet_invalid checks, on the hostile values of
issue 12. systemd and HAProxy read the same renderings back on real test hosts (molecule/balancer)."""
import pytest
from ansible.errors import AnsibleFilterError

from fleet_inventory import fleet_address, fleet_batches, fleet_servers
from fleet_render import (env_file, fleet_invalid, haproxy_word, keepalived_word, systemd_comment, systemd_environment, systemd_exec,
                          systemd_value)

HOSTILE = ["ends with \\", '"leading quote', "back\\\\slashes\\n", "  spaced  ", "$HOME and ${PATH}", "100%i", "`id`"]


def test_exec_words_are_quoted_with_unit_file_escapes():
    assert systemd_exec(["/bin/x", "a b", 'q"u', "back\\", "$HOME", "100%"]) == (
        '"/bin/x" "a b" "q\\"u" "back\\\\" "$$HOME" "100%%"')


def test_environment_doubles_percent_not_dollar():
    assert systemd_environment({"B": "x$y", "A": 'say "hi" 5%\\'}) == (
        'Environment="A=say \\"hi\\" 5%%\\\\"\nEnvironment="B=x$y"')


def test_env_file_escapes_what_systemd_unescapes_in_double_quotes():
    rendered = env_file({"VLLM_API_KEY": HOSTILE[0], "HF_TOKEN": HOSTILE[1]})
    assert rendered == 'HF_TOKEN="\\"leading quote"\nVLLM_API_KEY="ends with \\\\"'
    assert env_file({"K": "$HOME `id` \\n  "}) == 'K="\\$HOME \\`id\\` \\\\n  "'


@pytest.mark.parametrize("render", [
    lambda v: systemd_exec(["/bin/x", v]),
    lambda v: systemd_environment({"K": v}),
    lambda v: env_file({"VLLM_API_KEY": v}),
    lambda v: systemd_value(v),
    lambda v: haproxy_word(v),
])
@pytest.mark.parametrize("value", ["a\nLD_PRELOAD=/tmp/x.so", "a\rb", "tab\there", "nul\x00"])
def test_control_characters_are_refused_without_printing_the_value(render, value):
    with pytest.raises(AnsibleFilterError) as error:
        render(value)
    assert "LD_PRELOAD" not in str(error.value) and "nul" not in str(error.value)


@pytest.mark.parametrize("env, message", [
    ({"BAD-NAME": "x"}, r"'BAD-NAME' is not a valid variable name"),
    ({"K\nX": "x"}, r"is not a valid variable name"),
    ({"K": ["list"]}, r"must be a string or a number"),
])
def test_bad_variables(env, message):
    for render in (systemd_environment, env_file):
        with pytest.raises(AnsibleFilterError, match=message):
            render(env)


def test_values_and_comments():
    assert systemd_value("/var/lib/vllm") == "/var/lib/vllm" and systemd_value("50%") == "50%%"
    for bad in ("", "/var/lib/my vllm", '/x"', "/x\\y"):
        with pytest.raises(AnsibleFilterError, match=r"empty or holds whitespace, quotes or backslashes"):
            systemd_value(bad)
    assert systemd_comment("model\nExecStartPre=+/bin/sh \\") == "model ExecStartPre=+/bin/sh"


def test_haproxy_words():
    assert haproxy_word("vllm-1-main") == "vllm-1-main" and haproxy_word("[fd00::1]") == "[fd00::1]"
    for bad in ("a b", "x#y", '"q"', "a;b"):
        with pytest.raises(AnsibleFilterError, match=r"is not a single HAProxy word"):
            haproxy_word(bad)


# Every kind of haproxy.cfg value: what each accepts, and what would carry configuration (issue 28: a newline in
# balancer_health_path added a server line that `haproxy -c` calls valid).
HAPROXY_KINDS = {
    "time": (["1s", "250ms", "10m", "60", "2d"], ["1 s", "5s\n    server evil 203.0.113.66:80", "s", "-1s", "1.5s"]),
    "path": (["/health", "/metrics", "/", "/v1/%7Euser;x=1"],
             ["health", "/health\n    server evil 203.0.113.66:80", "/a b", "/a#b", "/a\"b", "/${X}", ""]),
    "bind": ([":80", "*:8080", "10.0.0.5:8000", "[::]:80", ":443 ssl crt /etc/haproxy/site.pem"],
             ["80", ":80\n    server evil 203.0.113.66:80", ":80  ssl", ":80 #x", "host:port", ""]),
    "keyword": (["leastconn", "random(2)", "hdr(host)", "conn-failure", "503"],
                ["least conn", "leastconn\nserver x", "uri whole", "Leastconn", ""]),
    "line": (["option http-keep-alive", "", "http-request set-header X-Y \"a b\""], ["one\ntwo", "tab\there"]),
}


@pytest.mark.parametrize("kind", sorted(HAPROXY_KINDS))
def test_haproxy_kinds(kind):
    good, bad = HAPROXY_KINDS[kind]
    for value in good:
        assert haproxy_word(value, "balancer_x", kind) == value
        assert fleet_invalid([["balancer_x", value, "haproxy_" + kind]]) == []
    for value in bad:
        with pytest.raises(AnsibleFilterError, match=r"^balancer_x "):
            haproxy_word(value, "balancer_x", kind)
        problems = fleet_invalid([["balancer_x", value, "haproxy_" + kind]], host="lb-1")
        assert len(problems) == 1 and problems[0].startswith("lb-1: balancer_x "), (value, problems)
    with pytest.raises(AnsibleFilterError, match=r"unknown kind 'url' for balancer_x"):
        haproxy_word("/x", "balancer_x", "url")


@pytest.mark.parametrize("kind,good,bad", [
    ("ipv4", ["10.0.0.100", "198.18.231.250", "0.0.0.0"], ["10.0.0.256", "10.0.0", "10.0.0.1/24", "10.0.0.1 x", "::1"]),
    ("ifname", ["eth0", "bond0.100", "enp1s0f0np0"], ["eth0 x", "a" * 16, "", "eth0#"]),
    ("word", ["http://127.0.0.1:80/balancer-health", "/run/keepalived/x.state"], ["a b", "a#b", "a!b", 'a"b', ""]),
])
def test_keepalived_kinds(kind, good, bad):
    for value in good:
        assert keepalived_word(value, "v", kind) == value
    for value in bad:
        with pytest.raises(AnsibleFilterError, match="v"):
            keepalived_word(value, "v", kind)
    assert fleet_invalid(bad, kind="keepalived_" + kind, label="x") and not fleet_invalid(good, kind="keepalived_" + kind)


def test_extra_packages_must_be_pinned():
    good = ["runai-model-streamer==0.14.0", "fastsafetensors==0.1.15", "runai-model-streamer[s3]==0.14.0"]
    bad = ["fastsafetensors", "fastsafetensors>=0.1", "x==", "x==1 ; rm", "-r x==1", "x==1\ny==2"]
    assert fleet_invalid(good, kind="pin", label="vllm_pip_extra_packages") == []
    problems = fleet_invalid(bad, host="gpu-1", kind="pin", label="vllm_pip_extra_packages")
    assert len(problems) == len(bad) and problems[0] == (
        "gpu-1: vllm_pip_extra_packages[0] must be a package pinned as NAME==VERSION (or NAME[EXTRA]==VERSION), got "
        "'fastsafetensors'")


def test_fleet_invalid_names_the_variable_and_hides_secrets():
    problems = fleet_invalid([
        ["vllm_home", "/var/lib/vllm", "path"], ["vllm_hf_home", "/var/lib/../etc", "path"],
        ["vllm_nvidia_smi", "relative/nvidia-smi", "path"], ["vllm_user", "Root User", "user"],
        ["vllm_api_key", "s3cret\n", "secret"], ["vllm_hf_token", " s3cret", "secret"], ["ok", "", "secret"],
        ["vllm_model", "--api-key", "text"], ["vllm_model", "org/model\n# x", "text"], ["port", 0, "port"],
        ["port", "8000", "port"], ["listen", "0.0.0.0", "host"], ["env", "LD PRELOAD", "env"],
    ], host="gpu-1")
    assert len(problems) == 9, problems
    assert all(p.startswith("gpu-1: ") for p in problems)
    assert not any("s3cret" in p for p in problems)
    assert any("vllm_hf_home must be an absolute path" in p for p in problems)
    assert any("vllm_api_key holds characters other than printable ASCII" in p for p in problems)
    assert any("vllm_model '--api-key' starts with '-'" in p for p in problems)
    names = fleet_invalid(["main", "../etc", "a b", "x" * 65], kind="name", label="vllm_instances.name")
    assert [p.split(" ")[0] for p in names] == ["vllm_instances.name[1]", "vllm_instances.name[2]",
                                                "vllm_instances.name[3]"]
    # The API key of the fleet test (backslash, quotes, $, % and spaces) is a valid secret.
    assert fleet_invalid([["vllm_api_key", 'k3y\\with "quotes" $HOME %i and spaces', "secret"]]) == []
    with pytest.raises(AnsibleFilterError, match=r"unknown kind 'url'"):
        fleet_invalid([["x", "y", "url"]])


def test_flags_are_one_word_options():
    flags = ["--collector.systemd", "--cluster.listen-address=", "--web.listen-address=:9100", "--a b", "-v",
             "--x=1\n--y", "positional"]
    problems = fleet_invalid(flags, host="mon-1", kind="flag", label="monitoring_prometheus_args")
    assert [p.split(" ")[1] for p in problems] == ["monitoring_prometheus_args[%d]" % i for i in (3, 4, 5, 6)]
    assert all("one word starting with --" in p for p in problems)


class HostVars(dict):
    """hostvars: a host's variables by inventory name."""


def test_fleet_servers_is_the_one_naming_and_address_rule():
    hostvars = HostVars({
        "gpu-1": {"ansible_host": "10.0.0.1", "vllm_instances": [{"name": "a", "port": 8000},
                                                                 {"name": "b", "port": 8001}]},
        "gpu-2": {"ansible_host": "10.0.0.2", "balancer_backend_address": "gpu-2.lan"},
        "gpu-3": {},
    })
    servers = fleet_servers(["gpu-1", "gpu-2", "gpu-3"], hostvars, [{"name": "main", "port": 8000}])
    assert [(s["server"], s["address"], s["port"]) for s in servers] == [
        ("gpu-1-a", "10.0.0.1", 8000), ("gpu-1-b", "10.0.0.1", 8001), ("gpu-2-main", "gpu-2.lan", 8000),
        ("gpu-3-main", "gpu-3", 8000)]
    assert fleet_address("gpu-2", hostvars) == "gpu-2.lan"
    hostvars["gpu-1"]["vllm_instances"] = [{"name": "a"}]
    with pytest.raises(AnsibleFilterError, match=r"host gpu-1: vllm_instances\[0\] must be a dict with name and port"):
        fleet_servers(["gpu-1"], hostvars, [])


def test_fleet_batches_are_serial_hosts_or_one_failure_domain_each():
    hostvars = {"gpu-1": {"rack": "r1"}, "gpu-2": {"rack": "r2"}, "gpu-3": {"rack": "r1"}, "gpu-4": {"rack": 7}}
    hosts = ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    assert fleet_batches(hosts, hostvars) == {"hosts": hosts, "serial": 1, "domains": []}
    assert fleet_batches(hosts, hostvars, "", "25%")["serial"] == "25%"
    # Grouped by domain, in order of each domain's first host; serial is the list of batch sizes.
    assert fleet_batches(hosts, hostvars, "rack") == {"hosts": ["gpu-1", "gpu-3", "gpu-2", "gpu-4"],
                                                      "serial": [2, 1, 1], "domains": ["r1", "r2", "7"]}
    assert fleet_batches(["gpu-3", "gpu-2"], hostvars, "rack")["serial"] == [1, 1]
    assert fleet_batches([], hostvars, "rack") == {"hosts": [], "serial": [], "domains": []}


@pytest.mark.parametrize("hostvars, serial, message", [
    ({"gpu-1": {"rack": "r1"}, "gpu-2": {}, "gpu-3": {}}, None,
     "rolling_restart_batch_by is rack, which host.s. gpu-2, gpu-3 do not set"),
    ({"gpu-1": {"rack": "r1"}, "gpu-2": {"rack": ["r1"]}, "gpu-3": {"rack": "r2"}}, None,
     r"host gpu-2: rack must be a name or a number \(its failure domain\), got \['r1'\]"),
    ({"gpu-1": {"rack": ""}, "gpu-2": {"rack": "r1"}, "gpu-3": {"rack": "r2"}}, None, "host gpu-1: rack must be"),
    ({"gpu-1": {"rack": "r1"}, "gpu-2": {"rack": "r1"}, "gpu-3": {"rack": "r2"}}, 2,
     r"rolling_restart_batch_by \(rack\) and rolling_restart_serial \(2\) both set"),
])
def test_fleet_batches_refuses_a_domain_it_cannot_read(hostvars, serial, message):
    with pytest.raises(AnsibleFilterError, match=message):
        fleet_batches(["gpu-1", "gpu-2", "gpu-3"], hostvars, "rack", serial)
