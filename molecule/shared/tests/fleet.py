"""Helpers for the Molecule verify tests: run commands and playbooks against the scenario's real test hosts."""
import json
import os
import subprocess
import time

PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.path.abspath(os.path.join(__file__, "../../../..")))
INVENTORY = os.environ.get("MOLECULE_INVENTORY_FILE", "")
API_KEY = "test-key-not-a-secret"  # molecule/shared/inventory/group_vars/vllm.yml


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
        cmd += f" -H 'Authorization: Bearer {key}'"
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

    Returns (returncode, output) with the output's whitespace folded: Ansible wraps long messages.
    """
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(PROJECT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    out = subprocess.run(
        ["ansible-playbook", "-i", INVENTORY, os.path.join(PROJECT, playbook_path), *args],
        capture_output=True, text=True, timeout=timeout, env=env, check=False, cwd=PROJECT,
    )
    return out.returncode, " ".join((out.stdout + out.stderr).split())
