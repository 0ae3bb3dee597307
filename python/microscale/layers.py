"""Inference layers over the quantized products. Each is a :class:`microscale.QuantizedWeight`
(``weight`` is its ``packed`` uint8, next to ``scales``, ``biases``, ``global_scale``, ``mode``,
``group_size``, ``bits`` and ``elem``) with a float ``bias`` and a product, so its quantized
parts can be inspected, or saved with :func:`microscale.save_checkpoint`, as they are.

>>> import numpy as np, microscale
>>> rng = np.random.default_rng(0)
>>> w = rng.standard_normal((32, 64)).astype(np.float32)
>>> layer = microscale.QuantizedLinear.from_linear(w, mode="nvfp4")   # three-level by default
>>> layer(rng.standard_normal((2, 64)).astype(np.float32)).shape
(2, 32)
>>> emb = microscale.QuantizedEmbedding.from_embedding(w, mode="affine", bits=4)
>>> emb(np.array([[3, 1]])).shape
(1, 2, 64)
"""

from __future__ import annotations

import numpy as np

from . import (_NAME_TO_DTYPE, _any_input, _as_array, _core, _dtype_name, _float_input,
               _global_scale_arg, _out_kind, _spec, _str, dequantize, global_scale)
from .matmul import _FLOATS, _indices, qqmm, quantized_matmul
from .weight import QuantizedWeight

__all__ = ["QuantizedLinear", "QuantizedEmbedding", "QQLinear"]


def _quantize_weight(weight, what, mode, group_size, bits, global_scale_, use_global_scale,
                     scale_rule, nonfinite, elem):
    """Quantize a 2-D float weight for a layer: compact scales, and for nvfp4 the weight's own
    amax as global scale unless one is given or use_global_scale is False."""
    arr = _float_input(weight, what)
    if arr.ndim != 2:
        raise ValueError(f"{what} must be 2-D, got shape {arr.shape}")
    mode = _str(mode, "mode")
    if mode == "nvfp4" and use_global_scale and global_scale_ is None:
        global_scale_ = global_scale(arr)
    gs = _global_scale_arg(global_scale_)
    q = _core.quantize(arr, _spec(mode, group_size, bits, scale_rule, nonfinite, "compact", elem, gs))
    return dict(weight=q.packed, scales=q.scales, biases=q.biases, mode=mode,
                group_size=q.spec.group_size, bits=q.spec.bits,
                global_scale=None if gs is None else np.float32(gs), elem=elem)


def _copy_bias(bias, n, layer):
    """A copy of a float ``[n]`` bias in the dtype it was given in, or None."""
    if bias is None:
        return None
    arr = _float_input(bias, f"{layer}: bias")
    if arr.shape != (n,):
        raise ValueError(f"{layer}: bias must have shape ({n},), got {arr.shape}")
    return np.array(arr, copy=True)


def _activation_amax(value, what):
    """A static activation amax as np.float32: finite and > 0 (0 would zero every input)."""
    if value is None or isinstance(value, bool):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}")
    g = _global_scale_arg(value)
    if not np.isfinite(g) or g <= 0:
        raise ValueError(f"{what} must be a finite number > 0 (the activations' amax), got {g}")
    return np.float32(g)



