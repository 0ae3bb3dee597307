// linear (matmul.hpp): y = x @ w^T (+ bias) for a float weight read in its own dtype. On every CPU
// target this machine runs and on the reference backend, each output is within float32's
// summation bound of the float64 sum of the same products, for weight dtypes float32, bfloat16
// and float16, rows of x 1 to 9 (the passes of four rows and their remainders), K with and without
// a vector tail; results do not depend on the thread count; bad operands are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "microscale/microscale.hpp"

namespace ms = microscale;

namespace {

// Values exactly representable in every weight dtype tested, so one float64 oracle serves all.
std::vector<float> halfable(std::int64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-255, 255);  // 8 significant bits: bfloat16 holds them
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& f : v) f = static_cast<float>(d(rng)) / 128.0f;
  return v;
}

ms::Tensor as_dtype(const std::vector<float>& v, ms::DType dtype, ms::Shape shape) {
  ms::Tensor t = ms::Tensor::uninitialized(dtype, std::move(shape));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (dtype == ms::DType::float32) {
      std::memcpy(t.bytes() + 4 * i, &v[i], 4);
      continue;
    }
    const std::uint16_t h = dtype == ms::DType::bfloat16 ? ms::encode_bf16(v[i]) : ms::encode_f16(v[i]);
    std::memcpy(t.bytes() + 2 * i, &h, 2);
  }
  return t;
}

float element(const ms::Tensor& t, std::int64_t i) {
  std::uint16_t h;
  if (t.dtype() == ms::DType::float32) return t.data<float>()[i];
  std::memcpy(&h, t.bytes() + 2 * i, 2);
  return t.dtype() == ms::DType::bfloat16 ? ms::decode_bf16(h) : ms::decode_f16(h);
}

void expect_within_bound(const ms::Tensor& y, const std::vector<float>& x, const std::vector<float>& w,
                         const std::vector<float>& bias, std::int64_t M, std::int64_t N, std::int64_t K) {
  const double unit = std::numeric_limits<float>::epsilon() / 2;
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double exact = bias.empty() ? 0.0 : bias[static_cast<std::size_t>(n)], magnitude = std::fabs(exact);
      for (std::int64_t k = 0; k < K; ++k) {
        const double p = double(x[static_cast<std::size_t>(m * K + k)]) * w[static_cast<std::size_t>(n * K + k)];
        exact += p;
        magnitude += std::fabs(p);
      }
      // Any order of K + 1 float32 additions: |error| <= (K + 1) u sum |terms| (to first order).
      const double bound = static_cast<double>(K + 1) * unit * magnitude * 1.01 + 1e-30;
      ASSERT_LE(std::fabs(element(y, m * N + n) - exact), bound) << "m " << m << ", n " << n;
    }
}

}  // namespace

TEST(Linear, WithinTheSummationBoundOnEveryTargetAndTheReference) {
  const std::int64_t N = 37;
  for (const std::string& target : ms::available_cpu_targets()) {
    for (ms::Backend backend : {ms::Backend::cpu, ms::Backend::reference}) {
      if (backend == ms::Backend::reference && target != ms::available_cpu_targets().front()) continue;
      ms::set_cpu_target(target);
      ms::set_backend(backend);
      for (ms::DType wdt : {ms::DType::float32, ms::DType::bfloat16, ms::DType::float16})
        for (std::int64_t K : {1, 15, 16, 100, 2048})
          for (std::int64_t M : {1, 2, 3, 4, 5, 9}) {
            SCOPED_TRACE(testing::Message() << target << " " << ms::name(backend) << " w " << ms::dtype_name(wdt)
                                            << " M " << M << " K " << K);
            const auto x = halfable(M * K, 1), w = halfable(N * K, 2), bias = halfable(N, 3);
            const ms::Tensor wt = as_dtype(w, wdt, {N, K});
            const ms::Tensor xt = as_dtype(x, ms::DType::float32, {M, K});
            const ms::TensorView bv(bias.data(), ms::DType::float32, {N});
            expect_within_bound(ms::linear(xt.view(), wt.view()), x, w, {}, M, N, K);
            expect_within_bound(ms::linear(xt.view(), wt.view(), &bv), x, w, bias, M, N, K);
          }
    }
  }
  ms::set_backend(ms::Backend::cpu);
  ms::set_cpu_target("auto");
}

