// Non-finite input policies, FORMATS.md 2.4.
#include <gtest/gtest.h>

#include "support.hpp"

namespace ms = microscale;
using namespace mst;

namespace {

ms::QuantSpec spec(ms::Mode mode, ms::NonFinite nf, std::optional<float> gs = std::nullopt,
                   ms::Elem elem = ms::Elem::e4m3) {
  ms::QuantSpec s;
  s.mode = mode;
  s.nonfinite = nf;
  s.global_scale = gs;
  s.elem = elem;
  return s;
}

struct ModeCase {
  ms::QuantSpec spec;
  int group;
};

std::vector<ModeCase> propagate_cases() {
  const auto p = ms::NonFinite::propagate;
  ms::QuantSpec aff = spec(ms::Mode::affine, p);
  return {{spec(ms::Mode::nvfp4, p), 16},
          {spec(ms::Mode::nvfp4, p, 5.0f), 16},
          {spec(ms::Mode::mxfp4, p), 32},
          {spec(ms::Mode::mxfp8, p), 32},
          {spec(ms::Mode::mxfp8, p, std::nullopt, ms::Elem::e5m2), 32},
          {aff, 64}};
}

// Per group: [start byte, end byte) of group g in a packed row.
std::pair<std::size_t, std::size_t> group_bytes(const ms::Quantized& q, std::int64_t g) {
  const std::int64_t per = q.spec.group_size * q.spec.bits / 8;
  return {static_cast<std::size_t>(g * per), static_cast<std::size_t>((g + 1) * per)};
}

TEST(NonFinite, PropagateMarksOnlyTheBlock) {
  for_each_backend([&] {
    for (const ModeCase& mc : propagate_cases()) {
      for (float bad : {kNaN, kInf, -kInf}) {
        const std::int64_t k = 4 * mc.group;
        std::vector<float> x = make_data(static_cast<std::size_t>(k), Dist::gaussian, 21);
        std::vector<float> clean = x;
        const std::int64_t g = 2;  // poisoned group
        x[static_cast<std::size_t>(g * mc.group + 3)] = bad;
        ms::Quantized q = ms::quantize(view(x, {1, k}), mc.spec);
        ms::Quantized qc = ms::quantize(view(clean, {1, k}), mc.spec);
        const std::string what = std::string(ms::name(mc.spec.mode)) + " bad " + std::to_string(bad);
        const auto [b0, b1] = group_bytes(q, g);
        const std::vector<std::uint8_t> p = bytes(q.packed), pc = bytes(qc.packed);
        for (std::size_t i = 0; i < p.size(); ++i) {
          if (i >= b0 && i < b1)
            EXPECT_EQ(p[i], 0) << what << " byte " << i;
          else
            EXPECT_EQ(p[i], pc[i]) << what << " byte " << i;
        }
        if (mc.spec.mode == ms::Mode::affine) {
          std::vector<float> s = values(q.scales), sc = values(qc.scales), b = values(q.biases), bc = values(qc.biases);
          for (std::size_t j = 0; j < s.size(); ++j) {
            if (static_cast<std::int64_t>(j) == g) {
              EXPECT_TRUE(std::isnan(s[j]) && std::isnan(b[j])) << what;
            } else {
              EXPECT_TRUE(same_bits(s[j], sc[j]) && same_bits(b[j], bc[j])) << what << " group " << j;
            }
          }
        } else {
          std::vector<std::uint8_t> s = bytes(q.scales), sc = bytes(qc.scales);
          const std::uint8_t nan_code = mc.spec.mode == ms::Mode::nvfp4 ? 0x7F : 0xFF;
          for (std::size_t j = 0; j < s.size(); ++j)
            EXPECT_EQ(s[j], static_cast<std::int64_t>(j) == g ? nan_code : sc[j]) << what << " group " << j;
        }
        for (DType out : {DType::float32, DType::bfloat16, DType::float16}) {
          std::vector<float> y = values(ms::dequantize(q, out)), yc = values(ms::dequantize(qc, out));
          for (std::size_t i = 0; i < y.size(); ++i) {
            if (static_cast<std::int64_t>(i) / mc.group == g)
              EXPECT_TRUE(std::isnan(y[i])) << what << " i " << i;
            else
              EXPECT_TRUE(same_bits(y[i], yc[i])) << what << " i " << i;
          }
        }
      }
    }
  });
}

TEST(NonFinite, PropagateIsTheDefault) {
  for_each_backend([&] {
    std::vector<float> x(32, 1.0f);
    x[0] = kNaN;
    ms::QuantSpec s;
    s.mode = ms::Mode::mxfp4;
    EXPECT_EQ(s.nonfinite, ms::NonFinite::propagate);
    EXPECT_EQ(ms::quantize(view(x, {1, 32}), s).scales.data<std::uint8_t>()[0], 0xFF);
  });
}

TEST(NonFinite, ErrorNamesTheFirstElement) {
  for_each_backend([&] {
    struct Case {
      float bad;
      const char* cls;
    };
    for (const Case& c : {Case{kNaN, "NaN"}, Case{kInf, "+Inf"}, Case{-kInf, "-Inf"}}) {
      for (ms::Mode mode : {ms::Mode::nvfp4, ms::Mode::mxfp4, ms::Mode::mxfp8, ms::Mode::affine}) {
        // Shape [3, 64]; the first non-finite in row-major order is (1, 37), flat 101; a later one
        // at (2, 0) must not be the one named.
        std::vector<float> x(3 * 64, 0.5f);
        x[1 * 64 + 37] = c.bad;
        x[2 * 64 + 0] = kNaN;
        try {
          ms::quantize(view(x, {3, 64}), spec(mode, ms::NonFinite::error));
          ADD_FAILURE() << "no error for " << c.cls << " in " << ms::name(mode);
        } catch (const ms::Error& e) {
          const std::string msg = e.what();
          EXPECT_NE(msg.find("101"), std::string::npos) << msg;
          EXPECT_NE(msg.find(ms::shape_str({1, 37})), std::string::npos) << msg;
          EXPECT_NE(msg.find(c.cls), std::string::npos) << msg;
        }
      }
    }
  });
}

TEST(NonFinite, ErrorUsesLogicalOrderOfStridedViews) {
  for_each_backend([&] {
    // Logical [2, 32] read from a [32, 2] buffer transposed: logical (1, 5) is memory offset 11,
    // logical (0, 20) is memory offset 40. In memory the (1, 5) value comes first, but row-major
    // logical order names (0, 20), flat 20.
    std::vector<float> buf(64, 1.0f);
    buf[5 * 2 + 1] = kInf;   // logical (1, 5)
    buf[20 * 2 + 0] = kNaN;  // logical (0, 20)
    TensorView v(buf.data(), DType::float32, {2, 32}, {1, 2});
    try {
      ms::quantize(v, spec(ms::Mode::mxfp4, ms::NonFinite::error));
      ADD_FAILURE() << "no error";
    } catch (const ms::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("20"), std::string::npos) << msg;
      EXPECT_NE(msg.find(ms::shape_str({0, 20})), std::string::npos) << msg;
      EXPECT_NE(msg.find("NaN"), std::string::npos) << msg;
    }
  });
}

