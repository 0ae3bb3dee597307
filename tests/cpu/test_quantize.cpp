// cpu::quantize against reference::quantize, byte for byte, on every SIMD target with 1 and 2
// threads: random corner-case data, FORMATS.md's tie vectors, and every f16/bf16 bit pattern.
#include <algorithm>
#include <numeric>

#include "common.hpp"
#include "core/numerics.hpp"

using namespace cputest;
namespace ref = microscale::reference;
namespace cpu = microscale::cpu;

namespace {

struct QOut {
  std::vector<std::uint8_t> packed, scales, biases;
};

QOut alloc(const Input& in, std::int64_t rows, std::int64_t K, const QuantSpec& s, std::uint8_t fill) {
  const std::size_t groups = static_cast<std::size_t>(rows * (K / s.group_size));
  const std::size_t ssize = s.mode == Mode::affine ? microscale::dtype_size(in.dtype) : 1;
  QOut o;
  o.packed.assign(static_cast<std::size_t>(rows * K * s.bits / 8), fill);
  o.scales.assign(groups * ssize, fill);
  if (s.mode == Mode::affine) o.biases.assign(groups * ssize, fill);
  return o;
}

std::byte* bytes(std::vector<std::uint8_t>& v) { return v.empty() ? nullptr : reinterpret_cast<std::byte*>(v.data()); }

// The reference needs zeroed outputs (it ORs bits in); the kernels get garbage, so a byte they
// fail to write shows up as a mismatch.
QOut run_reference(const Input& in, std::int64_t rows, std::int64_t K, const QuantSpec& s) {
  QOut o = alloc(in, rows, K, s, 0);
  ref::quantize(in.f32.data(), rows, K, in.dtype, s, o.packed.data(), bytes(o.scales), bytes(o.biases));
  return o;
}

QOut run_cpu(const Input& in, std::int64_t rows, std::int64_t K, const QuantSpec& s) {
  QOut o = alloc(in, rows, K, s, 0xA5);
  cpu::quantize(in.bytes.data(), in.dtype, rows, K, s, o.packed.data(), bytes(o.scales), bytes(o.biases));
  return o;
}

// Checks every target and thread count against the reference; one failure per buffer and case.
void expect_matches(const Input& in, std::int64_t rows, std::int64_t K, const NamedSpec& ns, const std::string& what) {
  const QuantSpec& s = ns.spec;
  const QOut want = run_reference(in, rows, K, s);
  const std::string ctx = what + " " + ns.name + " " + microscale::dtype_name(in.dtype) + " [" + std::to_string(rows) +
                          "x" + std::to_string(K) + "] ";
  for_each_target([&](const std::string& where) {
    const QOut got = run_cpu(in, rows, K, s);
    const std::int64_t p = first_diff(got.packed, want.packed);
    if (p >= 0) {
      const std::int64_t e = p * 8 / s.bits;  // first element of the byte
      ADD_FAILURE() << ctx << where << ": packed byte " << p << " got " << int{got.packed[p]} << " want "
                    << int{want.packed[p]} << " (block " << e / s.group_size << ", x[" << e << "] = " << in.f32[e]
                    << ")";
    }
    const std::int64_t q = first_diff(got.scales, want.scales);
    if (q >= 0)
      ADD_FAILURE() << ctx << where << ": scale byte " << q << " got " << int{got.scales[q]} << " want "
                    << int{want.scales[q]};
    const std::int64_t r = first_diff(got.biases, want.biases);
    if (r >= 0) ADD_FAILURE() << ctx << where << ": bias byte " << r;
  });
}

struct Shape2 {
  std::int64_t rows, K;
};
const DType kDtypes[] = {DType::float32, DType::float16, DType::bfloat16};

// Shapes with odd row counts and K around the tiles of every target, each with finite data and
// with NaN/Inf sprinkled in; the largest (several chunks per thread) with NaN/Inf only.
struct DataCase {
  Shape2 shape;
  bool nonfinite;
};
std::vector<DataCase> data_cases() {
  std::vector<DataCase> out;
  for (const Shape2 sh :
       {Shape2{1, 16}, {3, 16}, {1, 48}, {3, 48}, {129, 48}, {1, 96}, {3, 160}, {129, 96}, {1, 4096}, {3, 4096}})
    for (const bool nonfinite : {false, true}) out.push_back({sh, nonfinite});
  out.push_back({{129, 4096}, true});
  return out;
}

TEST(CpuQuantize, FpModesMatchReference) {
  std::uint64_t seed = 1;
  for (const DType t : kDtypes)
    for (const DataCase& c : data_cases()) {
      const auto n = static_cast<std::size_t>(c.shape.rows * c.shape.K);
      const Input in = make_input(corner_data(n, 16, t, c.nonfinite, seed++), t);
      std::vector<NonFinite> policies = {NonFinite::propagate, NonFinite::saturate};
      if (!c.nonfinite) policies.push_back(NonFinite::error);  // the caller rejected non-finite input
      for (const NonFinite p : policies)
        for (const NamedSpec& ns : fp_specs(c.shape.K, p, global_scales_for(in.f32)))
          expect_matches(in, c.shape.rows, c.shape.K, ns, c.nonfinite ? "with NaN/Inf" : "finite");
    }
}

TEST(CpuQuantize, AffineMatchesReference) {
  std::uint64_t seed = 100;
  for (const DType t : kDtypes)
    for (const DataCase& c : data_cases()) {
      const auto n = static_cast<std::size_t>(c.shape.rows * c.shape.K);
      const Input in = make_input(corner_data(n, 32, t, c.nonfinite, seed++), t);
      for (const NonFinite p : {NonFinite::propagate, NonFinite::saturate})
        for (const NamedSpec& ns : affine_specs(c.shape.K, p))
          expect_matches(in, c.shape.rows, c.shape.K, ns, c.nonfinite ? "with NaN/Inf" : "finite");
    }
}

// FORMATS.md 2.1's TE vectors, where the operation order decides an E4M3 scale tie and an E2M1
// element tie; and a block exactly at 6 * 448 * 2^k.
TEST(CpuQuantize, Nvfp4OperationOrderVectors) {
  struct Case {
    float amax;
    std::vector<float> block;
  };
  const Case cases[] = {
      {18.25f,
       {13.6875f, 1.0f, -2.0f, 0.5f, 3.0f, -13.0f, 7.0f, 0.0f, -0.0f, 1e-3f, 2.5f, 4.0f, 5.0f, 6.0f, 9.0f, 10.0f}},
      {11.125f,
       {2.390625f, 0.6953125f, -0.6953125f, 1.0f, 0.0f, 0.25f, 2.0f, 1.5f, 0.1f, -2.390625f, 0.3f, 0.6953125f, 1.2f,
        1.7f, 2.2f, 0.0f}},
      {2688.0f,
       {2688.0f, 1344.0f, -672.0f, 224.0f, 112.0f, 56.0f, 28.0f, 14.0f, 7.0f, 3.5f, 1.75f, 0.875f, 0.4375f, 0.21875f,
        0.109375f, -2688.0f}},
  };
  for (const Case& c : cases) {
    const Input in = make_input(c.block, DType::float32);
    QuantSpec s;
    s.global_scale = c.amax;
    expect_matches(in, 1, 16, {"nvfp4-3level", microscale::resolve(s)}, "TE vector");
    expect_matches(in, 1, 16, {"nvfp4-2level", microscale::resolve(QuantSpec{})}, "TE vector");
  }
}

// All 65536 patterns of a 16-bit float as elements: in order (neighbours of equal magnitude set
// the scale), shuffled (scales from unrelated magnitudes), and with every block's first element
// replaced by an anchor 1-4x the block's largest finite magnitude (elements land on every code).
std::vector<std::vector<std::uint16_t>> layouts(DType t) {
  std::vector<std::uint16_t> seq(65536);
  std::iota(seq.begin(), seq.end(), std::uint16_t{0});
  std::vector<std::uint16_t> shuffled = seq;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(7));
  std::vector<std::uint16_t> anchored = shuffled;
  std::mt19937_64 rng(8);
  std::uniform_real_distribution<float> factor(1.0f, 4.0f);
  for (std::size_t b = 0; b < anchored.size(); b += 16) {
    float m = 0.0f;
    for (std::size_t i = b; i < b + 16; ++i) {
      std::byte raw[4];  // 2 used; 4 keeps GCC's bounds check quiet where t is not known
      std::memcpy(raw, &anchored[i], 2);
      const float v = microscale::detail::load_f32(raw, t);
      if (std::isfinite(v)) m = std::max(m, std::fabs(v));
    }
    std::byte raw[4];
    const float top = t == DType::float16 ? 65504.0f : 3.0e38f;
    microscale::detail::store_f32(std::min(m * factor(rng), top), t, raw);
    std::memcpy(&anchored[b], raw, 2);
  }
  return {seq, shuffled, anchored};
}

