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
    // ml_dtypes' types are numpy kind 'V', except float8_e5m2, which is kind 'f' (numpy has no
    // 1-byte float of its own). Only they need the name, which numpy computes in Python (several
    // microseconds, more than a small quantize).
    const auto kind = nb::cast<std::string>(dt.attr("kind"));
    if (kind == "V" || (kind == "f" && nb::cast<int>(dt.attr("itemsize")) == 1)) {
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
  if (a.data() == nullptr && a.size() != 0) return false;  // a producer without storage
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

// torch without linking against it: the objects the fast path compares against and calls,
// looked up when the first torch tensor arrives (torch is imported by then) and kept for the
// process's life, like the torch module itself. Not a guarded static: the lookup runs Python
// code, which may switch threads, and a second thread would then wait on the guard holding the GIL.
struct TorchApi {
  nb::handle tensor_type, parameter_type, strided;
  nb::handle float32, float16, bfloat16;
  nb::handle from_dlpack;  // torch._C._from_dlpack: torch.from_dlpack less its Python wrapper
};

inline const TorchApi& torch_api() {
  static const TorchApi* api = nullptr;
  if (api == nullptr) {
    const nb::module_ torch = nb::module_::import_("torch");
    nb::object from_dlpack = nb::getattr(torch.attr("_C"), "_from_dlpack", nb::none());
    if (from_dlpack.is_none()) from_dlpack = torch.attr("from_dlpack");
    const auto keep = [&](const char* name) { return nb::object(torch.attr(name)).release(); };
    api = new TorchApi{keep("Tensor"),       nb::object(torch.attr("nn").attr("Parameter")).release(),
                       keep("strided"),      keep("float32"),
                       keep("float16"),      keep("bfloat16"),
                       from_dlpack.release()};
  }
  return *api;
}

// A CPU torch tensor of a float dtype, read in place through data_ptr / shape / stride: torch's
// __dlpack__ and Tensor.numpy() each cost more than a small quantize. nullopt for anything else
// (a subclass, another dtype, device or layout, no elements, the negative bit, no data), which
// the caller's general path handles with its messages.
inline std::optional<ms::TensorView> read_torch(nb::handle t) {
  const TorchApi& api = torch_api();
  if (!t.type().is(api.tensor_type) && !t.type().is(api.parameter_type)) return std::nullopt;
  const nb::object dt = t.attr("dtype");
  ms::DType dtype;
  if (dt.is(api.float32)) {
    dtype = ms::DType::float32;
  } else if (dt.is(api.bfloat16)) {
    dtype = ms::DType::bfloat16;
  } else if (dt.is(api.float16)) {
    dtype = ms::DType::float16;
  } else {
    return std::nullopt;
  }
  if (!t.attr("layout").is(api.strided) || !nb::cast<bool>(t.attr("is_cpu"))) return std::nullopt;
  // Its memory holds the values before negation (x.conj().imag, torch._neg_view): the general path
  // resolves the bit. (The conjugate bit exists on complex tensors only.)
  if (nb::cast<bool>(t.attr("is_neg")())) return std::nullopt;
  const auto shape_obj = nb::cast<nb::tuple>(t.attr("shape"));  // torch.Size is a tuple
  const auto strides_obj = nb::cast<nb::tuple>(t.attr("stride")());
  ms::Shape shape(shape_obj.size()), strides(shape_obj.size());
  if (strides_obj.size() != shape.size()) return std::nullopt;
  for (size_t i = 0; i < shape.size(); ++i) {
    shape[i] = nb::cast<std::int64_t>(shape_obj[i]);
    strides[i] = nb::cast<std::int64_t>(strides_obj[i]);
    if (shape[i] == 0 || strides[i] < 0) return std::nullopt;
  }
  const auto data = nb::cast<std::uintptr_t>(t.attr("data_ptr")());
  if (data == 0) return std::nullopt;
  return ms::TensorView(reinterpret_cast<const void*>(data), dtype, std::move(shape), std::move(strides));
}

// A torch tensor sharing the tensor's buffer (no copy), through a DLPack capsule; bfloat16 is
// DLPack's own bfloat16 code, which torch reads as torch.bfloat16.
inline nb::object to_torch(ms::Tensor t) {
  auto* owner = new ms::Tensor(std::move(t));
  nb::capsule cap(owner, [](void* p) noexcept { delete static_cast<ms::Tensor*>(p); });
  std::vector<size_t> shape(owner->shape().begin(), owner->shape().end());
  static std::uint64_t empty_storage = 0;  // torch, like numpy, wants a non-null pointer
  void* data = owner->bytes() != nullptr ? static_cast<void*>(owner->bytes()) : static_cast<void*>(&empty_storage);
  nb::dlpack::dtype dt = dlpack_dtype(owner->dtype());
  if (owner->dtype() == ms::DType::bfloat16) dt.code = static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat);
  // A plain nb::ndarray (no framework) exports as a DLPack capsule, which torch imports in place.
  const nb::object capsule = nb::ndarray<>(data, shape.size(), shape.data(), cap, nullptr, dt).cast();
  return torch_api().from_dlpack(capsule);
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
