"""vllm_serve_args rendering, malformed-input messages, and the filters as Ansible sees them."""
import os
import subprocess

import pytest
from ansible.errors import AnsibleFilterError
from conftest import ROOT, gpu

import vllm_sizing as vs
sz = vs.package()  # the package behind the filters, every module loaded
from vllm_sizing import vllm_kv_cache_bytes, vllm_max_model_len, vllm_model, vllm_serve_args, vllm_sizing

VENV_BIN = os.path.join(ROOT, ".venv", "bin")


@pytest.fixture
def plan():
    return vllm_sizing([gpu("NVIDIA H100 80GB HBM3", 81559, "9.0")], vllm_model("Qwen/Qwen3-8B"),
                       {"p99_context": 16384, "peak_concurrency": 32}, {"host": "h1"})


def pairs(args):
    """{flag: value or True} of a rendered argument list."""
    out, i = {}, 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[args[i]] = args[i + 1]
            i += 2
        else:
            out[args[i]] = True
            i += 1
    return out


# --- Rendering -----------------------------------------------------------------------------------------------------

def test_plan_renders_to_flags(plan):
    args = vllm_serve_args(plan, {"host": "0.0.0.0", "port": 8000, "served_model_name": ["qwen", "default"],
                                  "shutdown_timeout": 30, "enable_lora": True, "seed": None})
    assert args[:2] == ["--model", "Qwen/Qwen3-8B"]
    flags = pairs(args)
    assert flags["--gpu-memory-utilization"] == "0.9" and flags["--max-model-len"] == "16384"
    assert flags["--max-num-seqs"] == "32" and flags["--tensor-parallel-size"] == "1"
    assert flags["--kv-cache-dtype"] == "fp8" and flags["--port"] == "8000" and flags["--shutdown-timeout"] == "30"
    assert flags["--enable-lora"] is True
    assert "--enforce-eager" not in args  # false and off by default: left out
    assert "--seed" not in args  # None: left out
    i = args.index("--served-model-name")
    assert args[i + 1:i + 3] == ["qwen", "default"]
    assert all(isinstance(a, str) for a in args)


def test_booleans_and_negative_forms_per_version(plan):
    assert "--enforce-eager" in vllm_serve_args(dict(plan, engine_args=dict(plan["engine_args"], enforce_eager=True)))
    assert "--disable-prefix-caching" in vllm_serve_args(plan, {"enable_prefix_caching": False})
    old = dict(plan, vllm_version="0.32.0")
    assert "--no-enable-prefix-caching" in vllm_serve_args(old, {"enable_prefix_caching": False})
    assert "--enable-prefix-caching" in vllm_serve_args(old, {"enable_prefix_caching": True})
    assert "--trust-remote-code" not in vllm_serve_args(plan, {"trust_remote_code": False})
    assert "--enable-expert-parallel" in vllm_serve_args(plan, {"enable_expert_parallel": True})


@pytest.mark.parametrize("version", sorted(sz.versions.VERSIONS))
@pytest.mark.parametrize("key", ["enable_prefix_caching", "enable_chunked_prefill", "async_scheduling"])
def test_every_release_row_renders_a_false_boolean(plan, version, key):
    """A false boolean on by default in some release renders its negative form under every row: left out, vLLM's
    default (on) would win silently (0.11.0 already had --no-enable-prefix-caching, BooleanOptionalAction)."""
    args = vllm_serve_args(dict(plan, vllm_version=version), {key: False})
    negative = [a for a in args if a.startswith(("--no-", "--disable-")) and key.split("_", 1)[1].replace(
        "_", "-") in a]
    assert len(negative) == 1, (version, key, args)
    assert "--" + key.replace("_", "-") not in args


def test_negative_forms_are_per_release_rows_of_booleans():
    """Every release row spells the negative form of every boolean some release turns on by default: a new row
    cannot leave one out."""
    default_on = {key for key, spec in sz.flags.FLAGS.items() if spec.get("default_on")}
    for version, row in sz.versions.VERSIONS.items():
        assert default_on <= set(row["negative_flags"]), version
        assert all(sz.flags.FLAGS[key]["kind"] == "bool" for key in row["negative_flags"])


def test_dict_renders_as_json(plan):
    args = vllm_serve_args(plan, {"compilation_config": {"cudagraph_capture_sizes": [1, 2, 4], "level": 3}})
    i = args.index("--compilation-config")
    assert args[i + 1] == '{"cudagraph_capture_sizes":[1,2,4],"level":3}'


