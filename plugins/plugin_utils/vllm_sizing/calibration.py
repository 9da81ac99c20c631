# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Calibration: what vLLM printed at a real start (vllm_startup_report) replaces the budget's estimates for the
same configuration.

The store (the vllm role's vllm_calibration_dir, next to the inventory) holds one JSON entry per instance start,
under the directory calibration_key(plan) names: GPU model / model / vLLM version / parallelism, dtype, KV dtype,
max_num_batched_tokens and eager. Not the utilization: the measured parts (weights, activation, non-torch, graphs) do
not depend on it, so a start calibrates plans at any utilization, and the KV it printed is compared with a
prediction only at the same one (comparable_kv). An entry is {"key": that directory, "host", "instance", "started_at",
"invocation_id", "report": {...}}; a bare report is taken as measured on the plan's first configuration.

A load test (the vllm role's tasks/loadtest.yml) records its own entry in that directory's loadtest/ subdirectory,
out of reach of the start entries' *.json: {"key", "host", "instance", "started", "p99_context", "max_num_seqs",
"held_concurrency", "passed", "broken": [limit names], "capped_by"}. One whose KV cache did not hold max_num_seqs caps
the next plan of the configuration at the concurrency it held (loadtest_cap). A test of a plan so capped carries that
cap in "capped_by" (the plan's own "loadtest"), so passing at the cap keeps it instead of the estimate coming back.
"""

import re

from .common import as_dict, as_utilization, fail, gib

# The parts of the budget a report measures: report key -> budget key.
PARTS = {"model_loading_bytes": "weights_bytes", "activation_peak_bytes": "activation_peak_bytes",
         "non_torch_bytes": "non_torch_bytes", "cuda_graph_bytes": "cuda_graph_bytes"}
# A plan whose prediction is further than this from what vLLM then had is flagged (plan.yml).
OFF_PERCENT = 3.0


def key_fields(plan):
    """The configuration a measurement holds for, from a plan (what the key is made of)."""
    args = plan["engine_args"]
    return {"gpu": plan["gpus"]["name"], "model": str(plan["model"]), "vllm_version": plan["vllm_version"],
            "tensor_parallel_size": args["tensor_parallel_size"],
            "pipeline_parallel_size": args.get("pipeline_parallel_size", 1),
            "dtype": str(args.get("dtype") or "auto"), "quantization": str(args.get("quantization") or "none"),
            "kv_cache_dtype": args["kv_cache_dtype"], "max_num_batched_tokens": args["max_num_batched_tokens"],
            "enforce_eager": bool(args["enforce_eager"]), "nodes": plan["gpus"].get("nodes", 1)}


def _word(text):
    return re.sub(r"[^a-z0-9._-]+", "-", str(text).lower()).strip("-") or "none"


def key_prefix(gpu, model):
    """The store's directory of every configuration of a GPU type and a model (a local model by its directory's
    name): the first two levels of key_path."""
    model = str(model)
    model = model.rstrip("/").rsplit("/", maxsplit=1)[-1] if model.startswith("/") else model
    return "/".join([_word(gpu), _word(model)])


def key_path(fields):
    """The store's directory of a configuration: gpu/model/vllm-version/tpN-ppM[-nK]-dtype-quant-kv-bN-mode, nK for
    a replica group of K hosts (its cross-host buffers are not a single host's of the same layout)."""
    nodes = ["n%d" % fields["nodes"]] if fields.get("nodes", 1) > 1 else []
    return "/".join([key_prefix(fields["gpu"], fields["model"]), "vllm-" + _word(fields["vllm_version"]), "-".join([
        "tp%d" % fields["tensor_parallel_size"], "pp%d" % fields["pipeline_parallel_size"], *nodes,
        _word(fields["dtype"]),
        _word(fields["quantization"]), "kv-" + _word(fields["kv_cache_dtype"]),
        "b%d" % fields["max_num_batched_tokens"], "eager" if fields["enforce_eager"] else "graphs"])])


def calibration_key(plan):
    """The store's directory for the configuration a plan runs (see key_path)."""
    plan = as_dict(plan, "plan")
    if not isinstance(plan.get("engine_args"), dict) or not isinstance(plan.get("gpus"), dict):
        fail("vllm_calibration_key takes a plan from vllm_sizing, got a dict without engine_args and gpus")
    return key_path(key_fields(plan))


def measurement(value):
    """policy.measured checked at the door: (report, key fields or None, where/when it was measured)."""
    entry = as_dict(value, "policy.measured")
    report = as_dict(entry["report"], "policy.measured.report") if "report" in entry else entry
    for name, number in report.items():
        if name.endswith("_bytes") and (isinstance(number, bool) or not isinstance(number, int) or number < 0):
            fail("policy.measured: %s must be a number of bytes, got %r (pass vllm_startup_report's dict or a "
                 "calibration store entry)" % (name, number))
    if report.get("gpu_memory_utilization") is not None:
        as_utilization(report["gpu_memory_utilization"], "policy.measured: gpu_memory_utilization")
    if not any(k in report for k in list(PARTS) + ["available_kv_cache_bytes"]):
        fail("policy.measured holds none of %s: not a vllm_startup_report of a start"
             % ", ".join(list(PARTS) + ["available_kv_cache_bytes"]))
    key = entry.get("key") if "report" in entry else None
    if key is not None and not isinstance(key, str):
        fail("policy.measured.key must be the store directory the entry was recorded under (vllm_calibration_key), "
             "got %r" % (key,))
    request = as_dict(entry.get("request"), "policy.measured.request") if "report" in entry else {}
    if request.get("gpu_memory_utilization") is not None:
        as_utilization(request["gpu_memory_utilization"],
                       "policy.measured.request.gpu_memory_utilization (the plan's at that start)")
    total = request.get("memory_total_mib")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total <= 0):
        fail("policy.measured.request.memory_total_mib must be the plan's memory_total_mib at that start, got %r"
             % (total,))
    source = {k: entry[k] for k in ("host", "instance", "started_at") if entry.get(k) is not None}
    return {"report": report, "key": key, "source": source, "request": request}


def measurements(entries):
    """policy.measured's entries checked at the door. Store entries name their configuration (each is used for its
    own); a bare report holds for the first configuration tried, so it comes alone."""
    found = [measurement(entry) for entry in entries]
    if len(found) > 1 and any(m["key"] is None for m in found):
        fail("policy.measured: a list takes calibration store entries (each with its key), not bare "
             "vllm_startup_report dicts; pass one report alone")
    return found


def applies(measured, attempt):
    """Whether a measurement was taken on this configuration (a bare report: the first one tried)."""
    if measured["key"] is None:
        return attempt["first"]
    return measured["key"] == key_path(attempt["fields"])


def _number(minimum):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def _text(value):
    return isinstance(value, str) and value != ""


# A load-test entry's fields: name -> (check, what the check wants, what the field is).
LOADTEST = {
    "key": (_text, "a non-empty string", "the store directory of the configuration tested (vllm_calibration_key)"),
    "host": (_text, "a non-empty string", "the host tested"),
    "instance": (_text, "a non-empty string", "the instance tested"),
    "started": (_text, "a non-empty string", "when the test started"),
    "p99_context": (_number(1), "an integer of at least 1", "tokens per request, prompt plus output"),
    "max_num_seqs": (_number(1), "an integer of at least 1", "the tested plan's max_num_seqs"),
    "held_concurrency": (_number(0), "an integer of at least 0",
                         "the most sequences served with nothing preempted or queued"),
    "passed": (lambda v: isinstance(v, bool), "true or false", "the verdict"),
    "broken": (lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v), "a list of limit names",
               "the limits the test broke"),
}


