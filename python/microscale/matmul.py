"""Matrix products with quantized weights (FORMATS.md section 6), shaped like MLX's
``mx.quantized_matmul``, ``mx.qqmm`` and ``mx.gather_qmm``.

>>> import numpy as np, microscale
>>> rng = np.random.default_rng(0)
>>> w = rng.standard_normal((32, 64)).astype(np.float32)          # [N, K]
>>> x = rng.standard_normal((4, 64)).astype(np.float32)           # [M, K]
>>> wq, scales = microscale.quantize(w, mode="nvfp4")
>>> microscale.quantized_matmul(x, wq, scales, mode="nvfp4").shape  # x @ dequantize(w)^T
(4, 32)
>>> microscale.qqmm(x, w, mode="mxfp8").shape                      # both operands quantized
(4, 32)

Every product accumulates in float32, using the float32 value :func:`microscale.dequantize` gives
for each weight, and is rounded to the output dtype once. The summation order is unspecified, so
results agree with a float64 reference to a K-proportional tolerance, not bit for bit.
"""

from __future__ import annotations

import numpy as np

from . import (_BYTE_CODE_DTYPES, _FLOAT_NAMES, _any_input, _as_array, _core, _deliver,
               _float_input, _global_scale_arg, _out_kind, _packed_input, _scales_input, _spec)

__all__ = ["quantized_matmul", "qqmm", "gather_qmm"]

_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.uint32))


def _optional(a, what, allowed):
    """The array of an optional argument, or None."""
    if a is None:
        return None
    return _any_input(a, what, allowed)[0]


def _indices(a, what):
    """An int32 / int64 / uint32 index array, or None."""
    if a is None:
        return None
    arr = _as_array(a, what)
    if arr.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{what}: unsupported dtype {arr.dtype} (expected int32, int64 or uint32)")
    return arr


_FLOATS = {"float32", "float16", "bfloat16"}


def quantized_matmul(x, w_q, scales, biases=None, transpose=True, mode="nvfp4", group_size=None,
                     bits=None, global_scale_w=None, elem="e4m3", bias=None, out_type=None):
    """``x @ W^T`` (``transpose=True``) or ``x @ W`` with W given as :func:`microscale.quantize`
    returns it.

    Args:
      x: float32, float16 or bfloat16 ``[..., M, K]``, numpy (``ml_dtypes.bfloat16``), torch, MLX
        or any host array with ``__dlpack__`` (1-D ``[K]`` is one row and the result drops
        that axis).
      w_q, scales, biases: the quantized weight. ``transpose=True``: W is logical ``[..., N, K]``,
        ``w_q`` uint8 ``[..., N, K*bits/8]`` (or MLX's uint32 ``[..., N, K*bits/32]``) with groups
        along K; ``transpose=False``: W is logical ``[..., K, N]`` with groups along N. Batch axes
        of x and W broadcast. ``biases`` is required for affine and refused otherwise. Scales
        and packed values may be float8 arrays of their own format, as
        :func:`microscale.dequantize` takes them.
      mode, group_size, bits, elem: as given to :func:`microscale.quantize`.
      global_scale_w: nvfp4 three-level weights: the amax passed to :func:`microscale.quantize`.
      bias: optional float ``[N]`` added in float32 before the single rounding.
      out_type: None (x's array type), ``"numpy"``, ``"torch"`` or ``"mlx"``.

    Returns:
      ``[..., M, N]`` in x's dtype; affine: float32 unless x and the scales share a half dtype.
    """
    xa = _float_input(x, "x")
    spec = _spec(mode, group_size, bits, elem=elem, global_scale=global_scale_w)
    sa = _scales_input(scales, "scales", spec)
    ba = _optional(biases, "biases", _FLOATS)
    ya = _optional(bias, "bias", _FLOATS)
    wa = _packed_input(w_q, "w_q", spec)
    transpose = bool(transpose)
    return _deliver(_core.quantized_matmul(xa, wa, sa, ba, transpose, spec, ya),
                    _out_kind(out_type, x))


