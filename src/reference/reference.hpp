// Scalar reference kernels: the executable form of FORMATS.md sections 2-4. Every float
// operation is one binary32 operation in the written order (the library builds with
// -ffp-contract=off), so the fast backends can be checked against these bit for bit.
//
// Kernels take row-major data: `rows` rows of K values, already validated by src/ops.
#pragma once

#include <cstddef>
#include <cstdint>

#include "microscale/format.hpp"
#include "microscale/tensor.hpp"

namespace microscale::reference {

// x: rows*K float32 values, exact widenings of the caller's `src` dtype (needed by the 'nearest'
// scale rule and to round affine scales/biases). spec must be resolved; nonfinite 'error' has
// been checked by the caller. Writes packed [rows, K*bits/8], compact scales [rows, K/group]
// (uint8, or src-typed for affine) and, for affine, biases. index0 is the flat index of x[0] in
// the whole tensor (stochastic rounding keys its random bits by it); with scale_2d, x must start
// at a multiple of 16 rows.
void quantize(const float* x, std::int64_t rows, std::int64_t K, DType src, const QuantSpec& spec, std::uint8_t* packed,
              std::byte* scales, std::byte* biases, std::int64_t index0 = 0);

// Three-level nvfp4 mse's global-scale search: totals[c] = the sum over the `blocks` blocks of 16
// of x of the error mse's block scale leaves under global scale globals[c]
// (numerics::nvfp4_searched_block_scale's error), and, where scales is not null, scales[c * blocks + b] =
// the block scale code that search chose for block b. False, with the outputs untouched, when x
// holds a NaN or Inf.
bool nvfp4_global_errors(const float* x, std::int64_t blocks, const float* globals, int n, double* totals,
                         std::uint8_t* scales = nullptr);
// Three-level nvfp4 element codes of the finite blocks of x under global scale global_scale and
// the given block scale codes, round-to-nearest (packed as quantize packs them).
void nvfp4_encode(const float* x, std::int64_t blocks, float global_scale, const std::uint8_t* scales,
                  std::uint8_t* packed);

// Inverse: compact scales of dtype `scale_dtype` (uint8 for fp modes), biases of the same dtype
// (affine), output y [rows, K] of dtype `out`.
void dequantize(const std::uint8_t* packed, const std::byte* scales, const std::byte* biases, DType scale_dtype,
                std::int64_t rows, std::int64_t K, const QuantSpec& spec, DType out, std::byte* y);

// max |x_i| over finite values; 0 if there is none.
float amax_finite(const float* x, std::int64_t n);

// Compact [R, C] bytes <-> swizzled [roundup(R,128), roundup(C,4)] bytes (FORMATS.md 4).
void swizzle(const std::uint8_t* compact, std::int64_t R, std::int64_t C, std::uint8_t* out);
void unswizzle(const std::uint8_t* swizzled, std::int64_t R, std::int64_t C, std::uint8_t* out);

}  // namespace microscale::reference

namespace microscale::reference {

// y[m, n] = sum_k x[m, k] * w(n, k) (+ bias[n]), summed in float32 in k order; w(n, k) is
// w[n*K + k] when transpose, else w[k*N + n]. x is [M, K], y is [M, N].
void matmul(const float* x, const float* w, std::int64_t M, std::int64_t N, std::int64_t K, bool transpose,
            const float* bias, float* y);

// qqmm on codes: x packed [M, K*bits/8] with compact scales [M, K/group], w likewise [N, ...].
// Per block, the float32 dot of element values (exact for nvfp4) times (sx * sw), summed over
// blocks in order; then y = alpha * acc (+ bias). spec is resolved (nvfp4, mxfp4 or mxfp8).
void qqmm(const std::uint8_t* px, const std::uint8_t* sx, const std::uint8_t* pw, const std::uint8_t* sw,
          std::int64_t M, std::int64_t N, std::int64_t K, const QuantSpec& spec, float alpha, const float* bias,
          float* y);

}  // namespace microscale::reference
