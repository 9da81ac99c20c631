"""The budget against published vLLM startups on real GPUs (tests/fixtures/startup-logs/), and quantized weights
sized from real quantization_config blocks."""

import pytest
from ansible.errors import AnsibleFilterError
from conftest import gpu

import vllm_sizing as vs
sz = vs.package()  # the package behind the filters, every module loaded

import bench_budget  # noqa: E402

GiB = 1 << 30
ROWS, SKIPPED = bench_budget.corpus()
H100 = [gpu("NVIDIA H100 80GB HBM3", 81559, "9.0")]


# --- The corpus -----------------------------------------------------------------------------------------------------

def test_the_corpus_is_sized():
    # Every log the catalog and the version table can size; the rest are listed with a reason (see -rs).
    assert len(ROWS) >= 30
    assert all(why for _, why in SKIPPED)
    # What the sized part covers: models, tensor and pipeline parallel sizes, GPUs.
    assert len({log["model"] for _, log, _, _ in ROWS}) >= 15
    assert {log["tensor_parallel_size"] for _, log, _, _ in ROWS} >= {1, 2, 4, 8}
    assert any(log["pipeline_parallel_size"] > 1 for _, log, _, _ in ROWS)
    assert {bench_budget.gpu_of(log)[0] for _, log, _, _ in ROWS} >= {
        "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "NVIDIA RTX PRO 6000 Blackwell Server Edition"}


@pytest.mark.parametrize("ident, log, plan, error", ROWS, ids=[row[0] for row in ROWS])
def test_predicted_kv_within_bounds(ident, log, plan, error):
    """Within 5 % of the printed "Available KV cache memory", never more than 3 % above it."""
    assert error <= bench_budget.OVER and abs(error) <= bench_budget.OFF, (
        "%s: predicted %.2f GiB, vLLM printed %.2f GiB" % (
            ident, plan["budget_per_gpu"]["kv_cache_bytes"] / GiB, log["parsed"]["kv_available_gib"]))


def test_a_run_of_the_corpus_prints_its_figures():
    """After a run that sized the corpus, pytest's terminal summary prints bench_budget's own summary line (median,
    worst, how many over by more than 3 %); after a run without it, nothing."""
    import conftest

    class Reporter:
        def __init__(self, nodeids):
            self.stats = {"passed": [type("Report", (), {"nodeid": n, "when": "call"})() for n in nodeids]}
            self.lines = []

        def write_sep(self, sep, title):
            self.lines.append(title)

        def write_line(self, line):
            self.lines.append(line)

    ran = Reporter(["tests/unit/test_vllm_sizing_corpus.py::test_predicted_kv_within_bounds[%s]" % ROWS[0][0]])
    conftest.pytest_terminal_summary(ran)
    assert bench_budget.summary(ROWS) in ran.lines
    assert "%d logs: median error" % len(ROWS) in bench_budget.summary(ROWS)
    assert " 0 over by more than 3%" in bench_budget.summary(ROWS)
    other = Reporter(["tests/unit/test_vllm_sizing_kv.py::test_something"])
    conftest.pytest_terminal_summary(other)
    assert other.lines == []


@pytest.mark.parametrize("ident, why", SKIPPED, ids=[row[0] for row in SKIPPED])
def test_skipped_log(ident, why):
    pytest.skip(why)


@pytest.mark.parametrize("ident, log, plan, error",
                         [row for row in ROWS if row[1]["parsed"].get("weights_gib")], ids=lambda v: str(v)[:40])
def test_weights_per_gpu_match_model_loading(ident, log, plan, error):
    """Model loading took X GiB: within 2 % for every dtype and format in the corpus (MXFP4 above: padded)."""
    printed = log["parsed"]["weights_gib"]
    assert abs(plan["budget_per_gpu"]["weights_bytes"] / GiB - printed) <= 0.02 * printed + 0.05


def test_rope_caches_count_as_weights():
    """vLLM keeps its RoPE cos/sin caches on the GPU: Gemma 3's linear-scaled global RoPE caches 8 x 131072 positions
    and its local RoPE another 131072 (head_dim 256: 0.56 GiB, the gap between the checkpoint and "Model loading
    took" of gemma-3-4b/12b); a given checkpoint size holds none of it."""
    gemma = sz.shape.model_shape(vs.vllm_model("google/gemma-3-12b-it"))
    assert gemma["rotary_positions"] == (8 * 131072, 131072)
    assert sz.weights.rotary_bytes(gemma) == 9 * 131072 * 256 * 2
    assert sz.weights.gpu_weight_bytes(gemma, 1, 1) == 2 * 12187325040 + sz.weights.rotary_bytes(gemma)
    llama = sz.shape.model_shape(vs.vllm_model("meta-llama/Llama-3.1-8B-Instruct"))
    assert llama["rotary_positions"] == (131072,) and sz.weights.rotary_bytes(llama) == 131072 * 128 * 2
    # Tensor parallelism splits the checkpoint, not the caches.
    assert sz.weights.gpu_weight_bytes(llama, 2, 1) == pytest.approx(16060522496 / 2 + 131072 * 128 * 2, rel=2e-3)


def test_version_rows_decide_whether_cuda_graphs_are_budgeted():
    base = {"gpu_memory_utilization": 0.9}
    model = vs.vllm_model("meta-llama/Llama-3.1-8B-Instruct")
    old = vs.vllm_sizing(H100, model, {"max_context": 8192}, dict(base, vllm_version="0.19.0"))
    new = vs.vllm_sizing(H100, model, {"max_context": 8192}, dict(base, vllm_version="0.32.0"))
    assert old["budget_per_gpu"]["cuda_graph_bytes"] == 0  # captured after the KV cache, in the headroom
    assert 0.5 * GiB < new["budget_per_gpu"]["cuda_graph_bytes"] < 1.5 * GiB  # 0.19 estimated 0.84 GiB
    assert bench_budget.version_row("0.10.1.1") == "0.11.0" and bench_budget.version_row("0.19.0") == "0.19.0"
    assert bench_budget.version_row("0.27.1") == "0.27.1"
    assert bench_budget.version_row("0.15.2rc1.dev93+g11a4c9d30") == "0.15.1"  # a pre-release: the one before


L40S = [dict(gpu("NVIDIA L40S", 46068, "8.9"), index=i) for i in range(8)]
QWEN3_235B_FP8 = "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8"


def test_expert_parallelism_holds_whole_experts():
    """--enable-expert-parallel: a rank holds experts // TP whole experts (the first experts % TP ranks one more)
    instead of a 1/TP slice of every expert; the other weights are still split by tensor parallelism."""
    shape = sz.shape.model_shape(vs.vllm_model(QWEN3_235B_FP8))
    only = dict(shape, modules=[m for m in shape["modules"] if m[6] == "experts"])
    rope = sz.weights.rotary_bytes(shape)
    experts = sz.weights.gpu_weight_bytes(only, 1, 1) - rope
    # 128 experts over 8 ranks: 16 whole experts.
    assert sz.weights.gpu_weight_bytes(only, 8, 1, True) - rope == experts // 8
    # 128 experts over 3 ranks: the busiest holds 43 (not 128 / 3).
    assert sz.weights.gpu_weight_bytes(only, 3, 1, True) - rope == experts // 128 * 43
    dense = dict(shape, modules=[m for m in shape["modules"] if m[6] != "experts"])
    assert sz.weights.gpu_weight_bytes(dense, 8, 1, True) == sz.weights.gpu_weight_bytes(dense, 8, 1)


def test_expert_parallelism_and_the_pytorch_sampler_in_the_activation_peak():
    """The L40S start (vLLM 0.10.2, TP 8 with --enable-expert-parallel, no FlashInfer) printed a 1.4 GiB activation
    peak: the fused-MoE workspace runs whole experts (full intermediate width) and the PyTorch top-k/top-p sampler
    (torch.sort, 0.11.1-0.16) holds 38 bytes a logit where FlashInfer's holds 16 (the budget stays on the safe side
    of this start's 32: 38 is what Qwen3-14B's 5.64 GiB peak on 0.16 needed)."""
    base = {"gpu_memory_utilization": 0.9, "tensor_parallel_size": 8, "allow_tensor_parallel": False,
            "vllm_version": "0.11.0", "max_num_batched_tokens": 2048, "max_num_seqs": 256, "strict": False}
    model = vs.vllm_model(QWEN3_235B_FP8)

    def activation(**policy):
        plan = vs.vllm_sizing(L40S, model, {"max_context": 32768}, dict(base, **policy))
        return plan["budget_per_gpu"]["activation_peak_bytes"]

    flash, native = activation(), activation(flashinfer_sampler=False)
    assert native - flash == 256 * 151936 * (38 - 16)
    ep = activation(flashinfer_sampler=False, serve_options={"enable_expert_parallel": True})
    assert ep - native == 2048 * 8 * 2 * 3 * 1536 * 7 // 8  # gate/up, activation and down at full width
    assert 1.40 * GiB < ep < 1.70 * GiB  # printed: 1.4 GiB
    with pytest.raises(AnsibleFilterError, match="policy.flashinfer_sampler must be true or false"):
        activation(flashinfer_sampler="no")


# --- Quantized checkpoints ------------------------------------------------------------------------------------------

# AutoAWQ's quantization_config, as published with hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4 ("INT4 using
# the GEMM kernels performing zero-point quantization with a group size of 128") and verbatim in Qwen/Qwen3-4B-AWQ.
AWQ = {"bits": 4, "group_size": 128, "modules_to_not_convert": None, "quant_method": "awq", "version": "gemm",
       "zero_point": True}
# Qwen/Qwen3-4B-AWQ config.json, verbatim in a public test fixture (code search index id 68662368756).
QWEN3_4B_AWQ = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128, "hidden_size": 2560,
                "intermediate_size": 9728, "max_position_embeddings": 40960, "model_type": "qwen3",
                "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
                "quantization_config": {"bits": 4, "group_size": 128, "quant_method": "awq", "version": "gemm",
                                        "zero_point": True},
                "rope_theta": 1000000, "tie_word_embeddings": True, "torch_dtype": "float16", "vocab_size": 151936}
