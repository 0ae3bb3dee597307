"""microscale.QuantizedLinear, QuantizedEmbedding and QQLinear (python/microscale/layers.py, the
one implementation of the layers) against the bound ops and float64 references."""

import numpy as np
import pytest

import microscale
from conftest import assert_same_bits
from mm_support import BF16, F16, F32, QW, assert_close, randn, reference

LINEAR_MODES = [dict(mode="nvfp4"), dict(mode="nvfp4", use_global_scale=False), dict(mode="mxfp4"),
                dict(mode="mxfp8", elem="e5m2"), dict(mode="affine", bits=3, group_size=32)]


@pytest.mark.parametrize("kw", LINEAR_MODES, ids=str)
def test_quantized_linear(kw, rng):
    N, K = 40, 96
    w = randn(rng, (N, K))
    bias = randn(rng, (N,), BF16)
    layer = microscale.QuantizedLinear.from_linear(w, bias, **kw)
    # The weight is quantized as microscale.quantize does; nvfp4 uses its amax unless told not to.
    qkw = {k: v for k, v in kw.items() if k != "use_global_scale"}
    three = kw["mode"] == "nvfp4" and kw.get("use_global_scale", True)
    q = QW(w, global_scale=True if three else None, **qkw)
    assert_same_bits(layer.weight, q.wq)
    assert_same_bits(layer.scales, q.scales)
    assert (layer.biases is None) == (q.biases is None)
    assert layer.global_scale == (microscale.global_scale(w) if three else None)
    assert layer.bias.dtype == BF16 and layer.bias is not bias
    assert (layer.in_features, layer.out_features, layer.bits) == (K, N, q.wq.shape[1] * 8 // K)
    for shape in [(5, K), (2, 3, K), (K,)]:
        x = randn(rng, shape)
        y = layer(x)
        assert_same_bits(y, q.matmul(x, bias=bias))           # bias added before the rounding
        assert_close(y, *reference(x, q.wd, bias=bias.astype(np.float32)), K)
        np.testing.assert_allclose(layer.forward(x), q.matmul(x) + bias.astype(np.float32),
                                   rtol=1e-5, atol=1e-5)
    # Rebuilt from its parts (as a checkpoint would hold them) it computes the same.
    again = microscale.QuantizedLinear(layer.weight, layer.scales, layer.biases, layer.bias,
                                       mode=layer.mode, group_size=layer.group_size,
                                       bits=layer.bits, global_scale=layer.global_scale,
                                       elem=layer.elem)
    x = randn(rng, (3, K), F16)
    assert_same_bits(again(x), layer(x))


def test_quantized_linear_errors(rng):
    w = randn(rng, (8, 32))
    with pytest.raises(ValueError, match="weight must be 2-D"):
        microscale.QuantizedLinear.from_linear(w[None])
    with pytest.raises(TypeError, match="weight: unsupported dtype float64"):
        microscale.QuantizedLinear.from_linear(w.astype(np.float64))
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        microscale.QuantizedLinear.from_linear(w, np.zeros(4, np.float32))
    layer = microscale.QuantizedLinear.from_linear(w)
    with pytest.raises(ValueError, match="x has K = 16"):
        layer(randn(rng, (2, 16)))


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kw", [dict(mode="nvfp4"), dict(mode="mxfp4"), dict(mode="mxfp8"),
                                dict(mode="affine", bits=5, group_size=64)], ids=str)
