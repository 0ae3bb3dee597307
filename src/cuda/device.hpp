// Internal host-side plumbing of the CUDA backend: error checks, stream-ordered scratch memory,
// the device side of the ops' plans (pointers, caller-allocated outputs) and the entry points one
// translation unit offers another.
#pragma once

#include <cuda_runtime_api.h>

#include <optional>
#include <string>

#include "cuda/blocks.cuh"
#include "microscale/cuda.hpp"
#include "ops/plan.hpp"

namespace microscale::cuda::detail {

// Throws Error("<what>: <CUDA error name>: <description>") unless e is cudaSuccess.
void check(cudaError_t e, const std::string& what);

inline void require(bool ok, const std::string& msg) {
  if (!ok) throw Error(msg);
}

using ops::roundup;

// Device memory owned until the end of scope, allocated and freed in stream order.
class Scratch {
 public:
  Scratch(std::size_t bytes, Stream stream);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  Stream stream_;
};

// A DeviceTensor that owns its memory (a Scratch).
struct ScratchTensor {
  Scratch mem;
  DeviceTensor view;
  ScratchTensor(DType dtype, Shape shape, Stream stream)
      : mem(static_cast<std::size_t>(numel(shape)) * dtype_size(dtype), stream),
        view{mem.get(), dtype, std::move(shape)} {}
};

// Checks dtype, shape and pointer (non-null when non-empty, 16-byte aligned) of a view.
void check_tensor(const DeviceTensor& t, DType dtype, const Shape& shape, const std::string& what);
// Same for any float dtype.
void check_float_tensor(const DeviceTensor& t, const Shape& shape, const std::string& what);
void check_pointer(const DeviceTensor& t, const std::string& what);

// A device operand as the plans (ops/plan.hpp) read it: biases are passed where the mode reads
// them (affine) or the caller set them (an error for the fp modes). The kernels read packed
// bytes, so packed must be uint8 (the host ops also take MLX's uint32 words).
struct OperandArgs {
  ops::Arg packed, scales;
  std::optional<ops::Arg> biases;
};
OperandArgs operand_args(const DeviceQuantized& w, Mode mode, const std::string& op);
// The kernels' view of a planned operand, its pointers checked; `rows` of one stored matrix
// (all leading axes flattened for quantize/dequantize, the matmuls take one matrix's).
QuantizedArgs bind_operand(const ops::OperandPlan& p, const DeviceQuantized& w, std::int64_t rows,
                           const std::string& op);

// Flat index of the first NaN or Inf of x, or -1. Synchronizes the stream.
std::int64_t first_nonfinite(const DeviceTensor& x, Stream stream);

// qqmm's product on codes already quantized under spec_x (compact scales): y [M, N] = alpha *
// (x @ w^T) (+ bias [N]) on the tensor-core kernel; `w` is the plan of wq [N, K].
void qqmm_codes(const DeviceQuantized& xq, const QuantSpec& spec_x, const DeviceQuantized& wq,
                const ops::OperandPlan& w, std::int64_t M, float alpha, const DeviceTensor* bias, const DeviceTensor& y,
                Stream stream);

// Compact uint8 scales [R, C] to the zero-padded swizzled layout [roundup(R,128), roundup(C,4)].
void swizzle(const std::uint8_t* compact, std::int64_t R, std::int64_t C, std::uint8_t* out, Stream stream);

// y [M, N] float32 = alpha * (x @ w^T) through cuBLASLt's block-scaled GEMM (sm_100+): x and w
// quantized under `spec` (nvfp4, mxfp4 or mxfp8) with swizzled scales. Returns false, having
// queued nothing, when this device or cuBLASLt cannot run the mode, element types or shape.
bool cublaslt_block_scaled(const QuantSpec& spec, const void* x_packed, const void* x_scales, const void* w_packed,
                           const void* w_scales, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, float* y,
                           Stream stream);

}  // namespace microscale::cuda::detail
