// Fused quantized GEMV of one target (Highway -inl.h, included per target):
// y[m, n] = sum_k x[m, k] W[n, k] for up to kGemvMaxRows rows of float32 x, W stored [N, K] with
// groups along K. Each weight is decoded in registers and multiplied there; nothing is decoded to
// a float buffer. Modes with a dedicated kernel: nvfp4 and mxfp4 (E2M1 by byte-table lookup),
// mxfp8 (E4M3 and E5M2 by shifting the code into f32 position) and affine with 4 or 8 bits; the
// other affine widths decode a slice of the row through dequantize, then take dot products.
//
// Summation (docs/numerics.md, "Matmuls"): each lane sums x times the exact element values
// (fp4: twice the values, integers, halved once at the end) over the part of a group it holds,
// then multiplies that partial sum by the group's float32 factor, exactly as dequantize forms it
// (affine: by the scale, with the bias times the sum of x added per group). The order is fixed
// by the shape, so results never depend on the thread count.

#if defined(MICROSCALE_CPU_GEMV_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MICROSCALE_CPU_GEMV_INL_H_
#undef MICROSCALE_CPU_GEMV_INL_H_
#else
#define MICROSCALE_CPU_GEMV_INL_H_
#endif

#include <hwy/aligned_allocator.h>
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/convert.hpp"
#include "cpu/dequantize-inl.h"
#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace microscale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int kRowsPerPass = 4;  // rows of x that share one decode of a weight row

// Rows per parallel chunk of W (codes, scales and biases per row decide it).
inline std::int64_t RowsPerChunk(const QuantizedMatrix& w) {
  const std::int64_t groups = w.cols / w.spec.group_size;
  const auto scale_bytes = static_cast<std::int64_t>(dtype_size(w.scale_dtype));
  return gemv_rows_per_chunk(w.rows, w.cols * w.spec.bits / 8 + groups * scale_bytes * (w.biases ? 2 : 1));
}

// Bytes of codes per decode step of the 4-bit kernels, and the weights they hold.
constexpr std::size_t kStepBytes = 4 * kN;
constexpr std::size_t kStepWeights = 8 * kN;

// Up to kRowsPerPass accumulators as named vectors (SVE allows no arrays of vectors):
// Rows<kM>(f) calls f(m) for m < kM with m a compile-time constant.
template <int kM, class F>
HWY_INLINE void Rows(const F& f) {
  f(std::integral_constant<int, 0>{});
  if constexpr (kM > 1) f(std::integral_constant<int, 1>{});
  if constexpr (kM > 2) f(std::integral_constant<int, 2>{});
  if constexpr (kM > 3) f(std::integral_constant<int, 3>{});
}
template <int kI>
HWY_INLINE VF& Pick(VF& v0, VF& v1, VF& v2, VF& v3) {
  if constexpr (kI == 0) return v0;
  if constexpr (kI == 1) return v1;
  if constexpr (kI == 2) return v2;
  if constexpr (kI == 3) return v3;
}

// ---- x, prepared once per call ----

// The 4-bit kernels decode a step of kStepWeights weights (kStepBytes code bytes) into eight
// vectors: the low nibbles (even weights) and the high nibbles (odd weights) are each looked up
// as one byte vector, whose bytes are then spread to 32-bit lanes by byte shuffles, which work
// within 128-bit blocks: lane i (0..3) of block b of vector j (0..3) takes byte 4j + i of block b.
// So lane 4b + i of vector v = 4 * high + j holds weight 32b + 8j + 2i + high of the step: in
// each block, a vector's weights lie in one group of 16 or more, and the factor vector of a group
// of vectors j holds one factor per block (see BlockFactors). Leaving the code bytes in memory
// order costs no cross-block shuffle per step.
// Index of weight k of a step in that order:
inline std::int64_t NibbleOrderIndex(std::int64_t k) {
  const std::int64_t b = k / 32, j = k / 8 % 4, i = k / 2 % 4, high = k % 2;
  return (4 * high + j) * static_cast<std::int64_t>(kN) + 4 * b + i;
}

// Rows of x times `scale` (a power of two) in nibble order, step by step, zero-padded to a whole
// number of steps.
inline hwy::AlignedFreeUniquePtr<float[]> NibbleOrder(const float* x, std::int64_t M, std::int64_t K, std::int64_t Kp,
                                                      float scale) {
  auto xd = hwy::AllocateAligned<float>(static_cast<std::size_t>(M * Kp));
  std::fill(xd.get(), xd.get() + M * Kp, 0.0f);
  constexpr auto S = static_cast<std::int64_t>(kStepWeights);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t k = 0; k < K; ++k)
      xd[static_cast<std::size_t>(m * Kp + k / S * S + NibbleOrderIndex(k % S))] = x[m * K + k] * scale;
  return xd;
}

// x as the fp4 kernel takes it: scaled by 2^-25 when that is exact for every x (no nonzero |x|
// below 2^-101), which lets the kernel multiply by 2v * 2^24, the int8 table value spread to
// the top byte, without shifting it down: the products x * 2^-25 * 2v * 2^24 are then exactly
// x * v, rounded once. Otherwise x unscaled against 2v, the sums halved at the end.
inline bool ScaleXForFp4(const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a != 0.0f && a < 0x1p-101f) return false;
  }
  return true;
}

// x as the mxfp8 kernel takes it: times 2^(127-B) (the decode's rebias), when no finite x
// overflows by it, so that every product is exact; empty otherwise (Inf and NaN scale to
// themselves).
inline std::vector<float> PrescaleForFp8(const float* x, std::int64_t n, float rebias) {
  const float limit = std::numeric_limits<float>::max() / rebias;  // exact: rebias is a power of 2
  for (std::int64_t i = 0; i < n; ++i)
    if (std::fabs(x[i]) > limit && std::isfinite(x[i])) return {};
  std::vector<float> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = x[i] * rebias;
  return out;
}

// Per row of x, the float32 sum of x over each group (affine's bias term), summed in k order.
inline std::vector<float> GroupSums(const float* x, std::int64_t M, std::int64_t K, std::int64_t gs) {
  std::vector<float> sums(static_cast<std::size_t>(M * (K / gs)), 0.0f);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t k = 0; k < K; ++k) sums[static_cast<std::size_t>(m * (K / gs) + k / gs)] += x[m * K + k];
  return sums;
}

#if HWY_TARGET != HWY_SCALAR  // the fused kernels; the scalar target takes the generic path

// ---- per weight row: factors ----

// Float32 factors of a row's groups, exactly as dequantize forms them: E4M3 block scale (times
// the three-level factor) for nvfp4, 2^(e-127) for mx. Entries [groups, padded) are 0.
template <bool kNv, bool kThreeLevel>
HWY_INLINE void DecodeFactors(const std::uint8_t* codes, std::int64_t groups, std::int64_t padded, float amax,
                              float* out) {
  const DF df;
  const VF vamax = hn::Set(df, amax), c2688 = hn::Set(df, f32_from_bits(kC2688Bits));
  auto decode = [&](const std::uint8_t* c, float* o) HWY_ATTR {
    VF f = kNv ? DecodeE4M3(LoadBytes(c)) : DecodeE8M0(LoadBytes(c));
    if constexpr (kThreeLevel) f = hn::Mul(hn::Mul(f, vamax), c2688);
    hn::StoreU(f, df, o);
  };
  std::int64_t g = 0;
  for (; g + static_cast<std::int64_t>(kN) <= groups; g += kN) decode(codes + g, out + g);
  if (g < groups) {
    alignas(64) std::uint8_t tail[kN] = {};
    std::memcpy(tail, codes + g, static_cast<std::size_t>(groups - g));
    decode(tail, out + g);
  }
  std::fill(out + groups, out + padded, 0.0f);
}

inline void DecodeFactors(const std::uint8_t* codes, std::int64_t groups, std::int64_t padded, const QuantSpec& s,
                          float* out) {
  if (s.mode != Mode::nvfp4) return DecodeFactors<false, false>(codes, groups, padded, 0.0f, out);
  if (s.global_scale) return DecodeFactors<true, true>(codes, groups, padded, *s.global_scale, out);
  DecodeFactors<true, false>(codes, groups, padded, 0.0f, out);
}

// n values of dtype t (float32, float16 or bfloat16) widened into out.
HWY_INLINE void ToF32(const std::byte* p, DType t, std::int64_t n, float* out) {
  std::int64_t i = 0;
  const auto L = static_cast<std::int64_t>(kN);
  for (; i + L <= n; i += L) {
    const VF v = t == DType::float32   ? Load(reinterpret_cast<const float*>(p) + i)
                 : t == DType::float16 ? Load(reinterpret_cast<const hwy::float16_t*>(p) + i)
                                       : Load(reinterpret_cast<const hwy::bfloat16_t*>(p) + i);
    hn::StoreU(v, DF(), out + i);
  }
  for (; i < n; ++i) out[i] = detail::load_f32(p + static_cast<std::size_t>(i) * dtype_size(t), t);
}

