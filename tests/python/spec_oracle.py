"""Independent numpy model of FORMATS.md sections 1-4 (the microscale contract).

Written from the spec text only, to be compared byte for byte against the C++ library. All
arithmetic that the spec writes as fl(...) is one numpy float32 operation on float32 operands
(numpy never contracts to FMA and keeps subnormals), in the order the spec gives. Element
rounding is done by table search (nearest grid value, ties to the even code) in float64, where
every difference involved is exact, so it shares no rounding trick with the C++ code.

Conventions: every quantizer takes an array of shape [..., K] (float32, float16 or ml_dtypes
bfloat16) and returns numpy arrays shaped as the library returns them. bfloat16 is
ml_dtypes.bfloat16; "RN_T" is numpy's / ml_dtypes' round-to-nearest-even cast.
"""

from __future__ import annotations

import numpy as np
import ml_dtypes

F32 = np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)


def f32_from_bits(u):
    return np.asarray(u, dtype=np.uint32).view(np.float32)


def bits_of(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


# Section 0 constants, as bits.
C6 = f32_from_bits(0x3E2AAAAB)[()]
C448 = f32_from_bits(0x3B124925)[()]
C57344 = f32_from_bits(0x37924925)[()]
C2688 = f32_from_bits(0x39C30C31)[()]
C2688SQ = f32_from_bits(0x34149B93)[()]
FLT_MAX = f32_from_bits(0x7F7FFFFF)[()]
EPS_AFFINE = f32_from_bits(0x33D6BF95)[()]  # 1e-7f

DTYPES = {"float32": np.dtype(np.float32), "float16": F16, "bfloat16": BF16}


def dtype_of(name_or_dtype):
    if isinstance(name_or_dtype, str):
        return DTYPES[name_or_dtype]
    return np.dtype(name_or_dtype)


def widen(x):
    """f32/f16/bf16 -> float32, exactly."""
    x = np.asarray(x)
    if x.dtype == np.float32:
        return x.copy()
    assert x.dtype in (F16, BF16), x.dtype
    return x.astype(np.float32)


def rn(x32, dtype):
    """RN_T: round float32 to the output dtype (RNE, overflow to Inf)."""
    dt = dtype_of(dtype)
    if dt == np.float32:
        return np.asarray(x32, dtype=np.float32).copy()
    with np.errstate(over="ignore"):
        return np.asarray(x32, dtype=np.float32).astype(dt)


# ---------------------------------------------------------------------------------------------
# Section 1: element formats. Value tables of the non-negative codes, in code order.

def _minifloat_values(ebits, mbits, bias, ncodes):
    vals = []
    for c in range(ncodes):
        e = c >> mbits
        m = c & ((1 << mbits) - 1)
        if e == 0:
            vals.append(m * 2.0 ** (1 - bias - mbits))
        else:
            vals.append((1 + m / 2.0 ** mbits) * 2.0 ** (e - bias))
    return np.array(vals, dtype=np.float64)


E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)
E4M3_VALUES = _minifloat_values(4, 3, 7, 0x7F)   # codes 0x00..0x7E (0x7F is NaN)
E5M2_VALUES = _minifloat_values(5, 2, 15, 0x7C)  # codes 0x00..0x7B (0x7C is Inf)
assert E2M1_VALUES.tolist() == _minifloat_values(2, 1, 1, 8).tolist()
assert E4M3_VALUES[-1] == 448 and E4M3_VALUES[1] == 2.0 ** -9
assert E5M2_VALUES[-1] == 57344 and E5M2_VALUES[1] == 2.0 ** -16

FORMATS = {
    # name: (value table of non-negative codes, sign bit, NaN code (standalone encoder))
    "e2m1": (E2M1_VALUES, 0x8, 0x7),
    "e4m3": (E4M3_VALUES, 0x80, 0x7F),
    "e5m2": (E5M2_VALUES, 0x80, 0x7F),
}


