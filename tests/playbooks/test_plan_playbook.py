"""playbooks/plan.yml end to end: declared GPUs, catalog models, nothing contacted, one row per host."""
import json
import os
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_plan_prints_a_row_per_host_and_refuses_what_would_not_start(tmp_path):
    out_file = tmp_path / "plan.json"
    run = subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", "tests/playbooks/plan-inventory.yml",
         "playbooks/plan.yml", "-e", f"plan_out={out_file}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0"),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    rows = [line for line in run.stdout.splitlines() if line.strip().startswith('"') and " main " in line]
    assert len(rows) == 3, run.stdout[-3000:]
    by_host = {row.split()[0].strip('"'): row for row in rows}
    assert by_host["h100x8-gptoss"].rstrip('",').endswith("fits")
    assert "REFUSED" in by_host["t4-llama70b"] and "No available memory for the cache blocks" in by_host["t4-llama70b"]

    plans = json.loads(out_file.read_text())
    gptoss = plans["h100x8-gptoss"]["main"]
    assert gptoss["fits"] and gptoss["engine_args"]["max_model_len"] == 65536
    # Tensor parallelism on a 8-GPU host: the custom all-reduce conflict with expandable segments is handled.
    assert gptoss["engine_args"]["tensor_parallel_size"] > 1 and gptoss["engine_args"]["disable_custom_all_reduce"]
    assert gptoss["env"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert not plans["a10g-qwen3"]["main"]["fits"]
