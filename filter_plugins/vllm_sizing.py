# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sizing filters for vLLM: KV-cache arithmetic as vLLM does it, a memory plan per GPU group, and the
command line for that plan.

Documentation lives in the sidecar files next to this one (vllm_sizing.yml, vllm_kv_cache_bytes.yml,
vllm_max_model_len.yml, vllm_serve_args.yml, vllm_model.yml), so `ansible-doc -t filter NAME` shows it.

The KV arithmetic follows vLLM's own code (vllm/v1/kv_cache_interface.py, vllm/v1/core/kv_cache_utils.py,
kv_cache_planning.py in 0.34): per-layer page sizes, the grouping of hybrid (sliding + full attention)
models, the null block reserved before the startup check and the binary search behind "the estimated
maximum model length is N". Everything that changes between vLLM releases is in VERSIONS; the attention
backends that decide the KV block size on each kind of device are in ATTENTION.
"""

import fnmatch
import functools
import json
import math
import os
import re

from ansible.errors import AnsibleFilterError

GiB = 1 << 30
MiB = 1 << 20
PINNED_VERSION = "0.34.0"
CATALOG_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_models.json")

# Engine arguments whose values the plan decides; `serve` may repeat them but not change them.
SIZING_ARGS = (
    "model", "gpu_memory_utilization", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
    "kv_cache_dtype", "tensor_parallel_size", "pipeline_parallel_size", "enforce_eager", "block_size",
    "disable_custom_all_reduce",
)
# Where an operator sets a sizing argument, when it is not the policy key of the same name.
SIZING_POLICY = {"model": "policy.model (the role: vllm_model or vllm_model_dir)",
                 "disable_custom_all_reduce": "policy.expandable_segments (it sets this flag with TP/PP > 1)"}

# The only place vLLM flags are spelled. kind: value (one argument), list (nargs+), json (a dict as
# JSON), bool (bare flag when true). `false` spells the negative form per version, only for booleans
# whose default is on; other false booleans are defaults and are left out.
FLAGS = {
    "model": {"flag": "--model", "kind": "value"},
    "host": {"flag": "--host", "kind": "value"},
    "port": {"flag": "--port", "kind": "value"},
    "served_model_name": {"flag": "--served-model-name", "kind": "list"},
    "tensor_parallel_size": {"flag": "--tensor-parallel-size", "kind": "value"},
    "pipeline_parallel_size": {"flag": "--pipeline-parallel-size", "kind": "value"},
    "gpu_memory_utilization": {"flag": "--gpu-memory-utilization", "kind": "value"},
    "max_model_len": {"flag": "--max-model-len", "kind": "value"},
    "max_num_seqs": {"flag": "--max-num-seqs", "kind": "value"},
    "max_num_batched_tokens": {"flag": "--max-num-batched-tokens", "kind": "value"},
    "kv_cache_dtype": {"flag": "--kv-cache-dtype", "kind": "value"},
    "block_size": {"flag": "--block-size", "kind": "value"},
    "kv_cache_memory_bytes": {"flag": "--kv-cache-memory-bytes", "kind": "value"},
    "num_gpu_blocks_override": {"flag": "--num-gpu-blocks-override", "kind": "value"},
    "swap_space": {"flag": "--swap-space", "kind": "value"},
    "cpu_offload_gb": {"flag": "--cpu-offload-gb", "kind": "value"},
    "enforce_eager": {"flag": "--enforce-eager", "kind": "bool"},
    "disable_custom_all_reduce": {"flag": "--disable-custom-all-reduce", "kind": "bool"},
    "enable_prefix_caching": {
        "flag": "--enable-prefix-caching", "kind": "bool",
        "false": {"0.19.0": "--no-enable-prefix-caching", "0.32.0": "--no-enable-prefix-caching",
                  "0.34.0": "--disable-prefix-caching"}},
    "enable_chunked_prefill": {
        "flag": "--enable-chunked-prefill", "kind": "bool",
        "false": {"0.19.0": "--no-enable-chunked-prefill", "0.32.0": "--no-enable-chunked-prefill",
                  "0.34.0": "--disable-chunked-prefill"}},
    "async_scheduling": {"flag": "--async-scheduling", "kind": "bool",
                         "false": {"0.19.0": "--no-async-scheduling", "0.32.0": "--no-async-scheduling",
                                   "0.34.0": "--no-async-scheduling"}},
    "shutdown_timeout": {"flag": "--shutdown-timeout", "kind": "value"},
    "enable_lora": {"flag": "--enable-lora", "kind": "bool"},
    "max_loras": {"flag": "--max-loras", "kind": "value"},
    "max_lora_rank": {"flag": "--max-lora-rank", "kind": "value"},
    "max_cpu_loras": {"flag": "--max-cpu-loras", "kind": "value"},
    "enable_sleep_mode": {"flag": "--enable-sleep-mode", "kind": "bool"},
    "quantization": {"flag": "--quantization", "kind": "value"},
    "dtype": {"flag": "--dtype", "kind": "value"},
    "seed": {"flag": "--seed", "kind": "value"},
    "trust_remote_code": {"flag": "--trust-remote-code", "kind": "bool"},
    "download_dir": {"flag": "--download-dir", "kind": "value"},
    "tokenizer": {"flag": "--tokenizer", "kind": "value"},
    "revision": {"flag": "--revision", "kind": "value"},
    "generation_config": {"flag": "--generation-config", "kind": "value"},
    "chat_template": {"flag": "--chat-template", "kind": "value"},
    "enable_auto_tool_choice": {"flag": "--enable-auto-tool-choice", "kind": "bool"},
    "tool_call_parser": {"flag": "--tool-call-parser", "kind": "value"},
    "reasoning_parser": {"flag": "--reasoning-parser", "kind": "value"},
    "compilation_config": {"flag": "--compilation-config", "kind": "json"},
    "disable_log_stats": {"flag": "--disable-log-stats", "kind": "bool"},
    "max_log_len": {"flag": "--max-log-len", "kind": "value"},
    "uvicorn_log_level": {"flag": "--uvicorn-log-level", "kind": "value"},
}
_COMMON_FLAGS = frozenset(FLAGS) - {"swap_space", "shutdown_timeout"}
# Serving options (policy.serve_options) that change what the plan must budget; the rest pass through unread.
#   dtype: float32 stores 4 bytes per weight and per KV element; kv_cache_memory_bytes pins the KV size per GPU;
#   cpu_offload_gb moves that many GiB of weights per GPU to host memory; quantization (online, of an
#   unquantized checkpoint) only shrinks the weights, so budgeting the checkpoint's size stays on the safe side.
DTYPES = {"auto": None, "half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4}

# One table of what changes between vLLM releases. Read in each release's source (engine/arg_utils.py,
# config/cache.py, config/vllm.py, platforms/cpu.py, v1/kv_cache_interface.py, v1/core/kv_cache_*.py);
# the flag sets were checked against each release's argument parser.
#   block_size: CacheConfig.DEFAULT_BLOCK_SIZE, what a backend uses when it accepts it (see ATTENTION)
#   utilization: default --gpu-memory-utilization without the extensible KV cache
#   extensible_kv_cache: KV sized after warm-up, default utilization 1.0 on CUDA
#   async_scheduling: default on GPU (the CPU platform always turns it off)
#   in_flight: what a sliding-window layer keeps beyond its window: "batch" = max_num_batched_tokens,
#              "batches" = (pp + 1 with async scheduling, else pp) x max_num_batched_tokens
#   null_block: one block is held back before the startup check
#   grouped_check: the check sums blocks over KV-cache groups (padding included) instead of over layers
#   batch_defaults: (min GiB, excluded name, max_num_batched_tokens, max_num_seqs) for `vllm serve`,
#                   first match wins; cpu: per world size
#   message, gib_format: how the startup error spells "model's" and GiB (None: round(x, 2), as format_gib)
#   cuda_graph_budget: the CUDA-graph estimate is taken from the KV memory (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS,
#                      default on since 0.21); before, graphs are captured after the KV cache, in the headroom
VERSIONS = {
    "0.11.0": {
        "block_size": 16, "utilization": 0.9, "extensible_kv_cache": False,
        "async_scheduling": False, "in_flight": "batch", "null_block": False, "grouped_check": False,
        "batch_defaults": ((70, "a100", 8192, 1024), (0, None, 2048, 256)), "cpu_batch_defaults": (2048, 128),
        "message": "models's", "gib_format": "%.2f", "flags": (_COMMON_FLAGS | {"swap_space"}),
        "cuda_graph_budget": False,
    },
    "0.19.0": {
        "block_size": 16, "utilization": 0.9, "extensible_kv_cache": False,
        "async_scheduling": True, "in_flight": "batch", "null_block": False, "grouped_check": False,
        "batch_defaults": ((70, "a100", 8192, 1024), (0, None, 2048, 256)), "cpu_batch_defaults": (2048, 128),
        "message": "models's", "gib_format": None, "flags": (_COMMON_FLAGS | {"shutdown_timeout"}),
        "cuda_graph_budget": False,
    },
    "0.32.0": {
        "block_size": 16, "utilization": 0.92, "extensible_kv_cache": False,
        "async_scheduling": True, "in_flight": "batches", "null_block": True, "grouped_check": True,
        "batch_defaults": ((160, None, 16384, 1024), (70, "a100", 8192, 1024), (0, None, 2048, 256)),
        "cpu_batch_defaults": (2048, 128), "message": "model's", "gib_format": None,
        "flags": (_COMMON_FLAGS | {"shutdown_timeout"}), "cuda_graph_budget": True,
    },
    "0.34.0": {
        "block_size": 64, "utilization": 0.92, "extensible_kv_cache": True,
        "async_scheduling": True, "in_flight": "batches", "null_block": True, "grouped_check": True,
        "batch_defaults": ((160, None, 16384, 1024), (70, "a100", 8192, 1024), (0, None, 2048, 256)),
        "cpu_batch_defaults": (2048, 128), "message": "model's", "gib_format": None,
        "flags": (_COMMON_FLAGS | {"shutdown_timeout"}), "cuda_graph_budget": True,
    },
}

# Attention backends, in vLLM's order of preference per device, and the KV block sizes they take. Read in vLLM
# 0.32.0 and 0.34.0 (the same there): platforms/cuda.py _get_backend_priorities and each backend's
# supports_compute_capability; get_supported_kernel_block_sizes in v1/attention/backends/ (and mla/);
# platforms/cpu.py get_attn_backend_cls and check_and_update_config for the CPU build.
#   runs_on: compute capability -> bool (CUDA); amx: the backend needs (True) or excludes (False) AMX tiles (CPU)
#   sizes: kernel block sizes; a KV block may be any multiple of one (vLLM splits it into kernel blocks)
#   forced: the block size the platform sets whatever was asked (the CPU's reference MLA backend: 16)
#   default: the platform's own default instead of the version's (the CPU platform: 128)
# With no --block-size vLLM takes the first backend that runs on the device and gives it the version's default
# block size when one of its sizes divides it, else its smallest size (platforms/interface.py
# update_block_size_for_backend). With --block-size it skips the backends that do not take it
# ("block_size not supported"). Other criteria (head size, KV dtype, installed kernels) are not modelled: plans
# pass --block-size explicitly, so a different backend choice cannot change the arithmetic.
ATTENTION = {
    ("cuda", False): (
        {"name": "FLASHINFER", "runs_on": lambda cc: cc[0] == 10, "sizes": (16, 32, 64)},
        {"name": "FLASH_ATTN", "runs_on": lambda cc: cc >= (8, 0), "sizes": (16,)},
        {"name": "FLASHINFER", "runs_on": lambda cc: (8, 0) <= cc <= (12, 1) and cc[0] != 10, "sizes": (16, 32, 64)},
        {"name": "TRITON_ATTN", "runs_on": lambda cc: True, "sizes": (16,)},
        {"name": "FLEX_ATTENTION", "runs_on": lambda cc: True, "sizes": (16,)},
    ),
    ("cuda", True): (
        {"name": "FLASHINFER_MLA", "runs_on": lambda cc: cc[0] == 10, "sizes": (32, 64)},
        {"name": "CUTLASS_MLA", "runs_on": lambda cc: cc[0] == 10, "sizes": (128,)},
        {"name": "FLASH_ATTN_MLA", "runs_on": lambda cc: cc[0] == 9, "sizes": (16,)},
        {"name": "FLASHMLA", "runs_on": lambda cc: cc[0] in (9, 10), "sizes": (64,)},
        {"name": "TRITON_MLA", "runs_on": lambda cc: True, "sizes": (16,)},
    ),
    ("cpu", False): ({"name": "CPU_ATTN", "sizes": (32,), "default": 128},),
    ("cpu", True): (
        {"name": "CPU_AMX_MLA", "amx": True, "sizes": (32,), "default": 128},
        {"name": "CPU_MLA", "amx": False, "sizes": (16,), "forced": 16},
    ),
}
# Compute capabilities tried when a plan for CUDA does not give one: the block size is used only if they agree.
CAPABILITIES = ((7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0))
AMX_FLAG = "amx_tile"  # /proc/cpuinfo; vLLM asks torch.cpu._is_amx_tile_supported()

# kv_cache_dtype -> bytes per element (None: the model's dtype). fp8_ds_mla is a fixed 656-byte row.
KV_DTYPE_BYTES = {"auto": None, "bfloat16": 2, "float16": 2, "half": 2,
                  "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1}
FP8_DS_MLA_ROW = 656

# transformers' config defaults that change the KV layout when config.json leaves the key out
# (layer_pattern: the (i + 1) % 2 sliding/full alternation transformers fills in for Gemma 2 and gpt-oss).
MODEL_DEFAULTS = {
    "mistral": {"sliding_window": 4096},
    "gemma2": {"sliding_window": 4096, "max_position_embeddings": 8192, "layer_pattern": 2,
               "tie_word_embeddings": True},
    "gemma3_text": {"sliding_window": 4096, "max_position_embeddings": 131072, "sliding_window_pattern": 6,
                    "tie_word_embeddings": True, "vocab_size": 262208},
    "gpt_oss": {"sliding_window": 128, "layer_pattern": 2},
    "qwen2": {"sliding_window": 4096, "use_sliding_window": False},
    "qwen3": {"sliding_window": 4096, "use_sliding_window": False},
    "qwen2_moe": {"sliding_window": 4096, "use_sliding_window": False},
    "qwen3_moe": {"sliding_window": 4096, "use_sliding_window": False},
}
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# RoPE types whose max_position_embeddings is already the scaled length (vLLM _get_and_verify_max_len).
ROPE_PRESCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")

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
MOE_CHUNK_TOKENS = 16384
EXTENSIBLE_MARGIN_FLOOR = 1 * GiB    # 0.34 extensible KV cache: margin max(1 GiB, 0.75 x activation peak)
EXTENSIBLE_MARGIN_FRACTION = 0.75
UTILIZATION = {"exclusive": 0.93, "dedicated": 0.90, "shared": 0.80}
UTILIZATION_AFTER_OOM = 0.85
LENGTH_STEP = 1024  # a shortened max_model_len is rounded down to a multiple of this


def _fail(msg):
    raise AnsibleFilterError(msg)


def _cdiv(a, b):
    return -(-a // b)


def _gib(n):
    return "%.2f GiB" % (n / GiB)


def _format_gib(n, fixed=None):
    """GiB as vLLM prints them: format_gib's round(bytes / GiB, 2) (5.625 -> 5.62, 2 -> 2.0), or a fixed format."""
    return fixed % (n / GiB) if fixed else "%s" % round(n / GiB, 2)


