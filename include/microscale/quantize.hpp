// quantize / dequantize of every mode, the tensor amax, and scale-layout conversion.
//
// Quantization runs along the last axis in groups of `group_size`; leading axes are kept. For an
// input of shape [..., K]:
//   packed  uint8 [..., K*bits/8]   FP4: even element in the low nibble; affine: LSB-first bit
//                                    stream; viewed as little-endian uint32 it is MLX's w_q.
//   scales  compact:  uint8 [..., K/group] (E4M3 for nvfp4, E8M0 for mx), input dtype for affine
//           swizzled: uint8 [Rp, Cp], R = rows (leading axes flattened), C = K/group, padded to
//                     multiples of 128 and 4 with zeros (fp modes only)
//   biases  affine only: input dtype [..., K/group]
#pragma once

#include "microscale/format.hpp"
#include "microscale/tensor.hpp"

namespace microscale {

struct Quantized {
  Tensor packed;
  Tensor scales;
  Tensor biases;   // affine only; empty otherwise
  QuantSpec spec;  // resolved: group_size and bits filled in, global_scale as used
  Shape shape;     // logical shape of the quantized tensor ([..., K])
};

// Quantizes x (float32, float16 or bfloat16; any rank >= 1; any strides).
Quantized quantize(const TensorView& x, const QuantSpec& spec);

// Dequantizes to `dtype` (float32, float16 or bfloat16).
Tensor dequantize(const Quantized& q, DType dtype);
// Same from loose parts, as stored in a checkpoint: K is taken from packed's last axis and the
// resolved spec's bits; scales and biases must match (compact or swizzled per spec.layout).
Tensor dequantize(const TensorView& packed, const TensorView& scales, const TensorView* biases, const QuantSpec& spec,
                  DType dtype);

// The 16-point random Hadamard transform of the NVFP4 training recipe along the last axis (K a
// multiple of 16; docs/numerics.md): per chunk of 16, y = RN_bf16(0.25 * (d * x) H) with H the
// Sylvester Hadamard matrix and d TransformerEngine's signs (0xD7E8). x is float32, float16 or
// bfloat16; y has x's shape and dtype `out` (float32 or bfloat16; the values are bfloat16 either
// way). Transforming both operands of x @ w^T leaves the product unchanged up to rounding.
Tensor hadamard_transform(const TensorView& x, DType out = DType::bfloat16);

// Tensor amax as float32, ignoring NaN and +-Inf (0 when no finite value): the value nvfp4 takes
// as global_scale.
float global_scale(const TensorView& x);

// Compact [R, C] uint8 scales (leading axes of a higher-rank input are flattened into R) to the
// swizzled [roundup(R,128), roundup(C,4)] layout, padding zero-filled; and back.
Tensor swizzle_scales(const TensorView& scales);
Tensor unswizzle_scales(const TensorView& swizzled, std::int64_t rows, std::int64_t cols);
// Byte offset of compact element (r, c) inside the swizzled buffer with Cp padded columns.
inline std::int64_t swizzled_offset(std::int64_t r, std::int64_t c, std::int64_t cp) {
  return ((r / 128) * (cp / 4) + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

}  // namespace microscale
