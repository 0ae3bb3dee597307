"""microscale.quantize / dequantize byte for byte against the independent numpy model of
FORMATS.md (tests/python/spec_oracle.py) on many random inputs: heavy tails, zero blocks, blocks
whose scale underflows, values near the dtype's max, NaN/Inf, odd shapes, every input and output
dtype, non-contiguous views."""

import ml_dtypes
import numpy as np
import pytest

import microscale
import spec_oracle as O
from conftest import BF16, FLOAT_DTYPES, assert_same_bits, dtype_id

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
DTYPE_MAX = {F32: float(O.FLT_MAX), F16: 65504.0, BF16: float(ml_dtypes.finfo(BF16).max)}
DTYPE_TINY = {F32: 2.0 ** -149, F16: 2.0 ** -24, BF16: 2.0 ** -133}

# (mode, kwargs) configurations; nvfp4 global scales are filled in per input ("amax" etc.).
MX_CONFIGS = [("mxfp4", dict(scale_rule=r)) for r in ("ceil", "floor", "even", "nearest")] + [
    ("mxfp8", dict(scale_rule=r, elem=e)) for e in ("e4m3", "e5m2")
    for r in ("ceil", "floor", "even", "nearest")]
NV_CONFIGS = [("nvfp4", dict(global_scale=g)) for g in
              (None, "amax", "half_amax", "big", "zero", "tiny", "subnormal")]
AFFINE_CONFIGS = [("affine", dict(bits=b, group_size=g)) for b in (2, 3, 4, 5, 6, 8)
                  for g in (32, 64, 128)]
ALL_CONFIGS = NV_CONFIGS + MX_CONFIGS + AFFINE_CONFIGS


def cfg_id(c):
    mode, kw = c
    return mode + "-" + "-".join(f"{v}" for v in kw.values())


def group_of(mode, kw):
    return kw.get("group_size") or O.MODE_DEFAULTS[mode][0]


