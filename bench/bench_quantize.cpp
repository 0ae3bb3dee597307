// CPU quantize, dequantize, amax_finite and find_nonfinite throughput on a 14336 x 4096 matrix
// (FORMATS.md section 10), each op next to a STREAM-like twin that reads and writes the same
// bytes in the same buffers with the same threads, so an op's fraction of the memory roof comes
// from one run; repetitions are interleaved at random. At the end the medians are printed side
// by side (G elements/s, GB/s of the op and of its twin, ratio). The cached-quantize:* rows run
// each quantizer on 64 rows with one thread, in L2: its compute rate alone.
//
//   microscale_bench_quantize [--benchmark_filter=...]    (threads: the last name component, 1 or 2)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "microscale/codecs.hpp"
#include "microscale/runtime.hpp"
#include "read_pass.hpp"

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

enum class Kind { quantize, dequantize, amax, find_nonfinite };

struct Op {
  const char* name;  // "src->dst", or the input dtype
  Kind kind;
  ms::DType dtype;  // the float side: quantize/amax input, dequantize output
  ms::Mode mode = ms::Mode::nvfp4;
  ms::ScaleSearch search = ms::ScaleSearch::none;  // per-block search only: the kernel, not the global one
};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::quantize: return "quantize:";
    case Kind::dequantize: return "dequantize:";
    case Kind::amax: return "amax_finite:";
    case Kind::find_nonfinite: return "find_nonfinite:";
  }
  return "";
}

ms::QuantSpec spec_of(const Op& op) {
  ms::QuantSpec s;
  s.mode = op.mode;
  s.scale_search = op.search;
  if (op.mode == ms::Mode::nvfp4) s.global_scale = data().amax;
  return ms::resolve(s);
}

// Bytes per 1024 elements read and written by an op (scales included).
void traffic(const Op& op, std::int64_t& rd, std::int64_t& wr) {
  const ms::QuantSpec s = spec_of(op);
  const std::int64_t q = 1024 * s.bits / 8 + 1024 / s.group_size;
  const std::int64_t f = 1024 * static_cast<std::int64_t>(ms::dtype_size(op.dtype));
  rd = op.kind == Kind::dequantize ? q : f;
  wr = op.kind == Kind::quantize ? q : op.kind == Kind::dequantize ? f : 0;
}

void set_counters(benchmark::State& st, const Op& op) {
  std::int64_t rd, wr;
  traffic(op, rd, wr);
  st.counters["el/s"] = benchmark::Counter(static_cast<double>(kN), benchmark::Counter::kIsIterationInvariantRate);
  st.counters["B/s"] =
      benchmark::Counter(static_cast<double>(kN / 1024 * (rd + wr)), benchmark::Counter::kIsIterationInvariantRate);
}

void run_op(benchmark::State& st, Op op) {
  Data& d = data();
  ms::set_num_threads(static_cast<int>(st.range(0)));
  const ms::QuantSpec s = spec_of(op);
  auto* scales = reinterpret_cast<std::byte*>(d.scales.data());
  const void* x = op.dtype == ms::DType::float32 ? static_cast<const void*>(d.f32.data()) : d.bf16.data();
  if (op.kind == Kind::dequantize)  // real codes and scales (zero scales would make every product subnormal)
    ms::cpu::quantize(d.f32.data(), ms::DType::float32, kRows, kK, s, d.packed.data(), scales, nullptr);
  for (auto _ : st) {
    switch (op.kind) {
      case Kind::quantize: ms::cpu::quantize(x, op.dtype, kRows, kK, s, d.packed.data(), scales, nullptr); break;
      case Kind::dequantize:
        ms::cpu::dequantize(d.packed.data(), scales, nullptr, ms::DType::uint8, kRows, kK, s, op.dtype,
                            reinterpret_cast<std::byte*>(d.out.data()));
        break;
      case Kind::amax: benchmark::DoNotOptimize(ms::cpu::amax_finite(x, op.dtype, kN)); break;
      case Kind::find_nonfinite: benchmark::DoNotOptimize(ms::cpu::find_nonfinite(x, op.dtype, kN)); break;
    }
    benchmark::ClobberMemory();
  }
  set_counters(st, op);
}

// The op on the first kCachedRows rows only, one thread, data resident in L2: its compute rate
// without the memory system.
constexpr std::int64_t kCachedRows = 64;
void run_cached(benchmark::State& st, Op op) {
  Data& d = data();
  ms::set_num_threads(1);
  const ms::QuantSpec s = spec_of(op);
  const void* x = op.dtype == ms::DType::float32 ? static_cast<const void*>(d.f32.data()) : d.bf16.data();
  auto* scales = reinterpret_cast<std::byte*>(d.scales.data());
  for (auto _ : st) {
    ms::cpu::quantize(x, op.dtype, kCachedRows, kK, s, d.packed.data(), scales, nullptr);
    benchmark::ClobberMemory();
  }
  st.counters["el/s"] =
      benchmark::Counter(static_cast<double>(kCachedRows * kK), benchmark::Counter::kIsIterationInvariantRate);
}

// Per 1024 elements: XOR-reduce `rd` input bytes, store `wr` bytes derived from them; on the
// library's threads (the caller sets their number), in chunks of 64 such blocks.
void stream_pass(const std::uint8_t* in, std::int64_t rd, std::uint8_t* out, std::int64_t wr) {
  ms::cpu::parallel_for(kN / 1024, 64, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      const std::uint64_t acc = bench::xor_words(reinterpret_cast<const std::uint64_t*>(in + b * rd), rd / 8);
      benchmark::DoNotOptimize(acc);  // read-only twins write nothing
      auto* dst = reinterpret_cast<std::uint64_t*>(out + b * wr);
      for (std::int64_t i = 0; i < wr / 8; ++i) dst[i] = acc + static_cast<std::uint64_t>(i);
    }
  });
}

