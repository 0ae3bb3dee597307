// Fast CPU kernels (SIMD through Highway's runtime dispatch, threads through cpu/parallel.hpp).
// Each matches its reference counterpart (src/reference/reference.hpp): quantize, dequantize,
// amax and the layouts bit for bit on every target; the matmuls within float32 re-association.
// Inputs are row-major and contiguous, in their own dtype; src/ops validates and dispatches.
#pragma once

#include <cstddef>
#include <cstdint>

#include "microscale/format.hpp"
#include "microscale/tensor.hpp"

namespace microscale::cpu {

// x: rows*K values of dtype src (float32, float16 or bfloat16). Outputs as reference::quantize.
void quantize(const void* x, DType src, std::int64_t rows, std::int64_t K, const QuantSpec& spec,
              std::uint8_t* packed, std::byte* scales, std::byte* biases);
void dequantize(const std::uint8_t* packed, const std::byte* scales, const std::byte* biases, DType scale_dtype,
                std::int64_t rows, std::int64_t K, const QuantSpec& spec, DType out, std::byte* y);
// max |x_i| over finite values (0 if none).
float amax_finite(const void* x, DType src, std::int64_t n);
// Flat index of the first NaN or Inf, or -1.
std::int64_t find_nonfinite(const void* x, DType src, std::int64_t n);

// y [M, N] float32 = x [M, K] float32 @ W^T (transpose) or @ W, W given quantized as stored
// (rows x cols values, packed + compact scales (+ biases for affine)); bias [N] optional.
void quantized_matmul(const float* x, std::int64_t M, std::int64_t K, const std::uint8_t* packed,
                      const std::byte* scales, const std::byte* biases, DType scale_dtype, std::int64_t N,
                      bool transpose, const QuantSpec& spec, const float* bias, float* y);

}  // namespace microscale::cpu
