# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Plan every instance of a host with the vllm_sizing filter, on the controller (documentation:
plugins/modules/vllm_plan.py).

An action, not tasks: the plan was four tasks per host (the serve-options check, config.json, the plan, the plan again
with the calibration store), each paying Ansible's per-host cost and Jinja's, which made playbooks/plan.yml 18 times
Ansible's floor at 200 hosts. The arithmetic stays in the sizing package the filters use (plugin_utils/vllm_sizing), one
call per instance; the host is contacted only to read config.json of a model directory.
"""
from __future__ import annotations

import base64
import json
import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.vllm_fleet.fleet.plugins.plugin_utils.vllm_sizing.calibration import (
    calibration_key, key_prefix)
from ansible_collections.vllm_fleet.fleet.plugins.plugin_utils.vllm_sizing.flags import vllm_serve_args
from ansible_collections.vllm_fleet.fleet.plugins.plugin_utils.vllm_sizing.inputs import group_name
from ansible_collections.vllm_fleet.fleet.plugins.plugin_utils.vllm_sizing.plan import vllm_sizing
from ansible_collections.vllm_fleet.fleet.plugins.plugin_utils.vllm_sizing.shape import vllm_model

ARGUMENT_SPEC = {
    "gpus": {"type": "list", "elements": "dict", "required": True},
    "instances": {"type": "list", "elements": "dict", "required": True},
    "model": {"type": "str", "default": ""},
    "model_dir": {"type": "str", "default": ""},
    "model_config": {"type": "dict", "default": {}},
    "model_path": {"type": "str", "required": True},
    "workload": {"type": "dict", "default": {}},
    "policy": {"type": "dict", "default": {}},
    "serve_options": {"type": "dict", "default": {}},
    "serve_options_owned": {"type": "dict", "default": {}},
    "version": {"type": "str", "required": True},
    "strict": {"type": "bool", "default": True},
    "calibration_dir": {"type": "str", "default": ""},
    "running": {"type": "dict", "default": {}},
}


def clash_message(host, serve_options, owned):
    """Why serve_options may not set an argument the role sets from its own variable, or None."""
    clash = [key for key in serve_options if key in owned]
    if not clash:
        return None
    return "%s: vllm_serve_options sets %s" % (
        host, ", ".join("%s (set %s instead)" % (key, owned[key]) for key in clash))


def store_entries(directory, prefix, host, instance):
    """The calibration store's entries the sizing may plan an instance with: for every configuration of its GPU type
    and model (under prefix), this host's and instance's own entry, else the first of another host. Returns (starts,
    load tests), lists of paths. The sizing uses each entry for its own configuration (its key), so a plan that moves
    on to another configuration (a fallback) finds that one's measurements too."""
    starts, loadtests = [], []
    for path, dirs, files in sorted(os.walk(os.path.join(directory, prefix))):
        dirs.sort()
        names = sorted(name for name in files if name.endswith(".json"))
        if names:
            own = "%s-%s.json" % (host, instance)
            (loadtests if os.path.basename(path) == "loadtest" else starts).append(
                os.path.join(path, own if own in names else names[0]))
    return starts, loadtests


def hold_back(plans, running, runs_as):
    """After a start, the plans to keep and the ones to apply later: a plan that would run an instance differently
    (runs_as: its command line and environment) from the plan it was started with waits for the next apply, which
    writes it with the unit's drop-in. Until then the instance's plan (the file on the host, the load test's
    concurrency, the next start's calibration key) stays the one it runs. Returns (plans, {instance: later plan})."""
    kept, later = dict(plans), {}
    for name, started in running.items():
        if name in plans and runs_as(plans[name]) != runs_as(started):
            kept[name], later[name] = started, plans[name]
    return kept, later


def read_entry(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError) as exc:
        raise AnsibleActionFail("cannot read the calibration store's entry %s: %s" % (path, exc)) from None


class ActionModule(ActionBase):
    """One plan per instance; read-only."""

    _supports_check_mode = True
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def _model_config(self, args, task_vars):
        """config.json as a dict: given, read from the model directory on the host, or from the filter's catalog."""
        if args["model_config"]:
            return args["model_config"]
        if not args["model_dir"]:
            return vllm_model(args["model"])
        path = os.path.join(args["model_dir"], "config.json")
        read = self._execute_module(module_name="ansible.builtin.slurp", module_args={"src": path},
                                    task_vars=task_vars)
        if read.get("failed"):
            raise AnsibleActionFail("%s: cannot read %s (vllm_model_dir): %s"
                                    % (task_vars["inventory_hostname"], path, read.get("msg")))
        try:
            return json.loads(base64.b64decode(read["content"]))
        except ValueError as exc:
            raise AnsibleActionFail("%s: %s (vllm_model_dir) is not JSON: %s"
                                    % (task_vars["inventory_hostname"], path, exc)) from None

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        host = task_vars["inventory_hostname"]
        message = clash_message(host, args["serve_options"], args["serve_options_owned"])
        if message:
            raise AnsibleActionFail(message)
        config = self._model_config(args, task_vars)

        plans, entries = {}, {}
        for instance in args["instances"]:
            gpus = [gpu for gpu in args["gpus"] if gpu["index"] in instance["gpus"]]
            found = ([], [])
            if args["calibration_dir"]:
                # What starts and load tests of this GPU type and model measured, for every configuration the plan
                # may run: the sizing takes the entry of the configuration it chooses (one call per decision).
                prefix = key_prefix(group_name(gpus), args["model_path"])
                found = store_entries(args["calibration_dir"], prefix, host, instance["name"])
            policy = dict(args["policy"], host="%s (instance %s)" % (host, instance["name"]),
                          model=args["model_path"], vllm_version=args["version"],
                          serve_options=args["serve_options"], strict=args["strict"],
                          measured=[read_entry(path) for path in found[0]],
                          loadtest=[read_entry(path) for path in found[1]])
            plans[instance["name"]] = vllm_sizing(gpus, config, args["workload"], policy)
            # Report the entries of the configuration planned: the ones the plan could use.
            key = os.path.join(args["calibration_dir"], calibration_key(plans[instance["name"]]))
            used = [path for path in found[0] + found[1]
                    if os.path.dirname(path) in (key, os.path.join(key, "loadtest"))]
            if used:
                entries[instance["name"]] = used
        later = {}
        if args["running"]:  # after a start only: plan.yml and preflight pass none
            plans, later = hold_back(plans, args["running"], lambda p: (vllm_serve_args(p, {}), p.get("env")))
        result.update(changed=False, calibration_entries=entries,
                      ansible_facts={"vllm_plans": plans, "vllm_plans_later": later})
        return result
