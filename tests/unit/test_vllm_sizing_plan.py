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
                    "pipeline_parallel_size %d across them): policy.nodes %d plans that replica group "
                    "(docs/multi-node.md)" % (hosts, hosts, hosts))
    # The same arithmetic, asked as the replica group it names: that many hosts serve the workload, one fewer not.
    for nodes, fits in ((hosts, True), (hosts - 1, False)):
        staged = plan_for(hosts_of(a10g, nodes), "meta-llama/Llama-3.1-70B-Instruct", workload, strict=False,
                          nodes=nodes)
        assert staged["fits"] is fits, staged["reason"]
        assert staged["engine_args"]["pipeline_parallel_size"] == nodes
    # A group too small is told the same number of hosts.
    assert hint in staged["reason"]
    tiny = [gpu("Tesla T4", 15360, "7.5")]
    assert "not even 16 hosts of 1 x Tesla T4 would hold it" in plan_for(
        tiny, "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", {"p99_context": 32768, "peak_concurrency": 64},
        strict=False)["reason"]
    # A release without multi-node serving (--nnodes came in 0.11.1) names no hosts.
    assert "one instance across" not in plan_for(a10g, "meta-llama/Llama-3.1-70B-Instruct", workload, strict=False,
                                                 vllm_version="0.11.0")["reason"]


# --- Replica groups: one instance across hosts ------------------------------------------------------------------

def hosts_of(gpus, nodes):
    """The GPU facts of `nodes` hosts like the one given, as a replica group's plan takes them (all of theirs)."""
    return [dict(g, index=g["index"], uuid="GPU-%d-%d" % (n, g["index"])) for n in range(nodes) for g in gpus]


A10G_X4 = [dict(gpu("NVIDIA A10G", 23028, "8.6"), index=i) for i in range(4)]
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"


def test_a_replica_group_runs_tensor_parallel_in_each_host_and_a_pipeline_stage_per_host():
    workload = {"p99_context": 8192, "peak_concurrency": 8}
    assert not plan_for(A10G_X4, LLAMA_70B, workload, strict=False)["fits"]
    plan = plan_for(hosts_of(A10G_X4, 2), LLAMA_70B, workload, nodes=2)
    args = plan["engine_args"]
    assert plan["fits"] and (args["tensor_parallel_size"], args["pipeline_parallel_size"]) == (4, 2)
    assert plan["gpus"] == {"name": "NVIDIA A10G", "count": 8, "used": 8, "memory_total_mib": 23028, "nodes": 2}
    assert plan["reason"].startswith("meta-llama/Llama-3.1-70B-Instruct fits on 2 hosts of 4 x NVIDIA A10G "
                                     "(tensor_parallel_size 4, pipeline_parallel_size 2): ")
    assert any(line.startswith("one instance across a replica group of 2 hosts") for line in plan["applied"])
    # The same layout on one host of 8 GPUs: a stage per host leaves the cross-host buffers outside vLLM's share,
    # which 0.90 of an A10G does (2.2 GiB), so the budget is the same.
    one_host = plan_for(hosts_of(A10G_X4, 2), LLAMA_70B, workload, tensor_parallel_size=4, pipeline_parallel_size=2,
                        allow_tensor_parallel=False)
    assert one_host["gpus"]["nodes"] == 1 and one_host["budget_per_gpu"] == plan["budget_per_gpu"]
    assert sz.budget.CROSS_NODE_BYTES["pipeline"] == {"headroom": 512 << 20, "profiled": 0}


def test_a_replica_group_leaves_its_cross_host_buffers_outside_vllms_share():
    workload = {"p99_context": 8192, "peak_concurrency": 4}
    group = hosts_of(A10G_X4, 2)
    usable = sz.inputs.gpu_group(group, None)[2]
    # Tensor parallel across the hosts: the profile's all-reduces put as much again inside the share (non-torch).
    across = plan_for(group, LLAMA_70B, workload, nodes=2, tensor_parallel_size=8, gpu_sharing="exclusive")
    inside = plan_for(group, LLAMA_70B, workload, tensor_parallel_size=8, gpu_sharing="exclusive")
    cross = sz.budget.CROSS_NODE_BYTES["tensor"]
    assert (across["budget_per_gpu"]["non_torch_bytes"] - inside["budget_per_gpu"]["non_torch_bytes"]
            == cross["profiled"] > 0)
    # 0.93 of an A10G leaves 1.6 GiB outside vLLM's share: more than the 768 MiB, so kept.
    assert across["engine_args"]["gpu_memory_utilization"] == 0.93 and usable * 0.07 > cross["headroom"]
    # On 11 GiB cards 0.93 leaves 735 MiB: lowered to what leaves the buffers room (10,752 MiB usable: 0.92).
    small = hosts_of([dict(gpu("NVIDIA GeForce RTX 2080 Ti", 11264, "7.5"), index=i) for i in range(4)], 2)
    lowered = plan_for(small, "Qwen/Qwen3-8B", {"p99_context": 4096}, nodes=2, tensor_parallel_size=8,
                       gpu_sharing="exclusive")
    assert lowered["engine_args"]["gpu_memory_utilization"] == 0.92
    assert "gpu_memory_utilization 0.92: leaves the cross-host communication buffers (about 768 MiB a GPU) outside " \
           "vLLM's share" in lowered["applied"]
    # Set by the operator: kept, with a warning.
    kept = plan_for(group, LLAMA_70B, workload, nodes=2, tensor_parallel_size=8, gpu_memory_utilization=0.97,
                    strict=False)
    assert kept["engine_args"]["gpu_memory_utilization"] == 0.97
    assert any(line.startswith("gpu_memory_utilization 0.97 leaves") and "at most 0.96" in line
               for line in kept["warnings"]), kept["warnings"]


