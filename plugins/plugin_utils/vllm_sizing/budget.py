# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory budget per GPU: what vLLM subtracts from its share before the KV cache (weights, activation peak,
CUDA graphs, non-torch memory), and the utilization it asks for.
"""

import math

from .common import GiB, MiB, cdiv
from .kv import stage_block_bytes
from .weights import gpu_weight_bytes

# Estimates of what is not KV cache (vLLM measures these at start; override them in `policy`). Checked against the
# published startups of tests/fixtures/startup-logs/ (benchmarks/bench_budget.py). How vLLM measures non-torch memory
# is a fact of the release (its row's non_torch): the difference of two snapshots around the profile run (0.11-0.17:
# CUDA context growth, cuBLAS and attention workspaces, 0.13 GiB), with the CUDA-graph profiling inside that window
# from 0.18 (what the capture leaves behind counts too: 0.24-0.27 GiB printed by 0.19), and from 0.27 all the free
# memory consumed since the first snapshot (the same parts, measured another way).
NON_TORCH_BYTES = {"snapshot": 160 * MiB, "snapshot-graphs": 256 * MiB, "consumed": 256 * MiB}
# NCCL and custom all-reduce buffers with tensor parallelism, by compute capability: about 2 GiB more per rank on
# the NVLink GPUs of Hopper and data-centre Blackwell (9.x, 10.x) from 0.18 (NCCL's NVLink SHARP buffers; 2.07-2.21
# GiB in all printed by 0.19, 1.38 by 0.10 on H200); under 0.25 GiB on A100 and on L40S over PCIe (0.17-0.21 GiB
# printed at TP 8); about 1 GiB on the PCIe-only Blackwell cards (12.x: RTX PRO 6000 at TP 4, 0.27.1: 1.70 GiB of
# non-torch and MoE workspace printed together, 0.64 of it the workspace).
NON_TORCH_TP_BYTES = {(12, 0): {"snapshot": 1024 * MiB, "snapshot-graphs": 1024 * MiB, "consumed": 1024 * MiB},
                      (9, 0): {"snapshot": 1408 * MiB, "snapshot-graphs": 2048 * MiB, "consumed": 2048 * MiB},
                      (0, 0): {"snapshot": 256 * MiB, "snapshot-graphs": 256 * MiB, "consumed": 256 * MiB}}
# One instance across hosts (a replica group, policy.nodes): NCCL's buffers for the links between hosts, per GPU,
# over IB/RoCE with GPUDirect RDMA (over TCP sockets they stay in host memory: the larger figure is planned). vLLM
# sets up its communicators before its first memory snapshot and PyTorch's point-to-point ones come at the first
# request, so most of it is outside vLLM's share: headroom the utilization must leave. With tensor parallelism
# across hosts the profile run's all-reduces connect as much again inside the share (non-torch). From NCCL's
# buffer sizes (about 9.2 MiB per channel and peer for LL + LL128 + SIMPLE, 2 MiB shared point-to-point pools per
# channel) and vLLM's communicators (gpu_worker.init_device, parallel_state): docs/multi-node.md.
CROSS_NODE_BYTES = {"pipeline": {"headroom": 512 * MiB, "profiled": 0},
                    "tensor": {"headroom": 768 * MiB, "profiled": 768 * MiB}}
# CUDA graphs: the piecewise graphs keep each layer's outputs for the largest capture size in their pool, plus
# cuBLAS/NCCL state per captured graph. vLLM captures the batch sizes [1, 2, 4] + every 8 below 256 + every 16 from
# 256, up to min(2 x max_num_seqs, 512) (config/vllm.py). Against the estimates 0.19 printed (0.49-1.82 GiB at 51
# sizes; subtracted from KV from 0.20 where the model runner computes one, the row's cuda_graph_estimate) this is
# within -0.2/+0.8 GiB, above for most (and 0.8 below Llama-3.1-8B at TP 2, whose 1.69 GiB estimate was 0.93 GiB
# above its own capture); at 11 sizes (max_num_seqs 32, 0.27.1) it is 0.15 GiB above the 0.47 GiB that start took.
CUDA_GRAPH_BYTES_PER_SIZE = 10 * MiB
CUDA_GRAPH_MAX_CAPTURE = 512
# Activation peak of the profiling run (gpu_model_runner.profile_run): a forward pass of max_num_batched_tokens,
# then the sampler on min(max_num_batched_tokens, max_num_seqs) rows of logits. Bytes a logit by the release's
# top-k/top-p path (its row's sampler): FlashInfer's and the in-place Triton kernel of 0.17+ hold the logits, their
# float32 copy and the probabilities (0.19 printed 3.7-4.0 x the float32 logits: 16 with what the run keeps
# besides); the torch.sort path of 0.11.1-0.16 also holds the sorted copy, its int64 indices and the sort's own
# buffers (38: Qwen3-14B's 5.64 GiB at 1024 x 151936 logits); the V2 model runner's dummy sampler skips top-k/top-p
# (logits and their float32 copy, 8 with the same margin). The fused-MoE workspace (one chunk of at most the row's
# moe_chunk tokens x top-k x (gate/up + activation + down)) stays allocated through the sampler.
SAMPLER_BYTES_PER_LOGIT = {"flashinfer": 16, "triton": 16, "sort": 38, "v2": 8}
EXTENSIBLE_MARGIN_FLOOR = 1 * GiB    # 0.34 extensible KV cache: margin max(1 GiB, 0.75 x activation peak)
EXTENSIBLE_MARGIN_FRACTION = 0.75
UTILIZATION = {"exclusive": 0.93, "dedicated": 0.90, "shared": 0.80}
UTILIZATION_AFTER_OOM = 0.85


def default_batch(row, usable, name, capability):
    """`vllm serve`'s max_num_batched_tokens and max_num_seqs for this GPU (the row's tiers, first match)."""
    for min_gib, excluded, excluded_cc, batched, seqs in row["batch_defaults"]:
        if (usable >= min_gib * GiB and not (excluded and excluded in name.lower())
                and not (excluded_cc and "%d.%d" % capability == excluded_cc)):
            return batched, seqs
    return tuple(row["batch_defaults"][-1][3:])


def sampler_bytes(row, runner, flashinfer):
    """Bytes a logit the profile run's sampler holds (SAMPLER_BYTES_PER_LOGIT): flashinfer says whether FlashInfer is
    installed; the release decides whether its sampler uses it."""
    if runner == "v2":
        return SAMPLER_BYTES_PER_LOGIT["v2"]
    native = SAMPLER_BYTES_PER_LOGIT[row["sampler"]["native"]]
    when = row["sampler"]["flashinfer"]
    if flashinfer and when == "if-installed":
        return SAMPLER_BYTES_PER_LOGIT["flashinfer"]
    if flashinfer and when == "default":
        # A second, native pass follows FlashInfer's (0.21+): the peak is the larger of the two.
        return max(SAMPLER_BYTES_PER_LOGIT["flashinfer"], native)
    return native


def choose_utilization(policy, applied):
    """gpu_memory_utilization for a checked policy (inputs.policy), said in `applied`."""
    if policy.gpu_memory_utilization is not None:
        value = policy.gpu_memory_utilization
        applied.append("gpu_memory_utilization %.2f as set in the policy" % value)
        return value
    sharing = policy.gpu_sharing
    value = UTILIZATION[sharing]
    reason = {"exclusive": "nothing else runs on the GPUs", "dedicated": "dedicated GPUs",
              "shared": "GPUs shared with other processes"}[sharing]
    if policy.runtime_ooms and value > UTILIZATION_AFTER_OOM:
        value, reason = UTILIZATION_AFTER_OOM, "runtime OOMs were reported"
    applied.append("gpu_memory_utilization %.2f: %s" % (value, reason))
    return value


def cross_node(ctx, tp):
    """CROSS_NODE_BYTES of an instance with tensor_parallel_size tp on ctx's hosts, None on one host."""
    if ctx["nodes"] == 1:
        return None
    return CROSS_NODE_BYTES["tensor" if tp > ctx["gpus_per_node"] else "pipeline"]


