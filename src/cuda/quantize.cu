// amax, quantize, dequantize and scale swizzling on the device, plus the shared host plumbing.
// Kernels are grid-stride loops over independent work items (a group to quantize, eight values
// to decode) that call the blocks.cuh functions; built with --fmad=false, so every float
// operation rounds exactly as the CPU reference's.
#include <cuda_runtime.h>

#include "cuda/device.hpp"

namespace microscale::cuda {
namespace detail {

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    throw Error("microscale::cuda " + what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

Scratch::Scratch(std::size_t bytes, Stream stream) : stream_(stream) {
  if (bytes) check(cudaMallocAsync(&ptr_, bytes, stream), "scratch allocation");
}
Scratch::~Scratch() {
  if (ptr_) cudaFreeAsync(ptr_, stream_);  // a destructor cannot throw; a failure here shows up later
}

void check_pointer(const DeviceTensor& t, const std::string& what) {
  if (t.numel() == 0) return;
  require(t.data != nullptr, what + ": null data pointer for a non-empty tensor");
  require(reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0, what + ": device pointer must be 16-byte aligned");
}

void check_tensor(const DeviceTensor& t, DType dtype, const Shape& shape, const std::string& what) {
  require(t.dtype == dtype && t.shape == shape, what + " must be " + dtype_name(dtype) + " " + shape_str(shape) +
                                                    ", got " + dtype_name(t.dtype) + " " + shape_str(t.shape));
  check_pointer(t, what);
}

void check_float_tensor(const DeviceTensor& t, const Shape& shape, const std::string& what) {
  require(is_float(t.dtype), what + " must be float32, float16 or bfloat16, got " + dtype_name(t.dtype));
  check_tensor(t, t.dtype, shape, what);
}

OperandArgs operand_args(const DeviceQuantized& w, Mode mode, const std::string& op) {
  require(w.packed.dtype == DType::uint8,
          op + " (" + name(mode) + "): packed values must be uint8, got " + dtype_name(w.packed.dtype));
  OperandArgs a{ops::arg_of(w.packed), ops::arg_of(w.scales), std::nullopt};
  if (mode == Mode::affine || w.biases.data != nullptr) a.biases = ops::arg_of(w.biases);
  return a;
}

QuantizedArgs bind_operand(const ops::OperandPlan& p, const DeviceQuantized& w, std::int64_t rows,
                           const std::string& op) {
  const std::string where = op + " (" + name(p.spec.mode) + ")";
  const bool affine = p.spec.mode == Mode::affine;
  check_pointer(w.packed, where + ": packed values");
  check_pointer(w.scales, where + ": scales");
  if (affine) check_pointer(w.biases, where + ": biases");
  return quantized_args(p.spec, w.packed.data, w.scales.data, affine ? w.biases.data : nullptr, p.scale_dtype, rows,
                        p.K);
}

namespace {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items (enough to fill any current GPU, never zero).
unsigned blocks_for(std::int64_t n) {
  const std::int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

__device__ std::int64_t first_item() { return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ std::int64_t item_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

__global__ void amax_kernel(const void* x, DType t, std::int64_t n, unsigned* out) {
  float m = 0.0f;
  for (std::int64_t i = first_item(); i < n; i += item_stride()) {
    const float v = load_float(x, i, t);
    if (is_finite(v)) m = fmaxf(m, fabsf(v));
  }
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  // Non-negative floats order like their bit patterns, so an integer max is the float max.
  if ((threadIdx.x & 31) == 0) atomicMax(out, __float_as_uint(m));
}

__global__ void first_nonfinite_kernel(const void* x, DType t, std::int64_t n, unsigned long long* first) {
  for (std::int64_t i = first_item(); i < n; i += item_stride()) {
    if (!is_finite(load_float(x, i, t))) {
      atomicMin(first, static_cast<unsigned long long>(i));
      return;
    }
  }
}

__global__ void quantize_kernel(QuantizeArgs a) {
  for (std::int64_t g = first_item(); g < a.rows * a.groups; g += item_stride()) quantize_group(a, g);
}

__global__ void dequantize_kernel(QuantizedArgs q, void* y, DType out) {
  for (std::int64_t id = first_item(); id < q.rows * q.cols / 8; id += item_stride()) dequantize_chunk(q, y, out, id);
}

__global__ void swizzle_kernel(const std::uint8_t* compact, std::int64_t R, std::int64_t C, std::int64_t cp,
                               std::uint8_t* out) {
  for (std::int64_t i = first_item(); i < R * C; i += item_stride())
    out[swizzled_offset(i / C, i % C, cp)] = compact[i];
}

void launched(const char* what) { check(cudaGetLastError(), std::string(what) + " launch"); }

// nonfinite='error': fails naming the first NaN/Inf in row-major order, as the CPU does.
void check_finite(const DeviceTensor& x, Stream stream) {
  const std::int64_t i = first_nonfinite(x, stream);
  if (i < 0) return;
  const std::size_t size = dtype_size(x.dtype);
  alignas(4) unsigned char bytes[4] = {};
  check(cudaMemcpy(bytes, static_cast<const unsigned char*>(x.data) + static_cast<std::size_t>(i) * size, size,
                   cudaMemcpyDeviceToHost),
        "quantize");
  ops::throw_nonfinite(i, load_float(bytes, 0, x.dtype), x.shape);
}

}  // namespace

std::int64_t first_nonfinite(const DeviceTensor& x, Stream stream) {
  if (x.numel() == 0) return -1;
  Scratch first(sizeof(unsigned long long), stream);
  auto* f = static_cast<unsigned long long*>(first.get());
  check(cudaMemsetAsync(f, 0xFF, sizeof *f, stream), "quantize");
  first_nonfinite_kernel<<<blocks_for(x.numel()), kThreads, 0, stream>>>(x.data, x.dtype, x.numel(), f);
  launched("quantize");
  unsigned long long i = 0;
  check(cudaMemcpyAsync(&i, f, sizeof i, cudaMemcpyDeviceToHost, stream), "quantize");
  check(cudaStreamSynchronize(stream), "quantize");
  return i == ~0ull ? -1 : static_cast<std::int64_t>(i);
}

void swizzle(const std::uint8_t* compact, std::int64_t R, std::int64_t C, std::uint8_t* out, Stream stream) {
  check(cudaMemsetAsync(out, 0, static_cast<std::size_t>(roundup(R, 128) * roundup(C, 4)), stream), "swizzle");
  if (R * C == 0) return;
  swizzle_kernel<<<blocks_for(R * C), kThreads, 0, stream>>>(compact, R, C, roundup(C, 4), out);
  launched("swizzle");
}

}  // namespace detail

using namespace detail;

bool available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  // The kernels are built for sm_90a and sm_100a only; this fails on any other device.
  cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, amax_kernel) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

QuantizedShapes quantized_shapes(const Shape& x, DType dtype, const QuantSpec& spec) {
  const ops::QuantizePlan p = ops::plan_quantize({dtype, x}, spec);
  return {p.packed, p.scales, p.biases, p.scale_dtype};
}

float amax(const DeviceTensor& x, Stream stream) {
  ops::check_amax_input(ops::arg_of(x), "amax");
  check_pointer(x, "amax: x");
  if (x.numel() == 0) return 0.0f;
  Scratch out(sizeof(unsigned), stream);
  auto* o = static_cast<unsigned*>(out.get());
  check(cudaMemsetAsync(o, 0, sizeof *o, stream), "amax");
  amax_kernel<<<blocks_for(x.numel()), kThreads, 0, stream>>>(x.data, x.dtype, x.numel(), o);
  launched("amax");
  unsigned bits = 0;
  check(cudaMemcpyAsync(&bits, o, sizeof bits, cudaMemcpyDeviceToHost, stream), "amax");
  check(cudaStreamSynchronize(stream), "amax");
  return float_of(bits);
}

void quantize(const DeviceTensor& x, const QuantSpec& spec, const DeviceQuantized& out, Stream stream) {
  const ops::QuantizePlan p = ops::plan_quantize(ops::arg_of(x), spec);
  const QuantSpec& s = p.spec;
  // The searched modes run on the host backends only (their global scale is an output, too).
  if (s.scale_search != ScaleSearch::none)
    throw Error(std::string("quantize (CUDA): scale_search '") + name(s.scale_search) +
                "' is not supported on the device; quantize on the host (reference or cpu backend)");
  // The training recipe's options (docs/numerics.md) have host kernels only; microscale::quantize
  // applies hadamard on the host before any backend runs.
  if (s.scale_2d || s.hadamard || s.sr_seed)
    throw Error(std::string("quantize (CUDA): ") +
                (s.scale_2d   ? "scale_2d"
                 : s.hadamard ? "hadamard"
                              : "sr_seed (stochastic rounding)") +
                " is not supported on the device; quantize on the host (reference or cpu backend)");
  check_pointer(x, "quantize: x");
  check_tensor(out.packed, DType::uint8, p.packed, "quantize: packed output");
  check_tensor(out.scales, p.scale_dtype, p.scales, "quantize: scales output");
  if (s.mode == Mode::affine) check_tensor(out.biases, p.scale_dtype, p.biases, "quantize: biases output");
  if (x.numel() == 0) return;
  if (s.nonfinite == NonFinite::error) check_finite(x, stream);
  if (s.layout == Layout::swizzled)  // padding must read as zero scales
    check(cudaMemsetAsync(out.scales.data, 0, static_cast<std::size_t>(out.scales.numel()), stream), "quantize");
  const QuantizeArgs a = quantize_args(s, x.dtype, x.data, p.rows, p.K, static_cast<std::uint8_t*>(out.packed.data),
                                       out.scales.data, out.biases.data);
  quantize_kernel<<<blocks_for(p.rows * a.groups), kThreads, 0, stream>>>(a);
  launched("quantize");
}

void dequantize(const DeviceQuantized& q, const QuantSpec& spec, const DeviceTensor& y, Stream stream) {
  const OperandArgs args = operand_args(q, spec.mode, "dequantize");
  const ops::OperandPlan p = ops::plan_dequantize(args.packed, args.scales, ops::opt_ptr(args.biases), spec, y.dtype);
  const QuantizedArgs a = bind_operand(p, q, p.rows, "dequantize");
  check_tensor(y, y.dtype, p.shape, "dequantize: output");
  if (y.numel() == 0) return;
  dequantize_kernel<<<blocks_for(y.numel() / 8), kThreads, 0, stream>>>(a, y.data, y.dtype);
  launched("dequantize");
}

}  // namespace microscale::cuda
