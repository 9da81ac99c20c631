#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the roll_journal action (action_plugins/roll_journal.py does the work, on the controller)."""

DOCUMENTATION = r"""
module: roll_journal
short_description: Record on the controller where a host out of rotation is in its roll, or forget it
description:
  - The roll journal holds one C(<host>.json) per host that a roll (or the watchdog's restart) took out of
    rotation, rewritten at every step until the host is back in every balancer, then removed. A roll killed at any
    step leaves the entry; the next roll reads it under the roll lock (M(vllm_fleet.fleet.roll_lock)) and brings
    the host back first.
  - Runs on the controller, in the run's own process (no module is sent anywhere), whatever host the task is for.
  - Writes atomically (a temporary file renamed over the entry), mode 0600, in O(dir) (created 0700 if missing).
  - Check mode writes nothing (nothing was drained).
options:
  dir:
    description: The roll journal's directory (rolling_restart_journal_dir).
    type: path
    required: true
  host:
    description: The inventory hostname the entry is for (the file's name).
    type: str
    required: true
  record:
    description: The entry (required with O(state=present)); its C(host) must be O(host).
    type: dict
  state:
    description: C(present) writes the entry, C(absent) removes it.
    type: str
    choices: [present, absent]
    default: present
author: vllm-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Record that this host is drained
  vllm_fleet.fleet.roll_journal:
    dir: "{{ rolling_restart_journal_dir }}"
    host: "{{ inventory_hostname }}"
    record: {host: "{{ inventory_hostname }}", step: drained, at: "{{ now().timestamp() }}"}

- name: Forget it, it is back in every balancer
  vllm_fleet.fleet.roll_journal:
    dir: "{{ rolling_restart_journal_dir }}"
    host: "{{ inventory_hostname }}"
    state: absent
"""

RETURN = r"""
path:
  description: The entry's file.
  returned: always
  type: str
"""
