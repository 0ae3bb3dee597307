// One planned layer quantized from its float values: the step quantize's write and --budget's
// error table share, so that a layer --budget chose is written with the very bytes it was
// measured with.
#pragma once

#include <optional>
#include <vector>

#include "io/quantize_plan.hpp"

namespace microscale::io::ck {

// A layer's codes and scales, with each expert's global scale for stacked three-level experts.
struct LayerQuant {
  Quantized q;
  std::vector<Global> expert_globals;
};

// Whether `l` written as `f` quantizes each stacked expert with its own global scale (GGUF's
// per-expert .scale), as the per-expert layouts quantize them.
bool quantizes_per_expert(const QuantizePlan& plan, const PlannedLayer& l, const LayerSpec& f);
// Each expert's amax of `x` [experts * N, K].
std::vector<float> expert_amaxes(const TensorView& x, std::int64_t experts);

// `l` quantized as `f` from its values `x`. A member of a fused group sharing one global scale
// passes the group's amax (`fused`) or, quantized per expert, the group's per-expert amaxes
// (`fused_experts`); mse then searches the block scales only. GPTQ where the plan has the layer's
// Hessian. Errors name the layer's tensor.
LayerQuant quantize_planned(const QuantizePlan& plan, const PlannedLayer& l, const LayerSpec& f, const TensorView& x,
                            std::optional<float> fused, const std::vector<float>* fused_experts,
                            const GptqOptions& gptq_options);

// The NaN and Inf values of `x`; throws naming the layer's tensor when `f` refuses them.
std::int64_t checked_nonfinite(const PlannedLayer& l, const LayerSpec& f, const TensorView& x);

// A Hessian tensor's values as float64 (any alignment).
std::vector<double> hessian_values(const StTensor& t);

}  // namespace microscale::io::ck
