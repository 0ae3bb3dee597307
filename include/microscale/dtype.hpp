// Element types of tensors that cross the public API, and the error type every entry point throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace microscale {

// Every failure the library reports (bad shapes, unsupported modes, non-finite input under
// nonfinite=error, ...) is an Error with a message that names the argument at fault.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DType : std::uint8_t {
  float32,
  float16,
  bfloat16,
  uint8,
  uint32,
  int32,
  int64,
};

std::size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses "float32", "float16", "bfloat16", "uint8", "uint32", "int32", "int64"; throws Error otherwise.
DType dtype_from_name(const std::string& name);
inline bool is_float(DType t) { return t == DType::float32 || t == DType::float16 || t == DType::bfloat16; }

}  // namespace microscale
