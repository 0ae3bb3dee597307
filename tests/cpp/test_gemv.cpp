// The GEMV: quantized_matmul with up to 8 rows of x against W stored [N, K], on every backend
// configuration (the reference and the CPU backend forced to each SIMD target), against float64
// sums of x times dequantize(W). Every mode with a fused kernel (nvfp4 two- and three-level,
// mxfp4, mxfp8 E4M3 and E5M2, affine 4 and 8 bits with each group size) and the affine widths
// that decode through dequantize; rows of x 1..8 in float32, bfloat16 and float16; K a whole
// number of decode steps or not; activations so small or so large that the kernels leave their
// rescaled fast paths; NaN and Inf codes, scales and activations; row results independent of
// the neighbouring rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "microscale/microscale.hpp"
#include "support.hpp"

namespace ms = microscale;
using ms::DType;
using ms::Mode;
using ms::QuantSpec;
using ms::TensorView;

namespace {

struct Case {
  std::string name;
  QuantSpec spec;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  QuantSpec s;
  s.mode = Mode::nvfp4;
  out.push_back({"nvfp4", s});
  out.push_back({"nvfp4-3level", s});  // global scale set per weight below
  s.mode = Mode::mxfp4;
  out.push_back({"mxfp4", s});
  s.mode = Mode::mxfp8;
  out.push_back({"mxfp8-e4m3", s});
  s.elem = ms::Elem::e5m2;
  out.push_back({"mxfp8-e5m2", s});
  for (int bits : {4, 8, 2, 3, 5, 6})
    for (int gs : {32, 64, 128}) {
      if (bits != 4 && bits != 8 && gs != 64) continue;  // the generic path: one group size
      QuantSpec a;
      a.mode = Mode::affine;
      a.bits = bits;
      a.group_size = gs;
      out.push_back({"affine" + std::to_string(bits) + "-g" + std::to_string(gs), a});
    }
  return out;
}

std::vector<float> randn(std::size_t n, std::uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// x rows [M, K] in dtype t: the stored bytes and their exact float32 values.
struct X {
  std::vector<std::byte> bytes;
  std::vector<float> f32;
  DType dtype;
  TensorView view(std::int64_t M, std::int64_t K) const { return TensorView(bytes.data(), dtype, {M, K}); }
};
float load(const std::byte* p, DType t) {
  if (t == DType::float32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return t == DType::bfloat16 ? ms::decode_bf16(h) : ms::decode_f16(h);
}

X make_x(const std::vector<float>& v, DType t) {
  const std::size_t es = ms::dtype_size(t);
  X x{std::vector<std::byte>(v.size() * es), std::vector<float>(v.size()), t};
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == DType::float32) {
      std::memcpy(x.bytes.data() + i * es, &v[i], 4);
    } else {
      const std::uint16_t h = t == DType::bfloat16 ? ms::encode_bf16(v[i]) : ms::encode_f16(v[i]);
      std::memcpy(x.bytes.data() + i * es, &h, 2);
    }
    x.f32[i] = load(x.bytes.data() + i * es, t);
  }
  return x;
}

std::vector<float> as_f32(const ms::Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = load(t.bytes() + i * ms::dtype_size(t.dtype()), t.dtype());
  return out;
}

// y against sum_k x[m, k] w[n, k] in float64. The budget is the float32 error any summation
// order may make, K * 2^-24 * sum_k |x| (|w| + 2 |b|) (affine factors the bias out of the sum,
// so its terms count), plus the absolute error of products in the subnormal range and the final
// rounding to the output dtype.
void expect_gemv(const std::vector<float>& y, DType out, const X& x, const std::vector<float>& w,
                 const std::vector<float>& bias_per_weight, std::int64_t M, std::int64_t N, std::int64_t K) {
  const double out_ulp = out == DType::bfloat16 ? 0x1p-8 : out == DType::float16 ? 0x1p-11 : 0.0;
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double sum = 0, mag = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double xv = x.f32[static_cast<std::size_t>(m * K + k)];
        const double wv = w[static_cast<std::size_t>(n * K + k)];
        const double bv = bias_per_weight.empty() ? 0.0 : bias_per_weight[static_cast<std::size_t>(n * K + k)];
        sum += xv * wv;
        mag += std::fabs(xv) * (std::fabs(wv) + 2 * std::fabs(bv));
      }
      const double got = y[static_cast<std::size_t>(m * N + n)];
      const std::string where = "m=" + std::to_string(m) + " n=" + std::to_string(n);
      if (std::isnan(sum)) {
        EXPECT_TRUE(std::isnan(got)) << where << " got " << got;
        continue;
      }
      if (std::isinf(sum)) {
        EXPECT_EQ(got, sum) << where;
        continue;
      }
      const double budget = double(K) * 0x1p-24 * mag + double(K) * 0x1p-149 + std::fabs(sum) * out_ulp +
                            (out == DType::float16 ? 0x1p-24 : 0.0);
      // float16 outputs from 65520 up round to Inf.
      if (out == DType::float16 && std::fabs(sum) + budget >= 65520.0) {
        if (std::fabs(sum) - budget >= 65520.0) {
          EXPECT_EQ(got, std::copysign(INFINITY, sum)) << where;
        }
        continue;
      }
      ASSERT_LE(std::fabs(got - sum), budget) << where << " got " << got << " want " << sum;
    }
}

