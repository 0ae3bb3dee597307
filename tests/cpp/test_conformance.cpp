// Every mode, scale rule, element format and input dtype against the oracle of support.hpp,
// bit for bit (packed bytes, scales, biases, dequantized values), on Gaussian, heavy-tailed,
// tie-rich and wide-range data.
#include <gtest/gtest.h>

#include <sstream>

#include "support.hpp"

namespace ms = microscale;
using namespace mst;

namespace {

struct Case {
  ms::QuantSpec spec;
  DType dtype;
  Dist dist;
  std::string label() const {
    std::ostringstream o;
    o << ms::name(spec.mode) << " g" << spec.group_size << " b" << spec.bits << " rule " << ms::name(spec.scale_rule)
      << " elem " << ms::name(spec.elem) << " gs " << (spec.global_scale ? std::to_string(*spec.global_scale) : "-")
      << " dtype " << ms::dtype_name(dtype) << " dist " << static_cast<int>(dist);
    return o.str();
  }
};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  const Dist dists[] = {Dist::gaussian, Dist::student_t3, Dist::tie_rich, Dist::wide_range};
  for (DType t : {DType::float32, DType::bfloat16, DType::float16}) {
    for (Dist d : dists) {
      if (t == DType::float16 && d == Dist::wide_range) continue;  // would overflow f16
      ms::QuantSpec s;
      s.mode = ms::Mode::nvfp4;
      cases.push_back({s, t, d});
      s.global_scale = 0.0f;  // placeholder: filled with the data's amax in the test
      cases.push_back({s, t, d});
      for (ms::ScaleRule r : {ms::ScaleRule::ceil, ms::ScaleRule::floor, ms::ScaleRule::even, ms::ScaleRule::nearest}) {
        ms::QuantSpec m;
        m.mode = ms::Mode::mxfp4;
        m.scale_rule = r;
        cases.push_back({m, t, d});
        m.mode = ms::Mode::mxfp8;
        for (ms::Elem e : {ms::Elem::e4m3, ms::Elem::e5m2}) {
          m.elem = e;
          cases.push_back({m, t, d});
        }
      }
      for (int bits : {2, 3, 4, 5, 6, 8})
        for (int g : {32, 64, 128}) {
          ms::QuantSpec a;
          a.mode = ms::Mode::affine;
          a.bits = bits;
          a.group_size = g;
          cases.push_back({a, t, d});
        }
    }
  }
  return cases;
}

class Conformance : public ::testing::TestWithParam<int> {};

TEST_P(Conformance, MatchesOracleBitForBit) {
  static const std::vector<Case> cases = all_cases();
  const Case& c = cases[static_cast<std::size_t>(GetParam())];
  // Even cases: 6 x 256; odd cases: 5 rows of 7 groups, so SIMD loops get ragged tails.
  const bool odd = GetParam() % 2 == 1;
  const std::int64_t rows = odd ? 5 : 6, k = odd ? 7 * ms::resolve(c.spec).group_size : 256;
  std::vector<float> x =
      make_data(static_cast<std::size_t>(rows * k), c.dist, 1000 + static_cast<std::uint64_t>(GetParam()));
  std::vector<std::uint16_t> h;
  TensorView xv = view(x, {rows, k});
  if (c.dtype != DType::float32) {
    h = to_half(x, c.dtype);
    x = widen(h, c.dtype);
    xv = view(h, c.dtype, {rows, k});
  }
  ms::QuantSpec spec = c.spec;
  if (spec.global_scale) {
    spec.global_scale = ms::global_scale(xv);
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    ASSERT_EQ(*spec.global_scale, amax);
  }
  const std::string label = c.label();

  // The oracle: expected packed bytes, scales (bytes, or f32 values for affine), biases, and the
  // dequantized f32 values.
  std::vector<std::uint8_t> want_packed, want_scales;
  std::vector<float> want_scale_values, want_biases, want;
  if (spec.mode == ms::Mode::nvfp4) {
    RefFp r = ref_nvfp4(x, spec.global_scale);
    want_scales = r.scales;
    want_packed = pack_fp4(r.codes);
    for (std::size_t i = 0; i < x.size(); ++i)
      want.push_back(ref_nvfp4_value(r.codes[i], r.scales[i / 16], spec.global_scale));
  } else if (spec.mode == ms::Mode::mxfp4 || spec.mode == ms::Mode::mxfp8) {
    const Fmt f = spec.mode == ms::Mode::mxfp4 ? Fmt::e2m1 : spec.elem == ms::Elem::e4m3 ? Fmt::e4m3 : Fmt::e5m2;
    RefFp r = ref_mx(x, f, spec.scale_rule, c.dtype);
    want_scales = r.scales;
    want_packed = f == Fmt::e2m1 ? pack_fp4(r.codes) : r.codes;
    for (std::size_t i = 0; i < x.size(); ++i) want.push_back(ref_mx_value(f, r.codes[i], r.scales[i / 32]));
  } else {
    RefAffine r = ref_affine(x, spec.group_size, spec.bits, c.dtype);
    want_scale_values = r.scales;
    want_biases = r.biases;
    want_packed = pack_bits(r.codes, k, spec.bits);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const std::size_t g = i / static_cast<std::size_t>(spec.group_size);
      want.push_back(static_cast<float>(r.codes[i]) * r.scales[g] + r.biases[g]);
    }
  }

  for (const BackendConfig& b : backend_configs()) {
    UseBackend use(b);
    const std::string where = label + " on " + b.label;
    ms::Quantized q = ms::quantize(xv, spec);
    ASSERT_EQ(bytes(q.packed), want_packed) << where;
    if (spec.mode == ms::Mode::affine) {
      ASSERT_EQ(q.scales.dtype(), c.dtype) << where;
      ASSERT_EQ(values(q.scales), want_scale_values) << where;
      ASSERT_EQ(values(q.biases), want_biases) << where;
    } else {
      ASSERT_EQ(bytes(q.scales), want_scales) << where;
    }
    // Dequantize to every output dtype: the f32 value rounded once.
    for (DType out : {DType::float32, DType::bfloat16, DType::float16}) {
      Tensor y = ms::dequantize(q, out);
      ASSERT_EQ(y.dtype(), out);
      ASSERT_EQ(y.shape(), (Shape{rows, k}));
      std::vector<float> got = values(y);
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_TRUE(same_bits(got[i], round_to(out, want[i])))
            << where << " out " << ms::dtype_name(out) << " i " << i << " got " << got[i] << " want " << want[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllModes, Conformance, ::testing::Range(0, static_cast<int>(all_cases().size())));

}  // namespace
