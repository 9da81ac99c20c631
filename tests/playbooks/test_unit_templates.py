"""The vllm role's per-instance templates rendered by Ansible itself (tests/playbooks/render_vllm_templates.yml):
DeviceAllow follows the GPUs' device minors, values go through the renderers. systemd reads such renderings back
in the balancer scenario."""
import json
import os
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
H100 = json.load(open(os.path.join(ROOT, "tests", "fixtures", "gpus", "h100-8.json")))


def test_device_allow_uses_minor_numbers_and_values_are_escaped(tmp_path):
    facts = [{k: g[k] for k in ("index", "name", "uuid", "memory_total_mib", "compute_capability", "minor_number")}
             for g in H100["gpus"]]
    extra = {
        "render_out": str(tmp_path), "vllm_gpus": facts, "vllm_model_dir": "/srv/models/m",
        "vllm_api_key": 'k3y\\with "quotes" $HOME %i and spaces', "vllm_hf_token": "ends with \\",
        "vllm_environment": {"ODD": 'a "b" $c %d \\'},
        "vllm_plans": {"main": {"reason": "fits\nExecStartPre=+/bin/sh", "env": {}}},
        "vllm_argv": {"main": ["--model", "/srv/models/m", "--served-model-name", "a $b %c"]},
        "ansible_python_interpreter": os.path.join(ROOT, ".venv", "bin", "python"),
    }
    run = subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "tests/playbooks/render_vllm_templates.yml", "-e", json.dumps(extra)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg")))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    unit = (tmp_path / "10-plan.conf").read_text().splitlines()
    # GPUs 0 and 1 are /dev/nvidia2 and /dev/nvidia3 on this host (h100-8.json).
    assert [line for line in unit if line.startswith("DeviceAllow=")] == ["DeviceAllow=/dev/nvidia2 rw",
                                                                        "DeviceAllow=/dev/nvidia3 rw"]
    assert 'Environment="ODD=a \\"b\\" $c %%d \\\\"' in unit
    assert 'Environment="VLLM_CACHE_ROOT=/var/lib/vllm/cache/main"' in unit  # vLLM's caches, one per instance
    assert unit[-1].endswith('"--served-model-name" "a $$b %%c"')
    assert not any(line.startswith("ExecStartPre") for line in unit)  # the reason's newline stayed in its comment
    assert (tmp_path / "main.env").read_text().splitlines()[-2:] == [
        'HF_TOKEN="ends with \\\\"', 'VLLM_API_KEY="k3y\\\\with \\"quotes\\" \\$HOME %i and spaces"']
