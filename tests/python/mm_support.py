"""Float64 references and tolerances for the matmul and layer tests.

The reference product is computed from ``microscale.dequantize`` (the float32 value of every
weight) in float64. The contract (FORMATS.md section 6) accumulates in float32 in an unspecified
order, so each element may differ from the exact value by about K * 2^-24 * sum_k |x_k * w_k|;
half-precision outputs add half an ulp of the output for the single final rounding.
"""

import ml_dtypes
import numpy as np

import microscale

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
U = 2.0 ** -24  # float32 unit roundoff

# Weight formats under test: (id, quantize kwargs, K that is a multiple of the group).
SPECS = [
    ("nvfp4-2lvl", dict(mode="nvfp4"), 80),
    ("nvfp4-3lvl", dict(mode="nvfp4", global_scale=True), 80),
    ("mxfp4", dict(mode="mxfp4"), 96),
    ("mxfp8-e4m3", dict(mode="mxfp8", elem="e4m3"), 96),
    ("mxfp8-e5m2", dict(mode="mxfp8", elem="e5m2"), 96),
] + [(f"affine-b{b}-g{g}", dict(mode="affine", bits=b, group_size=g), 3 * g if g > 32 else 96)
     for b in (2, 3, 4, 5, 6, 8) for g in (32, 64, 128)]


def randn(rng, shape, dtype=F32, scale=1.0):
    """Normal data with a per-row spread of magnitudes, rounded to dtype."""
    rows = np.exp2(rng.integers(-3, 4, size=tuple(shape[:-1]) + (1,))) if len(shape) else 1.0
    return (rng.standard_normal(shape) * rows * scale).astype(np.float32).astype(dtype)


class QW:
    """A weight quantized with microscale.quantize, its parts and its float32 dequantized value."""

    def __init__(self, w, mode="nvfp4", global_scale=None, **kw):
        if global_scale is True:
            global_scale = microscale.global_scale(w)
        parts = microscale.quantize(w, mode=mode, global_scale=global_scale, **kw)
        self.wq, self.scales = parts[0], parts[1]
        self.biases = parts[2] if len(parts) == 3 else None
        self.kw = dict(mode=mode, **kw)
        self.gs = global_scale
        self.wd = microscale.dequantize(self.wq, self.scales, self.biases,
                                        global_scale=global_scale, **self.kw)

    def matmul_args(self):
        """Positional parts and keyword arguments for microscale.quantized_matmul / gather_qmm."""
        return (self.wq, self.scales, self.biases), dict(self.kw, global_scale_w=self.gs)

    def matmul(self, x, **extra):
        parts, kw = self.matmul_args()
        return microscale.quantized_matmul(x, *parts, **kw, **extra)


def ulp(v, dtype):
    """Spacing of dtype at |v| (float64 array), subnormals included."""
    mant, emin = {F32: (23, -126), F16: (10, -14), BF16: (7, -126)}[np.dtype(dtype)]
    a = np.abs(np.asarray(v, np.float64))
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    return np.exp2(np.maximum(e, emin) - mant)


def reference(x, wd, transpose=True, bias=None):
    """(exact float64 product, sum of |terms|) of x and the dequantized weight wd."""
    x64 = np.asarray(x).astype(np.float64)
    w64 = np.asarray(wd).astype(np.float64)
    wt = np.swapaxes(w64, -1, -2) if transpose else w64
    y, s = np.matmul(x64, wt), np.matmul(np.abs(x64), np.abs(wt))
    if bias is not None:
        b = np.asarray(bias).astype(np.float64)
        y, s = y + b, s + np.abs(b)
    return y, s


def assert_close(y, ref, s, K, out_dtype=F32, factor=1.0, what=""):
    """Element-wise |y - ref| <= factor*(K+2)*2^-24*s (+ half an output ulp for half types) and,
    for float32 results, a norm-wise relative error <= 1e-5."""
    y = np.asarray(y)
    assert y.dtype == np.dtype(out_dtype), f"{what}: dtype {y.dtype} != {np.dtype(out_dtype)}"
    assert y.shape == ref.shape, f"{what}: shape {y.shape} != {ref.shape}"
    y64 = y.astype(np.float64)
    assert np.all(np.isfinite(y64)), f"{what}: non-finite values"
    tol = factor * (K + 2) * U * s
    if np.dtype(out_dtype) != F32:
        tol = tol + 0.5 * ulp(y64, out_dtype)
    err = np.abs(y64 - ref)
    bad = np.flatnonzero(err > tol)
    assert bad.size == 0, (f"{what}: {bad.size} of {err.size} elements off; first at "
                           f"{np.unravel_index(bad[0], err.shape)}: got {y64.flat[bad[0]]!r}, "
                           f"want {ref.flat[bad[0]]!r}, tol {tol.flat[bad[0]]!r}")
    if np.dtype(out_dtype) == F32 and ref.size:
        nr = np.linalg.norm(ref)
        assert np.linalg.norm(y64 - ref) <= 1e-5 * nr + 1e-30, f"{what}: norm-wise error"
