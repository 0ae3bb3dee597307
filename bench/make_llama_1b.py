"""A Llama-3.2-1B-shaped bfloat16 checkpoint with random weights and a byte-level BPE tokenizer of
the model's whole vocabulary (128256 tokens), for the 1B benchmarks (bench/gguf_export_bench.sh,
bench/model_bench.sh). Timings depend on shapes, not values.

    python bench/make_llama_1b.py OUT FIXTURE

OUT is the model directory to write; FIXTURE a tokenizer fixture (tests/fixtures/llama) whose
tokenizer.json gives the pre-tokenizer, decoder and post-processor. Needs torch and transformers.
"""

import json
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, SPECIALS = 128256, 256


def write_model(out):
    # Llama-3.2-1B's dimensions.
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=64, vocab_size=VOCAB, tie_word_embeddings=True,
                      max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                      bos_token_id=VOCAB - SPECIALS, eos_token_id=VOCAB - SPECIALS + 1)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    LlamaForCausalLM(cfg).save_pretrained(out)


def write_tokenizer(out, fixture):
    # A byte-level BPE as large as Llama 3's: the 256 byte symbols, then merged tokens (every pair of
    # byte symbols, then byte-pair + byte) up to 128000, then 256 special tokens as Llama 3 has them.
    tj = json.load(open(os.path.join(fixture, "tokenizer.json")))
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    symbols = [chr(c) for c in cs]
    vocab, merges = {s: i for i, s in enumerate(symbols)}, []
    pairs = ((a, b) for a in symbols for b in symbols)
    triples = ((a + b, c) for a in symbols for b in symbols for c in symbols)
    for left, right in (p for gen in (pairs, triples) for p in gen):
        if len(vocab) == VOCAB - SPECIALS:
            break
        vocab[left + right] = len(vocab)
        merges.append([left, right])
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    names += [f"<|reserved_special_token_{k}|>" for k in range(SPECIALS - len(names))]
    added = [{"id": VOCAB - SPECIALS + k, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for k, t in enumerate(names)]
    for a in added:
        vocab[a["content"]] = a["id"]
    tj["model"]["vocab"], tj["model"]["merges"], tj["added_tokens"] = vocab, merges, added
    template = next(p for p in tj["post_processor"]["processors"] if p["type"] == "TemplateProcessing")
    template["special_tokens"]["<|begin_of_text|>"]["ids"] = [VOCAB - SPECIALS]
    json.dump(tj, open(os.path.join(out, "tokenizer.json"), "w"), ensure_ascii=False)
    tc = json.load(open(os.path.join(fixture, "tokenizer_config.json")))
    tc["added_tokens_decoder"] = {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                                   "single_word", "special")} for a in added}
    json.dump(tc, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    write_model(sys.argv[1])
    write_tokenizer(sys.argv[1], sys.argv[2])
