// Matrix products with quantized operands (FORMATS.md section 6). Every product accumulates in
// float32 whatever the input dtype, using the float32 value `dequantize` gives for each weight,
// and rounds to the output dtype once.
#pragma once

#include <optional>

#include "microscale/format.hpp"
#include "microscale/quantize.hpp"
#include "microscale/tensor.hpp"

namespace microscale {

// y = x @ W^T (transpose = true; W logical [..., N, K], stored [..., N, K*bits/8] with scales
// [..., N, K/group]) or y = x @ W (transpose = false; W logical [..., K, N], stored
// [..., K, N*bits/8], groups along N), as MLX defines them.
//   x       float32 / float16 / bfloat16 [..., M, K] (rank 1 means one row; the result drops it)
//   batch   x.shape[:-2] and w.shape[:-2] broadcast against each other
//   spec    mode, group_size, bits, elem; spec.global_scale is the weight's amax (nvfp4 three-level)
//   bias    optional float [N], added in float32 before the single rounding
// Output dtype: x's for fp modes; for affine the promotion of x and the scales' dtype (float32
// unless both are the same half type).
Tensor quantized_matmul(const TensorView& x, const TensorView& wq, const TensorView& scales, const TensorView* biases,
                        bool transpose, const QuantSpec& spec, const TensorView* bias = nullptr);
Tensor quantized_matmul(const TensorView& x, const Quantized& w, bool transpose = true,
                        const TensorView* bias = nullptr);

// y = x @ w^T (+ bias) for a float weight w [N, K] (float32, float16 or bfloat16, read in its own
// dtype): the layers a quantized model keeps unquantized, such as a language model's head. x is
// float [..., K], the result [..., N] in x's dtype, summed in float32 and rounded once. Meant for
// few rows of x (decode), where reading w is the cost: each weight row is read once per four rows
// of x; a GEMM library serves many rows better. CPU backends only.
Tensor linear(const TensorView& x, const TensorView& w, const TensorView* bias = nullptr);

// Both operands quantized: y = x @ w^T with w 2-D [N, K]. x (rank >= 1, [..., K]) is quantized on
// the fly exactly as `quantize` does with `spec` (and global_scale_x); w is either float (then
// quantized with global_scale_w) or already packed (then `w_scales` holds its scales). Modes nvfp4,
// mxfp4, mxfp8; nvfp4 takes both global scales or neither. Per K-block the exact block dot is
// scaled by the product of the two block scales; three-level nvfp4 multiplies the float32 sum by
// alpha = (amax_x * amax_w) / 2688^2 before rounding to x's dtype. Optional bias [N] as above.
Tensor qqmm(const TensorView& x, const TensorView& w, const TensorView* w_scales, const QuantSpec& spec,
            std::optional<float> global_scale_x = std::nullopt, std::optional<float> global_scale_w = std::nullopt,
            const TensorView* bias = nullptr);

// Mixture-of-experts product, MLX's gather_qmm: out[i] = x[lhs[i]] @ W[rhs[i]] (or W^T), where lhs
// indexes the flattened batch axes of x (x.shape[:-2]) and rhs those of w. A missing index array
// defaults to arange over its operand's batch, shaped like that batch; the two broadcast and the
// result has shape broadcast(lhs, rhs).shape + (M, N). Indices are int32, int64 or uint32 and
// must be in range. `sorted_indices` is a speed hint only; results never depend on it.
Tensor gather_qmm(const TensorView& x, const TensorView& wq, const TensorView& scales, const TensorView* biases,
                  const TensorView* lhs_indices, const TensorView* rhs_indices, bool transpose, const QuantSpec& spec,
                  bool sorted_indices = false);

}  // namespace microscale
