// microscale._core: a thin nanobind layer over the C++ API. Argument handling (dtype checks,
// defaults, messages) lives in python/microscale/__init__.py; this file binds the value types
// (QuantSpec and its enums, Quantized, the checkpoint's QuantizedLayer / RawTensor /
// CheckpointData) and turns numpy arrays into microscale::TensorView (dtype read from the array,
// strides in elements, so non-contiguous inputs are read in place) and microscale::Tensor results
// into numpy arrays sharing their buffers (convert.hpp). microscale::Error becomes ValueError.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "convert.hpp"
#include "microscale/checkpoint.hpp"
#include "microscale/microscale.hpp"
#include "microscale/runtime.hpp"

namespace nb = nanobind;
namespace ms = microscale;
using namespace msbind;  // NOLINT: the shared array conversions (convert.hpp)

namespace {

ms::Quantized py_quantize(const Array& x, const ms::QuantSpec& spec) {
  nb::gil_scoped_release release;
  return ms::quantize(x.view, spec);
}

nb::object py_dequantize(const Array& packed, const Array& scales, const std::optional<Array>& biases,
                         const ms::QuantSpec& spec, ms::DType dtype) {
  ms::Tensor y;
  {
    nb::gil_scoped_release release;
    y = ms::dequantize(packed.view, scales.view, view_or_null(biases), spec, dtype);
  }
  return to_numpy(std::move(y));
}

// quantize's parts as a tuple, (packed, scales) or (packed, scales, biases) for affine: one call
// instead of a Quantized object and its three properties (a small quantize is dominated by calls).
nb::tuple py_quantize_parts(const Array& x, const ms::QuantSpec& spec) {
  ms::Quantized q;
  {
    nb::gil_scoped_release release;
    q = ms::quantize(x.view, spec);
  }
  if (q.spec.mode == ms::Mode::affine) {
    return nb::make_tuple(to_numpy(std::move(q.packed)), to_numpy(std::move(q.scales)), to_numpy(std::move(q.biases)));
  }
  return nb::make_tuple(to_numpy(std::move(q.packed)), to_numpy(std::move(q.scales)));
}

// A Quantized's parts as a tuple of numpy arrays or torch tensors sharing its buffers: (packed,
// scales), or (packed, scales, biases) for affine.
nb::tuple export_parts(const ms::Quantized& q, bool torch) {
  const auto out = torch ? &to_torch : &to_numpy;
  if (q.spec.mode == ms::Mode::affine) return nb::make_tuple(out(q.packed), out(q.scales), out(q.biases));
  return nb::make_tuple(out(q.packed), out(q.scales));
}

// The common call with as little around it as possible (issue 14: a small quantize is dominated
// by the call): a numpy array or CPU torch tensor of a float dtype in, its parts out as the same
// type, sharing microscale's buffers. None for any other input or a spec whose search records a
// global scale; the Python layer then takes its general path, which has the messages.
nb::object py_quantize_fast(nb::handle x, const ms::QuantSpec& spec, bool torch) {
  if (spec.scale_search != ms::ScaleSearch::none && spec.global_scale) return nb::none();
  std::optional<ms::TensorView> view;
  Array numpy_array;  // holds a numpy input's import for the call
  try {
    if (torch) {
      view = read_torch(x);
    } else if (read_array(x, numpy_array)) {
      view = numpy_array.view;
    }
  } catch (const nb::python_error&) {
    return nb::none();  // e.g. a tensor without storage; the general path says what is wrong
  } catch (const nb::cast_error&) {
    return nb::none();
  }
  if (!view || !ms::is_float(view->dtype)) return nb::none();
  ms::Quantized q;
  {
    nb::gil_scoped_release release;
    q = ms::quantize(*view, spec);
  }
  return export_parts(q, torch);
}

// quantize then dequantize in one call (fake quantization): the same numerics as the two calls,
// without the packed parts crossing into Python.
nb::object py_quantize_dequantize(const Array& x, const ms::QuantSpec& spec, ms::DType dtype) {
  ms::Tensor y;
  {
    nb::gil_scoped_release release;
    y = ms::dequantize(ms::quantize(x.view, spec), dtype);
  }
  return to_numpy(std::move(y));
}

// GPTQ (microscale/gptq.hpp): H is float64 [K, K], converted and shape-checked by the caller's
// Python layer and by the C++ API.
ms::Quantized py_gptq(const Array& w, const nb::ndarray<const double, nb::c_contig, nb::device::cpu>& h,
                      const ms::QuantSpec& spec, double damp, int block_size) {
  ms::Shape shape;
  for (size_t i = 0; i < h.ndim(); ++i) shape.push_back(static_cast<std::int64_t>(h.shape(i)));
  nb::gil_scoped_release release;
  return ms::gptq(w.view, ms::HessianView{h.data(), shape}, spec, ms::GptqOptions{damp, block_size});
}

// H += x^T x into the caller's float64 [K, K] array (shape checked by the C++ API from its size and
// by the Python layer).
void py_accumulate_hessian(const Array& x, nb::ndarray<double, nb::c_contig, nb::device::cpu>& h) {
  const std::span<double> out(h.data(), h.size());
  nb::gil_scoped_release release;
  ms::accumulate_hessian(x.view, out);
}

nb::object py_hadamard_transform(const Array& x, ms::DType dtype) {
  ms::Tensor y;
  {
    nb::gil_scoped_release release;
    y = ms::hadamard_transform(x.view, dtype);
  }
  return to_numpy(std::move(y));
}

float py_global_scale(const Array& x) {
  nb::gil_scoped_release release;
  return ms::global_scale(x.view);
}

nb::object py_swizzle(const Array& s) {
  ms::Tensor t;
  {
    nb::gil_scoped_release release;
    t = ms::swizzle_scales(s.view);
  }
  return to_numpy(std::move(t));
}

nb::object py_unswizzle(const Array& s, std::int64_t rows, std::int64_t cols) {
  ms::Tensor t;
  {
    nb::gil_scoped_release release;
    t = ms::unswizzle_scales(s.view, rows, cols);
  }
  return to_numpy(std::move(t));
}

// Element codecs over contiguous arrays (the Python layer makes them contiguous).
enum class Fmt { e2m1, e4m3, e5m2, e8m0, bf16, f16 };

Fmt fmt_from_name(const std::string& s) {
  if (s == "e2m1") return Fmt::e2m1;
  if (s == "e4m3") return Fmt::e4m3;
  if (s == "e5m2") return Fmt::e5m2;
  if (s == "e8m0") return Fmt::e8m0;
  if (s == "bf16" || s == "bfloat16") return Fmt::bf16;
  if (s == "f16" || s == "float16") return Fmt::f16;
  throw ms::Error("unknown element format '" + s + "' (expected e2m1, e4m3, e5m2, e8m0, bf16 or f16)");
}

ms::Shape shape_of(const InArray& a) {
  ms::Shape shape(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) shape[i] = static_cast<std::int64_t>(a.shape(i));
  return shape;
}

// A numpy array owning a std::vector (for results with no microscale::DType, such as uint16).
template <class T>
nb::object vector_to_numpy(std::vector<T> v, const ms::Shape& shape_in) {
  static std::uint64_t empty_storage = 0;
  auto* owner = new std::vector<T>(std::move(v));
  nb::capsule cap(owner, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  std::vector<size_t> shape(shape_in.begin(), shape_in.end());
  void* data = owner->empty() ? static_cast<void*>(&empty_storage) : static_cast<void*>(owner->data());
  return nb::ndarray<nb::numpy, T>(data, shape.size(), shape.data(), cap).cast();
}

nb::object py_encode(const Array& x, const std::string& fmt_name) {
  const Fmt fmt = fmt_from_name(fmt_name);
  const ms::TensorView& xv = x.view;
  if (xv.dtype != ms::DType::float32) throw ms::Error("x: internal: encode takes float32");
  require_contiguous(x.keep, "x");
  const auto* src = static_cast<const float*>(xv.data);
  const auto n = static_cast<size_t>(xv.numel());
  if (fmt == Fmt::bf16 || fmt == Fmt::f16) {
    std::vector<std::uint16_t> out(n);
    {
      nb::gil_scoped_release release;
      for (size_t i = 0; i < n; ++i) {
        out[i] = fmt == Fmt::bf16 ? ms::encode_bf16(src[i]) : ms::encode_f16(src[i]);
      }
    }
    return vector_to_numpy(std::move(out), xv.shape);
  }
  std::vector<std::uint8_t> out(n);
  {
    nb::gil_scoped_release release;
    for (size_t i = 0; i < n; ++i) {
      switch (fmt) {
        case Fmt::e2m1: out[i] = ms::encode_e2m1(src[i]); break;
        case Fmt::e4m3: out[i] = ms::encode_e4m3(src[i]); break;
        case Fmt::e5m2: out[i] = ms::encode_e5m2(src[i]); break;
        case Fmt::e8m0: out[i] = ms::encode_e8m0(src[i]); break;
        default: break;
      }
    }
  }
  return vector_to_numpy(std::move(out), xv.shape);
}

nb::object py_decode(const InArray& codes, const std::string& fmt_name) {
  const Fmt fmt = fmt_from_name(fmt_name);
  const bool wide = fmt == Fmt::bf16 || fmt == Fmt::f16;
  const nb::dlpack::dtype want = {static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt),
                                  static_cast<std::uint8_t>(wide ? 16 : 8), 1};
  if (!(codes.dtype() == want)) {
    throw ms::Error(std::string("codes: expected ") + (wide ? "uint16" : "uint8") + " codes");
  }
  require_contiguous(codes, "codes");
  const ms::Shape shape = shape_of(codes);
  const std::int64_t n = ms::numel(shape);
  std::vector<float> out(static_cast<size_t>(n));
  float* dst = out.data();
  if (wide) {
    const auto* src = static_cast<const std::uint16_t*>(codes.data());
    nb::gil_scoped_release release;
    for (std::int64_t i = 0; i < n; ++i) {
      dst[i] = fmt == Fmt::bf16 ? ms::decode_bf16(src[i]) : ms::decode_f16(src[i]);
    }
  } else {
    const auto* src = static_cast<const std::uint8_t*>(codes.data());
    if (fmt == Fmt::e2m1) {
      for (std::int64_t i = 0; i < n; ++i) {
        if (src[i] > 0xF) {
          throw ms::Error("codes: E2M1 codes are 4-bit (0..15), got " + std::to_string(src[i]) + " at flat index " +
                          std::to_string(i));
        }
      }
    }
    nb::gil_scoped_release release;
    for (std::int64_t i = 0; i < n; ++i) {
      switch (fmt) {
        case Fmt::e2m1: dst[i] = ms::decode_e2m1(src[i]); break;
        case Fmt::e4m3: dst[i] = ms::decode_e4m3(src[i]); break;
        case Fmt::e5m2: dst[i] = ms::decode_e5m2(src[i]); break;
        case Fmt::e8m0: dst[i] = ms::decode_e8m0(src[i]); break;
        default: break;
      }
    }
  }
  return vector_to_numpy(std::move(out), shape);
}

// The ml_dtypes name of a DLPack 8-bit float code; nullptr for a code that names no 8-bit float
// format (producers that predate the float8 codes export them as plain Float, whose format is
// unknown).
const char* float8_name(nb::dlpack::dtype dt) {
  using nb::dlpack::dtype_code;
  if (dt.bits != 8 || dt.lanes != 1) return nullptr;
  switch (static_cast<dtype_code>(dt.code)) {
    case dtype_code::Float8_E3M4: return "float8_e3m4";
    case dtype_code::Float8_E4M3: return "float8_e4m3";
    case dtype_code::Float8_E4M3B11FNUZ: return "float8_e4m3b11fnuz";
    case dtype_code::Float8_E4M3FN: return "float8_e4m3fn";
    case dtype_code::Float8_E4M3FNUZ: return "float8_e4m3fnuz";
    case dtype_code::Float8_E5M2: return "float8_e5m2";
    case dtype_code::Float8_E5M2FNUZ: return "float8_e5m2fnuz";
    case dtype_code::Float8_E8M0FNU: return "float8_e8m0fnu";
    default: return nullptr;
  }
}

// A read-only numpy view of any DLPack producer's host memory (torch, MLX, JAX, CuPy host
// arrays), so that the Python layer checks one array type. No copy: the view holds the import,
// which holds the producer's buffer. bfloat16 comes back as ml_dtypes.bfloat16 (numpy has no
// bfloat16 of its own); 8-bit floats as their uint8 codes with the name of their ml_dtypes type,
// which the Python layer views them as: microscale reads codes only where their format is the
// one expected. Returns (array, ml_dtypes name or None).
nb::tuple py_host_view(nb::handle obj, const std::string& what) {
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(obj, a)) {
    throw nb::type_error((what + ": cannot be read through DLPack (expected an array with __dlpack__)").c_str());
  }
  if (a.device_type() != nb::device::cpu::value) {
    const char* device = a.device_type() == nb::device::cuda::value ? "CUDA" : "non-CPU";
    throw ms::Error(what + ": the array is in " + device + " memory (DLPack device type " +
                    std::to_string(a.device_type()) +
                    "); microscale's Python functions read host memory: copy it to the CPU first (e.g. tensor.cpu())");
  }
  // A producer without storage (a tensor that only carries a shape) exports a null pointer.
  if (a.data() == nullptr && a.size() != 0) {
    throw ms::Error(what + ": the array has no data (a null data pointer with " + std::to_string(a.size()) +
                    " elements)");
  }
  using nb::dlpack::dtype_code;
  nb::dlpack::dtype dt = a.dtype();
  const bool bf16 = dt.code == static_cast<std::uint8_t>(dtype_code::Bfloat) && dt.bits == 16;
  const char* float8 = float8_name(dt);
  const auto code = static_cast<dtype_code>(dt.code);
  const bool numpy_type = code == dtype_code::Int || code == dtype_code::UInt || code == dtype_code::Complex ||
                          code == dtype_code::Bool || (code == dtype_code::Float && dt.bits >= 16);
  if (!bf16 && float8 == nullptr && !numpy_type) {
    // e.g. an 8-bit Float that does not say which format it holds, or packed 4-bit floats.
    throw nb::type_error((what + ": unsupported DLPack dtype (type code " + std::to_string(dt.code) + ", " +
                          std::to_string(dt.bits) + " bits); pass uint8 codes or a float array")
                             .c_str());
  }
  if (bf16) dt = {static_cast<std::uint8_t>(dtype_code::UInt), 16, 1};
  if (float8 != nullptr) dt = {static_cast<std::uint8_t>(dtype_code::UInt), 8, 1};
  std::vector<size_t> shape(a.ndim());
  std::vector<std::int64_t> strides(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = a.shape(i);
    strides[i] = a.stride(i);
  }
  static std::uint64_t empty_storage = 0;  // numpy wants a non-null pointer even for size 0
  const void* data = a.data() != nullptr ? a.data() : &empty_storage;
  auto* owner = new nb::ndarray<nb::ro>(a);
  nb::capsule cap(owner, [](void* p) noexcept { delete static_cast<nb::ndarray<nb::ro>*>(p); });
  nb::object out = nb::ndarray<nb::numpy, nb::ro>(data, shape.size(), shape.data(), cap, strides.data(), dt).cast();
  if (bf16) out = out.attr("view")(nb::module_::import_("ml_dtypes").attr("bfloat16"));
  return nb::make_tuple(out, float8 != nullptr ? nb::object(nb::str(float8)) : nb::none());
}

