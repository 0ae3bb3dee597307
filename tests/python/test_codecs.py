"""Element codecs (microscale.encode / decode) against ml_dtypes / numpy and FORMATS.md section 1.

Where microscale's documented rule (include/microscale/codecs.hpp, FORMATS.md section 1) differs
from ml_dtypes, the difference is stated next to its mask; those inputs are checked against OUR
rule explicitly and ml_dtypes is compared on all other inputs.
"""

import ml_dtypes
import numpy as np
import pytest

import microscale
import spec_oracle as O

ML = {
    "e2m1": np.dtype(ml_dtypes.float4_e2m1fn),
    "e4m3": np.dtype(ml_dtypes.float8_e4m3fn),
    "e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "e8m0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f16": np.dtype(np.float16),
}
FORMATS = list(ML)
F32_MIN_NORMAL = np.float32(2.0 ** -126)


def all_f16_as_f32():
    return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


def all_bf16_as_f32():
    return (np.arange(65536, dtype=np.uint32) << 16).view(np.float32)


def ref_encode(x, fmt):
    """ml_dtypes / numpy conversion of float32 x, as the raw code (uint8, or uint16 bits)."""
    with np.errstate(all="ignore"):
        y = x.astype(ML[fmt])
    return y.view(np.uint16 if fmt in ("bf16", "f16") else np.uint8)


