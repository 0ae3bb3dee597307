// Quantize module: the kernels of cpu/quantize-inl.h, blocks split across threads, behind one
// dispatch per call.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/quantize.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "cpu/quantize-inl.h"

#if HWY_ONCE
#include <cstring>
#include <vector>

#include "core/convert.hpp"
#include "reference/reference.hpp"
#endif

HWY_BEFORE_NAMESPACE();
namespace microscale::cpu::HWY_NAMESPACE {

// Blocks of group_size per parallel chunk of the encoders: 64 Ki elements, as the benchmarks' stream
// twin reads them (16 Ki ran 10-25% slower on Zen 4: each chunk restarts the read streams); a
// multiple of every target's tile (up to 16 blocks), so only the last chunk has a partial tile.
std::int64_t EncodeGrain(std::int64_t group_size) { return std::max<std::int64_t>(16, 65536 / group_size / 16 * 16); }

void Quantize(const void* x, DType src, std::int64_t rows, std::int64_t K, const QuantSpec& spec, std::uint8_t* packed,
              std::byte* scales, std::byte* biases) {
  const std::int64_t blocks = rows * (K / spec.group_size);
  parallel_for(blocks, EncodeGrain(spec.group_size),
               [&](std::int64_t b0, std::int64_t b1) { QuantizeBlocks(x, src, spec, b0, b1, packed, scales, biases); });
}

bool Nvfp4GlobalErrors(const void* x, DType src, std::int64_t blocks, const float* globals, int n, double* totals,
                       std::uint8_t* scales) {
  std::vector<numerics::Nvfp4Search> searches;
  for (int c = 0; c < n; ++c) searches.push_back(numerics::nvfp4_search_tensor(true, globals[c], ScaleSearch::mse));
  // Per-chunk sums, added in chunk order at the end: the same totals for every thread count.
  constexpr std::int64_t grain = 1024;
  const std::int64_t chunks = (blocks + grain - 1) / grain;
  std::vector<double> sums(static_cast<std::size_t>(chunks * n), 0.0);
  std::vector<char> finite(static_cast<std::size_t>(chunks), 1);
  parallel_for(blocks, grain, [&](std::int64_t b0, std::int64_t b1) {
    const std::int64_t k = b0 / grain;
    finite[static_cast<std::size_t>(k)] =
        Nvfp4GlobalErrorBlocks(x, src, b0, b1, searches.data(), n, &sums[k * n], scales, blocks);
  });
  if (std::find(finite.begin(), finite.end(), 0) != finite.end()) return false;
  std::fill(totals, totals + n, 0.0);
  for (std::int64_t k = 0; k < chunks; ++k)
    for (int c = 0; c < n; ++c) totals[c] += sums[k * n + c];
  return true;
}

void Nvfp4Encode(const void* x, DType src, std::int64_t blocks, float global_scale, const std::uint8_t* scales,
                 std::uint8_t* packed) {
  parallel_for(blocks, EncodeGrain(numerics::kNvfp4Group), [&](std::int64_t b0, std::int64_t b1) {
    Nvfp4EncodeBlocks(x, src, b0, b1, global_scale, scales, packed);
  });
}

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace microscale::cpu {

HWY_EXPORT(Quantize);
HWY_EXPORT(Nvfp4GlobalErrors);
HWY_EXPORT(Nvfp4Encode);

namespace {

// scale_2d: whole tiles of 16 rows split across threads, each widened and quantized by the scalar
// spec (the tile's amax spans rows, which the vector kernels' flat block walk does not see).
void quantize_2d(const void* x, DType src, std::int64_t rows, std::int64_t K, const QuantSpec& spec,
                 std::uint8_t* packed, std::byte* scales) {
  constexpr std::int64_t kTileRows = 16;
  const std::int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  const std::int64_t groups = K / spec.group_size, row_bytes = K / 2;
  const std::size_t esize = dtype_size(src);
  // ~64 KiB of f32 input per chunk.
  const std::int64_t grain = std::max<std::int64_t>(1, 16384 / (kTileRows * std::max<std::int64_t>(K, 1)));
  parallel_for(tiles, grain, [&](std::int64_t t0, std::int64_t t1) {
    const std::int64_t r0 = t0 * kTileRows, r1 = std::min(t1 * kTileRows, rows);
    std::vector<float> buf(static_cast<std::size_t>((r1 - r0) * K));
    const auto* in = static_cast<const std::byte*>(x) + static_cast<std::size_t>(r0 * K) * esize;
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = detail::load_f32(in + i * esize, src);
    std::memset(packed + r0 * row_bytes, 0, static_cast<std::size_t>((r1 - r0) * row_bytes));  // ORed into
    reference::quantize(buf.data(), r1 - r0, K, src, spec, packed + r0 * row_bytes, scales + r0 * groups, nullptr,
                        r0 * K);
  });
}

}  // namespace

void quantize(const void* x, DType src, std::int64_t rows, std::int64_t K, const QuantSpec& spec, std::uint8_t* packed,
              std::byte* scales, std::byte* biases) {
  if (spec.scale_2d) return quantize_2d(x, src, rows, K, spec, packed, scales);
  HWY_DYNAMIC_DISPATCH(Quantize)(x, src, rows, K, spec, packed, scales, biases);
}

bool nvfp4_global_errors(const void* x, DType src, std::int64_t blocks, const float* globals, int n, double* totals,
                         std::uint8_t* scales) {
  return HWY_DYNAMIC_DISPATCH(Nvfp4GlobalErrors)(x, src, blocks, globals, n, totals, scales);
}

void nvfp4_encode(const void* x, DType src, std::int64_t blocks, float global_scale, const std::uint8_t* scales,
                  std::uint8_t* packed) {
  HWY_DYNAMIC_DISPATCH(Nvfp4Encode)(x, src, blocks, global_scale, scales, packed);
}

}  // namespace microscale::cpu
#endif
