#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the roll_lock action (action_plugins/roll_lock.py does the work, on the controller)."""

DOCUMENTATION = r"""
module: roll_lock
short_description: Take the fleet's roll lock on the controller for the rest of the run, and read the roll journal
description:
  - Every playbook that changes rotation (a roll, a drain, an enable, adding a host, the watchdog's restarts, the
    balancers' roll) takes this lock first, so two of them never work on the fleet at once.
  - The lock is C(flock(2)) on O(path), the lock C(flock(1)) takes in the controller's scheduled services
    (roles/roll_schedule). A small process holds it for as long as the ansible-playbook process lives; the run
    ending, failing or being killed releases it. Nothing to clean up, ever.
  - A run started under C(flock <path> ansible-playbook ...) (the scheduled services) already holds it; the action
    sees its own ancestor among the holders (C(/proc/locks)) and goes on.
  - When another process holds it, fails naming it (its PID and command line, and the run it recorded in the file),
    before anything is changed.
  - Runs on the controller only; check mode takes the lock too (a check run must not overlap a roll either).
  - Never reports a change (the lock is no change to the fleet).
options:
  path:
    description: The lock file (its directory must exist). Every playbook run on a controller must use the same.
    type: path
    required: true
  what:
    description: Recorded in the lock file for others' error messages, after the run's command line (the playbook
      and its arguments), e.g. who runs it since when.
    type: str
    default: ansible-playbook
  timeout:
    description: Seconds to wait for the lock before failing (0 fails at once).
    type: float
    default: 0
  journal:
    description: The roll journal's directory, read once the lock is held (see RV(journal)).
    type: path
author: vllm-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Take the roll lock for this run
  vllm_fleet.fleet.roll_lock:
    path: /run/lock/vllm-fleet-roll.lock
    what: "playbooks/rolling_restart.yml by {{ lookup('ansible.builtin.env', 'USER') }}"
  run_once: true
"""

RETURN = r"""
held_by:
  description: C(this run) (taken now, or earlier in the same run) or C(this run's flock) (a flock(1) around it).
  returned: success
  type: str
journal:
  description: The records of O(journal) (one C(<host>.json) per host a roll left unfinished, killed or stopped
    there), each with C(journal_file), its path; empty when there are none.
  returned: success
  type: list
  elements: dict
msg:
  description: What was done.
  returned: always
  type: str
"""