# A DeepSeek-V3 family config.json with its block-FP8 quantization_config (code search index id 62464985633).
DEEPSEEK_V3_FP8 = {
    "architectures": ["DeepseekV3ForCausalLM"], "first_k_dense_replace": 3, "hidden_size": 7168,
    "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn", "type": "yarn"},
    "tie_word_embeddings": False, "v_head_dim": 128, "vocab_size": 129280}


def unquantized(name):
    return {k: v for k, v in vs.vllm_model(name).items() if k not in ("_weight_bytes", "_num_parameters")}


def test_awq_70b_fits_one_h100_at_about_37_gib():
    """Issue 10: Llama-3.1-70B AWQ-INT4 was budgeted at 131 GiB (2 bytes a parameter)."""
    config = dict(unquantized("meta-llama/Llama-3.1-70B-Instruct"), quantization_config=AWQ,
                  torch_dtype="float16", _name="hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4")
    weights, how = sz.shape.model_shape(config)["weight_bytes"]
    # int4 + fp16 scale + packed zero per 128 for every linear layer; embeddings and lm_head in 16 bits.
    assert 36.5 * GiB < weights < 37.5 * GiB and how.endswith("quantization_config (awq 4-bit, group 128)")
    plan = vs.vllm_sizing(H100, config, {"p99_context": 8192}, {"allow_tensor_parallel": False})
    assert plan["fits"] and plan["budget_per_gpu"]["weights_bytes"] < 38 * GiB