void exhaustive(DType t) {
  const char* names[] = {"sequential", "shuffled", "anchored"};
  int li = 0;
  for (const std::vector<std::uint16_t>& bits : layouts(t)) {
    const Input in16 = input_from_bits(bits, t);
    const Input in32 = make_input(in16.f32, DType::float32);  // the same values as f32 input
    for (const Input* in : {&in16, &in32})
      for (const NonFinite p : {NonFinite::propagate, NonFinite::saturate}) {
        std::vector<NamedSpec> specs = fp_specs(4096, p, global_scales_for(in->f32));
        for (NamedSpec& a : affine_specs(4096, p)) specs.push_back(a);
        const Input x = p == NonFinite::saturate ? quiet_nans(*in) : *in;
        for (const NamedSpec& ns : specs) expect_matches(x, 16, 4096, ns, std::string("exhaustive ") + names[li]);
      }
    ++li;
  }
}

// The vectorised scale search (its E2M1 rounding by magic addition, the bound that skips
// candidates, the transposes) on every finite 16-bit pattern, with NaN/Inf patterns zeroed so
// that no tile falls back to the scalar path: ties, subnormal block scales, zero-heavy blocks.
void exhaustive_scale_search(DType t) {
  for (std::vector<std::uint16_t> bits : layouts(t)) {
    const std::uint16_t exp_mask = t == DType::float16 ? 0x7C00 : 0x7F80;
    for (std::uint16_t& b : bits)
      if ((b & exp_mask) == exp_mask) b = 0;
    const Input in16 = input_from_bits(bits, t);
    const Input in32 = make_input(in16.f32, DType::float32);
    const float amax = ref::amax_finite(in16.f32.data(), static_cast<std::int64_t>(in16.f32.size()));
    std::vector<NamedSpec> specs;
    for (const microscale::ScaleSearch search : {microscale::ScaleSearch::four_over_six, microscale::ScaleSearch::mse})
      for (const std::optional<float> g : {std::optional<float>{}, std::optional<float>{amax}}) {
        QuantSpec s;
        s.scale_search = search;
        s.global_scale = g;
        specs.push_back(
            {std::string("nvfp4 ") + microscale::name(search) + (g ? " 3-level" : ""), microscale::resolve(s)});
      }
    for (const ScaleRule rule : {ScaleRule::ceil, ScaleRule::floor}) {
      QuantSpec s;
      s.mode = Mode::mxfp4;
      s.scale_rule = rule;
      s.scale_search = microscale::ScaleSearch::mse;
      specs.push_back({std::string("mxfp4 mse ") + microscale::name(rule), microscale::resolve(s)});
    }
    for (const Input* in : {&in16, &in32})
      for (const NamedSpec& ns : specs) expect_matches(*in, 16, 4096, ns, "scale search, every finite pattern");
  }
}

