// GPTQ's CPU steps on the sizes: accumulate_hessian of 8192 activation rows of K = 4096
// (H += X^T X in float64) and gptq of a W [4096, 4096] to nvfp4 (factorization of the dampened H
// and the column loop; W [48, 4096] for the factorization alone), at the default number of
// threads (MICROSCALE_NUM_THREADS to change it).
//
//   microscale_bench_gptq [--benchmark_repetitions=3]
//
// Each case times one call (one iteration); the inputs are built once outside the timing.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "microscale/gptq.hpp"

namespace ms = microscale;

namespace {

constexpr std::int64_t kK = 4096, kN = 4096, kSamples = 8192;

// Correlated activations: independent Gaussians mixed along K by a short running sum, so that
// H is well conditioned but not diagonal.
const std::vector<float>& activations() {
  static const std::vector<float> x = [] {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(static_cast<std::size_t>(kSamples * kK));
    for (std::int64_t s = 0; s < kSamples; ++s) {
      float run = 0.0f;
      for (std::int64_t k = 0; k < kK; ++k) {
        run = 0.5f * run + d(rng);
        v[static_cast<std::size_t>(s * kK + k)] = run;
      }
    }
    return v;
  }();
  return x;
}

const std::vector<double>& hessian() {
  static const std::vector<double> h = [] {
    std::vector<double> v(static_cast<std::size_t>(kK * kK), 0.0);
    ms::accumulate_hessian(ms::TensorView(activations().data(), ms::DType::float32, {kSamples, kK}), v);
    return v;
  }();
  return h;
}

const std::vector<float>& weights() {
  static const std::vector<float> w = [] {
    std::mt19937 rng(2);
    std::normal_distribution<float> d(0.0f, 0.02f);
    std::vector<float> v(static_cast<std::size_t>(kN * kK));
    for (float& x : v) x = d(rng);
    return v;
  }();
  return w;
}

void BM_AccumulateHessian(benchmark::State& state) {
  const ms::TensorView x(activations().data(), ms::DType::float32, {kSamples, kK});
  std::vector<double> h(static_cast<std::size_t>(kK * kK), 0.0);
  for (auto _ : state) {
    ms::accumulate_hessian(x, h);
    benchmark::DoNotOptimize(h.data());
  }
}

// state.range(0): rows of W (48, one chunk of rows: about the cost of U from H alone; or kN).
void BM_GptqNvfp4(benchmark::State& state) {
  const ms::TensorView w(weights().data(), ms::DType::float32, {state.range(0), kK});
  const ms::HessianView h{hessian().data(), {kK, kK}};
  ms::QuantSpec spec;
  spec.mode = ms::Mode::nvfp4;
  for (auto _ : state) benchmark::DoNotOptimize(ms::gptq(w, h, spec));
}

}  // namespace

BENCHMARK(BM_AccumulateHessian)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
BENCHMARK(BM_GptqNvfp4)->Arg(48)->Arg(kN)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

BENCHMARK_MAIN();
