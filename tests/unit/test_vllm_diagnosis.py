"""The diagnosis of the vLLM OOM failures, on lines vLLM and PyTorch really print (tests/fixtures/vllm-logs)."""
import glob
import importlib
import os
import re

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "vllm-logs")
from ansible_collections.vllm_fleet.fleet.plugins.module_utils import vllm_diagnosis  # noqa: E402


def load_module(name):
    """One of the collection's modules."""
    return importlib.import_module("ansible_collections.vllm_fleet.fleet.plugins.modules." + name)


def log(*names):
    """The fixtures' lines, joined in order, without their source headers."""
    lines = []
    for name in names:
        with open(os.path.join(FIXTURES, name), encoding="utf-8") as handle:
            lines += [line for line in handle.read().splitlines() if not line.startswith("# ")]
    return "\n".join(lines) + "\n"


def diagnose(*names):
    return vllm_diagnosis.diagnose(log(*names))


# fixture -> kind and the details it must carry: every wording vLLM 0.32/0.34 (and V0) prints, as found.
CASES = {
    # Failure 1, the KV check: with and without the estimate, 0.32 and 0.34 wordings, the older "models's".
    "cpu032-kv-startup.log": ("startup_kv_cache", {"max_model_len": 65536, "needed_gib": 2.0, "available_gib": 1.0,
                                                   "estimated_max_model_len": 32640}),
    "cpu032-kv-startup-no-estimate.log": ("startup_kv_cache", {"max_model_len": 131072,
                                                               "estimated_max_model_len": 0}),
    "v034-kv-startup-extensible.log": ("startup_kv_cache", {"max_model_len": 40960, "needed_gib": 9.0,
                                                            "available_gib": 5.21, "estimated_max_model_len": 21392}),
    "v034-kv-startup-no-estimate.log": ("startup_kv_cache", {"available_gib": 0.4, "estimated_max_model_len": 0}),
    "tpu-inference-223-models-s.log": ("startup_kv_cache", {"max_model_len": 131072, "needed_gib": 16.0,
                                                            "available_gib": 0.71, "estimated_max_model_len": 5632}),
    "cpu032-no-cache-memory.log": ("no_cache_memory", {}),
    # A clean stop (SIGTERM, as systemd stops the unit): vLLM's teardown prints EngineDeadError after it.
    "cpu032-sigterm-stop.log": ("none", {}),
    "v034-no-cache-memory-autofit.log": ("no_cache_memory", {}),
    "vllm-2248-no-cache-v0.log": ("no_cache_memory", {}),
    # Another process holds the GPU: with and without the device, and 0.34's external-weights wording.
    "v034-gpu-busy.log": ("gpu_busy_at_start", {"free_gib": 3.1, "total_gib": 79.18, "requested_gib": 71.26}),
    "v034-gpu-busy-external-weights.log": ("gpu_busy_at_start", {"requested_gib": 51.26}),
    "vllm-23192-gpu-busy.log": ("gpu_busy_at_start", {"free_gib": 7.34, "gpu_memory_utilization": 0.9}),
    "club-3090-4-gpu-busy.log": ("gpu_busy_at_start", {"free_gib": 22.76, "gpu_memory_utilization": 0.97}),
    # Out of memory before serving: weights (V0 names the step), CUDA graphs, cuBLAS and NCCL at start.
    "vllm-14092-load-model-oom.log": ("startup_oom", {"phase": "loading weights", "source": "torch",
                                                      "allocation": "20.00 MiB"}),
    "vllm-19186-graph-capture-cuda-error.log": ("startup_oom", {"phase": "CUDA graph capture", "source": "cuda"}),
    "vllm-8180-cublas-startup.log": ("startup_oom", {"phase": "start-up", "source": "cublas"}),
    "vllm-19865-nccl-startup.log": ("startup_oom", {"phase": "start-up", "source": "nccl"}),
    # Out of memory while serving, in every unit PyTorch prints; fragmentation only where the numbers say so.
    "torch-oom-512-bytes.log": ("runtime_oom", {"allocation": "512 bytes", "allocation_bytes": 512,
                                                "fragmentation": False, "engine_dead": True}),
    "torch-oom-kib.log": ("runtime_oom", {"allocation": "768.00 KiB", "fragmentation": False}),
    "club-3090-16-hint-not-fragmentation.log": ("runtime_oom", {"allocation": "50.00 MiB", "fragmentation": False,
                                                                "engine_dead": True, "phase": None}),
    "vllm-9290-oom-repr-v0.log": ("runtime_oom", {"allocation": "138.00 MiB", "fragmentation": False}),
    "kaito-976-fragmentation-v0.log": ("runtime_oom", {"allocation": "546.00 MiB", "fragmentation": True,
                                                       "engine_dead": False}),
    "vllm-backport-24-fragmentation.log": ("runtime_oom", {"allocation": "2.96 GiB", "fragmentation": True,
                                                           "engine_dead": True,
                                                           "reserved_unallocated_bytes": int(4.37 * 2**30)}),
    "vllm-18446-nccl-no-errno.log": ("runtime_oom", {"source": "nccl", "engine_dead": True}),
    # Failure 3: V1 (0.32 CPU build here, 0.34's process monitor, a GPU server) and V0.
    "cpu032-engine-dead.log": ("engine_dead", {"engine": "V1"}),
    "cpu032-enginecore-sigkill.log": ("engine_dead", {"engine": "V1"}),
    "v034-engine-core-died.log": ("engine_dead", {"engine": "V1"}),
    "vllm-32468-engine-core-proc-died.log": ("engine_dead", {"engine": "V1"}),
    "club-3090-58-engine-dead.log": ("engine_dead", {"engine": "V1"}),
    "vllm-ascend-488-async-engine-dead.log": ("engine_dead", {"engine": "V0"}),
    # Source lines quoting a message are not the message: only "failed to start" is left.
    "vllm-27508-source-lines.log": ("startup_failed", {}),
    # Client text (prompts, outputs, request bodies) and healthy lines.
    "prompts-with-failure-text.log": ("none", {}),
    "serving-start.log": ("none", {}),
    "cpu032-startup-eager.log": ("none", {}),
    "cpu032-startup-compiled.log": ("none", {}),
    "systemd-restart.log": ("none", {}),
}


