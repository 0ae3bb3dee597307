// quantized_matmul, qqmm and gather_qmm against a float64 oracle built from dequantize.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "microscale/microscale.hpp"
#include "support.hpp"

namespace ms = microscale;
using ms::DType;
using ms::Mode;
using ms::QuantSpec;
using ms::Shape;
using ms::TensorView;

namespace {

std::vector<float> randn(std::int64_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

TensorView f32(const std::vector<float>& v, Shape shape) { return TensorView(v.data(), DType::float32, shape); }

std::vector<float> values(const ms::Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    switch (t.dtype()) {
      case DType::float16: out[i] = ms::decode_f16(t.data<std::uint16_t>()[i]); break;
      case DType::bfloat16: out[i] = ms::decode_bf16(t.data<std::uint16_t>()[i]); break;
      default: out[i] = t.data<float>()[i];
    }
  }
  return out;
}

QuantSpec spec_for(Mode mode, int group = 0, int bits = 0) {
  QuantSpec s;
  s.mode = mode;
  s.group_size = group;
  s.bits = bits;
  return s;
}

// y64[m, n] = sum_k x[m, k] * w(n, k) in float64, plus the float32 error budget per element:
// K * 2^-24 * sum_k |x w| (any f32 summation order stays inside it).
struct Oracle {
  std::vector<double> y, budget;
};
Oracle oracle(const std::vector<float>& x, const std::vector<float>& w, std::int64_t M, std::int64_t N, std::int64_t K,
              bool transpose) {
  Oracle o;
  o.y.assign(static_cast<std::size_t>(M * N), 0.0);
  o.budget.assign(static_cast<std::size_t>(M * N), 0.0);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double acc = 0, mag = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double p = double(x[m * K + k]) * double(transpose ? w[n * K + k] : w[k * N + n]);
        acc += p;
        mag += std::fabs(p);
      }
      o.y[m * N + n] = acc;
      o.budget[m * N + n] = double(K) * std::ldexp(1.0, -24) * mag + 1e-30;
    }
  return o;
}

void expect_close(const std::vector<float>& got, const Oracle& o, std::size_t offset = 0) {
  double err2 = 0, ref2 = 0;
  for (std::size_t i = 0; i < o.y.size(); ++i) {
    const double g = got[offset + i];
    ASSERT_LE(std::fabs(g - o.y[i]), o.budget[i]) << "element " << i << " got " << g << " want " << o.y[i];
    err2 += (g - o.y[i]) * (g - o.y[i]);
    ref2 += o.y[i] * o.y[i];
  }
  if (ref2 > 0) {
    EXPECT_LE(std::sqrt(err2 / ref2), 1e-5);
  }
}

const Mode kAllModes[] = {Mode::nvfp4, Mode::mxfp4, Mode::mxfp8, Mode::affine};

}  // namespace

TEST(QuantizedMatmul, EveryModeBothOrientationsMatchesFloat64) {
  for (Mode mode : kAllModes) {
    for (bool transpose : {true, false}) {
      for (std::int64_t M : {1, 3, 1000}) {
        // K a multiple of the group but not of 64 where the group allows it.
        const std::int64_t K = mode == Mode::nvfp4 ? 80 : 96, N = mode == Mode::nvfp4 ? 48 : 32;
        const auto x = randn(M * K, 1), w = randn(N * K, 2, 0.05f);
        QuantSpec s = spec_for(mode, mode == Mode::affine ? 32 : 0);
        if (mode == Mode::nvfp4) s.global_scale = ms::global_scale(f32(w, {N, K}));
        const Shape stored = transpose ? Shape{N, K} : Shape{K, N};
        const auto q = ms::quantize(f32(w, stored), s);
        const auto wd = values(ms::dequantize(q, DType::float32));
        const auto y = ms::quantized_matmul(f32(x, {M, K}), q, transpose);
        ASSERT_EQ(y.shape(), (Shape{M, N}));
        SCOPED_TRACE(std::string(ms::name(mode)) + (transpose ? " T" : " N") + " M=" + std::to_string(M));
        expect_close(values(y), oracle(x, wd, M, N, K, transpose));
      }
    }
  }
}

