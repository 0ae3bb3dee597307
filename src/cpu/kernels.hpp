// Fast CPU kernels (SIMD through Highway's runtime dispatch, threads through cpu/parallel.hpp):
// the module boundary. Each function dispatches once per call to its kernel for the best target
// (cpu/*-inl.h, one source compiled for every target), which runs the whole op.
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
void quantize(const void* x, DType src, std::int64_t rows, std::int64_t K, const QuantSpec& spec, std::uint8_t* packed,
              std::byte* scales, std::byte* biases);
// Three-level nvfp4 mse's global-scale search, as reference::nvfp4_global_errors (x of dtype src;
// the totals' order of summation is fixed, the same for every thread count).
bool nvfp4_global_errors(const void* x, DType src, std::int64_t blocks, const float* globals, int n, double* totals,
                         std::uint8_t* scales);
// As reference::nvfp4_encode (x of dtype src).
void nvfp4_encode(const void* x, DType src, std::int64_t blocks, float global_scale, const std::uint8_t* scales,
                  std::uint8_t* packed);
void dequantize(const std::uint8_t* packed, const std::byte* scales, const std::byte* biases, DType scale_dtype,
                std::int64_t rows, std::int64_t K, const QuantSpec& spec, DType out, std::byte* y);
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
  QuantSpec spec;  // resolved; global_scale set for three-level nvfp4
};

// Rows of x up to which quantized_matmul runs the GEMV (fused decode and multiply for
// transpose = true); more rows run the panel GEMM.
inline constexpr std::int64_t kGemvMaxRows = 8;

// Weight rows per parallel chunk of the GEMV, for rows of row_bytes bytes (codes, scales and biases).
// Every chunk restarts the read streams, so a chunk holds about 1 MiB (on Zen 4 the cold GEMV ran
// 5-18% faster than with the 32-row chunks before, the plain read pass 6-15%), but a call keeps at
// least 4 chunks per thread of its budget, and 32 rows per chunk.
std::int64_t gemv_rows_per_chunk(std::int64_t rows, std::int64_t row_bytes);

// y [M, N] float32 = x [M, K] float32 @ W^T (transpose: W is N x K) or @ W (W is K x N), plus
// bias [N] when given. Products use the float32 values dequantize gives for W (the GEMV factors
// the group scale out of its partial sums); sums are float32.
void quantized_matmul(const float* x, std::int64_t M, const QuantizedMatrix& w, bool transpose, const float* bias,
                      float* y);

// y [M, N] float32 = x [M, K] float32 @ w^T (+ bias [N]) for a float weight w [N, K] of w_dtype
// (float32, bfloat16 or float16), sums in float32 (cpu/linear-inl.h gives their order).
void linear(const float* x, std::int64_t M, const void* w, DType w_dtype, std::int64_t N, std::int64_t K,
            const float* bias, float* y);

// qqmm on codes, as reference::qqmm: x packed [M, K*bits/8] with compact scales [M, K/group], w
// likewise [N, ...]; y [M, N] float32 = alpha * (x @ w^T) (+ bias [N]). spec is x's resolved spec
// (nvfp4, mxfp4 or mxfp8); its global scale is not used (alpha carries the tensor factors).
void qqmm(const std::uint8_t* px, const std::uint8_t* sx, const std::uint8_t* pw, const std::uint8_t* sw,
          std::int64_t M, std::int64_t N, std::int64_t K, const QuantSpec& spec, float alpha, const float* bias,
          float* y);

}  // namespace microscale::cpu
