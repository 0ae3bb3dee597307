// microscale_cuda_bench: times the CUDA ops on one device against rooflines measured in the same
// run: a device-to-device copy for memory (bytes read + written over that bandwidth) and cuBLAS
// bf16 at the same shape for the matmuls. Not a test (nothing is asserted); docs/cuda.md says how
// scripts/gpu-check.sh runs it.
//   microscale_cuda_bench [--iters n] [--json FILE]
// Every figure is the median of `iters` calls timed one by one with events. Operands are rotated
// over enough copies that each call reads at least four times the L2 cache's worth of memory, so
// a weight that would fit in L2 is not timed from it.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
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

std::size_t bytes_of(DType dtype, const Shape& shape) {
  return static_cast<std::size_t>(microscale::numel(shape)) * microscale::dtype_size(dtype);
}

struct Buffer {
  cuda::DeviceTensor t;
  Buffer(DType dtype, Shape shape) : t{nullptr, dtype, std::move(shape)} {
    ok(cudaMalloc(&t.data, std::max<std::size_t>(bytes(), 1)), "cudaMalloc");
  }
  ~Buffer() { cudaFree(t.data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  std::size_t bytes() const { return bytes_of(t.dtype, t.shape); }
  void copy_from(const Buffer& o) { ok(cudaMemcpy(t.data, o.t.data, bytes(), cudaMemcpyDeviceToDevice), "copy"); }
};

// Normal values, rounded to the buffer's dtype on the host (never zeros: they can run faster than
// real data). 4M values are drawn and uploaded, then repeated over the rest of the buffer.
void fill(const Buffer& b, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::size_t size = microscale::dtype_size(b.t.dtype);
  const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(b.t.numel()), std::size_t{1} << 22);
  std::vector<std::uint8_t> host(n * size);
  for (std::size_t i = 0; i < n; ++i) {
    const float v = normal(rng);
    if (b.t.dtype == DType::float32) {
      std::memcpy(host.data() + 4 * i, &v, 4);
    } else {
      const std::uint16_t h = b.t.dtype == DType::float16 ? microscale::encode_f16(v) : microscale::encode_bf16(v);
      std::memcpy(host.data() + 2 * i, &h, 2);
    }
  }
  auto* dst = static_cast<std::uint8_t*>(b.t.data);
  ok(cudaMemcpy(dst, host.data(), host.size(), cudaMemcpyHostToDevice), "upload");
  for (std::size_t done = host.size(); done < b.bytes();) {
    const std::size_t chunk = std::min(done, b.bytes() - done);
    ok(cudaMemcpy(dst + done, dst, chunk, cudaMemcpyDeviceToDevice), "fill");
    done += chunk;
  }
}

// Median seconds of `iters` calls f(i), each between its own pair of events, after three warm-ups.
double median_seconds(const std::function<void(int)>& f, int iters) {
  for (int i = 0; i < 3; ++i) f(i);
  ok(cudaDeviceSynchronize(), "warm-up");
  std::vector<cudaEvent_t> ev(2 * static_cast<std::size_t>(iters));
  for (auto& e : ev) ok(cudaEventCreate(&e), "event");
  for (int i = 0; i < iters; ++i) {
    ok(cudaEventRecord(ev[2 * i]), "event");
    f(i);
    ok(cudaEventRecord(ev[2 * i + 1]), "event");
  }
  ok(cudaEventSynchronize(ev.back()), "event");
  ok(cudaGetLastError(), "launch");
  std::vector<double> s(static_cast<std::size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    ok(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]), "event");
    s[i] = ms * 1e-3;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::nth_element(s.begin(), s.begin() + iters / 2, s.end());
  return s[iters / 2];
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
  void copy_from(const Quantized& o) {
    packed.copy_from(o.packed);
    scales.copy_from(o.scales);
    if (biases) biases->copy_from(*o.biases);
  }
};

QuantSpec spec_of(Mode m, float global = 0) {
  QuantSpec s;
  s.mode = m;
  if (m == Mode::nvfp4 && global > 0) s.global_scale = global;
  return s;
}

// Copies needed so that rotating over them reads >= 4x L2 per round.
int copies_for(std::size_t bytes, std::size_t l2) {
  return static_cast<int>(std::clamp<std::size_t>((4 * l2 + bytes - 1) / std::max<std::size_t>(bytes, 1), 1, 64));
}

struct Row {
  std::string op, shape;
  double seconds, bytes, flops;
  double roof_fraction;  // bytes / seconds over the copy bandwidth (0: not memory-bound)
  double peer_ratio;     // the peer's time over ours (0: no peer)
  std::string peer;
};

