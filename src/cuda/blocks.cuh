// Per-group quantization and per-chunk decoding shared by the CUDA kernels and the host-side test.
// The math of each group (scale codes, encode and decode factors, affine scale and bias) is the
// scalar specification's (src/core/numerics.hpp), which the CPU reference calls too, so kernel
// outputs are byte-identical to it; what is here is the data movement. The host test runs these
// very functions over the test inputs and compares them with microscale::quantize / dequantize.
#pragma once

#include "cuda/codecs.cuh"
#include "microscale/format.hpp"

namespace microscale::cuda::detail {

MS_HD std::int64_t swizzled_offset(std::int64_t r, std::int64_t c, std::int64_t cp) {
  return ((r / 128) * (cp / 4) + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

// Device code must not read packed words through memcpy (nvcc then emits byte loads); the host
// test must not read them through a cast (alignment and aliasing). Callers guarantee alignment.
MS_HD std::uint32_t load_u32(const std::uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const std::uint32_t*>(p);
#else
  std::uint32_t v;
  memcpy(&v, p, 4);
  return v;
#endif
}
MS_HD std::uint64_t load_u64(const std::uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const std::uint64_t*>(p);
#else
  std::uint64_t v;
  memcpy(&v, p, 8);
  return v;
#endif
}

// ---- quantize ------------------------------------------------------------------------------

struct QuantizeArgs {
  const void* x;  // rows x K values of dtype src, row-major
  DType src;
  std::int64_t rows, K, groups;
  Mode mode;
  int group, bits;
  ScaleRule rule;
  NonFinite nonfinite;
  Elem elem;
  numerics::Nvfp4Tensor nvfp4;  // the tensor-level factors (two-level: 1)
  bool swizzled;
  std::int64_t scale_cols_padded;  // Cp of the swizzled layout
  std::uint8_t* packed;            // rows x K*bits/8
  void* scales;                    // uint8 codes, or src-typed affine scales
  void* biases;                    // affine only
};

// Host side. spec must be resolved.
inline QuantizeArgs quantize_args(const QuantSpec& spec, DType src, const void* x, std::int64_t rows, std::int64_t K,
                                  std::uint8_t* packed, void* scales, void* biases) {
  QuantizeArgs a{};
  a.x = x;
  a.src = src;
  a.rows = rows;
  a.K = K;
  a.groups = K / spec.group_size;
  a.mode = spec.mode;
  a.group = spec.group_size;
  a.bits = spec.bits;
  a.rule = spec.scale_rule;
  a.nonfinite = spec.nonfinite;
  a.elem = spec.elem;
  a.nvfp4 = numerics::nvfp4_tensor(spec.mode == Mode::nvfp4 && spec.global_scale.has_value(),
                                   spec.global_scale.value_or(0.0f));
  a.swizzled = spec.layout == Layout::swizzled;
  a.scale_cols_padded = (a.groups + 3) / 4 * 4;
  a.packed = packed;
  a.scales = scales;
  a.biases = biases;
  return a;
}

// Writes `n` zero bytes: the element codes of a non-finite block (outputs are not pre-zeroed).
MS_HD void zero_bytes(std::uint8_t* p, int n) {
  for (int i = 0; i < n; ++i) p[i] = 0;
}

// Quantizes group g (row-major over rows x groups) of the input; one call per group.
MS_HD void quantize_group(const QuantizeArgs& a, std::int64_t g) {
  const std::int64_t row = g / a.groups, j = g % a.groups;
  const std::int64_t x0 = row * a.K + j * a.group;
  std::uint8_t* out = a.packed + row * (a.K * a.bits / 8) + j * a.group * a.bits / 8;
  const int n = a.group, nbytes = a.group * a.bits / 8;
  const std::int64_t si = a.swizzled ? swizzled_offset(row, j, a.scale_cols_padded) : g;

  // Only 'saturate' uses the block amax of a non-finite block.
  bool finite = true;
  float bamax = 0.0f, wmax = 0.0f, wmin = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float v = load_float(a.x, x0 + i, a.src);
    finite = finite && is_finite(v);
    bamax = numerics::amax_step(bamax, v);
    // affine: as std::max / std::min from w[0] on (matters only for the sign of a zero)
    wmax = i == 0 ? v : (wmax < v ? v : wmax);
    wmin = i == 0 ? v : (v < wmin ? v : wmin);
  }

  if (a.mode == Mode::affine) {
    // 'saturate' has no affine form and acts as 'propagate'.
    if (!finite) {
      store_float(a.scales, g, a.src, float_of(numerics::kQuietNaNBits));
      store_float(a.biases, g, a.src, float_of(numerics::kQuietNaNBits));
      zero_bytes(out, nbytes);
      return;
    }
    const numerics::AffineScaleBias p = numerics::affine_scale_bias(wmin, wmax, a.bits);
    const float max_code = numerics::affine_max_code(a.bits);
    // LSB-first bit stream; every group starts and ends on a byte boundary (group * bits % 8 == 0).
    std::uint32_t acc = 0;
    int filled = 0;
    for (int i = 0; i < n; ++i) {
      acc |= numerics::affine_code(load_float(a.x, x0 + i, a.src), p, max_code) << filled;
      for (filled += a.bits; filled >= 8; filled -= 8, acc >>= 8) *out++ = static_cast<std::uint8_t>(acc);
    }
    store_float(a.scales, g, a.src, p.scale);
    store_float(a.biases, g, a.src, p.bias);
    return;
  }

  std::uint8_t* scale = static_cast<std::uint8_t*>(a.scales) + si;
  if (!finite && a.nonfinite != NonFinite::saturate) {
    // the scale format's NaN; element codes 0
    *scale = a.mode == Mode::nvfp4 ? numerics::E4M3::NAN_CODE : numerics::kE8M0NaN;
    zero_bytes(out, nbytes);
    return;
  }
  const numerics::BlockScale bs =
      a.mode == Mode::nvfp4
          ? numerics::nvfp4_block_scale(bamax, a.nvfp4)
          : numerics::mx_block_scale(bamax, numerics::mx_elem(a.mode, a.elem), a.rule, a.src, numerics::Log2Double{});
  *scale = bs.code;
  const float enc = bs.enc;
  if (a.mode == Mode::mxfp8) {
    for (int i = 0; i < n; ++i) out[i] = numerics::encode_fp8(a.elem, load_float(a.x, x0 + i, a.src) * enc);
    return;
  }
  for (int i = 0; i < n; i += 2) {  // FP4: even element in the low nibble
    const std::uint8_t lo = encode_e2m1(load_float(a.x, x0 + i, a.src) * enc);
    const std::uint8_t hi = encode_e2m1(load_float(a.x, x0 + i + 1, a.src) * enc);
    out[i / 2] = static_cast<std::uint8_t>(lo | (hi << 4));
  }
}

// ---- decode (dequantize, and the weight operand of the matmuls) ----------------------------

// A quantized operand: `batches` matrices of rows x cols values, groups along cols.
struct QuantizedArgs {
  const std::uint8_t* packed;
  const void* scales;  // uint8 codes, or affine scales of scale_dtype
  const void* biases;  // affine only
  DType scale_dtype;
  Mode mode;
  int group, bits;
  Elem elem;
  std::int64_t rows, cols, row_bytes, groups;
  bool swizzled;  // 2-D only
  std::int64_t scale_cols_padded;
  bool three_level;
  float amax;  // nvfp4 global scale
};

// Host side; spec must be resolved.
inline QuantizedArgs quantized_args(const QuantSpec& spec, const void* packed, const void* scales, const void* biases,
                                    DType scale_dtype, std::int64_t rows, std::int64_t cols) {
  QuantizedArgs q{};
  q.packed = static_cast<const std::uint8_t*>(packed);
  q.scales = scales;
  q.biases = biases;
  q.scale_dtype = scale_dtype;
  q.mode = spec.mode;
  q.group = spec.group_size;
  q.bits = spec.bits;
  q.elem = spec.elem;
  q.rows = rows;
  q.cols = cols;
  q.row_bytes = cols * spec.bits / 8;
  q.groups = cols / spec.group_size;
  q.swizzled = spec.layout == Layout::swizzled;
  q.scale_cols_padded = (q.groups + 3) / 4 * 4;
  q.three_level = spec.mode == Mode::nvfp4 && spec.global_scale.has_value();
  q.amax = q.three_level ? *spec.global_scale : 0.0f;
  return q;
}

// Values (r, c..c+7) of matrix `batch`, c a multiple of 8 (groups are, so a chunk has one scale).
// With `global`, exactly what dequantize gives; without, three-level nvfp4 leaves out the
// tensor factor amax/2688 (the two-level value e * sf, exact in f32 and bf16), which the matmuls
// apply once to the f32 sum.
MS_HD void decode8(const QuantizedArgs& q, std::int64_t batch, std::int64_t r, std::int64_t c, bool global,
                   float v[8]) {
  const std::uint8_t* p = q.packed + (batch * q.rows + r) * q.row_bytes + c * q.bits / 8;
  const std::int64_t gi =
      q.swizzled ? swizzled_offset(r, c / q.group, q.scale_cols_padded) : (batch * q.rows + r) * q.groups + c / q.group;
  if (q.mode == Mode::affine) {
    const float s = load_float(q.scales, gi, q.scale_dtype), b = load_float(q.biases, gi, q.scale_dtype);
    std::uint64_t word = 0;  // 8 values of `bits` bits = `bits` bytes, LSB first
    for (int i = 0; i < q.bits; ++i) word |= static_cast<std::uint64_t>(p[i]) << (8 * i);
    const std::uint64_t mask = (1u << q.bits) - 1;
    for (int i = 0; i < 8; ++i)
      v[i] = numerics::affine_decode(static_cast<std::uint32_t>((word >> (i * q.bits)) & mask), s, b);
    return;
  }
  const std::uint32_t code = static_cast<const std::uint8_t*>(q.scales)[gi];
  if (q.mode == Mode::mxfp8) {
    const float s = decode_e8m0(code);
    const std::uint64_t w = load_u64(p);
    for (int i = 0; i < 8; ++i) {
      const std::uint32_t e = static_cast<std::uint32_t>(w >> (8 * i)) & 0xFFu;
      v[i] = numerics::decode_fp8(q.elem, e) * s;
    }
    return;
  }
  const float factor =
      q.mode == Mode::mxfp4 ? decode_e8m0(code) : numerics::nvfp4_decode_factor(code, q.three_level && global, q.amax);
  const std::uint32_t w = load_u32(p);
  for (int i = 0; i < 8; ++i) v[i] = decode_e2m1((w >> (4 * i)) & 0xFu) * factor;
}

// Dequantizes chunk `id` (8 consecutive values of a row) of a 2-D view [rows, cols] into y: the
// host model of dequantize_kernel, which stores the same decode8 values as 16-byte vectors.
MS_HD void dequantize_chunk(const QuantizedArgs& q, void* y, DType out, std::int64_t id) {
  const std::int64_t per_row = q.cols / 8, r = id / per_row, c = (id % per_row) * 8;
  float v[8];
  decode8(q, 0, r, c, true, v);
  for (int i = 0; i < 8; ++i) store_float(y, r * q.cols + c + i, out, v[i]);
}

// ---- bf16 parts (tensor-core operands of the matmuls) ----------------------------------------

// v as the sum of P bf16 bit patterns, largest first. Exact for P = 3 and any f32 of magnitude
// >= 2^-110 (each part takes the next 8+1 significant bits of the remainder), for P = 2 on f16
// values and P = 1 on bf16 values. A part that would round past bf16's largest finite value is
// truncated instead, and once a part is non-finite the rest are 0, so Inf and NaN reach the sum
// as they would in f32 (not as Inf - Inf).
template <int P>
MS_HD void split_bf16(float v, std::uint16_t (&out)[P]) {
  for (int p = 0; p < P; ++p) {
    std::uint16_t h = encode_bf16(v);
    if ((h & 0x7FFFu) == 0x7F80u && is_finite(v)) h = static_cast<std::uint16_t>(bits_of(v) >> 16);
    out[p] = h;
    const float hv = decode_bf16(h);
    v = is_finite(hv) ? v - hv : 0.0f;
  }
}

}  // namespace microscale::cuda::detail
