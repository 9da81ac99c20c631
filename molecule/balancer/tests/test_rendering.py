"""The renderers of filter_plugins/fleet_render.py, read back by the real parsers on this scenario's hosts:
systemd 252 (Debian 12) runs a unit whose environment file, Environment= lines and ExecStart carry hostile values,
and the process reports what it received; HAProxy 2.6 checks a configuration of rendered server lines.
Values with control characters never get this far: the renderers refuse them (tests/unit/test_fleet_render.py)."""
import base64
import json
import os
import sys

from fleet import PROJECT, sh

sys.path.insert(0, os.path.join(PROJECT, "filter_plugins"))
from fleet_render import env_file, haproxy_word, systemd_environment, systemd_exec  # noqa: E402

HOST = "backend-1"
LB = "balancer-1"
# The cases: a trailing backslash (swallowed the next line), a leading quote (swallowed the rest),
# backslashes (vanished), surrounding spaces (trimmed), $ (doubled in Environment=), % (a specifier), backquotes.
HOSTILE = {
    "TRAILING_BACKSLASH": "key ends with \\",
    "LEADING_QUOTE": '"starts with a quote',
    "BACKSLASHES": "a\\b\\\\c\\n",
    "SPACES": "  surrounded by spaces  ",
    "DOLLAR": "$HOME ${PATH} $$",
    "PERCENT": "100% %i %n %%",
    "BACKQUOTE": "`id` 'single'",
}
# One line: a unit file word holds no newline.
REPORT = ("import json, os, sys; json.dump({'argv': sys.argv[1:], 'env': {n: os.environ.get(n) for n in %r}}, "
          "open('/run/render-check.json', 'w'))")


def put(host, path, text):
    encoded = base64.b64encode(text.encode()).decode()
    sh(host, f"echo {encoded} | base64 -d > {path}")


def test_systemd_passes_rendered_values_verbatim():
    unit_env = {"UNIT_" + k: v for k, v in HOSTILE.items()}
    file_env = {"FILE_" + k: v for k, v in HOSTILE.items()}
    args = list(HOSTILE.values())
    script = REPORT % sorted(list(unit_env) + list(file_env))
    put(HOST, "/etc/render-check.env", env_file(file_env) + "\n")
    put(HOST, "/etc/systemd/system/render-check.service", "\n".join([
        "[Service]", "Type=oneshot", "EnvironmentFile=/etc/render-check.env", systemd_environment(unit_env),
        "ExecStart=" + systemd_exec(["/usr/bin/python3", "-c", script] + args), ""]))
    try:
        verify = sh(HOST, "systemd-analyze verify /etc/systemd/system/render-check.service", check=False)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        sh(HOST, "systemctl daemon-reload && systemctl start render-check.service")
        seen = json.loads(sh(HOST, "cat /run/render-check.json").stdout)
    finally:
        sh(HOST, "rm -f /etc/systemd/system/render-check.service /etc/render-check.env /run/render-check.json"
                 " && systemctl daemon-reload", check=False)
    assert seen["argv"] == args
    assert seen["env"] == {**unit_env, **file_env}


def test_haproxy_accepts_rendered_server_lines():
    servers = [("gpu-01.dc1-main", "gpu-01.dc1.invalid", 8000), ("h_2-lora.a", "127.0.0.1", 8001)]
    # init-addr none: the check must not depend on resolving the names.
    lines = ["defaults", "    mode http", "    timeout connect 1s", "    timeout client 1s", "    timeout server 1s",
             "    default-server init-addr none", "backend check"]
    lines += ["    server %s %s:%d check" % (haproxy_word(n), haproxy_word(a), p) for n, a, p in servers]
    put(LB, "/tmp/render-check.cfg", "\n".join(lines) + "\n")
    result = sh(LB, "haproxy -c -f /tmp/render-check.cfg; rm -f /tmp/render-check.cfg", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
