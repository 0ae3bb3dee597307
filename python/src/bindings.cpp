// microscale._core: a thin nanobind layer over the C++ API. Argument handling (dtype checks,
// bfloat16 views, defaults) lives in python/microscale/__init__.py; this file only turns numpy
// arrays into microscale::TensorView (strides in elements, so non-contiguous inputs are read in
// place) and microscale::Tensor results into numpy arrays that own them.
//
// Every array crosses together with a dtype name ("float32", "float16", "bfloat16", "uint8", ...);
// bfloat16 travels as uint16 bits in both directions. microscale::Error becomes ValueError.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "microscale/checkpoint.hpp"
#include "microscale/microscale.hpp"
#include "microscale/runtime.hpp"
#include "convert.hpp"

namespace nb = nanobind;
namespace ms = microscale;
using namespace msbind;  // NOLINT: the shared array conversions (convert.hpp)

namespace {

nb::tuple py_quantize(const InArray& x, const std::string& x_dtype, const std::string& mode,
                      int group_size, int bits, const std::string& scale_rule,
                      const std::string& nonfinite, const std::string& layout,
                      const std::string& elem, std::optional<double> global_scale) {
  const ms::QuantSpec spec =
      make_spec(mode, group_size, bits, scale_rule, nonfinite, layout, elem, global_scale);
  const ms::TensorView xv = view_of(x, x_dtype, "w");
  ms::Quantized q;
  {
    nb::gil_scoped_release release;
    q = ms::quantize(xv, spec);
  }
  nb::object biases = nb::none();
  if (q.spec.mode == ms::Mode::affine) biases = nb::cast(to_numpy(std::move(q.biases)));
  return nb::make_tuple(to_numpy(std::move(q.packed)), to_numpy(std::move(q.scales)), biases,
                        q.spec.group_size, q.spec.bits);
}

Out py_dequantize(const InArray& packed, const std::string& packed_dtype, const InArray& scales,
                  const std::string& scales_dtype, const std::optional<InArray>& biases,
                  const std::string& biases_dtype, const std::string& mode, int group_size,
                  int bits, const std::string& scale_rule, const std::string& nonfinite,
                  const std::string& layout, const std::string& elem,
                  std::optional<double> global_scale, const std::string& out_dtype) {
  const ms::QuantSpec spec =
      make_spec(mode, group_size, bits, scale_rule, nonfinite, layout, elem, global_scale);
  const ms::DType dt = ms::dtype_from_name(out_dtype);
  const ms::TensorView pv = view_of(packed, packed_dtype, "w_q");
  const ms::TensorView sv = view_of(scales, scales_dtype, "scales");
  std::optional<ms::TensorView> bv;
  if (biases) bv = view_of(*biases, biases_dtype, "biases");
  ms::Tensor y;
  {
    nb::gil_scoped_release release;
    y = ms::dequantize(pv, sv, bv ? &*bv : nullptr, spec, dt);
  }
  return to_numpy(std::move(y));
}

double py_global_scale(const InArray& x, const std::string& x_dtype) {
  const ms::TensorView xv = view_of(x, x_dtype, "w");
  nb::gil_scoped_release release;
  return static_cast<double>(ms::global_scale(xv));
}

Out py_swizzle(const InArray& s, const std::string& s_dtype) {
  const ms::TensorView sv = view_of(s, s_dtype, "scales");
  ms::Tensor t;
  {
    nb::gil_scoped_release release;
    t = ms::swizzle_scales(sv);
  }
  return to_numpy(std::move(t));
}

Out py_unswizzle(const InArray& s, const std::string& s_dtype, std::int64_t rows,
                 std::int64_t cols) {
  const ms::TensorView sv = view_of(s, s_dtype, "scales");
  ms::Tensor t;
  {
    nb::gil_scoped_release release;
    t = ms::unswizzle_scales(sv, rows, cols);
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
  throw ms::Error("unknown element format '" + s +
                  "' (expected e2m1, e4m3, e5m2, e8m0, bf16 or f16)");
}

ms::Shape shape_of(const InArray& a) {
  ms::Shape shape(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) shape[i] = static_cast<std::int64_t>(a.shape(i));
  return shape;
}

void require_contiguous(const InArray& a, const char* what) {
  if (a.size() == 0) return;
  std::int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) {
      throw ms::Error(std::string(what) + ": internal: array must be C-contiguous");
    }
    expect *= static_cast<std::int64_t>(a.shape(i));
  }
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

nb::object py_encode(const InArray& x, const std::string& fmt_name) {
  const Fmt fmt = fmt_from_name(fmt_name);
  const ms::TensorView xv = view_of(x, "float32", "x");
  require_contiguous(x, "x");
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
          throw ms::Error("codes: E2M1 codes are 4-bit (0..15), got " + std::to_string(src[i]) +
                          " at flat index " + std::to_string(i));
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

void py_set_backend(const std::string& name) {
  if (name == "cpu") {
    ms::set_backend(ms::Backend::cpu);
  } else if (name == "reference") {
    ms::set_backend(ms::Backend::reference);
  } else {
    throw ms::Error("unknown backend '" + name + "' (expected cpu or reference)");
  }
}

std::string py_backend() { return ms::backend() == ms::Backend::cpu ? "cpu" : "reference"; }

}  // namespace

// ---- checkpoint I/O (python/microscale/checkpoint.py) ----------------------------------------
// Layers cross as tuples (module, mode, group_size, bits, global_scale | None, shape,
// (packed, dtype), (scales, dtype), (biases, dtype) | None, input_amax | None); tensors without a
// quantized role as (name, safetensors dtype name, shape, uint8 bytes). checkpoint.py builds the
// Python objects.
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

ms::Tensor copy_of(const InArray& a, const std::string& dtype_name, const char* what) {
  const ms::TensorView v = view_of(a, dtype_name, what);
  require_contiguous(a, what);
  ms::Tensor t(v.dtype, v.shape);
  if (t.nbytes()) std::memcpy(t.bytes(), v.data, t.nbytes());
  return t;
}

nb::tuple py_load_checkpoint(const std::string& path) {
  io::CheckpointData d;
  {
    nb::gil_scoped_release release;
    d = guarded([&] { return io::load_checkpoint(path); });
  }
  nb::list layers, tensors;
  for (io::QuantizedLayer& l : d.layers) {
    ms::Quantized& q = l.weight;
    nb::object gs = q.spec.global_scale ? nb::cast(static_cast<double>(*q.spec.global_scale)) : nb::none();
    nb::object act = l.input_amax ? nb::cast(static_cast<double>(*l.input_amax)) : nb::none();
    nb::object biases = q.spec.mode == ms::Mode::affine ? nb::cast(to_numpy(std::move(q.biases))) : nb::none();
    layers.append(nb::make_tuple(l.module, ms::name(q.spec.mode), q.spec.group_size, q.spec.bits, gs, q.shape,
                                 to_numpy(std::move(q.packed)), to_numpy(std::move(q.scales)), biases, act));
  }
  for (io::RawTensor& t : d.tensors) {
    ms::Tensor b(ms::DType::uint8, {static_cast<std::int64_t>(t.data.size())});
    if (!t.data.empty()) std::memcpy(b.bytes(), t.data.data(), t.data.size());
    tensors.append(nb::make_tuple(t.name, io::st_dtype_name(t.dtype), t.shape, to_numpy(std::move(b)).first));
  }
  return nb::make_tuple(d.convention, layers, tensors, d.config_json);
}

void py_save_checkpoint(const std::string& path, const nb::list& layers, const nb::list& tensors,
                        const std::string& convention, const std::string& config_json, bool force) {
  io::CheckpointData d;
  d.config_json = config_json;
  for (nb::handle h : layers) {
    auto t = nb::cast<nb::tuple>(h);
    if (t.size() != 13) throw ms::Error("internal: layer tuple of " + std::to_string(t.size()) + " items");
    io::QuantizedLayer l;
    l.module = nb::cast<std::string>(t[0]);
    ms::QuantSpec& s = l.weight.spec;
    s.mode = ms::mode_from_name(nb::cast<std::string>(t[1]));
    s.group_size = nb::cast<int>(t[2]);
    s.bits = nb::cast<int>(t[3]);
    if (!t[4].is_none()) s.global_scale = static_cast<float>(nb::cast<double>(t[4]));
    l.weight.shape = nb::cast<ms::Shape>(t[5]);
    l.weight.packed = copy_of(nb::cast<InArray>(t[6]), nb::cast<std::string>(t[7]), "packed");
    l.weight.scales = copy_of(nb::cast<InArray>(t[8]), nb::cast<std::string>(t[9]), "scales");
    if (!t[10].is_none()) l.weight.biases = copy_of(nb::cast<InArray>(t[10]), nb::cast<std::string>(t[11]), "biases");
    if (!t[12].is_none()) l.input_amax = static_cast<float>(nb::cast<double>(t[12]));
    d.layers.push_back(std::move(l));
  }
  for (nb::handle h : tensors) {
    auto t = nb::cast<nb::tuple>(h);
    io::RawTensor r;
    r.name = nb::cast<std::string>(t[0]);
    const std::string dt = nb::cast<std::string>(t[1]);
    const auto st = io::st_dtype_from_name(dt);
    if (!st) throw ms::Error("tensor " + r.name + ": unknown safetensors dtype " + dt);
    r.dtype = *st;
    r.shape = nb::cast<ms::Shape>(t[2]);
    const ms::Tensor b = copy_of(nb::cast<InArray>(t[3]), "uint8", "tensor bytes");
    r.data.assign(b.bytes(), b.bytes() + b.nbytes());
    d.tensors.push_back(std::move(r));
  }
  const io::Convention c = io::convention_from_name(convention);
  nb::gil_scoped_release release;
  guarded([&] {
    io::save_checkpoint(path, d, c, force);
    return 0;
  });
}

void bind(nb::module_& m) {
  m.def("load_checkpoint", &py_load_checkpoint, nb::arg("path"),
        "-> (convention, [layer tuples], [(name, st_dtype, shape, bytes)], config_json)");
  m.def("save_checkpoint", &py_save_checkpoint, nb::arg("path"), nb::arg("layers"), nb::arg("tensors"),
        nb::arg("convention"), nb::arg("config_json"), nb::arg("force"));
}

}  // namespace ckpt

