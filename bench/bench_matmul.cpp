// quantized_matmul benchmarks on the 14336 x 4096 weight of FORMATS.md section 10 (y = x @ W^T):
// the GEMV (M = 1) of every mode with a fused kernel, hot (one weight, reused) and cold (four
// copies rotating, more than L3), x float32 and bfloat16; the GEMM (M = 512); and a read-only pass
// over each weight's bytes with the same threads as the roofline, all in one binary so ratios
// come from one run.
//
//   build/bench/microscale_bench_matmul --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//   (--benchmark_filter=Gemv, =Gemm, =Roofline; threads: MICROSCALE_NUM_THREADS, default all cores)
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "microscale/microscale.hpp"
#include "read_pass.hpp"

namespace ms = microscale;

namespace {

constexpr std::int64_t kN = 14336, kK = 4096;
constexpr int kColdCopies = 4;  // 4 x 31-61 MB of weights rotate through a 32 MB L3

// The modes benchmarked, by index (Google Benchmark arguments are integers).
struct ModeCase {
  const char* name;
  ms::QuantSpec spec;
};
const std::vector<ModeCase>& modes() {
  static const std::vector<ModeCase> m = [] {
    std::vector<ModeCase> v;
    ms::QuantSpec s;
    s.mode = ms::Mode::nvfp4;
    v.push_back({"nvfp4", s});
    s.mode = ms::Mode::mxfp4;
    v.push_back({"mxfp4", s});
    s.mode = ms::Mode::mxfp8;
    v.push_back({"mxfp8-e4m3", s});
    ms::QuantSpec a;
    a.mode = ms::Mode::affine;
    a.bits = 4;
    a.group_size = 64;
    v.push_back({"affine4-g64", a});
    return v;
  }();
  return m;
}
constexpr int kNvfp4 = 0, kMxfp4 = 1, kMxfp8 = 2, kAffine4 = 3;

struct Weights {
  std::vector<ms::Quantized> copies;
  std::size_t bytes = 0;  // packed + scales (+ biases) of one copy
};

const Weights& weights(int mode) {
  static std::map<int, Weights> cache;
  auto it = cache.find(mode);
  if (it != cache.end()) return it->second;
  std::mt19937 rng(7);
  std::normal_distribution<float> z(0.0f, 0.02f);
  std::vector<float> w(static_cast<std::size_t>(kN * kK));
  for (float& v : w) v = z(rng);
  ms::QuantSpec s = modes()[static_cast<std::size_t>(mode)].spec;
  const ms::TensorView wv(w.data(), ms::DType::float32, {kN, kK});
  if (s.mode == ms::Mode::nvfp4) s.global_scale = ms::global_scale(wv);  // three-level
  Weights out;
  for (int c = 0; c < kColdCopies; ++c) out.copies.push_back(ms::quantize(wv, s));
  const ms::Quantized& q = out.copies[0];
  out.bytes = q.packed.nbytes() + q.scales.nbytes() + q.biases.nbytes();
  return cache.emplace(mode, std::move(out)).first->second;
}

std::vector<float> activations(std::int64_t m) {
  std::mt19937 rng(3);
  std::normal_distribution<float> z;
  std::vector<float> x(static_cast<std::size_t>(m * kK));
  for (float& v : x) v = z(rng);
  return x;
}

void set_counters(benchmark::State& state, double bytes, double flops) {
  state.counters["GB/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// GEMV: args {mode, cold, x dtype (0 float32, 1 bfloat16)}.
void BM_Gemv(benchmark::State& state) {
  const int mode = static_cast<int>(state.range(0));
  const bool cold = state.range(1) != 0;
  const bool bf16 = state.range(2) != 0;
  const Weights& w = weights(mode);
  const std::vector<float> xf = activations(1);
  std::vector<std::uint16_t> xb(xf.size());
  for (std::size_t i = 0; i < xf.size(); ++i) xb[i] = ms::encode_bf16(xf[i]);
  const ms::TensorView x = bf16 ? ms::TensorView(xb.data(), ms::DType::bfloat16, {1, kK})
                                : ms::TensorView(xf.data(), ms::DType::float32, {1, kK});
  std::size_t i = 0;
  for (auto _ : state) {
    const ms::Quantized& q = w.copies[cold ? i++ % kColdCopies : 0];
    benchmark::DoNotOptimize(ms::quantized_matmul(x, q, true));
  }
  set_counters(state, static_cast<double>(w.bytes), 2.0 * kN * kK);
  state.SetLabel(std::string(modes()[static_cast<std::size_t>(mode)].name) + (cold ? " cold" : " hot") +
                 (bf16 ? " x=bf16" : " x=f32"));
}

void BM_Gemm(benchmark::State& state) {
  const int mode = static_cast<int>(state.range(0));
  const std::int64_t M = state.range(1);
  const Weights& w = weights(mode);
  const std::vector<float> xf = activations(M);
  const ms::TensorView x(xf.data(), ms::DType::float32, {M, kK});
  for (auto _ : state) benchmark::DoNotOptimize(ms::quantized_matmul(x, w.copies[0], true));
  set_counters(state, static_cast<double>(w.bytes), 2.0 * static_cast<double>(M) * kN * kK);
  state.SetLabel(std::string(modes()[static_cast<std::size_t>(mode)].name) + " M=" + std::to_string(M));
}

// Roofline: read the bytes of one cold GEMV (the mode's weight), rotating over copies larger
// than L3, with the library's threads and row chunks.
void BM_ReadRoofline(benchmark::State& state) {
  const int mode = static_cast<int>(state.range(0));
  const std::size_t bytes = weights(mode).bytes;
  std::vector<std::vector<std::uint64_t>> bufs(kColdCopies, std::vector<std::uint64_t>(bytes / 8, 1));
  const std::int64_t rows = kN, row_words = static_cast<std::int64_t>(bytes / 8) / kN;
  std::size_t i = 0;
  for (auto _ : state) {
    const std::uint64_t* b = bufs[i++ % kColdCopies].data();
    std::atomic<std::uint64_t> all{0};
    ms::cpu::parallel_for(
        rows, ms::cpu::gemv_rows_per_chunk(rows, row_words * 8),
        [&](std::int64_t r0, std::int64_t r1) { all ^= bench::xor_words(b + r0 * row_words, (r1 - r0) * row_words); });
    benchmark::DoNotOptimize(all.load());
  }
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(modes()[static_cast<std::size_t>(mode)].name) + " bytes");
}

BENCHMARK(BM_ReadRoofline)->DenseRange(kNvfp4, kAffine4)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gemv)
    ->ArgsProduct({{kNvfp4, kMxfp4}, {0, 1}, {0, 1}})
    ->ArgsProduct({{kMxfp8, kAffine4}, {0, 1}, {0}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gemm)->ArgsProduct({{kNvfp4, kMxfp4}, {512}})->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(2);

}  // namespace

BENCHMARK_MAIN();
