# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The command line: the only place vLLM flags are spelled (FLAGS; the negative forms of booleans, which change
between releases, in the version table), the serving options a plan takes, and the `vllm serve` arguments of a plan.
"""

import json

from .common import as_dict, as_utilization, fail
from .shape import DTYPES
from .versions import VERSIONS, resolve_version

# Engine arguments whose values the plan decides; `serve` may repeat them but not change them.
SIZING_ARGS = (
    "model", "gpu_memory_utilization", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
    "kv_cache_dtype", "tensor_parallel_size", "pipeline_parallel_size", "enforce_eager", "block_size",
    "disable_custom_all_reduce",
)
# A replica group's arguments (docs/multi-node.md): one plan for the group, these per member (its rank, the head's
# address); group_member_args gives them, serve_options may not.
GROUP_ARGS = ("nnodes", "node_rank", "master_addr", "master_port", "headless")
# Where an operator sets a sizing argument, when it is not the policy key of the same name.
SIZING_POLICY = {"model": "policy.model (the role: vllm_model or vllm_model_dir)",
                 "disable_custom_all_reduce": "policy.expandable_segments (it sets this flag with TP/PP > 1)"}

# The only place vLLM flags are spelled, but for the negative forms of booleans, which change between releases and
# so live in the release table (VERSIONS[...]["negative_flags"], with the flags a release lacks and the choices its
# parser enforces; choices_from names the row's list of what a release takes where its parser does not enforce it).
# kind: str, int and number (one argument; min and max inclusive), utilization (common.as_utilization, the one range
# of gpu_memory_utilization), choice (one of choices), list (nargs+), json (a dict as JSON), bool (bare flag when
# true; when false nothing, or the release's negative form for default_on booleans: some release turns them on by
# default, so off must be said).
FLAGS = {
    "model": {"flag": "--model", "kind": "str"},
    "host": {"flag": "--host", "kind": "str"},
    "port": {"flag": "--port", "kind": "int", "min": 1, "max": 65535},
    "served_model_name": {"flag": "--served-model-name", "kind": "list"},
    "tensor_parallel_size": {"flag": "--tensor-parallel-size", "kind": "int", "min": 1},
    "pipeline_parallel_size": {"flag": "--pipeline-parallel-size", "kind": "int", "min": 1},
    # One instance across hosts without Ray (0.11.1+): every member gets the plan's arguments and these; the
    # followers (rank > 0) run headless, the head (rank 0) serves the API.
    "nnodes": {"flag": "--nnodes", "kind": "int", "min": 1},
    "node_rank": {"flag": "--node-rank", "kind": "int", "min": 0},
    "master_addr": {"flag": "--master-addr", "kind": "str"},
    "master_port": {"flag": "--master-port", "kind": "int", "min": 1, "max": 65535},
    "headless": {"flag": "--headless", "kind": "bool"},
    "gpu_memory_utilization": {"flag": "--gpu-memory-utilization", "kind": "utilization"},
    "max_model_len": {"flag": "--max-model-len", "kind": "int", "min": 1},
    "max_num_seqs": {"flag": "--max-num-seqs", "kind": "int", "min": 1},
    "max_num_batched_tokens": {"flag": "--max-num-batched-tokens", "kind": "int", "min": 1},
    "kv_cache_dtype": {"flag": "--kv-cache-dtype", "kind": "str"},
    "block_size": {"flag": "--block-size", "kind": "int", "min": 1},
    "kv_cache_memory_bytes": {"flag": "--kv-cache-memory-bytes", "kind": "int", "min": 1},
    "num_gpu_blocks_override": {"flag": "--num-gpu-blocks-override", "kind": "int", "min": 1},
    "swap_space": {"flag": "--swap-space", "kind": "number", "min": 0},
    "cpu_offload_gb": {"flag": "--cpu-offload-gb", "kind": "number", "min": 0},
    "enforce_eager": {"flag": "--enforce-eager", "kind": "bool"},
    "disable_custom_all_reduce": {"flag": "--disable-custom-all-reduce", "kind": "bool"},
    "enable_expert_parallel": {"flag": "--enable-expert-parallel", "kind": "bool"},
    "enable_prefix_caching": {"flag": "--enable-prefix-caching", "kind": "bool", "default_on": True},
    "enable_chunked_prefill": {"flag": "--enable-chunked-prefill", "kind": "bool", "default_on": True},
    "async_scheduling": {"flag": "--async-scheduling", "kind": "bool", "default_on": True},
    "shutdown_timeout": {"flag": "--shutdown-timeout", "kind": "int", "min": 0},
    "enable_lora": {"flag": "--enable-lora", "kind": "bool"},
    "max_loras": {"flag": "--max-loras", "kind": "int", "min": 1},
    "max_lora_rank": {"flag": "--max-lora-rank", "kind": "int", "min": 1},
    "max_cpu_loras": {"flag": "--max-cpu-loras", "kind": "int", "min": 1},
    "enable_sleep_mode": {"flag": "--enable-sleep-mode", "kind": "bool"},
    "quantization": {"flag": "--quantization", "kind": "str"},
    # A fast loader (runai_streamer, fastsafetensors, ...): its names are the release's own (load_formats).
    "load_format": {"flag": "--load-format", "kind": "str", "choices_from": "load_formats"},
    "dtype": {"flag": "--dtype", "kind": "choice", "choices": tuple(DTYPES)},
    "seed": {"flag": "--seed", "kind": "int", "min": 0},
    "trust_remote_code": {"flag": "--trust-remote-code", "kind": "bool"},
    "download_dir": {"flag": "--download-dir", "kind": "str"},
    "tokenizer": {"flag": "--tokenizer", "kind": "str"},
    "revision": {"flag": "--revision", "kind": "str"},
    "generation_config": {"flag": "--generation-config", "kind": "str"},
    "chat_template": {"flag": "--chat-template", "kind": "str"},
    "enable_auto_tool_choice": {"flag": "--enable-auto-tool-choice", "kind": "bool"},
    "tool_call_parser": {"flag": "--tool-call-parser", "kind": "str"},
    "reasoning_parser": {"flag": "--reasoning-parser", "kind": "str"},
    "compilation_config": {"flag": "--compilation-config", "kind": "json"},
    "disable_log_stats": {"flag": "--disable-log-stats", "kind": "bool"},
    "max_log_len": {"flag": "--max-log-len", "kind": "int", "min": 0},
    "uvicorn_log_level": {"flag": "--uvicorn-log-level", "kind": "choice",
                          "choices": ("critical", "error", "warning", "info", "debug", "trace")},
}


def available_flags(version):
    """The flags of FLAGS that vLLM `version` has (the release table's absent_flags are the others)."""
    return frozenset(FLAGS) - frozenset(VERSIONS[version]["absent_flags"])


def multi_node_refusal(version):
    """Why vLLM `version` cannot run one instance across hosts without Ray, or None when it can (--nnodes)."""
    if "nnodes" in available_flags(version):
        return None
    return "vLLM %s cannot run one instance across hosts without Ray (--nnodes came in 0.11.1)" % version


def vllm_serve_args(plan, serve=None):
    """The `vllm serve` / api_server arguments for a plan plus serving options, flags spelled per version."""
    plan = as_dict(plan, "plan")
    serve = as_dict(serve, "serve")
    if not isinstance(plan.get("engine_args"), dict):
        fail("plan.engine_args is missing: pass the dict vllm_sizing returned")
    version = resolve_version(plan.get("vllm_version"))
    available = available_flags(version)
    args = dict(plan["engine_args"])
    for key, value in serve.items():
        if key == "api_key":
            fail("serve.api_key: the API key is never put on the command line (it shows in ps); "
                 "set VLLM_API_KEY in the service environment instead")
        if args.get(key) is not None and value != args[key]:
            fail("serve.%s=%r conflicts with the plan's %r: change the sizing policy (or policy.serve_options) "
                 "instead" % (key, value, args[key]))
        args[key] = value
    if args.get("model") is None:
        fail("plan.engine_args.model is empty: give the model as policy.model (or model._name) when sizing")
    out = []
    for key in ["model"] + sorted(k for k in args if k != "model"):
        value = args[key]
        if key not in FLAGS:
            fail("serve.%s is not an engine argument this filter knows (known: %s)" % (key, ", ".join(sorted(FLAGS))))
        spec = FLAGS[key]
        if key not in available:
            fail("%s (%s) does not exist in vLLM %s: passing it fails argument parsing"
                 % (spec["flag"], key, version))
        if value is None:
            continue
        out.extend(_render(key, spec, value, version, "serve." + key))
    return out


def _render(key, spec, value, version, field):
    """The words of one flag; field names the input in errors."""
    kind = spec["kind"]
    row = VERSIONS[version]
    choices = row[spec["choices_from"]] if "choices_from" in spec else row["choices"].get(key)
    if choices is not None and not isinstance(value, bool) and value not in choices:
        # The release's parser refuses anything else (argparse choices), e.g. --max-lora-rank 24.
        fail("%s must be one of %s in vLLM %s, got %r" % (field, ", ".join(str(c) for c in choices), version, value))
    if kind == "bool":
        if not isinstance(value, bool):
            fail("%s must be true or false, got %r" % (field, value))
        if value:
            return [spec["flag"]]
        if not spec.get("default_on"):
            return []
        negative = VERSIONS[version]["negative_flags"].get(key)
        if negative is None:
            fail("%s: vLLM %s has no way to turn %s off" % (field, version, spec["flag"]))
        return [negative]
    if isinstance(value, bool):
        fail("%s takes a value, not %r" % (field, value))
    if kind == "list":
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in values):
            fail("%s must be a string or a list of strings, got %r" % (field, value))
        words = [str(v) for v in values]
    elif kind == "json":
        if not isinstance(value, dict):
            fail("%s must be a dict, got %r" % (field, value))
        words = [json.dumps(value, sort_keys=True, separators=(",", ":"))]
    elif kind == "choice":
        if value not in spec["choices"]:
            fail("%s must be one of %s, got %r" % (field, ", ".join(spec["choices"]), value))
        words = [value]
    elif kind == "utilization":
        words = [str(as_utilization(value, field))]
    elif kind == "str":
        if not isinstance(value, str):
            fail("%s must be a string, got %r" % (field, value))
        words = [value]
    else:
        number = int if kind == "int" else (int, float)
        low, high = spec.get("min"), spec.get("max", float("inf"))
        if not isinstance(value, number) or not low <= value <= high:  # NaN fails every comparison
            fail("%s must be %s %s %s%s, got %r" % (
                field, "an integer" if kind == "int" else "a number", "from" if "max" in spec else "of at least",
                low, " to %s" % high if "max" in spec else "", value))
        words = [str(value)]
    for word in words:
        # A newline or other control character would end the unit's ExecStart line and start another.
        if not word or word.startswith("--") or any(ord(c) < 32 or ord(c) == 127 for c in word):
            fail("%s: %r is not a value vLLM can take (empty, a flag, or a control character)" % (field, word))
    return [spec["flag"]] + words


