"""Argument and data errors (ValueError / TypeError) and empty tensors."""

import ml_dtypes
import numpy as np
import pytest

import microscale
import spec_oracle as O
from conftest import BF16, FLOAT_DTYPES, assert_same_bits, dtype_id

MODES = [("nvfp4", {}), ("mxfp4", {}), ("mxfp8", {}), ("mxfp8", {"elem": "e5m2"}),
         ("affine", {"group_size": 32, "bits": 3}), ("affine", {}), ("affine", {"bits": 8, "group_size": 128})]


def mode_id(m):
    return m[0] + "".join(f"-{v}" for v in m[1].values())


@pytest.mark.parametrize("mode,kw", MODES, ids=[mode_id(m) for m in MODES])
def test_k_not_divisible_by_group(mode, kw):
    g = kw.get("group_size") or O.MODE_DEFAULTS[mode][0]
    for K in (g + g // 2, g // 2, 1, 3 * g + 1):
        with pytest.raises(ValueError, match="divisible"):
            microscale.quantize(np.ones((2, K), np.float32), mode=mode, **kw)


@pytest.mark.parametrize("mode,kw", [
    ("nvfp4", {"group_size": 32}), ("nvfp4", {"group_size": 8}), ("nvfp4", {"bits": 8}),
    ("mxfp4", {"group_size": 16}), ("mxfp4", {"group_size": 64}), ("mxfp4", {"bits": 8}),
    ("mxfp8", {"group_size": 16}), ("mxfp8", {"bits": 4}),
    ("affine", {"group_size": 16}), ("affine", {"group_size": 256}), ("affine", {"bits": 1}),
    ("affine", {"bits": 7}), ("affine", {"bits": 16}),
    ("nvfp4", {"elem": "e5m2"}), ("mxfp4", {"elem": "e5m2"}),
    ("affine", {"layout": "swizzled"}),
])
def test_unsupported_group_bits_options(mode, kw):
    x = np.ones((2, 256), np.float32)
    with pytest.raises(ValueError):
        microscale.quantize(x, mode=mode, **kw)
    packed = np.zeros((2, 128), np.uint8)
    scales = np.zeros((2, 8), np.uint8)
    with pytest.raises(ValueError):
        microscale.dequantize(packed, scales, mode=mode, **kw)


@pytest.mark.parametrize("bad", [0, -16])
def test_nonpositive_group_or_bits(bad):
    with pytest.raises(ValueError):
        microscale.quantize(np.ones((2, 64), np.float32), mode="affine", group_size=bad)
    with pytest.raises(ValueError):
        microscale.quantize(np.ones((2, 64), np.float32), mode="affine", bits=bad)
    with pytest.raises(TypeError):
        microscale.quantize(np.ones((2, 64), np.float32), mode="affine", bits=4.0)


@pytest.mark.parametrize("mode", ["mxfp4", "mxfp8", "affine"])
def test_global_scale_rejected_for_other_modes(mode):
    x = np.ones((2, 128), np.float32)
    for g in (1.0, 0.0):
        with pytest.raises(ValueError, match="global_scale"):
            microscale.quantize(x, mode=mode, global_scale=g)
    parts = microscale.quantize(x, mode=mode)
    with pytest.raises(ValueError, match="global_scale"):
        microscale.dequantize(*parts, mode=mode, global_scale=1.0)


@pytest.mark.parametrize("g", [-1.0, -1e-30, float("nan"), float("inf"), float("-inf"), 1e39,
                               np.float32(np.nan), np.array([np.inf], np.float32)])
def test_bad_global_scale_values(g):
    x = np.ones((2, 32), np.float32)
    with pytest.raises(ValueError):
        microscale.quantize(x, mode="nvfp4", global_scale=g)
    p, s = microscale.quantize(x, mode="nvfp4")
    with pytest.raises(ValueError):
        microscale.dequantize(p, s, mode="nvfp4", global_scale=g)


def test_bad_global_scale_types():
    x = np.ones((2, 32), np.float32)
    with pytest.raises(ValueError):
        microscale.quantize(x, mode="nvfp4", global_scale=np.array([1.0, 2.0], np.float32))
    with pytest.raises(ValueError):
        microscale.quantize(x, mode="nvfp4", global_scale=np.zeros((0,), np.float32))
    with pytest.raises(TypeError):
        microscale.quantize(x, mode="nvfp4", global_scale="1.0")
    with pytest.raises(TypeError):
        microscale.quantize(x, mode="nvfp4", global_scale=True)


def test_bad_names():
    x = np.ones((2, 64), np.float32)
    for kw in ({"mode": "fp4"}, {"mode": "NVFP4x"}, {"mode": ""}, {"scale_rule": "up"},
               {"nonfinite": "ignore"}, {"layout": "blocked"}, {"mode": "mxfp8", "elem": "e3m4"}):
        with pytest.raises(ValueError):
            microscale.quantize(x, **kw)
    p, s = microscale.quantize(x)
    for kw in ({"mode": "int4"}, {"layout": "tiled"}, {"scale_rule": "round"}, {"nonfinite": "x"},
               {"dtype": "float64"}):
        with pytest.raises((ValueError, TypeError)):
            microscale.dequantize(p, s, **kw)
    with pytest.raises(TypeError):
        microscale.quantize(x, mode=4)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int8, np.uint8, np.bool_, np.complex64,
                                   ml_dtypes.float8_e4m3fn])
