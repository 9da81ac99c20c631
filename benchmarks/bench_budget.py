#!/usr/bin/env python3
"""How far the sizing budget's KV memory per GPU is from what vLLM printed on real GPUs (figures, not asserts).

    .venv/bin/python benchmarks/bench_budget.py

Reads the published startups of tests/fixtures/startup-logs/ ("Available KV cache memory: X GiB"), sizes the same
model, GPU, parallelism, utilization, batch, dtype, online quantization and eager settings with vllm_sizing under
the version-table row that behaves like the logged release, and prints per log the predicted and printed KV memory
and the error (positive: the plan expects more than vLLM had, the dangerous side), then the median, the worst and
the counts over and under. Logs that cannot be sized are listed with the reason. tests/unit/test_vllm_sizing_corpus.py
asserts the bounds on the same predictions.
"""
import glob
import json
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The filter file, and the collection's Python by its namespace (collections/ links back to this checkout).
sys.path[:0] = [os.path.join(ROOT, "filter_plugins"), os.path.join(ROOT, "collections")]
import vllm_sizing as vs  # noqa: E402
sz = vs.package()  # the package behind the filters, every module loaded

LOGS = os.path.join(ROOT, "tests", "fixtures", "startup-logs")
# Checkpoints with the same config.json shapes as a catalog entry (instruct and base builds).
ALIASES = {"Qwen/Qwen2.5-7B-Instruct": "Qwen/Qwen2.5-7B"}
# Models of the corpus that are not in the catalog, and why.
NOT_SIZED = {
    "RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16":
        "its config.json was not found in public sources: vLLM ran it as GPTQ (gptq_marlin), and the bits, group "
        "size and desc_act of its quantization_config would be guesses",
    "RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic":
        "its config.json (a compressed-tensors quantization_config) was not found in public sources",
    "meta-llama/Llama-4-Scout-17B-16E-Instruct":
        "chunked local attention (attention_chunk_size 8192 on 3 of 4 layers) is not sized: vllm_sizing would plan "
        "every layer as full attention",
    "Qwen/Qwen3-Next-80B-A3B-Instruct":
        "hybrid Gated DeltaNet linear attention (3 of 4 layers keep a fixed recurrent state, vLLM pads the attention "
        "block to 544 tokens) is not sized",
    "llava-hf/llava-v1.6-mistral-7b-hf":
        "the source does not name the GPU, and the printed activation peak includes the vision encoder's profiling "
        "batch of 5 images, which the budget does not model",
    "moonshotai/Kimi-K2-Thinking":
        "a nightly build without a version, utilization or max_model_len in the published lines (two lines only)",
    "zai-org/GLM-4.7-FP8": "refused start: only the ValueError line is published (no Available KV cache memory)",
    "Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8":
        "refused start: only the ValueError line is published (no Available KV cache memory)",
}
# nvidia-smi totals (vllm-facts.md section 2) for logs that do not print vLLM's total.
GPUS = {"A100 80GB": ("NVIDIA A100-SXM4-80GB", 81920, "8.0"), "A100 40GB": ("NVIDIA A100-SXM4-40GB", 40960, "8.0"),
        "A100": ("NVIDIA A100-SXM4-80GB", 81920, "8.0"), "H100": ("NVIDIA H100 80GB HBM3", 81559, "9.0"),
        "H200": ("NVIDIA H200", 143771, "9.0"), "L40S": ("NVIDIA L40S", 46068, "8.9"),
        # No nvidia-smi total in its source: vLLM's printed 95.01 GiB (the bench sizes from the printed total anyway).
        "RTX PRO 6000": ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97290, "12.0")}
# What vLLM prints when it samples with its PyTorch top-k/top-p instead of FlashInfer's.
NATIVE_SAMPLER = "Falling back to the PyTorch-native implementation of top-p & top-k sampling"
# Within these bounds a plan is usable: never more than 3 % above what vLLM had, never more than 5 % off.
OVER, OFF = 3.0, 5.0