# A test that broke max_num_seqs, as a capped plan names it: its "loadtest".source (SOURCE) and the cap.
SOURCE = ("host", "instance", "started", "p99_context", "max_num_seqs")


def _entry(value, where, fields):
    entry = as_dict(value, where)
    missing = [name for name in fields if name not in entry]
    if missing:
        fail("%s lacks %s: pass a load-test entry of the calibration store (<key>/loadtest/<host>-<instance>.json, "
             "written by the vllm role's tasks/loadtest.yml)" % (where, ", ".join(missing)))
    for name, (check, wanted, what) in fields.items():
        if not check(entry[name]):
            fail("%s.%s must be %s (%s), got %r" % (where, name, wanted, what, entry[name]))
    return {name: entry[name] for name in fields}


def loadtest(value):
    """policy.loadtest checked at the door: a load-test entry of the calibration store."""
    entry = _entry(value, "policy.loadtest", LOADTEST)
    capped_by = as_dict(value, "policy.loadtest").get("capped_by")
    if capped_by is not None:
        capped_by = as_dict(capped_by, "policy.loadtest.capped_by")
        held = capped_by.get("held_concurrency")
        if not _number(1)(held):
            fail("policy.loadtest.capped_by.held_concurrency must be an integer of at least 1 (the cap the tested "
                 "plan had), got %r" % (held,))
        capped_by = {"held_concurrency": held, "source": _entry(
            capped_by.get("source"), "policy.loadtest.capped_by.source", {n: LOADTEST[n] for n in SOURCE})}
    return dict(entry, capped_by=capped_by)


