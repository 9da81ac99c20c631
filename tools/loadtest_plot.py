#!/usr/bin/env python3
"""Draw a load-test report (roles/vllm/tasks/loadtest.yml) as a PNG.

Above: concurrency of the stage and requests running/waiting over time; middle: KV-cache usage and preemptions;
below: each stage's p50/p99 time to first token and inter-token latency. The verdict is the title.

  tools/loadtest_plot.py reports/loadtest/<run>/<host>-<instance>.json --out <host>-<instance>.png
"""
from __future__ import annotations

import argparse
import json
import sys


def draw(report, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    fig, (ax_load, ax_kv, ax_lat) = plt.subplots(3, 1, figsize=(10, 9))
    t = [s["t"] for s in samples]
    ax_load.step(t, [s["stage"] for s in samples], where="post", color="black", label="client concurrency")
    ax_load.plot(t, [s["running"] for s in samples], color="#2ca02c", label="running (vLLM)")
    ax_load.plot(t, [s["waiting"] for s in samples], color="#d62728", label="waiting (vLLM)")
    if report["plan"].get("max_num_seqs"):
        ax_load.axhline(report["plan"]["max_num_seqs"], color="grey", linestyle=":", label="plan max_num_seqs")
    ax_load.set_ylabel("requests")
    ax_load.legend(loc="upper left", fontsize="small")

    ax_kv.plot(t, [100 * (s["kv"] or 0) for s in samples], color="#1f77b4", label="KV cache used (%)")
    ax_kv.set_ylabel("KV cache used (%)")
    ax_kv.set_ylim(0, 105)
    ax_pre = ax_kv.twinx()
    base = samples[0]["preemptions"] if samples else 0
    ax_pre.step(t, [(s["preemptions"] or 0) - (base or 0) for s in samples], where="post", color="#ff7f0e",
                label="preemptions")
    ax_pre.set_ylabel("preemptions (cumulative)")
    ax_kv.set_xlabel("seconds since the test started")
    ax_kv.legend(loc="upper left", fontsize="small")
    ax_pre.legend(loc="upper right", fontsize="small")

    stages = report["stages"]
    labels = [str(s["concurrency"]) for s in stages]
    x = range(len(stages))
    for offset, key, name in ((-0.3, "median_ttft_ms", "TTFT p50"), (-0.1, "p99_ttft_ms", "TTFT p99"),
                              (0.1, "median_itl_ms", "ITL p50"), (0.3, "p99_itl_ms", "ITL p99")):
        ax_lat.bar([i + offset for i in x], [s.get(key) or 0 for s in stages], width=0.2, label=name)
    ax_lat.set_xticks(list(x))
    ax_lat.set_xticklabels(labels)
    ax_lat.set_xlabel("stage concurrency")
    ax_lat.set_ylabel("ms")
    ax_lat.set_yscale("log")
    ax_lat.legend(fontsize="small")

    verdict = report["verdict"]
    title = "%s %s: %s (p99 context %d, max_num_seqs %s)" % (
        report["host"], report["instance"], "PASSED" if verdict["passed"] else "FAILED: " + ", ".join(
            b["limit"] for b in verdict["broken"]), report["p99_context"], report["plan"].get("max_num_seqs"))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    with open(args.report, encoding="utf-8") as handle:
        draw(json.load(handle), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