def rn_sat_code(v, fmt):
    """rn_sat_F as a code: nearest grid value, ties to the even code, finite overflow and +-Inf
    to +-max, the sign bit copied from the input (also for zero results), NaN to the format's
    standalone NaN code (E2M1 0x7, E4M3 0x7F, E5M2 0x7F)."""
    table, sbit, nan_code = FORMATS[fmt]
    v = np.asarray(v, dtype=np.float32)
    nan = np.isnan(v)
    a = np.abs(np.where(nan, np.float32(0), v)).astype(np.float64)
    a = np.where(nan, 0.0, a)
    top = len(table) - 1
    hi = np.searchsorted(table, a, side="left")  # first table value >= a
    hi_c = np.minimum(hi, top)
    lo = np.maximum(hi - 1, 0)
    exact = table[hi_c] == a
    d_lo = a - table[lo]          # exact in float64 (see module docstring)
    d_hi = table[hi_c] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi_c % 2 == 0))
    idx = np.where(exact, hi_c, np.where(pick_hi, hi_c, lo))
    idx = np.where(a > table[top], top, idx)  # saturate (covers +-Inf)
    code = idx.astype(np.uint8) | np.where(np.signbit(v), sbit, 0).astype(np.uint8)
    return np.where(nan, nan_code, code).astype(np.uint8)


def decode_code(c, fmt):
    """val(c) as float32: E2M1 (low nibble), E4M3 (0x7F/0xFF NaN), E5M2 (0x7C/0xFC Inf)."""
    c = np.asarray(c, dtype=np.uint8)
    if fmt == "e2m1":
        mag = E2M1_VALUES[c & 7]
        return np.where(c & 8, -mag, mag).astype(np.float32)
    if fmt == "e4m3":
        low = c & 0x7F
        mag = np.where(low == 0x7F, np.nan, E4M3_VALUES[np.minimum(low, 0x7E)])
        return np.where(c & 0x80, -mag, mag).astype(np.float32)
    if fmt == "e5m2":
        low = c & 0x7F
        mag = np.where(low >= 0x7D, np.nan,
                       np.where(low == 0x7C, np.inf, E5M2_VALUES[np.minimum(low, 0x7B)]))
        return np.where(c & 0x80, -mag, mag).astype(np.float32)
    raise ValueError(fmt)


def decode_e8m0(e):
    """val(e) = 2^(e-127) by bits: e >= 1 -> e << 23, 0 -> 0x00400000, 0xFF -> NaN."""
    e = np.asarray(e, dtype=np.uint32)
    b = np.where(e == 0, 0x00400000, e << 23)
    b = np.where(e == 255, 0x7FC00000, b)
    return f32_from_bits(b.astype(np.uint32))


def e8m0_reciprocal(e):
    """2^(127-e) by bits: (254-e) << 23 for e <= 253, 0x00400000 for e = 254."""
    e = np.asarray(e, dtype=np.int64)
    b = np.where(e <= 253, (254 - np.minimum(e, 253)) << 23, 0x00400000)
    return f32_from_bits(b.astype(np.uint32))


def encode_e8m0_standalone(v):
    """Standalone E8M0 encoder of include/microscale/codecs.hpp: nearest power of two in the linear
    domain, 1.5*2^k rounds up, saturating to 2^127 / 2^-127; zero, negative, NaN, Inf -> 0xFF."""
    v = np.asarray(v, dtype=np.float32)
    bad = ~np.isfinite(v) | (v <= 0) | np.signbit(v)
    a = np.where(bad, np.float32(1), v).astype(np.float64)
    a = np.where(bad, 1.0, a)
    m, ex = np.frexp(a)          # a = m * 2^ex, m in [0.5, 1): floor(log2 a) = ex - 1
    k = ex - 1 + (m >= 0.75)     # m >= 0.75 <=> a >= 1.5 * 2^(ex-1)
    e = np.clip(k + 127, 0, 254)
    return np.where(bad, 255, e).astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# Section 2: modes.

MODE_DEFAULTS = {"nvfp4": (16, 4), "mxfp4": (32, 4), "mxfp8": (32, 8), "affine": (64, 4)}
ELEM = {"e2m1": (6.0, 2, 1, C6), "e4m3": (448.0, 8, 3, C448), "e5m2": (57344.0, 15, 2, C57344)}


