#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# MIT License (see the project's LICENSE)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: nvidia_gpu_facts
short_description: Report a host's NVIDIA GPUs and the compute processes using them
description:
  - Runs C(nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,driver_version,compute_cap,
    mig.mode.current,minor_number --format=csv,noheader,nounits) and C(nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory
    --format=csv,noheader,nounits) and returns the result as the facts C(nvidia_gpus) and C(nvidia_gpu_processes)
    (shapes in C(docs/interfaces.md)).
  - Values nvidia-smi reports as unavailable (C([N/A]), C([Not Supported]), any other bracketed status) become C(null).
  - nvidia-smi does not quote its CSV output. A name that contains C(, ) is still read correctly because every
    other column has a fixed shape.
  - With O(declared), nvidia-smi is not run at all and the given GPUs are validated and returned instead, on the
    controller (the action plugin of the same name), so a fleet is planned without touching its hosts.
  - With O(expected_count), a host with another number of GPUs fails the task (a GPU fell off the bus).
  - Never changes anything on the host.
version_added: "1.0.0"
author:
  - vllm-fleet maintainers (!UNKNOWN)
options:
  nvidia_smi_path:
    description:
      - Name or path of the nvidia-smi binary. A bare name is looked up in E(PATH) and the usual system directories.
    type: str
    default: nvidia-smi
  query_processes:
    description:
      - Also list the compute processes. When V(false), RV(ansible_facts.nvidia_gpu_processes) is an empty list.
    type: bool
    default: true
  declared:
    description:
      - GPUs to report instead of querying nvidia-smi.
      - Each item needs C(name), C(memory_total_mib) and C(compute_capability). C(index) defaults to the position in
        the list, C(uuid), C(memory_used_mib) and C(driver_version) to C(null), C(mig_mode) to C(Disabled).
      - An item may carry C(count) to stand for that many identical GPUs (indexes assigned in order).
      - Unknown keys are an error, so a misspelt key does not silently disappear.
    type: list
    elements: dict
    default: []
  expected_count:
    description:
      - Number of GPUs the host must have; V(0) skips the check.
    type: int
    default: 0
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: full
    details: The action plugin handles O(declared) and O(expected_count) on the controller.
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
    support: full
notes:
  - Set a task-level C(timeout) if a wedged GPU may make nvidia-smi hang.
"""

EXAMPLES = r"""
- name: Read the GPUs of the host, which must have 8
  vllm_fleet.fleet.nvidia_gpu_facts:
    expected_count: 8

- name: Use a stand-in nvidia-smi on a test host without a GPU
  vllm_fleet.fleet.nvidia_gpu_facts:
    nvidia_smi_path: /usr/local/bin/nvidia-smi

- name: Plan from the controller with GPUs declared in the inventory
  vllm_fleet.fleet.nvidia_gpu_facts:
    declared:
      - name: NVIDIA H100 80GB HBM3
        memory_total_mib: 81559
        compute_capability: "9.0"
        count: 8

- name: Show the first GPU
  ansible.builtin.debug:
    msg: "{{ ansible_facts.nvidia_gpus[0].name }} with {{ ansible_facts.nvidia_gpus[0].memory_total_mib }} MiB"
"""

RETURN = r"""
ansible_facts:
  description: GPU facts.
  returned: always
  type: dict
  contains:
    nvidia_gpus:
      description: One dict per GPU, sorted by index.
      returned: always
      type: list
      elements: dict
      contains:
        index:
          description: nvidia-smi C(index).
          type: int
        name:
          description: Product name, e.g. C(NVIDIA A10G).
          type: str
        uuid:
          description: C(GPU-...) identifier; null only for declared GPUs that did not give one.
          type: str
        memory_total_mib:
          description: C(memory.total) in MiB, null when nvidia-smi reports it unavailable.
          type: int
        memory_used_mib:
          description: C(memory.used) in MiB, null when unavailable (e.g. MIG, vGPU).
          type: int
        driver_version:
          description: Loaded kernel driver version, e.g. C(550.144.03).
          type: str
        compute_capability:
          description: C(compute_cap) as C(major.minor), e.g. C(8.6).
          type: str
        mig_mode:
          description: C(Enabled), C(Disabled) or null when the GPU has no MIG support.
          type: str
        minor_number:
          description:
            - Minor number of the GPU's device node C(/dev/nvidia<minor>); not always equal to the index. Null when
              nvidia-smi reports it unavailable, and for declared GPUs that do not give it.
          type: int
      sample:
        - index: 0
          name: NVIDIA A10G
          uuid: GPU-5e8f3f2a-2b8e-4c2e-9a43-0c1e6a7b9d01
          memory_total_mib: 23028
          memory_used_mib: 1
          driver_version: 550.144.03
          compute_capability: "8.6"
          mig_mode: null
          minor_number: 0
    nvidia_gpu_processes:
      description: Compute processes, in nvidia-smi's order.
      returned: always
      type: list
      elements: dict
      contains:
        gpu_uuid:
          description: UUID of the GPU the process uses.
          type: str
        pid:
          description: Process id (in the host's pid namespace).
          type: int
        process_name:
          description: Process name, null when nvidia-smi cannot read it.
          type: str
        used_memory_mib:
          description: GPU memory used by the process in MiB, null when unavailable.
          type: int
      sample:
        - gpu_uuid: GPU-5e8f3f2a-2b8e-4c2e-9a43-0c1e6a7b9d01
          pid: 4242
          process_name: /opt/vllm/venv/bin/python3
          used_memory_mib: 20480
source:
  description: Where the facts came from, C(nvidia-smi) or C(declared).
  returned: always
  type: str
nvidia_smi:
  description: Resolved path of the nvidia-smi that was run, null with O(declared).
  returned: always
  type: str
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.nvidia_smi import (
    NvidiaSmiParseError, data_lines, is_unavailable, split_row)

# Column order is part of the interface: the parsers below rely on it.
GPU_QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "memory.total",
    "memory.used",
    "driver_version",
    "compute_cap",
    "mig.mode.current",
    # /dev/nvidia<minor> is the GPU's device node; the minor is not always its index (DeviceAllow needs it).
    "minor_number",
)
PROCESS_QUERY_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
CSV_FORMAT = "--format=csv,noheader,nounits"

