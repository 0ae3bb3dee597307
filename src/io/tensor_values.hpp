// Element values of safetensors data, for statistics and error measurements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "microscale/io.hpp"

namespace microscale::io::ck {

// Whether element_value reads `t` as numbers (floats, and the 8-bit float formats).
bool has_values(StDType t);
// Element `i` of data of dtype `t` as a double (U8 as E8M0 scale codes); NaN for other dtypes.
double element_value(const std::byte* data, StDType t, std::size_t i);

// The NaN and infinite values in data of float dtype `t` (none for other dtypes).
struct NonFiniteCount {
  std::int64_t nan = 0, inf = 0;
  std::int64_t total() const { return nan + inf; }
};
NonFiniteCount count_nonfinite(std::span<const std::byte> data, StDType t);

}  // namespace microscale::io::ck
