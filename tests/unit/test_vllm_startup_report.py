"""The vllm_startup_report filter on real startup logs: the published GPU corpus (tests/fixtures/startup-logs, whose
hand-read `parsed` numbers it must reproduce), the CPU build's own starts (tests/fixtures/vllm-logs), and each
wording of vLLM 0.11-0.34 rendered from its source format string."""
import glob
import json
import os

import pytest
from ansible.errors import AnsibleFilterError

from vllm_startup_report import vllm_startup_report

from ansible_collections.vllm_fleet.fleet.plugins.module_utils import vllm_log

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CORPUS = sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "startup-logs", "*.json")))
LOGS = os.path.join(ROOT, "tests", "fixtures", "vllm-logs")
GIB = 1 << 30

# The corpus's `parsed` keys (README there) and the report's.
KEYS = {
    "weights_gib": "model_loading_bytes", "weights_plus_non_torch_gib": "weights_plus_non_torch_bytes",
    "non_torch_gib": "non_torch_bytes", "activation_peak_gib": "activation_peak_bytes",
    "kv_available_gib": "available_kv_cache_bytes", "kv_tokens": "kv_cache_tokens",
    "max_concurrency": "max_concurrency", "max_concurrency_tokens_per_request": "max_concurrency_tokens_per_request",
    "cuda_graph_gib": "cuda_graph_bytes", "cuda_graph_estimated_gib": "cuda_graph_estimated_bytes",
    "requested_memory_gib": "requested_memory_bytes", "total_gpu_memory_gib": "total_memory_bytes",
    "free_gpu_memory_at_startup_gib": "free_memory_at_start_bytes", "error_needed_kv_gib": "needed_kv_bytes",
    "error_available_kv_gib": "available_kv_bytes", "error_estimated_max_model_len": "estimated_max_model_len",
    "error_max_seq_len": "max_model_len",
}
# Not read: the corpus never found that line ("max tokens in KV" is no vLLM wording).
UNREAD = {"error_max_tokens_in_kv"}

# Where the report differs from the hand-read value, and why. The corpus takes the first value printed; the report
# takes the one vLLM sizes its pool from (the rank with the least KV memory, the smallest block count).
PP_RANK = ("pipeline stages differ and vLLM sizes every stage's pool to the smallest (v1/core/kv_cache_utils.py, "
           "'Change the num_blocks of each rank to the smallest'); the stages without an 'Available KV cache memory' "
           "line print theirs in 'Current kv cache memory in use', which the hand reading did not count: {tokens} "
           "tokens x {per_token} KiB per token per stage = the smallest value")
DISAGREEMENTS = {
    ("llama-3.1-8b-h100-pp2-v0.19.0", "kv_available_gib"): (65.63, PP_RANK.format(tokens="1,075,312", per_token=64)),
    ("llama-3.1-8b-h100-pp2-v0.19.0", "activation_peak_gib"): (
        2.01, "the stage with the least KV memory (PP1, the last) has the largest activation peak"),
    ("llama-3.1-8b-h100-pp4-v0.19.0", "kv_available_gib"): (68.89, PP_RANK.format(tokens="2,257,264", per_token=32)),
    ("llama-3.1-8b-h100-pp4-v0.19.0", "activation_peak_gib"): (
        2.01, "the stage with the least KV memory (PP3, the last) has the largest activation peak"),
    ("qwen3-235b-a22b-fp8-l40s-tp8-ep-v0.10.2", "kv_tokens"): (
        237344, "0.10.2 prints every rank's block count before taking the smallest for all (min_num_blocks)"),
    ("qwen3-235b-a22b-fp8-l40s-tp8-ep-v0.10.2", "max_concurrency"): (7.24, "the same smallest rank's pool"),
}
# The per-stage KV values the hand reading did not list (same cause).
EXTRA_VALUES = {
    ("llama-3.1-8b-h100-pp2-v0.19.0", "kv_available_gib"): [65.63, 66.54],
    ("llama-3.1-8b-h100-pp4-v0.19.0", "kv_available_gib"): [68.89, 69.8, 70.83],
}


def as_printed(key, value):
    return round(value / GIB, 4) if "_bytes" in key else value


