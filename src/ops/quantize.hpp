// Internal: quantize with the global-scale search of scale_search 'mse' optional, for callers that
// must keep the global scale they pass (fused checkpoint layers share one).
#pragma once

#include "microscale/quantize.hpp"

namespace microscale::ops {

// microscale::quantize is quantize(x, spec, true).
Quantized quantize(const TensorView& x, const QuantSpec& spec, bool search_global_scale);

}  // namespace microscale::ops