def _int(value, field, minimum=1, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        _fail("%s must be an integer, got %r" % (field, value))
    if value < minimum:
        _fail("%s must be at least %d, got %d" % (field, minimum, value))
    return value


def _mapping(value, field):
    if value is None:
        return {}
    if not isinstance(value, dict):
        _fail("%s must be a dict, got %s" % (field, type(value).__name__))
    return value


def _version(vllm_version):
    version = PINNED_VERSION if vllm_version is None else str(vllm_version)
    if version not in VERSIONS:
        _fail("vllm_version %r is not in the version table (known: %s)" % (version, ", ".join(sorted(VERSIONS))))
    return version


# --------------------------------------------------------------------------------------------------
# The model: what vLLM's config code derives from config.json
# --------------------------------------------------------------------------------------------------

def _model_shape(model, dtype=None, online=None):
    """Attention layout of a config.json dict: per-layer sliding windows, KV heads, head sizes, MLA.
    dtype: the --dtype vLLM is given (None or auto: the checkpoint's 16-bit dtype); online: --quantization of an
    unquantized checkpoint (fp8 is sized; other methods keep the checkpoint's bytes, the safe side)."""
    model = _mapping(model, "model")
    if not model:
        _fail("model must be the model's config.json as a dict (e.g. from_json), got an empty value")
    text = model.get("text_config")
    prefix = "model"
    if text is not None:
        text = _mapping(text, "model.text_config")
        prefix = "model.text_config"
    else:
        text = model
    model_type = str(text.get("model_type") or model.get("model_type") or "")
    defaults = MODEL_DEFAULTS.get(model_type, {})

    def get(key):
        return text[key] if key in text else defaults.get(key)

    layers = _int(get("num_hidden_layers"), prefix + ".num_hidden_layers")
    heads = _int(get("num_attention_heads"), prefix + ".num_attention_heads")
    hidden = _int(get("hidden_size"), prefix + ".hidden_size")
    kv_heads = heads if get("num_key_value_heads") is None else _int(
        get("num_key_value_heads"), prefix + ".num_key_value_heads")
    mla = get("kv_lora_rank") is not None
    if mla:
        head_size = (_int(get("kv_lora_rank"), prefix + ".kv_lora_rank")
                     + _int(get("qk_rope_head_dim"), prefix + ".qk_rope_head_dim", minimum=0))
        head_size_v = 0
    else:
        head_dim = get("head_dim")
        # Some configs write head_dim null or 0 for "derive it" (vLLM treats both as absent).
        head_size = hidden // heads if not head_dim else _int(head_dim, prefix + ".head_dim")
        head_size_v = head_size

    window = get("sliding_window")
    if window is not None:
        window = _int(window, prefix + ".sliding_window", minimum=0) or None  # 0 means disabled
    if get("use_sliding_window") is False:
        window = None
    layer_types = get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) < layers:
            _fail("%s.layer_types must list the type of each of the %d layers" % (prefix, layers))
    elif window is not None:
        layer_types = _generated_layer_types(get, layers)
    windows = []
    for index in range(layers):
        kind = "sliding_attention" if layer_types is None else layer_types[index]
        if kind not in ("sliding_attention", "full_attention"):
            _fail("%s.layer_types[%d] is %r: only full_attention and sliding_attention layers are sized "
                  "(linear-attention, Mamba and chunked-attention layers are not)" % (prefix, index, kind))
        windows.append(window if kind == "sliding_attention" else None)

    config_dtype = str(text.get("torch_dtype") or text.get("dtype") or model.get("torch_dtype")
                       or model.get("dtype") or "bfloat16")
    if config_dtype not in ("bfloat16", "float16", "float32", "half", "float"):
        _fail("%s.torch_dtype %r is not a dtype this filter knows (bfloat16, float16, float32)"
              % (prefix, config_dtype))
    # vLLM serves float32 checkpoints in 16 bits unless --dtype says otherwise.
    dtype_bytes = DTYPES.get(dtype or "auto") or 2

    quant = _quantization(text.get("quantization_config") or model.get("quantization_config"))
    dims = _dims(get, model_type, hidden, heads, kv_heads, head_size, layers, mla)
    quantized = quant is not None
    if quant is None and online == "fp8":
        # vLLM quantizes every linear layer to fp8 with a per-tensor scale while loading.
        quant = _quantization({"quant_method": "fp8"})
        model = {k: v for k, v in model.items() if k not in ("_weight_bytes", "_num_parameters")}
    modules = _modules(dims, quant, dtype_bytes)
    weights, how = _weight_bytes(model, modules, quant, dtype_bytes)
    if online == "fp8" and how.startswith("estimated") and "fp8" in how:
        how += ", quantized online"
    if how == "given" and dtype_bytes == 4 and quant is None:
        weights, how = weights * 2, how + ", served in float32"
    return {
        "name": str(model.get("_name") or model.get("_name_or_path") or "the model"),
        "model_arg": model.get("_name") or model.get("_name_or_path"),
        "model_type": model_type, "layers": layers, "heads": heads, "kv_heads": kv_heads,
        "head_size": head_size, "head_size_v": head_size_v, "mla": mla, "windows": tuple(windows),
        "hidden": hidden, "dims": dims, "vocab": dims["vocab"],
        "max_len": _derived_max_len(text, get, model_type),
        "rotary_positions": _rotary_positions(text, model_type, _derived_max_len(text, get, model_type)),
        "weight_bytes": (weights, how), "modules": modules, "quantized": quantized,
        "quantization": quant, "dtype_bytes": dtype_bytes,
    }