def close(key, got, want):
    """Sizes within the printed precision (vLLM rounds GiB to 2 decimals, 0.10's loading to 4)."""
    if "_bytes" in key:
        return abs(got / GIB - want) < 0.0051
    return got == want


def report_of(path):
    with open(path, encoding="utf-8") as handle:
        fixture = json.load(handle)
    return fixture, vllm_startup_report("\n".join(fixture["lines"]))


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: os.path.basename(p)[:-5])
def test_corpus_matches_the_hand_read_numbers(path):
    name = os.path.basename(path)[:-5]
    fixture, report = report_of(path)
    for key, want in fixture["parsed"].items():
        base = key[:-len("_values")] if key.endswith("_values") else key
        assert base in KEYS or base in UNREAD, "unknown corpus key %s" % key
        if base in UNREAD:
            assert want is None
            continue
        mine = KEYS[base] + ("_values" if key.endswith("_values") else "")
        if (name, key) in DISAGREEMENTS:
            want = DISAGREEMENTS[name, key][0]
        if want is None:
            assert mine not in report, "%s: %s printed nowhere, yet reported" % (name, mine)
        elif isinstance(want, list):
            assert len(report[mine]) == len(want) and all(close(mine, g, w) for g, w in zip(report[mine], want)), \
                (name, key, [as_printed(mine, v) for v in report[mine]], want)
        else:
            assert close(mine, report[mine], want), (name, key, as_printed(mine, report[mine]), want)
    listed = {KEYS[k[:-len("_values")]] for k in fixture["parsed"] if k.endswith("_values")}
    for (other, key), values in EXTRA_VALUES.items():
        if other == name:
            listed.add(KEYS[key])
            got = report[KEYS[key] + "_values"]
            assert [as_printed(KEYS[key], v) for v in got] == pytest.approx(values, abs=0.0051)
    assert {k for k in report if k.endswith("_values")} == {k + "_values" for k in listed}
    printed = fixture["vllm_version"]
    if any(printed and printed in line for line in fixture["lines"]):
        assert report["vllm_version"] == printed


def test_corpus_counts():
    """Every log of the corpus gives a report; what the README says it holds is read."""
    reports = [report_of(path)[1] for path in CORPUS]
    assert len(reports) == 50
    assert sum("available_kv_cache_bytes" in r for r in reports) == 48
    assert sum("needed_kv_bytes" in r for r in reports) == 2


def test_pipeline_stages_report_the_stage_that_sizes_the_pool():
    _fixture, report = report_of(os.path.join(ROOT, "tests", "fixtures", "startup-logs",
                                              "llama-3.1-8b-h100-pp4-v0.19.0.json"))
    # PP3 has the least KV memory; its pool of 2,257,264 tokens at 32 KiB per token is 68.89 GiB.
    assert report["kv_cache_tokens"] * 32 * 1024 == pytest.approx(report["available_kv_cache_bytes"], rel=2e-4)
    assert as_printed("x_bytes", report["model_loading_bytes"]) == pytest.approx(4.26, abs=0.005)
    assert as_printed("x_bytes", report["activation_peak_bytes"]) == pytest.approx(2.01, abs=0.005)


def cpu_log(name):
    with open(os.path.join(LOGS, name), encoding="utf-8") as handle:
        return "".join(line for line in handle if not line.startswith("# "))


def test_cpu_build_start_as_the_test_fleet_runs_it():
    assert vllm_startup_report(cpu_log("cpu032-startup-eager.log")) == {
        "vllm_version": "0.32.0", "available_kv_cache_bytes": GIB, "total_memory_bytes": int(23.54 * GIB),
        "kv_cache_device": "CPU", "kv_cache_tokens": 1048576, "max_concurrency": 256.0,
        "max_concurrency_tokens_per_request": 4096, "weights_loading_seconds": 0.01, "engine_init_seconds": 0.68}


def test_cpu_build_start_with_torch_compile():
    report = vllm_startup_report(cpu_log("cpu032-startup-compiled.log"))
    assert report["compiled_from_cache"] is False  # "[backbone] saved AOT compiled function to ..."
    assert report["profiling_run_seconds"] == 0.37
    assert report["engine_init_seconds"] == 39.25


