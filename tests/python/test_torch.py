"""microscale.torch: the straight-through fake quantization and the nn.Module layers, checked
against analytic gradients, finite differences, the numpy API and torchao's own NVFP4 / MX
quantization where its rules and microscale's coincide (docs/python.md lists where they do not)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: microscale.torch needs it")

import microscale  # noqa: E402
import microscale.torch as mst  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
E_MAX = {("nvfp4", "e4m3"): 6.0, ("mxfp4", "e4m3"): 6.0, ("mxfp8", "e4m3"): 448.0,
         ("mxfp8", "e5m2"): 57344.0}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _block_bound(x, mode, elem="e4m3", global_scale=None, scale_rule="ceil"):
    """E_max * decoded block scale per element, from the scale codes through microscale.decode
    (the element codec, independent of dequantize) and float32 numpy arithmetic."""
    _, scales = microscale.quantize(x, mode=mode, elem=elem, global_scale=global_scale,
                                    scale_rule=scale_rule, out_type="numpy")
    if mode == "nvfp4":
        s = microscale.decode(scales, "e4m3")
        if global_scale is not None:
            s = (s * np.float32(global_scale)) * np.float32(1 / 2688)
        group = 16
    else:
        s = microscale.decode(scales, "e8m0")
        group = 32
    bound = np.float32(E_MAX[(mode, elem)]) * np.repeat(s, group, axis=-1)
    return torch.from_numpy(bound)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode,kw", [("nvfp4", {}), ("nvfp4", {"three_level": True}), ("mxfp4", {}),
                                     ("mxfp4", {"scale_rule": "floor"}), ("mxfp8", {}),
                                     ("mxfp8", {"elem": "e5m2", "scale_rule": "floor"})])
def test_fake_quantize_forward_and_ste_gradient(mode, kw, dtype):
    kw = dict(kw)
    x = (torch.randn(6, 128, generator=_gen(1)) * 3).to(dtype)
    # Blocks whose max clips: nvfp4 scale E4M3(6.3/6) rounds down to 1.0, so 6.3 > 6 * 1.0
    # saturates; the floor rule puts 7 and 480 above E_max * 2^floor.
    x[0, :16] = 0.5
    x[0, 3] = 6.3
    x[1, :32] = 1.0
    x[1, 5] = 7.0 if mode == "mxfp4" else 480.0
    if kw.pop("three_level", False):
        kw["global_scale"] = float(microscale.global_scale(x))
    x.requires_grad_(True)
    y = mst.fake_quantize(x, mode=mode, **kw)
    assert y.dtype == dtype
    want = microscale.quantize_dequantize(x.detach(), mode=mode, **kw)
    assert torch.equal(y.detach(), want)
    upstream = torch.randn(x.shape, generator=_gen(2)).to(dtype)
    y.backward(upstream)
    mask = x.detach().float().abs() <= _block_bound(x.detach(), mode, **kw)
    assert torch.equal(x.grad, upstream * mask.to(dtype))
    saturated = ~mask
    if mode == "nvfp4" or kw.get("scale_rule") == "floor":
        assert saturated.any(), "the test data must saturate somewhere"
    assert mask.float().mean() > 0.9


def test_ste_zero_gradient_matches_finite_difference():
    # Where an element saturated, the forward value does not move with it: a finite difference
    # of the forward is exactly 0, which is the gradient the STE gives. In range, the forward
    # follows x on average (secant slope over many steps ~ 1), the STE's gradient of 1.
    x = torch.full((1, 16), 0.5)
    x[0, 3] = 6.3  # scale E4M3(1.05) = 1.0 for every 6.3 +- h below: 6.3 +- h clips at 6
    g = torch.zeros_like(x)
    xr = x.clone().requires_grad_(True)
    mst.fake_quantize(xr).sum().backward()
    assert xr.grad[0, 3] == 0 and (xr.grad[0, :3] == 1).all()
    for h in (0.01, 0.05):
        up, down = x.clone(), x.clone()
        up[0, 3] += h
        down[0, 3] -= h
        fd = (mst.fake_quantize(up) - mst.fake_quantize(down))[0, 3] / (2 * h)
        assert fd == g[0, 3] == 0
    xs = torch.linspace(-6, 6, 24001)
    block = torch.zeros(xs.numel(), 16)
    block[:, 0] = 6.0  # pins the block scale at 1
    block[:, 1] = xs
    yq = mst.fake_quantize(block)[:, 1]
    slope = (yq[-1] - yq[0]) / (xs[-1] - xs[0])
    assert abs(float(slope) - 1.0) < 1e-6


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_affine_ste_range(dtype):
    x = torch.randn(4, 128, generator=_gen(3)).to(dtype)
    p, s, b = microscale.quantize(x, mode="affine", bits=4, out_type="numpy")
    lo = np.repeat(b.astype(np.float32), 64, axis=-1)
    hi = lo + np.repeat(s.astype(np.float32), 64, axis=-1) * 15
    half = np.abs(hi - lo) / 30
    xf = x.float().numpy()
    inside = (xf >= np.minimum(lo, hi) - half) & (xf <= np.maximum(lo, hi) + half)
    xr = x.clone().requires_grad_(True)
    y = mst.fake_quantize(xr, mode="affine", bits=4)
    assert torch.equal(y.detach(), microscale.quantize_dequantize(x, mode="affine", bits=4))
    y.sum().backward()
    assert torch.equal(xr.grad, torch.from_numpy(inside).to(dtype))
    assert inside.mean() > 0.9  # MLX's exact-edge rescaling can leave the far edge outside


def test_fake_quantize_nonfinite_and_errors():
    x = torch.randn(2, 32)
    x[0, 4] = float("nan")
    x.requires_grad_(True)
    y = mst.fake_quantize(x, mode="mxfp4")
    assert torch.isnan(y[0]).all() and not torch.isnan(y[1]).any()
    y.nan_to_num(0).sum().backward()
    assert (x.grad[0] == 0).all() and (x.grad[1] == 1).all()
    with pytest.raises(TypeError, match="expected float32, float16 or bfloat16"):
        mst.fake_quantize(torch.zeros(2, 32, dtype=torch.float64))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        mst.fake_quantize(np.zeros((2, 32), np.float32))
    with pytest.raises(ValueError, match="16"):
        mst.fake_quantize(torch.zeros(2, 30))


# ---- torchao ----------------------------------------------------------------------------------

def _torchao_mx():
    pytest.importorskip("torchao", reason="torchao is not installed: the torchao comparisons need it")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import MXTensor
    return MXTensor, ScaleCalculationMode


def _torchao_nvfp4():
    pytest.importorskip("torchao", reason="torchao is not installed: the torchao comparisons need it")
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale
    return NVFP4Tensor, per_tensor_amax_to_scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("three_level", [False, True])
def test_nvfp4_matches_torchao(three_level, dtype):
    NVFP4Tensor, amax_to_scale = _torchao_nvfp4()
    x = (torch.randn(64, 256, generator=_gen(4)) * torch.exp(torch.randn(64, 1, generator=_gen(5)))).to(dtype)
    amax = x.float().abs().max()
    t = NVFP4Tensor.to_nvfp4(x, per_tensor_scale=amax_to_scale(amax) if three_level else None)
    g = float(amax) if three_level else None
    packed, scales = microscale.quantize(x, mode="nvfp4", global_scale=g)
    ao_scales = t.scale.view(torch.uint8).reshape(scales.shape)
    # torchao clamps a block scale below 2^-6 (E4M3's smallest normal, code 0x08) up to it
    normal = ao_scales.int() > 8
    assert normal.float().mean() > 0.5
    assert torch.equal(scales[normal], ao_scales[normal])
    rows = normal.all(dim=1)
    assert rows.any()
    ours = microscale.dequantize(packed, scales, mode="nvfp4", global_scale=g)[rows]
    theirs = t.dequantize(torch.float32)[rows]
    if not three_level:
        assert torch.equal(packed[rows], t.qdata.view(torch.uint8).reshape(packed.shape)[rows])
        assert torch.equal(ours, theirs)
        return
    # Three-level: the encode factor is TE's 1 / (val(s) * (amax/2688)) in microscale and
    # (2688/amax) / val(s) in torchao, and the decode val(q) * ((val(s) * amax) * fl(1/2688)) vs
    # val(q) * (val(s) * (amax/2688)) (docs/numerics.md: the operation order is TE's). The codes
    # differ only where x sits on an E2M1 rounding tie, and the values by float32 rounding.
    differ = ~torch.isclose(ours, theirs, rtol=3e-7, atol=0)
    assert differ.float().mean() < 0.01
    xs = x.float()[rows][differ].double()
    midpoint = (ours[differ].double() + theirs[differ].double()) / 2
    assert torch.all((xs - midpoint).abs() <= 1e-6 * xs.abs()), "codes differ away from a tie"


def test_nvfp4_torchao_difference_small_blocks():
    NVFP4Tensor, _ = _torchao_nvfp4()
    x = torch.full((1, 16), 0.03)  # block scale 0.005: an E4M3 subnormal (below 2^-6)
    t = NVFP4Tensor.to_nvfp4(x)
    _, scales = microscale.quantize(x, mode="nvfp4")
    assert t.scale.view(torch.uint8).item() == 0x08  # torchao: clamped to 2^-6
    assert microscale.decode(scales, "e4m3").item() == 0.005859375  # microscale: E4M3(0.005) = 3*2^-9


@pytest.mark.parametrize("mode,elem", [("mxfp4", "e4m3"), ("mxfp8", "e4m3"), ("mxfp8", "e5m2")])
@pytest.mark.parametrize("rule,ao_rule", [("ceil", "RCEIL"), ("floor", "FLOOR"), ("even", "EVEN")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_mx_matches_torchao(mode, elem, rule, ao_rule, dtype):
    MXTensor, SCM = _torchao_mx()
    ao_elem = {"mxfp4": torch.float4_e2m1fn_x2, "e4m3": torch.float8_e4m3fn,
               "e5m2": torch.float8_e5m2}["mxfp4" if mode == "mxfp4" else elem]
    x = (torch.randn(32, 256, generator=_gen(6)) * torch.exp(2 * torch.randn(32, 1, generator=_gen(7)))).to(dtype)
    t = MXTensor.to_mx(x, ao_elem, 32, scaling_mode=getattr(SCM, ao_rule))
    packed, scales = microscale.quantize(x, mode=mode, elem=elem, scale_rule=rule)
    assert torch.equal(scales, t.scale.view(torch.uint8).reshape(scales.shape))
    assert torch.equal(packed, t.qdata.view(torch.uint8).reshape(packed.shape))
    ours = microscale.dequantize(packed, scales, mode=mode, elem=elem, dtype=dtype)
    assert torch.equal(ours, t.dequantize(dtype))


# ---- the modules --------------------------------------------------------------------------------

def test_quantized_linear_module_matches_torchao_weight():
    NVFP4Tensor, amax_to_scale = _torchao_nvfp4()
    lin = torch.nn.Linear(256, 48)
    with torch.no_grad():
        lin.weight += 0.5 * torch.sign(lin.weight)  # every block scale normal (see above)
    m = mst.QuantizedLinear.from_linear(lin, mode="nvfp4")
    w = lin.weight.detach()
    amax = w.abs().max()
    t = NVFP4Tensor.to_nvfp4(w, per_tensor_scale=amax_to_scale(amax))
    assert torch.equal(m.weight, t.qdata.view(torch.uint8).reshape(m.weight.shape))
    assert torch.equal(m.scales, t.scale.view(torch.uint8).reshape(m.scales.shape))
    assert m.global_scale == float(amax)
    x = torch.randn(5, 256, generator=_gen(8))
    y = m(x)
    assert isinstance(y, torch.Tensor) and y.shape == (5, 48)
    want = x.double() @ t.dequantize(torch.float32).double().T + lin.bias.detach().double()
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
    numpy_layer = microscale.QuantizedLinear.from_linear(w.numpy(), lin.bias.detach().numpy())
    assert np.array_equal(y.detach().numpy(), numpy_layer(x.numpy()))
    assert set(m.state_dict()) == {"weight", "scales", "bias"}


@pytest.mark.parametrize("static", [False, True])
def test_qqlinear_module_matches_torchao_w4a4(static):
    NVFP4Tensor, amax_to_scale = _torchao_nvfp4()
    w = torch.randn(48, 256, generator=_gen(9))
    w += 0.5 * torch.sign(w)
    m = mst.QQLinear.from_linear(w, mode="nvfp4")
    x = torch.randn(4, 256, generator=_gen(10))
    x += 0.5 * torch.sign(x)
    x_amax = x.abs().max()
    if static:
        m.calibrate([x * 0.5, x])
        assert m.input_global_scale == float(x_amax)
        x = 0.9 * x  # a later batch quantized with the frozen scale
    y = m(x)
    # torchao's W4A4 product (NVFP4DynamicActivationNVFP4WeightConfig) runs torch._scaled_mm on
    # Blackwell GPUs only; on the CPU the reference is its quantized operands, dequantized by
    # torchao, multiplied in float64.
    tw = NVFP4Tensor.to_nvfp4(w, per_tensor_scale=amax_to_scale(w.abs().max()))
    tx = NVFP4Tensor.to_nvfp4(x, per_tensor_scale=amax_to_scale(x_amax if static else x.abs().max()))
    want = tx.dequantize(torch.float32).double() @ tw.dequantize(torch.float32).double().T
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-4)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32


def test_modules_refuse_bad_input():
    with pytest.raises(ValueError, match="mode must be nvfp4, mxfp4 or mxfp8"):
        mst.QQLinear.from_linear(torch.randn(8, 64), mode="affine")
    with pytest.raises(ValueError, match="brings its own bias"):
        mst.QuantizedLinear.from_linear(torch.nn.Linear(64, 8), bias=torch.zeros(8))
    m = mst.QQLinear.from_linear(torch.randn(8, 64))
    with pytest.raises(ValueError, match="NaN or Inf"):
        m.calibrate([torch.full((2, 64), float("inf"))])
    with pytest.raises(ValueError, match="mode: unknown mode"):
        mst.QuantizedLinear(torch.zeros(8, 32, dtype=torch.uint8), torch.zeros(8, 4, dtype=torch.uint8),
                            mode="int4")


def test_modules_from_float_is_from_linear():
    """torch.ao's quantized modules are built with from_float(float_module): the modules here
    take it as from_linear."""
    lin = torch.nn.Linear(64, 16)
    x = torch.randn(3, 64, generator=_gen(11))
    for cls, mode in ((mst.QuantizedLinear, "mxfp4"), (mst.QQLinear, "mxfp8")):
        got = cls.from_float(lin, mode=mode)
        assert isinstance(got, cls)
        assert torch.equal(got(x), cls.from_linear(lin, mode=mode)(x))


# ---- microscale.torch runs microscale's parallel loops on torch's OpenMP team


@pytest.mark.skipif("ATen parallel backend: OpenMP" not in torch.__config__.parallel_info(),
                    reason="this torch does not run on OpenMP")
def test_products_share_torchs_openmp_team():
    assert microscale._core._has_parallel_runner()
    torch.manual_seed(5)
    lin = mst.QuantizedLinear.from_linear(torch.nn.Linear(512, 384), mode="nvfp4")
    xs = [torch.randn(1, 512), torch.randn(40, 512)]
    torch.set_num_threads(2)
    on_team = [lin(x) for x in xs]
    try:
        microscale._core._set_parallel_runner(0)
        assert not microscale._core._has_parallel_runner()
        own_pool = [lin(x) for x in xs]
    finally:
        mst._share_torch_threads()
    for a, b in zip(on_team, own_pool):
        assert torch.equal(a, b)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork on this platform")
def test_forked_child_runs_products_on_its_own_pool():
    import os

    lin = mst.QuantizedLinear.from_linear(torch.nn.Linear(256, 128), mode="mxfp4")
    x = torch.randn(8, 256)
    expected = lin(x)
    pid = os.fork()
    if pid == 0:  # the child: no OpenMP team of the parent's to enter
        code = 0 if (not microscale._core._has_parallel_runner() and torch.equal(lin(x), expected)) else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0



# ---- DenseLinear: an nn.Linear whose few-row CPU products run microscale.linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_dense_linear_equals_nn_linear_up_to_summation_order(dtype, rows):
    torch.manual_seed(rows)
    lin = torch.nn.Linear(300, 77).to(dtype).requires_grad_(False)
    dense = mst.DenseLinear.sharing(lin)
    assert dense.weight is lin.weight and dense.bias is lin.bias
    x = torch.randn(rows, 300).to(dtype)
    got = dense(x)
    assert got.dtype == dtype and got.shape == (rows, 77)
    exact = x.double() @ lin.weight.double().T + lin.bias.double()
    # Float32 sums of 300 products, rounded once to dtype: within the sum's bound plus one rounding.
    magnitude = x.double().abs() @ lin.weight.double().abs().T + lin.bias.double().abs()
    rounding = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[dtype]
    assert ((got.double() - exact).abs() <= 301 * 2.0 ** -24 * magnitude + rounding * exact.abs()).all()


def test_dense_linear_takes_torchs_path_for_many_rows_and_gives_linears_gradients():
    torch.manual_seed(2)
    lin = torch.nn.Linear(64, 16)
    dense = mst.DenseLinear.sharing(lin)
    x = torch.randn(9, 64)
    assert torch.equal(dense(x), lin(x))  # more than MAX_ROWS rows: nn.Linear itself
    x1 = torch.randn(2, 64, requires_grad=True)
    y = dense(x1)
    with torch.no_grad():
        assert torch.equal(y, dense(x1))  # with or without gradients: the same product
    g = torch.randn(2, 16)
    y.backward(g)
    assert torch.allclose(x1.grad, g @ lin.weight, atol=1e-6)
    assert torch.allclose(lin.weight.grad, g.T @ x1.detach(), atol=1e-6)
    assert torch.allclose(lin.bias.grad, g.sum(0))


def test_microscale_linear_refuses_by_name():
    with pytest.raises(ValueError, match="linear: x's last axis"):
        microscale.linear(np.ones((2, 8), np.float32), np.ones((4, 16), np.float32))
    with pytest.raises(ValueError, match="bias must have shape"):
        microscale.linear(np.ones((2, 8), np.float32), np.ones((4, 8), np.float32), np.ones(3, np.float32))
    with pytest.raises(TypeError, match="w: unsupported dtype int32"):
        microscale.linear(np.ones((2, 8), np.float32), np.ones((4, 8), np.int32))