// The affine bias of each weight (for the budget), from the quantized tensor.
std::vector<float> affine_bias(const ms::Quantized& q, std::int64_t N, std::int64_t K) {
  if (q.spec.mode != Mode::affine) return {};
  const std::vector<float> b = as_f32(q.biases);
  std::vector<float> out(static_cast<std::size_t>(N * K));
  const std::int64_t gs = q.spec.group_size;
  for (std::int64_t i = 0; i < N * K; ++i) out[static_cast<std::size_t>(i)] = b[static_cast<std::size_t>(i / gs)];
  return out;
}

ms::Quantized quantize_case(const Case& c, const std::vector<float>& w, std::int64_t N, std::int64_t K) {
  QuantSpec s = c.spec;
  const TensorView wv(w.data(), DType::float32, {N, K});
  if (c.name == "nvfp4-3level") s.global_scale = ms::global_scale(wv);
  return ms::quantize(wv, s);
}

// Weights whose rows span the float32 range by group: row n's groups scaled by 2^e(n, g).
std::vector<float> weights(std::int64_t N, std::int64_t K, std::uint32_t seed, bool wide) {
  std::vector<float> w = randn(static_cast<std::size_t>(N * K), seed, 0.05f);
  if (!wide) return w;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t k = 0; k < K; ++k) {
      const int e = static_cast<int>((n * 13 + k / 32 * 7) % 61) - 40;  // 2^-40 .. 2^20
      w[static_cast<std::size_t>(n * K + k)] *= std::ldexp(1.0f, e);
    }
  return w;
}

}  // namespace

TEST(Gemv, EveryModeRowsDtypesAndShapesMatchFloat64) {
  const std::int64_t N = 37;
  for (const Case& c : cases()) {
    // K = one group; a K that leaves a partial decode step on every target; a long one.
    const std::int64_t G = ms::resolve(c.spec).group_size;
    for (const std::int64_t K : {G, G * 3 == 96 ? std::int64_t{160} : G * 3, std::int64_t{1056} / G * G + G}) {
      const auto w = weights(N, K, static_cast<std::uint32_t>(K), c.spec.mode != Mode::affine);
      const ms::Quantized q = quantize_case(c, w, N, K);
      const std::vector<float> wd = as_f32(ms::dequantize(q, DType::float32));
      const std::vector<float> bias = affine_bias(q, N, K);
      for (const DType dt : {DType::float32, DType::bfloat16, DType::float16}) {
        for (std::int64_t M = 1; M <= 8; ++M) {
          // Each row of x at its own scale, so that mixed-up rows show.
          std::vector<float> xv = randn(static_cast<std::size_t>(M * K), static_cast<std::uint32_t>(M), 1.0f);
          for (std::int64_t i = 0; i < M * K; ++i)
            xv[static_cast<std::size_t>(i)] *= std::ldexp(1.0f, static_cast<int>(i / K));
          const X x = make_x(xv, dt);
          mst::for_each_backend([&] {
            SCOPED_TRACE(c.name + " K=" + std::to_string(K) + " M=" + std::to_string(M) + " x=" + ms::dtype_name(dt));
            const ms::Tensor y = ms::quantized_matmul(x.view(M, K), q, true);
            ASSERT_EQ(y.shape(), (ms::Shape{M, N}));
            expect_gemv(as_f32(y), y.dtype(), x, wd, bias, M, N, K);
          });
        }
      }
    }
  }
}

// Activations below 2^-101 (the fp4 kernel then leaves x unscaled) and above 256 (the E4M3 kernel
// then keeps its rebias multiply), mixed with ordinary ones, and subnormal ones.
TEST(Gemv, ActivationsOutsideTheRescaledRange) {
  const std::int64_t N = 21, K = 192;
  for (const Case& c : cases()) {
    if (c.spec.mode == Mode::affine) continue;
    const auto w = weights(N, K, 5, false);
    const ms::Quantized q = quantize_case(c, w, N, K);
    const std::vector<float> wd = as_f32(ms::dequantize(q, DType::float32));
    for (const float scale : {0x1p-110f, 0x1p-130f, 300.0f, 0x1p100f}) {
      std::vector<float> xv = randn(static_cast<std::size_t>(3 * K), 9, 1.0f);
      for (std::size_t i = 0; i < xv.size(); i += 5) xv[i] *= scale;  // some rows' values only
      const X x = make_x(xv, DType::float32);
      mst::for_each_backend([&] {
        SCOPED_TRACE(c.name + " scale=" + std::to_string(std::log2(scale)));
        expect_gemv(as_f32(ms::quantized_matmul(x.view(3, K), q, true)), DType::float32, x, wd, {}, 3, N, K);
      });
    }
  }
}

