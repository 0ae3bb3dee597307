// microscale._core: quantized matrix products (include/microscale/matmul.hpp). Argument handling
// lives in python/microscale/matmul.py; arrays cross with their dtype names as in bindings.cpp,
// optional arrays as None. Errors are microscale::Error (ValueError in Python).

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>

#include "convert.hpp"

using namespace msbind;  // NOLINT: the shared array conversions

namespace {

using OptArray = std::optional<InArray>;

// A view of an optional array (empty when absent) and the pointer the C++ API takes.
struct OptView {
  ms::TensorView view;
  bool present = false;
  OptView(const OptArray& a, const std::string& dtype, const char* what) {
    if (a) {
      view = view_of(*a, dtype, what);
      present = true;
    }
  }
  const ms::TensorView* get() const { return present ? &view : nullptr; }
};

Out py_quantized_matmul(const InArray& x, const std::string& x_dtype, const InArray& wq, const InArray& scales,
                        const std::string& scales_dtype, const OptArray& biases, const std::string& biases_dtype,
                        bool transpose, const std::string& mode, int group_size, int bits, const std::string& elem,
                        std::optional<double> global_scale, const OptArray& bias, const std::string& bias_dtype) {
  const ms::QuantSpec spec = make_spec(mode, group_size, bits, "ceil", "propagate", "compact", elem, global_scale);
  const ms::TensorView xv = view_of(x, x_dtype, "x"), wv = view_of(wq, "uint8", "w_q");
  const ms::TensorView sv = view_of(scales, scales_dtype, "scales");
  const OptView bv(biases, biases_dtype, "biases"), yb(bias, bias_dtype, "bias");
  ms::Tensor y;
  {
    nb::gil_scoped_release release;
    y = ms::quantized_matmul(xv, wv, sv, bv.get(), transpose, spec, yb.get());
  }
  return to_numpy(std::move(y));
}

Out py_qqmm(const InArray& x, const std::string& x_dtype, const InArray& w, const std::string& w_dtype,
            const OptArray& scales, const std::string& mode, int group_size, int bits,
            const std::string& scale_rule, const std::string& nonfinite, const std::string& elem,
            std::optional<double> global_scale_x, std::optional<double> global_scale_w, const OptArray& bias,
            const std::string& bias_dtype) {
  const ms::QuantSpec spec = make_spec(mode, group_size, bits, scale_rule, nonfinite, "compact", elem, std::nullopt);
  const ms::TensorView xv = view_of(x, x_dtype, "x"), wv = view_of(w, w_dtype, "w");
  const OptView sv(scales, "uint8", "scales"), yb(bias, bias_dtype, "bias");
  // The Python layer rounded the global scales to float32, so these narrowings are exact.
  std::optional<float> gx, gw;
  if (global_scale_x) gx = static_cast<float>(*global_scale_x);
  if (global_scale_w) gw = static_cast<float>(*global_scale_w);
  ms::Tensor y;
  {
    nb::gil_scoped_release release;
    y = ms::qqmm(xv, wv, sv.get(), spec, gx, gw, yb.get());
  }
  return to_numpy(std::move(y));
}

Out py_gather_qmm(const InArray& x, const std::string& x_dtype, const InArray& wq, const InArray& scales,
                  const std::string& scales_dtype, const OptArray& biases, const std::string& biases_dtype,
                  const OptArray& lhs, const std::string& lhs_dtype, const OptArray& rhs,
                  const std::string& rhs_dtype, bool transpose, const std::string& mode, int group_size, int bits,
                  const std::string& elem, std::optional<double> global_scale, bool sorted_indices) {
  const ms::QuantSpec spec = make_spec(mode, group_size, bits, "ceil", "propagate", "compact", elem, global_scale);
  const ms::TensorView xv = view_of(x, x_dtype, "x"), wv = view_of(wq, "uint8", "w_q");
  const ms::TensorView sv = view_of(scales, scales_dtype, "scales");
  const OptView bv(biases, biases_dtype, "biases"), lv(lhs, lhs_dtype, "lhs_indices"),
      rv(rhs, rhs_dtype, "rhs_indices");
  ms::Tensor y;
  {
    nb::gil_scoped_release release;
    y = ms::gather_qmm(xv, wv, sv, bv.get(), lv.get(), rv.get(), transpose, spec, sorted_indices);
  }
  return to_numpy(std::move(y));
}

}  // namespace

void bind_matmul(nb::module_& m) {
  m.def("quantized_matmul", &py_quantized_matmul, nb::arg("x"), nb::arg("x_dtype"), nb::arg("w_q"),
        nb::arg("scales"), nb::arg("scales_dtype"), nb::arg("biases").none(), nb::arg("biases_dtype"),
        nb::arg("transpose"), nb::arg("mode"), nb::arg("group_size"), nb::arg("bits"), nb::arg("elem"),
        nb::arg("global_scale").none(), nb::arg("bias").none(), nb::arg("bias_dtype"), "-> (y, dtype)");
  m.def("qqmm", &py_qqmm, nb::arg("x"), nb::arg("x_dtype"), nb::arg("w"), nb::arg("w_dtype"),
        nb::arg("scales").none(), nb::arg("mode"), nb::arg("group_size"), nb::arg("bits"), nb::arg("scale_rule"),
        nb::arg("nonfinite"), nb::arg("elem"), nb::arg("global_scale_x").none(), nb::arg("global_scale_w").none(),
        nb::arg("bias").none(), nb::arg("bias_dtype"), "-> (y, dtype)");
  m.def("gather_qmm", &py_gather_qmm, nb::arg("x"), nb::arg("x_dtype"), nb::arg("w_q"), nb::arg("scales"),
        nb::arg("scales_dtype"), nb::arg("biases").none(), nb::arg("biases_dtype"), nb::arg("lhs").none(),
        nb::arg("lhs_dtype"), nb::arg("rhs").none(), nb::arg("rhs_dtype"), nb::arg("transpose"), nb::arg("mode"),
        nb::arg("group_size"), nb::arg("bits"), nb::arg("elem"), nb::arg("global_scale").none(),
        nb::arg("sorted_indices"), "-> (y, dtype)");
}