void py_set_backend(const std::string& name) {
  const std::optional<ms::Backend> b = ms::backend_from_name(name);
  if (!b) throw ms::Error("unknown backend '" + name + "' (expected cpu, reference or cuda)");
  ms::set_backend(*b);
}

std::string py_backend() { return ms::name(ms::backend()); }

}  // namespace

// ---- the value types -------------------------------------------------------------------------
// Enums by the names the C++ API prints (ms::name); from_name parses them with its messages.
template <class E>
nb::enum_<E> bind_enum(nb::module_& m, const char* type_name, std::initializer_list<E> values,
                       E (*from_name)(const std::string&)) {
  nb::enum_<E> e(m, type_name);
  for (E v : values) e.value(ms::name(v), v);
  e.def_static("from_name", from_name, nb::arg("name"));
  return e;
}

void bind_types(nb::module_& m) {
  using ms::Elem, ms::Layout, ms::Mode, ms::NonFinite, ms::ScaleRule, ms::ScaleSearch;
  bind_enum(m, "Mode", {Mode::nvfp4, Mode::mxfp4, Mode::mxfp8, Mode::affine}, &ms::mode_from_name);
  bind_enum(m, "ScaleRule", {ScaleRule::ceil, ScaleRule::floor, ScaleRule::even, ScaleRule::nearest},
            &ms::scale_rule_from_name);
  bind_enum(m, "NonFinite", {NonFinite::propagate, NonFinite::error, NonFinite::saturate}, &ms::nonfinite_from_name);
  bind_enum(m, "Layout", {Layout::compact, Layout::swizzled}, &ms::layout_from_name);
  bind_enum(m, "Elem", {Elem::e4m3, Elem::e5m2}, &ms::elem_from_name);
  bind_enum(m, "ScaleSearch", {ScaleSearch::none, ScaleSearch::four_over_six, ScaleSearch::mse},
            &ms::scale_search_from_name);
  nb::enum_<ms::DType> dtype(m, "DType");
  for (ms::DType t : {ms::DType::float32, ms::DType::float16, ms::DType::bfloat16, ms::DType::uint8, ms::DType::uint32,
                      ms::DType::int32, ms::DType::int64}) {
    dtype.value(ms::dtype_name(t), t);
  }

  nb::class_<ms::QuantSpec>(m, "QuantSpec")
      .def(
          "__init__",
          [](ms::QuantSpec* s, Mode mode, int group_size, int bits, ScaleRule scale_rule, NonFinite nonfinite,
             Layout layout, Elem elem, std::optional<float> global_scale, ScaleSearch scale_search, bool scale_2d,
             bool hadamard, std::optional<std::uint64_t> sr_seed) {
            new (s) ms::QuantSpec{mode, group_size,   bits,         scale_rule, nonfinite, layout,
                                  elem, scale_search, global_scale, scale_2d,   hadamard,  sr_seed};
          },
          nb::kw_only(), nb::arg("mode") = Mode::nvfp4, nb::arg("group_size") = 0, nb::arg("bits") = 0,
          nb::arg("scale_rule") = ScaleRule::ceil, nb::arg("nonfinite") = NonFinite::propagate,
          nb::arg("layout") = Layout::compact, nb::arg("elem") = Elem::e4m3,
          nb::arg("global_scale").none() = nb::none(), nb::arg("scale_search") = ScaleSearch::none,
          nb::arg("scale_2d") = false, nb::arg("hadamard") = false, nb::arg("sr_seed").none() = nb::none())
      .def_rw("mode", &ms::QuantSpec::mode)
      .def_rw("group_size", &ms::QuantSpec::group_size)
      .def_rw("bits", &ms::QuantSpec::bits)
      .def_rw("scale_rule", &ms::QuantSpec::scale_rule)
      .def_rw("nonfinite", &ms::QuantSpec::nonfinite)
      .def_rw("layout", &ms::QuantSpec::layout)
      .def_rw("elem", &ms::QuantSpec::elem)
      .def_rw("scale_search", &ms::QuantSpec::scale_search)
      .def_rw("global_scale", &ms::QuantSpec::global_scale, nb::arg("value").none())
      .def_rw("scale_2d", &ms::QuantSpec::scale_2d)
      .def_rw("hadamard", &ms::QuantSpec::hadamard)
      .def_rw("sr_seed", &ms::QuantSpec::sr_seed, nb::arg("value").none());

  // The parts come back as numpy arrays sharing the tensors' buffers; the constructor copies the
  // arrays it is given (C-contiguous), so the object owns what it holds.
  nb::class_<ms::Quantized>(m, "Quantized")
      .def(
          "__init__",
          [](ms::Quantized* q, const Array& packed, const Array& scales, const std::optional<Array>& biases,
             const ms::QuantSpec& spec, ms::Shape shape) {
            ms::Tensor b = biases ? copy_of(*biases, "biases") : ms::Tensor();
            new (q) ms::Quantized{copy_of(packed, "packed"), copy_of(scales, "scales"), std::move(b), spec,
                                  std::move(shape)};
          },
          nb::arg("packed"), nb::arg("scales"), nb::arg("biases").none(), nb::arg("spec"), nb::arg("shape"))
      .def_prop_ro("packed", [](const ms::Quantized& q) { return to_numpy(q.packed); })
      .def_prop_ro("scales", [](const ms::Quantized& q) { return to_numpy(q.scales); })
      .def_prop_ro(
          "biases",
          [](const ms::Quantized& q) { return q.spec.mode == ms::Mode::affine ? to_numpy(q.biases) : nb::none(); })
      .def("parts", &export_parts, nb::arg("torch"),
           "(packed, scales[, biases]) as numpy arrays, or torch tensors with torch=True, sharing the buffers")
      .def_rw("spec", &ms::Quantized::spec)
      .def_rw("shape", &ms::Quantized::shape);
}