// NaN and Inf codes in mxfp8 rows (E4M3 0x7F/0xFF; E5M2 Inf 0x7C/0xFC and NaN 0x7D..0x7F), NaN
// block scales, and NaN and Inf activations: the result is NaN or Inf exactly where the float64
// sum is.
TEST(Gemv, NonFiniteCodesScalesAndActivations) {
  const std::int64_t N = 12, K = 256;
  for (const Case& c : cases()) {
    if (c.spec.mode == Mode::affine) continue;
    const auto w = weights(N, K, 11, false);
    ms::Quantized q = quantize_case(c, w, N, K);
    auto* packed = q.packed.data<std::uint8_t>();
    auto* scales = q.scales.data<std::uint8_t>();
    const std::int64_t row_bytes = q.packed.shape()[1], groups = q.scales.shape()[1];
    const bool nv = c.spec.mode == Mode::nvfp4;
    scales[1 * groups + 3] = nv ? 0x7F : 0xFF;  // NaN scale
    if (c.spec.mode == Mode::mxfp8) {
      const bool e5m2 = c.spec.elem == ms::Elem::e5m2;
      packed[2 * row_bytes + 5] = e5m2 ? 0x7C : 0x7F;              // +Inf / NaN
      packed[3 * row_bytes + row_bytes - 1] = e5m2 ? 0xFC : 0xFF;  // -Inf / NaN, the last code
      packed[4 * row_bytes + 40] = e5m2 ? 0x7C : 0x00;             // +Inf and -Inf: NaN
      packed[4 * row_bytes + 200] = e5m2 ? 0xFC : 0x00;
      packed[5 * row_bytes + 70] = e5m2 ? 0x7E : 0x7F;  // NaN
    }
    const std::vector<float> wd = as_f32(ms::dequantize(q, DType::float32));
    std::vector<float> xv = randn(static_cast<std::size_t>(4 * K), 12, 1.0f);
    xv[1 * K + 17] = std::numeric_limits<float>::infinity();
    xv[2 * K + 33] = std::numeric_limits<float>::quiet_NaN();
    xv[3 * K + 1] = 0.0f;  // 0 times an Inf weight is NaN
    const X x = make_x(xv, DType::float32);
    mst::for_each_backend([&] {
      SCOPED_TRACE(c.name);
      expect_gemv(as_f32(ms::quantized_matmul(x.view(4, K), q, true)), DType::float32, x, wd, {}, 4, N, K);
    });
  }
}

// Three-level nvfp4 where a factor taken apart (the E4M3 value times the partial sum, the row's sum
// times amax * C2688) would overflow where dequantize's (val(s) * amax) * C2688 does not, or the
// reverse: a global scale of 2^125 (factors of scale 448 are Inf, so rows turn Inf or NaN), and
// activations of 2^120 against the scale-448 block of a weight whose amax is below 1.
TEST(Gemv, Nvfp4FactorsAtTheEdgesOfFloat32) {
  const std::int64_t N = 6, K = 256;
  QuantSpec s;
  s.mode = Mode::nvfp4;
  const auto w = randn(static_cast<std::size_t>(N * K), 21, 0.05f);
  const TensorView wv(w.data(), DType::float32, {N, K});
  s.global_scale = 0x1p125f;
  ms::Quantized huge = ms::quantize(wv, s);
  auto* scales = huge.scales.data<std::uint8_t>();
  for (std::int64_t i = 0; i < huge.scales.numel(); ++i) scales[i] = static_cast<std::uint8_t>(0x30 + i % 0x4F);
  s.global_scale = ms::global_scale(wv);
  const ms::Quantized moderate = ms::quantize(wv, s);
  std::vector<float> xv = randn(static_cast<std::size_t>(2 * K), 22, 1.0f);
  for (std::int64_t k = 0; k < K; ++k) xv[static_cast<std::size_t>(K + k)] = k % 2 ? 0x1p120f : -0x1p120f;
  const X x = make_x(xv, DType::float32);
  for (const ms::Quantized* q : {static_cast<const ms::Quantized*>(&huge), &moderate}) {
    const std::vector<float> wd = as_f32(ms::dequantize(*q, DType::float32));
    const std::int64_t M = q == &huge ? 1 : 2;  // 2^120 x against 2^125 factors: beyond float32 anyway
    mst::for_each_backend([&] {
      SCOPED_TRACE(q == &huge ? "global scale 2^125" : "x = 2^120");
      expect_gemv(as_f32(ms::quantized_matmul(x.view(M, K), *q, true)), DType::float32, x, wd, {}, M, N, K);
    });
  }
}

