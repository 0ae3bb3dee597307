// Threads on a busy machine: quantize and dequantize of the case `microscale eval --rows 256
// --cols 1024 --modes nvfp4` runs (bfloat16 weights to nvfp4, back to float32) with 1 thread and
// with the default number of threads, each on an idle machine and with every CPU kept busy by a
// spinning competitor thread. A pool that makes a call wait for a descheduled worker shows as a
// cliff from the idle rows to the busy ones; a good one drops to about one thread's speed.
//
//   microscale_bench_threads --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// Case names: threads 0 is the default count (the label gives it), busy 1 runs the competitors.
// items_per_second counts elements.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "microscale/microscale.hpp"

namespace ms = microscale;

namespace {

constexpr std::int64_t kRows = 256, kCols = 1024;

const ms::TensorView& weights() {
  static const std::vector<std::uint16_t> bf16 = [] {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<std::uint16_t> v(static_cast<std::size_t>(kRows * kCols));
    for (std::uint16_t& x : v) x = ms::encode_bf16(d(rng));
    return v;
  }();
  static const ms::TensorView view(bf16.data(), ms::DType::bfloat16, {kRows, kCols});
  return view;
}

// One busy-looping thread per CPU at normal priority, for the lifetime of the object.
class Competitors {
 public:
  explicit Competitors(bool on) {
    if (!on) return;
    for (unsigned i = 0; i < std::max(1u, std::thread::hardware_concurrency()); ++i)
      spinners_.emplace_back([this] {
        while (!stop_.load(std::memory_order_relaxed)) {
        }
      });
  }
  ~Competitors() {
    stop_ = true;
    for (std::thread& t : spinners_) t.join();
  }
  Competitors(const Competitors&) = delete;
  Competitors& operator=(const Competitors&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> spinners_;
};

// The case's thread count and load, set for the lifetime of the object.
class Case {
 public:
  explicit Case(benchmark::State& st) : load_(st.range(1) != 0), st_(st) {
    ms::set_num_threads(static_cast<int>(st.range(0)));
    st.SetLabel(std::to_string(ms::num_threads()) + (st.range(1) != 0 ? " threads, busy" : " threads, idle"));
  }
  ~Case() {
    st_.SetItemsProcessed(st_.iterations() * kRows * kCols);
    ms::set_num_threads(0);
  }
  Case(const Case&) = delete;
  Case& operator=(const Case&) = delete;

 private:
  Competitors load_;
  benchmark::State& st_;
};

// As eval times them: the previous result is released first, so no call pays fresh page faults.
void BM_Quantize(benchmark::State& st) {
  ms::Quantized q;
  const Case c(st);
  for (auto _ : st) {
    q = ms::Quantized();
    q = ms::quantize(weights(), ms::QuantSpec{});
    benchmark::DoNotOptimize(q.packed.bytes());
  }
}

void BM_Dequantize(benchmark::State& st) {
  const ms::Quantized q = ms::quantize(weights(), ms::QuantSpec{});
  ms::Tensor y;
  const Case c(st);
  for (auto _ : st) {
    y = ms::Tensor();
    y = ms::dequantize(q, ms::DType::float32);
    benchmark::DoNotOptimize(y.bytes());
  }
}

void cases(benchmark::internal::Benchmark* b) {
  b->ArgNames({"threads", "busy"})->ArgsProduct({{1, 0}, {0, 1}})->UseRealTime();
}

BENCHMARK(BM_Quantize)->Apply(cases);
BENCHMARK(BM_Dequantize)->Apply(cases);

}  // namespace

BENCHMARK_MAIN();
