"""The NVFP4 training recipe's numerics (docs/numerics.md, "Training-recipe numerics") against
independent numpy implementations written from the definitions: 2D 16x16 scales, the random
Hadamard transform (bit for bit, bfloat16 rounding included) and stochastic rounding (bit for bit
given the generator, plus unbiasedness over many seeds)."""

import ml_dtypes
import numpy as np
import pytest

import microscale as ms
import spec_oracle as so

BF16 = np.dtype(ml_dtypes.bfloat16)
GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)


def heavy(shape, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_t(3, size=shape) * 0.05).astype(np.float32)


# ---- numpy oracles -----------------------------------------------------------------------------

def nvfp4_scale_of(amax_blocks, global_scale):
    """(scale codes, encode factors) of the nvfp4 rule (FORMATS 2.1) for block maxima."""
    if global_scale is None:
        s = so.rn_sat_code(amax_blocks * so.C6, "e4m3")
        return s, np.fmin(np.float32(1) / so.decode_code(s, "e4m3"), so.FLT_MAX)
    amax = np.float32(global_scale)
    s_enc = np.fmin(np.float32(2688) / amax, so.FLT_MAX)
    if amax == 0 or s_enc == 0:
        s_enc = np.float32(1)
    s_dec = np.float32(1) / s_enc
    s = so.rn_sat_code(np.fmin(amax_blocks * (s_enc * so.C6), so.FLT_MAX), "e4m3")
    return s, np.fmin(np.float32(1) / (so.decode_code(s, "e4m3") * s_dec), so.FLT_MAX)