def test_flag_missing_from_the_version_raises(plan):
    with pytest.raises(AnsibleFilterError, match=r"--swap-space \(swap_space\) does not exist in vLLM 0.34.0"):
        vllm_serve_args(plan, {"swap_space": 4})
    with pytest.raises(AnsibleFilterError, match=r"--swap-space \(swap_space\) does not exist in vLLM 0.32.0"):
        vllm_serve_args(dict(plan, vllm_version="0.32.0"), {"swap_space": 4})
    legacy = dict(plan, vllm_version="0.11.0")
    assert pairs(vllm_serve_args(legacy, {"swap_space": 4}))["--swap-space"] == "4"
    with pytest.raises(AnsibleFilterError, match=r"--shutdown-timeout \(shutdown_timeout\) does not exist "
                       r"in vLLM 0.11"):
        vllm_serve_args(legacy, {"shutdown_timeout": 30})


@pytest.mark.parametrize("version, load_format, takes", [
    ("0.11.0", "runai_streamer", True), ("0.11.0", "fastsafetensors", True), ("0.11.0", "instanttensor", False),
    ("0.18.0", "instanttensor", True), ("0.29.0", "ipc_cache", False), ("0.30.0", "ipc_cache", True),
    ("0.28.0", "bitsandbytes", False)])
def test_a_fast_loader_is_a_serve_option_where_the_release_has_it(plan, version, load_format, takes):
    """--load-format takes the names of the release's own LoadFormats (the release table's load_formats): the
    parser would take any string, and vLLM would fail at start on a name it does not know."""
    at = dict(plan, vllm_version=version)
    if takes:
        assert pairs(vllm_serve_args(at, {"load_format": load_format}))["--load-format"] == load_format
    else:
        with pytest.raises(AnsibleFilterError, match=r"serve.load_format must be one of auto, .* in vLLM %s, got '%s'"
                           % (version.replace(".", r"\."), load_format)):
            vllm_serve_args(at, {"load_format": load_format})


def test_api_key_is_never_rendered(plan):
    with pytest.raises(AnsibleFilterError, match=r"serve.api_key: .*VLLM_API_KEY"):
        vllm_serve_args(plan, {"api_key": "secret"})


def test_serve_cannot_contradict_the_plan(plan):
    with pytest.raises(AnsibleFilterError, match=r"serve.max_model_len=131072 conflicts with the plan's 16384"):
        vllm_serve_args(plan, {"max_model_len": 131072})
    assert vllm_serve_args(plan, {"max_model_len": 16384}) == vllm_serve_args(plan)
    # The plan always carries its block size, so the server cannot use another one than the arithmetic did.
    assert pairs(vllm_serve_args(plan))["--block-size"] == "64"
    with pytest.raises(AnsibleFilterError, match=r"serve.block_size=32 conflicts with the plan's 64"):
        vllm_serve_args(plan, {"block_size": 32})


@pytest.mark.parametrize("serve, message", [
    ({"no_such_flag": 1}, r"serve.no_such_flag is not an engine argument this filter knows \(known: .*block_size"),
    ({"enable_lora": "yes"}, r"serve.enable_lora must be true or false, got 'yes'"),
    ({"port": True}, r"serve.port takes a value, not True"),
    ({"port": [8000]}, r"serve.port must be an integer from 1 to 65535, got \[8000\]"),
    ({"port": "8000"}, r"serve.port must be an integer from 1 to 65535, got '8000'"),
    ({"port": 0}, r"serve.port must be an integer from 1 to 65535, got 0"),
    ({"seed": 1.5}, r"serve.seed must be an integer of at least 0, got 1.5"),
    ({"cpu_offload_gb": float("nan")}, r"serve.cpu_offload_gb must be a number of at least 0, got nan"),
    ({"max_loras": 0}, r"serve.max_loras must be an integer of at least 1, got 0"),
    ({"dtype": "fp16"}, r"serve.dtype must be one of auto, .*float32.* in vLLM 0.34.0, got 'fp16'"),
    ({"uvicorn_log_level": "verbose"}, r"serve.uvicorn_log_level must be one of critical, .*trace.*, got 'verbose'"),
    ({"max_lora_rank": 24}, r"serve.max_lora_rank must be one of 1, 8, 16, 32, 64, 128, 256, 320, 512 in vLLM 0.34.0, "
                            r"got 24"),
    ({"tokenizer": 7}, r"serve.tokenizer must be a string, got 7"),
    ({"compilation_config": "x"}, r"serve.compilation_config must be a dict"),
    ({"served_model_name": []}, r"serve.served_model_name must be a string or a list of strings"),
])
def test_bad_serving_options(plan, serve, message):
    with pytest.raises(AnsibleFilterError, match=message):
        vllm_serve_args(plan, serve)


