#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load-test one vLLM instance on its own host, at its plan's limits, with vLLM's benchmark client."""
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_loadtest
short_description: Drive one vLLM instance at its plan's limits and say whether it held them
description:
  - Runs vLLM's own benchmark client (C(vllm.benchmarks.serve), the code of C(vllm bench serve)) from the instance's
    virtualenv against the instance on the host's loopback only, one stage per concurrency level, random prompts of
    O(p99_context) minus O(output_len) tokens and O(output_len) generated tokens each.
  - Reads C(/metrics) every O(sample_interval) seconds meanwhile (KV-cache usage, running and waiting requests,
    preemptions) and, afterwards, the unit's journal of the test window through the triage classifier (OOMs, engine
    death), and vLLM's own KV cache size (C(vllm:cache_config_info)).
  - The verdict (module_utils vllm_loadtest) holds when no request failed or timed out, the journal shows no OOM, no
    sequence was preempted or queued behind the KV cache at any concurrency up to the plan's max_num_seqs, and the
    p99 latencies at the workload's peak stayed within O(bounds).
  - "Sends real traffic: run it on an instance that is out of the balancers' rotation. Never changes the host."
options:
  unit: {description: systemd unit of the instance, type: str, required: true}
  port: {description: HTTP port of the instance on 127.0.0.1, type: int, required: true}
  python: {description: the venv python that has vLLM, type: path, required: true}
  model: {description: what the instance loaded (a local directory or a Hugging Face id; its tokenizer), type: str,
          required: true}
  served_model_name: {description: the model name the instance serves, type: str, required: true}
  hf_home: {description: HF_HOME of the instance (where a Hugging Face id's tokenizer is), type: path}
  api_key: {description: the instance's API key (passed to the client in its environment), type: str, default: ""}
  engine_args:
    description:
      - The engine arguments of the plan the instance runs (its plan's C(engine_args)); C(max_num_seqs) and
        C(max_model_len) are the limits tested.
      - The vllm role passes the plan file of the host, read once by its tasks/running_plans.yml.
    type: dict
    required: true
  kv_blocks_per_request:
    description:
      - The plan's C(kv_blocks_per_request) (C({context, blocks})) - the blocks of vLLM's pool one request of the
        plan's context takes, summed over the model's layer groups (sliding-window models have several). vLLM's
        block count divided by it is what the cache holds; without it, or at another context, a request is counted
        a block per C(block_size) tokens (right for full attention only).
    type: dict
  concurrency:
    description: Concurrency of each stage (run lowest first); empty for O(peak_concurrency) then the plan's max_num_seqs.
    type: list
    elements: int
    default: []
  requests_per_stage: {description: requests of a stage per unit of its concurrency, type: int, default: 2}
  output_len: {description: generated tokens of every request, type: int, default: 128}
  p99_context:
    description: The workload's p99 context; every prompt has this many tokens minus O(output_len), capped at the
      plan's max_model_len. 0 for the plan's max_model_len.
    type: int
    default: 0
  peak_concurrency:
    description: The workload's peak (latency bounds apply there); 0 for the plan's max_num_seqs.
    type: int
    default: 0
  stage_timeout: {description: seconds a stage may take before it is stopped and counted as failed, type: int,
                  default: 300}
  sample_interval: {description: seconds between two reads of /metrics, type: float, default: 0.25}
  bounds:
    description: C(ttft_p99_ms), C(itl_p99_ms), C(max_kv_cache_usage) (0 means no bound).
    type: dict
    default: {}
author: vllm-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Load-test instance main
  vllm_fleet.fleet.vllm_loadtest:
    unit: vllm@main.service
    port: 8000
    python: /opt/vllm/venv/bin/python
    model: Qwen/Qwen3-8B
    served_model_name: Qwen/Qwen3-8B
    engine_args: {max_num_seqs: 8, max_model_len: 8192}
    output_len: 128
    p99_context: 4096
    peak_concurrency: 8
    bounds: {ttft_p99_ms: 10000, itl_p99_ms: 500}
"""

RETURN = r"""
stages: {description: "one summary per concurrency level (counts, latency percentiles in ms, metric peaks)",
         type: list, elements: dict, returned: always}
samples: {description: "every /metrics read: t (s since start), stage, kv, running, waiting, preemptions",
          type: list, elements: dict, returned: always}
oom_failures: {description: kinds of the OOM and engine-death failures the journal shows during the test,
               type: list, elements: str, returned: always}
plan: {description: the engine_args tested, type: dict, returned: always}
verdict: {description: "passed, held_concurrency and broken limits (limit, stage, measured, bound, message, fix)",
          type: dict, returned: always}
started: {description: "start of the test, UTC ISO 8601", type: str, returned: always}
p99_context: {description: the context tested (prompt plus output tokens), type: int, returned: always}
input_len: {description: prompt tokens of every request, type: int, returned: always}
kv_cache_blocks: {description: KV cache blocks vLLM allocated (vllm:cache_config_info), type: int, returned: always}
block_size: {description: vLLM's KV block size in tokens, type: int, returned: always}
kv_capacity: {description: requests at p99_context the KV cache holds at once (null block excluded), type: int,
              returned: always}
output_len: {description: generated tokens of every request, type: int, returned: always}
peak_concurrency: {description: the concurrency the latency bounds were checked at, type: int, returned: always}
"""

import datetime
import json
import os
import shutil
import tempfile
import threading
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_diagnosis import diagnose
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_http import metrics_text
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_loadtest import (
    bench_command, kv_capacity, stage_summary, verdict)
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_metrics import metric_labels, parse_metrics
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_systemd import journal_command

OOM_KINDS = ("runtime_oom", "engine_dead", "startup_oom")


def read_metrics(port):
    text = metrics_text(port, timeout=2)
    if text is None:
        return None
    found = parse_metrics(text)
    return {"kv": found.get("vllm:kv_cache_usage_perc"), "running": found.get("vllm:num_requests_running"),
            "waiting": found.get("vllm:num_requests_waiting"),
            "preemptions": found.get("vllm:num_preemptions_total")}


def cache_config(port):
    """vLLM's own KV cache figures (vllm:cache_config_info): (blocks, block size), or (None, None)."""
    labels = metric_labels(metrics_text(port) or "", "vllm:cache_config_info")
    try:
        return int(labels["num_gpu_blocks"]), int(labels["block_size"])
    except (KeyError, ValueError):
        return None, None


def run_stage(module, p, concurrency, workdir, start):
    """Run the client for one stage while reading /metrics; (result JSON or None, samples, timed out, output)."""
    name = "stage-%d.json" % concurrency
    # timeout(1) ends the client (and what it started: its own process group) at the stage's limit, exit status 124.
    argv = ["timeout", "--kill-after=10", str(p["stage_timeout"])] + bench_command(
        p["python"], p["port"], p["model"], p["served_model_name"], concurrency, concurrency * p["requests_per_stage"],
        p["input_len"], p["output_len"], workdir, name)
    env = {"OPENAI_API_KEY": p["api_key"], "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    if p["hf_home"]:
        env["HF_HOME"] = p["hf_home"]
    samples = []
    done = threading.Event()

    def sample():
        """/metrics every sample_interval while the client runs, and once more after it ended."""
        while True:
            finished = done.is_set()
            found = read_metrics(p["port"])
            if found:
                found.update(t=round(time.time() - start, 2), stage=concurrency)
                samples.append(found)
            if finished:
                return
            done.wait(p["sample_interval"])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        rc, out, err = module.run_command(argv, cwd=workdir, environ_update=env)
    finally:
        done.set()
        sampler.join()
    output = out + err
    with open(os.path.join(workdir, name + ".log"), "w") as log:
        log.write(output)
    try:
        with open(os.path.join(workdir, name)) as handle:
            result = json.load(handle)
    except (OSError, ValueError):
        result = None
    return result, samples, rc == 124, output


def main():
    module = AnsibleModule(
        argument_spec=dict(
            unit=dict(type="str", required=True), port=dict(type="int", required=True),
            python=dict(type="path", required=True), model=dict(type="str", required=True),
            served_model_name=dict(type="str", required=True), hf_home=dict(type="path"), api_key=dict(type="str", default="", no_log=True),
            engine_args=dict(type="dict", required=True), kv_blocks_per_request=dict(type="dict"),
            concurrency=dict(type="list", elements="int", default=[]),
            requests_per_stage=dict(type="int", default=2), output_len=dict(type="int", default=128),
            p99_context=dict(type="int", default=0),
            peak_concurrency=dict(type="int", default=0), stage_timeout=dict(type="int", default=300),
            sample_interval=dict(type="float", default=0.25), bounds=dict(type="dict", default={})),
        supports_check_mode=False,
    )
    p = module.params
    plan_args = p["engine_args"]
    if not all(isinstance(plan_args.get(key), int) and plan_args[key] > 0 for key in ("max_num_seqs", "max_model_len")):
        module.fail_json(msg="engine_args must hold the plan's max_num_seqs and max_model_len as positive integers, "
                             "got %r: pass the plan the instance runs (its plan file's engine_args)" % plan_args)
    context = min(p["p99_context"] or plan_args["max_model_len"], plan_args["max_model_len"])
    p["input_len"] = context - p["output_len"]
    p["peak_concurrency"] = p["peak_concurrency"] or plan_args["max_num_seqs"]
    levels = sorted(set(p["concurrency"] or [p["peak_concurrency"], plan_args["max_num_seqs"]]))
    if p["input_len"] < 1 or min(levels) < 1 or p["output_len"] < 1:
        module.fail_json(msg="%s: nothing to test: prompts of %d tokens (p99 context %d minus %d generated), "
                             "concurrency %s" % (p["unit"], p["input_len"], context, p["output_len"], levels))
    blocks, block_size = cache_config(p["port"])
    capacity = kv_capacity(blocks, block_size, context, p["kv_blocks_per_request"])
    started = datetime.datetime.now(datetime.timezone.utc)
    start = time.time()
    workdir = tempfile.mkdtemp(prefix="vllm-loadtest-")
    stages, samples = [], []
    try:
        for concurrency in levels:
            result, stage_samples, timed_out, output = run_stage(module, p, concurrency, workdir, start)
            if result is None and not timed_out:
                module.fail_json(msg="%s: vLLM's benchmark client produced no result at concurrency %d; its last "
                                     "lines: %s" % (p["unit"], concurrency, output.strip().splitlines()[-5:]),
                                 stages=stages, samples=samples)
            stages.append(stage_summary(concurrency, result, stage_samples, timed_out))
            samples.extend(stage_samples)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    _rc, journal, _err = module.run_command(journal_command(p["unit"],
                                                            since=started.strftime("%Y-%m-%d %H:%M:%S UTC")))
    oom = [f["kind"] for f in diagnose(journal)["failures"] if f["kind"].startswith(OOM_KINDS)]
    # -e key=value gives strings: the bounds are numbers (0 or empty: no bound).
    bounds = {key: float(value or 0) for key, value in p["bounds"].items()}
    found = verdict(stages, oom, plan_args, context, p["peak_concurrency"], bounds, capacity)
    module.exit_json(changed=False, started=started.strftime("%Y-%m-%dT%H:%M:%SZ"), stages=stages, samples=samples,
                     oom_failures=oom, plan=plan_args, verdict=found, p99_context=context,
                     kv_cache_blocks=blocks, block_size=block_size, kv_capacity=capacity, input_len=p["input_len"],
                     output_len=p["output_len"], peak_concurrency=p["peak_concurrency"])


if __name__ == "__main__":
    main()