def test_quantized_hint_names_the_checkpoint_size(a10g):
    plan = vs.vllm_sizing(H100, vs.vllm_model("meta-llama/Llama-3.1-70B-Instruct"), {"p99_context": 8192},
                          {"strict": False, "allow_tensor_parallel": False})
    assert "a 4-bit (AWQ/GPTQ) checkpoint of this model would fit (about 37.07 GiB of weights per GPU instead " \
           "of 131.45 GiB)" in plan["reason"]


def test_awq_real_config_and_its_skip_list():
    shape = sz.shape.model_shape(QWEN3_4B_AWQ)
    # Tied embeddings in fp16 (0.78 GB) plus 3.63 G linear weights at 0.52 bytes (1.89 GB): 2.66 GB.
    assert 2.6e9 < shape["weight_bytes"][0] < 2.7e9
    skipping = dict(QWEN3_4B_AWQ, quantization_config=dict(QWEN3_4B_AWQ["quantization_config"],
                                                           modules_to_not_convert=["self_attn"]))
    # AWQ compares by substring: every attention projection stays fp16.
    assert sz.shape.model_shape(skipping)["weight_bytes"][0] > shape["weight_bytes"][0] + 0.5 * GiB


def test_block_fp8_moe_mla_keeps_routers_and_embeddings_wide():
    shape = sz.shape.model_shape(DEEPSEEK_V3_FP8)
    # 671 B parameters, one byte each plus a float32 scale per 128 x 128 block; 1.85 GiB of bf16 embeddings/lm_head.
    assert 625 * GiB < shape["weight_bytes"][0] < 640 * GiB
    routers = [m for m in shape["modules"] if m[6] == "router"]
    assert routers and not any(m[7] for m in routers)
    assert not [m for m in shape["modules"] if m[1] == "lm_head"][0][7]
    per_gpu = sz.weights.gpu_weight_bytes(shape, 8, 1)
    assert shape["weight_bytes"][0] / 8 < per_gpu < shape["weight_bytes"][0] / 8 + 2 * GiB  # replicated MLA parts


