"""The diagnosis of the three OOM failures, on the messages vLLM and PyTorch really print."""
import importlib.util
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "roles", "vllm", "module_utils"))
import vllm_diagnosis  # noqa: E402


def load_module(name):
    """Import a role module file; its `ansible.module_utils.vllm_diagnosis` import resolves to the role's copy."""
    sys.modules.setdefault("ansible.module_utils.vllm_diagnosis", vllm_diagnosis)
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "roles", "vllm", "library", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# As printed by vLLM (the guide's example; the mismatched parenthesis is vLLM's own).
STARTUP = ("ValueError: To serve at least one request with the model's max seq len (40960), (5.62 GiB KV cache is "
           "needed, which is larger than the available KV cache memory (4.89 GiB). Based on the available memory, "
           "the estimated maximum model length is 35600. Try increasing `gpu_memory_utilization` or decreasing "
           "`max_model_len` when initializing the engine.")
RUNTIME = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "23.99 GiB of which 1.10 GiB is free. Of the allocated memory 20.1 GiB is allocated by PyTorch, and "
           "1.2 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def test_startup_kv_cache_failure_reads_vllms_numbers():
    found = vllm_diagnosis.diagnose("INFO loading\n" + STARTUP + "\n")
    assert found["kind"] == "startup_kv_cache"
    assert found["details"] == {"max_model_len": 40960, "needed_gib": 5.62, "available_gib": 4.89,
                                "estimated_max_model_len": 35600}
    assert "max_model_len <= 35600" in found["advice"]
    assert 'the estimated maximum model length is 35600' in found["summary"]  # vLLM's words, greppable


def test_older_releases_spelling_models_s_is_recognised():
    assert vllm_diagnosis.diagnose(STARTUP.replace("model's", "models's"))["kind"] == "startup_kv_cache"


def test_runtime_allocator_oom_with_fragmentation_hint():
    found = vllm_diagnosis.diagnose(RUNTIME)
    assert found["kind"] == "runtime_oom"
    assert found["details"] == {"allocation": "2.00 GiB", "fragmentation": True}


def test_dead_engine_v1_and_v0():
    assert vllm_diagnosis.diagnose("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.")[
        "kind"] == "engine_dead"
    assert vllm_diagnosis.diagnose("AsyncEngineDeadError: Background loop has errored already.")[
        "kind"] == "engine_dead"


def test_gpu_still_held_at_start():
    text = ("ValueError: Free memory on device cuda:0 (3.1/22.05 GiB) on startup is less than desired GPU memory "
            "utilization (0.9, 19.85 GiB).")
    assert vllm_diagnosis.diagnose(text)["kind"] == "gpu_busy_at_start"


def test_clean_log_has_no_finding():
    assert vllm_diagnosis.diagnose("INFO: Application startup complete.")["kind"] == "none"


def test_metrics_parser_and_kv_pressure():
    diag = load_module("vllm_diagnose")
    text = "\n".join([
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.97',
        'vllm:num_preemptions_total{engine="0",model_name="m"} 12.0',
        'vllm:num_requests_waiting{engine="0",model_name="m"} 5.0',
        'vllm:num_requests_running{engine="0",model_name="m"} NaN',
    ])
    metrics = diag.parse_metrics(text)
    assert metrics == {"vllm:kv_cache_usage_perc": 0.97, "vllm:num_preemptions_total": 12.0,
                       "vllm:num_requests_waiting": 5.0}
    finding = diag.pressure_finding(metrics)
    assert finding["kind"] == "kv_cache_pressure" and "12 preemptions" in finding["summary"]
    assert diag.pressure_finding({"vllm:kv_cache_usage_perc": 0.4}) is None
