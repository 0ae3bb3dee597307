"""DLPack in and out: torch, MLX and other DLPack producers go in without a copy and results
come back as the input's array type (issue 14). The numpy path is the reference: it is tested
against the spec oracle elsewhere, so each test here compares a foreign array type's results
with the numpy results for the same values."""

import numpy as np
import pytest

import microscale
from conftest import BF16, FLOAT_DTYPES, assert_same_bits


class Producer:
    """A DLPack producer that is not a numpy array (as JAX or CuPy host arrays are to us)."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, **kwargs):
        return self.arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_any_dlpack_producer_is_read_in_place(rng):
    w = rng.standard_normal((8, 64)).astype(np.float32)
    view = microscale._as_array(Producer(w), "w")
    assert view.ctypes.data == w.ctypes.data and not view.flags.writeable
    got = microscale.quantize(Producer(w), mode="mxfp4")
    assert all(isinstance(a, np.ndarray) for a in got)  # unknown producers give numpy
    for a, b in zip(got, microscale.quantize(w, mode="mxfp4")):
        assert_same_bits(a, b)


def test_strided_producer_is_read_in_place(rng):
    base = rng.standard_normal((64, 48)).astype(np.float32)
    w = base[:, ::3].T  # [16, 64]: both axes strided
    view = microscale._as_array(Producer(w), "w")
    assert view.ctypes.data == w.ctypes.data and view.strides == w.strides
    for a, b in zip(microscale.quantize(Producer(w)), microscale.quantize(np.ascontiguousarray(w))):
        assert_same_bits(a, b)


def test_out_type_numpy_input(rng):
    w = rng.standard_normal((2, 32)).astype(np.float32)
    assert isinstance(microscale.quantize_dequantize(w, out_type="numpy"), np.ndarray)
    assert isinstance(microscale.quantize_dequantize(w, out_type=microscale.OutType.numpy), np.ndarray)
    with pytest.raises(ValueError, match="out_type must be None, 'numpy', 'torch' or 'mlx'"):
        microscale.quantize_dequantize(w, out_type="cupy")


# ---- quantize_dequantize ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("mode,kw", [("nvfp4", {}), ("nvfp4", {"global_scale": True}), ("mxfp4", {}),
                                     ("mxfp8", {"elem": "e5m2"}), ("mxfp4", {"scale_rule": "floor"}),
                                     ("affine", {"bits": 3})])
def test_quantize_dequantize_is_the_two_calls(mode, kw, dtype, rng):
    x = (rng.standard_normal((5, 128)) * 3).astype(dtype)
    x[1, 7] = np.nan
    kw = dict(kw)
    if kw.get("global_scale") is True:
        kw["global_scale"] = microscale.global_scale(x)
    want = microscale.dequantize(*microscale.quantize(x, mode=mode, **kw), mode=mode, dtype=x.dtype,
                                 **{k: v for k, v in kw.items() if k != "scale_rule"})
    got = microscale.quantize_dequantize(x, mode=mode, **kw)
    assert_same_bits(got, want, f"{mode} {kw}")
    assert_same_bits(microscale.quantize_dequantize(x, mode=mode, dtype="float32", **kw),
                     microscale.dequantize(*microscale.quantize(x, mode=mode, **kw), mode=mode,
                                           **{k: v for k, v in kw.items() if k != "scale_rule"}))


def test_quantize_dequantize_errors(rng):
    x = rng.standard_normal((2, 30)).astype(np.float32)
    with pytest.raises(ValueError, match="16"):
        microscale.quantize_dequantize(x, mode="nvfp4")
    with pytest.raises(TypeError, match="x: unsupported dtype int32"):
        microscale.quantize_dequantize(np.zeros((2, 32), np.int32))


# ---- torch -------------------------------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch", reason="torch is not installed: the torch DLPack tests need it")


def _torch_dtype(torch, dt):
    return {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
            BF16: torch.bfloat16}[np.dtype(dt)]


def _np(t):
    """numpy copy of a torch tensor, bfloat16 as ml_dtypes.bfloat16 (an independent path)."""
    import torch
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_torch_every_function(dtype, rng):
    torch = _torch()
    w_np = rng.standard_normal((32, 64)).astype(dtype)
    x_np = rng.standard_normal((3, 64)).astype(dtype)
    w = torch.from_numpy(w_np.view(np.int16)).view(torch.bfloat16) if w_np.dtype == BF16 else torch.from_numpy(w_np)
    x = torch.from_numpy(x_np.view(np.int16)).view(torch.bfloat16) if x_np.dtype == BF16 else torch.from_numpy(x_np)
    assert w.dtype == _torch_dtype(torch, dtype)

    for mode in ("nvfp4", "mxfp4", "mxfp8", "affine"):
        parts = microscale.quantize(w, mode=mode)
        ref = microscale.quantize(w_np, mode=mode)
        for a, b in zip(parts, ref):
            assert isinstance(a, torch.Tensor)
            assert_same_bits(_np(a), b, mode)
        y = microscale.dequantize(*parts, mode=mode, dtype=dtype)
        assert isinstance(y, torch.Tensor) and y.dtype == w.dtype
        assert_same_bits(_np(y), microscale.dequantize(*ref, mode=mode, dtype=dtype))
        fq = microscale.quantize_dequantize(w, mode=mode)
        assert isinstance(fq, torch.Tensor) and fq.dtype == w.dtype
        assert_same_bits(_np(fq), _np(y))
        mm = microscale.quantized_matmul(x, *parts, mode=mode)
        assert isinstance(mm, torch.Tensor)
        assert_same_bits(_np(mm), microscale.quantized_matmul(x_np, *ref, mode=mode))
    q = microscale.qqmm(x, w, mode="nvfp4")
    assert isinstance(q, torch.Tensor) and q.dtype == x.dtype
    assert_same_bits(_np(q), microscale.qqmm(x_np, w_np, mode="nvfp4"))
    g = microscale.gather_qmm(x[None], *microscale.quantize(w[None], mode="mxfp8"), mode="mxfp8",
                              rhs_indices=torch.zeros(1, dtype=torch.int64))
    assert isinstance(g, torch.Tensor)
    assert microscale.global_scale(w) == microscale.global_scale(w_np)


def test_torch_codes_and_scales_dtypes(rng):
    torch = _torch()
    w = torch.from_numpy(rng.standard_normal((4, 64)).astype(np.float32))
    for mode, f8 in (("nvfp4", torch.float8_e4m3fn), ("mxfp4", torch.float8_e8m0fnu)):
        packed, scales = microscale.quantize(w, mode=mode)
        assert packed.dtype == torch.uint8 and scales.dtype == torch.uint8
        want = microscale.dequantize(packed, scales, mode=mode)
        # float8 scale tensors are read as their codes; uint32 packed values as their bytes
        packed32 = packed.view(torch.int32).view(torch.uint32) if hasattr(torch, "uint32") else None
        assert_same_bits(_np(microscale.dequantize(packed, scales.view(f8), mode=mode)), _np(want))
        if packed32 is not None:
            assert_same_bits(_np(microscale.dequantize(packed32, scales, mode=mode)), _np(want))
    e4m3 = torch.tensor([1.5, -448.0, 0.0], dtype=torch.float8_e4m3fn)
    assert microscale.decode(e4m3, "e4m3").tolist() == [1.5, -448.0, 0.0]
    bits = microscale.encode(torch.tensor([1.0, -2.0]), "bf16")
    assert bits.dtype == torch.uint16 and bits.tolist() == [0x3F80, 0xC000]
    _, scales = microscale.quantize(torch.randn(40, 64), mode="mxfp8")
    sw = microscale.swizzle_scales(scales)
    assert isinstance(sw, torch.Tensor) and sw.shape == (128, 4)
    assert torch.equal(microscale.unswizzle_scales(sw, 40, 2), scales)


def test_torch_no_copy_in(rng):
    torch = _torch()
    base = torch.randn(64, 96, dtype=torch.bfloat16)
    for t in (base, base.T, base[::2, 16:80], base.requires_grad_(True)):
        view = microscale._as_array(t, "x")
        assert view.ctypes.data == t.data_ptr()
        assert view.dtype == BF16 and view.shape == tuple(t.shape)
        assert view.strides == tuple(s * 2 for s in t.stride())
    # strided inputs give the contiguous copy's results
    t = base.detach().T[:, :64]
    for a, b in zip(microscale.quantize(t, mode="nvfp4"), microscale.quantize(t.contiguous(), mode="nvfp4")):
        assert torch.equal(a, b)


def test_torch_no_copy_out(monkeypatch, rng):
    torch = _torch()
    made = []
    real = microscale._core.quantize_dequantize

    def spy(*args):
        made.append(real(*args))
        return made[-1]

    monkeypatch.setattr(microscale._core, "quantize_dequantize", spy)
    for dt in (torch.float32, torch.bfloat16):
        y = microscale.quantize_dequantize(torch.randn(4, 32, dtype=dt))
        assert isinstance(y, torch.Tensor) and y.dtype == dt
        assert y.data_ptr() == made[-1].ctypes.data  # the buffer microscale wrote, shared
    parts = microscale.quantize(torch.randn(4, 32), mode="nvfp4")
    packed, scales = parts
    del parts
    import gc
    gc.collect()
    assert packed.sum() >= 0 and scales.shape == (4, 2)  # the tensors own their buffers


def test_quantize_fast_path_matches_general_path(rng):
    """quantize's one-call path (_core.quantize_fast, issue 14's overhead target) takes numpy
    arrays and CPU torch tensors of every float dtype and layout in place, and gives the general
    path's bytes and types (out_type= forces the general path); other inputs are left to it."""
    torch = _torch()
    core = microscale._core
    base = torch.from_numpy(rng.standard_normal((64, 128)).astype(np.float32))
    tensors = [base, base.T, base[::2, 32:96], base.clone().requires_grad_(True),
               torch.nn.Parameter(base.clone()), base.to(torch.bfloat16).T, base.to(torch.float16)[:, :64]]
    for mode in ("nvfp4", "mxfp4", "affine"):
        spec = microscale._spec(mode)
        for t in tensors:
            assert core.quantize_fast(t, spec, True) is not None
            fast = microscale.quantize(t, mode=mode)
            general = microscale.quantize(t, mode=mode, out_type="torch")
            assert len(fast) == len(general)
            for f, g in zip(fast, general):
                assert isinstance(f, torch.Tensor) and f.dtype == g.dtype and not f.requires_grad
                assert torch.equal(f, g)
            a = _np(t.detach())
            for arr in (a, a[:, ::-1][:, ::-1], np.asfortranarray(a)):
                assert core.quantize_fast(arr, spec, False) is not None
                for f, g in zip(microscale.quantize(arr, mode=mode),
                                microscale.quantize(arr, mode=mode, out_type="numpy")):
                    assert type(f) is np.ndarray and f.dtype == g.dtype
                    assert_same_bits(f, g)
    spec = microscale._spec("nvfp4")
    for declined in (base.to(torch.float8_e4m3fn), base.to(torch.int32), torch.empty(0, 32),
                     torch.empty(4, 32, device="meta"), base.numpy()[:, ::-1],
                     base.numpy().astype(">f4"), base.numpy().astype(np.int32)):
        assert core.quantize_fast(declined, spec, isinstance(declined, torch.Tensor)) is None
    assert core.quantize_fast(base, microscale._spec("nvfp4", global_scale=2.0, scale_search="mse"),
                              True) is None


