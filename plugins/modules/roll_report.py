#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the roll_report action (action_plugins/roll_report.py does the work, on the controller)."""

DOCUMENTATION = r"""
module: roll_report
short_description: Record one host's roll in the run's directory, or assemble the run's report and its table
description:
  - Without O(assemble), writes C(<run_dir>/hosts/<host>.json), the host's record (outcome, error, the seconds
    between its steps (drain, stop, start to ready, enable, total), vLLM's own start-to-ready (the slowest
    instance's, from systemd) and the overhead (total minus vLLM's own start-to-ready), the journal's record of an
    earlier roll this run resumed, what the prefetch of the model's files read, each instance's start phases and
    its events).
  - With O(assemble=true), reads every record in C(<run_dir>/hosts), writes C(<run_dir>/report.json) (run_id,
    outcome, hosts by name, every event in time order) and returns the per-host table an operator reads at the end
    of the roll, also written to C(<run_dir>/table.txt). The roll assembles once, after its last batch or the
    batch that failed.
  - Runs on the controller, in the run's own process, whatever host the task is for. JSON files are written
    atomically, mode 0600. Check mode writes nothing (nothing was rolled).
options:
  run_dir:
    description: The run's directory (rolling_restart_run_dir); C(hosts/) must exist in it.
    type: path
    required: true
  assemble:
    description: Assemble report.json from the records instead of writing one.
    type: bool
    default: false
  host:
    description: The inventory hostname of the record (required without O(assemble)).
    type: str
  outcome:
    description: The host's outcome.
    type: str
    choices: [ok, failed, running]
  error:
    description: Why the host failed (empty when it did not).
    type: str
    default: ""
  events:
    description: The host's steps, C({time, host, state}) with time in epoch seconds, the first state C(start).
    type: list
    elements: dict
  start_to_ready:
    description: vLLM's own start-to-ready of each instance, in seconds (vllm_ready's results); may be empty.
    type: list
    elements: float
    default: []
  resumed:
    description: The roll journal's record of the earlier roll that left this host out, when this run resumed it.
    type: dict
  prefetch:
    description: What reading the model's files into the page cache while the host drained read (files, bytes,
      skipped_bytes, seconds; the vllm role's tasks/prefetch.yml).
    type: dict
  phases:
    description: Each instance's start phases, instance name to the RV(vllm_fleet.fleet.vllm_ready#module:phases)
      of M(vllm_fleet.fleet.vllm_ready) (weights_s, engine_init_s, profile_s, compile_s, graphs_s, other_s,
      first_completion_s); the table shows them per instance.
    type: dict
    default: {}
author: vllm-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Write this host's record of the run
  vllm_fleet.fleet.roll_report:
    run_dir: "{{ rolling_restart_run_dir }}"
    host: "{{ inventory_hostname }}"
    outcome: ok
    events: "{{ rolling_restart_events }}"
    start_to_ready: [31.9]

- name: Assemble the run's report
  vllm_fleet.fleet.roll_report:
    run_dir: "{{ rolling_restart_run_dir }}"
    assemble: true
  run_once: true
  register: rolling_restart_report
"""

RETURN = r"""
path:
  description: The file written (the host's record, or report.json).
  returned: success
  type: str
record:
  description: The host's record as written.
  returned: without assemble
  type: dict
outcome:
  description: C(failed) when any host of the run failed, else C(ok).
  returned: with assemble
  type: str
table:
  description: The per-host table (host, outcome, drain, stop, start->ready, vLLM own, enable, total, overhead),
    one line each, then a line for the run, then vLLM's start phases per instance (when the starts reported them).
  returned: with assemble
  type: list
  elements: str
"""
