// Quantize kernels of one target (Highway -inl.h, included per target).
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

#if defined(MICROSCALE_CPU_QUANTIZE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MICROSCALE_CPU_QUANTIZE_INL_H_
#undef MICROSCALE_CPU_QUANTIZE_INL_H_
#else
#define MICROSCALE_CPU_QUANTIZE_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/convert.hpp"
#include "cpu/simd-inl.h"
#include "microscale/format.hpp"
#include "microscale/tensor.hpp"
#include "reference/reference.hpp"

HWY_BEFORE_NAMESPACE();
namespace microscale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Widens a few blocks at a time and runs the reference: the whole kernel on single-lane targets,
// where vectors gain nothing, the searched scale modes on every target (their per-block
// candidate loop is the scalar spec's), and stochastic rounding (its random byte is per element).
// Block b starts at flat element b * G, which keys the stochastic rounding.
inline void ReferenceBlocks(const void* x, DType src, const QuantSpec& spec, std::int64_t b0, std::int64_t b1,
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
                        biases ? biases + static_cast<std::size_t>(b) * ssize : nullptr, b * G);
  }
}

#if HWY_TARGET == HWY_SCALAR

inline void QuantizeBlocks(const void* x, DType src, const QuantSpec& spec, std::int64_t b0, std::int64_t b1,
                           std::uint8_t* packed, std::byte* scales, std::byte* biases) {
  ReferenceBlocks(x, src, spec, b0, b1, packed, scales, biases);
}

inline std::vector<float> WidenedBlocks(const void* x, DType src, std::int64_t b0, std::int64_t b1) {
  constexpr std::int64_t G = numerics::kNvfp4Group;
  const std::size_t esize = dtype_size(src);
  std::vector<float> buf(static_cast<std::size_t>((b1 - b0) * G));
  const auto* in = static_cast<const std::byte*>(x) + static_cast<std::size_t>(b0 * G) * esize;
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = detail::load_f32(in + i * esize, src);
  return buf;
}

// scales: null, or each candidate's codes for all `blocks` blocks (this range's at b0).
inline bool Nvfp4GlobalErrorBlocks(const void* x, DType src, std::int64_t b0, std::int64_t b1,
                                   const numerics::Nvfp4Search* searches, int n, double* totals, std::uint8_t* scales,
                                   std::int64_t blocks) {
  const std::vector<float> buf = WidenedBlocks(x, src, b0, b1);
  const std::int64_t nb = b1 - b0;
  std::vector<float> globals;
  for (int c = 0; c < n; ++c) globals.push_back(searches[c].decode_amax);
  std::vector<double> sums(static_cast<std::size_t>(n));
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(n * nb));
  if (!reference::nvfp4_global_errors(buf.data(), nb, globals.data(), n, sums.data(), codes.data())) return false;
  for (int c = 0; c < n; ++c) {
    totals[c] += sums[static_cast<std::size_t>(c)];
    if (scales) std::memcpy(scales + c * blocks + b0, codes.data() + c * nb, static_cast<std::size_t>(nb));
  }
  return true;
}

inline void Nvfp4EncodeBlocks(const void* x, DType src, std::int64_t b0, std::int64_t b1, float global_scale,
                              const std::uint8_t* scales, std::uint8_t* packed) {
  const std::vector<float> buf = WidenedBlocks(x, src, b0, b1);
  reference::nvfp4_encode(buf.data(), b1 - b0, global_scale, scales + b0, packed + b0 * numerics::kNvfp4Group / 2);
}

#else

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

// Lane b = max |x| bits of block b of the tile x (N blocks of G): a plain max within each block,
// then a transposing one across blocks.
template <std::size_t G, bool kSat, class T>
HWY_INLINE VI BlockMaxBits(const T* x) {
  auto block = [x](std::size_t b) HWY_ATTR {
    VI m = AbsBits<kSat>(Load(x + b * G));
    for (std::size_t v = kN; v < G; v += kN) m = hn::Max(m, AbsBits<kSat>(Load(x + b * G + v)));
    return m;
  };
  if constexpr (kN == 4 || kN == 8) {
    // Within 128-bit blocks of 4 lanes: pairing blocks b and b+2 of each quad, then the two
    // pairs, leaves lane i of each 128-bit block holding block i of the quad, in order, with one
    // interleave per input instead of ConcatOdd/ConcatEven's two cross-block shuffles. With 8
    // lanes, one exchange of 128-bit halves then merges the two quads' partial maxima.
    const DI di;
    auto pair = [di](VI a, VI b)
                    HWY_ATTR { return hn::Max(hn::InterleaveLower(di, a, b), hn::InterleaveUpper(di, a, b)); };
    auto quad = [&](std::size_t q)
                    HWY_ATTR { return pair(pair(block(q), block(q + 2)), pair(block(q + 1), block(q + 3))); };
    if constexpr (kN == 4) {
      return quad(0);
    } else {
      const VI lo = quad(0), hi = quad(4);
      return hn::Max(hn::ConcatLowerLower(di, hi, lo), hn::ConcatUpperUpper(di, hi, lo));
    }
  } else {
    return TransposedMax<0, kN>(DI(), block);
  }
}

