"""microscale.quantized_matmul, qqmm and gather_qmm against float64 references built from
microscale.dequantize / quantize (FORMATS.md section 6), plus MLX 0.32.4 as an oracle for affine."""

import numpy as np
import pytest

import microscale
from mm_support import BF16, F16, F32, QW, SPECS, assert_close, randn, reference

BACKENDS = ["cpu", "reference"]


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Runs the test on each backend (small shapes only: the reference backend is scalar)."""
    old = microscale.backend()
    microscale.set_backend(request.param)
    yield request.param
    microscale.set_backend(old)


def spec_ids(specs):
    return [s[0] for s in specs]


# ---------------------------------------------------------------------------------------------
# quantized_matmul


@pytest.mark.parametrize("name,kw,K", SPECS, ids=spec_ids(SPECS))
def test_quantized_matmul_modes(name, kw, K, backend, rng):
    """Every format; M = 1, 1-D x, M = 0, a general M; batch axes broadcast."""
    N = 24
    w = QW(randn(rng, (N, K)), **kw)
    for shape in [(1, K), (K,), (0, K), (7, K)]:
        x = randn(rng, shape)
        ref, s = reference(x, w.wd)
        assert_close(w.matmul(x), ref, s, K, what=f"{name} x{shape}")
    # batch broadcasting: x [2, 1, M, K] against w [3, N, K] -> [2, 3, M, N]
    wb = QW(randn(rng, (3, N, K)), **kw)
    x = randn(rng, (2, 1, 5, K))
    ref, s = reference(x, wb.wd)
    assert_close(wb.matmul(x), ref, s, K, what=f"{name} batched")
    assert wb.matmul(randn(rng, (5, K))).shape == (3, 5, N)
    assert wb.matmul(np.zeros((2, 1, 0, K), np.float32)).shape == (2, 3, 0, N)


@pytest.mark.parametrize("name,kw,K", SPECS[::2], ids=spec_ids(SPECS[::2]))
def test_quantized_matmul_no_transpose(name, kw, K, backend, rng):
    """transpose=False: W logical [K, N], groups along the stored last axis N."""
    group = kw.get("group_size", 16 if kw["mode"] == "nvfp4" else 32)
    N, Kx = 2 * group, 40
    w = QW(randn(rng, (2, Kx, N)), **kw)
    x = randn(rng, (2, 3, Kx))
    ref, s = reference(x, w.wd, transpose=False)
    assert_close(w.matmul(x, transpose=False), ref, s, Kx, what=name)


@pytest.mark.parametrize("kw", [dict(mode="nvfp4", global_scale=True), dict(mode="mxfp8"),
                                dict(mode="affine", bits=4, group_size=64)], ids=str)
def test_quantized_matmul_large_m(kw, rng):
    """M = 1000 on the default cpu backend, with a bias."""
    K, N = 320, 72
    w = QW(randn(rng, (N, K)), **kw)
    x = randn(rng, (1000, K))
    bias = randn(rng, (N,))
    ref, s = reference(x, w.wd, bias=bias)
    y = w.matmul(x, bias=bias)
    assert_close(y, ref, s, K)
    # The cpu backend's results do not depend on its thread count.
    try:
        for n in (1, 3):
            microscale.set_num_threads(n)
            np.testing.assert_array_equal(w.matmul(x, bias=bias), y)
    finally:
        microscale.set_num_threads(0)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("kw", [dict(mode="nvfp4", global_scale=True), dict(mode="mxfp4"),
                                dict(mode="mxfp8", elem="e5m2")], ids=str)
def test_half_x(dtype, kw, backend, rng):
    """float16 / bfloat16 x: result in x's dtype, rounded once from the float32 product."""
    K = 96
    w = QW(randn(rng, (16, K)), **kw)
    x = randn(rng, (2, 5, K), dtype)
    ref, s = reference(x, w.wd)
    assert_close(w.matmul(x), ref, s, K, out_dtype=dtype)


@pytest.mark.parametrize("x_dtype,w_dtype,out_dtype", [
    (F32, F32, F32), (F16, F32, F32), (F16, F16, F16), (BF16, BF16, BF16), (F16, BF16, F32),
    (F32, F16, F32)], ids=str)