def test_every_fixture_is_a_case_and_names_its_source():
    names = sorted(os.path.basename(path) for path in glob.glob(os.path.join(FIXTURES, "*.log")))
    assert names == sorted(CASES)
    for name in names:
        with open(os.path.join(FIXTURES, name), encoding="utf-8") as handle:
            assert handle.readline().startswith("# source: "), name


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_wording(name):
    kind, details = CASES[name]
    found = diagnose(name)
    assert found["kind"] == kind, found["summary"]
    assert {key: found["details"][key] for key in details} == details


def test_the_fleet_tests_refused_start_reads_as_vllm_printed_it():
    """molecule/fleet asserts these words in the roll's stop message (vllm_ready's msg carries the summary)."""
    found = diagnose("cpu032-kv-startup.log")
    assert "failure 1 (startup)" in found["summary"]
    assert "estimated maximum model length is 32640" in found["summary"]
    assert "at most 32640 tokens" in found["advice"]
    assert found["details"]["line"] == 1 and found["details"]["time"] == "12-03 18:36:29"


def test_without_the_estimate_no_length_is_claimed():
    found = diagnose("cpu032-kv-startup-no-estimate.log")
    assert "printed no estimate" in found["summary"] and "estimated maximum model length is" not in found["summary"]
    assert "{estimate}" not in found["advice"] and "more GPUs" in found["advice"]


def test_a_stale_startup_refusal_does_not_mask_a_later_engine_death():
    # A refused start, systemd starts it again, it serves, then the engine dies.
    found = diagnose("cpu032-kv-startup.log", "systemd-restart.log", "serving-start.log", "cpu032-engine-dead.log")
    assert found["kind"] == "engine_dead"
    assert [f["kind"] for f in found["failures"]] == ["startup_kv_cache", "engine_dead"]
    assert "Earlier in the window: startup_kv_cache (line 1)" in found["summary"]
    # A refused start ends its process: whatever dies afterwards is another process, markers or not.
    assert diagnose("cpu032-kv-startup.log", "cpu032-engine-dead.log")["kind"] == "engine_dead"


