"""Helpers for the Molecule verify tests: run commands and playbooks against the scenario's real test hosts."""
import json
import os
import shlex
import subprocess
import sys
import time

import yaml

PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.path.abspath(os.path.join(__file__, "../../../..")))
INVENTORY = os.environ.get("MOLECULE_INVENTORY_FILE", "")
API_KEY = 'k3y\\with "quotes" $HOME %i and spaces'  # molecule/shared/inventory/group_vars/vllm.yml
with open(os.path.join(PROJECT, "molecule", "shared", "inventory", "group_vars", "vllm.yml")) as _f:
    VLLM_VARS = yaml.safe_load(_f)  # the test fleet's settings, for bounds that follow from them


def sh(host, cmd, check=True, timeout=120):
    """Run a shell command inside a test host (a container) and return the completed process."""
    out = subprocess.run(["docker", "exec", host, "bash", "-c", cmd], capture_output=True, text=True,
                         timeout=timeout, check=False)
    if check and out.returncode != 0:
        raise AssertionError(f"{host}: `{cmd}` exited {out.returncode}: {out.stdout}{out.stderr}")
    return out


def unit_props(host, unit, *props):
    out = sh(host, f"systemctl show {unit} -p {','.join(props)}").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def http(host, path, data=None, key=API_KEY, port=8000, timeout=60):
    """(status, body) of an HTTP request made on the host itself, to its own loopback."""
    cmd = f"curl -s -m {timeout} -o /tmp/body -w '%{{http_code}}' http://127.0.0.1:{port}{path}"
    if key:
        cmd += " -H " + shlex.quote("Authorization: Bearer " + key)
    if data is not None:
        cmd += f" -H 'Content-Type: application/json' -d '{json.dumps(data)}'"
    out = sh(host, cmd + "; echo; cat /tmp/body", check=False, timeout=timeout + 10)
    status, _, body = out.stdout.partition("\n")
    return int(status or 0), body


def wait_until(predicate, timeout, interval=2, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def playbook(playbook_path, *args, timeout=1200):
    """Run a project playbook against the scenario's inventory.

    Returns the CompletedProcess with stdout and stderr joined in .stdout and whitespace folded, since Ansible
    wraps long messages.
    """
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(PROJECT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    out = subprocess.run(
        ["ansible-playbook", "-i", INVENTORY, os.path.join(PROJECT, playbook_path), *args],
        capture_output=True, text=True, timeout=timeout, env=env, check=False, cwd=PROJECT,
    )
    return subprocess.CompletedProcess(out.args, out.returncode, " ".join((out.stdout + out.stderr).split()), "")


class Load:
    """tools/loadgen.py in the background against the balancer's loopback port, for the span of a `with` block."""

    # Light by default: each CPU-build worker busy-polls for work for 1 s after every step (vLLM's shm queue), so
    # a request to every server more than about once a second keeps them all spinning and starves a restarting
    # host on two cores. Measured here, one host's restart under 2 clients: 35 s without load, 48 s with a 1.5 s
    # pause (1.3 requests/s), 101-106 s with a 1.0 s pause (1.8 requests/s); under the 1.5 s pause each of two
    # serving workers still took 55 % of a core. A 3 s pause still sends a request every second or two.
    def __init__(self, workdir, name, clients=2, streaming=1, pause=3, url="http://127.0.0.1:18080/v1/completions"):
        self.stop = os.path.join(workdir, f"{name}.stop")
        self.report_file = os.path.join(workdir, f"{name}.json")
        self.events_file = os.path.join(workdir, f"{name}.jsonl")
        self.cmd = [sys.executable, os.path.join(PROJECT, "tools", "loadgen.py"), url, "--model", "tiny-llama",
                    "--clients", str(clients), "--streaming-clients", str(streaming), "--max-tokens", "8", "--pause", str(pause),
                    "--duration", "1200", "--stop-file", self.stop, "--report", self.report_file,
                    "--events", self.events_file]
        self.report = None

    def __enter__(self):
        self.proc = subprocess.Popen(self.cmd, env=dict(os.environ, LOADGEN_API_KEY=API_KEY),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(3)  # traffic flowing before the action starts
        return self

    def __exit__(self, *exc):
        time.sleep(3)  # and still flowing after it
        open(self.stop, "w").close()
        out, _ = self.proc.communicate(timeout=120)
        with open(self.report_file) as f:
            self.report = json.load(f)
        print(f"load: {self.report['totals']} errors={self.report['errors']} ({out.strip()[-300:]})")
        return False
