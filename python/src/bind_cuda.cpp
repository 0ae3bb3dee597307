// microscale._cuda: the CUDA backend (include/microscale/cuda.hpp) for microscale.torch's CUDA
// kernels. A module of its own so that microscale._core loads without the CUDA libraries; this
// one needs libcudart and libcublasLt, which `import torch` (CUDA wheels) or the toolkit provide.
//
// Arrays cross as DLPack arrays in CUDA memory (torch tensors), outputs allocated by the caller;
// the format as mode / group_size / bits / elem names, as the torch ops carry it; the stream as
// the integer handle torch.cuda.Stream.cuda_stream. Errors are microscale::Error (ValueError).

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "convert.hpp"
#include "microscale/cuda.hpp"

namespace cuda = microscale::cuda;

namespace {

using DType = ms::DType;

// The array an argument names, its device, layout and dtype checked (`allowed`), as a view of
// its device memory. `keep` holds the producer's memory for the call.
struct DeviceArray {
  cuda::DeviceTensor view;
  nb::ndarray<> keep;
};

std::string dtype_list(std::initializer_list<DType> allowed) {
  std::string s;
  for (DType t : allowed) s += (s.empty() ? "" : ", ") + std::string(ms::dtype_name(t));
  return s;
}

DeviceArray device_array(nb::handle obj, const char* what, std::initializer_list<DType> allowed) {
  DeviceArray out;
  if (!nb::try_cast(obj, out.keep)) {
    throw ms::Error(std::string(what) + ": expected a CUDA tensor (a DLPack array), got " +
                    nb::cast<std::string>(nb::str(obj.type().attr("__name__"))));
  }
  const nb::ndarray<>& a = out.keep;
  if (a.device_type() != nb::device::cuda::value) {
    throw ms::Error(std::string(what) + ": the array is not in CUDA memory (DLPack device type " +
                    std::to_string(a.device_type()) + "); the CUDA backend takes CUDA tensors");
  }
  const std::optional<DType> dtype = msbind::dtype_of(a.dtype());
  bool ok = false;
  for (DType t : allowed) ok = ok || dtype == t;
  if (!ok) {
    throw ms::Error(std::string(what) + ": unsupported dtype " +
                    (dtype ? std::string(ms::dtype_name(*dtype)) : std::string("(not a microscale dtype)")) +
                    " (expected " + dtype_list(allowed) + ")");
  }
  ms::Shape shape(a.ndim());
  std::int64_t expect = 1;
  bool contiguous = true;
  for (size_t i = a.ndim(); i-- > 0;) {
    shape[i] = static_cast<std::int64_t>(a.shape(i));
    contiguous = contiguous && (a.shape(i) == 1 || a.stride(i) == expect);
    expect *= shape[i];
  }
  if (!contiguous && a.size() != 0) {
    throw ms::Error(std::string(what) + ": the array must be contiguous (call .contiguous() first)");
  }
  out.view = {a.data(), *dtype, std::move(shape)};
  return out;
}

std::optional<DeviceArray> optional_array(nb::handle obj, const char* what, std::initializer_list<DType> allowed) {
  if (obj.is_none()) return std::nullopt;
  return device_array(obj, what, allowed);
}

const cuda::DeviceTensor* view_or_null(const std::optional<DeviceArray>& a) { return a ? &a->view : nullptr; }

constexpr std::initializer_list<DType> kFloats = {DType::float32, DType::float16, DType::bfloat16};
constexpr std::initializer_list<DType> kScales = {DType::uint8, DType::float32, DType::float16, DType::bfloat16};
constexpr std::initializer_list<DType> kIndices = {DType::int32, DType::int64, DType::uint32};

cuda::Stream stream_of(std::uintptr_t handle) { return reinterpret_cast<cuda::Stream>(handle); }

ms::QuantSpec spec_of(const std::string& mode, int group_size, int bits, const std::string& elem,
                      std::optional<float> global_scale) {
  ms::QuantSpec spec;
  spec.mode = ms::mode_from_name(mode);
  spec.group_size = group_size;
  spec.bits = bits;
  spec.elem = ms::elem_from_name(elem);
  spec.global_scale = global_scale;
  return spec;
}

// The checked device operands of a quantized weight: packed uint8 codes, scales (codes, or
// affine's floats) and affine's biases.
struct Weight {
  DeviceArray packed, scales;
  std::optional<DeviceArray> biases;

  Weight(nb::handle w_q, nb::handle s, nb::handle b)
      : packed(device_array(w_q, "w_q", {DType::uint8})),
        scales(device_array(s, "scales", kScales)),
        biases(optional_array(b, "biases", kFloats)) {}

