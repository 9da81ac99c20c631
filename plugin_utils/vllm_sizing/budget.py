# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory budget per GPU: what vLLM subtracts from its share before the KV cache (weights, activation peak,
CUDA graphs, non-torch memory), and the utilization it asks for.
"""

import math

from .common import GiB, MiB
from .kv import stage_block_bytes
from .weights import gpu_weight_bytes

# Estimates of what is not KV cache (vLLM measures these at start; override them in `policy`). Checked against the
# published startups of tests/fixtures/startup-logs/ (benchmarks/bench_budget.py).
NON_TORCH_BYTES = 256 * MiB  # CUDA context growth, cuBLAS and attention workspaces: 0.07-0.27 GiB printed
# NCCL and custom all-reduce buffers with tensor parallelism, by compute capability: about 2 GiB more per rank on
# Hopper and later (NCCL's NVLink SHARP buffers; 2.07-2.21 GiB in all printed by 0.19, 1.38 by 0.10 on H200), under
# 0.25 GiB on A100 and on L40S over PCIe (0.17-0.21 GiB printed at TP 8).
NON_TORCH_TP_BYTES = {(9, 0): 2048 * MiB, (0, 0): 256 * MiB}
# CUDA graphs: the piecewise graphs keep each layer's outputs for the largest capture size in their pool, plus
# cuBLAS/NCCL graph state. vLLM captures batch sizes up to min(2 x max_num_seqs, 512). Against the estimates 0.19
# printed (0.49-1.82 GiB; subtracted from KV since 0.21) this is within -0.2/+0.8 GiB, above for most (and 0.8
# below Llama-3.1-8B at TP 2, whose 1.69 GiB estimate was 0.93 GiB above its own capture).
CUDA_GRAPH_BYTES = 512 * MiB
CUDA_GRAPH_MAX_CAPTURE = 512
# Activation peak of the profiling run (gpu_model_runner.profile_run): a forward pass of max_num_batched_tokens,
# then the sampler on max_num_seqs rows of logits, which holds float32 logits plus their sorted copy and int64 sort
# indices for top-k/top-p (16 bytes a logit; 0.19 printed 3.7-4.0 x the float32 logits). The fused-MoE workspace
# (one chunk of at most 16384 tokens x top-k x (gate/up + activation + down)) stays allocated through the sampler.
SAMPLER_BYTES_PER_LOGIT = 16
# Without FlashInfer (not installed, or VLLM_USE_FLASHINFER_SAMPLER=0) vLLM's PyTorch top-k/top-p
# (v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p) holds, when it scatters the sorted logits back: the
# 16-bit logits, their float32 copy, the sorted copy and its int64 indices, the top-k mask (bool), the softmax of
# the sorted logits and their cumulative sum (float32), the top-p mask (bool) and the scattered result (float32).
NATIVE_SAMPLER_BYTES_PER_LOGIT = 2 + 4 + 4 + 8 + 1 + 4 + 4 + 1 + 4
MOE_CHUNK_TOKENS = 16384
EXTENSIBLE_MARGIN_FLOOR = 1 * GiB    # 0.34 extensible KV cache: margin max(1 GiB, 0.75 x activation peak)
EXTENSIBLE_MARGIN_FRACTION = 0.75
UTILIZATION = {"exclusive": 0.93, "dedicated": 0.90, "shared": 0.80}
UTILIZATION_AFTER_OOM = 0.85


def default_batch(row, usable, name):
    for min_gib, excluded, batched, seqs in row["batch_defaults"]:
        if usable >= min_gib * GiB and not (excluded and excluded in name.lower()):
            return batched, seqs
    return row["batch_defaults"][-1][2:]


def choose_utilization(policy, applied):
    """gpu_memory_utilization for a checked policy (inputs.policy), said in `applied`."""
    if policy["gpu_memory_utilization"] is not None:
        value = policy["gpu_memory_utilization"]
        applied.append("gpu_memory_utilization %.2f as set in the policy" % value)
        return value
    sharing = policy["gpu_sharing"]
    value = UTILIZATION[sharing]
    reason = {"exclusive": "nothing else runs on the GPUs", "dedicated": "dedicated GPUs",
              "shared": "GPUs shared with other processes"}[sharing]
    if policy["runtime_ooms"] and value > UTILIZATION_AFTER_OOM:
        value, reason = UTILIZATION_AFTER_OOM, "runtime OOMs were reported"
    applied.append("gpu_memory_utilization %.2f: %s" % (value, reason))
    return value


def memory_budget(lay, ctx, seqs, weights=None):
    """Per-GPU memory budget: what vLLM subtracts from its share before the KV cache (weights: per GPU,
    to try another checkpoint)."""
    shape, policy, batched, row = lay["shape"], ctx["policy"], ctx["batched"], lay["row"]
    expert_parallel = bool(ctx["serve"].get("enable_expert_parallel"))
    if weights is None:
        weights = gpu_weight_bytes(shape, lay["tp"], lay["pp"], expert_parallel)
    weights = max(0, weights - int(ctx["serve"].get("cpu_offload_gb", 0) * GiB))
    activation = policy["activation_bytes"]
    if activation is None:
        sampler = SAMPLER_BYTES_PER_LOGIT if policy["flashinfer_sampler"] else NATIVE_SAMPLER_BYTES_PER_LOGIT
        activation = _activation(shape, lay["tp"], lay["pp"], batched, seqs, expert_parallel, sampler)
    graphs = policy["cuda_graph_bytes"]
    if graphs is None:
        graphs = _cuda_graphs(lay, seqs) if row["cuda_graph_budget"] or ctx["extensible"] else 0
    if ctx["enforce_eager"]:
        graphs = 0
    non_torch = policy["non_torch_bytes"]
    if non_torch is None:
        non_torch = NON_TORCH_BYTES
        if lay["tp"] > 1:
            non_torch += next(v for cc, v in sorted(NON_TORCH_TP_BYTES.items(), reverse=True)
                              if ctx["device"]["capability"] >= cc)
    usable = ctx["usable"]
    requested = math.ceil(usable * ctx["utilization"])
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


def _activation(shape, tp, pp, batched, seqs, expert_parallel, sampler_bytes):
    """Peak torch memory of vLLM's profiling run on the busiest stage (see SAMPLER_BYTES_PER_LOGIT)."""
    dims, width = shape["dims"], shape["dtype_bytes"]
    attention = (dims["heads"] + 2 * dims["kv_heads"]) * dims["head_size"] // tp + 4 * dims["hidden"]
    # Dense MLP: gate/up output, activation output; with only MoE layers the workspace below is the MLP.
    mlp = 3 * dims["inter"] // tp if len(dims["moe_layers"]) < dims["layers"] else 0
    forward = batched * width * (attention + mlp)
    sampler = seqs * dims["vocab"] * sampler_bytes
    moe = 0
    if dims["moe_layers"]:
        # With expert parallelism each rank runs whole experts (full intermediate width) on every token's top-k
        # slots, the other ranks' experts masked out by the expert map.
        split = 1 if expert_parallel else tp
        moe = min(batched, MOE_CHUNK_TOKENS) * dims["topk"] * width * (3 * dims["moe_inter"] // split + dims["hidden"])
    # Pipeline stages keep the received hidden states and residual of a whole batch.
    relay = 2 * batched * dims["hidden"] * width if pp > 1 else 0
    return max(forward, sampler) + moe + relay


def _cuda_graphs(lay, seqs):
    """Memory of the captured CUDA graphs on the busiest stage (see CUDA_GRAPH_BYTES)."""
    dims, tp = lay["shape"]["dims"], lay["tp"]
    capture = min(2 * seqs, CUDA_GRAPH_MAX_CAPTURE)
    # Per layer: q/k/v and attention output, residual and hidden state; MoE layers also keep the top-k routed
    # copies of the hidden state. 16-bit activations whatever the weights (0.19 printed the same for float32).
    attention = (2 * dims["heads"] + 2 * dims["kv_heads"]) * dims["head_size"] // tp + 2 * dims["hidden"]
    routed = dims["topk"] * dims["hidden"]
    layers = max(len(stage) for stage in lay["stages"])
    moe = max(len(stage & dims["moe_layers"]) for stage in lay["stages"])
    return CUDA_GRAPH_BYTES + 2 * capture * (attention * layers + routed * moe)