def test_affine_output_dtype(x_dtype, w_dtype, out_dtype, rng):
    """Affine results have the promotion of x's and the scales' dtypes."""
    K = 64
    w = QW(randn(rng, (8, K), w_dtype), mode="affine", group_size=32, bits=4)
    assert w.scales.dtype == w_dtype
    x = randn(rng, (3, K), x_dtype)
    ref, s = reference(x, w.wd.astype(np.float32))
    assert_close(w.matmul(x), ref, s, K, out_dtype=out_dtype)


def test_f16_x_small_amax_weight(rng):
    """A three-level nvfp4 weight of amax 1e-4 times float16 x: float32 accumulation keeps the
    partial sums (2688/amax times the true ones without the global factor) finite."""
    K, N = 4096, 16
    w = randn(rng, (N, K))
    w = (w * (1e-4 / np.abs(w).max())).astype(np.float32)
    w[0, 0] = 1e-4
    q = QW(w, mode="nvfp4", global_scale=True)
    assert np.float32(q.gs) == np.float32(1e-4)
    x = (rng.standard_normal((4, K)) * 30).astype(F16)
    y = q.matmul(x)
    assert np.all(np.isfinite(y.astype(np.float64)))
    ref, s = reference(x, q.wd)
    assert_close(y, ref, s, K, out_dtype=F16)


# ---------------------------------------------------------------------------------------------
# qqmm

QQ_SPECS = [("nvfp4-2lvl", dict(mode="nvfp4"), False), ("nvfp4-3lvl", dict(mode="nvfp4"), True),
            ("mxfp4", dict(mode="mxfp4"), False), ("mxfp8-e4m3", dict(mode="mxfp8"), False),
            ("mxfp8-e5m2", dict(mode="mxfp8", elem="e5m2"), False)]


def qq_reference(x, w, kw, gx, gw):
    """dequant(quant(x)) @ dequant(quant(w))^T in float64, quantizing as microscale.quantize."""
    xd = QW(x, global_scale=gx, **kw).wd
    wd = QW(w, global_scale=gw, **kw).wd
    return reference(xd, wd)


@pytest.mark.parametrize("name,kw,three", QQ_SPECS, ids=[s[0] for s in QQ_SPECS])
def test_qqmm(name, kw, three, backend, rng):
    """M > 1, batched and 1-D x, float and prequantized w (identical results), bias."""
    K, N = 96, 20
    w = randn(rng, (N, K), scale=0.05)
    gw = microscale.global_scale(w) if three else None
    wq, scales = microscale.quantize(w, global_scale=gw, **kw)
    for shape in [(6, K), (2, 3, 5, K), (K,), (0, K)]:
        x = randn(rng, shape)
        gx = microscale.global_scale(x) if three else None
        y = microscale.qqmm(x, w, global_scale_x=gx, global_scale_w=gw, **kw)
        ref, s = qq_reference(x, w, kw, gx, gw)
        assert_close(y, ref, s, K, what=f"{name} x{shape}")
        y_pre = microscale.qqmm(x, wq, scales, global_scale_x=gx, global_scale_w=gw, **kw)
        np.testing.assert_array_equal(y_pre, y)
    x = randn(rng, (4, K), BF16)
    bias = randn(rng, (N,))
    gx = microscale.global_scale(x) if three else None
    y = microscale.qqmm(x, w, global_scale_x=gx, global_scale_w=gw, bias=bias, **kw)
    ref, s = qq_reference(x, w, kw, gx, gw)
    ref, s = ref + bias, s + np.abs(bias)
    assert_close(y, ref, s, K, out_dtype=BF16, what=f"{name} bf16 + bias")


def test_qqmm_global_scales_honoured(rng):
    """Both global scales enter the result: the product of the two-level decodes of the same
    codes (what an implementation that drops them computes) is far off."""
    K, N = 128, 16
    w = randn(rng, (N, K), scale=0.05)
    x = randn(rng, (8, K), scale=0.01)
    gx, gw = microscale.global_scale(x), microscale.global_scale(w)
    y = microscale.qqmm(x, w, global_scale_x=gx, global_scale_w=gw)
    ref, s = qq_reference(x, w, dict(mode="nvfp4"), gx, gw)
    assert_close(y, ref, s, K)
    xq, xs = microscale.quantize(x, global_scale=gx)
    wq, ws = microscale.quantize(w, global_scale=gw)
    dropped, _ = reference(microscale.dequantize(xq, xs), microscale.dequantize(wq, ws))
    assert np.linalg.norm(dropped - ref) > 100 * np.linalg.norm(ref)
    # The three-level weight codes passed without the global scales: a very different answer.
    y_dropped = microscale.qqmm(x, wq, ws).astype(np.float64)
    assert np.linalg.norm(y_dropped - ref) > 100 * np.linalg.norm(ref)
    y_pre = microscale.qqmm(x, wq, ws, global_scale_x=gx, global_scale_w=gw)
    np.testing.assert_array_equal(y_pre, y)