// ---- nvfp4 / mxfp4 ----

// Twice the E2M1 values, as int8: a byte-table lookup every target has.
alignas(16) constexpr std::int8_t kTwiceE2M1[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Byte-shuffle controls spreading bytes 4j .. 4j+3 of each 128-bit block to the top byte (kTop:
// signed values, then shifted down) or the low byte (unsigned) of the block's four 32-bit lanes;
// 0x80 selects zero.
struct Spreads {
  alignas(16) std::uint8_t top[4][16];
  alignas(16) std::uint8_t low[4][16];
};
constexpr Spreads MakeSpreads() {
  Spreads t{};
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 4; ++i)
      for (int byte = 0; byte < 4; ++byte) {
        t.top[j][4 * i + byte] = static_cast<std::uint8_t>(byte == 3 ? 4 * j + i : 0x80);
        t.low[j][4 * i + byte] = static_cast<std::uint8_t>(byte == 0 ? 4 * j + i : 0x80);
      }
  return t;
}
constexpr Spreads kSpreads = MakeSpreads();

// A factor vector whose lanes of block b (4 lanes, weights 32b .. 32b + 31 of a step) hold
// factor(b).
template <class FactorOfBlock>
HWY_INLINE VF BlockFactors(const FactorOfBlock& factor) {
  const DF df;
  if constexpr (kN == 4) {
    return hn::Set(df, factor(0));
  } else if constexpr (kN == 8) {
    const hn::Half<DF> dh;
    return hn::Combine(df, hn::Set(dh, factor(1)), hn::Set(dh, factor(0)));
  } else {
    alignas(64) float lanes[kN];
    for (std::size_t l = 0; l < kN; ++l) lanes[l] = factor(l / 4);
    return hn::Load(df, lanes);
  }
}

// The low and the high nibbles of kStepBytes code bytes, as byte vectors.
HWY_INLINE void Nibbles(const std::uint8_t* codes, hn::Vec<D8>& low, hn::Vec<D8>& high) {
  const D8 d8;
  const auto bytes = hn::LoadU(d8, codes);
  low = hn::And(bytes, hn::Set(d8, 0x0F));
  high = hn::And(hn::BitCast(d8, hn::ShiftRight<4>(hn::BitCast(D16(), bytes))), hn::Set(d8, 0x0F));
}

// Vector j of a looked-up nibble vector as float32: signed int8 values in the top byte of each
// lane (kShifted: moved down, the value itself; else the value times 2^24), or unsigned codes.
template <bool kShifted>
HWY_INLINE VF SpreadSigned(hn::Vec<D8> bytes, std::size_t j) {
  const VI spread = hn::BitCast(DI(), hn::TableLookupBytesOr0(bytes, hn::LoadDup128(D8(), kSpreads.top[j])));
  return hn::ConvertTo(DF(), kShifted ? hn::ShiftRight<24>(spread) : spread);
}
HWY_INLINE VF SpreadUnsigned(hn::Vec<D8> bytes, std::size_t j) {
  return hn::ConvertTo(DF(), hn::BitCast(DI(), hn::TableLookupBytesOr0(bytes, hn::LoadDup128(D8(), kSpreads.low[j]))));
}

// One step of a 4-bit row: for each group q of the step's vectors (kVecsPerGroup vectors j
// sharing one factor vector), t = sum over its vectors of x * value (low and high nibbles), then
// a += t * factor(q), with even q into the accumulators a and odd q into b, so that no dependency
// chain is longer than two of the step's groups. spread(bytes, j) gives vector j of a looked-up
// nibble vector as float32.
template <int kM, std::size_t kVecsPerGroup, class SpreadFn, class FactorFn>
HWY_INLINE void Step4(hn::Vec<D8> low, hn::Vec<D8> high, const float* x, std::int64_t Kp, const SpreadFn& spread,
                      const FactorFn& factor, VF& a0, VF& a1, VF& a2, VF& a3, VF& b0, VF& b1, VF& b2, VF& b3) {
  const DF df;
  for (std::size_t q = 0; q < 4 / kVecsPerGroup; ++q) {
    VF t0 = hn::Zero(df), t1 = t0, t2 = t0, t3 = t0;
    for (std::size_t j = q * kVecsPerGroup; j < (q + 1) * kVecsPerGroup; ++j) {
      const VF even = spread(low, j), odd = spread(high, j);
      Rows<kM>([&](auto m) HWY_ATTR {
        VF& t = Pick<decltype(m)::value>(t0, t1, t2, t3);
        t = hn::MulAdd(hn::Load(df, x + m * Kp + kN * j), even, t);
        t = hn::MulAdd(hn::Load(df, x + m * Kp + kN * (4 + j)), odd, t);
      });
    }
    const VF f = factor(q);
    Rows<kM>([&](auto m) HWY_ATTR {
      constexpr int kI = decltype(m)::value;
      VF& acc = q % 2 == 0 ? Pick<kI>(a0, a1, a2, a3) : Pick<kI>(b0, b1, b2, b3);
      acc = hn::MulAdd(Pick<kI>(t0, t1, t2, t3), f, acc);
    });
  }
}

// sums[m] = the lanes of a_m + b_m, summed.
template <int kM>
HWY_INLINE void StoreRowSums(VF a0, VF a1, VF a2, VF a3, VF b0, VF b1, VF b2, VF b3, float* sums) {
  const DF df;
  Rows<kM>([&](auto m) HWY_ATTR {
    constexpr int kI = decltype(m)::value;
    sums[kI] = hn::GetLane(hn::SumOfLanes(df, hn::Add(Pick<kI>(a0, a1, a2, a3), Pick<kI>(b0, b1, b2, b3))));
  });
}

// Sums of kM rows of x (nibble order, row stride Kp) against one nvfp4/mxfp4 weight row of Kp/2
// code bytes and Kp/G scale codes (the caller pads the last step: codes and scale codes 0), each
// scale code's factor read from `factor_of` (256 entries). kScaledX: x holds x * 2^-25 (see
// ScaleXForFp4) and the sums are the dot products; else they are twice them.
template <int kM, std::size_t G, bool kScaledX>
HWY_INLINE void Fp4Row(const std::uint8_t* codes, const std::uint8_t* scale_codes, const float* factor_of,
                       const float* xd, std::int64_t Kp, float* sums) {
  const DF df;
  const D8 d8;
  const auto table = hn::LoadDup128(d8, reinterpret_cast<const std::uint8_t*>(kTwiceE2M1));
  // A vector holds 2 kN weights: a part of one group, or two whole groups of 16 (16 lanes).
  // Vector j holds, in block b, weights 32b + 8j .. 32b + 8j + 7: those of G / 8 vectors share
  // their groups.
  constexpr std::size_t kVecsPerGroup = std::min<std::size_t>(4, G / 8);
  constexpr std::size_t kGroupsPerStep = kStepWeights / G;
  const auto spread = [](hn::Vec<D8> bytes, std::size_t j) HWY_ATTR { return SpreadSigned<!kScaledX>(bytes, j); };
  VF a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  // The next step's values are looked up before this step's products, so the long load-shuffle
  // chain overlaps the multiply-adds instead of holding them in the scheduler.
  const auto values = [&](const std::uint8_t* c, hn::Vec<D8>& low, hn::Vec<D8>& high) HWY_ATTR {
    Nibbles(c, low, high);
    low = hn::TableLookupBytes(table, low);
    high = hn::TableLookupBytes(table, high);
  };
  const std::uint8_t* const last = codes + Kp / 2 - kStepBytes;
  hn::Vec<D8> low, high;
  values(codes, low, high);
  for (const float* x = xd;; codes += kStepBytes, x += kStepWeights, scale_codes += kGroupsPerStep) {
    hwy::Prefetch(codes + 2048);
    hn::Vec<D8> next_low = low, next_high = high;
    if (codes != last) values(codes + kStepBytes, next_low, next_high);
    const auto factor = [&](std::size_t q) HWY_ATTR {
      return BlockFactors([&](std::size_t b) { return factor_of[scale_codes[(32 * b + 8 * kVecsPerGroup * q) / G]]; });
    };
    Step4<kM, kVecsPerGroup>(low, high, x, Kp, spread, factor, a0, a1, a2, a3, b0, b1, b2, b3);
    if (codes == last) break;
    low = next_low;
    high = next_high;
  }
  StoreRowSums<kM>(a0, a1, a2, a3, b0, b1, b2, b3, sums);
}

// Two weight rows of 4-bit codes against one row of x in nibble order (mxfp4 and affine 4-bit;
// codes1: the second row; `ahead`: how far past each code pointer to prefetch, the next pair of
// rows). values(nibbles) gives the bytes that spread(bytes, j) turns into vector j of float32
// values; each call of factor0() / factor1() the factor vector of the row's next step, whose
// block b lies in one group (see NibbleOrderIndex). Both rows share each load of x, and their
// independent chains give the out-of-order core twice the work per step to overlap the decode
// with: 4-5% less time per weight for mxfp4 and affine 4-bit on a weight held in L3 (AVX2,
// Zen 3). For nvfp4 (two factors per block and step) a pair ran 1-8% slower, GCC spilling its
// sums to the stack, so it keeps Fp4Row. (Decoding the even nibbles of both rows before the odd
// ones kept the sums in registers but halved the chains in flight: 8% slower.)
template <class ValuesFn, class SpreadFn, class FactorFn0, class FactorFn1>
HWY_INLINE void Nibble4RowPair(const std::uint8_t* codes0, const std::uint8_t* codes1, const float* xd, std::int64_t Kp,
                               std::int64_t ahead, const ValuesFn& values, const SpreadFn& spread, FactorFn0 factor0,
                               FactorFn1 factor1, float* sums) {
  const DF df;
  VF a0 = hn::Zero(df), a1 = a0;  // the sums of row 0 and row 1
  const std::uint8_t* const end = codes0 + Kp / 2;
  for (const float* x = xd; codes0 != end; codes0 += kStepBytes, codes1 += kStepBytes, x += kStepWeights) {
    // Into L2 only (locality 2): on Zen 4 cold mxfp4 and affine 4-bit ran 4-12% faster than with
    // an L1 prefetch, while nvfp4's Fp4Row ran 5-20% slower and keeps it.
    __builtin_prefetch(codes0 + ahead, 0, 2);
    __builtin_prefetch(codes1 + ahead, 0, 2);
    hn::Vec<D8> low0, high0, low1, high1;
    Nibbles(codes0, low0, high0);
    Nibbles(codes1, low1, high1);
    low0 = values(low0);
    high0 = values(high0);
    low1 = values(low1);
    high1 = values(high1);
    // t: row 0, u: row 1; even and odd nibbles in separate chains.
    VF t0 = hn::Zero(df), t1 = t0, u0 = t0, u1 = t0;
    for (std::size_t j = 0; j < 4; ++j) {
      const VF x_even = hn::Load(df, x + kN * j), x_odd = hn::Load(df, x + kN * (4 + j));
      t0 = hn::MulAdd(x_even, spread(low0, j), t0);
      u0 = hn::MulAdd(x_even, spread(low1, j), u0);
      t1 = hn::MulAdd(x_odd, spread(high0, j), t1);
      u1 = hn::MulAdd(x_odd, spread(high1, j), u1);
    }
    a0 = hn::MulAdd(hn::Add(t0, t1), factor0(), a0);
    a1 = hn::MulAdd(hn::Add(u0, u1), factor1(), a1);
  }
  sums[0] = hn::GetLane(hn::SumOfLanes(df, a0));
  sums[1] = hn::GetLane(hn::SumOfLanes(df, a1));
}

// ---- mxfp8 ----

// Sums of kM rows of x (natural order, stride K) against one mxfp8 row, decoding codes as if
// none were NaN or Inf. kPrescaled: x holds x * 2^(127-B) (see PrescaleForFp8), so the decoded
// bits multiply it directly: the products are exactly x * v, rounded once. Returns whether some code was (the caller
// then recomputes the row exactly): E4M3 0x7F and 0xFF, E5M2 0x7C .. 0x7F and 0xFC .. 0xFF, found from the codes'
// largest signed and unsigned bytes.
template <int kM, bool kE5M2, bool kPrescaled>
HWY_INLINE bool Fp8Row(const std::uint8_t* codes, const float* factors, const float* x, std::int64_t K, float* sums) {
  const DF df;
  const hn::Repartition<std::int8_t, DF> di8;
  constexpr int M = kE5M2 ? 2 : 3, B = kE5M2 ? 15 : 7;
  constexpr auto kBytes = static_cast<std::int64_t>(hn::MaxLanes(hn::Repartition<std::int8_t, DF>()));
  static_assert(64 % kBytes == 0, "byte vectors tile 64 codes");
  VF a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0;
  auto max_signed = hn::Set(di8, -128);
  auto max_unsigned = hn::Zero(D8());
  auto track = [&](const std::uint8_t* c) HWY_ATTR {
    max_signed = hn::Max(max_signed, hn::LoadU(di8, reinterpret_cast<const std::int8_t*>(c)));
    max_unsigned = hn::Max(max_unsigned, hn::LoadU(D8(), c));
  };
  // One group of 32 weights at k0: t = sum of x * value, then acc += t * factor.
  auto group = [&](std::int64_t k0) HWY_ATTR {
    VF t0 = hn::Zero(df), t1 = t0, t2 = t0, t3 = t0;
    for (std::size_t k = 0; k < 32; k += kN) {
      VF v = MinifloatBitsSigned<M>(
          hn::PromoteTo(DI(), hn::LoadU(DQI8(), reinterpret_cast<const std::int8_t*>(codes + k0 + k))));
      if constexpr (!kPrescaled) v = hn::Mul(v, hn::Set(df, numerics::pow2(127 - B)));
      Rows<kM>([&](auto m) HWY_ATTR {
        VF& t = Pick<decltype(m)::value>(t0, t1, t2, t3);
        t = hn::MulAdd(hn::LoadU(df, x + m * K + k0 + k), v, t);
      });
    }
    const VF f = hn::Set(df, factors[k0 / 32]);
    Rows<kM>([&](auto m) HWY_ATTR {
      VF& a = Pick<decltype(m)::value>(a0, a1, a2, a3);
      a = hn::MulAdd(Pick<decltype(m)::value>(t0, t1, t2, t3), f, a);
    });
  };
  // Two groups per iteration halve the loop overhead; the special-code tracking covers 64 bytes.
  // Codes are prefetched a 4096-weight row ahead (2 KiB left the cold GEMV 10-15% slower on an
  // Ice Lake, AVX-512 and AVX2 alike), into L2 only (locality 2, prefetcht1 on x86): on Zen 4 the
  // cold GEMV ran 7-10% faster than with prefetcht0 on both targets.
  std::int64_t k0 = 0;
  for (; k0 + 64 <= K; k0 += 64) {
    __builtin_prefetch(codes + k0 + 4096, 0, 2);
    for (std::int64_t b = 0; b < 64; b += kBytes) track(codes + k0 + b);
    group(k0);
    group(k0 + 32);
  }
  const std::int64_t tracked = k0;  // codes [0, tracked) went through track()
  if (k0 < K) group(k0);            // K is a multiple of 32: at most one group left
  Rows<kM>([&](auto m)
               HWY_ATTR { sums[m] = hn::GetLane(hn::SumOfLanes(df, Pick<decltype(m)::value>(a0, a1, a2, a3))); });
  constexpr int kHigh = kE5M2 ? 0x7B : 0x7E;  // magnitudes above it are special
  for (std::int64_t k = tracked; k < K; ++k)
    if ((codes[k] & 0x7F) > kHigh) return true;
  // Positive codes: the largest signed byte; negative ones: the largest unsigned byte, less 0x80.
  const auto negatives = hn::BitCast(di8, hn::Xor(max_unsigned, hn::Set(D8(), 0x80)));
  return !hn::AllFalse(di8, hn::Gt(hn::Max(max_signed, negatives), hn::Set(di8, kHigh)));
}

// ---- affine, 4 and 8 bits: sum over groups of scale * sum_k x_k q_k ----
// (the caller adds each group's bias times its sum of x)

// The factor vector of an affine 4-bit step at weight s (see NibbleOrderIndex): lanes of block b
// take the scale of weight s + 32b's group. Groups (32, 64 or 128 weights) hold whole blocks of a
// step; scales is zero-padded past the padding of the last step.
HWY_INLINE VF AffineStepFactors(const float* scales, std::int64_t s, int log2_gs) {
  const DF df;
  if ((std::int64_t{1} << log2_gs) >= static_cast<std::int64_t>(kStepWeights))  // the step lies in one group
    return hn::Set(df, scales[s >> log2_gs]);
  if constexpr (kN > 8) {  // lane l: the step's group (32 (l / 4)) >> log2_gs, by a lane permute
    const DI di;
    const VI group = hn::ShiftRightSame(hn::ShiftLeft<3>(hn::And(hn::Iota(di, 0), hn::Set(di, ~3))), log2_gs);
    return hn::TableLookupLanes(hn::LoadU(df, scales + (s >> log2_gs)), hn::IndicesFromVec(df, group));
  }
  return BlockFactors([&](std::size_t b) { return scales[(s + static_cast<std::int64_t>(32 * b)) >> log2_gs]; });
}

// 4-bit codes (low nibble first, as fp4) against x in nibble order, with the row's scales
// (zero-padded past the padding of the last step): the step's four vectors j share one factor
// vector.
template <int kM>
HWY_INLINE void Affine4Row(const std::uint8_t* codes, const float* scales, std::int64_t gs, const float* xd,
                           std::int64_t Kp, float* sums) {
  const DF df;
  const auto spread = [](hn::Vec<D8> bytes, std::size_t j) HWY_ATTR { return SpreadUnsigned(bytes, j); };
  const int log2_gs = std::countr_zero(static_cast<std::uint64_t>(gs));
  constexpr auto kStep = static_cast<std::int64_t>(kStepWeights);
  VF a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  hn::Vec<D8> low, high;
  Nibbles(codes, low, high);
  for (std::int64_t s = 0;; s += kStep) {            // the next step's nibbles ahead, as in Fp4Row
    __builtin_prefetch(codes + s / 2 + 2048, 0, 2);  // into L2, as in Nibble4RowPair
    hn::Vec<D8> next_low = low, next_high = high;
    if (s + kStep != Kp) Nibbles(codes + (s + kStep) / 2, next_low, next_high);
    const auto factor = [&](std::size_t) HWY_ATTR { return AffineStepFactors(scales, s, log2_gs); };
    Step4<kM, 4>(low, high, xd + s, Kp, spread, factor, a0, a1, a2, a3, b0, b1, b2, b3);
    if (s + kStep == Kp) break;
    low = next_low;
    high = next_high;
  }
  StoreRowSums<kM>(a0, a1, a2, a3, b0, b1, b2, b3, sums);
}

// 8-bit codes against x in natural order.
template <int kM>
HWY_INLINE void Affine8Row(const std::uint8_t* codes, const float* scales, std::int64_t gs, const float* x,
                           std::int64_t K, float* sums) {
  const DF df;
  VF a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0;
  for (std::int64_t k0 = 0; k0 < K; k0 += gs) {
    VF t0 = hn::Zero(df), t1 = t0, t2 = t0, t3 = t0;
    for (std::int64_t k1 = k0; k1 < k0 + gs; k1 += 32) {  // groups are whole multiples of 32
      hwy::Prefetch(codes + k1 + 2048);
      for (std::size_t k = 0; k < 32; k += kN) {
        const VF q = hn::ConvertTo(df, hn::BitCast(DI(), hn::PromoteTo(DU(), hn::LoadU(DQ8(), codes + k1 + k))));
        Rows<kM>([&](auto m) HWY_ATTR {
          VF& t = Pick<decltype(m)::value>(t0, t1, t2, t3);
          t = hn::MulAdd(hn::LoadU(df, x + m * K + k1 + k), q, t);
        });
      }
    }
    const VF f = hn::Set(df, scales[k0 / gs]);
    Rows<kM>([&](auto m) HWY_ATTR {
      VF& a = Pick<decltype(m)::value>(a0, a1, a2, a3);
      a = hn::MulAdd(Pick<decltype(m)::value>(t0, t1, t2, t3), f, a);
    });
  }
  Rows<kM>([&](auto m)
               HWY_ATTR { sums[m] = hn::GetLane(hn::SumOfLanes(df, Pick<decltype(m)::value>(a0, a1, a2, a3))); });
}

#endif  // HWY_TARGET != HWY_SCALAR

// ---- any mode: a slice of the row decoded through dequantize, then dot products ----

HWY_INLINE float Dot(const float* a, const float* b, std::int64_t n) {
  const DF df;
  const auto L = static_cast<std::int64_t>(kN);
  VF s0 = hn::Zero(df), s1 = s0;
  std::int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(df, a + i + L), hn::LoadU(df, b + i + L), s1);
  }
  for (; i + L <= n; i += L) s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
  float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(s0, s1)));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Exact float32 values of W[r, c0 : c0 + n) (c0 and n multiples of the group) into out.