// The CPU GEMM blocks x by 512 rows in strips of 2 vectors, W by panels of 128 output columns and
// 256 K values, in register tiles of 6 or 8 weight rows: shapes with partial blocks, strips,
// panels and tiles at every level, on every backend and target.
TEST(QuantizedMatmul, GemmBlockingOnEveryBackend) {
  const std::int64_t M = 530, K = 640, N = 320;  // N a multiple of 64 for the untransposed weight
  const auto x = randn(M * K, 11), w = randn(N * K, 12, 0.05f);
  for (Mode mode : {Mode::nvfp4, Mode::mxfp4, Mode::affine}) {
    QuantSpec s = spec_for(mode, mode == Mode::affine ? 64 : 0, mode == Mode::affine ? 4 : 0);
    if (mode == Mode::nvfp4) s.global_scale = ms::global_scale(f32(w, {N, K}));
    for (bool transpose : {true, false}) {
      const auto q = ms::quantize(f32(w, transpose ? Shape{N, K} : Shape{K, N}), s);
      const Oracle o = oracle(x, values(ms::dequantize(q, DType::float32)), M, N, K, transpose);
      for (const mst::BackendConfig& c : mst::backend_configs()) {
        SCOPED_TRACE(std::string(ms::name(mode)) + (transpose ? " T " : " N ") + c.label);
        const mst::UseBackend use(c);
        expect_close(values(ms::quantized_matmul(f32(x, {M, K}), q, transpose)), o);
      }
    }
  }
}

// The fp4 GEMV (M <= 4) decodes K in 128-value blocks and then 32-value leftovers: every mix of
// the two, rows of x 1..4, an odd N for the thread split, and groups scaled across the whole
// float32 range (mx scales down to 2^-127 make subnormal weights) or zero.
TEST(QuantizedMatmul, Fp4GemvBlocksLeftoversAndScaleRange) {
  for (Mode mode : {Mode::nvfp4, Mode::mxfp4}) {
    for (bool global : {false, true}) {
      if (mode == Mode::mxfp4 && global) continue;
      for (std::int64_t K : {32, 128, 224, 544}) {
        const std::int64_t N = 37;
        auto w = randn(N * K, 21, 0.05f);
        for (std::int64_t n = 0; n < N; ++n) {  // row n's groups at 2^(-140 .. +100) or 0
          const int e = -140 + static_cast<int>((n * 7) % 241);
          for (std::int64_t k = 0; k < 32; ++k) w[n * K + (k + n * 32) % K] *= n % 5 == 4 ? 0.0f : std::ldexp(1.0f, e);
        }
        QuantSpec s = spec_for(mode);
        if (global) s.global_scale = ms::global_scale(f32(w, {N, K}));
        const auto q = ms::quantize(f32(w, {N, K}), s);
        const auto wd = values(ms::dequantize(q, DType::float32));
        for (std::int64_t M = 1; M <= 4; ++M) {
          const auto x = randn(M * K, 22);
          SCOPED_TRACE(std::string(ms::name(mode)) + (global ? " global" : "") + " K=" + std::to_string(K) +
                       " M=" + std::to_string(M));
          expect_close(values(ms::quantized_matmul(f32(x, {M, K}), q, true)), oracle(x, wd, M, N, K, true));
        }
      }
    }
  }
}

// Hostile scale codes: NaN ones poison their row; negative and subnormal E4M3 ones decode as
// dequantize decodes them.
TEST(QuantizedMatmul, Fp4GemvOddScaleCodes) {
  for (Mode mode : {Mode::nvfp4, Mode::mxfp4}) {
    const std::int64_t N = 3, K = 160;
    auto q = ms::quantize(f32(randn(N * K, 23), {N, K}), spec_for(mode));
    const std::int64_t groups = K / q.spec.group_size;
    auto* codes = q.scales.data<std::uint8_t>();
    const std::uint8_t nan = mode == Mode::nvfp4 ? 0x7F : 0xFF;
    codes[1 * groups + 1] = nan;                            // inside the first 128-value block
    codes[2 * groups + groups - 1] = nan;                   // in the leftover 32-value chunk
    codes[0] = mode == Mode::nvfp4 ? 0xB5 : 0x00;           // negative E4M3; E8M0's subnormal 2^-127
    codes[groups - 1] = mode == Mode::nvfp4 ? 0x01 : 0xF8;  // subnormal E4M3; E8M0 2^121
    const auto x = randn(K, 24);
    const auto y = values(ms::quantized_matmul(f32(x, {1, K}), q, true));
    const auto wd = values(ms::dequantize(q, DType::float32));
    SCOPED_TRACE(ms::name(mode));
    EXPECT_TRUE(std::isnan(y[1]));
    EXPECT_TRUE(std::isnan(y[2]));
    const Oracle o = oracle(x, std::vector<float>(wd.begin(), wd.begin() + K), 1, 1, K, true);
    expect_close(std::vector<float>{y[0]}, o);
  }
}

