# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Weights: the tensors vLLM holds, module by module, in the checkpoint's quantization, and their bytes on each
GPU by tensor and pipeline parallelism.
"""

import fnmatch
import re

from .common import as_bool, as_dict, as_int, as_names, cdiv, fail


def module_tensors(dims, quant, dtype_bytes):
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
# compressed-tensors' QuantizationStrategy values.
CT_STRATEGIES = ("tensor", "channel", "group", "block", "token", "tensor_group", "attn_head")


def parse_quantization(config):
    """quantization_config parsed into what the weight arithmetic needs (None: not quantized)."""
    if not config:
        return None
    config = as_dict(config, "model.quantization_config")
    method = str(config.get("quant_method") or "").lower().replace("_marlin", "")
    field = "model.quantization_config"
    if method not in QUANT_METHODS:
        fail("%s.quant_method %r is not sized here (sized: %s): give model._weight_bytes, the bytes of weights "
             "vLLM loads (\"Model loading took\" x tensor_parallel_size)" % (field, method, ", ".join(QUANT_METHODS)))
    quant = {"method": method, "skip": (), "match": "substring", "lm_head": False}
    if method in ("awq", "gptq"):
        bits = as_int(config.get("bits", config.get("w_bit")), field + ".bits", maximum=32)
        group = config.get("group_size", config.get("q_group_size", 128))
        group = -1 if group == -1 else as_int(group, field + ".group_size")
        zeros = (as_bool(config.get("zero_point"), field + ".zero_point", True) if method == "awq"
                 else not as_bool(config.get("sym"), field + ".sym", True))
        # GPTQModel's "dynamic" overrides: a "-:" key skips the modules its pattern matches.
        dynamic = [str(k) for k in as_dict(config.get("dynamic"), field + ".dynamic")]
        quant.update(bits=bits, group=group, zeros=zeros,
                     lm_head=as_bool(config.get("lm_head"), field + ".lm_head", False),
                     g_idx=method == "gptq" and as_bool(config.get("desc_act"), field + ".desc_act", False),
                     skip=as_names(config.get("modules_to_not_convert"), field + ".modules_to_not_convert") + tuple(
                         k[2:] for k in dynamic if k.startswith("-:") and len(k) > 2))
        if method == "gptq":
            quant["match"] = "regex_or_substring"
    elif method == "fp8":
        skip_key = "ignored_layers" if config.get("ignored_layers") else "modules_to_not_convert"
        quant.update(block=_pair(config.get("weight_block_size"), field + ".weight_block_size"), match="exact",
                     skip=as_names(config.get(skip_key), "%s.%s" % (field, skip_key)))
    elif method == "mxfp4":
        quant.update(match="glob", skip=as_names(config.get("modules_to_not_convert"),
                                                 field + ".modules_to_not_convert"))
    elif method == "bitsandbytes":
        four, eight = (as_bool(config.get(k), "%s.%s" % (field, k), False) for k in ("load_in_4bit", "load_in_8bit"))
        quant.update(bits=4 if four else 8, skip=as_names(config.get("llm_int8_skip_modules"),
                                                          field + ".llm_int8_skip_modules"),
                     double=as_bool(config.get("bnb_4bit_use_double_quant"), field + ".bnb_4bit_use_double_quant",
                                    False))
        if not (four or eight):
            fail("%s: bitsandbytes without load_in_4bit or load_in_8bit is not a quantized checkpoint" % field)
    else:
        quant.update(_compressed_tensors(config, field))
    for pattern in quant["skip"]:
        _pattern_checked(pattern, quant["match"], field)
    return quant


def _pair(value, field):
    """A block shape [rows, columns] of positive integers; None: none."""
    if not value:
        return None
    if not isinstance(value, list) or len(value) != 2:
        fail("%s must be a list of two integers (e.g. [128, 128]), got %r" % (field, value))
    return tuple(as_int(v, "%s[%d]" % (field, i)) for i, v in enumerate(value))


def _pattern_checked(pattern, mode, field):
    """A skip or target entry that _matches reads as a regular expression must compile."""
    regex = pattern[3:] if pattern.startswith("re:") else (
        pattern if mode == "regex_or_substring" and any(c in pattern for c in "*+[(") else None)
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as error:
            fail("%s: %r is not a valid regular expression (%s)" % (field, pattern, error))


def _compressed_tensors(config, field):
    """The config_groups of a compressed-tensors checkpoint: (targets, weights scheme) in order, and the ignore list."""
    groups = []
    for name, group in sorted(as_dict(config.get("config_groups"), field + ".config_groups").items()):
        where = "%s.config_groups.%s" % (field, name)
        group = as_dict(group, where)
        weights = as_dict(group.get("weights"), where + ".weights")
        strategy = weights.get("strategy") or "tensor"
        if strategy not in CT_STRATEGIES:
            fail("%s.weights.strategy must be one of %s, got %r" % (where, ", ".join(CT_STRATEGIES), strategy))
        size = weights.get("group_size")
        scheme = {"bits": as_int(weights.get("num_bits"), where + ".weights.num_bits", maximum=32),
                  "strategy": strategy,
                  "group": -1 if size in (None, -1) else as_int(size, where + ".weights.group_size"),
                  "block": _pair(weights.get("block_structure"), where + ".weights.block_structure") or (128, 128),
                  "zeros": not as_bool(weights.get("symmetric"), where + ".weights.symmetric", True),
                  "scale_bytes": 4 if weights.get("type") == "float" else 2}
        targets = as_names(group.get("targets"), where + ".targets") or ("Linear",)
        for target in targets:
            _pattern_checked(target, "regex_or_exact", where + ".targets")
        groups.append((targets, scheme))
    if not groups:
        fail("%s.config_groups is empty: nothing says how the weights are stored" % field)
    return {"groups": tuple(groups), "skip": as_names(config.get("ignore"), field + ".ignore"),
            "match": "regex_or_exact"}


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
        groups = 1 if quant["group"] == -1 else cdiv(k, quant["group"])
        zeros = n * groups * quant["bits"] // 8 if quant["zeros"] else 0
        return k * n * quant["bits"] // 8 + groups * n * 2 + zeros + (8 * k if quant["g_idx"] else 0)
    if method == "fp8":
        block = quant["block"]
        return k * n + (cdiv(k, block[1]) * cdiv(n, block[0]) * 4 if block else 4)
    if method == "mxfp4":
        return k * n // 2 + cdiv(k, 32) * n
    if method == "bitsandbytes":
        if quant["bits"] == 8:
            return k * n + 4 * n
        blocks = cdiv(k * n, 64)
        return k * n // 2 + (blocks + 4 * cdiv(blocks, 256) if quant["double"] else 4 * blocks)
    scheme = _ct_scheme(quant, name)
    strategy = scheme["strategy"]
    scales = {"group": (1 if scheme["group"] == -1 else cdiv(k, scheme["group"])) * n, "channel": n,
              "block": cdiv(k, scheme["block"][1]) * cdiv(n, scheme["block"][0])}.get(strategy, 1)
    zeros = scales * scheme["bits"] // 8 if scheme["zeros"] else 0
    return k * n * scheme["bits"] // 8 + scales * scheme["scale_bytes"] + zeros


def _shard(k, n, shard, tp, dims):
    """(K, N) of one tensor-parallel rank's part."""
    if shard == "out":
        return k, cdiv(n, tp)
    if shard == "in":
        return cdiv(k, tp), n
    if shard == "kv":
        return k, max(1, dims["kv_heads"] // tp) * dims["head_size"]
    if shard == "vocab":
        return cdiv(cdiv(k, 64) * 64, tp), n
    return k, n


def _stage_weights(shape, tp, pp, ep=False):
    """Estimated weight bytes on the GPU of each pipeline stage (one tensor-parallel rank), from the modules.
    ep: expert parallelism (--enable-expert-parallel): a rank holds whole experts instead of a slice of each;
    vLLM's determine_expert_map gives the first experts % tp ranks one more, so the busiest holds the ceiling."""
    dims, quant, dtype_bytes = shape["dims"], shape["quantization"], shape["dtype_bytes"]
    stages = pp_stages(dims["layers"], pp)
    totals = [rotary_bytes(shape)] * pp
    for layers, name, k, n, count, shard, kind, quantized in shape["modules"]:
        if ep and kind == "experts":
            count = cdiv(count, tp)
        else:
            k, n = _shard(k, n, shard, tp, dims)
        if quantized and kind == "experts" and quant["method"] == "mxfp4":
            # Padded for the MoE kernel (Marlin, TRT-LLM: hidden to 256, intermediate to 128); the lighter
            # padding of other kernels is within this.
            k, n = cdiv(k, 256 if shard == "out" else 128) * (256 if shard == "out" else 128), cdiv(n, 256) * 256
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


def checkpoint_bytes(model, modules, quant, dtype_bytes):
    """(bytes, how) of the whole checkpoint: given, from the parameter count, or estimated from the modules."""
    if model.get("_weight_bytes") is not None:
        return as_int(model["_weight_bytes"], "model._weight_bytes"), "given"
    if model.get("_num_parameters") is not None and quant is None:
        # A quantized checkpoint's parameter count counts packed int32 words, not weights: not used.
        return (dtype_bytes * as_int(model["_num_parameters"], "model._num_parameters"),
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
        return "compressed-tensors " + ", ".join("%d-bit %s" % (s["bits"], s["strategy"])
                                                 for _name, s in quant["groups"])
    return "mxfp4 experts"


def rotary_bytes(shape):
    """The RoPE cos/sin caches: positions x rotary dim in the served dtype, on every stage (not in the checkpoint)."""
    return sum(shape["rotary_positions"]) * (shape["dims"]["rotary"] or 0) * shape["dtype_bytes"]


def gpu_weight_bytes(shape, tp, pp, ep=False):
    """Weight bytes on the busiest GPU: the largest stage of one rank (ep: expert parallelism); a given total is
    split like the estimate, plus the RoPE caches it does not hold."""
    stages = _stage_weights(shape, tp, pp, ep)
    total, how = shape["weight_bytes"]
    if how.startswith("estimated"):
        return max(stages)
    rotary = rotary_bytes(shape)
    estimate = sum(_stage_weights(shape, 1, 1)) - rotary
    return cdiv(total * (max(stages) - rotary), estimate) + rotary


def pp_stages(layers, pp):
    """Layer indices of each pipeline stage (vLLM get_pp_indices: the extra layers go to the middle)."""
    sizes = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        sizes[-i] += 1
    stages, start = [], 0
    for size in sizes:
        stages.append(set(range(start, start + size)))
        start += size
    return stages