HWY_INLINE void DecodeRow(const QuantizedMatrix& w, std::int64_t r, std::int64_t c0, std::int64_t n, float* out) {
  const std::int64_t g = w.spec.group_size;
  const std::int64_t first = r * (w.cols / g) + c0 / g;
  const std::size_t ss = dtype_size(w.scale_dtype);
  DequantizeBlocks(w.packed + first * g * w.spec.bits / 8, w.scales + static_cast<std::size_t>(first) * ss,
                   w.biases ? w.biases + static_cast<std::size_t>(first) * ss : nullptr, w.scale_dtype, w.spec,
                   DType::float32, 0, n / g, reinterpret_cast<std::byte*>(out));
}

constexpr std::int64_t kSlice = 1024;  // values of a row decoded at a time by the generic path

template <int kM>
HWY_INLINE void GenericRow(const QuantizedMatrix& w, std::int64_t n, const float* x, float* slice, float* sums) {
  const std::int64_t K = w.cols;
  for (int m = 0; m < kM; ++m) sums[m] = 0.0f;
  for (std::int64_t k0 = 0; k0 < K; k0 += kSlice) {
    const std::int64_t kc = std::min(kSlice, K - k0);
    DecodeRow(w, n, k0, kc, slice);
    for (int m = 0; m < kM; ++m) sums[m] += Dot(x + m * K + k0, slice, kc);
  }
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// An extra 16-lane path for nvfp4 / mxfp4 behind the same dispatch (raw AVX-512: vpermps reading only the low 4 bits of
// an index is what makes the decode cheap, and Highway's table lookups require in-range indices). E2M1 codes index a
// 16-entry float table directly, against x rearranged once per call to match the order the codes arrive in. Shuffles
// bound this loop on Zen 4 (dropping the byte-to-dword widening took it from 1.8 to 1.3 ns per 32 weights), so the
// layout needs no other shuffle per code. Scale factors for 16 groups are decoded in one vector and spread to the lanes
// of their group by a table lookup.

// Float32 scale factors of 16 consecutive groups from their code bytes: E4M3 for nvfp4 (times
// the three-level factor exactly as dequantize forms it), E8M0 for mx.
HWY_INLINE __m512 ScaleFactors16(const std::uint8_t* codes, const QuantSpec& s) {
  const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  const __m512 nan = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000));
  if (s.mode == Mode::nvfp4) {
    // The E4M3 magnitude bits placed at the f32 exponent/mantissa position are its value times
    // 2^-120 (a subnormal f32 for subnormal codes), so one exact multiply rebiases them.
    const __m512i magnitude = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
    const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
    const __m512i bits =  // magnitude << 20 | (c << 24 & sign)
        _mm512_ternarylogic_epi32(_mm512_slli_epi32(magnitude, 20), _mm512_slli_epi32(c, 24), sign, 0xF8);
    __m512 sf = _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0x1p120f));
    sf = _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(magnitude, _mm512_set1_epi32(0x7F)), sf, nan);
    if (s.global_scale)
      sf = _mm512_mul_ps(_mm512_mul_ps(sf, _mm512_set1_ps(*s.global_scale)), _mm512_set1_ps(f32_from_bits(kC2688Bits)));
    return sf;
  }
  // 2^(c - 127) from its bits; c = 0 is the subnormal 2^-127, c = 255 NaN.
  __m512i bits = _mm512_slli_epi32(c, 23);
  bits =
      _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(c, _mm512_setzero_si512()), bits, _mm512_set1_epi32(0x00400000));
  return _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(c, _mm512_set1_epi32(0xFF)), _mm512_castsi512_ps(bits), nan);
}