  cuda::DeviceQuantized view() const {
    return {packed.view, scales.view, biases ? biases->view : cuda::DeviceTensor{}};
  }
};

void py_quantized_matmul(nb::handle x, nb::handle w_q, nb::handle scales, nb::handle biases, bool transpose,
                         const std::string& mode, int group_size, int bits, std::optional<float> global_scale,
                         const std::string& elem, nb::handle bias, nb::handle y, std::uintptr_t stream) {
  const DeviceArray xa = device_array(x, "x", kFloats);
  const Weight w(w_q, scales, biases);
  const std::optional<DeviceArray> ba = optional_array(bias, "bias", kFloats);
  const DeviceArray ya = device_array(y, "y", kFloats);
  const ms::QuantSpec spec = spec_of(mode, group_size, bits, elem, global_scale);
  nb::gil_scoped_release release;
  cuda::quantized_matmul(xa.view, w.view(), transpose, spec, ya.view, view_or_null(ba), stream_of(stream));
}

void py_gather_qmm(nb::handle x, nb::handle w_q, nb::handle scales, nb::handle biases, nb::handle lhs, nb::handle rhs,
                   bool transpose, const std::string& mode, int group_size, int bits, std::optional<float> global_scale,
                   const std::string& elem, bool sorted_indices, nb::handle y, std::uintptr_t stream) {
  const DeviceArray xa = device_array(x, "x", kFloats);
  const Weight w(w_q, scales, biases);
  const std::optional<DeviceArray> la = optional_array(lhs, "lhs_indices", kIndices);
  const std::optional<DeviceArray> ra = optional_array(rhs, "rhs_indices", kIndices);
  const DeviceArray ya = device_array(y, "y", kFloats);
  const ms::QuantSpec spec = spec_of(mode, group_size, bits, elem, global_scale);
  nb::gil_scoped_release release;
  cuda::gather_qmm(xa.view, w.view(), view_or_null(la), view_or_null(ra), transpose, spec, ya.view, sorted_indices,
                   stream_of(stream));
}

void py_qqmm(nb::handle x, nb::handle w, nb::handle w_scales, const std::string& mode, int group_size, int bits,
             std::optional<float> global_scale_x, std::optional<float> global_scale_w, const std::string& scale_rule,
             const std::string& nonfinite, const std::string& elem, nb::handle bias, nb::handle y,
             std::uintptr_t stream) {
  const DeviceArray xa = device_array(x, "x", kFloats);
  // w: float [N, K], quantized here, or packed uint8 codes with their scales.
  const DeviceArray wa = device_array(w, "w", {DType::uint8, DType::float32, DType::float16, DType::bfloat16});
  const std::optional<DeviceArray> sa = optional_array(w_scales, "scales", {DType::uint8});
  const std::optional<DeviceArray> ba = optional_array(bias, "bias", kFloats);
  const DeviceArray ya = device_array(y, "y", kFloats);
  ms::QuantSpec spec = spec_of(mode, group_size, bits, elem, std::nullopt);
  spec.scale_rule = ms::scale_rule_from_name(scale_rule);
  spec.nonfinite = ms::nonfinite_from_name(nonfinite);
  nb::gil_scoped_release release;
  cuda::qqmm(xa.view, wa.view, view_or_null(sa), spec, global_scale_x, global_scale_w, ya.view, view_or_null(ba),
             cuda::QqmmPath::automatic, stream_of(stream));
}

float py_amax(nb::handle x, std::uintptr_t stream) {
  const DeviceArray xa = device_array(x, "x", kFloats);
  nb::gil_scoped_release release;
  return cuda::amax(xa.view, stream_of(stream));
}

}  // namespace

NB_MODULE(_cuda, m) {
  m.doc() = "microscale's CUDA backend (include/microscale/cuda.hpp) over DLPack arrays in CUDA memory";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ms::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  m.def("available", &cuda::available,
        "True when a CUDA device is present and this build has kernels for it (sm_90a, sm_100a).");
  m.def("quantized_matmul", &py_quantized_matmul, nb::arg("x"), nb::arg("w_q"), nb::arg("scales"),
        nb::arg("biases").none(), nb::arg("transpose"), nb::arg("mode"), nb::arg("group_size"), nb::arg("bits"),
        nb::arg("global_scale").none(), nb::arg("elem"), nb::arg("bias").none(), nb::arg("y"), nb::arg("stream"));
  m.def("gather_qmm", &py_gather_qmm, nb::arg("x"), nb::arg("w_q"), nb::arg("scales"), nb::arg("biases").none(),
        nb::arg("lhs_indices").none(), nb::arg("rhs_indices").none(), nb::arg("transpose"), nb::arg("mode"),
        nb::arg("group_size"), nb::arg("bits"), nb::arg("global_scale").none(), nb::arg("elem"),
        nb::arg("sorted_indices"), nb::arg("y"), nb::arg("stream"));
  m.def("qqmm", &py_qqmm, nb::arg("x"), nb::arg("w"), nb::arg("scales").none(), nb::arg("mode"), nb::arg("group_size"),
        nb::arg("bits"), nb::arg("global_scale_x").none(), nb::arg("global_scale_w").none(), nb::arg("scale_rule"),
        nb::arg("nonfinite"), nb::arg("elem"), nb::arg("bias").none(), nb::arg("y"), nb::arg("stream"));
  m.def("amax", &py_amax, nb::arg("x"), nb::arg("stream"),
        "Largest |x| over finite values, 0 if none (the nvfp4 global scale); synchronizes the stream.");
}
