# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The inputs of vllm_sizing checked once, at the door: workload, policy and GPU facts become clean values (types,
ranges, choices, defaults filled in). A misspelt key is refused with the accepted ones named, a string is never
taken for a boolean. The rest of the package trusts what these functions return.
"""

import dataclasses

from .budget import UTILIZATION
from .common import MiB, as_bool, as_dict, as_int, as_utilization, fail
from .kv import parse_capability

# key: (kind, default, description for messages). Kinds: int (>= 1), bytes (>= 0), bool, str, dict, fraction
# (common.as_utilization: 0 < x < 1), choice (a tuple of values), block (a positive int, the version's choices
# checked by kv_layout), entries (a dict or a list of dicts, given as a list).
WORKLOAD = {
    "p99_context": ("int", None, "tokens of the 99th-percentile request, prompt plus completion"),
    "peak_concurrency": ("int", None, "concurrent sequences at peak"),
    "max_context": ("int", None, "preferred max_model_len above p99_context"),
}
POLICY = {
    # Set by the role from its own variables (vllm_model..., vllm_version, vllm_serve_options, vllm_plan_strict).
    "host": ("str", None, "host name for messages"),
    "model": ("str", None, "what --model gets"),
    "vllm_version": ("str", None, "the vLLM release to plan for"),
    "serve_options": ("dict", None, "other engine arguments"),
    "strict": ("bool", True, "fail when nothing fits"),
    # The operator's policy (the vllm role's vllm_policy).
    "gpu_sharing": (tuple(UTILIZATION), "dedicated", "who else uses the GPUs"),
    "runtime_ooms": ("bool", False, "runtime OOMs were seen"),
    "gpu_memory_utilization": ("fraction", None, "explicit utilization"),
    "usable_memory_mib": ("int", None, "memory per GPU CUDA can use"),
    "max_model_len": ("int", None, "preferred max_model_len"),
    "min_model_len": ("int", 4096, "shortest max_model_len accepted without a p99_context"),
    "max_num_seqs": ("int", None, "max_num_seqs without a peak_concurrency"),
    "min_num_seqs": ("int", None, "lowest max_num_seqs before more tensor parallelism"),
    "max_num_batched_tokens": ("int", None, "tokens per scheduler step"),
    "kv_cache_dtype": ("str", "auto", "KV cache dtype to start from"),
    "allow_fp8_kv_cache": ("bool", True, "allow the fp8 KV cache fallback"),
    "tensor_parallel_size": ("int", 1, "tensor parallel size to start from"),
    "allow_tensor_parallel": ("bool", True, "allow raising tensor parallelism"),
    "pipeline_parallel_size": ("int", 1, "pipeline stages"),
    "nodes": ("int", 1, "hosts one instance spans, a replica group: gpus are all of theirs, as many on each"),
    "block_size": ("int", None, "KV block size"),
    "enforce_eager": ("bool", None, "CUDA graphs off"),
    "expandable_segments": ("bool", True, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
    "startup_plan": ("bool", True, "VLLM_ENABLE_STARTUP_PLAN=1 where the release has it"),
    "flashinfer_sampler": ("bool", True, "FlashInfer is installed (the release decides whether its sampler uses it)"),
    "activation_bytes": ("bytes", None, "measured activation peak per GPU"),
    "cuda_graph_bytes": ("bytes", None, "measured CUDA graph memory per GPU"),
    "non_torch_bytes": ("bytes", None, "measured non-torch memory per GPU"),
    "measured": ("entries", None, "calibration store entries (each used for its own configuration), or one "
                 "vllm_startup_report of the first configuration tried"),
    "loadtest": ("entries", None, "load-test entries of the calibration store (its loadtest/ directories)"),
}


def _value(kind, value, field):
    if kind == "int":
        return as_int(value, field)
    if kind == "bytes":
        return as_int(value, field, minimum=0)
    if kind == "bool":
        return as_bool(value, field)
    if kind == "str":
        if not isinstance(value, str) or not value:
            fail("%s must be a non-empty string, got %r" % (field, value))
        return value
    if kind == "dict":
        return as_dict(value, field)
    if kind == "entries":
        if isinstance(value, (list, tuple)):
            return [as_dict(entry, "%s[%d]" % (field, i)) for i, entry in enumerate(value)]
        return [as_dict(value, field)]
    if kind == "fraction":
        return as_utilization(value, field)
    if value not in kind:
        fail("%s must be one of %s, got %r" % (field, ", ".join(kind), value))
    return value


def _checked(value, spec, field):
    """A dict of spec's keys, each checked and defaulted (None: absent); unknown keys name the accepted ones."""
    given = as_dict(value, field)
    unknown = sorted(str(k) for k in given if k not in spec)
    if unknown:
        fail("%s: unknown key%s %s (accepted: %s)" % (field, "s" if len(unknown) > 1 else "", ", ".join(unknown),
                                                      ", ".join(spec)))
    return {key: default if given.get(key) is None else _value(kind, given[key], "%s.%s" % (field, key))
            for key, (kind, default, _doc) in spec.items()}