// ---- checkpoint I/O (python/microscale/checkpoint.py) ----------------------------------------
namespace ckpt {

namespace io = ms::io;

// Messages quote bytes from hostile files (JSON parser errors echo them); Python needs UTF-8, so
// bytes that do not form valid UTF-8 sequences become '?'.
std::string valid_utf8(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (std::size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 2;
    if (ok) {
      out.append(s, i, n);
      i += n;
    } else {
      out += '?';
      ++i;
    }
  }
  return out;
}

template <class F>
auto guarded(F&& f) {
  try {
    return f();
  } catch (const ms::Error& e) {
    throw ms::Error(valid_utf8(e.what()));
  }
}

io::CheckpointData py_load_checkpoint(const std::string& path) {
  nb::gil_scoped_release release;
  return guarded([&] { return io::load_checkpoint(path); });
}

void py_save_checkpoint(const std::string& path, const io::CheckpointData& data, io::Convention convention,
                        bool force) {
  nb::gil_scoped_release release;
  guarded([&] {
    io::save_checkpoint(path, data, convention, force);
    return 0;
  });
}

// quantize_checkpoint with the options microscale.quantize_checkpoint passes (its docstring says
// what each means); returns {"tensors": [...], "budget": [...], "notes": [...]}.
nb::dict py_quantize_checkpoint(const std::string& in, const std::string& out, const std::string& format,
                                const std::string& export_name,
                                const std::vector<std::pair<std::string, std::string>>& rules,
                                const std::string& recipe_file, std::optional<double> budget,
                                const std::vector<std::string>& candidates, const std::string& budget_csv,
                                const std::string& hessians, const std::vector<std::string>& exclude,
                                const std::vector<std::string>& include, bool force) {
  io::Report r;
  {
    nb::gil_scoped_release release;
    r = guarded([&] {
      io::QuantizeOptions opt;
      const io::LayerFormat base = io::parse_layer_format(format, "format");
      if (base.keep()) throw ms::Error("format 'keep' quantizes nothing; name a format (nvfp4, mxfp8, ...)");
      if (base.levels) throw ms::Error("format: levels is a recipe option (rules=[('*', 'nvfp4,levels=2')])");
      opt.spec = *base.spec;
      opt.scale_rule_set = base.scale_rule_set;
      opt.to = export_name.empty() ? io::default_convention(opt.spec.mode) : io::convention_from_name(export_name);
      if (!recipe_file.empty()) opt.recipe = io::read_recipe(recipe_file);
      for (const auto& [pattern, f] : rules)
        opt.recipe.push_back({pattern, io::parse_layer_format(f, "rule " + pattern + "=" + f)});
      opt.budget_bits = budget;
      for (const std::string& c : candidates) opt.candidates.push_back(io::parse_layer_format(c, "candidate " + c));
      if ((!candidates.empty() || !budget_csv.empty()) && !budget)
        throw ms::Error("candidates and budget_csv belong to budget; give budget too");
      opt.budget_csv = budget_csv;
      opt.hessians = hessians;
      opt.exclude = exclude;
      opt.include = include;
      opt.force = force;
      return io::quantize_checkpoint(in, out, opt);
    });
  }
  nb::list tensors, choices, notes;
  for (const io::TensorReport& t : r.tensors) {
    nb::dict d;
    d["name"] = t.name;
    d["action"] = std::string(io::name(t.action));
    d["format"] = t.format;
    d["reason"] = t.reason;
    tensors.append(d);
  }
  for (const io::BudgetReport& b : r.budget) {
    nb::dict d;
    d["layers"] = b.layers;
    d["format"] = b.format;
    d["bits"] = b.bits;
    d["error"] = b.error;
    choices.append(d);
  }
  for (const std::string& n : r.notes) notes.append(n);
  nb::dict out_dict;
  out_dict["tensors"] = tensors;
  out_dict["budget"] = choices;
  out_dict["notes"] = notes;
  return out_dict;
}

void bind(nb::module_& m) {
  nb::enum_<io::Convention> convention(m, "Convention");
  // The C++ names table is the one list of conventions: "compressed-tensors" is `compressed_tensors`.
  for (io::Convention c : io::conventions()) {
    std::string label = io::name(c);
    std::replace(label.begin(), label.end(), '-', '_');  // a Python name
    convention.value(label.c_str(), c);
  }
  convention.def_static(
      "from_name", [](const std::string& s) { return io::convention_from_name(s); }, nb::arg("name"));
  convention.def_prop_ro("label", [](io::Convention c) { return std::string(io::name(c)); });
  convention.def_prop_ro("activation_scales", [](io::Convention c) { return io::stores_activation_scales(c); });
  convention.def_prop_ro("model_directory", [](io::Convention c) { return io::is_model_directory(c); });

  nb::class_<io::QuantizedLayer>(m, "QuantizedLayer")
      .def(
          "__init__",
          [](io::QuantizedLayer* l, std::string module, ms::Quantized weight, std::optional<float> input_amax) {
            new (l) io::QuantizedLayer{std::move(module), std::move(weight), input_amax};
          },
          nb::arg("module"), nb::arg("weight"), nb::arg("input_amax").none())
      .def_rw("module", &io::QuantizedLayer::module)
      .def_rw("weight", &io::QuantizedLayer::weight)
      .def_rw("input_amax", &io::QuantizedLayer::input_amax, nb::arg("value").none());

  // A tensor that is no part of a quantized layer, kept as its bytes and safetensors dtype name
  // ("F32", "BF16", "F8_E4M3", ...: F4 and F6 have no numpy type).
  nb::class_<io::RawTensor>(m, "RawTensor")
      .def_ro("name", &io::RawTensor::name)
      .def_prop_ro("dtype", [](const io::RawTensor& t) { return std::string(io::st_dtype_name(t.dtype)); })
      .def_ro("shape", &io::RawTensor::shape)
      .def_prop_ro("data", [](const io::RawTensor& t) {
        ms::Tensor b(ms::DType::uint8, {static_cast<std::int64_t>(t.data.size())});
        if (!t.data.empty()) std::memcpy(b.bytes(), t.data.data(), t.data.size());
        return to_numpy(std::move(b));
      });

  // Built up by add_layer / add_tensor, so that no list of large tensors is copied on the way in.
  nb::class_<io::CheckpointData>(m, "CheckpointData")
      .def(nb::init<>())
      .def_rw("convention", &io::CheckpointData::convention)
      .def_rw("config_json", &io::CheckpointData::config_json)
      .def_ro("layers", &io::CheckpointData::layers)
      .def_ro("tensors", &io::CheckpointData::tensors)
      // [(name, dtype, shape, uint8 array)], each tensor's bytes moved into its array (no copy,
      // so a model's float tensors are held once while they are read); tensors is empty after.
      .def("take_tensors",
           [](io::CheckpointData& d) {
             static std::uint64_t empty_storage = 0;  // numpy wants a non-null pointer even for size 0
             nb::list out;
             for (io::RawTensor& t : d.tensors) {
               auto* owner = new std::vector<std::byte>(std::move(t.data));
               nb::capsule cap(owner, [](void* p) noexcept { delete static_cast<std::vector<std::byte>*>(p); });
               std::size_t n = owner->size();
               void* data = n != 0 ? static_cast<void*>(owner->data()) : static_cast<void*>(&empty_storage);
               OutArray bytes(data, 1, &n, cap, nullptr, dlpack_dtype(ms::DType::uint8));
               out.append(nb::make_tuple(t.name, std::string(io::st_dtype_name(t.dtype)), t.shape, bytes.cast()));
             }
             d.tensors.clear();
             return out;
           })
      .def(
          "add_layer", [](io::CheckpointData& d, io::QuantizedLayer layer) { d.layers.push_back(std::move(layer)); },
          nb::arg("layer"))
      .def(
          "add_tensor",
          [](io::CheckpointData& d, std::string name, const std::string& dtype, ms::Shape shape, const Array& data) {
            const auto st = io::st_dtype_from_name(dtype);
            if (!st) throw ms::Error("tensor " + name + ": unknown safetensors dtype " + dtype);
            const ms::Tensor b = copy_of(data, "tensor bytes");
            if (b.dtype() != ms::DType::uint8) throw ms::Error("tensor " + name + ": internal: bytes must be uint8");
            d.tensors.push_back(
                io::RawTensor{std::move(name), *st, std::move(shape), {b.bytes(), b.bytes() + b.nbytes()}});
          },
          nb::arg("name"), nb::arg("dtype"), nb::arg("shape"), nb::arg("data"));

  m.def("load_checkpoint", &py_load_checkpoint, nb::arg("path"));
  m.def("save_checkpoint", &py_save_checkpoint, nb::arg("path"), nb::arg("data"), nb::arg("convention"),
        nb::arg("force"));
  m.def("quantize_checkpoint", &py_quantize_checkpoint, nb::arg("model"), nb::arg("output"), nb::arg("format"),
        nb::arg("export"), nb::arg("rules"), nb::arg("recipe_file"), nb::arg("budget").none(), nb::arg("candidates"),
        nb::arg("budget_csv"), nb::arg("hessians"), nb::arg("exclude"), nb::arg("include"), nb::arg("force"));
}

}  // namespace ckpt

