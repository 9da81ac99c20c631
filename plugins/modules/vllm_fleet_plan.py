#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the vllm_fleet_plan action (action_plugins/vllm_fleet_plan.py does the work, on the controller)."""

DOCUMENTATION = r"""
module: vllm_fleet_plan
short_description: Plan many vLLM hosts in one task on the controller, each as its own per-host plan would
description:
  - For each host of O(hosts), what the per-host path gives it (roles/nvidia_gpu/tasks/facts.yml, then
    roles/vllm/tasks/plan.yml, each behind its role's argument check), in one task. The host's variables come from
    Ansible's variable manager (with both roles' defaults), the entry points' argument checks from the roles'
    C(meta/argument_specs.yml), and the actions C(nvidia_gpu_facts) and C(vllm_plan) run with the args of those
    task files, templated for the host.
  - A template is rendered once per distinct set of the values it reads (through every variable it reads); one that
    reads a lookup, the clock, randomness, C(hostvars), C(vars) or the play's host lists is rendered for each host.
  - Hosts without C(nvidia_gpu_declared), and hosts whose config.json must be read from C(vllm_model_dir), are not
    planned here but named in C(contact), for the per-host path. Nothing is contacted; changes nothing.
  - Run it once (C(run_once)) in a play over the hosts, delegated to localhost with C(delegate_facts), as
    playbooks/plan.yml does.
options:
  hosts:
    description: The inventory hostnames to plan.
    type: list
    elements: str
    required: true
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
- name: Plan the declared hosts of the play
  vllm_fleet.fleet.vllm_fleet_plan:
    hosts: "{{ ansible_play_hosts_all }}"
  run_once: true
  delegate_to: localhost
  delegate_facts: true
"""

RETURN = r"""
ansible_facts:
  description:
    - C(vllm_fleet_plan) with C(hosts) (O(hosts)), C(plans) (host to its C(vllm_plans)), C(contact) (the hosts left
      to the per-host path) and C(refused) (host to the message its per-host path would fail with).
  returned: success
  type: dict
"""