TEST(Linear, ShapesAndDtypes) {
  const auto x = halfable(2 * 3 * 64, 4), w = halfable(5 * 64, 5);
  const ms::Tensor xb = as_dtype(x, ms::DType::bfloat16, {2, 3, 64});
  const ms::Tensor y = ms::linear(xb.view(), ms::TensorView(w.data(), ms::DType::float32, {5, 64}));
  EXPECT_EQ(y.dtype(), ms::DType::bfloat16);
  EXPECT_EQ(y.shape(), (ms::Shape{2, 3, 5}));
  const ms::Tensor one = ms::linear(ms::TensorView(x.data(), ms::DType::float32, {64}),
                                    ms::TensorView(w.data(), ms::DType::float32, {5, 64}));
  EXPECT_EQ(one.shape(), (ms::Shape{5}));
}

TEST(Linear, StridedWeightGivesTheContiguousResult) {
  const std::int64_t M = 2, N = 5, K = 24;
  const auto x = halfable(M * K, 8), w = halfable(N * K, 9);
  const ms::TensorView xv(x.data(), ms::DType::float32, {M, K});
  std::vector<float> wt(static_cast<std::size_t>(K * N));  // w stored transposed, viewed back as [N, K]
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t k = 0; k < K; ++k)
      wt[static_cast<std::size_t>(k * N + n)] = w[static_cast<std::size_t>(n * K + k)];
  const ms::TensorView strided(wt.data(), ms::DType::float32, {N, K}, {1, N});
  const ms::Tensor want = ms::linear(xv, ms::TensorView(w.data(), ms::DType::float32, {N, K}));
  const ms::Tensor got = ms::linear(xv, strided);
  EXPECT_EQ(std::memcmp(want.bytes(), got.bytes(), want.nbytes()), 0);
}

TEST(Linear, SameBytesForEveryThreadCount) {
  const std::int64_t M = 3, N = 300, K = 520;
  const auto x = halfable(M * K, 6), w = halfable(N * K, 7);
  const ms::Tensor wt = as_dtype(w, ms::DType::bfloat16, {N, K});
  const ms::TensorView xv(x.data(), ms::DType::float32, {M, K});
  ms::set_num_threads(1);
  const ms::Tensor one = ms::linear(xv, wt.view());
  for (int t : {2, 3, 8}) {
    ms::set_num_threads(t);
    const ms::Tensor many = ms::linear(xv, wt.view());
    EXPECT_EQ(std::memcmp(one.bytes(), many.bytes(), one.nbytes()), 0) << t << " threads";
  }
  ms::set_num_threads(0);
}

TEST(Linear, RefusesBadOperandsByName) {
  const std::vector<float> x(64), w(5 * 64), b(4);
  const ms::TensorView xv(x.data(), ms::DType::float32, {1, 64});
  auto refused = [](auto&& call, const std::string& words) {
    try {
      call();
      ADD_FAILURE() << "accepted; expected: " << words;
    } catch (const ms::Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused([&] { ms::linear(xv, ms::TensorView(w.data(), ms::DType::uint8, {5, 64})); }, "linear: w must be float");
  refused([&] { ms::linear(xv, ms::TensorView(w.data(), ms::DType::float32, {5, 32})); }, "must equal w's K");
  refused([&] { ms::linear(xv, ms::TensorView(w.data(), ms::DType::float32, {320})); }, "w must be 2-D");
  const ms::TensorView bad_bias(b.data(), ms::DType::float32, {4});
  refused(
      [&] {
        ms::linear(xv, ms::TensorView(w.data(), ms::DType::float32, {5, 64}), &bad_bias);
      },
      "linear: bias must have shape");
  refused([&] { ms::linear(ms::TensorView(x.data(), ms::DType::int32, {1, 64}), xv); }, "linear: x must be float");
}
