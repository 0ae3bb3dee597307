// SIMD target and thread settings of the CPU backend (the backend itself is chosen in src/ops).
#include "microscale/runtime.hpp"

#include <hwy/targets.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "cpu/parallel.hpp"
#include "microscale/dtype.hpp"

namespace microscale {
namespace {

struct TargetName {
  const char* name;
  std::int64_t bit;
};
// Best first (Highway's lower bits are better targets).
constexpr TargetName kTargets[] = {
#if HWY_ARCH_X86
    {"avx512_dl", HWY_AVX3_DL}, {"avx512", HWY_AVX3}, {"avx2", HWY_AVX2}, {"sse4", HWY_SSE4}, {"ssse3", HWY_SSSE3},
#elif HWY_ARCH_ARM
    {"sve2_128", HWY_SVE2_128}, {"sve_256", HWY_SVE_256}, {"sve2", HWY_SVE2}, {"sve", HWY_SVE}, {"neon", HWY_NEON},
#endif
    {"scalar", HWY_SCALAR},
};

std::string target_list() {
  std::string out = "auto";
  for (const TargetName& t : kTargets) out += std::string(", ") + t.name;
  return out;
}

std::int64_t runnable_targets() {
  hwy::DisableTargets(0);  // the machine's real set, whatever was disabled before
  return hwy::SupportedTargets();
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// CPUs this process may run on (its affinity mask, as taskset and cgroup cpusets set it).
int runnable_cpus() {
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// A whole positive decimal count (digits only; a count past long long's range is its largest),
// or nothing: "1e3", "4x", " 4", "-2" and "0x10" are not counts.
std::optional<long long> positive_count(std::string_view text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
  long long n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec == std::errc::result_out_of_range) return std::numeric_limits<long long>::max();
  if (n <= 0) return std::nullopt;
  return n;
}

int clamp_threads(long long n) { return static_cast<int>(std::min<long long>(n, kMaxThreads)); }

// MICROSCALE_NUM_THREADS is ours and must be a count. OMP_NUM_THREADS belongs to OpenMP, whose
// value is a list of counts per nesting level ("8,4"): its first count is used, and a value
// OpenMP would not take either is passed over, as OpenMP runtimes pass it over.
int default_threads() {
  const std::string ours = env("MICROSCALE_NUM_THREADS");
  if (!ours.empty()) {
    const std::optional<long long> n = positive_count(ours);
    if (!n)
      throw Error("MICROSCALE_NUM_THREADS='" + ours + "' is not a thread count (a whole number >= 1; at most " +
                  std::to_string(kMaxThreads) + " are used)");
    return clamp_threads(*n);
  }
  const std::string omp = env("OMP_NUM_THREADS");
  if (const std::optional<long long> n = positive_count(std::string_view(omp).substr(0, omp.find(','))))
    return clamp_threads(*n);
  return runnable_cpus();
}

struct Settings;
std::atomic<Settings*> g_settings{nullptr};  // once constructed: what the fork handler resets

struct Settings {
  std::mutex mu;
  std::atomic<int> threads{1};
  std::atomic<int> budget{1};  // threads not held by running calls

  std::int64_t machine_targets = runnable_targets();  // before any forcing

  // Everything that can throw (the environment's values) comes first: a constructor that throws
  // runs again at the next use, and must not have left a fork handler behind.
  Settings() {
    threads = default_threads();
    budget = threads.load();
    const std::string target = env("MICROSCALE_CPU_TARGET");
    if (!target.empty() && target != "auto") {
      try {
        force(target);
      } catch (const Error& e) {
        throw Error("MICROSCALE_CPU_TARGET: " + std::string(e.what()));
      }
    }
    g_settings = this;
    // A forked child has none of the parent's running calls, whose leases it would never return.
    // Registered once, after the settings exist; the handler only stores.
    pthread_atfork(nullptr, nullptr, [] {
      Settings* s = g_settings.load();
      s->budget = s->threads.load();
    });
  }

  // Dispatch picks the best enabled target, so forcing one disables every better one.
  void force(const std::string& name) {
    for (const TargetName& t : kTargets) {
      if (name != t.name) continue;
      if (!(machine_targets & HWY_TARGETS & t.bit))
        throw Error("CPU target '" + name + "' is not supported by this machine");
      hwy::DisableTargets(t.bit - 1);
      return;
    }
    throw Error("unknown CPU target '" + name + "' (" + target_list() + ")");
  }
};

Settings& settings() {
  static Settings s;
  return s;
}

}  // namespace

void set_cpu_target(const std::string& name) {
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.mu);
  if (name == "auto")
    hwy::DisableTargets(0);  // back to the machine's own set
  else
    s.force(name);
}

std::string cpu_target() {
  settings();
  const std::int64_t chosen = hwy::SupportedTargets() & HWY_TARGETS;
  for (const TargetName& t : kTargets)
    if (chosen & t.bit) return t.name;  // dispatch picks the best runnable target
  return "scalar";
}

std::vector<std::string> available_cpu_targets() {
  const std::int64_t machine = settings().machine_targets;
  std::vector<std::string> out;
  for (const TargetName& t : kTargets)
    if ((HWY_TARGETS & t.bit) && (machine & t.bit)) out.push_back(t.name);
  return out;
}

void set_num_threads(int n) {
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.mu);
  const int next = n > 0 ? clamp_threads(n) : default_threads();
  s.budget += next - s.threads;
  s.threads = next;
}
int num_threads() { return settings().threads; }

namespace cpu {

ThreadLease::ThreadLease(std::int64_t want) : n_(1) {
  // Every running call holds at least its own thread, so the budget may go negative while more
  // user threads call in than the budget allows; extra workers are only taken from what is left.
  std::atomic<int>& budget = settings().budget;
  const int cap = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(want, settings().threads)));
  int avail = budget.load();
  do {
    n_ = std::max(1, std::min(cap, avail));
  } while (!budget.compare_exchange_weak(avail, avail - n_));
}

ThreadLease::~ThreadLease() { settings().budget += n_; }

}  // namespace cpu
}  // namespace microscale