TEST(CpuQuantize, ScaleSearchEveryFiniteBf16Pattern) { exhaustive_scale_search(DType::bfloat16); }
TEST(CpuQuantize, ScaleSearchEveryFiniteF16Pattern) { exhaustive_scale_search(DType::float16); }

TEST(CpuQuantize, EveryBf16Pattern) { exhaustive(DType::bfloat16); }
TEST(CpuQuantize, EveryF16Pattern) { exhaustive(DType::float16); }

// 'saturate' skips signaling NaNs in block amaxes exactly like quiet ones (see quiet_nans).
TEST(CpuQuantize, SaturateSkipsSignalingNaN) {
  for (const DType t : kDtypes) {
    const std::uint32_t snan = t == DType::float32 ? 0x7F800001u : t == DType::bfloat16 ? 0x7F81u : 0x7C01u;
    std::vector<float> v = corner_data(4096, 32, t, false, 5);
    const Input base = make_input(v, t);
    Input signaling = base;
    const std::size_t es = microscale::dtype_size(t);
    for (std::size_t i = 3; i < v.size(); i += 7) {
      std::memcpy(signaling.bytes.data() + i * es, &snan, es);
      signaling.f32[i] = microscale::detail::load_f32(signaling.bytes.data() + i * es, t);
    }
    const Input quieted = quiet_nans(signaling);
    for (const NamedSpec& ns : fp_specs(4096, NonFinite::saturate, {1.0f})) {
      const QuantSpec& s = ns.spec;
      for_each_target([&](const std::string& where) {
        const QOut a = run_cpu(signaling, 1, 4096, s), b = run_cpu(quieted, 1, 4096, s);
        EXPECT_TRUE(a.packed == b.packed && a.scales == b.scales) << ns.name << " " << where;
      });
    }
  }
}

