// Scale search (docs/numerics.md, "Scale search"): hand-computed 4over6 blocks, mse never worse
// than round-to-nearest under an independent decoder (support.hpp's code values), the weight-error
// gain on a heavy-tailed matrix, identical bytes on every backend, and the argument errors.
#include <numeric>

#include "ops/quantize.hpp"
#include "support.hpp"

namespace {

using namespace mst;
using microscale::Mode;
using microscale::Quantized;
using microscale::QuantSpec;
using microscale::ScaleRule;
using microscale::ScaleSearch;

QuantSpec spec_of(Mode mode, ScaleSearch search, std::optional<float> global = std::nullopt) {
  QuantSpec s;
  s.mode = mode;
  s.scale_search = search;
  s.global_scale = global;
  return s;
}

// Values of a quantized fp4 tensor decoded from its bytes by support.hpp's code tables: element
// value times the block's decode factor (E4M3 scale, times amax / 2688 when three-level; or the
// E8M0 power of two), in double.
std::vector<double> decode_fp4(const Quantized& q) {
  const std::vector<std::uint8_t> packed = bytes(q.packed), scales = bytes(q.scales);
  const int g = q.spec.group_size;
  std::vector<double> y(packed.size() * 2);
  for (std::size_t i = 0; i < y.size(); ++i) {
    const std::uint8_t code = static_cast<std::uint8_t>((packed[i / 2] >> ((i & 1) * 4)) & 0xF);
    const std::uint8_t s = scales[i / static_cast<std::size_t>(g)];
    double factor = q.spec.mode == Mode::nvfp4 ? e4m3_value(s) : e8m0_value(s);
    if (q.spec.global_scale) factor = factor * static_cast<double>(*q.spec.global_scale) / 2688.0;
    y[i] = e2m1_value(code) * factor;
  }
  return y;
}

std::vector<double> block_sq_errors(const std::vector<double>& y, const std::vector<float>& x, int g) {
  std::vector<double> e(x.size() / static_cast<std::size_t>(g), 0.0);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double d = y[i] - x[i];
    e[i / static_cast<std::size_t>(g)] += d * d;
  }
  return e;
}

