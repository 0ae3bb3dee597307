// quantized_matmul module: the fused GEMV (cpu/gemv-inl.h) for up to kGemvMaxRows rows of x and
// the panel GEMM (cpu/gemm-inl.h) beyond, behind one dispatch per call; qqmm composed of
// dequantize and that product; and the dense GEMV of linear (cpu/linear-inl.h).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/matmul.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <vector>

#include "cpu/gemm-inl.h"
#include "cpu/gemv-inl.h"
#include "cpu/kernels.hpp"
#include "cpu/linear-inl.h"
#include "microscale/runtime.hpp"

HWY_BEFORE_NAMESPACE();
namespace microscale::cpu::HWY_NAMESPACE {

void QuantizedMatmul(const float* x, std::int64_t M, const QuantizedMatrix& w, bool transpose, const float* bias,
                     float* y) {
  const std::int64_t K = transpose ? w.cols : w.rows, N = transpose ? w.rows : w.cols;
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (std::int64_t i = 0; i < M * N; ++i) y[i] = bias ? bias[i % N] : 0.0f;
    return;
  }
  if (M > kGemvMaxRows) return Gemm(x, M, w, transpose, bias, y);
  if (transpose) return Gemv(x, M, w, bias, y);
  AxpyRows(x, M, w, bias, y);
}

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace microscale::cpu {

HWY_EXPORT(QuantizedMatmul);
HWY_EXPORT(Linear);

std::int64_t gemv_rows_per_chunk(std::int64_t rows, std::int64_t row_bytes) {
  constexpr std::int64_t kChunkBytes = std::int64_t{1} << 20, kMinRows = 32;
  const std::int64_t by_bytes = kChunkBytes / std::max<std::int64_t>(row_bytes, 1);
  const std::int64_t by_threads = rows / (4 * std::int64_t{num_threads()});
  return std::max(kMinRows, std::min(by_bytes, by_threads));
}

void linear(const float* x, std::int64_t M, const void* w, DType w_dtype, std::int64_t N, std::int64_t K,
            const float* bias, float* y) {
  HWY_DYNAMIC_DISPATCH(Linear)(x, M, w, w_dtype, N, K, bias, y);
}

void quantized_matmul(const float* x, std::int64_t M, const QuantizedMatrix& w, bool transpose, const float* bias,
                      float* y) {
  HWY_DYNAMIC_DISPATCH(QuantizedMatmul)(x, M, w, transpose, bias, y);
}

void qqmm(const std::uint8_t* px, const std::uint8_t* sx, const std::uint8_t* pw, const std::uint8_t* sw,
          std::int64_t M, std::int64_t N, std::int64_t K, const QuantSpec& spec, float alpha, const float* bias,
          float* y) {
  // Two-level values (element times block scale) are exact in float32 on both sides, so their
  // products are the exact block products; alpha applies once to the float32 sum.
  QuantSpec two_level = spec;
  two_level.global_scale.reset();
  std::vector<float> xd(static_cast<std::size_t>(M * K));
  dequantize(px, reinterpret_cast<const std::byte*>(sx), nullptr, DType::uint8, M, K, two_level, DType::float32,
             reinterpret_cast<std::byte*>(xd.data()));
  const QuantizedMatrix wm{pw, reinterpret_cast<const std::byte*>(sw), nullptr, DType::uint8, N, K, two_level};
  quantized_matmul(xd.data(), M, wm, true, nullptr, y);
  for (std::int64_t i = 0; i < M * N; ++i) {
    const float v = alpha * y[i];
    y[i] = bias ? v + bias[i % N] : v;
  }
}

}  // namespace microscale::cpu
#endif