def _generated_layer_types(get, layers):
    """layer_types as transformers fills them in when config.json has none (Gemma 2/3, gpt-oss, Qwen2)."""
    pattern = get("sliding_window_pattern") or get("layer_pattern")
    if pattern:
        # Gemma 3: (i + 1) % pattern -> sliding, so 5 local : 1 global for pattern 6.
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if get("max_window_layers") is not None:
        # Qwen2/Qwen3 with use_sliding_window: layers from max_window_layers on use the window.
        return ["sliding_attention" if i >= get("max_window_layers") else "full_attention" for i in range(layers)]
    return None  # one model-wide window on every layer (Mistral v0.1, Phi-3)


def _rotary_positions(text, model_type, max_len):
    """Positions of each RoPE cos/sin cache vLLM keeps on the GPU (one per distinct RoPE). Gemma 3's global layers
    use a linear-scaled RoPE, which caches max_position_embeddings x factor positions (rotary_embedding/
    linear_scaling_rope.py), and its local layers an unscaled RoPE with another base: 0.56 GiB for head_dim 256."""
    if "gemma3" not in model_type:
        return (max_len,)
    rope = text.get("rope_scaling") or text.get("rope_parameters")
    factor = rope.get("factor") if isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type")) == "linear" \
        else None
    scaled = isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 1
    return (int(max_len * factor) if scaled else max_len, max_len)


def _derived_max_len(text, get, model_type):
    """The model's maximum context as vLLM derives it (smallest length key, times a RoPE factor)."""
    lengths = [text[k] for k in MAX_LEN_KEYS if isinstance(text.get(k), int) and not isinstance(text.get(k), bool)]
    if text.get("model_max_length"):
        lengths = [text["model_max_length"]]
    if not lengths and get("max_position_embeddings"):
        lengths = [get("max_position_embeddings")]
    derived = min(lengths) if lengths else 2048  # vLLM's fallback when config.json has no length
    rope = text.get("rope_scaling") or text.get("rope_parameters")
    if isinstance(rope, dict) and "gemma3" not in model_type:
        rope_type = rope.get("rope_type") or rope.get("type") or "default"
        if rope_type not in ROPE_PRESCALED and rope.get("factor"):
            derived = int(derived * rope["factor"])
    return int(derived)


# --------------------------------------------------------------------------------------------------
# Weights: the tensors vLLM holds, module by module, in the checkpoint's quantization
# --------------------------------------------------------------------------------------------------

def _dims(get, model_type, hidden, heads, kv_heads, head_size, layers, mla):
    """The sizes of config.json that decide the weights and the activation peak (dense, MoE, MLA)."""
    experts = get("num_local_experts") or get("num_experts") or get("n_routed_experts") or 0
    inter = get("intermediate_size") or 4 * hidden
    moe_layers = set()
    if experts:
        first_dense = get("first_k_dense_replace") or 0        # DeepSeek: the first k layers are dense
        freq = get("moe_layer_freq") or 1
        step = get("decoder_sparse_step") or get("interleave_moe_layer_step") or 1  # Qwen MoE / Llama 4
        dense_only = set(get("mlp_only_layers") or ())
        moe_layers = {i for i in range(layers) if i >= first_dense and (i - first_dense) % freq == 0
                      and (i + 1) % step == 0 and i not in dense_only}
    moe_inter = get("moe_intermediate_size") or inter
    shared = (get("n_shared_experts") or 0) * moe_inter or get("shared_expert_intermediate_size") or 0
    if model_type.startswith("llama4"):
        shared = inter  # one shared expert as wide as a routed one; dense layers use intermediate_size_mlp
        inter = get("intermediate_size_mlp") or inter
    return {
        "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "head_size": head_size, "layers": layers,
        "vocab": get("vocab_size") or 32000, "tied": bool(get("tie_word_embeddings")), "inter": inter,
        "experts": experts, "moe_inter": moe_inter, "topk": get("num_experts_per_tok") or 1,
        "shared": shared, "moe_layers": frozenset(moe_layers), "mla": _mla_dims(get) if mla else None,
        "qkv_bias": bool(get("attention_bias")) or model_type.startswith("qwen2"),
        "rotary": (get("qk_rope_head_dim") if mla else head_size),
        "moe_block": {"mixtral": "block_sparse_moe"}.get(model_type, "feed_forward" if model_type.startswith(
            "llama4") else "mlp"),
    }


def _mla_dims(get):
    return {"q_lora": get("q_lora_rank"), "kv_lora": get("kv_lora_rank"), "rope": get("qk_rope_head_dim"),
            "nope": get("qk_nope_head_dim") or 128, "v": get("v_head_dim") or 128}


def _modules(dims, quant, dtype_bytes):
    """Weight tensors as vLLM allocates them: (layers, name, K inputs, N outputs, count, shard, kind, quantized).

    layers: the layer indices holding the tensor (None: embedding / lm_head / final norm); shard: how tensor
    parallelism splits it: "out"/"in" (column/row parallel), "kv" (KV heads, replicated when fewer than TP),
    "vocab" (padded to 64 rows), "rep" (every rank holds all of it); kind: linear, experts, router (never
    quantized: vLLM builds routers with quant_config=None), dense (embeddings, norms, biases: never quantized)."""
    hidden, hd, heads, kv = dims["hidden"], dims["head_size"], dims["heads"], dims["kv_heads"]
    every = frozenset(range(dims["layers"]))
    moe, dense = dims["moe_layers"], every - dims["moe_layers"]
    prefix = "model.layers.%d."
    attn = []
    if dims["mla"]:
        m = dims["mla"]
        qk = m["nope"] + m["rope"]
        attn += ([("self_attn.q_proj", hidden, heads * qk, "out")] if not m["q_lora"] else
                 [("self_attn.q_a_proj", hidden, m["q_lora"], "rep"), ("self_attn.q_b_proj", m["q_lora"], heads * qk,
                                                                       "out")])
        attn += [("self_attn.kv_a_proj_with_mqa", hidden, m["kv_lora"] + m["rope"], "rep"),
                 ("self_attn.kv_b_proj", m["kv_lora"], heads * (m["nope"] + m["v"]), "out"),
                 ("self_attn.o_proj", heads * m["v"], hidden, "in")]
    else:
        attn += [("self_attn.q_proj", hidden, heads * hd, "out"), ("self_attn.k_proj", hidden, kv * hd, "kv"),
                 ("self_attn.v_proj", hidden, kv * hd, "kv"), ("self_attn.o_proj", heads * hd, hidden, "in")]
    mlp = [("mlp.gate_proj", hidden, dims["inter"], "out"), ("mlp.up_proj", hidden, dims["inter"], "out"),
           ("mlp.down_proj", dims["inter"], hidden, "in")]
    block = dims["moe_block"] + "."
    shared = [(block + "shared_experts.gate_proj", hidden, dims["shared"], "out"),
              (block + "shared_experts.up_proj", hidden, dims["shared"], "out"),
              (block + "shared_experts.down_proj", dims["shared"], hidden, "in")] if dims["shared"] else []
    out = []

    def add(layers, name, k, n, count, shard, kind):
        """One template per layer set, split by whether the quantization skips it in that layer."""
        if not layers or not k or not n:
            return
        if layers is None or kind in ("router", "dense"):
            out.append((layers, name, k, n, count, shard, kind, kind != "dense" and _quantizes(quant, name, kind)))
            return
        split = {}
        for i in layers:
            split.setdefault(_quantizes(quant, prefix % i + name, kind), set()).add(i)
        out.extend((frozenset(s), name, k, n, count, shard, kind, q) for q, s in split.items())

    for name, k, n, shard in attn:
        add(every, name, k, n, 1, shard, "linear")
    if dims["qkv_bias"]:
        add(every, "self_attn.qkv_bias", 1, (heads + 2 * kv) * hd, 1, "out", "dense")
    for name, k, n, shard in mlp:
        add(dense, name, k, n, 1, shard, "linear")
    add(moe, block + "experts", hidden, 2 * dims["moe_inter"], dims["experts"], "out", "experts")
    add(moe, block + "experts.down", dims["moe_inter"], hidden, dims["experts"], "in", "experts")
    add(moe, block + "gate", hidden, dims["experts"], 1, "rep", "router")
    for name, k, n, shard in shared:
        add(moe, name, k, n, 1, shard, "linear")
    add(every, "norms", 1, 2 * hidden, 1, "rep", "dense")
    out.append((None, "model.embed_tokens", dims["vocab"], hidden, 1, "vocab", "dense", False))
    if not dims["tied"]:
        out.append((None, "lm_head", dims["vocab"], hidden, 1, "vocab", "head", _quantizes(quant, "lm_head", "head")))
    return tuple(out)


