// Quantize/dequantize kernel throughput on a 14336 x 4096 matrix (FORMATS.md section 10), each
// op next to a STREAM-like twin that reads and writes the same bytes in the same buffers with
// the same threads, so an op's fraction of the memory roof comes from one run. At the end the
// medians are printed side by side.
//
//   microscale_bench_quantize [--benchmark_filter=...]    (threads: the last name component, 1 or 2)
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/kernels.hpp"
#include "microscale/codecs.hpp"
#include "microscale/runtime.hpp"

namespace ms = microscale;

namespace {

constexpr std::int64_t kRows = 14336, kK = 4096, kN = kRows * kK;

struct Data {
  std::vector<float> f32;
  std::vector<std::uint16_t> bf16;
  std::vector<std::uint8_t> packed, scales;  // large enough for every mode and the twins
  std::vector<std::uint8_t> out;             // dequantized values (up to f32)
  float amax = 0.0f;
  Data() : f32(kN), bf16(kN), packed(kN + kN / 16), scales(kN / 16), out(kN * 4) {
    std::mt19937_64 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::int64_t i = 0; i < kN; ++i) {
      f32[i] = normal(rng);
      bf16[i] = ms::encode_bf16(f32[i]);
    }
    amax = ms::cpu::amax_finite(f32.data(), ms::DType::float32, kN);
  }
};

Data& data() {
  static Data d;
  return d;
}

struct Op {
  const char* name;  // "src->dst"
  ms::DType in;      // quantize: input dtype; dequantize: output dtype
  ms::Mode mode;
  bool quantize;
};

ms::QuantSpec spec_of(const Op& op) {
  ms::QuantSpec s;
  s.mode = op.mode;
  if (op.mode == ms::Mode::nvfp4) s.global_scale = data().amax;
  return ms::resolve(s);
}

// Bytes per 1024 elements read and written by an op (scales included).
void traffic(const Op& op, std::int64_t& rd, std::int64_t& wr) {
  const ms::QuantSpec s = spec_of(op);
  const std::int64_t q = 1024 * s.bits / 8 + 1024 / s.group_size;
  const std::int64_t f = 1024 * static_cast<std::int64_t>(ms::dtype_size(op.in));
  rd = op.quantize ? f : q;
  wr = op.quantize ? q : f;
}

void set_counters(benchmark::State& st, const Op& op) {
  std::int64_t rd, wr;
  traffic(op, rd, wr);
  st.counters["el/s"] = benchmark::Counter(static_cast<double>(kN), benchmark::Counter::kIsIterationInvariantRate);
  st.counters["B/s"] = benchmark::Counter(static_cast<double>(kN / 1024 * (rd + wr)),
                                          benchmark::Counter::kIsIterationInvariantRate);
}

void run_op(benchmark::State& st, Op op) {
  Data& d = data();
  ms::set_num_threads(static_cast<int>(st.range(0)));
  const ms::QuantSpec s = spec_of(op);
  auto* scales = reinterpret_cast<std::byte*>(d.scales.data());
  const void* x = op.in == ms::DType::float32 ? static_cast<const void*>(d.f32.data()) : d.bf16.data();
  if (!op.quantize)  // real codes and scales (zero scales would make every product subnormal)
    ms::cpu::quantize(d.f32.data(), ms::DType::float32, kRows, kK, s, d.packed.data(), scales, nullptr);
  for (auto _ : st) {
    if (op.quantize)
      ms::cpu::quantize(x, op.in, kRows, kK, s, d.packed.data(), scales, nullptr);
    else
      ms::cpu::dequantize(d.packed.data(), scales, nullptr, ms::DType::uint8, kRows, kK, s, op.in,
                          reinterpret_cast<std::byte*>(d.out.data()));
    benchmark::ClobberMemory();
  }
  set_counters(st, op);
}

// Per 1024 elements: XOR-reduce `rd` input bytes, store `wr` bytes derived from them; threads
// take contiguous ranges as the kernels' parallel_for does.
void stream_pass(const std::uint8_t* in, std::int64_t rd, std::uint8_t* out, std::int64_t wr, int threads) {
  const std::int64_t blocks = kN / 1024;
#pragma omp parallel num_threads(threads)
  {
    const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    for (std::int64_t b = blocks * t / nt; b < blocks * (t + 1) / nt; ++b) {
      const auto* src = reinterpret_cast<const std::uint64_t*>(in + b * rd);
      std::uint64_t acc = 0;
      for (std::int64_t i = 0; i < rd / 8; ++i) acc ^= src[i];
      auto* dst = reinterpret_cast<std::uint64_t*>(out + b * wr);
      for (std::int64_t i = 0; i < wr / 8; ++i) dst[i] = acc + static_cast<std::uint64_t>(i);
    }
  }
}

