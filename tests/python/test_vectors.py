"""Hand-computed vectors from FORMATS.md (sections 2.1-2.4, 3) checked against microscale."""

import ml_dtypes
import numpy as np
import pytest

import microscale
import spec_oracle as O

f32 = np.float32


def block(values, n, dtype=np.float32):
    x = np.zeros((1, n), dtype=np.float32)
    x[0, : len(values)] = values
    return x.astype(dtype)


def codes_fp4(packed):
    return O.unpack_fp4(packed)


# ---------------------------------------------------------------------------------------------
# 2.1 nvfp4: TE order vectors

def test_te_scale_vector():
    # amax 18.25, bamax 13.6875: exact bamax*448/amax = 336 is an E4M3 tie (320|352);
    # fl(bamax*fl(S_enc*C6)) = 336.00003 -> 0x7B (352), where fl(fl(bamax/6)*S_enc) = 336 -> 0x7A.
    s_enc = f32(2688) / f32(18.25)
    assert f32(13.6875) * (s_enc * O.C6) == np.nextafter(f32(336), f32(400))
    assert (f32(13.6875) / f32(6)) * s_enc == f32(336)
    _, scales = microscale.quantize(block([13.6875], 16), mode="nvfp4", global_scale=18.25)
    assert scales.tolist() == [[0x7B]]
    assert microscale.decode(scales, "e4m3")[0, 0] == 352


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_te_element_vector(dtype):
    # amax 11.125, bamax 2.390625 -> s = 0x6C (96); x = 0.6953125: exact x*enc = 1.75 (tie).
    # TE form enc = fl(1/fl(sf*S_dec)) = 2.5168538, x*enc = 1.7499999 -> idx 3 (1.5); the S_enc/sf
    # form gives 1.7500001 -> idx 4 (2.0).
    x = block([2.390625, 0.6953125], 16, dtype)
    packed, scales = microscale.quantize(x, mode="nvfp4", global_scale=11.125)
    assert scales.tolist() == [[0x6C]]
    codes = codes_fp4(packed)[0]
    assert codes[1] == 3
    s_enc = f32(2688) / f32(11.125)
    enc = f32(1) / (f32(96) * (f32(1) / s_enc))
    assert abs(float(enc) - 2.5168538) < 1e-6
    assert f32(0.6953125) * enc < f32(1.75) < f32(0.6953125) * (s_enc / f32(96))


def test_order_sensitive_cases_found_by_search():
    """bf16 triples (amax, bamax, x) where TE's operation order and the algebraically equal
    alternatives give different codes: microscale must follow TE's order (FORMATS.md 2.1)."""
    rng = np.random.default_rng(2639)
    n = 400_000

    def bf(a):
        return a.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)

    amax = bf(rng.uniform(1, 64, n))
    bamax = bf(amax * rng.uniform(0, 1, n).astype(np.float32))
    x = bf(bamax * rng.uniform(0, 1, n).astype(np.float32))
    with np.errstate(all="ignore"):
        s_enc = f32(2688) / amax
        s_dec = f32(1) / s_enc
        s_te = O.rn_sat_code(bamax * (s_enc * O.C6), "e4m3")
        s_alt = O.rn_sat_code((bamax / f32(6)) * s_enc, "e4m3")
        sf = O.decode_code(s_te, "e4m3")
        q_te = O.rn_sat_code(x * (f32(1) / (sf * s_dec)), "e2m1")
        q_alt = O.rn_sat_code(x * (s_enc / sf), "e2m1")
    picks = np.flatnonzero((s_te != s_alt) | (q_te != q_alt))
    assert picks.size > 50
    for i in picks[:300]:
        xb = block([bamax[i], x[i]], 16, ml_dtypes.bfloat16)
        packed, scales = microscale.quantize(xb, mode="nvfp4", global_scale=float(amax[i]))
        assert scales[0, 0] == s_te[i], (amax[i], bamax[i])
        assert codes_fp4(packed)[0, 1] == q_te[i], (amax[i], bamax[i], x[i])


