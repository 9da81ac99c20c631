#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the vllm_plan action (action_plugins/vllm_plan.py does the work, on the controller)."""

DOCUMENTATION = r"""
module: vllm_plan
short_description: Plan every vLLM instance of a host with the vllm_sizing filter, and the calibration store
description:
  - One plan per instance (C(ansible_facts.vllm_plans), keyed by instance name) from the vllm_sizing filter, with the
    GPUs of the instance, the model's config.json, the workload and the policy.
  - When O(calibration_dir) is set, the filter gets the store's entries of every configuration of the instance's GPU
    type and model (for each, this host's and instance's own entry, else the first of another host; starts and load
    tests, C(loadtest/)) and uses, for each configuration it tries, that configuration's own - one call per plan.
  - Runs on the controller, in the run's own process; the host is contacted only to read C(config.json) of
    O(model_dir) when O(model_config) is empty. Changes nothing.
  - Fails naming the host when O(serve_options) sets an argument the role owns (O(serve_options_owned)), and with
    the filter's message when a plan cannot be made (or does not fit, with O(strict)).
options:
  gpus:
    description: The host's GPUs (the nvidia_gpus facts' shape); an instance gets those whose index it lists.
    type: list
    elements: dict
    required: true
  instances:
    description: The instances (vllm_instances), each with C(name) and C(gpus), a list of GPU indexes.
    type: list
    elements: dict
    required: true
  model:
    description: Hugging Face id, sized from the filter's catalog when neither O(model_config) nor O(model_dir) is set.
    type: str
    default: ""
  model_dir:
    description: Model directory on the host; its config.json is read when O(model_config) is empty.
    type: str
    default: ""
  model_config:
    description: The model's config.json as a dict.
    type: dict
    default: {}
  model_path:
    description: What vLLM loads (the policy's C(model)).
    type: str
    required: true
  workload:
    description: vllm_sizing's workload.
    type: dict
    default: {}
  policy:
    description: vllm_sizing's policy; C(host), C(model), C(vllm_version), C(serve_options), C(strict) are set here.
    type: dict
    default: {}
  serve_options:
    description: Other engine arguments of the flag table, by EngineArgs name.
    type: dict
    default: {}
  serve_options_owned:
    description: Engine arguments O(serve_options) may not set, each with the variable to set instead.
    type: dict
    default: {}
  version:
    description: The vLLM release to plan for.
    type: str
    required: true
  strict:
    description: A plan that does not fit fails the task (else it is returned with its reason).
    type: bool
    default: true
  calibration_dir:
    description: The calibration store's directory on the controller; empty plans without it.
    type: str
    default: ""
  running:
    description:
      - The plans the instances were started with, by instance name (after a start, to plan again with what it
        measured). A new plan that would change an instance's command line or environment is not returned in
        C(vllm_plans), which keeps the running plan, but in C(vllm_plans_later); it waits for the next apply, which
        writes it together with the unit's drop-in, so that the plan file on the host is always what runs.
    type: dict
    default: {}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
    support: full
author: vllm-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Plan every instance
  vllm_fleet.fleet.vllm_plan:
    gpus: "{{ ansible_facts.nvidia_gpus }}"
    instances: [{name: main, gpus: [0, 1], port: 8000}]
    model: Qwen/Qwen3-8B
    model_path: Qwen/Qwen3-8B
    workload: {p99_context: 32768, peak_concurrency: 16}
    version: 0.11.0
    calibration_dir: "{{ inventory_dir }}/calibration"

- name: Show the main instance's command line
  ansible.builtin.debug:
    msg: "{{ vllm_plans.main | vllm_serve_args }}"
"""

RETURN = r"""
ansible_facts:
  description:
    - C(vllm_plans), the plan of each instance by name (the vllm_sizing filter's result), and C(vllm_plans_later),
      the new plans O(running) holds back (empty without it).
  returned: success
  type: dict
calibration_entries:
  description: The calibration store's files each instance was planned with, by instance name.
  returned: success
  type: dict
"""