// The E4M3 values of 16 scale codes, for rows without a NaN code (AnyNanScale): the sign-extended
// code shifted left by 20, with the sign's copies above bit 27 masked off, is the value times
// 2^-120, as in ScaleFactors16, in three operations where that takes five and a NaN blend.
HWY_INLINE __m512 E4M3Values16(const std::uint8_t* codes) {
  const __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  const __m512i bits = _mm512_and_si512(_mm512_slli_epi32(c, 20), _mm512_set1_epi32(static_cast<int>(0x87F00000u)));
  return _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0x1p120f));
}

// Whether n E4M3 scale codes hold a NaN (0x7F or 0xFF).
HWY_INLINE bool AnyNanScale(const std::uint8_t* codes, std::int64_t n) {
  const __m512i magnitude = _mm512_set1_epi8(0x7F);
  __mmask64 nan = 0;
  for (std::int64_t i = 0; i < n; i += 64) {
    const __mmask64 in_range = n - i >= 64 ? ~__mmask64{0} : (__mmask64{1} << (n - i)) - 1;
    const __m512i c = _mm512_and_si512(_mm512_maskz_loadu_epi8(in_range, codes + i), magnitude);
    nan |= _mm512_mask_cmpeq_epi8_mask(in_range, c, magnitude);
  }
  return nan != 0;
}

