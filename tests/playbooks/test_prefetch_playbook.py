"""The vllm role's prefetch.yml and prefetch_wait.yml as the roll runs them around a host's drain and stop, on the
controller: the read starts in the background, and after the stop vllm_prefetch says what it read. The fleet
scenario checks the same on real hosts through the roll's report (test_2_fleet.py, test_1)."""
import json
import os
import shutil
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PYTHON = os.path.join(ROOT, ".venv", "bin", "python")


def prefetch(tmp_path, helper_dir, model_dir, **extra):
    """Run both task files on a local host; returns (the run, vllm_prefetch as it was set)."""
    book = tmp_path / "prefetch.yml"
    book.write_text(json.dumps([{"hosts": "gpu-a", "gather_facts": False, "tasks": [
        {"ansible.builtin.include_role": {"name": "vllm", "tasks_from": "prefetch"}},
        {"ansible.builtin.include_role": {"name": "vllm", "tasks_from": "prefetch_wait"}},
        {"ansible.builtin.copy": {"content": "{{ vllm_prefetch | to_json }}", "dest": str(tmp_path / "read.json"),
                                  "mode": "0600"}}]}]))
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": {"gpu-a": {
        "ansible_connection": "local", "ansible_python_interpreter": PYTHON}}}}))
    run = subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", str(inventory), str(book),
         "-e", json.dumps(dict({"vllm_helper_dir": str(helper_dir), "vllm_model_dir": str(model_dir)}, **extra))],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
                 ANSIBLE_ROLES_PATH=os.path.join(ROOT, "roles"), ANSIBLE_ASYNC_DIR=str(tmp_path / "async")))
    assert run.returncode == 0, run.stdout[-3000:]
    return json.loads((tmp_path / "read.json").read_text())


def test_the_models_files_are_read_in_the_background_and_reported(tmp_path):
    helper_dir = tmp_path / "libexec"
    helper_dir.mkdir()
    # As the role installs it: the helper with the collection's nvidia-smi reader and HTTP client next to it.
    shutil.copy(os.path.join(ROOT, "roles", "vllm", "files", "vllm-unit-helper"), helper_dir)
    for name in ("nvidia_smi.py", "vllm_http.py"):
        shutil.copy(os.path.join(ROOT, "plugins", "module_utils", name), helper_dir)
    os.chmod(helper_dir / "vllm-unit-helper", 0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(os.urandom(2 << 20))
    (model / "config.json").write_text("{}")
    read = prefetch(tmp_path, helper_dir, model, vllm_prefetch_reserve_mib=0)
    assert read["files"] == 2 and read["bytes"] == (2 << 20) + 2 and read["skipped_bytes"] == 0


def test_a_read_that_fails_is_reported_and_does_not_stop_the_roll(tmp_path):
    # The helper is not executable here: the wait says why in vllm_prefetch, and the run goes on.
    helper_dir = tmp_path / "libexec"
    helper_dir.mkdir()
    (helper_dir / "vllm-unit-helper").write_text("#!/bin/sh\n")
    assert prefetch(tmp_path, helper_dir, tmp_path) == {"error": "Error executing command. (rc 13)"}
