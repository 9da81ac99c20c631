#!/usr/bin/env python3
"""How exact a plan becomes once a start of the same configuration was measured (figures, not asserts).

    .venv/bin/python benchmarks/bench_calibration.py

For every published startup of tests/fixtures/startup-logs/ that benchmarks/bench_budget.py sizes, the log's lines
that vLLM prints at INFO level (what a server logs by default) go through vllm_startup_report and back into
vllm_sizing as policy.measured, as the calibration store holds them: with the request of the plan that started (its
utilization and the GPU's nvidia-smi total). The plan's KV memory per GPU is then compared with what the next start
of that configuration has: what vLLM printed, or with its startup plan on (VLLM_ENABLE_STARTUP_PLAN, 0.26+) what it
stores for later starts (the summary line's --kv-cache-memory), beside the estimate's error.
tests/unit/test_vllm_sizing_corpus.py asserts the bound on the same figures.
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_budget  # noqa: E402
import vllm_startup_report  # noqa: E402  (bench_budget puts filter_plugins on the path)


def calibrated():
    """Rows of (id, estimate error %, calibrated error %, measured parts)."""
    rows = []
    for ident, log, plan, error in bench_budget.corpus()[0]:
        info = [line for line in log["lines"] if " DEBUG " not in line]
        entry = {"report": vllm_startup_report.vllm_startup_report(info), "request": {
            "gpu_memory_utilization": plan["engine_args"]["gpu_memory_utilization"],
            "memory_total_mib": plan["gpus"]["memory_total_mib"]}}
        plan, _ = bench_budget.predict(log, measured=entry)
        printed = log["parsed"]["kv_available_gib"] * bench_budget.sz.common.GiB
        if "VLLM_ENABLE_STARTUP_PLAN" in plan["env"] and "kv_cache_memory_suggested_bytes" in entry["report"]:
            printed = entry["report"]["kv_cache_memory_suggested_bytes"]
        after = (plan["budget_per_gpu"]["kv_cache_bytes"] - printed) / printed * 100
        rows.append((ident, error, after, plan.get("calibration", {}).get("parts", [])))
    return rows


def main():
    rows = calibrated()
    print("%-50s %9s %11s  %s" % ("log", "estimate", "calibrated", "measured parts"))
    for ident, error, after, parts in rows:
        print("%-50s %+8.1f%% %+10.1f%%  %s" % (ident[:50], error, after, ", ".join(parts) or "-"))
    after = [row[2] for row in rows]
    print("\n%d logs calibrated: median error %+.2f%% (estimate %+.2f%%), worst %+.2f%% / %+.2f%%"
          % (len(rows), statistics.median(after), statistics.median(row[1] for row in rows), max(after), min(after)))


if __name__ == "__main__":
    main()
