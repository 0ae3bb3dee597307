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

// i / d and i % d, in 32-bit arithmetic where both fit (a 64-bit division costs several times as
// many instructions, and these kernels divide once per group or chunk).
__device__ void divide(std::int64_t i, std::int64_t d, std::int64_t& q, std::int64_t& r) {
  if (((i | d) >> 32) == 0) {
    const auto ui = static_cast<std::uint32_t>(i), ud = static_cast<std::uint32_t>(d);
    q = ui / ud;
    r = ui - static_cast<std::uint32_t>(q) * ud;
  } else {
    q = i / d;
    r = i - q * d;
  }
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

// The fp modes over 16-byte aligned rows: each thread loads its whole group with 16-byte vector
// loads and stores its codes as one vector, rather than quantize_group's scalar accesses strided
// by the group across the warp. The math is quantize_group's, call for call (same bytes).
template <Mode MODE, DType SRC>
__global__ void quantize_vec_kernel(QuantizeArgs a) {
  constexpr int G = MODE == Mode::nvfp4 ? 16 : 32;
  constexpr int kBytes = MODE == Mode::mxfp8 ? G : G / 2;
  for (std::int64_t g = first_item(); g < a.rows * a.groups; g += item_stride()) {
    std::int64_t row, j;
    divide(g, a.groups, row, j);
    const std::int64_t x0 = row * a.K + j * G;
    float v[G];
    if constexpr (SRC == DType::float32) {
      const auto* p = reinterpret_cast<const float4*>(static_cast<const float*>(a.x) + x0);
#pragma unroll
      for (int i = 0; i < G / 4; ++i) {
        const float4 f = p[i];
        v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
      }
    } else {
      const auto* p = reinterpret_cast<const uint4*>(static_cast<const std::uint16_t*>(a.x) + x0);
#pragma unroll
      for (int i = 0; i < G / 8; ++i) {
        const uint4 u = p[i];
        const std::uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const auto h = static_cast<std::uint16_t>(w[k / 2] >> (16 * (k % 2)));
          v[8 * i + k] = SRC == DType::float16 ? decode_f16(h) : decode_bf16(h);
        }
      }
    }
    bool finite = true;
    float bamax = 0.0f;
#pragma unroll
    for (int i = 0; i < G; ++i) {
      finite = finite && is_finite(v[i]);
      bamax = numerics::amax_step(bamax, v[i]);
    }
    std::uint8_t* scale =
        static_cast<std::uint8_t*>(a.scales) + (a.swizzled ? swizzled_offset(row, j, a.scale_cols_padded) : g);
    std::uint32_t codes[kBytes / 4] = {};
    if (!finite && a.nonfinite != NonFinite::saturate) {
      *scale = MODE == Mode::nvfp4 ? numerics::E4M3::NAN_CODE : numerics::kE8M0NaN;
    } else {
      const numerics::BlockScale bs =
          MODE == Mode::nvfp4
              ? numerics::nvfp4_block_scale(bamax, a.nvfp4)
              : numerics::mx_block_scale(bamax, numerics::mx_elem(MODE, a.elem), a.rule, a.src, numerics::Log2Double{});
      *scale = bs.code;
#pragma unroll
      for (int i = 0; i < G; ++i) {
        if constexpr (MODE == Mode::mxfp8)
          codes[i / 4] |= static_cast<std::uint32_t>(numerics::encode_fp8(a.elem, v[i] * bs.enc)) << (8 * (i % 4));
        else
          codes[i / 8] |= static_cast<std::uint32_t>(encode_e2m1(v[i] * bs.enc)) << (4 * (i % 8));
      }
    }
    std::uint8_t* out = a.packed + row * (a.K * a.bits / 8) + j * kBytes;
    if constexpr (kBytes == 8) {
      *reinterpret_cast<uint2*>(out) = make_uint2(codes[0], codes[1]);
    } else {
#pragma unroll
      for (int i = 0; i < kBytes / 16; ++i)
        reinterpret_cast<uint4*>(out)[i] =
            make_uint4(codes[4 * i], codes[4 * i + 1], codes[4 * i + 2], codes[4 * i + 3]);
    }
  }
}