# The clear values the door returns: one attribute per key of the schema above, frozen (the plan code reads them,
# never changes them). tests/unit/test_input_schemas.py holds the filter's documentation and the vllm role's argument
# specs to the same keys, types and choices.
Workload = dataclasses.make_dataclass("Workload", list(WORKLOAD), frozen=True)
Policy = dataclasses.make_dataclass("Policy", list(POLICY), frozen=True)


def workload(value):
    """The workload dict of vllm_sizing, checked into a Workload."""
    return Workload(**_checked(value, WORKLOAD, "workload"))


def policy(value):
    """The policy dict of vllm_sizing, checked into a Policy (kv_cache_dtype and block_size against the version in
    kv_layout)."""
    return Policy(**_checked(value, POLICY, "policy"))


def group_name(gpus):
    """The name of a group of GPUs as plans and the calibration store's keys give it: "NVIDIA A10G", or the distinct
    names joined by " + "."""
    return " + ".join(sorted({str(gpu.get("name")) for gpu in gpus}))


def gpu_group(gpus, usable_override):
    """(name, count, usable bytes per GPU, smallest compute capability, warnings, smallest nvidia-smi total in MiB or
    None) of the GPU facts of one group. usable_override: policy.usable_memory_mib (None: from the smallest GPU's
    total)."""
    if not isinstance(gpus, list) or not gpus:
        fail("gpus must be a non-empty list of GPU facts (ansible_facts.nvidia_gpus), got %r" % (gpus,))
    totals, capabilities, warnings = [], [], []
    for i, fact in enumerate(gpus):
        field = "gpus[%d]" % i
        gpu = as_dict(fact, field)
        if not isinstance(gpu.get("name"), str) or not gpu["name"]:
            fail("%s.name must be the GPU's name, got %r" % (field, gpu.get("name")))
        if gpu.get("mig_mode") == "Enabled" and usable_override is None:
            # nvidia-smi lists the whole GPU's memory; vLLM runs on one MIG instance of it.
            fail("%s (%s) has MIG enabled: vLLM sees one MIG instance, not the whole GPU; set "
                 "policy.usable_memory_mib (the vllm role: vllm_policy.usable_memory_mib) to that instance's "
                 "memory" % (field, gpu["name"]))
        total = gpu.get("memory_total_mib")
        if total is None and usable_override is None:
            fail("%s.memory_total_mib is null (MIG or [N/A] from nvidia-smi): set policy.usable_memory_mib "
                 "to the memory vLLM may see on %s" % (field, gpu["name"]))
        if total is not None:
            totals.append(as_int(total, field + ".memory_total_mib"))
            used = gpu.get("memory_used_mib")
            if isinstance(used, int) and not isinstance(used, bool) and used > 1024:
                warnings.append("%s (%s) already has %d MiB in use: vLLM refuses to start when free memory is "
                                "below what it requests; stop the other process or lower the utilization"
                                % (field, gpu["name"], used))
        capabilities.append(parse_capability(gpu.get("compute_capability"), field + ".compute_capability"))
    names = sorted({gpu["name"] for gpu in gpus})
    if usable_override is not None and totals and usable_override > min(totals):
        # More memory than the GPU has would plan a KV cache vLLM never gets (a host that does not come back).
        fail("policy.usable_memory_mib %d is more than the %d MiB nvidia-smi reports for %s: set it at most to that "
             "(it is for MIG instances and GPUs whose total nvidia-smi does not report)"
             % (usable_override, min(totals), names[0] if len(names) == 1 else " / ".join(names)))
    if usable_override is not None:
        usable = usable_override * MiB
    else:
        # nvidia-smi's total is a few hundred MiB above what CUDA lets a process use (H100: 81559 MiB
        # listed, 79.2 GiB usable): budget from usable memory.
        smallest = min(totals)
        usable = (smallest - max(512, smallest // 100)) * MiB
    return group_name(gpus), len(gpus), usable, min(capabilities), warnings, min(totals) if totals else None