def test_quantize_parts_share_buffers():
    """The exporter of the one-call path hands torch the buffers microscale wrote (no copy): the
    torch parts of a Quantized have the data pointers of its numpy parts."""
    torch = _torch()
    x = np.linspace(-3, 3, 8 * 64, dtype=np.float32).reshape(8, 64)
    for mode in ("nvfp4", "affine"):
        q = microscale._core.quantize(x.astype(BF16), microscale._spec(mode))
        numpy_parts = q.parts(False)
        torch_parts = q.parts(True)
        assert len(numpy_parts) == len(torch_parts) == (3 if mode == "affine" else 2)
        assert numpy_parts[0].ctypes.data == q.packed.ctypes.data  # numpy parts share q's buffers
        for n, t in zip(numpy_parts, torch_parts):
            assert t.data_ptr() == n.ctypes.data
            assert t.shape == n.shape and isinstance(t, torch.Tensor)
        if mode == "affine":
            assert torch_parts[1].dtype == torch.bfloat16 and numpy_parts[1].dtype == BF16


def test_torch_out_type_override(rng):
    torch = _torch()
    w = torch.randn(2, 32)
    assert isinstance(microscale.quantize_dequantize(w, out_type="numpy"), np.ndarray)
    y = microscale.quantize_dequantize(w.numpy(), out_type="torch")
    assert isinstance(y, torch.Tensor)
    assert torch.equal(y, microscale.quantize_dequantize(w))


