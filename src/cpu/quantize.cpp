// Quantize kernels: Highway runtime dispatch per SIMD target, blocks split across threads.
//
// Bit-identical to reference::quantize: every float operation is the reference's, in its order,
// on the same f32 values (f16/bf16 are widened exactly in registers); only the branches of the
// scalar codecs become integer bit arithmetic and selects. Blocks never straddle rows and the
// packed values and compact scales of consecutive rows are contiguous, so the tensor is one flat
// sequence of blocks.
//
// Per tile of N blocks (N = f32 lanes), pass 1 reduces each block to the integer max of its |x|
// bit patterns, one block per lane; the scales of all N blocks are then computed at once, and
// pass 2 re-reads the tile (from L1) to encode the elements, split into even- and odd-indexed
// ones since codes are packed by element pairs.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/quantize.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/convert.hpp"
#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "microscale/codecs.hpp"
#include "reference/reference.hpp"

HWY_BEFORE_NAMESPACE();
namespace microscale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_SCALAR

// Single-lane vectors gain nothing: widen a few blocks at a time and run the reference.
void QuantizeBlocks(const void* x, DType src, const QuantSpec& spec, std::int64_t b0, std::int64_t b1,
                    std::uint8_t* packed, std::byte* scales, std::byte* biases) {
  constexpr std::int64_t kChunk = 64;
  const std::int64_t G = spec.group_size;
  const std::int64_t block_bytes = G * spec.bits / 8;
  const std::size_t esize = dtype_size(src);
  const std::size_t ssize = spec.mode == Mode::affine ? esize : 1;
  float buf[kChunk * 128];
  for (std::int64_t b = b0; b < b1; b += kChunk) {
    const std::int64_t nb = std::min(kChunk, b1 - b);
    const auto* in = static_cast<const std::byte*>(x) + static_cast<std::size_t>(b * G) * esize;
    // NaNs made quiet: the reference's 'saturate' amax (glibc fmaxf) does not skip signaling ones.
    for (std::int64_t i = 0; i < nb * G; ++i) {
      const float v = detail::load_f32(in + static_cast<std::size_t>(i) * esize, src);
      buf[i] = std::isnan(v) ? std::numeric_limits<float>::quiet_NaN() : v;
    }
    std::memset(packed + b * block_bytes, 0, static_cast<std::size_t>(nb * block_bytes));  // the reference ORs bits in
    reference::quantize(buf, nb, G, src, spec, packed + b * block_bytes, scales + static_cast<std::size_t>(b) * ssize,
                        biases ? biases + static_cast<std::size_t>(b) * ssize : nullptr);
  }
}

#else

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;
constexpr std::size_t kN = HWY_LANES(float);
constexpr std::int32_t kInfBits = 0x7F800000;
constexpr float kFltMax = std::numeric_limits<float>::max();

// ---- loading: N values of the input dtype, widened exactly to f32 ----

HWY_INLINE VF Load(const float* p) { return hn::LoadU(DF(), p); }

HWY_INLINE VF Load(const hwy::bfloat16_t* p) {
  const hn::Rebind<std::uint16_t, DF> d16;
  const auto h = hn::LoadU(d16, reinterpret_cast<const std::uint16_t*>(p));
  return hn::BitCast(DF(), hn::ShiftLeft<16>(hn::PromoteTo(DU(), h)));
}