void run_stream(benchmark::State& st, Op op) {
  Data& d = data();
  std::int64_t rd, wr;
  traffic(op, rd, wr);
  const int threads = static_cast<int>(st.range(0));
  const auto* x = op.in == ms::DType::float32 ? reinterpret_cast<const std::uint8_t*>(d.f32.data())
                                              : reinterpret_cast<const std::uint8_t*>(d.bf16.data());
  for (auto _ : st) {
    if (op.quantize)
      stream_pass(x, rd, d.packed.data(), wr, threads);
    else
      stream_pass(d.packed.data(), rd, d.out.data(), wr, threads);
    benchmark::ClobberMemory();
  }
  set_counters(st, op);
}

// Console output plus, at the end, each op's median next to its twin's.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  explicit RatioReporter(std::map<std::string, double> bytes_per_el) : bytes_per_el_(std::move(bytes_per_el)) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs)
      if (r.aggregate_name == "median") medians_[r.run_name.function_name + "/" + r.run_name.args] = r.counters.at("el/s");
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\n%-32s %10s %10s %10s %7s\n", "op/threads (medians)", "Gel/s", "GB/s", "roof GB/s", "ratio");
    for (const auto& [key, op] : medians_) {
      if (key.rfind("stream:", 0) == 0) continue;
      const auto twin = medians_.find("stream:" + key.substr(key.find(':') + 1));
      if (twin == medians_.end()) continue;
      std::printf("%-32s %10.3f %10.2f %10.2f %6.1f%%\n", key.c_str(), op.value / 1e9,
                  bytes_per_el(key) * op.value / 1e9, bytes_per_el(key) * twin->second.value / 1e9,
                  100.0 * op.value / twin->second.value);
    }
  }
 private:
  double bytes_per_el(const std::string& key) const {
    const auto it = bytes_per_el_.find(key.substr(0, key.rfind('/')));
    return it == bytes_per_el_.end() ? 0.0 : it->second;
  }
  std::map<std::string, double> bytes_per_el_;  // by op name without the thread count
  std::map<std::string, benchmark::Counter> medians_;
};

}  // namespace

int main(int argc, char** argv) {
  const Op ops[] = {
      {"f32->nvfp4", ms::DType::float32, ms::Mode::nvfp4, true},
      {"bf16->nvfp4", ms::DType::bfloat16, ms::Mode::nvfp4, true},
      {"f32->mxfp4", ms::DType::float32, ms::Mode::mxfp4, true},
      {"bf16->mxfp4", ms::DType::bfloat16, ms::Mode::mxfp4, true},
      {"f32->mxfp8", ms::DType::float32, ms::Mode::mxfp8, true},
      {"bf16->mxfp8", ms::DType::bfloat16, ms::Mode::mxfp8, true},
      {"nvfp4->bf16", ms::DType::bfloat16, ms::Mode::nvfp4, false},
      {"nvfp4->f32", ms::DType::float32, ms::Mode::nvfp4, false},
      {"mxfp4->bf16", ms::DType::bfloat16, ms::Mode::mxfp4, false},
      {"mxfp4->f32", ms::DType::float32, ms::Mode::mxfp4, false},
      {"mxfp8->bf16", ms::DType::bfloat16, ms::Mode::mxfp8, false},
      {"mxfp8->f32", ms::DType::float32, ms::Mode::mxfp8, false},
  };
  benchmark::Initialize(&argc, argv);
  std::map<std::string, double> bytes_per_el;
  for (const Op& op : ops) {
    const std::string kind = op.quantize ? "quantize:" : "dequantize:";
    std::int64_t rd, wr;
    traffic(op, rd, wr);
    bytes_per_el[kind + op.name] = static_cast<double>(rd + wr) / 1024.0;
    using Fn = void (*)(benchmark::State&, Op);
    for (const auto& [name, fn] : {std::pair<std::string, Fn>{kind + op.name, run_op}, {"stream:" + std::string(op.name), run_stream}})
      benchmark::RegisterBenchmark(name.c_str(), fn, op)
          ->Arg(1)
          ->Arg(2)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.5)
          ->Repetitions(7)
          ->ReportAggregatesOnly(true);
  }
  RatioReporter reporter(std::move(bytes_per_el));
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}
