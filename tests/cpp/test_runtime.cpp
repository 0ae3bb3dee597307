// Backend and CPU-target selection (include/microscale/runtime.hpp).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "support.hpp"

namespace ms = microscale;
using namespace mst;

namespace {

TEST(Runtime, BackendConfigsCoverReferenceAndEveryTarget) {
  const std::vector<BackendConfig>& c = backend_configs();
  ASSERT_GE(c.size(), 2u);
  std::string list;
  for (const BackendConfig& b : c) list += " [" + b.label + "]";
  std::string offered;
  for (const std::string& t : ms::available_cpu_targets()) offered += " " + t;
  std::printf("cpu targets offered:%s\nbackends under test:%s\n", offered.c_str(), list.c_str());
  std::fflush(stdout);  // a later death test forks: an unflushed line would be printed twice
  EXPECT_EQ(c.front().backend, ms::Backend::reference);
}

// The machine's targets do not change when one is forced.
TEST(Runtime, AvailableTargetsDoNotDependOnForcing) {
  const std::vector<std::string> all = ms::available_cpu_targets();
  ASSERT_FALSE(all.empty());
  for (const std::string& t : all) {
    ms::set_cpu_target(t);
    EXPECT_EQ(ms::cpu_target(), t);
    EXPECT_EQ(ms::available_cpu_targets(), all) << "after forcing " << t;
  }
  ms::set_cpu_target("auto");
  EXPECT_EQ(ms::cpu_target(), all.front());
}

TEST(Runtime, SettersAndErrors) {
  EXPECT_THROW(ms::set_cpu_target("avx9000"), ms::Error);
  const ms::Backend before = ms::backend();
  ms::set_backend(ms::Backend::reference);
  EXPECT_EQ(ms::backend(), ms::Backend::reference);
  ms::set_backend(before);
  ms::set_num_threads(3);
  EXPECT_EQ(ms::num_threads(), 3);
  ms::set_num_threads(0);
  EXPECT_GE(ms::num_threads(), 1);
}

// One spelling per backend, shared by the CLI, the Python module and MICROSCALE_BACKEND.
TEST(Runtime, BackendNames) {
  for (ms::Backend b : {ms::Backend::cpu, ms::Backend::reference, ms::Backend::cuda})
    EXPECT_EQ(ms::backend_from_name(ms::name(b)), b);
  EXPECT_STREQ(ms::name(ms::Backend::cpu), "cpu");
  EXPECT_STREQ(ms::name(ms::Backend::reference), "reference");
  EXPECT_STREQ(ms::name(ms::Backend::cuda), "cuda");
  for (const char* bad : {"", "gpu", "CPU", "reference ", "ref"}) EXPECT_FALSE(ms::backend_from_name(bad)) << bad;
}

// This program does not link microscale_cuda: selecting cuda fails saying what is missing and
// what to do, and leaves the setting as it was.
TEST(Runtime, CudaWithoutTheCudaBackendIsAClearError) {
  const ms::Backend before = ms::backend();
  try {
    ms::set_backend(ms::Backend::cuda);
    ADD_FAILURE() << "set_backend(cuda) succeeded in a program without the CUDA backend";
  } catch (const ms::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("no CUDA backend"), std::string::npos) << msg;
    EXPECT_NE(msg.find("-DMICROSCALE_CUDA=ON"), std::string::npos) << msg;
    EXPECT_NE(msg.find("use backend cpu or reference"), std::string::npos) << msg;
  }
  EXPECT_EQ(ms::backend(), before);
}

// MICROSCALE_BACKEND=cuda is not silently replaced by another backend: the first op fails with
// set_backend's message. The environment is read once per process, so a fresh one (the
// threadsafe death-test style re-runs this binary) reads it.
TEST(RuntimeDeathTest, CudaFromTheEnvironmentFailsAtTheFirstOp) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ASSERT_EQ(setenv("MICROSCALE_BACKEND", "cuda", 1), 0);
  EXPECT_EXIT(
      {
        const std::vector<float> v(32, 1.0f);
        try {
          ms::quantize(ms::TensorView(v.data(), ms::DType::float32, {1, 32}), ms::QuantSpec{});
        } catch (const ms::Error& e) {
          std::fprintf(stderr, "%s\n", e.what());
          std::exit(2);
        }
        std::exit(0);
      },
      testing::ExitedWithCode(2), "backend cuda: this program has no CUDA backend");
  unsetenv("MICROSCALE_BACKEND");
}

