// Per-target SIMD building blocks of the CPU kernels: vector tags, exact loads of the input
// dtypes, and the element and scale codecs in vector form. Highway's -inl.h idiom: a module
// compiled once per target (foreach_target) includes this header once per target; code here is
// called directly by the kernels of the same target, never through a dispatch.
//
// Every codec is bit-exact to src/core/codecs.cpp: values are decoded exactly from their bits
// and encoded by integer arithmetic that reproduces the scalar rounding (FORMATS.md section 1).

#if defined(MICROSCALE_CPU_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MICROSCALE_CPU_SIMD_INL_H_
#undef MICROSCALE_CPU_SIMD_INL_H_
#else
#define MICROSCALE_CPU_SIMD_INL_H_
#endif

#include <hwy/highway.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/numerics.hpp"
#include "microscale/codecs.hpp"

// Tile bodies passed as lambdas are inlined into their loops, so that the constants they set up
// are hoisted out of the loop instead of being rebuilt per tile.
#ifndef MICROSCALE_ALWAYS_INLINE
#define MICROSCALE_ALWAYS_INLINE __attribute__((always_inline))
#endif

HWY_BEFORE_NAMESPACE();
namespace microscale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lane counts are compile-time constants on every target, because tiles (one block per lane)
// and register blocks are shaped by them. The generic SVE targets, whose vector length is known
// only at run time, therefore run 128-bit vectors; SVE_256 and SVE2_128 are full width.
#if HWY_TARGET == HWY_SVE || HWY_TARGET == HWY_SVE2
template <class T>
using Tag = hn::CappedTag<T, 16 / sizeof(T)>;
#else
template <class T>
using Tag = hn::ScalableTag<T>;
#endif

using DF = Tag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;
constexpr std::size_t kN = hn::MaxLanes(DF());
using D8 = hn::Repartition<std::uint8_t, DF>;  // the bytes of one f32 vector
using D16 = hn::Repartition<std::uint16_t, DF>;
using DQ8 = hn::Rebind<std::uint8_t, DF>;  // one byte per f32 lane
using DQI8 = hn::Rebind<std::int8_t, DF>;

constexpr std::int32_t kInfBits = 0x7F800000;
constexpr float kFltMax = std::numeric_limits<float>::max();

#if HWY_TARGET != HWY_SCALAR  // the scalar target runs the reference kernels

// ---- exact loads: N values of the input dtype as float32 ----

HWY_INLINE VF Load(const float* p) { return hn::LoadU(DF(), p); }

HWY_INLINE VF Load(const hwy::bfloat16_t* p) {
  const auto h = hn::LoadU(hn::Rebind<std::uint16_t, DF>(), reinterpret_cast<const std::uint16_t*>(p));
  return hn::BitCast(DF(), hn::ShiftLeft<16>(hn::PromoteTo(DU(), h)));
}

HWY_INLINE VF Load(const hwy::float16_t* p) {
#if HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3
  // No F16C, and Highway 1.0.3's emulated PromoteTo maps Inf/NaN to finite values. Shifting the
  // exponent and mantissa into f32 position and multiplying by 2^112 rebiases normals and turns
  // f16 subnormals (f32 subnormals here) into exact normals; exponent 31 is patched to Inf/NaN.
  const DU du;
  const auto h =
      hn::PromoteTo(du, hn::LoadU(hn::Rebind<std::uint16_t, DF>(), reinterpret_cast<const std::uint16_t*>(p)));
  const auto mag = hn::ShiftLeft<13>(hn::And(h, hn::Set(du, 0x7FFFu)));
  const auto finite = hn::BitCast(du, hn::Mul(hn::BitCast(DF(), mag), hn::Set(DF(), 0x1p112f)));
  const auto special = hn::Or(mag, hn::Set(du, 0x7F800000u));
  const auto is_special = hn::Gt(hn::BitCast(DI(), mag), hn::Set(DI(), 0x0F7FFFFF));
  const auto bits = hn::IfThenElse(hn::RebindMask(du, is_special), special, finite);
  return hn::BitCast(DF(), hn::Or(bits, hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)))));
#else
  return hn::PromoteTo(DF(), hn::LoadU(hn::Rebind<hwy::float16_t, DF>(), p));
#endif
}

// One byte per lane, zero-extended.
HWY_INLINE VI LoadBytes(const std::uint8_t* p) { return hn::BitCast(DI(), hn::PromoteTo(DU(), hn::LoadU(DQ8(), p))); }

// ---- decoders: codes in 32-bit lanes -> exact float32 values ----