// Where x[k] goes in the deinterleaved copy, given the row's 128-value blocks end at k128.
//  - Inside a 128-value block, 64 code bytes load as 16 dwords with no shuffle: dword l holds the
//    8 codes of k = 8l .. 8l+7, and shifting it right by 4j leaves code 8l+j in its low 4 bits,
//    which is all vpermps reads. So x goes to [j][l] = x[8l + j].
//  - The remaining 32-value chunks load 16 bytes widened to dwords: low nibbles are even k, high
//    nibbles odd k, so x goes to [x0 x2 .. x30 | x1 x3 .. x31].
inline std::int64_t DeinterleavedIndex(std::int64_t k, std::int64_t k128) {
  if (k < k128) return k / 128 * 128 + (k % 8) * 16 + (k % 128) / 8;
  return k / 32 * 32 + (k % 2) * 16 + (k % 32) / 2;
}

// Lane -> group of a 128-value block within the 16 groups whose factors are in one vector:
// nvfp4 (16 per group) blocks b = 0, 1 use groups 8b + l/2; mx (32 per group) blocks b = 0..3
// use groups 4b + l/4.
struct SpreadTables {
  HWY_ALIGN std::uint32_t nvfp4[2][16];
  HWY_ALIGN std::uint32_t mx[4][16];
  HWY_ALIGN std::uint32_t nvfp4_chunk[16];  // a 32-value chunk: groups 0 (lanes 0-7) and 1
};
constexpr SpreadTables MakeSpreadTables() {
  SpreadTables t{};
  for (std::uint32_t l = 0; l < 16; ++l) {
    for (std::uint32_t b = 0; b < 2; ++b) t.nvfp4[b][l] = 8 * b + l / 2;
    for (std::uint32_t b = 0; b < 4; ++b) t.mx[b][l] = 4 * b + l / 4;
    t.nvfp4_chunk[l] = l / 8;
  }
  return t;
}
constexpr SpreadTables kSpread = MakeSpreadTables();

// Float32 factors of groups [g, g + 16) of a row, zero-padded past its last group: as dequantize
// forms them, or (kE4M3Values) the nvfp4 E4M3 values alone.
template <bool kE4M3Values>
HWY_INLINE __m512 RowFactors(const std::uint8_t* row_codes, std::int64_t groups, std::int64_t g, const QuantSpec& s) {
  if (groups - g >= 16) return kE4M3Values ? E4M3Values16(row_codes + g) : ScaleFactors16(row_codes + g, s);
  HWY_ALIGN std::uint8_t tail[16] = {};
  std::memcpy(tail, row_codes + g, static_cast<std::size_t>(groups - g));
  return kE4M3Values ? E4M3Values16(tail) : ScaleFactors16(tail, s);
}

// Rows [n0, n1) of an nvfp4 / mxfp4 W against Products::kM rows of x. Per 128-value block,
// products.Block gives each row of x its lane sums of x times E2M1 values, and acc += sums *
// (factor of each lane's group); products.Chunk does the same for the 32-value chunks after the
// last block. kE4M3Values (nvfp4 rows without a NaN scale code): the factors are the E4M3 values,
// and each row's sum is multiplied by row_factor (GemvFp4Avx512 says when).
template <bool kNv, bool kE4M3Values, class Products>
HWY_INLINE void Fp4Rows(const Products& products, const QuantizedMatrix& w, float row_factor, std::int64_t n0,
                        std::int64_t n1, const float* bias, float* y) {
  constexpr int kM = Products::kM;
  constexpr std::int64_t kGroup = kNv ? numerics::kNvfp4Group : numerics::kMxGroup;
  constexpr std::int64_t kBlocksPerFactors = kNv ? 2 : 4;  // 128-value blocks covered by 16 groups
  const std::int64_t K = w.cols, N = w.rows;
  const std::int64_t groups = K / kGroup;
  const std::int64_t blocks = K / 128;
  const std::uint32_t(*spread)[16] = kNv ? kSpread.nvfp4 : kSpread.mx;
  for (std::int64_t n = n0; n < n1; ++n) {
    const std::uint8_t* p = w.packed + n * (K / 2);
    const std::uint8_t* sc = reinterpret_cast<const std::uint8_t*>(w.scales) + n * groups;
    __m512 acc[kM], sums[kM];
    for (int m = 0; m < kM; ++m) acc[m] = _mm512_setzero_ps();
    for (std::int64_t b0 = 0; b0 < blocks; b0 += kBlocksPerFactors) {
      const __m512 factors = RowFactors<kE4M3Values>(sc, groups, b0 * 128 / kGroup, w.spec);
      _mm_prefetch(reinterpret_cast<const char*>(sc + b0 * 128 / kGroup + 512), _MM_HINT_T0);
      const std::int64_t b1 = std::min(blocks, b0 + kBlocksPerFactors);
      for (std::int64_t b = b0; b < b1; ++b) {
        const __m512 f = _mm512_permutexvar_ps(_mm512_load_si512(spread[b - b0]), factors);
        // Software prefetch a few KB ahead: one core's hardware prefetch alone left the DRAM
        // stream short of the two-thread bandwidth. Into L2 only: cold GEMVs on Zen 4 ran 10-17%
        // faster than with prefetcht0 once the compute came near the memory time (EXPERIMENTS.md).
        _mm_prefetch(reinterpret_cast<const char*>(p + b * 64 + 4096), _MM_HINT_T1);
        // Held opaque in a register: GCC would otherwise fold this load into each shift of the
        // codes, and Zen 4 issues one 512-bit load per cycle (with 8 of x per block, loads then
        // bound the float32 loop; in L2 this took it from 84.7 to 79.7 us, nvfp4 448 x 4096).
        __m512i codes = _mm512_loadu_si512(p + b * 64);
        asm("" : "+v"(codes));
        products.Block(b, codes, sums);
        for (int m = 0; m < kM; ++m) acc[m] = _mm512_fmadd_ps(sums[m], f, acc[m]);
      }
    }
    if constexpr (Products::kChunks) {
      for (std::int64_t c = blocks * 4; c < K / 32; ++c) {
        const __m512 chunk_factors = RowFactors<kE4M3Values>(sc, groups, c * 32 / kGroup, w.spec);
        const __m512 f = kNv ? _mm512_permutexvar_ps(_mm512_load_si512(kSpread.nvfp4_chunk), chunk_factors)
                             : _mm512_permutexvar_ps(_mm512_setzero_si512(), chunk_factors);
        products.Chunk(c, p, sums);
        for (int m = 0; m < kM; ++m) acc[m] = _mm512_fmadd_ps(sums[m], f, acc[m]);
      }
    }
    for (int m = 0; m < kM; ++m) {
      float v = _mm512_reduce_add_ps(acc[m]);
      if constexpr (kE4M3Values) v *= row_factor;
      y[m * N + n] = bias ? v + bias[n] : v;
    }
  }
}

// Float32 x laid out by DeinterleavedIndex (kM rows, row stride K): the values are looked up as
// float32 and multiplied by x with FMAs.
template <int kM_>
struct Fp32Products {
  static constexpr int kM = kM_;
  static constexpr bool kChunks = true;
  const float* xd;
  std::int64_t K;
  __m512 table = _mm512_load_ps(numerics::kE2M1Values);

  HWY_INLINE void Block(std::int64_t b, __m512i codes, __m512 (&sums)[kM]) const {
    // Two partial sums per row of x halve the FMA dependency chain of a block.
    __m512 t0[kM], t1[kM];
    auto step = [&](auto j) HWY_ATTR {
      constexpr int kJ = decltype(j)::value;
      const __m512 v = _mm512_permutexvar_ps(kJ ? _mm512_srli_epi32(codes, 4 * kJ) : codes, table);
      for (int m = 0; m < kM; ++m) {
        const __m512 xj = _mm512_load_ps(xd + m * K + b * 128 + 16 * kJ);
        __m512& t = kJ % 2 ? t1[m] : t0[m];
        t = kJ < 2 ? _mm512_mul_ps(xj, v) : _mm512_fmadd_ps(xj, v, t);
      }
    };
    step(std::integral_constant<int, 0>{}), step(std::integral_constant<int, 1>{});
    step(std::integral_constant<int, 2>{}), step(std::integral_constant<int, 3>{});
    step(std::integral_constant<int, 4>{}), step(std::integral_constant<int, 5>{});
    step(std::integral_constant<int, 6>{}), step(std::integral_constant<int, 7>{});
    for (int m = 0; m < kM; ++m) sums[m] = _mm512_add_ps(t0[m], t1[m]);
  }

