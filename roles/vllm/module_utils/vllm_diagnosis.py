# -*- coding: utf-8 -*-
"""Tell the three kinds of "vLLM CUDA OOM" apart from a server's log, and say what to change.

1. startup: the KV cache for one request at max_model_len does not fit; vLLM refuses to start.
2. runtime: an allocation outside the KV pool failed (torch.OutOfMemoryError) under load.
3. loop: every request fails after one bad one: a dead engine (restart) or allocator fragmentation.
Plus the restart trap: another process still holds the GPU, so the free-memory check fails.

Pure functions over text, shared by the vllm_ready module and the unit tests.
"""
from __future__ import annotations

import re

_KV_STARTUP = re.compile(
    r"To serve at least one request with the models?'s max seq len \((?P<len>\d+)\), "
    r"\((?P<need>[\d.]+) GiB KV cache is needed, which is larger than the available KV cache memory "
    r"\((?P<avail>[\d.]+) GiB\)\. Based on the available memory, the estimated maximum model length is "
    r"(?P<est>\d+)"
)
_FREE_MEMORY = re.compile(r"Free memory on device .* on startup is less than desired GPU memory utilization")
_TORCH_OOM = re.compile(r"(torch\.)?OutOfMemoryError: CUDA out of memory\. Tried to allocate (?P<size>[\d.]+ [KMG]i?B)")
_ENGINE_DEAD = re.compile(r"EngineDeadError|EngineCore.*died|Engine core proc .* died|AsyncEngineDeadError")
_FRAGMENTATION = re.compile(r"reserved but unallocated memory is large")


def diagnose(text: str) -> dict:
    """Return {kind, summary, advice, details} for the most telling failure found in ``text``.

    kind is one of: startup_kv_cache, gpu_busy_at_start, runtime_oom, engine_dead, none.
    """
    match = _KV_STARTUP.search(text)
    if match:
        est = int(match.group("est"))
        return {
            "kind": "startup_kv_cache",
            "summary": (
                f"failure 1 (startup): max_model_len {match.group('len')} needs {match.group('need')} GiB of KV "
                f"cache but only {match.group('avail')} GiB is available (vLLM: \"the estimated maximum model "
                f"length is {est}\")."
            ),
            "advice": (
                f"Lower the workload's context (max_model_len <= {est}), allow fp8 KV cache, or give the instance "
                "more GPUs; the sizing filter normally refuses this before start, so check that the plan's GPU "
                "facts match the host."
            ),
            "details": {"max_model_len": int(match.group("len")), "needed_gib": float(match.group("need")),
                        "available_gib": float(match.group("avail")), "estimated_max_model_len": est},
        }
    if _FREE_MEMORY.search(text):
        return {
            "kind": "gpu_busy_at_start",
            "summary": "vLLM refused to start: free GPU memory is below the requested utilization.",
            "advice": ("Another process holds GPU memory (often the previous vLLM still exiting). Check "
                       "nvidia-smi; the unit's ExecStartPre waits for release, raise vllm_gpu_release_timeout "
                       "or stop the foreign process."),
            "details": {},
        }
    match = _TORCH_OOM.search(text)
    if match:
        frag = bool(_FRAGMENTATION.search(text))
        return {
            "kind": "runtime_oom",
            "summary": (f"failure 2 (runtime): an allocation of {match.group('size')} outside the KV cache failed"
                        + (" with much memory reserved but unallocated (fragmentation)" if frag else "") + "."),
            "advice": ("Set vllm_policy.runtime_ooms_seen: true (utilization 0.80-0.85), enforce_eager, or lower "
                       "max_num_seqs / max_num_batched_tokens; check nvidia-smi for other processes. "
                       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is set by the plan."),
            "details": {"allocation": match.group("size"), "fragmentation": frag},
        }
    if _ENGINE_DEAD.search(text):
        return {
            "kind": "engine_dead",
            "summary": "failure 3 (loop): the engine died; every request fails until the process restarts.",
            "advice": ("Restart=always restarts it (it exits 0, so on-failure would not). If it recurs, the host "
                       "is under-provisioned: re-plan with a shorter max_model_len or fp8 KV cache."),
            "details": {},
        }
    return {"kind": "none", "summary": "no known vLLM failure in the log.", "advice": "", "details": {}}
