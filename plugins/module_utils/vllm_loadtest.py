# -*- coding: utf-8 -*-
"""A load test of one vLLM instance against its plan: what to run, what the run measured, and the verdict.

Pure functions over data, shared by the vllm_loadtest module and the unit tests:
- bench_command: vLLM's own benchmark client (vllm.benchmarks.serve, the code behind `vllm bench serve`). The CPU
  build's `vllm` console script fails (it looks up package metadata named `vllm`), so the client runs through its
  add_cli_args / main functions, which are the same client.
- stage_summary: one concurrency level, from the client's result JSON and the /metrics samples taken meanwhile.
- verdict: each limit of the plan held or broke; a broken one says what broke and which variable to change.
"""
from __future__ import annotations

# Runs under the instance's own venv python: `python -c BENCH_CLIENT --backend vllm ...`.
BENCH_CLIENT = (
    "import argparse, sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "parser = argparse.ArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)

# The client's result JSON keys kept in a stage (milliseconds), from its --percentile-metrics/--metric-percentiles.
LATENCY_KEYS = ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "median_tpot_ms", "p99_tpot_ms",
                "median_e2el_ms", "p99_e2el_ms")


def bench_command(python, port, model, served_model_name, concurrency, requests, input_len, output_len, result_dir,
                  result_file, seed=0):
    """argv of one stage: random prompts of input_len tokens, output_len tokens each, at most `concurrency` in
    flight, to the instance on the host's loopback only. The API key travels in OPENAI_API_KEY (not in argv).
    model (what the server loaded: its tokenizer) and served_model_name are given: without them the client asks
    /v1/models, without the API key."""
    return [python, "-c", BENCH_CLIENT, "--backend", "vllm", "--base-url", "http://127.0.0.1:%d" % port,
            "--model", model, "--served-model-name", served_model_name,
            "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--num-prompts", str(requests), "--max-concurrency", str(concurrency), "--seed", str(seed),
            "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--num-warmups", "0", "--disable-tqdm", "--save-result", "--result-dir", result_dir,
            "--result-filename", result_file]


def stage_summary(concurrency, result, samples, timed_out=False):
    """One stage: the client's counts and latency percentiles, and the peaks of the /metrics samples.

    result: the client's result JSON (None when it produced none). samples: [{"t", "kv", "running", "waiting",
    "preemptions"}] read from /metrics during the stage, the first one before the stage's first request.
    """
    result = result or {}
    sent = int(result.get("num_prompts") or 0)
    completed = int(result.get("completed") or 0)
    failed = int(result.get("failed") or (sent - completed if result else 0))
    preempt = [s["preemptions"] for s in samples if s.get("preemptions") is not None]
    # Requests vLLM kept waiting, seen in two samples in a row (one sample also catches a request that waits for
    # the next scheduler step).
    waiting = [s.get("waiting") or 0 for s in samples]
    summary = {
        "concurrency": concurrency,
        "requests": sent,
        "completed": completed,
        "failed": failed,
        "timed_out": timed_out,
        "duration_s": result.get("duration"),
        "output_throughput": result.get("output_throughput"),
        "peak_kv_cache_usage": max((s["kv"] for s in samples if s.get("kv") is not None), default=None),
        "peak_running": max((s["running"] for s in samples if s.get("running") is not None), default=None),
        "peak_waiting": max((s["waiting"] for s in samples if s.get("waiting") is not None), default=None),
        "sustained_waiting": max((min(a, b) for a, b in zip(waiting, waiting[1:])), default=0),
        "preemptions": (preempt[-1] - preempt[0]) if len(preempt) > 1 else 0,
        "samples": len(samples),
    }
    summary.update({key: result.get(key) for key in LATENCY_KEYS})
    return summary