  // The 32-value chunk c of a row whose codes start at p (K not a multiple of 128).
  HWY_INLINE void Chunk(std::int64_t c, const std::uint8_t* p, __m512 (&sums)[kM]) const {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + c * 16)));
    const __m512 even = _mm512_permutexvar_ps(bytes, table);
    const __m512 odd = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
    for (int m = 0; m < kM; ++m)
      sums[m] = _mm512_fmadd_ps(_mm512_load_ps(xd + m * K + c * 32 + 16), odd,
                                _mm512_mul_ps(_mm512_load_ps(xd + m * K + c * 32), even));
  }
};

template <int kM, bool kNv, bool kE4M3Values>
void GemvRowsFp4Avx512(const float* xd, const QuantizedMatrix& w, float row_factor, std::int64_t n0, std::int64_t n1,
                       const float* bias, float* y) {
  Fp4Rows<kNv, kE4M3Values>(Fp32Products<kM>{xd, w.cols}, w, row_factor, n0, n1, bias, y);
}

// bfloat16 activations on AVX512_BF16 CPUs (Zen 4, Sapphire Rapids): when every x is a bfloat16
// value (its low 16 bits zero, as for activations that came as bfloat16), vdpbf16ps multiplies
// pairs of x by pairs of E2M1 values looked up as bfloat16: 3 word shifts and 4 vpermw per 128
// weights where the float32 path takes 7 shifts and 8 vpermps. Each product is exact and rounded
// once into the lane's sum. The instruction reads subnormal inputs as 0 and flushes subnormal
// sums to 0, so it is taken only where every nonzero |x| is at least 2^-118 (and finite): x is
// then a multiple of 2^-125 and each value one of 2^-1, so every product and partial sum is a
// multiple of 2^-126 and none is subnormal. K is a multiple of 128.

// Whether the CPU has AVX512_BF16 (Highway's AVX3_DL target does not imply it).
inline bool CpuHasAvx512Bf16() {
  static const bool has = [] {
    __builtin_cpu_init();  // also when first called from a constructor
    return __builtin_cpu_supports("avx512bf16") != 0;
  }();
  return has;
}

// The E2M1 values as bfloat16, twice (vpermw reads 5 index bits).
struct Bf16E2M1Table {
  HWY_ALIGN std::uint16_t words[32];
};
constexpr Bf16E2M1Table MakeBf16E2M1Table() {
  Bf16E2M1Table t{};
  for (int i = 0; i < 32; ++i)
    t.words[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(numerics::kE2M1Values[i % 16]) >> 16);
  return t;
}
constexpr Bf16E2M1Table kBf16E2M1 = MakeBf16E2M1Table();

// Whether every x qualifies for the bfloat16 path (see above).
inline bool Bf16Activations(const float* x, std::int64_t n) {
  bool ok = true;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(x[i]);
    const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
    ok &= (bits & 0xFFFFu) == 0 && (magnitude == 0 || (magnitude >= 0x04800000u && magnitude < 0x7F800000u));
  }
  return ok;
}

// Where x[k] goes among the bfloat16 pairs: in the 128-value block of k, vector j = k % 4 of 32
// words, whose dword i pairs x[8i + j] (even word) with x[8i + 4 + j], as the codes' 16-bit words
// shifted right by 4j put code 8i + j and 8i + 4 + j in the words of dword i.
inline std::int64_t Bf16PairIndex(std::int64_t k) {
  const std::int64_t r = k % 128, i = r / 8, j = r % 4, odd = (r % 8) / 4;
  return k - r + 32 * j + 2 * i + odd;
}

#if HWY_TARGET == HWY_AVX3_DL
#define MICROSCALE_ATTR_BF16 __attribute__((target("avx512bf16")))
// bfloat16 x laid out by Bf16PairIndex (kM rows, row stride K, K a multiple of 128). Block is not
// HWY_INLINE: GCC would refuse to force it into Fp4Rows, whose own target lacks avx512bf16; it
// is inlined once Fp4Rows is, into GemvRowsFp4Bf16.
template <int kM_>
struct Bf16Products {
  static constexpr int kM = kM_;
  static constexpr bool kChunks = false;
  const std::uint16_t* xb;
  std::int64_t K;
  __m512i table = _mm512_load_si512(kBf16E2M1.words);

  MICROSCALE_ATTR_BF16 void Block(std::int64_t b, __m512i codes, __m512 (&sums)[kM]) const {
    const __m512bh v0 = (__m512bh)_mm512_permutexvar_epi16(codes, table);
    const __m512bh v1 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(codes, 4), table);
    const __m512bh v2 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(codes, 8), table);
    const __m512bh v3 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(codes, 12), table);
    for (int m = 0; m < kM; ++m) {
      const std::uint16_t* xm = xb + m * K + b * 128;
      auto x_vec = [&](int j) HWY_ATTR MICROSCALE_ATTR_BF16 { return (__m512bh)_mm512_load_si512(xm + 32 * j); };
      __m512 t0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), v0, x_vec(0));
      __m512 t1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), v1, x_vec(1));
      t0 = _mm512_dpbf16_ps(t0, v2, x_vec(2));
      t1 = _mm512_dpbf16_ps(t1, v3, x_vec(3));
      sums[m] = _mm512_add_ps(t0, t1);
    }
  }
};

template <int kM, bool kNv, bool kE4M3Values>
MICROSCALE_ATTR_BF16 void GemvRowsFp4Bf16(const std::uint16_t* xb, const QuantizedMatrix& w, float row_factor,
                                          std::int64_t n0, std::int64_t n1, const float* bias, float* y) {
  Fp4Rows<kNv, kE4M3Values>(Bf16Products<kM>{xb, w.cols}, w, row_factor, n0, n1, bias, y);
}
#endif

// x rearranged once per call for the AVX-512 path, then rows of x in passes of up to 4.
inline void GemvFp4Avx512(const float* x, std::int64_t M, const QuantizedMatrix& w, const float* bias, float* y) {
  const std::int64_t K = w.cols, N = w.rows;
#if HWY_TARGET == HWY_AVX3_DL
  const bool bf16 = K % 128 == 0 && CpuHasAvx512Bf16() && Bf16Activations(x, M * K);
#else
  constexpr bool bf16 = false;
#endif
  hwy::AlignedFreeUniquePtr<float[]> xd;
  hwy::AlignedFreeUniquePtr<std::uint16_t[]> xb;
  if (bf16) {
    xb = hwy::AllocateAligned<std::uint16_t>(static_cast<std::size_t>(M * K));
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t k = 0; k < K; ++k)
        xb[static_cast<std::size_t>(m * K + Bf16PairIndex(k))] =
            static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x[m * K + k]) >> 16);
  } else {
    xd = hwy::AllocateAligned<float>(static_cast<std::size_t>(M * K));
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t k = 0; k < K; ++k)
        xd[static_cast<std::size_t>(m * K + DeinterleavedIndex(k, K / 128 * 128))] = x[m * K + k];
  }
  const bool nv = w.spec.mode == Mode::nvfp4;
  bool x_moderate = true;  // every |x| <= 2^64 (false for NaN)
  if (nv)
    for (std::int64_t i = 0; i < M * K; ++i) x_moderate &= std::fabs(x[i]) <= 0x1p64f;
  // nvfp4 factors as E4M3 values, each row's sum times amax * C2688 (1 when two-level): two
  // multiplies and the NaN blend fewer per 16 groups. In exact arithmetic that is dequantize's
  // factor (val(s) * amax) * C2688; in float32 the two differ by three roundings at most (under
  // 2^-22 relative per product, docs/numerics.md). Taken where neither form can overflow or lose
  // bits to underflow: amax in [2^-64, 2^64] and every |x| <= 2^64 (all real checkpoints and
  // activations), in thread chunks without a NaN scale code; elsewhere the exact factors.
  const std::optional<float>& amax = w.spec.global_scale;
  const bool values = nv && x_moderate && (!amax || (*amax >= 0x1p-64f && *amax <= 0x1p64f));
  const float row_factor = amax ? *amax * f32_from_bits(kC2688Bits) : 1.0f;
  const std::int64_t groups = K / numerics::kNvfp4Group;
  parallel_for(N, RowsPerChunk(w), [&](std::int64_t n0, std::int64_t n1) {
    const bool chunk_values =
        values && !AnyNanScale(reinterpret_cast<const std::uint8_t*>(w.scales) + n0 * groups, (n1 - n0) * groups);
    for (std::int64_t m0 = 0; m0 < M; m0 += kRowsPerPass) {
      float* ym = y + m0 * N;
      auto rows = [&](auto m) HWY_ATTR {
        constexpr int kM = decltype(m)::value;
#if HWY_TARGET == HWY_AVX3_DL
        if (bf16) {
          const std::uint16_t* xm = xb.get() + m0 * K;
          if (!nv) return GemvRowsFp4Bf16<kM, false, false>(xm, w, 0.0f, n0, n1, bias, ym);
          if (chunk_values) return GemvRowsFp4Bf16<kM, true, true>(xm, w, row_factor, n0, n1, bias, ym);
          return GemvRowsFp4Bf16<kM, true, false>(xm, w, 0.0f, n0, n1, bias, ym);
        }
#endif
        const float* xm = xd.get() + m0 * K;
        if (!nv) return GemvRowsFp4Avx512<kM, false, false>(xm, w, 0.0f, n0, n1, bias, ym);
        if (chunk_values) return GemvRowsFp4Avx512<kM, true, true>(xm, w, row_factor, n0, n1, bias, ym);
        GemvRowsFp4Avx512<kM, true, false>(xm, w, 0.0f, n0, n1, bias, ym);
      };
      switch (std::min<std::int64_t>(kRowsPerPass, M - m0)) {
        case 1: rows(std::integral_constant<int, 1>{}); break;
        case 2: rows(std::integral_constant<int, 2>{}); break;
        case 3: rows(std::integral_constant<int, 3>{}); break;
        default: rows(std::integral_constant<int, 4>{}); break;
      }
    }
  });
}
#endif  // HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL

