// GPTQ through the C++ API (microscale/gptq.hpp; docs/numerics.md "GPTQ"): a diagonal H lets no
// error reach another column, so the bytes equal round-to-nearest's; a correlated H lowers the
// H-weighted error (the layer's output error on the calibration inputs) below round-to-nearest's;
// accumulate_hessian against a plain double sum; the result does not depend on the thread count;
// and the argument errors. The independent float64 GPTQ oracle is tests/python/test_gptq.py.
#include <random>

#include "microscale/gptq.hpp"
#include "microscale/runtime.hpp"
#include "support.hpp"

namespace {

using namespace mst;
using microscale::GptqOptions;
using microscale::HessianView;
using microscale::Mode;
using microscale::Quantized;
using microscale::QuantSpec;

// f() throws microscale::Error whose message contains `part`.
template <class F>
void expect_error(F f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing \"" << part << "\"";
  } catch (const microscale::Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

QuantSpec spec_of(Mode mode) {
  QuantSpec s;
  s.mode = mode;
  return s;
}

std::vector<float> gaussian(std::size_t n, float scale, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

void expect_same_bytes(const Quantized& a, const Quantized& b) {
  EXPECT_EQ(bytes(a.packed), bytes(b.packed));
  EXPECT_EQ(bytes(a.scales), bytes(b.scales));
  EXPECT_EQ(bytes(a.biases), bytes(b.biases));
}

// sum over rows of (w - wq) H (w - wq)^T: the squared output error on the calibration inputs.
double weighted_error(const std::vector<float>& w, const std::vector<float>& wq, const std::vector<double>& h,
                      std::int64_t n, std::int64_t k) {
  double total = 0;
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t i = 0; i < k; ++i)
      for (std::int64_t j = 0; j < k; ++j)
        total += (w[r * k + i] - wq[r * k + i]) * h[i * k + j] * (w[r * k + j] - wq[r * k + j]);
  return total;
}

// Correlated inputs: x = z @ M with M random and row-scaled by 1 / (1 + i / 8).
std::vector<float> correlated_inputs(std::int64_t rows, std::int64_t k, unsigned seed) {
  const std::vector<float> z = gaussian(static_cast<std::size_t>(rows * k), 1.0f, seed);
  const std::vector<float> m = gaussian(static_cast<std::size_t>(k * k), 1.0f, seed + 1);
  std::vector<float> x(static_cast<std::size_t>(rows * k), 0.0f);
  for (std::int64_t s = 0; s < rows; ++s)
    for (std::int64_t i = 0; i < k; ++i)
      for (std::int64_t j = 0; j < k; ++j)
        x[s * k + j] += z[s * k + i] / (1.0f + static_cast<float>(i) / 8.0f) * m[i * k + j];
  return x;
}

TEST(Gptq, DiagonalHessianIsRoundToNearest) {
  const std::int64_t n = 24, k = 128;
  const std::vector<float> w = gaussian(static_cast<std::size_t>(n * k), 0.05f, 1);
  std::vector<float> h(static_cast<std::size_t>(k * k), 0.0f);
  for (std::int64_t i = 0; i < k; ++i) h[i * k + i] = 0.5f + static_cast<float>(i % 7);
  const TensorView wv(w.data(), DType::float32, {n, k}), hv(h.data(), DType::float32, {k, k});
  for (Mode mode : {Mode::nvfp4, Mode::mxfp4, Mode::mxfp8, Mode::affine}) {
    SCOPED_TRACE(microscale::name(mode));
    expect_same_bytes(microscale::gptq(wv, hv, spec_of(mode)), microscale::quantize(wv, spec_of(mode)));
  }
  QuantSpec three = spec_of(Mode::nvfp4);
  three.global_scale = microscale::global_scale(wv);
  expect_same_bytes(microscale::gptq(wv, hv, three), microscale::quantize(wv, three));
}

TEST(Gptq, CorrelatedHessianLowersTheOutputError) {
  const std::int64_t n = 16, k = 64, samples = 512;
  const std::vector<float> w = gaussian(static_cast<std::size_t>(n * k), 0.02f, 2);
  const std::vector<float> x = correlated_inputs(samples, k, 3);
  std::vector<double> h(static_cast<std::size_t>(k * k), 0.0);
  microscale::accumulate_hessian(TensorView(x.data(), DType::float32, {samples, k}), h);
  const TensorView wv(w.data(), DType::float32, {n, k});
  for (Mode mode : {Mode::nvfp4, Mode::mxfp4, Mode::affine}) {
    SCOPED_TRACE(microscale::name(mode));
    const Quantized g = microscale::gptq(wv, HessianView{h.data(), {k, k}}, spec_of(mode));
    const Quantized r = microscale::quantize(wv, spec_of(mode));
    const double eg = weighted_error(w, values(microscale::dequantize(g, DType::float32)), h, n, k);
    const double er = weighted_error(w, values(microscale::dequantize(r, DType::float32)), h, n, k);
    EXPECT_LT(eg, 0.8 * 0.8 * er);  // output error (the square root) at least 20% lower
  }
}

TEST(Gptq, AccumulateHessianSumsBatches) {
  const std::int64_t k = 40;
  const std::vector<float> a = gaussian(static_cast<std::size_t>(30 * k), 1.0f, 4);
  const std::vector<float> b = gaussian(static_cast<std::size_t>(7 * k), 1.0f, 5);
  std::vector<double> h(static_cast<std::size_t>(k * k), 0.0);
  microscale::accumulate_hessian(TensorView(a.data(), DType::float32, {3, 10, k}), h);
  microscale::accumulate_hessian(TensorView(b.data(), DType::float32, {7, k}), h);
  for (std::int64_t i = 0; i < k; ++i)
    for (std::int64_t j = 0; j < k; ++j) {
      double want = 0;
      for (std::int64_t s = 0; s < 30; ++s) want += static_cast<double>(a[s * k + i]) * a[s * k + j];
      for (std::int64_t s = 0; s < 7; ++s) want += static_cast<double>(b[s * k + i]) * b[s * k + j];
      EXPECT_NEAR(h[i * k + j], want, 1e-9 * (1 + std::abs(want)));
      EXPECT_EQ(h[i * k + j], h[j * k + i]);
    }
}

TEST(Gptq, ThreadCountDoesNotChangeTheResult) {
  // Sizes that are not multiples of the blocked steps' tiles (rows per chunk, factorization
  // panels, column blocks, sample runs), so that edge tiles run on every thread count.
  const std::int64_t n = 150, k = 352, samples = 300;
  const std::vector<float> w = gaussian(static_cast<std::size_t>(n * k), 0.02f, 6);
  const std::vector<float> x = correlated_inputs(samples, k, 7);
  const TensorView wv(w.data(), DType::float32, {n, k}), xv(x.data(), DType::float32, {samples, k});
  QuantSpec nvfp4 = spec_of(Mode::nvfp4);
  nvfp4.global_scale = 0.08f;
  auto run = [&](int threads) {
    microscale::set_num_threads(threads);
    std::vector<double> h(static_cast<std::size_t>(k * k), 0.0);
    microscale::accumulate_hessian(xv, h);
    const Quantized mx = microscale::gptq(wv, HessianView{h.data(), {k, k}}, spec_of(Mode::mxfp4));
    const Quantized nv = microscale::gptq(wv, HessianView{h.data(), {k, k}}, nvfp4);
    microscale::set_num_threads(0);
    return std::make_tuple(h, mx, nv);
  };
  const auto [h1, mx1, nv1] = run(1);
  for (const int threads : {2, 3}) {
    const auto [h, mx, nv] = run(threads);
    EXPECT_EQ(h1, h) << threads << " threads";
    expect_same_bytes(mx1, mx);
    expect_same_bytes(nv1, nv);
  }
}

TEST(Gptq, ArgumentErrorsNameTheArgument) {
  const std::int64_t n = 4, k = 32;
  std::vector<float> w = gaussian(static_cast<std::size_t>(n * k), 1.0f, 8);
  std::vector<double> h(static_cast<std::size_t>(k * k), 0.0);
  for (std::int64_t i = 0; i < k; ++i) h[i * k + i] = 1.0;
  const TensorView wv(w.data(), DType::float32, {n, k});
  const QuantSpec mx = spec_of(Mode::mxfp4);
  expect_error(
      [&] {
        microscale::gptq(wv, HessianView{h.data(), {k, k + 1}}, mx);
      },
      "hessian must have shape [K, K] = [32, 32]");
  std::vector<double> bad = h;
  bad[5 * k + 5] = std::numeric_limits<double>::infinity();
  expect_error([&] { microscale::gptq(wv, HessianView{bad.data(), {k, k}}, mx); }, "hessian holds a non-finite value");
  bad = h;
  bad[3 * k + 3] = -4.0;
  expect_error([&] { microscale::gptq(wv, HessianView{bad.data(), {k, k}}, mx); }, "not positive definite");
  expect_error(
      [&] {
        microscale::gptq(wv, HessianView{h.data(), {k, k}}, mx, GptqOptions{0.01, 16});
      },
      "block_size must be a positive multiple of the group size 32");
  const std::vector<std::uint8_t> codes(static_cast<std::size_t>(k * k));
  expect_error(
      [&] {
        microscale::gptq(wv, TensorView(codes.data(), DType::uint8, {k, k}), mx);
      },
      "hessian must be float32");
  QuantSpec nv = spec_of(Mode::nvfp4);
  nv.scale_2d = true;
  expect_error([&] { microscale::gptq(wv, HessianView{h.data(), {k, k}}, nv); }, "scale_2d does not combine with GPTQ");
  nv.scale_2d = false;
  nv.sr_seed = 7;
  expect_error([&] { microscale::gptq(wv, HessianView{h.data(), {k, k}}, nv); }, "sr_seed does not combine with GPTQ");
  w[7] = kNaN;
  expect_error([&] { microscale::gptq(wv, HessianView{h.data(), {k, k}}, mx); }, "w holds a non-finite value");
  std::vector<double> small(10);
  expect_error([&] { microscale::accumulate_hessian(wv, small); }, "hessian must hold [K, K] = 1024 values");
}

}  // namespace