HWY_INLINE VF Load(const hwy::float16_t* p) {
#if HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3
  // No F16C, and Highway 1.0.3's emulated PromoteTo maps Inf/NaN to finite values. Shifting the
  // exponent and mantissa into f32 position and multiplying by 2^112 rebiases normals and turns
  // f16 subnormals (f32 subnormals here) into exact normals; exponent 31 is patched to Inf/NaN.
  const DU du;
  const hn::Rebind<std::uint16_t, DF> d16;
  const auto h = hn::PromoteTo(du, hn::LoadU(d16, reinterpret_cast<const std::uint16_t*>(p)));
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

// 2N consecutive values split into the even- and the odd-indexed ones (pass 2 packs element
// pairs, so it never needs them interleaved back). bf16 pairs are one 32-bit word: the low half
// shifted up is the even value and the masked high half the odd one.
HWY_INLINE void LoadPairs(const float* p, VF& even, VF& odd) {
  const VF a = Load(p), b = Load(p + kN);
  even = hn::ConcatEven(DF(), b, a);
  odd = hn::ConcatOdd(DF(), b, a);
}
HWY_INLINE void LoadPairs(const hwy::float16_t* p, VF& even, VF& odd) {
  const VF a = Load(p), b = Load(p + kN);
  even = hn::ConcatEven(DF(), b, a);
  odd = hn::ConcatOdd(DF(), b, a);
}
HWY_INLINE void LoadPairs(const hwy::bfloat16_t* p, VF& even, VF& odd) {
  const DU du;
  const auto w = hn::LoadU(du, reinterpret_cast<const std::uint32_t*>(p));
  even = hn::BitCast(DF(), hn::ShiftLeft<16>(w));
  odd = hn::BitCast(DF(), hn::And(w, hn::Set(du, 0xFFFF0000u)));
}

// ---- element formats ----

// M explicit mantissa bits, smallest normal 2^EMIN, NaN code, sign bit (and the f32 shift that
// brings the sign there), emax_elem, bits per code, max value and fl(1/MAX) of FORMATS.md 2.2.
struct E2M1 {
  static constexpr int M = 1, EMIN = 0, NAN_CODE = 0x7, SIGN_BIT = 0x8, SIGN_SHIFT = 28;
  static constexpr int EMAX = 2, BITS = 4;
  static constexpr float MAX = 6.0f, ROUNDS_TO_MAX = 7.0f;  // below the tie of MAX and the next binade
  static constexpr std::uint32_t C_MAX_BITS = kC6Bits;
};
struct E4M3 {
  static constexpr int M = 3, EMIN = -6, NAN_CODE = 0x7F, SIGN_BIT = 0x80, SIGN_SHIFT = 24;
  static constexpr int EMAX = 8, BITS = 8;
  static constexpr float MAX = 448.0f, ROUNDS_TO_MAX = 464.0f;
  static constexpr std::uint32_t C_MAX_BITS = kC448Bits;
};
struct E5M2 {
  static constexpr int M = 2, EMIN = -14, NAN_CODE = 0x7F, SIGN_BIT = 0x80, SIGN_SHIFT = 24;
  static constexpr int EMAX = 15, BITS = 8;
  static constexpr float MAX = 57344.0f, ROUNDS_TO_MAX = 61440.0f;
  static constexpr std::uint32_t C_MAX_BITS = kC57344Bits;
};

// rn_sat magnitude code of |y| given as its f32 bit pattern a. |y| is first clamped to the
// format's max (as integers, so Inf and NaN clamp too), unless the caller knows |y| < F::ROUNDS_TO_MAX. With E = 2^max(exponent, EMIN), adding
// 2^(23-M) * E rounds |y| to M mantissa bits below E's binade (ties to even, a carry reaching the
// next binade; below 2^EMIN the fixed subnormal step), and the sum's bits minus the addend's
// count those steps: 2^M + m in a normal binade, m below it. The binade offset
// (log2 E - EMIN) << M completes the code. No float result is ever subnormal (which costs
// microcode assists on some x86 cores).
template <class F, bool kClamp = true>
HWY_INLINE VI RoundMagnitude(VI a) {
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
  const VI code = hn::OrAnd(RoundMagnitude<F, kClamp>(a), hn::ShiftRight<F::SIGN_SHIFT>(u), hn::Set(di, F::SIGN_BIT));
  if (!kSat) return code;
  return hn::IfThenElse(hn::Gt(a, hn::Set(di, kInfBits)), hn::Set(di, F::NAN_CODE), code);
}

// Codes of N element pairs (even, odd) merged per lane: one byte for 4-bit codes (even element
// in the low nibble), two bytes for 8-bit ones.
template <class F, bool kSat, bool kClamp>
HWY_INLINE VI PairCodes(VF even, VF odd) {
  return hn::Or(EncodeElements<F, kSat, kClamp>(even), hn::ShiftLeft<F::BITS>(EncodeElements<F, kSat, kClamp>(odd)));
}

// Stores the lanes of four PairCodes vectors (8N elements) as packed bytes, in order: keeping
// the low half of every lane twice for 4-bit codes, once for 8-bit ones.
template <class F>
HWY_INLINE void StoreQuad(const VI* c, std::uint8_t* out) {
  const hn::Repartition<std::uint16_t, DF> d16;
  const auto w01 = hn::ConcatEven(d16, hn::BitCast(d16, c[1]), hn::BitCast(d16, c[0]));
  const auto w23 = hn::ConcatEven(d16, hn::BitCast(d16, c[3]), hn::BitCast(d16, c[2]));
  if constexpr (F::BITS == 4) {
    const hn::Repartition<std::uint8_t, DF> d8;
    hn::StoreU(hn::ConcatEven(d8, hn::BitCast(d8, w23), hn::BitCast(d8, w01)), d8, out);
  } else {
    hn::StoreU(w01, d16, reinterpret_cast<std::uint16_t*>(out));
    hn::StoreU(w23, d16, reinterpret_cast<std::uint16_t*>(out) + 2 * kN);
  }
}

HWY_INLINE void StoreBytes(VI codes, std::uint8_t* out) {
  const hn::Rebind<std::uint8_t, DF> d8;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // vpmovdb (Highway 1.0.3's TruncateTo u32 -> u8 permutes dwords instead of bytes on AVX3_DL).
  hn::StoreU(hn::Vec128<std::uint8_t>{_mm512_cvtepi32_epi8(codes.raw)}, d8, out);
#else
  hn::StoreU(hn::DemoteTo(d8, codes), d8, out);  // codes are 0..255: no saturation
#endif
}

// |x| as an int32 bit pattern orders like |x|, with Inf above every finite value and NaN above
// Inf, so one integer max per block gives the block amax and whether the block is finite.
// 'saturate' skips NaN (as fmaxf) by zeroing it first.
template <bool kSat>
HWY_INLINE VI AbsBits(VF x) {
  const DI di;
  const VI a = hn::And(hn::BitCast(di, x), hn::Set(di, 0x7FFFFFFF));
  if (!kSat) return a;
  return hn::IfThenZeroElse(hn::Gt(a, hn::Set(di, kInfBits)), a);
}

// Transposing max reduction of n vectors: each level halves the count with
// max(ConcatOdd, ConcatEven), so the last vector's lane i is the max of the i-th run of n
// consecutive values of the n vectors laid end to end.
template <class D>
HWY_INLINE hn::Vec<D> ReduceRuns(D d, hn::Vec<D>* v, std::size_t n) {
  for (; n > 1; n /= 2)
    for (std::size_t j = 0; j < n / 2; ++j)
      v[j] = hn::Max(hn::ConcatOdd(d, v[2 * j + 1], v[2 * j]), hn::ConcatEven(d, v[2 * j + 1], v[2 * j]));
  return v[0];
}

// Lane b = max |x| bits of block b of the tile x (N blocks of G): a plain max within each block,
// then a transposing one across blocks.
template <std::size_t G, bool kSat, class T>
HWY_INLINE VI BlockMaxBits(const T* x) {
  VI m[kN];
  for (std::size_t b = 0; b < kN; ++b) {
    m[b] = AbsBits<kSat>(Load(x + b * G));
    for (std::size_t v = kN; v < G; v += kN) m[b] = hn::Max(m[b], AbsBits<kSat>(Load(x + b * G + v)));
  }
  return ReduceRuns(DI(), m, kN);
}

// bf16 bits widen to f32 bits by a shift, which keeps their order: reduce the 16-bit patterns
// (twice the lanes) to half-block runs, then merge the two halves of each 32-bit lane.
template <std::size_t G, bool kSat>
HWY_INLINE VI BlockMaxBits(const hwy::bfloat16_t* x) {
  const hn::Repartition<std::int16_t, DF> d16;
  using V16 = hn::Vec<decltype(d16)>;
  V16 m[G / 2];
  for (std::size_t v = 0; v < G / 2; ++v) {
    const V16 a = hn::And(hn::LoadU(d16, reinterpret_cast<const std::int16_t*>(x) + v * 2 * kN), hn::Set(d16, 0x7FFF));
    m[v] = kSat ? hn::IfThenZeroElse(hn::Gt(a, hn::Set(d16, 0x7F80)), a) : a;
  }
  const VI h = hn::BitCast(DI(), ReduceRuns(d16, m, G / 2));
  return hn::Max(hn::ShiftLeft<16>(h), hn::And(h, hn::Set(DI(), static_cast<std::int32_t>(0xFFFF0000u))));
}

// Lanes of blocks holding NaN or Inf ('propagate' and 'error'; 'saturate' keeps them).
template <bool kSat>
HWY_INLINE auto NonFiniteBlocks(VI bm) {
  const DI di;
  return hn::Gt(bm, hn::Set(di, kSat ? 0x7FFFFFFF : kInfBits - 1));
}

// Elements of a tile times their block's factor, encoded pair by pair.
template <class F, std::size_t G, bool kSat, bool kClamp, class T>
HWY_INLINE void EncodePairs(const T* x, const float* factor, std::uint8_t* packed) {
  static_assert(2 * kN <= 2 * G && G % 8 == 0, "a pair spans at most two blocks; tiles hold whole quads");
  const DF df;
  for (std::size_t q = 0; q < kN * G; q += 8 * kN) {
    VI codes[4];
    for (std::size_t j = 0; j < 4; ++j) {
      const std::size_t e = q + j * 2 * kN;
      VF f;
      if constexpr (2 * kN <= G) {
        f = hn::Set(df, factor[e / G]);
      } else {  // lanes 0..N/2-1 hold elements of block e/G, the others of the next one
        const hn::Half<DF> dh;
        f = hn::Combine(df, hn::Set(dh, factor[e / G + 1]), hn::Set(dh, factor[e / G]));
      }
      VF even, odd;
      LoadPairs(x + e, even, odd);
      codes[j] = PairCodes<F, kSat, kClamp>(hn::Mul(even, f), hn::Mul(odd, f));
    }
    StoreQuad<F>(codes, packed + q * F::BITS / 8);
  }
}

// Pass 2 of a tile, factor[b] = 1/scale of block b with maxima bm: the clamp to the format's max
// is only needed when some fl(bamax * factor) may round past it (saturating scales, clipping
// rules, Inf/NaN). Blocks whose scale byte is nan_scale (non-finite blocks under 'propagate')
// get all-zero codes instead.
template <class F, std::size_t G, bool kSat, class T>
HWY_INLINE void EncodeTile(const T* x, VF factors, VI bm, const std::uint8_t* scales, std::uint8_t nan_scale,
                           bool any_bad, std::uint8_t* packed) {
  const DF df;
  alignas(64) float factor[kN];
  hn::Store(factors, df, factor);
  const VF ymax = hn::Mul(hn::BitCast(df, bm), factors);  // NaN for NaN blocks: no clamp needed there
  if (hn::AllFalse(df, hn::Ge(ymax, hn::Set(df, F::ROUNDS_TO_MAX))))
    EncodePairs<F, G, kSat, false>(x, factor, packed);
  else
    EncodePairs<F, G, kSat, true>(x, factor, packed);
  if (!any_bad) return;
  constexpr std::size_t kBlockBytes = G * F::BITS / 8;
  for (std::size_t b = 0; b < kN; ++b)
    if (scales[b] == nan_scale) std::memset(packed + b * kBlockBytes, 0, kBlockBytes);
}

// ---- nvfp4 (FORMATS.md 2.1) ----

struct Nvfp4 {
  float s_enc_c6;  // fl(S_enc * C6); C6 for two-level, where S_enc = S_dec = 1
  float s_dec;
};

Nvfp4 Nvfp4Factors(const QuantSpec& spec) {
  const float c6 = f32_from_bits(kC6Bits);
  if (!spec.global_scale) return {c6, 1.0f};
  const float amax = *spec.global_scale;
  float s_enc = std::fmin(2688.0f / amax, kFltMax);
  if (amax == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
  return {s_enc * c6, 1.0f / s_enc};
}

// Two-level is three-level with S_enc = S_dec = 1: bamax*C6 and 1/(sf*1) are the same single
// roundings, and fminf changes nothing the E4M3 encoder does not already saturate.
template <bool kSat, class T>
HWY_INLINE void Nvfp4Tile(const T* x, const Nvfp4& p, std::uint8_t* packed, std::uint8_t* scales) {
  const DF df;
  const DI di;
  const VI bm = BlockMaxBits<16, kSat>(x);
  const VF t = hn::Min(hn::Mul(hn::BitCast(df, bm), hn::Set(df, p.s_enc_c6)), hn::Set(df, kFltMax));
  VI s = RoundMagnitude<E4M3>(hn::BitCast(di, t));
  // val(s): the code's bits at f32 mantissa/exponent position times 2^120 (exact, subnormals too).
  const VF sf = hn::Mul(hn::BitCast(df, hn::ShiftLeft<20>(s)), hn::Set(df, 0x1p120f));
  const VF enc = hn::Min(hn::Div(hn::Set(df, 1.0f), hn::Mul(sf, hn::Set(df, p.s_dec))), hn::Set(df, kFltMax));
  const auto bad = NonFiniteBlocks<kSat>(bm);
  s = hn::IfThenElse(bad, hn::Set(di, 0x7F), s);
  StoreBytes(s, scales);
  EncodeTile<E2M1, 16, kSat>(x, enc, bm, scales, 0x7F, !hn::AllFalse(di, bad), packed);
}

// ---- mxfp4 / mxfp8 (FORMATS.md 2.2) ----

// MLX's rule needs log2f: scalar per block, the reference's operations.
template <class F>
std::uint8_t NearestScale(float bamax, DType src) {
  const float a = detail::round_to(bamax / F::MAX, src);
  if (a == 0.0f) return 0x7F;
  const float l = detail::round_to(std::log2(a), src);
  return static_cast<std::uint8_t>(std::clamp(std::nearbyint(l) + 127.0f, 0.0f, 254.0f));
}

template <class F>
HWY_INLINE VI E8m0Scales(VI bm, ScaleRule rule, DType src) {
  const DF df;
  const DI di;
  switch (rule) {
    case ScaleRule::ceil: {
      const VI v = hn::BitCast(di, hn::Mul(hn::BitCast(df, bm), hn::Set(df, f32_from_bits(F::C_MAX_BITS))));
      const VI e = hn::ShiftRight<23>(v);
      const VI mant = hn::And(v, hn::Set(di, 0x7FFFFF));
      // Round up when mant != 0, except at exponent 0 up to the 2^-127 midpoint; Inf -> 0xFE.
      const VI keep = hn::IfThenElseZero(hn::Eq(e, hn::Zero(di)), hn::Set(di, 0x400000));
      const VI up = hn::VecFromMask(di, hn::Gt(mant, keep));
      return hn::Min(hn::Sub(e, up), hn::Set(di, 0xFE));
    }
    case ScaleRule::floor:
      return hn::Max(hn::Sub(hn::ShiftRight<23>(bm), hn::Set(di, F::EMAX)), hn::Zero(di));
    case ScaleRule::even: {
      const VI b = hn::Add(bm, hn::Set(di, 1 << (22 - F::M)));
      const VI e = hn::Sub(hn::ShiftRight<23>(b), hn::Set(di, F::EMAX));
      return hn::Min(hn::Max(e, hn::Zero(di)), hn::Set(di, 254));
    }
    case ScaleRule::nearest: {
      alignas(64) std::int32_t lanes[kN];
      hn::Store(bm, di, lanes);
      for (std::size_t b = 0; b < kN; ++b)  // NaN blocks ('propagate') get 0xFF later
        lanes[b] = lanes[b] > kInfBits ? 0 : NearestScale<F>(f32_from_bits(static_cast<std::uint32_t>(lanes[b])), src);
      return hn::Load(di, lanes);
    }
  }
  return hn::Set(di, 0xFF);
}

template <class F, bool kSat, class T>
HWY_INLINE void MxTile(const T* x, ScaleRule rule, DType src, std::uint8_t* packed, std::uint8_t* scales) {
  const DI di;
  const VI bm = BlockMaxBits<32, kSat>(x);
  VI e = E8m0Scales<F>(bm, rule, src);
  // 2^(127-e) from bits: (254-e) << 23, and the subnormal 2^-127 for e = 254.
  const VI r = hn::IfThenElse(hn::Eq(e, hn::Set(di, 254)), hn::Set(di, 0x400000),
                              hn::ShiftLeft<23>(hn::Sub(hn::Set(di, 254), e)));
  const auto bad = NonFiniteBlocks<kSat>(bm);
  e = hn::IfThenElse(bad, hn::Set(di, 0xFF), e);
  StoreBytes(e, scales);
  EncodeTile<F, 32, kSat>(x, hn::BitCast(DF(), r), bm, scales, 0xFF, !hn::AllFalse(di, bad), packed);
}

// Runs tile(x, packed, scales) over blocks [b0, b1); the last partial tile goes through a
// zero-padded copy.
template <std::size_t G, std::size_t kBits, class T, class Tile>
HWY_INLINE void TiledBlocks(const T* x, std::int64_t b0, std::int64_t b1, std::uint8_t* packed, std::uint8_t* scales,
                            const Tile& tile) {
  constexpr std::size_t kBlockBytes = G * kBits / 8;
  std::int64_t b = b0;
  for (; b + static_cast<std::int64_t>(kN) <= b1; b += kN)
    tile(x + b * G, packed + b * kBlockBytes, scales + b);
  if (b == b1) return;
  const auto rem = static_cast<std::size_t>(b1 - b);
  alignas(64) T xin[kN * G] = {};
  std::uint8_t pout[kN * kBlockBytes];
  std::uint8_t sout[kN];
  std::memcpy(xin, x + b * G, rem * G * sizeof(T));
  tile(xin, pout, sout);
  std::memcpy(packed + b * kBlockBytes, pout, rem * kBlockBytes);
  std::memcpy(scales + b, sout, rem);
}

template <bool kSat, class T>
void FpBlocks(const T* x, const QuantSpec& spec, DType src, std::int64_t b0, std::int64_t b1, std::uint8_t* packed,
              std::uint8_t* scales) {
  const ScaleRule rule = spec.scale_rule;
  switch (spec.mode) {
    case Mode::nvfp4: {
      const Nvfp4 p = Nvfp4Factors(spec);
      TiledBlocks<16, 4>(x, b0, b1, packed, scales,
                         [&](const T* xt, std::uint8_t* pt, std::uint8_t* st) { Nvfp4Tile<kSat>(xt, p, pt, st); });
      break;
    }
    case Mode::mxfp4:
      TiledBlocks<32, 4>(x, b0, b1, packed, scales, [&](const T* xt, std::uint8_t* pt, std::uint8_t* st) {
        MxTile<E2M1, kSat>(xt, rule, src, pt, st);
      });
      break;
    case Mode::mxfp8:
      if (spec.elem == Elem::e5m2)
        TiledBlocks<32, 8>(x, b0, b1, packed, scales, [&](const T* xt, std::uint8_t* pt, std::uint8_t* st) {
          MxTile<E5M2, kSat>(xt, rule, src, pt, st);
        });
      else
        TiledBlocks<32, 8>(x, b0, b1, packed, scales, [&](const T* xt, std::uint8_t* pt, std::uint8_t* st) {
          MxTile<E4M3, kSat>(xt, rule, src, pt, st);
        });
      break;
    case Mode::affine:
      break;
  }
}

// ---- affine (FORMATS.md 2.3): one group at a time, min/max and codes in vectors ----

// Appends `bits`-wide codes to an LSB-first bit stream (whole bytes: n * bits % 8 == 0).
void PackBits(const std::int32_t* codes, int n, int bits, std::uint8_t* out) {
  std::uint64_t acc = 0;
  int filled = 0;
  for (int i = 0; i < n; ++i) {
    acc |= static_cast<std::uint64_t>(codes[i]) << filled;
    for (filled += bits; filled >= 8; filled -= 8, acc >>= 8) *out++ = static_cast<std::uint8_t>(acc);
  }
}

template <class T>
void AffineGroups(const T* x, const QuantSpec& spec, DType src, std::int64_t g0, std::int64_t g1,
                  std::uint8_t* packed, std::byte* scales, std::byte* biases) {
  const DF df;
  const DI di;
  const int gs = spec.group_size;
  const int bits = spec.bits;
  const std::size_t group_bytes = static_cast<std::size_t>(gs * bits / 8);
  const std::size_t ssize = dtype_size(src);
  const float n = static_cast<float>((1 << bits) - 1);
  alignas(64) std::int32_t codes[128];
  for (std::int64_t g = g0; g < g1; ++g) {
    const T* w = x + g * gs;
    std::uint8_t* out = packed + static_cast<std::size_t>(g) * group_bytes;
    std::byte* sp = scales + static_cast<std::size_t>(g) * ssize;
    std::byte* bp = biases + static_cast<std::size_t>(g) * ssize;
    VF vmax = Load(w), vmin = vmax;
    VI bm = AbsBits<false>(vmax);
    for (int i = static_cast<int>(kN); i < gs; i += static_cast<int>(kN)) {
      const VF v = Load(w + i);
      vmax = hn::Max(vmax, v);
      vmin = hn::Min(vmin, v);
      bm = hn::Max(bm, AbsBits<false>(v));
    }
    if (!hn::AllFalse(di, NonFiniteBlocks<false>(bm))) {  // 'saturate' has no affine form: propagate
      const float nan = std::numeric_limits<float>::quiet_NaN();
      detail::store_f32(nan, src, sp);
      detail::store_f32(nan, src, bp);
      std::memset(out, 0, group_bytes);
      continue;
    }
    // The signs of zero extremes differ from the reference's scan order but reach no output.
    const float wmax = hn::GetLane(hn::MaxOfLanes(df, vmax));
    const float wmin = hn::GetLane(hn::MinOfLanes(df, vmin));
    const bool neg = std::fabs(wmin) > std::fabs(wmax);
    float scale = std::fmax((wmax - wmin) / n, 1e-7f);
    if (!neg) scale = -scale;
    const float edge = neg ? wmin : wmax;
    const float q0 = std::nearbyint(edge / scale);
    float bias = 0.0f;
    if (q0 != 0.0f) {
      scale = edge / q0;
      bias = edge;
    }
    const VF vs = hn::Set(df, scale), vb = hn::Set(df, bias), hi = hn::Set(df, n);
    for (int i = 0; i < gs; i += static_cast<int>(kN)) {
      const VF q = hn::Round(hn::Div(hn::Sub(Load(w + i), vb), vs));
      hn::Store(hn::ConvertTo(di, hn::Min(hn::Max(q, hn::Zero(df)), hi)), di, codes + i);
    }
    PackBits(codes, gs, bits, out);
    detail::store_f32(scale, src, sp);
    detail::store_f32(bias, src, bp);
  }
}

template <class T>
void Blocks(const T* x, DType src, const QuantSpec& spec, std::int64_t b0, std::int64_t b1, std::uint8_t* packed,
            std::byte* scales, std::byte* biases) {
  auto* s8 = reinterpret_cast<std::uint8_t*>(scales);
  if (spec.mode == Mode::affine)
    AffineGroups(x, spec, src, b0, b1, packed, scales, biases);
  else if (spec.nonfinite == NonFinite::saturate)
    FpBlocks<true>(x, spec, src, b0, b1, packed, s8);
  else
    FpBlocks<false>(x, spec, src, b0, b1, packed, s8);
}

void QuantizeBlocks(const void* x, DType src, const QuantSpec& spec, std::int64_t b0, std::int64_t b1,
                    std::uint8_t* packed, std::byte* scales, std::byte* biases) {
  switch (src) {
    case DType::float16:
      return Blocks(static_cast<const hwy::float16_t*>(x), src, spec, b0, b1, packed, scales, biases);
    case DType::bfloat16:
      return Blocks(static_cast<const hwy::bfloat16_t*>(x), src, spec, b0, b1, packed, scales, biases);
    default:
      return Blocks(static_cast<const float*>(x), src, spec, b0, b1, packed, scales, biases);
  }
}

#endif  // HWY_TARGET == HWY_SCALAR

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace microscale::cpu {

HWY_EXPORT(QuantizeBlocks);

void quantize(const void* x, DType src, std::int64_t rows, std::int64_t K, const QuantSpec& spec,
              std::uint8_t* packed, std::byte* scales, std::byte* biases) {
  const std::int64_t blocks = rows * (K / spec.group_size);
  // ~64 KiB of f32 input per chunk; a multiple of every target's tile (16 blocks), so only the
  // last chunk has a partial tile.
  const std::int64_t grain = std::max<std::int64_t>(16, 16384 / spec.group_size / 16 * 16);
  parallel_for(blocks, grain, [&](std::int64_t b0, std::int64_t b1) {
    HWY_DYNAMIC_DISPATCH(QuantizeBlocks)(x, src, spec, b0, b1, packed, scales, biases);
  });
}

}  // namespace microscale::cpu
#endif
