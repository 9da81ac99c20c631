#!/usr/bin/env python3
"""How far the sizing budget's KV memory per GPU is from what vLLM printed on real GPUs (figures, not asserts).

    .venv/bin/python benchmarks/bench_budget.py

Reads the published startups of tests/fixtures/startup-logs/ ("Available KV cache memory: X GiB"), sizes the same
model, GPU, parallelism, utilization, batch and eager settings with vllm_sizing, and prints per log the predicted
and printed KV memory and the error (positive: the plan expects more than vLLM had, the dangerous side), then the
median, the worst and the counts over and under. Logs whose model is not in the vllm_model catalog, or that lack
the printed KV memory, are listed as skipped.
"""
import glob
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "filter_plugins"))
import vllm_sizing as vs  # noqa: E402

LOGS = os.path.join(ROOT, "tests", "fixtures", "startup-logs")
# Checkpoints with the same shapes as a catalog entry.
ALIASES = {"Qwen/Qwen2.5-7B-Instruct": "Qwen/Qwen2.5-7B"}
# nvidia-smi totals (vllm-facts.md section 2) for logs that do not print vLLM's total.
GPUS = {"A100 80GB": ("NVIDIA A100-SXM4-80GB", 81920, "8.0"), "A100 40GB": ("NVIDIA A100-SXM4-40GB", 40960, "8.0"),
        "A100": ("NVIDIA A100-SXM4-80GB", 81920, "8.0"), "H100": ("NVIDIA H100 80GB HBM3", 81559, "9.0"),
        "H200": ("NVIDIA H200", 143771, "9.0"), "L40S": ("NVIDIA L40S", 46068, "8.9")}


def gpu_of(log):
    for key, spec in GPUS.items():
        if key in (log.get("gpu") or ""):
            return spec
    return None


def predict(log):
    """(predicted KV bytes per GPU, why not) for one log."""
    model = ALIASES.get(log["model"], log["model"])
    if model not in vs._catalog():
        return None, "model not in the catalog"
    printed = log["parsed"].get("kv_available_gib")
    spec = gpu_of(log)
    if printed is None or spec is None or log.get("gpu_memory_utilization") is None:
        return None, "no printed KV memory, GPU or utilization"
    name, total_mib, capability = spec
    tp, pp = log.get("tensor_parallel_size") or 1, log.get("pipeline_parallel_size") or 1
    gpus = [{"index": i, "name": name, "memory_total_mib": total_mib, "compute_capability": capability}
            for i in range(tp * pp)]
    policy = {"gpu_memory_utilization": log["gpu_memory_utilization"], "tensor_parallel_size": tp,
              "pipeline_parallel_size": pp, "allow_tensor_parallel": False, "strict": False,
              "enforce_eager": bool(log.get("enforce_eager")), "vllm_version": "0.32.0", "allow_fp8_kv_cache": False}
    if log["parsed"].get("total_gpu_memory_gib"):
        policy["usable_memory_mib"] = int(log["parsed"]["total_gpu_memory_gib"] * 1024)
    for key in ("max_num_batched_tokens", "max_num_seqs"):
        if log.get(key):
            policy[key] = log[key]
    if log.get("dtype") == "float32":
        policy["serve_options"] = {"dtype": "float32"}
    workload = {"max_context": log["max_model_len"]} if log.get("max_model_len") else {}
    plan = vs.vllm_sizing(gpus, vs.vllm_model(model), workload, policy)
    return plan["budget_per_gpu"]["kv_cache_bytes"], None


def main():
    rows, skipped = [], []
    for path in sorted(glob.glob(os.path.join(LOGS, "*.json"))):
        with open(path) as handle:
            log = json.load(handle)
        ident = os.path.basename(path)[:-5]
        predicted, why = predict(log)
        if predicted is None:
            skipped.append((ident, why))
            continue
        printed = log["parsed"]["kv_available_gib"] * vs.GiB
        rows.append((ident, predicted / vs.GiB, printed / vs.GiB, (predicted - printed) / printed * 100))
    print("%-58s %10s %10s %8s" % ("log", "predicted", "printed", "error"))
    for ident, predicted, printed, error in rows:
        print("%-58s %8.2f G %8.2f G %+7.1f%%" % (ident[:58], predicted, printed, error))
    errors = [row[3] for row in rows]
    if errors:
        print("\n%d logs: median error %+.1f%%, worst over %+.1f%%, worst under %+.1f%%; %d over by more than 3%%, "
              "%d within 5%%" % (len(errors), statistics.median(errors), max(errors), min(errors),
                                 sum(e > 3 for e in errors), sum(abs(e) <= 5 for e in errors)))
    for ident, why in skipped:
        print("skipped %s: %s" % (ident, why))


if __name__ == "__main__":
    main()