def test_unsupported_input_dtypes(dtype):
    x = np.ones((2, 64), dtype)
    for mode in ("nvfp4", "affine"):
        with pytest.raises(TypeError):
            microscale.quantize(x, mode=mode)
    with pytest.raises(TypeError):
        microscale.global_scale(x)
    with pytest.raises(TypeError):
        microscale.quantize([[1.0] * 64], mode="nvfp4")  # a list is float64


def test_unsupported_dequantize_dtypes():
    x = np.ones((2, 64), np.float32)
    p, s = microscale.quantize(x, mode="mxfp8")
    with pytest.raises(TypeError):
        microscale.dequantize(p.astype(np.int8), s, mode="mxfp8")
    with pytest.raises(TypeError):
        microscale.dequantize(p.astype(np.float32), s, mode="mxfp8")
    with pytest.raises(TypeError):
        microscale.dequantize(p, s.astype(np.float64), mode="mxfp8")
    with pytest.raises(TypeError):
        microscale.dequantize(p, s, mode="mxfp8", dtype=np.float64)
    with pytest.raises(TypeError):
        microscale.dequantize(p, s, mode="mxfp8", dtype="int8")
    with pytest.raises(ValueError):  # fp-mode scales must be byte codes
        microscale.dequantize(p, s.astype(np.float32), mode="mxfp8")
    pa, sa, ba = microscale.quantize(x, mode="affine")
    with pytest.raises(TypeError):
        microscale.dequantize(pa, sa.astype(np.float64), ba, mode="affine")
    with pytest.raises(ValueError):  # affine scales must be floats
        microscale.dequantize(pa, sa.view(np.uint32).astype(np.uint8), ba, mode="affine")


def test_mismatched_dequantize_shapes():
    x = np.ones((4, 128), np.float32)
    p, s = microscale.quantize(x, mode="nvfp4")
    for bad in (s[:, :7], s[:3], s.reshape(2, 2, 8), s[:, :, None]):
        with pytest.raises(ValueError):
            microscale.dequantize(p, bad, mode="nvfp4")
    with pytest.raises(ValueError):
        microscale.dequantize(p[:, :63], s, mode="nvfp4")       # 126 values: not whole groups
    with pytest.raises(ValueError):
        microscale.dequantize(p, s, mode="mxfp4")               # scales for groups of 16
    with pytest.raises(ValueError):
        microscale.dequantize(p, s, np.ones((4, 8), np.float32), mode="nvfp4")  # biases: affine only
    with pytest.raises(ValueError):
        microscale.dequantize(p, s, mode="nvfp4", layout="swizzled")
    pa, sa, ba = microscale.quantize(x, mode="affine")
    with pytest.raises(ValueError):
        microscale.dequantize(pa, sa, mode="affine")             # biases required
    for bad_b in (ba[:, :1], ba[:3], ba.astype(np.float16)):
        with pytest.raises(ValueError):
            microscale.dequantize(pa, sa, bad_b, mode="affine")
    with pytest.raises(ValueError):
        microscale.dequantize(pa, sa, ba, mode="affine", group_size=32)
    with pytest.raises(ValueError):
        microscale.dequantize(pa, sa, ba, mode="affine", bits=3)
    with pytest.raises(ValueError):
        microscale.dequantize(pa[0, 0], sa, ba, mode="affine")   # rank 0 packed
    with pytest.raises(ValueError):
        microscale.unswizzle_scales(microscale.swizzle_scales(s), 129, 8)


def test_rank0_input():
    with pytest.raises(ValueError):
        microscale.quantize(np.float32(1.0), mode="nvfp4")
    with pytest.raises(ValueError):
        microscale.quantize(np.array(1.0, np.float32), mode="affine")


@pytest.mark.parametrize("mode,kw", MODES + [("nvfp4", {"global_scale": 2.0})],
                         ids=[mode_id(m) for m in MODES] + ["nvfp4-3level"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_empty_tensors(mode, kw, dtype):
    g = kw.get("group_size") or O.MODE_DEFAULTS[mode][0]
    b = kw.get("bits") or O.MODE_DEFAULTS[mode][1]
    for shape in [(0, g), (0, 4 * g), (3, 0), (0,), (0, 0), (2, 0, g), (2, 3, 0)]:
        x = np.zeros(shape, dtype)
        out = microscale.quantize(x, mode=mode, **kw)
        want = O.quantize(x, mode=mode, **kw)
        for a, w in zip(out, want):
            assert_same_bits(a, w, f"empty {shape}")
        lead, K = shape[:-1], shape[-1]
        assert out[0].shape == lead + (K * b // 8,) and out[0].dtype == np.uint8
        assert out[1].shape == lead + (K // g,)
        if mode == "affine":
            assert len(out) == 3 and out[1].dtype == dtype and out[2].dtype == dtype
            assert out[2].shape == lead + (K // g,)
        else:
            assert len(out) == 2 and out[1].dtype == np.uint8
        for dt in ("float32", "float16", "bfloat16"):
            y = microscale.dequantize(*out, mode=mode, dtype=dt, **kw)
            assert y.shape == shape and y.dtype == O.dtype_of(dt)
        if mode != "affine":
            outs = microscale.quantize(x, mode=mode, layout="swizzled", **kw)
            R = int(np.prod(lead))
            C = K // g
            assert outs[1].shape == (-(-R // 128) * 128, -(-C // 4) * 4)
            assert not outs[1].any()
            y = microscale.dequantize(*outs, mode=mode, layout="swizzled", **kw)
            assert y.shape == shape
    assert microscale.global_scale(np.zeros((0, 3), dtype)) == 0
