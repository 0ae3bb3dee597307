// Which backend runs the ops, which SIMD target the CPU kernels use, and how many threads.
//
// Environment (read once, at first use; the setters override it). An unset or empty variable means
// its default; any other value that is not one of those below is an Error naming the variable, thrown
// by every use of the setting it governs (the ops, the getters and the setters) until it is fixed:
//   MICROSCALE_BACKEND      "cpu" (default: SIMD + threads), "reference" (scalar executable spec)
//                           or "cuda" (the GPU: needs a program linked with microscale_cuda and a
//                           device; otherwise the first op throws Error saying so)
//   MICROSCALE_CPU_TARGET   "auto" (default: best the machine has), or force one of
//                           x86: "avx512_dl" (AVX-512 with VNNI/VBMI2), "avx512", "avx2",
//                                "sse4", "ssse3";
//                           Arm: "sve2_128", "sve_256" (SVE of that vector width), "sve2",
//                                "sve", "neon";
//                           "scalar" (portable fallback: the reference kernels)
//   MICROSCALE_NUM_THREADS  threads per call, the caller's included: a whole decimal number >= 1,
//                           clamped to kMaxThreads (unset: the first count of OMP_NUM_THREADS, where
//                           it is one, then the number of CPUs this process may run on); also a
//                           budget shared by calls from several threads at once, each keeping its
//                           own thread
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace microscale {

// cuda also runs any op whose operand lives in device memory, whatever the setting; host operands
// are copied to the device and results back.
enum class Backend { cpu, reference, cuda };

// "cpu", "reference" or "cuda"; no value for any other name, so each caller words its own error.
std::optional<Backend> backend_from_name(std::string_view text);
const char* name(Backend b);

Backend backend();
// Throws Error for cuda when this program has no CUDA backend (microscale_cuda not linked) or no
// device it can run on.
void set_backend(Backend b);

// Forces a CPU target; throws Error if the name is unknown or this machine cannot run it.
void set_cpu_target(const std::string& name);
// Name of the target the CPU kernels dispatch to now.
std::string cpu_target();
// Targets this build contains and this machine can run, best first.
std::vector<std::string> available_cpu_targets();

// The most threads per call: set_num_threads and MICROSCALE_NUM_THREADS clamp larger counts to it.
inline constexpr int kMaxThreads = 1024;

void set_num_threads(int n);  // n <= 0 restores the environment's default; n > kMaxThreads means kMaxThreads
int num_threads();

// Runs the CPU kernels' parallel loops on another runtime's threads instead of microscale's own
// pool. An application whose threads spin between its parallel regions (OpenMP's default, as in
// torch) otherwise holds the cores that microscale's pool then waits for; sharing one team of
// threads avoids that. runner(work, context, threads, 0) must call work(context) on up to `threads`
// threads concurrently, the calling thread among them, and return once every call has returned:
// the signature and contract of libgomp's GOMP_parallel (LLVM's libomp exports it too), the
// intended value. Results do not change (chunks never depend on the thread count); nullptr
// restores microscale's pool. The thread budget (set_num_threads) still bounds `threads`.
using ParallelRunner = void (*)(void (*work)(void*), void* context, unsigned threads, unsigned flags);
void set_parallel_runner(ParallelRunner runner);
bool has_parallel_runner();

}  // namespace microscale
