// set_parallel_runner with OpenMP's own entry point (libgomp's GOMP_parallel, the value torch's
// OpenMP build hands over from Python): the loops then run inside an OpenMP team of the requested
// size, every fixed chunk once, results identical to microscale's pool, exceptions reach the
// caller, and nullptr gives the pool back. A team that keeps joining late (its threads kept off the
// CPU) hands calls back to the pool for a while; one whose threads share the work never does.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cpu/parallel.hpp"
#include "microscale/microscale.hpp"

extern "C" void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);

namespace ms = microscale;

namespace {

struct TeamSeen {
  std::atomic<bool> outside_team{false};
  std::atomic<int> team_size{0};
};

// Records, for every chunk, whether it ran inside an OpenMP team and that team's size.
void run_loop(std::int64_t n, std::int64_t grain, TeamSeen& seen, std::vector<std::atomic<int>>& hits) {
  ms::cpu::parallel_for(n, grain, [&](std::int64_t b, std::int64_t e) {
    if (!omp_in_parallel()) seen.outside_team = true;
    seen.team_size = omp_get_num_threads();
    for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
  });
}

ms::Tensor gemm(const std::vector<float>& w, const std::vector<float>& x) {
  ms::QuantSpec s;
  s.mode = ms::Mode::nvfp4;
  const ms::TensorView wv(w.data(), ms::DType::float32, {256, 512});
  s.global_scale = ms::global_scale(wv);
  return ms::quantized_matmul(ms::TensorView(x.data(), ms::DType::float32, {24, 512}), ms::quantize(wv, s), true);
}

class ParallelRunner : public testing::Test {
 protected:
  void TearDown() override {
    ms::set_parallel_runner(nullptr);
    ms::set_num_threads(0);
  }
};

}  // namespace

TEST_F(ParallelRunner, LoopsRunInAnOpenMPTeamEveryChunkOnce) {
  ms::set_parallel_runner(&GOMP_parallel);
  EXPECT_TRUE(ms::has_parallel_runner());
  for (int threads : {2, 3}) {
    SCOPED_TRACE(testing::Message() << "threads " << threads);
    ms::set_num_threads(threads);
    const std::int64_t n = 10007, grain = 13;
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
    TeamSeen seen;
    run_loop(n, grain, seen, hits);
    EXPECT_FALSE(seen.outside_team);
    EXPECT_EQ(seen.team_size, threads);
    EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](const std::atomic<int>& h) { return h == 1; }));
  }
}

TEST_F(ParallelRunner, NullRestoresTheOwnPool) {
  ms::set_parallel_runner(&GOMP_parallel);
  ms::set_parallel_runner(nullptr);
  EXPECT_FALSE(ms::has_parallel_runner());
  ms::set_num_threads(2);
  std::vector<std::atomic<int>> hits(1000);
  TeamSeen seen;
  run_loop(1000, 10, seen, hits);
  EXPECT_TRUE(seen.outside_team);
}

TEST_F(ParallelRunner, ResultsEqualThePool) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d;
  std::vector<float> w(256 * 512), x(24 * 512);
  for (float& v : w) v = d(rng);
  for (float& v : x) v = d(rng);
  ms::set_num_threads(2);
  const ms::Tensor pool = gemm(w, x);
  ms::set_parallel_runner(&GOMP_parallel);
  const ms::Tensor team = gemm(w, x);
  ASSERT_EQ(pool.nbytes(), team.nbytes());
  EXPECT_EQ(std::memcmp(pool.bytes(), team.bytes(), pool.nbytes()), 0);
}

TEST_F(ParallelRunner, BodyExceptionReachesTheCaller) {
  ms::set_parallel_runner(&GOMP_parallel);
  ms::set_num_threads(2);
  try {
    ms::cpu::parallel_for(100, 1, [&](std::int64_t b, std::int64_t) {
      if (b == 37) throw std::runtime_error("chunk 37");
    });
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "chunk 37");
  }
}

namespace {

std::atomic<int> g_team_calls{0};

// A team of two whose second thread joins 3 ms after the caller claimed every chunk: what a
// team thread that another process keeps off the CPU looks like.
void late_team(void (*work)(void*), void* context, unsigned, unsigned) {
  ++g_team_calls;
  work(context);
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    work(context);
  });
  late.join();
}

// A team of two whose second thread claims every chunk before the caller looks: never late,
// however long the caller then waits.
void sharing_team(void (*work)(void*), void* context, unsigned, unsigned) {
  ++g_team_calls;
  std::thread other([&] { work(context); });
  other.join();
  work(context);
}

void count_calls(int calls) {
  for (int i = 0; i < calls; ++i) ms::cpu::parallel_for(64, 8, [](std::int64_t, std::int64_t) {});
}

}  // namespace

TEST_F(ParallelRunner, LateTeamHandsCallsToThePoolForAWhile) {
  ms::set_num_threads(2);
  ms::set_parallel_runner(&late_team);
  g_team_calls = 0;
  count_calls(ms::cpu::kTeamLateRuns + ms::cpu::kTeamPoolCalls);
  EXPECT_EQ(g_team_calls, ms::cpu::kTeamLateRuns);
  count_calls(1);  // the pool's turn is over: the team again
  EXPECT_EQ(g_team_calls, ms::cpu::kTeamLateRuns + 1);
  ms::set_parallel_runner(&late_team);  // setting a runner starts afresh
  count_calls(1);
  EXPECT_EQ(g_team_calls, ms::cpu::kTeamLateRuns + 2);
}

TEST_F(ParallelRunner, TeamThatSharesTheWorkKeepsEveryCall) {
  ms::set_num_threads(2);
  ms::set_parallel_runner(&sharing_team);
  g_team_calls = 0;
  count_calls(ms::cpu::kTeamLateRuns + ms::cpu::kTeamPoolCalls);
  EXPECT_EQ(g_team_calls, ms::cpu::kTeamLateRuns + ms::cpu::kTeamPoolCalls);
}