def test_cpu_build_refused_start():
    assert vllm_startup_report(cpu_log("cpu032-kv-startup.log")) == {
        "max_model_len": 65536, "needed_kv_bytes": 2 * GIB, "available_kv_bytes": GIB,
        "estimated_max_model_len": 32640}
    refused = vllm_startup_report(cpu_log("cpu032-kv-startup-no-estimate.log"))
    assert refused["max_model_len"] == 131072 and "estimated_max_model_len" not in refused


# (release, where, format string, arguments, what the report holds): the wordings the corpus lacks, rendered from
# vLLM's own format strings (paths under vllm/ of each wheel).
WORDINGS = [
    ("0.11.0", "v1/worker/gpu_model_runner.py:2653", "Model loading took %.4f GiB and %.6f seconds", (14.2488, 4.42),
     {"model_loading_bytes": 14.2488, "model_loading_seconds": 4.42}),
    ("0.14.0", "v1/worker/gpu/model_runner.py:188", "Model loading took %s GiB and %.6f seconds", ("7.5", 3.0),
     {"model_loading_bytes": 7.5, "model_loading_seconds": 3.0}),
    ("0.34.0", "v1/worker/gpu/model_runner.py:442", "Model loading took %s GiB memory and %.6f seconds", ("15.27", 5.5),
     {"model_loading_bytes": 15.27, "model_loading_seconds": 5.5}),
    ("0.11.0", "v1/worker/gpu_worker.py:298", "Available KV cache memory: %.2f GiB", (5.01,),
     {"available_kv_cache_bytes": 5.01}),
    ("0.11.0", "v1/engine/core.py:210", "init engine (profile, create kv cache, warmup model) took %.2f seconds",
     (89.58,), {"engine_init_seconds": 89.58}),
    ("0.25.0", "v1/engine/core.py:338", "init engine (profile, create kv cache, warmup model) took %.2f s "
     "(compilation: %.2f s)", (41.2, 30.1), {"engine_init_seconds": 41.2}),
    ("0.32.0", "v1/engine/core.py:386", "init engine (profile, create kv cache, warmup model) took %.2f s "
     "(compilation: %.2f s \u2014 language_model: %.2f s, encoder: %.2f s)", (50.0, 30.0, 20.0, 10.0),
     {"engine_init_seconds": 50.0}),
    ("0.11.0", "compilation/monitor.py:34", "torch.compile takes %.2f s in total", (25.3,),
     {"torch_compile_seconds": 25.3}),
    ("0.19.0", "compilation/monitor.py:20", "torch.compile took %.2f s in total", (12.5,),
     {"torch_compile_seconds": 12.5}),
    ("0.34.0", "compilation/monitor.py:20", "%storch.compile took %.2f s in total", ("[language_model] ", 20.0),
     {"torch_compile_seconds": 20.0}),
    ("0.34.0", "compilation/monitor.py:92", "%sInitial profiling/warmup run took %.2f s", ("[backbone] ", 0.37),
     {"profiling_run_seconds": 0.37}),
    ("0.11.0", "compilation/backends.py:169", "Directly load the compiled graph(s) for shape %s from the cache, took "
     "%.3f s", ("None", 1.5), {"compiled_from_cache": True}),
    ("0.34.0", "compilation/backends.py:422", "%sCompiling a graph for compile range %s takes %.2f s",
     ("", "(1, 8192)", 20.0), {"compiled_from_cache": False}),
    ("0.34.0", "compilation/decorators.py:327", "%sDirectly load AOT compilation from path %s", ("", "/c"),
     {"compiled_from_cache": True}),
    ("0.25.0", "v1/core/kv_cache_utils.py:2146", "GPU KV cache size: %s tokens", ("93,872",),
     {"kv_cache_device": "GPU", "kv_cache_tokens": 93872}),
    ("0.29.0", "v1/core/kv_cache_utils.py:2033", "GPU KV cache size: %s tokens, Maximum concurrency for %s tokens "
     "per request: %.2fx", ("418,688", "8,192", 51.11),
     {"kv_cache_device": "GPU", "kv_cache_tokens": 418688, "max_concurrency_tokens_per_request": 8192,
      "max_concurrency": 51.11}),
    ("0.34.0", "v1/core/kv_cache_utils.py:1169", "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per "
     "request: %.2fx", ("GPU + host", "418,688", "8,192", 51.11),
     {"kv_cache_device": "GPU + host", "kv_cache_tokens": 418688, "max_concurrency_tokens_per_request": 8192,
      "max_concurrency": 51.11}),
    ("0.34.0", "v1/worker/extensible_kv_cache.py:537", "Extended KV cache to %d blocks (%.2f GiB).", (3600, 56.25),
     {"available_kv_cache_bytes": 56.25}),
    ("0.34.0", "v1/worker/extensible_kv_cache.py:694", "Memory after warmup: %s GiB free, %s GiB committed to the KV "
     "cache, %s GiB kept for transient activations (%s GiB allocated at peak, %s GiB of torch reservation growth); "
     "%d KV cache blocks (%s GiB) fit within the requested %s GiB. Torch may reserve up to %s GiB.",
     ("60.1", "0.5", "2.2", "2.2", "1.0", 3600, "56.25", "79.19", "62.0"), {"requested_memory_bytes": 79.19}),
    ("0.19.0", "v1/worker/gpu_worker.py:425", "Initial free memory: %s GiB; Requested memory: %f (util), %s GiB",
     ("78.68", 0.95, "75.23"), {"gpu_memory_utilization": 0.95, "requested_memory_bytes": 75.23}),
    ("0.34.0", "v1/worker/gpu_worker.py:1154", "Free memory on device (%s/%s GiB) on startup. Desired GPU memory "
     "utilization is (%s, %s GiB). Actual usage is %s GiB for consumed memory (weights + non-torch), %s GiB for peak "
     "activation, and %s GiB for CUDAGraph memory. Replace gpu_memory_utilization config with "
     "`--kv-cache-memory=%d` (%s GiB) to fit into requested memory, or `--kv-cache-memory=%d` (%s GiB) to fully "
     "utilize gpu memory. Current kv cache memory in use is %s GiB.",
     ("78.68", "79.19", 0.92, "72.85", "16.2", "3.1", "0.9", 56371445760, "52.5", 62599819264, "58.3", "52.65"),
     {"free_memory_at_start_bytes": 78.68, "total_memory_bytes": 79.19, "gpu_memory_utilization": 0.92,
      "requested_memory_bytes": 72.85, "weights_plus_non_torch_bytes": 16.2, "activation_peak_bytes": 3.1,
      "cuda_graph_bytes": 0.9, "available_kv_cache_bytes": 52.65, "kv_cache_memory_suggested_bytes": 56371445760}),
    # VLLM_ENABLE_STARTUP_PLAN: a later start applies the stored value (exact bytes) and reserves it without a
    # profile; the same line follows --kv-cache-memory-bytes. 0.11.0 printed "%.2fGiB" without a space.
    ("0.26.0", "v1/worker/startup_plan.py:153", "Applying persisted startup plan (fingerprint %s): "
     "kv_cache_memory_bytes=%d (%.2f GiB), recorded free-memory baseline %.2f GiB, current %.2f GiB. Memory profiling "
     "will be skipped.", ("3f2a9c0d1e4b5a67", 56371445760, 52.5, 78.68, 78.7),
     {"startup_plan_kv_cache_bytes": 56371445760}),
    ("0.32.0", "v1/worker/startup_plan.py:189", "Saved startup plan to %s",
     ("/var/lib/vllm/cache/main/startup_plan/startup_plan_3f2a9c0d1e4b5a67.json",),
     {"startup_plan_saved": "/var/lib/vllm/cache/main/startup_plan/startup_plan_3f2a9c0d1e4b5a67.json"}),
    ("0.32.0", "v1/worker/gpu_worker.py:669", "Initial free memory %s GiB, reserved %s GiB memory for KV Cache as "
     "specified by kv_cache_memory_bytes config and skipped memory profiling. This does not respect the "
     "gpu_memory_utilization config. Only use kv_cache_memory_bytes config when you want manual control of KV cache "
     "memory size. If OOM'ed, check the difference of initial free memory between the current run and the previous "
     "run where kv_cache_memory_bytes is suggested and update it correspondingly.", ("78.7", "52.5"),
     {"free_memory_at_start_bytes": 78.7, "available_kv_cache_bytes": 52.5}),
    ("0.11.0", "v1/worker/gpu_worker.py:251", "Initial free memory %s GiB, reserved %.2fGiB memory for KV Cache as "
     "specified by kv_cache_memory_bytes config and skipped memory profiling. This does does not respect the "
     "gpu_memory_utilization config.", (78.6875, 10.0),
     {"free_memory_at_start_bytes": 78.6875, "available_kv_cache_bytes": 10.0}),
    ("0.32.0", "utils/mem_utils.py:218", "Memory profiling takes %.2f seconds. Total non KV cache memory: %sGiB; "
     "torch peak memory increase: %sGiB; total consumed (from mem_get_info): %sGiB; weights memory: %sGiB.",
     (21.74, "19.3", "2.87", "16.4", "15.27"),
     {"memory_profiling_seconds": 21.74, "activation_peak_bytes": 2.87, "weights_plus_non_torch_bytes": 16.4,
      "model_loading_bytes": 15.27}),
    ("0.32.0", "v1/worker/cpu_worker.py:252", "Auto set (%s/%s) GiB for KV cache on node %s, with %s GiB requested "
     "memory for the worker. %s GiB memory was consumed by non-kv usages.", ("18.7", "23.54", 0, "21.19", "2.49"),
     {"available_kv_cache_bytes": 18.7, "total_memory_bytes": 23.54, "requested_memory_bytes": 21.19}),
    ("0.27.1", "v1/worker/gpu_worker.py:578", "CUDA graph memory profiling is enabled (default since v0.21.0). The "
     "current --gpu-memory-utilization=%.4f is equivalent to --gpu-memory-utilization=%.4f without CUDA graph memory "
     "profiling. To maintain the same effective KV cache size as before, increase --gpu-memory-utilization to %.4f. "
     "To disable, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.", (0.9, 0.8947, 0.9053),
     {"gpu_memory_utilization": 0.9, "cuda_graph_equivalent_utilization": 0.8947}),
    ("0.14.0", "entrypoints/openai/api_server.py:1272", "vLLM API server version %s", ("0.14.0",),
     {"vllm_version": "0.14.0"}),
    ("0.34.0", "entrypoints/common/startup.py:18", "vLLM server version %s, serving model %s", ("0.34.0", "m"),
     {"vllm_version": "0.34.0"}),
    ("0.34.0", "v1/core/kv_cache_planning.py:125", "ValueError: To serve at least one request with the model's max "
     "seq len (%d), (%s GiB KV cache is needed, which is larger than the available KV cache memory (%s GiB). Based on "
     "the available memory, the estimated maximum model length is %d. Decreasing `max_model_len` also reduces what "
     "is needed.", (40960, "9.0", "5.21", 21392),
     {"max_model_len": 40960, "needed_kv_bytes": 9.0, "available_kv_bytes": 5.21, "estimated_max_model_len": 21392}),
]