TEST(CpuQuantize, EmptyInput) {
  const Input in = make_input({}, DType::float32);
  QuantSpec s;
  for_each_target([&](const std::string&) {
    cpu::quantize(in.bytes.data(), DType::float32, 0, 16, microscale::resolve(s), nullptr, nullptr, nullptr);
  });
}

}  // namespace

// The searched scale modes (scale_search 4over6 / mse) give the reference's bytes on every target
// and thread count: corner-case data (heavy tails, outliers, ties, subnormals, NaN/Inf) and a
// heavy-tailed Gaussian, two-level and three-level nvfp4, mxfp4 under two scale rules.
TEST(CpuQuantize, ScaleSearchMatchesReference) {
  using microscale::ScaleSearch;
  std::uint64_t seed = 101;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (const DType t : kDtypes)
    for (int data = 0; data < 3; ++data) {
      const std::int64_t rows = 9, K = 256;
      const auto n = static_cast<std::size_t>(rows * K);
      std::vector<float> v;
      if (data == 2) {
        for (std::size_t i = 0; i < n; ++i) v.push_back(normal(rng) * std::exp(1.5f * normal(rng)));
      } else {
        v = corner_data(n, 16, t, data == 1, seed++);
      }
      const Input in = make_input(v, t);
      const float amax = microscale::reference::amax_finite(in.f32.data(), static_cast<std::int64_t>(n));
      for (const NonFinite p : {NonFinite::propagate, NonFinite::saturate}) {
        std::vector<NamedSpec> specs;
        for (const ScaleSearch search : {ScaleSearch::four_over_six, ScaleSearch::mse}) {
          const std::string sname = microscale::name(search);
          for (const std::optional<float> g :
               {std::optional<float>{}, std::optional<float>{amax},
                std::optional<float>{std::fmin(amax * 1.03125f, kFltMax)}, std::optional<float>{0.0f}}) {
            QuantSpec s;
            s.mode = Mode::nvfp4;
            s.nonfinite = p;
            s.scale_search = search;
            s.global_scale = g;
            specs.push_back({"nvfp4 " + sname + (g ? " gs " + std::to_string(*g) : ""), microscale::resolve(s)});
          }
        }
        for (const ScaleRule rule : {ScaleRule::ceil, ScaleRule::floor, ScaleRule::nearest}) {
          QuantSpec s;
          s.mode = Mode::mxfp4;
          s.nonfinite = p;
          s.scale_rule = rule;
          s.scale_search = ScaleSearch::mse;
          specs.push_back({std::string("mxfp4 mse ") + microscale::name(rule), microscale::resolve(s)});
        }
        for (const NamedSpec& ns : specs) expect_matches(in, rows, K, ns, "scale search data " + std::to_string(data));
      }
    }
}