TEST(NonFinite, ErrorPolicyAcceptsFiniteInput) {
  for_each_backend([&] {
    std::vector<float> x = make_data(64, Dist::student_t3, 2);
    for (ms::Mode mode : {ms::Mode::nvfp4, ms::Mode::mxfp4, ms::Mode::mxfp8, ms::Mode::affine}) {
      ms::Quantized a = ms::quantize(view(x, {1, 64}), spec(mode, ms::NonFinite::error));
      ms::Quantized b = ms::quantize(view(x, {1, 64}), spec(mode, ms::NonFinite::propagate));
      EXPECT_EQ(bytes(a.packed), bytes(b.packed));
      EXPECT_EQ(bytes(a.scales), bytes(b.scales));
    }
  });
}

std::uint8_t nib(const ms::Quantized& q, int i) {
  std::uint8_t b = q.packed.data<std::uint8_t>()[i / 2];
  return (i % 2) ? b >> 4 : b & 0xF;
}

TEST(NonFinite, SaturateNvfp4) {
  for_each_backend([&] {
    const auto sat = ms::NonFinite::saturate;
    // A block with Inf: scale 448, Inf -> +-6, NaN -> +6, finite values divided by 448.
    std::vector<float> x = {kInf, -kInf, kNaN, 100.0f, -300.0f, 1.0f, 0, -0.0f, 224.0f, 0, 0, 0, 0, 0, 0, 0};
    for (std::optional<float> gs : {std::optional<float>{}, std::optional<float>{1000.0f}}) {
      ms::Quantized q = ms::quantize(view(x, {1, 16}), spec(ms::Mode::nvfp4, sat, gs));
      EXPECT_EQ(q.scales.data<std::uint8_t>()[0], 0x7E);
      EXPECT_EQ(nib(q, 0), 0x7);
      EXPECT_EQ(nib(q, 1), 0xF);
      EXPECT_EQ(nib(q, 2), 0x7);
      RefFp r = ref_nvfp4({448.0f * 6, 100.0f, -300.0f, 1.0f, 0, -0.0f, 224.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0}, gs);
      ASSERT_EQ(r.scales[0], 0x7E);
      for (int i = 3; i < 16; ++i) EXPECT_EQ(nib(q, i), r.codes[static_cast<std::size_t>(i - 2)]) << i;
    }
    // All-NaN block: amax skips NaN -> 0, scale 0, codes +6, decodes to 0.
    std::vector<float> nan(16, kNaN);
    ms::Quantized qn = ms::quantize(view(nan, {1, 16}), spec(ms::Mode::nvfp4, sat));
    EXPECT_EQ(qn.scales.data<std::uint8_t>()[0], 0x00);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(nib(qn, i), 0x7);
    for (float v : values(ms::dequantize(qn, DType::float32))) EXPECT_EQ(v, 0.0f);
    // NaN among finite values: the scale comes from the finite ones.
    std::vector<float> mixed = {kNaN, 3.0f, -1.5f, 0.75f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    ms::Quantized qm = ms::quantize(view(mixed, {1, 16}), spec(ms::Mode::nvfp4, sat));
    EXPECT_EQ(qm.scales.data<std::uint8_t>()[0], 0x30);  // 3/6 = 0.5
    EXPECT_EQ(nib(qm, 0), 0x7);
    EXPECT_EQ(nib(qm, 1), 0x7);  // 3 / 0.5 = 6
    EXPECT_EQ(nib(qm, 2), 0xD);  // -3
    EXPECT_EQ(nib(qm, 3), 0x3);  // 1.5
  });
}

TEST(NonFinite, SaturateMx) {
  for_each_backend([&] {
    const auto sat = ms::NonFinite::saturate;
    std::vector<float> x(32, 0.0f);
    x[0] = kInf;
    x[1] = -kInf;
    x[2] = kNaN;
    x[3] = 1e30f;  // * 2^-127 ~ 1.7e-8: flushes to (signed) zero
    x[4] = -5.0f;
    {
      ms::Quantized q = ms::quantize(view(x, {1, 32}), spec(ms::Mode::mxfp4, sat));
      EXPECT_EQ(q.scales.data<std::uint8_t>()[0], 0xFE);
      EXPECT_EQ(nib(q, 0), 0x7);
      EXPECT_EQ(nib(q, 1), 0xF);
      EXPECT_EQ(nib(q, 2), 0x7);
      EXPECT_EQ(nib(q, 3), 0x0);
      EXPECT_EQ(nib(q, 4), 0x8);
    }
    const struct {
      ms::Elem elem;
      std::uint8_t max;
    } elems[] = {{ms::Elem::e4m3, 0x7E}, {ms::Elem::e5m2, 0x7B}};
    for (const auto& e : elems) {
      ms::Quantized q = ms::quantize(view(x, {1, 32}), spec(ms::Mode::mxfp8, sat, std::nullopt, e.elem));
      const std::uint8_t* p = q.packed.data<std::uint8_t>();
      EXPECT_EQ(q.scales.data<std::uint8_t>()[0], 0xFE);
      EXPECT_EQ(p[0], e.max);
      EXPECT_EQ(p[1], e.max | 0x80);
      EXPECT_EQ(p[2], 0x7F);
      EXPECT_EQ(p[4], 0x80);
    }
    // NaN among finite values: scale from the finite ones (bamax 448 -> 127), NaN -> 0x7F.
    std::vector<float> m(32, 1.0f);
    m[0] = 448.0f;
    m[7] = kNaN;
    ms::Quantized q8 = ms::quantize(view(m, {1, 32}), spec(ms::Mode::mxfp8, sat));
    EXPECT_EQ(q8.scales.data<std::uint8_t>()[0], 127);
    EXPECT_EQ(q8.packed.data<std::uint8_t>()[0], 0x7E);
    EXPECT_EQ(q8.packed.data<std::uint8_t>()[7], 0x7F);
    EXPECT_EQ(q8.packed.data<std::uint8_t>()[8], 0x38);
  });
}

TEST(NonFinite, SaturateIsPropagateForAffine) {
  for_each_backend([&] {
    std::vector<float> x = make_data(128, Dist::gaussian, 4);
    x[70] = kInf;
    ms::Quantized a = ms::quantize(view(x, {1, 128}), spec(ms::Mode::affine, ms::NonFinite::saturate));
    ms::Quantized b = ms::quantize(view(x, {1, 128}), spec(ms::Mode::affine, ms::NonFinite::propagate));
    EXPECT_EQ(bytes(a.packed), bytes(b.packed));
    EXPECT_EQ(bytes(a.scales), bytes(b.scales));
    EXPECT_EQ(bytes(a.biases), bytes(b.biases));
    EXPECT_TRUE(std::isnan(a.scales.data<float>()[1]));
  });
}

}  // namespace