def check_encoder(x, fmt):
    """Compare microscale.encode(x, fmt) with ml_dtypes on x, our own rule where they differ.
    Returns the number of inputs checked against our rule instead of ml_dtypes."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    ours = microscale.encode(x, fmt)
    ref = ref_encode(x, fmt)
    a = np.abs(x)
    nan = np.isnan(x)
    neg = np.signbit(x)
    with np.errstate(all="ignore"):
        if fmt == "e2m1":
            # ml_dtypes turns NaN into a (signed) zero; microscale's E2M1 has no NaN and encodes
            # NaN as 0x7 (+6) like cvt.rn.satfinite.e2m1x2. +-Inf and overflow saturate in both.
            ours_rule = nan
            assert np.all(ours[nan] == 0x7)
        elif fmt == "e4m3":
            # ml_dtypes' float8_e4m3fn does not saturate: |x| > 464 (past the 448|480 midpoint) and
            # +-Inf become NaN there; microscale saturates to +-448 (0x7E|sign). ml_dtypes keeps
            # NaN's sign (0xFF); microscale writes 0x7F for every NaN (FORMATS.md section 1).
            sat = ~nan & (a > 464)
            ours_rule = nan | sat
            assert np.all((ref[sat] & 0x7F) == 0x7F)
            assert np.all(ours[sat] == np.where(neg[sat], 0xFE, 0x7E))
            assert np.all(ours[nan] == 0x7F)
        elif fmt == "e5m2":
            # ml_dtypes' float8_e5m2 is IEEE-like: |x| >= 61440 (the 57344|65536 midpoint rounds
            # to even = Inf) and +-Inf give +-Inf; microscale saturates to +-57344 (0x7B|sign).
            # NaN: ml_dtypes 0x7E|sign, microscale 0x7F.
            sat = ~nan & (a >= 61440)
            ours_rule = nan | sat
            assert np.all((ref[sat] & 0x7F) == 0x7C)
            assert np.all(ours[sat] == np.where(neg[sat], 0xFB, 0x7B))
            assert np.all(ours[nan] == 0x7F)
        elif fmt == "e8m0":
            # Both give 0xFF for zero, negative, NaN and Inf. Differences: ml_dtypes gives 0xFF
            # (NaN) from 1.5*2^127 up where microscale saturates to 0xFE; and ml_dtypes rounds
            # float32 subnormal inputs differently (e.g. 1.4*2^-127 -> 2^-126) where microscale
            # keeps its rule (nearest power of two, 1.5*2^k rounds up, below 2^-127 -> 0x00).
            finite_pos = np.isfinite(x) & (x > 0)
            sat = finite_pos & (a >= np.float32(1.5 * 2.0 ** 127))
            sub = finite_pos & (a < F32_MIN_NORMAL)
            ours_rule = sat | sub
            assert np.all(ref[sat] == 0xFF)
            assert np.all(ours[sat] == 0xFE)
            assert np.array_equal(ours[sub], O.encode_e8m0_standalone(x[sub]))
        else:
            # bf16 / f16: IEEE RNE with overflow to Inf, as ml_dtypes and numpy. NaN payloads
            # are not part of the contract ("NaN -> quiet NaN"): numpy may even keep a signaling
            # f16 NaN (0x7C01). Check that ours is a quiet NaN.
            ours_rule = nan
            qbit = 0x0040 if fmt == "bf16" else 0x0200
            expo = 0x7F80 if fmt == "bf16" else 0x7C00
            on = ours[nan]
            assert np.all((on & expo) == expo) and np.all(on & qbit)
    other = ~ours_rule
    if not np.array_equal(ours[other], ref[other]):
        bad = np.flatnonzero(other & (ours != ref))
        raise AssertionError(
            f"{fmt}: {bad.size} mismatches vs ml_dtypes, e.g. x={x[bad[:5]].tolist()} "
            f"bits={[hex(v) for v in x[bad[:5]].view(np.uint32)]} ours={ours[bad[:5]].tolist()} "
            f"ref={ref[bad[:5]].tolist()}")
    return int(ours_rule.sum())


def check_oracle_rule(x, fmt):
    """E2M1/E4M3/E5M2 against the independent table search of spec_oracle (covers NaN too)."""
    if fmt in ("e2m1", "e4m3", "e5m2"):
        ours = microscale.encode(np.ascontiguousarray(x, dtype=np.float32), fmt)
        want = O.rn_sat_code(x, fmt)
        bad = np.flatnonzero(ours != want)
        assert bad.size == 0, (fmt, x[bad[:5]].tolist(), ours[bad[:5]].tolist(), want[bad[:5]].tolist())
    elif fmt == "e8m0":
        assert np.array_equal(microscale.encode(x, fmt), O.encode_e8m0_standalone(x))


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_all_f16_inputs(fmt):
    x = all_f16_as_f32()
    check_encoder(x, fmt)
    check_oracle_rule(x, fmt)
    if fmt == "f16":  # f16 -> f32 -> f16 is the identity (NaN: quiet)
        ours = microscale.encode(x, "f16")
        src = np.arange(65536, dtype=np.uint32).astype(np.uint16)
        fin = ~np.isnan(x)
        assert np.array_equal(ours[fin], src[fin])


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_all_bf16_inputs(fmt):
    x = all_bf16_as_f32()
    check_encoder(x, fmt)
    check_oracle_rule(x, fmt)
    if fmt == "bf16":
        ours = microscale.encode(x, "bf16")
        src = np.arange(65536, dtype=np.uint32).astype(np.uint16)
        fin = ~np.isnan(x)
        assert np.array_equal(ours[fin], src[fin])


def _grid(fmt):
    """All finite non-negative values of a format, ascending (float64)."""
    if fmt == "e8m0":
        return np.exp2(np.arange(-127, 128, dtype=np.float64))
    if fmt == "bf16":
        return np.arange(0, 0x7F81, dtype=np.uint32).astype(np.uint16).view(ML[fmt]).astype(np.float64)
    if fmt == "f16":
        return np.arange(0, 0x7C01, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)
    return {"e2m1": O.E2M1_VALUES, "e4m3": O.E4M3_VALUES, "e5m2": O.E5M2_VALUES}[fmt]


def boundary_values():
    """Every grid value and every midpoint (tie) of every format, their float32 neighbours, both
    signs, plus the FORMATS.md section 1 table ends and specials."""
    vals = []
    for fmt in FORMATS:
        g = _grid(fmt)
        if fmt in ("bf16", "f16"):
            g = g[:: 97]  # a sample of the 65k grid: all of it is covered by the exhaustive tests
        mids = (g[:-1] + g[1:]) / 2 if fmt != "e8m0" else 1.5 * g
        vals += [g, mids]
    table_ends = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6, 448, 464, 480, 2.0 ** -10, 2.0 ** -9,
                  2.0 ** -6, 57344, 61440, 65536, 2.0 ** -16, 2.0 ** -17, 2.0 ** -14, 65504, 65520,
                  2.0 ** -24, 2.0 ** -25, 2.0 ** -133, 2.0 ** -134, 2.0 ** 127, 1.5 * 2.0 ** 127,
                  2.0 ** -127, 1.5 * 2.0 ** -127, 2.0 ** -128, 2.0 ** -149, 1.0, 0.1]
    v = np.concatenate(vals + [np.array(table_ends, dtype=np.float64)])
    v = v[np.abs(v) <= np.float64(O.FLT_MAX)]
    v32 = v.astype(np.float32)
    near = [v32, np.nextafter(v32, np.float32(np.inf)), np.nextafter(v32, np.float32(0))]
    v32 = np.concatenate(near)
    specials = np.array([np.inf, np.nan, O.FLT_MAX, 0.0], dtype=np.float32)
    specials = np.concatenate([specials, O.f32_from_bits(np.array([0x7FC00001, 0x7F800001, 1], np.uint32))])
    allv = np.concatenate([v32, specials])
    allv = np.concatenate([allv, -allv])
    return np.unique(allv.view(np.uint32)).view(np.float32)


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_boundaries_and_ties(fmt):
    x = boundary_values()
    check_encoder(x, fmt)
    check_oracle_rule(x, fmt)


def test_encode_e2m1_tie_table():
    # FORMATS.md section 1: closed ends are ties and go to the even index.
    x = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
    want_val = [0, 1, 1, 2, 2, 4, 4]
    got = microscale.decode(microscale.encode(x, "e2m1"), "e2m1")
    assert got.tolist() == want_val
    assert microscale.decode(microscale.encode(-x, "e2m1"), "e2m1").tolist() == [-v for v in want_val]
    # sign copied: -0.0 and -0.1 encode as 0x8; NaN 0x7, +-Inf +-6
    x = np.array([-0.0, -0.1, 0.0, np.nan, np.inf, -np.inf, 1e30], np.float32)
    assert microscale.encode(x, "e2m1").tolist() == [0x8, 0x8, 0x0, 0x7, 0x7, 0xF, 0x7]


def test_encode_e4m3_e5m2_e8m0_specials():
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 2.0 ** -10, -2.0 ** -10, 449, 464, 465, 1e30],
                 np.float32)
    assert microscale.encode(x, "e4m3").tolist() == [0x7F, 0x7F, 0x7E, 0xFE, 0x00, 0x80, 0x7E, 0x7E,
                                                     0x7E, 0x7E]
    x = np.array([np.nan, np.inf, -np.inf, 61439, 61440, -1e30], np.float32)
    assert microscale.encode(x, "e5m2").tolist() == [0x7F, 0x7B, 0xFB, 0x7B, 0x7B, 0xFB]
    x = np.array([0.0, -1.0, np.nan, np.inf, 1.0, 0.75, 1.5, 2.0 ** -130, 2.0 ** 127 * 1.5, 3.0],
                 np.float32)
    assert microscale.encode(x, "e8m0").tolist() == [0xFF, 0xFF, 0xFF, 0xFF, 127, 127, 128, 0, 0xFE, 129]


def chunks_of_random_bits(total, chunk, seed):
    rng = np.random.default_rng(seed)
    for _ in range(total // chunk):
        yield rng.integers(0, 2**32, size=chunk, dtype=np.uint32).view(np.float32)


def test_encode_random_bit_patterns():
    """>= 10 million random float32 bit patterns through every encoder (2M per chunk)."""
    n = 0
    for x in chunks_of_random_bits(10_000_000, 2_000_000, seed=20261122):
        for fmt in FORMATS:
            check_encoder(x, fmt)
        n += x.size
    assert n >= 10_000_000


def test_encode_random_in_range():
    """Random values where the small formats are not all saturated or zero."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(1_000_000) * np.exp2(rng.integers(-20, 20, 1_000_000))).astype(np.float32)
    for fmt in FORMATS:
        check_encoder(x, fmt)
        check_oracle_rule(x, fmt)