class _Layer(QuantizedWeight):
    """A layer's quantized 2-D weight [rows, K]: built from its parts, with the mode's default
    group size and bits where they are None."""

    def __init__(self, weight, scales, biases=None, mode="nvfp4", group_size=None, bits=None,
                 global_scale=None, elem="e4m3"):
        # The dtypes are checked here, the formats by the products, which know the spec.
        self.packed = _any_input(weight, "weight", {"uint8", "uint32", "float8"})[0]
        self.scales = _any_input(scales, "scales", {"uint8", "float8", *_FLOATS})[0]
        self.biases = None if biases is None else _any_input(biases, "biases", _FLOATS)[0]
        self.mode = _str(mode, "mode")
        default_group, default_bits = _core.mode_defaults(self.mode) or (None, None)
        self.group_size = default_group if group_size is None else group_size
        self.bits = default_bits if bits is None else bits
        self.global_scale = None if global_scale is None else np.float32(
            _global_scale_arg(global_scale))
        self.input_amax = None
        self.elem = elem

    # Layers compare and hash by identity, as objects holding arrays do.
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    # The layers' name for the packed values.
    @property
    def weight(self):
        return self.packed

    @weight.setter
    def weight(self, value):
        self.packed = value

    @property
    def shape(self):
        """The logical ``[rows, K]``, from the packed width and bits."""
        return tuple(self.packed.shape[:-1]) + (self.packed.shape[-1] * 8 // self.bits,)

    def _matmul(self, x, bias=None, out_type=None):
        return quantized_matmul(x, self.weight, self.scales, self.biases, True, self.mode,
                                self.group_size, self.bits, self.global_scale, self.elem, bias,
                                out_type)

    def __repr__(self):
        return (f"{type(self).__name__}(packed shape={tuple(self.weight.shape)}, "
                f"mode={self.mode!r}, group_size={self.group_size}, bits={self.bits}, "
                f"global_scale={self.global_scale})")


class QuantizedLinear(_Layer):
    """``y = x @ W^T + bias`` with W ``[out_features, in_features]`` quantized once.

    Build with :meth:`from_linear` (also named :meth:`from_float`), or from existing parts (e.g.
    a checkpoint) with the constructor: ``QuantizedLinear(weight, scales, biases=None, bias=None,
    mode=..., group_size=..., bits=..., global_scale=..., elem=...)``.
    """

    def __init__(self, weight, scales, biases=None, bias=None, mode="nvfp4", group_size=None,
                 bits=None, global_scale=None, elem="e4m3"):
        super().__init__(weight, scales, biases, mode, group_size, bits, global_scale, elem)
        self.bias = None if bias is None else _any_input(bias, "bias", _FLOATS)[0]

    @classmethod
    def from_linear(cls, weight, bias=None, mode="nvfp4", group_size=None, bits=None,
                    use_global_scale=True, global_scale=None, scale_rule="ceil",
                    nonfinite="propagate", elem="e4m3"):
        """Quantize a float ``[N, K]`` weight (and keep an optional float ``[N]`` bias in its
        dtype). nvfp4 weights are three-level with their own amax as global scale unless
        ``global_scale`` is given or ``use_global_scale`` is False."""
        parts = _quantize_weight(weight, "QuantizedLinear: weight", mode, group_size, bits, global_scale,
                                 use_global_scale, scale_rule, nonfinite, elem)
        n = parts["weight"].shape[0]
        return cls(bias=_copy_bias(bias, n, "QuantizedLinear"), **parts)

    # A layer from a float weight is from_linear, under the name torch's quantized modules use
    # (the inherited QuantizedWeight.from_float would build the bare weight's arguments).
    from_float = from_linear

    @property
    def in_features(self):
        return self.shape[-1]

    @property
    def out_features(self):
        return self.weight.shape[0]

    def __call__(self, x, out_type=None):
        """``x [..., in_features]`` -> ``[..., out_features]`` (see :func:`quantized_matmul`)."""
        return self._matmul(x, self.bias, out_type)

    forward = __call__


class QuantizedEmbedding(_Layer):
    """Row lookup in a quantized ``[V, D]`` table; only the selected rows are dequantized.
    :meth:`as_linear` multiplies by the table's transpose (tied output heads)."""

    def __init__(self, weight, scales, biases=None, mode="nvfp4", group_size=None, bits=None,
                 global_scale=None, elem="e4m3", dtype="float32"):
        super().__init__(weight, scales, biases, mode, group_size, bits, global_scale, elem)
        self.dtype = _NAME_TO_DTYPE[_dtype_name(dtype)]

    @classmethod
    def from_embedding(cls, table, mode="nvfp4", group_size=None, bits=None,
                       use_global_scale=True, global_scale=None, scale_rule="ceil",
                       nonfinite="propagate", elem="e4m3"):
        """Quantize a float ``[V, D]`` table; lookups return the table's dtype."""
        parts = _quantize_weight(table, "QuantizedEmbedding: table", mode, group_size, bits, global_scale,
                                 use_global_scale, scale_rule, nonfinite, elem)
        return cls(dtype=_as_array(table, "QuantizedEmbedding: table").dtype, **parts)

    from_float = from_embedding  # as QuantizedLinear.from_float

    @property
    def num_embeddings(self):
        return self.weight.shape[0]

    @property
    def dims(self):
        return self.shape[-1]

    def __call__(self, indices, out_type=None):
        """int32 / int64 / uint32 indices of any shape, each in ``[0, V)`` -> ``indices.shape +
        (D,)`` in the table's dtype, equal to the dequantized table's rows."""
        idx = _indices(indices, "QuantizedEmbedding: indices")
        if idx is None:
            raise TypeError("QuantizedEmbedding: indices must be an integer array, got None")
        flat = idx.reshape(-1)
        bad = np.flatnonzero((flat < 0) | (flat >= self.num_embeddings))
        if bad.size:
            raise ValueError(f"QuantizedEmbedding: indices value {flat[bad[0]]} at position "
                             f"{bad[0]} is out of range [0, {self.num_embeddings})")
        return dequantize(self.weight[idx], self.scales[idx],
                          None if self.biases is None else self.biases[idx], mode=self.mode,
                          global_scale=self.global_scale, dtype=self.dtype,
                          group_size=self.group_size, bits=self.bits, elem=self.elem,
                          out_type=_out_kind(out_type, indices))

    forward = __call__

    def as_linear(self, x, out_type=None):
        """``x [..., D]`` -> ``x @ table^T`` ``[..., V]`` (see :func:`quantized_matmul`)."""
        return self._matmul(x, None, out_type)


class QQLinear(_Layer):
    """``y = x @ W^T + bias`` with both operands quantized (nvfp4, mxfp4, mxfp8): the weight
    once, the activations on every call, exactly as :func:`qqmm` does.

    nvfp4 weights are three-level, and the activations use their own amax per call (dynamic
    per-tensor scale) until :meth:`calibrate` freezes a static one (``input_global_scale``).
    """

    def __init__(self, weight, scales, bias=None, mode="nvfp4", group_size=None, bits=None,
                 global_scale=None, input_global_scale=None, scale_rule="ceil",
                 nonfinite="propagate", elem="e4m3"):
        super().__init__(weight, scales, None, mode, group_size, bits, global_scale, elem)
        self.bias = None if bias is None else _any_input(bias, "bias", _FLOATS)[0]
        if input_global_scale is not None and self.global_scale is None:
            raise ValueError("QQLinear: input_global_scale needs a three-level nvfp4 weight "
                             "(global_scale); other modes have no activation global scale")
        self.input_global_scale = None if input_global_scale is None else _activation_amax(
            input_global_scale, "QQLinear: input_global_scale")
        self.scale_rule = scale_rule
        self.nonfinite = nonfinite

    # The static activation amax is the weight's input_amax, which checkpoints store (W4A4).
    @property
    def input_global_scale(self):
        return self.input_amax

    @input_global_scale.setter
    def input_global_scale(self, value):
        self.input_amax = value

    @classmethod
    def from_linear(cls, weight, bias=None, mode="nvfp4", group_size=None, bits=None,
                    global_scale=None, scale_rule="ceil", nonfinite="propagate", elem="e4m3"):
        """Quantize a float ``[N, K]`` weight (nvfp4: three-level, with its amax unless
        ``global_scale`` is given). ``scale_rule``, ``nonfinite`` and ``elem`` apply to the
        weight and to every activation."""
        if mode == "affine":
            raise ValueError("QQLinear: mode must be nvfp4, mxfp4 or mxfp8")
        parts = _quantize_weight(weight, "QQLinear: weight", mode, group_size, bits, global_scale, True,
                                 scale_rule, nonfinite, elem)
        del parts["biases"]
        n = parts["weight"].shape[0]
        return cls(bias=_copy_bias(bias, n, "QQLinear"), scale_rule=scale_rule,
                   nonfinite=nonfinite, **parts)

    from_float = from_linear  # as QuantizedLinear.from_float

    @property
    def in_features(self):
        return self.shape[-1]

    @property
    def out_features(self):
        return self.weight.shape[0]

    def calibrate(self, batches):
        """Freeze the activation global scale (nvfp4) at the largest amax over ``batches`` (an
        iterable of float arrays), as torchao's static NVFP4 flow. Returns self."""
        if self.mode != "nvfp4":
            raise ValueError("QQLinear.calibrate: only nvfp4 uses an activation global scale")
        k = self.in_features
        amax = None
        for i, batch in enumerate(batches):
            what = f"QQLinear.calibrate: batches[{i}]"
            arr = _float_input(batch, what)
            if arr.ndim == 0 or arr.shape[-1] != k:
                raise ValueError(f"{what} must have shape [..., {k}] (in_features), got {arr.shape}")
            # global_scale skips NaN and Inf, so a damaged batch would calibrate on its finite
            # rest (or to 0) without a word: refuse it instead.
            finite = np.isfinite(arr)
            if not finite.all():
                pos = np.unravel_index(np.argmin(finite), finite.shape)
                raise ValueError(f"{what} has {finite.size - np.count_nonzero(finite)} NaN or Inf "
                                 f"values (the first at index {tuple(int(p) for p in pos)}); "
                                 "calibrate on finite activations")
            amax = global_scale(arr) if amax is None else max(amax, global_scale(arr))
        if amax is None:
            raise ValueError("QQLinear.calibrate: no calibration batches")
        if amax == 0:
            raise ValueError("QQLinear.calibrate: every calibration batch is all zeros; a zero "
                             "activation scale would turn every input into zeros. Calibrate on "
                             "real activations")
        self.input_global_scale = np.float32(amax)
        return self

    def __call__(self, x, out_type=None):
        """``x [..., in_features]`` -> ``[..., out_features]`` in x's dtype."""
        xa = _float_input(x, "x")  # once, for the amax and the product
        gx = None
        if self.global_scale is not None:
            gx = self.input_global_scale if self.input_global_scale is not None else global_scale(xa)
        return qqmm(xa, self.weight, self.scales, self.mode, self.group_size, self.bits, gx,
                    self.global_scale, self.scale_rule, self.nonfinite, self.elem, self.bias,
                    _out_kind(out_type, x))

    forward = __call__