# quantization_config.quant_method -> what vLLM does with it (model_executor/layers/quantization/: auto_awq.py,
# auto_gptq.py, fp8.py, mxfp4.py, compressed_tensors/, bitsandbytes.py in 0.19). Per K x N weight matrix:
#   awq: int4 packed 8 to an int32, an fp16 scale per group of K and (zero_point) a packed 4-bit zero per group;
#   gptq: the same with zeros only when asymmetric (0.34 retires symmetric qzeros) and, with desc_act, g_idx and
#         its sort permutation (two int32 per input row);
#   fp8: one byte, a float32 scale per 128 x 128 block when weight_block_size is set (per tensor otherwise);
#   mxfp4: two fp4 values a byte and a uint8 exponent per 32 inputs, on the MoE experts only (vLLM keeps every
#          linear layer of gpt-oss in 16 bits);
#   compressed-tensors: num_bits per weight, scales per group / channel / block, zeros when not symmetric;
#   bitsandbytes: 4-bit packs two a byte with a float32 absmax per 64 (double quant: a uint8 per 64 plus a
#                 float32 per 256 blocks), 8-bit is one byte plus a float32 per output row.
# Embeddings and norms stay 16-bit in every format; lm_head only with awq/gptq "lm_head": true.
QUANT_METHODS = ("awq", "gptq", "fp8", "mxfp4", "compressed-tensors", "bitsandbytes")


def _quantization(config):
    """quantization_config parsed into what the weight arithmetic needs (None: not quantized)."""
    if not config:
        return None
    config = _mapping(config, "model.quantization_config")
    method = str(config.get("quant_method") or "").lower().replace("_marlin", "")
    field = "model.quantization_config"
    if method not in QUANT_METHODS:
        _fail("%s.quant_method %r is not sized here (sized: %s): give model._weight_bytes, the bytes of weights "
              "vLLM loads (\"Model loading took\" x tensor_parallel_size)" % (field, method, ", ".join(QUANT_METHODS)))
    quant = {"method": method, "skip": (), "match": "substring", "lm_head": False}
    if method in ("awq", "gptq"):
        bits = _int(config.get("bits", config.get("w_bit")), field + ".bits")
        group = config.get("group_size", config.get("q_group_size", 128))
        group = -1 if group == -1 else _int(group, field + ".group_size")
        zeros = bool(config.get("zero_point", True)) if method == "awq" else not config.get("sym", True)
        quant.update(bits=bits, group=group, zeros=zeros, lm_head=bool(config.get("lm_head")),
                     g_idx=method == "gptq" and bool(config.get("desc_act")),
                     skip=tuple(config.get("modules_to_not_convert") or ()) + tuple(
                         k[2:] for k in (config.get("dynamic") or {}) if k.startswith("-:")))
        if method == "gptq":
            quant["match"] = "regex_or_substring"
    elif method == "fp8":
        block = config.get("weight_block_size")
        quant.update(block=tuple(block) if block else None, match="exact",
                     skip=tuple(config.get("ignored_layers") or config.get("modules_to_not_convert") or ()))
    elif method == "mxfp4":
        quant.update(match="glob", skip=tuple(config.get("modules_to_not_convert") or ()))
    elif method == "bitsandbytes":
        quant.update(bits=4 if config.get("load_in_4bit") else 8, double=bool(config.get("bnb_4bit_use_double_quant")),
                     skip=tuple(config.get("llm_int8_skip_modules") or ()))
        if not (config.get("load_in_4bit") or config.get("load_in_8bit")):
            _fail("%s: bitsandbytes without load_in_4bit or load_in_8bit is not a quantized checkpoint" % field)
    else:
        quant.update(_compressed_tensors(config, field))
    return quant


def _compressed_tensors(config, field):
    """The config_groups of a compressed-tensors checkpoint: (targets, weights scheme) in order, and the ignore list."""
    groups = []
    for name, group in sorted(_mapping(config.get("config_groups"), field + ".config_groups").items()):
        weights = _mapping(group.get("weights"), "%s.config_groups.%s.weights" % (field, name))
        strategy = weights.get("strategy") or "tensor"
        scheme = {"bits": _int(weights.get("num_bits"), "%s.config_groups.%s.weights.num_bits" % (field, name)),
                  "strategy": strategy, "group": weights.get("group_size") or -1,
                  "block": tuple(weights.get("block_structure") or (128, 128)),
                  "zeros": not weights.get("symmetric", True),
                  "scale_bytes": 4 if weights.get("type") == "float" else 2}
        groups.append((tuple(group.get("targets") or ("Linear",)), scheme))
    if not groups:
        _fail("%s.config_groups is empty: nothing says how the weights are stored" % field)
    return {"groups": tuple(groups), "skip": tuple(config.get("ignore") or ()), "match": "regex_or_exact"}