class NonFiniteError(ValueError):
    pass


def _flat2d(x):
    """[..., K] -> float32 [R, K] (a copy), the input dtype, and the leading shape."""
    x = np.asarray(x)
    in_dtype = x.dtype
    x32 = widen(x)
    lead = x32.shape[:-1]
    k = x32.shape[-1]
    r = int(np.prod(lead, dtype=np.int64))
    return x32.reshape(r, k), in_dtype, lead


def _first_nonfinite(x32, shape):
    bad = np.flatnonzero(~np.isfinite(x32.reshape(-1)))
    if bad.size == 0:
        return None
    i = int(bad[0])
    v = x32.reshape(-1)[i]
    cls = "NaN" if np.isnan(v) else ("+Inf" if v > 0 else "-Inf")
    return i, tuple(int(t) for t in np.unravel_index(i, shape)), cls


def block_amax(blocks, nonfinite):
    """bamax over the last axis. 'saturate': fmaxf semantics (NaN skipped, Inf kept); otherwise
    the max over finite values (non-finite blocks are overwritten afterwards)."""
    a = np.abs(blocks)
    if nonfinite == "saturate":
        return np.fmax.reduce(a, axis=-1, initial=np.float32(0)).astype(np.float32)
    return np.where(np.isfinite(a), a, np.float32(0)).max(axis=-1, initial=np.float32(0))


def mx_scale(bamax, elem, rule, in_dtype=np.float32):
    """E8M0 scale byte of FORMATS.md 2.2 for block maxima bamax (float32 array, >= 0 or Inf)."""
    max_elem, emax, m, cmax = ELEM[elem]
    bamax = np.asarray(bamax, dtype=np.float32)
    with np.errstate(all="ignore"):
        if rule == "ceil":
            v = bamax * cmax
            b = bits_of(v).astype(np.int64)
            e = b >> 23
            mant = b & 0x7FFFFF
            up = (mant != 0) & (e != 0xFE) & ~((e == 0) & (mant <= 0x400000))
            e = e + up
            e = np.where(v == 0, 0, e)
            e = np.where(v == np.inf, 0xFE, e)
            e = np.where(np.isnan(v), 0xFF, e)
            return e.astype(np.uint8)
        if rule == "floor":
            E = ((bits_of(bamax).astype(np.int64) >> 23) & 0xFF) - 127
            s = np.maximum(E - emax, -127) + 127
            return np.where(bamax == 0, 0, s).astype(np.uint8)
        if rule == "even":
            b = (bits_of(bamax).astype(np.int64) + (1 << (22 - m))) & 0xFF800000
            E = (b >> 23) - 127
            return (np.clip(E - emax, -127, 127) + 127).astype(np.uint8)
        if rule == "nearest":
            a = rn(bamax / np.float32(max_elem), in_dtype).astype(np.float32)
            # fl(log2 a), correctly rounded: float64 log2 rounded once to float32.
            L = np.log2(np.where(a == 0, 1, a).astype(np.float64)).astype(np.float32)
            L = rn(L, in_dtype).astype(np.float32)
            s = np.clip(np.rint(L.astype(np.float64)) + 127, 0, 254)
            s = np.where(a == 0, 0x7F, s)
            return s.astype(np.uint8)
    raise ValueError(rule)