TEST(QuantizedMatmul, BatchBroadcastAgainstWeightBatch) {
  const std::int64_t B = 3, M = 2, N = 16, K = 64;
  const auto x = randn(2 * 1 * M * K, 3), w = randn(B * N * K, 4);
  const auto q = ms::quantize(f32(w, {1, B, N, K}), spec_for(Mode::mxfp8));
  const auto wd = values(ms::dequantize(q, DType::float32));
  const auto y = ms::quantized_matmul(f32(x, {2, 1, M, K}), q, true);
  ASSERT_EQ(y.shape(), (Shape{1 * 2, B, M, N}));
  const auto yv = values(y);
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t b = 0; b < B; ++b) {
      const std::vector<float> xi(x.begin() + i * M * K, x.begin() + (i + 1) * M * K);
      const std::vector<float> wb(wd.begin() + b * N * K, wd.begin() + (b + 1) * N * K);
      expect_close(yv, oracle(xi, wb, M, N, K, true), static_cast<std::size_t>((i * B + b) * M * N));
    }
}

TEST(QuantizedMatmul, HalfActivationsAccumulateInFloat32) {
  // K = 4096 products of 1 * 0.3-ish weights: a bf16 accumulator would stall far below the sum.
  const std::int64_t K = 4096, N = 4;
  std::vector<float> w(static_cast<std::size_t>(N * K), 0.3f);
  const auto q = ms::quantize(f32(w, {N, K}), spec_for(Mode::nvfp4));
  const auto wd = values(ms::dequantize(q, DType::float32));
  std::vector<std::uint16_t> xb(static_cast<std::size_t>(K), ms::encode_bf16(1.0f));
  const auto y = ms::quantized_matmul(TensorView(xb.data(), DType::bfloat16, {1, K}), q, true);
  ASSERT_EQ(y.dtype(), DType::bfloat16);
  double exact = 0;
  for (std::int64_t k = 0; k < K; ++k) exact += wd[static_cast<std::size_t>(k)];
  EXPECT_EQ(values(y)[0], ms::decode_bf16(ms::encode_bf16(static_cast<float>(exact))));
}

TEST(QuantizedMatmul, Float16WithTinyGlobalScaleDoesNotOverflow) {
  const std::int64_t M = 8, N = 32, K = 4096;
  auto w = randn(N * K, 5);
  const float amax_raw = ms::global_scale(f32(w, {N, K}));
  for (float& v : w) v *= 1e-4f / amax_raw;
  QuantSpec s = spec_for(Mode::nvfp4);
  s.global_scale = ms::global_scale(f32(w, {N, K}));
  const auto q = ms::quantize(f32(w, {N, K}), s);
  const auto xf = randn(M * K, 6, 30.0f);
  std::vector<std::uint16_t> xh(xf.size());
  for (std::size_t i = 0; i < xf.size(); ++i) xh[i] = ms::encode_f16(xf[i]);
  const auto y = ms::quantized_matmul(TensorView(xh.data(), DType::float16, {M, K}), q, true);
  for (float v : values(y)) ASSERT_TRUE(std::isfinite(v));
  std::vector<float> xr(xf.size());
  for (std::size_t i = 0; i < xf.size(); ++i) xr[i] = ms::decode_f16(xh[i]);
  const auto o = oracle(xr, values(ms::dequantize(q, DType::float32)), M, N, K, true);
  const auto yv = values(y);
  for (std::size_t i = 0; i < yv.size(); ++i) EXPECT_NEAR(yv[i], o.y[i], o.budget[i] + std::fabs(o.y[i]) * 1e-3);
}