def loadtest_cap(entry, fields, context):
    """(max_num_seqs, the test that set it) a load test proved for this configuration at requests of `context`
    tokens, or None. Only a test that broke max_num_seqs sets a cap (a passing one, or one that failed for errors,
    latency or OOMs, says nothing of the KV cache), of the same configuration, at a context at least as long: what
    held there holds for shorter requests, a shorter test says nothing of longer ones. A test of a capped plan that
    did not break max_num_seqs keeps the cap it ran with: the estimate above it already failed."""
    if entry["key"] != key_path(fields):
        return None
    if "max_num_seqs" in entry["broken"]:
        held, source = max(entry["held_concurrency"], 1), {name: entry[name] for name in SOURCE}
    elif entry["capped_by"] is not None:
        held, source = entry["capped_by"]["held_concurrency"], entry["capped_by"]["source"]
    else:
        return None
    return (held, source) if source["p99_context"] >= context else None


def describe_loadtest(entry, capped, planned):
    """One line for the plan's `applied` when a load test capped max_num_seqs (`capped`: the plan's loadtest)."""
    source = capped["source"]
    line = ("max_num_seqs %d: the load test on %s instance %s started %s held %d sequences at p99 context %d "
            "(max_num_seqs %d); the estimate allowed %d" % (
                capped["held_concurrency"], source["host"], source["instance"], source["started"],
                capped["held_concurrency"], source["p99_context"], source["max_num_seqs"], planned))
    if source["started"] != entry["started"]:
        line += "; the test on %s instance %s started %s ran at that cap" % (
            entry["host"], entry["instance"], entry["started"])
    return line


def compile_cache(report):
    """warm, cold (torch.compile compiled at this start, which leaves less for the KV cache) or none (eager)."""
    if "compiled_from_cache" not in report:
        return "none"
    return "warm" if report["compiled_from_cache"] else "cold"


# vLLM prints the utilization with two decimals at most; closer than this is the same request.
SAME_UTILIZATION = 0.005
# vLLM prints GiB rounded to two decimals.
PRINTED_GIB_ROUNDING = 0.005 * (1 << 30)


def cpu_build(report):
    """Whether the start was vLLM's CPU build: its KV space is VLLM_CPU_KVCACHE_SPACE, whatever the memory."""
    return report.get("kv_cache_device") == "CPU"