void bind_matmul(nb::module_& m);  // bind_matmul.cpp: quantized_matmul, qqmm, gather_qmm

NB_MODULE(_core, m) {
  m.doc() = "microscale C++ core (use the functions of the microscale package instead)";
  // The project version (CMakeLists.txt), which is also the package's (pyproject.toml reads it).
  m.attr("__version__") = MICROSCALE_VERSION;

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ms::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  bind_types(m);
  m.def("quantize", &py_quantize, nb::arg("x"), nb::arg("spec"));
  m.def("dequantize", &py_dequantize, nb::arg("packed"), nb::arg("scales"), nb::arg("biases").none(), nb::arg("spec"),
        nb::arg("dtype"));
  m.def("global_scale", &py_global_scale, nb::arg("x"));
  m.def("gptq", &py_gptq, nb::arg("w"), nb::arg("hessian"), nb::arg("spec"), nb::arg("damp"), nb::arg("block_size"));
  m.def("accumulate_hessian", &py_accumulate_hessian, nb::arg("x"), nb::arg("hessian"));
  m.def("hadamard_transform", &py_hadamard_transform, nb::arg("x"), nb::arg("dtype"));
  m.def("quantize_parts", &py_quantize_parts, nb::arg("x"), nb::arg("spec"));
  m.def("quantize_fast", &py_quantize_fast, nb::arg("x"), nb::arg("spec"), nb::arg("torch"));
  m.def("quantize_dequantize", &py_quantize_dequantize, nb::arg("x"), nb::arg("spec"), nb::arg("dtype"));
  m.def("swizzle_scales", &py_swizzle, nb::arg("scales"));
  m.def("unswizzle_scales", &py_unswizzle, nb::arg("scales"), nb::arg("rows"), nb::arg("cols"));
  m.def("encode", &py_encode, nb::arg("x"), nb::arg("fmt"),
        "float32 C-contiguous -> uint8 codes (uint16 bits for bf16/f16)");
  m.def("decode", &py_decode, nb::arg("codes"), nb::arg("fmt"));
  m.def("host_view", &py_host_view, nb::arg("obj"), nb::arg("what"),
        "(a read-only numpy view of a DLPack producer's host memory, the ml_dtypes name of its 8-bit "
        "float type or None); bfloat16 as ml_dtypes.bfloat16, 8-bit floats as their uint8 codes");

  // A mode's default (group_size, bits), from the library's one table; None for an unknown name.
  m.def(
      "mode_defaults",
      [](const std::string& mode) -> std::optional<std::pair<int, int>> {
        ms::QuantSpec spec;
        try {
          spec.mode = ms::mode_from_name(mode);
        } catch (const ms::Error&) {
          return std::nullopt;
        }
        spec = ms::resolve(spec);
        return std::pair{spec.group_size, spec.bits};
      },
      nb::arg("mode"));

  m.def("set_backend", &py_set_backend, nb::arg("name"));
  m.def("backend", &py_backend);
  m.def("set_cpu_target", &ms::set_cpu_target, nb::arg("name"));
  m.def("cpu_target", &ms::cpu_target);
  m.def("available_cpu_targets", &ms::available_cpu_targets);
  m.def("set_num_threads", &ms::set_num_threads, nb::arg("n"));
  m.attr("MAX_THREADS") = ms::kMaxThreads;
  m.def("num_threads", &ms::num_threads);
  // The address of an OpenMP runtime's GOMP_parallel (microscale.torch passes torch's), 0 for the
  // own pool: see set_parallel_runner. Private: a wrong address is not checkable here.
  m.def(
      "_set_parallel_runner",
      [](std::uintptr_t address) { ms::set_parallel_runner(reinterpret_cast<ms::ParallelRunner>(address)); },
      nb::arg("address"));
  m.def("_has_parallel_runner", &ms::has_parallel_runner);

  ckpt::bind(m);   // checkpoint I/O
  bind_matmul(m);  // quantized matrix products
}
