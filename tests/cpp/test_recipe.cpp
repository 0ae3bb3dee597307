// The NVFP4 training recipe's numerics (docs/numerics.md, "Training-recipe numerics"): 2D 16x16
// scales (W and W^T decode to transposes of each other), the random Hadamard transform's
// properties and errors, stochastic rounding's determinism, grid neighbours and bytes on every
// backend and thread count. The bit-exact numpy oracles are in tests/python/test_recipe.py.
#include <functional>

#include "support.hpp"

namespace {

using namespace mst;
using microscale::Mode;
using microscale::NonFinite;
using microscale::Quantized;
using microscale::QuantSpec;

QuantSpec nvfp4_2d(std::optional<float> global = std::nullopt) {
  QuantSpec s;
  s.scale_2d = true;
  s.global_scale = global;
  return s;
}

QuantSpec sr(Mode mode, std::uint64_t seed, std::optional<float> global = std::nullopt) {
  QuantSpec s;
  s.mode = mode;
  s.sr_seed = seed;
  s.global_scale = global;
  return s;
}

std::vector<float> transposed(const std::vector<float>& x, std::int64_t rows, std::int64_t cols) {
  std::vector<float> t(x.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      t[static_cast<std::size_t>(c * rows + r)] = x[static_cast<std::size_t>(r * cols + c)];
  return t;
}

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error, expected one containing: " << part;
  } catch (const microscale::Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// Every backend configuration, and the cpu backend on 1 and 2 threads, gives the first one's bytes.
void expect_same_bytes_everywhere(const std::vector<float>& x, const Shape& shape, const QuantSpec& spec) {
  std::optional<Quantized> first;
  auto check = [&](const std::string& label) {
    Quantized q = microscale::quantize(view(x, shape), spec);
    if (!first) {
      first = std::move(q);
      return;
    }
    EXPECT_EQ(bytes(q.packed), bytes(first->packed)) << label;
    EXPECT_EQ(bytes(q.scales), bytes(first->scales)) << label;
  };
  for (const BackendConfig& b : backend_configs()) {
    UseBackend use(b);
    check(b.label);
  }
  for (const int threads : {1, 2}) {
    UseBackend use({"cpu threads=" + std::to_string(threads), microscale::Backend::cpu, "auto", threads});
    check("cpu threads=" + std::to_string(threads));
  }
}

// ---- 2D scaling ----

// W and W^T give transposed decoded values, two- and three-level, on every backend.
TEST(Recipe2D, TransposeQuantizesToTranspose) {
  const std::int64_t R = 48, C = 80;
  const std::vector<float> w = make_data(static_cast<std::size_t>(R * C), Dist::student_t3, 21);
  const std::vector<float> wt = transposed(w, R, C);
  const float amax = microscale::global_scale(view(w, {R, C}));
  for (const std::optional<float> g : {std::optional<float>(), std::optional<float>(amax)}) {
    for_each_backend([&] {
      const std::vector<float> y =
          values(microscale::dequantize(microscale::quantize(view(w, {R, C}), nvfp4_2d(g)), DType::float32));
      const std::vector<float> yt =
          values(microscale::dequantize(microscale::quantize(view(wt, {C, R}), nvfp4_2d(g)), DType::float32));
      EXPECT_EQ(transposed(y, R, C), yt);
      // Not true of the default 1x16 blocks on this heavy-tailed data (the test has teeth).
      QuantSpec rows;
      rows.global_scale = g;
      const std::vector<float> r1 =
          values(microscale::dequantize(microscale::quantize(view(w, {R, C}), rows), DType::float32));
      const std::vector<float> r2 =
          values(microscale::dequantize(microscale::quantize(view(wt, {C, R}), rows), DType::float32));
      EXPECT_NE(transposed(r1, R, C), r2);
    });
  }
}

// The compact scales repeat each tile's byte in its rows (a partial last tile included), and that
// byte is the 1x16 rule applied to the tile's amax.
TEST(Recipe2D, TileScaleRepeatedInItsRows) {
  const std::int64_t R = 37, C = 64;  // tiles of 16, 16 and 5 rows
  const std::vector<float> w = make_data(static_cast<std::size_t>(R * C), Dist::gaussian, 4);
  const Quantized q = microscale::quantize(view(w, {R, C}), nvfp4_2d());
  const std::vector<std::uint8_t> s = bytes(q.scales);
  ASSERT_EQ(s.size(), static_cast<std::size_t>(R * C / 16));
  for (std::int64_t r0 = 0; r0 < R; r0 += 16) {
    for (std::int64_t j = 0; j < C / 16; ++j) {
      float amax = 0.0f;
      for (std::int64_t r = r0; r < std::min(r0 + 16, R); ++r)
        for (std::int64_t i = 0; i < 16; ++i)
          amax = std::max(amax, std::fabs(w[static_cast<std::size_t>(r * C + j * 16 + i)]));
      // A 1x16 block holding just the tile's amax gets the tile's scale byte.
      std::vector<float> one(16, 0.0f);
      one[0] = amax;
      const std::uint8_t expect = bytes(microscale::quantize(view(one, {16}), QuantSpec{}).scales)[0];
      for (std::int64_t r = r0; r < std::min(r0 + 16, R); ++r)
        EXPECT_EQ(s[static_cast<std::size_t>(r * (C / 16) + j)], expect) << "row " << r << " tile column " << j;
    }
  }
}

TEST(Recipe2D, SameBytesOnEveryBackendAndNonFiniteTiles) {
  std::vector<float> w = make_data(50 * 96, Dist::wide_range, 8);
  w[17 * 96 + 40] = kNaN;  // tile (1, 2) under 'propagate': NaN scale in rows 16..31
  expect_same_bytes_everywhere(w, {50, 96}, nvfp4_2d());
  expect_same_bytes_everywhere(w, {2, 25, 96}, nvfp4_2d(3.5f));
  QuantSpec sat = nvfp4_2d();
  sat.nonfinite = NonFinite::saturate;
  expect_same_bytes_everywhere(w, {50, 96}, sat);
  const std::vector<std::uint8_t> s = bytes(microscale::quantize(view(w, {50, 96}), nvfp4_2d()).scales);
  for (std::int64_t r = 0; r < 50; ++r)
    EXPECT_EQ(s[static_cast<std::size_t>(r * 6 + 2)] == 0x7F, r >= 16 && r < 32) << "row " << r;
}

// ---- random Hadamard transform ----

// M = 0.25 * D * H is orthogonal: transforming a one-hot row gives row i of M, +-0.25 with the
// sign d_i * H[i][j]; the rows are orthonormal.
TEST(RecipeHadamard, RowsOfTheMatrixAreOrthonormal) {
  std::vector<float> eye(16 * 16, 0.0f);
  for (int i = 0; i < 16; ++i) eye[static_cast<std::size_t>(i * 17)] = 1.0f;
  const std::vector<float> m = values(microscale::hadamard_transform(view(eye, {16, 16}), DType::float32));
  for (int i = 0; i < 16; ++i) {
    for (int k = 0; k < 16; ++k) {
      double dot = 0.0;
      for (int j = 0; j < 16; ++j)
        dot += double(m[static_cast<std::size_t>(i * 16 + j)]) * m[static_cast<std::size_t>(k * 16 + j)];
      EXPECT_EQ(dot, i == k ? 1.0 : 0.0) << i << "," << k;
    }
    // Column 0 of H is all ones, so row i starts with d_i * 0.25: the sign vector 0xD7E8.
    EXPECT_EQ(m[static_cast<std::size_t>(i * 16)], ((0xD7E8u >> i) & 1u) ? -0.25f : 0.25f) << i;
  }
}

TEST(RecipeHadamard, Errors) {
  const std::vector<float> x(48, 1.0f);
  expect_error([&] { microscale::hadamard_transform(view(x, {2, 24})); }, "(K = 24) must be a multiple of 16");
  expect_error([&] { microscale::hadamard_transform(view(x, {48}), DType::float16); }, "float32 or bfloat16");
  const std::vector<std::uint8_t> u8(32);
  expect_error([&] { microscale::hadamard_transform(TensorView(u8.data(), DType::uint8, {32})); },
               "unsupported input dtype uint8");
  QuantSpec a;
  a.mode = Mode::affine;
  a.hadamard = true;
  expect_error([&] { microscale::quantize(view(x, {48}), a); }, "not affine");
}

// quantize with hadamard = quantize of the transformed tensor, bytes and all.
TEST(RecipeHadamard, QuantizeAppliesTheTransformFirst) {
  const std::vector<float> x = make_data(8 * 64, Dist::student_t3, 5);
  const Tensor y = microscale::hadamard_transform(view(x, {8, 64}));
  const float amax = microscale::global_scale(y.view());
  for_each_backend([&] {
    QuantSpec s;
    s.global_scale = amax;
    const Quantized plain = microscale::quantize(y.view(), s);
    s.hadamard = true;
    const Quantized q = microscale::quantize(view(x, {8, 64}), s);
    EXPECT_EQ(bytes(q.packed), bytes(plain.packed));
    EXPECT_EQ(bytes(q.scales), bytes(plain.scales));
    EXPECT_TRUE(q.spec.hadamard);
  });
}

// ---- stochastic rounding ----

TEST(RecipeStochastic, SameBytesOnEveryBackendAndThreadCount) {
  const std::vector<float> x = make_data(67 * 128, Dist::student_t3, 12);
  const float amax = microscale::global_scale(view(x, {67, 128}));
  expect_same_bytes_everywhere(x, {67, 128}, sr(Mode::nvfp4, 7));
  expect_same_bytes_everywhere(x, {67, 128}, sr(Mode::nvfp4, 7, amax));
  expect_same_bytes_everywhere(x, {67, 128}, sr(Mode::mxfp4, 0xFFFFFFFFFFFFFFFFull));
  QuantSpec both = sr(Mode::nvfp4, 3, amax);
  both.scale_2d = true;
  expect_same_bytes_everywhere(x, {67, 128}, both);
}

// Same seed: same bytes; another seed: other bytes; the scales are round-to-nearest's; every value
// decodes to one of the two grid neighbours of the scaled input.
TEST(RecipeStochastic, DeterministicAndBetweenNeighbours) {
  const std::vector<float> x = make_data(16 * 256, Dist::gaussian, 3);
  const Quantized a = microscale::quantize(view(x, {16, 256}), sr(Mode::nvfp4, 42));
  const Quantized b = microscale::quantize(view(x, {16, 256}), sr(Mode::nvfp4, 42));
  const Quantized c = microscale::quantize(view(x, {16, 256}), sr(Mode::nvfp4, 43));
  const Quantized rtn = microscale::quantize(view(x, {16, 256}), QuantSpec{});
  EXPECT_EQ(bytes(a.packed), bytes(b.packed));
  EXPECT_NE(bytes(a.packed), bytes(c.packed));
  EXPECT_EQ(bytes(a.scales), bytes(rtn.scales));
  const std::vector<std::uint8_t> p = bytes(a.packed), s = bytes(a.scales);
  static const double grid[] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double sf = e4m3_value(s[i / 16]);
    const double v = std::fabs(double(x[i]) / sf);  // the scaled magnitude, in double
    const double got = std::fabs(e2m1_value(static_cast<std::uint8_t>((p[i / 2] >> ((i & 1) * 4)) & 0xF)));
    double lo = 0, hi = 6;
    for (const double g : grid) {
      if (g <= v) lo = g;
      if (g >= v && g < hi) hi = g;
    }
    // f32 rounding of the scaled value may land on a neighbour's edge: allow lo/hi of v +- 1 ulp.
    EXPECT_TRUE(got == lo || got == hi || std::fabs(got - v) < 1e-5) << i << ": " << v << " -> " << got;
  }
}

TEST(RecipeStochastic, Errors) {
  const std::vector<float> x(64, 1.0f);
  expect_error([&] { microscale::quantize(view(x, {64}), sr(Mode::mxfp8, 1)); }, "nvfp4 and mxfp4");
  QuantSpec s = sr(Mode::nvfp4, 1);
  s.scale_search = microscale::ScaleSearch::mse;
  expect_error([&] { microscale::quantize(view(x, {64}), s); }, "cannot be combined with scale_search");
  QuantSpec t = nvfp4_2d();
  t.mode = Mode::mxfp4;
  expect_error([&] { microscale::quantize(view(x, {64}), t); },
               "scale_2d (16x16 scale tiles) is only defined for nvfp4");
}

}  // namespace