def make_input(rng, shape, dtype, group, nonfinite=False, extreme=True):
    """Heavy-tailed data with special blocks, as `dtype`."""
    dtype = np.dtype(dtype)
    top = DTYPE_MAX[dtype]
    n = int(np.prod(shape))
    x = rng.standard_t(2.5, size=n) * np.exp2(rng.integers(-10, 10, size=n) // 4)
    x = x.astype(np.float64)
    if n and extreme:
        blocks = x.reshape(-1, group) if n % group == 0 else x.reshape(1, -1)
        nb = blocks.shape[0]
        kinds = rng.integers(0, 10, size=nb)
        for b, kind in enumerate(kinds):
            blk = blocks[b]
            if kind == 0:      # all zero, some negative zeros
                blk[:] = np.where(rng.random(blk.size) < 0.3, -0.0, 0.0)
            elif kind == 1:    # tiny: scales underflow / subnormal inputs
                blk[:] = rng.standard_normal(blk.size) * DTYPE_TINY[dtype] * rng.integers(1, 64)
            elif kind == 2:    # near the dtype's max
                blk[:] = rng.uniform(-1, 1, blk.size) * top
                blk[rng.integers(blk.size)] = top * rng.choice([-1, 1])
            elif kind == 3:    # one large value, the rest far below it
                blk[:] = rng.standard_normal(blk.size) * 1e-6
                blk[rng.integers(blk.size)] = 1e3
            elif kind == 4:    # small but normal, a different binade per block
                blk[:] = rng.standard_normal(blk.size) * 2.0 ** rng.integers(-30, -8)
            elif kind == 5:    # values on E2M1 / E4M3 ties after scaling
                blk[:] = rng.choice([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6], blk.size) * \
                    rng.choice([-1, 1], blk.size) * 2.0 ** rng.integers(-3, 3)
            elif kind == 6:    # constant block
                blk[:] = rng.standard_normal()
            elif kind in (7, 8):  # few significant bits: reaches E4M3/E2M1 ties after scaling
                blk[:] = rng.integers(-96, 97, blk.size) / 64.0 * 2.0 ** int(rng.integers(-2, 4))
    with np.errstate(over="ignore"):
        x = np.clip(x, -top, top).astype(np.float32).astype(dtype)
    if nonfinite and n:
        k = max(1, n // 97)
        idx = rng.choice(n, size=k, replace=False)
        vals = rng.choice(np.array([np.nan, np.inf, -np.inf], np.float32), size=k)
        flat = x.reshape(-1)
        flat[idx] = vals.astype(dtype)
        if n >= group:  # also one block that is entirely NaN
            j = int(rng.integers(n // group)) * group
            flat[j:j + group] = np.nan
    return x.reshape(shape)


def resolve_global_scale(g, x):
    if g is None:
        return None
    amax = O.global_scale(x)
    with np.errstate(over="ignore"):
        big = np.fmin(amax * np.float32(1000), O.FLT_MAX)
    return {"amax": amax, "half_amax": np.float32(amax * np.float32(0.5)),
            "big": big, "zero": np.float32(0),
            "tiny": np.float32(1e-37), "subnormal": np.float32(1e-40)}[g]


def quantize_both(x, mode, kw, **extra):
    kw = dict(kw, **extra)
    if "global_scale" in kw:
        kw["global_scale"] = resolve_global_scale(kw["global_scale"], x)
    ours = microscale.quantize(x, mode=mode, **kw)
    want = O.quantize(np.asarray(x), mode=mode, **kw)
    return ours, want, kw


def check_roundtrip(x, mode, kw, out_dtypes=("float32", "float16", "bfloat16"), **extra):
    ours, want, kw = quantize_both(x, mode, kw, **extra)
    names = ("w_q", "scales", "biases")
    assert len(ours) == len(want)
    for name, a, b in zip(names, ours, want):
        assert_same_bits(a, b, f"{mode} {kw} {name}")
    dq_kw = {k: v for k, v in kw.items() if k in ("group_size", "bits", "elem", "global_scale",
                                                    "layout")}
    biases = ours[2] if mode == "affine" else None
    for dt in out_dtypes:
        y = microscale.dequantize(ours[0], ours[1], biases, mode=mode, dtype=dt, **dq_kw)
        y_want = O.dequantize(want[0], want[1], want[2] if mode == "affine" else None, mode=mode,
                              dtype=dt, **dq_kw)
        assert_same_bits(y, y_want, f"dequantize {mode} {kw} -> {dt}")
    return ours


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("cfg", ALL_CONFIGS, ids=cfg_id)
def test_quantize_matches_oracle(cfg, dtype, rng):
    mode, kw = cfg
    g = group_of(mode, kw)
    for shape in [(8, 4 * 128), (3, 5, 2 * g), (2 * g,), (2, 1, 3, g), (130, g)]:
        x = make_input(rng, shape, dtype, g)
        check_roundtrip(x, mode, kw)


@pytest.mark.parametrize("nonfinite", ["propagate", "saturate"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("cfg", ALL_CONFIGS, ids=cfg_id)
def test_nonfinite_policies_match_oracle(cfg, dtype, nonfinite, rng):
    mode, kw = cfg
    g = group_of(mode, kw)
    x = make_input(rng, (16, 4 * 128), dtype, g, nonfinite=True)
    check_roundtrip(x, mode, kw, nonfinite=nonfinite)


@pytest.mark.parametrize("cfg", [NV_CONFIGS[0], NV_CONFIGS[1]] + MX_CONFIGS + AFFINE_CONFIGS[3:6],
                         ids=cfg_id)
def test_nonfinite_error_policy(cfg, rng):
    mode, kw = cfg
    g = group_of(mode, kw)
    x = make_input(rng, (4, 2 * 128), np.float32, g)
    # finite input: 'error' gives the same bytes as 'propagate'
    check_roundtrip(x, mode, kw, out_dtypes=("float32",), nonfinite="error")
    x[2, 77] = np.nan
    x[3, 5] = np.inf
    with pytest.raises(ValueError):
        quantize_both(x, mode, kw, nonfinite="error")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("cfg", [NV_CONFIGS[0], NV_CONFIGS[1], MX_CONFIGS[0], MX_CONFIGS[3],
                                 MX_CONFIGS[4], MX_CONFIGS[11], AFFINE_CONFIGS[4],
                                 AFFINE_CONFIGS[10]], ids=cfg_id)
def test_non_contiguous_inputs(cfg, dtype, rng):
    mode, kw = cfg
    g = group_of(mode, kw)
    base = make_input(rng, (6, 2 * g, 40), dtype, g)
    views = [
        base[:, :, 3].copy().T.copy().T,          # plain transposed copy (F order)
        np.swapaxes(base, 1, 2),                  # [6, 40, 2g] with K strided
        base.transpose(2, 0, 1)[::3],             # [14, 6, 2g], sliced leading axis
        np.swapaxes(base, 1, 2)[:, ::-1, :],      # negative stride on a leading axis
        np.swapaxes(base, 1, 2)[1, :, ::-1],      # reversed K axis
        np.broadcast_to(base[0, :, 0], (5, 2 * g)),  # zero stride
    ]
    for v in views:
        assert not v.flags.c_contiguous or v is views[0]
        ours = check_roundtrip(v, mode, kw, out_dtypes=("float32",))
        contiguous = microscale.quantize(np.ascontiguousarray(v), mode=mode,
                                         **{k: resolve_global_scale(val, v) if k == "global_scale" else val
                                            for k, val in kw.items()})
        for a, b in zip(ours, contiguous):
            assert_same_bits(a, b, "non-contiguous vs contiguous")


@pytest.mark.parametrize("cfg", [NV_CONFIGS[0], NV_CONFIGS[1]] + MX_CONFIGS, ids=cfg_id)
def test_swizzled_layout_matches_oracle(cfg, rng):
    mode, kw = cfg
    g = group_of(mode, kw)
    for shape in [(130, 6 * g), (2, 3, 4 * g), (1, g), (257, 9 * g)]:
        x = make_input(rng, shape, np.float32, g)
        ours = check_roundtrip(x, mode, kw, out_dtypes=("float32", "bfloat16"), layout="swizzled")
        R = int(np.prod(shape[:-1]))
        C = shape[-1] // g
        assert ours[1].shape == (-(-R // 128) * 128, -(-C // 4) * 4)
        compact = microscale.quantize(x, mode=mode, **{k: resolve_global_scale(v, x)
                                                       if k == "global_scale" else v
                                                       for k, v in kw.items()})[1]
        assert_same_bits(microscale.swizzle_scales(compact), ours[1], "swizzle_scales")
        assert_same_bits(microscale.unswizzle_scales(ours[1], R, C), compact.reshape(R, C),
                         "unswizzle_scales")


@pytest.mark.parametrize("R,C", [(1, 1), (5, 3), (128, 4), (129, 5), (300, 90), (256, 92), (0, 4),
                                 (7, 0)])
def test_swizzle_scales_matches_oracle(R, C, rng):
    s = rng.integers(0, 256, size=(R, C), dtype=np.uint8)
    sw = microscale.swizzle_scales(s)
    assert_same_bits(sw, O.swizzle(s), "swizzle")
    assert_same_bits(sw, O.swizzle_by_permute(s), "swizzle (permute description)")
    assert_same_bits(microscale.unswizzle_scales(sw, R, C), s, "unswizzle")
    # padding is zero-filled
    mask = np.ones(sw.size, bool)
    if R and C:
        r, c = np.meshgrid(np.arange(R), np.arange(C), indexing="ij")
        mask[O.swizzled_offset(r, c, sw.shape[1]).reshape(-1)] = False
    assert not sw.reshape(-1)[mask].any()
    # rank 3 input: leading axes flattened into rows
    if R % 1 == 0 and R >= 2:
        s3 = s[: (R // 2) * 2].reshape(2, R // 2, C)
        assert_same_bits(microscale.swizzle_scales(s3), O.swizzle(s3), "swizzle rank 3")


@pytest.mark.parametrize("mode,kw", [("nvfp4", {}), ("nvfp4", {"global_scale": 3.5}),
                                     ("nvfp4", {"global_scale": 0.0}),
                                     ("mxfp4", {}), ("mxfp8", {}), ("mxfp8", {"elem": "e5m2"})])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dequantize_arbitrary_bytes(mode, kw, dtype, rng):
    """Every code, NaN/Inf codes included, decodes as the oracle does."""
    g, b = O.MODE_DEFAULTS[mode]
    K = 8 * g
    packed = rng.integers(0, 256, size=(33, K * b // 8), dtype=np.uint8)
    scales = rng.integers(0, 256, size=(33, K // g), dtype=np.uint8)
    scales[0, :] = [0, 0xFF, 0x7F, 0xFE, 0x80, 1, 0x7E, 0xFF][: K // g]
    y = microscale.dequantize(packed, scales, mode=mode, dtype=dtype, **kw)
    want = O.dequantize(packed, scales, mode=mode, dtype=dtype, **kw)
    assert_same_bits(y, want, f"dequantize {mode} {kw}")


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_affine_dequantize_arbitrary_parts(bits, dtype, rng):
    g = 32
    K = 4 * g
    packed = rng.integers(0, 256, size=(9, K * bits // 8), dtype=np.uint8)
    scales = (rng.standard_normal((9, K // g)) * 0.1).astype(np.float32).astype(dtype)
    biases = rng.standard_normal((9, K // g)).astype(np.float32).astype(dtype)
    for out in ("float32", "float16", "bfloat16"):
        y = microscale.dequantize(packed, scales, biases, mode="affine", group_size=g, bits=bits,
                                  dtype=out)
        want = O.dequantize(packed, scales, biases, mode="affine", group_size=g, bits=bits,
                            dtype=out)
        assert_same_bits(y, want, f"affine dequantize bits={bits} {dtype}->{out}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_global_scale_matches_oracle(dtype, rng):
    x = make_input(rng, (7, 96), dtype, 32, nonfinite=True)
    g = microscale.global_scale(x)
    assert isinstance(g, np.float32)
    assert g == O.global_scale(x)
    assert microscale.global_scale(np.full((3, 4), np.nan, dtype)) == 0
    assert microscale.global_scale(np.array([-np.inf, -3.0, 2.0], dtype)) == 3.0
    assert microscale.global_scale(np.zeros((0, 16), dtype)) == 0
    assert microscale.global_scale(np.swapaxes(x, 0, 1)) == g


def test_random_fuzz_against_oracle():
    """Many small random configurations in one loop."""
    rng = np.random.default_rng(12345)
    for _ in range(150):
        mode, kw = ALL_CONFIGS[rng.integers(len(ALL_CONFIGS))]
        dtype = FLOAT_DTYPES[rng.integers(3)]
        g = group_of(mode, kw)
        rank = int(rng.integers(1, 5))
        shape = tuple(int(v) for v in rng.integers(1, 4, size=rank - 1)) + (g * int(rng.integers(1, 5)),)
        nonfinite = ["propagate", "saturate"][rng.integers(2)]
        x = make_input(rng, shape, dtype, g, nonfinite=bool(rng.integers(2)))
        check_roundtrip(x, mode, kw, out_dtypes=(["float32", "float16", "bfloat16"][rng.integers(3)],),
                        nonfinite=nonfinite)
