// Public quantize / dequantize entry points: the plan (ops/plan.hpp), then the backend's kernels.
#include "microscale/quantize.hpp"

#include "core/convert.hpp"
#include "ops/kernels.hpp"
#include "ops/operand.hpp"
#include "reference/reference.hpp"

namespace microscale {
namespace {

void require(bool ok, const std::string& msg) {
  if (!ok) throw Error(msg);
}

// nonfinite='error': fails naming the first NaN/Inf in row-major order before anything is written.
void check_finite(const ops::Kernels& k, const detail::Rows& x, DType dtype, const Shape& shape) {
  float value = 0.0f;
  const std::int64_t i = k.find_nonfinite(x.data, dtype, x.numel, &value);
  if (i >= 0) ops::throw_nonfinite(i, value, shape);
}

}  // namespace

float global_scale(const TensorView& x) {
  ops::check_amax_input(ops::arg_of(x), "global_scale");
  const ops::Kernels& k = ops::kernels_for("global_scale", {&x});  // before rows_of reads x
  const detail::Rows c = detail::rows_of(x);
  return k.amax_finite(c.data, x.dtype, c.numel);
}

Quantized quantize(const TensorView& x, const QuantSpec& spec) {
  const ops::QuantizePlan p = ops::plan_quantize(ops::arg_of(x), spec);
  const ops::Kernels& k = ops::kernels_for("quantize", {&x});
  const detail::Rows xc = detail::rows_of(x);
  if (p.spec.nonfinite == NonFinite::error) check_finite(k, xc, x.dtype, x.shape);

  Quantized q;
  q.spec = p.spec;
  q.shape = x.shape;
  q.packed = Tensor(DType::uint8, p.packed);
  Tensor compact(p.scale_dtype, p.compact_scales);
  if (p.spec.mode == Mode::affine) q.biases = Tensor(p.scale_dtype, p.biases);
  k.quantize(xc.data, x.dtype, p.rows, p.K, p.spec, q.packed.data<std::uint8_t>(), compact.bytes(), q.biases.bytes());
  q.scales = p.spec.layout == Layout::swizzled ? swizzle_scales(compact.view()) : compact;
  return q;
}

Tensor dequantize(const Quantized& q, DType dtype) {
  const bool affine = q.spec.mode == Mode::affine;
  const TensorView biases = affine ? q.biases.view() : TensorView();
  return dequantize(q.packed.view(), q.scales.view(), affine ? &biases : nullptr, q.spec, dtype);
}

namespace ops {

QuantizedOperand bind_operand(const OperandPlan& plan, const TensorView& packed, const TensorView& scales,
                              const TensorView* biases) {
  QuantizedOperand o;
  if (plan.spec.layout == Layout::swizzled) {
    Tensor host_scales;  // swizzled device scales are unswizzled on the host
    o.scales.copy = unswizzle_scales(host_readable(scales, host_scales), plan.rows, plan.groups);
    o.scales.data = o.scales.copy.bytes();
    o.scales.numel = o.scales.copy.numel();
  } else {
    o.scales = detail::rows_of(scales);
  }
  o.packed = detail::rows_of(packed);
  if (plan.spec.mode == Mode::affine) o.biases = detail::rows_of(*biases);
  return o;
}

}  // namespace ops

Tensor dequantize(const TensorView& packed, const TensorView& scales, const TensorView* biases, const QuantSpec& spec,
                  DType dtype) {
  const std::optional<ops::Arg> b = ops::optional_arg(biases);
  const ops::OperandPlan p =
      ops::plan_dequantize(ops::arg_of(packed), ops::arg_of(scales), ops::opt_ptr(b), spec, dtype);
  const ops::Kernels& k = ops::kernels_for("dequantize", {&packed, &scales, biases});
  const ops::QuantizedOperand w = ops::bind_operand(p, packed, scales, biases);
  Tensor y = Tensor::uninitialized(dtype, p.shape);  // every element is written
  k.dequantize(reinterpret_cast<const std::uint8_t*>(w.packed.data), w.scales.data, w.biases.data, p.scale_dtype,
               p.rows, p.K, p.spec, dtype, y.bytes());
  return y;
}

Tensor swizzle_scales(const TensorView& scales) {
  require(scales.dtype == DType::uint8,
          std::string("swizzle_scales: scales must be uint8, got ") + dtype_name(scales.dtype));
  require(scales.rank() >= 1, "swizzle_scales: scales must have rank >= 1");
  const std::int64_t C = scales.shape.back();
  const std::int64_t R = C == 0 ? numel(Shape(scales.shape.begin(), scales.shape.end() - 1)) : scales.numel() / C;
  const Tensor compact = detail::contiguous(scales);
  Tensor out(DType::uint8, {ops::roundup(R, 128), ops::roundup(C, 4)});
  reference::swizzle(compact.data<std::uint8_t>(), R, C, out.data<std::uint8_t>());
  return out;
}

Tensor unswizzle_scales(const TensorView& swizzled, std::int64_t rows, std::int64_t cols) {
  require(swizzled.dtype == DType::uint8,
          std::string("unswizzle_scales: scales must be uint8, got ") + dtype_name(swizzled.dtype));
  require(rows >= 0 && cols >= 0, "unswizzle_scales: rows and cols must be >= 0");
  const std::int64_t need = ops::roundup(rows, 128) * ops::roundup(cols, 4);
  require(swizzled.numel() == need, "unswizzle_scales: " + std::to_string(rows) + "x" + std::to_string(cols) +
                                        " scales need " + std::to_string(need) + " swizzled bytes, got " +
                                        std::to_string(swizzled.numel()));
  const Tensor sw = detail::contiguous(swizzled);
  Tensor out(DType::uint8, {rows, cols});
  reference::unswizzle(sw.data<std::uint8_t>(), rows, cols, out.data<std::uint8_t>());
  return out;
}

}  // namespace microscale
