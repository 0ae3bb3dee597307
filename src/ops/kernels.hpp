// Internal: the kernels of the host backends behind one table. The ops validate and plan
// (ops/plan.hpp), then run the plan on kernels(), the table of the backend set now.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/kernels.hpp"
#include "microscale/format.hpp"

namespace microscale::ops {

// Row-major contiguous inputs in their own dtype, as src/cpu/kernels.hpp describes them; the
// reference entries give the same bytes with the scalar kernels of src/reference (no SIMD).
struct Kernels {
  void (*quantize)(const void* x, DType src, std::int64_t rows, std::int64_t K, const QuantSpec& spec,
                   std::uint8_t* packed, std::byte* scales, std::byte* biases);
  void (*dequantize)(const std::uint8_t* packed, const std::byte* scales, const std::byte* biases, DType scale_dtype,
                     std::int64_t rows, std::int64_t K, const QuantSpec& spec, DType out, std::byte* y);
  float (*amax_finite)(const void* x, DType src, std::int64_t n);
  std::int64_t (*find_nonfinite)(const void* x, DType src, std::int64_t n);
  void (*quantized_matmul)(const float* x, std::int64_t M, const cpu::QuantizedMatrix& w, bool transpose,
                           const float* bias, float* y);
  // y [M, N] float32 = alpha * (x @ w^T) (+ bias) on codes with compact scales (reference::qqmm).
  void (*qqmm)(const std::uint8_t* px, const std::uint8_t* sx, const std::uint8_t* pw, const std::uint8_t* sw,
               std::int64_t M, std::int64_t N, std::int64_t K, const QuantSpec& spec, float alpha, const float* bias,
               float* y);
};

const Kernels& kernels();

}  // namespace microscale::ops