class Report {
 public:
  explicit Report(double bandwidth) : bandwidth_(bandwidth) {}
  void add(const std::string& op, const std::string& shape, double s, double bytes, double flops,
           const std::string& peer = "", double peer_s = 0) {
    Row r{op, shape, s, bytes, flops, bytes > 0 ? bytes / s / bandwidth_ : 0, peer_s > 0 ? peer_s / s : 0, peer};
    std::printf("%-34s %-22s %9.1f us %8.0f GB/s %6.1f%% roof %8.1f TFLOP/s", op.c_str(), shape.c_str(), s * 1e6,
                bytes / s * 1e-9, 100 * r.roof_fraction, flops / s * 1e-12);
    if (r.peer_ratio > 0) std::printf("  %.2fx %s", r.peer_ratio, peer.c_str());
    std::printf("\n");
    std::fflush(stdout);
    rows_.push_back(std::move(r));
  }
  void write_json(const std::string& path, const cudaDeviceProp& prop, int driver, int runtime, int iters) const {
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      std::exit(1);
    }
    std::fprintf(f,
                 "{\"device\": \"%s\", \"sm\": \"%d%d\", \"multiprocessors\": %d, \"l2_bytes\": %d, "
                 "\"driver\": %d, \"runtime\": %d, \"iters\": %d, \"copy_bandwidth_gbs\": %.1f, \"rows\": [",
                 prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.l2CacheSize, driver, runtime, iters,
                 bandwidth_ * 1e-9);
    for (std::size_t i = 0; i < rows_.size(); ++i) {
      const Row& r = rows_[i];
      std::fprintf(f,
                   "%s\n  {\"op\": \"%s\", \"shape\": \"%s\", \"us\": %.3f, \"bytes\": %.0f, \"gbs\": %.1f, "
                   "\"roof_fraction\": %.4f, \"tflops\": %.3f, \"peer\": \"%s\", \"peer_ratio\": %.4f}",
                   i ? "," : "", r.op.c_str(), r.shape.c_str(), r.seconds * 1e6, r.bytes, r.bytes / r.seconds * 1e-9,
                   r.roof_fraction, r.flops / r.seconds * 1e-12, r.peer.c_str(), r.peer_ratio);
    }
    std::fprintf(f, "\n]}\n");
    std::fclose(f);
  }

 private:
  double bandwidth_;
  std::vector<Row> rows_;
};

std::string shape_text(std::int64_t a, std::int64_t b, std::int64_t c = 0) {
  std::string s = std::to_string(a) + "x" + std::to_string(b);
  return c ? s + "x" + std::to_string(c) : s;
}

// Bytes read plus written per second by a 2 GiB device-to-device copy: the memory roof.
double copy_bandwidth(int iters) {
  const std::size_t n = std::size_t{1} << 31;
  void *a = nullptr, *b = nullptr;
  ok(cudaMalloc(&a, n), "cudaMalloc");
  ok(cudaMalloc(&b, n), "cudaMalloc");
  ok(cudaMemset(a, 0x5A, n), "cudaMemset");
  const double s = median_seconds([&](int) { ok(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice), "copy"); }, iters);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(n) / s;
}

void bench_quantize(Report& report, std::int64_t R, std::int64_t C, std::size_t l2, int iters) {
  for (DType dt : {DType::float32, DType::bfloat16}) {
    Buffer x(dt, {R, C});
    fill(x, 1);
    const float amax = cuda::amax(x.t);
    for (Mode m : {Mode::nvfp4, Mode::mxfp4, Mode::mxfp8}) {
      const QuantSpec s = spec_of(m, amax);
      const Quantized q0({R, C}, dt, s);
      const int k = copies_for(x.bytes() + q0.bytes(), l2);
      std::vector<std::unique_ptr<Buffer>> xs;
      std::vector<std::unique_ptr<Quantized>> qs;
      for (int i = 0; i < k; ++i) {
        xs.push_back(std::make_unique<Buffer>(dt, Shape{R, C}));
        xs.back()->copy_from(x);
        qs.push_back(std::make_unique<Quantized>(Shape{R, C}, dt, s));
      }
      const double t = median_seconds([&](int i) { cuda::quantize(xs[i % k]->t, s, qs[i % k]->view()); }, iters);
      report.add(std::string("quantize ") + microscale::dtype_name(dt) + "->" + microscale::name(m), shape_text(R, C),
                 t, static_cast<double>(x.bytes() + q0.bytes()), 0);
      if (dt != DType::float32) continue;
      for (DType out : {DType::bfloat16, DType::float32}) {
        std::vector<std::unique_ptr<Buffer>> ys;
        for (int i = 0; i < k; ++i) ys.push_back(std::make_unique<Buffer>(out, Shape{R, C}));
        const double td = median_seconds([&](int i) { cuda::dequantize(qs[i % k]->view(), s, ys[i % k]->t); }, iters);
        report.add(std::string("dequantize ") + microscale::name(m) + "->" + microscale::dtype_name(out),
                   shape_text(R, C), td, static_cast<double>(bytes_of(out, {R, C}) + q0.bytes()), 0);
      }
    }
  }
}

