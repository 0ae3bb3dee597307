// Tensor amax over finite values and the first non-finite index, on the input's own bit patterns:
// |x| as a sign-cleared integer orders like |x|, and x is finite exactly when that integer is
// below the Inf pattern, so f16/bf16 never need widening (twice the lanes of f32).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/amax.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <vector>

#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "microscale/codecs.hpp"

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
L MaxFinite(const L* p, std::size_t n, Bits<L> k) {
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
std::int64_t FirstNonFinite(const L* p, std::size_t n, Bits<L> k) {
  const hn::ScalableTag<L> d;
  const std::size_t N = hn::Lanes(d);
  const auto abs = hn::Set(d, k.abs), below = hn::Set(d, static_cast<L>(k.inf - 1));
  std::size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    const auto m = hn::Max(hn::Max(hn::And(hn::LoadU(d, p + i), abs), hn::And(hn::LoadU(d, p + i + N), abs)),
                           hn::Max(hn::And(hn::LoadU(d, p + i + 2 * N), abs),
                                   hn::And(hn::LoadU(d, p + i + 3 * N), abs)));
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
std::uint32_t AmaxBits(const void* x, DType src, std::int64_t i0, std::int64_t i1) {
  const auto n = static_cast<std::size_t>(i1 - i0);
  if (src == DType::float32)
    return static_cast<std::uint32_t>(MaxFinite(static_cast<const std::int32_t*>(x) + i0, n, f32_bits_info()));
  return static_cast<std::uint32_t>(MaxFinite(static_cast<const std::int16_t*>(x) + i0, n, f16_bits_info(src)));
}

std::int64_t FindNonFinite(const void* x, DType src, std::int64_t i0, std::int64_t i1) {
  const auto n = static_cast<std::size_t>(i1 - i0);
  const std::int64_t r = src == DType::float32
                             ? FirstNonFinite(static_cast<const std::int32_t*>(x) + i0, n, f32_bits_info())
                             : FirstNonFinite(static_cast<const std::int16_t*>(x) + i0, n, f16_bits_info(src));
  return r < 0 ? r : i0 + r;
}

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace microscale::cpu {
namespace {

HWY_EXPORT(AmaxBits);
HWY_EXPORT(FindNonFinite);

constexpr std::int64_t kChunk = 1 << 16;

// f(chunk index, begin, end) for every chunk of [0, n), chunks spread over threads.
template <class F>
void for_chunks(std::int64_t n, F&& f) {
  parallel_for((n + kChunk - 1) / kChunk, 1, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) f(c, c * kChunk, std::min(n, (c + 1) * kChunk));
  });
}

}  // namespace

float amax_finite(const void* x, DType src, std::int64_t n) {
  std::vector<std::uint32_t> part(static_cast<std::size_t>((n + kChunk - 1) / kChunk));
  for_chunks(n, [&](std::int64_t c, std::int64_t i0, std::int64_t i1) {
    part[static_cast<std::size_t>(c)] = HWY_DYNAMIC_DISPATCH(AmaxBits)(x, src, i0, i1);
  });
  const std::uint32_t m = part.empty() ? 0 : *std::max_element(part.begin(), part.end());
  if (src == DType::float32) return f32_from_bits(m);
  const auto h = static_cast<std::uint16_t>(m);
  return src == DType::bfloat16 ? decode_bf16(h) : decode_f16(h);
}

std::int64_t find_nonfinite(const void* x, DType src, std::int64_t n) {
  std::vector<std::int64_t> part(static_cast<std::size_t>((n + kChunk - 1) / kChunk));
  for_chunks(n, [&](std::int64_t c, std::int64_t i0, std::int64_t i1) {
    part[static_cast<std::size_t>(c)] = HWY_DYNAMIC_DISPATCH(FindNonFinite)(x, src, i0, i1);
  });
  for (const std::int64_t i : part)
    if (i >= 0) return i;
  return -1;
}

}  // namespace microscale::cpu
#endif