def test_a_replica_groups_measurements_are_filed_apart_from_a_single_host_of_the_same_layout():
    workload = {"p99_context": 8192, "peak_concurrency": 8}
    group = plan_for(hosts_of(A10G_X4, 2), LLAMA_70B, workload, nodes=2)
    one_host = plan_for(hosts_of(A10G_X4, 2), LLAMA_70B, workload, tensor_parallel_size=4, pipeline_parallel_size=2,
                        allow_tensor_parallel=False)
    single, grouped = sz.calibration.calibration_key(one_host), sz.calibration.calibration_key(group)
    assert "/tp4-pp2-" in single and "-n2-" not in single  # a single host's key is what it always was
    assert grouped == single.replace("/tp4-pp2-", "/tp4-pp2-n2-")
    # The group's own measurement applies to its plan, the single host's does not.
    report = {"model_loading_bytes": 17 << 30, "activation_peak_bytes": 1 << 30, "non_torch_bytes": 1 << 30,
              "cuda_graph_bytes": 1 << 29, "kv_cache_bytes": 1 << 30, "gpu_memory_utilization": 0.9}
    measured = plan_for(hosts_of(A10G_X4, 2), LLAMA_70B, workload, nodes=2, strict=False,
                        measured={"key": grouped, "report": report})
    assert measured["calibration"]["used"] is True
    assert "calibration" not in plan_for(hosts_of(A10G_X4, 2), LLAMA_70B, workload, nodes=2, strict=False,
                                         measured={"key": single, "report": report})


def test_a_replica_group_takes_the_layout_it_is_given_and_warns_of_tensor_parallel_across_hosts():
    workload = {"p99_context": 8192, "peak_concurrency": 4}
    across = plan_for(hosts_of(A10G_X4, 2), LLAMA_70B, workload, nodes=2, tensor_parallel_size=8)
    args = across["engine_args"]
    assert args["tensor_parallel_size"] == 8 and "pipeline_parallel_size" not in args
    assert any("tensor parallelism across hosts" in line for line in across["warnings"])
    staged = plan_for(hosts_of(A10G_X4, 2), LLAMA_70B, workload, nodes=2, pipeline_parallel_size=4)
    assert (staged["engine_args"]["tensor_parallel_size"], staged["engine_args"]["pipeline_parallel_size"]) == (2, 4)
    assert not any("across hosts" in line for line in staged["warnings"])


@pytest.mark.parametrize("gpus, policy, message", [
    (A10G_X4[:3] + A10G_X4, {"nodes": 2}, r"host g1: meta-llama/Llama-3.1-70B-Instruct: policy.nodes 2: the group's 7 "
                                          r"GPUs are not as many on each host"),
    (hosts_of(A10G_X4, 2), {"nodes": 2, "tensor_parallel_size": 2, "pipeline_parallel_size": 2},
     r"a replica group of 2 hosts runs one instance on all its 8 GPUs: tensor_parallel_size 2 x "
     r"pipeline_parallel_size 2 must be 8"),
    (hosts_of(A10G_X4[:3], 2), {"nodes": 2, "pipeline_parallel_size": 3},
     r"tensor_parallel_size 2 with 3 GPUs a host would split a tensor-parallel group unevenly"),
    (hosts_of(A10G_X4, 2), {"nodes": 2, "vllm_version": "0.11.0"},
     r"policy.nodes 2: vLLM 0.11.0 cannot run one instance across hosts without Ray \(--nnodes came in 0.11.1\)"),
])
def test_a_replica_group_layout_that_cannot_run_is_refused_before_sizing(gpus, policy, message):
    with pytest.raises(AnsibleFilterError, match=message):
        plan_for(gpus, LLAMA_70B, {"p99_context": 8192}, host="g1", **policy)


def test_every_member_gets_the_plans_arguments_and_only_the_followers_run_headless():
    plan = plan_for(hosts_of(A10G_X4, 2), LLAMA_70B, {"p99_context": 8192, "peak_concurrency": 4}, nodes=2,
                    model="/srv/models/llama-70b")
    head = sz.flags.group_member_args(plan, 0, "10.0.0.1", 29500)
    follower = sz.flags.group_member_args(plan, 1, "10.0.0.1", 29500)
    assert head == {"nnodes": 2, "node_rank": 0, "master_addr": "10.0.0.1", "master_port": 29500, "headless": False}
    assert follower == dict(head, node_rank=1, headless=True)
    head_argv, follower_argv = (sz.flags.vllm_serve_args(plan, m) for m in (head, follower))
    assert "--headless" in follower_argv and "--headless" not in head_argv
    assert [w for w in follower_argv if w != "--headless"] == [
        "1" if w == "0" and head_argv[i - 1] == "--node-rank" else w for i, w in enumerate(head_argv)]
    assert head_argv[head_argv.index("--nnodes") + 1] == "2"
    with pytest.raises(AnsibleFilterError, match=r"rank must be an integer from 0 to 1"):
        sz.flags.group_member_args(plan, 2, "10.0.0.1", 29500)
    with pytest.raises(AnsibleFilterError, match=r"the plan is for one host"):
        sz.flags.group_member_args(plan_for(A10G_X4, "Qwen/Qwen3-8B"), 0, "10.0.0.1", 29500)
    with pytest.raises(AnsibleFilterError, match=r"policy.serve_options.nnodes is set per member of a replica group"):
        plan_for(A10G_X4, "Qwen/Qwen3-8B", serve_options={"nnodes": 2})


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
                         "concurrency_at_max_model_len", "concurrency_limit", "kv_blocks_per_request",
                         "kv_bytes_per_request", "applied", "warnings"}
    assert plan["kv_blocks_per_request"] == {"context": 4096, "blocks": 4096 // 64}
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