def expected(values):
    return {key: int(value * GIB) if key.endswith("_bytes") and isinstance(value, float) else value
            for key, value in values.items()}


@pytest.mark.parametrize("release, where, fmt, args, values", WORDINGS, ids=lambda w: w if isinstance(w, str) else "")
def test_each_wording_from_source(release, where, fmt, args, values):
    line = "(Worker_TP0 pid=444) INFO 12-03 10:00:00 [%s] %s" % (where.split("/")[-1], fmt % args)
    assert vllm_startup_report(line) == expected(values), (release, where)


BASE = "INFO 04-22 01:36:26 [v1/worker/gpu_worker.py:436] Available KV cache memory: 63.76 GiB"
KV = {"available_kv_cache_bytes": int(63.76 * GIB)}


@pytest.mark.parametrize("line", [
    BASE,
    "(EngineCore_DP0 pid=123) " + BASE,
    "2026-12-03T10:00:00+0000 gpu1 vllm[123]: (EngineCore_DP0 pid=123) " + BASE,
    "Dec 03 10:00:00 gpu1 vllm[123]: (Worker_TP0 pid=444) " + BASE,
    "vllm[123]: " + BASE,
    "\x1b[32mINFO\x1b[0m 04-22 01:36:26 [gpu_worker.py:436] Available KV cache memory: 63.76 GiB",
    "Capturing CUDA graphs:  99%|#####| 66/67 [00:03<00:00, 20.10it/s](VllmWorker TP1 pid=1431) " + BASE,
    "Loading: 50%\r(Worker pid=9) " + BASE,
    "(EngineCore_0 pid=1159) (RayWorkerWrapper pid=345, ip=10.42.11.243) " + BASE + " [repeated 3x across cluster]",
    "(EngineCore_0 pid=1257) (RayWorkerWrapper pid=374, ip=10.254.6.219) " + BASE[:-12] + "\n" + BASE[-12:],
], ids=["bare", "process", "short-iso", "short", "syslog-ident", "ansi", "glued-progress-bar", "carriage-return",
        "ray-repeated", "hard-wrapped"])