def test_an_old_engine_death_does_not_mask_todays_refused_start():
    found = diagnose("cpu032-engine-dead.log", "systemd-restart.log", "cpu032-kv-startup.log")
    assert found["kind"] == "startup_kv_cache"
    assert [f["kind"] for f in found["failures"]] == ["engine_dead", "startup_kv_cache"]
    assert diagnose("cpu032-engine-dead.log", "v034-gpu-busy.log")["kind"] == "gpu_busy_at_start"


def test_a_clean_stop_is_not_an_engine_death_and_a_death_still_is():
    stop = log("cpu032-sigterm-stop.log")
    # Without the stop's first line, the same EngineDeadError reads as a death: the stop is what tells them apart.
    assert "AsyncLLM output_handler failed." in stop
    assert vllm_diagnosis.diagnose(stop.replace("API server: shutdown triggered", ""))["kind"] == "engine_dead"
    # systemd's own line, which comes first in the journal (journalctl -u, what vllm_diagnose reads), says it too.
    lines = stop.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if "API server: shutdown triggered" in line)
    lines[first] = "Stopping vllm@main.service - vLLM inference server (instance main)...\n"
    assert vllm_diagnosis.diagnose("".join(lines))["kind"] == "none"
    # A death while serving, before a stop, is still a death; one after the restart that followed the stop too.
    found = diagnose("serving-start.log", "cpu032-engine-dead.log", "cpu032-sigterm-stop.log")
    assert found["kind"] == "engine_dead" and len(found["failures"]) == 1
    found = diagnose("cpu032-sigterm-stop.log", "systemd-restart.log", "serving-start.log", "cpu032-engine-dead.log")
    assert found["kind"] == "engine_dead" and len(found["failures"]) == 1


def test_one_failure_with_its_consequences_is_one_failure():
    # The worker's OOM, the EngineCore's re-raise and its death; the refusal and "failed to start".
    assert len(diagnose("torch-oom-512-bytes.log")["failures"]) == 1
    assert len(diagnose("v034-kv-startup-extensible.log")["failures"]) == 1
    # The API server's EngineDeadError comes before the EngineCore's traceback: still one failure.
    assert len(diagnose("club-3090-58-engine-dead.log")["failures"]) == 1


def test_text_a_client_sent_is_never_a_failure():
    # Prompts, request bodies, outputs and a tool parser's raw output quote every failure: nothing counts...
    assert diagnose("prompts-with-failure-text.log")["failures"] == []
    # ... and a real failure after them is found where it is.
    found = diagnose("prompts-with-failure-text.log", "vllm-backport-24-fragmentation.log")
    assert found["kind"] == "runtime_oom" and len(found["failures"]) == 1
    assert found["failures"][0]["text"].startswith("RuntimeError: Worker failed with error 'CUDA out of memory")


def test_fragmentation_needs_the_numbers_not_the_hint():
    """Every PyTorch OOM carries the expandable_segments hint; only a large reserved-unallocated amount counts."""
    hinted = [name for name, (kind, _) in CASES.items() if kind.endswith("_oom") and "expandable_segments:True"
              in log(name)]
    fragmented = [name for name in hinted if diagnose(name)["details"]["fragmentation"]]
    assert sorted(fragmented) == ["kaito-976-fragmentation-v0.log", "vllm-backport-24-fragmentation.log"]
    assert "fragmentation" in diagnose("kaito-976-fragmentation-v0.log")["summary"]
    assert "expandable_segments" in diagnose("kaito-976-fragmentation-v0.log")["advice"]
    assert "fragmentation" not in diagnose("club-3090-16-hint-not-fragmentation.log")["summary"]


def test_the_guides_runtime_example_is_not_fragmentation():
    """1.2 GiB reserved-unallocated cannot hold the 2 GiB asked for: a headroom problem, whatever the hint says."""
    text = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "23.99 GiB of which 1.10 GiB is free. Of the allocated memory 20.1 GiB is allocated by PyTorch, and "
            "1.2 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
    found = vllm_diagnosis.diagnose(text)
    assert found["kind"] == "runtime_oom" and not found["details"]["fragmentation"]
    assert "vllm_policy.runtime_ooms: true" in found["advice"]


