// Placeholder until the SIMD quantize kernels land: widens to float32 and runs the reference.
#include <cmath>
#include <vector>

#include "core/convert.hpp"
#include "cpu/kernels.hpp"
#include "reference/reference.hpp"

namespace microscale::cpu {
namespace {
std::vector<float> widen(const void* x, DType src, std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  const auto* p = static_cast<const std::byte*>(x);
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = detail::load_f32(p + i * static_cast<std::int64_t>(dtype_size(src)), src);
  return v;
}
}  // namespace

void quantize(const void* x, DType src, std::int64_t rows, std::int64_t K, const QuantSpec& spec,
              std::uint8_t* packed, std::byte* scales, std::byte* biases) {
  const std::vector<float> v = widen(x, src, rows * K);
  reference::quantize(v.data(), rows, K, src, spec, packed, scales, biases);
}

void dequantize(const std::uint8_t* packed, const std::byte* scales, const std::byte* biases, DType scale_dtype,
                std::int64_t rows, std::int64_t K, const QuantSpec& spec, DType out, std::byte* y) {
  reference::dequantize(packed, scales, biases, scale_dtype, rows, K, spec, out, y);
}

float amax_finite(const void* x, DType src, std::int64_t n) {
  const std::vector<float> v = widen(x, src, n);
  return reference::amax_finite(v.data(), n);
}

std::int64_t find_nonfinite(const void* x, DType src, std::int64_t n) {
  const std::vector<float> v = widen(x, src, n);
  for (std::int64_t i = 0; i < n; ++i)
    if (!std::isfinite(v[static_cast<std::size_t>(i)])) return i;
  return -1;
}

}  // namespace microscale::cpu