double total(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

std::vector<float> decoded_f32(const Quantized& q) {
  const Tensor y = microscale::dequantize(q, DType::float32);
  const float* p = y.data<float>();
  return std::vector<float>(p, p + y.numel());
}

// Two-level 4over6 by hand. bamax 4: max-to-6 scale E4M3(4/6) = 0.6875 (0x33) decodes 4 as 4.125;
// max-to-4 scale E4M3(1.0) (0x38) decodes every value below exactly, so 4 wins.
TEST(ScaleSearch, FourOverSixPicksFour) {
  std::vector<float> x = {4, 3, 2, 1.5f, 1, 0.5f, 0, -4, -3, -2, -1.5f, -1, -0.5f, 0, 4, 2};
  const Quantized q = microscale::quantize(view(x, {16}), spec_of(Mode::nvfp4, ScaleSearch::four_over_six));
  EXPECT_EQ(bytes(q.scales)[0], 0x38);
  EXPECT_EQ(decoded_f32(q), x);
  const Quantized rtn = microscale::quantize(view(x, {16}), spec_of(Mode::nvfp4, ScaleSearch::none));
  EXPECT_EQ(bytes(rtn.scales)[0], 0x33);
}

// bamax 6: max-to-6 scale 1.0 is exact; max-to-4 scale 1.5 (0x3C) sends 0.5 to 0.333.. -> 0.5 * 1.5,
// so 6 wins. And a tie (bamax 3: scale 0.5 and 0.75 both exact) keeps the max-to-6 scale 0.5 (0x30).
TEST(ScaleSearch, FourOverSixPicksSixAndTiesToSix) {
  std::vector<float> x = {6, 3, 1.5f, 0.5f, 0, 0, 0, 0, -6, -3, -1.5f, -0.5f, 0, 0, 0, 0};
  Quantized q = microscale::quantize(view(x, {16}), spec_of(Mode::nvfp4, ScaleSearch::four_over_six));
  EXPECT_EQ(bytes(q.scales)[0], 0x38);
  EXPECT_EQ(decoded_f32(q), x);
  std::vector<float> tie = {3, 1.5f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -3};
  q = microscale::quantize(view(tie, {16}), spec_of(Mode::nvfp4, ScaleSearch::four_over_six));
  EXPECT_EQ(bytes(q.scales)[0], 0x30);
  EXPECT_EQ(decoded_f32(q), tie);
}

// Three-level: S_enc = 1536 / amax = 256, so a block with bamax = amax gets the max-to-6 scale 256
// (0x78) or the max-to-4 scale 384 (0x7C), and the recorded global scale is 1.75 * amax, whose
// standard decode factor (256 * 10.5) / 2688 is exactly 1 here.
TEST(ScaleSearch, FourOverSixThreeLevel) {
  std::vector<float> x = {6, 3, 1.5f, 0.5f, 0, 0, 0, 0, -6, -3, -1.5f, -0.5f, 0, 0, 0, 0};
  Quantized q = microscale::quantize(view(x, {16}), spec_of(Mode::nvfp4, ScaleSearch::four_over_six, 6.0f));
  EXPECT_EQ(bytes(q.scales)[0], 0x78);
  ASSERT_TRUE(q.spec.global_scale.has_value());
  EXPECT_EQ(*q.spec.global_scale, 10.5f);
  EXPECT_EQ(decoded_f32(q), x);
  std::vector<float> four = {4, 3, 2, 1.5f, 1, 0.5f, 0, -4, -3, -2, -1.5f, -1, -0.5f, 0, 4, 2};
  q = microscale::quantize(view(four, {16}), spec_of(Mode::nvfp4, ScaleSearch::four_over_six, 4.0f));
  EXPECT_EQ(bytes(q.scales)[0], 0x7C);  // 384, exact; 0x78 (256) would decode 3 as 4 * 2/3
  EXPECT_EQ(*q.spec.global_scale, 7.0f);
  EXPECT_EQ(decoded_f32(q), four);
}

// Random and heavy-tailed blocks: each mse block is at most round-to-nearest's error, measured
// with the independent decoder in double (the search compares float32 sums, hence the slack).
TEST(ScaleSearch, MseNeverWorseThanNearestPerBlock) {
  for (const Dist d : {Dist::gaussian, Dist::student_t3, Dist::wide_range, Dist::tie_rich}) {
    const std::vector<float> x = make_data(64 * 256, d, 11 + static_cast<int>(d));
    for (const Mode mode : {Mode::nvfp4, Mode::mxfp4}) {
      const Quantized rtn = microscale::quantize(view(x, {64, 256}), spec_of(mode, ScaleSearch::none));
      const Quantized mse = microscale::quantize(view(x, {64, 256}), spec_of(mode, ScaleSearch::mse));
      const int g = rtn.spec.group_size;
      const std::vector<double> er = block_sq_errors(decode_fp4(rtn), x, g);
      const std::vector<double> em = block_sq_errors(decode_fp4(mse), x, g);
      int better = 0;
      for (std::size_t b = 0; b < er.size(); ++b) {
        EXPECT_LE(em[b], er[b] * (1 + 1e-5) + 1e-30) << microscale::name(mode) << " block " << b;
        better += em[b] < er[b];
      }
      // Tie-rich data mostly sits on the grids already, and wide-range blocks are all their max;
      // Gaussian and heavy-tailed blocks must gain somewhere.
      if (d == Dist::gaussian || d == Dist::student_t3) {
        EXPECT_GT(better, 0) << microscale::name(mode) << " dist " << static_cast<int>(d);
      }
      // The library's dequantize decodes the chosen bytes as the independent decoder does.
      const std::vector<float> lib = decoded_f32(mse);
      const std::vector<double> ind = decode_fp4(mse);
      for (std::size_t i = 0; i < lib.size(); ++i)
        ASSERT_NEAR(lib[i], ind[i], std::abs(ind[i]) * 1e-6) << microscale::name(mode) << " element " << i;
    }
  }
}

// Two-level nvfp4 mse picks, per block, exactly the definition's choice: the first lowest float32
// error among round-to-nearest's code s0, s0-1, s0+1, s0-2, s0+2 and 4over6's max-to-4 code, each
// error recomputed here from support.hpp's rounding oracle (rn_sat) and code values.
TEST(ScaleSearch, MseNvfp4PicksTheFirstLeastErrorCandidate) {
  for (const Dist d : {Dist::gaussian, Dist::student_t3, Dist::wide_range, Dist::tie_rich}) {
    const std::vector<float> x = make_data(64 * 256, d, 21 + static_cast<int>(d));
    const std::vector<std::uint8_t> s0 =
        bytes(microscale::quantize(view(x, {64, 256}), spec_of(Mode::nvfp4, ScaleSearch::none)).scales);
    const std::vector<std::uint8_t> got =
        bytes(microscale::quantize(view(x, {64, 256}), spec_of(Mode::nvfp4, ScaleSearch::mse)).scales);
    int moved_two = 0;
    for (std::size_t b = 0; b < s0.size(); ++b) {
      const float* xb = x.data() + b * 16;
      float bamax = 0.0f;
      for (int i = 0; i < 16; ++i) bamax = std::max(bamax, std::fabs(xb[i]));
      auto error = [&](int code) {
        const float dec = code_value(Fmt::e4m3, static_cast<std::uint8_t>(code));
        const float enc = std::fmin(1.0f / dec, FLT_MAX);
        float err = 0.0f;
        for (int i = 0; i < 16; ++i) {
          const float e = code_value(Fmt::e2m1, rn_sat(Fmt::e2m1, xb[i] * enc)) * dec - xb[i];
          err = err + e * e;
        }
        return err;
      };
      int best = s0[b];
      float best_err = error(best);
      std::vector<int> candidates = {s0[b] - 1, s0[b] + 1, s0[b] - 2, s0[b] + 2};
      candidates.push_back(rn_sat(Fmt::e4m3, bamax * kC6 * 1.5f));
      for (const int c : candidates) {
        if (c < 0 || c > 0x7E) continue;
        const float err = error(c);
        if (err < best_err) {
          best = c;
          best_err = err;
        }
      }
      ASSERT_EQ(int{got[b]}, best) << "dist " << static_cast<int>(d) << " block " << b << " s0 " << int{s0[b]};
      moved_two += std::abs(best - s0[b]) == 2;
    }
    // The outer steps are taken somewhere on spread-out data, so a narrower search would fail too.
    if (d == Dist::gaussian || d == Dist::student_t3) {
      EXPECT_GT(moved_two, 0) << "dist " << static_cast<int>(d);
    }
  }
}

// Three-level nvfp4 mse also searches the global scale: the chosen one is one of the candidates,
// and the total error is at most round-to-nearest's.
TEST(ScaleSearch, MseThreeLevelNeverWorseInTotal) {
  const std::vector<float> x = make_data(64 * 256, Dist::student_t3, 5);
  const float amax = microscale::global_scale(view(x, {64, 256}));
  const Quantized rtn = microscale::quantize(view(x, {64, 256}), spec_of(Mode::nvfp4, ScaleSearch::none, amax));
  const Quantized mse = microscale::quantize(view(x, {64, 256}), spec_of(Mode::nvfp4, ScaleSearch::mse, amax));
  ASSERT_TRUE(mse.spec.global_scale.has_value());
  const float g = *mse.spec.global_scale;
  EXPECT_TRUE(g == amax || g == amax * 1.03125f || g == amax * 1.0625f || g == amax * 1.09375f || g == amax * 1.75f)
      << g;
  EXPECT_LE(total(block_sq_errors(decode_fp4(mse), x, 16)), total(block_sq_errors(decode_fp4(rtn), x, 16)));
}

// On an extreme tail (Student-t, 1.5 degrees of freedom: a few elements far above the rest),
// three-level mse is not worse in total than 4over6, whose global scale (1.75 x amax) is among
// mse's candidates.
TEST(ScaleSearch, MseThreeLevelNotWorseThanFourOverSixOnExtremeTail) {
  std::mt19937 rng(4);
  std::student_t_distribution<float> student(1.5f);
  std::vector<float> w(128 * 1024);
  for (float& v : w) v = student(rng);
  const TensorView wv = view(w, {128, 1024});
  const float amax = microscale::global_scale(wv);
  const Quantized mse = microscale::quantize(wv, spec_of(Mode::nvfp4, ScaleSearch::mse, amax));
  const Quantized fos = microscale::quantize(wv, spec_of(Mode::nvfp4, ScaleSearch::four_over_six, amax));
  const double em = total(block_sq_errors(decode_fp4(mse), w, 16));
  const double ef = total(block_sq_errors(decode_fp4(fos), w, 16));
  EXPECT_LE(em, ef) << "mse/4over6 = " << em / ef << ", mse global scale " << *mse.spec.global_scale << " amax "
                    << amax;
}

// A heavy-tailed weight matrix (Gaussian rows times a log-normal spread): mse lowers nvfp4's
// weight error by at least 5% relative to round-to-nearest (the target), two- and three-level.
TEST(ScaleSearch, MseLowersHeavyTailedWeightError) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> w(256 * 1024);
  for (float& v : w) v = normal(rng) * std::exp(1.0f * normal(rng));
  const TensorView wv = view(w, {256, 1024});
  const float amax = microscale::global_scale(wv);
  for (const std::optional<float> g : {std::optional<float>{}, std::optional<float>{amax}}) {
    const double er =
        total(block_sq_errors(decode_fp4(microscale::quantize(wv, spec_of(Mode::nvfp4, ScaleSearch::none, g))), w, 16));
    const double em =
        total(block_sq_errors(decode_fp4(microscale::quantize(wv, spec_of(Mode::nvfp4, ScaleSearch::mse, g))), w, 16));
    RecordProperty(g ? "three_level_ratio" : "two_level_ratio", std::to_string(em / er));
    EXPECT_LE(em, 0.95 * er) << (g ? "three-level" : "two-level") << " mse/rtn = " << em / er;
  }
}

