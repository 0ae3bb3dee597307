// microscale_cuda_bench: times the CUDA ops on one device against the HBM roofline of FORMATS.md
// section 10 and against cuBLAS bf16 at the same shapes. Not a test (nothing is asserted); see
// docs/cuda.md for how to run it and what to compare.
//   microscale_cuda_bench [--bandwidth GB/s] [--iters n]
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "microscale/cuda.hpp"
#include "microscale/microscale.hpp"

namespace {

namespace cuda = microscale::cuda;
using microscale::DType;
using microscale::Mode;
using microscale::QuantSpec;
using microscale::Shape;

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Buffer {
  cuda::DeviceTensor t;
  Buffer(DType dtype, Shape shape) : t{nullptr, dtype, std::move(shape)} {
    ok(cudaMalloc(&t.data, bytes()), "cudaMalloc");
    ok(cudaMemset(t.data, 0, bytes()), "cudaMemset");
  }
  ~Buffer() { cudaFree(t.data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  std::size_t bytes() const { return static_cast<std::size_t>(t.numel()) * microscale::dtype_size(t.dtype); }
};

// Normal values, rounded to dtype on the host and uploaded.
void fill(const Buffer& b, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint8_t> host(b.bytes());
  for (std::size_t i = 0; i < static_cast<std::size_t>(b.t.numel()); ++i) {
    const float v = normal(rng);
    if (b.t.dtype == DType::float32) {
      std::memcpy(host.data() + 4 * i, &v, 4);
    } else {
      const std::uint16_t h = b.t.dtype == DType::float16 ? microscale::encode_f16(v) : microscale::encode_bf16(v);
      std::memcpy(host.data() + 2 * i, &h, 2);
    }
  }
  ok(cudaMemcpy(b.t.data, host.data(), host.size(), cudaMemcpyHostToDevice), "upload");
}

// Seconds per call: mean over `iters` after three warm-up calls.
double seconds(const std::function<void()>& f, int iters) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a), "event");
  ok(cudaEventCreate(&b), "event");
  ok(cudaEventRecord(a), "event");
  for (int i = 0; i < iters; ++i) f();
  ok(cudaEventRecord(b), "event");
  ok(cudaEventSynchronize(b), "event");
  float ms = 0;
  ok(cudaEventElapsedTime(&ms, a, b), "event");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms * 1e-3 / iters;
}

// Quantized operand buffers for shape x under spec.
struct Quantized {
  Buffer packed, scales;
  std::unique_ptr<Buffer> biases;
  Quantized(const Shape& x, DType dtype, const QuantSpec& spec)
      : Quantized(cuda::quantized_shapes(x, dtype, spec), spec.mode == Mode::affine) {}
  Quantized(const cuda::QuantizedShapes& s, bool affine)
      : packed(DType::uint8, s.packed),
        scales(s.scale_dtype, s.scales),
        biases(affine ? std::make_unique<Buffer>(s.scale_dtype, s.biases) : nullptr) {}
  cuda::DeviceQuantized view() const { return {packed.t, scales.t, biases ? biases->t : cuda::DeviceTensor{}}; }
  std::size_t bytes() const { return packed.bytes() + scales.bytes() + (biases ? biases->bytes() : 0); }
};

QuantSpec spec_of(Mode m, float global = 0) {
  QuantSpec s;
  s.mode = m;
  if (m == Mode::nvfp4 && global > 0) s.global_scale = global;
  return s;
}

void row(const std::string& op, double s, double bytes, double flops, double bandwidth) {
  std::printf("%-44s %10.1f us %9.1f GB/s %6.1f%% of HBM %9.1f TFLOP/s\n", op.c_str(), s * 1e6, bytes / s * 1e-9,
              100.0 * bytes / s / bandwidth, flops / s * 1e-12);
}

}  // namespace

