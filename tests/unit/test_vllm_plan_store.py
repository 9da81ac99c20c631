"""The vllm_plan action's read of the calibration store (plugins/action/vllm_plan.py): for every configuration of the
instance's GPU type and model, this host's and instance's own entry, else another host's; starts and load tests apart.
The sizing then uses each for its own configuration (test_vllm_sizing_calibration.py)."""
import json

from ansible_collections.vllm_fleet.fleet.plugins.action.vllm_plan import store_entries
from ansible_collections.vllm_fleet.fleet.plugins.plugin_utils.vllm_sizing.calibration import key_prefix


def write(root, path):
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"key": str(target.parent.relative_to(root))}))


def test_own_entry_first_else_another_hosts_for_every_configuration(tmp_path):
    prefix = key_prefix("NVIDIA A10G", "/srv/models/Qwen3-8B/")
    assert prefix == "nvidia-a10g/qwen3-8b"
    release = prefix + "/vllm-0.34.0/"
    for path in ("tp1-kv-auto/gpu-2-main.json", "tp1-kv-auto/gpu-1-main.json", "tp1-kv-auto/gpu-1-small.json",
                 "tp1-kv-fp8/gpu-3-main.json", "tp1-kv-fp8/loadtest/gpu-3-main.json"):
        write(tmp_path, release + path)
    write(tmp_path, "nvidia-h100/qwen3-8b/vllm-0.34.0/tp1-kv-auto/gpu-1-main.json")
    starts, loadtests = store_entries(str(tmp_path), prefix, "gpu-1", "main")
    base = str(tmp_path / prefix / "vllm-0.34.0")
    assert starts == [base + "/tp1-kv-auto/gpu-1-main.json", base + "/tp1-kv-fp8/gpu-3-main.json"]
    assert loadtests == [base + "/tp1-kv-fp8/loadtest/gpu-3-main.json"]
    # Another host's instance of another name: the first entry of each configuration, by name.
    assert store_entries(str(tmp_path), prefix, "gpu-9", "main")[0][0] == base + "/tp1-kv-auto/gpu-1-main.json"
    assert store_entries(str(tmp_path), key_prefix("NVIDIA L4", "Qwen/Qwen3-8B"), "gpu-1", "main") == ([], [])
