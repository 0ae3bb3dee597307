// CUDA backend (library microscale_cuda; kernels for sm_90a and sm_100a): the ops of quantize.hpp
// and matmul.hpp on device memory, with the same semantics (FORMATS.md). quantize and dequantize
// give the same bytes as the CPU library; the matmuls accumulate in float32 and round once.
//
// Tensors are non-owning views of row-major, contiguous device memory; the caller allocates every
// output with the shape documented for the op (quantized_shapes() gives quantize's). Data
// pointers must be 16-byte aligned (cudaMalloc gives 256). Work is queued on `stream` (nullptr:
// the legacy default stream) and temporaries use the stream-ordered allocator; ops that must read
// a result on the host (amax, nonfinite = error, gather_qmm's indices) synchronize the stream.
// Empty outputs launch nothing. Every failure throws microscale::Error.
//
// Linking microscale_cuda also makes Backend::cuda (runtime.hpp) available: the host API of
// quantize.hpp and matmul.hpp then runs on the device, on host or device operands.
#pragma once

#include <optional>

#include "microscale/format.hpp"
#include "microscale/tensor.hpp"

struct CUstream_st;

namespace microscale::cuda {

using Stream = CUstream_st*;  // cudaStream_t

struct DeviceTensor {
  void* data = nullptr;
  DType dtype = DType::float32;
  Shape shape;

  std::int64_t numel() const { return microscale::numel(shape); }
};

// Packed values, scales and (affine only) biases of one quantized tensor, as quantize.hpp lays
// them out; biases.data is null for the fp modes.
struct DeviceQuantized {
  DeviceTensor packed, scales, biases;
};

// True when a CUDA device is present and this build has kernels for it.
bool available();

// Shapes and dtypes quantize() writes for input `x` of dtype `dtype` under `spec`.
struct QuantizedShapes {
  Shape packed, scales, biases;  // biases: affine only
  DType scale_dtype;             // uint8 codes, or x's dtype for affine
};
QuantizedShapes quantized_shapes(const Shape& x, DType dtype, const QuantSpec& spec);

// Largest |x| over finite values, 0 if none (the nvfp4 global scale). Synchronizes the stream.
float amax(const DeviceTensor& x, Stream stream = nullptr);

void quantize(const DeviceTensor& x, const QuantSpec& spec, const DeviceQuantized& out, Stream stream = nullptr);

// y: float32, float16 or bfloat16 with the logical shape [..., K] (K from packed and spec.bits).
void dequantize(const DeviceQuantized& q, const QuantSpec& spec, const DeviceTensor& y, Stream stream = nullptr);

// y = x @ W^T (transpose) or x @ W with W quantized as in microscale::quantized_matmul, batch
// axes broadcast. y: any float dtype, shape broadcast(batch) + [M, N] ([N] for 1-D x); bias [N].
void quantized_matmul(const DeviceTensor& x, const DeviceQuantized& w, bool transpose, const QuantSpec& spec,
                      const DeviceTensor& y, const DeviceTensor* bias = nullptr, Stream stream = nullptr);

// microscale::gather_qmm on the device. Indices (int32, int64 or uint32, device memory) are
// copied to the host to be checked, so this synchronizes the stream; `sorted_indices` is a hint.
void gather_qmm(const DeviceTensor& x, const DeviceQuantized& w, const DeviceTensor* lhs_indices,
                const DeviceTensor* rhs_indices, bool transpose, const QuantSpec& spec, const DeviceTensor& y,
                bool sorted_indices = false, Stream stream = nullptr);

// How qqmm multiplies: automatic picks cuBLASLt's block-scaled GEMM where the device (sm_100)
// and cuBLASLt support the mode and shape, else the tensor-core kernel (every device).
enum class QqmmPath { automatic, tensor_core, cublaslt };

// microscale::qqmm: y = x @ w^T, x float [..., K] quantized on the fly, w 2-D float [N, K] or
// packed [N, K*bits/8] with `w_scales` (layout per spec.layout). y: any float dtype, [..., N].
void qqmm(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor* w_scales, const QuantSpec& spec,
          std::optional<float> global_scale_x, std::optional<float> global_scale_w, const DeviceTensor& y,
          const DeviceTensor* bias = nullptr, QqmmPath path = QqmmPath::automatic, Stream stream = nullptr);

}  // namespace microscale::cuda
