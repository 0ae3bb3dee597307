// Internal: a quantized operand (packed values + scales (+ affine biases)) checked against its
// spec and laid out as compact row-major bytes, ready for any backend.
#pragma once

#include "core/convert.hpp"
#include "microscale/format.hpp"
#include "microscale/tensor.hpp"

namespace microscale::detail {

struct QuantizedOperand {
  QuantSpec spec;      // resolved
  Shape shape;         // logical [..., K]
  std::int64_t rows;   // product of the leading axes
  std::int64_t K;      // values per row
  std::int64_t groups;  // scales per row
  Rows packed;         // rows x K*bits/8 bytes
  Rows scales;         // rows x groups, compact (unswizzled when given swizzled)
  Rows biases;         // affine only
  DType scale_dtype;
};

// Throws Error naming `op` when dtypes or shapes disagree with the spec.
QuantizedOperand check_operand(const TensorView& packed, const TensorView& scales, const TensorView* biases,
                               const QuantSpec& spec, const char* op);

}  // namespace microscale::detail