TEST(QuantizedMatmul, EmptyRowsAndBias) {
  const std::int64_t N = 16, K = 32;
  const auto w = randn(N * K, 7);
  const auto q = ms::quantize(f32(w, {N, K}), spec_for(Mode::mxfp4));
  std::vector<float> none;
  const auto y = ms::quantized_matmul(TensorView(none.data(), DType::float32, {0, K}), q, true);
  EXPECT_EQ(y.shape(), (Shape{0, N}));
  const auto x = randn(K, 8), bias = randn(N, 9);
  const TensorView bv = f32(bias, {N});
  const auto yb = values(ms::quantized_matmul(f32(x, {K}), q, true, &bv));
  const auto y0 = values(ms::quantized_matmul(f32(x, {K}), q, true));
  ASSERT_EQ(yb.size(), static_cast<std::size_t>(N));
  for (std::int64_t n = 0; n < N; ++n) EXPECT_EQ(yb[n], y0[n] + bias[n]);
}

TEST(QuantizedMatmul, ClearErrors) {
  const auto w = randn(16 * 64, 10);
  const auto q = ms::quantize(f32(w, {16, 64}), spec_for(Mode::nvfp4));
  const auto x = randn(2 * 48, 11);
  EXPECT_THROW(ms::quantized_matmul(f32(x, {2, 48}), q, true), ms::Error);  // K mismatch
  std::vector<std::int32_t> xi(128);
  EXPECT_THROW(ms::quantized_matmul(TensorView(xi.data(), DType::int32, {2, 64}), q, true), ms::Error);
  const auto bad_scales = ms::Tensor(DType::uint8, {16, 3});
  const auto x2 = randn(2 * 64, 12);
  EXPECT_THROW(ms::quantized_matmul(f32(x2, {2, 64}), q.packed.view(), bad_scales.view(), nullptr, true, q.spec),
               ms::Error);
  const auto xb = randn(3 * 2 * 64, 13);
  const auto q3 = ms::quantize(f32(randn(2 * 16 * 64, 14), {2, 16, 64}), spec_for(Mode::nvfp4));
  EXPECT_THROW(ms::quantized_matmul(f32(xb, {3, 2, 64}), q3, true), ms::Error);  // batch 3 vs 2
}

TEST(Qqmm, MatchesBlockExactFormulaForAnyM) {
  for (Mode mode : {Mode::nvfp4, Mode::mxfp4, Mode::mxfp8}) {
    for (bool global : {false, true}) {
      if (global && mode != Mode::nvfp4) continue;
      const std::int64_t M = 37, N = 24, K = 96;
      const auto x = randn(2 * M * K, 15), w = randn(N * K, 16, 0.02f);
      std::optional<float> gx, gw;
      if (global) {
        gx = ms::global_scale(f32(x, {2, M, K}));
        gw = ms::global_scale(f32(w, {N, K}));
      }
      const QuantSpec s = spec_for(mode);
      const auto y = ms::qqmm(f32(x, {2, M, K}), f32(w, {N, K}), nullptr, s, gx, gw);
      ASSERT_EQ(y.shape(), (Shape{2, M, N}));
      QuantSpec sx = s, sw = s;
      sx.global_scale = gx;
      sw.global_scale = gw;
      const auto xd = values(ms::dequantize(ms::quantize(f32(x, {2 * M, K}), sx), DType::float32));
      const auto wd = values(ms::dequantize(ms::quantize(f32(w, {N, K}), sw), DType::float32));
      SCOPED_TRACE(std::string(ms::name(mode)) + (global ? " three-level" : ""));
      expect_close(values(y), oracle(xd, wd, 2 * M, N, K, true));
      // Prequantized w gives the same bits as float w.
      const auto qw = ms::quantize(f32(w, {N, K}), sw);
      const auto scales = qw.scales.view();
      const auto y2 = ms::qqmm(f32(x, {2, M, K}), qw.packed.view(), &scales, s, gx, gw);
      ASSERT_EQ(values(y2), values(y));
    }
  }
}

TEST(Qqmm, GlobalScalesAreHonoured) {
  // x = 1, w = 0.3 along K = 4096 with both global scales: the answer is ~4096 * 0.3, not
  // 2688^2 / (amax_x * amax_w) times that.
  const std::int64_t K = 4096;
  std::vector<float> x(static_cast<std::size_t>(K), 1.0f), w(static_cast<std::size_t>(K), 0.3f);
  const auto y = values(ms::qqmm(f32(x, {1, K}), f32(w, {1, K}), nullptr, spec_for(Mode::nvfp4), 1.0f, 0.3f));
  EXPECT_NEAR(y[0], 4096 * 0.3, 4096 * 0.3 * 0.05);
  EXPECT_THROW(ms::qqmm(f32(x, {1, K}), f32(w, {1, K}), nullptr, spec_for(Mode::nvfp4), 1.0f, std::nullopt), ms::Error);
  EXPECT_THROW(ms::qqmm(f32(x, {1, K}), f32(w, {1, K}), nullptr, spec_for(Mode::affine)), ms::Error);
  EXPECT_THROW(ms::qqmm(f32(x, {1, 32}), f32(w, {1, K}), nullptr, spec_for(Mode::mxfp8)), ms::Error);
}

