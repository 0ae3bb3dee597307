// Threads: results never depend on the thread count, and concurrent calls from several user
// threads neither crash nor change results.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

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
