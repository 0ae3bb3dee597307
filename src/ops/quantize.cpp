// Public quantize / dequantize entry points: argument checks, then the backend kernels.
#include "microscale/quantize.hpp"

#include <cmath>
#include <cstring>

#include "core/convert.hpp"
#include "cpu/kernels.hpp"
#include "microscale/runtime.hpp"
#include "ops/operand.hpp"
#include "reference/reference.hpp"

namespace microscale {
namespace {

std::int64_t roundup(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }

void require(bool ok, const std::string& msg) {
  if (!ok) throw Error(msg);
}

Shape with_last(Shape s, std::int64_t last) {
  s.back() = last;
  return s;
}

// nonfinite='error': fails naming the first NaN/Inf in row-major order before anything is written.
void check_finite(const detail::Rows& x, DType dtype, const Shape& shape) {
  const std::int64_t i = cpu::find_nonfinite(x.data, dtype, x.numel);
  if (i < 0) return;
  const float v = detail::load_f32(x.data + static_cast<std::size_t>(i) * dtype_size(dtype), dtype);
  const char* cls = std::isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf";
  Shape index(shape.size());
  std::int64_t rest = i;
  for (std::size_t d = index.size(); d-- > 0;) {
    index[d] = rest % shape[d];
    rest /= shape[d];
  }
  throw Error(std::string("quantize: non-finite input (") + cls + ") at flat index " + std::to_string(i) +
              ", index " + shape_str(index) + " (nonfinite='error')");
}

}  // namespace

float global_scale(const TensorView& x) {
  require(is_float(x.dtype), std::string("global_scale: unsupported input dtype ") +
                                 dtype_name(x.dtype) + " (float32, float16 or bfloat16)");
  if (backend() == Backend::reference) {
    const std::vector<float> v = detail::to_f32(x);
    return reference::amax_finite(v.data(), static_cast<std::int64_t>(v.size()));
  }
  const detail::Rows c = detail::rows_of(x);
  return cpu::amax_finite(c.data, x.dtype, c.numel);
}

Quantized quantize(const TensorView& x, const QuantSpec& spec) {
  const QuantSpec s = resolve(spec);
  require(is_float(x.dtype), std::string("quantize: unsupported input dtype ") +
                                 dtype_name(x.dtype) + " (float32, float16 or bfloat16)");
  require(x.rank() >= 1, "quantize: input must have rank >= 1 (groups run along the last axis)");
  const std::int64_t K = x.shape.back();
  require(K % s.group_size == 0, "quantize: last dimension " + std::to_string(K) +
                                     " is not divisible by group_size " +
                                     std::to_string(s.group_size) + " (" + name(s.mode) + ")");
  const std::int64_t rows = numel(Shape(x.shape.begin(), x.shape.end() - 1));
  const std::int64_t groups = K / s.group_size;

  const detail::Rows xc = detail::rows_of(x);
  if (s.nonfinite == NonFinite::error) check_finite(xc, x.dtype, x.shape);

  Quantized q;
  q.spec = s;
  q.shape = x.shape;
  q.packed = Tensor(DType::uint8, with_last(x.shape, K * s.bits / 8));
  const DType scale_dtype = s.mode == Mode::affine ? x.dtype : DType::uint8;
  Tensor compact(scale_dtype, with_last(x.shape, groups));
  if (s.mode == Mode::affine) q.biases = Tensor(scale_dtype, compact.shape());
  if (backend() == Backend::reference) {
    const std::vector<float> xf = detail::to_f32(x);
    reference::quantize(xf.data(), rows, K, x.dtype, s, q.packed.data<std::uint8_t>(), compact.bytes(),
                        q.biases.bytes());
  } else {
    cpu::quantize(xc.data, x.dtype, rows, K, s, q.packed.data<std::uint8_t>(), compact.bytes(),
                  q.biases.bytes());
  }
  q.scales = s.layout == Layout::swizzled ? swizzle_scales(compact.view()) : compact;
  return q;
}

Tensor dequantize(const Quantized& q, DType dtype) {
  const bool affine = q.spec.mode == Mode::affine;
  const TensorView biases = affine ? q.biases.view() : TensorView();
  return dequantize(q.packed.view(), q.scales.view(), affine ? &biases : nullptr, q.spec, dtype);
}

namespace detail {

QuantizedOperand check_operand(const TensorView& packed_in, const TensorView& scales_in, const TensorView* biases_in,
                               const QuantSpec& spec, const char* op) {
  QuantizedOperand o;
  o.spec = resolve(spec);
  const QuantSpec& s = o.spec;
  const std::string where = std::string(op) + " (" + name(s.mode) + ")";
  require(packed_in.dtype == DType::uint8 || packed_in.dtype == DType::uint32,
          where + ": packed values must be uint8 (or MLX's uint32), got " + dtype_name(packed_in.dtype));
  require(packed_in.rank() >= 1, where + ": packed values must have rank >= 1");

  // Packed uint32 words are MLX's view of the same little-endian bytes.
  const std::int64_t row_bytes = packed_in.shape.back() * static_cast<std::int64_t>(dtype_size(packed_in.dtype));
  require(row_bytes * 8 % s.bits == 0, where + ": " + std::to_string(row_bytes) +
                                           " packed bytes per row do not hold whole " + std::to_string(s.bits) +
                                           "-bit values");
  o.K = row_bytes * 8 / s.bits;
  require(o.K % s.group_size == 0, where + ": " + std::to_string(o.K) +
                                       " values per row are not divisible by group_size " +
                                       std::to_string(s.group_size));
  o.shape = with_last(packed_in.shape, o.K);
  o.rows = numel(Shape(o.shape.begin(), o.shape.end() - 1));
  o.groups = o.K / s.group_size;
  const Shape compact_shape = with_last(o.shape, o.groups);

  const bool affine = s.mode == Mode::affine;
  if (affine) {
    require(is_float(scales_in.dtype),
            where + ": scales must be float32, float16 or bfloat16, got " + dtype_name(scales_in.dtype));
    require(biases_in != nullptr, where + ": biases are required");
    require(biases_in->dtype == scales_in.dtype && biases_in->shape == scales_in.shape,
            where + ": biases " + shape_str(biases_in->shape) + " " + dtype_name(biases_in->dtype) +
                " must match scales " + shape_str(scales_in.shape) + " " + dtype_name(scales_in.dtype));
  } else {
    require(scales_in.dtype == DType::uint8, where + ": scales must be uint8 codes, got " + dtype_name(scales_in.dtype));
    require(biases_in == nullptr, where + ": biases are only used by affine");
  }
  o.scale_dtype = scales_in.dtype;
  if (s.layout == Layout::swizzled) {
    const Shape sw = {roundup(o.rows, 128), roundup(o.groups, 4)};
    require(scales_in.shape == sw, where + ": swizzled scales must have shape " + shape_str(sw) + " for packed " +
                                       shape_str(packed_in.shape) + ", got " + shape_str(scales_in.shape));
    o.scales.copy = unswizzle_scales(scales_in, o.rows, o.groups);
    o.scales.data = o.scales.copy.bytes();
    o.scales.numel = o.scales.copy.numel();
  } else {
    require(scales_in.shape == compact_shape, where + ": scales must have shape " + shape_str(compact_shape) +
                                                  " for packed " + shape_str(packed_in.shape) + ", got " +
                                                  shape_str(scales_in.shape));
    o.scales = rows_of(scales_in);
  }
  o.packed = rows_of(packed_in);
  if (affine) o.biases = rows_of(*biases_in);
  return o;
}

}  // namespace detail

Tensor dequantize(const TensorView& packed, const TensorView& scales, const TensorView* biases, const QuantSpec& spec,
                  DType dtype) {
  require(is_float(dtype), std::string("dequantize: output dtype ") + dtype_name(dtype) +
                               " is not supported (float32, float16 or bfloat16)");
  const detail::QuantizedOperand w = detail::check_operand(packed, scales, biases, spec, "dequantize");
  const auto* p = reinterpret_cast<const std::uint8_t*>(w.packed.data);
  Tensor y = Tensor::uninitialized(dtype, w.shape);  // every element is written
  if (backend() == Backend::reference)
    reference::dequantize(p, w.scales.data, w.biases.data, w.scale_dtype, w.rows, w.K, w.spec, dtype, y.bytes());
  else
    cpu::dequantize(p, w.scales.data, w.biases.data, w.scale_dtype, w.rows, w.K, w.spec, dtype, y.bytes());
  return y;
}

Tensor swizzle_scales(const TensorView& scales) {
  require(scales.dtype == DType::uint8,
          std::string("swizzle_scales: scales must be uint8, got ") + dtype_name(scales.dtype));
  require(scales.rank() >= 1, "swizzle_scales: scales must have rank >= 1");
  const std::int64_t C = scales.shape.back();
  const std::int64_t R = C == 0 ? numel(Shape(scales.shape.begin(), scales.shape.end() - 1))
                                : scales.numel() / C;
  const Tensor compact = detail::contiguous(scales);
  Tensor out(DType::uint8, {roundup(R, 128), roundup(C, 4)});
  reference::swizzle(compact.data<std::uint8_t>(), R, C, out.data<std::uint8_t>());
  return out;
}

Tensor unswizzle_scales(const TensorView& swizzled, std::int64_t rows, std::int64_t cols) {
  require(swizzled.dtype == DType::uint8,
          std::string("unswizzle_scales: scales must be uint8, got ") + dtype_name(swizzled.dtype));
  require(rows >= 0 && cols >= 0, "unswizzle_scales: rows and cols must be >= 0");
  const std::int64_t need = roundup(rows, 128) * roundup(cols, 4);
  require(swizzled.numel() == need, "unswizzle_scales: " + std::to_string(rows) + "x" +
                                        std::to_string(cols) + " scales need " + std::to_string(need) +
                                        " swizzled bytes, got " + std::to_string(swizzled.numel()));
  const Tensor sw = detail::contiguous(swizzled);
  Tensor out(DType::uint8, {rows, cols});
  reference::unswizzle(sw.data<std::uint8_t>(), rows, cols, out.data<std::uint8_t>());
  return out;
}

}  // namespace microscale
