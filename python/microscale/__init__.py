"""microscale: microscaling block-quantized formats (NVFP4, MXFP4, MXFP8, MLX-style affine).

The functions follow MLX's ``mx.quantize`` / ``mx.dequantize`` shape conventions on numpy arrays;
the numerics are microscale's contract (FORMATS.md sections 1-4):

>>> import numpy as np, microscale
>>> w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
>>> wq, scales = microscale.quantize(w, mode="nvfp4")                  # 2-level NVFP4
>>> wq.shape, scales.shape
((4, 32), (4, 4))
>>> w2 = microscale.dequantize(wq, scales, mode="nvfp4")              # float32 by default
>>> g = microscale.global_scale(w)                                    # tensor amax
>>> wq, scales = microscale.quantize(w, mode="nvfp4", global_scale=g)  # 3-level NVFP4
>>> wq, scales, biases = microscale.quantize(w, mode="affine", group_size=64, bits=4)

Inputs may be float32, float16 or bfloat16 arrays of any rank >= 1 and any strides: numpy
(``ml_dtypes.bfloat16``) or any host array with ``__dlpack__`` (torch, MLX, JAX), read in place
with no copy; quantization runs along the last axis. Results come back as the first array
argument's type: torch in, torch out (sharing microscale's buffer, no copy); MLX in, MLX out (MLX
copies host memory on import); numpy and other types give numpy. ``out_type=`` ("numpy",
"torch", "mlx") overrides it. Packed values are uint8 ``[..., K*bits/8]`` (viewed as
little-endian uint32 they are MLX's ``w_q``); fp-mode scales are uint8 codes ``[..., K/group]``
(E4M3 for nvfp4, E8M0 for mxfp4/mxfp8), or an array of that format's float8 type (torch or
ml_dtypes ``float8_e4m3fn`` / ``float8_e8m0fnu``; another float8 type is refused, see
docs/python.md); affine scales and biases have the input's dtype.
Errors in the arguments or the data raise ``ValueError``; unsupported array dtypes raise
``TypeError``.
"""

from __future__ import annotations

import enum
import operator
import sys

import ml_dtypes
import numpy as np

from . import _core

__all__ = [
    "quantize",
    "dequantize",
    "quantize_dequantize",
    "OutType",
    "global_scale",
    "gptq",
    "accumulate_hessian",
    "hadamard_transform",
    "swizzle_scales",
    "unswizzle_scales",
    "encode",
    "decode",
    "set_backend",
    "backend",
    "set_cpu_target",
    "cpu_target",
    "available_cpu_targets",
    "set_num_threads",
    "num_threads",
]

# One version: the project's (CMakeLists.txt), compiled into _core; pyproject.toml reads the same line.
__version__ = _core.__version__

_BF16 = np.dtype(ml_dtypes.bfloat16)
_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)
_FLOAT_NAMES = {_F32: "float32", _F16: "float16", _BF16: "bfloat16"}
_NAME_TO_DTYPE = {"float32": _F32, "float16": _F16, "bfloat16": _BF16}
# ml_dtypes' types of the element formats, for decode: their bytes are the codes.
_CODE_DTYPES = {
    "e4m3": np.dtype(ml_dtypes.float8_e4m3fn),
    "e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "e8m0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "e2m1": np.dtype(ml_dtypes.float4_e2m1fn),
}
# The 8-bit float types microscale reads as codes, wherever the codes are of that type's format:
# an array of another float8 type holds another format's codes, whose bytes would decode wrongly.
_BYTE_CODE_DTYPES = (
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e5m2),
    np.dtype(ml_dtypes.float8_e8m0fnu),
)
_BYTE_CODE_NAMES = [d.name for d in _BYTE_CODE_DTYPES]
# (format, float8 type) of each fp mode's scale codes.
_SCALE_FORMAT = {
    "nvfp4": ("E4M3", _CODE_DTYPES["e4m3"]),
    "mxfp4": ("E8M0", _CODE_DTYPES["e8m0"]),
    "mxfp8": ("E8M0", _CODE_DTYPES["e8m0"]),
}


# ---------------------------------------------------------------------------------------------
# argument handling

def _as_array(a, what):
    """A numpy array for ``a``: numpy arrays as they are; torch tensors and other DLPack
    producers (MLX, JAX, CuPy host arrays) as a view of their memory, no copy; anything else
    through np.asarray."""
    kind = _kind_of(a)
    if kind is OutType.numpy and type(a) is np.ndarray:
        arr = a
        if arr.flags.c_contiguous and arr.dtype.isnative:
            return arr
    elif kind is OutType.torch:
        arr = _torch_view(a, what)
        if arr.flags.c_contiguous:
            return arr
    elif hasattr(type(a), "__dlpack__"):
        # torch refuses to export a tensor that requires grad; these functions are not
        # differentiable (microscale.torch has the autograd versions), so read its values.
        if getattr(a, "requires_grad", False):
            a = a.detach()
        arr = _host_view(a, what)
    else:
        try:
            arr = np.asarray(a)
        except Exception as e:  # noqa: BLE001 - report what could not be read
            raise TypeError(f"{what}: cannot be read as an array ({e})") from None
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    # _core reads strides in elements: negative or non-itemsize-multiple strides need a copy.
    if arr.size and any(s < 0 or s % arr.itemsize for s in arr.strides):
        arr = np.ascontiguousarray(arr)
    return arr