// E2M1 code 0..15 per lane.
HWY_INLINE VF DecodeE2M1(VI c) {
  const DF df;
  const DI di;
  if constexpr (kN == 16) {  // a 16-entry lane lookup
    return hn::TableLookupLanes(hn::Load(df, numerics::kE2M1Values), hn::IndicesFromVec(df, c));
  } else if constexpr (kN == 8) {  // the magnitude by lane lookup, the sign moved from bit 3 to bit 31
    const VF mag =
        hn::TableLookupLanes(hn::Load(df, numerics::kE2M1Values), hn::IndicesFromVec(df, hn::And(c, hn::Set(di, 7))));
    return hn::BitCast(df, hn::Or(hn::BitCast(di, mag), hn::ShiftLeft<28>(hn::And(c, hn::Set(di, 8)))));
  } else {  // twice the magnitude by a byte table (lane bytes 1..3 index entry 0, which is 0)
    alignas(16) static constexpr std::uint8_t kTwice[16] = {0, 1, 2, 3, 4, 6, 8, 12};
    const VI twice = hn::BitCast(
        di, hn::TableLookupBytes(hn::LoadDup128(D8(), kTwice), hn::BitCast(D8(), hn::And(c, hn::Set(di, 7)))));
    const VF mag = hn::Mul(hn::ConvertTo(df, twice), hn::Set(df, 0.5f));
    return hn::BitCast(df, hn::Or(hn::BitCast(di, mag), hn::ShiftLeft<28>(hn::And(c, hn::Set(di, 8)))));
  }
}

// Codes 0..255 of a signed 8-bit minifloat with M mantissa bits and exponent bias B: the
// magnitude shifted to f32 position times 2^(127-B) (exact; subnormals become normals).
// E4M3: 0x7F NaN. E5M2: 0x7C Inf, above NaN. NaN decodes as the reference's +-quiet NaN;
// without kNaN the caller has ruled NaN (and Inf) codes out.
template <int M, int B, int kInfCode, int kNaNCode, bool kNaN>
HWY_INLINE VF DecodeMinifloat(VI c) {
  const DF df;
  const DI di;
  const VI mag = hn::And(c, hn::Set(di, 0x7F));
  VI v = hn::BitCast(di, hn::Mul(hn::BitCast(df, hn::ShiftLeft<23 - M>(mag)), hn::Set(df, numerics::pow2(127 - B))));
  if constexpr (kNaN) {
    if constexpr (kInfCode >= 0) v = hn::IfThenElse(hn::Eq(mag, hn::Set(di, kInfCode)), hn::Set(di, kInfBits), v);
    v = hn::IfThenElse(hn::Gt(mag, hn::Set(di, kNaNCode - 1)), hn::Set(di, 0x7FC00000), v);
  }
  return hn::BitCast(df, hn::Or(v, hn::ShiftLeft<24>(hn::And(c, hn::Set(di, 0x80)))));
}
template <bool kNaN = true>
HWY_INLINE VF DecodeE4M3(VI c) {
  return DecodeMinifloat<3, 7, -1, 0x7F, kNaN>(c);
}
template <bool kNaN = true>
HWY_INLINE VF DecodeE5M2(VI c) {
  return DecodeMinifloat<2, 15, 0x7C, 0x7D, kNaN>(c);
}

// Sign-extended minifloat codes (one int8 per lane, as PromoteTo from int8 gives them) without
// NaN or Inf codes, as their values times 2^(B-127): the code shifted to f32 position, with the
// copies of the sign that land in the exponent bits above the magnitude masked off. Multiplying
// by 2^(127-B) gives the values (exactly; subnormal codes are subnormal floats here).
template <int M>
HWY_INLINE VF MinifloatBitsSigned(VI s) {
  constexpr std::int32_t kKeep =
      static_cast<std::int32_t>(0x80000000u | ((0x7Fu << (23 - M)) | ((1u << (23 - M)) - 1)));
  return hn::BitCast(DF(), hn::And(hn::ShiftLeft<23 - M>(s), hn::Set(DI(), kKeep)));
}

// E8M0: e << 23, 0 -> 2^-127 (subnormal), 0xFF -> NaN.
HWY_INLINE VF DecodeE8M0(VI e) {
  const DI di;
  VI v = hn::IfThenElse(hn::Eq(e, hn::Zero(di)), hn::Set(di, 0x400000), hn::ShiftLeft<23>(e));
  v = hn::IfThenElse(hn::Eq(e, hn::Set(di, 0xFF)), hn::Set(di, 0x7FC00000), v);
  return hn::BitCast(DF(), v);
}

