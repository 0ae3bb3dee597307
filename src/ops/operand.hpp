// Internal: the bytes of a planned quantized operand in host memory, laid out as compact
// row-major rows ready for the host kernels.
#pragma once

#include "core/convert.hpp"
#include "ops/plan.hpp"

namespace microscale::ops {

struct QuantizedOperand {
  detail::Rows packed;  // rows x K*bits/8 bytes
  detail::Rows scales;  // rows x groups, compact (unswizzled when given swizzled)
  detail::Rows biases;  // affine only
};

// Binds the views the plan was made from.
QuantizedOperand bind_operand(const OperandPlan& plan, const TensorView& packed, const TensorView& scales,
                              const TensorView* biases);

}  // namespace microscale::ops