def test_bad_plans(plan):
    with pytest.raises(AnsibleFilterError, match=r"plan.engine_args is missing"):
        vllm_serve_args({"vllm_version": "0.34.0"})
    with pytest.raises(AnsibleFilterError, match=r"vllm_version 0.99.0 is newer than the release table, whose newest "
                       r"release is 0.34.0: add it with `tools/vllm_release.py add 0.99.0`"):
        vllm_serve_args(dict(plan, vllm_version="0.99.0"))
    with pytest.raises(AnsibleFilterError, match=r"plan.engine_args.model is empty"):
        vllm_serve_args(dict(plan, engine_args=dict(plan["engine_args"], model=None)))
    with pytest.raises(AnsibleFilterError, match=r"plan must be a dict, got str"):
        vllm_serve_args("plan")


def test_every_flag_is_spelled_once():
    spellings = [spec["flag"] for spec in sz.flags.FLAGS.values()]
    assert len(spellings) == len(set(spellings))
    assert all(f.startswith("--") and f == f.lower() for f in spellings)
    for row in sz.versions.VERSIONS.values():
        assert set(row["absent_flags"]) <= set(sz.flags.FLAGS)


# --- Malformed input ---------------------------------------------------------------------------------------------

BASE = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8, "num_hidden_layers": 8}


@pytest.mark.parametrize("model, message", [
    ("Qwen/Qwen3-8B", r"model must be a dict, got str"),
    ({}, r"model must be the model's config.json as a dict"),
    ({"hidden_size": 256, "num_attention_heads": 8}, r"model.num_hidden_layers must be an integer, got None"),
    (dict(BASE, num_hidden_layers="8"), r"model.num_hidden_layers must be an integer, got '8'"),
    (dict(BASE, num_hidden_layers=0), r"model.num_hidden_layers must be at least 1, got 0"),
    (dict(BASE, num_key_value_heads=True), r"model.num_key_value_heads must be an integer, got True"),
    # Issue 24's probes: sized as 6.5x the KV capacity before.
    (dict(BASE, num_key_value_heads=52), r"model.num_key_value_heads 52 must divide num_attention_heads 8"),
    (dict(BASE, num_key_value_heads=3), r"model.num_key_value_heads 3 must divide num_attention_heads 8"),
    ({"text_config": dict(BASE, num_key_value_heads=16)},
     r"model.text_config.num_key_value_heads 16 must divide num_attention_heads 8"),
    (dict(BASE, head_dim=12.5), r"model.head_dim must be an integer, got 12.5"),
    (dict(BASE, num_attention_heads=512), r"model.num_attention_heads 512 is larger than hidden_size 256: no head size"),
    (dict(BASE, sliding_window=-1), r"model.sliding_window must be at least 0"),
    (dict(BASE, sliding_window=64, layer_types=["sliding_attention"]), r"model.layer_types must list the type of each"),
    (dict(BASE, layer_types=["linear_attention"] * 8, sliding_window=64),
     r"model.layer_types\[0\] is 'linear_attention'"),
    (dict(BASE, torch_dtype="int4"), r"model.torch_dtype 'int4' is not a dtype this filter knows"),
    ({"text_config": "x"}, r"model.text_config must be a dict"),
    ({"text_config": {"hidden_size": 1}}, r"model.text_config.num_hidden_layers must be an integer"),
    (dict(BASE, kv_lora_rank=512), r"model.qk_rope_head_dim must be an integer, got None"),
    (dict(BASE, _weight_bytes="16G"), r"model._weight_bytes must be an integer, got '16G'"),
])
def test_bad_models(model, message):
    with pytest.raises(AnsibleFilterError, match=message):
        vllm_kv_cache_bytes(model, 1024)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_model_len": 0}, r"max_model_len must be at least 1, got 0"),
    ({"max_model_len": "4k"}, r"max_model_len must be an integer, got '4k'"),
    ({"tensor_parallel_size": 0}, r"tensor_parallel_size must be at least 1"),
    ({"pipeline_parallel_size": 9}, r"pipeline_parallel_size 9 is more than the 8 layers"),
    ({"kv_cache_dtype": "int3"}, r"kv_cache_dtype 'int3' is not one of vLLM 0.34.0's choices that this filter sizes "
                                 r"\(auto, float16"),
    ({"block_size": -16}, r"block_size must be at least 1"),
    ({"max_num_batched_tokens": 1.5}, r"max_num_batched_tokens must be an integer"),
    ({"vllm_version": "0.10.2"},
     r"vllm_version 0.10.2 is older than 0.11.0, the oldest release the table holds"),
    ({"device": "tpu"}, r"device must be cuda or cpu, got 'tpu'"),
])
def test_bad_kv_arguments(kwargs, message):
    args = dict({"max_model_len": 1024}, **kwargs)
    with pytest.raises(AnsibleFilterError, match=message):
        vllm_kv_cache_bytes(BASE, **args)