# ---------------------------------------------------------------------------------------------
# gather_qmm


def moe_routing(rng, T, E, k=2):
    """Top-k distinct experts per token, never routing to the last two experts."""
    return np.stack([rng.choice(E - 2, size=k, replace=False) for _ in range(T)])


@pytest.mark.parametrize("E", [4, 16, 64])
@pytest.mark.parametrize("kw", [dict(mode="nvfp4", global_scale=True), dict(mode="mxfp8"),
                                dict(mode="affine", bits=4, group_size=32)], ids=str)
def test_gather_qmm_moe(E, kw, rng):
    """Top-2 mixture of experts: x [T, 1, 1, K], rhs_indices [T, 2] against a loop of
    quantized_matmul; unused experts; sorted_indices never changes the result."""
    T, K, N = 24, 64, 32
    w = QW(randn(rng, (E, N, K)), **kw)
    parts, mkw = w.matmul_args()
    x = randn(rng, (T, 1, 1, K))
    idx = moe_routing(rng, T, E)
    assert len(np.unique(idx)) < E
    y = microscale.gather_qmm(x, *parts, rhs_indices=idx.astype(np.int32), **mkw)
    assert y.shape == (T, 2, 1, N)
    ref, s = reference(x, w.wd[idx])  # [T, 2, 1, N]
    assert_close(y, ref, s, K)
    for t in range(T):
        for j in range(2):
            e = idx[t, j]
            one = microscale.quantized_matmul(x[t, 0], w.wq[e], w.scales[e],
                                              None if w.biases is None else w.biases[e], **mkw)
            tol = 2 * (K + 2) * 2**-24 * s[t, j] + 1e-30
            np.testing.assert_array_less(np.abs(y[t, j] - one), tol)
    y_sorted_flag = microscale.gather_qmm(x, *parts, rhs_indices=idx, sorted_indices=True, **mkw)
    np.testing.assert_array_equal(y_sorted_flag, y)
    # MLX-style sorted routing: flatten (token, slot) pairs, order them by expert.
    order = np.argsort(idx.reshape(-1), kind="stable")
    lhs = (order // 2).astype(np.uint32)
    rhs = idx.reshape(-1)[order].astype(np.int64)
    ys = microscale.gather_qmm(x.reshape(T, 1, K), *parts, lhs_indices=lhs, rhs_indices=rhs,
                               sorted_indices=True, **mkw)
    ref_s, s_s = reference(x[lhs, 0], w.wd[rhs])
    assert_close(ys, ref_s, s_s, K)
    unsorted = np.empty_like(ys)
    unsorted[order] = ys
    np.testing.assert_allclose(unsorted.reshape(T, 2, 1, N), y, rtol=0,
                               atol=float(2 * (K + 2) * 2**-24 * s.max()))


def test_gather_qmm_indices(backend, rng):
    """lhs and rhs index arrays broadcast; defaults are arange over each batch; int32, int64
    and uint32; transpose=False; both missing is quantized_matmul."""
    K, N = 32, 16
    w = QW(randn(rng, (3, N, K)), mode="mxfp4")
    parts, mkw = w.matmul_args()
    x = randn(rng, (5, 2, K))
    lhs = np.array([[4], [0], [2]], np.int64)           # [3, 1]
    rhs = np.array([0, 2, 1, 1], np.uint32)              # [4]
    y = microscale.gather_qmm(x, *parts, lhs_indices=lhs, rhs_indices=rhs, **mkw)
    assert y.shape == (3, 4, 2, N)
    ref, s = reference(x[lhs], w.wd[rhs])
    assert_close(y, ref, s, K)
    # rhs only: lhs defaults to arange(5) shaped [5]; broadcast against rhs [5].
    rhs5 = np.array([2, 2, 0, 1, 0], np.int32)
    y = microscale.gather_qmm(x, *parts, rhs_indices=rhs5, **mkw)
    ref, s = reference(x, w.wd[rhs5])
    assert_close(y, ref, s, K)
    # both missing: the plain batched product
    xb = randn(rng, (3, 2, K))
    np.testing.assert_array_equal(microscale.gather_qmm(xb, *parts, **mkw), w.matmul(xb))
    # transpose=False
    wt = QW(randn(rng, (3, K, 64)), mode="nvfp4")
    parts_t, mkw_t = wt.matmul_args()
    y = microscale.gather_qmm(x, *parts_t, lhs_indices=np.array([1, 3], np.int32),
                              rhs_indices=np.array([2, 0], np.int32), transpose=False, **mkw_t)
    ref, s = reference(x[[1, 3]], wt.wd[[2, 0]], transpose=False)
    assert_close(y, ref, s, K)


# ---------------------------------------------------------------------------------------------
# MLX 0.32.4 as an oracle (affine; MLX's CPU kernels accumulate float32 x in float32)


@pytest.fixture(scope="module")
def mx():
    mlx = pytest.importorskip("mlx.core")
    mlx.set_default_device(mlx.cpu)
    return mlx


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_mlx_quantized_matmul_affine(bits, group, mx, rng):
    K, N = 2 * group + 128, 48
    w = randn(rng, (N, K))
    wq, scales, biases = (np.array(a) for a in
                          mx.quantize(mx.array(w), group_size=group, bits=bits))
    assert wq.dtype == np.uint32
    x = randn(rng, (2, 7, K))
    kw = dict(mode="affine", group_size=group, bits=bits)
    y = microscale.quantized_matmul(x, wq, scales, biases, **kw)
    y_mlx = np.array(mx.quantized_matmul(mx.array(x), mx.array(wq), mx.array(scales),
                                         mx.array(biases), transpose=True, group_size=group,
                                         bits=bits))
    wd = microscale.dequantize(wq, scales, biases, **kw)
    ref, s = reference(x, wd)
    assert_close(y, ref, s, K)
    assert_close(y_mlx, ref, s, K, what="mlx")  # the oracle is itself within the contract
    np.testing.assert_array_less(np.abs(y - y_mlx), 2 * (K + 2) * 2**-24 * s + 1e-30)
    # transpose=False: W logical [K', N'] grouped along N'
    wt = randn(rng, (64, 2 * group))
    tq, ts, tb = (np.array(a) for a in mx.quantize(mx.array(wt), group_size=group, bits=bits))
    xt = randn(rng, (3, 64))
    y = microscale.quantized_matmul(xt, tq, ts, tb, transpose=False, **kw)
    y_mlx = np.array(mx.quantized_matmul(mx.array(xt), mx.array(tq), mx.array(ts), mx.array(tb),
                                         transpose=False, group_size=group, bits=bits))
    ref, s = reference(xt, microscale.dequantize(tq, ts, tb, **kw), transpose=False)
    assert_close(y, ref, s, 64)
    np.testing.assert_array_less(np.abs(y - y_mlx), 2 * (64 + 2) * 2**-24 * s + 1e-30)


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8"])
def test_mlx_quantized_matmul_fp_modes(mode, mx, rng):
    """MLX-quantized fp-mode weights (uint32 w_q, uint8 scales): both products within the
    contract's tolerance of the float64 product of the dequantized weight."""
    K, N = 256, 48
    w, x = randn(rng, (N, K)), randn(rng, (5, K))
    wq, scales = (np.array(a) for a in mx.quantize(mx.array(w), mode=mode))
    y = microscale.quantized_matmul(x, wq, scales, mode=mode)
    y_mlx = np.array(mx.quantized_matmul(mx.array(x), mx.array(wq), mx.array(scales), mode=mode))
    ref, s = reference(x, microscale.dequantize(wq, scales, mode=mode))
    assert_close(y, ref, s, K)
    assert_close(y_mlx, ref, s, K, what="mlx")


def test_mlx_gather_qmm_affine(mx, rng):
    E, T, K, N = 8, 12, 128, 32
    w = randn(rng, (E, N, K))
    wq, scales, biases = (np.array(a) for a in mx.quantize(mx.array(w), group_size=64, bits=4))
    x = randn(rng, (T, 1, 1, K))
    idx = moe_routing(rng, T, E).astype(np.uint32)
    y = microscale.gather_qmm(x, wq, scales, biases, rhs_indices=idx, mode="affine",
                              group_size=64, bits=4)
    y_mlx = np.array(mx.gather_qmm(mx.array(x), mx.array(wq), mx.array(scales), mx.array(biases),
                                   rhs_indices=mx.array(idx), group_size=64, bits=4))
    wd = microscale.dequantize(wq, scales, biases, mode="affine", group_size=64, bits=4)
    ref, s = reference(x, wd[idx])
    assert_close(y, ref, s, K)
    np.testing.assert_array_less(np.abs(y - y_mlx), 2 * (K + 2) * 2**-24 * s + 1e-30)


# ---------------------------------------------------------------------------------------------
# errors


def test_errors(rng):
    K = 64
    x = randn(rng, (3, K))
    w = randn(rng, (16, K))
    wq, sc = microscale.quantize(w)
    aq, asc, ab = microscale.quantize(w, mode="affine", group_size=32)
    eq, esc = microscale.quantize(randn(rng, (4, 16, K)))
    qm = microscale.quantized_matmul
    with pytest.raises(ValueError, match="x has K = 48 but the weight"):
        qm(x[:, :48], wq, sc)
    with pytest.raises(ValueError, match="scales must have shape"):
        qm(x, wq, sc[:, :2])
    with pytest.raises(ValueError, match="biases are required"):
        qm(x, aq, asc, mode="affine", group_size=32)
    with pytest.raises(ValueError, match="do not broadcast"):
        qm(randn(rng, (3, 2, K)), eq, esc)
    with pytest.raises(ValueError, match="bias must have shape"):
        qm(x, wq, sc, bias=np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="x: unsupported dtype float64"):
        qm(x.astype(np.float64), wq, sc)
    with pytest.raises(TypeError, match="w_q: unsupported dtype"):
        qm(x, wq.astype(np.int16), sc)
    with pytest.raises(TypeError, match="scales: unsupported dtype"):
        qm(x, wq, sc.astype(np.int32))
    with pytest.raises(ValueError, match="global_scale"):
        qm(x, wq, sc, mode="mxfp4", global_scale_w=1.0)
    # qqmm
    with pytest.raises(ValueError, match="both global_scale_x and global_scale_w, or neither"):
        microscale.qqmm(x, w, global_scale_x=1.0)
    with pytest.raises(ValueError, match="both global_scale_x and global_scale_w, or neither"):
        microscale.qqmm(x, w, global_scale_w=1.0)
    with pytest.raises(ValueError, match="mode must be nvfp4, mxfp4 or mxfp8"):
        microscale.qqmm(x, w, mode="affine")
    with pytest.raises(ValueError, match="a packed w needs its scales"):
        microscale.qqmm(x, wq)
    with pytest.raises(ValueError, match="x has K = 48 but w has K = 64"):
        microscale.qqmm(x[:, :48], wq, sc)
    with pytest.raises(TypeError, match="w: unsupported dtype int16"):
        microscale.qqmm(x, w.astype(np.int16))
    # gather_qmm
    xg = randn(rng, (2, 1, K))
    for bad in ([0, 4], [-1, 0]):
        with pytest.raises(ValueError, match=r"rhs_indices value -?\d at position \d is out of range"):
            microscale.gather_qmm(xg, eq, esc, rhs_indices=np.array(bad, np.int32))
    with pytest.raises(ValueError, match="lhs_indices value 2 at position 1 is out of range"):
        microscale.gather_qmm(xg, eq, esc, lhs_indices=np.array([0, 2]),
                              rhs_indices=np.array([0, 1]))
    with pytest.raises(TypeError, match="rhs_indices: unsupported dtype float32"):
        microscale.gather_qmm(xg, eq, esc, rhs_indices=np.array([0, 1], np.float32))
    with pytest.raises(ValueError, match="index shapes"):
        microscale.gather_qmm(xg, eq, esc, lhs_indices=np.array([0, 1]),
                              rhs_indices=np.array([0, 1, 2]))
