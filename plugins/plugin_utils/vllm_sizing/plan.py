# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan: vllm_sizing tries the configurations an operator would (shorter max_model_len, fp8 KV cache, fewer
sequences, more tensor parallelism) and says what it applied, what it warns about and, when nothing fits, why.
"""

from . import calibration, inputs
from .budget import choose_utilization, default_batch, leave_headroom, memory_budget
from .common import fail, gib
from .flags import multi_node_refusal, parse_serve_options
from .kv import (KV_DTYPE_BYTES, REAL, check_message, checked_kv_dtype, fitting_max_len, kv_capacity,
                 kv_dtype_refusal, kv_layout, request_bytes, startup_check, tp_refusal)
from .shape import model_shape
from .versions import VERSIONS, resolve_version
from .weights import gpu_weight_bytes, module_tensors, parse_quantization

LENGTH_STEP = 1024  # a shortened max_model_len is rounded down to a multiple of this


def startup_plan(ctx, row):
    """Whether the plan turns on vLLM's startup plan: the policy asks for it and the release has it."""
    return ctx["policy"].startup_plan and row["startup_plan"] is not None


def _tp_candidates(shape, start, count, allow_more):
    """Tensor parallel sizes to try: the start, then powers of two up to the group's GPUs that vLLM can shard the
    model over."""
    larger = [t for t in (2, 4, 8, 16, 32, 64) if start < t <= count and tp_refusal(shape, t) is None]
    return [start] + (larger if allow_more else [])