// Every backend configuration gives the same bytes and global scale (the global search included).
TEST(ScaleSearch, SameBytesOnEveryBackend) {
  const std::vector<float> x = make_data(33 * 128, Dist::student_t3, 9);
  const float amax = microscale::global_scale(view(x, {33, 128}));
  const QuantSpec specs[] = {spec_of(Mode::nvfp4, ScaleSearch::mse, amax), spec_of(Mode::nvfp4, ScaleSearch::mse),
                             spec_of(Mode::nvfp4, ScaleSearch::four_over_six, amax),
                             spec_of(Mode::mxfp4, ScaleSearch::mse)};
  for (const QuantSpec& s : specs) {
    std::optional<Quantized> first;
    for (const BackendConfig& b : backend_configs()) {
      UseBackend use(b);
      Quantized q = microscale::quantize(view(x, {33, 128}), s);
      if (!first) {
        first = std::move(q);
        continue;
      }
      EXPECT_EQ(bytes(q.packed), bytes(first->packed)) << b.label;
      EXPECT_EQ(bytes(q.scales), bytes(first->scales)) << b.label;
      EXPECT_EQ(q.spec.global_scale, first->spec.global_scale) << b.label;
    }
  }
}

// The global search as docs/numerics.md defines it, by brute force: each candidate's whole
// quantization (ops::quantize without the global search), its float64 total in row-major order
// over the finite inputs, the least kept, ties to the first.
Quantized documented_global_choice(const TensorView& x, const std::vector<float>& xf, float amax) {
  std::optional<Quantized> best;
  double best_err = 0.0;
  for (const float m : {1.0f, 1.03125f, 1.0625f, 1.09375f, 1.75f}) {
    const QuantSpec s = spec_of(Mode::nvfp4, ScaleSearch::mse, std::fmin(amax * m, FLT_MAX));
    Quantized q = microscale::ops::quantize(x, s, false);
    const std::vector<float> y = decoded_f32(q);
    double err = 0.0;
    for (std::size_t i = 0; i < xf.size(); ++i) {
      if (!std::isfinite(xf[i])) continue;
      const double d = static_cast<double>(y[i]) - static_cast<double>(xf[i]);
      err += d * d;
    }
    if (!best || err < best_err) {
      best = std::move(q);
      best_err = err;
    }
  }
  return std::move(*best);
}

