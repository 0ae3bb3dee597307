// Element codecs of FORMATS.md section 1 as __host__ __device__ functions, so the CUDA kernels and
// the host-side test run the same source. They reproduce src/core/codecs.cpp bit for bit with
// integer code and single IEEE binary32 operations only (no tables, no libm except log2 in
// blocks.cuh, no hardware FP8/FP4 conversions: sm_90 has no E2M1 cvt, and cvt's NaN handling is
// not the contract's). Kernels including this are compiled with --fmad=false, so no expression
// here is contracted into an FMA; the host side builds with -ffp-contract=off for the same reason.
// Plain C++ when not compiled by nvcc, so host-only code (and the host test) can include it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "microscale/dtype.hpp"

#if defined(__CUDACC__)
#define MS_HD __host__ __device__ __forceinline__
#else
#define MS_HD inline
#endif

namespace microscale::cuda::detail {

MS_HD std::uint32_t bits_of(float f) {
  std::uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
MS_HD float float_of(std::uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// FORMATS.md section 0 constants.
constexpr std::uint32_t kC6 = 0x3E2AAAABu;
constexpr std::uint32_t kC448 = 0x3B124925u;
constexpr std::uint32_t kC57344 = 0x37924925u;
constexpr std::uint32_t kC2688 = 0x39C30C31u;
constexpr std::uint32_t kFltMax = 0x7F7FFFFFu;
constexpr std::uint32_t kQuietNaN = 0x7FC00000u;  // the NaN std::numeric_limits gives on the CPU

MS_HD bool is_nan(float v) { return (bits_of(v) & 0x7FFFFFFFu) > 0x7F800000u; }
MS_HD bool is_finite(float v) { return (bits_of(v) & 0x7F800000u) != 0x7F800000u; }

// Magnitude a (0 <= a < max) to the code of a minifloat with M mantissa bits and smallest normal
// 2^EMIN, ties to even; same construction as the CPU's round_magnitude. `sub_scale` is
// 2^(M-EMIN): below the normals the codes are multiples of 2^(EMIN-M), and that power-of-two
// product is exact.
template <int M, int EMIN>
MS_HD std::uint32_t round_magnitude(float a, float min_normal, float sub_scale) {
  if (a < min_normal) return static_cast<std::uint32_t>(rintf(a * sub_scale));
  constexpr int kShift = 23 - M;
  std::uint32_t b = bits_of(a);
  b += ((1u << (kShift - 1)) - 1) + ((b >> kShift) & 1u);
  b >>= kShift;
  return b - (static_cast<std::uint32_t>(126 + EMIN) << M);
}

template <int M, int EMIN, int kSignBit, std::uint32_t kMaxCode>
MS_HD std::uint8_t encode_saturating(float v, float max_value, std::uint8_t nan_code, float min_normal,
                                     float sub_scale) {
  if (is_nan(v)) return nan_code;
  const std::uint32_t sign = (bits_of(v) >> 31) << kSignBit;
  const float a = fabsf(v);
  if (a >= max_value) return static_cast<std::uint8_t>(sign | kMaxCode);
  return static_cast<std::uint8_t>(sign | round_magnitude<M, EMIN>(a, min_normal, sub_scale));
}

// E2M1: NaN -> 0x7 (+6), +-Inf -> +-6, sign kept (so -0.0 -> 0x8).
MS_HD std::uint8_t encode_e2m1(float v) { return encode_saturating<1, 0, 3, 0x7u>(v, 6.0f, 0x7, 1.0f, 2.0f); }
// E4M3 (fn): NaN -> 0x7F, +-Inf and overflow -> +-448.
MS_HD std::uint8_t encode_e4m3(float v) {
  return encode_saturating<3, -6, 7, 0x7Eu>(v, 448.0f, 0x7F, 0.015625f, 512.0f);
}
// E5M2: NaN -> 0x7F, +-Inf and overflow -> +-57344 (satfinite).
MS_HD std::uint8_t encode_e5m2(float v) {
  return encode_saturating<2, -14, 7, 0x7Bu>(v, 57344.0f, 0x7F, 0.00006103515625f, 65536.0f);
}

// Decoders build the f32 bits directly: normal codes by rebiasing the exponent, subnormal codes as
// an exact integer times a power of two.
MS_HD float decode_e2m1(std::uint32_t code) {
  const std::uint32_t sign = (code & 8u) << 28, e = (code >> 1) & 3u, m = code & 1u;
  const std::uint32_t mag = e == 0 ? (m ? 0x3F000000u : 0u) : ((e + 126u) << 23) | (m << 22);
  return float_of(sign | mag);
}
MS_HD float decode_e4m3(std::uint32_t code) {
  const std::uint32_t sign = (code & 0x80u) << 24, e = (code >> 3) & 15u, m = code & 7u;
  if ((code & 0x7Fu) == 0x7Fu) return float_of(sign | kQuietNaN);
  if (e == 0) return float_of(sign | bits_of(static_cast<float>(m) * 0.001953125f));  // m * 2^-9
  return float_of(sign | ((e + 120u) << 23) | (m << 20));
}
MS_HD float decode_e5m2(std::uint32_t code) {
  const std::uint32_t sign = (code & 0x80u) << 24, e = (code >> 2) & 31u, m = code & 3u;
  if (e == 31) return float_of(sign | (m == 0 ? 0x7F800000u : kQuietNaN));
  if (e == 0) return float_of(sign | bits_of(static_cast<float>(m) * 0.0000152587890625f));  // m * 2^-16
  return float_of(sign | ((e + 112u) << 23) | (m << 21));
}
// E8M0: 0x00 -> 2^-127 (f32 subnormal), 0xFF -> NaN.
MS_HD float decode_e8m0(std::uint32_t code) {
  if (code == 0xFF) return float_of(kQuietNaN);
  return float_of(code == 0 ? 0x00400000u : code << 23);
}
// 2^(127-e), exact for e <= 254.
MS_HD float e8m0_reciprocal(std::uint32_t code) {
  if (code == 0xFF) return float_of(kQuietNaN);
  return float_of(code == 254 ? 0x00400000u : (254u - code) << 23);
}

// bf16 / f16: RNE, IEEE overflow to Inf, NaN stays a quiet NaN with the CPU's payload rule.
MS_HD std::uint16_t encode_bf16(float v) {
  const std::uint32_t b = bits_of(v);
  if (is_nan(v)) return static_cast<std::uint16_t>((b >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}
MS_HD float decode_bf16(std::uint32_t h) { return float_of(h << 16); }

MS_HD std::uint16_t encode_f16(float v) {
  const std::uint32_t b = bits_of(v);
  const std::uint32_t sign = (b >> 16) & 0x8000u, a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x1FFu));
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to Inf
  if (a < 0x38800000u)  // below 2^-14: multiples of 2^-24, scaled exactly and rounded to even
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(rintf(float_of(a) * 16777216.0f)));
  return static_cast<std::uint16_t>(sign | ((a - (112u << 23) + 0xFFFu + ((a >> 13) & 1u)) >> 13));
}
MS_HD float decode_f16(std::uint32_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3FFu;
  if (e == 0) return float_of(sign | bits_of(static_cast<float>(m) * 5.9604644775390625e-8f));  // m * 2^-24
  if (e == 31) return float_of(sign | 0x7F800000u | (m << 13));
  return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

// v rounded to t and widened back: the value a t-typed variable holds.
MS_HD float round_to(float v, DType t) {
  if (t == DType::float16) return decode_f16(encode_f16(v));
  if (t == DType::bfloat16) return decode_bf16(encode_bf16(v));
  return v;
}

MS_HD float load_float(const void* base, std::int64_t i, DType t) {
  if (t == DType::float32) return static_cast<const float*>(base)[i];
  const std::uint16_t h = static_cast<const std::uint16_t*>(base)[i];
  return t == DType::float16 ? decode_f16(h) : decode_bf16(h);
}
MS_HD void store_float(void* base, std::int64_t i, DType t, float v) {
  if (t == DType::float32)
    static_cast<float*>(base)[i] = v;
  else
    static_cast<std::uint16_t*>(base)[i] = t == DType::float16 ? encode_f16(v) : encode_bf16(v);
}

}  // namespace microscale::cuda::detail
