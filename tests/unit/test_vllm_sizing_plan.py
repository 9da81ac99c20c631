"""Policy of vllm_sizing: utilization, sizing to the workload, the fallback order, versions, conflicts, errors."""
import pytest
from ansible.errors import AnsibleFilterError
from conftest import gpu

from vllm_sizing import package, vllm_model, vllm_sizing
sz = package()  # the package behind the filters, every module loaded

GiB = 1 << 30
QWEN3 = vllm_model("Qwen/Qwen3-8B")


def plan_for(gpus, name="Qwen/Qwen3-8B", workload=None, **policy):
    return vllm_sizing(gpus, vllm_model(name), workload or {}, policy)


# --- Utilization ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy, expected", [
    ({}, 0.90),
    ({"gpu_sharing": "dedicated"}, 0.90),
    ({"gpu_sharing": "exclusive"}, 0.93),
    ({"gpu_sharing": "shared"}, 0.80),
    ({"runtime_ooms": True}, 0.85),
    ({"gpu_sharing": "exclusive", "runtime_ooms": True}, 0.85),
    ({"gpu_sharing": "shared", "runtime_ooms": True}, 0.80),
    ({"gpu_memory_utilization": 0.75}, 0.75),
])
def test_utilization_policy(a10g, policy, expected):
    plan = plan_for(a10g, "microsoft/Phi-3-mini-4k-instruct", {"p99_context": 4096}, **policy)
    assert plan["engine_args"]["gpu_memory_utilization"] == expected
    assert any("gpu_memory_utilization %.2f" % expected in line for line in plan["applied"])


def test_utilization_is_always_explicit_and_never_one(a10g):
    plan = plan_for(a10g, workload={"p99_context": 4096})
    assert 0 < plan["engine_args"]["gpu_memory_utilization"] < 1
    assert any("would default to 1.0" in line for line in plan["applied"])  # 0.34's extensible KV cache
    with pytest.raises(AnsibleFilterError, match=r"policy.gpu_memory_utilization must be a number between 0 and 1"):
        plan_for(a10g, gpu_memory_utilization=1.0)


def test_runtime_ooms_turn_cuda_graphs_off(a10g):
    plan = plan_for(a10g, workload={"p99_context": 4096}, runtime_ooms=True)
    assert plan["engine_args"]["enforce_eager"] is True
    assert plan["budget_per_gpu"]["cuda_graph_bytes"] == 0
    assert plan_for(a10g, workload={"p99_context": 4096}, runtime_ooms=True,
                    enforce_eager=False)["engine_args"]["enforce_eager"] is False