// Sets (nullptr: unsets) an environment variable until the end of the scope, which restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* var, const char* value) : var_(var) {
    if (const char* old = std::getenv(var)) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(old_ ? old_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  void set(const char* value) const {
    if (value != nullptr) {
      setenv(var_, value, 1);
    } else {
      unsetenv(var_);
    }
  }

 private:
  const char* var_;
  std::optional<std::string> old_;
};

// A bad MICROSCALE_CPU_TARGET is an Error naming the variable at each use, and forked children
// (multiprocessing pools, DataLoader workers) are not affected: the settings' fork handler is
// registered only once they are valid, and never throws.
TEST(RuntimeDeathTest, BadCpuTargetInTheEnvironmentLeavesForkAlone) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const ScopedEnv target("MICROSCALE_CPU_TARGET", "avx9000");
  EXPECT_EXIT(
      {
        for (int attempt = 0; attempt < 3; ++attempt) {
          try {
            ms::num_threads();
            std::_Exit(3);  // the bad value was accepted
          } catch (const ms::Error& e) {
            if (std::string(e.what()).find("MICROSCALE_CPU_TARGET") == std::string::npos) std::_Exit(4);
          }
        }
        for (int child = 0; child < 2; ++child) {
          const pid_t pid = fork();
          if (pid == 0) std::_Exit(0);
          int status = 0;
          waitpid(pid, &status, 0);
          if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::_Exit(5);
        }
        std::_Exit(0);
      },
      testing::ExitedWithCode(0), "");
}

// Exit code 0 when `use` throws an Error that names `var`, 3 when it does not throw, 4 when the
// message does not name the variable.
template <class Use>
int error_names(const char* var, Use use) {
  try {
    use();
  } catch (const ms::Error& e) {
    return std::string(e.what()).find(var) != std::string::npos ? 0 : 4;
  }
  return 3;
}

// Environment values that are not exactly what they name are errors that name the variable, not
// silently another setting. The environment is read once per process, so each value is tried in
// a fresh one (the threadsafe death-test style re-runs this binary).
TEST(RuntimeDeathTest, BadEnvironmentValuesAreErrorsNamingTheVariable) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const ScopedEnv threads("MICROSCALE_NUM_THREADS", nullptr), omp("OMP_NUM_THREADS", nullptr);
  for (const char* value : {"1e3", "4x", " 4", "-2", "0x10", "+4", "0", "4,2"}) {
    threads.set(value);
    EXPECT_EXIT(std::_Exit(error_names("MICROSCALE_NUM_THREADS", [] { ms::num_threads(); })),
                testing::ExitedWithCode(0), "")
        << "MICROSCALE_NUM_THREADS=" << value;
  }
  threads.set("3");
  EXPECT_EXIT(std::_Exit(ms::num_threads() == 3 ? 0 : 1), testing::ExitedWithCode(0), "");
  for (const char* value : {"999999", "99999999999999999999"}) {
    threads.set(value);
    EXPECT_EXIT(std::_Exit(ms::num_threads() == ms::kMaxThreads ? 0 : 1), testing::ExitedWithCode(0), "") << value;
  }
  // OMP_NUM_THREADS is OpenMP's: its first count per nesting level is used.
  threads.set(nullptr);
  omp.set("3,2");
  EXPECT_EXIT(std::_Exit(ms::num_threads() == 3 ? 0 : 1), testing::ExitedWithCode(0), "");

  const ScopedEnv backend("MICROSCALE_BACKEND", nullptr);
  const std::vector<float> v(32, 1.0f);
  const auto quantize = [&] { ms::quantize(ms::TensorView(v.data(), ms::DType::float32, {1, 32}), ms::QuantSpec{}); };
  for (const char* value : {"typo", "CPU", "gpu", "cpu "}) {
    backend.set(value);
    EXPECT_EXIT(std::_Exit(error_names("MICROSCALE_BACKEND", quantize)), testing::ExitedWithCode(0), "")
        << "MICROSCALE_BACKEND=" << value;
  }
  backend.set("reference");
  EXPECT_EXIT(std::_Exit(ms::backend() == ms::Backend::reference ? 0 : 1), testing::ExitedWithCode(0), "");
}

// Thread counts beyond kMaxThreads are clamped to it (the environment's too, above).
TEST(Runtime, ThreadCountsAreClampedToTheMaximum) {
  for (int n : {ms::kMaxThreads + 1, 999999, INT_MAX}) {
    ms::set_num_threads(n);
    EXPECT_EQ(ms::num_threads(), ms::kMaxThreads) << n;
  }
  ms::set_num_threads(ms::kMaxThreads);
  EXPECT_EQ(ms::num_threads(), ms::kMaxThreads);
  ms::set_num_threads(0);
  EXPECT_LE(ms::num_threads(), ms::kMaxThreads);
}

}  // namespace
