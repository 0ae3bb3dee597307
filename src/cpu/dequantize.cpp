// Dequantize module: the kernels of cpu/dequantize-inl.h, blocks split across threads, behind one
// dispatch per call.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/dequantize.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "cpu/dequantize-inl.h"
#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"

HWY_BEFORE_NAMESPACE();
namespace microscale::cpu::HWY_NAMESPACE {

void Dequantize(const std::uint8_t* packed, const std::byte* scales, const std::byte* biases, DType scale_dtype,
                std::int64_t rows, std::int64_t K, const QuantSpec& spec, DType out, std::byte* y) {
  const std::int64_t blocks = rows * (K / spec.group_size);
  // ~16K values per chunk, a multiple of every target's tile of up to 16 blocks.
  const std::int64_t grain = std::max<std::int64_t>(16, 16384 / spec.group_size / 16 * 16);
  parallel_for(blocks, grain, [&](std::int64_t b0, std::int64_t b1) {
    DequantizeBlocks(packed, scales, biases, scale_dtype, spec, out, b0, b1, y);
  });
}

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace microscale::cpu {

HWY_EXPORT(Dequantize);

void dequantize(const std::uint8_t* packed, const std::byte* scales, const std::byte* biases, DType scale_dtype,
                std::int64_t rows, std::int64_t K, const QuantSpec& spec, DType out, std::byte* y) {
  HWY_DYNAMIC_DISPATCH(Dequantize)(packed, scales, biases, scale_dtype, rows, K, spec, out, y);
}

}  // namespace microscale::cpu
#endif