void bind_matmul(nb::module_& m);  // bind_matmul.cpp: quantized_matmul, qqmm, gather_qmm

NB_MODULE(_core, m) {
  m.doc() = "microscale C++ core (use the functions of the microscale package instead)";

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ms::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  m.def("quantize", &py_quantize, nb::arg("x"), nb::arg("x_dtype"), nb::arg("mode"),
        nb::arg("group_size"), nb::arg("bits"), nb::arg("scale_rule"), nb::arg("nonfinite"),
        nb::arg("layout"), nb::arg("elem"), nb::arg("global_scale").none(),
        "-> ((packed, dtype), (scales, dtype), (biases, dtype) | None, group_size, bits)");
  m.def("dequantize", &py_dequantize, nb::arg("packed"), nb::arg("packed_dtype"),
        nb::arg("scales"), nb::arg("scales_dtype"), nb::arg("biases").none(),
        nb::arg("biases_dtype"), nb::arg("mode"), nb::arg("group_size"), nb::arg("bits"),
        nb::arg("scale_rule"), nb::arg("nonfinite"), nb::arg("layout"), nb::arg("elem"),
        nb::arg("global_scale").none(), nb::arg("out_dtype"), "-> (y, dtype)");
  m.def("global_scale", &py_global_scale, nb::arg("x"), nb::arg("x_dtype"));
  m.def("swizzle_scales", &py_swizzle, nb::arg("scales"), nb::arg("scales_dtype"));
  m.def("unswizzle_scales", &py_unswizzle, nb::arg("scales"), nb::arg("scales_dtype"),
        nb::arg("rows"), nb::arg("cols"));
  m.def("encode", &py_encode, nb::arg("x"), nb::arg("fmt"),
        "float32 C-contiguous -> uint8 codes (uint16 bits for bf16/f16)");
  m.def("decode", &py_decode, nb::arg("codes"), nb::arg("fmt"));

  m.def("set_backend", &py_set_backend, nb::arg("name"));
  m.def("backend", &py_backend);
  m.def("set_cpu_target", &ms::set_cpu_target, nb::arg("name"));
  m.def("cpu_target", &ms::cpu_target);
  m.def("available_cpu_targets", &ms::available_cpu_targets);
  m.def("set_num_threads", &ms::set_num_threads, nb::arg("n"));
  m.def("num_threads", &ms::num_threads);

  ckpt::bind(m);  // checkpoint I/O
  bind_matmul(m);  // quantized matrix products
}
