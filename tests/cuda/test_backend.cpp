// Backend::cuda in a program linked with microscale_cuda: linking registers the backend, and
// selecting it on a machine without a usable device fails saying so (these run everywhere; the
// host API's results under Backend::cuda are checked on a device in test_ops.cpp).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "microscale/cuda.hpp"
#include "microscale/microscale.hpp"
#include "microscale/runtime.hpp"

namespace {

namespace ms = microscale;

constexpr const char* kNoDevice = "backend cuda: no usable CUDA device";

TEST(CudaBackend, SelectableExactlyWhenADeviceIsAvailable) {
  const ms::Backend before = ms::backend();
  if (ms::cuda::available()) {
    ASSERT_NO_THROW(ms::set_backend(ms::Backend::cuda));
    EXPECT_EQ(ms::backend(), ms::Backend::cuda);
    ms::set_backend(before);
    return;
  }
  try {
    ms::set_backend(ms::Backend::cuda);
    ADD_FAILURE() << "set_backend(cuda) succeeded without a usable device";
  } catch (const ms::Error& e) {
    const std::string msg = e.what();
    // Registered by linking (else: "no CUDA backend"), and the reason is the device.
    EXPECT_NE(msg.find(kNoDevice), std::string::npos) << msg;
    EXPECT_NE(msg.find("use backend cpu or reference"), std::string::npos) << msg;
  }
  EXPECT_EQ(ms::backend(), before);
}

// Host memory is never taken for device memory: with the backend set to cpu, host operands run
// on the CPU kernels whether or not a device is present.
TEST(CudaBackend, HostOperandsKeepTheSetting) {
  const ms::Backend before = ms::backend();
  ms::set_backend(ms::Backend::cpu);
  std::vector<float> v(64);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) - 20.5f;
  const ms::Quantized q = ms::quantize(ms::TensorView(v.data(), ms::DType::float32, {2, 32}), ms::QuantSpec{});
  EXPECT_EQ(q.packed.shape(), (ms::Shape{2, 16}));
  EXPECT_EQ(ms::global_scale(ms::TensorView(v.data(), ms::DType::float32, {64})), 42.5f);
  ms::set_backend(before);
}

// MICROSCALE_BACKEND=cuda: the first op runs on the device, or, without a usable one, fails with
// set_backend's message rather than running elsewhere. A fresh process (the threadsafe
// death-test style re-runs this binary) reads the environment anew.
TEST(CudaBackendDeathTest, FromTheEnvironmentRunsOrFailsAtTheFirstOp) {
  const bool device = ms::cuda::available();
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
        std::exit(ms::backend() == ms::Backend::cuda ? 0 : 3);
      },
      testing::ExitedWithCode(device ? 0 : 2), device ? "" : kNoDevice);
  unsetenv("MICROSCALE_BACKEND");
}

}  // namespace