def test_prefixes_colours_and_wrapping(line):
    assert vllm_startup_report(line) == KV


def test_colourised_banner():
    banner = ("(APIServer pid=1) INFO 04-22 01:35:30 [utils.py:299]  \x1b[33m\u2584\u2584\x1b[0m \x1b[34m\u2584\u2588"
              "\x1b[0m \x1b[37m\u2588     \u2588     \u2588 \u2580\u2584\u2580 \u2588\x1b[0m  version "
              "\x1b[37m0.19.0\x1b[0m")
    assert vllm_startup_report(banner) == {"vllm_version": "0.19.0"}


def test_only_the_latest_start_counts():
    first = "vLLM API server version 0.32.0\n(EngineCore pid=1) " + BASE.replace("63.76", "10.0")
    second = ("Starting vllm@main.service - vLLM inference server (instance main)...\n"
              "(APIServer pid=2) INFO 12-03 10:00:00 [api_utils.py:347]  \u2584\u2584 \u2584\u2588 \u2588     "
              "\u2588     \u2588 \u2580\u2584\u2580 \u2588  version 0.34.0\n(EngineCore pid=3) " + BASE)
    assert vllm_startup_report(first + "\n" + cpu_log("systemd-restart.log") + second) == dict(
        KV, vllm_version="0.34.0")