def oracle_2d(w, global_scale=None):
    """2D nvfp4 of a finite float32 [R, K]: one scale per 16x16 tile, repeated in its rows."""
    R, K = w.shape
    amax = np.zeros((R, K // 16), np.float32)
    for r0 in range(0, R, 16):
        tile = np.abs(w[r0:r0 + 16]).reshape(-1, K // 16, 16).max(axis=(0, 2))
        amax[r0:r0 + 16] = tile
    s, enc = nvfp4_scale_of(amax, global_scale)
    codes = so.rn_sat_code(w.reshape(R, K // 16, 16) * enc[..., None], "e2m1")
    return so.pack_fp4(codes.reshape(R, K).astype(np.uint8)), s.astype(np.uint8)


def oracle_hadamard(x):
    """y_j = RN_bf16(fl(0.25 * s_j)), s_j summed in float32 in index order, returned as float32."""
    x = np.asarray(x, np.float32)
    d = np.array([-1.0 if (0xD7E8 >> i) & 1 else 1.0 for i in range(16)], np.float32)
    h = np.array([[(-1.0) ** bin(i & j).count("1") for j in range(16)] for i in range(16)], np.float32)
    chunks = x.reshape(-1, 16)
    y = np.empty_like(chunks)
    for j in range(16):
        terms = chunks * (d * h[:, j])  # exact: sign flips
        s = terms[:, 0].copy()
        for i in range(1, 16):
            s = (s + terms[:, i]).astype(np.float32)
        y[:, j] = (s * np.float32(0.25)).astype(BF16).astype(np.float32)
    return y.reshape(x.shape)


M64 = (1 << 64) - 1


def splitmix_byte(seed, index):
    """Top byte of the (index+1)-th SplitMix64 output seeded with seed (Python ints, mod 2^64)."""
    z = (seed + 0x9E3779B97F4A7C15 * (index + 1)) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    return z >> 56


def sr_codes(v, u):
    """Stochastic E2M1 codes of float32 values v with random bytes u (FORMATS 5)."""
    a = np.abs(v).astype(np.float32)
    lo_idx = np.clip(np.searchsorted(GRID, a, side="right") - 1, 0, 6)
    step = GRID[lo_idx + 1] - GRID[lo_idx]
    t = (a + (u.astype(np.float32) * np.float32(1 / 256)) * step).astype(np.float32)
    idx = np.searchsorted(GRID, t, side="right") - 1
    idx = np.where(a >= 6, 7, idx)
    return (idx | np.where(np.signbit(v), 8, 0)).astype(np.uint8)


def oracle_sr_nvfp4(x, seed, global_scale=None):
    R, K = x.shape
    blocks = x.reshape(R, K // 16, 16)
    s, enc = nvfp4_scale_of(np.abs(blocks).max(axis=-1), global_scale)
    v = (blocks * enc[..., None]).astype(np.float32).reshape(-1)
    u = np.array([splitmix_byte(seed, i) for i in range(v.size)], np.uint32)
    return so.pack_fp4(sr_codes(v, u).reshape(R, K)), s.astype(np.uint8)


def oracle_sr_mxfp4(x, seed):
    R, K = x.shape
    blocks = x.reshape(R, K // 32, 32)
    s = so.mx_scale(np.abs(blocks).max(axis=-1), "e2m1", "ceil")
    v = (blocks * so.e8m0_reciprocal(s)[..., None]).astype(np.float32).reshape(-1)
    u = np.array([splitmix_byte(seed, i) for i in range(v.size)], np.uint32)
    return so.pack_fp4(sr_codes(v, u).reshape(R, K)), np.asarray(s, np.uint8)


@pytest.fixture(params=["reference", "cpu"])
def backend(request):
    saved = ms.backend()
    ms.set_backend(request.param)
    yield request.param
    ms.set_backend(saved)


# ---- 2D scaling --------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(48, 64), (37, 32), (5, 128)])
@pytest.mark.parametrize("three_level", [False, True])
def test_2d_matches_numpy(backend, shape, three_level):
    w = heavy(shape, 1)
    g = ms.global_scale(w) if three_level else None
    packed, scales = ms.quantize(w, scale_2d=True, global_scale=g)
    want_p, want_s = oracle_2d(w, g)
    np.testing.assert_array_equal(scales, want_s)
    np.testing.assert_array_equal(packed, want_p)


@pytest.mark.parametrize("three_level", [False, True])
def test_2d_transpose_decodes_to_transpose(backend, three_level):
    w = heavy((64, 96), 2)
    g = ms.global_scale(w) if three_level else None
    y = ms.dequantize(*ms.quantize(w, scale_2d=True, global_scale=g), global_scale=g)
    yt = ms.dequantize(*ms.quantize(np.ascontiguousarray(w.T), scale_2d=True, global_scale=g),
                       global_scale=g)
    np.testing.assert_array_equal(y.T, yt)


def test_2d_same_bytes_on_both_backends_and_thread_counts():
    w = heavy((70, 160), 3)
    got = []
    for b, threads in [("reference", 0), ("cpu", 1), ("cpu", 2)]:
        ms.set_backend(b)
        ms.set_num_threads(threads)
        got.append(ms.quantize(w, scale_2d=True, global_scale=ms.global_scale(w)))
    ms.set_backend("cpu")
    ms.set_num_threads(0)
    for p, s in got[1:]:
        np.testing.assert_array_equal(p, got[0][0])
        np.testing.assert_array_equal(s, got[0][1])


# ---- random Hadamard transform -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
def test_hadamard_matches_numpy_bit_for_bit(dtype):
    rng = np.random.default_rng(4)
    # Wide dynamic range per chunk, so the float32 sums round and their order matters.
    span = 8 if dtype == np.float16 else 20  # float16 overflows at 2^16
    x = (rng.standard_normal((9, 64)) * np.exp2(rng.integers(-span, span, (9, 64)))).astype(dtype)
    want = oracle_hadamard(x.astype(np.float32))
    got = ms.hadamard_transform(x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    got_bf16 = ms.hadamard_transform(x, dtype="bfloat16")
    assert got_bf16.dtype == BF16
    np.testing.assert_array_equal(got_bf16.astype(np.float32).view(np.uint32), want.view(np.uint32))


def test_hadamard_is_orthogonal():
    m = ms.hadamard_transform(np.eye(16, dtype=np.float32))  # rows of M = 0.25 * D * H
    np.testing.assert_array_equal(m @ m.T, np.eye(16))
    np.testing.assert_array_equal(np.abs(m), np.full((16, 16), 0.25))


def test_hadamard_preserves_the_product():
    """x M (w M)^T = x w^T exactly up to the bf16 roundings of the two transforms: each rounding
    is a relative error <= 2^-9 per element, so the product moves by at most about
    2 * 2^-9 * sum_k |x_k||w_k| (plus float32 sums, far smaller); asserted per output element."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    w = rng.standard_normal((12, 256)).astype(np.float32)
    xt = ms.hadamard_transform(x).astype(np.float64)
    wt = ms.hadamard_transform(w).astype(np.float64)
    got = xt @ wt.T
    want = x.astype(np.float64) @ w.astype(np.float64).T
    # |x M| and |w M| have the same Euclidean norms per row as x and w (M orthogonal); bound with
    # the Cauchy-Schwarz product of those norms.
    bound = 2.5 * 2.0 ** -9 * np.outer(np.linalg.norm(x, axis=1), np.linalg.norm(w, axis=1))
    assert np.all(np.abs(got - want) <= bound)
    assert np.abs(got - want).max() > 0  # the roundings are real: not the identity


def test_quantize_with_hadamard_is_quantize_of_transform(backend):
    x = heavy((16, 64), 6)
    y = ms.hadamard_transform(x, dtype="bfloat16")
    g = ms.global_scale(y)
    for mode in ["nvfp4", "mxfp4"]:
        gs = g if mode == "nvfp4" else None
        want = ms.quantize(y, mode=mode, global_scale=gs)
        got = ms.quantize(x, mode=mode, global_scale=gs, hadamard=True)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


def test_hadamard_errors():
    with pytest.raises(ValueError, match=r"K = 24\) must be a multiple of 16"):
        ms.hadamard_transform(np.zeros((2, 24), np.float32))
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        ms.hadamard_transform(np.zeros(16, np.float32), dtype="float16")
    with pytest.raises(ValueError, match="not affine"):
        ms.quantize(np.zeros(64, np.float32), mode="affine", hadamard=True)
    with pytest.raises(TypeError, match="hadamard must be a bool"):
        ms.quantize(np.zeros(64, np.float32), hadamard="yes")


# ---- stochastic rounding -----------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2**64 - 1])
def test_sr_matches_numpy(backend, seed):
    x = heavy((6, 64), 7)
    for g in [None, ms.global_scale(x)]:
        got = ms.quantize(x, sr_seed=seed, global_scale=g)
        want = oracle_sr_nvfp4(x, seed, g)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])
    got = ms.quantize(x, mode="mxfp4", sr_seed=seed)
    want = oracle_sr_mxfp4(x, seed)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


def test_sr_reproducible_across_backends_and_threads():
    x = heavy((33, 512), 8)
    got = []
    for b, threads in [("reference", 0), ("cpu", 1), ("cpu", 2)]:
        ms.set_backend(b)
        ms.set_num_threads(threads)
        got.append(ms.quantize(x, sr_seed=99, global_scale=ms.global_scale(x)))
        got.append(ms.quantize(x, mode="mxfp4", sr_seed=99))
    ms.set_backend("cpu")
    ms.set_num_threads(0)
    for i in range(2, len(got)):
        for a, b in zip(got[i], got[i % 2]):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(ms.quantize(x, sr_seed=100)[0], ms.quantize(x, sr_seed=99)[0])


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4"])
def test_sr_unbiased_and_between_neighbours(mode):
    """Over n seeds the mean decoded value of each element approaches its input. With p the
    probability of rounding up between neighbours lo < hi (scaled by the block's decode factor),
    one draw has variance p (1 - p) (hi - lo)^2, so the mean of n draws lies within 5 sigma =
    5 sqrt(p (1 - p) / n) (hi - lo) of its expectation; the expectation differs from the input by
    less than (hi - lo) / 256 (8 random bits) plus float32 rounding of the scaled value. An nvfp4
    block max may scale past 6 (its E4M3 scale rounds down) and saturates to 6, as with
    round-to-nearest: its expectation is 6 times the decode factor."""
    rng = np.random.default_rng(9)
    g = 16 if mode == "nvfp4" else 32
    x = rng.standard_normal((4, 64)).astype(np.float32)
    # Every block's max is fixed so the scales are the same on every seed.
    n = 400
    ys = np.stack([ms.dequantize(*ms.quantize(x, mode=mode, sr_seed=s), mode=mode)
                   for s in range(n)])
    _, scales = ms.quantize(x, mode=mode)
    if mode == "nvfp4":
        factor = scales.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    else:
        factor = scales.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    factor = np.repeat(factor, g, axis=-1)
    v = np.abs(x.astype(np.float64) / factor)  # scaled magnitudes
    lo_i = np.clip(np.searchsorted(GRID, v, side="right") - 1, 0, 6)
    lo = GRID[lo_i] * factor
    hi = GRID[lo_i + 1] * factor
    # Never outside the two grid neighbours (allowing an ulp of the scaled value at the edges).
    mag = np.abs(ys)
    ok = (mag == lo) | (mag == hi) | (np.abs(mag - np.abs(x)) <= 1e-6 * factor)
    assert ok.all()
    p = np.clip((v * factor - lo) / (hi - lo), 0, 1)
    sigma = np.sqrt(p * (1 - p) / n) * (hi - lo)
    bound = 5 * sigma + (hi - lo) / 256 + 1e-6 * factor
    expected = np.sign(x) * np.minimum(np.abs(x), 6 * factor)
    err = np.abs(ys.mean(axis=0) - expected)
    assert np.all(err <= bound), (err / bound).max()
    # Round to nearest is biased on the same data: the test can tell the difference.
    rtn = ms.dequantize(*ms.quantize(x, mode=mode), mode=mode)
    assert np.sum(np.abs(rtn - x) > bound) > x.size // 4


def test_sr_errors():
    x = np.zeros(64, np.float32)
    with pytest.raises(ValueError, match="nvfp4 and mxfp4"):
        ms.quantize(x, mode="mxfp8", sr_seed=1)
    with pytest.raises(ValueError, match="cannot be combined with scale_search"):
        ms.quantize(x, sr_seed=1, scale_search="mse")
    with pytest.raises(ValueError, match=r"sr_seed must be in \[0, 2\*\*64\)"):
        ms.quantize(x, sr_seed=-1)
    with pytest.raises(TypeError, match="sr_seed must be an int"):
        ms.quantize(x, sr_seed=1.5)
    with pytest.raises(ValueError, match="only defined for nvfp4"):
        ms.quantize(x, mode="mxfp4", scale_2d=True)


def test_checkpoint_scale_2d(tmp_path):
    """`microscale quantize --scale-2d` writes the 2D nvfp4 bytes of each weight (the numpy oracle
    with the weight's global scale), records scale_2d in the producer block, `inspect` prints it."""
    import json
    import os
    import subprocess

    from ckpt_support import load_all, make_tensors, write_model

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cli = os.environ.get("MICROSCALE_CLI") or os.path.join(root, "build", "src", "cli", "microscale")
    if not os.access(cli, os.X_OK):
        pytest.skip(f"no microscale command at {cli}")
    src = tmp_path / "src"
    tensors = make_tensors(layers=1)
    write_model(src, tensors, shards=1)
    out = tmp_path / "out"
    r = subprocess.run([cli, "quantize", str(src), "-o", str(out), "--scale-2d", "--separate-fused-scales"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["producer"]["scale_2d"] is True
    r = subprocess.run([cli, "inspect", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "config: scale_2d (16x16 scale tiles); " in r.stdout, r.stdout + r.stderr
    got = load_all(out)
    name = "model.layers.0.mlp.down_proj"
    w = np.asarray(tensors[name + ".weight"], np.float32)
    amax = np.float32(2688.0) / np.float32(got[name + ".weight_global_scale"].reshape(-1)[0])
    want_p, want_s = oracle_2d(w, ms.global_scale(w))
    assert np.float32(amax) == pytest.approx(ms.global_scale(w), rel=1e-6)
    np.testing.assert_array_equal(got[name + ".weight_scale"].view(np.uint8), want_s)
    np.testing.assert_array_equal(got[name + ".weight_packed"], want_p)


def test_quantize_dequantize_takes_the_options():
    x = heavy((32, 64), 10)
    g = ms.global_scale(x)
    for kw in [dict(sr_seed=5), dict(scale_2d=True), dict(sr_seed=5, scale_2d=True)]:
        want = ms.dequantize(*ms.quantize(x, global_scale=g, **kw), global_scale=g)
        np.testing.assert_array_equal(ms.quantize_dequantize(x, global_scale=g, **kw), want)
    y = ms.hadamard_transform(x)
    np.testing.assert_array_equal(ms.quantize_dequantize(x, hadamard=True),
                                  ms.quantize_dequantize(y))
