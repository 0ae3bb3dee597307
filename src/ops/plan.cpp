// Argument checks and plans of every op (see plan.hpp): the one place their error messages live.
#include "ops/plan.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/convert.hpp"

namespace microscale::ops {
namespace {

void require(bool ok, const std::string& msg) {
  if (!ok) throw Error(msg);
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op, const char* what) {
  Shape out(std::max(a.size(), b.size()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::int64_t da = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    const std::int64_t db = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    require(da == db || da == 1 || db == 1,
            std::string(op) + ": " + what + " " + shape_str(a) + " and " + shape_str(b) + " do not broadcast");
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

// The pairs of broadcast(lhs_shape, rhs_shape), each side's matrix taken through its index list.
std::vector<BatchPair> batch_pairs(const std::vector<std::int64_t>& lhs, const Shape& lhs_shape,
                                   const std::vector<std::int64_t>& rhs, const Shape& rhs_shape, const Shape& out) {
  const std::vector<std::int64_t> lmap = broadcast_map(lhs_shape, out), rmap = broadcast_map(rhs_shape, out);
  std::vector<BatchPair> pairs(lmap.size());
  for (std::size_t i = 0; i < pairs.size(); ++i)
    pairs[i] = {lhs[static_cast<std::size_t>(lmap[i])], rhs[static_cast<std::size_t>(rmap[i])]};
  return pairs;
}

std::vector<std::int64_t> arange(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

void check_bias(const Arg* bias, std::int64_t N, const char* op) {
  if (bias == nullptr) return;
  require(is_float(bias->dtype), std::string(op) + ": bias must be float32, float16 or bfloat16");
  require(bias->shape == Shape{N},
          std::string(op) + ": bias must have shape " + shape_str({N}) + ", got " + shape_str(bias->shape));
}

void check_x(const Arg& x, const char* op) {
  require(is_float(x.dtype), std::string(op) + ": x must be float32, float16 or bfloat16, got " + dtype_name(x.dtype));
}

WeightPlan plan_weight(const Arg& wq, const Arg& scales, const Arg* biases, const QuantSpec& s, const char* op) {
  require(wq.shape.size() >= 2, std::string(op) + ": quantized weight must have rank >= 2, got " + shape_str(wq.shape));
  require(s.layout == Layout::compact || wq.shape.size() == 2,
          std::string(op) + ": swizzled scales are only supported for 2-D weights");
  WeightPlan w{plan_operand(wq, scales, biases, s, op), {}, 0, 0};
  w.batch = leading(w.q.shape, 2);
  w.rows = w.q.shape[w.q.shape.size() - 2];
  w.cols = w.q.K;
  return w;
}

// The affine result promotes x with the scales' dtype.
DType matmul_dtype(const Arg& x, const Arg& scales, const QuantSpec& s) {
  if (s.mode != Mode::affine || scales.dtype == x.dtype) return x.dtype;
  return DType::float32;
}

}  // namespace

Shape leading(const Shape& s, std::size_t drop) {
  return Shape(s.begin(), s.end() - static_cast<std::ptrdiff_t>(drop));
}

Shape with_last(Shape s, std::int64_t last) {
  s.back() = last;
  return s;
}

QuantizePlan plan_quantize(const Arg& x, const QuantSpec& spec) {
  QuantizePlan p;
  p.spec = resolve(spec);
  const QuantSpec& s = p.spec;
  require(is_float(x.dtype),
          std::string("quantize: unsupported input dtype ") + dtype_name(x.dtype) + " (float32, float16 or bfloat16)");
  require(!x.shape.empty(), "quantize: input must have rank >= 1 (groups run along the last axis)");
  p.K = x.shape.back();
  require(p.K % s.group_size == 0, "quantize: last dimension " + std::to_string(p.K) +
                                       " is not divisible by group_size " + std::to_string(s.group_size) + " (" +
                                       name(s.mode) + ")");
  p.rows = numel(leading(x.shape, 1));
  p.groups = p.K / s.group_size;
  p.packed = with_last(x.shape, p.K * s.bits / 8);
  p.compact_scales = with_last(x.shape, p.groups);
  p.scales = s.layout == Layout::swizzled ? Shape{roundup(p.rows, 128), roundup(p.groups, 4)} : p.compact_scales;
  p.scale_dtype = s.mode == Mode::affine ? x.dtype : DType::uint8;
  if (s.mode == Mode::affine) p.biases = p.compact_scales;
  return p;
}

void throw_nonfinite(std::int64_t flat, float value, const Shape& shape) {
  const char* cls = std::isnan(value) ? "NaN" : value > 0 ? "+Inf" : "-Inf";
  Shape index(shape.size());
  std::int64_t rest = flat;
  for (std::size_t d = index.size(); d-- > 0;) {
    index[d] = rest % shape[d];
    rest /= shape[d];
  }
  throw Error(std::string("quantize: non-finite input (") + cls + ") at flat index " + std::to_string(flat) +
              ", index " + shape_str(index) + " (nonfinite='error')");
}

void check_amax_input(const Arg& x, const char* op) {
  require(is_float(x.dtype),
          std::string(op) + ": unsupported input dtype " + dtype_name(x.dtype) + " (float32, float16 or bfloat16)");
}

OperandPlan plan_operand(const Arg& packed, const Arg& scales, const Arg* biases, const QuantSpec& spec,
                         const char* op) {
  OperandPlan o;
  o.spec = resolve(spec);
  const QuantSpec& s = o.spec;
  const std::string where = std::string(op) + " (" + name(s.mode) + ")";
  require(packed.dtype == DType::uint8 || packed.dtype == DType::uint32,
          where + ": packed values must be uint8 (or MLX's uint32), got " + dtype_name(packed.dtype));
  require(!packed.shape.empty(), where + ": packed values must have rank >= 1");

  // Packed uint32 words are MLX's view of the same little-endian bytes.
  const std::int64_t row_bytes = packed.shape.back() * static_cast<std::int64_t>(dtype_size(packed.dtype));
  require(row_bytes * 8 % s.bits == 0, where + ": " + std::to_string(row_bytes) +
                                           " packed bytes per row do not hold whole " + std::to_string(s.bits) +
                                           "-bit values");
  o.K = row_bytes * 8 / s.bits;
  require(o.K % s.group_size == 0, where + ": " + std::to_string(o.K) +
                                       " values per row are not divisible by group_size " +
                                       std::to_string(s.group_size));
  o.shape = with_last(packed.shape, o.K);
  o.rows = numel(leading(o.shape, 1));
  o.groups = o.K / s.group_size;
  const Shape compact_shape = with_last(o.shape, o.groups);

  if (s.mode == Mode::affine) {
    require(is_float(scales.dtype),
            where + ": scales must be float32, float16 or bfloat16, got " + dtype_name(scales.dtype));
    require(biases != nullptr, where + ": biases are required");
    require(biases->dtype == scales.dtype && biases->shape == scales.shape,
            where + ": biases " + shape_str(biases->shape) + " " + dtype_name(biases->dtype) + " must match scales " +
                shape_str(scales.shape) + " " + dtype_name(scales.dtype));
  } else {
    require(scales.dtype == DType::uint8, where + ": scales must be uint8 codes, got " + dtype_name(scales.dtype));
    require(biases == nullptr, where + ": biases are only used by affine");
  }
  o.scale_dtype = scales.dtype;
  if (s.layout == Layout::swizzled) {
    const Shape sw = {roundup(o.rows, 128), roundup(o.groups, 4)};
    require(scales.shape == sw, where + ": swizzled scales must have shape " + shape_str(sw) + " for packed " +
                                    shape_str(packed.shape) + ", got " + shape_str(scales.shape));
  } else {
    require(scales.shape == compact_shape, where + ": scales must have shape " + shape_str(compact_shape) +
                                               " for packed " + shape_str(packed.shape) + ", got " +
                                               shape_str(scales.shape));
  }
  return o;
}

OperandPlan plan_dequantize(const Arg& packed, const Arg& scales, const Arg* biases, const QuantSpec& spec, DType out) {
  require(is_float(out), std::string("dequantize: output dtype ") + dtype_name(out) +
                             " is not supported (float32, float16 or bfloat16)");
  return plan_operand(packed, scales, biases, spec, "dequantize");
}

MatmulPlan plan_quantized_matmul(const Arg& x, const Arg& wq, const Arg& scales, const Arg* biases, bool transpose,
                                 const QuantSpec& spec, const Arg* bias) {
  const char* op = "quantized_matmul";
  const QuantSpec s = resolve(spec);
  check_x(x, op);
  require(!x.shape.empty(), std::string(op) + ": x must have rank >= 1");
  MatmulPlan p;
  p.w = plan_weight(wq, scales, biases, s, op);
  p.transpose = transpose;
  p.K = transpose ? p.w.cols : p.w.rows;
  p.N = transpose ? p.w.rows : p.w.cols;
  require(x.shape.back() == p.K, std::string(op) + ": x has K = " + std::to_string(x.shape.back()) +
                                     " but the weight " + (transpose ? "[N, K] = " : "[K, N] = ") +
                                     shape_str({p.w.rows, p.w.cols}) + " needs K = " + std::to_string(p.K));
  const bool vector = x.shape.size() == 1;
  const Shape x_batch = vector ? Shape{} : leading(x.shape, 2);
  p.M = vector ? 1 : x.shape[x.shape.size() - 2];
  const Shape batch = broadcast_shapes(x_batch, p.w.batch, op, "batch shapes");
  const std::vector<std::int64_t> xmap = broadcast_map(x_batch, batch), wmap = broadcast_map(p.w.batch, batch);
  p.pairs.resize(xmap.size());
  for (std::size_t i = 0; i < p.pairs.size(); ++i) p.pairs[i] = {xmap[i], wmap[i]};
  p.out_shape = batch;
  if (!vector) p.out_shape.push_back(p.M);
  p.out_shape.push_back(p.N);
  check_bias(bias, p.N, op);
  p.out_dtype = matmul_dtype(x, scales, s);
  return p;
}

MatmulPlan plan_gather_qmm(const Arg& x, const Arg& wq, const Arg& scales, const Arg* biases, const Arg* lhs_indices,
                           const Arg* rhs_indices, bool transpose, const QuantSpec& spec, const ReadIndices& read) {
  if (lhs_indices == nullptr && rhs_indices == nullptr)
    return plan_quantized_matmul(x, wq, scales, biases, transpose, spec, nullptr);
  const char* op = "gather_qmm";
  const QuantSpec s = resolve(spec);
  check_x(x, op);
  require(x.shape.size() >= 2, "gather_qmm: x must have rank >= 2 ([..., M, K])");
  MatmulPlan p;
  p.w = plan_weight(wq, scales, biases, s, op);
  p.transpose = transpose;
  p.K = transpose ? p.w.cols : p.w.rows;
  p.N = transpose ? p.w.rows : p.w.cols;
  require(x.shape.back() == p.K, "gather_qmm: x has K = " + std::to_string(x.shape.back()) +
                                     " but the weight needs K = " + std::to_string(p.K));
  const Shape x_batch = leading(x.shape, 2);
  p.M = x.shape[x.shape.size() - 2];

  // A missing index array is arange over its operand's batch, shaped like that batch.
  auto indices = [&](const Arg* given, Side side, const Shape& batch, const char* what) {
    std::pair<std::vector<std::int64_t>, Shape> r;
    if (given) {
      detail::check_index_dtype(given->dtype, op, what);
      r.first = read(side, numel(batch), what);
      r.second = given->shape;
    } else {
      r.first = arange(numel(batch));
      r.second = batch;
    }
    return r;
  };
  const auto [lhs, lhs_shape] = indices(lhs_indices, Side::lhs, x_batch, "lhs_indices");
  const auto [rhs, rhs_shape] = indices(rhs_indices, Side::rhs, p.w.batch, "rhs_indices");
  p.out_shape = broadcast_shapes(lhs_shape, rhs_shape, op, "index shapes");
  p.pairs = batch_pairs(lhs, lhs_shape, rhs, rhs_shape, p.out_shape);
  p.out_shape.push_back(p.M);
  p.out_shape.push_back(p.N);
  p.out_dtype = matmul_dtype(x, scales, s);
  return p;
}

QqmmPlan plan_qqmm(const Arg& x, const Arg& w, const Arg* w_scales, const QuantSpec& spec,
                   std::optional<float> global_scale_x, std::optional<float> global_scale_w, const Arg* bias) {
  const char* op = "qqmm";
  QqmmPlan p;
  require(spec.scale_search == ScaleSearch::none,
          "qqmm: scale_search is an option of quantize: quantize w with it and pass the packed weight and scales");
  require(!spec.scale_2d && !spec.hadamard && !spec.sr_seed,
          "qqmm: scale_2d, hadamard and sr_seed are options of quantize: quantize w with them and pass the packed "
          "weight and scales (and x through hadamard_transform when w was transformed)");
  p.specs = resolve_qqmm(spec, global_scale_x, global_scale_w);
  check_x(x, op);
  require(!x.shape.empty(), "qqmm: x must have rank >= 1");
  require(w.shape.size() == 2, "qqmm: w must be 2-D [N, K] (packed [N, K*bits/8]), got " + shape_str(w.shape));
  p.w_float = is_float(w.dtype);
  if (p.w_float) {
    require(w_scales == nullptr, "qqmm: w_scales given but w is float (pass packed w with its scales)");
    p.specs.w.layout = Layout::compact;  // a float w is quantized by the op; the layout is its choice
    const QuantizePlan q = plan_quantize(w, p.specs.w);
    p.w.spec = q.spec;
    p.w.shape = w.shape;
    p.w.rows = q.rows;
    p.w.K = q.K;
    p.w.groups = q.groups;
    p.w.scale_dtype = q.scale_dtype;
  } else {
    require(w_scales != nullptr, "qqmm: a packed w needs its scales");
    p.w = plan_operand(w, *w_scales, nullptr, p.specs.w, op);
  }
  p.N = p.w.rows;
  p.K = p.w.K;
  require(x.shape.back() == p.K,
          "qqmm: x has K = " + std::to_string(x.shape.back()) + " but w has K = " + std::to_string(p.K));
  p.M = numel(leading(x.shape, 1));
  p.out_shape = with_last(x.shape, p.N);
  check_bias(bias, p.N, op);
  return p;
}

Quantized allocate_quantized(const QuantizePlan& p, const Shape& shape) {
  Quantized q;
  q.spec = p.spec;
  q.shape = shape;
  q.packed = Tensor(DType::uint8, p.packed);
  if (p.spec.mode == Mode::affine) q.biases = Tensor(p.scale_dtype, p.biases);
  return q;
}

LinearPlan plan_linear(const Arg& x, const Arg& w, const Arg* bias) {
  check_x(x, "linear");
  require(!x.shape.empty(), "linear: x must have rank >= 1");
  require(is_float(w.dtype), std::string("linear: w must be float32, float16 or bfloat16, got ") + dtype_name(w.dtype));
  require(w.shape.size() == 2, "linear: w must be 2-D [N, K], got " + shape_str(w.shape));
  LinearPlan p;
  p.N = w.shape[0];
  p.K = w.shape[1];
  require(x.shape.back() == p.K, "linear: x's last axis (" + std::to_string(x.shape.back()) + ") must equal w's K (" +
                                     std::to_string(p.K) + ")");
  check_bias(bias, p.N, "linear");
  p.M = numel(Shape(x.shape.begin(), x.shape.end() - 1));
  p.out_shape = x.shape;
  p.out_shape.back() = p.N;
  return p;
}

}  // namespace microscale::ops
