// Threads: results never depend on the thread count, and concurrent calls from several user
// threads neither crash nor change results. The thread pool itself (cpu/parallel.hpp): every item
// is covered once by fixed chunks, exceptions reach the caller, calls complete with more threads
// configured than there are CPUs, concurrent calls stay within the budget, and a forked child can
// run parallel calls.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cpu/parallel.hpp"
#include "microscale/microscale.hpp"

namespace ms = microscale;

namespace {

std::vector<float> randn(std::int64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

bool same_bytes(const ms::Tensor& a, const ms::Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

struct Outputs {
  ms::Tensor packed, scales, deq, gemv, gemm, gemm_nt;
};

Outputs run_all(const std::vector<float>& w, const std::vector<float>& x, ms::Mode mode) {
  const std::int64_t N = 384, K = 512;
  ms::QuantSpec s;
  s.mode = mode;
  const ms::TensorView wv(w.data(), ms::DType::float32, {N, K});
  if (mode == ms::Mode::nvfp4) s.global_scale = ms::global_scale(wv);
  const ms::Quantized q = ms::quantize(wv, s);
  Outputs o{q.packed, q.scales, ms::dequantize(q, ms::DType::bfloat16), {}, {}, {}};
  o.gemv = ms::quantized_matmul(ms::TensorView(x.data(), ms::DType::float32, {2, K}), q, true);
  o.gemm = ms::quantized_matmul(ms::TensorView(x.data(), ms::DType::float32, {40, K}), q, true);
  const ms::Quantized qt = ms::quantize(ms::TensorView(w.data(), ms::DType::float32, {K, N}), s);
  o.gemm_nt = ms::quantized_matmul(ms::TensorView(x.data(), ms::DType::float32, {40, K}), qt, false);
  return o;
}

void expect_same(const Outputs& a, const Outputs& b) {
  EXPECT_TRUE(same_bytes(a.packed, b.packed));
  EXPECT_TRUE(same_bytes(a.scales, b.scales));
  EXPECT_TRUE(same_bytes(a.deq, b.deq));
  EXPECT_TRUE(same_bytes(a.gemv, b.gemv));
  EXPECT_TRUE(same_bytes(a.gemm, b.gemm));
  EXPECT_TRUE(same_bytes(a.gemm_nt, b.gemm_nt));
}

}  // namespace

TEST(Threads, ResultsDoNotDependOnThreadCount) {
  const auto w = randn(384 * 512, 1), x = randn(40 * 512, 2);
  for (ms::Mode mode : {ms::Mode::nvfp4, ms::Mode::mxfp4, ms::Mode::mxfp8, ms::Mode::affine}) {
    SCOPED_TRACE(ms::name(mode));
    ms::set_num_threads(1);
    const Outputs one = run_all(w, x, mode);
    for (int t : {2, 3, 8}) {
      ms::set_num_threads(t);
      expect_same(one, run_all(w, x, mode));
    }
  }
  ms::set_num_threads(0);
}

TEST(Threads, ConcurrentCallersGetSerialResults) {
  const auto w = randn(384 * 512, 3), x = randn(40 * 512, 4);
  ms::set_num_threads(2);
  const Outputs serial = run_all(w, x, ms::Mode::nvfp4);
  std::vector<Outputs> got(4);
  std::vector<std::thread> callers;
  for (std::size_t i = 0; i < got.size(); ++i)
    callers.emplace_back([&, i] {
      for (int rep = 0; rep < 3; ++rep) got[i] = run_all(w, x, ms::Mode::nvfp4);
    });
  for (std::thread& t : callers) t.join();
  for (const Outputs& o : got) expect_same(serial, o);
  ms::set_num_threads(0);
}

namespace {

// Runs parallel_for(n, grain) and checks that the body saw exactly the fixed chunks, each once.
void expect_fixed_chunks(std::int64_t n, std::int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
  std::atomic<bool> misaligned{false};
  ms::cpu::parallel_for(n, grain, [&](std::int64_t b, std::int64_t e) {
    if (b % grain != 0 || e != std::min(n, b + grain)) misaligned = true;
    for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
  });
  EXPECT_FALSE(misaligned);
  EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](const std::atomic<int>& h) { return h == 1; }));
}

}  // namespace

