// amax and non-finite search module: the kernels of cpu/amax-inl.h over chunks split across
// threads, behind one dispatch per call.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/amax.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <vector>

#include "cpu/amax-inl.h"
#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "microscale/codecs.hpp"

HWY_BEFORE_NAMESPACE();
namespace microscale::cpu::HWY_NAMESPACE {

constexpr std::int64_t kChunk = 1 << 16;

// f(chunk index, begin, end) for every chunk of [0, n), chunks spread over threads.
template <class F>
void ForChunks(std::int64_t n, F&& f) {
  parallel_for((n + kChunk - 1) / kChunk, 1, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) f(c, c * kChunk, std::min(n, (c + 1) * kChunk));
  });
}

// The amax of x[0, n) as a bit pattern of the input dtype.
std::uint32_t AmaxFiniteBits(const void* x, DType src, std::int64_t n) {
  std::vector<std::uint32_t> part(static_cast<std::size_t>((n + kChunk - 1) / kChunk));
  ForChunks(n, [&](std::int64_t c, std::int64_t i0, std::int64_t i1) {
    part[static_cast<std::size_t>(c)] = AmaxBits(x, src, i0, i1);
  });
  return part.empty() ? 0 : *std::max_element(part.begin(), part.end());
}

std::int64_t FirstNonFiniteIndex(const void* x, DType src, std::int64_t n) {
  std::vector<std::int64_t> part(static_cast<std::size_t>((n + kChunk - 1) / kChunk));
  ForChunks(n, [&](std::int64_t c, std::int64_t i0, std::int64_t i1) {
    part[static_cast<std::size_t>(c)] = FindNonFinite(x, src, i0, i1);
  });
  for (const std::int64_t i : part)
    if (i >= 0) return i;
  return -1;
}

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace microscale::cpu {

HWY_EXPORT(AmaxFiniteBits);
HWY_EXPORT(FirstNonFiniteIndex);

float amax_finite(const void* x, DType src, std::int64_t n) {
  const std::uint32_t m = HWY_DYNAMIC_DISPATCH(AmaxFiniteBits)(x, src, n);
  if (src == DType::float32) return f32_from_bits(m);
  const auto h = static_cast<std::uint16_t>(m);
  return src == DType::bfloat16 ? decode_bf16(h) : decode_f16(h);
}

std::int64_t find_nonfinite(const void* x, DType src, std::int64_t n) {
  return HWY_DYNAMIC_DISPATCH(FirstNonFiniteIndex)(x, src, n);
}

}  // namespace microscale::cpu
#endif