// Whether n bytes (a multiple of the byte-vector size) of 8-bit minifloat codes hold a NaN or
// Inf code: with the sign dropped, E4M3's is 0x7F and E5M2's are 0x7C and above.
template <bool kE5M2>
HWY_INLINE bool AnySpecialCode(const std::uint8_t* p, std::size_t n) {
  const D8 d8;
  const auto magnitude = hn::Set(d8, 0x7F);
  auto m0 = hn::Zero(d8), m1 = m0;
  std::size_t i = 0;
  for (; i + 2 * hn::Lanes(d8) <= n; i += 2 * hn::Lanes(d8)) {
    m0 = hn::Max(m0, hn::And(hn::LoadU(d8, p + i), magnitude));
    m1 = hn::Max(m1, hn::And(hn::LoadU(d8, p + i + hn::Lanes(d8)), magnitude));
  }
  if (i < n) m0 = hn::Max(m0, hn::And(hn::LoadU(d8, p + i), magnitude));
  const hn::Repartition<std::int8_t, DF> di8;  // magnitudes are below 0x80: signed compare
  return !hn::AllFalse(di8, hn::Gt(hn::BitCast(di8, hn::Max(m0, m1)), hn::Set(di8, kE5M2 ? 0x7B : 0x7E)));
}

// ---- encoders: float32 -> codes, the scalar codecs' rounding in integer arithmetic ----

// The element formats' parameters (src/core/numerics.hpp), plus the f32 shift that brings the
// sign to SIGN_BIT and the bound below which |y| cannot round past MAX (below the tie of MAX and
// the next binade).
struct E2M1 : numerics::E2M1 {
  static constexpr int SIGN_SHIFT = 28;
  static constexpr float ROUNDS_TO_MAX = 7.0f;
};
struct E4M3 : numerics::E4M3 {
  static constexpr int SIGN_SHIFT = 24;
  static constexpr float ROUNDS_TO_MAX = 464.0f;
};
struct E5M2 : numerics::E5M2 {
  static constexpr int SIGN_SHIFT = 24;
  static constexpr float ROUNDS_TO_MAX = 61440.0f;
};

#if HWY_TARGET == HWY_AVX2
// RoundMagnitude<E2M1> by one permute per constant (AVX2 only: vpermd reads just the low 3 bits
// of each index, which is what makes the exponent an index without masking). The binade
// arithmetic depends only on the exponent class, max(exponent, 127), which for |y| < 8 is one of
// 127, 128, 129: the addend 2^22 * E and the addend's bits less the binade offset come from
// 8-entry tables indexed by the low 3 bits of the biased exponent. Raising |y| to at least 2^-5
// first keeps that index unique (exponents 122 to 129) and changes no code: everything below
// 2^-4 rounds to 0. Two instructions per vector of 8 fewer than the generic form.
template <bool kClamp>
HWY_INLINE VI RoundE2M1Magnitude(VI a) {
  const DI di;
  if constexpr (kClamp) a = hn::Min(a, hn::Set(di, std::bit_cast<std::int32_t>(E2M1::MAX)));
  a = hn::Max(a, hn::Set(di, std::bit_cast<std::int32_t>(0x1p-5f)));
  constexpr auto addend = [](int e) { return (e + 22) << 23; };  // bits of 2^22 * 2^(e - 127)
  constexpr auto less_offset = [addend](int e) { return addend(e) - 2 * (e - 127); };
  // Index = the exponent's low 3 bits: 128 -> 0, 129 -> 1, 122..127 -> 2..7 (class 127).
  const __m256i by_addend = _mm256_setr_epi32(addend(128), addend(129), addend(127), addend(127), addend(127),
                                              addend(127), addend(127), addend(127));
  const __m256i by_less_offset =
      _mm256_setr_epi32(less_offset(128), less_offset(129), less_offset(127), less_offset(127), less_offset(127),
                        less_offset(127), less_offset(127), less_offset(127));
  const __m256i index = _mm256_srli_epi32(a.raw, 23);
  const __m256 sum =
      _mm256_add_ps(_mm256_castsi256_ps(a.raw), _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(by_addend, index)));
  return VI{_mm256_sub_epi32(_mm256_castps_si256(sum), _mm256_permutevar8x32_epi32(by_less_offset, index))};
}
#endif