def _host_view(a, what):
    """A DLPack producer's host memory as numpy (_core.host_view), 8-bit floats in the ml_dtypes
    type of their DLPack code (_core returns the type's name with their uint8 codes)."""
    arr, float8_name = _core.host_view(a, what)
    return arr if float8_name is None else arr.view(getattr(ml_dtypes, float8_name))


# The torch module, bound the first time a torch tensor is seen: microscale never imports torch
# itself, and a module attribute is cheaper than an import statement on every call.
_torch = None


def _torch_module():
    global _torch
    if _torch is None:
        import torch

        _torch = torch
    return _torch


def _torch_view(t, what):
    """A torch tensor's values as numpy, sharing its memory when it is a CPU tensor with plain
    strided memory: torch's own numpy bridge is DLPack's zero-copy import at a fraction of its
    per-call cost. bfloat16 comes back as ml_dtypes.bfloat16, the float8 types as ml_dtypes'
    types of the same names; other dtypes go through DLPack.

    Refused by name: tensors whose memory does not hold their values (subclasses that dispatch
    every op themselves, such as FakeTensor, DTensor and torchao's tensors; meta tensors; other
    layouts). The negative and conjugate bits are resolved (a copy): the memory holds the values
    before negation or conjugation, and neither numpy nor DLPack carries the bit."""
    torch = _torch_module()
    if type(t).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        raise TypeError(
            f"{what}: a {type(t).__name__} is a tensor subclass that computes its values itself "
            "(as FakeTensor, DTensor and torchao's tensors do), not plain memory microscale can "
            "read; pass a plain torch.Tensor (e.g. its .dequantize() or .full_tensor())")
    if t.layout is not torch.strided or t.is_nested:
        raise TypeError(f"{what}: a {'nested' if t.is_nested else t.layout} tensor is not plain "
                        "strided memory; pass a dense tensor (e.g. .to_dense())")
    if t.device.type == "meta":
        raise ValueError(f"{what}: a meta tensor has no data (only a shape and dtype); pass a "
                         "tensor on the CPU")
    if t.requires_grad:
        t = t.detach()
    if t.is_neg() or t.is_conj():
        t = t.resolve_neg().resolve_conj()
    if not t.is_cpu:
        return _host_view(t, what)  # which refuses device memory by name
    if t.data_ptr() == 0 and t.numel() != 0:
        raise ValueError(f"{what}: the tensor has no data (a null data pointer with "
                         f"{t.numel()} elements)")
    dtype = t.dtype
    try:
        if dtype is torch.float32 or dtype is torch.float16:
            return t.numpy()
        if dtype is torch.bfloat16:
            return t.view(torch.int16).numpy().view(_BF16)
        if t.element_size() == 1 and str(dtype).startswith("torch.float8_"):
            return t.view(torch.uint8).numpy().view(getattr(ml_dtypes, str(dtype)[6:]))
        return t.numpy()
    except (TypeError, RuntimeError, AttributeError):  # AttributeError: a float8 type ml_dtypes lacks
        return _host_view(t, what)


class OutType(enum.Enum):
    """The array type results come back as (``out_type=``): the input's own by default."""

    numpy = "numpy"
    torch = "torch"
    mlx = "mlx"


_KIND_OF_TYPE = {np.ndarray: OutType.numpy}


def _kind_of(a):
    """The OutType matching ``a``'s array type: torch tensors (subclasses included) and MLX arrays
    come back as their own type, everything else (numpy, JAX, other DLPack producers) as numpy.
    Cached per type: this runs on every call."""
    cls = type(a)
    kind = _KIND_OF_TYPE.get(cls)
    if kind is None:
        torch = sys.modules.get("torch")  # imported wherever a torch tensor exists
        if torch is not None and issubclass(cls, torch.Tensor):
            kind = OutType.torch
        elif cls.__module__.startswith("mlx"):
            kind = OutType.mlx
        else:
            kind = OutType.numpy
        if len(_KIND_OF_TYPE) < 64:
            _KIND_OF_TYPE[cls] = kind
    return kind


def _out_kind(out_type, source):
    """The OutType of the results: ``out_type`` (None, a name or an OutType), else ``source``'s."""
    if out_type is None:
        return _kind_of(source)
    if isinstance(out_type, OutType):
        return out_type
    if isinstance(out_type, str) and out_type in OutType.__members__:
        return OutType[out_type]
    raise ValueError(f"out_type must be None, 'numpy', 'torch' or 'mlx', got {out_type!r}")


def _deliver(result, kind):
    """``result`` (a numpy array from _core, or a tuple of them) as ``kind``. torch shares the
    numpy buffer (no copy); MLX copies, as MLX cannot import host memory without one.
    bfloat16 crosses as its 16-bit pattern: ml_dtypes' arrays do not export through DLPack."""
    if kind is OutType.numpy:
        return result
    if kind is OutType.torch:
        try:
            torch = _torch_module()
        except ImportError:
            raise ImportError("out_type='torch' needs torch: pip install torch") from None
        if isinstance(result, tuple):
            return tuple([_to_torch(torch, r) for r in result])
        return _to_torch(torch, result)
    if isinstance(result, tuple):
        return tuple([_deliver(r, kind) for r in result])
    try:
        import mlx.core as mx
    except ImportError:
        raise ImportError("out_type='mlx' needs MLX: pip install mlx") from None
    bf16 = result.dtype == _BF16
    out = mx.from_dlpack(result.view(np.uint16) if bf16 else result)
    return out.view(mx.bfloat16) if bf16 else out