def parse_serve_options(options, version):
    """policy.serve_options validated at the door: flags of the table that the planned version has, with values
    of the right kind. Sizing arguments are the plan's to decide, the API key never goes on a command line."""
    options = as_dict(options, "policy.serve_options")
    available = available_flags(version)
    out = {}
    for key in sorted(options):
        value, field = options[key], "policy.serve_options.%s" % key
        if key == "api_key":
            fail("%s: the API key is never put on the command line (it shows in ps); set VLLM_API_KEY in the "
                 "service environment instead (the vllm role's vllm_api_key)" % field)
        if key not in FLAGS:
            fail("%s is not an engine argument this filter knows (known: %s)"
                 % (field, ", ".join(sorted(set(FLAGS) - set(SIZING_ARGS)))))
        if key in SIZING_ARGS:
            fail("%s is decided by the plan: set %s instead" % (field, SIZING_POLICY.get(key, "policy." + key)))
        if key in GROUP_ARGS:
            fail("%s is set per member of a replica group (policy.nodes plans one; docs/multi-node.md), not in "
                 "serve_options" % field)
        if key not in available:
            fail("%s: %s does not exist in vLLM %s (passing it fails argument parsing)"
                 % (field, FLAGS[key]["flag"], version))
        if value is None:
            continue
        _render(key, FLAGS[key], value, version, field)
        out[key] = value
    return out


def group_member_args(plan, rank, master_addr, master_port):
    """The serving options of member `rank` of the replica group a plan spans (plan.gpus.nodes hosts): to pass to
    vllm_serve_args beside the plan, the same on every member but for the rank and headless (rank > 0)."""
    plan = as_dict(plan, "plan")
    nodes = as_dict(plan.get("gpus"), "plan.gpus").get("nodes", 1)
    if nodes == 1:
        fail("the plan is for one host (plan.gpus.nodes 1): it has no group members")
    version = resolve_version(plan.get("vllm_version"))
    refusal = multi_node_refusal(version)
    if refusal:
        fail(refusal)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < nodes:
        fail("rank must be an integer from 0 to %d (the group has %d hosts, the head first), got %r"
             % (nodes - 1, nodes, rank))
    options = {"nnodes": nodes, "node_rank": rank, "master_addr": master_addr, "master_port": master_port,
               "headless": rank > 0}
    for key, value in options.items():
        _render(key, FLAGS[key], value, version, key)
    return options
