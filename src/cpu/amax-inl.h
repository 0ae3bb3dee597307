// Tensor amax over finite values and the first non-finite index, of one target (Highway -inl.h,
// included per target), on the input's own bit patterns: |x| as a sign-cleared integer orders
// like |x|, and x is finite exactly when that integer is below the Inf pattern, so f16/bf16
// never need widening (twice the lanes of f32).

#if defined(MICROSCALE_CPU_AMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MICROSCALE_CPU_AMAX_INL_H_
#undef MICROSCALE_CPU_AMAX_INL_H_
#else
#define MICROSCALE_CPU_AMAX_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>

#include "microscale/tensor.hpp"

#ifndef MICROSCALE_CPU_AMAX_ONCE
#define MICROSCALE_CPU_AMAX_ONCE
namespace microscale::cpu {
// Sign mask and Inf pattern of a float type, as integers of its width.
template <class L>
struct Bits {
  L abs, inf;
};
inline Bits<std::int32_t> f32_bits_info() { return {0x7FFFFFFF, 0x7F800000}; }
inline Bits<std::int16_t> f16_bits_info(DType t) {
  return {0x7FFF, static_cast<std::int16_t>(t == DType::bfloat16 ? 0x7F80 : 0x7C00)};
}
}  // namespace microscale::cpu
#endif

HWY_BEFORE_NAMESPACE();
namespace microscale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Largest |x| pattern over the finite x of p[0, n) (0 if none).
template <class L>
HWY_INLINE L MaxFinite(const L* p, std::size_t n, Bits<L> k) {
  const hn::ScalableTag<L> d;
  const std::size_t N = hn::Lanes(d);
  const auto abs = hn::Set(d, k.abs), inf = hn::Set(d, k.inf);
  auto m0 = hn::Zero(d), m1 = hn::Zero(d);
  std::size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto a0 = hn::And(hn::LoadU(d, p + i), abs);
    const auto a1 = hn::And(hn::LoadU(d, p + i + N), abs);
    m0 = hn::Max(m0, hn::IfThenElseZero(hn::Lt(a0, inf), a0));
    m1 = hn::Max(m1, hn::IfThenElseZero(hn::Lt(a1, inf), a1));
  }
  L m = hn::GetLane(hn::MaxOfLanes(d, hn::Max(m0, m1)));
  for (; i < n; ++i) {
    const L a = static_cast<L>(p[i] & k.abs);
    if (a < k.inf) m = std::max(m, a);
  }
  return m;
}

// Index of the first x of p[0, n) that is NaN or Inf, or -1.
template <class L>
HWY_INLINE std::int64_t FirstNonFinite(const L* p, std::size_t n, Bits<L> k) {
  const hn::ScalableTag<L> d;
  const std::size_t N = hn::Lanes(d);
  const auto abs = hn::Set(d, k.abs), below = hn::Set(d, static_cast<L>(k.inf - 1));
  std::size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    const auto m =
        hn::Max(hn::Max(hn::And(hn::LoadU(d, p + i), abs), hn::And(hn::LoadU(d, p + i + N), abs)),
                hn::Max(hn::And(hn::LoadU(d, p + i + 2 * N), abs), hn::And(hn::LoadU(d, p + i + 3 * N), abs)));
    if (!hn::AllFalse(d, hn::Gt(m, below))) break;  // the first hit is in these 4 vectors: found below
  }
  for (; i + N <= n; i += N) {
    const auto bad = hn::Gt(hn::And(hn::LoadU(d, p + i), abs), below);
    if (!hn::AllFalse(d, bad)) return static_cast<std::int64_t>(i) + hn::FindFirstTrue(d, bad);
  }
  for (; i < n; ++i)
    if (static_cast<L>(p[i] & k.abs) >= k.inf) return static_cast<std::int64_t>(i);
  return -1;
}

// The amax of x[i0, i1) as a bit pattern of the input dtype.
inline std::uint32_t AmaxBits(const void* x, DType src, std::int64_t i0, std::int64_t i1) {
  const auto n = static_cast<std::size_t>(i1 - i0);
  if (src == DType::float32)
    return static_cast<std::uint32_t>(MaxFinite(static_cast<const std::int32_t*>(x) + i0, n, f32_bits_info()));
  return static_cast<std::uint32_t>(MaxFinite(static_cast<const std::int16_t*>(x) + i0, n, f16_bits_info(src)));
}

inline std::int64_t FindNonFinite(const void* x, DType src, std::int64_t i0, std::int64_t i1) {
  const auto n = static_cast<std::size_t>(i1 - i0);
  const std::int64_t r = src == DType::float32
                             ? FirstNonFinite(static_cast<const std::int32_t*>(x) + i0, n, f32_bits_info())
                             : FirstNonFinite(static_cast<const std::int16_t*>(x) + i0, n, f16_bits_info(src));
  return r < 0 ? r : i0 + r;
}

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MICROSCALE_CPU_AMAX_INL_H_
