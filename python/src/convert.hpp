// Array conversions shared by the binding sources (bindings.cpp, bind_matmul.cpp): numpy arrays in
// as msbind::Array (a microscale::TensorView whose dtype is read from the array itself),
// microscale::Tensor results out as numpy arrays of the matching dtype.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "microscale/microscale.hpp"

namespace nb = nanobind;
namespace ms = microscale;

namespace msbind {

// Any dtype, any strides, read-only allowed.
using InArray = nb::ndarray<nb::ro, nb::device::cpu>;
using OutArray = nb::ndarray<nb::numpy>;

// A numpy array argument as the C++ API reads it. `keep` holds the memory `view` points into for
// as long as the argument lives (the call).
struct Array {
  ms::TensorView view;
  InArray keep;
};

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

inline std::optional<ms::DType> dtype_of(nb::dlpack::dtype d) {
  for (ms::DType t : {ms::DType::float32, ms::DType::float16, ms::DType::uint8, ms::DType::uint32, ms::DType::int32,
                      ms::DType::int64}) {
    if (d == dlpack_dtype(t)) return t;
  }
  if (d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat) && d.bits == 16 && d.lanes == 1) {
    return ms::DType::bfloat16;
  }
  return std::nullopt;
}

// ml_dtypes' types reach nanobind through neither DLPack nor the buffer protocol, so their arrays
// are read through an unsigned-integer view of the same bytes: bfloat16 as its uint16 bits, the
// 8-bit (and byte-stored 4-bit) floats as uint8 codes.
inline bool read_array(nb::handle src, Array& out) {
  nb::object arr = nb::borrow(src);
  std::optional<ms::DType> dtype;
  if (nb::hasattr(arr, "dtype")) {
    const nb::object dt = arr.attr("dtype");
    // ml_dtypes' types are numpy kind 'V'. Only they need the name, which numpy computes in
    // Python (several microseconds, more than a small quantize).
    if (nb::cast<std::string>(dt.attr("kind")) == "V") {
      const auto name = nb::cast<std::string>(dt.attr("name"));
      const auto itemsize = nb::cast<int>(dt.attr("itemsize"));
      if (name == "bfloat16" && itemsize == 2) {
        arr = arr.attr("view")("uint16");
        dtype = ms::DType::bfloat16;
      } else if ((name.rfind("float8_", 0) == 0 || name.rfind("float4_", 0) == 0) && itemsize == 1) {
        arr = arr.attr("view")("uint8");
      }
    }
  }
  if (!nb::try_cast(arr, out.keep)) return false;
  if (!dtype) dtype = dtype_of(out.keep.dtype());
  if (!dtype) return false;
  const InArray& a = out.keep;
  ms::Shape shape(a.ndim()), strides(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = static_cast<std::int64_t>(a.shape(i));
    strides[i] = a.stride(i);
    // The Python layer copies arrays with negative strides; strides are in elements here.
    if (strides[i] < 0) return false;
  }
  out.view = ms::TensorView(a.data(), *dtype, std::move(shape), std::move(strides));
  return true;
}

// A numpy array sharing the tensor's buffer (microscale::Tensor copies share it), dtype included:
// bfloat16 comes back as ml_dtypes.bfloat16.
inline nb::object to_numpy(ms::Tensor t) {
  static std::uint64_t empty_storage = 0;  // numpy wants a non-null pointer even for size 0
  auto* owner = new ms::Tensor(std::move(t));
  nb::capsule cap(owner, [](void* p) noexcept { delete static_cast<ms::Tensor*>(p); });
  std::vector<size_t> shape(owner->shape().begin(), owner->shape().end());
  void* data = owner->bytes() != nullptr ? static_cast<void*>(owner->bytes()) : static_cast<void*>(&empty_storage);
  OutArray arr(data, shape.size(), shape.data(), cap, nullptr, dlpack_dtype(owner->dtype()));
  nb::object out = arr.cast();
  if (owner->dtype() == ms::DType::bfloat16) {
    out = out.attr("view")(nb::module_::import_("ml_dtypes").attr("bfloat16"));
  }
  return out;
}

inline void require_contiguous(const InArray& a, const char* what) {
  if (a.size() == 0) return;
  std::int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) {
      throw ms::Error(std::string(what) + ": internal: array must be C-contiguous");
    }
    expect *= static_cast<std::int64_t>(a.shape(i));
  }
}

// An owning copy of a C-contiguous array (the checkpoint writer keeps what it is given).
inline ms::Tensor copy_of(const Array& a, const char* what) {
  require_contiguous(a.keep, what);
  ms::Tensor t(a.view.dtype, a.view.shape);
  if (t.nbytes()) std::memcpy(t.bytes(), a.view.data, t.nbytes());
  return t;
}

// The pointer the C++ API takes for an optional array.
inline const ms::TensorView* view_or_null(const std::optional<Array>& a) { return a ? &a->view : nullptr; }

}  // namespace msbind

namespace nanobind::detail {

// msbind::Array arguments: a failed conversion is a TypeError naming the function's signature
// (the Python layer checks dtypes first, with its own messages).
template <>
struct type_caster<msbind::Array> {
  NB_TYPE_CASTER(msbind::Array, const_name("numpy.ndarray"))

  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    try {
      return msbind::read_array(src, value);
    } catch (...) {
      PyErr_Clear();
      return false;
    }
  }
};

}  // namespace nanobind::detail
