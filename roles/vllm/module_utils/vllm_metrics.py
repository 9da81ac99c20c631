# -*- coding: utf-8 -*-
"""vLLM's Prometheus text exposition (/metrics): the one parser, for the vllm role's modules and the unit tests."""
from __future__ import annotations

import re

METRICS = ("vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "vllm:num_requests_running",
           "vllm:num_requests_waiting")
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+|NaN)$")


def parse_metrics(text, names=METRICS):
    """Sum each wanted metric over its label sets (one engine per instance in practice); NaN samples are skipped."""
    found = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match and match.group(1) in names and match.group(3) != "NaN":
            found[match.group(1)] = found.get(match.group(1), 0.0) + float(match.group(3))
    return found


def metric_labels(text, name):
    """The labels of a metric's first sample ({} when absent), e.g. vllm:cache_config_info's num_gpu_blocks."""
    for line in text.splitlines():
        match = _LINE.match(line)
        if match and match.group(1) == name:
            return dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
    return {}
