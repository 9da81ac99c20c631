# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The model: what vLLM's config code derives from config.json (layers, heads, sliding windows, MLA, maximum
context, dimensions), and the catalog of popular models' config.json (vllm_models.json).
"""

import functools
import json
import os

from .common import as_bool, as_dict, as_int, as_number, fail
from .weights import checkpoint_bytes, module_tensors, parse_quantization

# The catalog sits with the filters' documentation (plugins/filter is filter_plugins/).
CATALOG_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "filter",
                            "vllm_models.json")

# Serving options (policy.serve_options) that change what the plan must budget; the rest pass through unread.
#   dtype: float32 stores 4 bytes per weight and per KV element; kv_cache_memory_bytes pins the KV size per GPU;
#   cpu_offload_gb moves that many GiB of weights per GPU to host memory; quantization (online, of an
#   unquantized checkpoint) only shrinks the weights, so budgeting the checkpoint's size stays on the safe side.
DTYPES = {"auto": None, "half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4}

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
# config.json fields read as integers, with their smallest valid value (a string, float or NaN there is refused with
# the field's name). head_dim 0 is refused: vLLM's get_head_size takes a present head_dim as is (a head size of 0);
# only null or absent derives it from hidden_size.
CONFIG_INTS = dict({key: 1 for key in MAX_LEN_KEYS}, **{
    "vocab_size": 1, "intermediate_size": 1, "moe_intermediate_size": 1, "shared_expert_intermediate_size": 0,
    "intermediate_size_mlp": 1, "num_local_experts": 0, "num_experts": 0, "n_routed_experts": 0,
    "num_experts_per_tok": 1, "n_shared_experts": 0, "first_k_dense_replace": 0, "moe_layer_freq": 1,
    "decoder_sparse_step": 1, "interleave_moe_layer_step": 1, "sliding_window_pattern": 1, "layer_pattern": 1,
    "max_window_layers": 0, "head_dim": 1, "q_lora_rank": 1, "qk_nope_head_dim": 1, "v_head_dim": 1,
})
# config.json fields read as booleans: true, false or absent/null, nothing else (bool("false") is true).
CONFIG_BOOLS = ("tie_word_embeddings", "use_sliding_window", "attention_bias")
MAX_LAYERS = 10000
MAX_ROPE_FACTOR = 1024  # published configs use up to 64 (YaRN); more is a typo
ROPE_PRESCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def model_shape(model, dtype=None, online=None):
    """Attention layout of a config.json dict: per-layer sliding windows, KV heads, head sizes, MLA.
    dtype: the --dtype vLLM is given (None or auto: the checkpoint's 16-bit dtype); online: --quantization of an
    unquantized checkpoint (fp8 is sized; other methods keep the checkpoint's bytes, the safe side)."""
    model = as_dict(model, "model")
    if not model:
        fail("model must be the model's config.json as a dict (e.g. from_json), got an empty value")
    text = model.get("text_config")
    prefix = "model"
    if text is not None:
        text = as_dict(text, "model.text_config")
        prefix = "model.text_config"
    else:
        text = model
    model_type = str(text.get("model_type") or model.get("model_type") or "")
    defaults = MODEL_DEFAULTS.get(model_type, {})

    def get(key):
        value = text[key] if key in text else defaults.get(key)
        if value is not None and key in CONFIG_INTS:
            return as_int(value, "%s.%s" % (prefix, key), minimum=CONFIG_INTS[key])
        if key in CONFIG_BOOLS:
            return as_bool(value, "%s.%s" % (prefix, key))
        return value

    # Layers are walked one by one; the largest models have a few hundred.
    layers = as_int(get("num_hidden_layers"), prefix + ".num_hidden_layers", maximum=MAX_LAYERS)
    heads = as_int(get("num_attention_heads"), prefix + ".num_attention_heads")
    hidden = as_int(get("hidden_size"), prefix + ".hidden_size")
    kv_heads = heads if get("num_key_value_heads") is None else as_int(
        get("num_key_value_heads"), prefix + ".num_key_value_heads")
    mla = get("kv_lora_rank") is not None
    if not mla and heads % kv_heads:
        # Grouped-query attention shares each KV head among the same number of query heads; anything else is a typo
        # that would be sized as that many more KV heads than the model has.
        fail("%s.num_key_value_heads %d must divide num_attention_heads %d (and so be at most that)"
             % (prefix, kv_heads, heads))
    if mla:
        head_size = (as_int(get("kv_lora_rank"), prefix + ".kv_lora_rank")
                     + as_int(get("qk_rope_head_dim"), prefix + ".qk_rope_head_dim", minimum=0))
        head_size_v = 0
    else:
        head_dim = get("head_dim")  # a positive int (CONFIG_INTS), or None: derived as vLLM does
        head_size = hidden // heads if head_dim is None else head_dim
        if not head_size:
            fail("%s.num_attention_heads %d is larger than hidden_size %d: no head size follows (give head_dim)"
                 % (prefix, heads, hidden))
        head_size_v = head_size

    window = get("sliding_window")
    if window is not None:
        window = as_int(window, prefix + ".sliding_window", minimum=0) or None  # 0 means disabled
    if get("use_sliding_window") is False:
        window = None
    layer_types = get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) < layers:
            fail("%s.layer_types must list the type of each of the %d layers" % (prefix, layers))
    elif window is not None:
        layer_types = _generated_layer_types(get, layers)
    windows = []
    for index in range(layers):
        kind = "sliding_attention" if layer_types is None else layer_types[index]
        if kind not in ("sliding_attention", "full_attention"):
            fail("%s.layer_types[%d] is %r: only full_attention and sliding_attention layers are sized "
                 "(linear-attention, Mamba and chunked-attention layers are not)" % (prefix, index, kind))
        windows.append(window if kind == "sliding_attention" else None)

    config_dtype = str(text.get("torch_dtype") or text.get("dtype") or model.get("torch_dtype")
                       or model.get("dtype") or "bfloat16")
    if config_dtype not in ("bfloat16", "float16", "float32", "half", "float"):
        fail("%s.torch_dtype %r is not a dtype this filter knows (bfloat16, float16, float32)"
             % (prefix, config_dtype))
    # vLLM serves float32 checkpoints in 16 bits unless --dtype says otherwise.
    dtype_bytes = DTYPES.get(dtype or "auto") or 2

    quant = parse_quantization(text.get("quantization_config") or model.get("quantization_config"))
    dims = model_dims(get, model_type, hidden, heads, kv_heads, head_size, layers, mla)
    quantized = quant is not None
    if quant is None and online == "fp8":
        # vLLM quantizes every linear layer to fp8 with a per-tensor scale while loading.
        quant = parse_quantization({"quant_method": "fp8"})
        model = {k: v for k, v in model.items() if k not in ("_weight_bytes", "_num_parameters")}
    modules = module_tensors(dims, quant, dtype_bytes)
    weights, how = checkpoint_bytes(model, modules, quant, dtype_bytes)
    if online == "fp8" and how.startswith("estimated") and "fp8" in how:
        how += ", quantized online"
    if how == "given" and dtype_bytes == 4 and quant is None:
        weights, how = weights * 2, how + ", served in float32"
    rope = _rope(text, prefix)
    max_len = _derived_max_len(text, get, model_type, prefix, rope)
    return {
        "name": str(model.get("_name") or model.get("_name_or_path") or "the model"),
        "model_arg": model.get("_name") or model.get("_name_or_path"),
        "model_type": model_type, "architectures": _architectures(model, text, prefix),
        "layers": layers, "heads": heads, "kv_heads": kv_heads,
        "head_size": head_size, "head_size_v": head_size_v, "mla": mla, "windows": tuple(windows),
        "hidden": hidden, "dims": dims, "vocab": dims["vocab"],
        "max_len": max_len, "rotary_positions": _rotary_positions(rope, model_type, max_len),
        "weight_bytes": (weights, how), "modules": modules, "quantized": quantized,
        "quantization": quant, "dtype_bytes": dtype_bytes,
    }


def _architectures(model, text, prefix):
    """config.json's architectures (which model class vLLM runs: some releases pick their model runner by it)."""
    value = model.get("architectures") or text.get("architectures") or []
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        fail("%s.architectures must be a list of class names, got %r" % (prefix, value))
    return tuple(value)


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


def _rope(text, prefix):
    """The RoPE dict of config.json (rope_scaling, or transformers 5's rope_parameters), its numbers checked: vLLM
    builds the rotary embedding from them at load, so a string there ("1e6") or a null factor fails the start.
    None: no RoPE scaling."""
    if text.get("rope_theta") is not None:
        as_number(text["rope_theta"], prefix + ".rope_theta")
    if text.get("original_max_position_embeddings") is not None:  # Phi-3 longrope keeps it at the top level
        as_int(text["original_max_position_embeddings"], prefix + ".original_max_position_embeddings")
    key = "rope_scaling" if text.get("rope_scaling") else "rope_parameters"
    rope = text.get(key)
    if not rope:
        return None
    rope = as_dict(rope, "%s.%s" % (prefix, key))
    field = "%s.%s." % (prefix, key)
    if "factor" in rope:  # present means used: null is not "no scaling" (that is rope_scaling: null)
        as_number(rope["factor"], field + "factor", maximum=MAX_ROPE_FACTOR)
    if "rope_theta" in rope:
        as_number(rope["rope_theta"], field + "rope_theta")
    if "original_max_position_embeddings" in rope:
        as_int(rope["original_max_position_embeddings"], field + "original_max_position_embeddings")
    return rope


def _rotary_positions(rope, model_type, max_len):
    """Positions of each RoPE cos/sin cache vLLM keeps on the GPU (one per distinct RoPE). Gemma 3's global layers
    use a linear-scaled RoPE, which caches max_position_embeddings x factor positions (rotary_embedding/
    linear_scaling_rope.py), and its local layers an unscaled RoPE with another base: 0.56 GiB for head_dim 256."""
    if "gemma3" not in model_type:
        return (max_len,)
    factor = rope.get("factor") if rope and (rope.get("rope_type") or rope.get("type")) == "linear" else None
    scaled = factor is not None and factor > 1  # checked by _rope
    return (int(max_len * factor) if scaled else max_len, max_len)


def _derived_max_len(text, get, model_type, prefix, rope):
    """The model's maximum context as vLLM derives it (smallest length key, times a RoPE factor); rope: _rope's."""
    lengths = [get(k) for k in MAX_LEN_KEYS if text.get(k) is not None]
    if text.get("model_max_length"):
        lengths = [get("model_max_length")]
    if not lengths and get("max_position_embeddings"):
        lengths = [get("max_position_embeddings")]
    derived = min(lengths) if lengths else 2048  # vLLM's fallback when config.json has no length
    factor = rope.get("factor") if rope else None
    if rope and "gemma3" not in model_type:
        rope_type = rope.get("rope_type") or rope.get("type") or "default"
        if rope_type not in ROPE_PRESCALED and factor:
            derived = int(derived * factor)
    return int(derived)


def model_dims(get, model_type, hidden, heads, kv_heads, head_size, layers, mla):
    """The sizes of config.json that decide the weights and the activation peak (dense, MoE, MLA)."""
    experts = get("num_local_experts") or get("num_experts") or get("n_routed_experts") or 0
    inter = get("intermediate_size") or 4 * hidden
    moe_layers = set()
    if experts:
        first_dense = get("first_k_dense_replace") or 0        # DeepSeek: the first k layers are dense
        freq = get("moe_layer_freq") or 1
        step = get("decoder_sparse_step") or get("interleave_moe_layer_step") or 1  # Qwen MoE / Llama 4
        dense_only = get("mlp_only_layers") or []
        if not isinstance(dense_only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in dense_only):
            fail("model.mlp_only_layers must be a list of layer indices, got %r" % (dense_only,))
        dense_only = set(dense_only)
        moe_layers = {i for i in range(layers) if i >= first_dense and (i - first_dense) % freq == 0
                      and (i + 1) % step == 0 and i not in dense_only}
    moe_inter = get("moe_intermediate_size") or inter
    shared = (get("n_shared_experts") or 0) * moe_inter or get("shared_expert_intermediate_size") or 0
    if model_type.startswith("llama4"):
        shared = inter  # one shared expert as wide as a routed one; dense layers use intermediate_size_mlp
        inter = get("intermediate_size_mlp") or inter
    return {
        "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "head_size": head_size, "layers": layers,
        "vocab": get("vocab_size") or 32000, "tied": get("tie_word_embeddings") or False, "inter": inter,
        "experts": experts, "moe_inter": moe_inter, "topk": get("num_experts_per_tok") or 1,
        "shared": shared, "moe_layers": frozenset(moe_layers), "mla": _mla_dims(get) if mla else None,
        "qkv_bias": get("attention_bias") or model_type.startswith("qwen2"),
        "rotary": (get("qk_rope_head_dim") if mla else head_size),
        "moe_block": {"mixtral": "block_sparse_moe"}.get(model_type, "feed_forward" if model_type.startswith(
            "llama4") else "mlp"),
    }


def _mla_dims(get):
    return {"q_lora": get("q_lora_rank"), "kv_lora": get("kv_lora_rank"), "rope": get("qk_rope_head_dim"),
            "nope": get("qk_nope_head_dim") or 128, "v": get("v_head_dim") or 128}


def vllm_model(name):
    """The catalog entry (config.json fields plus _weight_bytes) of a popular model."""
    catalog = _catalog()
    if not isinstance(name, str) or name not in catalog:
        fail("vllm_model: unknown model %r; known models: %s" % (name, ", ".join(sorted(catalog))))
    entry = json.loads(json.dumps(catalog[name]))
    entry["_name"] = name
    return entry


@functools.lru_cache(maxsize=1)
def _catalog():
    with open(CATALOG_FILE) as handle:
        return {k: v for k, v in json.load(handle).items() if not k.startswith("_")}