// ---- the GEMV over rows of W ----

enum class GemvKernel { fp4, fp8, affine4, affine8, generic };

inline GemvKernel KernelFor(const QuantSpec& s) {
  if (HWY_TARGET == HWY_SCALAR) return GemvKernel::generic;
  switch (s.mode) {
    case Mode::nvfp4:
    case Mode::mxfp4: return GemvKernel::fp4;
    case Mode::mxfp8: return GemvKernel::fp8;
    case Mode::affine:
      return s.bits == 4 ? GemvKernel::affine4 : s.bits == 8 ? GemvKernel::affine8 : GemvKernel::generic;
  }
  return GemvKernel::generic;
}

// x and what every row needs of it, prepared once per call.
struct GemvInput {
  const QuantizedMatrix* w;
  GemvKernel kernel;
  const float* x;            // [M, K]
  const float* xd;           // nibble order [M, Kp]: fp4 and affine4
  bool scaled_x;             // fp4: xd holds x * 2^-25
  const float* x_prescaled;  // mxfp8: x * 2^(127-B) when exact (PrescaleForFp8), else null
  const float* group_sums;   // [M, K/gs]: affine
  const float* fp4_factors;  // fp4: the factor of each of the 256 scale codes
  std::int64_t Kp;
  std::int64_t groups;         // per weight row
  std::int64_t padded_groups;  // Kp / group size + 1
  const float* bias;
  float* y;  // [M, N]
};

#if HWY_TARGET != HWY_SCALAR
// One weight row as the fused kernels take it. Rows are contiguous, so a row whose last step is
// partial (fp4, affine4) is read from a zero-padded copy of its codes (fp4: its scale codes too,
// after them). fp8 factors and affine scales come as float32, zero-padded past the last step.
struct GemvRow {
  const std::uint8_t* codes;
  const std::uint8_t* scale_codes;  // fp4
  const float* factors;             // fp8, affine
  const float* biases;              // affine
};

// Where LoadRow puts one row's padded copy and float32 factors and biases.
struct RowScratch {
  hwy::AlignedFreeUniquePtr<std::uint8_t[]> bytes;
  hwy::AlignedFreeUniquePtr<float[]> factors;
  hwy::AlignedFreeUniquePtr<float[]> biases;
};

// Only what the kernel needs: most rows need no scratch at all.
inline RowScratch MakeRowScratch(const GemvInput& in) {
  RowScratch s;
  if (in.Kp != in.w->cols) {
    const auto bytes = static_cast<std::size_t>(in.Kp / 2 + in.Kp / 16);
    s.bytes = hwy::AllocateAligned<std::uint8_t>(bytes);
    std::memset(s.bytes.get(), 0, bytes);  // the padding; each row overwrites only its own bytes
  }
  if (in.kernel == GemvKernel::fp8 || in.kernel == GemvKernel::affine4 || in.kernel == GemvKernel::affine8) {
    s.factors = hwy::AllocateAligned<float>(static_cast<std::size_t>(in.padded_groups) + 2 * kN);
    s.biases = hwy::AllocateAligned<float>(static_cast<std::size_t>(in.groups));
  }
  return s;
}

inline GemvRow LoadRow(const GemvInput& in, std::int64_t n, RowScratch& s) {
  const QuantizedMatrix& w = *in.w;
  const std::int64_t K = w.cols, groups = in.groups;
  GemvRow r{w.packed + n * (K * w.spec.bits / 8), reinterpret_cast<const std::uint8_t*>(w.scales) + n * groups, nullptr,
            nullptr};
  if (s.bytes) {
    std::memcpy(s.bytes.get(), r.codes, static_cast<std::size_t>(K / 2));
    r.codes = s.bytes.get();
    if (in.kernel == GemvKernel::fp4) {
      std::memcpy(s.bytes.get() + in.Kp / 2, r.scale_codes, static_cast<std::size_t>(groups));
      r.scale_codes = s.bytes.get() + in.Kp / 2;
    }
  }
  if (in.kernel == GemvKernel::fp8) {
    DecodeFactors(r.scale_codes, groups, in.padded_groups + kN, w.spec, s.factors.get());
    r.factors = s.factors.get();
  } else if (in.kernel == GemvKernel::affine4 || in.kernel == GemvKernel::affine8) {
    const std::size_t ss = dtype_size(w.scale_dtype);
    ToF32(w.scales + static_cast<std::size_t>(n * groups) * ss, w.scale_dtype, groups, s.factors.get());
    ToF32(w.biases + static_cast<std::size_t>(n * groups) * ss, w.scale_dtype, groups, s.biases.get());
    std::fill(s.factors.get() + groups, s.factors.get() + in.padded_groups + 2 * kN, 0.0f);
    r.factors = s.factors.get();
    r.biases = s.biases.get();
  }
  return r;
}

// Factor vectors of a row's steps for Nibble4RowPair, one call per step in order: mxfp4 from the
// row's scale codes (factor_of: the factor of each of the 256 codes), affine from its float32
// scales.
struct Fp4StepFactors {
  const float* factor_of;
  const std::uint8_t* scale_codes;
  HWY_INLINE VF operator()() {
    const VF f = BlockFactors([&](std::size_t b) { return factor_of[scale_codes[b]]; });
    scale_codes += kStepWeights / 32;
    return f;
  }
};
struct AffineStepFactorsOf {
  const float* scales;
  int log2_gs;
  std::int64_t s;  // the step's first weight
  HWY_INLINE VF operator()() {
    const VF f = AffineStepFactors(scales, s, log2_gs);
    s += static_cast<std::int64_t>(kStepWeights);
    return f;
  }
};