def linear(x, w, bias=None, out_type=None):
    """``x @ w^T (+ bias)`` for a float weight ``w [N, K]`` (float32, float16 or bfloat16, read in
    its own dtype): the layers a quantized model keeps unquantized, such as a language model's
    head. Summed in float32 and rounded once to x's dtype. Made for few rows of x (decode), where
    reading w is the cost; a GEMM library serves many rows better.

    Args:
      x: float ``[..., K]`` (host arrays, as :func:`quantized_matmul` takes them).
      w: float ``[N, K]``.
      bias: optional float ``[N]``.
      out_type: None (x's array type), ``"numpy"``, ``"torch"`` or ``"mlx"``.

    Returns:
      ``[..., N]`` in x's dtype.
    """
    xa = _float_input(x, "x")
    wa = _float_input(w, "w")
    ya = _optional(bias, "bias", _FLOATS)
    return _deliver(_core.linear(xa, wa, ya), _out_kind(out_type, x))


def qqmm(x, w, scales=None, mode="nvfp4", group_size=None, bits=None, global_scale_x=None,
         global_scale_w=None, scale_rule="ceil", nonfinite="propagate", elem="e4m3", bias=None,
         out_type=None):
    """``x @ w^T`` with both operands quantized (modes nvfp4, mxfp4, mxfp8).

    x (float, ``[..., K]``) is quantized on every call exactly as :func:`microscale.quantize`
    does with the same arguments (and ``global_scale=global_scale_x``). w is 2-D: either float
    ``[N, K]`` (quantized here with ``global_scale_w``) or packed uint8 / uint32 with its
    ``scales`` (uint8 codes, or float8 arrays of their own format as :func:`microscale.dequantize`
    takes them). Per K-block the exact block dot product is scaled by the two block scales; for
    three-level nvfp4 (both global scales given; one alone is an error) the float32 sum is
    multiplied by ``(global_scale_x * global_scale_w) / 2688**2``. Returns ``[..., N]`` in x's
    dtype (and array type, unless ``out_type`` says otherwise); optional float ``bias [N]`` is
    added before rounding.
    """
    xa = _float_input(x, "x")
    spec = _spec(mode, group_size, bits, scale_rule, nonfinite, elem=elem)
    w_arr = _as_array(w, "w")
    if w_arr.dtype in _FLOAT_NAMES:
        wa = _float_input(w_arr, "w")
    elif w_arr.dtype in (np.uint8, np.uint32) or w_arr.dtype in _BYTE_CODE_DTYPES:
        wa = _packed_input(w_arr, "w", spec)
    else:
        raise TypeError(f"w: unsupported dtype {w_arr.dtype} (expected float32, float16, "
                        "ml_dtypes.bfloat16, or packed uint8 / uint32)")
    sa = None if scales is None else _scales_input(scales, "scales", spec)
    ya = _optional(bias, "bias", _FLOATS)
    return _deliver(_core.qqmm(xa, wa, sa, spec, _global_scale_arg(global_scale_x),
                               _global_scale_arg(global_scale_w), ya), _out_kind(out_type, x))


def gather_qmm(x, w_q, scales, biases=None, lhs_indices=None, rhs_indices=None, transpose=True,
               mode="nvfp4", group_size=None, bits=None, global_scale_w=None, elem="e4m3",
               sorted_indices=False, out_type=None):
    """Mixture-of-experts product: ``out[i] = x[lhs[i]] @ W[rhs[i]]^T`` (or ``@ W[rhs[i]]``).

    ``lhs_indices`` index the flattened batch axes of x (``x.shape[:-2]``), ``rhs_indices`` those
    of the quantized weight (``[E, N, K*bits/8]`` for E experts); int32, int64 or uint32 arrays,
    in range. A missing one defaults to arange over its operand's batch (shaped like it); the two
    broadcast and the result is ``broadcast(lhs, rhs).shape + (M, N)``. Both missing is
    :func:`quantized_matmul`. ``sorted_indices`` is a speed hint only: results never depend on
    it. Other arguments as in :func:`quantized_matmul`; for top-k routing pass x as
    ``[T, 1, 1, K]`` and ``rhs_indices`` as ``[T, k]``.
    """
    xa = _float_input(x, "x")
    spec = _spec(mode, group_size, bits, elem=elem, global_scale=global_scale_w)
    sa = _scales_input(scales, "scales", spec)
    ba = _optional(biases, "biases", _FLOATS)
    la = _indices(lhs_indices, "lhs_indices")
    ra = _indices(rhs_indices, "rhs_indices")
    wa = _packed_input(w_q, "w_q", spec)
    transpose = bool(transpose)
    return _deliver(_core.gather_qmm(xa, wa, sa, ba, la, ra, transpose, spec, bool(sorted_indices)),
                    _out_kind(out_type, x))
