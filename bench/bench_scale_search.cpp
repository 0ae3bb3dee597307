// Three-level nvfp4 quantize through the public op, round-to-nearest against mse (whose global
// search tries five global scales), in one process: the same-run ratio issue 32 asks for.
//
//   build/bench/microscale_bench_scale_search [--benchmark_filter=...]
//
// Prints each median and, last, mse's speed as a fraction of round-to-nearest's per dtype and
// thread count. Data: 2048 x 4096 Student-t (3 degrees of freedom) values, the tensor amax as the
// global scale.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "microscale/microscale.hpp"

namespace ms = microscale;

namespace {

constexpr std::int64_t kRows = 2048, kK = 4096;

struct Data {
  std::vector<float> f32;
  std::vector<std::uint16_t> bf16;
  float amax = 0;
};

const Data& data() {
  static const Data d = [] {
    Data out;
    std::mt19937 rng(1);
    std::student_t_distribution<float> t3(3.0f);
    out.f32.resize(kRows * kK);
    for (float& v : out.f32) v = t3(rng);
    out.bf16.resize(out.f32.size());
    for (std::size_t i = 0; i < out.f32.size(); ++i) out.bf16[i] = ms::encode_bf16(out.f32[i]);
    out.amax = ms::global_scale(ms::TensorView(out.f32.data(), ms::DType::float32, {kRows, kK}));
    return out;
  }();
  return d;
}

void run(benchmark::State& st, ms::DType dtype, ms::ScaleSearch search) {
  const Data& d = data();
  ms::set_num_threads(static_cast<int>(st.range(0)));
  const void* p = dtype == ms::DType::float32 ? static_cast<const void*>(d.f32.data()) : d.bf16.data();
  const ms::TensorView x(p, dtype, {kRows, kK});
  ms::QuantSpec s;
  s.mode = ms::Mode::nvfp4;
  s.global_scale = d.amax;
  s.scale_search = search;
  for (auto _ : st) benchmark::DoNotOptimize(ms::quantize(x, s));
  st.counters["el/s"] =
      benchmark::Counter(static_cast<double>(kRows * kK), benchmark::Counter::kIsIterationInvariantRate);
}

// The console output plus the median of every run, by name.
class MedianReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs)
      if (r.aggregate_name == "median") medians[r.run_name.str()] = r.GetAdjustedRealTime();
  }
  std::map<std::string, double> medians;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  for (const auto& [dname, dtype] : {std::pair{"f32", ms::DType::float32}, std::pair{"bf16", ms::DType::bfloat16}})
    for (const auto& [sname, search] :
         {std::pair{"rtn", ms::ScaleSearch::none}, std::pair{"mse", ms::ScaleSearch::mse}})
      benchmark::RegisterBenchmark((std::string("quantize-3level-") + sname + ":" + dname).c_str(), run, dtype, search)
          ->Arg(1)
          ->Arg(2)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.3)
          ->Repetitions(5)
          ->ReportAggregatesOnly(true);
  MedianReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  std::printf("\nmse speed / round-to-nearest speed (same run, medians), target %s:\n", ms::cpu_target().c_str());
  // Run names read "NAME/THREADS/min_time:.../repeats:.../real_time".
  const auto median = [&](const std::string& prefix) {
    for (const auto& [name, t] : reporter.medians)
      if (name.rfind(prefix, 0) == 0) return t;
    return 0.0;
  };
  for (const char* dname : {"f32", "bf16"})
    for (const char* threads : {"1", "2"}) {
      const std::string tail = std::string(":") + dname + "/" + threads + "/";
      const double rtn = median("quantize-3level-rtn" + tail), mse = median("quantize-3level-mse" + tail);
      if (rtn > 0 && mse > 0)
        std::printf("  %s, %s threads: rtn %.2f ms, mse %.2f ms, %.3fx\n", dname, threads, rtn, mse, rtn / mse);
    }
  return 0;
}