def test_bad_memory_argument():
    with pytest.raises(AnsibleFilterError, match=r"kv_cache_bytes must be an integer, got '1GiB'"):
        vllm_max_model_len(BASE, "1GiB")
    with pytest.raises(AnsibleFilterError, match=r"kv_cache_bytes must be at least 0, got -1"):
        vllm_max_model_len(BASE, -1)


@pytest.mark.parametrize("gpus, workload, policy, message", [
    ([], {}, {}, r"gpus must be a non-empty list of GPU facts"),
    ({"name": "x"}, {}, {}, r"gpus must be a non-empty list"),
    (["NVIDIA A10G"], {}, {}, r"gpus\[0\] must be a dict, got str"),
    ([{"memory_total_mib": 23028, "compute_capability": "8.6"}], {}, {}, r"gpus\[0\].name must be the GPU's name"),
    ([gpu("A10G", "23028", "8.6")], {}, {}, r"gpus\[0\].memory_total_mib must be an integer, got '23028'"),
    ([gpu("A10G", 23028, "eight")], {}, {}, r"gpus\[0\].compute_capability must look like \"8.6\", got 'eight'"),
    ([gpu("A10G", 23028, None)], {}, {}, r"gpus\[0\].compute_capability must look like"),
    ([gpu("A10G", 23028, "-0.5")], {}, {}, r"gpus\[0\].compute_capability must look like \"8.6\", got '-0.5'"),
    ([gpu("A10G", 23028, "8.6")], [], {}, r"workload must be a dict, got list"),
    ([gpu("A10G", 23028, "8.6")], {"p99_context": -5}, {}, r"workload.p99_context must be at least 1, got -5"),
    ([gpu("A10G", 23028, "8.6")], {"peak_concurrency": "many"}, {}, r"workload.peak_concurrency must be an integer"),
    ([gpu("A10G", 23028, "8.6")], {}, "strict", r"policy must be a dict, got str"),
    ([gpu("A10G", 23028, "8.6")], {}, {"gpu_sharing": "sometimes"}, r"policy.gpu_sharing must be one of"),
    ([gpu("A10G", 23028, "8.6")], {}, {"gpu_memory_utilization": "0.9"}, r"policy.gpu_memory_utilization must be"),
    ([gpu("A10G", 23028, "8.6")], {}, {"kv_cache_dtype": "fp4"},
     r"policy.kv_cache_dtype 'fp4' is not one of vLLM 0.34.0's choices"),
    ([gpu("A10G", 23028, "8.6")], {}, {"tensor_parallel_size": "2"}, r"policy.tensor_parallel_size must be an integer"),
    ([gpu("A10G", 23028, "8.6")], {}, {"vllm_version": "1.0"}, r"vllm_version '1.0' is not a vLLM release \(X.Y.Z\)"),
    ([gpu("A10G", 23028, "8.6")], {}, {"vllm_version": "0.34.1"},
     r"vllm_version 0.34.1 is newer than the release table, whose newest release is 0.34.0: add it with "
     r"`tools/vllm_release.py add 0.34.1`"),
    ([gpu("A10G", 23028, "8.6")], {}, {"min_num_seqs": 0}, r"policy.min_num_seqs must be at least 1"),
    ([gpu("A10G", 23028, "8.6")], {}, {"usable_memory_mib": "lots"}, r"policy.usable_memory_mib must be an integer"),
    # Issue 24's probe: 200000 MiB on an A10G planned 166 GiB of KV cache per GPU.
    ([gpu("A10G", 23028, "8.6")], {}, {"usable_memory_mib": 200000},
     r"policy.usable_memory_mib 200000 is more than the 23028 MiB nvidia-smi reports for A10G"),
    ([gpu("A10G", 23028, "8.6"), gpu("A10G", 22000, "8.6")], {}, {"usable_memory_mib": 22500},
     r"policy.usable_memory_mib 22500 is more than the 22000 MiB"),
])
def test_bad_sizing_input(gpus, workload, policy, message):
    with pytest.raises(AnsibleFilterError, match=message):
        vllm_sizing(gpus, vllm_model("microsoft/Phi-3-mini-4k-instruct"), workload, policy)


# --- Through Ansible ------------------------------------------------------------------------------------------------

def test_filter_module_exposes_the_sizing_filters():
    assert set(vs.FilterModule().filters()) == {"vllm_kv_cache_bytes", "vllm_max_model_len", "vllm_sizing",
                                                "vllm_serve_args", "vllm_group_member_args", "vllm_model",
                                                "vllm_calibration_key"}