// dequantize_chunk's values, stored as one or two 16-byte vectors (y is 16-byte aligned, and a
// chunk starts at a multiple of 8 elements).
template <DType OUT>
__global__ void dequantize_kernel(QuantizedArgs q, void* y) {
  const std::int64_t per_row = q.cols / 8;
  for (std::int64_t id = first_item(); id < q.rows * per_row; id += item_stride()) {
    std::int64_t r, chunk;
    divide(id, per_row, r, chunk);
    float v[8];
    decode8(q, 0, r, chunk * 8, true, v);
    const std::int64_t i = r * q.cols + chunk * 8;
    if constexpr (OUT == DType::float32) {
      auto* p = reinterpret_cast<float4*>(static_cast<float*>(y) + i);
      p[0] = make_float4(v[0], v[1], v[2], v[3]);
      p[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      std::uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const std::uint32_t lo = OUT == DType::float16 ? encode_f16(v[2 * k]) : encode_bf16(v[2 * k]);
        const std::uint32_t hi = OUT == DType::float16 ? encode_f16(v[2 * k + 1]) : encode_bf16(v[2 * k + 1]);
        w[k] = lo | (hi << 16);
      }
      *reinterpret_cast<uint4*>(static_cast<std::uint16_t*>(y) + i) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

template <DType SRC>
void launch_quantize_vec(const QuantizeArgs& a, unsigned blocks, Stream stream) {
  if (a.mode == Mode::nvfp4)
    quantize_vec_kernel<Mode::nvfp4, SRC><<<blocks, kThreads, 0, stream>>>(a);
  else if (a.mode == Mode::mxfp4)
    quantize_vec_kernel<Mode::mxfp4, SRC><<<blocks, kThreads, 0, stream>>>(a);
  else
    quantize_vec_kernel<Mode::mxfp8, SRC><<<blocks, kThreads, 0, stream>>>(a);
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
  const unsigned blocks = blocks_for(p.rows * a.groups);
  // The vector kernel's rows of x and of the codes must stay 16-byte aligned (8 for nvfp4's codes;
  // check_pointer saw to the first row).
  const bool vec = s.mode != Mode::affine && (p.K * static_cast<std::int64_t>(dtype_size(x.dtype))) % 16 == 0 &&
                   (p.K * s.bits / 8) % (s.mode == Mode::nvfp4 ? 8 : 16) == 0;
  if (!vec)
    quantize_kernel<<<blocks, kThreads, 0, stream>>>(a);
  else if (x.dtype == DType::float32)
    launch_quantize_vec<DType::float32>(a, blocks, stream);
  else if (x.dtype == DType::float16)
    launch_quantize_vec<DType::float16>(a, blocks, stream);
  else
    launch_quantize_vec<DType::bfloat16>(a, blocks, stream);
  launched("quantize");
}

void dequantize(const DeviceQuantized& q, const QuantSpec& spec, const DeviceTensor& y, Stream stream) {
  const OperandArgs args = operand_args(q, spec.mode, "dequantize");
  const ops::OperandPlan p = ops::plan_dequantize(args.packed, args.scales, ops::opt_ptr(args.biases), spec, y.dtype);
  const QuantizedArgs a = bind_operand(p, q, p.rows, "dequantize");
  check_tensor(y, y.dtype, p.shape, "dequantize: output");
  if (y.numel() == 0) return;
  const unsigned blocks = blocks_for(y.numel() / 8);
  if (y.dtype == DType::float32)
    dequantize_kernel<DType::float32><<<blocks, kThreads, 0, stream>>>(a, y.data);
  else if (y.dtype == DType::float16)
    dequantize_kernel<DType::float16><<<blocks, kThreads, 0, stream>>>(a, y.data);
  else
    dequantize_kernel<DType::bfloat16><<<blocks, kThreads, 0, stream>>>(a, y.data);
  launched("dequantize");
}

}  // namespace microscale::cuda
