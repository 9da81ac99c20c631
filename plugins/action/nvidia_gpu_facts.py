# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nvidia_gpu_facts on the controller (documentation: library/nvidia_gpu_facts.py).

GPUs declared in the inventory are validated here, without contacting the host: planning a fleet from the inventory
used to delegate the module to localhost, and a delegated task costs Ansible the delegated host's variables for
each host (0.22 s a host at 200 hosts, most of playbooks/plan.yml's time). Otherwise the module runs on the host and
queries nvidia-smi. Either way, the number of GPUs is checked against expected_count here.
"""
from __future__ import annotations

import re

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# The keys of a GPU in the nvidia_gpus facts (the module's GPU_KEYS; a unit test holds the two equal), and count.
GPU_KEYS = ("index", "name", "uuid", "memory_total_mib", "memory_used_mib", "driver_version", "compute_capability",
            "mig_mode", "minor_number")
DECLARED_KEYS = set(GPU_KEYS) | {"count"}
MIG_MODES = {"enabled": "Enabled", "disabled": "Disabled"}
_CC_RE = re.compile(r"^\d+\.\d+$")
ARGUMENT_SPEC = {
    "nvidia_smi_path": {"type": "str", "default": "nvidia-smi"},
    "query_processes": {"type": "bool", "default": True},
    "declared": {"type": "list", "elements": "dict", "default": []},
    "expected_count": {"type": "int", "default": 0},
}


def normalize_declared(declared):
    """Validate GPUs declared in the inventory and return them in the nvidia_gpus shape."""
    if not isinstance(declared, list):
        raise ValueError("declared must be a list of GPU dicts, got %s" % type(declared).__name__)
    gpus = []
    for position, item in enumerate(declared):
        where = "declared[%d]" % position
        if not isinstance(item, dict):
            raise ValueError("%s must be a dict, got %r" % (where, item))
        unknown = sorted(set(item) - DECLARED_KEYS)
        if unknown:
            raise ValueError("%s has unknown keys %s (allowed: %s)" % (where, unknown, sorted(DECLARED_KEYS)))
        missing = [key for key in ("name", "memory_total_mib", "compute_capability") if item.get(key) is None]
        if missing:
            raise ValueError("%s lacks %s" % (where, ", ".join(missing)))
        count = item.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError("%s: count must be an integer >= 1, got %r" % (where, count))
        if count > 1 and (item.get("uuid") is not None or item.get("index") is not None):
            raise ValueError("%s: count cannot be combined with uuid or index" % where)
        cc = str(item["compute_capability"])
        if not _CC_RE.match(cc):
            raise ValueError(
                "%s: compute_capability must look like \"8.6\", got %r" % (where, item["compute_capability"])
            )
        mig = item.get("mig_mode", "Disabled")
        if mig is not None:
            mig = MIG_MODES.get(str(mig).lower())
            if mig is None:
                raise ValueError("%s: mig_mode must be Enabled, Disabled or null, got %r" % (where, item["mig_mode"]))
        for _copy in range(count):
            gpus.append(
                {
                    "index": _declared_int(item.get("index", len(gpus)), where, "index", nullable=False),
                    "name": str(item["name"]),
                    "uuid": None if item.get("uuid") is None else str(item["uuid"]),
                    "memory_total_mib": _declared_int(item["memory_total_mib"], where, "memory_total_mib"),
                    "memory_used_mib": _declared_int(item.get("memory_used_mib"), where, "memory_used_mib"),
                    "driver_version": None if item.get("driver_version") is None else str(item["driver_version"]),
                    "compute_capability": cc,
                    "mig_mode": mig,
                    "minor_number": _declared_int(item.get("minor_number"), where, "minor_number"),
                }
            )
    gpus.sort(key=lambda gpu: gpu["index"])
    indexes = [gpu["index"] for gpu in gpus]
    if len(set(indexes)) != len(indexes):
        raise ValueError("declared GPUs have duplicate indexes: %s" % indexes)
    return gpus


def _declared_int(value, where, key, nullable=True):
    if value is None and nullable:
        return None
    if isinstance(value, bool):
        raise ValueError("%s: %s must be an integer, got %r" % (where, key, value))
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError("%s: %s must be an integer, got %r" % (where, key, value))
    if number < 0:
        raise ValueError("%s: %s must not be negative, got %r" % (where, key, value))
    return number


def count_message(host, gpus, expected):
    """Why a host with another number of GPUs than expected fails, or None."""
    if expected <= 0 or len(gpus) == expected:
        return None
    return "%s has %d GPU(s), nvidia_gpu_expected_count is %d: %s." % (
        host, len(gpus), expected, ", ".join(gpu["name"] for gpu in gpus) or "none")


class ActionModule(ActionBase):
    """Declared GPUs here, nvidia-smi's through the module on the host; the count checked for both."""

    _supports_check_mode = True
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        if args["declared"]:
            try:
                gpus = normalize_declared(args["declared"])
            except ValueError as exc:
                raise AnsibleActionFail("nvidia_gpu_declared is invalid: %s" % exc) from None
            result.update(changed=False, source="declared", nvidia_smi=None,
                          ansible_facts={"nvidia_gpus": gpus, "nvidia_gpu_processes": []})
        else:
            result.update(self._execute_module(
                module_name="vllm_fleet.fleet.nvidia_gpu_facts", task_vars=task_vars,
                module_args={"nvidia_smi_path": args["nvidia_smi_path"], "query_processes": args["query_processes"]}))
            if result.get("failed"):
                return result
        message = count_message(task_vars["inventory_hostname"], result["ansible_facts"]["nvidia_gpus"],
                                args["expected_count"])
        if message:
            result.update(failed=True, msg=message)
        return result
