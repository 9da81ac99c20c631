# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Record one host's roll in the run's directory, or assemble the run's report.json and its per-host table, on the
controller (documentation: library/roll_report.py).

An action, not a template delegated to localhost and a loop over every record on every host: that was a delegated
task per host and a read of every earlier host's record by every host (quadratic), seconds a host at fleet scale.
Here a host's record is one file written in the run's own process, and the report is assembled once, at the end.
"""
from __future__ import annotations

import glob
import json
import os
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# The report's per-host columns: (heading, record key).
COLUMNS = (("drain", "drain_wait_s"), ("stop", "stop_s"), ("start->ready", "start_to_ready_s"),
           ("vLLM own", "vllm_start_to_ready_s"), ("enable", "enable_s"), ("total", "total_s"),
           ("overhead", "overhead_s"))
# vLLM's start per instance (the vllm_ready module's phases): (heading, key).
PHASE_COLUMNS = (("weights", "weights_s"), ("engine init", "engine_init_s"), ("profile", "profile_s"),
                 ("compile", "compile_s"), ("graphs", "graphs_s"), ("other", "other_s"),
                 ("1st reply", "first_completion_s"))


def host_record(host, outcome, error, events, start_to_ready, resumed, prefetch=None, phases=None):
    """One host's record: the time between its steps (events: [{time, host, state}], the last of a state counts),
    vLLM's own start-to-ready (the slowest instance's, from systemd; None when no instance reached it), the
    overhead: everything the roll added around that restart, and each instance's start phases (instance -> the
    vllm_ready module's phases)."""
    at = {}
    for event in events:
        at[event["state"]] = float(event["time"])
    if "start" not in at:
        raise ValueError("%s: the events have no start" % host)

    def span(first, last):
        return round(at[last] - at[first], 2) if first in at and last in at else None

    own = [value for value in start_to_ready if isinstance(value, (int, float)) and not isinstance(value, bool)]
    vllm = max(own) if own else None
    total = at.get("enabled", at.get("failed", at["start"])) - at["start"]
    return {"host": host, "outcome": outcome, "error": error,
            "drain_wait_s": span("start", "drained"), "stop_s": span("drained", "stopped"),
            "start_to_ready_s": span("stopped", "ready"), "enable_s": span("ready", "enabled"),
            "total_s": round(total, 2),
            "vllm_start_to_ready_s": round(vllm, 2) if vllm is not None else None,
            "overhead_s": round(total - vllm, 2) if vllm is not None else None,
            "resumed": resumed, "prefetch": prefetch, "start_phases": phases or {}, "events": events}


def write(path, document):
    """Write a JSON document atomically (a temporary file renamed over it), mode 0600."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(document, indent=4, sort_keys=True) + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def assemble(run_dir):
    """The run's report from every host's record in <run_dir>/hosts: outcome, hosts by name, events in time order."""
    records = []
    for path in sorted(glob.glob(os.path.join(run_dir, "hosts", "*.json"))):
        with open(path, encoding="utf-8") as handle:
            records.append(json.load(handle))
    return {"run_id": os.path.basename(os.path.normpath(run_dir)),
            "outcome": "failed" if any(r["outcome"] == "failed" for r in records) else "ok",
            "hosts": {r["host"]: r for r in records},
            "events": sorted((e for r in records for e in r["events"]), key=lambda e: float(e["time"]))}


def table(report):
    """The per-host table an operator reads at the end of the roll (seconds), then one line for the run."""
    def cell(value):
        return "-" if value is None else "%.1fs" % value

    width = max([4] + [len(host) for host in report["hosts"]])
    lines = ["%-*s %-7s " % (width, "host", "outcome") + " ".join("%12s" % heading for heading, _key in COLUMNS)]
    for host, record in sorted(report["hosts"].items()):
        lines.append("%-*s %-7s " % (width, host, record["outcome"])
                     + " ".join("%12s" % cell(record[key]) for _heading, key in COLUMNS))
    times = [float(e["time"]) for e in report["events"]]
    lines.append("%d host(s), outcome %s, %.1f s from the first host's start to the last step"
                 % (len(report["hosts"]), report["outcome"], (max(times) - min(times)) if times else 0.0))
    starts = [("%s/%s" % (host, instance), phases) for host, record in sorted(report["hosts"].items())
              for instance, phases in sorted(record.get("start_phases", {}).items())]
    if starts:
        width = max(len(name) for name, _phases in starts)
        lines.append("vLLM's start (seconds, from its log; other: imports, processes, the API server):")
        lines.append("%-*s " % (width, "instance") + " ".join("%11s" % heading for heading, _key in PHASE_COLUMNS))
        lines.extend("%-*s " % (width, name)
                     + " ".join("%11s" % cell(phases.get(key)) for _heading, key in PHASE_COLUMNS)
                     for name, phases in starts)
    return lines


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("run_dir", "host", "outcome", "error", "events", "start_to_ready", "resumed",
                             "prefetch", "phases", "assemble"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        run_dir = args.get("run_dir")
        if not run_dir or not isinstance(run_dir, str) or not os.path.isdir(os.path.join(run_dir, "hosts")):
            raise AnsibleActionFail("roll_report: run_dir must be a run's directory with hosts/ in it (tasks/run_dir.yml"
                                    " makes it), got %r" % (run_dir,))
        if self._task.check_mode:
            result["skipped"], result["msg"] = True, "check mode rolls nothing, so there is nothing to report"
            return result
        if args.get("assemble"):
            report = assemble(run_dir)
            result["path"] = os.path.join(run_dir, "report.json")
            write(result["path"], report)
            result.update(changed=True, outcome=report["outcome"], table=table(report))
            # The same table beside the report, for whoever reads the run afterwards (make demo prints it).
            with open(os.path.join(run_dir, "table.txt"), "w", encoding="utf-8") as handle:
                handle.write("\n".join(result["table"]) + "\n")
            return result
        host = args.get("host")
        if not host or not isinstance(host, str) or "/" in host or host.startswith("."):
            raise AnsibleActionFail("roll_report: host must be an inventory hostname, got %r" % (host,))
        if args.get("outcome") not in ("ok", "failed", "running"):
            raise AnsibleActionFail("roll_report: %s: outcome must be ok, failed or running, got %r"
                                    % (host, args.get("outcome")))
        events, start_to_ready = args.get("events"), args.get("start_to_ready") or []
        if not isinstance(events, list) or not all(isinstance(e, dict) and {"time", "state"} <= set(e)
                                                   for e in events):
            raise AnsibleActionFail("roll_report: %s: events must be a list of {time, host, state}" % host)
        phases = args.get("phases") or {}
        if not isinstance(phases, dict) or not all(isinstance(p, dict) for p in phases.values()):
            raise AnsibleActionFail("roll_report: %s: phases must map each instance to its phases" % host)
        try:
            record = host_record(host, args["outcome"], args.get("error") or "", events, start_to_ready,
                                 args.get("resumed"), args.get("prefetch"), phases)
        except (TypeError, ValueError) as exc:
            raise AnsibleActionFail("roll_report: %s" % exc) from exc
        result["path"] = os.path.join(run_dir, "hosts", host + ".json")
        write(result["path"], record)
        result.update(changed=True, record=record)
        return result