// mxfp4 and affine 4-bit W rows [n0, n1) against row m of x, two rows at a time
// (Nibble4RowPair). An odd last row is paired with itself: a row's sum never depends on its
// partner, so every row gets the same arithmetic whatever the chunking.
inline void Nibble4RowsInPairs(const GemvInput& in, std::int64_t m, std::int64_t n0, std::int64_t n1) {
  const QuantizedMatrix& w = *in.w;
  const bool affine = w.spec.mode == Mode::affine;
  const std::int64_t K = w.cols, N = w.rows, groups = in.groups;
  const int log2_gs = std::countr_zero(static_cast<std::uint64_t>(w.spec.group_size));
  const float* x = in.xd + m * in.Kp;
  RowScratch scratch0 = MakeRowScratch(in), scratch1 = MakeRowScratch(in);
  const auto table = hn::LoadDup128(D8(), reinterpret_cast<const std::uint8_t*>(kTwiceE2M1));
  // By reference: SVE vectors cannot be copied into a lambda.
  const auto lookup = [&table](hn::Vec<D8> nibbles) HWY_ATTR { return hn::TableLookupBytes(table, nibbles); };
  const auto same = [](hn::Vec<D8> nibbles) HWY_ATTR { return nibbles; };
  const auto fp4_factors = [&](const GemvRow& r) { return Fp4StepFactors{in.fp4_factors, r.scale_codes}; };
  const auto affine_factors = [&](const GemvRow& r) { return AffineStepFactorsOf{r.factors, log2_gs, 0}; };
  for (std::int64_t n = n0; n < n1; n += 2) {
    const GemvRow r0 = LoadRow(in, n, scratch0), r1 = LoadRow(in, std::min(n + 1, n1 - 1), scratch1);
    float sums[2];
    if (affine) {
      const auto spread = [](hn::Vec<D8> bytes, std::size_t j) HWY_ATTR { return SpreadUnsigned(bytes, j); };
      Nibble4RowPair(r0.codes, r1.codes, x, in.Kp, K, same, spread, affine_factors(r0), affine_factors(r1), sums);
      const float* group_sums = in.group_sums + m * groups;
      sums[0] += Dot(r0.biases, group_sums, groups);
      sums[1] += Dot(r1.biases, group_sums, groups);
    } else if (in.scaled_x) {
      const auto spread = [](hn::Vec<D8> bytes, std::size_t j) HWY_ATTR { return SpreadSigned<false>(bytes, j); };
      Nibble4RowPair(r0.codes, r1.codes, x, in.Kp, K, lookup, spread, fp4_factors(r0), fp4_factors(r1), sums);
    } else {
      const auto spread = [](hn::Vec<D8> bytes, std::size_t j) HWY_ATTR { return SpreadSigned<true>(bytes, j); };
      Nibble4RowPair(r0.codes, r1.codes, x, in.Kp, K, lookup, spread, fp4_factors(r0), fp4_factors(r1), sums);
      sums[0] *= 0.5f;  // unscaled x meets twice the values
      sums[1] *= 0.5f;
    }
    for (std::int64_t i = 0; i < std::min<std::int64_t>(2, n1 - n); ++i)
      in.y[m * N + n + i] = in.bias ? sums[i] + in.bias[n + i] : sums[i];
  }
}

// Sums of kM rows of x against an nvfp4 (G = 16) or mxfp4 (G = 32) row.
template <int kM, std::size_t G>
HWY_INLINE void Fp4Sums(const GemvInput& in, const GemvRow& r, const float* xd, float* sums) {
  if (in.scaled_x) return Fp4Row<kM, G, true>(r.codes, r.scale_codes, in.fp4_factors, xd, in.Kp, sums);
  Fp4Row<kM, G, false>(r.codes, r.scale_codes, in.fp4_factors, xd, in.Kp, sums);
  for (int m = 0; m < kM; ++m) sums[m] *= 0.5f;  // unscaled x meets twice the values
}
#endif

// W rows [n0, n1) against rows [m0, m0 + kM) of x.
template <int kM>
void GemvRows(const GemvInput& in, std::int64_t m0, std::int64_t n0, std::int64_t n1) {
  const QuantizedMatrix& w = *in.w;
  const std::int64_t K = w.cols, N = w.rows;
  const float* x = in.x + m0 * K;
  auto slice = hwy::AllocateAligned<float>(static_cast<std::size_t>(std::min(K, kSlice)));
  float sums[kRowsPerPass] = {};  // every kernel a pass reaches sets it; zeroed for GCC -O3 (maybe-uninitialized)
#if HWY_TARGET != HWY_SCALAR
  // One row of x: mxfp4 and affine 4-bit decode weight rows in pairs.
  if constexpr (kM == 1)
    if ((in.kernel == GemvKernel::fp4 && w.spec.mode == Mode::mxfp4) || in.kernel == GemvKernel::affine4)
      return Nibble4RowsInPairs(in, m0, n0, n1);
  const std::int64_t groups = in.groups;
  const float* xd = in.xd ? in.xd + m0 * in.Kp : nullptr;
  RowScratch scratch = MakeRowScratch(in);
#endif
  for (std::int64_t n = n0; n < n1; ++n) {
#if HWY_TARGET != HWY_SCALAR
    const GemvRow r = LoadRow(in, n, scratch);
    switch (in.kernel) {
      case GemvKernel::fp4:
        if (w.spec.mode == Mode::nvfp4)
          Fp4Sums<kM, 16>(in, r, xd, sums);
        else if constexpr (kM > 1)
          Fp4Sums<kM, 32>(in, r, xd, sums);
        break;
      case GemvKernel::fp8: {
        const float* xs = in.x_prescaled ? in.x_prescaled + m0 * K : x;
        const bool special = w.spec.elem == Elem::e5m2
                                 ? (in.x_prescaled ? Fp8Row<kM, true, true>(r.codes, r.factors, xs, K, sums)
                                                   : Fp8Row<kM, true, false>(r.codes, r.factors, xs, K, sums))
                                 : (in.x_prescaled ? Fp8Row<kM, false, true>(r.codes, r.factors, xs, K, sums)
                                                   : Fp8Row<kM, false, false>(r.codes, r.factors, xs, K, sums));
        if (special) GenericRow<kM>(w, n, x, slice.get(), sums);  // NaN or Inf codes: the exact decode
        break;
      }
      case GemvKernel::affine4:
      case GemvKernel::affine8:
        if (in.kernel == GemvKernel::affine8)
          Affine8Row<kM>(r.codes, r.factors, w.spec.group_size, x, K, sums);
        else if constexpr (kM > 1)
          Affine4Row<kM>(r.codes, r.factors, w.spec.group_size, xd, in.Kp, sums);
        for (int m = 0; m < kM; ++m) sums[m] += Dot(r.biases, in.group_sums + (m0 + m) * groups, groups);
        break;
      default: GenericRow<kM>(w, n, x, slice.get(), sums); break;
    }
#else
    GenericRow<kM>(w, n, x, slice.get(), sums);
#endif
    for (int m = 0; m < kM; ++m) in.y[(m0 + m) * N + n] = in.bias ? sums[m] + in.bias[n] : sums[m];
  }
}

// y [M, N] = x [M, K] @ W^T (+ bias), M <= kGemvMaxRows.
inline void Gemv(const float* x, std::int64_t M, const QuantizedMatrix& w, const float* bias, float* y) {
  const std::int64_t K = w.cols, N = w.rows;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if ((w.spec.mode == Mode::nvfp4 || w.spec.mode == Mode::mxfp4) && K % 32 == 0) return GemvFp4Avx512(x, M, w, bias, y);
#endif
  const std::int64_t groups = K / w.spec.group_size;
  GemvInput in{&w, KernelFor(w.spec), x, nullptr, false, nullptr, nullptr, nullptr, K, groups, groups + 1, bias, y};
#if HWY_TARGET != HWY_SCALAR
  // The factor of each of the 256 scale codes, decoded as for a row holding every code once.
  alignas(64) float fp4_factors[256 + kN];  // DecodeFactors may store a whole vector past the end
  if (in.kernel == GemvKernel::fp4) {
    alignas(64) std::uint8_t every_code[256];
    for (int c = 0; c < 256; ++c) every_code[c] = static_cast<std::uint8_t>(c);
    DecodeFactors(every_code, 256, 256, w.spec, fp4_factors);
    in.fp4_factors = fp4_factors;
  }
#endif
  hwy::AlignedFreeUniquePtr<float[]> xd;
  std::vector<float> group_sums;
  if (in.kernel == GemvKernel::fp4 || in.kernel == GemvKernel::affine4) {
    const auto S = static_cast<std::int64_t>(kStepWeights);
    in.Kp = (K + S - 1) / S * S;
    in.padded_groups = in.Kp / w.spec.group_size + 1;
    in.scaled_x = in.kernel == GemvKernel::fp4 && ScaleXForFp4(x, M * K);
    xd = NibbleOrder(x, M, K, in.Kp, in.scaled_x ? 0x1p-25f : 1.0f);
    in.xd = xd.get();
  }
  std::vector<float> x_prescaled;
  if (in.kernel == GemvKernel::fp8) {
    x_prescaled = PrescaleForFp8(x, M * K, w.spec.elem == Elem::e5m2 ? 0x1p112f : 0x1p120f);
    if (!x_prescaled.empty()) in.x_prescaled = x_prescaled.data();
  }
  if (w.spec.mode == Mode::affine) {
    group_sums = GroupSums(x, M, K, w.spec.group_size);
    in.group_sums = group_sums.data();
  }
  parallel_for(N, RowsPerChunk(w), [&](std::int64_t n0, std::int64_t n1) {
    for (std::int64_t m0 = 0; m0 < M; m0 += kRowsPerPass) {
      switch (std::min<std::int64_t>(kRowsPerPass, M - m0)) {
        case 1: GemvRows<1>(in, m0, n0, n1); break;
        case 2: GemvRows<2>(in, m0, n0, n1); break;
        case 3: GemvRows<3>(in, m0, n0, n1); break;
        default: GemvRows<4>(in, m0, n0, n1); break;
      }
    }
  });
}

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MICROSCALE_CPU_GEMV_INL_H_