def test_text_that_is_not_a_startup_line_gives_nothing():
    assert vllm_startup_report("") == {}
    # A prompt quoting vLLM's words is not vLLM's line (the message must start with them).
    line = "INFO 12-03 10:00:00 [logger.py:39] Received request cmpl-1: prompt: 'Available KV cache memory: 1.0 GiB'"
    assert vllm_startup_report(line) == {}


def test_lines_as_a_list():
    assert vllm_startup_report(["(EngineCore pid=1) " + BASE, "INFO:     Application startup complete."]) == KV


@pytest.mark.parametrize("bad", [None, 42, {"stdout": BASE}, [BASE, 1]], ids=["none", "int", "dict", "mixed-list"])
def test_not_a_log_is_an_error_naming_what_to_pass(bad):
    with pytest.raises(AnsibleFilterError, match="takes vLLM's log as a string or a list of lines"):
        vllm_startup_report(bad)


def corpus_log(name):
    with open(os.path.join(ROOT, "tests", "fixtures", "startup-logs", name + ".json")) as handle:
        return "\n".join(json.load(handle)["lines"])


def test_a_gpu_start_splits_into_weights_engine_init_within_it_and_the_rest():
    """llm-d-planner's published H100 start (0.19.0): 14.43 s of weights, 21.45 s of engine init with an 18 s profile
    and 3 s of CUDA graphs in it; with systemd's start-to-ready the rest is what Python and the API server took."""
    phases = vllm_log.start_phases(vllm_startup_report(corpus_log("llama-3.1-8b-h100-tp1-v0.19.0")), 60.0, 0.31)
    assert phases == {"weights_s": 14.43, "engine_init_s": 21.45, "profile_s": 17.96, "compile_s": None,
                      "graphs_s": 3.0, "other_s": 24.12, "first_completion_s": 0.31}


def test_a_cpu_build_start_is_mostly_imports_and_processes():
    """The CPU build's eager start (tests/fixtures/vllm-logs): 0.01 s of weights and 0.68 s of engine init out of a
    start of about 32 s; no start-to-ready known, no rest; nothing printed, nothing made up."""
    phases = vllm_log.start_phases(vllm_startup_report(cpu_log("cpu032-startup-eager.log")), 31.9, 0.05)
    assert phases["weights_s"] == 0.01 and phases["engine_init_s"] == 0.68 and phases["other_s"] == 31.21
    assert phases["compile_s"] is None and phases["graphs_s"] is None and phases["profile_s"] is None
    assert vllm_log.start_phases({})["other_s"] is None