// The search's one pass over the tensor (every candidate's block errors at once) decides as the
// documented float64 totals do, on every backend: heavy tails, ties, wide ranges, zeros and
// constants (all candidates tie: the first), tiny and huge values, NaN (the documented path),
// float32, float16 and bfloat16 inputs.
TEST(ScaleSearch, GlobalSearchMatchesTheDocumentedTotals) {
  struct Input {
    std::string name;
    std::vector<float> x;
  };
  std::vector<Input> inputs;
  for (const Dist d : {Dist::gaussian, Dist::student_t3, Dist::tie_rich, Dist::wide_range})
    for (std::uint64_t seed = 0; seed < 3; ++seed)
      inputs.push_back({"dist " + std::to_string(static_cast<int>(d)) + " seed " + std::to_string(seed),
                        make_data(48 * 64, d, 100 + seed)});
  inputs.push_back({"zeros", std::vector<float>(48 * 64, 0.0f)});
  inputs.push_back({"constant", std::vector<float>(48 * 64, -0.3f)});
  std::vector<float> tiny = make_data(48 * 64, Dist::gaussian, 7), huge = tiny, nan = tiny;
  for (float& v : tiny) v *= 1e-39f;  // float32 subnormals
  for (float& v : huge) v *= 1e37f;   // 1.75 x amax near float32's largest value
  nan[1000] = std::numeric_limits<float>::quiet_NaN();
  inputs.push_back({"tiny", tiny});
  inputs.push_back({"huge", huge});
  inputs.push_back({"nan", nan});
  for (const Input& in : inputs)
    for (const DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
      const std::vector<std::uint16_t> half =
          dtype == DType::float32 ? std::vector<std::uint16_t>{} : to_half(in.x, dtype);
      const TensorView xv = dtype == DType::float32 ? view(in.x, {48, 64}) : view(half, dtype, {48, 64});
      const float amax = microscale::global_scale(xv);
      const std::string what = in.name + " " + microscale::dtype_name(dtype);
      std::optional<Quantized> want;
      {
        UseBackend use(backend_configs().front());
        want = documented_global_choice(xv, dtype == DType::float32 ? in.x : widen(half, dtype), amax);
      }
      for (const BackendConfig& b : backend_configs()) {
        UseBackend use(b);
        const Quantized got = microscale::quantize(xv, spec_of(Mode::nvfp4, ScaleSearch::mse, amax));
        EXPECT_EQ(got.spec.global_scale, want->spec.global_scale) << what << " " << b.label;
        EXPECT_EQ(bytes(got.packed), bytes(want->packed)) << what << " " << b.label;
        EXPECT_EQ(bytes(got.scales), bytes(want->scales)) << what << " " << b.label;
      }
    }
}

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error, expected one containing: " << part;
  } catch (const microscale::Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(ScaleSearch, RejectsModesWithoutIt) {
  const std::vector<float> x(64, 1.0f);
  expect_error([&] { microscale::quantize(view(x, {64}), spec_of(Mode::mxfp4, ScaleSearch::four_over_six)); },
               "scale_search '4over6' is only defined for nvfp4, not mxfp4");
  expect_error([&] { microscale::quantize(view(x, {64}), spec_of(Mode::mxfp8, ScaleSearch::mse)); },
               "scale_search 'mse' is only defined for nvfp4 and mxfp4, not mxfp8");
  expect_error([&] { microscale::quantize(view(x, {64}), spec_of(Mode::affine, ScaleSearch::mse)); }, "not affine");
  expect_error(
      [&] {
        microscale::qqmm(view(x, {1, 64}), view(x, {1, 64}), nullptr, spec_of(Mode::nvfp4, ScaleSearch::mse));
      },
      "qqmm: scale_search is an option of quantize");
  expect_error([] { microscale::scale_search_from_name("best"); },
               "unknown scale_search 'best' (expected one of none, 4over6, mse)");
  EXPECT_EQ(microscale::scale_search_from_name("4over6"), ScaleSearch::four_over_six);
}

}  // namespace
