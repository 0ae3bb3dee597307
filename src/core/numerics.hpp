// The scalar specification of the formats (docs/numerics.md, FORMATS.md sections 0-2), written
// once: element codecs, per-mode traits and defaults, and the per-group math of every mode (scale
// codes, encode and decode factors, affine scale and bias). The scalar reference kernels, the
// public codecs (src/core/codecs.cpp), the CUDA kernels and the scalar parts of the SIMD kernels
// all call these functions, so they compute the same bits by construction.
//
// Host and device: every function is plain C++ on integer bits and single IEEE binary32
// operations (no table lookups, no libm beyond rint/fabs/fmin/fmax and the 'nearest' rule's log2, no
// hardware FP8/FP4 conversions), marked __host__ __device__ under nvcc. Callers build without
// multiply-add contraction (-ffp-contract=off, nvcc --fmad=false), so no expression here is fused.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "microscale/codecs.hpp"  // the reciprocal constants kC6Bits ... (public API)
#include "microscale/dtype.hpp"
#include "microscale/format.hpp"

#ifndef MS_HD
#if defined(__CUDACC__)
#define MS_HD __host__ __device__ __forceinline__
#else
#define MS_HD inline
#endif
#endif

namespace microscale::numerics {

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

constexpr std::uint32_t kFltMaxBits = 0x7F7FFFFFu;
constexpr std::uint32_t kQuietNaNBits = 0x7FC00000u;  // the NaN std::numeric_limits gives on the CPU

MS_HD bool is_nan(float v) { return (bits_of(v) & 0x7FFFFFFFu) > 0x7F800000u; }
MS_HD bool is_finite(float v) { return (bits_of(v) & 0x7F800000u) != 0x7F800000u; }

// 2^k, exact, for constant expressions.
MS_HD constexpr float pow2(int k) {
  float r = 1.0f;
  for (; k > 0; --k) r *= 2.0f;
  for (; k < 0; ++k) r *= 0.5f;
  return r;
}

// ---- element formats (FORMATS.md section 1) --------------------------------------------------

// Sign-magnitude minifloats: M explicit mantissa bits, smallest normal 2^EMIN, largest exponent
// EMAX (what the mx scale rules subtract), BITS per code, the sign bit, the largest finite
// magnitude code and its value MAX, the code NaN encodes to, and fl(1/MAX) (section 0).
struct E2M1 {
  static constexpr int M = 1, EMIN = 0, EMAX = 2, BITS = 4, SIGN_BIT = 0x8, MAX_CODE = 0x7, NAN_CODE = 0x7;
  static constexpr float MAX = 6.0f;
  static constexpr std::uint32_t C_MAX_BITS = kC6Bits;
};
struct E4M3 {
  static constexpr int M = 3, EMIN = -6, EMAX = 8, BITS = 8, SIGN_BIT = 0x80, MAX_CODE = 0x7E, NAN_CODE = 0x7F;
  static constexpr float MAX = 448.0f;
  static constexpr std::uint32_t C_MAX_BITS = kC448Bits;
};
struct E5M2 {
  static constexpr int M = 2, EMIN = -14, EMAX = 15, BITS = 8, SIGN_BIT = 0x80, MAX_CODE = 0x7B, NAN_CODE = 0x7F;
  static constexpr float MAX = 57344.0f;
  static constexpr std::uint32_t C_MAX_BITS = kC57344Bits;
};
constexpr std::uint8_t kE8M0NaN = 0xFF;

// The E2M1 values by code, for table lookups in the SIMD kernels (host only).
alignas(64) inline constexpr float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Magnitude a (0 <= a < max) to its code, ties to even. Codes are (biased exponent << M) |
// mantissa with bias 1 - EMIN, so the subnormal codes 0..2^M-1 continue seamlessly into the
// normals and a carry out of the mantissa bumps the exponent. Below the normals the codes are
// multiples of 2^(EMIN-M), and scaling by that power of two is exact.
template <class F>
MS_HD std::uint32_t round_magnitude(float a) {
  constexpr float kMinNormal = pow2(F::EMIN), kSubScale = pow2(F::M - F::EMIN);
  if (a < kMinNormal) return static_cast<std::uint32_t>(rintf(a * kSubScale));
  constexpr int kShift = 23 - F::M;
  std::uint32_t b = bits_of(a);
  b += ((1u << (kShift - 1)) - 1) + ((b >> kShift) & 1u);  // RNE on the dropped bits
  b >>= kShift;
  return b - (static_cast<std::uint32_t>(126 + F::EMIN) << F::M);  // rebias 127 -> 1 - EMIN
}

// Sign kept; finite overflow and +-Inf saturate to +-MAX; NaN gives NAN_CODE.
template <class F>
MS_HD std::uint8_t encode_saturating(float v) {
  if (is_nan(v)) return static_cast<std::uint8_t>(F::NAN_CODE);
  const std::uint32_t sign = (bits_of(v) >> 31) ? static_cast<std::uint32_t>(F::SIGN_BIT) : 0u;
  const float a = fabsf(v);
  if (a >= F::MAX) return static_cast<std::uint8_t>(sign | static_cast<std::uint32_t>(F::MAX_CODE));
  return static_cast<std::uint8_t>(sign | round_magnitude<F>(a));
}

// E2M1: NaN -> 0x7 (+6), +-Inf -> +-6, sign kept (so -0.0 -> 0x8), as cvt.rn.satfinite.e2m1x2.
MS_HD std::uint8_t encode_e2m1(float v) { return encode_saturating<E2M1>(v); }
// E4M3 (fn): NaN -> 0x7F, +-Inf and overflow -> +-448.
MS_HD std::uint8_t encode_e4m3(float v) { return encode_saturating<E4M3>(v); }
// E5M2: NaN -> 0x7F, +-Inf and overflow -> +-57344 (satfinite).
MS_HD std::uint8_t encode_e5m2(float v) { return encode_saturating<E5M2>(v); }

// Decoders build the f32 bits directly: normal codes by rebiasing the exponent, subnormal codes as
// an exact integer times a power of two. Bits above a code's width are ignored.
MS_HD float decode_e2m1(std::uint32_t code) {
  const std::uint32_t sign = (code & 8u) << 28, e = (code >> 1) & 3u, m = code & 1u;
  const std::uint32_t mag = e == 0 ? (m ? 0x3F000000u : 0u) : ((e + 126u) << 23) | (m << 22);
  return float_of(sign | mag);
}
// 0x7F / 0xFF decode to NaN.
MS_HD float decode_e4m3(std::uint32_t code) {
  const std::uint32_t sign = (code & 0x80u) << 24, e = (code >> 3) & 15u, m = code & 7u;
  if ((code & 0x7Fu) == 0x7Fu) return float_of(sign | kQuietNaNBits);
  if (e == 0) return float_of(sign | bits_of(static_cast<float>(m) * 0.001953125f));  // m * 2^-9
  return float_of(sign | ((e + 120u) << 23) | (m << 20));
}
// 0x7C / 0xFC decode to +-Inf, 0x7D..0x7F (and signed) to NaN.
MS_HD float decode_e5m2(std::uint32_t code) {
  const std::uint32_t sign = (code & 0x80u) << 24, e = (code >> 2) & 31u, m = code & 3u;
  if (e == 31) return float_of(sign | (m == 0 ? 0x7F800000u : kQuietNaNBits));
  if (e == 0) return float_of(sign | bits_of(static_cast<float>(m) * 0.0000152587890625f));  // m * 2^-16
  return float_of(sign | ((e + 112u) << 23) | (m << 21));
}

// mxfp8's element format.
MS_HD std::uint8_t encode_fp8(Elem elem, float v) { return elem == Elem::e5m2 ? encode_e5m2(v) : encode_e4m3(v); }
MS_HD float decode_fp8(Elem elem, std::uint32_t code) {
  return elem == Elem::e5m2 ? decode_e5m2(code) : decode_e4m3(code);
}

// E8M0 standalone encoder (block scales come from the rules of section 2.2 instead): positive
// finite v to the nearest power of two in the linear domain (the midpoint 1.5*2^k rounds up),
// saturating to 2^127 above and 2^-127 below; zero, negative values, NaN and Inf give 0xFF.
MS_HD std::uint8_t encode_e8m0(float v) {
  if (!(v > 0.0f) || !is_finite(v)) return kE8M0NaN;
  const std::uint32_t b = bits_of(v);
  if (b < 0x00800000u) return b >= 0x00600000u ? 1 : 0;  // f32 subnormal: midpoint 1.5 * 2^-127
  const std::uint32_t e = (b + 0x00400000u) >> 23;       // the midpoint 1.5 * 2^k rounds up
  return static_cast<std::uint8_t>(e > 254 ? 254 : e);
}
// 0x00 -> 2^-127 (f32 subnormal), 0xFF -> NaN.
MS_HD float decode_e8m0(std::uint32_t code) {
  if (code == kE8M0NaN) return float_of(kQuietNaNBits);
  return float_of(code == 0 ? 0x00400000u : code << 23);
}
// 2^(127-e), exact for e <= 254.
MS_HD float e8m0_reciprocal(std::uint32_t code) {
  if (code == kE8M0NaN) return float_of(kQuietNaNBits);
  return float_of(code == 254 ? 0x00400000u : (254u - code) << 23);
}

// bf16 / f16: RNE, IEEE overflow to Inf, NaN stays a quiet NaN with its payload's top bits.
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

// ---- modes (FORMATS.md section 2) --------------------------------------------------------------

constexpr int kNvfp4Group = 16;
constexpr int kMxGroup = 32;
constexpr int kAffineDefaultGroup = 64;
constexpr int kAffineDefaultBits = 4;

// What QuantSpec's 0 stands for.
MS_HD constexpr int default_group_size(Mode m) {
  return m == Mode::nvfp4 ? kNvfp4Group : m == Mode::affine ? kAffineDefaultGroup : kMxGroup;
}
MS_HD constexpr int default_bits(Mode m) {
  return m == Mode::mxfp8 ? E4M3::BITS : m == Mode::affine ? kAffineDefaultBits : E2M1::BITS;
}

// Block amax step: NaN is skipped and Inf kept, as TE's fmaxf. The explicit test matters: glibc's
// fmaxf returns NaN for a signaling NaN instead of skipping it.
MS_HD float amax_step(float m, float v) { return is_nan(v) ? m : fmaxf(m, fabsf(v)); }

// A block's scale code and the factor its elements are multiplied by before encoding.
struct BlockScale {
  std::uint8_t code;
  float enc;
};

// -- nvfp4 (2.1, TransformerEngine's operation order) --

// The largest block scale times the largest element, 448 * 6: a tensor with amax A has the encode
// factor 2688 / A, and checkpoints store that factor or A / 2688.
constexpr float kNvfp4Range = E4M3::MAX * E2M1::MAX;

// The tensor-level factors: S_enc = 2688 / amax (1 when amax is 0 or the quotient underflows),
// S_dec = 1 / S_enc; both 1 for two-level.
struct Nvfp4Tensor {
  bool three_level;
  float s_enc, s_dec;
};
MS_HD Nvfp4Tensor nvfp4_tensor(bool three_level, float amax) {
  if (!three_level) return {false, 1.0f, 1.0f};
  float s_enc = fminf(kNvfp4Range / amax, float_of(kFltMaxBits));
  if (amax == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
  return {true, s_enc, 1.0f / s_enc};
}

MS_HD BlockScale nvfp4_block_scale(float bamax, const Nvfp4Tensor& t) {
  const float flt_max = float_of(kFltMaxBits), c6 = float_of(kC6Bits);
  if (t.three_level) {
    const std::uint8_t s = encode_e4m3(fminf(bamax * (t.s_enc * c6), flt_max));
    return {s, fminf(1.0f / (decode_e4m3(s) * t.s_dec), flt_max)};
  }
  const std::uint8_t s = encode_e4m3(bamax * c6);
  return {s, fminf(1.0f / decode_e4m3(s), flt_max)};
}

// The three-level decode's tensor factor amax / 2688 (its reciprocal as a constant).
MS_HD float nvfp4_tensor_decode(float amax) { return amax * float_of(kC2688Bits); }

// qqmm's factor on the f32 sum of two three-level operands: (amax_x * amax_w) / 2688^2.
MS_HD float nvfp4_product_decode(float amax_x, float amax_w) { return (amax_x * amax_w) * float_of(kC2688SqBits); }

// What a block's E2M1 values are multiplied by to decode: val(s), or (val(s) * amax) * C2688.
MS_HD float nvfp4_decode_factor(std::uint32_t scale_code, bool three_level, float amax) {
  const float sf = decode_e4m3(scale_code);
  return three_level ? (sf * amax) * float_of(kC2688Bits) : sf;
}

// -- mxfp4 / mxfp8 (2.2) --

// An mx element format at run time: max, emax, explicit mantissa bits, fl(1/max).
struct MxElem {
  float max;
  int emax, mbits;
  std::uint32_t c_max_bits;
};
template <class F>
MS_HD MxElem mx_elem_of() {
  return {F::MAX, F::EMAX, F::M, F::C_MAX_BITS};
}
MS_HD MxElem mx_elem(Mode mode, Elem elem) {
  if (mode == Mode::mxfp4) return mx_elem_of<E2M1>();
  if (elem == Elem::e5m2) return mx_elem_of<E5M2>();
  return mx_elem_of<E4M3>();
}

// log2 for the 'nearest' rule as the CPU computes it (the C library's log2f).
struct Log2Float {
  float operator()(float a) const { return std::log2(a); }
};
// CUDA has no log2f equal to glibc's; log2 in double rounded to float is correctly rounded in
// practice and, over every positive f32, gives the same scale byte as glibc's log2f (which is not
// always correctly rounded, but never where the byte would change). See docs/cuda.md.
struct Log2Double {
  MS_HD float operator()(float a) const { return static_cast<float>(::log2(static_cast<double>(a))); }
};

// E8M0 block scale of the block max by rule; `src` is the input dtype ('nearest' computes in it).
template <class Log2 = Log2Float>
MS_HD std::uint8_t e8m0_scale(float bamax, const MxElem& ef, ScaleRule rule, DType src, Log2 log2_of = {}) {
  switch (rule) {
    case ScaleRule::ceil: {
      const float v = bamax * float_of(ef.c_max_bits);
      if (is_nan(v)) return kE8M0NaN;
      if (!is_finite(v)) return 0xFE;
      if (v == 0.0f) return 0x00;
      const std::uint32_t b = bits_of(v);
      std::uint32_t e = b >> 23;
      const std::uint32_t mant = b & 0x7FFFFFu;
      if (mant != 0 && e != 0xFE && !(e == 0 && mant <= 0x400000u)) e += 1;
      return static_cast<std::uint8_t>(e);
    }
    case ScaleRule::floor: {
      if (bamax == 0.0f) return 0x00;
      const int e = static_cast<int>((bits_of(bamax) >> 23) & 0xFFu) - 127 - ef.emax;
      return static_cast<std::uint8_t>((e < -127 ? -127 : e) + 127);
    }
    case ScaleRule::even: {
      const std::uint32_t b = (bits_of(bamax) + (1u << (22 - ef.mbits))) & 0xFF800000u;
      const int e = static_cast<int>(b >> 23) - 127 - ef.emax;
      return static_cast<std::uint8_t>((e < -127 ? -127 : e > 127 ? 127 : e) + 127);
    }
    case ScaleRule::nearest: {
      const float a = round_to(bamax / ef.max, src);
      if (a == 0.0f) return 0x7F;
      const float l = round_to(log2_of(a), src);
      // roundeven in the default rounding mode; clamped as a float so Inf converts safely.
      const float e = rintf(l) + 127.0f;
      return static_cast<std::uint8_t>(e < 0.0f ? 0.0f : (254.0f < e ? 254.0f : e));
    }
  }
  return kE8M0NaN;
}

template <class Log2 = Log2Float>
MS_HD BlockScale mx_block_scale(float bamax, const MxElem& ef, ScaleRule rule, DType src, Log2 log2_of = {}) {
  const std::uint8_t e = e8m0_scale(bamax, ef, rule, src, log2_of);
  return {e, e8m0_reciprocal(e)};
}

// -- scale search (docs/numerics.md "Scale search"; off by default) --
//
// Only the choice of the block scale changes: elements are encoded with the chosen scale's factor
// exactly as round-to-nearest encodes them, and every result decodes with the standard decoder.
// A candidate's error is the f32 sum, in index order, of fl(d*d), d = fl(fl(val(q_i) * dec) - x_i);
// a candidate replaces the current best only when its error is strictly lower, so ties (and NaN
// errors, from blocks holding Inf under 'saturate') keep the default choice.

// mse tries the E4M3 codes this many steps below and above the round-to-nearest code, then
// 4over6's max-to-4 code.
constexpr int kNvfp4MseSteps = 2;

// Squared error of an fp4 block of n values encoded with factor enc and decoded with factor dec.
MS_HD float fp4_block_sq_error(const float* x, int n, float enc, float dec) {
  float err = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float d = decode_e2m1(encode_e2m1(x[i] * enc)) * dec - x[i];
    err = err + d * d;
  }
  return err;
}

// The nvfp4 tensor factors a searched quantization encodes with, and the global scale its output
// records (the amax the standard decoder multiplies by C2688).
struct Nvfp4Search {
  Nvfp4Tensor t;
  float decode_amax;
};

// 4over6 keeps the block scales at or below 256 so that the max-to-4 candidate (1.5 times the
// max-to-6 one) never saturates: S_enc = 1536 / amax (6 * 256), and the decode factor amax / 1536
// is expressed as the standard three-level one of the recorded global scale 1.75 * amax.
constexpr float kNvfp4FourOverSixRange = 1536.0f;
MS_HD float nvfp4_four_over_six_global(float amax) { return fminf(amax * 1.75f, float_of(kFltMaxBits)); }

MS_HD Nvfp4Search nvfp4_search_tensor(bool three_level, float amax, ScaleSearch search) {
  if (!three_level || search != ScaleSearch::four_over_six) return {nvfp4_tensor(three_level, amax), amax};
  float s_enc = fminf(kNvfp4FourOverSixRange / amax, float_of(kFltMaxBits));
  if (amax == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
  return {{true, s_enc, 1.0f / s_enc}, nvfp4_four_over_six_global(amax)};
}

// Block scale code s with the encode factor round-to-nearest would use for it.
MS_HD BlockScale nvfp4_scale_of_code(std::uint8_t s, const Nvfp4Tensor& t) {
  const float flt_max = float_of(kFltMaxBits);
  return {s, fminf(1.0f / (t.three_level ? decode_e4m3(s) * t.s_dec : decode_e4m3(s)), flt_max)};
}

// The searched scale of a finite nvfp4 block x[0..15] with block max bamax.
MS_HD BlockScale nvfp4_searched_block_scale(const float* x, float bamax, const Nvfp4Search& p, ScaleSearch search) {
  const Nvfp4Tensor& t = p.t;
  auto error_of = [&](const BlockScale& c) {
    return fp4_block_sq_error(x, kNvfp4Group, c.enc, nvfp4_decode_factor(c.code, t.three_level, p.decode_amax));
  };
  const BlockScale rtn = nvfp4_block_scale(bamax, t);
  if (search == ScaleSearch::none) return rtn;
  BlockScale best = rtn;
  float best_err = error_of(rtn);
  auto consider = [&](std::uint8_t code) {
    const BlockScale c = nvfp4_scale_of_code(code, t);
    const float err = error_of(c);
    if (err < best_err) {
      best = c;
      best_err = err;
    }
  };
  if (search == ScaleSearch::mse) {
    for (int d = 1; d <= kNvfp4MseSteps; ++d) {
      if (rtn.code >= d) consider(static_cast<std::uint8_t>(rtn.code - d));
      if (rtn.code + d <= E4M3::MAX_CODE) consider(static_cast<std::uint8_t>(rtn.code + d));
    }
  }
  // rtn is 4over6's max-to-6 candidate; the max-to-4 one rounds 1.5 times the same base (mse
  // tries it last: 4 or 5 E4M3 steps up, beyond the steps above).
  const float base =
      t.three_level ? fminf(bamax * (t.s_enc * float_of(kC6Bits)), float_of(kFltMaxBits)) : bamax * float_of(kC6Bits);
  consider(encode_e4m3(base * 1.5f));
  return best;
}

// The searched scale of a finite mxfp4 block x[0..31]: the rule's exponent or one of its two
// neighbours (mse).
template <class Log2 = Log2Float>
MS_HD BlockScale mx_searched_block_scale(const float* x, float bamax, const MxElem& ef, ScaleRule rule, DType src,
                                         ScaleSearch search, Log2 log2_of = {}) {
  const BlockScale rtn = mx_block_scale(bamax, ef, rule, src, log2_of);
  if (search != ScaleSearch::mse || rtn.code == kE8M0NaN) return rtn;
  BlockScale best = rtn;
  float best_err = fp4_block_sq_error(x, kMxGroup, rtn.enc, decode_e8m0(rtn.code));
  for (int d = -1; d <= 1; d += 2) {
    const int e = rtn.code + d;
    if (e < 0 || e > 254) continue;
    const auto code = static_cast<std::uint32_t>(e);
    const float err = fp4_block_sq_error(x, kMxGroup, e8m0_reciprocal(code), decode_e8m0(code));
    if (err < best_err) {
      best = {static_cast<std::uint8_t>(code), e8m0_reciprocal(code)};
      best_err = err;
    }
  }
  return best;
}

// mse's global-scale search for three-level nvfp4 tries the tensor amax times each of these (all
// >= 1, so no block scale saturates that did not before) and keeps the one with the least total
// squared error, ties to the first: quarter E4M3 steps at the bottom of a binade, then 4over6's
// 1.75 (block scales up to 256, so the max-to-4 candidates of the largest blocks fit too; on
// extreme tails that range beats the finer steps).
constexpr float kNvfp4GlobalCandidates[] = {1.0f, 1.03125f, 1.0625f, 1.09375f, 1.75f};

// -- affine (2.3, MLX's CPU algorithm) --

struct AffineScaleBias {
  float scale, bias;
};

// The largest code, 2^bits - 1, as a float.
MS_HD float affine_max_code(int bits) { return static_cast<float>((1 << bits) - 1); }

// From a finite group's extremes: scale = max((max - min) / (2^b - 1), 1e-7), negated unless the
// minimum has the larger magnitude; that edge becomes exactly representable.
MS_HD AffineScaleBias affine_scale_bias(float wmin, float wmax, int bits) {
  const bool neg = fabsf(wmin) > fabsf(wmax);
  float scale = fmaxf((wmax - wmin) / affine_max_code(bits), 1e-7f);
  if (!neg) scale = -scale;
  const float edge = neg ? wmin : wmax;
  const float q0 = rintf(edge / scale);
  float bias = 0.0f;
  if (q0 != 0.0f) {
    scale = edge / q0;
    bias = edge;
  }
  return {scale, bias};
}

// clamp(round((w - bias) / scale), 0, max_code), ties to even.
MS_HD std::uint32_t affine_code(float w, const AffineScaleBias& p, float max_code) {
  const float q = rintf((w - p.bias) / p.scale);
  return static_cast<std::uint32_t>(q < 0.0f ? 0.0f : (max_code < q ? max_code : q));
}

MS_HD float affine_decode(std::uint32_t code, float scale, float bias) {
  return static_cast<float>(code) * scale + bias;
}

}  // namespace microscale::numerics
