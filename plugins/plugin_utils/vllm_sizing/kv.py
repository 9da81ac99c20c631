# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The KV arithmetic as vLLM does it (vllm/v1/kv_cache_interface.py, vllm/v1/core/kv_cache_utils.py,
kv_cache_planning.py in 0.34): per-layer page sizes, the grouping of hybrid (sliding + full attention) models, the
null block reserved before the startup check and the binary search behind "the estimated maximum model length
is N". The one place this arithmetic lives.
"""

import re

from ansible.errors import AnsibleFilterError

from .common import as_int, cdiv, fail, format_gib
from .shape import model_shape
from .versions import (AMX_FLAG, CC_GRID, VERSIONS, async_scheduling as default_async, in_flight_batches,
                       model_runner, resolve_version)
from .weights import pp_stages

# kv_cache_dtype -> bytes per element (None: the model's dtype). fp8_ds_mla is a fixed 656-byte row.
KV_DTYPE_BYTES = {"auto": None, "bfloat16": 2, "float16": 2,
                  "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1}
FP8_DS_MLA_ROW = 656


def _bytes_per_token(shape, tp, kv_cache_dtype):
    """KV bytes of one token in one layer on one GPU (vLLM's page size for block_size 1)."""
    if kv_cache_dtype == "fp8_ds_mla":
        if not shape["mla"]:
            fail("kv_cache_dtype fp8_ds_mla is only for MLA models (DeepSeek), not %s" % shape["name"])
        return FP8_DS_MLA_ROW
    dtype_bytes = KV_DTYPE_BYTES[kv_cache_dtype] or shape["dtype_bytes"]
    if shape["mla"]:
        # MLA is one latent "head" per token, the same on every TP rank.
        return shape["head_size"] * dtype_bytes
    kv_heads = max(1, shape["kv_heads"] // tp)  # heads are replicated when kv heads < TP
    return kv_heads * (shape["head_size"] + shape["head_size_v"]) * dtype_bytes


def _groups(windows):
    """vLLM's KV-cache groups: one for a uniform model, else equal-size groups per attention type."""
    buckets = {}
    for index, window in enumerate(windows):
        buckets.setdefault(window, []).append(index)
    if len(buckets) == 1:
        return [(windows[0], list(range(len(windows))))]
    sizes = [len(layers) for layers in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < group_size * 1.5:  # few padding layers: pad to the larger type instead
        group_size = max(sizes)
    groups = []
    for window, layers in buckets.items():
        count = cdiv(len(layers), group_size)
        groups.extend((window, layers[i::count]) for i in range(count))
    return groups


def checked_kv_dtype(version, value, field):
    """value if it is one of the version's --kv-cache-dtype choices that this arithmetic sizes."""
    choices = [d for d in VERSIONS[version]["kv_cache_dtypes"] if d in KV_DTYPE_BYTES]
    if value not in choices:
        fail("%s %r is not one of vLLM %s's choices that this filter sizes (%s)"
             % (field, value, version, ", ".join(choices)))
    return value


def tp_refusal(shape, tp):
    """Why vLLM cannot shard this model over tp GPUs (None: it can): the attention heads must divide by tp, and the
    KV heads by tp, or tp by them (replicated heads); MLA has one latent KV head on every rank. The one rule, for the
    plan's TP candidates and every KV arithmetic (kv_layout)."""
    if shape["heads"] % tp:
        return "does not divide the model's %d attention heads" % shape["heads"]
    kv = shape["kv_heads"]
    if not shape["mla"] and (kv % tp if tp < kv else tp % kv):
        # QKVParallelLinear: divide(total_num_kv_heads, tp_size), or divide(tp_size, total_num_kv_heads).
        return ("and the model's %d KV heads do not divide each other (vLLM asserts in QKVParallelLinear at load)"
                % kv)
    return None


def kv_layout(shape, tensor_parallel_size, pipeline_parallel_size, kv_cache_dtype, block_size,
              max_num_batched_tokens, async_scheduling, vllm_version, device):
    """Everything the KV arithmetic needs, resolved from the arguments, the device (device_facts) and the version."""
    version = resolve_version(vllm_version)
    row = VERSIONS[version]
    tp = as_int(tensor_parallel_size, "tensor_parallel_size")
    refusal = tp_refusal(shape, tp)
    if refusal:
        # A byte count for a sharding vLLM refuses at load would be sized for a server that never starts.
        fail("tensor_parallel_size %d %s" % (tp, refusal))
    pp = as_int(pipeline_parallel_size, "pipeline_parallel_size")
    if pp > shape["layers"]:
        fail("pipeline_parallel_size %d is more than the %d layers of %s" % (pp, shape["layers"], shape["name"]))
    checked_kv_dtype(version, kv_cache_dtype, "kv_cache_dtype")
    attention = attention_backend(shape, version, device, as_int(block_size, "block_size", allow_none=True),
                                  kv_cache_dtype)
    block_size = attention["block_size"]
    cpu = device["type"] == "cpu"
    if max_num_batched_tokens is None:
        max_num_batched_tokens = row["cpu_batch_defaults"][0] * tp * pp if cpu else row["batch_defaults"][-1][3]
    batched = as_int(max_num_batched_tokens, "max_num_batched_tokens")
    runner = "v1" if cpu else model_runner(row, shape)
    if async_scheduling is None:
        async_scheduling = default_async(row, pp, runner, cpu)
    # The KV arithmetic's block: the --block-size, but for a model of sliding-window layers only, whose layers take a
    # block of their own from 0.25 (hybrid models have theirs scaled back to the full-attention layers' page).
    kv_block = block_size
    if all(window is not None for window in shape["windows"]):
        kv_block = sliding_block(row["sw_block"], attention["kernel"], block_size)
    return {
        "shape": shape, "version": version, "row": row, "tp": tp, "pp": pp, "block_size": block_size,
        "kv_block": kv_block, "attention": attention, "runner": runner,
        "in_flight": in_flight_batches(row, pp, runner, async_scheduling) * batched,
        "page": kv_block * _bytes_per_token(shape, tp, kv_cache_dtype),
        "groups": _groups(shape["windows"]), "stages": pp_stages(shape["layers"], pp),
    }


def sliding_block(rule, kernel, primary):
    """The block size a sliding-window layer's KV spec gets under the release's rule (its row's sw_block; vLLM's
    Attention.get_kv_cache_spec and _largest_kernel_block_within), from the chosen backend's kernel sizes."""
    if rule == "primary" or kernel is None:
        return primary
    ints = [] if kernel["multiple_of"] else list(kernel["sizes"])
    bases = list(kernel["sizes"]) if kernel["multiple_of"] else []
    if rule == "smallest":
        return min(ints or bases)
    candidates = (ints or bases) if rule == "largest-within" else ints + [max(b, primary // b * b) for b in bases]
    fitting = [size for size in candidates if size <= primary]
    if rule == "dividing":
        dividing = [size for size in fitting if primary % size == 0]
        dividing += [size for base in bases for size in range(base, primary + 1, base) if primary % size == 0]
        if dividing:
            return max(dividing)
    return max(fitting) if fitting else min(candidates)


def device_facts(device, compute_capability=None, cpu_flags=None):
    """The facts about the device that decide vLLM's attention backend: cuda with its compute capability (None:
    unknown), or cpu with its /proc/cpuinfo flags (None: unknown)."""
    if device not in ("cuda", "cpu"):
        fail("device must be cuda or cpu, got %r" % (device,))
    capability = None if compute_capability is None else parse_capability(compute_capability, "compute_capability")
    flags = None
    if cpu_flags is not None:
        if isinstance(cpu_flags, str):
            cpu_flags = cpu_flags.split()
        if not isinstance(cpu_flags, list) or not all(isinstance(f, str) for f in cpu_flags):
            fail("cpu_flags must be the CPU's flags (the 'flags' line of /proc/cpuinfo), got %r" % (cpu_flags,))
        flags = frozenset(cpu_flags)
    return {"type": device, "capability": capability, "cpu_flags": flags}


def parse_capability(value, field):
    """(major, minor) of nvidia-smi's compute_cap ("8.6"): the one parser of it."""
    match = None if isinstance(value, bool) else re.fullmatch(r"(\d{1,3})\.(\d{1,3})", str(value))
    if not match:
        fail("%s must look like \"8.6\", got %r (nvidia-smi's compute_cap)" % (field, value))
    return int(match.group(1)), int(match.group(2))


def _cc(capability):
    return "%d.%d" % capability


def _takes(backend, block_size):
    """Whether an attention backend's kernels take KV blocks of block_size (vLLM splits a block into kernel
    blocks of any size that divides it)."""
    if backend["multiple_of"]:
        return block_size % backend["sizes"][0] == 0
    return any(block_size % size == 0 for size in backend["sizes"])


def _preferred(backend, default):
    """get_preferred_block_size: the platform's default if the backend takes it, else its smallest size."""
    return default if _takes(backend, default) else min(backend["sizes"])


def _cuda_choice(shape, row, cc, requested, kv_dtype):
    """(backend name, block size) vLLM settles on for this model on a GPU of compute capability cc, or (None,
    why) when it fails to start."""
    table = row["cuda"]
    kind = "mla" if shape["mla"] else "standard"
    order = next(names for ccs, names in table[kind] if cc in ccs)
    usable = [name for name in order if cc in table["backends"][name]["runs_on"]
              and kv_dtype in table["backends"][name].get("kv_dtypes_by_cc", {}).get(
                  cc, table["backends"][name]["kv_dtypes"])]
    if not usable:
        return None, "no attention backend takes kv_cache_dtype %s (vLLM: \"No valid attention backend\")" % kv_dtype
    default = row["block_size"]
    if row["block_rule"] == "forced":
        # The platform sets the size, forcing MLA kernels' sizes even over --block-size, and the backend is chosen
        # without looking at it: a size its kernels do not take fails when the KV cache is created.
        block = default if requested is None else requested
        forced = (table["forced_mla"] or {}).get(cc) if shape["mla"] else None
        if forced:
            rule = forced["qk_nope_128" if shape["dims"]["mla"]["nope"] == 128 else "other"]
            block = block if block in rule["keep"] else rule["else"]
        name = usable[0]
        if not _takes(table["backends"][name], block):
            return None, "%s takes no KV block of %d, only %s (vLLM: \"No common block size for %d\")" % (
                name, block, _sizes(table["backends"][name]), block)
        return name, block
    if requested is None:
        return usable[0], _preferred(table["backends"][usable[0]], default)
    name = next((n for n in usable if _takes(table["backends"][n], requested)), None)
    if name is None:
        return None, "no attention backend takes KV blocks of %d (%s; vLLM: \"No valid attention backend\")" % (
            requested, "; ".join("%s: %s" % (n, _sizes(table["backends"][n])) for n in usable))
    return name, requested


def _sizes(backend):
    """What block sizes a backend's kernels take, for messages."""
    return "multiples of " + " or ".join(str(size) for size in backend["sizes"])


def _cpu_choice(shape, row, cpu_flags, requested, kv_dtype):
    """(backend, block size) of the CPU build, or (None, why)."""
    table = row["cpu"]
    if shape["mla"]:
        if table["mla"] is None:
            return None, "this release's CPU build does not run MLA models"
        amx = AMX_FLAG in cpu_flags
        backend = table["mla"]["amx"] if amx and table["mla"]["amx"] else table["mla"]["no_amx"]
    else:
        backend = table["standard"]
    if kv_dtype not in backend["kv_dtypes"]:
        return None, "%s takes no kv_cache_dtype %s" % (backend["backend"], kv_dtype)
    if backend.get("forced"):
        return backend["backend"], backend["forced"]
    block = backend["default"] if requested is None else requested
    if not _takes(backend, block):
        return None, "%s takes no KV block of %d, only %s (vLLM: \"No common block size for %d\")" % (
            backend["backend"], block, _sizes(backend), block)
    return backend["backend"], block


def attention_backend(shape, version, device, block_size, kv_cache_dtype="auto"):
    """The attention backend vLLM picks on the device and the KV block size it then uses (the release table's
    attention facts). Fails when vLLM would not start with them, and when the answer depends on a fact not given."""
    row = VERSIONS[version]
    kind = "an MLA model" if shape["mla"] else "standard attention"
    if block_size is not None and row["block_sizes"] and block_size not in row["block_sizes"]:
        fail("block_size %d is not one of vLLM %s's choices (%s)"
             % (block_size, version, ", ".join(str(b) for b in row["block_sizes"])))
    if device["type"] == "cpu":
        if device["cpu_flags"] is None:
            choices = {_cpu_choice(shape, row, flags, block_size, kv_cache_dtype)
                       for flags in (frozenset(), frozenset([AMX_FLAG]))}
            if len(choices) > 1:
                fail("on the CPU build of vLLM %s, %s gets %s with AMX tiles and without: give cpu_flags (the "
                     "'flags' line of /proc/cpuinfo) or block_size" % (version, kind, " or ".join(
                         "%s/%s" % c for c in sorted(choices, key=str))))
            chosen = {None: choices.pop()}
        else:
            chosen = {None: _cpu_choice(shape, row, device["cpu_flags"], block_size, kv_cache_dtype)}
    else:
        if device["capability"] is not None:
            cc = _cc(device["capability"])
            if cc not in CC_GRID:
                fail("compute capability %s is not one the release table knows (%s): give block_size"
                     % (cc, ", ".join(CC_GRID)))
            ccs = [cc]
        else:
            ccs = CC_GRID
        chosen = {cc: _cuda_choice(shape, row, cc, block_size, kv_cache_dtype) for cc in ccs}
    refused = sorted((cc or device["type"], why) for cc, (name, why) in chosen.items() if name is None)
    if refused and len(refused) == len(chosen):
        fail("vLLM %s would not start %s on %s: %s"
             % (version, kind, ", ".join(c for c, _reason in refused), refused[0][1]))
    sizes = {block for name, block in chosen.values() if name is not None}
    if refused or len(sizes) > 1:
        outcomes = {}
        for cc in CC_GRID:
            if cc in chosen:
                name, why = chosen[cc]
                outcomes.setdefault(why if name is None else "block size %d" % why, []).append(cc)
        fail("on CUDA, vLLM %s gives %s %s depending on the GPU: give compute_capability or block_size" % (
            version, kind, "; ".join("%s on %s" % (what, ", ".join(ccs)) for what, ccs in outcomes.items())))
    names = sorted({name for name, _why in chosen.values()})
    first = {cc: _first_backend(shape, row, cc) for cc in chosen if cc is not None}
    precluded = sorted({first[cc] for cc, (name, _why) in chosen.items() if cc is not None and name != first[cc]})
    return {"backend": " or ".join(names), "block_size": sizes.pop(), "precluded": precluded,
            "kernel": _kernel(shape, row, device, names)}


def _kernel(shape, row, device, names):
    """The chosen backend's kernel sizes ({"sizes", "multiple_of"}), None when the GPU is unknown and backends
    differ."""
    if device["type"] == "cpu":
        table = row["cpu"]
        if not shape["mla"]:
            return table["standard"]
        candidates = [b for b in (table["mla"]["amx"], table["mla"]["no_amx"]) if b and b["backend"] in names]
        return candidates[0] if candidates else None
    return row["cuda"]["backends"][names[0]] if len(names) == 1 else None


def kv_dtype_refusal(shape, version, device, block_size, kv_cache_dtype):
    """Why vLLM would not start with this KV cache dtype on the device (None: it would), e.g. fp8_inc, which no
    CUDA attention backend takes."""
    try:
        attention_backend(shape, version, device, block_size, kv_cache_dtype)
    except AnsibleFilterError as exc:
        return str(exc)
    return None


def _first_backend(shape, row, cc):
    """vLLM's preferred backend on a GPU, whatever the block size and KV dtype."""
    table = row["cuda"]
    order = next(names for ccs, names in table["mla" if shape["mla"] else "standard"] if cc in ccs)
    return next((name for name in order if cc in table["backends"][name]["runs_on"]), None)


def _blocks(window, max_model_len, in_flight, block_size):
    """Blocks one request at max_model_len takes in one layer (SlidingWindowSpec / FullAttentionSpec)."""
    if window is None:
        return cdiv(max_model_len, block_size)
    # +1: the window need not start at a block boundary.
    return cdiv(min(window - 1 + in_flight, max_model_len), block_size) + 1


def stage_block_bytes(lay, stage):
    """Bytes of one block in a stage's shared pool: the largest group's layers on that stage."""
    return lay["page"] * max(len(stage.intersection(layers)) for _window, layers in lay["groups"])


# What the allocator hands one request, whatever the startup check of the release sums: every KV-cache group's blocks
# of the shared pool, padding included, with the pool's null block held back.
REAL = "real"


def stage_need(lay, stage, max_model_len, check=None):
    """KV bytes one request at max_model_len needs on a stage's GPUs, as the release's startup check counts them
    (check: the row's, or REAL)."""
    check = check or lay["row"]["check"]
    in_flight, block_size = lay["in_flight"], lay["kv_block"]
    if check in ("groups", REAL):
        # Every group claims blocks from the shared pool, empty or padded ones included.
        blocks = sum(_blocks(w, max_model_len, in_flight, block_size) for w, _layers in lay["groups"])
        return stage_block_bytes(lay, stage) * blocks
    if check == "layers":
        return lay["page"] * sum(_blocks(lay["shape"]["windows"][i], max_model_len, in_flight, block_size)
                                 for i in stage)
    # first-group(-global): the first group's blocks times the largest group, on this stage or over the whole model
    # (0.14-0.16 compared the whole model's need with one stage's memory, so pipeline stages did not shrink it).
    layers = frozenset(range(lay["shape"]["layers"])) if check == "first-group-global" else stage
    return stage_block_bytes(lay, layers) * _blocks(lay["groups"][0][0], max_model_len, in_flight, block_size)


def check_memory(lay, stage, kv_cache_bytes, check=None):
    """Available memory as the startup check sees it (after the null block in newer releases, and always for
    REAL)."""
    null = lay["row"]["null_block"] or check == REAL
    return kv_cache_bytes - (stage_block_bytes(lay, stage) if null else 0)


def _estimate(lay, stage, available, upper, check=None):
    """vLLM's binary search for the largest length that fits, bounds included (0: not even 1 token)."""
    if available <= 0:
        return 0

    def fits(length):
        return stage_need(lay, stage, length, check) <= available

    if not fits(1):
        return 0
    left, right, result = 1, upper, 1
    while left <= right:
        mid = (left + right) // 2
        if fits(mid):
            result, left = mid, mid + 1
        else:
            right = mid - 1
    return result


def startup_check(lay, kv_cache_bytes, max_model_len):
    """What vLLM's startup check does with this much KV memory per GPU: None if it passes, else the
    failing stage's numbers (needed, available, estimated maximum model length)."""
    for stage in lay["stages"]:
        available = check_memory(lay, stage, kv_cache_bytes)
        needed = stage_need(lay, stage, max_model_len)
        if available <= 0 or needed > available:
            return {"needed": needed, "available": available,
                    "estimate": _estimate(lay, stage, available, max_model_len)}
    return None


def request_bytes(lay, max_model_len):
    """KV bytes of one request at max_model_len on the busiest pipeline stage."""
    return max(stage_need(lay, stage, max_model_len) for stage in lay["stages"])


def fitting_max_len(lay, kv_cache_bytes, upper, check=None):
    """Largest length every stage's startup check accepts (vLLM's estimate, bounded by upper); with REAL, the
    largest one request really gets blocks for (a plan needs both: some releases check less than a request takes)."""
    return min(_estimate(lay, stage, check_memory(lay, stage, kv_cache_bytes, check), upper, check)
               for stage in lay["stages"])


def kv_capacity(lay, kv_cache_bytes, max_model_len):
    """num_blocks, per-request blocks (summed over the layer groups), KV tokens and concurrency as vLLM logs them,
    and the requests of that length the cache holds at once (`held`: the null block is never handed out), the one
    count of it."""
    num_blocks = min(kv_cache_bytes // stage_block_bytes(lay, stage) for stage in lay["stages"])
    per_request = sum(_blocks(w, max_model_len, lay["in_flight"], lay["kv_block"]) for w, _layers in lay["groups"])
    concurrency = num_blocks / per_request
    return {"num_blocks": num_blocks, "blocks_per_request": per_request,
            "tokens": int(concurrency * max_model_len), "concurrency": concurrency,
            "held": max(0, num_blocks - 1) // per_request}


def check_message(lay, max_model_len, failed):
    """vLLM's startup error text for a failed check."""
    estimate = ""
    if failed["estimate"] > 0:
        estimate = "Based on the available memory, the estimated maximum model length is %d. " % failed["estimate"]
    return ("To serve at least one request with the %s max seq len (%d), (%s GiB KV cache is needed, which is "
            "larger than the available KV cache memory (%s GiB). %s" % (
                lay["row"]["message"], max_model_len, format_gib(failed["needed"], lay["row"]["gib_format"]),
                format_gib(failed["available"], lay["row"]["gib_format"]), estimate)).strip()


def vllm_kv_cache_bytes(model, max_model_len, tensor_parallel_size=1, pipeline_parallel_size=1,
                        kv_cache_dtype="auto", block_size=None, max_num_batched_tokens=None,
                        async_scheduling=None, vllm_version=None, device="cuda", compute_capability=None,
                        cpu_flags=None):
    """Bytes of KV cache one request at max_model_len needs on one GPU (the busiest pipeline stage),
    as vLLM's startup check counts them, without the null block."""
    lay = kv_layout(model_shape(model), tensor_parallel_size, pipeline_parallel_size, kv_cache_dtype, block_size,
                    max_num_batched_tokens, async_scheduling, vllm_version,
                    device_facts(device, compute_capability, cpu_flags))
    return request_bytes(lay, as_int(max_model_len, "max_model_len"))


def vllm_max_model_len(model, kv_cache_bytes, tensor_parallel_size=1, pipeline_parallel_size=1,
                       kv_cache_dtype="auto", block_size=None, max_num_batched_tokens=None,
                       async_scheduling=None, vllm_version=None, device="cuda", max_model_len=None,
                       compute_capability=None, cpu_flags=None):
    """Largest max_model_len vLLM's startup check accepts with kv_cache_bytes of KV memory per GPU;
    vLLM's own binary search between 1 and max_model_len (default: the model's derived maximum)."""
    lay = kv_layout(model_shape(model), tensor_parallel_size, pipeline_parallel_size, kv_cache_dtype, block_size,
                    max_num_batched_tokens, async_scheduling, vllm_version,
                    device_facts(device, compute_capability, cpu_flags))
    memory = as_int(kv_cache_bytes, "kv_cache_bytes", minimum=0)
    upper = lay["shape"]["max_len"] if max_model_len is None else as_int(max_model_len, "max_model_len")
    return fitting_max_len(lay, memory, upper)
