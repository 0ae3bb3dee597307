"""GGUF files that are not what microscale's export writes (found by tests/fuzz/fuzz_gguf.cpp):
inspect, dequantize and convert refuse them with an error naming the file and what is wrong, leave
no output, or read them correctly. The files are written with llama.cpp's gguf-py."""

import os

import numpy as np
import pytest

from ckpt_support import ok, run, skip_without_cli

skip_without_cli()
gguf = pytest.importorskip("gguf", reason="pip install gguf==0.19.0 (llama.cpp's gguf-py)")
T = gguf.GGMLQuantizationType
HIDDEN, VOCAB = 64, 8


def nvfp4(rows, k):
    """ggml NVFP4 blocks of scale 1.0 (E4M3 0x38) and arbitrary codes."""
    block = bytes([0x38] * 4) + bytes(range(32))
    return np.frombuffer(block * (rows * k // 64), np.uint8).reshape(rows, k // 64 * 36)


def write(path, arch="llama", heads=2, kv_heads=1, blocks=1, tensors=()):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(blocks)
    w.add_context_length(128)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(64)
    if heads is not None:
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_tensor("token_embd.weight", np.zeros((VOCAB, HIDDEN), np.float16))
    for name, data, dtype in tensors:
        w.add_tensor(name, data, raw_dtype=dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def refused(args, *words):
    r = run(*args)
    assert r.returncode != 0
    for w in words:
        assert w in r.stderr, r.stderr
    return r


def test_block_count_does_not_bound_the_work(tmp_path):
    """block_count is any u32/u64: names are made for the blocks the file has tensors of (the
    reader made them for every block count up front, 4 billion blocks' worth here)."""
    g = write(tmp_path / "m.gguf", blocks=2**32 - 1,
              tensors=[("blk.3.ffn_up.weight", nvfp4(64, HIDDEN), T.NVFP4)])
    r = ok("inspect", g)
    assert "model.layers.3.mlp.up_proj" in r.stdout


def test_heads_that_do_not_divide_the_rows_are_refused(tmp_path):
    """llama's q/k rows are regrouped per head: 32 rows are not 3 heads of an even size, and the
    reader left two rows unwritten (zeros) instead of refusing."""
    g = write(tmp_path / "m.gguf", heads=3, kv_heads=3, tensors=[("blk.0.attn_k.weight", nvfp4(32, HIDDEN), T.NVFP4)])
    for args in (("convert", g, "--to", "compressed-tensors", "-o", tmp_path / "ct"),
                 ("dequantize", g, "-o", tmp_path / "dq")):
        refused(args, str(g), "blk.0.attn_k.weight", "attention.head_count_kv")
    assert not os.path.exists(tmp_path / "ct") and not os.path.exists(tmp_path / "dq")


def test_errors_from_the_keys_name_the_file(tmp_path):
    g = write(tmp_path / "mamba.gguf", arch="mamba")
    refused(("inspect", g), str(g), "mamba")
    g = write(tmp_path / "heads.gguf", heads=None)
    refused(("inspect", g), str(g), "llama.* keys", "num_attention_heads")


def test_inspect_shows_q8_0_tensors(tmp_path):
    """Q8_0 (ggml's 8-bit blocks) is listed as such; dequantize refuses it by name."""
    q8 = np.zeros((64, HIDDEN // 32 * 34), np.uint8)
    g = write(tmp_path / "m.gguf", tensors=[("blk.0.ffn_up.weight", q8, T.Q8_0)])
    r = ok("inspect", g)
    assert "Q8_0 ggml blocks" in r.stdout
    refused(("dequantize", g, "-o", tmp_path / "dq"), str(g), "blk.0.ffn_up.weight", "Q8_0")


def test_an_empty_expert_stack_is_refused(tmp_path):
    """2^40 experts of no rows hold no bytes; splitting them per expert ran out of memory."""
    g = write(tmp_path / "m.gguf", arch="qwen3moe",
              tensors=[("blk.0.ffn_up_exps.weight", np.zeros((2**40, 0, 36), np.uint8), T.NVFP4)])
    refused(("dequantize", g, "-o", tmp_path / "dq"), str(g), "blk.0.ffn_up_exps.weight", "no values")
    assert not os.path.exists(tmp_path / "dq")


def test_a_head_count_past_int_is_refused(tmp_path):
    """2^31 kv heads turned negative as an int, and the q/k rows were left in llama.cpp's order."""
    g = write(tmp_path / "m.gguf", heads=2, kv_heads=2**31,
              tensors=[("blk.0.attn_k.weight", nvfp4(32, HIDDEN), T.NVFP4)])
    refused(("convert", g, "--to", "compressed-tensors", "-o", tmp_path / "ct"), str(g),
            "llama.attention.head_count_kv")
    assert not os.path.exists(tmp_path / "ct")
