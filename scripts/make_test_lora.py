#!/usr/bin/env python3
"""Build a random-weight LoRA adapter (PEFT layout) for a tiny test model, without any model hub.

Runtime LoRA tests load it through vLLM's /v1/load_lora_adapter. Run it with the controller's vLLM venv
(scripts/build-controller-vllm.sh), which carries torch and safetensors.

    make_test_lora.py BASE_MODEL_DIR OUT_DIR [--rank 8]

The adapter targets q_proj and v_proj of every layer; its shapes come from the base model's config.json. Seeded,
so the same base and rank give the same adapter; OUT_DIR is left alone when it already holds that adapter.
"""
import argparse
import json
import os


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base_model_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--rank", type=int, default=8)
    args = ap.parse_args()

    with open(os.path.join(args.base_model_dir, "config.json")) as f:
        cfg = json.load(f)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    out_features = {"q_proj": cfg["num_attention_heads"] * head_dim,
                    "v_proj": cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * head_dim}
    adapter_config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": args.rank, "lora_alpha": 2 * args.rank,
        "lora_dropout": 0.0, "bias": "none", "target_modules": sorted(out_features),
        "base_model_name_or_path": os.path.abspath(args.base_model_dir), "fan_in_fan_out": False,
        "inference_mode": True,
    }
    config_file = os.path.join(args.out_dir, "adapter_config.json")
    if os.path.exists(config_file) and os.path.exists(os.path.join(args.out_dir, "adapter_model.safetensors")):
        with open(config_file) as f:
            if json.load(f) == adapter_config:
                print(f"{args.out_dir}: up to date")
                return

    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for module, out in out_features.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(args.rank, cfg["hidden_size"]) * 0.02
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out, args.rank) * 0.02
    os.makedirs(args.out_dir, exist_ok=True)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()},
              os.path.join(args.out_dir, "adapter_model.safetensors"))
    with open(config_file, "w") as f:
        json.dump(adapter_config, f, indent=2)
    for name in os.listdir(args.out_dir):  # the test hosts' vllm user reads the cache
        os.chmod(os.path.join(args.out_dir, name), 0o644)
    print(f"{args.out_dir}: LoRA rank {args.rank} on {', '.join(sorted(out_features))} of {args.base_model_dir}")


if __name__ == "__main__":
    main()