int main(int argc, char** argv) {
  double bandwidth = 3.35e12;  // H100 SXM (FORMATS.md 10)
  int iters = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--bandwidth")) bandwidth = std::atof(argv[i + 1]) * 1e9;
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
  }
  if (!cuda::available()) {
    std::fprintf(stderr, "no CUDA device this build supports (sm_90a, sm_100a)\n");
    return 1;
  }
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, 0), "device");
  std::printf("%s, roofline %.0f GB/s\n", prop.name, bandwidth * 1e-9);

  const std::int64_t R = 8192, C = 8192;
  for (DType dt : {DType::float32, DType::bfloat16}) {
    Buffer x(dt, {R, C});
    fill(x, 1);
    const float amax = cuda::amax(x.t);
    for (Mode m : {Mode::nvfp4, Mode::mxfp4, Mode::mxfp8}) {
      const QuantSpec s = spec_of(m, amax);
      Quantized q({R, C}, dt, s);
      const double t = seconds([&] { cuda::quantize(x.t, s, q.view()); }, iters);
      row(std::string("quantize ") + microscale::dtype_name(dt) + " -> " + microscale::name(m), t,
          static_cast<double>(x.bytes() + q.bytes()), 0, bandwidth);
      if (dt == DType::float32 && m != Mode::mxfp4) {
        Buffer y(DType::bfloat16, {R, C});
        const double td = seconds([&] { cuda::dequantize(q.view(), s, y.t); }, iters);
        row(std::string("dequantize ") + microscale::name(m) + " -> bfloat16", td,
            static_cast<double>(y.bytes() + q.bytes()), 0, bandwidth);
      }
    }
  }

  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return 1;
  const float one = 1.0f, zero = 0.0f;
  for (std::int64_t M : {std::int64_t{1}, std::int64_t{4096}}) {
    const std::int64_t N = M == 1 ? 8192 : 4096, K = N;
    Buffer x(DType::bfloat16, {M, K}), wf(DType::float32, {N, K}), wb(DType::bfloat16, {N, K}),
        y(DType::bfloat16, {M, N});
    fill(x, 2);
    fill(wf, 3);
    fill(wb, 3);
    const double flops = 2.0 * static_cast<double>(M * N * K);
    const std::string shape = " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
    // cuBLAS bf16 (column-major: y^T [N, M] = W [N, K] * x^T [K, M]).
    const double tb = seconds(
        [&] {
          cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                       &one, wb.t.data, CUDA_R_16BF, static_cast<int>(K), x.t.data, CUDA_R_16BF, static_cast<int>(K),
                       &zero, y.t.data, CUDA_R_16BF, static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        },
        iters);
    row("cuBLAS bf16" + shape, tb, static_cast<double>(wb.bytes() + x.bytes() + y.bytes()), flops, bandwidth);
    for (Mode m : {Mode::nvfp4, Mode::mxfp4, Mode::mxfp8, Mode::affine}) {
      const QuantSpec s = spec_of(m, m == Mode::nvfp4 ? cuda::amax(wf.t) : 0.0f);
      Quantized w({N, K}, DType::float32, s);
      cuda::quantize(wf.t, s, w.view());
      const double t = seconds([&] { cuda::quantized_matmul(x.t, w.view(), true, s, y.t); }, iters);
      row(std::string("quantized_matmul ") + microscale::name(m) + shape, t,
          static_cast<double>(w.bytes() + x.bytes() + y.bytes()), flops, bandwidth);
    }
    if (M > 1)
      for (cuda::QqmmPath p : {cuda::QqmmPath::tensor_core, cuda::QqmmPath::cublaslt}) {
        const QuantSpec s = spec_of(Mode::nvfp4);
        try {
          const double t = seconds([&] { cuda::qqmm(x.t, wf.t, nullptr, s, {}, {}, y.t, nullptr, p); }, iters);
          row(std::string("qqmm nvfp4 (w float) ") + (p == cuda::QqmmPath::cublaslt ? "cublaslt" : "tensor_core") +
                  shape,
              t, 0, flops, bandwidth);
        } catch (const microscale::Error& e) {
          std::printf("qqmm %s: %s\n", p == cuda::QqmmPath::cublaslt ? "cublaslt" : "tensor_core", e.what());
        }
      }
  }
  cublasDestroy(blas);
  return 0;
}
