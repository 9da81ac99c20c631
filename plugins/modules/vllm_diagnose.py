#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Say which of the three "vLLM CUDA OOM" failures an instance shows, from its journal, unit state and metrics."""
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_diagnose
short_description: Tell the three vLLM OOM failures apart on one instance and say what to change
description:
  - Reads the unit's state (restarts, result), its journal since a given time and C(/metrics) (KV-cache usage,
    preemptions, waiting requests).
  - The journal is read as vLLM prints it (the vllm_diagnosis module_utils); the latest failure is the finding and
    every failure of the window is listed in RV(failures), so an old start-up refusal does not hide today's engine
    death.
  - "Kinds: C(startup_kv_cache) (vLLM refused the KV cache for one request at max_model_len), C(no_cache_memory)
    (nothing left for the KV cache), C(gpu_busy_at_start) (another process holds the GPU), C(startup_oom) (out of
    memory while loading weights, profiling or capturing CUDA graphs), C(runtime_oom) (an allocation outside the KV
    pool failed while serving), C(engine_dead) (every request fails until a restart), C(startup_failed) (the engine
    did not start, cause not recognised) and, from the metrics, C(kv_cache_pressure) (preemption: latency, not
    errors)."
options:
  unit: {description: systemd unit name, type: str, required: true}
  port: {description: HTTP port of the instance, type: int, required: true}
  since: {description: journalctl --since value, type: str, default: "-24h"}
author: vllm-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Diagnose
  vllm_fleet.fleet.vllm_diagnose:
    unit: vllm@main.service
    port: 8000
"""

RETURN = r"""
findings:
  description:
    - The latest failure of the journal, then KV-cache pressure from the metrics, each as kind, summary, advice and
      details (the numbers vLLM printed, the line and time of the failure).
  type: list
  elements: dict
  returned: always
failures:
  description: Every failure of the journal window, oldest first, each as kind, line, time and the line's text.
  type: list
  elements: dict
  returned: always
metrics: {description: the vLLM metrics read, type: dict, returned: always}
unit: {description: "ActiveState, Result and NRestarts of the unit", type: dict, returned: always}
"""


from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_diagnosis import diagnose
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_http import metrics_text
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_metrics import ACTIVE, PRESSURE, parse_metrics
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_systemd import journal_command, parse_show, show_command


def pressure_finding(metrics):
    usage = metrics.get("vllm:kv_cache_usage_perc")
    preempted = metrics.get("vllm:num_preemptions_total", 0)
    if preempted > 0 or (usage is not None and usage > 0.95):
        return {
            "kind": "kv_cache_pressure",
            "summary": "KV-cache pressure: %d preemptions, KV cache %.0f%% used, %d requests waiting. This costs "
                       "latency, not errors." % (preempted, 100 * (usage or 0),
                                                 metrics.get("vllm:num_requests_waiting", 0)),
            "advice": "Reduce client concurrency or re-plan with a larger vllm_workload.peak_concurrency (fp8 KV "
                      "cache, more GPUs); allocator settings do not help here.",
            "details": {},
        }
    return None


def main():
    module = AnsibleModule(
        argument_spec=dict(unit=dict(type="str", required=True), port=dict(type="int", required=True),
                           since=dict(type="str", default="-24h")),
        supports_check_mode=True,
    )
    p = module.params
    _rc, out, _err = module.run_command(show_command(p["unit"], ("ActiveState", "Result", "NRestarts")))
    unit = parse_show(out)
    _rc, journal, _err = module.run_command(journal_command(p["unit"], since=p["since"]))
    text = metrics_text(p["port"])
    # A dead or stopped server has no metrics; the journal still tells.
    metrics = {} if text is None else parse_metrics(text, ACTIVE + PRESSURE)
    found = diagnose(journal)
    findings = [{k: found[k] for k in ("kind", "summary", "advice", "details")}] if found["kind"] != "none" else []
    pressure = pressure_finding(metrics)
    if pressure:
        findings.append(pressure)
    module.exit_json(changed=False, findings=findings, failures=found["failures"], metrics=metrics, unit=unit)


if __name__ == "__main__":
    main()
