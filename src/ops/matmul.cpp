// Public matmul entry points: argument checks, batch broadcasting and index gathering, then the
// backend kernels.
#include "microscale/matmul.hpp"

#include <algorithm>
#include <cstring>

#include "core/convert.hpp"
#include "cpu/kernels.hpp"
#include "microscale/runtime.hpp"
#include "ops/operand.hpp"
#include "reference/reference.hpp"

namespace microscale {
namespace {

void require(bool ok, const std::string& msg) {
  if (!ok) throw Error(msg);
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op, const char* what) {
  Shape out(std::max(a.size(), b.size()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::int64_t da = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    const std::int64_t db = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    require(da == db || da == 1 || db == 1, std::string(op) + ": " + what + " " + shape_str(a) + " and " +
                                                shape_str(b) + " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// For each row-major position of `out`, the flat position in `src` that broadcasts to it.
std::vector<std::int64_t> broadcast_map(const Shape& src, const Shape& out) {
  const std::int64_t n = numel(out);
  std::vector<std::int64_t> map(static_cast<std::size_t>(n));
  const Shape src_strides = contiguous_strides(src);
  const std::size_t lead = out.size() - src.size();
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t rest = i, off = 0;
    for (std::size_t d = out.size(); d-- > lead;) {
      const std::int64_t idx = rest % out[d];
      rest /= out[d];
      if (src[d - lead] != 1) off += idx * src_strides[d - lead];
    }
    map[static_cast<std::size_t>(i)] = off;
  }
  return map;
}

Shape leading(const Shape& s, std::size_t drop) { return Shape(s.begin(), s.end() - static_cast<std::ptrdiff_t>(drop)); }

DType output_dtype(const TensorView& x, const TensorView& scales, const QuantSpec& s) {
  if (s.mode != Mode::affine || scales.dtype == x.dtype) return x.dtype;
  return DType::float32;
}

std::vector<float> bias_f32(const TensorView* bias, std::int64_t N, const char* op) {
  if (bias == nullptr) return {};
  require(is_float(bias->dtype), std::string(op) + ": bias must be float32, float16 or bfloat16");
  require(bias->shape == Shape{N}, std::string(op) + ": bias must have shape " + shape_str({N}) + ", got " +
                                       shape_str(bias->shape));
  return detail::to_f32(*bias);
}

Tensor to_dtype(const std::vector<float>& y, DType dtype, Shape shape) {
  Tensor out = Tensor::uninitialized(dtype, std::move(shape));  // every element is written
  const std::size_t size = dtype_size(dtype);
  for (std::size_t i = 0; i < y.size(); ++i) detail::store_f32(y[i], dtype, out.bytes() + i * size);
  return out;
}

// A (possibly batched) quantized weight [..., rows, cols], checked but not decoded.
struct Weight {
  detail::QuantizedOperand q;
  Shape batch;
  std::int64_t rows, cols;  // stored matrix: rows x cols values, groups along cols
};

Weight check_weight(const TensorView& wq, const TensorView& scales, const TensorView* biases, const QuantSpec& s,
                    const char* op) {
  require(wq.rank() >= 2, std::string(op) + ": quantized weight must have rank >= 2, got " + shape_str(wq.shape));
  require(resolve(s).layout == Layout::compact || wq.rank() == 2,
          std::string(op) + ": swizzled scales are only supported for 2-D weights");
  Weight w{detail::check_operand(wq, scales, biases, s, op), {}, 0, 0};
  w.batch = leading(w.q.shape, 2);
  w.rows = w.q.shape[w.q.shape.size() - 2];
  w.cols = w.q.K;
  return w;
}

// y [M, N] float32 = x [M, K] @ W_b^T (or W_b) for matrix b of the weight's flattened batch.
void matmul_one(const float* x, std::int64_t M, const Weight& w, std::int64_t b, bool transpose, const float* bias,
                float* y) {
  const QuantSpec& s = w.q.spec;
  const std::size_t scale_size = dtype_size(w.q.scale_dtype);
  const std::int64_t groups = w.rows * (w.cols / s.group_size);
  cpu::QuantizedMatrix m;
  m.packed = reinterpret_cast<const std::uint8_t*>(w.q.packed.data) + b * w.rows * w.cols * s.bits / 8;
  m.scales = w.q.scales.data + static_cast<std::size_t>(b * groups) * scale_size;
  m.biases = w.q.biases.data ? w.q.biases.data + static_cast<std::size_t>(b * groups) * scale_size : nullptr;
  m.scale_dtype = w.q.scale_dtype;
  m.rows = w.rows;
  m.cols = w.cols;
  m.spec = s;
  if (backend() == Backend::cpu) return cpu::quantized_matmul(x, M, m, transpose, bias, y);
  std::vector<float> wf(static_cast<std::size_t>(w.rows * w.cols));
  reference::dequantize(m.packed, m.scales, m.biases, m.scale_dtype, w.rows, w.cols, s, DType::float32,
                        reinterpret_cast<std::byte*>(wf.data()));
  reference::matmul(x, wf.data(), M, transpose ? w.rows : w.cols, transpose ? w.cols : w.rows, transpose, bias, y);
}

}  // namespace

Tensor quantized_matmul(const TensorView& x, const TensorView& wq, const TensorView& scales,
                        const TensorView* biases, bool transpose, const QuantSpec& spec, const TensorView* bias) {
  const char* op = "quantized_matmul";
  const QuantSpec s = resolve(spec);
  require(is_float(x.dtype), std::string(op) + ": x must be float32, float16 or bfloat16, got " + dtype_name(x.dtype));
  require(x.rank() >= 1, std::string(op) + ": x must have rank >= 1");
  const Weight w = check_weight(wq, scales, biases, s, op);
  const std::int64_t K = transpose ? w.cols : w.rows;
  const std::int64_t N = transpose ? w.rows : w.cols;
  require(x.shape.back() == K, std::string(op) + ": x has K = " + std::to_string(x.shape.back()) + " but the weight " +
                                   (transpose ? "[N, K] = " : "[K, N] = ") + shape_str({w.rows, w.cols}) +
                                   " needs K = " + std::to_string(K));
  const bool vector = x.rank() == 1;
  const Shape x_batch = vector ? Shape{} : leading(x.shape, 2);
  const std::int64_t M = vector ? 1 : x.shape[x.shape.size() - 2];
  const Shape batch = broadcast_shapes(x_batch, w.batch, op, "batch shapes");
  const std::vector<std::int64_t> xmap = broadcast_map(x_batch, batch), wmap = broadcast_map(w.batch, batch);
  const std::vector<float> xf = detail::to_f32(x), bf = bias_f32(bias, N, op);

  std::vector<float> y(static_cast<std::size_t>(numel(batch) * M * N));
  for (std::size_t b = 0; b < xmap.size(); ++b)
    matmul_one(xf.data() + xmap[b] * M * K, M, w, wmap[b], transpose, bf.empty() ? nullptr : bf.data(),
               y.data() + static_cast<std::int64_t>(b) * M * N);
  Shape out_shape = batch;
  if (!vector) out_shape.push_back(M);
  out_shape.push_back(N);
  return to_dtype(y, output_dtype(x, scales, s), out_shape);
}

Tensor quantized_matmul(const TensorView& x, const Quantized& w, bool transpose, const TensorView* bias) {
  const bool affine = w.spec.mode == Mode::affine;
  const TensorView biases = affine ? w.biases.view() : TensorView();
  return quantized_matmul(x, w.packed.view(), w.scales.view(), affine ? &biases : nullptr, transpose, w.spec, bias);
}

Tensor qqmm(const TensorView& x, const TensorView& w, const TensorView* w_scales, const QuantSpec& spec,
            std::optional<float> global_scale_x, std::optional<float> global_scale_w, const TensorView* bias) {
  const char* op = "qqmm";
  const QqmmSpecs specs = resolve_qqmm(spec, global_scale_x, global_scale_w);
  const QuantSpec& sx = specs.x;
  QuantSpec sw = specs.w;
  require(is_float(x.dtype), std::string(op) + ": x must be float32, float16 or bfloat16, got " + dtype_name(x.dtype));
  require(x.rank() >= 1, "qqmm: x must have rank >= 1");
  require(w.rank() == 2, "qqmm: w must be 2-D [N, K] (packed [N, K*bits/8]), got " + shape_str(w.shape));

  // w as a checked quantized operand; a float w is quantized here exactly as quantize does.
  Quantized w_owned;
  TensorView w_packed = w, w_codes = w_scales ? *w_scales : TensorView();
  if (is_float(w.dtype)) {
    require(w_scales == nullptr, "qqmm: w_scales given but w is float (pass packed w with its scales)");
    sw.layout = Layout::compact;
    w_owned = quantize(w, sw);
    w_packed = w_owned.packed.view();
    w_codes = w_owned.scales.view();
  } else {
    require(w_scales != nullptr, "qqmm: a packed w needs its scales");
  }
  const detail::QuantizedOperand wop = detail::check_operand(w_packed, w_codes, nullptr, sw, op);
  const std::int64_t N = wop.rows, K = wop.K;
  require(x.shape.back() == K, "qqmm: x has K = " + std::to_string(x.shape.back()) + " but w has K = " + std::to_string(K));
  const Quantized qx = quantize(x, sx);
  const std::int64_t M = numel(leading(x.shape, 1));
  const float alpha = specs.alpha;
  const std::vector<float> bf = bias_f32(bias, N, op);
  std::vector<float> y(static_cast<std::size_t>(M * N));
  const auto* w_bytes = reinterpret_cast<const std::uint8_t*>(wop.packed.data);
  const auto* w_scale_codes = reinterpret_cast<const std::uint8_t*>(wop.scales.data);
  if (backend() == Backend::reference) {
    reference::qqmm(qx.packed.data<std::uint8_t>(), qx.scales.data<std::uint8_t>(), w_bytes, w_scale_codes, M, N, K, sx,
                    alpha, bf.empty() ? nullptr : bf.data(), y.data());
  } else {
    // Two-level values (element times block scale) are exact in float32 on both sides, so their
    // products are the exact block products; alpha applies once to the float32 sum.
    QuantSpec two_level = sx;
    two_level.global_scale.reset();
    const Tensor xd = dequantize(qx.packed.view(), qx.scales.view(), nullptr, two_level, DType::float32);
    const cpu::QuantizedMatrix wm{w_bytes, wop.scales.data, nullptr, DType::uint8, N, K, two_level};
    cpu::quantized_matmul(xd.data<float>(), M, wm, true, nullptr, y.data());
    for (std::size_t i = 0; i < y.size(); ++i) {
      const float v = alpha * y[i];
      y[i] = bf.empty() ? v : v + bf[i % static_cast<std::size_t>(N)];
    }
  }
  Shape out_shape = x.shape;
  out_shape.back() = N;
  return to_dtype(y, x.dtype, out_shape);
}

Tensor gather_qmm(const TensorView& x, const TensorView& wq, const TensorView& scales, const TensorView* biases,
                  const TensorView* lhs_indices, const TensorView* rhs_indices, bool transpose, const QuantSpec& spec,
                  bool /*sorted_indices: a speed hint only; experts are grouped either way*/) {
  const char* op = "gather_qmm";
  if (lhs_indices == nullptr && rhs_indices == nullptr) return quantized_matmul(x, wq, scales, biases, transpose, spec);
  const QuantSpec s = resolve(spec);
  require(is_float(x.dtype), std::string(op) + ": x must be float32, float16 or bfloat16, got " + dtype_name(x.dtype));
  require(x.rank() >= 2, "gather_qmm: x must have rank >= 2 ([..., M, K])");
  const Weight w = check_weight(wq, scales, biases, s, op);
  const std::int64_t K = transpose ? w.cols : w.rows;
  const std::int64_t N = transpose ? w.rows : w.cols;
  require(x.shape.back() == K, "gather_qmm: x has K = " + std::to_string(x.shape.back()) + " but the weight needs K = " +
                                   std::to_string(K));
  const Shape x_batch = leading(x.shape, 2);
  const std::int64_t M = x.shape[x.shape.size() - 2];
  const std::int64_t bx = numel(x_batch), bw = numel(w.batch);

  auto indices = [&](const TensorView* given, const Shape& batch, std::int64_t limit, const char* what) {
    std::pair<std::vector<std::int64_t>, Shape> r;
    if (given) {
      r.first = detail::read_indices(*given, limit, op, what);
      r.second = given->shape;
    } else {
      r.first.resize(static_cast<std::size_t>(limit));
      for (std::int64_t i = 0; i < limit; ++i) r.first[static_cast<std::size_t>(i)] = i;
      r.second = batch;
    }
    return r;
  };
  const auto [lhs, lhs_shape] = indices(lhs_indices, x_batch, bx, "lhs_indices");
  const auto [rhs, rhs_shape] = indices(rhs_indices, w.batch, bw, "rhs_indices");
  const Shape out_batch = broadcast_shapes(lhs_shape, rhs_shape, op, "index shapes");
  const std::vector<std::int64_t> lmap = broadcast_map(lhs_shape, out_batch), rmap = broadcast_map(rhs_shape, out_batch);

  const std::vector<float> xf = detail::to_f32(x);
  std::vector<float> y(static_cast<std::size_t>(numel(out_batch) * M * N));
  // All products with the same expert run as one matmul over the stacked rows of x, so each
  // expert's weights stream once per call. Grouping happens whether or not the caller sorted the
  // indices, so `sorted_indices` cannot change results.
  std::vector<std::vector<std::size_t>> by_expert(static_cast<std::size_t>(bw));
  for (std::size_t i = 0; i < lmap.size(); ++i) by_expert[static_cast<std::size_t>(rhs[static_cast<std::size_t>(rmap[i])])].push_back(i);
  std::vector<float> xs, ys;
  for (std::int64_t e = 0; e < bw; ++e) {
    const std::vector<std::size_t>& outs = by_expert[static_cast<std::size_t>(e)];
    if (outs.empty()) continue;
    const std::int64_t rows = static_cast<std::int64_t>(outs.size()) * M;
    xs.resize(static_cast<std::size_t>(rows * K));
    ys.resize(static_cast<std::size_t>(rows * N));
    for (std::size_t j = 0; j < outs.size(); ++j) {
      const std::int64_t li = lhs[static_cast<std::size_t>(lmap[outs[j]])];
      std::copy_n(xf.begin() + li * M * K, M * K, xs.begin() + static_cast<std::int64_t>(j) * M * K);
    }
    matmul_one(xs.data(), rows, w, e, transpose, nullptr, ys.data());
    for (std::size_t j = 0; j < outs.size(); ++j)
      std::copy_n(ys.begin() + static_cast<std::int64_t>(j) * M * N, M * N,
                  y.begin() + static_cast<std::int64_t>(outs[j]) * M * N);
  }
  Shape out_shape = out_batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  return to_dtype(y, output_dtype(x, scales, s), out_shape);
}

}  // namespace microscale