def _matches(name, pattern, mode):
    """Whether a skip/target entry names a module, the way the format's loader compares them."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if mode == "glob":
        return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".*")
    if mode in ("exact", "regex_or_exact"):
        # vLLM checks the unfused shards: "mlp.experts" is skipped by its own name or a name below it.
        return name == pattern or name.startswith(pattern + ".")
    if mode == "regex_or_substring" and any(c in pattern for c in "*+[("):
        return re.match(pattern, name) is not None
    return pattern in name


def _quantizes(quant, name, kind):
    """Whether vLLM stores this module quantized (see QUANT_METHODS for which kinds each format covers)."""
    if quant is None or kind in ("router", "dense") or (kind == "head" and not quant["lm_head"]):
        return False
    if quant["method"] == "mxfp4" and kind != "experts":
        return False
    if any(_matches(name, p, quant["match"]) for p in quant["skip"]):
        return False
    if quant["method"] == "compressed-tensors":
        return _ct_scheme(quant, name) is not None
    return True


def _ct_scheme(quant, name):
    """The first config group whose targets cover the module (\"Linear\" covers every linear layer)."""
    for targets, scheme in quant["groups"]:
        if any(t == "Linear" or _matches(name, t, "regex_or_exact") for t in targets):
            return scheme
    return None


def _storage(quant, name, k, n, dtype_bytes):
    """Bytes of one K x N weight matrix as vLLM stores it after loading (unquantized: the served dtype)."""
    if quant is None:
        return k * n * dtype_bytes
    method = quant["method"]
    if method in ("awq", "gptq"):
        groups = 1 if quant["group"] == -1 else _cdiv(k, quant["group"])
        zeros = n * groups * quant["bits"] // 8 if quant["zeros"] else 0
        return k * n * quant["bits"] // 8 + groups * n * 2 + zeros + (8 * k if quant["g_idx"] else 0)
    if method == "fp8":
        block = quant["block"]
        return k * n + (_cdiv(k, block[1]) * _cdiv(n, block[0]) * 4 if block else 4)
    if method == "mxfp4":
        return k * n // 2 + _cdiv(k, 32) * n
    if method == "bitsandbytes":
        if quant["bits"] == 8:
            return k * n + 4 * n
        blocks = _cdiv(k * n, 64)
        return k * n // 2 + (blocks + 4 * _cdiv(blocks, 256) if quant["double"] else 4 * blocks)
    scheme = _ct_scheme(quant, name)
    strategy = scheme["strategy"]
    scales = {"group": (1 if scheme["group"] == -1 else _cdiv(k, scheme["group"])) * n, "channel": n,
              "block": _cdiv(k, scheme["block"][1]) * _cdiv(n, scheme["block"][0])}.get(strategy, 1)
    zeros = scales * scheme["bits"] // 8 if scheme["zeros"] else 0
    return k * n * scheme["bits"] // 8 + scales * scheme["scale_bytes"] + zeros


def _shard(k, n, shard, tp, dims):
    """(K, N) of one tensor-parallel rank's part."""
    if shard == "out":
        return k, _cdiv(n, tp)
    if shard == "in":
        return _cdiv(k, tp), n
    if shard == "kv":
        return k, max(1, dims["kv_heads"] // tp) * dims["head_size"]
    if shard == "vocab":
        return _cdiv(_cdiv(k, 64) * 64, tp), n
    return k, n


def _stage_weights(shape, tp, pp):
    """Estimated weight bytes on the GPU of each pipeline stage (one tensor-parallel rank), from the modules."""
    dims, quant, dtype_bytes = shape["dims"], shape["quantization"], shape["dtype_bytes"]
    stages = _pp_stages(dims["layers"], pp)
    totals = [_rotary_bytes(shape)] * pp
    for layers, name, k, n, count, shard, kind, quantized in shape["modules"]:
        k, n = _shard(k, n, shard, tp, dims)
        if quantized and kind == "experts" and quant["method"] == "mxfp4":
            # Padded for the MoE kernel (Marlin, TRT-LLM: hidden to 256, intermediate to 128); the lighter
            # padding of other kernels is within this.
            k, n = _cdiv(k, 256 if shard == "out" else 128) * (256 if shard == "out" else 128), _cdiv(n, 256) * 256
        size = count * _storage(quant if quantized else None, name, k, n, dtype_bytes)
        if layers is None:
            # The embedding lives on the first stage, lm_head on the last (a tied one is copied there).
            holders = [pp - 1] if name == "lm_head" else ([0, pp - 1] if dims["tied"] and pp > 1 else [0])
            for stage in set(holders):
                totals[stage] += size
        else:
            for index, stage in enumerate(stages):
                totals[index] += size * len(stage.intersection(layers))
    return totals


def _weight_bytes(model, modules, quant, dtype_bytes):
    """(bytes, how) of the whole checkpoint: given, from the parameter count, or estimated from the modules."""
    if model.get("_weight_bytes") is not None:
        return _int(model["_weight_bytes"], "model._weight_bytes"), "given"
    if model.get("_num_parameters") is not None and quant is None:
        # A quantized checkpoint's parameter count counts packed int32 words, not weights: not used.
        return (dtype_bytes * _int(model["_num_parameters"], "model._num_parameters"),
                "from _num_parameters x %d bytes" % dtype_bytes)
    total = 0
    for layers, name, k, n, count, shard, kind, quantized in modules:
        total += count * (1 if layers is None else len(layers)) * _storage(
            quant if quantized else None, name, k, n, dtype_bytes)
    if quant is None:
        return total, "estimated from config.json shapes"
    return total, "estimated from config.json shapes and quantization_config (%s)" % _describe(quant)


def _describe(quant):
    method = quant["method"]
    if method in ("awq", "gptq"):
        group = "per channel" if quant["group"] == -1 else quant["group"]
        return "%s %d-bit, group %s" % (method, quant["bits"], group)
    if method == "fp8":
        return "fp8, %s scales" % ("%dx%d block" % quant["block"] if quant["block"] else "per-tensor")
    if method == "bitsandbytes":
        return "bitsandbytes %d-bit" % quant["bits"]
    if method == "compressed-tensors":
        return "compressed-tensors " + ", ".join("%d-bit %s" % (s["bits"], s["strategy"]) for _, s in quant["groups"])
    return "mxfp4 experts"


def _rotary_bytes(shape):
    """The RoPE cos/sin caches: positions x rotary dim in the served dtype, on every stage (not in the checkpoint)."""
    return sum(shape["rotary_positions"]) * (shape["dims"]["rotary"] or 0) * shape["dtype_bytes"]


def _gpu_weight_bytes(shape, tp, pp):
    """Weight bytes on the busiest GPU: the largest stage of one rank; a given total is split like the estimate,
    plus the RoPE caches it does not hold."""
    stages = _stage_weights(shape, tp, pp)
    total, how = shape["weight_bytes"]
    if how.startswith("estimated"):
        return max(stages)
    rotary = _rotary_bytes(shape)
    estimate = sum(_stage_weights(shape, 1, 1)) - rotary
    return _cdiv(total * (max(stages) - rotary), estimate) + rotary


# --------------------------------------------------------------------------------------------------
# The KV arithmetic (the one place it lives)
# --------------------------------------------------------------------------------------------------

def _bytes_per_token(shape, tp, kv_cache_dtype):
    """KV bytes of one token in one layer on one GPU (vLLM's page size for block_size 1)."""
    if kv_cache_dtype == "fp8_ds_mla":
        if not shape["mla"]:
            _fail("kv_cache_dtype fp8_ds_mla is only for MLA models (DeepSeek), not %s" % shape["name"])
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
        count = _cdiv(len(layers), group_size)
        groups.extend((window, layers[i::count]) for i in range(count))
    return groups


def _pp_stages(layers, pp):
    """Layer indices of each pipeline stage (vLLM get_pp_indices: the extra layers go to the middle)."""
    sizes = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        sizes[-i] += 1
    stages, start = [], 0
    for size in sizes:
        stages.append(set(range(start, start + size)))
        start += size
    return stages


def _layout(shape, tensor_parallel_size, pipeline_parallel_size, kv_cache_dtype, block_size,
            max_num_batched_tokens, async_scheduling, vllm_version, device):
    """Everything the KV arithmetic needs, resolved from the arguments, the device (_device) and the version."""
    version = _version(vllm_version)
    row = VERSIONS[version]
    tp = _int(tensor_parallel_size, "tensor_parallel_size")
    pp = _int(pipeline_parallel_size, "pipeline_parallel_size")
    if pp > shape["layers"]:
        _fail("pipeline_parallel_size %d is more than the %d layers of %s" % (pp, shape["layers"], shape["name"]))
    if kv_cache_dtype not in KV_DTYPE_BYTES:
        _fail("kv_cache_dtype %r is not supported here (supported: %s)" % (kv_cache_dtype, ", ".join(KV_DTYPE_BYTES)))
    attention = _attention(shape, version, device, _int(block_size, "block_size", allow_none=True))
    block_size = attention["block_size"]
    cpu = device["type"] == "cpu"
    if max_num_batched_tokens is None:
        max_num_batched_tokens = row["cpu_batch_defaults"][0] * tp * pp if cpu else row["batch_defaults"][-1][2]
    batched = _int(max_num_batched_tokens, "max_num_batched_tokens")
    if async_scheduling is None:
        async_scheduling = row["async_scheduling"] and not cpu
    in_flight = batched if row["in_flight"] == "batch" else (pp + 1 if async_scheduling else pp) * batched
    return {
        "shape": shape, "version": version, "row": row, "tp": tp, "pp": pp, "block_size": block_size,
        "attention": attention,
        "in_flight": in_flight, "page": block_size * _bytes_per_token(shape, tp, kv_cache_dtype),
        "groups": _groups(shape["windows"]), "stages": _pp_stages(shape["layers"], pp),
    }


def _device(device, compute_capability=None, cpu_flags=None):
    """The facts about the device that decide vLLM's attention backend: cuda with its compute capability (None:
    unknown), or cpu with its /proc/cpuinfo flags (None: unknown)."""
    if device not in ("cuda", "cpu"):
        _fail("device must be cuda or cpu, got %r" % (device,))
    capability = None if compute_capability is None else _capability(compute_capability, "compute_capability")
    flags = None
    if cpu_flags is not None:
        if isinstance(cpu_flags, str):
            cpu_flags = cpu_flags.split()
        if not isinstance(cpu_flags, list) or not all(isinstance(f, str) for f in cpu_flags):
            _fail("cpu_flags must be the CPU's flags (the 'flags' line of /proc/cpuinfo), got %r" % (cpu_flags,))
        flags = frozenset(cpu_flags)
    return {"type": device, "capability": capability, "cpu_flags": flags}


def _capability(value, field):
    """(major, minor) of nvidia-smi's compute_cap ("8.6"): the one parser of it."""
    try:
        capability = tuple(int(p) for p in str(value).split("."))
    except ValueError:
        capability = ()
    if len(capability) != 2:
        _fail("%s must look like \"8.6\", got %r (nvidia-smi's compute_cap)" % (field, value))
    return capability


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


def _attention(shape, version, device, block_size):
    """The attention backend vLLM picks on the device and the KV block size it then uses (see ATTENTION).
    Fails when no backend takes the requested block size, and when the answer depends on a fact not given."""
    default = VERSIONS[version]["block_size"]
    table = ATTENTION[(device["type"], shape["mla"])]
    kind = "an MLA model" if shape["mla"] else "standard attention"
    if device["type"] == "cpu":
        if device["cpu_flags"] is None and len(table) > 1:
            _fail("on the CPU build, %s gets block size 128 with AMX tiles and 16 without: give cpu_flags (the "
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
        _fail("block_size %d: no attention backend vLLM %s has for %s on %s takes it (%s); vLLM would fail at "
              "start (\"No valid attention backend\" or \"No common block size for %d\")" % (
                  block_size, version, kind, ", ".join(refused), "; ".join(
                      "%s: multiples of %s" % (b["name"], " or ".join(str(x) for x in b["sizes"]))
                      for b in table), block_size))
    sizes = {pick[1] for pick in chosen.values()}
    if len(sizes) > 1:
        _fail("on CUDA, vLLM %s gives %s block size %s depending on the GPU: give compute_capability or block_size"
              % (version, kind, " or ".join(str(x) for x in sorted(sizes))))
    names = sorted({pick[0]["name"] for pick in chosen.values()})
    first = {cc: backends[0]["name"] for cc, backends in candidates.items() if backends}
    precluded = sorted({first[cc] for cc, pick in chosen.items() if pick[0]["name"] != first[cc]})
    return {"backend": " or ".join(names), "block_size": sizes.pop(), "precluded": precluded}


def _blocks(window, max_model_len, in_flight, block_size):
    """Blocks one request at max_model_len takes in one layer (SlidingWindowSpec / FullAttentionSpec)."""
    if window is None:
        return _cdiv(max_model_len, block_size)
    # +1: the window need not start at a block boundary.
    return _cdiv(min(window - 1 + in_flight, max_model_len), block_size) + 1


def _stage_block_bytes(lay, stage):
    """Bytes of one block in a stage's shared pool: the largest group's layers on that stage."""
    return lay["page"] * max(len(stage.intersection(layers)) for _, layers in lay["groups"])


def _stage_need(lay, stage, max_model_len):
    """KV bytes one request at max_model_len needs on a stage's GPUs, as the startup check counts them."""
    if lay["row"]["grouped_check"]:
        # Every group claims blocks from the shared pool, empty or padded ones included.
        blocks = sum(_blocks(w, max_model_len, lay["in_flight"], lay["block_size"]) for w, _ in lay["groups"])
        return _stage_block_bytes(lay, stage) * blocks
    return lay["page"] * sum(_blocks(lay["shape"]["windows"][i], max_model_len, lay["in_flight"], lay["block_size"])
                             for i in stage)


def _check_memory(lay, stage, kv_cache_bytes):
    """Available memory as the startup check sees it (after the null block in newer releases)."""
    return kv_cache_bytes - (_stage_block_bytes(lay, stage) if lay["row"]["null_block"] else 0)


def _estimate(lay, stage, available, upper):
    """vLLM's binary search for the largest length that fits, bounds included (0: not even 1 token)."""
    if available <= 0:
        return 0

    def fits(length):
        return _stage_need(lay, stage, length) <= available

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


def _startup_check(lay, kv_cache_bytes, max_model_len):
    """What vLLM's startup check does with this much KV memory per GPU: None if it passes, else the
    failing stage's numbers (needed, available, estimated maximum model length)."""
    for stage in lay["stages"]:
        available = _check_memory(lay, stage, kv_cache_bytes)
        needed = _stage_need(lay, stage, max_model_len)
        if available <= 0 or needed > available:
            return {"needed": needed, "available": available,
                    "estimate": _estimate(lay, stage, available, max_model_len)}
    return None


def _request_bytes(lay, max_model_len):
    """KV bytes of one request at max_model_len on the busiest pipeline stage."""
    return max(_stage_need(lay, stage, max_model_len) for stage in lay["stages"])


def _max_len(lay, kv_cache_bytes, upper):
    """Largest length every stage's startup check accepts (vLLM's estimate, bounded by upper)."""
    return min(_estimate(lay, stage, _check_memory(lay, stage, kv_cache_bytes), upper) for stage in lay["stages"])


def _capacity(lay, kv_cache_bytes, max_model_len):
    """num_blocks, per-request blocks, KV tokens and concurrency as vLLM logs them."""
    num_blocks = min(kv_cache_bytes // _stage_block_bytes(lay, stage) for stage in lay["stages"])
    per_request = sum(_blocks(w, max_model_len, lay["in_flight"], lay["block_size"]) for w, _ in lay["groups"])
    concurrency = num_blocks / per_request
    return {"num_blocks": num_blocks, "blocks_per_request": per_request,
            "tokens": int(concurrency * max_model_len), "concurrency": concurrency}


def _check_message(lay, max_model_len, failed):
    """vLLM's startup error text for a failed check."""
    estimate = ""
    if failed["estimate"] > 0:
        estimate = "Based on the available memory, the estimated maximum model length is %d. " % failed["estimate"]
    return ("To serve at least one request with the %s max seq len (%d), (%s GiB KV cache is needed, which is "
            "larger than the available KV cache memory (%s GiB). %s" % (
                lay["row"]["message"], max_model_len, _format_gib(failed["needed"], lay["row"]["gib_format"]),
                _format_gib(failed["available"], lay["row"]["gib_format"]), estimate)).strip()


# --------------------------------------------------------------------------------------------------
# Public filters: KV arithmetic
# --------------------------------------------------------------------------------------------------

def vllm_kv_cache_bytes(model, max_model_len, tensor_parallel_size=1, pipeline_parallel_size=1,
                        kv_cache_dtype="auto", block_size=None, max_num_batched_tokens=None,
                        async_scheduling=None, vllm_version=None, device="cuda", compute_capability=None,
                        cpu_flags=None):
    """Bytes of KV cache one request at max_model_len needs on one GPU (the busiest pipeline stage),
    as vLLM's startup check counts them, without the null block."""
    lay = _layout(_model_shape(model), tensor_parallel_size, pipeline_parallel_size, kv_cache_dtype, block_size,
                  max_num_batched_tokens, async_scheduling, vllm_version,
                  _device(device, compute_capability, cpu_flags))
    return _request_bytes(lay, _int(max_model_len, "max_model_len"))


def vllm_max_model_len(model, kv_cache_bytes, tensor_parallel_size=1, pipeline_parallel_size=1,
                       kv_cache_dtype="auto", block_size=None, max_num_batched_tokens=None,
                       async_scheduling=None, vllm_version=None, device="cuda", max_model_len=None,
                       compute_capability=None, cpu_flags=None):
    """Largest max_model_len vLLM's startup check accepts with kv_cache_bytes of KV memory per GPU;
    vLLM's own binary search between 1 and max_model_len (default: the model's derived maximum)."""
    lay = _layout(_model_shape(model), tensor_parallel_size, pipeline_parallel_size, kv_cache_dtype, block_size,
                  max_num_batched_tokens, async_scheduling, vllm_version,
                  _device(device, compute_capability, cpu_flags))
    memory = _int(kv_cache_bytes, "kv_cache_bytes", minimum=0)
    upper = lay["shape"]["max_len"] if max_model_len is None else _int(max_model_len, "max_model_len")
    return _max_len(lay, memory, upper)


def vllm_model(name):
    """The catalog entry (config.json fields plus _weight_bytes) of a popular model."""
    catalog = _catalog()
    if not isinstance(name, str) or name not in catalog:
        _fail("vllm_model: unknown model %r; known models: %s" % (name, ", ".join(sorted(catalog))))
    entry = json.loads(json.dumps(catalog[name]))
    entry["_name"] = name
    return entry


@functools.lru_cache(maxsize=1)
def _catalog():
    with open(CATALOG_FILE) as handle:
        return {k: v for k, v in json.load(handle).items() if not k.startswith("_")}


# --------------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------------

def _gpu_group(gpus, policy):
    """(name, count, usable bytes per GPU, smallest compute capability, warnings) of the GPU group."""
    if not isinstance(gpus, list) or not gpus:
        _fail("gpus must be a non-empty list of GPU facts (ansible_facts.nvidia_gpus), got %r" % (gpus,))
    usable_override = policy.get("usable_memory_mib")
    totals, capabilities, warnings = [], [], []
    for i, fact in enumerate(gpus):
        field = "gpus[%d]" % i
        gpu = _mapping(fact, field)
        if not isinstance(gpu.get("name"), str) or not gpu["name"]:
            _fail("%s.name must be the GPU's name, got %r" % (field, gpu.get("name")))
        total = gpu.get("memory_total_mib")
        if total is None and usable_override is None:
            _fail("%s.memory_total_mib is null (MIG or [N/A] from nvidia-smi): set policy.usable_memory_mib "
                  "to the memory vLLM may see on %s" % (field, gpu["name"]))
        if total is not None:
            totals.append(_int(total, field + ".memory_total_mib"))
            used = gpu.get("memory_used_mib")
            if isinstance(used, int) and not isinstance(used, bool) and used > 1024:
                warnings.append("%s (%s) already has %d MiB in use: vLLM refuses to start when free memory is "
                                "below what it requests; stop the other process or lower the utilization"
                                % (field, gpu["name"], used))
        capabilities.append(_capability(gpu.get("compute_capability"), field + ".compute_capability"))
    names = sorted({gpu["name"] for gpu in gpus})
    if usable_override is not None:
        usable = _int(usable_override, "policy.usable_memory_mib") * MiB
    else:
        # nvidia-smi's total is a few hundred MiB above what CUDA lets a process use (H100: 81559 MiB
        # listed, 79.2 GiB usable): budget from usable memory.
        smallest = min(totals)
        usable = (smallest - max(512, smallest // 100)) * MiB
    return " + ".join(names), len(gpus), usable, min(capabilities), warnings


def _batch_defaults(row, usable, name):
    for min_gib, excluded, batched, seqs in row["batch_defaults"]:
        if usable >= min_gib * GiB and not (excluded and excluded in name.lower()):
            return batched, seqs
    return row["batch_defaults"][-1][2:]


def _utilization(policy, applied):
    if policy.get("gpu_memory_utilization") is not None:
        value = policy["gpu_memory_utilization"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            _fail("policy.gpu_memory_utilization must be between 0 and 1 (exclusive: 1.0 leaves PyTorch and "
                  "prefill spikes no headroom), got %r" % (value,))
        applied.append("gpu_memory_utilization %.2f as set in the policy" % value)
        return float(value)
    sharing = policy.get("gpu_sharing", "dedicated")
    if sharing not in UTILIZATION:
        _fail("policy.gpu_sharing must be one of %s, got %r" % (", ".join(UTILIZATION), sharing))
    value = UTILIZATION[sharing]
    reason = {"exclusive": "nothing else runs on the GPUs", "dedicated": "dedicated GPUs",
              "shared": "GPUs shared with other processes"}[sharing]
    if policy.get("runtime_ooms") and value > UTILIZATION_AFTER_OOM:
        value, reason = UTILIZATION_AFTER_OOM, "runtime OOMs were reported"
    applied.append("gpu_memory_utilization %.2f: %s" % (value, reason))
    return value


def _budget(lay, ctx, seqs, weights=None):
    """Per-GPU memory budget: what vLLM subtracts from its share before the KV cache (weights: per GPU,
    to try another checkpoint)."""
    shape, policy, batched, row = lay["shape"], ctx["policy"], ctx["batched"], lay["row"]
    if weights is None:
        weights = _gpu_weight_bytes(shape, lay["tp"], lay["pp"])
    weights = max(0, weights - int(ctx["serve"].get("cpu_offload_gb", 0) * GiB))
    activation = policy.get("activation_bytes")
    if activation is None:
        activation = _activation(shape, lay["tp"], lay["pp"], batched, seqs)
    graphs = policy.get("cuda_graph_bytes")
    if graphs is None:
        graphs = _cuda_graphs(lay, seqs) if row["cuda_graph_budget"] or ctx["extensible"] else 0
    if ctx["enforce_eager"]:
        graphs = 0
    non_torch = policy.get("non_torch_bytes")
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
        kv = ctx["serve"]["num_gpu_blocks_override"] * max(_stage_block_bytes(lay, s) for s in lay["stages"])
    elif ctx["serve"].get("kv_cache_memory_bytes") is not None:
        kv = ctx["serve"]["kv_cache_memory_bytes"]  # vLLM then ignores the utilization for the KV size
    return {"usable_bytes": usable, "requested_bytes": requested, "weights_bytes": weights,
            "activation_peak_bytes": activation, "cuda_graph_bytes": graphs, "non_torch_bytes": non_torch,
            "kv_cache_bytes": max(kv, 0)}


def _activation(shape, tp, pp, batched, seqs):
    """Peak torch memory of vLLM's profiling run on the busiest stage (see SAMPLER_BYTES_PER_LOGIT)."""
    dims, width = shape["dims"], shape["dtype_bytes"]
    attention = (dims["heads"] + 2 * dims["kv_heads"]) * dims["head_size"] // tp + 4 * dims["hidden"]
    # Dense MLP: gate/up output, activation output; with only MoE layers the workspace below is the MLP.
    mlp = 3 * dims["inter"] // tp if len(dims["moe_layers"]) < dims["layers"] else 0
    forward = batched * width * (attention + mlp)
    sampler = seqs * dims["vocab"] * SAMPLER_BYTES_PER_LOGIT
    moe = 0
    if dims["moe_layers"]:
        moe = min(batched, MOE_CHUNK_TOKENS) * dims["topk"] * width * (3 * dims["moe_inter"] // tp + dims["hidden"])
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


def _tp_candidates(shape, start, count, allow_more):
    """Tensor parallel sizes to try: the start, then powers of two up to the group's GPUs (vLLM needs them to
    divide the attention heads)."""
    larger = [t for t in (2, 4, 8, 16, 32, 64) if start < t <= count and shape["heads"] % t == 0]
    return [start] + (larger if allow_more else [])


def _attempt(ctx, tp, kv_dtype, seqs):
    """Size one configuration; returns the facts about it (fits or not, and why)."""
    lay = _layout(ctx["shape"], tp, ctx["pp"], kv_dtype, ctx["block_size"], ctx["batched"], None, ctx["version"],
                  ctx["device"])
    budget = _budget(lay, ctx, seqs)
    kv = budget["kv_cache_bytes"]
    fit_len = _max_len(lay, kv, ctx["target_len"])
    length = fit_len
    if fit_len < ctx["target_len"]:
        # Shrunk: stay a little below the longest that fits, on a round number.
        length = max(ctx["floor_len"], fit_len // LENGTH_STEP * LENGTH_STEP)
    if fit_len < ctx["floor_len"]:
        length = None
    result = {"tp": tp, "kv_dtype": kv_dtype, "lay": lay, "budget": budget, "fit_len": fit_len,
              "max_model_len": length, "max_num_seqs": seqs}
    if length is None:
        return result
    result["capacity"] = _capacity(lay, kv, length)
    if ctx["peak"]:
        held = _capacity(lay, kv, ctx["p99"] or length)
        # The null block is never handed out; the rest must hold the peak at p99 context.
        result["seqs_that_fit"] = (held["num_blocks"] - 1) // held["blocks_per_request"]
    return result


def _fits_workload(result, ctx):
    return result["max_model_len"] is not None and result.get("seqs_that_fit", ctx["peak"] or 0) >= (ctx["peak"] or 0)


def vllm_sizing(gpus, model, workload=None, policy=None):
    """The vLLM plan for one host or GPU group: engine arguments, environment, memory budget, fit."""
    workload = _mapping(workload, "workload")
    policy = _mapping(policy, "policy")
    version = _version(policy.get("vllm_version"))
    row = VERSIONS[version]
    serve = _serve_options(policy.get("serve_options"), version)
    shape = _model_shape(model, serve.get("dtype"), serve.get("quantization"))
    host = policy.get("host")
    where = ("host %s: " % host) if host else ""
    name = str(policy.get("model") or shape["name"])  # for messages; the model may have no name
    applied, warnings = [], []
    gpu_name, gpu_count, usable, capability, gpu_warnings = _gpu_group(gpus, policy)
    warnings.extend(gpu_warnings)

    p99 = _int(workload.get("p99_context"), "workload.p99_context", allow_none=True)
    peak = _int(workload.get("peak_concurrency"), "workload.peak_concurrency", allow_none=True)
    model_max = shape["max_len"]
    if p99 and p99 > model_max:
        _fail("%s%s: workload.p99_context %d is longer than the model's maximum context %d "
              "(max_position_embeddings); no setting serves it" % (where, name, p99, model_max))
    target = policy.get("max_model_len") or workload.get("max_context") or p99 or model_max
    target = _int(target, "policy.max_model_len" if policy.get("max_model_len") else "workload.max_context")
    if p99 and target < p99:
        _fail("%s%s: max_model_len %d is shorter than workload.p99_context %d: requests that long would be "
              "rejected" % (where, name, target, p99))
    if target > model_max:
        applied.append("max_model_len capped at the model's maximum context %d (asked %d)" % (model_max, target))
        target = model_max
    if p99:
        applied.append("max_model_len sized to the workload (p99 context %d), not the model's maximum %d"
                       % (p99, model_max) if target == p99 else
                       "max_model_len target %d, may shrink down to the workload's p99 context %d" % (target, p99))
    floor = min(target, p99 or _int(policy.get("min_model_len", 4096), "policy.min_model_len"))

    utilization = _utilization(policy, applied)
    enforce_eager = policy.get("enforce_eager")
    if enforce_eager is None:
        enforce_eager = bool(policy.get("runtime_ooms"))
        if enforce_eager:
            applied.append("enforce_eager: CUDA graphs off after runtime OOMs (frees their memory)")
    default_batched, default_seqs = _batch_defaults(row, usable, gpu_name)
    batched = _int(policy.get("max_num_batched_tokens", default_batched), "policy.max_num_batched_tokens")
    seqs = _int(peak or policy.get("max_num_seqs") or default_seqs, "policy.max_num_seqs")
    if batched < seqs:
        applied.append("max_num_batched_tokens raised to max_num_seqs %d (vLLM requires at least that)" % seqs)
        batched = seqs
    kv_dtype = policy.get("kv_cache_dtype", "auto")
    if kv_dtype not in KV_DTYPE_BYTES:
        _fail("policy.kv_cache_dtype %r is not supported (supported: %s)" % (kv_dtype, ", ".join(KV_DTYPE_BYTES)))
    allow_fp8 = policy.get("allow_fp8_kv_cache", True) and capability >= (8, 0)
    tp_start = _int(policy.get("tensor_parallel_size", 1), "policy.tensor_parallel_size")
    pp = _int(policy.get("pipeline_parallel_size", 1), "policy.pipeline_parallel_size")
    if shape["heads"] % tp_start:
        _fail("%s%s: policy.tensor_parallel_size %d does not divide the model's %d attention heads"
              % (where, name, tp_start, shape["heads"]))
    if tp_start * pp > gpu_count:
        _fail("%s%s: tensor_parallel_size %d x pipeline_parallel_size %d needs %d GPUs, the group has %d (%s)"
              % (where, name, tp_start, pp, tp_start * pp, gpu_count, gpu_name))
    ctx = {"shape": shape, "name": name, "host": host, "gpu_name": gpu_name, "gpu_count": gpu_count,
           "applied": applied, "warnings": warnings, "version": version, "pp": pp,
           "block_size": policy.get("block_size"), "batched": batched,
           "usable": usable, "utilization": utilization, "enforce_eager": enforce_eager, "policy": policy,
           "extensible": row["extensible_kv_cache"], "target_len": target, "floor_len": floor,
           "p99": p99, "peak": peak, "serve": serve,
           "device": {"type": "cuda", "capability": capability, "cpu_flags": None},
           "min_seqs": _int(policy.get("min_num_seqs", max(1, (peak or 0) // 2)), "policy.min_num_seqs")}

    # Fallbacks in order: shorter max_model_len (inside _attempt), fp8 KV cache, fewer max_num_seqs,
    # more tensor parallelism. Quantized weights can only be suggested.
    tried, chosen = [], None
    tp_candidates = _tp_candidates(shape, tp_start, gpu_count // pp, policy.get("allow_tensor_parallel", True))
    for tp in tp_candidates:
        dtypes = [kv_dtype] + (["fp8"] if allow_fp8 and KV_DTYPE_BYTES[kv_dtype] != 1 else [])
        results = [_attempt(ctx, tp, d, seqs) for d in dtypes]
        tried.extend(results)
        chosen = next((r for r in results if _fits_workload(r, ctx)), None) or _fewer_seqs(results[-1], ctx, tp)
        if chosen is not None:
            break
    if chosen is not None and peak and chosen["max_num_seqs"] < peak:
        warnings.append(_peak_hint(ctx, chosen, tp_candidates[tp_candidates.index(chosen["tp"]) + 1:]))
    plan = _plan(ctx, chosen or tried[-1], chosen is not None, tried)
    if not plan["fits"] and policy.get("strict", True):
        _fail("vllm_sizing: %s%s" % (where, plan["reason"]))
    return plan


def _fewer_seqs(result, ctx, tp):
    """Lower max_num_seqs to what the KV cache holds at p99, if the policy's floor allows."""
    if result["max_model_len"] is None or "seqs_that_fit" not in result:
        return None
    for _ in range(3):  # fewer sequences shrink the sampler's share, which frees a little KV memory
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
    if result["kv_dtype"] != (ctx["policy"].get("kv_cache_dtype") or "auto"):
        applied.append("kv_cache_dtype fp8: halves KV bytes per token (the model's dtype did not fit)")
    if result["kv_dtype"].startswith("fp8"):
        warnings.append("fp8 KV cache: a small quality cost; check your evaluations")
    if ctx["peak"] and result["max_num_seqs"] < ctx["peak"]:
        applied.append("max_num_seqs %d (peak concurrency %d does not fit at context %d; floor %d)"
                       % (result["max_num_seqs"], ctx["peak"], ctx["p99"] or length, ctx["min_seqs"]))
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
    if ctx["policy"].get("expandable_segments", True):
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        applied.append("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against allocator fragmentation")
        if tp * pp > 1:
            engine_args["disable_custom_all_reduce"] = True
            warnings.append("expandable_segments with tensor parallelism can crash vLLM's custom all-reduce at "
                            "start-up (vLLM #42609, #49101, #56180): disable_custom_all_reduce is set")
    if shape["weight_bytes"][1] != "given":
        warnings.append("weights %s: %s" % (shape["weight_bytes"][1], _gib(shape["weight_bytes"][0])))
    applied.append("explicit gpu_memory_utilization: vLLM %s would default to %s" % (ctx["version"], (
        "1.0 (extensible KV cache; it logs a warning for values below 1.0, the headroom stays for prefill spikes "
        "and other processes)") if row["extensible_kv_cache"] else row["utilization"]))
    capacity = result.get("capacity") or {"tokens": 0, "concurrency": 0.0}
    plan = {
        "fits": fits, "reason": "", "vllm_version": ctx["version"], "host": ctx["host"], "model": _model_arg(ctx),
        "gpus": {"name": ctx["gpu_name"], "count": ctx["gpu_count"], "used": tp * pp},
        "engine_args": engine_args, "env": env, "budget_per_gpu": budget,
        "block_size": lay["block_size"], "attention_backend": lay["attention"]["backend"],
        "kv_cache_tokens": capacity["tokens"],
        "concurrency_at_max_model_len": round(capacity["concurrency"], 2),
        "kv_bytes_per_request": _request_bytes(lay, length),
        "applied": applied, "warnings": warnings,
    }
    if fits:
        plan["reason"] = ("%s fits on %d x %s: %s of KV cache per GPU holds %d tokens, %.2f requests at "
                          "max_model_len %d" % (name, tp * pp, ctx["gpu_name"], _gib(budget["kv_cache_bytes"]),
                                                capacity["tokens"], capacity["concurrency"], length))
    else:
        plan["reason"] = _misfit_reason(ctx, result, tried)
    return plan


def _serve_warnings(ctx, budget, warnings):
    """What the serving options change in the budget, said where the plan cannot check it."""
    serve = ctx["serve"]
    if serve.get("quantization") and ctx["shape"]["quantization"] is None:
        warnings.append("quantization %s of an unquantized checkpoint: the budget counts the checkpoint's weights "
                        "(%s per GPU), so the KV cache vLLM gets will be larger than planned"
                        % (serve["quantization"], _gib(budget["weights_bytes"])))
    if "kv_cache_memory_bytes" in serve or "num_gpu_blocks_override" in serve:
        outside = (budget["usable_bytes"] - budget["weights_bytes"] - budget["activation_peak_bytes"]
                   - budget["cuda_graph_bytes"] - budget["non_torch_bytes"])
        if budget["kv_cache_bytes"] > outside:
            warnings.append("the KV cache pinned by serve_options (%s) is more than the %s left beside weights, "
                            "activations, CUDA graphs and non-torch memory: expect CUDA OOM at start or under load"
                            % (_gib(budget["kv_cache_bytes"]), _gib(outside)))


def _model_arg(ctx):
    """What --model gets: policy.model, else the config's _name / _name_or_path (None: serve_args refuses)."""
    return ctx["policy"].get("model") or ctx["shape"]["model_arg"]


def _misfit_reason(ctx, result, tried):
    """Why nothing fits, with vLLM's own message for the last configuration tried."""
    lay, budget = result["lay"], result["budget"]
    parts = ["%s does not fit on %d x %s (%s usable each, vLLM %s)" % (
        ctx["name"], ctx["gpu_count"], ctx["gpu_name"], _gib(ctx["usable"]), ctx["version"])]
    parts.append("last tried tensor_parallel_size %d, kv_cache_dtype %s, gpu_memory_utilization %.2f: %s requested "
                 "per GPU = weights %s + activation peak %s + CUDA graphs %s + non-torch %s, leaving %s for KV cache"
                 % (result["tp"], result["kv_dtype"], ctx["utilization"], _gib(budget["requested_bytes"]),
                    _gib(budget["weights_bytes"]), _gib(budget["activation_peak_bytes"]),
                    _gib(budget["cuda_graph_bytes"]), _gib(budget["non_torch_bytes"]), _gib(budget["kv_cache_bytes"])))
    if result["max_model_len"] is None:
        failed = _startup_check(lay, budget["kv_cache_bytes"], ctx["floor_len"])
        if failed["available"] <= 0:
            parts.append("nothing is left for the KV cache (vLLM: \"No available memory for the cache blocks\")")
        else:
            parts.append("even at max_model_len %d vLLM would stop with: %s"
                         % (ctx["floor_len"], _check_message(lay, ctx["floor_len"], failed)))
    elif ctx["peak"]:
        parts.append("at context %d the KV cache holds %d sequences, the workload peaks at %d and "
                     "max_num_seqs may not go below %d (policy.min_num_seqs)"
                     % (ctx["p99"] or result["max_model_len"], result.get("seqs_that_fit", 0), ctx["peak"],
                        ctx["min_seqs"]))
    parts.append("tried: " + ", ".join("TP %d %s -> %s" % (r["tp"], r["kv_dtype"], (
        "max_model_len %d" % r["max_model_len"]) if r["max_model_len"] else "estimated max %d" % r["fit_len"])
        for r in tried))
    parts.append(_quantization_hint(ctx, result))
    return "; ".join(p for p in parts if p)


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
        quant = _quantization(config)
        variant = dict(shape, quantization=quant, modules=_modules(shape["dims"], quant, shape["dtype_bytes"]),
                       weight_bytes=(0, "estimated"))
        smaller = _gpu_weight_bytes(variant, lay["tp"], lay["pp"])
        kv = _budget(lay, ctx, result["max_num_seqs"], smaller)["kv_cache_bytes"]
        if _max_len(lay, kv, ctx["target_len"]) >= ctx["floor_len"]:
            held = _capacity(lay, kv, ctx["p99"] or ctx["floor_len"])
            if (held["num_blocks"] - 1) // held["blocks_per_request"] >= (ctx["peak"] or 1):
                return ("suggestion: %s checkpoint of this model would fit (about %s of weights per GPU instead of %s)"
                        % (label, _gib(smaller), _gib(weights)))
    return "even a 4-bit checkpoint would not fit: more or larger GPUs are needed"


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------

def vllm_serve_args(plan, serve=None):
    """The `vllm serve` / api_server arguments for a plan plus serving options, flags spelled per version."""
    plan = _mapping(plan, "plan")
    serve = _mapping(serve, "serve")
    if not isinstance(plan.get("engine_args"), dict):
        _fail("plan.engine_args is missing: pass the dict vllm_sizing returned")
    version = _version(plan.get("vllm_version"))
    available = VERSIONS[version]["flags"]
    args = dict(plan["engine_args"])
    for key, value in serve.items():
        if key == "api_key":
            _fail("serve.api_key: the API key is never put on the command line (it shows in ps); "
                  "set VLLM_API_KEY in the service environment instead")
        if args.get(key) is not None and value != args[key]:
            _fail("serve.%s=%r conflicts with the plan's %r: change the sizing policy (or policy.serve_options) "
                  "instead" % (key, value, args[key]))
        args[key] = value
    if args.get("model") is None:
        _fail("plan.engine_args.model is empty: give the model as policy.model (or model._name) when sizing")
    out = []
    for key in ["model"] + sorted(k for k in args if k != "model"):
        value = args[key]
        if key not in FLAGS:
            _fail("serve.%s is not an engine argument this filter knows (known: %s)" % (key, ", ".join(sorted(FLAGS))))
        spec = FLAGS[key]
        if key not in available:
            _fail("%s (%s) does not exist in vLLM %s: passing it fails argument parsing"
                  % (spec["flag"], key, version))
        if value is None:
            continue
        out.extend(_render(key, spec, value, version, "serve." + key))
    return out


def _render(key, spec, value, version, field):
    """The words of one flag; field names the input in errors."""
    kind = spec["kind"]
    if kind == "bool":
        if not isinstance(value, bool):
            _fail("%s must be true or false, got %r" % (field, value))
        if value:
            return [spec["flag"]]
        negative = spec.get("false", {}).get(version)
        return [negative] if negative else []
    if isinstance(value, bool):
        _fail("%s takes a value, not %r" % (field, value))
    if kind == "list":
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in values):
            _fail("%s must be a string or a list of strings, got %r" % (field, value))
        words = [str(v) for v in values]
    elif kind == "json":
        if not isinstance(value, dict):
            _fail("%s must be a dict, got %r" % (field, value))
        words = [json.dumps(value, sort_keys=True, separators=(",", ":"))]
    elif not isinstance(value, (str, int, float)):
        _fail("%s must be a string or a number, got %r" % (field, value))
    else:
        words = [str(value)]
    for word in words:
        # A newline or other control character would end the unit's ExecStart line and start another.
        if not word or word.startswith("--") or any(ord(c) < 32 or ord(c) == 127 for c in word):
            _fail("%s: %r is not a value vLLM can take (empty, a flag, or a control character)" % (field, word))
    return [spec["flag"]] + words


def _serve_options(options, version):
    """policy.serve_options validated at the door: flags of the table that the planned version has, with values
    of the right kind. Sizing arguments are the plan's to decide, the API key never goes on a command line."""
    options = _mapping(options, "policy.serve_options")
    available = VERSIONS[version]["flags"]
    out = {}
    for key in sorted(options):
        value, field = options[key], "policy.serve_options.%s" % key
        if key == "api_key":
            _fail("%s: the API key is never put on the command line (it shows in ps); set VLLM_API_KEY in the "
                  "service environment instead (the vllm role's vllm_api_key)" % field)
        if key not in FLAGS:
            _fail("%s is not an engine argument this filter knows (known: %s)"
                  % (field, ", ".join(sorted(set(FLAGS) - set(SIZING_ARGS)))))
        if key in SIZING_ARGS:
            _fail("%s is decided by the plan: set %s instead" % (field, SIZING_POLICY.get(key, "policy." + key)))
        if key not in available:
            _fail("%s: %s does not exist in vLLM %s (passing it fails argument parsing)"
                  % (field, FLAGS[key]["flag"], version))
        if value is None:
            continue
        _render(key, FLAGS[key], value, version, field)
        if key == "dtype" and value not in DTYPES:
            _fail("%s must be one of %s, got %r" % (field, ", ".join(DTYPES), value))
        if key in ("kv_cache_memory_bytes", "num_gpu_blocks_override"):
            _int(value, field)
        if key == "cpu_offload_gb" and (isinstance(value, str) or value < 0):
            _fail("%s must be a number of GiB, at least 0, got %r" % (field, value))
        out[key] = value
    return out


class FilterModule(object):
    """vLLM sizing filters."""

    def filters(self):
        return {
            "vllm_kv_cache_bytes": vllm_kv_cache_bytes,
            "vllm_max_model_len": vllm_max_model_len,
            "vllm_sizing": vllm_sizing,
            "vllm_serve_args": vllm_serve_args,
            "vllm_model": vllm_model,
        }