GPU_KEYS = (
    "index",
    "name",
    "uuid",
    "memory_total_mib",
    "memory_used_mib",
    "driver_version",
    "compute_capability",
    "mig_mode",
    "minor_number",
)
PROCESS_KEYS = ("gpu_uuid", "pid", "process_name", "used_memory_mib")
MIG_MODES = {"enabled": "Enabled", "disabled": "Disabled"}

# nvidia-smi exit statuses worth explaining (from its man page, "RETURN VALUE").
RC_HINTS = {
    2: "nvidia-smi rejected its arguments; this nvidia-smi may be too old for one of the queried fields",
    4: "the user running nvidia-smi may not access the GPUs",
    6: "no GPU was found: check that the GPUs are visible on the PCI bus (lspci) and not excluded",
    9: (
        "the NVIDIA kernel driver is not loaded: reboot after installing it, check that nouveau is blacklisted, "
        "that DKMS built the module for the running kernel (dkms status) and that Secure Boot did not reject it "
        "(dmesg)"
    ),
    12: "the NVML library was not found: the driver's user-space packages are incomplete",
    15: "a GPU has fallen off the bus: the host needs a reset or hardware check",
    18: "driver/library version mismatch: the driver packages changed since boot, reboot the host",
}

_MIB_RE = re.compile(r"^(\d+)(?:\s*MiB)?$")
_CC_RE = re.compile(r"^\d+\.\d+$")
NO_PROCESSES_LINES = ("no running processes found",)


def _int(value, what, line, nullable):
    if is_unavailable(value):
        if nullable:
            return None
        raise NvidiaSmiParseError("%s is unavailable (%r) in line %r" % (what, value, line))
    match = _MIB_RE.match(value)
    if not match:
        raise NvidiaSmiParseError("%s is not an integer: %r in line %r" % (what, value, line))
    return int(match.group(1))


def _str(value, what, line, nullable):
    if is_unavailable(value):
        if nullable:
            return None
        raise NvidiaSmiParseError("%s is unavailable (%r) in line %r" % (what, value, line))
    return value


def parse_mig_mode(value, line=""):
    if is_unavailable(value):
        return None
    try:
        return MIG_MODES[value.strip().lower()]
    except KeyError:
        raise NvidiaSmiParseError("unexpected mig.mode.current %r in line %r" % (value, line))


def parse_compute_capability(value, line=""):
    if is_unavailable(value):
        return None
    if not _CC_RE.match(value):
        raise NvidiaSmiParseError("compute_cap is not major.minor: %r in line %r" % (value, line))
    return value


def parse_gpu_line(line):
    index, name, uuid, total, used, driver, cc, mig, minor = split_row(line, GPU_QUERY_FIELDS, free_field="name")
    return {
        "index": _int(index, "index", line, nullable=False),
        "name": _str(name, "name", line, nullable=False),
        "uuid": _str(uuid, "uuid", line, nullable=False),
        "memory_total_mib": _int(total, "memory.total", line, nullable=True),
        "memory_used_mib": _int(used, "memory.used", line, nullable=True),
        "driver_version": _str(driver, "driver_version", line, nullable=False),
        "compute_capability": parse_compute_capability(cc, line),
        "mig_mode": parse_mig_mode(mig, line),
        "minor_number": _int(minor, "minor_number", line, nullable=True),
    }