@pytest.mark.parametrize("name", ["vllm_sizing", "vllm_kv_cache_bytes", "vllm_max_model_len", "vllm_serve_args",
                                  "vllm_group_member_args", "vllm_model", "vllm_calibration_key", "fleet_servers", "fleet_address",
                                  "systemd_exec", "systemd_environment", "systemd_value", "systemd_comment",
                                  "env_file", "haproxy_word", "fleet_invalid"])
def test_ansible_doc_shows_docs_and_examples(name):
    result = subprocess.run([os.path.join(VENV_BIN, "ansible-doc"), "-t", "filter", name], cwd=ROOT, check=False,
                            capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, ANSIBLE_FILTER_PLUGINS=os.path.join(ROOT, "filter_plugins"),
                                     ANSIBLE_NOCOLOR="1"))
    assert result.returncode == 0, result.stderr
    assert "EXAMPLES" in result.stdout and "RETURN VALUES" in result.stdout and name in result.stdout


def test_filters_from_a_template():
    template = ("{{ (q | vllm_max_model_len((4.89 * 1024**3) | int + 2359296, block_size=16)) ~ ' ' ~ "
                "(q | vllm_kv_cache_bytes(40960, block_size=16)) ~ ' ' ~ "
                "(gpus | vllm_sizing(q, {'p99_context': 4096}) | vllm_serve_args({'port': 8000}) | join(' ')) }}")
    result = subprocess.run(
        [os.path.join(VENV_BIN, "ansible"), "localhost", "-c", "local", "-i", "localhost,", "-m", "debug",
         "-a", "msg=\"%s\"" % template,
         "-e", '{"q": "{{ \'Qwen/Qwen3-8B\' | vllm_model }}", "gpus": [{"name": "NVIDIA L40S", '
               '"memory_total_mib": 46068, "compute_capability": "8.9"}]}'],
        cwd=ROOT, check=False, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, ANSIBLE_FILTER_PLUGINS=os.path.join(ROOT, "filter_plugins"), ANSIBLE_NOCOLOR="1"))
    assert result.returncode == 0, result.stdout + result.stderr
    expected = '"msg": "35600 6039797760 --model Qwen/Qwen3-8B --block-size 64 --gpu-memory-utilization 0.9'
    assert expected in result.stdout


# --- Issue 10 part 3: every malformed input is refused at the door, naming the field ------------------------------