@pytest.mark.parametrize("fmt", ["e2m1", "e4m3", "e5m2", "e8m0"])
def test_decode_all_codes(fmt):
    n = 16 if fmt == "e2m1" else 256
    codes = np.arange(n, dtype=np.uint8)
    ours = microscale.decode(codes, fmt)
    assert ours.dtype == np.float32 and ours.shape == (n,)
    ref = codes.view(ML[fmt]).astype(np.float32)
    # FORMATS.md: E4M3 0x7F/0xFF, E5M2 0x7D-0x7F/0xFD-0xFF and E8M0 0xFF decode to NaN, E8M0 0x00
    # to 2^-127 - all as ml_dtypes. Compare NaN by position, the rest bitwise.
    assert np.array_equal(np.isnan(ours), np.isnan(ref))
    fin = ~np.isnan(ref)
    assert same_bits_arr(ours[fin], ref[fin])
    if fmt == "e8m0":
        assert ours[0] == np.float32(2.0 ** -127) and np.isnan(ours[255])
        assert np.array_equal(ours, O.decode_e8m0(codes), equal_nan=True)
    else:
        assert np.array_equal(ours, O.decode_code(codes, fmt), equal_nan=True)
    # ml_dtypes arrays are read by their bytes
    assert np.array_equal(microscale.decode(codes.view(ML[fmt]), fmt), ours, equal_nan=True)