// y [M, N] = x [M, K] W^T, W [N, K]: cuBLAS bf16 first, then each mode at the same shape.
void bench_matmul(Report& report, cublasHandle_t blas, std::int64_t M, std::int64_t N, std::int64_t K, std::size_t l2,
                  int iters) {
  const float one = 1.0f, zero = 0.0f;
  Buffer x(DType::bfloat16, {M, K}), wf(DType::float32, {N, K}), y(DType::bfloat16, {M, N});
  fill(x, 2);
  fill(wf, 3);
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  const std::string shape = shape_text(M, N, K);
  const double io = static_cast<double>(x.bytes() + y.bytes());

  const std::size_t wb_bytes = bytes_of(DType::bfloat16, {N, K});
  const int kb = copies_for(wb_bytes, l2);
  std::vector<std::unique_ptr<Buffer>> wbs;
  {
    Buffer wb(DType::bfloat16, {N, K});
    fill(wb, 3);
    for (int i = 0; i < kb; ++i) {
      wbs.push_back(std::make_unique<Buffer>(DType::bfloat16, Shape{N, K}));
      wbs.back()->copy_from(wb);
    }
  }
  // Column-major: y^T [N, M] = W [N, K]^T' * x^T [K, M].
  const double tb = median_seconds(
      [&](int i) {
        if (cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                         &one, wbs[i % kb]->t.data, CUDA_R_16BF, static_cast<int>(K), x.t.data, CUDA_R_16BF,
                         static_cast<int>(K), &zero, y.t.data, CUDA_R_16BF, static_cast<int>(N), CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
          std::fprintf(stderr, "cublasGemmEx failed\n");
          std::exit(1);
        }
      },
      iters);
  wbs.clear();
  report.add("cuBLAS bf16", shape, tb, static_cast<double>(wb_bytes) + io, flops);

  const bool gemv = M <= 8;
  for (Mode m : {Mode::nvfp4, Mode::mxfp4, Mode::mxfp8, Mode::affine}) {
    const QuantSpec s = spec_of(m, m == Mode::nvfp4 ? cuda::amax(wf.t) : 0.0f);
    const Quantized w0({N, K}, DType::float32, s);
    cuda::quantize(wf.t, s, w0.view());
    const int k = copies_for(w0.bytes(), l2);
    std::vector<std::unique_ptr<Quantized>> ws;
    for (int i = 0; i < k; ++i) {
      ws.push_back(std::make_unique<Quantized>(Shape{N, K}, DType::float32, s));
      ws.back()->copy_from(w0);
    }
    const double t =
        median_seconds([&](int i) { cuda::quantized_matmul(x.t, ws[i % k]->view(), true, s, y.t); }, iters);
    // A GEMV is bound by the weight bytes; a GEMM is compared with cuBLAS bf16 in TFLOP/s.
    report.add(std::string("quantized_matmul ") + microscale::name(m), shape, t,
               gemv ? static_cast<double>(w0.bytes()) + io : 0, flops, "cuBLAS bf16", tb);
  }
  if (gemv) return;
  for (cuda::QqmmPath p : {cuda::QqmmPath::tensor_core, cuda::QqmmPath::cublaslt}) {
    const char* path = p == cuda::QqmmPath::cublaslt ? "cublaslt" : "tensor_core";
    try {
      const QuantSpec s = spec_of(Mode::nvfp4);
      const double t = median_seconds([&](int) { cuda::qqmm(x.t, wf.t, nullptr, s, {}, {}, y.t, nullptr, p); }, iters);
      report.add(std::string("qqmm nvfp4 w float ") + path, shape, t, 0, flops, "cuBLAS bf16", tb);
    } catch (const microscale::Error& e) {
      std::printf("qqmm nvfp4 %s %s: refused: %s\n", path, shape.c_str(), e.what());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 50;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: microscale_cuda_bench [--iters n] [--json FILE]\n");
      return 2;
    }
  }
  if (iters < 1) iters = 1;
  if (!cuda::available()) {
    std::fprintf(stderr, "no CUDA device this build supports (sm_90a, sm_100a)\n");
    return 1;
  }
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, 0), "device");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  const std::size_t l2 = static_cast<std::size_t>(prop.l2CacheSize);
  const double bandwidth = copy_bandwidth(iters);
  std::printf("%s (sm_%d%d, %d SMs, L2 %zu MB), driver %d, runtime %d; copy roof %.0f GB/s; median of %d\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount, l2 >> 20, driver, runtime, bandwidth * 1e-9, iters);

  Report report(bandwidth);
  // The CPU tables' weight (14336 x 4096) and a square one.
  bench_quantize(report, 14336, 4096, l2, iters);
  bench_quantize(report, 8192, 8192, l2, iters);

  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    return 1;
  }
  for (std::int64_t M : {1, 2, 4, 8, 512}) bench_matmul(report, blas, M, 14336, 4096, l2, iters);
  cublasDestroy(blas);
  if (!json.empty()) report.write_json(json, prop, driver, runtime, iters);
  return 0;
}
