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
    # Serving options reach the plan; the block size is always explicit, decided for the H100 (compute 9.0).
    assert gptoss["engine_args"]["tool_call_parser"] == "openai" and gptoss["engine_args"]["enable_prefix_caching"]
    assert gptoss["engine_args"]["block_size"] == 64 and gptoss["attention_backend"] == "FLASH_ATTN"
    assert not plans["a10g-qwen3"]["main"]["fits"]


def test_options_are_checked_before_any_plan(tmp_path):
    """A misspelt policy key, a role-owned argument or a flag the planned vLLM lacks stops plan.yml with the
    variable named."""
    def plan(options, variable="vllm_serve_options"):
        return subprocess.run(
            [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", "tests/playbooks/plan-inventory.yml",
             "playbooks/plan.yml", "--limit", "a10g-qwen3", "-e", json.dumps({variable: options}),
             "-e", f"plan_out={tmp_path / 'plan.json'}"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
            env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0"))
    owned = plan({"port": 9000, "dtype": "float16"})
    assert owned.returncode != 0 and "vllm_serve_options sets port (set vllm_instances[].port instead)" in owned.stdout
    typo = plan({"gpu_shareing": "shared"}, "vllm_policy")
    assert typo.returncode != 0 and "vllm_policy.gpu_shareing. Supported parameters include" in typo.stdout
    missing = plan({"swap_space": 4})
    assert missing.returncode != 0
    assert "policy.serve_options.swap_space: --swap-space does not exist in vLLM 0.34.0" in missing.stdout
