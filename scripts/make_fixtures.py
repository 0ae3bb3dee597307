#!/usr/bin/env python3
"""Generates the tiny architecture fixtures under tests/fixtures/<arch>/ from transformers' own
model classes: each architecture is built from a tiny config with random weights (fixed seed) and
written with `save_pretrained` in bfloat16 safetensors, so the tensor names, shapes and layouts are
the ones the real checkpoints have (tests/python/test_architectures.py, scripts/test-ecosystem.sh).

    python scripts/make_fixtures.py [OUT_DIR]          # default tests/fixtures

Needs torch and transformers (e.g. the venv of scripts/test-ecosystem.sh); the tests that read the
fixtures need neither. Every in-feature count is a multiple of 64, so every mode's group divides
it. Embeddings are tied or untied as in the real model family. tests/fixtures/MANIFEST.md lists
each fixture's tensors (name, dtype, shape) and the versions that wrote them.
"""

import json
import os
import sys

import torch
import transformers

SEED = 1234
# Shared small dimensions: hidden 64, MLP 128, 2 heads of 32 (o_proj in-features 64), 1 KV head.
BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=32, vocab_size=128, max_position_embeddings=128)


def fixtures():
    """{directory name: (model class, config)}; tie_word_embeddings as the family's real models."""
    t = transformers
    moe = dict(num_experts_per_tok=2)
    return {
        # Llama-3-8B / Mistral-7B: untied.
        "llama": (t.LlamaForCausalLM, t.LlamaConfig(**BASE, tie_word_embeddings=False)),
        "mistral": (t.MistralForCausalLM, t.MistralConfig(**BASE, tie_word_embeddings=False)),
        # Qwen2 (7B): q/k/v biases, untied. Qwen3 (0.6B-4B): q_norm / k_norm, tied.
        "qwen2": (t.Qwen2ForCausalLM, t.Qwen2Config(**{k: v for k, v in BASE.items() if k != "head_dim"},
                                                     tie_word_embeddings=False)),
        "qwen3": (t.Qwen3ForCausalLM, t.Qwen3Config(**BASE, tie_word_embeddings=True)),
        # Qwen3-30B-A3B: 4 experts here, router mlp.gate, untied.
        "qwen3_moe": (t.Qwen3MoeForCausalLM,
                      t.Qwen3MoeConfig(**BASE, num_experts=4, moe_intermediate_size=64, decoder_sparse_step=1,
                                       mlp_only_layers=[], tie_word_embeddings=False, **moe)),
        # Mixtral-8x7B: router block_sparse_moe.gate (mlp.gate in transformers 5), untied.
        "mixtral": (t.MixtralForCausalLM, t.MixtralConfig(**BASE, num_local_experts=4, tie_word_embeddings=False,
                                                          **moe)),
        # DeepSeek-V3: MLA (q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj and their norms), the
        # first layer dense, then routed plus shared experts; router mlp.gate with its
        # e_score_correction_bias; untied. qk_nope / v head dims of 64: mlx-lm splits kv_b_proj per
        # head and re-quantizes the pieces along them.
        "deepseek_v3": (t.DeepseekV3ForCausalLM,
                        t.DeepseekV3Config(hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
                                           num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=2,
                                           num_key_value_heads=2, q_lora_rank=64, kv_lora_rank=64,
                                           qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64,
                                           n_routed_experts=4, n_shared_experts=1, n_group=1, topk_group=1,
                                           vocab_size=128, max_position_embeddings=128, tie_word_embeddings=False,
                                           **moe)),
        # Phi-3-mini: fused qkv_proj and gate_up_proj, untied.
        "phi3": (t.Phi3ForCausalLM, t.Phi3Config(**{k: v for k, v in BASE.items() if k != "head_dim"},
                                                 pad_token_id=0, tie_word_embeddings=False)),
        # Gemma 2 and Gemma 3 (text model): tied.
        "gemma2": (t.Gemma2ForCausalLM, t.Gemma2Config(**BASE, tie_word_embeddings=True)),
        "gemma3": (t.Gemma3ForCausalLM, t.Gemma3TextConfig(**BASE, sliding_window=32, tie_word_embeddings=True)),
        # gpt-oss: stacked 3-D experts with biases, router mlp.router with a bias, attention sinks;
        # untied.
        "gpt_oss": (t.GptOssForCausalLM,
                    t.GptOssConfig(**{**BASE, "intermediate_size": 64}, num_local_experts=4, sliding_window=32,
                                   num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"],
                                   tie_word_embeddings=False)),
        # GPT-2: Conv1D weights stored [in, out], tied lm_head (not saved).
        "gpt2": (t.GPT2LMHeadModel, t.GPT2Config(n_embd=64, n_layer=2, n_head=2, n_positions=64, vocab_size=128,
                                                 tie_word_embeddings=True)),
    }


def published_keys(d):
    """Adds to config.json the keys the published configs carry and transformers 5 writes under
    new names (top-level rope_theta, Qwen3-MoE's num_experts), which mlx-lm 0.32 reads."""
    path = os.path.join(d, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None:
        cfg.setdefault("rope_theta", theta)
    if cfg["model_type"] == "qwen3_moe":
        cfg.setdefault("num_experts", cfg["num_local_experts"])
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests", "fixtures")
    manifest = ["# Architecture fixtures", "",
                f"Written by scripts/make_fixtures.py with torch {torch.__version__} and transformers "
                f"{transformers.__version__} (seed {SEED}, bfloat16). Tensors as in each model.safetensors header.", ""]
    for name, (cls, config) in fixtures().items():
        torch.manual_seed(SEED)
        model = cls(config).to(torch.bfloat16).eval()
        d = os.path.join(out, name)
        model.save_pretrained(d)
        # Only config.json and the weights: generation_config.json is not needed by any test.
        for extra in os.listdir(d):
            if extra not in ("config.json", "model.safetensors"):
                os.remove(os.path.join(d, extra))
        published_keys(d)
        h = header(os.path.join(d, "model.safetensors"))
        size = os.path.getsize(os.path.join(d, "model.safetensors"))
        manifest += [f"## {name} ({cls.__name__}, {size // 1024} KiB)", "", "| tensor | dtype | shape |",
                     "|---|---|---|"]
        manifest += [f"| `{t}` | {v['dtype']} | {v['shape']} |" for t, v in sorted(h.items()) if t != "__metadata__"]
        manifest.append("")
        print(f"{name}: {len(h) - ('__metadata__' in h)} tensors, {size // 1024} KiB")
    with open(os.path.join(out, "MANIFEST.md"), "w") as f:
        f.write("\n".join(manifest))


if __name__ == "__main__":
    main()
