// Public matmul entry points: the plan (ops/plan.hpp: checks, batch broadcasting, index
// gathering), then the backend's kernels.
#include "microscale/matmul.hpp"

#include <algorithm>

#include "core/convert.hpp"
#include "ops/kernels.hpp"
#include "ops/operand.hpp"

namespace microscale {
namespace {

// Float32 copies of operands the host widens (wherever they live).
std::vector<float> host_f32(const TensorView& v) {
  Tensor host;
  return detail::to_f32(ops::host_readable(v, host));
}
std::vector<float> bias_f32(const TensorView* bias) { return bias ? host_f32(*bias) : std::vector<float>(); }

Tensor to_dtype(const std::vector<float>& y, DType dtype, Shape shape) {
  Tensor out = Tensor::uninitialized(dtype, std::move(shape));  // every element is written
  const std::size_t size = dtype_size(dtype);
  for (std::size_t i = 0; i < y.size(); ++i) detail::store_f32(y[i], dtype, out.bytes() + i * size);
  return out;
}

// Matrix b of a planned weight's flattened batch.
cpu::QuantizedMatrix weight_matrix(const ops::WeightPlan& p, const ops::QuantizedOperand& w, std::int64_t b) {
  const QuantSpec& s = p.q.spec;
  const std::size_t scale_size = dtype_size(p.q.scale_dtype);
  const std::int64_t groups = p.rows * (p.cols / s.group_size);
  cpu::QuantizedMatrix m;
  m.packed = reinterpret_cast<const std::uint8_t*>(w.packed.data) + b * p.rows * p.cols * s.bits / 8;
  m.scales = w.scales.data + static_cast<std::size_t>(b * groups) * scale_size;
  m.biases = w.biases.data ? w.biases.data + static_cast<std::size_t>(b * groups) * scale_size : nullptr;
  m.scale_dtype = p.q.scale_dtype;
  m.rows = p.rows;
  m.cols = p.cols;
  m.spec = s;
  return m;
}

}  // namespace

Tensor quantized_matmul(const TensorView& x, const TensorView& wq, const TensorView& scales, const TensorView* biases,
                        bool transpose, const QuantSpec& spec, const TensorView* bias) {
  const std::optional<ops::Arg> b = ops::optional_arg(biases), bias_arg = ops::optional_arg(bias);
  const ops::MatmulPlan p = ops::plan_quantized_matmul(ops::arg_of(x), ops::arg_of(wq), ops::arg_of(scales),
                                                       ops::opt_ptr(b), transpose, spec, ops::opt_ptr(bias_arg));
  const ops::Kernels& k = ops::kernels_for("quantized_matmul", {&x, &wq, &scales, biases, bias});
  const ops::QuantizedOperand w = ops::bind_operand(p.w.q, wq, scales, biases);
  const std::vector<float> xf = host_f32(x), bf = bias_f32(bias);
  const std::int64_t M = p.M, N = p.N, K = p.K;
  std::vector<float> y(static_cast<std::size_t>(static_cast<std::int64_t>(p.pairs.size()) * M * N));
  for (std::size_t i = 0; i < p.pairs.size(); ++i)
    k.quantized_matmul(xf.data() + p.pairs[i].x * M * K, M, weight_matrix(p.w, w, p.pairs[i].w), transpose,
                       bf.empty() ? nullptr : bf.data(), y.data() + static_cast<std::int64_t>(i) * M * N);
  return to_dtype(y, p.out_dtype, p.out_shape);
}

Tensor quantized_matmul(const TensorView& x, const Quantized& w, bool transpose, const TensorView* bias) {
  const bool affine = w.spec.mode == Mode::affine;
  const TensorView biases = affine ? w.biases.view() : TensorView();
  return quantized_matmul(x, w.packed.view(), w.scales.view(), affine ? &biases : nullptr, transpose, w.spec, bias);
}

Tensor linear(const TensorView& x, const TensorView& w, const TensorView* bias) {
  const std::optional<ops::Arg> bias_arg = ops::optional_arg(bias);
  const ops::LinearPlan p = ops::plan_linear(ops::arg_of(x), ops::arg_of(w), ops::opt_ptr(bias_arg));
  const ops::Kernels& k = ops::kernels_for("linear", {&x, &w, bias});
  if (k.linear == nullptr)
    throw Error("linear: runs on the cpu and reference backends only (its operands or the backend setting chose cuda)");
  const std::vector<float> xf = host_f32(x), bf = bias_f32(bias);
  const detail::Rows wr = detail::rows_of(w);  // a strided (transposed, sliced) w is copied once
  std::vector<float> y(static_cast<std::size_t>(p.M * p.N));
  k.linear(xf.data(), p.M, wr.data, w.dtype, p.N, p.K, bf.empty() ? nullptr : bf.data(), y.data());
  return to_dtype(y, x.dtype, p.out_shape);
}

Tensor qqmm(const TensorView& x, const TensorView& w, const TensorView* w_scales, const QuantSpec& spec,
            std::optional<float> global_scale_x, std::optional<float> global_scale_w, const TensorView* bias) {
  const std::optional<ops::Arg> ws = ops::optional_arg(w_scales), bias_arg = ops::optional_arg(bias);
  const ops::QqmmPlan p = ops::plan_qqmm(ops::arg_of(x), ops::arg_of(w), ops::opt_ptr(ws), spec, global_scale_x,
                                         global_scale_w, ops::opt_ptr(bias_arg));
  const ops::Kernels& k = ops::kernels_for("qqmm", {&x, &w, w_scales, bias});
  // A float w is quantized here exactly as quantize does.
  Quantized w_owned;
  TensorView w_packed = w, w_codes = w_scales ? *w_scales : TensorView();
  if (p.w_float) {
    w_owned = quantize(w, p.specs.w);
    w_packed = w_owned.packed.view();
    w_codes = w_owned.scales.view();
  }
  const ops::QuantizedOperand wop = ops::bind_operand(p.w, w_packed, w_codes, nullptr);
  const Quantized qx = quantize(x, p.specs.x);
  const std::vector<float> bf = bias_f32(bias);
  std::vector<float> y(static_cast<std::size_t>(p.M * p.N));
  k.qqmm(qx.packed.data<std::uint8_t>(), qx.scales.data<std::uint8_t>(),
         reinterpret_cast<const std::uint8_t*>(wop.packed.data), reinterpret_cast<const std::uint8_t*>(wop.scales.data),
         p.M, p.N, p.K, p.specs.x, p.specs.alpha, bf.empty() ? nullptr : bf.data(), y.data());
  return to_dtype(y, x.dtype, p.out_shape);
}

Tensor gather_qmm(const TensorView& x, const TensorView& wq, const TensorView& scales, const TensorView* biases,
                  const TensorView* lhs_indices, const TensorView* rhs_indices, bool transpose, const QuantSpec& spec,
                  bool /*sorted_indices: a speed hint only; experts are grouped either way*/) {
  if (lhs_indices == nullptr && rhs_indices == nullptr) return quantized_matmul(x, wq, scales, biases, transpose, spec);
  const std::optional<ops::Arg> b = ops::optional_arg(biases), lhs_arg = ops::optional_arg(lhs_indices),
                                rhs_arg = ops::optional_arg(rhs_indices);
  auto read = [&](ops::Side side, std::int64_t limit, const char* what) {
    Tensor host;
    return detail::read_indices(ops::host_readable(side == ops::Side::lhs ? *lhs_indices : *rhs_indices, host), limit,
                                "gather_qmm", what);
  };
  const ops::MatmulPlan p = ops::plan_gather_qmm(ops::arg_of(x), ops::arg_of(wq), ops::arg_of(scales), ops::opt_ptr(b),
                                                 ops::opt_ptr(lhs_arg), ops::opt_ptr(rhs_arg), transpose, spec, read);
  const ops::Kernels& k = ops::kernels_for("gather_qmm", {&x, &wq, &scales, biases, lhs_indices, rhs_indices});
  const ops::QuantizedOperand w = ops::bind_operand(p.w.q, wq, scales, biases);
  const std::int64_t M = p.M, N = p.N, K = p.K;

  const std::vector<float> xf = host_f32(x);
  std::vector<float> y(static_cast<std::size_t>(static_cast<std::int64_t>(p.pairs.size()) * M * N));
  // All products with the same expert run as one matmul over the stacked rows of x, so each
  // expert's weights stream once per call. Grouping happens whether or not the caller sorted the
  // indices, so `sorted_indices` cannot change results.
  std::vector<std::vector<std::size_t>> by_expert(static_cast<std::size_t>(numel(p.w.batch)));
  for (std::size_t i = 0; i < p.pairs.size(); ++i) by_expert[static_cast<std::size_t>(p.pairs[i].w)].push_back(i);
  std::vector<float> xs, ys;
  for (std::size_t e = 0; e < by_expert.size(); ++e) {
    const std::vector<std::size_t>& outs = by_expert[e];
    if (outs.empty()) continue;
    const std::int64_t rows = static_cast<std::int64_t>(outs.size()) * M;
    xs.resize(static_cast<std::size_t>(rows * K));
    ys.resize(static_cast<std::size_t>(rows * N));
    for (std::size_t j = 0; j < outs.size(); ++j)
      std::copy_n(xf.begin() + p.pairs[outs[j]].x * M * K, M * K, xs.begin() + static_cast<std::int64_t>(j) * M * K);
    k.quantized_matmul(xs.data(), rows, weight_matrix(p.w, w, static_cast<std::int64_t>(e)), transpose, nullptr,
                       ys.data());
    for (std::size_t j = 0; j < outs.size(); ++j)
      std::copy_n(ys.begin() + static_cast<std::int64_t>(j) * M * N, M * N,
                  y.begin() + static_cast<std::int64_t>(outs[j]) * M * N);
  }
  return to_dtype(y, p.out_dtype, p.out_shape);
}

}  // namespace microscale
