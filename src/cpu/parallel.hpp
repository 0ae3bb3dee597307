// Thread pool policy for the CPU kernels: OpenMP teams sized by MICROSCALE_NUM_THREADS, with a
// process-wide budget so concurrent calls from several user threads never run more workers than
// the budget (each call keeps at least its own thread). Work is split into fixed chunks, and each
// output element is computed by exactly one thread in a fixed order, so results never depend on
// the number of threads.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace microscale::cpu {

// Reserves up to `want` threads from the budget for the lifetime of the object.
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

// Calls body(begin, end) over [0, n) in chunks of at least `grain` items, in parallel.
template <class Body>
void parallel_for(std::int64_t n, std::int64_t grain, Body&& body) {
  if (n <= 0) return;
  const std::int64_t chunks = (n + grain - 1) / grain;
  ThreadLease lease(chunks);
  const int threads = lease.threads();
  if (threads <= 1) {
    body(std::int64_t{0}, n);
    return;
  }
  // One contiguous range per thread keeps each thread's memory stream sequential.
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const std::int64_t per = (chunks + threads - 1) / threads;
    const std::int64_t b = std::min<std::int64_t>(n, per * t * grain);
    const std::int64_t e = std::min<std::int64_t>(n, per * (t + 1) * grain);
    if (b < e) body(b, e);
  }
}

}  // namespace microscale::cpu