def test_an_oom_while_starting_is_sizing_and_one_while_serving_is_headroom():
    # The same allocator line reads by where the run was: started but not serving, or serving.
    starting = diagnose("systemd-restart.log", "kaito-976-fragmentation-v0.log")
    serving = diagnose("systemd-restart.log", "serving-start.log", "kaito-976-fragmentation-v0.log")
    assert starting["kind"] == "startup_oom" and starting["details"]["phase"] == "start-up"
    assert serving["kind"] == "runtime_oom"
    assert "failure 1 (startup)" in starting["summary"] and "failure 2 (runtime)" in serving["summary"]
    assert starting["advice"] != serving["advice"]
    # The traceback names the step: weights, graphs.
    assert "tensor_parallel_size" in diagnose("vllm-14092-load-model-oom.log")["advice"]
    assert "enforce_eager" in diagnose("vllm-19186-graph-capture-cuda-error.log")["advice"]


def test_journal_lines_with_their_timestamps():
    """vllm_diagnose reads journalctl -o short-iso: the journal's prefix is not part of vLLM's line."""
    prefixed = "".join("2026-12-03T18:36:29+0000 gpu-1 python3[4242]: %s\n" % line
                       for line in log("cpu032-engine-dead.log", "cpu032-kv-startup.log").splitlines())
    found = vllm_diagnosis.diagnose(prefixed)
    assert found["kind"] == "startup_kv_cache" and found["details"]["time"] == "2026-12-03T18:36:29+0000"
    assert [f["kind"] for f in found["failures"]] == ["engine_dead", "startup_kv_cache"]


def test_clean_log_has_no_finding():
    found = vllm_diagnosis.diagnose("INFO:     Application startup complete.\n")
    assert found == {"kind": "none", "summary": "no known vLLM failure in the log.", "advice": "", "details": {},
                     "failures": []}


def variables():
    """The role's variables, and the sizing filter's documented policy and workload keys."""
    with open(os.path.join(ROOT, "roles", "vllm", "defaults", "main.yml"), encoding="utf-8") as handle:
        names = set(yaml.safe_load(handle))
    with open(os.path.join(ROOT, "roles", "rolling_restart", "defaults", "main.yml"), encoding="utf-8") as handle:
        names |= set(yaml.safe_load(handle))
    with open(os.path.join(ROOT, "filter_plugins", "vllm_sizing.yml"), encoding="utf-8") as handle:
        options = yaml.safe_load(handle)["DOCUMENTATION"]["options"]
    return names, set(options["policy"]["suboptions"]), set(options["workload"]["suboptions"])


def test_advice_names_only_real_variables():
    names, policy, workload = variables()
    advice = list(vllm_diagnosis.ADVICE.values()) + [diagnose(name)["advice"] for name in CASES]
    advice.append(load_module("vllm_diagnose").pressure_finding({"vllm:num_preemptions_total": 1.0})["advice"])
    checked = set()
    for text in advice:
        for prefix, key in re.findall(r"\b(vllm_policy|vllm_workload)\.(\w+)", text):
            assert key in (policy if prefix == "vllm_policy" else workload), "%s.%s" % (prefix, key)
            checked.add(prefix + "." + key)
        for name in re.findall(r"\b((?:vllm|rolling_restart)_\w+)", text):
            assert name in names, name
            checked.add(name)
    assert {"vllm_policy.runtime_ooms", "vllm_workload.p99_context", "vllm_gpu_release_timeout",
            "rolling_restart_apply_config"} <= checked
    assert not any("runtime_ooms_seen" in text for text in advice)


def test_diagnose_module_reports_findings_and_every_failure():
    diag = load_module("vllm_diagnose")
    assert "failures" in yaml.safe_load(diag.RETURN)
    for kind in ("startup_oom", "no_cache_memory", "startup_failed", "kv_cache_pressure"):
        assert kind in diag.DOCUMENTATION


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