def pack_fp4(codes):
    codes = np.asarray(codes, dtype=np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_fp4(packed):
    packed = np.asarray(packed, dtype=np.uint8)
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed & 0xF
    out[..., 1::2] = packed >> 4
    return out


def pack_bits(codes, b):
    """LSB-first bit stream per row: element i at stream bits [i*b, (i+1)*b)."""
    codes = np.asarray(codes, dtype=np.uint32)
    bits = ((codes[..., None] >> np.arange(b, dtype=np.uint32)) & 1).astype(np.uint8)
    bits = bits.reshape(codes.shape[:-1] + (codes.shape[-1] * b,))
    return np.packbits(bits, axis=-1, bitorder="little")


def unpack_bits(packed, b):
    packed = np.asarray(packed, dtype=np.uint8)
    bits = np.unpackbits(packed, axis=-1, bitorder="little")
    k = bits.shape[-1] // b
    bits = bits.reshape(packed.shape[:-1] + (k, b)).astype(np.uint32)
    return (bits << np.arange(b, dtype=np.uint32)).sum(axis=-1).astype(np.uint32)


def quantize(x, mode="nvfp4", group_size=None, bits=None, scale_rule="ceil",
             nonfinite="propagate", elem="e4m3", global_scale=None, layout="compact"):
    """Returns (packed, scales) or (packed, scales, biases) for affine."""
    g_def, b_def = MODE_DEFAULTS[mode]
    g = g_def if group_size is None else group_size
    b = b_def if bits is None else bits
    x = np.asarray(x)
    shape = x.shape
    x32, in_dtype, lead = _flat2d(x)
    R, K = x32.shape
    assert K % g == 0
    if nonfinite == "error":
        first = _first_nonfinite(x32, shape)
        if first is not None:
            raise NonFiniteError(f"non-finite input at flat index {first[0]}, index {first[1]}: {first[2]}")
        nonfinite = "propagate"
    blocks = x32.reshape(R, K // g, g)
    bad = ~np.isfinite(blocks).all(axis=-1)  # blocks holding NaN or Inf
    propagate = nonfinite == "propagate" or mode == "affine"
    with np.errstate(all="ignore"):
        if mode == "nvfp4":
            bamax = block_amax(blocks, nonfinite)
            if global_scale is None:
                s = rn_sat_code(bamax * C6, "e4m3")
                sf = decode_code(s, "e4m3")
                enc = np.fmin(np.float32(1) / sf, FLT_MAX)
            else:
                amax = np.float32(global_scale)
                s_enc = np.fmin(np.float32(2688) / amax, FLT_MAX)
                if amax == 0 or s_enc == 0:
                    s_enc = np.float32(1)
                s_dec = np.float32(1) / s_enc
                t = s_enc * C6
                s = rn_sat_code(np.fmin(bamax * t, FLT_MAX), "e4m3")
                sf = decode_code(s, "e4m3")
                enc = np.fmin(np.float32(1) / (sf * s_dec), FLT_MAX)
            codes = rn_sat_code(blocks * enc[..., None], "e2m1")
            if propagate:
                s = np.where(bad, 0x7F, s).astype(np.uint8)
                codes = np.where(bad[..., None], 0, codes).astype(np.uint8)
            packed = pack_fp4(codes.reshape(R, K))
        elif mode in ("mxfp4", "mxfp8"):
            el = "e2m1" if mode == "mxfp4" else elem
            bamax = block_amax(blocks, nonfinite)
            s = mx_scale(bamax, el, scale_rule, in_dtype)
            r = e8m0_reciprocal(s)
            codes = rn_sat_code(blocks * r[..., None], el)
            if propagate:
                s = np.where(bad, 0xFF, s).astype(np.uint8)
                codes = np.where(bad[..., None], 0, codes).astype(np.uint8)
            codes = codes.reshape(R, K)
            packed = pack_fp4(codes) if mode == "mxfp4" else codes
        elif mode == "affine":
            n = np.float32(2 ** b - 1)
            wmax = blocks.max(axis=-1, initial=-np.inf)
            wmin = blocks.min(axis=-1, initial=np.inf)
            neg = np.abs(wmin) > np.abs(wmax)
            scale = np.fmax((wmax - wmin) / n, EPS_AFFINE)
            scale = np.where(neg, scale, -scale)
            edge = np.where(neg, wmin, wmax)
            q0 = np.rint(edge / scale)
            nz = q0 != 0
            scale = np.where(nz, edge / np.where(nz, q0, np.float32(1)), scale)
            bias = np.where(nz, edge, np.float32(0)).astype(np.float32)
            q = np.rint((blocks - bias[..., None]) / scale[..., None])
            q = np.clip(q, 0, n)
            q = np.where(bad[..., None], 0, q)
            scale = np.where(bad, np.nan, scale).astype(np.float32)
            bias = np.where(bad, np.nan, bias).astype(np.float32)
            packed = pack_bits(q.reshape(R, K).astype(np.uint32), b)
            scales_out = rn(scale, in_dtype).reshape(lead + (K // g,))
            biases_out = rn(bias, in_dtype).reshape(lead + (K // g,))
            return packed.reshape(lead + (K * b // 8,)), scales_out, biases_out
        else:
            raise ValueError(mode)
    packed = packed.reshape(lead + (K * b // 8,))
    if layout == "swizzled":
        return packed, swizzle(s.reshape(R, K // g))
    return packed, s.reshape(lead + (K // g,))


def dequantize(packed, scales, biases=None, mode="nvfp4", group_size=None, bits=None,
               elem="e4m3", global_scale=None, dtype="float32", layout="compact"):
    g_def, b_def = MODE_DEFAULTS[mode]
    g = g_def if group_size is None else group_size
    b = b_def if bits is None else bits
    packed = np.asarray(packed, dtype=np.uint8)
    lead = packed.shape[:-1]
    K = packed.shape[-1] * 8 // b
    R = int(np.prod(lead, dtype=np.int64))
    p2 = packed.reshape(R, packed.shape[-1])
    if layout == "swizzled":
        scales = unswizzle(scales, R, K // g)
    with np.errstate(all="ignore"):
        if mode == "affine":
            q = unpack_bits(p2, b).astype(np.float32).reshape(R, K // g, g)
            s = widen(np.asarray(scales)).reshape(R, K // g, 1)
            bb = widen(np.asarray(biases)).reshape(R, K // g, 1)
            y = (q * s) + bb
        else:
            s = np.asarray(scales, dtype=np.uint8).reshape(R, K // g)
            if mode == "mxfp8":
                vals = decode_code(p2, elem)
            else:
                vals = decode_code(unpack_fp4(p2), "e2m1")
            vals = vals.reshape(R, K // g, g)
            if mode == "nvfp4":
                sf = decode_code(s, "e4m3")
                if global_scale is None:
                    y = vals * sf[..., None]
                else:
                    amax = np.float32(global_scale)
                    y = vals * ((sf * amax) * C2688)[..., None]
            else:
                y = vals * decode_e8m0(s)[..., None]
    return rn(y.astype(np.float32).reshape(lead + (K,)), dtype)


def global_scale(x):
    x32 = widen(np.asarray(x)).reshape(-1)
    a = np.abs(x32[np.isfinite(x32)])
    return np.float32(a.max()) if a.size else np.float32(0)


# ---------------------------------------------------------------------------------------------
# Section 4: swizzled scale layout.

def swizzled_offset(r, c, cp):
    return ((r // 128) * (cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)


def swizzle(scales):
    s = np.asarray(scales, dtype=np.uint8)
    C = s.shape[-1]
    R = int(np.prod(s.shape[:-1], dtype=np.int64))
    s = s.reshape(R, C)
    Rp = -(-R // 128) * 128
    Cp = -(-C // 4) * 4
    out = np.zeros(Rp * Cp, dtype=np.uint8)
    r, c = np.meshgrid(np.arange(R), np.arange(C), indexing="ij")
    out[swizzled_offset(r, c, Cp)] = s
    return out.reshape(Rp, Cp)


def unswizzle(sw, rows, cols):
    sw = np.asarray(sw, dtype=np.uint8).reshape(-1)
    Cp = -(-cols // 4) * 4
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return sw[swizzled_offset(r, c, Cp)].reshape(rows, cols)


def swizzle_by_permute(scales):
    """The second description of section 4: view [Rp/128, 4, 32, Cp/4, 4], permute (0,3,2,1,4)."""
    s = np.asarray(scales, dtype=np.uint8)
    C = s.shape[-1]
    R = int(np.prod(s.shape[:-1], dtype=np.int64))
    s = s.reshape(R, C)
    Rp = -(-R // 128) * 128
    Cp = -(-C // 4) * 4
    pad = np.zeros((Rp, Cp), dtype=np.uint8)
    pad[:R, :C] = s
    return pad.reshape(Rp // 128, 4, 32, Cp // 4, 4).transpose(0, 3, 2, 1, 4).reshape(Rp, Cp)
