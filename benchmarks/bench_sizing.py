#!/usr/bin/env python3
"""Time vllm_sizing over 10,000 host x model x workload combinations (figures, not asserts).

    .venv/bin/python benchmarks/bench_sizing.py [--count N]

Hosts are the GPU types of vllm-facts.md section 2 (nvidia-smi totals) in groups of 1, 2, 4 and 8; models are the
vllm_model catalog; workloads range from short chat to long context. Plans that do not fit are sized with
strict=false, so they are timed like the others.
"""
import argparse
import itertools
import os
import statistics
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The filter file, and the collection's Python by its namespace (collections/ links back to this checkout).
sys.path[:0] = [os.path.join(_ROOT, "filter_plugins"), os.path.join(_ROOT, "collections")]
from ansible.errors import AnsibleFilterError  # noqa: E402
import vllm_sizing as vs  # noqa: E402
sz = vs.package()  # the package behind the filters, every module loaded

GPUS = [("NVIDIA A10G", 23028, "8.6"), ("NVIDIA L4", 23034, "8.9"), ("NVIDIA L40S", 46068, "8.9"),
        ("NVIDIA A100-SXM4-40GB", 40960, "8.0"), ("NVIDIA A100-SXM4-80GB", 81920, "8.0"),
        ("NVIDIA H100 80GB HBM3", 81559, "9.0"), ("NVIDIA H100 NVL", 95830, "9.0"), ("NVIDIA H200", 143771, "9.0"),
        ("NVIDIA GeForce RTX 4090", 24564, "8.9"), ("NVIDIA RTX 6000 Ada Generation", 49140, "8.9"),
        ("Tesla V100-SXM2-32GB", 32768, "7.0"), ("Tesla T4", 15360, "7.5")]
COUNTS = (1, 2, 4, 8)
WORKLOADS = ({"p99_context": 2048, "peak_concurrency": 64}, {"p99_context": 4096, "peak_concurrency": 16},
             {"p99_context": 8192, "peak_concurrency": 32}, {"p99_context": 16384, "peak_concurrency": 8},
             {"p99_context": 32768, "peak_concurrency": 4}, {})
POLICIES = ({}, {"gpu_sharing": "shared"}, {"runtime_ooms": True}, {"vllm_version": "0.32.0"})


def combinations(count):
    models = [vs.vllm_model(name) for name in sorted(sz.shape._catalog())]
    hosts = [[{"index": i, "name": name, "memory_total_mib": mib, "compute_capability": cc} for i in range(n)]
             for (name, mib, cc), n in itertools.product(GPUS, COUNTS)]
    every = itertools.cycle(itertools.product(hosts, models, WORKLOADS, POLICIES))
    return [next(every) for _ in range(count)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10000)
    args = parser.parse_args()
    cases = combinations(args.count)
    timings, fits, errors = [], 0, 0
    started = time.perf_counter()
    for gpus, model, workload, policy in cases:
        t0 = time.perf_counter()
        try:
            fits += vs.vllm_sizing(gpus, model, workload, dict(policy, strict=False))["fits"]
        except AnsibleFilterError:
            errors += 1  # impossible requests (e.g. p99 beyond the model's context)
        timings.append(time.perf_counter() - t0)
    total = time.perf_counter() - started
    timings.sort()
    print("vllm_sizing: %d plans in %.2f s (%.0f plans/s)" % (len(cases), total, len(cases) / total))
    print("per plan: mean %.2f ms, median %.2f ms, p99 %.2f ms, max %.2f ms"
          % (1000 * statistics.mean(timings), 1000 * timings[len(timings) // 2],
             1000 * timings[int(len(timings) * 0.99)], 1000 * timings[-1]))
    print("fits: %d, does not fit: %d, refused as impossible: %d" % (fits, len(cases) - fits - errors, errors))


if __name__ == "__main__":
    main()