A10G = [gpu("A10G", 23028, "8.6")]
# Phi-3-medium-4k-instruct's config.json shape (40 attention heads, 10 KV heads): TP 4 divides the heads, not the
# KV heads, and vLLM asserts divide(10, 4) in QKVParallelLinear.
PHI3_MEDIUM = {"model_type": "phi3", "hidden_size": 5120, "num_attention_heads": 40, "num_key_value_heads": 10,
               "num_hidden_layers": 40, "intermediate_size": 17920, "vocab_size": 32064,
               "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
H100X4 = [dict(gpu("NVIDIA H100 80GB HBM3", 81559, "9.0"), index=i) for i in range(4)]


@pytest.mark.parametrize("workload, policy, message", [
    ({"p99_ctx": 4096}, {}, r"workload: unknown key p99_ctx \(accepted: p99_context, peak_concurrency, max_context\)"),
    ({}, {"runtime_oom": True, "gpu_shareing": "shared"},
     r"policy: unknown keys gpu_shareing, runtime_oom \(accepted: host, .*runtime_ooms"),
    ({}, {"runtime_ooms": "false"}, r"policy.runtime_ooms must be true or false, got 'false' \(a string is not"),
    ({}, {"enforce_eager": "no"}, r"policy.enforce_eager must be true or false"),
    ({}, {"activation_bytes": -1}, r"policy.activation_bytes must be at least 0, got -1"),
    ({}, {"kv_cache_dtype": "half"}, r"policy.kv_cache_dtype 'half' is not one of vLLM 0.34.0's choices"),
    ({}, {"kv_cache_dtype": "float16", "vllm_version": "0.17.1"},
     r"policy.kv_cache_dtype 'float16' is not one of vLLM 0.17.1's choices that this filter sizes \(auto, bfloat16, "
     r"fp8"),
    ({}, {"block_size": 7, "vllm_version": "0.17.1"}, r"block_size 7 is not one of vLLM 0.17.1's choices"),
    ({}, {"block_size": 7}, r"policy.kv_cache_dtype auto with policy.block_size 7: vLLM 0.34.0 would not start "
                            r"standard attention on 8.6: no attention backend takes KV blocks of 7"),
    # Issue 24's probe: fp8_inc is Intel Gaudi's; no CUDA attention backend takes it.
    ({}, {"kv_cache_dtype": "fp8_inc"}, r"Qwen/Qwen3-8B: policy.kv_cache_dtype fp8_inc: vLLM 0.34.0 would not start "
                                        r"standard attention on 8.6: no attention backend takes kv_cache_dtype "
                                        r"fp8_inc"),
    ({}, {"serve_options": {"enable_prefix_cache": True}}, r"policy.serve_options.enable_prefix_cache is not an"),
])
def test_malformed_workload_and_policy(workload, policy, message):
    with pytest.raises(AnsibleFilterError, match=message):
        vllm_sizing(A10G, vllm_model("Qwen/Qwen3-8B"), workload, policy)


def test_float16_kv_cache_is_a_choice_of_the_releases_that_have_it():
    plan = vllm_sizing(A10G, vllm_model("Qwen/Qwen3-8B"), {"p99_context": 4096}, {"kv_cache_dtype": "float16"})
    assert plan["engine_args"]["kv_cache_dtype"] == "float16"


def test_tensor_parallelism_must_divide_the_kv_heads_too():
    with pytest.raises(AnsibleFilterError, match=r"tensor_parallel_size 4 and the model's 10 KV heads do not divide"):
        vllm_sizing(H100X4, PHI3_MEDIUM, {}, {"tensor_parallel_size": 4})
    # TP 2 divides both; when more is needed, 4 is never tried.
    plan = vllm_sizing(H100X4, PHI3_MEDIUM, {"p99_context": 4096, "peak_concurrency": 8}, {"tensor_parallel_size": 2})
    assert plan["engine_args"]["tensor_parallel_size"] == 2
    assert sz.plan.tp_refusal(sz.shape.model_shape(PHI3_MEDIUM), 4) is not None
    assert sz.plan.tp_refusal(sz.shape.model_shape(dict(PHI3_MEDIUM, num_key_value_heads=2)), 4) is None  # replicas


def test_the_kv_filters_refuse_the_tensor_parallel_sizes_the_plan_refuses():
    """vllm_kv_cache_bytes and vllm_max_model_len shard the model as vllm_sizing does: a TP size vLLM cannot load
    is an error, not a byte count (one refusal, kv.tp_refusal, for all three)."""
    with pytest.raises(AnsibleFilterError, match=r"tensor_parallel_size 4 and the model's 10 KV heads do not divide"):
        vllm_kv_cache_bytes(PHI3_MEDIUM, 4096, tensor_parallel_size=4, block_size=16)
    with pytest.raises(AnsibleFilterError, match=r"tensor_parallel_size 4 and the model's 10 KV heads do not divide"):
        vllm_max_model_len(PHI3_MEDIUM, 8 << 30, tensor_parallel_size=4, block_size=16)
    with pytest.raises(AnsibleFilterError, match=r"tensor_parallel_size 3 does not divide the model's 40 attention"):
        vllm_kv_cache_bytes(PHI3_MEDIUM, 4096, tensor_parallel_size=3, block_size=16)
    assert vllm_kv_cache_bytes(PHI3_MEDIUM, 4096, tensor_parallel_size=2, block_size=16) > 0
    assert sz.plan.tp_refusal is sz.kv.tp_refusal


def test_a_mig_gpu_is_not_sized_as_the_whole_gpu():
    mig = [dict(gpu("NVIDIA A100-SXM4-80GB", 81920, "8.0"), mig_mode="Enabled")]
    with pytest.raises(AnsibleFilterError, match=r"gpus\[0\] \(NVIDIA A100-SXM4-80GB\) has MIG enabled.*"
                                                 r"vllm_policy.usable_memory_mib"):
        vllm_sizing(mig, vllm_model("Qwen/Qwen3-8B"), {"p99_context": 4096})
    plan = vllm_sizing(mig, vllm_model("Qwen/Qwen3-8B"), {"p99_context": 4096}, {"usable_memory_mib": 40192})
    assert plan["budget_per_gpu"]["usable_bytes"] == 40192 << 20


@pytest.mark.parametrize("field, value, message", [
    ("vocab_size", "151936", r"model.vocab_size must be an integer, got '151936'"),
    ("intermediate_size", float("nan"), r"model.intermediate_size must be an integer, got nan"),
    ("sliding_window_pattern", "6", r"model.sliding_window_pattern must be an integer"),
    ("max_position_embeddings", 4096.0, r"model.max_position_embeddings must be an integer, got 4096.0"),
    ("head_dim", -128, r"model.head_dim must be at least 1, got -128"),
    ("rope_scaling", {"rope_type": "linear", "factor": "2"}, r"model.rope_scaling.factor must be a positive number"),
    ("rope_scaling", {"rope_type": "dynamic", "factor": float("inf")}, r"rope_scaling.factor must be a positive"),
    ("mlp_only_layers", "0,1", r"model.mlp_only_layers must be a list of layer indices"),
    # Absurd sizes are refused, not walked layer by layer or divided down to a head size of 0.
    ("num_hidden_layers", 10 ** 30, r"model.num_hidden_layers must be at most 10000"),
    ("vocab_size", 1 << 60, r"model.vocab_size must be at most 1125899906842624"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 1e9}, r"model.rope_scaling.factor must be a positive number up"),
    # RoPE fields are numbers, not the strings a hand-edited config.json may hold.
    ("rope_theta", "1e6", r"model.rope_theta must be a positive number, got '1e6'"),
    ("rope_theta", float("nan"), r"model.rope_theta must be a positive number, got nan"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": "32768"},
     r"model.rope_scaling.original_max_position_embeddings must be an integer, got '32768'"),
    ("rope_scaling", {"rope_type": "linear", "factor": None}, r"model.rope_scaling.factor must be a positive number up "
                                                              r"to 1024, got None"),
    ("rope_scaling", "yarn", r"model.rope_scaling must be a dict, got str"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": "1e6"},
     r"model.rope_parameters.rope_theta must be a positive number, got '1e6'"),
    ("original_max_position_embeddings", "4096", r"model.original_max_position_embeddings must be an integer"),
    # Config booleans are booleans: bool("false") is true (1 GiB of lm_head left out, a window taken for enabled).
    ("tie_word_embeddings", "false", r"model.tie_word_embeddings must be true or false, got 'false' \(a string is not"),
    ("use_sliding_window", "false", r"model.use_sliding_window must be true or false, got 'false'"),
    ("attention_bias", 1, r"model.attention_bias must be true or false, got 1"),
])
def test_malformed_config_fields_name_the_field(field, value, message):
    config = dict(vllm_model("Qwen/Qwen3-30B-A3B") if field == "mlp_only_layers" else vllm_model("Qwen/Qwen3-8B"),
                  **{field: value})
    if field == "sliding_window_pattern":
        config = dict(BASE, model_type="gemma3_text", sliding_window=1024, sliding_window_pattern=value)
    with pytest.raises(AnsibleFilterError, match=message):
        vllm_sizing(A10G, config, {"p99_context": 4096}, {"strict": False})