// bfloat16 activations where K is a multiple of 128, which AVX512_BF16 CPUs multiply as bfloat16
// pairs (float32 x that is bfloat16-exact included), and the activations that keep them on the
// float32 path: a nonzero |x| below 2^-118 (the instruction could flush its products), NaN and Inf. Each row
// of x at its own scale; one nvfp4 row holds a NaN scale code.
TEST(Gemv, Bfloat16ActivationsMatchFloat64) {
  const std::int64_t N = 19;
  for (const Case& c : cases()) {
    if (c.spec.mode != Mode::nvfp4 && c.spec.mode != Mode::mxfp4) continue;
    for (const std::int64_t K : {128, 384, 2048}) {
      const auto w = weights(N, K, static_cast<std::uint32_t>(K + 1), true);
      ms::Quantized q = quantize_case(c, w, N, K);
      if (c.spec.mode == Mode::nvfp4) q.scales.data<std::uint8_t>()[5 * (K / 16) + 2] = 0xFF;
      const std::vector<float> wd = as_f32(ms::dequantize(q, DType::float32));
      for (const float odd : {1.0f, 0x1p-118f, 0x1p-119f, 0x1p-126f, 0x1p100f, NAN, INFINITY}) {
        for (const std::int64_t M : {1, 3, 4, 8}) {
          std::vector<float> xv = randn(static_cast<std::size_t>(M * K), static_cast<std::uint32_t>(M), 1.0f);
          for (std::int64_t i = 0; i < M * K; ++i)
            xv[static_cast<std::size_t>(i)] *= std::ldexp(1.0f, static_cast<int>(i / K) * 3 - 6);
          xv[static_cast<std::size_t>(K / 2)] = odd;
          if (odd == 0x1p-126f)  // a row of the smallest normals, whose products are subnormal
            for (std::int64_t k = 0; k < K; ++k) xv[static_cast<std::size_t>(k)] = k % 3 ? odd : -odd;
          xv[static_cast<std::size_t>(M * K - 1)] = 0.0f;
          // bfloat16 values either way; the tiny row's results are subnormal, which a bfloat16
          // output would round beyond the budget, so it takes float32 x (the same kernel path).
          for (const DType dt : {DType::float32, DType::bfloat16}) {
            if (odd == 0x1p-126f && dt == DType::bfloat16) break;
            const X x = make_x(make_x(xv, DType::bfloat16).f32, dt);
            mst::for_each_backend([&] {
              SCOPED_TRACE(c.name + " K=" + std::to_string(K) + " M=" + std::to_string(M) +
                           " odd=" + std::to_string(odd) + " x=" + ms::dtype_name(dt));
              const ms::Tensor y = ms::quantized_matmul(x.view(M, K), q, true);
              expect_gemv(as_f32(y), y.dtype(), x, wd, {}, M, N, K);
            });
          }
        }
      }
    }
  }
}

// A row's result does not depend on which rows are computed with it (kernels may decode rows in
// pairs, and a thread's chunk may start on either row of a pair): the GEMV of rows 1..N-1 alone,
// quantized on their own (every mode quantizes rows independently), gives bit for bit what the
// whole weight gives for those rows.
TEST(Gemv, RowResultsDoNotDependOnNeighbours) {
  const std::int64_t N = 9, K = 224;  // odd row counts on both sides; K a partial step on every target
  for (const Case& c : cases()) {
    if (c.name == "nvfp4-3level") continue;  // the global scale would differ between the two weights
    const std::int64_t G = ms::resolve(c.spec).group_size;
    const std::int64_t k = K / G * G;
    const auto w = weights(N, k, 5, c.spec.mode != Mode::affine);
    const std::vector<float> tail(w.begin() + k, w.end());
    const ms::Quantized all = quantize_case(c, w, N, k), rest = quantize_case(c, tail, N - 1, k);
    const X x = make_x(randn(static_cast<std::size_t>(k), 6, 1.0f), DType::float32);
    mst::for_each_backend([&] {
      SCOPED_TRACE(c.name);
      const std::vector<float> y_all = as_f32(ms::quantized_matmul(x.view(1, k), all, true));
      const std::vector<float> y_rest = as_f32(ms::quantized_matmul(x.view(1, k), rest, true));
      for (std::int64_t n = 1; n < N; ++n)
        EXPECT_EQ(std::memcmp(&y_all[static_cast<std::size_t>(n)], &y_rest[static_cast<std::size_t>(n - 1)], 4), 0)
            << "row " << n << ": " << y_all[static_cast<std::size_t>(n)] << " vs "
            << y_rest[static_cast<std::size_t>(n - 1)];
    });
  }
}
