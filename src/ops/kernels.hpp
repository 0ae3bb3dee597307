// Internal: the kernels of every backend behind one table. The ops validate and plan
// (ops/plan.hpp), then run the plan on kernels_for(their operands): the table of the backend set
// now, or the CUDA table when an operand lives in device memory. The host tables live in
// backend.cpp; the CUDA table is registered by microscale_cuda (src/cuda/backend.cu), so the core
// library never links CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "cpu/kernels.hpp"
#include "microscale/format.hpp"
#include "microscale/tensor.hpp"

namespace microscale::ops {

// Row-major contiguous inputs in their own dtype, as src/cpu/kernels.hpp describes them; the
// reference entries give the same bytes with the scalar kernels of src/reference (no SIMD). The
// CUDA entries take host or device pointers for every argument and write outputs wherever they
// live.
struct Kernels {
  void (*quantize)(const void* x, DType src, std::int64_t rows, std::int64_t K, const QuantSpec& spec,
                   std::uint8_t* packed, std::byte* scales, std::byte* biases);
  void (*dequantize)(const std::uint8_t* packed, const std::byte* scales, const std::byte* biases, DType scale_dtype,
                     std::int64_t rows, std::int64_t K, const QuantSpec& spec, DType out, std::byte* y);
  // Three-level nvfp4 mse's global-scale search (ops/quantize.cpp): for each of n candidate
  // global scales, the sum over the `blocks` blocks of 16 of the float32 error mse's block scale
  // leaves (reference::nvfp4_global_errors), and, where scales is not null, those block scales
  // (n x blocks codes, candidate-major). False when x holds a NaN or Inf. Null in the CUDA table
  // (the searched modes run on the host).
  bool (*nvfp4_global_errors)(const void* x, DType src, std::int64_t blocks, const float* globals, int n,
                              double* totals, std::uint8_t* scales);
  // The element codes of finite three-level nvfp4 blocks under the given block scales
  // (reference::nvfp4_encode), round-to-nearest: how the search's winner is written. Null in the
  // CUDA table.
  void (*nvfp4_encode)(const void* x, DType src, std::int64_t blocks, float global_scale, const std::uint8_t* scales,
                       std::uint8_t* packed);
  float (*amax_finite)(const void* x, DType src, std::int64_t n);
  // Flat index of the first NaN or Inf, or -1; *value receives that element (as float32).
  std::int64_t (*find_nonfinite)(const void* x, DType src, std::int64_t n, float* value);
  void (*quantized_matmul)(const float* x, std::int64_t M, const cpu::QuantizedMatrix& w, bool transpose,
                           const float* bias, float* y);
  // y [M, N] float32 = alpha * (x @ w^T) (+ bias) on codes with compact scales (reference::qqmm).
  void (*qqmm)(const std::uint8_t* px, const std::uint8_t* sx, const std::uint8_t* pw, const std::uint8_t* sw,
               std::int64_t M, std::int64_t N, std::int64_t K, const QuantSpec& spec, float alpha, const float* bias,
               float* y);
  // y [M, N] float32 = x @ w^T (+ bias) for a float weight [N, K] (cpu::linear). Null in the CUDA
  // table: the op runs on the host backends only.
  void (*linear)(const float* x, std::int64_t M, const void* w, DType w_dtype, std::int64_t N, std::int64_t K,
                 const float* bias, float* y);
};

// A device backend as microscale_cuda registers it.
struct DeviceBackend {
  const Kernels* kernels;
  bool (*available)();                    // a device this build has kernels for is present
  bool (*is_device_memory)(const void*);  // p points into device memory (false where no device is)
  void (*copy)(void* dst, const void* src, std::size_t bytes);  // between any two memories
};
// Called once, at load, by microscale_cuda.
void register_cuda(const DeviceBackend& backend);

// The table of the backend set now. Throws Error when that is cuda and this program has no CUDA
// backend or no device for it.
const Kernels& kernels();
// The CUDA table when one of `operands` (null entries ignored) is device memory, else kernels().
// Errors name `op`: a device operand must be contiguous (the host side reads no device memory).
const Kernels& kernels_for(const char* op, std::initializer_list<const TensorView*> operands);

// A view the host can read: v itself, or a host copy (kept in `keep`) of a device tensor. For the
// host-side steps of an op (widening to float32, unswizzling scales, reading indices).
TensorView host_readable(const TensorView& v, Tensor& keep);

}  // namespace microscale::ops