def version_row(version):
    """The release-table row of the logged release: its own, else the newest row before it (a pre-release such as
    0.15.2rc1 runs the code of the release before; 0.10 logs take the oldest row, 0.11.0: the same profiling and
    sampler, no CUDA-graph budget)."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    if not match:
        return None
    key = tuple(int(part) for part in match.groups())
    if version in sz.versions.VERSIONS:
        return version
    rows = sorted(sz.versions.VERSIONS, key=sz.versions.version_key)
    older = [r for r in rows if sz.versions.version_key(r) < key]
    return older[-1] if older else rows[0]


def gpu_of(log):
    named = (log.get("gpu") or "").split("(")[0]  # the notes in brackets may name other GPUs
    for key, spec in GPUS.items():
        if key in named:
            return spec
    return None


def predict(log, measured=None, **options):
    """(plan, why not) for one log: the plan vllm_sizing makes for its settings (measured: policy.measured; options:
    other policy options)."""
    model = ALIASES.get(log["model"], log["model"])
    if model in NOT_SIZED:
        return None, NOT_SIZED[model]
    if model not in sz.shape._catalog():
        return None, "model not in the catalog"
    spec = gpu_of(log)
    if log["parsed"].get("kv_available_gib") is None or spec is None or log.get("gpu_memory_utilization") is None:
        return None, "no printed KV memory, GPU or utilization"
    if "MULTI-NODE" in (log.get("notes") or ""):
        return None, "tensor parallelism across nodes (NCCL over the network): vllm_sizing plans one host's GPUs"
    version = version_row(log.get("vllm_version"))
    if version is None:
        return None, "nightly build without a version: no version-table row to size it with"
    name, total_mib, capability = spec
    tp, pp = log.get("tensor_parallel_size") or 1, log.get("pipeline_parallel_size") or 1
    gpus = [{"index": i, "name": name, "memory_total_mib": total_mib, "compute_capability": capability}
            for i in range(tp * pp)]
    policy = {"gpu_memory_utilization": log["gpu_memory_utilization"], "tensor_parallel_size": tp,
              "pipeline_parallel_size": pp, "allow_tensor_parallel": False, "strict": False,
              "enforce_eager": bool(log.get("enforce_eager")), "vllm_version": version, "allow_fp8_kv_cache": False}
    if log["parsed"].get("total_gpu_memory_gib"):
        policy["usable_memory_mib"] = int(log["parsed"]["total_gpu_memory_gib"] * 1024)
    for key in ("max_num_batched_tokens", "max_num_seqs"):
        if log.get(key):
            policy[key] = log[key]
    serve = {}
    if any("'enable_expert_parallel': True" in line for line in log["lines"]):
        serve["enable_expert_parallel"] = True
    if any(NATIVE_SAMPLER in line for line in log["lines"]):
        policy["flashinfer_sampler"] = False
    if log.get("dtype") == "float32":
        serve["dtype"] = "float32"
    entry = vs.vllm_model(model)
    if log.get("quantization") and not entry.get("quantization_config"):
        serve["quantization"] = log["quantization"]  # online quantization of a 16-bit checkpoint
    policy["serve_options"] = serve
    if measured is not None:
        policy["measured"] = measured
    policy.update(options)
    workload = {"max_context": log["max_model_len"]} if log.get("max_model_len") else {}
    return vs.vllm_sizing(gpus, entry, workload, policy), None


def corpus():
    """(rows, skipped): rows of (id, log, plan, error %) for every log that can be sized."""
    rows, skipped = [], []
    for path in sorted(glob.glob(os.path.join(LOGS, "*.json"))):
        with open(path) as handle:
            log = json.load(handle)
        ident = os.path.basename(path)[:-5]
        plan, why = predict(log)
        if plan is None:
            skipped.append((ident, why))
            continue
        printed = log["parsed"]["kv_available_gib"] * sz.common.GiB
        rows.append((ident, log, plan, (plan["budget_per_gpu"]["kv_cache_bytes"] - printed) / printed * 100))
    return rows, skipped


def summary(rows):
    """The corpus in one line: median, worst and how many logs are over by more than OVER % or outside OFF % (also
    printed after a pytest run of tests/unit/test_vllm_sizing_corpus.py, by tests/unit/conftest.py)."""
    errors = [row[3] for row in rows]
    return ("%d logs: median error %+.1f%%, worst over %+.1f%%, worst under %+.1f%%; %d over by more than %g%%, "
            "%d outside %g%%" % (len(errors), statistics.median(errors), max(errors), min(errors),
                                 sum(e > OVER for e in errors), OVER, sum(abs(e) > OFF for e in errors), OFF))


def main():
    rows, skipped = corpus()
    parts = (("weights", "weights_bytes", "weights_gib"), ("activation", "activation_peak_bytes",
                                                           "activation_peak_gib"),
             ("non-torch", "non_torch_bytes", "non_torch_gib"))
    print("%-50s %9s %9s %7s  %s" % ("log", "predicted", "printed", "error", "weights / activation / non-torch "
                                     "(predicted/printed GiB)"))
    for ident, log, plan, error in rows:
        budget = plan["budget_per_gpu"]
        detail = "  ".join("%.2f/%s" % (budget[key] / sz.common.GiB,
                           log["parsed"].get(printed)) for _, key, printed in parts)
        print("%-50s %7.2f G %7.2f G %+6.1f%%  %s%s" % (
            ident[:50], budget["kv_cache_bytes"] / sz.common.GiB, log["parsed"]["kv_available_gib"], error, detail,
            "  <-- outside bounds" if error > OVER or abs(error) > OFF else ""))
    if rows:
        print("\n" + summary(rows))
        print("\nper release (the row the log was sized with):")
        for release in sorted({row[2]["vllm_version"] for row in rows}, key=sz.versions.version_key):
            print("  %-8s %s" % (release, summary([row for row in rows if row[2]["vllm_version"] == release])))
    for ident, why in skipped:
        print("skipped %s: %s" % (ident, why))


if __name__ == "__main__":
    main()
