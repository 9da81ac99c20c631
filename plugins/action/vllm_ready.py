# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wait until a vLLM instance serves a completion, saying while it waits what for, for how long and the limit
(documentation: library/vllm_ready.py, the module that waits on the host).

A start takes minutes on a large model (weights, profiling, compilation, CUDA graphs) and a module prints nothing
until it returns: the roll looked hung for up to vllm_ready_timeout. This action runs the module a slice of the wait
at a time (progress_every seconds) and prints a line between slices; the last slice fails with the diagnosis.
"""
from __future__ import annotations

import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


def progress_line(host, args, waited, limit, last, unit_state):
    """One line while waiting: what for, how long so far, the limit, and what the last check saw."""
    state = "/".join(filter(None, (unit_state.get("ActiveState"), unit_state.get("SubState"))))
    return "%s: waiting for %s (port %s) to serve a completion: %d s so far, at most %d s; unit %s, %s" % (
        host, args["unit"], args["port"], waited, limit, state or "unknown", last)


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        total, every = int(args.get("timeout", 900)), int(args.get("progress_every", 30))
        host = task_vars["inventory_hostname"]
        started = time.monotonic()
        while True:
            left = total - (time.monotonic() - started)
            final = every <= 0 or left <= every
            args.update(timeout=max(int(left + 0.5), 1) if final else every, fail_on_timeout=final)
            step = self._execute_module(module_name="vllm_fleet.fleet.vllm_ready", module_args=args,
                                        task_vars=task_vars)
            if step.get("failed") or step.get("ready", True) or final:
                break
            display.display(progress_line(host, args, time.monotonic() - started, total, step.get("last", ""),
                                          step.get("unit_state") or {}))
        step["seconds"] = round(time.monotonic() - started, 1)
        result.update(step)
        return result
