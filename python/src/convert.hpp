// Array and spec conversions shared by the binding sources (bindings.cpp, bind_matmul.cpp):
// numpy arrays in as microscale::TensorView, microscale::Tensor results out as numpy arrays.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "microscale/microscale.hpp"

namespace nb = nanobind;
namespace ms = microscale;

namespace msbind {

// Any dtype, any strides, read-only allowed; the dtype is checked against the name passed along.
using InArray = nb::ndarray<nb::ro, nb::device::cpu>;
using OutArray = nb::ndarray<nb::numpy>;
// An array as it comes back to Python: the numpy array and its microscale dtype name.
using Out = std::pair<nb::object, std::string>;

inline nb::dlpack::dtype dlpack_dtype(ms::DType t) {
  using nb::dlpack::dtype_code;
  switch (t) {
    case ms::DType::float32: return {static_cast<std::uint8_t>(dtype_code::Float), 32, 1};
    case ms::DType::float16: return {static_cast<std::uint8_t>(dtype_code::Float), 16, 1};
    case ms::DType::bfloat16: return {static_cast<std::uint8_t>(dtype_code::UInt), 16, 1};  // bits
    case ms::DType::uint8: return {static_cast<std::uint8_t>(dtype_code::UInt), 8, 1};
    case ms::DType::uint32: return {static_cast<std::uint8_t>(dtype_code::UInt), 32, 1};
    case ms::DType::int32: return {static_cast<std::uint8_t>(dtype_code::Int), 32, 1};
    case ms::DType::int64: return {static_cast<std::uint8_t>(dtype_code::Int), 64, 1};
  }
  throw ms::Error("internal: unknown dtype");
}

inline ms::TensorView view_of(const InArray& a, const std::string& dtype_name, const char* what) {
  const ms::DType dt = ms::dtype_from_name(dtype_name);
  const nb::dlpack::dtype want = dlpack_dtype(dt);
  const nb::dlpack::dtype got = a.dtype();
  const bool bf16_ok = dt == ms::DType::bfloat16 && got.bits == 16 && got.lanes == 1 &&
                       got.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat);
  if (!(got == want) && !bf16_ok) {
    throw ms::Error(std::string(what) + ": array does not hold " + dtype_name + " data");
  }
  ms::Shape shape(a.ndim()), strides(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = static_cast<std::int64_t>(a.shape(i));
    strides[i] = a.stride(i);
    if (strides[i] < 0) throw ms::Error(std::string(what) + ": negative strides are not supported");
  }
  return ms::TensorView(a.data(), dt, std::move(shape), std::move(strides));
}

// Hands the tensor to a numpy array that owns it (freed when the array is collected).
inline Out to_numpy(ms::Tensor t) {
  static std::uint64_t empty_storage = 0;  // numpy wants a non-null pointer even for size 0
  auto* owner = new ms::Tensor(std::move(t));
  nb::capsule cap(owner, [](void* p) noexcept { delete static_cast<ms::Tensor*>(p); });
  std::vector<size_t> shape(owner->shape().begin(), owner->shape().end());
  void* data = owner->bytes() != nullptr ? static_cast<void*>(owner->bytes())
                                         : static_cast<void*>(&empty_storage);
  OutArray arr(data, shape.size(), shape.data(), cap, nullptr, dlpack_dtype(owner->dtype()));
  return {arr.cast(), ms::dtype_name(owner->dtype())};
}

inline ms::QuantSpec make_spec(const std::string& mode, int group_size, int bits,
                        const std::string& scale_rule, const std::string& nonfinite,
                        const std::string& layout, const std::string& elem,
                        std::optional<double> global_scale) {
  ms::QuantSpec spec;
  spec.mode = ms::mode_from_name(mode);
  spec.group_size = group_size;
  spec.bits = bits;
  spec.scale_rule = ms::scale_rule_from_name(scale_rule);
  spec.nonfinite = ms::nonfinite_from_name(nonfinite);
  spec.layout = ms::layout_from_name(layout);
  spec.elem = ms::elem_from_name(elem);
  // The Python layer already rounded the value to float32, so this narrowing is exact.
  if (global_scale) spec.global_scale = static_cast<float>(*global_scale);
  return spec;
}

}  // namespace msbind
