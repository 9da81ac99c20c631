# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The KV arithmetic as vLLM does it (vllm/v1/kv_cache_interface.py, vllm/v1/core/kv_cache_utils.py,
kv_cache_planning.py in 0.34): per-layer page sizes, the grouping of hybrid (sliding + full attention) models, the
null block reserved before the startup check and the binary search behind "the estimated maximum model length
is N". The one place this arithmetic lives.
"""

import re

from .common import as_int, cdiv, fail, format_gib
from .shape import model_shape
from .versions import AMX_FLAG, ATTENTION, CAPABILITIES, VERSIONS, resolve_version
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
        fail("%s %r is not one of vLLM %s's choices (%s)" % (field, value, version, ", ".join(choices)))
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
    block_size = as_int(block_size, "block_size", allow_none=True)
    if block_size is not None and row["block_sizes"] and block_size not in row["block_sizes"]:
        fail("block_size %d is not one of vLLM %s's choices (%s)"
             % (block_size, version, ", ".join(str(b) for b in row["block_sizes"])))
    attention = attention_backend(shape, version, device, block_size)
    block_size = attention["block_size"]
    cpu = device["type"] == "cpu"
    if max_num_batched_tokens is None:
        max_num_batched_tokens = row["cpu_batch_defaults"][0] * tp * pp if cpu else row["batch_defaults"][-1][2]
    batched = as_int(max_num_batched_tokens, "max_num_batched_tokens")
    if async_scheduling is None:
        async_scheduling = row["async_scheduling"] and not cpu
    in_flight = batched if row["in_flight"] == "batch" else (pp + 1 if async_scheduling else pp) * batched
    return {
        "shape": shape, "version": version, "row": row, "tp": tp, "pp": pp, "block_size": block_size,
        "attention": attention,
        "in_flight": in_flight, "page": block_size * _bytes_per_token(shape, tp, kv_cache_dtype),
        "groups": _groups(shape["windows"]), "stages": pp_stages(shape["layers"], pp),
    }


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


def _accepts(backend, block_size):
    return any(block_size % size == 0 for size in backend["sizes"])


def _backend_block(backends, requested, default):
    """(backend, block size) vLLM settles on among backends that run on the device, in order (None: none takes
    the requested size)."""
    if not backends:
        return None
    if backends[0].get("forced"):
        return backends[0], backends[0]["forced"]
    if requested is None:
        first = backends[0]
        default = first.get("default", default)
        return first, default if _accepts(first, default) else min(first["sizes"])
    return next(((b, requested) for b in backends if _accepts(b, requested)), None)


def attention_backend(shape, version, device, block_size):
    """The attention backend vLLM picks on the device and the KV block size it then uses (see ATTENTION).
    Fails when no backend takes the requested block size, and when the answer depends on a fact not given."""
    default = VERSIONS[version]["block_size"]
    table = ATTENTION[(device["type"], shape["mla"])]
    kind = "an MLA model" if shape["mla"] else "standard attention"
    if device["type"] == "cpu":
        if device["cpu_flags"] is None and len(table) > 1:
            fail("on the CPU build, %s gets block size 128 with AMX tiles and 16 without: give cpu_flags (the "
                 "'flags' line of /proc/cpuinfo) or block_size" % kind)
        amx = device["cpu_flags"] is not None and AMX_FLAG in device["cpu_flags"]
        candidates = {None: [b for b in table if b.get("amx", amx) == amx]}
    elif device["capability"] is not None:
        candidates = {device["capability"]: [b for b in table if b["runs_on"](device["capability"])]}
    else:
        candidates = {cc: [b for b in table if b["runs_on"](cc)] for cc in CAPABILITIES}
    chosen = {cc: _backend_block(backends, block_size, default) for cc, backends in candidates.items()}
    refused = sorted("%d.%d" % cc if cc else device["type"] for cc, pick in chosen.items() if pick is None)
    if refused:
        fail("block_size %d: no attention backend vLLM %s has for %s on %s takes it (%s); vLLM would fail at "
             "start (\"No valid attention backend\" or \"No common block size for %d\")" % (
                  block_size, version, kind, ", ".join(refused), "; ".join(
                      "%s: multiples of %s" % (b["name"], " or ".join(str(x) for x in b["sizes"]))
                      for b in table), block_size))
    sizes = {pick[1] for pick in chosen.values()}
    if len(sizes) > 1:
        fail("on CUDA, vLLM %s gives %s block size %s depending on the GPU: give compute_capability or block_size"
             % (version, kind, " or ".join(str(x) for x in sorted(sizes))))
    names = sorted({pick[0]["name"] for pick in chosen.values()})
    first = {cc: backends[0]["name"] for cc, backends in candidates.items() if backends}
    precluded = sorted({first[cc] for cc, pick in chosen.items() if pick[0]["name"] != first[cc]})
    return {"backend": " or ".join(names), "block_size": sizes.pop(), "precluded": precluded}


def _blocks(window, max_model_len, in_flight, block_size):
    """Blocks one request at max_model_len takes in one layer (SlidingWindowSpec / FullAttentionSpec)."""
    if window is None:
        return cdiv(max_model_len, block_size)
    # +1: the window need not start at a block boundary.
    return cdiv(min(window - 1 + in_flight, max_model_len), block_size) + 1


def stage_block_bytes(lay, stage):
    """Bytes of one block in a stage's shared pool: the largest group's layers on that stage."""
    return lay["page"] * max(len(stage.intersection(layers)) for _, layers in lay["groups"])


def stage_need(lay, stage, max_model_len):
    """KV bytes one request at max_model_len needs on a stage's GPUs, as the startup check counts them."""
    if lay["row"]["grouped_check"]:
        # Every group claims blocks from the shared pool, empty or padded ones included.
        blocks = sum(_blocks(w, max_model_len, lay["in_flight"], lay["block_size"]) for w, _ in lay["groups"])
        return stage_block_bytes(lay, stage) * blocks
    return lay["page"] * sum(_blocks(lay["shape"]["windows"][i], max_model_len, lay["in_flight"], lay["block_size"])
                             for i in stage)


def check_memory(lay, stage, kv_cache_bytes):
    """Available memory as the startup check sees it (after the null block in newer releases)."""
    return kv_cache_bytes - (stage_block_bytes(lay, stage) if lay["row"]["null_block"] else 0)


def _estimate(lay, stage, available, upper):
    """vLLM's binary search for the largest length that fits, bounds included (0: not even 1 token)."""
    if available <= 0:
        return 0

    def fits(length):
        return stage_need(lay, stage, length) <= available

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


def fitting_max_len(lay, kv_cache_bytes, upper):
    """Largest length every stage's startup check accepts (vLLM's estimate, bounded by upper)."""
    return min(_estimate(lay, stage, check_memory(lay, stage, kv_cache_bytes), upper) for stage in lay["stages"])


def kv_capacity(lay, kv_cache_bytes, max_model_len):
    """num_blocks, per-request blocks, KV tokens and concurrency as vLLM logs them."""
    num_blocks = min(kv_cache_bytes // stage_block_bytes(lay, stage) for stage in lay["stages"])
    per_request = sum(_blocks(w, max_model_len, lay["in_flight"], lay["block_size"]) for w, _ in lay["groups"])
    concurrency = num_blocks / per_request
    return {"num_blocks": num_blocks, "blocks_per_request": per_request,
            "tokens": int(concurrency * max_model_len), "concurrency": concurrency}


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
