// GPTQ: error-compensating rounding of a weight with calibration statistics (docs/numerics.md,
// "GPTQ"). The columns of W [N, K] are rounded in order, each in the target format's exact grid,
// and each column's rounding error is fed into the columns not yet rounded through the inverse of
// H = X^T X (X: the layer's inputs, [samples, K]). The result is the same Quantized that quantize
// returns, in the same standard bytes: dequantize decodes it; only the chosen codes and scales differ.
#pragma once

#include <cstdint>
#include <span>

#include "microscale/quantize.hpp"

namespace microscale {

struct GptqOptions {
  // Fraction of the mean diagonal of H added to the diagonal before the factorization.
  double damp = 0.01;
  // Columns per lazy batch: the error of a batch reaches the later columns in one pass at its end.
  // A multiple of the group size.
  int block_size = 128;
};

// H as float64, row-major [K, K] (symmetric; a non-symmetric one is refused).
struct HessianView {
  const double* data = nullptr;
  Shape shape;
};

// Quantizes w (float32, float16 or bfloat16, [N, K], any strides, finite) with GPTQ under `spec`
// (nvfp4, mxfp4, mxfp8 or affine; spec.global_scale gives three-level nvfp4 and should be the amax
// of the original w; scale_search must be none). CPU only, multithreaded over rows; the result
// does not depend on the thread count. Throws Error naming the argument for a shape mismatch, a
// non-finite w or H, or an H that is not positive definite after dampening.
Quantized gptq(const TensorView& w, const HessianView& hessian, const QuantSpec& spec, const GptqOptions& opt = {});
// The same with a float32 H [K, K] (widened to float64).
Quantized gptq(const TensorView& w, const TensorView& hessian, const QuantSpec& spec, const GptqOptions& opt = {});

// H += X^T X for a batch x (float32, float16 or bfloat16, [..., K]: leading axes are samples),
// accumulated in float64 into the row-major [K, K] buffer `hessian` (K * K values).
void accumulate_hessian(const TensorView& x, std::span<double> hessian);

}  // namespace microscale