TEST(GatherQmm, MixtureOfExpertsTop2MatchesLoop) {
  for (std::int64_t E : {4, 16, 64}) {
    for (bool sorted : {false, true}) {
      const std::int64_t T = 12, N = 32, K = 64, top = 2;
      const auto w = randn(E * N * K, 17);
      const auto q = ms::quantize(f32(w, {E, N, K}), spec_for(Mode::affine));
      const auto x = randn(T * K, 18);
      std::mt19937 rng(static_cast<std::uint32_t>(E));
      // Experts 0 and 1 never chosen when E > 4: empty experts must be harmless.
      std::uniform_int_distribution<std::int32_t> pick(E > 4 ? 2 : 0, static_cast<std::int32_t>(E - 1));
      std::vector<std::int32_t> idx(static_cast<std::size_t>(T * top));
      for (auto& i : idx) i = pick(rng);
      if (sorted) std::sort(idx.begin(), idx.end());
      const TensorView rhs(idx.data(), DType::int32, {T, top});
      const auto xv = f32(x, {T, 1, 1, K});
      const auto biases = q.biases.view();
      const auto y = ms::gather_qmm(xv, q.packed.view(), q.scales.view(), &biases, nullptr, &rhs, true, q.spec, sorted);
      ASSERT_EQ(y.shape(), (Shape{T, top, 1, N}));
      const auto yv = values(y);
      // The flag is a hint: the same indices give the same bits with or without it.
      EXPECT_EQ(yv, values(ms::gather_qmm(xv, q.packed.view(), q.scales.view(), &biases, nullptr, &rhs, true, q.spec,
                                          !sorted)));
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t j = 0; j < top; ++j) {
          const std::int64_t e = idx[static_cast<std::size_t>(t * top + j)];
          const std::int64_t pb = q.packed.shape()[2], sb = q.scales.shape()[2];
          const TensorView pe(q.packed.bytes() + e * N * pb, DType::uint8, {N, pb});
          const TensorView se(q.scales.bytes() + e * N * sb * 4, DType::float32, {N, sb});
          const TensorView be(q.biases.bytes() + e * N * sb * 4, DType::float32, {N, sb});
          const auto ref = values(ms::quantized_matmul(
              f32(std::vector<float>(x.begin() + t * K, x.begin() + (t + 1) * K), {1, K}), pe, se, &be, true, q.spec));
          // Rows routed to one expert run as one matmul, so only the float32 summation order
          // may differ from the per-row loop.
          const auto wd = values(ms::dequantize(pe, se, &be, q.spec, DType::float32));
          const auto o = oracle(std::vector<float>(x.begin() + t * K, x.begin() + (t + 1) * K), wd, 1, N, K, true);
          for (std::int64_t n = 0; n < N; ++n) {
            const auto i = static_cast<std::size_t>(n);
            ASSERT_NEAR(yv[static_cast<std::size_t>((t * top + j) * N + n)], ref[i], 2 * o.budget[i]);
          }
        }
    }
  }
}

TEST(GatherQmm, IndexErrors) {
  const auto q = ms::quantize(f32(randn(4 * 16 * 32, 19), {4, 16, 32}), spec_for(Mode::mxfp4));
  const auto x = randn(2 * 32, 20);
  std::vector<std::int32_t> bad = {0, 4};
  const TensorView rhs(bad.data(), DType::int32, {2});
  EXPECT_THROW(
      ms::gather_qmm(f32(x, {2, 1, 32}), q.packed.view(), q.scales.view(), nullptr, nullptr, &rhs, true, q.spec),
      ms::Error);
  std::vector<float> fidx = {0, 1};
  const TensorView frhs(fidx.data(), DType::float32, {2});
  EXPECT_THROW(
      ms::gather_qmm(f32(x, {2, 1, 32}), q.packed.view(), q.scales.view(), nullptr, nullptr, &frhs, true, q.spec),
      ms::Error);
}