TEST(ParallelFor, CoversEveryItemOnceInFixedChunks) {
  const std::int64_t cases[][2] = {{0, 1}, {1, 1},   {1, 8},    {5, 8},     {8, 8},
                                   {9, 8}, {100, 7}, {1000, 1}, {4096, 64}, {100003, 3}};
  for (int t : {1, 2, 3, 8}) {
    ms::set_num_threads(t);
    for (const auto& c : cases) {
      SCOPED_TRACE(testing::Message() << "threads " << t << ", n " << c[0] << ", grain " << c[1]);
      expect_fixed_chunks(c[0], c[1]);
    }
  }
  ms::set_num_threads(0);
}

TEST(ParallelFor, BodyExceptionReachesTheCaller) {
  for (int t : {1, 2, 4}) {
    SCOPED_TRACE(testing::Message() << "threads " << t);
    ms::set_num_threads(t);
    std::atomic<int> calls{0};
    const auto throw_in_chunk_7 = [&](std::int64_t b, std::int64_t) {
      calls.fetch_add(1);
      if (b == 7 * 16) throw std::runtime_error("chunk 7");
    };
    try {
      ms::cpu::parallel_for(64 * 16, 16, throw_in_chunk_7);
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "chunk 7");
    }
    EXPECT_GE(calls.load(), 1);
    EXPECT_LE(calls.load(), 64);
    // Every chunk throws: one exception comes back, and the threads are still usable.
    EXPECT_THROW(ms::cpu::parallel_for(1000, 10, [](std::int64_t, std::int64_t) { throw std::logic_error("any"); }),
                 std::logic_error);
    expect_fixed_chunks(1000, 10);
  }
  ms::set_num_threads(0);
}

// 16 threads on a machine with fewer CPUs: calls must neither hang nor go wrong while workers are
// descheduled (how fast they run is the benchmarks' business, not a test's).
TEST(ParallelFor, CompletesWithMoreThreadsThanCpus) {
  const auto w = randn(256 * 1024, 5);  // 16 chunks of the quantizer
  const ms::TensorView wv(w.data(), ms::DType::float32, {256, 1024});
  ms::set_num_threads(1);
  const ms::Quantized serial = ms::quantize(wv, ms::QuantSpec{});
  ms::set_num_threads(16);
  for (int rep = 0; rep < 200; ++rep) {
    const ms::Quantized q = ms::quantize(wv, ms::QuantSpec{});
    ASSERT_TRUE(same_bytes(serial.packed, q.packed) && same_bytes(serial.scales, q.scales)) << "call " << rep;
    expect_fixed_chunks(97, 3);
  }
  ms::set_num_threads(0);
}

// Two callers under a budget of 3: the pool's workers never run more than 3 - 1 bodies at once.
TEST(ParallelFor, ConcurrentCallsStayWithinTheBudget) {
  ms::set_num_threads(3);
  static thread_local bool caller = false;
  std::atomic<int> workers{0}, most{0};
  const auto body = [&](std::int64_t, std::int64_t) {
    if (caller) return;
    const int now = workers.fetch_add(1) + 1;
    for (int seen = most.load(); now > seen && !most.compare_exchange_weak(seen, now);) {
    }
    std::this_thread::yield();
    workers.fetch_sub(1);
  };
  std::vector<std::thread> callers;
  for (int i = 0; i < 2; ++i)
    callers.emplace_back([&] {
      caller = true;
      for (int rep = 0; rep < 200; ++rep) ms::cpu::parallel_for(64, 1, body);
    });
  for (std::thread& t : callers) t.join();
  EXPECT_LE(most.load(), 2);
  ms::set_num_threads(0);
}

#if !defined(__SANITIZE_THREAD__)  // TSan does not support starting threads after a multi-threaded fork
TEST(ParallelFor, ForkedChildRunsParallelCalls) {
  ms::set_num_threads(4);
  expect_fixed_chunks(1000, 10);  // the parent's pool is running
  // Let its workers go to sleep first: ASan's allocator, unlike glibc's malloc, is not fork-safe,
  // and a worker freeing a job during fork() would leave the child an allocator lock held forever.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(30);  // a deadlock kills the child instead of hanging the test
    std::atomic<std::int64_t> sum{0};
    for (int rep = 0; rep < 100; ++rep)
      ms::cpu::parallel_for(1000, 10, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) sum.fetch_add(i);
      });
    std::exit(sum == 100 * 999 * 1000 / 2 ? 0 : 1);  // static destructors too: joins the child's pool
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  ms::set_num_threads(0);
}
#endif
