// The thread pool behind parallel_for (see parallel.hpp).
#include "cpu/parallel.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "microscale/runtime.hpp"

namespace microscale::cpu {
namespace {

// How long an idle thread polls before it sleeps: enough to catch the next call of a loop over
// tensors without a sleep/wake round trip, too little to matter on a machine with no core to spare.
constexpr auto kSpin = std::chrono::microseconds(20);

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls `ready` for up to kSpin; returns its last answer. Yields between rounds: on a busy machine
// the thread that would make `ready` true may be waiting for this very CPU.
template <class Ready>
bool spin_until(Ready&& ready) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  do {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    std::this_thread::yield();
  } while (std::chrono::steady_clock::now() < until);
  return ready();
}

// One parallel_for call. Shared with the workers it was offered to, so a worker that wakes after
// the call returned still finds a valid (exhausted) job.
struct Job {
  Job(std::int64_t n_, std::int64_t grain_, ChunkFn fn_, void* body_)
      : n(n_), grain(grain_), chunks((n_ + grain_ - 1) / grain_), fn(fn_), body(body_) {}

  // Runs chunks until none is left unclaimed; returns how many this thread claimed. After an
  // exception the remaining chunks are claimed but skipped.
  std::int64_t work() {
    std::int64_t claimed = 0;
    for (std::int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks; ++claimed) {
      if (failed.load(std::memory_order_relaxed)) continue;
      const std::int64_t b = c * grain;
      try {
        fn(body, b, std::min(n, b + grain));
      } catch (...) {
        if (!failed.exchange(true)) error = std::current_exception();
      }
    }
    return claimed;
  }

  // Counts chunks as done; the thread that completes the job wakes the caller.
  void finish(std::int64_t claimed) {
    if (claimed == 0 || done.fetch_add(claimed, std::memory_order_acq_rel) + claimed != chunks) return;
    std::lock_guard<std::mutex> lock(mu);
    all_done.notify_one();
  }

  bool complete() const { return done.load(std::memory_order_acquire) == chunks; }

  void wait() {
    if (spin_until([&] { return complete(); })) return;
    std::unique_lock<std::mutex> lock(mu);
    all_done.wait(lock, [&] { return complete(); });
  }

  const std::int64_t n, grain, chunks;
  const ChunkFn fn;
  void* const body;  // valid until the job is complete: the caller returns only then
  std::atomic<std::int64_t> next{0};
  std::atomic<std::int64_t> done{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;  // written by the thread that set `failed`, published by `done`
  std::mutex mu;
  std::condition_variable all_done;
};

// Worker threads, started on demand, that take offers to help a job from a queue.
class Pool {
 public:
  Pool() = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // Offers `helpers` workers to `job`, starting threads (at most `max_threads` in all) when fewer
  // are free than offers are queued. Threads start before the offers are queued, so an exception
  // leaves no offer pointing at a call that did not happen.
  void offer(const std::shared_ptr<Job>& job, int helpers, int max_threads) {
    int wake = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const std::size_t wanted =
          std::min(static_cast<std::size_t>(max_threads),
                   offers_.size() + static_cast<std::size_t>(helpers + busy_.load(std::memory_order_relaxed)));
      try {
        while (threads_.size() < wanted) threads_.emplace_back([this] { serve(); });
      } catch (const std::system_error&) {
        // Out of threads: the caller and the workers already running do the chunks.
      }
      offers_.insert(offers_.end(), static_cast<std::size_t>(helpers), job);
      queued_.store(offers_.size(), std::memory_order_relaxed);
      wake = std::min(helpers, sleeping_);
    }
    for (int i = 0; i < wake; ++i) wake_.notify_one();
  }

