// microscale._core: quantized matrix products (include/microscale/matmul.hpp). Argument handling
// lives in python/microscale/matmul.py; arrays cross as numpy arrays (their dtypes read from
// them, convert.hpp), the format as a QuantSpec, optional arrays as None. Errors are
// microscale::Error (ValueError in Python).

#include <nanobind/stl/optional.h>

#include <optional>

#include "convert.hpp"

using namespace msbind;  // NOLINT: the shared array conversions

namespace {

using OptArray = std::optional<Array>;

nb::object py_quantized_matmul(const Array& x, const Array& w_q, const Array& scales, const OptArray& biases,
                               bool transpose, const ms::QuantSpec& spec, const OptArray& bias) {
  ms::Tensor y;
  {
    nb::gil_scoped_release release;
    y = ms::quantized_matmul(x.view, w_q.view, scales.view, view_or_null(biases), transpose, spec, view_or_null(bias));
  }
  return to_numpy(std::move(y));
}

nb::object py_qqmm(const Array& x, const Array& w, const OptArray& scales, const ms::QuantSpec& spec,
                   std::optional<float> global_scale_x, std::optional<float> global_scale_w, const OptArray& bias) {
  ms::Tensor y;
  {
    nb::gil_scoped_release release;
    y = ms::qqmm(x.view, w.view, view_or_null(scales), spec, global_scale_x, global_scale_w, view_or_null(bias));
  }
  return to_numpy(std::move(y));
}

nb::object py_gather_qmm(const Array& x, const Array& w_q, const Array& scales, const OptArray& biases,
                         const OptArray& lhs, const OptArray& rhs, bool transpose, const ms::QuantSpec& spec,
                         bool sorted_indices) {
  ms::Tensor y;
  {
    nb::gil_scoped_release release;
    y = ms::gather_qmm(x.view, w_q.view, scales.view, view_or_null(biases), view_or_null(lhs), view_or_null(rhs),
                       transpose, spec, sorted_indices);
  }
  return to_numpy(std::move(y));
}

nb::object py_linear(const Array& x, const Array& w, const OptArray& bias) {
  ms::Tensor y;
  {
    nb::gil_scoped_release release;
    y = ms::linear(x.view, w.view, view_or_null(bias));
  }
  return to_numpy(std::move(y));
}

}  // namespace

void bind_matmul(nb::module_& m) {
  m.def("quantized_matmul", &py_quantized_matmul, nb::arg("x"), nb::arg("w_q"), nb::arg("scales"),
        nb::arg("biases").none(), nb::arg("transpose"), nb::arg("spec"), nb::arg("bias").none());
  m.def("qqmm", &py_qqmm, nb::arg("x"), nb::arg("w"), nb::arg("scales").none(), nb::arg("spec"),
        nb::arg("global_scale_x").none(), nb::arg("global_scale_w").none(), nb::arg("bias").none());
  m.def("gather_qmm", &py_gather_qmm, nb::arg("x"), nb::arg("w_q"), nb::arg("scales"), nb::arg("biases").none(),
        nb::arg("lhs").none(), nb::arg("rhs").none(), nb::arg("transpose"), nb::arg("spec"), nb::arg("sorted_indices"));
  m.def("linear", &py_linear, nb::arg("x"), nb::arg("w"), nb::arg("bias").none());
}
