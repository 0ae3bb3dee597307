#include "microscale/layers.hpp"

#include <algorithm>
#include <cstring>

#include "core/convert.hpp"

namespace microscale {
namespace {

void require(bool ok, const std::string& msg) {
  if (!ok) throw Error(msg);
}

void check_weight(const TensorView& w, const char* layer) {
  require(is_float(w.dtype), std::string(layer) + ": weight must be float32, float16 or bfloat16, got " +
                                 dtype_name(w.dtype));
  require(w.rank() == 2, std::string(layer) + ": weight must be 2-D, got " + shape_str(w.shape));
}

std::optional<Tensor> copy_bias(const TensorView* bias, std::int64_t n, const char* layer) {
  if (bias == nullptr) return std::nullopt;
  require(is_float(bias->dtype), std::string(layer) + ": bias must be float32, float16 or bfloat16");
  require(bias->shape == Shape{n},
          std::string(layer) + ": bias must have shape " + shape_str({n}) + ", got " + shape_str(bias->shape));
  return detail::contiguous(*bias);
}

// nvfp4 weights default to three-level with their own amax as global scale.
QuantSpec weight_spec(const TensorView& w, QuantSpec spec, bool use_global_scale) {
  spec.layout = Layout::compact;
  if (spec.mode == Mode::nvfp4 && use_global_scale && !spec.global_scale) spec.global_scale = global_scale(w);
  return spec;
}

}  // namespace

QuantizedLinear QuantizedLinear::from_linear(const TensorView& weight, const TensorView* bias, const QuantSpec& spec,
                                             bool use_global_scale) {
  check_weight(weight, "QuantizedLinear");
  QuantizedLinear l;
  l.weight = quantize(weight, weight_spec(weight, spec, use_global_scale));
  l.bias = copy_bias(bias, weight.shape[0], "QuantizedLinear");
  return l;
}

Tensor QuantizedLinear::forward(const TensorView& x) const {
  const TensorView b = bias ? bias->view() : TensorView();
  return quantized_matmul(x, weight, true, bias ? &b : nullptr);
}

QuantizedEmbedding QuantizedEmbedding::from_embedding(const TensorView& table, const QuantSpec& spec,
                                                      bool use_global_scale) {
  check_weight(table, "QuantizedEmbedding");
  QuantizedEmbedding e;
  e.table = quantize(table, weight_spec(table, spec, use_global_scale));
  e.dtype = table.dtype;
  return e;
}

Tensor QuantizedEmbedding::forward(const TensorView& indices) const {
  const std::int64_t V = table.shape[0], D = table.shape[1];
  const std::vector<std::int64_t> rows = detail::read_indices(indices, V, "QuantizedEmbedding", "indices");
  const auto n = static_cast<std::int64_t>(rows.size());
  // Gather the selected rows' bytes, then dequantize just those in one call.
  auto gather = [&](const Tensor& t) {
    const std::int64_t width = t.shape()[1];
    Tensor out(t.dtype(), {n, width});
    const std::size_t row_bytes = static_cast<std::size_t>(width) * dtype_size(t.dtype());
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::memcpy(out.bytes() + i * row_bytes, t.bytes() + static_cast<std::size_t>(rows[i]) * row_bytes, row_bytes);
    return out;
  };
  const Tensor packed = gather(table.packed), scales = gather(table.scales);
  const bool affine = table.spec.mode == Mode::affine;
  const Tensor biases = affine ? gather(table.biases) : Tensor();
  const TensorView bv = affine ? biases.view() : TensorView();
  Shape out_shape = indices.shape;
  out_shape.push_back(D);
  return dequantize(packed.view(), scales.view(), affine ? &bv : nullptr, table.spec, dtype).reshaped(out_shape);
}

Tensor QuantizedEmbedding::as_linear(const TensorView& x) const { return quantized_matmul(x, table, true); }

QQLinear QQLinear::from_linear(const TensorView& weight, const TensorView* bias, const QuantSpec& spec) {
  check_weight(weight, "QQLinear");
  require(spec.mode != Mode::affine, "QQLinear: mode must be nvfp4, mxfp4 or mxfp8");
  QQLinear l;
  l.weight = quantize(weight, weight_spec(weight, spec, true));
  l.bias = copy_bias(bias, weight.shape[0], "QQLinear");
  return l;
}

void QQLinear::calibrate(const std::vector<TensorView>& batches) {
  require(weight.spec.mode == Mode::nvfp4, "QQLinear.calibrate: only nvfp4 uses an activation global scale");
  require(!batches.empty(), "QQLinear.calibrate: no calibration batches");
  float amax = 0.0f;
  for (const TensorView& b : batches) amax = std::max(amax, global_scale(b));
  input_global_scale = amax;
}

Tensor QQLinear::forward(const TensorView& x) const {
  QuantSpec s = weight.spec;
  const std::optional<float> gw = s.global_scale;
  s.global_scale.reset();
  std::optional<float> gx;
  if (gw) gx = input_global_scale ? *input_global_scale : global_scale(x);
  const TensorView b = bias ? bias->view() : TensorView();
  const TensorView scales = weight.scales.view();
  return qqmm(x, weight.packed.view(), &scales, s, gx, gw, bias ? &b : nullptr);
}

}  // namespace microscale
