#!/usr/bin/env python3
"""Writes the seed corpus of the checkpoint fuzz target (tests/fuzz/corpus_checkpoint/*.bin): valid
small layers of every layout, and the hostile cases the checkpoint layer once mishandled. The byte
format is the one fuzz_checkpoint.cpp reads (see its header); the tables below mirror its tables."""
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus_checkpoint")
DIMS = [0, 1, 2, 3, 4, 8, 16, 32, 64, 128, 4096, 2**31 - 1, 2**31, 2**32, 2**32 + 4, 2**40,
        2**43, 2**58, 2**60, 2**61, 2**62, 2**63 - 1]
CONFIG_INTS = [0, 2, 3, 4, 5, 6, 8, 16, 32, 64, 128, -1, -4, 1, 7, 9, 256, 2**32 + 4, 2**32 + 32, 2**40, 2**63 - 1]
MODES = [None, "affine", "nvfp4", "mxfp4", "mxfp8", "bogus"]
MODULES = ["m", "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",  # first entries of kModules
           "model.layers.0.mlp.gate_proj", "lm_head", "model.embed_tokens", "model.norm", "x"]
SUFFIXES = [".weight", ".weight_packed", ".weight_scale", ".weight_global_scale", ".weight_scale_2",
            ".input_scale", ".input_global_scale", ".scales", ".biases", ".weight_zero_point", ".bias", "",
            ".weight_scale_inv", "_blocks", "_scales"]
LIKELY = ["U8", "U32", "F8_E4M3", "F16", "BF16", "F32", "F8_E8M0"]
CONFIG_KINDS = {None: 0, "empty": 1, "mlx": 2, "mlx_override": 3, "ct": 4, "modelopt": 5, "raw": 6, "bad": 7}
RANKS = {2: 0, 1: 3, 0: 4, 3: 5, 4: 6}
# Indexes into kEdgeValues: the value an F32 tensor is filled with (0: none, the data pool).
EDGES = {"zero": 1, "negzero": 2, "denormal": 3, "flt_max": 6, "inf": 7, "nan": 9, "negative": 10}


def dim(v):
    return DIMS.index(v) if v in DIMS else len(DIMS) + v


def seed(config=None, group=64, bits=4, mode=None, tensors=(), data=b"", sharded=False, damage=0, stats=True,
         quantize_mlx=False, raw_config=b"", side=0):
    """tensors: (module, suffix, dtype, shape[, shard[, edge]]); side: the side-files byte"""
    flags = CONFIG_KINDS[config] | (8 if sharded else 0) | (damage << 4) | (64 if stats else 0) | (128 if quantize_mlx else 0)
    module0 = MODULES.index(tensors[0][0]) if tensors else 0
    out = bytes([flags, module0, CONFIG_INTS.index(group), CONFIG_INTS.index(bits), MODES.index(mode)])
    if config == "raw":
        out += bytes([len(raw_config)]) + raw_config
    out += bytes([len(tensors)])
    for i, t in enumerate(tensors):
        module, suffix, dtype, shape = t[:4]
        shard = t[4] if len(t) > 4 else 0
        edge = EDGES[t[5]] if len(t) > 5 else 0
        if i:
            out += bytes([MODULES.index(module)])
        dims = [dim(d) for d in shape] + [0] * (3 - len(shape))  # rank 4 writes a fourth dim
        out += bytes([SUFFIXES.index(suffix), LIKELY.index(dtype), RANKS[len(shape)], shard | edge << 1] + dims)
    return out + bytes([side]) + data