def test_mxfp4_quantizes_only_the_experts():
    shape = sz.shape.model_shape(vs.vllm_model("openai/gpt-oss-120b"))
    kinds = {m[6] for m in shape["modules"] if m[7]}
    assert kinds == {"experts"}
    # 60.8 GiB of checkpoint; vLLM pads the experts for its MoE kernels (H100 printed 64.38 GiB at TP 1).
    assert 60 * GiB < shape["weight_bytes"][0] < 61.5 * GiB
    assert 64 * GiB < sz.weights.gpu_weight_bytes(shape, 1, 1) < 67 * GiB


@pytest.mark.parametrize("config, low, high", [
    # W4A16 (RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16 scheme): 5.38 GiB printed by vLLM 0.19.
    ({"quant_method": "compressed-tensors", "ignore": ["lm_head"], "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                           "group_size": 128}}}}, 5.2, 5.5),
    # FP8-dynamic (RedHatAI Llama-3.3-70B-Instruct-FP8-dynamic scheme): per-channel float scales.
    ({"quant_method": "compressed-tensors", "ignore": ["lm_head"], "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "symmetric": True,
                                           "strategy": "channel"}}}}, 8.4, 8.6),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}, 5.2, 5.5),
    ({"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": True, "sym": False}, 8.4, 8.6),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": True,
      "bnb_4bit_quant_type": "nf4"}, 5.2, 5.5),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True, "llm_int8_skip_modules": ["mlp"]}, 13.5, 14.0),
])
def test_formats_on_llama_8b(config, low, high):
    shape = sz.shape.model_shape(dict(unquantized("meta-llama/Llama-3.1-8B-Instruct"), quantization_config=config))
    assert low * GiB < shape["weight_bytes"][0] < high * GiB


def test_compressed_tensors_ignore_regex_and_targets():
    config = {"quant_method": "compressed-tensors", "ignore": ["lm_head", "re:.*self_attn.*"], "config_groups": {
        "group_0": {"targets": ["re:.*mlp.*"], "weights": {"num_bits": 4, "symmetric": False, "strategy": "group",
                                                           "group_size": 64}}}}
    shape = sz.shape.model_shape(dict(unquantized("meta-llama/Llama-3.1-8B-Instruct"), quantization_config=config))
    quantized = {m[1] for m in shape["modules"] if m[7]}
    assert quantized == {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}


def test_fp8_exact_names_skip_single_layers():
    config = {"quant_method": "fp8", "modules_to_not_convert": ["model.layers.0.self_attn.q_proj"]}
    shape = sz.shape.model_shape(dict(unquantized("meta-llama/Llama-3.1-8B-Instruct"), quantization_config=config))
    wide = [m for m in shape["modules"] if m[1] == "self_attn.q_proj" and not m[7]]
    assert [sorted(m[0]) for m in wide] == [[0]]


def test_quantized_parameter_counts_are_not_used():
    # A quantized checkpoint's parameter count counts packed words: sized from the modules instead.
    config = dict(QWEN3_4B_AWQ, _num_parameters=1234)
    assert sz.shape.model_shape(config)["weight_bytes"][1].startswith("estimated from config.json shapes and")


@pytest.mark.parametrize("config, message", [
    ({"quant_method": "hqq"}, r"model.quantization_config.quant_method 'hqq' is not sized here \(sized: awq, .*"
                              r"give model._weight_bytes"),
    ({"quant_method": "awq", "bits": "4"}, r"model.quantization_config.bits must be an integer, got '4'"),
    ({"quant_method": "bitsandbytes"}, r"bitsandbytes without load_in_4bit or load_in_8bit"),
    ({"quant_method": "compressed-tensors", "config_groups": {}}, r"config_groups is empty"),
    ("awq", r"model.quantization_config must be a dict, got str"),
])
def test_bad_quantization_config(config, message):
    with pytest.raises(AnsibleFilterError, match=message):
        sz.shape.model_shape(dict(QWEN3_4B_AWQ, quantization_config=config))
