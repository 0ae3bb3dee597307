// Inference layers built on the quantized ops: plain values that own their quantized weights.
#pragma once

#include <optional>
#include <vector>

#include "microscale/matmul.hpp"

namespace microscale {

// y = x @ W^T + bias with W quantized once. For nvfp4 the weight's amax is its global scale
// (three-level) unless `use_global_scale` is false or spec.global_scale is given.
struct QuantizedLinear {
  Quantized weight;            // logical [N, K]
  std::optional<Tensor> bias;  // [N], the dtype it was given in

  static QuantizedLinear from_linear(const TensorView& weight, const TensorView* bias, const QuantSpec& spec,
                                     bool use_global_scale = true);
  std::int64_t in_features() const { return weight.shape.back(); }
  std::int64_t out_features() const { return weight.shape.front(); }
  Tensor forward(const TensorView& x) const;
};

// Row lookup in a quantized [V, D] table: only the selected rows are dequantized. as_linear(x)
// multiplies by the table's transpose (tied output heads).
struct QuantizedEmbedding {
  Quantized table;                 // logical [V, D]
  DType dtype = DType::float32;    // dtype of lookups (the original table's)

  static QuantizedEmbedding from_embedding(const TensorView& table, const QuantSpec& spec,
                                           bool use_global_scale = true);
  // indices: int32 / int64 / uint32 of any shape, each in [0, V); result shape indices.shape + (D,).
  Tensor forward(const TensorView& indices) const;
  Tensor as_linear(const TensorView& x) const;
};

// Both operands quantized: weights once, activations on every call (nvfp4, mxfp4, mxfp8). nvfp4
// uses the activation's own amax per call (dynamic per-tensor scale) until calibrate() freezes a
// static one: the largest amax over the calibration batches.
struct QQLinear {
  Quantized weight;                      // logical [N, K]
  std::optional<Tensor> bias;
  std::optional<float> input_global_scale;  // static activation amax once calibrated (nvfp4)

  static QQLinear from_linear(const TensorView& weight, const TensorView* bias, const QuantSpec& spec);
  void calibrate(const std::vector<TensorView>& batches);
  Tensor forward(const TensorView& x) const;
};

}  // namespace microscale