  // Takes back the offers for `job` that no worker has taken, so none wakes up for nothing.
  void withdraw(const Job& job) {
    if (queued_.load(std::memory_order_relaxed) == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(offers_, [&](const std::shared_ptr<Job>& o) { return o.get() == &job; });
    queued_.store(offers_.size(), std::memory_order_relaxed);
  }

  Pool* forked_from = nullptr;  // once abandoned by a fork: the pool abandoned before it

 private:
  void serve() {
    for (;;) {
      spin_until([&] { return queued_.load(std::memory_order_relaxed) > 0; });
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ++sleeping_;
        wake_.wait(lock, [&] { return stopping_ || !offers_.empty(); });
        --sleeping_;
        if (stopping_) return;
        job = std::move(offers_.front());
        offers_.pop_front();
        queued_.store(offers_.size(), std::memory_order_relaxed);
        busy_.fetch_add(1, std::memory_order_relaxed);
      }
      job->finish(job->work());
      busy_.fetch_sub(1, std::memory_order_relaxed);
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> offers_;
  std::atomic<std::size_t> queued_{0};  // offers_.size(), polled without the lock
  std::atomic<int> busy_{0};            // workers inside a job
  std::vector<std::thread> threads_;
  int sleeping_ = 0;
  bool stopping_ = false;
};

constinit std::atomic<Pool*> g_pool{nullptr};
constinit std::atomic<ParallelRunner> g_runner{nullptr};
constinit std::atomic<bool> g_exited{false};

// Owns the process's pool. At exit it joins the workers, and later calls (from other static
// destructors) run on the caller alone. A forked child has none of the parent's threads and may
// have inherited its pool's lock held, so it abandons that pool (never touched again, but kept
// reachable for leak checkers) and starts its own at its next parallel call.
struct PoolOwner {
  PoolOwner() {
    pthread_atfork(nullptr, nullptr, [] {
      if (Pool* parent = g_pool.exchange(nullptr)) {
        parent->forked_from = abandoned_pools;
        abandoned_pools = parent;
      }
    });
  }
  ~PoolOwner() {
    g_exited = true;
    delete g_pool.exchange(nullptr);
  }
  PoolOwner(const PoolOwner&) = delete;
  PoolOwner& operator=(const PoolOwner&) = delete;

  static inline Pool* abandoned_pools = nullptr;  // chained through forked_from
} g_pool_owner;

Pool* pool() {
  if (Pool* p = g_pool.load(std::memory_order_acquire)) return p;
  if (g_exited) return nullptr;
  auto fresh = std::make_unique<Pool>();
  Pool* expected = nullptr;
  if (g_pool.compare_exchange_strong(expected, fresh.get(), std::memory_order_acq_rel)) return fresh.release();
  return expected;
}

// A runner (set_parallel_runner) returns only once every thread of its team has joined, and a
// team thread that another process keeps off the CPU costs the caller a scheduling round on
// every call, where the own pool never waits for a thread that has not started. So a call whose
// caller claimed every chunk and then still waited kLateJoin for the team counts as late, and
// after kTeamLateRuns late calls in a row the next kTeamPoolCalls calls go to the own pool before
// the team is tried again.
constexpr auto kLateJoin = std::chrono::microseconds(500);
constinit std::atomic<int> g_late_runs{0};
constinit std::atomic<int> g_pool_calls_left{0};

// Whether this call may use the runner; counts down the pool's turn.
bool team_turn() {
  int left = g_pool_calls_left.load(std::memory_order_relaxed);
  while (left > 0 && !g_pool_calls_left.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) {
  }
  return left <= 0;
}

void run_on_team(ParallelRunner runner, std::int64_t n, std::int64_t grain, int threads, ChunkFn fn, void* body) {
  using Clock = std::chrono::steady_clock;
  struct Call {
    Job job;
    std::thread::id caller;
    std::int64_t caller_claimed = 0;
    Clock::time_point caller_done{};
  } call{Job(n, grain, fn, body), std::this_thread::get_id()};
  runner(
      [](void* p) {
        Call& c = *static_cast<Call*>(p);
        const std::int64_t claimed = c.job.work();
        if (std::this_thread::get_id() != c.caller) return;
        c.caller_claimed = claimed;
        c.caller_done = Clock::now();
      },
      &call, static_cast<unsigned>(threads), 0);
  const bool late = call.caller_claimed == call.job.chunks && Clock::now() - call.caller_done > kLateJoin;
  if (!late) {
    g_late_runs.store(0, std::memory_order_relaxed);
  } else if (g_late_runs.fetch_add(1, std::memory_order_relaxed) + 1 >= kTeamLateRuns) {
    g_late_runs.store(0, std::memory_order_relaxed);
    g_pool_calls_left.store(kTeamPoolCalls, std::memory_order_relaxed);
  }
  if (call.job.error) std::rethrow_exception(call.job.error);
}

}  // namespace

void run_chunks(std::int64_t n, std::int64_t grain, int threads, ChunkFn fn, void* body) {
  if (const ParallelRunner runner = g_runner.load(std::memory_order_acquire); runner && team_turn()) {
    run_on_team(runner, n, grain, threads, fn, body);
    return;
  }
  const auto job = std::make_shared<Job>(n, grain, fn, body);
  Pool* workers = pool();
  if (workers) workers->offer(job, threads - 1, num_threads() - 1);
  job->finish(job->work());
  if (workers) workers->withdraw(*job);
  job->wait();
  if (job->error) std::rethrow_exception(job->error);
}

}  // namespace microscale::cpu

namespace microscale {

void set_parallel_runner(ParallelRunner runner) {
  cpu::g_late_runs.store(0, std::memory_order_relaxed);
  cpu::g_pool_calls_left.store(0, std::memory_order_relaxed);
  cpu::g_runner.store(runner, std::memory_order_release);
}
bool has_parallel_runner() { return cpu::g_runner.load(std::memory_order_acquire) != nullptr; }

}  // namespace microscale