def test_quantized_embedding(kw, dtype, rng):
    V, D = 50, 128
    table = randn(rng, (V, D), dtype)
    emb = microscale.QuantizedEmbedding.from_embedding(table, **kw)
    q = QW(table, global_scale=True if kw["mode"] == "nvfp4" else None, **kw)
    assert emb.dtype == dtype and (emb.num_embeddings, emb.dims) == (V, D)
    full = microscale.dequantize(q.wq, q.scales, q.biases, global_scale=q.gs, dtype=dtype, **q.kw)
    for idx in [np.array([[3, 0, 49], [7, 7, 1]], np.int32), np.array([12], np.uint32),
                np.array(5, np.int64), np.zeros((0, 2), np.int64)]:
        rows = emb(idx)
        assert rows.shape == idx.shape + (D,)
        assert_same_bits(rows, full[idx], f"rows {idx.tolist()}")
    # as_linear: x @ table^T
    x = randn(rng, (4, D))
    assert_same_bits(emb.as_linear(x), q.matmul(x))
    with pytest.raises(ValueError, match=r"indices value 50 at position 1 is out of range \[0, 50\)"):
        emb(np.array([0, 50]))
    with pytest.raises(ValueError, match="indices value -1 at position 0"):
        emb(np.array([-1]))
    with pytest.raises(TypeError, match="indices: unsupported dtype float32"):
        emb(np.array([1.0], np.float32))


@pytest.mark.parametrize("kw", [dict(mode="nvfp4"), dict(mode="mxfp4"), dict(mode="mxfp8")],
                         ids=str)
def test_qqlinear(kw, rng):
    """Dynamic activation scale (nvfp4: each call's own amax) and the calibrated static one."""
    N, K = 24, 64
    w = randn(rng, (N, K))
    bias = randn(rng, (N,))
    layer = microscale.QQLinear.from_linear(w, bias, **kw)
    nv = kw["mode"] == "nvfp4"
    gw = microscale.global_scale(w) if nv else None
    assert layer.global_scale == gw and layer.input_global_scale is None
    wq, ws = microscale.quantize(w, global_scale=gw, **kw)
    assert_same_bits(layer.weight, wq)
    assert_same_bits(layer.scales, ws)
    batches = [randn(rng, (3, 5, K), scale=s) for s in (0.5, 4.0, 1.0)]

    def qq(x, gx):
        return microscale.qqmm(x, w, global_scale_x=gx, global_scale_w=gw, bias=bias, **kw)

    x = batches[0]
    dynamic = layer(x)
    assert_same_bits(dynamic, qq(x, microscale.global_scale(x) if nv else None))
    xd = QW(x, global_scale=microscale.global_scale(x) if nv else None, **kw).wd
    assert_close(dynamic, *reference(xd, QW(w, global_scale=gw, **kw).wd, bias=bias), K)
    if not nv:
        with pytest.raises(ValueError, match="only nvfp4 uses an activation global scale"):
            layer.calibrate(batches)
        return
    assert layer.calibrate(iter(batches)) is layer
    amax = max(microscale.global_scale(b) for b in batches)
    assert layer.input_global_scale == amax
    static = layer(x)
    assert_same_bits(static, qq(x, amax))
    assert not np.array_equal(static, dynamic)  # x's own amax is 8x smaller than the frozen one
    assert_close(static, *reference(QW(x, global_scale=amax, **kw).wd,
                                    QW(w, global_scale=gw, **kw).wd, bias=bias), K)
    with pytest.raises(ValueError, match="no calibration batches"):
        layer.calibrate([])


def test_qqlinear_errors(rng):
    with pytest.raises(ValueError, match="QQLinear: mode must be nvfp4, mxfp4 or mxfp8"):
        microscale.QQLinear.from_linear(randn(rng, (4, 32)), mode="affine")