def parse_gpu_csv(text):
    """Facts for `nvidia-smi --query-gpu=<GPU_QUERY_FIELDS> --format=csv,noheader,nounits`, sorted by index."""
    gpus = [parse_gpu_line(line) for line in data_lines(text, GPU_QUERY_FIELDS)]
    gpus.sort(key=lambda gpu: gpu["index"])
    for key in ("index", "uuid"):
        values = [gpu[key] for gpu in gpus]
        duplicates = sorted(set(value for value in values if values.count(value) > 1))
        if duplicates:
            raise NvidiaSmiParseError("duplicate GPU %s in nvidia-smi output: %s" % (key, duplicates))
    return gpus


def parse_process_line(line):
    gpu_uuid, pid, name, used = split_row(line, PROCESS_QUERY_FIELDS, free_field="process_name")
    return {
        "gpu_uuid": _str(gpu_uuid, "gpu_uuid", line, nullable=False),
        "pid": _int(pid, "pid", line, nullable=False),
        "process_name": _str(name, "process_name", line, nullable=True),
        "used_memory_mib": _int(used, "used_memory", line, nullable=True),
    }


def parse_process_csv(text):
    """Facts for `nvidia-smi --query-compute-apps=<PROCESS_QUERY_FIELDS> --format=csv,noheader,nounits`."""
    return [
        parse_process_line(line)
        for line in data_lines(text, PROCESS_QUERY_FIELDS)
        if line.lower() not in NO_PROCESSES_LINES
    ]


def gpu_query_command(nvidia_smi):
    return [nvidia_smi, "--query-gpu=" + ",".join(GPU_QUERY_FIELDS), CSV_FORMAT]


def process_query_command(nvidia_smi):
    return [nvidia_smi, "--query-compute-apps=" + ",".join(PROCESS_QUERY_FIELDS), CSV_FORMAT]


def resolve_nvidia_smi(module, name):
    if os.sep in name:
        if os.path.isfile(name) and os.access(name, os.X_OK):
            return name
        return None
    return module.get_bin_path(name, required=False, opt_dirs=["/usr/bin", "/usr/sbin", "/usr/local/bin"])


def not_installed_message(name):
    return (
        "nvidia-smi not found (looked for %r): the NVIDIA driver is not installed on this host. "
        "Install it (role nvidia_gpu with nvidia_gpu_install_driver: true), point nvidia_gpu_nvidia_smi_path "
        "(module option nvidia_smi_path) at the binary, or declare the GPUs with nvidia_gpu_declared." % name
    )


def failure_message(cmd, rc, stdout, stderr):
    # nvidia-smi prints its errors on stdout.
    output = " ".join((stdout.strip() + " " + stderr.strip()).split()) or "(no output)"
    message = "%s failed with exit code %s: %s" % (" ".join(cmd), rc, output)
    if rc in RC_HINTS:
        message += " (%s)" % RC_HINTS[rc]
    return message


def run_query(module, cmd):
    rc, stdout, stderr = module.run_command(cmd, environ_update={"LC_ALL": "C"})
    if rc != 0:
        module.fail_json(
            msg=failure_message(cmd, rc, stdout, stderr), rc=rc, cmd=cmd, stdout=stdout, stderr=stderr
        )
    return stdout


def parse_or_fail(module, parser, cmd):
    stdout = run_query(module, cmd)
    try:
        return parser(stdout)
    except NvidiaSmiParseError as exc:
        module.fail_json(msg="cannot read the output of %s: %s" % (" ".join(cmd), exc), cmd=cmd, stdout=stdout)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi_path=dict(type="str", default="nvidia-smi"),
            query_processes=dict(type="bool", default=True),
            declared=dict(type="list", elements="dict", default=[]),
            expected_count=dict(type="int", default=0),
        ),
        supports_check_mode=True,
    )
    # The action plugin of the same name handles these on the controller and never passes them on: declared GPUs
    # must not reach a host, where nvidia-smi would be queried instead.
    if module.params["declared"] or module.params["expected_count"]:
        module.fail_json(msg="declared and expected_count are read on the controller by the action of the same name "
                             "(vllm_fleet.fleet.nvidia_gpu_facts); this module ran without it")

    name = module.params["nvidia_smi_path"]
    nvidia_smi = resolve_nvidia_smi(module, name)
    if nvidia_smi is None:
        module.fail_json(msg=not_installed_message(name))

    gpus = parse_or_fail(module, parse_gpu_csv, gpu_query_command(nvidia_smi))
    processes = []
    if module.params["query_processes"]:
        processes = parse_or_fail(module, parse_process_csv, process_query_command(nvidia_smi))

    module.exit_json(
        changed=False,
        source="nvidia-smi",
        nvidia_smi=nvidia_smi,
        ansible_facts=dict(nvidia_gpus=gpus, nvidia_gpu_processes=processes),
    )


if __name__ == "__main__":
    main()