def kv_capacity(num_blocks, block_size, context, blocks_per_request=None):
    """Requests of `context` tokens the KV cache holds at once: vLLM's own block count (vllm:cache_config_info)
    less the null block it reserves, in whole requests. None when the server did not say.

    blocks_per_request: the plan's kv_blocks_per_request ({context, blocks}: the sizing's count of the pool's blocks
    one request takes, summed over its layer groups), used when it is of this context; else one block per block_size
    tokens, right for one group of full attention only (gpt-oss-20b at 8192 tokens takes 257 blocks of 64, not
    128: counted that way the load test saw twice the room its cache has)."""
    if not num_blocks or not block_size or not context:
        return None
    per_request = -(-context // block_size)
    if blocks_per_request and blocks_per_request.get("context") == context and blocks_per_request.get("blocks"):
        per_request = blocks_per_request["blocks"]
    return max(0, num_blocks - 1) // per_request


def _kv_bound(stage, max_num_seqs, capacity):
    """The KV cache did not hold the stage's sequences: vLLM preempted some, or kept requests waiting while it ran
    fewer than the stage's concurrency. Without vLLM's block count, waiting must be seen in two samples in a row (one
    can be a long prompt waiting for the next step's token budget); with it, a cache too small for the stage and one
    sample of waiting suffice (a short stage can end between two samples: a fleet run here saw 3 waiting once, 5
    running, 4 fit, in a stage of 0.5 s)."""
    if max_num_seqs and stage["concurrency"] > max_num_seqs:
        return False  # beyond the plan's own limit vLLM queues by design
    if stage["preemptions"]:
        return True
    if (stage["peak_running"] or 0) >= stage["concurrency"]:
        return False
    if capacity is None:
        return bool(stage["sustained_waiting"])
    return capacity < stage["concurrency"] and bool(stage["peak_waiting"])


def _stage_text(stage):
    return "at concurrency %d" % stage["concurrency"]


def verdict(stages, oom_failures, plan_args, p99_context, peak_concurrency, bounds, capacity=None):
    """Whether the instance held its plan, and for each limit that broke what to change.

    stages: stage_summary dicts, lowest concurrency first. oom_failures: the triage classifier's failures of the
    journal during the test (kinds). plan_args: the plan's engine_args. bounds: {"ttft_p99_ms", "itl_p99_ms",
    "max_kv_cache_usage"} (0 or None: no bound). capacity: kv_capacity at p99_context from the server's metrics.
    Returns {"passed", "held_concurrency", "broken": [{"limit", "stage", "measured", "bound", "message", "fix"}]}.
    A broken limit named "max_num_seqs" carries "suggest_max_num_seqs", "runtime_oom" asks for
    vllm_policy.runtime_ooms: the caller re-plans with the sizing filter to show the plan change.
    """
    broken = []
    max_num_seqs = plan_args.get("max_num_seqs")
    # The most sequences served together at p99 context with nothing preempted, queued behind the KV cache or failed.
    held = 0
    for stage in stages:
        clean = stage["failed"] == 0 and not stage["timed_out"] and not _kv_bound(stage, max_num_seqs, capacity)
        if clean:
            held = max(held, min(stage["concurrency"], max_num_seqs or stage["concurrency"]))
        else:
            break
    for stage in stages:
        if stage["failed"] or stage["timed_out"]:
            broken.append({
                "limit": "errors", "stage": stage["concurrency"], "measured": stage["failed"], "bound": 0,
                "message": "%d of %d requests failed%s %s" % (
                    stage["failed"], stage["requests"], " and the stage ran out of time" if stage["timed_out"]
                    else "", _stage_text(stage)),
                "fix": "Run playbooks/diagnose.yml on the host: it names the failure and the change that fixes it."})
            break
    if oom_failures:
        broken.append({
            "limit": "runtime_oom", "stage": None, "measured": len(oom_failures), "bound": 0,
            "message": "the journal shows %s during the test" % ", ".join(sorted(set(oom_failures))),
            "fix": "Set vllm_policy.runtime_ooms: true (utilization at most 0.85, no CUDA graphs) and apply it "
                   "with playbooks/rolling_restart.yml -e rolling_restart_apply_config=true."})
    for stage in stages:
        if _kv_bound(stage, max_num_seqs, capacity):
            what = []
            if stage["preemptions"]:
                what.append("%d preemptions" % stage["preemptions"])
            if stage["peak_waiting"]:
                what.append("vLLM ran at most %d and kept %d waiting" % (
                    stage["peak_running"] or 0, stage["sustained_waiting"] or stage["peak_waiting"]))
            broken.append({
                "limit": "max_num_seqs", "stage": stage["concurrency"], "measured": held,
                "bound": max_num_seqs, "suggest_max_num_seqs": max(held, 1),
                "message": "the KV cache did not hold %d sequences at p99 context %d (max_num_seqs %s): %s %s; "
                           "KV cache up to %.0f%% used; it held %d%s" % (
                               stage["concurrency"], p99_context, max_num_seqs, " and ".join(what),
                               _stage_text(stage), 100 * (stage["peak_kv_cache_usage"] or 0), held,
                               "" if capacity is None else " (vLLM's cache: %d at that context)" % capacity),
                "fix": "Plan for what the KV cache holds: vllm_workload.peak_concurrency %d (max_num_seqs %d), or "
                       "keep the peak with more KV cache: vllm_policy.allow_fp8_kv_cache, more GPUs for the "
                       "instance, or a shorter vllm_workload.p99_context." % (max(held, 1), max(held, 1))})
            break
    peak_stage = next((s for s in stages if s["concurrency"] >= (peak_concurrency or 0)),
                      stages[-1] if stages else None)
    checks = (("ttft_p99_ms", "p99_ttft_ms", "time to first token"),
              ("itl_p99_ms", "p99_itl_ms", "inter-token latency"))
    for bound_key, key, name in checks:
        bound = bounds.get(bound_key)
        if peak_stage and bound and peak_stage.get(key) is not None and peak_stage[key] > bound:
            broken.append({
                "limit": bound_key, "stage": peak_stage["concurrency"], "measured": round(peak_stage[key], 1),
                "bound": bound,
                "message": "p99 %s %.0f ms above %.0f ms %s" % (name, peak_stage[key], bound,
                                                                _stage_text(peak_stage)),
                "fix": "Serve the peak with fewer sequences per instance (more instances or GPUs, or a lower "
                       "vllm_workload.peak_concurrency per host), a smaller vllm_policy.max_num_batched_tokens "
                       "(shorter prefill stalls), or raise vllm_loadtest_%s if the bound is too tight." % bound_key})
    limit = bounds.get("max_kv_cache_usage")
    if peak_stage and limit and (peak_stage["peak_kv_cache_usage"] or 0) > limit:
        broken.append({
            "limit": "max_kv_cache_usage", "stage": peak_stage["concurrency"],
            "measured": peak_stage["peak_kv_cache_usage"], "bound": limit,
            "message": "KV cache %.0f%% used at the workload's peak, above %.0f%%" % (
                100 * peak_stage["peak_kv_cache_usage"], 100 * limit),
            "fix": "Leave headroom for longer requests: vllm_policy.allow_fp8_kv_cache, more GPUs for the instance, "
                   "or a lower vllm_workload.peak_concurrency."})
    return {"passed": not broken, "held_concurrency": held, "broken": broken}