@pytest.mark.parametrize("batch, match", [
    (np.zeros((3, 64), np.float32), "every calibration batch is all zeros"),
    (np.full((3, 64), np.nan, np.float32), r"batches\[1\] has 192 NaN or Inf values"),
    (np.full((2, 64), np.inf, F16), r"batches\[1\] has 128 NaN or Inf values"),
    (np.full((1, 64), -np.inf, BF16), r"batches\[1\] has 64 NaN or Inf values"),
    (np.ones((3, 32), np.float32), r"batches\[1\] must have shape \[\.\.\., 64\] \(in_features\)"),
    (np.float32(1.0), r"batches\[1\] must have shape"),
    (np.ones((3, 64), np.int32), r"batches\[1\]: unsupported dtype int32"),
], ids=["zeros", "nan", "inf", "bf16-inf", "wrong-K", "scalar", "int"])
def test_qqlinear_calibrate_refuses_bad_batches(batch, match, rng):
    """A calibration that would freeze a zero or meaningless activation scale is an error that
    names the batch, and leaves the layer as it was."""
    layer = microscale.QQLinear.from_linear(randn(rng, (8, 64)), mode="nvfp4")
    good = randn(rng, (3, 64))
    # Zeros are refused only when every batch is zero; one good batch calibrates fine.
    batches = [np.zeros_like(batch), batch] if "all zeros" in match else [good, batch]
    with pytest.raises((ValueError, TypeError), match=match):
        layer.calibrate(batches)
    assert layer.input_global_scale is None
    assert layer.calibrate([good, np.zeros((3, 64), np.float32)]).input_global_scale == \
        microscale.global_scale(good)
    # One NaN among finite values is refused too (global_scale alone would skip it).
    x = good.copy()
    x[2, 5] = np.nan
    with pytest.raises(ValueError, match=r"batches\[0\] has 1 NaN or Inf values \(the first at index \(2, 5\)\)"):
        layer.calibrate([x])


@pytest.mark.parametrize("value", [0.0, -5.0, float("nan"), float("inf")])
def test_qqlinear_input_global_scale_checked(value, rng):
    w = randn(rng, (8, 64))
    layer = microscale.QQLinear.from_linear(w, mode="nvfp4")
    with pytest.raises(ValueError, match="QQLinear: input_global_scale must be a finite number > 0"):
        microscale.QQLinear(layer.weight, layer.scales, mode="nvfp4", global_scale=layer.global_scale,
                            input_global_scale=value)
    # Where there is no activation global scale, one given is an error rather than ignored.
    with pytest.raises(ValueError, match="input_global_scale needs a three-level nvfp4 weight"):
        microscale.QQLinear(layer.weight, layer.scales, mode="nvfp4", input_global_scale=1.0)


def test_docstring_examples():
    import doctest
    import microscale.layers
    import microscale.matmul
    for mod in (microscale.matmul, microscale.layers):
        res = doctest.testmod(mod, verbose=False)
        assert res.attempted >= 3 and res.failed == 0, mod.__name__


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8", "affine"])
def test_from_float_is_from_linear(mode, rng):
    """The layers' from_float (torch.ao's name for building a quantized module from a float one)
    builds the layer from_linear / from_embedding builds, with their arguments in their order; the
    inherited QuantizedWeight.from_float passed its arguments in its own order."""
    w = randn(rng, (16, 64))
    bias = randn(rng, (16,))
    x = randn(rng, (3, 64))
    lin = microscale.QuantizedLinear.from_float(w, bias, mode)
    want = microscale.QuantizedLinear.from_linear(w, bias, mode)
    assert isinstance(lin, microscale.QuantizedLinear)
    assert (lin.mode, lin.group_size, lin.bits, lin.global_scale) == (
        want.mode, want.group_size, want.bits, want.global_scale)
    assert_same_bits(lin(x), want(x))
    kw = {"group_size": 32} if mode == "affine" else {}
    emb = microscale.QuantizedEmbedding.from_float(w, mode, **kw)
    assert isinstance(emb, microscale.QuantizedEmbedding)
    idx = np.array([5, 0, 15])
    assert_same_bits(emb(idx), microscale.QuantizedEmbedding.from_embedding(w, mode, **kw)(idx))
    if mode != "affine":
        qq = microscale.QQLinear.from_float(w, bias, mode)
        assert isinstance(qq, microscale.QQLinear)
        assert_same_bits(qq(x), microscale.QQLinear.from_linear(w, bias, mode)(x))
    # The bare weight keeps its own from_float (two-level nvfp4 unless global_scale=True).
    q = microscale.QuantizedWeight.from_float(w, mode=mode, **kw)
    assert type(q) is microscale.QuantizedWeight and q.global_scale is None