def test_config_booleans_decide_as_booleans():
    qwen = vllm_model("Qwen/Qwen3-8B")
    untied = sz.shape.model_shape(dict(qwen, tie_word_embeddings=False))["dims"]["tied"]
    assert untied is False and sz.shape.model_shape(dict(qwen, tie_word_embeddings=True))["dims"]["tied"] is True
    assert sz.shape.model_shape(dict(qwen, tie_word_embeddings=None))["dims"]["tied"] is False  # absent
    assert set(sz.shape.model_shape(dict(qwen, use_sliding_window=False))["windows"]) == {None}


def test_head_dim_zero_is_refused_and_null_is_derived():
    # vLLM's get_head_size takes a present head_dim as is: 0 would be a head size of 0, not "derive it" (issue 10,
    # section 3 lists it as malformed). Null or absent derives hidden_size // num_attention_heads.
    qwen = vllm_model("Qwen/Qwen3-8B")
    with pytest.raises(AnsibleFilterError, match=r"model.head_dim must be at least 1, got 0"):
        sz.shape.model_shape(dict(qwen, head_dim=0))
    with pytest.raises(AnsibleFilterError, match=r"model.text_config.head_dim must be at least 1, got 0"):
        sz.shape.model_shape({"text_config": dict(qwen, head_dim=0)})
    derived = qwen["hidden_size"] // qwen["num_attention_heads"]
    assert sz.shape.model_shape(dict(qwen, head_dim=None))["head_size"] == derived
    assert sz.shape.model_shape({k: v for k, v in qwen.items() if k != "head_dim"})["head_size"] == derived


GPT_OSS_QUANT = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}
FP8_QUANT = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
CT_QUANT = {"quant_method": "compressed-tensors", "ignore": ["lm_head"], "config_groups": {"group_0": {
    "targets": ["Linear"], "weights": {"num_bits": 4, "strategy": "group", "group_size": 128, "symmetric": True}}}}


