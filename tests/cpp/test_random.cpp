// Randomized self-consistency: dequantize(quantize(x)) stays within each format's half-step of
// x, per block, with the step derived from the block maximum (so a wrong, too-large scale fails),
// on heavy-tailed data with occasional outliers and several seeds.
#include <gtest/gtest.h>

#include "support.hpp"

namespace ms = microscale;
using namespace mst;

namespace {

std::vector<float> heavy_tailed(std::size_t n, std::uint64_t seed) {
  std::vector<float> x = make_data(n, Dist::student_t3, seed);
  std::mt19937_64 rng(seed ^ 0x9E3779B97F4A7C15ull);
  std::uniform_int_distribution<int> pick(0, 499), ex(-12, 3);
  for (float& v : x) {
    if (pick(rng) == 0) v *= 40.0f;                     // outliers
    if (pick(rng) < 5) v *= std::ldexp(1.0f, ex(rng));  // blocks of very different magnitude
    // Two-level nvfp4 saturates block maxima above 6 * 448; keep every mode in its range.
    v = std::clamp(v, -2500.0f, 2500.0f);
  }
  return x;
}

// Largest gap between neighbouring positive grid values below `v` (the half of it bounds the
// rounding error of any |u| <= v with no clipping).
double max_gap_up_to(Fmt f, double v) {
  Grid g = grid(f);
  double gap = 0;
  for (int c = 0; c < g.max_code; ++c) {
    const double lo = g.value(static_cast<std::uint8_t>(c)), hi = g.value(static_cast<std::uint8_t>(c + 1));
    if (lo >= v) break;
    gap = std::max(gap, hi - lo);
  }
  return gap;
}

class RandomRoundTrip : public ::testing::TestWithParam<std::uint64_t> {};

TEST_P(RandomRoundTrip, FpModesWithinHalfStep) {
  for_each_backend([&] {
    const std::uint64_t seed = GetParam();
    const std::int64_t rows = 16, k = 512;
    const std::vector<float> x = heavy_tailed(static_cast<std::size_t>(rows * k), seed);
    struct Case {
      ms::Mode mode;
      Fmt f;
      ms::Elem elem;
      bool three;
    };
    const Case cases[] = {{ms::Mode::nvfp4, Fmt::e2m1, ms::Elem::e4m3, false},
                          {ms::Mode::nvfp4, Fmt::e2m1, ms::Elem::e4m3, true},
                          {ms::Mode::mxfp4, Fmt::e2m1, ms::Elem::e4m3, false},
                          {ms::Mode::mxfp8, Fmt::e4m3, ms::Elem::e4m3, false},
                          {ms::Mode::mxfp8, Fmt::e5m2, ms::Elem::e5m2, false}};
    for (const Case& c : cases) {
      ms::QuantSpec s;
      s.mode = c.mode;
      s.elem = c.elem;
      if (c.three) s.global_scale = ms::global_scale(view(x, {rows, k}));
      ms::Quantized q = ms::quantize(view(x, {rows, k}), s);
      const std::vector<float> y = values(ms::dequantize(q, DType::float32));
      const int group = q.spec.group_size;
      const double emax = max_value(c.f);
      for (std::size_t b0 = 0; b0 < x.size(); b0 += static_cast<std::size_t>(group)) {
        double bamax = 0;
        for (int i = 0; i < group; ++i) bamax = std::max(bamax, std::fabs(static_cast<double>(x[b0 + i])));
        // Decode step unit d: the ideal scale bamax/emax, enlarged by what the scale format allows.
        //   nvfp4: E4M3 rounds the scale to nearest (3 mantissa bits): d <= bamax/6 * (1 + 1/16),
        //          plus the scale's own subnormal spacing when the block is tiny relative to amax.
        //   mx 'ceil': d = 2^ceil(log2(bamax/emax)) < 2 * bamax/emax.
        double d;
        double abs_slack = 0;
        if (c.mode == ms::Mode::nvfp4) {
          d = bamax / 6.0 * (1.0 + 1.0 / 16.0);
          const double unit = c.three ? *q.spec.global_scale / 2688.0 : 1.0;  // decode factor per scale unit
          abs_slack = std::ldexp(1.0, -10) * unit * 6.0;                      // half of the smallest E4M3 step
        } else {
          d = 2.0 * bamax / emax;
        }
        // Error bound: half the largest grid gap at the block's magnitude (in units of d) plus the
        // clipping of the block max, which the rounding-to-nearest of the scale can push past emax
        // by at most the scale's relative half-step (nvfp4 only: mx 'ceil' never clips).
        const double half_step = max_gap_up_to(c.f, emax) / 2.0 * d;
        const double bound = half_step * (1 + 1e-6) + abs_slack + 1e-37;
        for (int i = 0; i < group; ++i) {
          const double err = std::fabs(static_cast<double>(x[b0 + i]) - static_cast<double>(y[b0 + i]));
          ASSERT_LE(err, bound) << ms::name(c.mode) << (c.three ? " three-level" : "") << " seed " << seed << " block "
                                << b0 / group << " x " << x[b0 + i] << " y " << y[b0 + i] << " bamax " << bamax;
        }
      }
    }
  });
}

TEST_P(RandomRoundTrip, AffineWithinHalfStep) {
  for_each_backend([&] {
    const std::uint64_t seed = GetParam();
    const std::int64_t rows = 8, k = 512;
    const std::vector<float> x = heavy_tailed(static_cast<std::size_t>(rows * k), seed + 100);
    for (int bits : {2, 3, 4, 5, 6, 8}) {
      for (int group : {32, 64, 128}) {
        ms::QuantSpec s;
        s.mode = ms::Mode::affine;
        s.bits = bits;
        s.group_size = group;
        ms::Quantized q = ms::quantize(view(x, {rows, k}), s);
        const std::vector<float> y = values(ms::dequantize(q, DType::float32));
        const std::vector<float> sc = values(q.scales);
        const int n = (1 << bits) - 1;
        for (std::size_t g0 = 0, g = 0; g0 < x.size(); g0 += static_cast<std::size_t>(group), ++g) {
          double lo = x[g0], hi = x[g0];
          for (int i = 0; i < group; ++i) {
            lo = std::min(lo, static_cast<double>(x[g0 + i]));
            hi = std::max(hi, static_cast<double>(x[g0 + i]));
          }
          const double range = hi - lo;
          // The stored step is range/n adjusted so an edge is exact: |q0| moves by at most 1/2, so
          // |scale| <= range / (n - 1) (and >= range / (n + 1)).
          const double step = std::fabs(static_cast<double>(sc[g]));
          ASSERT_LE(step, range / (n - 1.0) * (1 + 1e-6) + 1e-30) << "bits " << bits << " group " << group;
          ASSERT_GE(step, range / (n + 1.0) * (1 - 1e-6)) << "bits " << bits << " group " << group;
          for (int i = 0; i < group; ++i) {
            const double err = std::fabs(static_cast<double>(x[g0 + i]) - static_cast<double>(y[g0 + i]));
            // Half a step for every element; the far edge may clip by up to half a step more.
            const std::uint8_t code = unpack_bits(q.packed.data<std::uint8_t>() + (g0 / k) * (k * bits / 8),
                                                  static_cast<std::int64_t>(g0 % k) + i, bits);
            const double bound =
                (code == n ? 1.0 : 0.5) * step * (1 + 1e-5) + 1e-6 * (range + std::max(std::fabs(lo), std::fabs(hi)));
            ASSERT_LE(err, bound) << "bits " << bits << " group " << group << " x " << x[g0 + i] << " y " << y[g0 + i];
          }
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomRoundTrip, ::testing::Values(1u, 2u, 3u, 4u, 5u));

}  // namespace