def comparable_kv(report, utilization):
    """(KV bytes vLLM had, or would have had, at the plan's utilization, how) from a report; (None, why) when the
    report cannot say, or from the CPU build (its KV space is VLLM_CPU_KVCACHE_SPACE, not GPU memory). Same utilization:
    as printed.
    Another utilization: vLLM's requested memory at the plan's utilization less what the start measured besides the
    KV cache (its requested memory less its KV), which do not depend on the utilization."""
    kv = report.get("available_kv_cache_bytes")
    if kv is None:
        return None, "not compared: the start printed no KV cache memory"
    if "startup_plan_kv_cache_bytes" in report:
        return None, "not compared: the start applied vLLM's startup plan (no memory profile, the stored KV cache)"
    if cpu_build(report):  # the plan predicts GPU memory
        return None, "not compared: the CPU build's KV space (VLLM_CPU_KVCACHE_SPACE) is not the GPU memory predicted"
    used, requested, total = (report.get(k) for k in ("gpu_memory_utilization", "requested_memory_bytes",
                                                      "total_memory_bytes"))
    # Any two of utilization, requested and total memory give the third.
    if used is None and requested is not None and total:
        used = requested / total
    if used is None:
        return None, "not compared: the start printed neither its gpu_memory_utilization nor its requested memory"
    if abs(used - utilization) < SAME_UTILIZATION:
        return kv, "as printed (the start ran at the plan's gpu_memory_utilization %.2f)" % utilization
    if total is None and requested is None:
        return None, ("not compared: the start ran at gpu_memory_utilization %.2f, the plan at %.2f, and it printed "
                      "no memory total to re-derive its KV cache at %.2f" % (used, utilization, utilization))
    if total is None:
        total = requested / used
    if requested is None:
        requested = round(total * used)
    derived = max(0, round(total * utilization) - (requested - kv))
    return derived, ("re-derived at gpu_memory_utilization %.2f (the start ran at %.2f): %s requested there less the "
                     "%s the start measured besides the KV cache" % (utilization, used, gib(round(total * utilization)),
                                                                     gib(requested - kv)))


def same_request(measured, budget, utilization, total_mib):
    """Whether vLLM asked for the same memory at that start as it will for this plan, so that the KV cache it printed
    is what it will have again: the same utilization on a GPU of the same nvidia-smi total (what the store entry
    recorded of its plan). A bare report can only say it through the requested memory it printed, which vLLM rounds
    to 0.01 GiB (and whose total is CUDA's, not nvidia-smi's)."""
    report, request = measured["report"], measured["request"]
    if request.get("gpu_memory_utilization") is not None and request.get("memory_total_mib") is not None:
        return (abs(request["gpu_memory_utilization"] - utilization) < SAME_UTILIZATION
                and request["memory_total_mib"] == total_mib)
    printed = report.get("requested_memory_bytes")
    return printed is not None and abs(printed - budget["requested_bytes"]) <= PRINTED_GIB_ROUNDING


def measured_parts(report, row):
    """The budget parts a report measured, as the budget counts them: report key -> bytes."""
    parts = {budget_key: report[key] for key, budget_key in PARTS.items() if key in report}
    if "non_torch_bytes" not in parts and "weights_plus_non_torch_bytes" in report and "model_loading_bytes" in report:
        # 0.27+: "consumed memory (weights + non-torch)".
        parts["non_torch_bytes"] = max(0, report["weights_plus_non_torch_bytes"] - report["model_loading_bytes"])
    # Where vLLM takes the CUDA-graph estimate from the KV memory, the estimate is the part, not the capture.
    estimate = report.get("cuda_graph_estimated_bytes")
    equivalent, total = report.get("cuda_graph_equivalent_utilization"), report.get("total_memory_bytes")
    if estimate is None and equivalent is not None and total is not None:
        estimate = round((report["gpu_memory_utilization"] - equivalent) * total)
    if estimate is not None:
        parts["cuda_graph_bytes"] = estimate
    if "weights_plus_non_torch_bytes" in report and "activation_peak_bytes" in report and estimate is None \
            and (row["cuda_graph_estimate"]["v1"] or row["cuda_graph_estimate"]["v2"]):
        # 0.27+'s summary line counts the estimate it took within its peak activation.
        parts["cuda_graph_bytes"] = 0
    return parts


