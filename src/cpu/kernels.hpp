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
// Blocks [b0, b1) of dequantize on the calling thread, as flat indices over rows x K/group.
void dequantize_blocks(const std::uint8_t* packed, const std::byte* scales, const std::byte* biases,
                       DType scale_dtype, const QuantSpec& spec, DType out, std::int64_t b0, std::int64_t b1,
                       std::byte* y);
// max |x_i| over finite values (0 if none).
float amax_finite(const void* x, DType src, std::int64_t n);
// Flat index of the first NaN or Inf, or -1.
std::int64_t find_nonfinite(const void* x, DType src, std::int64_t n);

// One stored matrix of a quantized operand: rows x cols values, groups along cols, compact scales.
struct QuantizedMatrix {
  const std::uint8_t* packed;
  const std::byte* scales;
  const std::byte* biases;  // affine only
  DType scale_dtype;        // uint8 codes, or the float dtype of affine scales and biases
  std::int64_t rows, cols;
  QuantSpec spec;           // resolved; global_scale set for three-level nvfp4
};

// y [M, N] float32 = x [M, K] float32 @ W^T (transpose: W is N x K) or @ W (W is K x N), plus
// bias [N] when given. Products use the float32 values dequantize gives for W; sums are float32.
void quantized_matmul(const float* x, std::int64_t M, const QuantizedMatrix& w, bool transpose, const float* bias,
                      float* y);

}  // namespace microscale::cpu
