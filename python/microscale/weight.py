"""The one quantized-weight type: the parts ``microscale.quantize`` returns and the arguments
that decode them. Checkpoints hold their layers as it, and the layers (``microscale.layers``) are
it with a product attached."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import _any_input, _core, _packed_input, _scales_input

__all__ = ["QuantizedWeight"]


@dataclass
class QuantizedWeight:
    """One quantized 2-D weight ``[N, K]`` (a Linear layer's), as ``microscale.quantize`` returns it.

    packed: uint8 ``[N, K*bits/8]``; scales: uint8 codes (fp modes) or the weight's float dtype
    (affine) ``[N, K/group_size]``; biases: affine only. global_scale: nvfp4 tensor amax
    (three-level) or None (two-level). input_amax: static activation amax (W4A4), if any.
    elem: the mxfp8 element format (``"e4m3"`` or ``"e5m2"``).
    """

    packed: np.ndarray
    scales: np.ndarray
    biases: Optional[np.ndarray]
    mode: str
    group_size: int
    bits: int
    shape: tuple
    global_scale: Optional[float] = None
    input_amax: Optional[float] = None
    elem: str = "e4m3"

    @classmethod
    def from_float(cls, w, mode="nvfp4", group_size=None, bits=None, global_scale=False, **kwargs):
        """Quantize a float ``[N, K]`` weight. ``global_scale=True`` uses the tensor amax
        (three-level nvfp4); a number is taken as the amax."""
        from . import _as_array, global_scale as amax_of, quantize

        g = None
        if mode == "nvfp4" and global_scale is not False and global_scale is not None:
            g = amax_of(w) if global_scale is True else global_scale
        out = quantize(w, mode=mode, group_size=group_size, bits=bits, global_scale=g,
                       out_type="numpy", **kwargs)
        packed, scales, biases = (out + (None,))[:3]
        w = _as_array(w, "w")
        k = w.shape[-1]
        gs = scales.shape[-1]
        return cls(packed, scales, biases, mode, k // gs, packed.shape[-1] * 8 // k, tuple(w.shape),
                   None if g is None else float(np.float32(g)), elem=kwargs.get("elem", "e4m3"))

    def dequantize(self, dtype="float32"):
        from . import dequantize

        return dequantize(self.packed, self.scales, self.biases, mode=self.mode, group_size=self.group_size,
                          bits=self.bits, global_scale=self.global_scale, dtype=dtype, elem=self.elem)

    # The C++ value (_core.Quantized) this stands for, on the way into and out of _core.
    @classmethod
    def _from_core(cls, q, input_amax=None):
        s = q.spec
        return cls(q.packed, q.scales, q.biases, s.mode.name, s.group_size, s.bits, tuple(q.shape),
                   s.global_scale, input_amax, s.elem.name)

    def _to_core(self):
        spec = _core.QuantSpec(
            mode=_core.Mode.from_name(self.mode), group_size=int(self.group_size), bits=int(self.bits),
            elem=_core.Elem.from_name(self.elem),
            global_scale=None if self.global_scale is None else float(self.global_scale))
        packed = _stored(_packed_input(self.packed, "QuantizedWeight.packed", spec))
        scales = _stored(_scales_input(self.scales, "QuantizedWeight.scales", spec))
        biases = None
        if self.biases is not None:
            biases = _stored(_any_input(self.biases, "QuantizedWeight.biases",
                                        {"float32", "float16", "bfloat16"})[0])
        return _core.Quantized(packed, scales, biases, spec, [int(d) for d in self.shape])


def _stored(a):
    """A part as _core.Quantized copies it: C-contiguous, 8-bit float codes as their uint8 bytes
    (the caller has checked their format)."""
    a = np.ascontiguousarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a
