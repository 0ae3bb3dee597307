// Backend and CPU-target selection (include/microscale/runtime.hpp).
#include <gtest/gtest.h>

#include <algorithm>

#include "support.hpp"

namespace ms = microscale;
using namespace mst;

namespace {

TEST(Runtime, BackendConfigsCoverReferenceAndEveryTarget) {
  const std::vector<BackendConfig>& c = backend_configs();
  ASSERT_GE(c.size(), 2u);
  std::string list;
  for (const BackendConfig& b : c) list += " [" + b.label + "]";
  std::printf("backends under test:%s\n", list.c_str());
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
  for (ms::Backend b : {ms::Backend::cpu, ms::Backend::reference}) EXPECT_EQ(ms::backend_from_name(ms::name(b)), b);
  EXPECT_STREQ(ms::name(ms::Backend::cpu), "cpu");
  EXPECT_STREQ(ms::name(ms::Backend::reference), "reference");
  for (const char* bad : {"", "gpu", "CPU", "reference ", "ref"}) EXPECT_FALSE(ms::backend_from_name(bad)) << bad;
}

}  // namespace