def test_budget_from_usable_memory_not_nvidia_smi_total(h100x8):
    plan = plan_for(h100x8, workload={"p99_context": 8192})
    budget = plan["budget_per_gpu"]
    assert budget["usable_bytes"] < 81559 * (1 << 20)
    # CUDA reports about 79.2 GiB on an H100; the estimate keeps max(512 MiB, 1%) below nvidia-smi's total.
    assert 78.5 * GiB < budget["usable_bytes"] <= 79.2 * GiB
    assert budget["requested_bytes"] == -(-budget["usable_bytes"] * 9 // 10)
    parts = ("weights_bytes", "activation_peak_bytes", "cuda_graph_bytes", "non_torch_bytes", "kv_cache_bytes")
    assert sum(budget[k] for k in parts) <= budget["requested_bytes"]
    assert plan_for(h100x8, workload={"p99_context": 8192},
                    usable_memory_mib=40000)["budget_per_gpu"]["usable_bytes"] == 40000 << 20


# --- Sizing to the workload -----------------------------------------------------------------------------------------

def test_max_model_len_is_the_workload_p99_not_the_model_maximum(h100x8):
    plan = plan_for(h100x8, workload={"p99_context": 12000, "peak_concurrency": 8})
    assert plan["fits"] and plan["engine_args"]["max_model_len"] == 12000
    assert plan["engine_args"]["max_num_seqs"] == 8
    assert plan["engine_args"]["kv_cache_dtype"] == "auto" and plan["engine_args"]["tensor_parallel_size"] == 1
    assert plan["concurrency_at_max_model_len"] >= 8
    assert any("not the model's maximum 40960" in line for line in plan["applied"])


def test_max_model_len_capped_at_max_position_embeddings(h100x8):
    plan = plan_for(h100x8, max_model_len=131072)
    assert plan["engine_args"]["max_model_len"] == 40960
    assert any("capped at the model's maximum context 40960" in line for line in plan["applied"])


def test_p99_longer_than_the_model_is_impossible(a10g):
    with pytest.raises(AnsibleFilterError, match=r"host gpu-7: Qwen/Qwen3-8B: workload.p99_context 65536 is longer "
                       r"than the model's maximum context 40960"):
        plan_for(a10g, workload={"p99_context": 65536}, host="gpu-7")


def test_max_model_len_below_p99_is_refused(a10g):
    with pytest.raises(AnsibleFilterError, match=r"max_model_len 2048 is shorter than workload.p99_context 4096"):
        plan_for(a10g, workload={"p99_context": 4096}, max_model_len=2048)


# --- The fallback order ------------------------------------------------------------------------------------------

def test_step1_shorter_max_model_len(a10g):
    # No workload: the model's 40960 does not fit an A10G next to 15 GiB of weights; shrink, keep bf16.
    plan = plan_for(a10g)
    length = plan["engine_args"]["max_model_len"]
    assert plan["fits"] and 4096 <= length < 40960 and length % 1024 == 0
    assert plan["engine_args"]["kv_cache_dtype"] == "auto"
    assert any(line.startswith("max_model_len %d: 40960 does not fit" % length) for line in plan["applied"])
    # What is left fits one request at that length, by vLLM's own check.
    lay = sz.kv.kv_layout(sz.shape.model_shape(QWEN3), 1, 1, "auto", None,
                          None, None, "0.34.0", sz.kv.device_facts("cuda"))
    assert sz.kv.startup_check(lay, plan["budget_per_gpu"]["kv_cache_bytes"], length) is None


def test_step1_stops_at_the_p99_floor_then_step2_fp8(a10g):
    plan = plan_for(a10g, workload={"max_context": 40960, "p99_context": 24576})
    assert plan["fits"] and plan["engine_args"]["kv_cache_dtype"] == "fp8"
    assert plan["engine_args"]["max_model_len"] >= 24576
    assert any("kv_cache_dtype fp8" in line for line in plan["applied"])
    assert any("fp8 KV cache" in line for line in plan["warnings"])


def test_fp8_not_used_when_forbidden_or_unsupported(a10g):
    with pytest.raises(AnsibleFilterError) as err:
        plan_for(a10g, workload={"p99_context": 24576}, allow_fp8_kv_cache=False, host="a10-1")
    message = str(err.value)
    assert "host a10-1" in message and "Qwen/Qwen3-8B does not fit on 1 x NVIDIA A10G" in message
    assert "To serve at least one request with the model's max seq len (24576), (3.38 GiB KV cache is needed" in message
    assert "the estimated maximum model length is" in message
    t4 = [gpu("Tesla T4", 15360, "7.5")]
    workload = {"p99_context": 4096, "peak_concurrency": 64}
    plan = vllm_sizing(t4, vllm_model("microsoft/Phi-3-mini-4k-instruct"), workload, {"strict": False})
    assert not plan["fits"] and plan["engine_args"]["kv_cache_dtype"] == "auto"
    assert "tried: TP 1 auto -> max_model_len 4096; " in plan["reason"]  # no fp8 attempt on compute capability 7.5


def test_step3_fewer_max_num_seqs(a10g):
    plan = plan_for(a10g, workload={"p99_context": 8192, "peak_concurrency": 8})
    seqs = plan["engine_args"]["max_num_seqs"]
    assert plan["fits"] and 4 <= seqs < 8  # default floor: half the peak
    assert plan["engine_args"]["kv_cache_dtype"] == "fp8"
    assert any(line.startswith("max_num_seqs %d (peak concurrency 8" % seqs) for line in plan["applied"])
    assert any("wait in the queue" in line for line in plan["warnings"])
    assert plan["kv_cache_tokens"] >= seqs * 8192


def test_step3_floor_then_step4_more_tensor_parallelism(h100x8):
    llama70 = {"p99_context": 32768, "peak_concurrency": 64}
    plan = plan_for(h100x8, "meta-llama/Llama-3.1-70B-Instruct", llama70)
    args = plan["engine_args"]
    assert plan["fits"] and args["tensor_parallel_size"] in (4, 8) and args["max_num_seqs"] >= 32
    assert any(line.startswith("tensor_parallel_size %d" % args["tensor_parallel_size"]) for line in plan["applied"])
    full = plan_for(h100x8, "meta-llama/Llama-3.1-70B-Instruct", llama70, min_num_seqs=64)
    assert full["engine_args"]["max_num_seqs"] == 64 and full["engine_args"]["tensor_parallel_size"] == 8
    fixed = plan_for(h100x8, "meta-llama/Llama-3.1-70B-Instruct", {"p99_context": 8192}, tensor_parallel_size=4,
                     allow_tensor_parallel=False)
    assert fixed["engine_args"]["tensor_parallel_size"] == 4


def test_lower_seqs_warning_names_the_tensor_parallel_size_that_serves_the_peak(h100x8):
    plan = plan_for(h100x8, "openai/gpt-oss-120b", {"p99_context": 65536, "peak_concurrency": 32}, min_num_seqs=1)
    assert plan["engine_args"]["tensor_parallel_size"] == 1 and plan["engine_args"]["max_num_seqs"] < 32
    assert any("tensor_parallel_size 2 would serve the peak of 32" in line for line in plan["warnings"])


def test_step5_quantized_weights_are_only_suggested(a10g):
    plan = plan_for(a10g, "google/gemma-3-27b-it", {"p99_context": 8192, "peak_concurrency": 2}, strict=False)
    assert plan["fits"] is False
    assert "suggestion: a 4-bit (AWQ/GPTQ) checkpoint of this model would fit" in plan["reason"]
    assert "No available memory for the cache blocks" in plan["reason"]
    with pytest.raises(AnsibleFilterError, match=r"^vllm_sizing: host small-1: google/gemma-3-27b-it does not fit"):
        plan_for(a10g, "google/gemma-3-27b-it", {"p99_context": 8192}, host="small-1")


def test_already_quantized_checkpoint_needs_bigger_gpus(a10g):
    plan = plan_for(a10g, "openai/gpt-oss-120b", {"p99_context": 8192}, strict=False)
    assert not plan["fits"] and "already quantized" in plan["reason"]


def test_a_model_too_large_for_the_host_names_the_fewest_hosts_whose_pipeline_holds_it(a10g):
    workload = {"p99_context": 8192, "peak_concurrency": 4}
    plan = plan_for(a10g, "meta-llama/Llama-3.1-70B-Instruct", workload, strict=False)
    assert not plan["fits"]
    hint = next(part for part in plan["reason"].split("; ") if part.startswith("one instance across"))
    hosts = int(hint.split()[3])
    assert hint == ("one instance across %d hosts of 1 x NVIDIA A10G would hold it (tensor_parallel_size 1 on each, "
                    "pipeline_parallel_size %d across them, before cross-host communication buffers, and replica groups "
                    "are not built yet: docs/multi-node.md)" % (hosts, hosts))
    # The same arithmetic, asked directly: that many pipeline stages serve the workload, one fewer does not.
    for stages, fits in ((hosts, True), (hosts - 1, False)):
        gpus = [dict(a10g[0], index=n, uuid="GPU-%d" % n) for n in range(stages)]
        staged = plan_for(gpus, "meta-llama/Llama-3.1-70B-Instruct", workload, strict=False,
                          pipeline_parallel_size=stages)
        assert staged["fits"] is fits, staged["reason"]
    tiny = [gpu("Tesla T4", 15360, "7.5")]
    assert "not even 16 hosts of 1 x Tesla T4 would hold it" in plan_for(
        tiny, "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", {"p99_context": 32768, "peak_concurrency": 64},
        strict=False)["reason"]


# --- Conflicts, environment, versions -----------------------------------------------------------------------------

def test_expandable_segments_with_tensor_parallel_disables_custom_all_reduce(h100x8):
    plan = plan_for(h100x8, "meta-llama/Llama-3.1-70B-Instruct", {"p99_context": 8192})
    assert plan["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert plan["engine_args"]["tensor_parallel_size"] > 1
    assert plan["engine_args"]["disable_custom_all_reduce"] is True
    assert any("custom all-reduce" in line for line in plan["warnings"])
    single = plan_for(h100x8, workload={"p99_context": 8192})
    assert "disable_custom_all_reduce" not in single["engine_args"]
    off = plan_for(h100x8, "meta-llama/Llama-3.1-70B-Instruct", {"p99_context": 8192}, expandable_segments=False)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in off["env"] and "disable_custom_all_reduce" not in off["engine_args"]


@pytest.mark.parametrize("version, on", [("0.25.0", False), ("0.26.0", True), ("0.32.0", True), ("0.34.0", True)])
def test_the_startup_plan_is_on_where_the_release_has_it(h100x8, version, on):
    """VLLM_ENABLE_STARTUP_PLAN exists from 0.26.0 (the release table's startup_plan, read from each release's
    v1/worker/startup_plan.py); policy.startup_plan false leaves it out."""
    plan = plan_for(h100x8, workload={"p99_context": 8192}, vllm_version=version)
    assert ("VLLM_ENABLE_STARTUP_PLAN" in plan["env"]) is on
    assert any(line.startswith("VLLM_ENABLE_STARTUP_PLAN=1: vLLM %s stores" % version) for line in plan["applied"]) is on
    off = plan_for(h100x8, workload={"p99_context": 8192}, vllm_version=version, startup_plan=False)
    assert "VLLM_ENABLE_STARTUP_PLAN" not in off["env"]


def test_version_table_drives_block_size_and_batch_defaults(h100x8, a10g):
    assert plan_for(h100x8, workload={"p99_context": 8192})["block_size"] == 64
    old = plan_for(h100x8, workload={"p99_context": 8192}, vllm_version="0.32.0")
    assert old["block_size"] == 16 and old["vllm_version"] == "0.32.0"
    assert "explicit gpu_memory_utilization: vLLM 0.32.0 would default to 0.92" in old["applied"]
    h100 = plan_for(h100x8)["engine_args"]
    assert (h100["max_num_batched_tokens"], h100["max_num_seqs"]) == (8192, 1024)
    a10 = plan_for(a10g)["engine_args"]
    assert (a10["max_num_batched_tokens"], a10["max_num_seqs"]) == (2048, 256)
    a100 = plan_for([gpu("NVIDIA A100-SXM4-80GB", 81920, "8.0")])["engine_args"]
    assert (a100["max_num_batched_tokens"], a100["max_num_seqs"]) == (2048, 256)
    b200 = plan_for([gpu("NVIDIA B200", 183359, "10.0")])["engine_args"]
    assert (b200["max_num_batched_tokens"], b200["max_num_seqs"]) == (16384, 1024)
    assert plan_for([gpu("NVIDIA B200", 183359, "10.0")], vllm_version="0.11.0")["engine_args"][
        "max_num_batched_tokens"] == 8192


def test_batched_tokens_at_least_max_num_seqs(h100x8):
    plan = plan_for(h100x8, workload={"p99_context": 1024, "peak_concurrency": 4000}, strict=False)
    assert plan["engine_args"]["max_num_batched_tokens"] >= plan["engine_args"]["max_num_seqs"]


def test_plan_keys(a10g):
    plan = plan_for(a10g, workload={"p99_context": 4096, "peak_concurrency": 2}, host="a10-1")
    assert set(plan) == {"fits", "reason", "vllm_version", "host", "model", "gpus", "engine_args", "env",
                         "budget_per_gpu", "block_size", "attention_backend", "kv_cache_tokens",
                         "concurrency_at_max_model_len", "concurrency_limit", "kv_bytes_per_request", "applied",
                         "warnings"}
    assert set(plan["engine_args"]) == {"model", "gpu_memory_utilization", "max_model_len", "max_num_seqs",
                                        "max_num_batched_tokens", "kv_cache_dtype", "tensor_parallel_size",
                                        "enforce_eager", "block_size"}
    assert plan["engine_args"]["block_size"] == plan["block_size"] == 64
    assert plan["attention_backend"] == "FLASH_ATTN"
    assert plan["host"] == "a10-1" and plan["engine_args"]["model"] == "Qwen/Qwen3-8B"
    assert plan["reason"].startswith("Qwen/Qwen3-8B fits on 1 x NVIDIA A10G")


def test_policy_model_name_and_weight_estimates(a10g):
    config = {k: v for k, v in QWEN3.items() if not k.startswith("_")}
    plan = vllm_sizing(a10g, config, {"p99_context": 4096}, {"model": "/srv/models/qwen3"})
    assert plan["engine_args"]["model"] == "/srv/models/qwen3"
    assert any("estimated from config.json shapes" in line for line in plan["warnings"])
    # The shape estimate is within 2% of the real parameter count.
    assert abs(sz.shape.model_shape(config)["weight_bytes"][0] - QWEN3["_weight_bytes"]) < 0.02 * QWEN3["_weight_bytes"]
    by_count = dict(config, _num_parameters=8190735360)
    assert sz.shape.model_shape(by_count)["weight_bytes"] == (16381470720, "from _num_parameters x 2 bytes")


def test_busy_gpu_warns(a10g):
    busy = [dict(a10g[0], memory_used_mib=6000)]
    plan = plan_for(busy, workload={"p99_context": 4096})
    assert any("already has 6000 MiB in use" in line for line in plan["warnings"])


def test_mig_needs_usable_memory():
    mig = [gpu("NVIDIA A100-SXM4-80GB MIG 3g.40gb", None, "8.0")]
    with pytest.raises(AnsibleFilterError, match=r"gpus\[0\].memory_total_mib is null .* policy.usable_memory_mib"):
        plan_for(mig)
    assert plan_for(mig, workload={"p99_context": 4096}, usable_memory_mib=40000)["fits"]


def test_tp_times_pp_beyond_the_group(a10g):
    with pytest.raises(AnsibleFilterError, match=r"needs 2 GPUs, the group has 1"):
        plan_for(a10g, tensor_parallel_size=2)


def test_pipeline_parallel_plan(h100x8):
    plan = plan_for(h100x8, "meta-llama/Llama-3.1-70B-Instruct", {"p99_context": 8192}, pipeline_parallel_size=2,
                    tensor_parallel_size=2)
    assert plan["engine_args"]["pipeline_parallel_size"] == 2
    assert plan["gpus"]["used"] == plan["engine_args"]["tensor_parallel_size"] * 2


# --- The catalog --------------------------------------------------------------------------------------------------

def test_catalog_entries_are_sized(h100x8):
    names = sorted(sz.shape._catalog())
    assert len(names) == 23
    for name in names:
        entry = vllm_model(name)
        # Quantized entries are sized from quantization_config, the others from their parameter bytes.
        assert entry["_name"] == name and entry["_source"]
        assert sz.shape.model_shape(entry)["weight_bytes"][0] > 0, name
        plan = vllm_sizing(h100x8, entry, {"p99_context": 4096, "peak_concurrency": 4})
        assert plan["fits"], name


def test_catalog_returns_a_copy():
    entry = vllm_model("Qwen/Qwen3-8B")
    entry["num_hidden_layers"] = 1
    assert vllm_model("Qwen/Qwen3-8B")["num_hidden_layers"] == 36


def test_unknown_catalog_name_lists_known_names():
    with pytest.raises(AnsibleFilterError, match=r"unknown model 'Qwen/Qwen9'; known models: .*Qwen/Qwen3-8B"):
        vllm_model("Qwen/Qwen9")


# --- Every release plans (issue 24: 4 of the 36 releases since 0.11.0 did) ------------------------------------------

L4 = [gpu("NVIDIA L4", 23034, "8.9")]
H100X2 = [dict(gpu("NVIDIA H100 80GB HBM3", 81559, "9.0"), index=i) for i in range(2)]


@pytest.mark.parametrize("version", sorted(sz.versions.VERSIONS, key=sz.versions.version_key))
def test_every_release_of_the_table_plans_and_renders(version):
    """The issue's probe (Qwen3-8B on an L4) plus an MLA model at TP 2 and a sliding-window model, under every row:
    each plans, and its command line renders with that release's spellings."""
    from vllm_sizing import vllm_serve_args
    for gpus, name, workload in ((L4, "Qwen/Qwen3-8B", {"p99_context": 8192, "peak_concurrency": 4}),
                                 (H100X2, "deepseek-ai/DeepSeek-V2-Lite-Chat", {"p99_context": 16384}),
                                 (L4, "google/gemma-2-2b-it", {"p99_context": 4096})):
        plan = vllm_sizing(gpus, vllm_model(name), workload, {"vllm_version": version,
                                                              "tensor_parallel_size": len(gpus)})
        assert plan["fits"] and plan["vllm_version"] == version, (name, plan["reason"])
        args = vllm_serve_args(plan)
        assert "--block-size" in args and "--max-model-len" in args
        assert 1 <= plan["concurrency_limit"] <= plan["engine_args"]["max_num_seqs"]
