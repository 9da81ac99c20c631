"""execution-environment.yml (AWX, Automation Platform): ansible-builder 3 turns it into a build context (no image is
built here), its pins are requirements.txt's, and the collections the project uses are in what it installs."""
import glob
import os
import re
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)


def pins():
    with open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8") as handle:
        return dict(line.split("==") for line in (raw.split("#")[0].strip() for raw in handle) if "==" in line)


def definition():
    with open(os.path.join(ROOT, "execution-environment.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def test_ansible_builder_creates_the_build_context(tmp_path):
    run = subprocess.run([os.path.join(BIN, "ansible-builder"), "create", "-f", "execution-environment.yml",
                          "-c", str(tmp_path / "context"), "--output-filename", "Containerfile"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    containerfile = (tmp_path / "context" / "Containerfile").read_text()
    assert 'ANSIBLE_INSTALL_REFS="ansible-core==%s ansible-runner==' % pins()["ansible-core"] in containerfile
    python = (tmp_path / "context" / "_build" / "requirements.txt").read_text().split()
    assert python == ["ansible==%s" % pins()["ansible"], "matplotlib==%s" % pins()["matplotlib"]]


def test_the_pins_are_the_controllers():
    ee, pinned = definition(), pins()
    assert ee["version"] == 3
    assert ee["dependencies"]["ansible_core"]["package_pip"] == "ansible-core==" + pinned["ansible-core"]
    assert ee["dependencies"]["python"] == ["ansible==" + pinned["ansible"], "matplotlib==" + pinned["matplotlib"]]


def test_every_collection_the_project_uses_comes_with_the_ansible_package():
    """Tasks' module names and ansible.cfg's callbacks: each collection other than ansible.builtin must be in the
    `ansible` package the environment installs (the same version as the controller's venv)."""
    used = set()
    for path in glob.glob(os.path.join(ROOT, "roles", "*", "tasks", "*.yml")) + \
            glob.glob(os.path.join(ROOT, "playbooks", "*.yml")):
        with open(path, encoding="utf-8") as handle:
            used.update(re.findall(r"^\s*(?:- )?([a-z0-9_]+\.[a-z0-9_]+)\.[a-z0-9_]+:", handle.read(), re.M))
    with open(os.path.join(ROOT, "ansible.cfg"), encoding="utf-8") as handle:
        used.update(re.findall(r"\b([a-z0-9_]+\.[a-z0-9_]+)\.[a-z0-9_]+\b", handle.read().split("callbacks_enabled")[1]
                               .splitlines()[0]))
    used.discard("ansible.builtin")
    assert used >= {"community.general", "ansible.posix"}
    import ansible_collections
    missing = [name for name in sorted(used)
               if not any(os.path.isdir(os.path.join(path, *name.split("."))) for path in ansible_collections.__path__)]
    assert not missing, "not in the ansible package: %s" % missing