// Three-level mse's global search (cpu::nvfp4_global_errors): each candidate's total is the sum
// of the same float32 block errors as the reference's, added in block order within a chunk of
// 1024 blocks, so totals over at most 1024 blocks match bit for bit (NaN where float32 errors
// overflow at the extreme global scales), and so do the chosen block scales; encoding the blocks
// with those scales (cpu::nvfp4_encode) gives the reference's codes. Every finite 16-bit pattern
// (three layouts), corner-case and heavy-tailed data, whole tiles and a ragged tail, global
// scales from the candidates' range to the clamps; NaN or Inf anywhere answers false.
TEST(CpuQuantize, Nvfp4GlobalErrorsMatchReference) {
  constexpr std::int64_t kChunk = 1024, G = 16;
  std::vector<Input> inputs;
  for (const DType t : {DType::bfloat16, DType::float16})
    for (std::vector<std::uint16_t> bits : layouts(t)) {
      const std::uint16_t exp_mask = t == DType::float16 ? 0x7C00 : 0x7F80;
      for (std::uint16_t& b : bits)
        if ((b & exp_mask) == exp_mask) b = 0;
      inputs.push_back(input_from_bits(bits, t));
      inputs.push_back(make_input(inputs.back().f32, DType::float32));
    }
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> tails(G * 1000);
  for (float& v : tails) v = normal(rng) * std::exp(2.0f * normal(rng));
  auto finite_input = [](std::vector<float> v, DType t) {  // values t rounds to Inf become 0
    const Input in = make_input(v, t);
    for (std::size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(in.f32[i])) v[i] = 0.0f;
    return make_input(v, t);
  };
  for (const DType t : kDtypes) {
    inputs.push_back(finite_input(corner_data(G * 1000, 16, t, false, 11), t));
    inputs.push_back(finite_input(tails, t));
  }
  for (const Input& in : inputs) {
    const auto blocks = static_cast<std::int64_t>(in.f32.size()) / G;
    const float amax = ref::amax_finite(in.f32.data(), blocks * G);
    std::vector<float> globals;
    for (const float c : microscale::numerics::kNvfp4GlobalCandidates) globals.push_back(std::fmin(amax * c, kFltMax));
    for (const float g : {0.0f, 1e-37f, kFltMax}) globals.push_back(g);
    const int n = static_cast<int>(globals.size());
    const std::size_t es = microscale::dtype_size(in.dtype);
    for (std::int64_t b0 = 0; b0 < blocks; b0 += kChunk) {
      const std::int64_t nb = std::min(kChunk, blocks - b0) - (b0 == 0 ? 3 : 0);  // one ragged slice
      const auto codes_size = static_cast<std::size_t>(n * nb);
      std::vector<double> want(n), got(n);
      std::vector<std::uint8_t> want_codes(codes_size), got_codes(codes_size), want_packed(nb * G / 2),
          got_packed(nb * G / 2);
      const float* xf = in.f32.data() + b0 * G;
      ASSERT_TRUE(ref::nvfp4_global_errors(xf, nb, globals.data(), n, want.data(), want_codes.data()));
      const std::string what = std::string(microscale::dtype_name(in.dtype)) + " blocks " + std::to_string(b0) + "+" +
                               std::to_string(nb) + " global ";
      for_each_target([&](const std::string& where) {
        const std::byte* xb = in.bytes.data() + b0 * G * es;
        ASSERT_TRUE(cpu::nvfp4_global_errors(xb, in.dtype, nb, globals.data(), n, got.data(), got_codes.data()))
            << where;
        EXPECT_EQ(first_diff(got_codes, want_codes), -1) << what << where;
        for (int c = 0; c < n; ++c) {
          EXPECT_TRUE(got[c] == want[c] || (std::isnan(got[c]) && std::isnan(want[c])))
              << got[c] << " != " << want[c] << " " << what << globals[c] << " " << where;
          const std::uint8_t* scales = want_codes.data() + c * nb;
          ref::nvfp4_encode(xf, nb, globals[c], scales, want_packed.data());
          cpu::nvfp4_encode(xb, in.dtype, nb, globals[c], scales, got_packed.data());
          EXPECT_EQ(first_diff(got_packed, want_packed), -1) << "encode " << what << globals[c] << " " << where;
        }
      });
    }
  }
  std::vector<float> bad(G * 40, 1.0f);
  bad[G * 37 + 5] = kInf;
  const Input in = make_input(bad, DType::float32);
  double totals[1];
  const float g = 1.0f;
  EXPECT_FALSE(ref::nvfp4_global_errors(in.f32.data(), 40, &g, 1, totals));
  for_each_target([&](const std::string& where) {
    EXPECT_FALSE(cpu::nvfp4_global_errors(in.bytes.data(), DType::float32, 40, &g, 1, totals, nullptr)) << where;
  });
}