// bf16 bits widen to f32 bits by a shift, which keeps their order, so the maxima are taken on
// the 16-bit patterns (twice the lanes per vector).
template <std::size_t G, bool kSat>
HWY_INLINE VI BlockMaxBits(const hwy::bfloat16_t* x) {
  const hn::Repartition<std::int16_t, DF> d16;
  const auto abs_bits = [x, d16](std::size_t v) HWY_ATTR {  // |bits| of the v-th vector of 2N values
    const auto a = hn::And(hn::LoadU(d16, reinterpret_cast<const std::int16_t*>(x) + v * 2 * kN), hn::Set(d16, 0x7FFF));
    return kSat ? hn::IfThenZeroElse(hn::Gt(a, hn::Set(d16, 0x7F80)), a) : a;
  };
  if constexpr (kN == 8) {
    // Eight blocks of 16 or 32: each block's vectors maxed into one of 16 lanes, then three levels
    // of in-block interleaves (16-, 32- and 64-bit) leave lane i of each 128-bit block holding
    // block i's max over that half, and one exchange of halves completes it. In-block
    // interleaves are one instruction each on AVX2, where ConcatOdd/ConcatEven of 16-bit lanes
    // take three: this halves the work of the bf16 block maxima.
    const auto leaf = [&](std::size_t b) HWY_ATTR {
      auto m = abs_bits(b * G / (2 * kN));
      for (std::size_t v = 1; v < G / (2 * kN); ++v) m = hn::Max(m, abs_bits(b * G / (2 * kN) + v));
      return m;
    };
    const auto level = [d16](auto d, auto a, auto b) HWY_ATTR {  // a and b as lanes of d, maxed pairwise
      const auto a_d = hn::BitCast(d, a), b_d = hn::BitCast(d, b);
      return hn::Max(hn::BitCast(d16, hn::InterleaveLower(d, a_d, b_d)),
                     hn::BitCast(d16, hn::InterleaveUpper(d, a_d, b_d)));
    };
    const hn::Repartition<std::int32_t, DF> d32;
    const hn::Repartition<std::int64_t, DF> d64;
    const auto q0 = level(d32, level(d16, leaf(0), leaf(1)), level(d16, leaf(2), leaf(3)));
    const auto q1 = level(d32, level(d16, leaf(4), leaf(5)), level(d16, leaf(6), leaf(7)));
    const auto r = level(d64, q0, q1);
    const auto m = hn::Max(r, hn::SwapAdjacentBlocks(r));
    return hn::ShiftLeft<16>(hn::PromoteTo(DI(), hn::LowerHalf(m)));  // maxima are 0..0x7FFF
  } else {
    // Reduce to half-block runs, then merge the two halves of each 32-bit lane.
    const VI h = hn::BitCast(DI(), TransposedMax<0, G / 2>(d16, abs_bits));
    return hn::Max(hn::ShiftLeft<16>(h), hn::And(h, hn::Set(DI(), static_cast<std::int32_t>(0xFFFF0000u))));
  }
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
  // The codes of the even- and the odd-indexed elements of the 2N values at e.
  auto codes = [&](std::size_t e, VI& even_codes, VI& odd_codes) HWY_ATTR MICROSCALE_ALWAYS_INLINE {
    VF f;
    if constexpr (2 * kN <= G) {
      f = hn::Set(df, factor[e / G]);
    } else {  // lanes 0..N/2-1 hold elements of block e/G, the others of the next one
      const hn::Half<DF> dh;
      f = hn::Combine(df, hn::Set(dh, factor[e / G + 1]), hn::Set(dh, factor[e / G]));
    }
    VF even, odd;
    LoadPairs(x + e, even, odd);
    even_codes = EncodeElements<F, kSat, kClamp>(hn::Mul(even, f));
    odd_codes = EncodeElements<F, kSat, kClamp>(hn::Mul(odd, f));
  };
#if HWY_TARGET == HWY_AVX2
  if constexpr (F::BITS == 4) {
    // 64 elements per store: the even codes of four vectors saturate-packed to bytes (in-block
    // packs, so their 4-byte runs come out interleaved), the odd ones likewise, merged as
    // nibbles in one shift and one OR, and the runs put in order by one permute: 9
    // instructions where merging each pair in 32-bit lanes first takes 17. Codes are 0..15.
    for (std::size_t q = 0; q < kN * G; q += 8 * kN) {
      VI e0, o0, e1, o1, e2, o2, e3, o3;
      codes(q, e0, o0);
      codes(q + 2 * kN, e1, o1);
      codes(q + 4 * kN, e2, o2);
      codes(q + 6 * kN, e3, o3);
      const __m256i even =
          _mm256_packus_epi16(_mm256_packus_epi32(e0.raw, e1.raw), _mm256_packus_epi32(e2.raw, e3.raw));
      const __m256i odd = _mm256_packus_epi16(_mm256_packus_epi32(o0.raw, o1.raw), _mm256_packus_epi32(o2.raw, o3.raw));
      const __m256i bytes = _mm256_or_si256(even, _mm256_slli_epi16(odd, 4));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(packed + q / 2),
                          _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    return;
  }
#endif
  auto pair_codes = [&](std::size_t e) HWY_ATTR MICROSCALE_ALWAYS_INLINE {
    VI even_codes, odd_codes;
    codes(e, even_codes, odd_codes);
    return hn::Or(even_codes, hn::ShiftLeft<F::BITS>(odd_codes));
  };
  for (std::size_t q = 0; q < kN * G; q += 8 * kN)
    StoreQuad<F>(pair_codes(q), pair_codes(q + 2 * kN), pair_codes(q + 4 * kN), pair_codes(q + 6 * kN),
                 packed + q * F::BITS / 8);
}

// What pass 2 of a tile needs from pass 1, in memory (sizeless SVE vectors cannot be members):
// factor[b] = 1/scale of block b; whether some fl(bamax * factor) may round past the format's
// max, so that elements need the clamp (saturating scales, clipping rules, Inf/NaN); whether some
// block's scale byte is the NaN scale (non-finite blocks under 'propagate'), whose codes are zero.
struct TilePlan {
  alignas(64) float factor[kN];
  bool clamp;
  bool any_bad;
};

template <class F>
HWY_INLINE void PlanTile(VF factors, VI bm, bool any_bad, TilePlan& plan) {
  const DF df;
  hn::Store(factors, df, plan.factor);
  const VF ymax = hn::Mul(hn::BitCast(df, bm), factors);  // NaN for NaN blocks: no clamp needed there
  plan.clamp = !hn::AllFalse(df, hn::Ge(ymax, hn::Set(df, F::ROUNDS_TO_MAX)));
  plan.any_bad = any_bad;
}

template <class F, std::size_t G, bool kSat, class T>
HWY_INLINE void EncodePlannedTile(const T* x, const TilePlan& plan, const std::uint8_t* scales, std::uint8_t nan_scale,
                                  std::uint8_t* packed) {
  if (plan.clamp)
    EncodePairs<F, G, kSat, true>(x, plan.factor, packed);
  else
    EncodePairs<F, G, kSat, false>(x, plan.factor, packed);
  if (!plan.any_bad) return;
  constexpr std::size_t kBlockBytes = G * F::BITS / 8;
  for (std::size_t b = 0; b < kN; ++b)
    if (scales[b] == nan_scale) std::memset(packed + b * kBlockBytes, 0, kBlockBytes);
}

// Pass 2 of a tile with block maxima bm, right after its pass 1.
template <class F, std::size_t G, bool kSat, class T>
HWY_INLINE void EncodeTile(const T* x, VF factors, VI bm, const std::uint8_t* scales, std::uint8_t nan_scale,
                           bool any_bad, std::uint8_t* packed) {
  TilePlan plan;
  PlanTile<F>(factors, bm, any_bad, plan);
  EncodePlannedTile<F, G, kSat>(x, plan, scales, nan_scale, packed);
}

// ---- nvfp4 (FORMATS.md 2.1) ----

struct Nvfp4 {
  float s_enc_c6;  // fl(S_enc * C6); C6 for two-level, where S_enc = S_dec = 1
  float s_dec;
};

inline Nvfp4 Nvfp4Factors(const QuantSpec& spec) {
  const numerics::Nvfp4Tensor t =
      numerics::nvfp4_tensor(spec.global_scale.has_value(), spec.global_scale.value_or(0.0f));
  return {t.s_enc * f32_from_bits(kC6Bits), t.s_dec};
}

// Pass 1 of a tile: its scale bytes and plan. Two-level is three-level with S_enc = S_dec = 1:
// bamax*C6 and 1/(sf*1) are the same single roundings, and fminf changes nothing the E4M3 encoder
// does not already saturate.
template <bool kSat, class T>
HWY_INLINE void Nvfp4PlanTile(const T* x, const Nvfp4& p, std::uint8_t* scales, TilePlan& plan) {
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
  PlanTile<E2M1>(enc, bm, !hn::AllFalse(di, bad), plan);
}

// The magnitudes of a tile of N blocks of G in float32, transposed: mags[i * N + b] is |element
// i of block b|. With 8 lanes, 8 x 8 transposes in registers (pairs of lanes, then pairs of
// pairs within 128-bit blocks, then the 128-bit halves); otherwise, and on SVE (which allows no
// arrays of vectors), through memory.
template <std::size_t G, class T>
HWY_INLINE void TransposeMagnitudes(const T* x, float* mags) {
  const DF df;
#if !HWY_HAVE_SCALABLE
  if constexpr (kN == 8) {
    const hn::Repartition<double, DF> d64;
    auto lo64 = [d64](VF a, VF b) HWY_ATTR {
      return hn::BitCast(DF(), hn::InterleaveLower(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
    };
    auto hi64 = [d64](VF a, VF b) HWY_ATTR {
      return hn::BitCast(DF(), hn::InterleaveUpper(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
    };
    for (std::size_t j = 0; j < G; j += 8) {
      VF r[8], t[8], u[8];
      for (std::size_t b = 0; b < 8; ++b) r[b] = hn::Abs(Load(x + b * G + j));
      for (std::size_t b = 0; b < 8; b += 2) {
        t[b] = hn::InterleaveLower(df, r[b], r[b + 1]);
        t[b + 1] = hn::InterleaveUpper(df, r[b], r[b + 1]);
      }
      for (std::size_t h = 0; h < 8; h += 4) {  // rows h..h+3: u[h + k] holds their elements k and k + 4
        u[h] = lo64(t[h], t[h + 2]);
        u[h + 1] = hi64(t[h], t[h + 2]);
        u[h + 2] = lo64(t[h + 1], t[h + 3]);
        u[h + 3] = hi64(t[h + 1], t[h + 3]);
      }
      for (std::size_t k = 0; k < 4; ++k) {
        hn::Store(hn::ConcatLowerLower(df, u[4 + k], u[k]), df, mags + (j + k) * 8);
        hn::Store(hn::ConcatUpperUpper(df, u[4 + k], u[k]), df, mags + (j + k + 4) * 8);
      }
    }
    return;
  }
#endif
  alignas(64) float rows[kN * G];
  for (std::size_t v = 0; v < kN * G; v += kN) hn::Store(hn::Abs(Load(x + v)), df, rows + v);
  for (std::size_t b = 0; b < kN; ++b)
    for (std::size_t i = 0; i < G; ++i) mags[i * kN + b] = rows[b * G + i];
}

// BlockMaxBits of a tile from its transposed magnitudes (TransposeMagnitudes): a max of rows.
template <std::size_t G>
HWY_INLINE VI TransposedBlockMaxBits(const float* mags) {
  const DF df;
  const DI di;
  VI m = hn::BitCast(di, hn::Load(df, mags));
  for (std::size_t i = 1; i < G; ++i) m = hn::Max(m, hn::BitCast(di, hn::Load(df, mags + i * kN)));
  return m;
}

// The C of Fp4SquaredError below, 2^22 * 2^floor(log2 max(y, 1)), for 0 <= y < 8.
HWY_INLINE VF Fp4RoundingConstant(VF y) {
#if HWY_TARGET == HWY_AVX2
  // One permute by y's biased exponent, whose low 3 bits (all vpermps reads) tell apart the
  // binades 2^-5 to 4 (exponents 122 to 129); below 2^-5, y rounds to 0 under any of the three C.
  const __m256 by_exponent = _mm256_setr_ps(0x1p23f, 0x1p24f, 0x1p22f, 0x1p22f, 0x1p22f, 0x1p22f, 0x1p22f, 0x1p22f);
  return VF{_mm256_permutevar8x32_ps(by_exponent, _mm256_srli_epi32(_mm256_castps_si256(y.raw), 23))};
#elif HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // The same with the exponent's low 4 bits (binades 2^-13 to 4): two instructions, not three.
  const __m512 by_exponent = _mm512_setr_ps(0x1p23f, 0x1p24f, 0x1p22f, 0x1p22f, 0x1p22f, 0x1p22f, 0x1p22f, 0x1p22f,
                                            0x1p22f, 0x1p22f, 0x1p22f, 0x1p22f, 0x1p22f, 0x1p22f, 0x1p22f, 0x1p22f);
  return VF{_mm512_permutexvar_ps(_mm512_srli_epi32(_mm512_castps_si512(y.raw), 23), by_exponent)};
#else
  const DI di;
  const VI binade = hn::Max(hn::And(hn::BitCast(di, y), hn::Set(di, kInfBits)), hn::Set(di, 0x3F800000));
  return hn::BitCast(DF(), hn::Add(binade, hn::Set(di, 22 << 23)));
#endif
}

// fl(d*d), d = fl(fl(val(E2M1(a * enc)) * dec) - a), for magnitudes a: a term of
// numerics::fp4_block_sq_error. Rounding is sign-symmetric, so for x = +-a the spec's d is +-this
// d. The E2M1 value of y = a * enc comes without a code: adding C = 2^22 * 2^floor(log2 max(y,
// 1)) rounds y to the format's step in its binade (0.5 below 2, 1 below 4, 2 up to 6), ties to
// the even multiple of the step, which is the even code; subtracting C is exact. y is saturated
// to 6 first (Inf included) unless the caller knows y < 7, which rounds to at most 6 anyway.
template <bool kSaturate>
HWY_INLINE VF Fp4SquaredError(VF a, VF enc, VF dec) {
  const DF df;
  VF y = hn::Mul(a, enc);
  if constexpr (kSaturate) y = hn::Min(y, hn::Set(df, 6.0f));
  const VF c = Fp4RoundingConstant(y);
  const VF d = hn::Sub(hn::Mul(hn::Sub(hn::Add(y, c), c), dec), a);
  return hn::Mul(d, d);
}

// Per lane b: numerics::fp4_block_sq_error of block b (the f32 sum of the terms in index order),
// from its magnitudes (mags as TransposeMagnitudes) and their max amax.
template <std::size_t G>
HWY_INLINE VF Fp4SquaredErrors(const float* mags, VF amax, VF enc, VF dec) {
  const DF df;
  VF err = hn::Zero(df);
  if (hn::AllFalse(df, hn::Ge(hn::Mul(amax, enc), hn::Set(df, E2M1::ROUNDS_TO_MAX)))) {
    for (std::size_t i = 0; i < G; ++i)
      err = hn::Add(err, Fp4SquaredError<false>(hn::Load(df, mags + i * kN), enc, dec));
  } else {
    for (std::size_t i = 0; i < G; ++i)
      err = hn::Add(err, Fp4SquaredError<true>(hn::Load(df, mags + i * kN), enc, dec));
  }
  return err;
}

// The encode and decode factors of block scale codes (numerics::nvfp4_scale_of_code and
// nvfp4_decode_factor).
HWY_INLINE void Nvfp4CodeFactors(VI code, const numerics::Nvfp4Search& p, VF& enc, VF& dec) {
  const DF df;
  const numerics::Nvfp4Tensor& t = p.t;
  const VF sf = DecodeE4M3<false>(code);
  enc = hn::Min(hn::Div(hn::Set(df, 1.0f), hn::Mul(sf, hn::Set(df, t.s_dec))), hn::Set(df, kFltMax));
  dec = t.three_level ? hn::Mul(hn::Mul(sf, hn::Set(df, p.decode_amax)), hn::Set(df, f32_from_bits(kC2688Bits))) : sf;
}

#if !HWY_HAVE_SCALABLE
// Per lane b and code k: numerics::fp4_block_sq_error of block b under the factors enc[k],
// dec[k], as Fp4SquaredErrors; the kP sums advance together so that their dependent additions
// overlap. Bit k of kSaturate: code k's terms saturate y first.
template <unsigned kSaturate, std::size_t kP, std::size_t... kK>
HWY_INLINE void Fp4SquaredErrorsInterleaved(const float* mags, const VF (&enc)[kP], const VF (&dec)[kP], VF (&err)[kP],
                                            std::index_sequence<kK...>) {
  const DF df;
  for (VF& e : err) e = hn::Zero(df);
  for (std::size_t i = 0; i < numerics::kNvfp4Group; ++i) {
    const VF a = hn::Load(df, mags + i * kN);
    ((err[kK] = hn::Add(err[kK], Fp4SquaredError<((kSaturate >> kK) & 1) != 0>(a, enc[kK], dec[kK]))), ...);
  }
}

// The same, saturating only the codes whose factors may take some block max to ROUNDS_TO_MAX:
// mse's codes below round-to-nearest's (bits kBelow) mostly do, the others (whose max lands near
// 6 or lower) only on subnormal block scales, so one test per group spares most terms the min.
template <unsigned kBelow, std::size_t kP>
HWY_INLINE void Fp4SquaredErrorsInterleaved(const float* mags, VF amax, const VF (&enc)[kP], const VF (&dec)[kP],
                                            VF (&err)[kP]) {
  const DF df;
  constexpr unsigned kAll = (1u << kP) - 1;
  auto saturates = [&](unsigned group) HWY_ATTR {  // fl(amax * enc) grows with enc
    VF most = hn::Zero(df);
    for (std::size_t k = 0; k < kP; ++k)
      if ((group >> k) & 1) most = hn::Max(most, enc[k]);
    return !hn::AllFalse(df, hn::Ge(hn::Mul(amax, most), hn::Set(df, E2M1::ROUNDS_TO_MAX)));
  };
  const auto codes = std::make_index_sequence<kP>();
  if (saturates(kAll & ~kBelow))
    Fp4SquaredErrorsInterleaved<kAll>(mags, enc, dec, err, codes);
  else if (saturates(kBelow))
    Fp4SquaredErrorsInterleaved<kBelow>(mags, enc, dec, err, codes);
  else
    Fp4SquaredErrorsInterleaved<0>(mags, enc, dec, err, codes);
}

// mse's search (Nvfp4SearchBlocks) with its six codes evaluated together: the chosen codes, their
// encode factors and errors.
HWY_INLINE void Nvfp4MseBlocks(const float* mags, VI bm, const numerics::Nvfp4Search& p, VI& best_code, VF& best_enc,
                               VF& best_err) {
  const DF df;
  const DI di;
  const VF amax = hn::BitCast(df, bm);
  const VF base = hn::Min(hn::Mul(amax, hn::Set(df, p.t.s_enc * f32_from_bits(kC6Bits))), hn::Set(df, kFltMax));
  const VI s0 = RoundMagnitude<E4M3>(hn::BitCast(di, base));
  const VI one = hn::Set(di, 1), two = hn::Set(di, 2);
  // In the spec's order: s0, s0-1, s0+1, s0-2, s0+2, 4over6.
  const VI codes[6] = {s0,
                       hn::Sub(s0, one),
                       hn::Add(s0, one),
                       hn::Sub(s0, two),
                       hn::Add(s0, two),
                       RoundMagnitude<E4M3>(hn::BitCast(di, hn::Mul(base, hn::Set(df, 1.5f))))};
  VF enc[6], dec[6], err[6];
  for (std::size_t k = 0; k < 6; ++k) Nvfp4CodeFactors(codes[k], p, enc[k], dec[k]);
  Fp4SquaredErrorsInterleaved<0b01010>(mags, amax, enc, dec, err);  // s0-1 and s0-2
  // Strictly lower errors replace the best in that order.
  const VI max_code = hn::Set(di, E4M3::MAX_CODE);
  best_code = codes[0];
  best_enc = enc[0];
  best_err = err[0];
  auto consider = [&](std::size_t k, auto valid) HWY_ATTR MICROSCALE_ALWAYS_INLINE {
    const auto better = hn::And(hn::RebindMask(df, valid), hn::Lt(err[k], best_err));
    best_code = hn::IfThenElse(hn::RebindMask(di, better), codes[k], best_code);
    best_enc = hn::IfThenElse(better, enc[k], best_enc);
    best_err = hn::IfThenElse(better, err[k], best_err);
  };
  consider(1, hn::Gt(s0, hn::Zero(di)));
  consider(2, hn::Lt(s0, max_code));
  consider(3, hn::Gt(s0, one));
  consider(4, hn::Lt(hn::Add(s0, one), max_code));
  consider(5, hn::Eq(s0, s0));
}
#endif

// The searched nvfp4 block scales of a finite tile (lane b = block b, from its transposed
// magnitudes and block maxima): each candidate's error is summed over the block's elements in
// index order with the scalar spec's float operations (numerics::nvfp4_searched_block_scale), so
// the choice is the reference's. Outputs the chosen codes, their encode factors and errors
// (references: SVE vectors cannot be members of a struct).
HWY_INLINE void Nvfp4SearchBlocks(const float* mags, VI bm, const numerics::Nvfp4Search& p, ScaleSearch search,
                                  VI& best_code, VF& best_enc, VF& best_err) {
  constexpr std::size_t G = numerics::kNvfp4Group;
  const DF df;
  const DI di;
#if !HWY_HAVE_SCALABLE  // sizeless vectors make no arrays
  if (search == ScaleSearch::mse) return Nvfp4MseBlocks(mags, bm, p, best_code, best_enc, best_err);
#endif
  const numerics::Nvfp4Tensor& t = p.t;
  const VF flt_max = hn::Set(df, kFltMax);
  const VF amax = hn::BitCast(df, bm);
  const VF base = hn::Min(hn::Mul(amax, hn::Set(df, t.s_enc * f32_from_bits(kC6Bits))), flt_max);
  const VI s0 = RoundMagnitude<E4M3>(hn::BitCast(di, base));
  best_code = s0;
  VF dec0;
  Nvfp4CodeFactors(s0, p, best_enc, dec0);
  best_err = Fp4SquaredErrors<G>(mags, amax, best_enc, dec0);
  // A candidate's error is at least its block max's term (a sum of non-negative terms never
  // falls below one of them), so where that term alone reaches the best error in every valid
  // lane, the candidate cannot win. Checked for the scales 2 and 3 steps down, where the max
  // saturates and mostly loses so; elsewhere it would rarely skip anything.
  auto consider = [&](VI code, auto valid, bool bounded) HWY_ATTR MICROSCALE_ALWAYS_INLINE {
    VF enc, dec;
    Nvfp4CodeFactors(code, p, enc, dec);
    if (bounded && hn::AllTrue(df, hn::Or(hn::Not(valid), hn::Ge(Fp4SquaredError<true>(amax, enc, dec), best_err))))
      return;
    const VF err = Fp4SquaredErrors<G>(mags, amax, enc, dec);
    const auto better = hn::And(valid, hn::Lt(err, best_err));
    best_code = hn::IfThenElse(hn::RebindMask(di, better), code, best_code);
    best_enc = hn::IfThenElse(better, enc, best_enc);
    best_err = hn::IfThenElse(better, err, best_err);
  };
  if (search == ScaleSearch::mse) {
    for (int d = 1; d <= numerics::kNvfp4MseSteps; ++d) {
      const VI step = hn::Set(di, d);
      consider(hn::Sub(s0, step), hn::RebindMask(df, hn::Gt(s0, hn::Sub(step, hn::Set(di, 1)))), d > 1);
      consider(hn::Add(s0, step), hn::RebindMask(df, hn::Gt(hn::Set(di, E4M3::MAX_CODE + 1), hn::Add(s0, step))),
               false);
    }
  }
  // 4over6's max-to-4 code (mse tries it last).
  consider(RoundMagnitude<E4M3>(hn::BitCast(di, hn::Mul(base, hn::Set(df, 1.5f)))), hn::RebindMask(df, hn::Eq(s0, s0)),
           false);
}

// nvfp4 scale search (4over6, mse) on finite tiles, 'propagate'/'error' only. Tiles holding
// NaN/Inf take the scalar path.
template <class T>
HWY_INLINE void Nvfp4SearchTile(const T* x, const numerics::Nvfp4Search& p, const QuantSpec& spec, DType src,
                                std::uint8_t* packed, std::uint8_t* scales) {
  constexpr std::size_t G = numerics::kNvfp4Group;
  const DI di;
  alignas(64) float mags[G * kN];
  TransposeMagnitudes<G>(x, mags);
  const VI bm = TransposedBlockMaxBits<G>(mags);
  if (!hn::AllFalse(di, NonFiniteBlocks<false>(bm))) {
    ReferenceBlocks(x, src, spec, 0, static_cast<std::int64_t>(kN), packed, reinterpret_cast<std::byte*>(scales),
                    nullptr);
    return;
  }
  VI code = hn::Zero(di);
  VF enc = hn::Zero(DF()), err = enc;
  Nvfp4SearchBlocks(mags, bm, p, spec.scale_search, code, enc, err);
  StoreBytes(code, scales);
  EncodeTile<E2M1, G, false>(x, enc, bm, scales, 0x7F, false, packed);
}

// Three-level mse's global search over a tile (reference::nvfp4_global_errors): adds, for each of
// the n candidate searches, the errors its block scales leave to totals[c]. The transposed tile is
// shared by every candidate. False when the tile holds a NaN or Inf.
// With codes not null, codes[c * stride + b] receives candidate c's code for block b.
template <class T>
HWY_INLINE bool Nvfp4GlobalErrorsTile(const T* x, const numerics::Nvfp4Search* searches, int n, double* totals,
                                      std::uint8_t* codes, std::int64_t stride) {
  constexpr std::size_t G = numerics::kNvfp4Group;
  const DI di;
  alignas(64) float mags[G * kN];
  TransposeMagnitudes<G>(x, mags);
  const VI bm = TransposedBlockMaxBits<G>(mags);
  if (!hn::AllFalse(di, NonFiniteBlocks<false>(bm))) return false;
  alignas(64) float errs[kN];
  VI code = hn::Zero(di);
  VF enc = hn::Zero(DF()), err = enc;
  for (int c = 0; c < n; ++c) {
    Nvfp4SearchBlocks(mags, bm, searches[c], ScaleSearch::mse, code, enc, err);
    if (codes) StoreBytes(code, codes + c * stride);
    hn::Store(err, DF(), errs);
    for (const float e : errs) totals[c] += e;
  }
  return true;
}

template <class T>
bool Nvfp4GlobalErrorsOf(const T* x, std::int64_t b0, std::int64_t b1, const numerics::Nvfp4Search* searches, int n,
                         double* totals, std::uint8_t* scales, std::int64_t blocks) {
  constexpr std::int64_t G = numerics::kNvfp4Group;
  std::int64_t b = b0;
  for (; b + static_cast<std::int64_t>(kN) <= b1; b += kN)
    if (!Nvfp4GlobalErrorsTile(x + b * G, searches, n, totals, scales ? scales + b : nullptr, blocks)) return false;
  if (b == b1) return true;
  const auto rem = static_cast<std::size_t>(b1 - b);
  alignas(64) T tail[kN * G] = {};  // zero blocks add no error
  std::memcpy(tail, x + b * G, rem * G * sizeof(T));
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(n) * kN);
  if (!Nvfp4GlobalErrorsTile(tail, searches, n, totals, codes.data(), kN)) return false;
  if (scales)
    for (int c = 0; c < n; ++c) std::memcpy(scales + c * blocks + b, codes.data() + c * kN, rem);
  return true;
}

inline bool Nvfp4GlobalErrorBlocks(const void* x, DType src, std::int64_t b0, std::int64_t b1,
                                   const numerics::Nvfp4Search* searches, int n, double* totals, std::uint8_t* scales,
                                   std::int64_t blocks) {
  switch (src) {
    case DType::float16:
      return Nvfp4GlobalErrorsOf(static_cast<const hwy::float16_t*>(x), b0, b1, searches, n, totals, scales, blocks);
    case DType::bfloat16:
      return Nvfp4GlobalErrorsOf(static_cast<const hwy::bfloat16_t*>(x), b0, b1, searches, n, totals, scales, blocks);
    default: return Nvfp4GlobalErrorsOf(static_cast<const float*>(x), b0, b1, searches, n, totals, scales, blocks);
  }
}

// Element codes of a finite tile under given block scale codes, as Nvfp4SearchTile encodes its
// choice.
template <class T>
HWY_INLINE void Nvfp4EncodeTile(const T* x, const numerics::Nvfp4Search& p, const std::uint8_t* scales,
                                std::uint8_t* packed) {
  const VI code = hn::PromoteTo(DI(), hn::LoadU(DQ8(), scales));
  VF enc, dec;
  Nvfp4CodeFactors(code, p, enc, dec);
  EncodeTile<E2M1, numerics::kNvfp4Group, false>(x, enc, BlockMaxBits<numerics::kNvfp4Group, false>(x), scales, 0x7F,
                                                 false, packed);
}

template <class T>
void Nvfp4EncodeOf(const T* x, std::int64_t b0, std::int64_t b1, const numerics::Nvfp4Search& p,
                   const std::uint8_t* scales, std::uint8_t* packed) {
  constexpr std::int64_t G = numerics::kNvfp4Group;
  std::int64_t b = b0;
  for (; b + static_cast<std::int64_t>(kN) <= b1; b += kN)
    Nvfp4EncodeTile(x + b * G, p, scales + b, packed + b * G / 2);
  if (b == b1) return;
  const auto rem = static_cast<std::size_t>(b1 - b);
  alignas(64) T xin[kN * G] = {};
  std::uint8_t sin[kN] = {}, pout[kN * G / 2];
  std::memcpy(xin, x + b * G, rem * G * sizeof(T));
  std::memcpy(sin, scales + b, rem);
  Nvfp4EncodeTile(xin, p, sin, pout);
  std::memcpy(packed + b * G / 2, pout, rem * G / 2);
}

inline void Nvfp4EncodeBlocks(const void* x, DType src, std::int64_t b0, std::int64_t b1, float global_scale,
                              const std::uint8_t* scales, std::uint8_t* packed) {
  const numerics::Nvfp4Search p = numerics::nvfp4_search_tensor(true, global_scale, ScaleSearch::mse);
  switch (src) {
    case DType::float16: return Nvfp4EncodeOf(static_cast<const hwy::float16_t*>(x), b0, b1, p, scales, packed);
    case DType::bfloat16: return Nvfp4EncodeOf(static_cast<const hwy::bfloat16_t*>(x), b0, b1, p, scales, packed);
    default: return Nvfp4EncodeOf(static_cast<const float*>(x), b0, b1, p, scales, packed);
  }
}

// ---- mxfp4 / mxfp8 (FORMATS.md 2.2) ----

// MLX's rule needs log2f: scalar per block, the reference's operations.
template <class F>
std::uint8_t NearestScale(float bamax, DType src) {
  return numerics::e8m0_scale(bamax, numerics::mx_elem_of<F>(), ScaleRule::nearest, src);
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
    case ScaleRule::floor: return hn::Max(hn::Sub(hn::ShiftRight<23>(bm), hn::Set(di, F::EMAX)), hn::Zero(di));
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
HWY_INLINE void MxPlanTile(const T* x, ScaleRule rule, DType src, std::uint8_t* scales, TilePlan& plan) {
  const DI di;
  const VI bm = BlockMaxBits<32, kSat>(x);
  VI e = E8m0Scales<F>(bm, rule, src);
  // 2^(127-e) from bits: (254-e) << 23, and the subnormal 2^-127 for e = 254.
  const VI r = hn::IfThenElse(hn::Eq(e, hn::Set(di, 254)), hn::Set(di, 0x400000),
                              hn::ShiftLeft<23>(hn::Sub(hn::Set(di, 254), e)));
  const auto bad = NonFiniteBlocks<kSat>(bm);
  e = hn::IfThenElse(bad, hn::Set(di, 0xFF), e);
  StoreBytes(e, scales);
  PlanTile<F>(hn::BitCast(DF(), r), bm, !hn::AllFalse(di, bad), plan);
}

// mxfp4 mse on finite tiles ('propagate'/'error'): the rule's exponent and its two neighbours per
// lane, as numerics::mx_searched_block_scale. Tiles holding NaN/Inf take the scalar path.
template <class T>
HWY_INLINE void Mxfp4SearchTile(const T* x, const QuantSpec& spec, DType src, std::uint8_t* packed,
                                std::uint8_t* scales) {
  constexpr std::size_t G = numerics::kMxGroup;
  const DF df;
  const DI di;
  const VI bm = BlockMaxBits<G, false>(x);
  if (!hn::AllFalse(di, NonFiniteBlocks<false>(bm))) {
    ReferenceBlocks(x, src, spec, 0, static_cast<std::int64_t>(kN), packed, reinterpret_cast<std::byte*>(scales),
                    nullptr);
    return;
  }
  alignas(64) float mags[G * kN];
  TransposeMagnitudes<G>(x, mags);
  const VI e0 = E8m0Scales<E2M1>(bm, spec.scale_rule, src);
  auto error_of = [&](VI e, VF& enc) HWY_ATTR MICROSCALE_ALWAYS_INLINE {
    // 2^(127-e) from bits, the subnormal 2^-127 for e = 254, as MxTile.
    enc = hn::BitCast(df, hn::IfThenElse(hn::Eq(e, hn::Set(di, 254)), hn::Set(di, 0x400000),
                                         hn::ShiftLeft<23>(hn::Sub(hn::Set(di, 254), e))));
    return Fp4SquaredErrors<G>(mags, hn::BitCast(df, bm), enc, DecodeE8M0(e));
  };
  VI best = e0;
  VF best_enc;
  VF best_err = error_of(e0, best_enc);
  auto consider = [&](VI e, auto valid) HWY_ATTR MICROSCALE_ALWAYS_INLINE {
    VF enc;
    const VF err = error_of(e, enc);
    const auto better = hn::And(valid, hn::Lt(err, best_err));
    best = hn::IfThenElse(hn::RebindMask(di, better), e, best);
    best_enc = hn::IfThenElse(better, enc, best_enc);
    best_err = hn::IfThenElse(better, err, best_err);
  };
  const VI one = hn::Set(di, 1);
  consider(hn::Sub(e0, one), hn::RebindMask(df, hn::Gt(e0, hn::Zero(di))));
  consider(hn::Add(e0, one), hn::RebindMask(df, hn::Gt(hn::Set(di, 255), hn::Add(e0, one))));
  StoreBytes(best, scales);
  EncodeTile<E2M1, G, false>(x, best_enc, bm, scales, 0xFF, false, packed);
}

// Runs tile(x, packed, scales) over blocks [b0, b1); the last partial tile goes through a
// zero-padded copy.
template <std::size_t G, std::size_t kBits, class T, class Tile>
HWY_INLINE void TiledBlocks(const T* x, std::int64_t b0, std::int64_t b1, std::uint8_t* packed, std::uint8_t* scales,
                            const Tile& tile) {
  constexpr std::size_t kBlockBytes = G * kBits / 8;
  std::int64_t b = b0;
  for (; b + static_cast<std::int64_t>(kN) <= b1; b += kN) tile(x + b * G, packed + b * kBlockBytes, scales + b);
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

// 2 KiB on AVX-512 was 3-8% faster than 4 KiB on Zen 4 in every f32 and bf16 -> nvfp4 / mxfp4
// case at 2 threads (8 and 16 KiB slower); elsewhere 4 KiB, as measured on Ice Lake with AVX2.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr std::size_t kPrefetchAhead = 2048;
#else
constexpr std::size_t kPrefetchAhead = 4096;
#endif

// TiledBlocks for tiles in two passes, plan(x, scales, TilePlan&) then encode(x, plan, scales,
// packed), with each tile planned before the previous one is encoded: a plan is a chain of
// dependent steps (block maxima, scale, division) that leaves the vector ports idle while it
// runs, and issued ahead it overlaps the previous tile's encode. The input is prefetched
// kPrefetchAhead bytes ahead, which the hardware prefetcher alone does not keep up with (10-15% on
// Ice Lake).
template <std::size_t G, std::size_t kBits, class T, class Plan, class Encode>
HWY_INLINE void PlannedTiles(const T* x, std::int64_t b0, std::int64_t b1, std::uint8_t* packed, std::uint8_t* scales,
                             const Plan& plan, const Encode& encode) {
  constexpr std::size_t kBlockBytes = G * kBits / 8;
  constexpr auto kTile = static_cast<std::int64_t>(kN);
  const std::int64_t end = b0 + (b1 - b0) / kTile * kTile;  // past the last full tile
  TilePlan plans[2];
  if (b0 < end) plan(x + b0 * G, scales + b0, plans[0]);
  for (std::int64_t b = b0, i = 0; b < end; b += kTile, i ^= 1) {
    const T* next = x + (b + kTile) * G;
    for (std::size_t line = 0; line < kN * G * sizeof(T); line += 64)
      hwy::Prefetch(reinterpret_cast<const char*>(next) + kPrefetchAhead + line);
    if (b + kTile < end) plan(next, scales + b + kTile, plans[i ^ 1]);
    encode(x + b * G, plans[i], scales + b, packed + b * kBlockBytes);
  }
  TiledBlocks<G, kBits>(x, end, b1, packed, scales,
                        [&](const T* xt, std::uint8_t* pt, std::uint8_t* st) HWY_ATTR MICROSCALE_ALWAYS_INLINE {
                          TilePlan p;
                          plan(xt, st, p);
                          encode(xt, p, st, pt);
                        });
}

template <class F, bool kSat, class T>
HWY_INLINE void MxBlocks(const T* x, ScaleRule rule, DType src, std::int64_t b0, std::int64_t b1, std::uint8_t* packed,
                         std::uint8_t* scales) {
  PlannedTiles<32, F::BITS>(
      x, b0, b1, packed, scales,
      [&](const T* xt, std::uint8_t* st, TilePlan& plan)
          HWY_ATTR MICROSCALE_ALWAYS_INLINE { MxPlanTile<F, kSat>(xt, rule, src, st, plan); },
      [&](const T* xt, const TilePlan& plan, const std::uint8_t* st, std::uint8_t* pt)
          HWY_ATTR MICROSCALE_ALWAYS_INLINE { EncodePlannedTile<F, 32, kSat>(xt, plan, st, 0xFF, pt); });
}

template <bool kSat, class T>
HWY_INLINE void Nvfp4Blocks(const T* x, const Nvfp4& p, std::int64_t b0, std::int64_t b1, std::uint8_t* packed,
                            std::uint8_t* scales) {
  PlannedTiles<16, 4>(
      x, b0, b1, packed, scales,
      [&](const T* xt, std::uint8_t* st, TilePlan& plan)
          HWY_ATTR MICROSCALE_ALWAYS_INLINE { Nvfp4PlanTile<kSat>(xt, p, st, plan); },
      [&](const T* xt, const TilePlan& plan, const std::uint8_t* st, std::uint8_t* pt)
          HWY_ATTR MICROSCALE_ALWAYS_INLINE { EncodePlannedTile<E2M1, 16, kSat>(xt, plan, st, 0x7F, pt); });
}

template <bool kSat, class T>
void FpBlocks(const T* x, const QuantSpec& spec, DType src, std::int64_t b0, std::int64_t b1, std::uint8_t* packed,
              std::uint8_t* scales) {
  const ScaleRule rule = spec.scale_rule;
  switch (spec.mode) {
    case Mode::nvfp4: {
      if (spec.scale_search != ScaleSearch::none) {  // QuantizeBlocks sends 'saturate' to the scalar path
        const numerics::Nvfp4Search ps = numerics::nvfp4_search_tensor(
            spec.global_scale.has_value(), spec.global_scale.value_or(0.0f), spec.scale_search);
        TiledBlocks<16, 4>(x, b0, b1, packed, scales, [&](const T* xt, std::uint8_t* pt, std::uint8_t* st) HWY_ATTR {
          Nvfp4SearchTile(xt, ps, spec, src, pt, st);
        });
        break;
      }
      Nvfp4Blocks<kSat>(x, Nvfp4Factors(spec), b0, b1, packed, scales);
      break;
    }
    case Mode::mxfp4:
      if (spec.scale_search == ScaleSearch::mse) {
        TiledBlocks<32, 4>(x, b0, b1, packed, scales, [&](const T* xt, std::uint8_t* pt, std::uint8_t* st) HWY_ATTR {
          Mxfp4SearchTile(xt, spec, src, pt, st);
        });
        break;
      }
      MxBlocks<E2M1, kSat>(x, rule, src, b0, b1, packed, scales);
      break;
    case Mode::mxfp8:
      if (spec.elem == Elem::e5m2)
        MxBlocks<E5M2, kSat>(x, rule, src, b0, b1, packed, scales);
      else
        MxBlocks<E4M3, kSat>(x, rule, src, b0, b1, packed, scales);
      break;
    case Mode::affine: break;
  }
}

// ---- affine (FORMATS.md 2.3): one group at a time, min/max and codes in vectors ----

// Appends `bits`-wide codes to an LSB-first bit stream (whole bytes: n * bits % 8 == 0).
inline void PackBits(const std::int32_t* codes, int n, int bits, std::uint8_t* out) {
  std::uint64_t acc = 0;
  int filled = 0;
  for (int i = 0; i < n; ++i) {
    acc |= static_cast<std::uint64_t>(codes[i]) << filled;
    for (filled += bits; filled >= 8; filled -= 8, acc >>= 8) *out++ = static_cast<std::uint8_t>(acc);
  }
}

template <class T>
void AffineGroups(const T* x, const QuantSpec& spec, DType src, std::int64_t g0, std::int64_t g1, std::uint8_t* packed,
                  std::byte* scales, std::byte* biases) {
  const DF df;
  const DI di;
  const int gs = spec.group_size;
  const int bits = spec.bits;
  const std::size_t group_bytes = static_cast<std::size_t>(gs * bits / 8);
  const std::size_t ssize = dtype_size(src);
  const float n = numerics::affine_max_code(bits);
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
    const auto [scale, bias] = numerics::affine_scale_bias(wmin, wmax, bits);
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

inline void QuantizeBlocks(const void* x, DType src, const QuantSpec& spec, std::int64_t b0, std::int64_t b1,
                           std::uint8_t* packed, std::byte* scales, std::byte* biases) {
  // Searched scales: vectors under the finite-block policies, the scalar spec under 'saturate'.
  if (spec.scale_search != ScaleSearch::none && spec.nonfinite == NonFinite::saturate)
    return ReferenceBlocks(x, src, spec, b0, b1, packed, scales, biases);
  if (spec.sr_seed) return ReferenceBlocks(x, src, spec, b0, b1, packed, scales, biases);
  switch (src) {
    case DType::float16:
      return Blocks(static_cast<const hwy::float16_t*>(x), src, spec, b0, b1, packed, scales, biases);
    case DType::bfloat16:
      return Blocks(static_cast<const hwy::bfloat16_t*>(x), src, spec, b0, b1, packed, scales, biases);
    default: return Blocks(static_cast<const float*>(x), src, spec, b0, b1, packed, scales, biases);
  }
}

#endif  // HWY_TARGET == HWY_SCALAR

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MICROSCALE_CPU_QUANTIZE_INL_H_
