#!/usr/bin/env python3
"""Writes the seed corpus of the GGUF fuzz target (tests/fuzz/corpus_gguf/*.bin) in the byte format
fuzz_gguf.cpp reads (see its header):
  - mode byte 0, then a GGUF file: tiny llama / qwen3 / qwen3moe / gemma2 files of NVFP4, MXFP4,
    F32, F16 and BF16 tensors with .scale tensors, written by llama.cpp's own gguf-py writer; and the
    shapes that once broke the reader (see BAD below);
  - mode byte 1 (3: mxfp4, 5: split files), then the tokenizer files of a fixture model, each behind
    a little-endian u16 length (0xFFFF: absent).
Needs numpy and gguf (llama.cpp's gguf-py); run it with the project's venv."""
import os
import struct
import sys
import tempfile

import gguf
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus_gguf")
FIXTURES = os.path.join(HERE, "..", "fixtures")
T = gguf.GGMLQuantizationType
HIDDEN, VOCAB, FF = 64, 8, 8


def nvfp4_blocks(rows, k, seed=0):
    """ggml NVFP4: per 64 values four E4M3 scale bytes, then 32 code bytes."""
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(rows * k // 64):
        blocks.append(bytes(int(x) for x in rng.choice([0x30, 0x38, 0x40, 0x3c], 4)) + rng.integers(0, 256, 32, dtype=np.uint8).tobytes())
    return np.frombuffer(b"".join(blocks), dtype=np.uint8).reshape(rows, k // 64 * 36)


def mxfp4_blocks(rows, k, seed=0):
    """ggml MXFP4: per 32 values one E8M0 byte, then 16 code bytes."""
    rng = np.random.default_rng(seed)
    blocks = [bytes([int(rng.integers(120, 130))]) + rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
              for _ in range(rows * k // 32)]
    return np.frombuffer(b"".join(blocks), dtype=np.uint8).reshape(rows, k // 32 * 17)


def floats(shape, dtype=np.float32, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 0.1).astype(dtype)


def write(arch, kvs, tensors, split=None):
    """kvs: (method name or raw key, value[, GGUFValueType]); tensors: (name, array[, raw dtype])."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.gguf")
        w = gguf.GGUFWriter(path, arch)
        for kv in kvs:
            if len(kv) == 3:
                w.add_key_value(kv[0], kv[1], kv[2])
            else:
                getattr(w, kv[0])(kv[1])
        if split:
            w.add_uint16("split.no", split[0])
            w.add_uint16("split.count", split[1])
            w.add_int32("split.tensors.count", len(tensors))
        for t in tensors:
            if len(t) == 3:
                w.add_tensor(t[0], t[1], raw_dtype=t[2])
            else:
                w.add_tensor(t[0], t[1])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(path, "rb") as f:
            return f.read()


def base_kvs(heads=2, kv_heads=1, head_dim=32, blocks=1):
    return [("add_block_count", blocks), ("add_context_length", 128), ("add_embedding_length", HIDDEN),
            ("add_feed_forward_length", FF), ("add_head_count", heads), ("add_head_count_kv", kv_heads),
            ("add_layer_norm_rms_eps", 1e-6), ("add_key_length", head_dim), ("add_value_length", head_dim),
            ("add_rope_freq_base", 10000.0)]


def scale(value, n=1):
    return np.full((n,), value, dtype=np.float32)


def llama(quant=T.NVFP4):
    blocks = nvfp4_blocks if quant == T.NVFP4 else mxfp4_blocks
    tensors = [("token_embd.weight", floats((VOCAB, HIDDEN), np.float16)),
               ("output_norm.weight", floats((HIDDEN,))),
               ("blk.0.attn_norm.weight", floats((HIDDEN,), seed=1)),
               ("blk.0.attn_k.weight", blocks(32, HIDDEN, 1), quant),
               ("blk.0.ffn_gate.weight", blocks(FF, HIDDEN, 2), quant),
               ("blk.0.ffn_down.weight", floats((HIDDEN, FF), np.float16))]
    if quant == T.NVFP4:
        tensors += [("blk.0.attn_k.scale", scale(0.5)), ("blk.0.ffn_gate.scale", scale(1 / 2688))]
    return write("llama", base_kvs() + [("add_rope_dimension_count", 32), ("add_vocab_size", VOCAB)], tensors)


def qwen3():
    tensors = [("token_embd.weight", floats((VOCAB, HIDDEN)).astype(np.float32)),
               ("output.weight", floats((VOCAB, HIDDEN), seed=3)),
               ("blk.0.attn_q_norm.weight", floats((32,), seed=4)),
               ("blk.0.attn_q.weight", mxfp4_blocks(HIDDEN, HIDDEN, 5), T.MXFP4),
               ("blk.0.ffn_up.weight", nvfp4_blocks(FF, HIDDEN, 6), T.NVFP4),
               ("blk.0.ffn_up.scale", scale(0.01))]
    return write("qwen3", base_kvs(), tensors)


def qwen3moe():
    experts = 2
    tensors = [("token_embd.weight", floats((VOCAB, HIDDEN))),
               ("blk.0.ffn_gate_inp.weight", floats((experts, HIDDEN), seed=7)),
               ("blk.0.ffn_gate_exps.weight", nvfp4_blocks(experts * FF, HIDDEN, 8).reshape(experts, FF, 36), T.NVFP4),
               ("blk.0.ffn_gate_exps.scale", np.array([0.25, 0.5], dtype=np.float32)),
               ("blk.0.ffn_down_exps.weight", mxfp4_blocks(experts * HIDDEN, 64, 9).reshape(experts, HIDDEN, 34), T.MXFP4)]
    kvs = base_kvs() + [("add_expert_count", experts), ("add_expert_used_count", 1),
                        ("add_expert_feed_forward_length", FF)]
    return write("qwen3moe", kvs, tensors)


def gemma2():
    tensors = [("token_embd.weight", floats((VOCAB, HIDDEN)).astype(np.float32)),
               ("blk.0.post_attention_norm.weight", floats((HIDDEN,), seed=10)),
               ("blk.0.attn_output.weight", nvfp4_blocks(HIDDEN, HIDDEN, 11), T.NVFP4),
               ("blk.0.attn_output.scale", scale(2.0))]
    kvs = base_kvs() + [("add_sliding_window", 64), ("add_attn_logit_softcapping", 50.0),
                        ("add_final_logit_softcapping", 30.0)]
    return write("gemma2", kvs, tensors)


def bf16():
    import ml_dtypes  # gguf-py writes BF16 from raw bytes
    emb = floats((VOCAB, HIDDEN)).astype(ml_dtypes.bfloat16).view(np.uint8)
    tensors = [("token_embd.weight", emb, T.BF16), ("blk.0.ffn_up.weight", nvfp4_blocks(FF, HIDDEN, 12), T.NVFP4)]
    return write("qwen3", base_kvs(), tensors)


# Shapes the reader must refuse cleanly.
def bad():
    emb = ("token_embd.weight", floats((VOCAB, HIDDEN), np.float16))
    return {
        "split_first": write("llama", base_kvs(), [emb], split=(0, 2)),
        "mxfp4_with_scale": write("qwen3", base_kvs(), [emb, ("blk.0.ffn_up.weight", mxfp4_blocks(FF, HIDDEN), T.MXFP4),
                                                        ("blk.0.ffn_up.scale", scale(1.0))]),
        "scale_per_expert_count": write("qwen3moe", base_kvs() + [("add_expert_count", 2)],
                                        [emb, ("blk.0.ffn_up_exps.weight",
                                               nvfp4_blocks(2 * FF, HIDDEN).reshape(2, FF, 36), T.NVFP4),
                                         ("blk.0.ffn_up_exps.scale", scale(1.0, 3))]),
        "scale_not_f32": write("qwen3", base_kvs(), [emb, ("blk.0.ffn_up.weight", nvfp4_blocks(FF, HIDDEN), T.NVFP4),
                                                     ("blk.0.ffn_up.scale", np.ones(1, np.float16))]),
        "unknown_arch": write("mamba", base_kvs(), [emb]),
        "no_block_count": write("llama", [], [emb]),
        # Names were made for every block up front: 4 billion blocks' worth (a fuzz timeout).
        "huge_block_count": write("llama", base_kvs(blocks=2**32 - 1), [emb, ("blk.3.ffn_up.weight",
                                                                           nvfp4_blocks(FF, HIDDEN), T.NVFP4)]),
        # Rows that are not whole heads: two rows were left unwritten (zeros) by the q/k regrouping.
        "heads_not_dividing": write("llama", base_kvs(heads=3, kv_heads=3),
                                    [emb, ("blk.0.attn_k.weight", nvfp4_blocks(32, HIDDEN), T.NVFP4)]),
        # 2^31 kv heads turned negative as an int: the q/k rows were left unpermuted.
        "heads_past_int": write("llama", base_kvs(kv_heads=2**31),
                                [emb, ("blk.0.attn_k.weight", nvfp4_blocks(32, HIDDEN), T.NVFP4)]),
        # inspect dereferenced an empty optional for a type without a safetensors dtype.
        "q8_0": write("qwen3", base_kvs(), [emb, ("blk.0.ffn_up.weight",
                                                  np.zeros((FF, HIDDEN // 32 * 34), np.uint8), T.Q8_0)]),
        # A stack of 2^40 experts of no rows holds no bytes, yet was split into 2^40 names.
        "empty_expert_stack": write("qwen3moe", base_kvs() + [("add_expert_count", 2)],
                                    [emb, ("blk.0.ffn_up_exps.weight", np.zeros((2**40, 0, 36), np.uint8), T.NVFP4)]),
        "foreign_tensor": write("llama", base_kvs(), [emb, ("blk.0.something.weight", floats((4,)))]),
    }


def tokenizer_seed(fixture, flags=1):
    out = bytes([flags])
    for name in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        path = os.path.join(FIXTURES, fixture, name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                data = f.read()
            out += struct.pack("<H", len(data)) + data
        else:
            out += b"\xff\xff"
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    seeds = {"llama_nvfp4": llama(), "llama_mxfp4": llama(T.MXFP4), "qwen3_mixed": qwen3(), "qwen3moe": qwen3moe(),
             "gemma2_nvfp4": gemma2(), "qwen3_bf16_embd": bf16()}
    seeds = {k: b"\x00" + v for k, v in seeds.items()}
    seeds.update({"bad_" + k: b"\x00" + v for k, v in bad().items()})
    seeds.update({"tok_llama_bpe": tokenizer_seed("llama"), "tok_gemma2_spm": tokenizer_seed("gemma2", 3),
                  "tok_phi3_spm": tokenizer_seed("phi3", 5), "tok_qwen2_bpe": tokenizer_seed("qwen2"),
                  "tok_none": bytes([1]) + b"\xff\xff" * 4})
    for name, data in seeds.items():
        if len(data) > 16384:
            sys.exit(f"seed {name} is {len(data)} bytes, over run.sh's -max_len for gguf")
        with open(os.path.join(OUT, name + ".bin"), "wb") as f:
            f.write(data)
    print(f"{len(seeds)} seeds in {OUT}")


if __name__ == "__main__":
    main()
