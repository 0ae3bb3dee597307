// Backend and CPU-target selection (include/microscale/runtime.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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

}  // namespace