def test_nvfp4_two_level_exact_decode():
    # two-level: s = rn_sat_E4M3(fl(bamax*C6)), y = val(q)*sf exact in f32.
    x = block([6.0, -3.0, 1.5, 0.5, -0.0], 16)
    packed, scales = microscale.quantize(x, mode="nvfp4")
    assert scales.tolist() == [[0x38]]  # 1.0
    assert codes_fp4(packed)[0, :5].tolist() == [0x7, 0xD, 0x3, 0x1, 0x8]
    y = microscale.dequantize(packed, scales, mode="nvfp4")
    assert np.array_equal(y, x) and np.signbit(y[0, 4])


def test_zero_scale_corner():
    # FORMATS.md 2.1: s = 0 when fl(bamax*fl(S_enc*C6)) <= 2^-10; then enc = FLT_MAX and the codes
    # are rn_sat_E2M1(fl(x*FLT_MAX)): +-0 stays +-0, |x| > ~1.47e-38 gives +-6, smaller subnormals
    # land on intermediate codes; all decode to +-0.
    amax = 1.0  # S_enc = 2688, S_enc*C6 = 448: s = 0 for bamax <= 2^-10/448
    vals = np.array([1e-6, -1e-6, 0.0, -0.0, 1e-39, -1e-40, 1.2e-38, 1.47e-38, 1.48e-38, 2e-39,
                     4e-39, -5e-39, 8e-39, 2e-6, -2.1e-6, 1e-45], dtype=np.float32)
    assert f32(2.1e-6) * (f32(2688) * O.C6) <= f32(2.0 ** -10)
    packed, scales = microscale.quantize(vals[None, :], mode="nvfp4", global_scale=amax)
    assert scales.tolist() == [[0]]
    with np.errstate(over="ignore"):
        prod = vals * O.FLT_MAX
    want = []
    for p in prod.astype(np.float64):  # E2M1 table of section 1, sign copied
        a = abs(p)
        idx = (0 if a <= 0.25 else 1 if a < 0.75 else 2 if a <= 1.25 else 3 if a < 1.75 else
               4 if a <= 2.5 else 5 if a < 3.5 else 6 if a <= 5 else 7)
        want.append(idx | (8 if np.signbit(p) else 0))
    got = codes_fp4(packed)[0].tolist()
    assert got == want
    assert got[:4] == [0x7, 0xF, 0x0, 0x8]
    assert 0 < len({c & 7 for c in want}) - 2  # intermediate codes reached
    y = microscale.dequantize(packed, scales, mode="nvfp4", global_scale=amax)
    assert not y.any() and np.array_equal(np.signbit(y[0]), np.signbit(vals))


def test_metal_regression_rows_keep_their_own_scales():
    # MLX issue #3557: alternating rows of 6*2^-9 and 6.0 must keep independent block scales.
    tiny = f32(6 * 2.0 ** -9)
    x = np.empty((64, 256), np.float32)
    x[0::2] = tiny
    x[1::2] = 6.0
    packed, scales = microscale.quantize(x, mode="nvfp4")
    assert (scales[0::2] == 0x01).all()   # 2^-9, the smallest E4M3 subnormal
    assert (scales[1::2] == 0x38).all()   # 1.0
    assert (packed == 0x77).all()
    assert np.array_equal(microscale.dequantize(packed, scales, mode="nvfp4"), x)
    # three-level with amax 6: S_enc = 448; tiny rows: 6*2^-9*448/6 = 0.875 -> 0x36
    packed, scales = microscale.quantize(x, mode="nvfp4", global_scale=6.0)
    assert (scales[0::2] == 0x36).all() and (scales[1::2] == 0x7E).all()
    y = microscale.dequantize(packed, scales, mode="nvfp4", global_scale=6.0)
    assert np.allclose(y, x, rtol=1e-6, atol=0)
    for mode in ("mxfp4", "mxfp8"):
        packed, scales = microscale.quantize(x, mode=mode)
        assert (scales[0::2] == scales[0, 0]).all() and (scales[1::2] == scales[1, 0]).all()
        assert scales[0, 0] != scales[1, 0]
        assert np.array_equal(microscale.dequantize(packed, scales, mode=mode), x)


# ---------------------------------------------------------------------------------------------
# 2.2 scale rules