def same_bits_arr(a, b):
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("fmt", ["bf16", "f16"])
def test_decode_all_16bit(fmt):
    codes = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    ours = microscale.decode(codes, fmt)
    ref = codes.view(ML[fmt]).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(ours), nan)
    assert same_bits_arr(ours[~nan], ref[~nan])
    # round trip through our encoder
    assert np.array_equal(microscale.encode(ours, fmt)[~nan], codes[~nan])


def test_decode_rejects_wide_e2m1_codes():
    with pytest.raises(ValueError):
        microscale.decode(np.array([0x10], np.uint8), "e2m1")


def test_codec_shapes_and_types():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)[:, ::2, ::-1]  # non-contiguous
    for fmt in FORMATS:
        c = microscale.encode(x, fmt)
        assert c.shape == x.shape
        assert c.dtype == (np.uint16 if fmt in ("bf16", "f16") else np.uint8)
        assert np.array_equal(c, ref_encode(np.ascontiguousarray(x), fmt)) or fmt == "e8m0"
        assert microscale.decode(c, fmt).shape == x.shape
    # 0-d and empty
    assert microscale.encode(np.float32(1.5), "e2m1").shape == ()
    assert microscale.encode(np.zeros((0, 3), np.float32), "e4m3").shape == (0, 3)
    assert microscale.decode(np.zeros((0,), np.uint8), "e8m0").shape == (0,)
    # half inputs are widened exactly
    h = np.array([0.75, 3.5, -448], np.float16)
    assert np.array_equal(microscale.encode(h, "e4m3"), microscale.encode(h.astype(np.float32), "e4m3"))
    with pytest.raises(TypeError):
        microscale.encode(np.zeros(3, np.float64), "e4m3")
    with pytest.raises(TypeError):
        microscale.encode(np.zeros(3, np.int32), "e4m3")
    with pytest.raises(TypeError):
        microscale.decode(np.zeros(3, np.int16), "e4m3")
    with pytest.raises(TypeError):
        microscale.decode(np.zeros(3, np.uint8), "bf16")
    with pytest.raises(ValueError):
        microscale.encode(np.zeros(3, np.float32), "e3m4")