def main():
    os.makedirs(HERE, exist_ok=True)
    one = struct.pack("<f", 1.0)
    packed = bytes((i * 37 + 11) & 0xFF for i in range(32))
    halves = struct.pack("<4e", 0.01, 0.02, 0.03, 0.04)
    e4m3 = bytes((i * 29 + 3) & 0x77 for i in range(256))  # E4M3 codes without the NaN ones
    seeds = {
        # The reported SIGFPE: U32 [0, 2^40] over one F16 scale column (group 2^43 truncated to 0).
        "mlx_sigfpe_empty_rows": seed("mlx", tensors=[("m", ".weight", "U32", [0, 2**40]),
                                                      ("m", ".scales", "F16", [0, 1]), ("m", ".biases", "F16", [0, 1])]),
        "mlx_width_overflow": seed("mlx", tensors=[("m", ".weight", "U32", [0, 2**62]),
                                                   ("m", ".scales", "F16", [0, 1]), ("m", ".biases", "F16", [0, 1])]),
        "mlx_bits_zero": seed("mlx", bits=0, tensors=[("m", ".weight", "U32", [0, 8]),
                                                      ("m", ".scales", "F16", [0, 1]), ("m", ".biases", "F16", [0, 1])]),
        "ct_width_overflow": seed(None, tensors=[("m", ".weight_packed", "U8", [0, 2**62]),
                                                 ("m", ".weight_scale", "F8_E4M3", [0, 1]),
                                                 ("m", ".weight_global_scale", "F32", [1])], data=one),
        "mlx_affine": seed("mlx", tensors=[("m", ".weight", "U32", [4, 8]), ("m", ".scales", "F16", [4, 1]),
                                           ("m", ".biases", "F16", [4, 1])], data=packed * 4 + halves + halves),
        "mlx_nvfp4_no_config": seed(None, tensors=[("m", ".weight", "U32", [4, 2]), ("m", ".scales", "U8", [4, 1])],
                                    data=packed + b"\x38" * 4),
        "mlx_mxfp4_override": seed("mlx_override", mode="mxfp4", group=32,
                                   tensors=[("m", ".weight", "U32", [4, 4]), ("m", ".scales", "U8", [4, 1])],
                                   data=packed * 2 + b"\x7f" * 4),
        "ct_nvfp4": seed("ct", group=16, tensors=[("m", ".weight_packed", "U8", [4, 8]),
                                                  ("m", ".weight_scale", "F8_E4M3", [4, 1]),
                                                  ("m", ".weight_global_scale", "F32", [1])],
                         data=packed + b"\x38" * 4 + struct.pack("<f", 3584.0)),
        "ct_mxfp4": seed("ct", group=32, tensors=[("m", ".weight_packed", "U8", [4, 16]),
                                                  ("m", ".weight_scale", "U8", [4, 1])],
                         data=packed * 2 + b"\x7f" * 4),
        "modelopt_nvfp4": seed("modelopt", tensors=[("m", ".weight", "U8", [4, 8]),
                                                    ("m", ".weight_scale", "F8_E4M3", [4, 1]),
                                                    ("m", ".weight_scale_2", "F32", []),
                                                    ("m", ".input_scale", "F32", [])],
                               data=packed + b"\x38" * 4 + one + one),
        "float_model": seed("empty", quantize_mlx=True,
                            tensors=[("model.layers.0.self_attn.q_proj", ".weight", "BF16", [4, 64]),
                                     ("model.layers.0.self_attn.k_proj", ".weight", "BF16", [4, 64]),
                                     ("model.norm", ".weight", "F32", [64])],
                            data=bytes((i * 13 + 5) & 0x3F for i in range(256))),
        # A ModelOpt layer beside a compressed-tensors activation scale: convert to compressed-tensors
        # used to copy it through, where it became the layer's (malformed) activation scale.
        "modelopt_stray_ct_scale": seed("modelopt", tensors=[("m", ".weight", "U8", [4, 8]),
                                                             ("m", ".weight_scale", "F8_E4M3", [4, 1]),
                                                             ("m", ".weight_scale_2", "F32", []),
                                                             ("m", ".input_global_scale", "F32", [0, 0, 0])],
                                        data=packed + b"\x38" * 4 + one),
        # Global scales at the edges of their conventions: a weight_scale_2 of 0 or -0 decodes to
        # zeros, a denormal one to an amax whose 2688/amax overflows; convert used to write a
        # weight_global_scale decoding the same codes to values up to 2688, or 3000x larger.
        **{f"modelopt_ws2_{edge}": seed("modelopt", tensors=[("m", ".weight", "U8", [4, 8]),
                                                             ("m", ".weight_scale", "F8_E4M3", [4, 1]),
                                                             ("m", ".weight_scale_2", "F32", [], 0, edge)],
                                        data=packed + b"\x38" * 4)
           for edge in ("zero", "negzero", "denormal", "flt_max", "nan")},
        **{f"ct_gs_{edge}": seed("ct", group=16, tensors=[("m", ".weight_packed", "U8", [4, 8]),
                                                           ("m", ".weight_scale", "F8_E4M3", [4, 1]),
                                                           ("m", ".weight_global_scale", "F32", [1], 0, edge)],
                                 data=packed + b"\x38" * 4)
           for edge in ("zero", "negzero", "denormal", "flt_max", "inf", "negative")},
        "modelopt_ws2_zero_scales": seed("modelopt", tensors=[("m", ".weight", "U8", [4, 8]),
                                                               ("m", ".weight_scale", "F8_E4M3", [4, 1]),
                                                               ("m", ".weight_scale_2", "F32", [], 0, "zero")],
                                         data=packed + b"\x00" * 4),
        # A float model holding a tensor named like a part of the layer quantize writes: the output
        # used to be one that load, dequantize and convert refuse.
        "float_model_layer_part": seed("empty", quantize_mlx=True,
                                       tensors=[("m", ".weight", "BF16", [4, 64]),
                                                ("m", ".weight_global_scale", "F32", [1])],
                                       data=bytes((i * 13 + 5) & 0x3F for i in range(256))),
        # Weights without input features (K = 0): quantize used to write codes and scales of width 0,
        # which no reader can tell the group size from, so the output did not load back.
        "float_model_no_input_features": seed("empty", quantize_mlx=True,
                                              tensors=[("m", ".weight", "BF16", [0, 0]),
                                                       ("x", ".weight", "BF16", [4, 0]),
                                                       ("model.layers.0.self_attn.q_proj", ".weight", "BF16", [4, 64])],
                                              data=bytes((i * 13 + 5) & 0x3F for i in range(256))),
        # A shard tensor that the index leaves out, and one the index names but no shard holds.
        "sharded_unlisted": seed("empty", sharded=True, damage=1,
                                 tensors=[("m", ".weight", "F32", [4, 8], 0), ("x", ".weight", "F32", [4, 8], 1)]),
        "sharded_ghost": seed("empty", sharded=True, damage=2,
                              tensors=[("m", ".weight", "F32", [4, 8], 0), ("x", ".weight", "F32", [4, 8], 1)]),
        "sharded_ok": seed("mlx", sharded=True,
                           tensors=[("m", ".weight", "U32", [4, 8], 0), ("m", ".scales", "F16", [4, 1], 1),
                                    ("m", ".biases", "F16", [4, 1], 1)], data=packed * 4 + halves + halves),
        "raw_config": seed("raw", raw_config=b'{"quantization": {"bits": 4, "group_size": 64, "m": 7}}',
                           tensors=[("m", ".weight", "U32", [4, 8]), ("m", ".scales", "F16", [4, 1]),
                                    ("m", ".biases", "F16", [4, 1])]),
        # Quantized sources (docs/checkpoints.md, "Quantized sources"): valid layers of each, and
        # a block grid over an empty weight with a hostile width.
        "fp8_block": seed("raw", raw_config=b'{"quantization_config": {"quant_method": "fp8", '
                                            b'"weight_block_size": [2, 32]}}',
                          tensors=[("m", ".weight", "F8_E4M3", [4, 64]), ("m", ".weight_scale_inv", "F32", [2, 2])],
                          data=e4m3 + struct.pack("<4f", 0.5, 0.25, 2.0, 0.125)),
        "fp8_block_empty_wide": seed("raw", raw_config=b'{"quantization_config": {"quant_method": "fp8", '
                                                       b'"weight_block_size": [128, 128]}}',
                                     tensors=[("m", ".weight", "F8_E4M3", [0, 2**62]),
                                              ("m", ".weight_scale_inv", "F32", [0, 2**58])]),
        "ct_fp8_channel": seed("raw", raw_config=b'{"quantization_config": {"quant_method": "compressed-tensors", '
                                                 b'"format": "float-quantized"}}',
                               tensors=[("m", ".weight", "F8_E4M3", [4, 64]), ("m", ".weight_scale", "BF16", [4, 1]),
                                        ("m", ".input_scale", "BF16", [1])],
                               data=e4m3 + struct.pack("<5e", 0.5, 0.25, 2.0, 0.125, 1.0)),
        "modelopt_fp8": seed("raw", raw_config=b'{"quantization_config": {"quant_method": "modelopt", '
                                               b'"quant_algo": "FP8"}}',
                             tensors=[("m", ".weight", "F8_E4M3", [4, 64]), ("m", ".weight_scale", "F32", []),
                                      ("m", ".input_scale", "F32", [])],
                             data=e4m3 + one + one),
        # Side files: links out of the model (relative and absolute), one inside, a private file,
        # a dangling link and an earlier output, around a float model and a quantized one; each
        # with another report path checked against the inputs.
        "side_files_float": seed("empty", quantize_mlx=True,
                                 tensors=[("model.layers.0.self_attn.q_proj", ".weight", "BF16", [4, 64])],
                                 data=bytes((i * 13 + 5) & 0x3F for i in range(256)), side=0x3F),
        "side_files_sharded": seed("empty", sharded=True,
                                   tensors=[("model.layers.0.self_attn.q_proj", ".weight", "BF16", [4, 64], 0),
                                            ("model.layers.0.self_attn.k_proj", ".weight", "BF16", [4, 64], 1)],
                                   data=bytes((i * 7 + 1) & 0x3F for i in range(256)), side=0x3F | 0x40),
        "side_files_ct": seed("ct", group=16, tensors=[("m", ".weight_packed", "U8", [4, 8]),
                                                       ("m", ".weight_scale", "F8_E4M3", [4, 1]),
                                                       ("m", ".weight_global_scale", "F32", [1])],
                              data=packed + b"\x38" * 4 + struct.pack("<f", 3584.0), side=0x3F | 0x80),
        "side_files_links_only": seed("empty", tensors=[("x", ".weight", "F32", [4, 16])], side=0x13 | 0xC0),
        "gptoss_mxfp4": seed("raw", raw_config=b'{"quantization_config": {"quant_method": "mxfp4"}}',
                             tensors=[("m", "_blocks", "U8", [2, 4, 2, 16]), ("m", "_scales", "U8", [2, 4, 2])],
                             data=packed * 8 + bytes(range(120, 136))),
    }
    for name, b in seeds.items():
        with open(os.path.join(HERE, name + ".bin"), "wb") as f:
            f.write(b)
    print(f"wrote {len(seeds)} seeds to {HERE}")


if __name__ == "__main__":
    main()
