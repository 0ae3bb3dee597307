// Parallel loops for the CPU kernels: a small pool of our own threads under a process-wide thread
// budget (MICROSCALE_NUM_THREADS), so concurrent calls from several user threads never run more
// threads than the budget in total, and each call keeps at least its own thread.
//
// [0, n) is cut into fixed chunks of `grain` items whatever the thread count, and each chunk is one
// body call, so results never depend on the number of threads. The calling thread and the pool
// workers that are awake claim chunks from a shared counter; a worker that wakes late finds none,
// and the caller waits only for chunks that workers have already claimed. Idle threads spin for
// microseconds before they sleep, so on a busy machine a call slows to about one thread's speed
// instead of waiting for threads that are not running.
//
// With a runner set (set_parallel_runner: torch's OpenMP team, say) the same chunks run on the
// runner's threads instead. Its team joins before the call returns, so while its threads are kept
// off the CPU (late joins, see parallel.cpp) calls go back to the pool for a while.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace microscale::cpu {

// Reserves up to `want` threads (the caller's own included) from the budget for the lifetime of
// the object.
class ThreadLease {
 public:
  explicit ThreadLease(std::int64_t want);
  ~ThreadLease();
  ThreadLease(const ThreadLease&) = delete;
  ThreadLease& operator=(const ThreadLease&) = delete;
  int threads() const { return n_; }

 private:
  int n_;
};

// After this many late team calls in a row, this many calls run on the pool (see parallel.cpp).
inline constexpr int kTeamLateRuns = 2;
inline constexpr int kTeamPoolCalls = 256;

using ChunkFn = void (*)(void* body, std::int64_t begin, std::int64_t end);

// Runs every chunk of parallel_for(n, grain, ...) on the calling thread and up to threads - 1 pool
// workers; rethrows the first exception a chunk threw, after the other chunks are done.
void run_chunks(std::int64_t n, std::int64_t grain, int threads, ChunkFn fn, void* body);

// Calls body(begin, end) for each chunk [k * grain, min(n, (k + 1) * grain)) of [0, n), in
// parallel; grain >= 1.
template <class Body>
void parallel_for(std::int64_t n, std::int64_t grain, Body&& body) {
  if (n <= 0) return;
  ThreadLease lease((n + grain - 1) / grain);
  if (lease.threads() > 1) {
    using F = std::remove_reference_t<Body>;
    const auto call = [](void* f, std::int64_t b, std::int64_t e) { (*static_cast<F*>(f))(b, e); };
    run_chunks(n, grain, lease.threads(), call, const_cast<void*>(static_cast<const void*>(&body)));
    return;
  }
  for (std::int64_t b = 0; b < n; b += grain) body(b, std::min(n, b + grain));
}

}  // namespace microscale::cpu