def _attempt(ctx, tp, kv_dtype, seqs):
    """Size one configuration; returns the facts about it (fits or not, and why)."""
    lay = kv_layout(ctx["shape"], tp, ctx["pp"], kv_dtype, ctx["block_size"], ctx["batched"], None, ctx["version"],
                    ctx["device"])
    budget = memory_budget(lay, ctx, seqs)
    measured = None
    attempt = {"first": tp == ctx["tp_start"] and kv_dtype == ctx["policy"].kv_cache_dtype,
               "fields": _key_fields(ctx, tp, kv_dtype)}
    entry = next((m for m in ctx["measured"] if calibration.applies(m, attempt)), None)
    if entry is not None:
        budget, measured = calibration.measured_budget(budget, entry, ctx["utilization"], ctx["total_mib"],
                                                       lay["row"], startup_plan(ctx, lay["row"]))
    kv = budget["kv_cache_bytes"]
    fit_len = _fitting(lay, kv, ctx["target_len"])
    length = fit_len
    if fit_len < ctx["target_len"]:
        # Shrunk: stay a little below the longest that fits, on a round number.
        length = max(ctx["floor_len"], fit_len // LENGTH_STEP * LENGTH_STEP)
    if fit_len < ctx["floor_len"]:
        length = None
    result = {"tp": tp, "kv_dtype": kv_dtype, "lay": lay, "budget": budget, "fit_len": fit_len,
              "max_model_len": length, "max_num_seqs": seqs, "measured": measured}
    if length is None:
        return result
    result["capacity"] = kv_capacity(lay, kv, length)
    if ctx["peak"]:
        # The cache must hold the peak at p99 context.
        result["seqs_that_fit"] = kv_capacity(lay, kv, ctx["p99"] or length)["held"]
    return result


def _fitting(lay, kv, upper):
    """The longest max_model_len vLLM starts with and a request of that length really gets blocks for."""
    return min(fitting_max_len(lay, kv, upper), fitting_max_len(lay, kv, upper, REAL))


def _key_fields(ctx, tp, kv_dtype):
    """calibration.key_fields of the plan this configuration would make."""
    return {"gpu": ctx["gpu_name"], "model": str(_model_arg(ctx)), "vllm_version": ctx["version"],
            "tensor_parallel_size": tp, "pipeline_parallel_size": ctx["pp"], "kv_cache_dtype": kv_dtype,
            "max_num_batched_tokens": ctx["batched"], "enforce_eager": ctx["enforce_eager"],
            "dtype": str(ctx["serve"].get("dtype") or "auto"),
            "quantization": str(ctx["serve"].get("quantization") or "none"), "nodes": ctx["nodes"]}


def _loadtest_cap(ctx, result):
    """The chosen configuration at most at the concurrency a load test of it held (the estimate said more).

    The key does not move: max_num_seqs is not part of it, and max_num_batched_tokens (which is) was settled from
    the uncapped max_num_seqs. So the next plan finds the same entry and caps again, instead of an uncapped plan
    and a capped one taking turns."""
    fields = _key_fields(ctx, result["tp"], result["kv_dtype"])
    found = next(((entry, cap) for entry in ctx["loadtest"]
                  for cap in [calibration.loadtest_cap(entry, fields, ctx["p99"] or result["max_model_len"])]
                  if cap is not None), None)
    if found is None or found[1][0] >= result["max_num_seqs"]:
        return result
    entry, (held, source) = found
    capped = _attempt(ctx, result["tp"], result["kv_dtype"], held)
    capped["loadtest"] = {"held_concurrency": held, "uncapped_max_num_seqs": result["max_num_seqs"],
                          "source": source}
    capped["loadtest_entry"] = entry
    return capped


def _fits_workload(result, ctx):
    return result["max_model_len"] is not None and result.get("seqs_that_fit", ctx["peak"] or 0) >= (ctx["peak"] or 0)


def vllm_sizing(gpus, model, workload=None, policy=None):
    """The vLLM plan for one host or GPU group: engine arguments, environment, memory budget, fit."""
    workload = inputs.workload(workload)
    policy = inputs.policy(policy)
    version = resolve_version(policy.vllm_version)
    row = VERSIONS[version]
    serve = parse_serve_options(policy.serve_options, version)
    shape = model_shape(model, serve.get("dtype"), serve.get("quantization"))
    host = policy.host
    where = ("host %s: " % host) if host else ""
    name = policy.model or shape["name"]  # for messages; the model may have no name
    applied, warnings = [], []
    gpu_name, gpu_count, usable, capability, gpu_warnings, total_mib = inputs.gpu_group(gpus,
                                                                                        policy.usable_memory_mib)
    warnings.extend(gpu_warnings)

    p99, peak = workload.p99_context, workload.peak_concurrency
    model_max = shape["max_len"]
    if p99 and p99 > model_max:
        fail("%s%s: workload.p99_context %d is longer than the model's maximum context %d "
             "(max_position_embeddings); no setting serves it" % (where, name, p99, model_max))
    target = policy.max_model_len or workload.max_context or p99 or model_max
    if p99 and target < p99:
        fail("%s%s: max_model_len %d is shorter than workload.p99_context %d: requests that long would be "
             "rejected" % (where, name, target, p99))
    if target > model_max:
        applied.append("max_model_len capped at the model's maximum context %d (asked %d)" % (model_max, target))
        target = model_max
    if p99:
        applied.append("max_model_len sized to the workload (p99 context %d), not the model's maximum %d"
                       % (p99, model_max) if target == p99 else
                       "max_model_len target %d, may shrink down to the workload's p99 context %d" % (target, p99))
    floor = min(target, p99 or policy.min_model_len)

    utilization = choose_utilization(policy, applied)
    enforce_eager = policy.enforce_eager
    if enforce_eager is None:
        enforce_eager = policy.runtime_ooms
        if enforce_eager:
            applied.append("enforce_eager: CUDA graphs off after runtime OOMs (frees their memory)")
    default_batched, default_seqs = default_batch(row, usable, gpu_name, capability)
    batched = policy.max_num_batched_tokens or default_batched
    seqs = peak or policy.max_num_seqs or default_seqs
    if batched < seqs:
        applied.append("max_num_batched_tokens raised to max_num_seqs %d (vLLM requires at least that)" % seqs)
        batched = seqs
    kv_dtype = checked_kv_dtype(version, policy.kv_cache_dtype, "policy.kv_cache_dtype")
    device = {"type": "cuda", "capability": capability, "cpu_flags": None}
    refusal = kv_dtype_refusal(shape, version, device, policy.block_size, kv_dtype)
    if refusal:
        fail("%s%s: policy.kv_cache_dtype %s%s: %s" % (where, name, kv_dtype, "" if policy.block_size is None
                                                       else " with policy.block_size %d" % policy.block_size,
                                                       refusal))
    # The fallback to an fp8 KV cache where an attention backend of the release takes it on the GPU, and never below
    # Ampere: Triton's fp8 conversions, the only backend listing fp8 there, are not built for older GPUs.
    allow_fp8 = (policy.allow_fp8_kv_cache and capability >= (8, 0)
                 and not kv_dtype_refusal(shape, version, device, policy.block_size, "fp8"))
    nodes = policy.nodes
    if nodes > 1:
        tp_start, pp = _group_layout(shape, policy, gpu_count, version, where + name, warnings)
    else:
        tp_start, pp = policy.tensor_parallel_size, policy.pipeline_parallel_size
    refusal = tp_refusal(shape, tp_start)
    if refusal:
        fail("%s%s: policy.tensor_parallel_size %d %s" % (where, name, tp_start, refusal))
    if tp_start * pp > gpu_count:
        fail("%s%s: tensor_parallel_size %d x pipeline_parallel_size %d needs %d GPUs, the group has %d (%s)"
             % (where, name, tp_start, pp, tp_start * pp, gpu_count, gpu_name))
    ctx = {"shape": shape, "name": name, "host": host, "gpu_name": gpu_name, "gpu_count": gpu_count,
           "total_mib": total_mib,
           "applied": applied, "warnings": warnings, "version": version, "pp": pp,
           "block_size": policy.block_size, "batched": batched,
           "usable": usable, "utilization": utilization, "enforce_eager": enforce_eager, "policy": policy,
           "nodes": nodes, "gpus_per_node": gpu_count // nodes,
           "extensible": row["extensible_kv_cache"], "target_len": target, "floor_len": floor,
           "p99": p99, "peak": peak, "serve": serve, "tp_start": tp_start,
           "measured": calibration.measurements(policy.measured or []),
           "loadtest": [calibration.loadtest(entry) for entry in policy.loadtest or []],
           "device": device,
           "min_seqs": policy.min_num_seqs or max(1, (peak or 0) // 2)}
    ctx["utilization"] = leave_headroom(ctx, tp_start, applied, warnings)

    # Fallbacks in order: shorter max_model_len (inside _attempt), fp8 KV cache, fewer max_num_seqs,
    # more tensor parallelism. Quantized weights can only be suggested.
    tried, chosen = [], None
    # A replica group's layout uses all of its GPUs: nothing larger to fall back to.
    tp_candidates = _tp_candidates(shape, tp_start, gpu_count // pp, policy.allow_tensor_parallel and nodes == 1)
    for tp in tp_candidates:
        dtypes = [kv_dtype] + (["fp8"] if allow_fp8 and KV_DTYPE_BYTES[kv_dtype] != 1 else [])
        results = [_attempt(ctx, tp, d, seqs) for d in dtypes]
        tried.extend(results)
        chosen = next((r for r in results if _fits_workload(r, ctx)), None) or _fewer_seqs(results[-1], ctx, tp)
        if chosen is not None:
            chosen = _loadtest_cap(ctx, chosen)
            break
    # A load test's cap names its own fixes; the hint's policy.min_num_seqs would not undo it.
    if chosen is not None and peak and chosen["max_num_seqs"] < peak and not chosen.get("loadtest"):
        warnings.append(_peak_hint(ctx, chosen, tp_candidates[tp_candidates.index(chosen["tp"]) + 1:]))
    plan = _plan(ctx, chosen or tried[-1], chosen is not None, tried)
    if not plan["fits"] and policy.strict:
        fail("vllm_sizing: %s%s" % (where, plan["reason"]))
    return plan


def _group_layout(shape, policy, gpu_count, version, who, warnings):
    """Tensor and pipeline parallel sizes of one instance across policy.nodes hosts: all the group's GPUs
    (tensor x pipeline), by default tensor parallel inside each host and a pipeline stage per host. A tensor-parallel
    group either stays inside a host or spans whole hosts."""
    nodes = policy.nodes
    refusal = multi_node_refusal(version)
    if refusal:
        fail("%s: policy.nodes %d: %s" % (who, nodes, refusal))
    if gpu_count % nodes:
        fail("%s: policy.nodes %d: the group's %d GPUs are not as many on each host" % (who, nodes, gpu_count))
    per_node = gpu_count // nodes
    tp, pp = policy.tensor_parallel_size, policy.pipeline_parallel_size
    if tp == 1 and pp == 1:
        tp, pp = per_node, nodes
    elif pp == 1 and gpu_count % tp == 0:
        pp = gpu_count // tp
    elif tp == 1 and gpu_count % pp == 0:
        tp = gpu_count // pp
    if tp * pp != gpu_count:
        fail("%s: a replica group of %d hosts runs one instance on all its %d GPUs: tensor_parallel_size %d x "
             "pipeline_parallel_size %d must be %d" % (who, nodes, gpu_count, tp, pp, gpu_count))
    if (per_node % tp if tp < per_node else tp % per_node):
        fail("%s: tensor_parallel_size %d with %d GPUs a host would split a tensor-parallel group unevenly across "
             "hosts: use a divisor or a multiple of %d" % (who, tp, per_node, per_node))
    if pp > shape["layers"]:
        fail("%s: pipeline_parallel_size %d is more than the model's %d layers" % (who, pp, shape["layers"]))
    if tp > per_node:
        warnings.append("tensor parallelism across hosts (tensor_parallel_size %d, %d GPUs a host): every layer's "
                        "all-reduce crosses the network; a pipeline stage per host (the default) needs far less "
                        "bandwidth" % (tp, per_node))
    return tp, pp


def _fewer_seqs(result, ctx, tp):
    """Lower max_num_seqs to what the KV cache holds at p99, if the policy's floor allows."""
    if result["max_model_len"] is None or "seqs_that_fit" not in result:
        return None
    for _round in range(3):  # fewer sequences shrink the sampler's share, which frees a little KV memory
        seqs = result["seqs_that_fit"]
        if seqs < ctx["min_seqs"]:
            return None
        result = _attempt(ctx, tp, result["kv_dtype"], seqs)
        if result["max_model_len"] is not None and result.get("seqs_that_fit", 0) >= seqs:
            result["max_num_seqs"] = seqs
            return result
    return None


def _peak_hint(ctx, chosen, larger_tp):
    """What would serve the whole peak when max_num_seqs had to be lowered."""
    for tp in larger_tp:
        result = _attempt(ctx, tp, chosen["kv_dtype"], ctx["peak"])
        if _fits_workload(result, ctx):
            return ("requests beyond %d concurrent sequences wait in the queue; tensor_parallel_size %d would serve "
                    "the peak of %d (raise policy.min_num_seqs to make the plan use it)"
                    % (chosen["max_num_seqs"], tp, ctx["peak"]))
    return ("requests beyond %d concurrent sequences wait in the queue; serving the peak of %d needs more GPUs "
            "or a quantized checkpoint" % (chosen["max_num_seqs"], ctx["peak"]))


def _plan(ctx, result, fits, tried):
    lay, budget = result["lay"], result["budget"]
    shape, name, applied, warnings = ctx["shape"], ctx["name"], ctx["applied"], ctx["warnings"]
    row, tp, pp = lay["row"], result["tp"], ctx["pp"]
    length = result["max_model_len"] or ctx["floor_len"]
    if result["max_model_len"] is not None and length < ctx["target_len"]:
        applied.append("max_model_len %d: %d does not fit, %d is the longest that does (rounded down; floor %d)"
                       % (length, ctx["target_len"], result["fit_len"], ctx["floor_len"]))
    if result["kv_dtype"] != ctx["policy"].kv_cache_dtype:
        applied.append("kv_cache_dtype fp8: halves KV bytes per token (the model's dtype did not fit)")
    if result["kv_dtype"].startswith("fp8"):
        warnings.append("fp8 KV cache: a small quality cost; check your evaluations")
    if result.get("loadtest"):
        applied.append(calibration.describe_loadtest(result["loadtest_entry"], result["loadtest"],
                                                     result["loadtest"]["uncapped_max_num_seqs"]))
    elif ctx["peak"] and result["max_num_seqs"] < ctx["peak"]:
        applied.append("max_num_seqs %d (peak concurrency %d does not fit at context %d; floor %d)"
                       % (result["max_num_seqs"], ctx["peak"], ctx["p99"] or length, ctx["min_seqs"]))
    if ctx["nodes"] > 1:
        applied.append("one instance across a replica group of %d hosts (tensor_parallel_size %d, "
                       "pipeline_parallel_size %d): room for NCCL's cross-host buffers left outside vLLM's share%s"
                       % (ctx["nodes"], tp, pp, " and counted inside it" if tp > ctx["gpus_per_node"] else ""))
    start_tp = tried[0]["tp"]
    if tp > start_tp:
        applied.append("tensor_parallel_size %d: splits the weights over %d GPUs to make room for KV cache"
                       % (tp, tp))
    engine_args = {
        "model": _model_arg(ctx),
        "gpu_memory_utilization": ctx["utilization"], "max_model_len": length,
        "max_num_seqs": result["max_num_seqs"], "max_num_batched_tokens": ctx["batched"],
        "kv_cache_dtype": result["kv_dtype"], "tensor_parallel_size": tp, "enforce_eager": ctx["enforce_eager"],
    }
    if pp > 1:
        engine_args["pipeline_parallel_size"] = pp
    # Always explicit: the plan's arithmetic and the server then use the same block size by construction.
    engine_args["block_size"] = lay["block_size"]
    attention = lay["attention"]
    applied.append("block_size %d: %s" % (lay["block_size"], (
        "as set in the policy" if ctx["block_size"] is not None else
        "what vLLM %s gives %s on compute capability %s" % (
            ctx["version"], attention["backend"], ".".join(str(x) for x in ctx["device"]["capability"])))))
    if attention["precluded"]:
        warnings.append("block_size %d rules out vLLM's preferred attention backend %s: it uses %s instead, "
                        "which may be slower" % (lay["block_size"], ", ".join(attention["precluded"]),
                                                 attention["backend"]))
    engine_args.update(ctx["serve"])
    _serve_warnings(ctx, budget, warnings)
    env = {}
    if ctx["policy"].expandable_segments:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        applied.append("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against allocator fragmentation")
        if tp * pp > 1:
            engine_args["disable_custom_all_reduce"] = True
            warnings.append("expandable_segments with tensor parallelism can crash vLLM's custom all-reduce at "
                            "start-up (vLLM #42609, #49101, #56180): disable_custom_all_reduce is set")
    if startup_plan(ctx, row):
        env["VLLM_ENABLE_STARTUP_PLAN"] = "1"
        applied.append("VLLM_ENABLE_STARTUP_PLAN=1: vLLM %s stores the first start's KV cache size and later starts "
                       "of this configuration reuse it without the memory profile, while the GPU has as much free "
                       "memory as then" % ctx["version"])
    if shape["weight_bytes"][1] != "given":
        warnings.append("weights %s: %s" % (shape["weight_bytes"][1], gib(shape["weight_bytes"][0])))
    applied.append("explicit gpu_memory_utilization: vLLM %s would default to %s" % (ctx["version"], (
        "1.0 (extensible KV cache; it logs a warning for values below 1.0, the headroom stays for prefill spikes "
        "and other processes)") if row["extensible_kv_cache"] else row["utilization"]))
    capacity = result.get("capacity") or {"tokens": 0, "concurrency": 0.0}
    limit, blocks_per_request = _held(ctx, result, length)
    plan = {
        "fits": fits, "reason": "", "vllm_version": ctx["version"], "host": ctx["host"], "model": _model_arg(ctx),
        "gpus": {"name": ctx["gpu_name"], "count": ctx["gpu_count"], "used": tp * pp,
                 "memory_total_mib": ctx["total_mib"], "nodes": ctx["nodes"]},
        "engine_args": engine_args, "env": env, "budget_per_gpu": budget,
        "block_size": lay["block_size"], "attention_backend": lay["attention"]["backend"],
        "kv_cache_tokens": capacity["tokens"],
        "concurrency_at_max_model_len": round(capacity["concurrency"], 2),
        "concurrency_limit": limit,
        "kv_blocks_per_request": blocks_per_request,
        "kv_bytes_per_request": request_bytes(lay, length),
        "applied": applied, "warnings": warnings,
    }
    # The measured configuration may not be the chosen one: what vLLM had there can make the plan move on.
    measured = result if result["measured"] is not None else next((r for r in tried if r["measured"]), None)
    if measured is not None:
        info = measured["measured"]
        error = calibration.error_percent(info)
        plan["calibration"] = dict(info, error_percent=error, used=measured is result,
                                   flagged=error is not None and abs(error) > calibration.OFF_PERCENT)
        applied.append(calibration.describe(info) + ("" if measured is result else (
            "; with that, tensor_parallel_size %d with kv_cache_dtype %s does not serve the workload, so the plan "
            "moved on" % (measured["tp"], measured["kv_dtype"]))))
    if result.get("loadtest"):
        plan["loadtest"] = result["loadtest"]
    if fits:
        plan["reason"] = ("%s fits on %s: %s of KV cache per GPU holds %d tokens, %.2f requests at "
                          "max_model_len %d" % (name, _where(ctx, tp, pp), gib(budget["kv_cache_bytes"]),
                                                capacity["tokens"], capacity["concurrency"], length))
    else:
        plan["reason"] = _misfit_reason(ctx, result, tried)
    return plan


def _where(ctx, tp, pp):
    """The GPUs a plan runs on, in words: "2 x NVIDIA A10G", or for a replica group "2 hosts of 8 x NVIDIA H100 ...
    (tensor_parallel_size 8, pipeline_parallel_size 2)"."""
    if ctx["nodes"] == 1:
        return "%d x %s" % (tp * pp, ctx["gpu_name"])
    return "%d hosts of %d x %s (tensor_parallel_size %d, pipeline_parallel_size %d)" % (
        ctx["nodes"], ctx["gpu_count"] // ctx["nodes"], ctx["gpu_name"], tp, pp)


def _held(ctx, result, length):
    """(concurrency_limit, kv_blocks_per_request) at the workload's p99 context (else at max_model_len).

    concurrency_limit: the most requests the instance serves at once without its KV cache running out there, and
    never more than max_num_seqs: the limit the balancer holds it to (vLLM would queue the rest inside, or preempt
    and recompute them), at least 1. kv_blocks_per_request: the blocks of the pool one such request takes, summed
    over the layer groups, which the load test divides vLLM's own block count by."""
    if result["max_model_len"] is None:
        return 1, None
    context = ctx["p99"] or length
    held = kv_capacity(result["lay"], result["budget"]["kv_cache_bytes"], context)
    return (max(1, min(result["max_num_seqs"], held["held"])),
            {"context": context, "blocks": held["blocks_per_request"]})


def _serve_warnings(ctx, budget, warnings):
    """What the serving options change in the budget, said where the plan cannot check it."""
    serve = ctx["serve"]
    if serve.get("quantization") and ctx["shape"]["quantization"] is None:
        warnings.append("quantization %s of an unquantized checkpoint: the budget counts the checkpoint's weights "
                        "(%s per GPU), so the KV cache vLLM gets will be larger than planned"
                        % (serve["quantization"], gib(budget["weights_bytes"])))
    if "kv_cache_memory_bytes" in serve or "num_gpu_blocks_override" in serve:
        outside = (budget["usable_bytes"] - budget["weights_bytes"] - budget["activation_peak_bytes"]
                   - budget["cuda_graph_bytes"] - budget["non_torch_bytes"])
        if budget["kv_cache_bytes"] > outside:
            warnings.append("the KV cache pinned by serve_options (%s) is more than the %s left beside weights, "
                            "activations, CUDA graphs and non-torch memory: expect CUDA OOM at start or under load"
                            % (gib(budget["kv_cache_bytes"]), gib(outside)))


def _model_arg(ctx):
    """What --model gets: policy.model, else the config's _name / _name_or_path (None: serve_args refuses)."""
    return ctx["policy"].model or ctx["shape"]["model_arg"]


def _misfit_reason(ctx, result, tried):
    """Why nothing fits, with vLLM's own message for the last configuration tried."""
    lay, budget = result["lay"], result["budget"]
    parts = ["%s does not fit on %d x %s (%s usable each, vLLM %s)" % (
        ctx["name"], ctx["gpu_count"], ctx["gpu_name"], gib(ctx["usable"]), ctx["version"])]
    parts.append("last tried tensor_parallel_size %d, kv_cache_dtype %s, gpu_memory_utilization %.2f: %s requested "
                 "per GPU = weights %s + activation peak %s + CUDA graphs %s + non-torch %s, leaving %s for KV cache"
                 % (result["tp"], result["kv_dtype"], ctx["utilization"], gib(budget["requested_bytes"]),
                    gib(budget["weights_bytes"]), gib(budget["activation_peak_bytes"]),
                    gib(budget["cuda_graph_bytes"]), gib(budget["non_torch_bytes"]), gib(budget["kv_cache_bytes"])))
    if result["max_model_len"] is None:
        failed = startup_check(lay, budget["kv_cache_bytes"], ctx["floor_len"])
        if failed["available"] <= 0:
            parts.append("nothing is left for the KV cache (vLLM: \"No available memory for the cache blocks\")")
        else:
            parts.append("even at max_model_len %d vLLM would stop with: %s"
                         % (ctx["floor_len"], check_message(lay, ctx["floor_len"], failed)))
    elif ctx["peak"]:
        parts.append("at context %d the KV cache holds %d sequences, the workload peaks at %d and "
                     "max_num_seqs may not go below %d (policy.min_num_seqs)"
                     % (ctx["p99"] or result["max_model_len"], result.get("seqs_that_fit", 0), ctx["peak"],
                        ctx["min_seqs"]))
    parts.append("tried: " + ", ".join("TP %d %s -> %s" % (r["tp"], r["kv_dtype"], (
        "max_model_len %d" % r["max_model_len"]) if r["max_model_len"] else "estimated max %d" % r["fit_len"])
        for r in tried))
    parts.append(_hosts_hint(ctx, result))
    parts.append(_quantization_hint(ctx, result))
    return "; ".join(p for p in parts if p)


# The largest instance across hosts the hint considers.
MAX_HOSTS = 16


def _hosts_hint(ctx, result):
    """How many hosts with these GPUs one instance across them needs, planned as a replica group is (policy.nodes):
    tensor parallel within each host (the largest size vLLM shards the model over), as many pipeline stages per host
    as the plan has, room left for the cross-host buffers. A group that does not fit is asked with more hosts."""
    shape = ctx["shape"]
    if multi_node_refusal(ctx["version"]):
        return ""
    stages = max(1, ctx["pp"] // ctx["nodes"])  # per host
    tp = _tp_candidates(shape, ctx["tp_start"] if ctx["nodes"] == 1 else 1, ctx["gpus_per_node"] // stages, True)[-1]
    for hosts in range(ctx["nodes"] + 1, MAX_HOSTS + 1):
        pp = stages * hosts
        if pp > shape["layers"]:
            break
        group = dict(ctx, pp=pp, nodes=hosts, measured=[], loadtest=[])
        group["utilization"] = leave_headroom(group, tp, [], [])
        attempt = _attempt(group, tp, result["kv_dtype"], result["max_num_seqs"])
        if _fits_workload(attempt, group) or _fewer_seqs(attempt, group, tp):
            return ("one instance across %d hosts of %d x %s would hold it (tensor_parallel_size %d on each, "
                    "pipeline_parallel_size %d across them): policy.nodes %d plans that replica group "
                    "(docs/multi-node.md)" % (hosts, ctx["gpus_per_node"], ctx["gpu_name"], tp, pp, hosts))
    return "not even %d hosts of %d x %s would hold it as one instance" % (MAX_HOSTS, ctx["gpus_per_node"],
                                                                           ctx["gpu_name"])


# Checkpoints the hint considers: FP8 (as vLLM's fp8 method or compressed-tensors FP8-dynamic store it) and AWQ
# 4-bit with 128-wide groups, the common published forms; embeddings, lm_head, norms and routers stay 16-bit.
HINT_CHECKPOINTS = (("an 8-bit (FP8)", {"quant_method": "fp8"}),
                    ("a 4-bit (AWQ/GPTQ)", {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}))


def _quantization_hint(ctx, result):
    """Quantized weights cannot be applied to a checkpoint we do not have; say whether one would fit."""
    shape = ctx["shape"]
    if shape["quantized"]:
        return "the checkpoint is already quantized: this model needs more or larger GPUs"
    lay, weights = result["lay"], result["budget"]["weights_bytes"]
    for label, config in HINT_CHECKPOINTS:
        quant = parse_quantization(config)
        variant = dict(shape, quantization=quant, modules=module_tensors(shape["dims"], quant, shape["dtype_bytes"]),
                       weight_bytes=(0, "estimated"))
        smaller = gpu_weight_bytes(variant, lay["tp"], lay["pp"], bool(ctx["serve"].get("enable_expert_parallel")))
        kv = memory_budget(lay, ctx, result["max_num_seqs"], smaller)["kv_cache_bytes"]
        if _fitting(lay, kv, ctx["target_len"]) >= ctx["floor_len"]:
            if kv_capacity(lay, kv, ctx["p99"] or ctx["floor_len"])["held"] >= (ctx["peak"] or 1):
                return ("suggestion: %s checkpoint of this model would fit (about %s of weights per GPU instead of %s)"
                        % (label, gib(smaller), gib(weights)))
    return "even a 4-bit checkpoint would not fit: more or larger GPUs are needed"