def leave_headroom(ctx, tp, applied, warnings):
    """The utilization, lowered to leave a replica group's cross-host buffers outside vLLM's share (they come
    before its startup check, which then finds less free memory than it requests, or at the first request)."""
    utilization, cross = ctx["utilization"], cross_node(ctx, tp)
    if cross is None or ctx["usable"] * (1 - utilization) >= cross["headroom"]:
        return utilization
    highest = math.floor((ctx["usable"] - cross["headroom"]) / ctx["usable"] * 100) / 100
    if ctx["policy"].gpu_memory_utilization is not None:
        warnings.append("gpu_memory_utilization %.2f leaves %d MiB a GPU outside vLLM's share; the cross-host "
                        "communication buffers need about %d MiB there: at most %.2f" % (
                            utilization, ctx["usable"] * (1 - utilization) // MiB, cross["headroom"] // MiB,
                            highest))
        return utilization
    applied.append("gpu_memory_utilization %.2f: leaves the cross-host communication buffers (about %d MiB a GPU) "
                   "outside vLLM's share" % (highest, cross["headroom"] // MiB))
    return highest


def memory_budget(lay, ctx, seqs, weights=None):
    """Per-GPU memory budget: what vLLM subtracts from its share before the KV cache (weights: per GPU,
    to try another checkpoint)."""
    shape, policy, batched, row = lay["shape"], ctx["policy"], ctx["batched"], lay["row"]
    expert_parallel = bool(ctx["serve"].get("enable_expert_parallel"))
    if weights is None:
        weights = gpu_weight_bytes(shape, lay["tp"], lay["pp"], expert_parallel)
    weights = max(0, weights - int(ctx["serve"].get("cpu_offload_gb", 0) * GiB))
    activation = policy.activation_bytes
    if activation is None:
        moe_tokens = min(batched, row["moe_chunk"] or batched)
        activation = _activation(shape, lay["tp"], lay["pp"], batched, min(batched, seqs), moe_tokens,
                                 expert_parallel, sampler_bytes(row, lay["runner"], policy.flashinfer_sampler))
    graphs = policy.cuda_graph_bytes
    if graphs is None:
        graphs = _cuda_graphs(lay, seqs) if row["cuda_graph_estimate"][lay["runner"]] or ctx["extensible"] else 0
    if ctx["enforce_eager"]:
        graphs = 0
    non_torch = policy.non_torch_bytes
    if non_torch is None:
        regime = row["non_torch"]
        non_torch = NON_TORCH_BYTES[regime]
        if lay["tp"] > 1:
            non_torch += next(v[regime] for cc, v in sorted(NON_TORCH_TP_BYTES.items(), reverse=True)
                              if ctx["device"]["capability"] >= cc)
        cross = cross_node(ctx, lay["tp"])
        if cross is not None:
            non_torch += cross["profiled"]
        if regime == "consumed" and lay["runner"] == "v2":
            # The V2 runner's penalty state (output_bin_counts, int32, and a bit mask of the prompt's tokens per
            # sequence) is allocated with the model; only the "consumed" accounting counts it.
            non_torch += seqs * shape["dims"]["vocab"] * 4 + seqs * cdiv(shape["dims"]["vocab"], 32) * 4
    usable = ctx["usable"]
    product = usable * ctx["utilization"]
    requested = math.ceil(product) if row["requested"] == "ceil" else int(product)
    not_kv = weights + graphs + non_torch
    kv = requested - not_kv - activation
    if ctx["extensible"]:
        # 0.34 sizes KV after warm-up and keeps max(1 GiB, 0.75 x activation peak) of the device free.
        margin = max(EXTENSIBLE_MARGIN_FLOOR, int(activation * EXTENSIBLE_MARGIN_FRACTION))
        kv = min(requested - not_kv, usable - not_kv - margin) - activation
    if ctx["serve"].get("num_gpu_blocks_override") is not None:
        kv = ctx["serve"]["num_gpu_blocks_override"] * max(stage_block_bytes(lay, s) for s in lay["stages"])
    elif ctx["serve"].get("kv_cache_memory_bytes") is not None:
        kv = ctx["serve"]["kv_cache_memory_bytes"]  # vLLM then ignores the utilization for the KV size
    return {"usable_bytes": usable, "requested_bytes": requested, "weights_bytes": weights,
            "activation_peak_bytes": activation, "cuda_graph_bytes": graphs, "non_torch_bytes": non_torch,
            "kv_cache_bytes": max(kv, 0)}


def _activation(shape, tp, pp, batched, rows, moe_tokens, expert_parallel, sampler_bytes):
    """Peak torch memory of vLLM's profiling run on the busiest stage (see SAMPLER_BYTES_PER_LOGIT)."""
    dims, width = shape["dims"], shape["dtype_bytes"]
    attention = (dims["heads"] + 2 * dims["kv_heads"]) * dims["head_size"] // tp + 4 * dims["hidden"]
    # Dense MLP: gate/up output, activation output; with only MoE layers the workspace below is the MLP.
    mlp = 3 * dims["inter"] // tp if len(dims["moe_layers"]) < dims["layers"] else 0
    forward = batched * width * (attention + mlp)
    sampler = rows * dims["vocab"] * sampler_bytes
    moe = 0
    if dims["moe_layers"]:
        # With expert parallelism each rank runs whole experts (full intermediate width) on every token's top-k
        # slots, the other ranks' experts masked out by the expert map.
        split = 1 if expert_parallel else tp
        moe = moe_tokens * dims["topk"] * width * (3 * dims["moe_inter"] // split + dims["hidden"])
    # Pipeline stages keep the received hidden states and residual of a whole batch.
    relay = 2 * batched * dims["hidden"] * width if pp > 1 else 0
    return max(forward, sampler) + moe + relay


def _cuda_graphs(lay, seqs):
    """Memory of the captured CUDA graphs on the busiest stage (see CUDA_GRAPH_BYTES_PER_SIZE)."""
    dims, tp = lay["shape"]["dims"], lay["tp"]
    capture = min(2 * seqs, CUDA_GRAPH_MAX_CAPTURE)
    sizes = len([size for size in [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, CUDA_GRAPH_MAX_CAPTURE + 1, 16))
                 if size <= capture])
    # Per layer: q/k/v and attention output, residual and hidden state; MoE layers also keep the top-k routed
    # copies of the hidden state. 16-bit activations whatever the weights (0.19 printed the same for float32).
    attention = (2 * dims["heads"] + 2 * dims["kv_heads"]) * dims["head_size"] // tp + 2 * dims["hidden"]
    routed = dims["topk"] * dims["hidden"]
    layers = max(len(stage) for stage in lay["stages"])
    moe = max(len(stage & dims["moe_layers"]) for stage in lay["stages"])
    return CUDA_GRAPH_BYTES_PER_SIZE * sizes + 2 * capture * (attention * layers + routed * moe)