def test_torch_layers(rng):
    torch = _torch()
    w = torch.randn(32, 64, dtype=torch.bfloat16)
    b = torch.randn(32, dtype=torch.bfloat16)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    lin = microscale.QuantizedLinear.from_linear(w, bias=b, mode="nvfp4")
    ref = microscale.QuantizedLinear.from_linear(_np(w), bias=_np(b), mode="nvfp4")
    y = lin(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
    assert_same_bits(_np(y), ref(_np(x)))
    qq = microscale.QQLinear.from_linear(w, mode="nvfp4").calibrate([x])
    assert isinstance(qq(x), torch.Tensor)
    emb = microscale.QuantizedEmbedding.from_embedding(w, mode="affine")
    rows = emb(torch.tensor([3, 1]))
    assert isinstance(rows, torch.Tensor) and rows.dtype == torch.bfloat16 and rows.shape == (2, 64)


# ---- MLX ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
def test_mlx_in_mlx_out(name, rng):
    mx = pytest.importorskip("mlx.core", reason="mlx is not installed: the MLX DLPack tests need it")
    w_np = rng.standard_normal((8, 64)).astype(np.float32)
    w = mx.array(w_np).astype(getattr(mx, name))
    ref_in = np.asarray(w.astype(mx.float32)).astype(np.dtype(BF16 if name == "bfloat16" else name))
    y = microscale.quantize_dequantize(w, mode="nvfp4")
    assert isinstance(y, mx.array) and y.dtype == getattr(mx, name)
    want = microscale.quantize_dequantize(ref_in, mode="nvfp4")
    assert_same_bits(np.asarray(y.astype(mx.float32)).astype(want.dtype), want)
    packed, scales = microscale.quantize(w, mode="mxfp4")
    assert isinstance(packed, mx.array) and packed.dtype == mx.uint8
    y = microscale.dequantize(packed, scales, mode="mxfp4", dtype=getattr(mx, name))
    assert isinstance(y, mx.array) and y.dtype == getattr(mx, name)
    ref_parts = microscale.quantize(ref_in, mode="mxfp4")
    assert_same_bits(np.asarray(y.astype(mx.float32)).astype(want.dtype),
                     microscale.dequantize(*ref_parts, mode="mxfp4", dtype=want.dtype))
    x = mx.array(rng.standard_normal((3, 64)).astype(np.float32)).astype(getattr(mx, name))
    mm = microscale.quantized_matmul(x, packed, scales, mode="mxfp4")
    assert isinstance(mm, mx.array) and mm.shape == (3, 8)
    wt = mx.array(np.ascontiguousarray(w_np.T)).astype(getattr(mx, name)).T  # a transposed view
    got = microscale.quantize_dequantize(wt, mode="nvfp4")
    assert_same_bits(np.asarray(got.astype(mx.float32)).astype(want.dtype), want)


def test_spec_cache_keeps_argument_checks(rng):
    # Specs are cached by argument; True == 1 and 16.0 == 16 must still be refused after the
    # equal int was accepted, and an array global scale (unhashable) still works.
    w = rng.standard_normal((2, 32)).astype(np.float32)
    microscale.quantize(w, mode="nvfp4", group_size=16)
    with pytest.raises(TypeError, match="group_size must be an int or None, got bool"):
        microscale.quantize(w, mode="mxfp4", group_size=True, bits=4)
    microscale.quantize(w, mode="mxfp4", group_size=32, bits=4)
    with pytest.raises(TypeError, match="group_size must be an int or None, got float"):
        microscale.quantize(w, mode="mxfp4", group_size=32.0, bits=4)
    g = microscale.global_scale(w)
    a = microscale.quantize(w, mode="nvfp4", global_scale=np.array([g]))
    b = microscale.quantize(w, mode="nvfp4", global_scale=float(g))
    for x, y in zip(a, b):
        assert_same_bits(x, y)


def test_torch_checkpoint_tensors_keep_their_dtype(tmp_path, rng):
    import json
    import struct

    torch = _torch()
    w = torch.randn(8, 64, dtype=torch.bfloat16)
    q = microscale.QuantizedWeight.from_float(w, mode="nvfp4")
    q.packed, q.scales = torch.from_numpy(q.packed), torch.from_numpy(q.scales).view(torch.float8_e4m3fn)
    norm = torch.ones(64, dtype=torch.bfloat16)
    microscale.save_checkpoint(tmp_path / "a", {"lin": q}, {"norm.weight": norm}, export="compressed-tensors")
    back = microscale.load_checkpoint(tmp_path / "a")
    assert back.tensors["norm.weight"].dtype == BF16
    assert (back.tensors["norm.weight"].astype(np.float32) == 1).all()
    assert_same_bits(back.layers["lin"].dequantize(), microscale.dequantize(
        q.packed.numpy(), q.scales.view(torch.uint8).numpy(), mode="nvfp4"))
    # A torch float8 tensor is stored as F8_E4M3 (its codes, read through the header), not U8.
    fp8 = torch.tensor([1.5, -448.0], dtype=torch.float8_e4m3fn)
    microscale.save_checkpoint(tmp_path / "b", {"lin": q}, {"fp8.weight": fp8}, export="compressed-tensors")
    raw = (tmp_path / "b" / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    entry = json.loads(raw[8:8 + n])["fp8.weight"]
    assert entry["dtype"] == "F8_E4M3" and entry["shape"] == [2]
    start, end = entry["data_offsets"]
    assert raw[8 + n + start:8 + n + end] == bytes(fp8.view(torch.uint8).tolist())


def test_out_type_of_a_missing_package(monkeypatch, rng):
    w = rng.standard_normal((2, 32)).astype(np.float32)
    monkeypatch.setattr(microscale, "_torch", None)  # forget a torch bound by earlier tests
    for name, module in (("torch", "torch"), ("mlx", "mlx.core")):
        monkeypatch.setitem(__import__("sys").modules, module, None)  # import fails as if absent
        with pytest.raises(ImportError, match=f"out_type='{name}' needs"):
            microscale.quantize_dequantize(w, out_type=name)


def _cuda_capsule_producer():
    """A DLPack producer whose tensor claims to live in CUDA memory (a hand-built legacy
    DLManagedTensor; its data pointer is never read)."""
    import ctypes

    class Device(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

    class DType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

    class Tensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device", Device), ("ndim", ctypes.c_int32),
                    ("dtype", DType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                    ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]

    class Managed(ctypes.Structure):
        _fields_ = [("dl_tensor", Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]

    shape = (ctypes.c_int64 * 2)(2, 32)
    managed = Managed(Tensor(0x1000, Device(2, 0), 2, DType(2, 32, 1), shape, None, 0), None, None)
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

    class CudaProducer:
        keep = (shape, managed)

        def __dlpack__(self, **kwargs):
            return new_capsule(ctypes.addressof(managed), b"dltensor", None)

        def __dlpack_device__(self):
            return (2, 0)

    return CudaProducer()


def test_device_memory_is_refused_by_name():
    with pytest.raises(ValueError, match=r"x: the array is in CUDA memory \(DLPack device type 2\).*\.cpu\(\)"):
        microscale.quantize_dequantize(_cuda_capsule_producer())


# ---- float8 codes of the wrong format (issue 27) -----------------------------------------------

_F8 = ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
_SCALE_TYPE = {"nvfp4": "float8_e4m3fn", "mxfp4": "float8_e8m0fnu", "mxfp8": "float8_e8m0fnu"}


def _float8_makers():
    """(label, make(uint8 numpy codes, float8 name) -> that array type holding those codes)."""
    import ml_dtypes

    makers = [("numpy", lambda c, name: c.view(getattr(ml_dtypes, name)))]
    try:
        import torch
    except ImportError:
        return makers
    makers.append(("torch", lambda c, name: torch.from_numpy(c).view(getattr(torch, name))))
    # A producer that is not torch: its float8 type arrives as a DLPack type code.
    makers.append(("dlpack", lambda c, name: Producer(torch.from_numpy(c).view(getattr(torch, name)))))
    return makers


@pytest.mark.parametrize("maker", _float8_makers(), ids=lambda m: m[0])
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8"])
def test_float8_scales_must_be_the_modes_scale_format(maker, mode, rng):
    """Scales of the mode's float8 type are read as its codes; another float8 type holds another
    format's codes (an mxfp4 dequantize of E4M3-typed scales came out 4x off) and is refused with
    the argument and the expected format named, by every function that takes scales."""
    _, make = maker
    w = rng.standard_normal((8, 64)).astype(np.float32)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    packed, scales = microscale.quantize(w, mode=mode)
    fmt = "E4M3" if mode == "nvfp4" else "E8M0"
    calls = {
        "dequantize": lambda s: microscale.dequantize(packed, s, mode=mode, out_type="numpy"),
        "quantized_matmul": lambda s: microscale.quantized_matmul(x, packed, s, mode=mode),
        "gather_qmm": lambda s: microscale.gather_qmm(x, packed[None], s, mode=mode, out_type="numpy"),
        "qqmm": lambda s: microscale.qqmm(x, packed, s, mode=mode),
        "QuantizedLinear": lambda s: microscale.QuantizedLinear(packed, s, mode=mode)(x),
        "QuantizedWeight._to_core": lambda s: microscale.QuantizedWeight(
            packed, s, None, mode, 16 if mode == "nvfp4" else 32, 8 if mode == "mxfp8" else 4,
            (8, 64))._to_core().scales,
    }
    for fn, call in calls.items():
        base = scales[None] if fn == "gather_qmm" else scales  # one expert
        want = call(base)
        for name in _F8:
            s = make(base, name)
            if name == _SCALE_TYPE[mode]:
                assert_same_bits(np.asarray(call(s)), np.asarray(want), f"{fn} {name}")
                continue
            with pytest.raises(TypeError, match=rf"scales.*{mode} scales are {fmt} codes, uint8 or "
                                                rf"{_SCALE_TYPE[mode]}; got {name}"):
                call(s)


@pytest.mark.parametrize("maker", _float8_makers(), ids=lambda m: m[0])
def test_float8_packed_values_and_affine_scales(maker, rng):
    """mxfp8 packed values may be their element type; the fp4 modes' packed pairs and affine's
    float scales are no float8 type."""
    _, make = maker
    w = rng.standard_normal((8, 64)).astype(np.float32)
    for elem, name in (("e4m3", "float8_e4m3fn"), ("e5m2", "float8_e5m2")):
        packed, scales = microscale.quantize(w, mode="mxfp8", elem=elem)
        want = microscale.dequantize(packed, scales, mode="mxfp8", elem=elem)
        got = microscale.dequantize(make(packed, name), scales, mode="mxfp8", elem=elem, out_type="numpy")
        assert_same_bits(got, want, elem)
        other = "float8_e5m2" if elem == "e4m3" else "float8_e4m3fn"
        with pytest.raises(TypeError, match=rf"w_q: mxfp8 {elem} elements are {elem.upper()} codes, "
                                            rf"uint8 or {name}; got {other}"):
            microscale.dequantize(make(packed, other), scales, mode="mxfp8", elem=elem)
    packed, scales = microscale.quantize(w, mode="nvfp4")
    with pytest.raises(TypeError, match="w_q: nvfp4 packs its codes into bytes"):
        microscale.dequantize(make(packed, "float8_e4m3fn"), scales, mode="nvfp4")
    packed, scales, biases = microscale.quantize(w, mode="affine")
    with pytest.raises(TypeError, match="scales: affine scales are not 8-bit codes"):
        microscale.dequantize(packed, make(scales.view(np.uint8)[..., :1].copy(), "float8_e4m3fn"),
                              biases, mode="affine")


def test_float8_types_microscale_does_not_read_are_refused(rng):
    """float8 types of no format microscale reads (the FNUZ variants) are a TypeError naming the
    argument, not their bytes read as codes."""
    import ml_dtypes

    w = rng.standard_normal((8, 64)).astype(np.float32)
    packed, scales = microscale.quantize(w, mode="nvfp4")
    for name in ("float8_e4m3fnuz", "float8_e5m2fnuz"):
        with pytest.raises(TypeError, match=rf"scales: unsupported dtype {name}"):
            microscale.dequantize(packed, scales.view(getattr(ml_dtypes, name)), mode="nvfp4")
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="scales: unsupported dtype float8_e4m3fnuz"):
        microscale.dequantize(packed, torch.from_numpy(scales).view(torch.float8_e4m3fnuz), mode="nvfp4")
