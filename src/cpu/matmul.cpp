// quantized_matmul module: the fused GEMV (cpu/gemv-inl.h) for up to kGemvMaxRows rows of x and
// the panel GEMM (cpu/gemm-inl.h) beyond, behind one dispatch per call.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/matmul.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "cpu/gemm-inl.h"
#include "cpu/gemv-inl.h"
#include "cpu/kernels.hpp"

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

void quantized_matmul(const float* x, std::int64_t M, const QuantizedMatrix& w, bool transpose, const float* bias,
                      float* y) {
  HWY_DYNAMIC_DISPATCH(QuantizedMatmul)(x, M, w, transpose, bias, y);
}

}  // namespace microscale::cpu
#endif