MXFP4_TABLE = {  # bamax: ceil, floor, even, nearest
    4: (127, 127, 127, 126), 6: (127, 127, 127, 127), 6.5: (128, 127, 127, 127),
    7: (128, 127, 128, 127), 8: (128, 128, 128, 127), 12.5: (129, 128, 128, 128)}
MXFP8_TABLE = {
    240: (127, 126, 126, 126), 300: (127, 127, 127, 126), 448: (127, 127, 127, 127),
    449: (128, 127, 127, 127), 500: (128, 127, 128, 127)}
RULES = ("ceil", "floor", "even", "nearest")


@pytest.mark.parametrize("mode,table", [("mxfp4", MXFP4_TABLE), ("mxfp8", MXFP8_TABLE)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_scale_rule_table(mode, table, dtype):
    for bamax, want in table.items():
        if float(np.float32(bamax).astype(dtype)) != bamax:
            continue  # not representable in this dtype (449 in bf16)
        for rule, w in zip(RULES, want):
            _, s = microscale.quantize(block([bamax, -1.0], 32, dtype), mode=mode, scale_rule=rule)
            assert s[0, 0] == w, (mode, bamax, rule)
            _, s = microscale.quantize(block([1.0, -bamax], 32, dtype), mode=mode, scale_rule=rule)
            assert s[0, 0] == w, (mode, -bamax, rule)


def test_scale_rule_table_consequences():
    # nearest with bamax = 4 stores 8 -> 6, dequantizing to 3; floor with 7 stores 6; ceil never clips.
    q = microscale.quantize(block([4.0], 32), mode="mxfp4", scale_rule="nearest")
    assert microscale.dequantize(*q, mode="mxfp4")[0, 0] == 3.0
    q = microscale.quantize(block([7.0], 32), mode="mxfp4", scale_rule="floor")
    assert microscale.dequantize(*q, mode="mxfp4")[0, 0] == 6.0
    for v in (4, 6, 6.5, 7, 8, 12.5):
        q = microscale.quantize(block([v], 32), mode="mxfp4", scale_rule="ceil")
        assert microscale.dequantize(*q, mode="mxfp4")[0, 0] >= v * 0.75  # no clipping to 6*2^k < v*...
        assert microscale.dequantize(*q, mode="mxfp4")[0, 0] * 1.0 <= v * 1.34
    # 'nearest' clipping of a constant block (PR #4353): 0.3 in mxfp8 decodes to 0.21875
    q = microscale.quantize(np.full((1, 32), 0.3, np.float32), mode="mxfp8", scale_rule="nearest")
    assert microscale.dequantize(*q, mode="mxfp8")[0, 0] == 0.21875


@pytest.mark.parametrize("mode,elem,emax_val", [("mxfp4", "e4m3", 6.0), ("mxfp8", "e4m3", 448.0),
                                                ("mxfp8", "e5m2", 57344.0)])
def test_ceil_powers_of_two_exact(mode, elem, emax_val):
    # Since fl(max_elem*C_max) == 1, amax = max_elem*2^k gives exactly e = 127 + k (clamped).
    ks = np.arange(-150, 120)
    with np.errstate(over="ignore"):
        vals = (emax_val * np.exp2(ks.astype(np.float64))).astype(np.float32)
    keep = (vals > 0) & np.isfinite(vals) & (vals.astype(np.float64) == emax_val * np.exp2(ks))
    for k, v in zip(ks[keep], vals[keep]):
        _, s = microscale.quantize(block([v], 32), mode=mode, elem=elem)
        assert s[0, 0] == min(max(127 + k, 0), 254) or (127 + k < 0 and s[0, 0] == 0), (k, s)


def test_e8m0_decode_contract_in_dequantize():
    # 0x00 decodes to 2^-127 (not 0), 0xFF to NaN; scale products formed in f32 and rounded once
    # to the output type (2^(e-127) itself underflows f16 for e < 103).
    packed = np.full((1, 32), 0x7E, np.uint8)  # E4M3 448
    for e, dt in [(0, "float32"), (100, "float16"), (255, "float32"), (1, "bfloat16")]:
        y = microscale.dequantize(packed, np.array([[e]], np.uint8), mode="mxfp8", dtype=dt)
        want = np.float64(448) * 2.0 ** (e - 127) if e != 255 else np.nan
        w = O.rn(np.array([want], np.float32), dt)[0]
        assert y.dtype == O.dtype_of(dt)
        if e == 255:
            assert np.isnan(y.astype(np.float32)).all()
        else:
            assert (y == w).all() and w != 0, (e, dt, y[0, 0], w)


# ---------------------------------------------------------------------------------------------
# 2.3 affine

def test_affine_example():
    w = ((np.arange(64) - 20) / 10).astype(np.float32)[None, :]
    packed, scales, biases = microscale.quantize(w, mode="affine", group_size=64, bits=4)
    assert scales[0, 0] == f32(-0.43) and biases[0, 0] == f32(4.3)
    # hand: wmax = 4.3, wmin = -2: scale = -(6.3/15) = -0.42, q0 = rint(4.3/-0.42) = -10,
    # scale = 4.3/-10, bias = 4.3; element 0 (-2.0): rint((-2 - 4.3)/-0.43) = rint(14.65) = 15
    codes = O.unpack_bits(packed, 4)[0]
    assert codes[0] == 15 and codes[63] == 0 and codes[20] == 10
    y = microscale.dequantize(packed, scales, biases, mode="affine", group_size=64, bits=4)
    assert y[0, 63] == f32(4.3) and y[0, 0] == (f32(15) * f32(-0.43)) + f32(4.3)


def test_affine_zero_group():
    packed, scales, biases = microscale.quantize(np.zeros((2, 64), np.float32), mode="affine")
    assert (scales.view(np.uint32) == 0xB3D6BF95).all()  # -1e-7f
    assert (biases == 0).all() and not packed.any()


def test_affine_negative_edge():
    # |wmin| > |wmax|: positive scale, code 0 maps exactly to wmin
    w = np.linspace(-5, 1, 32, dtype=np.float32)[None, :]
    packed, scales, biases = microscale.quantize(w, mode="affine", group_size=32, bits=3)
    assert scales[0, 0] > 0 and biases[0, 0] == f32(-5)
    assert O.unpack_bits(packed, 3)[0, 0] == 0
    y = microscale.dequantize(packed, scales, biases, mode="affine", group_size=32, bits=3)
    assert y[0, 0] == -5


# ---------------------------------------------------------------------------------------------
# 2.4 non-finite policies (hand cases; the random ones are in test_oracle.py)

def test_propagate_hand():
    x = np.ones((2, 32), np.float32)
    x[0, 3] = np.nan
    packed, scales = microscale.quantize(x, mode="mxfp8")
    # row 1: bamax 1 -> ceil(log2(1/448)) = -8 -> 119
    assert scales[:, 0].tolist() == [0xFF, 119] and not packed[0].any()
    y = microscale.dequantize(packed, scales, mode="mxfp8")
    assert np.isnan(y[0]).all() and (y[1] == 1).all()
    packed, scales = microscale.quantize(x[:, :16], mode="nvfp4")
    assert scales[:, 0].tolist() == [0x7F, 0x23]  # rn_E4M3(C6) = 0.171875
    packed, scales, biases = microscale.quantize(x, mode="affine", group_size=32)
    assert np.isnan(scales[0, 0]) and np.isnan(biases[0, 0]) and not packed[0].any()


def test_saturate_hand():
    x = np.full((3, 16), 0.5, np.float32)
    x[0, 0] = np.inf
    x[1, :] = np.nan
    x[2, 5] = np.nan
    packed, scales = microscale.quantize(x, mode="nvfp4", nonfinite="saturate")
    c = codes_fp4(packed)
    # Inf block: scale 448, Inf -> +6, finite elements flush; all-NaN block: scale 0, codes +6
    # row 2: bamax 0.5 (NaN skipped): rn_E4M3(0.5*C6 = 0.0833) = 0.0859375 = 0x1B; 0.5/0.0859 -> 6
    assert scales[:, 0].tolist() == [0x7E, 0x00, 0x1B] and c[0, 0] == 7 and (c[1] == 7).all()
    assert c[2, 5] == 7 and c[2, 0] == 7 and c[0, 1] == 0
    y = microscale.dequantize(packed, scales, mode="nvfp4")
    assert (y[1] == 0).all()
    x = np.ones((1, 32), np.float32)
    x[0, 0] = -np.inf
    packed, scales = microscale.quantize(x, mode="mxfp8", nonfinite="saturate")
    assert scales[0, 0] == 0xFE and packed[0, 0] == 0xFE


def test_error_policy_message():
    x = np.zeros((2, 3, 32), np.float32)
    x[1, 2, 7] = -np.inf
    x[1, 2, 9] = np.nan
    with pytest.raises(ValueError) as e:
        microscale.quantize(x, mode="mxfp4", nonfinite="error")
    msg = str(e.value)
    flat = 1 * 96 + 2 * 32 + 7
    assert str(flat) in msg and "-Inf" in msg
    assert "1, 2, 7" in msg.replace("[", "(").replace("]", ")")
    x[1, 2, 7] = 0
    with pytest.raises(ValueError, match="NaN"):
        microscale.quantize(x, mode="affine", group_size=32, nonfinite="error")
    x[:] = 0
    x[0, 0, 0] = np.inf
    with pytest.raises(ValueError, match=r"\+Inf"):
        microscale.quantize(x.astype(np.float16), mode="nvfp4", nonfinite="error")


# ---------------------------------------------------------------------------------------------
# 3 packing

def test_fp4_packing_examples():
    packed, scales = microscale.quantize(block([1.0, -6.0], 32), mode="mxfp4")
    assert scales[0, 0] == 127 and packed[0, 0] == 0xF2
    packed, _ = microscale.quantize(block([0.0, 0.5, 4.0, -0.0, 6.0], 32), mode="mxfp4")
    assert packed[0, :2].tolist() == [0x10, 0x86]
    packed, _ = microscale.quantize(block([1.0, -6.0], 16), mode="nvfp4")
    assert packed[0, 0] == 0xF2


MLX_VECTOR = [6, .25, .75, 1.25, 1.75, 2.5, 3.5, 5, -.25, -.75, -1.25, -1.75, -2.5, -3.5, -5, -6,
              0, -0., .2, .3, 5.1, 7, -7, 6, .5, 1, 1.5, 2, 3, 4, .1, -.1]


@pytest.mark.parametrize("rule,scale,words", [
    ("nearest", 0x7F, ["66442207", "feeccaa8", "7f771080", "80654321"]),
    ("ceil", 0x80, ["44221105", "dccaa998", "5e650080", "80432210"]),
])
def test_mlx_test_vector_words(rule, scale, words):
    x = np.array(MLX_VECTOR, np.float32)[None, :]
    packed, scales = microscale.quantize(x, mode="mxfp4", scale_rule=rule)
    assert scales.tolist() == [[scale]]
    assert [format(w, "08x") for w in packed.view("<u4")[0]] == words
    # uint32 (MLX w_q) input to dequantize reads the same bytes
    y1 = microscale.dequantize(packed, scales, mode="mxfp4")
    y2 = microscale.dequantize(packed.view("<u4"), scales, mode="mxfp4")
    assert np.array_equal(y1, y2)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_affine_bit_stream(bits):
    # element i at stream bits [i*b, (i+1)*b), stream bit t = bit t%8 of byte t/8.
    n = 2 ** bits - 1
    w = np.arange(32, dtype=np.float32)[None, :] % (n + 1)
    w[0, 0], w[0, 1] = n, 0  # codes are exact: scale -1, bias n for bits < 5
    packed, scales, biases = microscale.quantize(w, mode="affine", group_size=32, bits=bits)
    codes = O.unpack_bits(packed, bits)[0]
    stream = np.unpackbits(packed[0], bitorder="little")
    for i in range(32):
        v = int(sum(int(stream[i * bits + j]) << j for j in range(bits)))
        assert v == codes[i]
    y = microscale.dequantize(packed, scales, biases, mode="affine", group_size=32, bits=bits)
    assert np.allclose(y, w, atol=float(abs(scales[0, 0])) / 2 + 1e-6)
