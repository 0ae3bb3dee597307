// Quantize module: the kernels of cpu/quantize-inl.h, blocks split across threads, behind one
// dispatch per call.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/quantize.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "cpu/quantize-inl.h"

HWY_BEFORE_NAMESPACE();
namespace microscale::cpu::HWY_NAMESPACE {

void Quantize(const void* x, DType src, std::int64_t rows, std::int64_t K, const QuantSpec& spec, std::uint8_t* packed,
              std::byte* scales, std::byte* biases) {
  const std::int64_t blocks = rows * (K / spec.group_size);
  // ~64 KiB of f32 input per chunk; a multiple of every target's tile (up to 16 blocks), so only
  // the last chunk has a partial tile.
  const std::int64_t grain = std::max<std::int64_t>(16, 16384 / spec.group_size / 16 * 16);
  parallel_for(blocks, grain,
               [&](std::int64_t b0, std::int64_t b1) { QuantizeBlocks(x, src, spec, b0, b1, packed, scales, biases); });
}

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace microscale::cpu {

HWY_EXPORT(Quantize);

void quantize(const void* x, DType src, std::int64_t rows, std::int64_t K, const QuantSpec& spec, std::uint8_t* packed,
              std::byte* scales, std::byte* biases) {
  HWY_DYNAMIC_DISPATCH(Quantize)(x, src, rows, K, spec, packed, scales, biases);
}

}  // namespace microscale::cpu
#endif