def _to_torch(torch, result):
    # torch.from_numpy shares the buffer as torch.from_dlpack would, at a fraction of the cost.
    if result.itemsize == 2 and result.dtype == _BF16:
        return torch.from_numpy(result.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(result)


def _float_input(a, what):
    """The array for _core of a float32 / float16 / bfloat16 array (_core reads its dtype)."""
    arr = _as_array(a, what)
    if arr.dtype not in _FLOAT_NAMES:
        raise TypeError(
            f"{what}: unsupported dtype {arr.dtype} (expected float32, float16 or "
            "ml_dtypes.bfloat16)")
    return arr


def _any_input(a, what, allowed):
    """(array for _core, dtype name) for an array whose dtype name is in `allowed`; the name is
    for the checks here ("float8": one of the 8-bit float types read as codes, which the caller
    checks with _check_codes), _core reads the array's own dtype."""
    arr = _as_array(a, what)
    if arr.dtype in _FLOAT_NAMES:
        name = _FLOAT_NAMES[arr.dtype]
    elif arr.dtype == np.uint8:
        name = "uint8"
    elif arr.dtype in _BYTE_CODE_DTYPES:
        name = "float8"
    elif arr.dtype == np.uint32:
        name = "uint32"
    else:
        name = None
    if name not in allowed:
        shown = sorted(n for k in allowed for n in (_BYTE_CODE_NAMES if k == "float8" else [k]))
        raise TypeError(f"{what}: unsupported dtype {arr.dtype} (expected one of "
                        f"{', '.join(shown)})")
    return arr, name


def _check_codes(arr, what, role, fmt, dtype):
    """Refuses a float8 array of codes unless its type is `dtype`, that of their format `fmt`: the
    bytes of another float8 type are another format's codes, which would decode as wrong values."""
    if dtype is None:
        raise TypeError(f"{what}: {role} are not 8-bit codes, got {arr.dtype}")
    if arr.dtype != dtype:
        raise TypeError(f"{what}: {role} are {fmt} codes, uint8 or {dtype.name}; got {arr.dtype}, "
                        f"which holds another format's codes")


def _scales_input(scales, what, spec):
    """The scales for _core: affine's float scales, or an fp mode's codes, uint8 or the float8 type
    of the mode's scale format (nvfp4: E4M3, float8_e4m3fn; mxfp4, mxfp8: E8M0, float8_e8m0fnu)."""
    arr, name = _any_input(scales, what, {"uint8", "float8", "float32", "float16", "bfloat16"})
    if name == "float8":
        mode = spec.mode.name
        _check_codes(arr, what, f"{mode} scales", *_SCALE_FORMAT.get(mode, (None, None)))
    return arr


def _packed_input(w_q, what, spec):
    """The packed values for _core: uint8, MLX's uint32 read as its little-endian bytes, or for
    mxfp8 the float8 type of its element format (float8_e4m3fn, float8_e5m2)."""
    arr, name = _any_input(w_q, what, {"uint8", "uint32", "float8"})
    if name == "float8":
        mode = spec.mode.name
        if mode == "mxfp8":
            elem = spec.elem.name
            _check_codes(arr, what, f"mxfp8 {elem} elements", elem.upper(), _CODE_DTYPES[elem])
        else:
            raise TypeError(f"{what}: {mode} packs its codes into bytes: uint8 (or uint32), got "
                            f"{arr.dtype}")
    elif name == "uint32":
        if arr.ndim == 0:
            raise ValueError(f"{what} must have rank >= 1")
        arr = _c_contig(arr).astype("<u4", copy=False)
        arr = arr.view(np.uint8).reshape(arr.shape[:-1] + (arr.shape[-1] * 4,))
    return arr


def _c_contig(arr):
    # (np.ascontiguousarray would turn a 0-d array into shape (1,).)
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def _str(v, what):
    if not isinstance(v, str):
        raise TypeError(f"{what} must be a string, got {type(v).__name__}")
    return v


def _opt_int(v, what):
    """None -> 0 (the mode's default in C++); otherwise a positive int."""
    if v is None:
        return 0
    if isinstance(v, bool):
        raise TypeError(f"{what} must be an int or None, got bool")
    try:
        i = operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an int or None, got {type(v).__name__}") from None
    if i <= 0:
        raise ValueError(f"{what} must be positive, got {i}")
    if i > 2**30:
        raise ValueError(f"{what} is too large: {i}")
    return i


def _bool(v, what):
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{what} must be a bool, got {type(v).__name__}")
    return bool(v)


def _seed_arg(v):
    """None, or a seed in [0, 2**64) (an int, not a bool)."""
    if v is None:
        return None
    if isinstance(v, bool):
        raise TypeError("sr_seed must be an int or None, got bool")
    try:
        i = operator.index(v)
    except TypeError:
        raise TypeError(f"sr_seed must be an int or None, got {type(v).__name__}") from None
    if not 0 <= i < 2**64:
        raise ValueError(f"sr_seed must be in [0, 2**64), got {i}")
    return i


def _global_scale_arg(g):
    """None, or the float32 value of a Python float, numpy scalar, 0-d or 1-element array."""
    if g is None:
        return None
    if isinstance(g, bool):
        raise TypeError("global_scale must be a number, got bool")
    # A tensor is read as the array arguments are (np.asarray would read a torch tensor's memory
    # without its negative bit, or fail on one that has no memory).
    arr = _as_array(g, "global_scale") if hasattr(type(g), "__dlpack__") else np.asarray(g)
    if arr.size != 1:
        raise ValueError(f"global_scale must be a scalar or a 1-element array, got shape {arr.shape}")
    if arr.dtype == _BF16 or arr.dtype.kind in "fiu":
        with np.errstate(over="ignore"):
            v = arr.reshape(()).astype(np.float32)
        return float(v)  # exact: a float32 value as a Python float
    raise TypeError(f"global_scale: unsupported dtype {arr.dtype}")


# QuantSpecs already built, by their arguments and the types of the numeric ones (True == 1, but
# True is refused): parsing five names costs more than the C++ quantize of a small tensor. The
# specs are only read (the C++ functions take them by const reference).
_SPEC_CACHE = {}


def _spec(mode, group_size=None, bits=None, scale_rule="ceil", nonfinite="propagate",
          layout="compact", elem="e4m3", global_scale=None, scale_search="none", scale_2d=False,
          hadamard=False, sr_seed=None):
    """The _core.QuantSpec of these arguments: types checked here, names parsed (and refused,
    ValueError) by the C++ enums' from_name."""
    if global_scale is not None and not isinstance(global_scale, (float, int, np.generic)):
        # An array (a torch tensor hashes by identity, and its value may change in place).
        return _make_spec(mode, group_size, bits, scale_rule, nonfinite, layout, elem, global_scale,
                          scale_search, scale_2d, hadamard, sr_seed)
    key = (mode, group_size, type(group_size), bits, type(bits), scale_rule, nonfinite, layout,
           elem, global_scale, type(global_scale), scale_search, scale_2d, type(scale_2d),
           hadamard, type(hadamard), sr_seed, type(sr_seed))
    try:
        return _SPEC_CACHE[key]
    except (KeyError, TypeError):  # TypeError: an unhashable argument
        pass
    spec = _make_spec(mode, group_size, bits, scale_rule, nonfinite, layout, elem, global_scale,
                      scale_search, scale_2d, hadamard, sr_seed)
    try:
        if len(_SPEC_CACHE) >= 256:
            _SPEC_CACHE.clear()
        _SPEC_CACHE[key] = spec
    except TypeError:
        pass
    return spec


def _make_spec(mode, group_size, bits, scale_rule, nonfinite, layout, elem, global_scale,
               scale_search, scale_2d, hadamard, sr_seed):
    mode = _str(mode, "mode")
    group_size = _opt_int(group_size, "group_size")
    bits = _opt_int(bits, "bits")
    scale_rule = _str(scale_rule, "scale_rule")
    nonfinite = _str(nonfinite, "nonfinite")
    layout = _str(layout, "layout")
    elem = _str(elem, "elem")
    global_scale = _global_scale_arg(global_scale)
    return _core.QuantSpec(
        mode=_core.Mode.from_name(mode), group_size=group_size, bits=bits,
        scale_rule=_core.ScaleRule.from_name(scale_rule),
        nonfinite=_core.NonFinite.from_name(nonfinite), layout=_core.Layout.from_name(layout),
        elem=_core.Elem.from_name(elem), global_scale=global_scale,
        scale_search=_core.ScaleSearch.from_name(_str(scale_search, "scale_search")),
        scale_2d=_bool(scale_2d, "scale_2d"), hadamard=_bool(hadamard, "hadamard"),
        sr_seed=_seed_arg(sr_seed))


def _dtype_name(dtype):
    """'float32' | 'float16' | 'bfloat16' from a name, numpy dtype, ml_dtypes type, or torch or
    MLX dtype."""
    if type(dtype).__module__.startswith(("torch", "mlx")):
        dtype = str(dtype).rsplit(".", 1)[-1]  # torch.bfloat16, mlx.core.float16: by name
    if isinstance(dtype, str):
        if dtype in _NAME_TO_DTYPE:
            return dtype
        raise TypeError(f"dtype: unsupported output dtype {dtype!r} (expected float32, float16 "
                        "or bfloat16)")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype: cannot interpret {dtype!r} as a dtype") from None
    name = _FLOAT_NAMES.get(dt)
    if name is None:
        raise TypeError(f"dtype: unsupported output dtype {dt} (expected float32, float16 or "
                        "bfloat16)")
    return name


# ---------------------------------------------------------------------------------------------
# public API

def quantize(w, mode="nvfp4", group_size=None, bits=None, global_scale=None, layout="compact",
             scale_rule="ceil", nonfinite="propagate", elem="e4m3", scale_search="none",
             scale_2d=False, hadamard=False, sr_seed=None, out_type=None):
    """Quantize ``w`` along its last axis.

    Args:
      w: float32, float16 or bfloat16 array of shape ``[..., K]`` (rank >= 1, any strides):
        numpy (``ml_dtypes.bfloat16``), torch, MLX or any host array with ``__dlpack__``;
        ``K`` must be a multiple of the group size.
      mode: ``"nvfp4"`` (E2M1 elements, E4M3 scales, groups of 16), ``"mxfp4"`` (E2M1, E8M0, 32),
        ``"mxfp8"`` (E4M3 or E5M2, E8M0, 32) or ``"affine"`` (b-bit unsigned codes with a scale and
        a bias per group, MLX-compatible).
      group_size: None for the mode's default (nvfp4 16, mx 32, affine 64; affine also 32, 128).
      bits: None for the mode's default (4, 4, 8, 4); affine takes 2, 3, 4, 5, 6 or 8.
      global_scale: nvfp4 only. The tensor amax (e.g. ``microscale.global_scale(w)``) as a
        Python float, numpy scalar or 1-element array, rounded to float32; given, the result is
        three-level NVFP4, otherwise two-level. Not an encode or decode factor.
      layout: ``"compact"`` scales ``[..., K/group]`` or ``"swizzled"`` (cuBLAS 128x4 tiles,
        ``[roundup(R,128), roundup(K/group,4)]`` with R the product of the leading axes; fp
        modes only).
      scale_rule: E8M0 rule of the mx modes: ``"ceil"`` (default, TE/cuBLAS), ``"floor"`` (OCP MX
        v1.0), ``"even"`` (torchao EVEN) or ``"nearest"`` (MLX 0.32.2).
      nonfinite: blocks holding NaN/Inf: ``"propagate"`` (default: the block decodes to NaN),
        ``"error"`` (ValueError naming the first non-finite element) or ``"saturate"``
        (TensorEngine's hardware behaviour; affine treats it as propagate).
      elem: mxfp8 element format, ``"e4m3"`` (default) or ``"e5m2"``.
      scale_search: how fp4 block scales are chosen: ``"none"`` (default, round to nearest from
        the block max), ``"4over6"`` (nvfp4) or ``"mse"`` (nvfp4, mxfp4); the bytes decode with the
        standard decoder (docs/numerics.md, "Scale search").
      scale_2d: nvfp4 only: one scale per 16x16 tile (16 rows of the flattened leading axes x 16
        values along K; the last tile may have fewer rows), repeated in each of its rows' compact
        scales, so ``w`` and ``w.T`` quantize to transposes of each other. Default False.
      hadamard: fp modes: quantize :func:`hadamard_transform` of ``w`` (the 16-point random
        Hadamard transform along K, bfloat16 values) instead of ``w``; ``dequantize`` then gives
        transformed values. A ``global_scale`` must be the amax of the transformed tensor
        (``global_scale(hadamard_transform(w))``). Default False.
      sr_seed: nvfp4, mxfp4: None (default) rounds elements to nearest; an int in [0, 2**64)
        rounds the E2M1 elements stochastically (unbiased to within 2**-8 of a grid step), with
        random bits keyed by (seed, flat element index): the same seed gives the same bytes on
        every backend and thread count. Scales are unchanged. Not with ``scale_search``.
      out_type: None (results are w's array type), ``"numpy"``, ``"torch"`` or ``"mlx"``.

    Returns:
      ``(w_q, scales)`` for the fp modes and ``(w_q, scales, biases)`` for affine: ``w_q`` uint8
      ``[..., K*bits/8]``; fp-mode scales uint8 codes; affine scales and biases in w's dtype.
      With ``scale_search`` other than ``"none"`` and a ``global_scale``, the search may record a
      different global scale, so the result is ``(w_q, scales, global_scale)``: pass that float
      to :func:`dequantize`.
    """
    if out_type is None:
        # The common call (a float numpy array or CPU torch tensor in, the same type out) in one
        # _core call; anything it does not take, argument errors included, goes the general way,
        # which checks the input before the options, as it always has.
        kind = _kind_of(w)
        if kind is OutType.torch or type(w) is np.ndarray:
            try:
                spec = _spec(mode, group_size, bits, scale_rule, nonfinite, layout, elem,
                             global_scale, scale_search, scale_2d, hadamard, sr_seed)
            except (TypeError, ValueError):
                spec = None
            if spec is not None:
                parts = _core.quantize_fast(w, spec, kind is OutType.torch)
                if parts is not None:
                    return parts
    arr = _float_input(w, "w")
    spec = _spec(mode, group_size, bits, scale_rule, nonfinite, layout, elem, global_scale,
                 scale_search, scale_2d, hadamard, sr_seed)
    if spec.scale_search != _core.ScaleSearch.none and spec.global_scale is not None:
        q = _core.quantize(arr, spec)
        return _deliver((q.packed, q.scales), _out_kind(out_type, w)) + (q.spec.global_scale,)
    return _deliver(_core.quantize_parts(arr, spec), _out_kind(out_type, w))


def quantize_dequantize(x, mode="nvfp4", group_size=None, bits=None, global_scale=None,
                        scale_rule="ceil", nonfinite="propagate", elem="e4m3", dtype=None,
                        scale_2d=False, hadamard=False, sr_seed=None, out_type=None):
    """Fake quantization: ``dequantize(*quantize(x, ...), ...)`` in one call, bit for bit.

    Args:
      x: float32, float16 or bfloat16 array ``[..., K]`` (any array type with ``__dlpack__``).
      mode, group_size, bits, global_scale, scale_rule, nonfinite, elem, scale_2d, hadamard,
        sr_seed: as for :func:`quantize`; ``global_scale`` (nvfp4) gives the three-level round
        trip; with ``hadamard`` the values are those of the transformed tensor.
      dtype: output dtype; None (default) keeps x's.
      out_type: None (x's array type), ``"numpy"``, ``"torch"`` or ``"mlx"``.

    Returns:
      array ``[..., K]``: each element's value after quantization.
    """
    arr = _float_input(x, "x")
    out_name = _FLOAT_NAMES[arr.dtype] if dtype is None else _dtype_name(dtype)
    spec = _spec(mode, group_size, bits, scale_rule, nonfinite, "compact", elem, global_scale,
                 "none", scale_2d, hadamard, sr_seed)
    return _deliver(_core.quantize_dequantize(arr, spec, _core.DType[out_name]),
                    _out_kind(out_type, x))


def dequantize(w_q, scales, biases=None, mode="nvfp4", global_scale=None, dtype="float32",
               layout="compact", group_size=None, bits=None, scale_rule="ceil",
               nonfinite="propagate", elem="e4m3", out_type=None):
    """Dequantize the output of :func:`quantize` (or the same parts from a checkpoint).

    Args:
      w_q: packed values, uint8 ``[..., K*bits/8]``, or MLX's uint32 ``[..., K*bits/32]`` (read
        as little-endian bytes); mxfp8 also takes its element type (``float8_e4m3fn``, or
        ``float8_e5m2`` with ``elem="e5m2"``).
      scales: fp modes: uint8 codes in the given ``layout``, or an array of the float8 type of
        the mode's scale format (nvfp4: ``float8_e4m3fn``; mxfp4, mxfp8: ``float8_e8m0fnu``; numpy
        ml_dtypes or torch); another float8 type is a TypeError. affine: float32, float16 or
        bfloat16.
      biases: affine only, same shape as ``scales``.
      mode, group_size, bits, layout, elem: as given to :func:`quantize`.
      global_scale: nvfp4 only: the amax that was passed to :func:`quantize` (three-level decode
        ``val(q) * ((val(s) * amax) * fl(1/2688))``); None for two-level data.
      dtype: output dtype, ``"float32"`` (default), ``"float16"`` or ``"bfloat16"`` (also as numpy
        / ml_dtypes, torch or MLX dtypes). Every value is computed in float32 and rounded once.
      scale_rule, nonfinite: accepted for symmetry with :func:`quantize` and validated; decoding
        does not depend on them.
      out_type: None (results are w_q's array type), ``"numpy"``, ``"torch"`` or ``"mlx"``.

    Returns:
      array ``[..., K]`` of ``dtype``.
    """
    out_name = _dtype_name(dtype)
    spec = _spec(mode, group_size, bits, scale_rule, nonfinite, layout, elem, global_scale)
    pw = _packed_input(w_q, "w_q", spec)
    sw = _scales_input(scales, "scales", spec)
    bw = None if biases is None else _any_input(biases, "biases", {"float32", "float16", "bfloat16"})[0]
    return _deliver(_core.dequantize(pw, sw, bw, spec, _core.DType[out_name]),
                    _out_kind(out_type, w_q))


def gptq(w, hessian, mode="nvfp4", group_size=None, bits=None, global_scale=None,
         layout="compact", scale_rule="ceil", elem="e4m3", damp=0.01, block_size=128,
         out_type=None):
    """Quantize a weight with GPTQ: columns rounded in order, each rounding error compensated in
    the later columns through the calibration statistics ``hessian`` (docs/numerics.md, "GPTQ").
    The bytes are standard: :func:`dequantize` decodes the result like :func:`quantize`'s.

    Args:
      w: float32, float16 or bfloat16 weight ``[N, K]`` (a Linear layer's ``[out, in]``), finite.
      hessian: ``H = X^T X`` of the layer's inputs ``X [samples, K]``, shape ``[K, K]``, float64
        or float32 (e.g. from :func:`accumulate_hessian`); symmetric, finite.
      mode, group_size, bits, layout, scale_rule, elem: as for :func:`quantize` (nvfp4, mxfp4,
        mxfp8 or affine).
      global_scale: nvfp4 only: three-level when given; pass the amax of the original weight
        (``microscale.global_scale(w)``), as for :func:`quantize`.
      damp: fraction of the mean diagonal of H added to the diagonal (default 0.01).
      block_size: columns per lazy batch, a multiple of the group size (default 128).
      out_type: None (results are w's array type), ``"numpy"``, ``"torch"`` or ``"mlx"``.

    Returns:
      what :func:`quantize` returns for the mode: ``(w_q, scales)``, or ``(w_q, scales, biases)``
      for affine.
    """
    arr = _float_input(w, "w")
    spec = _spec(mode, group_size, bits, scale_rule, "propagate", layout, elem, global_scale)
    h = _as_array(hessian, "hessian")
    if h.dtype not in (np.float64, np.float32):
        raise TypeError(f"hessian: unsupported dtype {h.dtype} (expected float64 or float32)")
    h = np.ascontiguousarray(h, dtype=np.float64)
    if isinstance(damp, bool) or not isinstance(damp, (int, float, np.floating, np.integer)):
        raise TypeError(f"damp must be a number, got {type(damp).__name__}")
    block_size = _opt_int(block_size, "block_size")
    q = _core.gptq(arr, h, spec, float(damp), block_size)
    parts = (q.packed, q.scales, q.biases) if spec.mode == _core.Mode.affine else (q.packed, q.scales)
    return _deliver(parts, _out_kind(out_type, w))


def accumulate_hessian(x, h=None):
    """Accumulate ``H += X^T X`` for a batch of a layer's inputs, in float64.

    Args:
      x: float32, float16 or bfloat16 activations ``[..., K]`` (leading axes are samples).
      h: None to start a new ``H``, or the float64 C-contiguous ``[K, K]`` numpy array of earlier
        batches, updated in place.

    Returns:
      ``h``: float64 numpy array ``[K, K]`` (the same object when one was given).
    """
    arr = _float_input(x, "x")
    if arr.ndim == 0:
        raise ValueError("x must have rank >= 1 ([..., K])")
    k = arr.shape[-1]
    if h is None:
        h = np.zeros((k, k), np.float64)
    elif not isinstance(h, np.ndarray) or h.dtype != np.float64 or not h.flags.c_contiguous \
            or not h.flags.writeable:
        raise TypeError("h must be a writeable C-contiguous float64 numpy array (it is updated in "
                        "place), or None")
    elif h.shape != (k, k):
        raise ValueError(f"h must have shape [K, K] = [{k}, {k}] for x of K = {k}, got "
                         f"{list(h.shape)}")
    _core.accumulate_hessian(arr, h)
    return h


def global_scale(w):
    """The tensor amax of ``w`` as ``np.float32``, ignoring NaN and +-Inf (0 if no finite value):
    the value nvfp4 takes as ``global_scale``."""
    return np.float32(_core.global_scale(_float_input(w, "w")))


def hadamard_transform(x, dtype="float32", out_type=None):
    """The 16-point random Hadamard transform of the NVFP4 training recipe along the last axis.

    Per chunk of 16 values along K: ``y_j = RN_bf16(0.25 * s_j)``, ``s_j`` the float32 sum in
    index order of ``d_i * H[i][j] * x_i`` (``H`` the Sylvester Hadamard matrix,
    ``d_i = -1`` where bit i of 0xD7E8 is set, TransformerEngine's signs). ``0.25 * D * H`` is
    orthogonal, so transforming both operands of ``x @ w.T`` along K leaves the product
    unchanged up to the bfloat16 rounding (docs/numerics.md, "Random Hadamard transform").

    Args:
      x: float32, float16 or bfloat16 array ``[..., K]``, K a multiple of 16.
      dtype: output dtype, ``"float32"`` (default) or ``"bfloat16"``; the values are bfloat16
        either way.
      out_type: None (x's array type), ``"numpy"``, ``"torch"`` or ``"mlx"``.
    """
    arr = _float_input(x, "x")
    return _deliver(_core.hadamard_transform(arr, _core.DType[_dtype_name(dtype)]),
                    _out_kind(out_type, x))


def swizzle_scales(scales, out_type=None):
    """Compact uint8 scales ``[R, C]`` (leading axes of higher ranks are flattened into R) to the
    swizzled ``[roundup(R,128), roundup(C,4)]`` layout of FORMATS.md section 4, zero-padded."""
    arr, _ = _any_input(scales, "scales", {"uint8", "float8"})  # bytes moved, whatever their format
    return _deliver(_core.swizzle_scales(arr), _out_kind(out_type, scales))


def unswizzle_scales(scales, rows, cols, out_type=None):
    """Inverse of :func:`swizzle_scales`: the compact ``[rows, cols]`` uint8 scales."""
    arr, _ = _any_input(scales, "scales", {"uint8", "float8"})
    r = operator.index(rows)
    c = operator.index(cols)
    if r < 0 or c < 0:
        raise ValueError(f"rows and cols must be >= 0, got {r}, {c}")
    return _deliver(_core.unswizzle_scales(arr, r, c), _out_kind(out_type, scales))


_ENCODE_FORMATS = ("e2m1", "e4m3", "e5m2", "e8m0", "bf16", "f16")


def _fmt_name(fmt):
    fmt = _str(fmt, "fmt")
    aliases = {"bfloat16": "bf16", "float16": "f16"}
    fmt = aliases.get(fmt, fmt)
    if fmt not in _ENCODE_FORMATS:
        raise ValueError(f"unknown element format {fmt!r} (expected one of "
                         f"{', '.join(_ENCODE_FORMATS)})")
    return fmt


def encode(x, fmt, out_type=None):
    """Encode float values element by element (round to nearest even, see FORMATS.md section 1).

    Args:
      x: float32 array (float16 / bfloat16 arrays are widened exactly; float64 is refused so no
        value is rounded twice).
      fmt: ``"e2m1"``, ``"e4m3"``, ``"e5m2"``, ``"e8m0"`` (uint8 codes; E2M1 in the low nibble) or
        ``"bf16"``, ``"f16"`` (uint16 bit patterns).

    Standalone rules: E2M1 NaN -> 0x7, +-Inf -> +-6; E4M3 NaN -> 0x7F, overflow and +-Inf -> +-448;
    E5M2 NaN -> 0x7F, overflow and +-Inf -> +-57344; E8M0 rounds to the nearest power of two
    (1.5*2^k up), saturates to 2^127 / 2^-127, zero / negative / NaN / Inf -> 0xFF; bf16 and f16
    are IEEE (overflow -> Inf).
    """
    fmt = _fmt_name(fmt)
    arr = _float_input(x, "x")
    if arr.dtype != _F32:
        arr = arr.astype(np.float32)
    arr = _c_contig(arr)
    return _deliver(_core.encode(arr, fmt).reshape(arr.shape), _out_kind(out_type, x))


def decode(codes, fmt, out_type=None):
    """Decode codes to float32 exactly.

    Args:
      codes: uint8 codes for ``"e2m1"`` (0..15), ``"e4m3"``, ``"e5m2"``, ``"e8m0"``, or uint16 bit
        patterns for ``"bf16"`` / ``"f16"``; arrays of the matching ml_dtypes / numpy type
        (float8_e4m3fn, float8_e5m2, float8_e8m0fnu, float4_e2m1fn, bfloat16, float16) are read
        by their bits.

    E4M3 0x7F/0xFF and E8M0 0xFF decode to NaN, E8M0 0x00 to 2^-127, E5M2 0x7C/0xFC to +-Inf.
    """
    fmt = _fmt_name(fmt)
    arr = _as_array(codes, "codes")
    wide = fmt in ("bf16", "f16")
    if fmt == "e2m1" and arr.dtype == _CODE_DTYPES["e2m1"]:
        arr = arr.view(np.uint8)
    elif fmt in _CODE_DTYPES and arr.dtype == _CODE_DTYPES[fmt]:
        arr = arr.view(np.uint8)
    elif fmt == "bf16" and arr.dtype == _BF16:
        arr = arr.view(np.uint16)
    elif fmt == "f16" and arr.dtype == _F16:
        arr = arr.view(np.uint16)
    want = np.uint16 if wide else np.uint8
    if arr.dtype != want:
        raise TypeError(f"codes: unsupported dtype {arr.dtype} for {fmt} (expected "
                        f"{np.dtype(want).name})")
    arr = _c_contig(arr)
    return _deliver(_core.decode(arr, fmt).reshape(arr.shape), _out_kind(out_type, codes))


# ---------------------------------------------------------------------------------------------
# runtime settings (include/microscale/runtime.hpp)

def set_backend(name):
    """Select the backend that runs quantize/dequantize: ``"cpu"`` (default: SIMD kernels and
    threads) or ``"reference"`` (the scalar executable spec). Both give identical bytes.
    Process-wide; the environment variable MICROSCALE_BACKEND sets the initial value (a value
    that names no backend is a ValueError naming the variable, raised by every op and by the
    runtime functions until it is fixed; MICROSCALE_CPU_TARGET and MICROSCALE_NUM_THREADS the
    same)."""
    _core.set_backend(_str(name, "name"))


def backend():
    """The backend in use: ``"cpu"`` or ``"reference"``."""
    return _core.backend()


def set_cpu_target(name):
    """Force the SIMD target of the cpu backend: ``"auto"`` or one of ``available_cpu_targets()``
    (x86: ``"avx512_dl"``, ``"avx512"``, ``"avx2"``, ``"sse4"``, ``"ssse3"``; Arm: ``"sve2_128"``,
    ``"sve_256"``, ``"sve2"``, ``"sve"``, ``"neon"``; ``"scalar"``); ValueError if unknown or not
    runnable here."""
    _core.set_cpu_target(_str(name, "name"))


def cpu_target():
    """Name of the SIMD target the cpu kernels dispatch to now."""
    return _core.cpu_target()


def available_cpu_targets():
    """SIMD targets this build contains and this machine can run, best first."""
    return list(_core.available_cpu_targets())


def set_num_threads(n):
    """Threads per call, the caller's included, at most 1024 (larger counts mean 1024); ``n <= 0``
    restores the default (MICROSCALE_NUM_THREADS, then OMP_NUM_THREADS, then the CPUs this process
    may run on)."""
    n = operator.index(n)
    _core.set_num_threads(min(n, _core.MAX_THREADS) if n > 0 else 0)


def num_threads():
    """Worker threads per call now."""
    return _core.num_threads()


# Checkpoints: quantized layers in and out of compressed-tensors, ModelOpt and MLX model directories.
from .checkpoint import (  # noqa: E402
    BudgetChoice, LoadedCheckpoint, QuantizedWeight, QuantizeReport, load_checkpoint, quantize_checkpoint,
    save_checkpoint)

__all__ += ["QuantizedWeight", "LoadedCheckpoint", "load_checkpoint", "save_checkpoint", "quantize_checkpoint",
            "QuantizeReport", "BudgetChoice"]


# Quantized matrix products and the layers built on them (FORMATS.md section 6).
from .matmul import gather_qmm, linear, qqmm, quantized_matmul  # noqa: E402
from .layers import QQLinear, QuantizedEmbedding, QuantizedLinear  # noqa: E402

__all__ += ["quantized_matmul", "qqmm", "gather_qmm", "linear", "QuantizedLinear", "QuantizedEmbedding",
            "QQLinear"]