@pytest.mark.parametrize("quant, message", [
    (dict(GPT_OSS_QUANT, modules_to_not_convert=float("nan")),
     r"model.quantization_config.modules_to_not_convert must be a list of non-empty strings, got nan"),
    (dict(GPT_OSS_QUANT, modules_to_not_convert=[1]), r"modules_to_not_convert must be a list of non-empty strings"),
    (dict(FP8_QUANT, weight_block_size="128"), r"weight_block_size must be a list of two integers \(e.g. \[128, 128\]\)"),
    (dict(FP8_QUANT, weight_block_size=[128]), r"weight_block_size must be a list of two integers"),
    (dict(FP8_QUANT, weight_block_size=[128, 0]), r"weight_block_size\[1\] must be at least 1, got 0"),
    (dict(FP8_QUANT, ignored_layers=["re:model.layers.[0-"]),
     r"model.quantization_config: 're:model.layers.\[0-' is not a valid regular expression"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "modules_to_not_convert": ["mlp.(gate"]},
     r"'mlp.\(gate' is not a valid regular expression"),
    ({"quant_method": "gptq", "bits": 64, "group_size": 128}, r"model.quantization_config.bits must be at most 32"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "dynamic": ["-:lm_head"]},
     r"model.quantization_config.dynamic must be a dict, got list"),
    (dict(CT_QUANT, ignore="lm_head"), r"model.quantization_config.ignore must be a list of non-empty strings"),
    (dict(CT_QUANT, config_groups={"group_0": "Linear"}), r"model.quantization_config.config_groups.group_0 must be a dict"),
    (dict(CT_QUANT, config_groups={"group_0": {"weights": {"num_bits": 4, "strategy": "rows"}}}),
     r"config_groups.group_0.weights.strategy must be one of tensor, channel, group, block"),
    (dict(CT_QUANT, config_groups={"group_0": {"weights": {"num_bits": 4, "strategy": "group", "group_size": "128"}}}),
     r"config_groups.group_0.weights.group_size must be an integer, got '128'"),
    (dict(CT_QUANT, config_groups={"group_0": {"targets": "Linear", "weights": {"num_bits": 8}}}),
     r"config_groups.group_0.targets must be a list of non-empty strings"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": "false"},
     r"model.quantization_config.sym must be true or false, got 'false'"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": "true"},
     r"model.quantization_config.zero_point must be true or false, got 'true'"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": "false"},
     r"model.quantization_config.desc_act must be true or false"),
    (dict(CT_QUANT, config_groups={"group_0": {"weights": {"num_bits": 4, "symmetric": "true"}}}),
     r"config_groups.group_0.weights.symmetric must be true or false, got 'true'"),
])
def test_malformed_quantization_config_names_the_field(quant, message):
    config = dict(vllm_model("Qwen/Qwen3-8B"), quantization_config=quant)
    config.pop("_weight_bytes", None)
    with pytest.raises(AnsibleFilterError, match=message):
        vllm_sizing(A10G, config, {"p99_context": 4096}, {"strict": False})
    vllm_sizing(A10G, dict(config, quantization_config=QUANT_OK[quant["quant_method"]]), {"p99_context": 4096},
                {"strict": False})


QUANT_OK = {"mxfp4": GPT_OSS_QUANT, "fp8": FP8_QUANT, "compressed-tensors": CT_QUANT,
            "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "modules_to_not_convert": ["mlp.(gate|up)"]},
            "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "dynamic": {"-:lm_head": {}}}}


@pytest.mark.parametrize("value", [0, 1.0, 1.2, -0.5, "0.9", float("nan")])
def test_gpu_memory_utilization_has_one_valid_range_everywhere(plan, value):
    """The policy's door, the flag the plan renders and a start's record in the calibration store all take
    gpu_memory_utilization through common.as_utilization: the same values are refused, with the same words."""
    plan_ok = plan
    message = r"must be a number between 0 and 1 \(exclusive: 1.0 leaves PyTorch and prefill spikes no headroom\)"
    with pytest.raises(AnsibleFilterError, match=r"policy.gpu_memory_utilization " + message):
        vllm_sizing([gpu("A10G", 23028, "8.6")], vllm_model("Qwen/Qwen3-8B"), {"p99_context": 4096},
                    {"gpu_memory_utilization": value})
    with pytest.raises(AnsibleFilterError, match=r"gpu_memory_utilization.* " + message):
        vllm_serve_args(dict(plan_ok, engine_args=dict(plan_ok["engine_args"], gpu_memory_utilization=value)))
    report = {"available_kv_cache_bytes": 1 << 30, "gpu_memory_utilization": value}
    with pytest.raises(AnsibleFilterError, match=r"policy.measured: gpu_memory_utilization " + message):
        sz.calibration.measurement(report)
    entry = {"report": {"available_kv_cache_bytes": 1 << 30}, "request": {"gpu_memory_utilization": value}}
    with pytest.raises(AnsibleFilterError, match=r"policy.measured.request.gpu_memory_utilization .*" + message):
        sz.calibration.measurement(entry)
