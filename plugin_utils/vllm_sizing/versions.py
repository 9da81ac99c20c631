# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What changes between vLLM releases, in one table (VERSIONS), and the attention backends that decide the KV
block size on each kind of device (ATTENTION). Adding a vLLM release means adding its row here.
"""

from .common import fail

PINNED_VERSION = "0.34.0"

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
#   kv_cache_dtypes: --kv-cache-dtype choices (CacheDType in config/cache.py; 0.32 adds float16, 0.32.0 read from its
#                    installed source); block_sizes: --block-size choices (BlockSize), None: any positive integer the
#                    attention backend takes (0.32 and later)
#   versioned_flags: flags of FLAGS (flags.py) that only some releases have, this one's (the rest all have)
#   negative_flags: how a boolean of FLAGS on by default (or in some release) is turned off, per release: every row
#                   has every such flag, or a false value would render nothing and vLLM's default (on) would win.
#                   0.11 to 0.32 derive --no-X from the bool type (argparse BooleanOptionalAction in arg_utils.py)
#   cuda_graph_budget: the CUDA-graph estimate is taken from the KV memory (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS,
#                      default on since 0.21); before, graphs are captured after the KV cache, in the headroom
_V0_11 = {
    "block_size": 16, "utilization": 0.9, "extensible_kv_cache": False,
    "async_scheduling": False, "in_flight": "batch", "null_block": False, "grouped_check": False,
    "batch_defaults": ((70, "a100", 8192, 1024), (0, None, 2048, 256)), "cpu_batch_defaults": (2048, 128),
    "message": "models's", "gib_format": "%.2f", "versioned_flags": frozenset({"swap_space"}),
    "negative_flags": {"enable_prefix_caching": "--no-enable-prefix-caching",
                       "enable_chunked_prefill": "--no-enable-chunked-prefill",
                       "async_scheduling": "--no-async-scheduling"},
    "cuda_graph_budget": False,
    "kv_cache_dtypes": ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"),
    "block_sizes": (1, 8, 16, 32, 64, 128, 256),
}
# Each later release as what changed since the one before: the table reads as vLLM's own changelog of these facts.
_V0_19 = dict(_V0_11, async_scheduling=True, gib_format=None, versioned_flags=frozenset({"shutdown_timeout"}))
_V0_32 = dict(
    _V0_19, utilization=0.92, in_flight="batches", null_block=True, grouped_check=True,
    batch_defaults=((160, None, 16384, 1024), (70, "a100", 8192, 1024), (0, None, 2048, 256)),
    message="model's", cuda_graph_budget=True,
    kv_cache_dtypes=("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"),
    block_sizes=None)
_V0_34 = dict(_V0_32, block_size=64, extensible_kv_cache=True, negative_flags=dict(
    _V0_32["negative_flags"], enable_prefix_caching="--disable-prefix-caching",
    enable_chunked_prefill="--disable-chunked-prefill"))
VERSIONS = {"0.11.0": _V0_11, "0.19.0": _V0_19, "0.32.0": _V0_32, "0.34.0": _V0_34}

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


def resolve_version(vllm_version):
    version = PINNED_VERSION if vllm_version is None else str(vllm_version)
    if version not in VERSIONS:
        fail("vllm_version %r is not in the version table (known: %s)" % (version, ", ".join(sorted(VERSIONS))))
    return version