void run_stream(benchmark::State& st, Op op) {
  Data& d = data();
  std::int64_t rd, wr;
  traffic(op, rd, wr);
  ms::set_num_threads(static_cast<int>(st.range(0)));
  const auto* x = op.dtype == ms::DType::float32 ? reinterpret_cast<const std::uint8_t*>(d.f32.data())
                                                 : reinterpret_cast<const std::uint8_t*>(d.bf16.data());
  for (auto _ : st) {
    if (op.kind == Kind::dequantize)
      stream_pass(d.packed.data(), rd, d.out.data(), wr);
    else
      stream_pass(x, rd, d.packed.data(), wr);
    benchmark::ClobberMemory();
  }
  set_counters(st, op);
}

// Console output plus, at the end, each op's median next to its twin's.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  struct Info {
    double bytes_per_el;
    std::string twin;
  };
  explicit RatioReporter(std::map<std::string, Info> ops) : ops_(std::move(ops)) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs)
      if (r.aggregate_name == "median")
        medians_[r.run_name.function_name + "/" + r.run_name.args] = r.counters.at("el/s");
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\n%-32s %10s %10s %10s %7s\n", "op/threads (medians)", "Gel/s", "GB/s", "roof GB/s", "ratio");
    for (const auto& [key, op] : medians_) {
      const std::size_t slash = key.rfind('/');
      const auto info = ops_.find(key.substr(0, slash));
      if (info == ops_.end()) continue;
      const auto twin = medians_.find(info->second.twin + key.substr(slash));
      if (twin == medians_.end()) continue;
      const double b = info->second.bytes_per_el;
      std::printf("%-32s %10.3f %10.2f %10.2f %6.1f%%\n", key.c_str(), op.value / 1e9, b * op.value / 1e9,
                  b * twin->second.value / 1e9, 100.0 * op.value / twin->second.value);
    }
  }

 private:
  std::map<std::string, Info> ops_;  // by op name without the thread count
  std::map<std::string, benchmark::Counter> medians_;
};

}  // namespace

int main(int argc, char** argv) {
  using ms::DType;
  using ms::Mode;
  const Op ops[] = {
      {"f32->nvfp4", Kind::quantize, DType::float32, Mode::nvfp4},
      {"bf16->nvfp4", Kind::quantize, DType::bfloat16, Mode::nvfp4},
      {"f32->mxfp4", Kind::quantize, DType::float32, Mode::mxfp4},
      {"bf16->mxfp4", Kind::quantize, DType::bfloat16, Mode::mxfp4},
      {"f32->nvfp4-4over6", Kind::quantize, DType::float32, Mode::nvfp4, ms::ScaleSearch::four_over_six},
      {"f32->nvfp4-mse", Kind::quantize, DType::float32, Mode::nvfp4, ms::ScaleSearch::mse},
      {"f32->mxfp4-mse", Kind::quantize, DType::float32, Mode::mxfp4, ms::ScaleSearch::mse},
      {"f32->mxfp8", Kind::quantize, DType::float32, Mode::mxfp8},
      {"bf16->mxfp8", Kind::quantize, DType::bfloat16, Mode::mxfp8},
      {"nvfp4->bf16", Kind::dequantize, DType::bfloat16, Mode::nvfp4},
      {"nvfp4->f32", Kind::dequantize, DType::float32, Mode::nvfp4},
      {"mxfp4->bf16", Kind::dequantize, DType::bfloat16, Mode::mxfp4},
      {"mxfp4->f32", Kind::dequantize, DType::float32, Mode::mxfp4},
      {"mxfp8->bf16", Kind::dequantize, DType::bfloat16, Mode::mxfp8},
      {"mxfp8->f32", Kind::dequantize, DType::float32, Mode::mxfp8},
      {"f32", Kind::amax, DType::float32},
      {"bf16", Kind::amax, DType::bfloat16},
      {"f32", Kind::find_nonfinite, DType::float32},
      {"bf16", Kind::find_nonfinite, DType::bfloat16},
  };
  // Repetitions of different benchmarks interleaved at random, so load from other processes
  // drifting during the run biases an op and its twin alike (overridable on the command line).
  std::vector<char*> args(argv, argv + argc);
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  args.insert(args.begin() + 1, interleave.data());
  int nargs = static_cast<int>(args.size());
  benchmark::Initialize(&nargs, args.data());
  std::map<std::string, RatioReporter::Info> infos;
  for (const Op& op : ops) {
    std::int64_t rd, wr;
    traffic(op, rd, wr);
    const std::string name = std::string(kind_name(op.kind)) + op.name;
    // amax and find_nonfinite read the same bytes: one read-only twin per dtype.
    const bool reads = op.kind == Kind::amax || op.kind == Kind::find_nonfinite;
    const std::string twin = std::string("stream:") + (reads ? "read-" : "") + op.name;
    infos[name] = {static_cast<double>(rd + wr) / 1024.0, twin};
    using Fn = void (*)(benchmark::State&, Op);
    std::vector<std::pair<std::string, Fn>> runs = {{name, run_op}};
    if (op.kind != Kind::find_nonfinite) runs.emplace_back(twin, run_stream);
    if (op.kind == Kind::quantize)
      benchmark::RegisterBenchmark(("cached-" + name).c_str(), run_cached, op)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2)
          ->Repetitions(7)
          ->ReportAggregatesOnly(true);
    for (const auto& [n, fn] : runs)
      benchmark::RegisterBenchmark(n.c_str(), fn, op)
          ->Arg(1)
          ->Arg(2)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.5)
          ->Repetitions(7)
          ->ReportAggregatesOnly(true);
  }
  RatioReporter reporter(std::move(infos));
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}
