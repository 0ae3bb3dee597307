// quantized_matmul benchmarks: GEMV (M = 1) hot and cold, GEMM (M = 512), and a read-only
// pass over the same weight bytes as the roofline, all in one binary so ratios come from one run.
//
//   build/bench/microscale_bench_matmul --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "microscale/microscale.hpp"

namespace ms = microscale;

namespace {

constexpr std::int64_t kN = 14336, kK = 4096;
constexpr int kColdCopies = 4;  // 4 x ~33 MB of weights rotate through the 32 MB L3

struct Weights {
  std::vector<ms::Quantized> copies;
  std::size_t bytes = 0;  // packed + scales (+ biases) of one copy
};

const Weights& weights(ms::Mode mode, bool transpose = true) {
  static std::map<std::pair<int, bool>, Weights> cache;
  auto key = std::make_pair(static_cast<int>(mode), transpose);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::mt19937 rng(7);
  std::normal_distribution<float> z(0.0f, 0.02f);
  std::vector<float> w(static_cast<std::size_t>(kN * kK));
  for (float& v : w) v = z(rng);
  ms::QuantSpec s;
  s.mode = mode;
  const ms::Shape shape = transpose ? ms::Shape{kN, kK} : ms::Shape{kK, kN};
  const ms::TensorView wv(w.data(), ms::DType::float32, shape);
  if (mode == ms::Mode::nvfp4) s.global_scale = ms::global_scale(wv);
  Weights out;
  for (int c = 0; c < kColdCopies; ++c) out.copies.push_back(ms::quantize(wv, s));
  const ms::Quantized& q = out.copies[0];
  out.bytes = q.packed.nbytes() + q.scales.nbytes() + q.biases.nbytes();
  return cache.emplace(key, std::move(out)).first->second;
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

// GEMV: args {mode, cold, x dtype (0 f32, 1 bf16)}.
void BM_Gemv(benchmark::State& state) {
  const auto mode = static_cast<ms::Mode>(state.range(0));
  const bool cold = state.range(1) != 0;
  const bool bf16 = state.range(2) != 0;
  const Weights& w = weights(mode);
  const std::vector<float> xf = activations(1);
  std::vector<std::uint16_t> xb(xf.size());
  for (std::size_t i = 0; i < xf.size(); ++i) xb[i] = ms::encode_bf16(xf[i]);
  const ms::TensorView x = bf16 ? ms::TensorView(xb.data(), ms::DType::bfloat16, {1, kK})
                                : ms::TensorView(xf.data(), ms::DType::float32, {1, kK});
  int i = 0;
  for (auto _ : state) {
    const ms::Quantized& q = w.copies[cold ? static_cast<std::size_t>(i++ % kColdCopies) : 0];
    benchmark::DoNotOptimize(ms::quantized_matmul(x, q, true));
  }
  set_counters(state, static_cast<double>(w.bytes), 2.0 * kN * kK);
  state.SetLabel(std::string(ms::name(mode)) + (cold ? " cold" : " hot") + (bf16 ? " x=bf16" : " x=f32"));
}

void BM_Gemm(benchmark::State& state) {
  const auto mode = static_cast<ms::Mode>(state.range(0));
  const std::int64_t M = state.range(1);
  const Weights& w = weights(mode);
  const std::vector<float> xf = activations(M);
  const ms::TensorView x(xf.data(), ms::DType::float32, {M, kK});
  for (auto _ : state) benchmark::DoNotOptimize(ms::quantized_matmul(x, w.copies[0], true));
  set_counters(state, static_cast<double>(w.bytes), 2.0 * static_cast<double>(M) * kN * kK);
  state.SetLabel(std::string(ms::name(mode)) + " M=" + std::to_string(M));
}

// Roofline: read the same number of bytes as one cold GEMV, rotating over copies larger than L3.
void BM_ReadRoofline(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0));
  std::vector<std::vector<std::uint64_t>> bufs(kColdCopies, std::vector<std::uint64_t>(bytes / 8, 1));
  int i = 0;
  for (auto _ : state) {
    const std::vector<std::uint64_t>& b = bufs[static_cast<std::size_t>(i++ % kColdCopies)];
    std::uint64_t acc = 0;
#pragma omp parallel for reduction(^ : acc) num_threads(ms::num_threads())
    for (std::int64_t j = 0; j < static_cast<std::int64_t>(b.size()); ++j) acc ^= b[static_cast<std::size_t>(j)];
    benchmark::DoNotOptimize(acc);
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate);
}

constexpr int kNv = static_cast<int>(ms::Mode::nvfp4), kMx4 = static_cast<int>(ms::Mode::mxfp4),
              kMx8 = static_cast<int>(ms::Mode::mxfp8), kAff = static_cast<int>(ms::Mode::affine);

BENCHMARK(BM_ReadRoofline)->Arg(kN * kK * 9 / 16)->Arg(kN * kK * 17 / 32)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gemv)
    ->ArgsProduct({{kNv, kMx4}, {0, 1}, {0, 1}})
    ->Args({kMx8, 0, 0})
    ->Args({kAff, 0, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gemm)->ArgsProduct({{kNv, kMx4}, {512}})->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(2);

}  // namespace

BENCHMARK_MAIN();