def measured_budget(budget, measured, utilization, total_mib, row, startup_plan=False):
    """The budget with the measured parts in place of the estimates, and what was measured.

    The KV cache: vLLM's own figure when it asked for the same memory (same_request) or on a CPU build (its KV space
    is fixed by VLLM_CPU_KVCACHE_SPACE); else what the measured parts leave. A cold compile cache measured more
    activation than a warm start needs: its parts are used, but the KV never goes above the estimate's until a warm
    start is measured. With vLLM's startup plan on (`startup_plan`), a profiled start stores for the later starts the
    KV cache its summary line suggests (150 MiB below what it had, vLLM's redundancy buffer) and a start that applied
    it prints that: the plan takes that figure, the one its later starts run with."""
    report = measured["report"]
    out = dict(budget)
    values = measured_parts(report, row)
    # CUDA graphs count only where the budget has them (versions that take them from the KV memory, not eager).
    parts = [key for key in values if not (key == "cuda_graph_bytes" and budget["cuda_graph_bytes"] == 0)]
    for key in parts:
        out[key] = values[key]
    if parts:
        out["kv_cache_bytes"] = max(0, budget["kv_cache_bytes"] + sum(budget[p] - out[p] for p in parts))
    kv = report.get("startup_plan_kv_cache_bytes", report.get("available_kv_cache_bytes"))
    kept = report.get("kv_cache_memory_suggested_bytes") if startup_plan else None
    if kv is not None and (cpu_build(report) or same_request(measured, budget, utilization, total_mib)):
        out["kv_cache_bytes"] = kv if kept is None else min(kv, kept)
        parts.append("kv_cache_bytes")
    cache = compile_cache(report)
    if cache == "cold":
        out["kv_cache_bytes"] = min(out["kv_cache_bytes"], budget["kv_cache_bytes"])
    compared, how = comparable_kv(report, utilization)
    return out, {"parts": parts, "compile_cache": cache, "predicted_kv_cache_bytes": budget["kv_cache_bytes"],
                 "measured_kv_cache_bytes": kv, "compared_kv_cache_bytes": compared, "compared": how,
                 "cpu_build": cpu_build(report), "source": measured["source"],
                 # Said only where the plan took it: below what that start had.
                 "startup_plan_kv_cache_bytes": kept if "kv_cache_bytes" in parts and out["kv_cache_bytes"] == kept
                 else None}


def describe(info):
    """One line for the plan's `applied`."""
    where = info["source"]
    at = " on %s instance %s" % (where["host"], where.get("instance", "?")) if "host" in where else ""
    when = " started %s" % where["started_at"] if "started_at" in where else ""
    line = "measured%s%s: %s used instead of estimates" % (at, when, ", ".join(info["parts"]) or "nothing")
    if info["measured_kv_cache_bytes"] is not None:
        line += " (predicted KV %s, vLLM had %s; compared %s)" % (
            gib(info["predicted_kv_cache_bytes"]), gib(info["measured_kv_cache_bytes"]), info["compared"])
    if info["compile_cache"] == "cold":
        line += "; cold torch.compile cache at that start: the KV cache stays at the estimate's until a warm start " \
                "is measured"
    if info.get("startup_plan_kv_cache_bytes") is not None:
        line += "; KV cache %s, what vLLM's startup plan keeps for the later starts" % gib(
            info["startup_plan_kv_cache_bytes"])
    return line


def error_percent(info):
    """How far the prediction was from what vLLM had at the plan's utilization (positive: the plan expected more),
    None if that is not known (see comparable_kv)."""
    kv = info["compared_kv_cache_bytes"]
    if not kv:
        return None
    return round(100.0 * (info["predicted_kv_cache_bytes"] - kv) / kv, 1)
