#include "microscale/dtype.hpp"

namespace microscale {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::float32: return 4;
    case DType::float16: return 2;
    case DType::bfloat16: return 2;
    case DType::uint8: return 1;
    case DType::uint32: return 4;
    case DType::int32: return 4;
    case DType::int64: return 8;
  }
  throw Error("unknown dtype");
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::float32: return "float32";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
    case DType::uint8: return "uint8";
    case DType::uint32: return "uint32";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
  }
  return "unknown";
}

DType dtype_from_name(const std::string& name) {
  for (DType t :
       {DType::float32, DType::float16, DType::bfloat16, DType::uint8, DType::uint32, DType::int32, DType::int64}) {
    if (name == dtype_name(t)) return t;
  }
  throw Error("unsupported dtype '" + name + "'");
}

}  // namespace microscale
