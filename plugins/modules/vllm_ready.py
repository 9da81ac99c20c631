#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wait until a vLLM instance is ready: unit active, /health 200 and a one-token completion."""
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_ready
short_description: Wait until a vLLM instance under systemd serves a completion
description:
  - Polls the unit's state, C(GET /health) and a one-token C(POST /v1/completions) on 127.0.0.1.
  - A wedged engine keeps /health at 200, so only a real completion proves readiness.
  - Fails at once when the unit has failed for good (start limit hit), with the last journal lines and a
    diagnosis of which "CUDA OOM" failure it was.
options:
  unit: {description: systemd unit name, type: str, required: true}
  port: {description: HTTP port of the instance, type: int, required: true}
  model: {description: served model name sent in the completion, type: str, required: true}
  api_key: {description: API key (VLLM_API_KEY), type: str, default: ""}
  timeout: {description: seconds to wait in all, type: int, default: 900}
  progress_every:
    description:
      - Every this many seconds of waiting, the task prints what it waits for, how long so far and the limit (the
        role's action plugin runs the module for a slice of the wait at a time). 0 waits in one run, silently.
    type: int
    default: 30
  fail_on_timeout:
    description:
      - Internal (set by the action for each slice but the last). With false, running out of O(timeout) returns
        C(ready=false) and the last check instead of failing with a diagnosis. A unit that failed fails either way.
    type: bool
    default: true
  journal_lines: {description: journal lines returned on failure, type: int, default: 40}
  startup_report:
    description:
      - Also return the numbers vLLM printed while starting (the vllm_startup_report filter's dict, read from the
        first O(startup_lines) journal lines of the unit's current invocation), with the invocation and its start
        time, for the calibration store.
    type: bool
    default: false
  startup_lines: {description: journal lines of the invocation read for the startup report, type: int, default: 5000}
author: vllm-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Wait for vLLM
  vllm_fleet.fleet.vllm_ready:
    unit: vllm@main.service
    port: 8000
    model: Qwen/Qwen3-8B
    api_key: "{{ vllm_api_key }}"
"""

RETURN = r"""
seconds: {description: seconds waited, type: float, returned: always}
ready: {description: whether the instance served a completion (false only without fail_on_timeout), type: bool,
        returned: always}
last: {description: "the last check, when not ready (e.g. /health answered 503)", type: str, returned: when not ready}
restarts: {description: the unit's NRestarts, type: int, returned: always}
start_to_ready:
  description: seconds from the server process's start to the unit becoming active (/health 200), per systemd
  type: float
  returned: success
startup:
  description: what vLLM printed while starting (keys of the vllm_startup_report filter; missing lines are absent)
  type: dict
  returned: success and startup_report
phases:
  description: >-
    the start's phases in seconds, null where the start printed or measured nothing: weights_s, engine_init_s
    (profile, KV cache, warm-up), within it profile_s, compile_s (torch.compile) and graphs_s (CUDA graphs),
    other_s (the rest of start_to_ready: imports, process spawns, the API server) and first_completion_s (the first
    completion after /health 200)
  type: dict
  returned: success and startup_report
invocation_id: {description: the unit's InvocationID (one per start), type: str, returned: success and startup_report}
started_at: {description: "the server process's start, as systemd prints it (ExecMainStartTimestamp)", type: str,
             returned: success and startup_report}
diagnosis: {description: "kind, summary and advice of the failure found in the journal", type: dict,
            returned: failure}
journal: {description: last journal lines, type: list, returned: failure}
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_diagnosis import diagnose
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_http import http
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_log import start_phases, startup_report
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_systemd import journal_command, parse_show, show_command


def unit_state(module, unit):
    _rc, out, _err = module.run_command(show_command(unit, (
        "ActiveState", "SubState", "Result", "NRestarts", "ExecMainStatus", "ExecMainStartTimestampMonotonic",
        "ActiveEnterTimestampMonotonic", "InvocationID", "ExecMainStartTimestamp")))
    return parse_show(out)


# head stops journalctl at the lines it needs (SIGPIPE): an invocation's journal can hold days of serving logs.
FIRST_LINES = 'n=$1; shift; "$@" 2>/dev/null | head -n "$n"'


def first_lines(module, invocation, count):
    """The first `count` journal lines of one invocation of a unit: the startup, not days of serving logs."""
    _rc, out, _err = module.run_command(["sh", "-c", FIRST_LINES, "sh", str(int(count))]
                                        + journal_command(invocation=invocation, output="cat"))
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            unit=dict(type="str", required=True),
            port=dict(type="int", required=True),
            model=dict(type="str", required=True),
            api_key=dict(type="str", default="", no_log=True),
            timeout=dict(type="int", default=900),
            progress_every=dict(type="int", default=30),
            fail_on_timeout=dict(type="bool", default=True),
            journal_lines=dict(type="int", default=40),
            startup_report=dict(type="bool", default=False),
            startup_lines=dict(type="int", default=5000),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if module.check_mode:
        module.exit_json(changed=False, ready=True, seconds=0.0, restarts=0)
    base = "http://127.0.0.1:%d" % p["port"]
    start = time.monotonic()
    last = "not checked yet"
    state = {}
    first_completion = None  # seconds the first completion took once /health said 200
    while time.monotonic() - start < p["timeout"]:
        state = unit_state(module, p["unit"])
        if state.get("ActiveState") == "failed" or (
                state.get("ActiveState") == "inactive" and state.get("SubState") == "dead"):
            last = "unit %s is %s (result %s)" % (p["unit"], state.get("ActiveState"), state.get("Result"))
            break
        status, body = http(base + "/health", timeout=5)
        if status == 200:
            asked = time.monotonic()
            status, body = http(base + "/v1/completions", {"model": p["model"], "prompt": "ping", "max_tokens": 1},
                                api_key=p["api_key"], timeout=60)
            if status == 200 and first_completion is None:
                first_completion = round(time.monotonic() - asked, 2)
            # Active: the unit's ExecStartPost saw /health 200 too, so systemd's timestamps are final.
            if status == 200 and '"choices"' in body and state.get("ActiveState") == "active":
                started = int(state.get("ExecMainStartTimestampMonotonic") or 0)
                active = int(state.get("ActiveEnterTimestampMonotonic") or 0)
                result = dict(changed=False, ready=True, seconds=round(time.monotonic() - start, 1),
                              restarts=int(state.get("NRestarts", 0) or 0),
                              start_to_ready=round((active - started) / 1e6, 2) if active > started > 0 else None)
                if p["startup_report"] and state.get("InvocationID"):
                    report = startup_report(first_lines(module, state["InvocationID"], p["startup_lines"]))
                    result.update(startup=report, phases=start_phases(report, result["start_to_ready"],
                                                                      first_completion),
                                  invocation_id=state["InvocationID"], started_at=state.get("ExecMainStartTimestamp"))
                module.exit_json(**result)
            last = "completion answered %s: %s" % (status, body[:300])
        else:
            last = "/health answered %s" % (status if status is not None else body)
        time.sleep(1)  # a poll is a local GET and a systemctl show: cheap, and a second less per start
    else:
        if not p["fail_on_timeout"]:
            module.exit_json(changed=False, ready=False, last=last, seconds=round(time.monotonic() - start, 1),
                             restarts=int(state.get("NRestarts", 0) or 0), unit_state=state)
        last = "not ready after %ds; last check: %s" % (p["timeout"], last)
    # Diagnose from a long tail: after restarts the telling line sits above many traceback lines.
    _rc, journal, _err = module.run_command(journal_command(p["unit"], lines=2000, output="cat"))
    found = diagnose(journal)
    journal = "\n".join(journal.splitlines()[-p["journal_lines"]:])
    module.fail_json(
        msg="%s on port %d is not ready: %s. %s %s" % (p["unit"], p["port"], last, found["summary"], found["advice"]),
        seconds=round(time.monotonic() - start, 1), restarts=int(state.get("NRestarts", 0) or 0),
        diagnosis=found, journal=journal.splitlines(), unit_state=state)


if __name__ == "__main__":
    main()