// rn_sat magnitude code of |y| given as its f32 bit pattern a. |y| is first clamped to the
// format's max (as integers, so Inf and NaN clamp too), unless the caller knows
// |y| < F::ROUNDS_TO_MAX. With E = 2^max(exponent, EMIN), adding 2^(23-M) * E rounds |y| to M
// mantissa bits below E's binade (ties to even, a carry reaching the next binade; below 2^EMIN
// the fixed subnormal step), and the sum's bits minus the addend's count those steps: 2^M + m in
// a normal binade, m below it. The binade offset (log2 E - EMIN) << M completes the code. No
// float result is ever subnormal (which costs microcode assists on some x86 cores).
template <class F, bool kClamp = true>
HWY_INLINE VI RoundMagnitude(VI a) {
#if HWY_TARGET == HWY_AVX2
  if constexpr (std::is_same_v<F, E2M1>) return RoundE2M1Magnitude<kClamp>(a);
#endif
  const DI di;
  const VI c = kClamp ? hn::Min(a, hn::Set(di, std::bit_cast<std::int32_t>(F::MAX))) : a;
  const VI e = hn::Max(hn::And(c, hn::Set(di, kInfBits)), hn::Set(di, (127 + F::EMIN) << 23));
  const VI magic = hn::Add(e, hn::Set(di, (23 - F::M) << 23));
  const VI steps = hn::Sub(hn::BitCast(di, hn::Add(hn::BitCast(DF(), c), hn::BitCast(DF(), magic))), magic);
  return hn::Add(steps, hn::Sub(hn::ShiftRight<23 - F::M>(e), hn::Set(di, (127 + F::EMIN) << F::M)));
}

// Element codes of y: sign copied from y; NaN (reachable under 'saturate' only: 'propagate'
// zeroes such blocks) gets the format's NaN code without sign.
template <class F, bool kSat, bool kClamp>
HWY_INLINE VI EncodeElements(VF y) {
  const DI di;
  const VI u = hn::BitCast(di, y);
  const VI a = hn::And(u, hn::Set(di, 0x7FFFFFFF));
  const VI magnitude = RoundMagnitude<F, kClamp>(a);
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4
  // A blend on the sign (one instruction) instead of shifting the sign down and masking it.
  const VI code = hn::IfNegativeThenElse(u, hn::Or(magnitude, hn::Set(di, F::SIGN_BIT)), magnitude);
#else
  const VI code = hn::OrAnd(magnitude, hn::ShiftRight<F::SIGN_SHIFT>(u), hn::Set(di, F::SIGN_BIT));
#endif
  if (!kSat) return code;
  return hn::IfThenElse(hn::Gt(a, hn::Set(di, kInfBits)), hn::Set(di, F::NAN_CODE), code);
}

// Stores four vectors of N element pairs' codes merged per lane (even | odd << BITS: one byte
// for 4-bit codes, two for 8-bit ones), 8N elements, as packed bytes in order: keeping
// the low half of every lane twice for 4-bit codes, once for 8-bit ones.
template <class F>
HWY_INLINE void StoreQuad(VI c0, VI c1, VI c2, VI c3, std::uint8_t* out) {
  const D16 d16;
  const auto w01 = hn::ConcatEven(d16, hn::BitCast(d16, c1), hn::BitCast(d16, c0));
  const auto w23 = hn::ConcatEven(d16, hn::BitCast(d16, c3), hn::BitCast(d16, c2));
  if constexpr (F::BITS == 4) {
    const D8 d8;
    hn::StoreU(hn::ConcatEven(d8, hn::BitCast(d8, w23), hn::BitCast(d8, w01)), d8, out);
  } else {
    hn::StoreU(w01, d16, reinterpret_cast<std::uint16_t*>(out));
    hn::StoreU(w23, d16, reinterpret_cast<std::uint16_t*>(out) + 2 * kN);
  }
}

// Lanes holding 0..255, one byte each.
HWY_INLINE void StoreBytes(VI codes, std::uint8_t* out) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // vpmovdb (Highway 1.0.3's TruncateTo u32 -> u8 permutes dwords instead of bytes on AVX3_DL).
  hn::StoreU(hn::Vec128<std::uint8_t>{_mm512_cvtepi32_epi8(codes.raw)}, DQ8(), out);
#else
  hn::StoreU(hn::DemoteTo(DQ8(), codes), DQ8(), out);  // codes are 0..255: no saturation
#endif
}

// Transposing max over the vectors leaf(kLo) .. leaf(kLo + kCount - 1) laid end to end: lane i of
// the result is the max of their i-th run of kCount consecutive lanes (with kCount == lanes,
// leaf i's max). Each level halves the count with max(ConcatOdd, ConcatEven). A recursion over
// leaves rather than an array of vectors, which SVE's sizeless vector types do not allow.
template <std::size_t kLo, std::size_t kCount, class D, class Leaf>
HWY_INLINE hn::Vec<D> TransposedMax(D d, const Leaf& leaf) {
  if constexpr (kCount == 1) {
    return leaf(kLo);
  } else {
    const auto a = TransposedMax<kLo, kCount / 2>(d, leaf);
    const auto b = TransposedMax<kLo + kCount / 2, kCount / 2>(d, leaf);
    return hn::Max(hn::ConcatOdd(d, b, a), hn::ConcatEven(d, b, a));
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MICROSCALE_CPU_SIMD_INL_H_
