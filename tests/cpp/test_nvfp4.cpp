// nvfp4 (FORMATS.md 2.1): the TE vectors, two- and three-level formulas, the zero-scale corner.
#include <gtest/gtest.h>

#include "support.hpp"

namespace ms = microscale;
using namespace mst;

namespace {

ms::QuantSpec nvfp4(std::optional<float> global = std::nullopt) {
  ms::QuantSpec s;
  s.mode = ms::Mode::nvfp4;
  s.global_scale = global;
  return s;
}

std::uint8_t nibble(const Tensor& packed, std::int64_t i) {
  std::uint8_t b = packed.data<std::uint8_t>()[i / 2];
  return (i % 2) ? b >> 4 : b & 0xF;
}

TEST(Nvfp4, ResolvedSpecAndShapes) {
  for_each_backend([&] {
    std::vector<float> x(3 * 64, 1.0f);
    ms::Quantized q = ms::quantize(view(x, {3, 64}), nvfp4());
    EXPECT_EQ(q.spec.group_size, 16);
    EXPECT_EQ(q.spec.bits, 4);
    EXPECT_FALSE(q.spec.global_scale.has_value());
    EXPECT_EQ(q.shape, (Shape{3, 64}));
    EXPECT_EQ(q.packed.dtype(), DType::uint8);
    EXPECT_EQ(q.packed.shape(), (Shape{3, 32}));
    EXPECT_EQ(q.scales.dtype(), DType::uint8);
    EXPECT_EQ(q.scales.shape(), (Shape{3, 4}));
    EXPECT_TRUE(q.biases.empty());
    ms::Quantized q3 = ms::quantize(view(x, {3, 64}), nvfp4(2.0f));
    ASSERT_TRUE(q3.spec.global_scale.has_value());
    EXPECT_EQ(*q3.spec.global_scale, 2.0f);
  });
}

// TE PR #2639 scale vector: exact bamax*448/amax = 336 is an E4M3 tie (320 | 352); TE's order
// fl(bamax * fl(S_enc * C6)) gives 336.00003 -> 0x7B, the other order would give 0x7A.
TEST(Nvfp4, TeScaleVector) {
  for_each_backend([&] {
    const float amax = 18.25f, bamax = 13.6875f;
    // The hand derivation of the vector, in f32.
    const float s_enc = 2688.0f / amax;
    EXPECT_GT(bamax * (s_enc * kC6), 336.0f);
    EXPECT_EQ((bamax / 6.0f) * s_enc, 336.0f);

    std::vector<float> x(16, 0.0f);
    x[3] = -bamax;
    x[7] = 1.0f;
    ms::Quantized q = ms::quantize(view(x, {1, 16}), nvfp4(amax));
    EXPECT_EQ(q.scales.data<std::uint8_t>()[0], 0x7B);
    EXPECT_EQ(ms::decode_e4m3(0x7B), 352.0f);
  });
}

// TE element vector: amax 11.125, bamax 2.390625 -> s = 0x6C (96); x = 0.6953125 has exact
// x * enc = 1.75 (an E2M1 tie) but TE's enc = fl(1/fl(sf*S_dec)) gives 1.7499999 -> idx 3.
TEST(Nvfp4, TeElementVector) {
  for_each_backend([&] {
    const float amax = 11.125f, bamax = 2.390625f, xv = 0.6953125f;
    std::vector<float> x(16, 0.0f);
    x[0] = bamax;
    x[5] = xv;
    x[6] = -xv;
    ms::Quantized q = ms::quantize(view(x, {1, 16}), nvfp4(amax));
    ASSERT_EQ(q.scales.data<std::uint8_t>()[0], 0x6C);
    EXPECT_EQ(ms::decode_e4m3(0x6C), 96.0f);
    EXPECT_EQ(nibble(q.packed, 5), 3);
    EXPECT_EQ(nibble(q.packed, 6), 0xB);
    // bamax itself: exact 2.390625 * 2688/11.125/96 = 6.0166..., rounds/saturates to 6.
    EXPECT_EQ(nibble(q.packed, 0), 7);
    // Derivation check in f32.
    const float s_enc = 2688.0f / amax, s_dec = 1.0f / s_enc;
    const float enc = 1.0f / (96.0f * s_dec);
    EXPECT_LT(xv * enc, 1.75f);
    EXPECT_GT(xv * (s_enc / 96.0f), 1.75f);
  });
}

TEST(Nvfp4, TwoLevelByFormula) {
  for_each_backend([&] {
    // Block 0: bamax 6 -> s = rn(6*C6) = 1.0 (0x38); elements are their own E2M1 codes.
    // Block 1: bamax 3 -> s = 0.5 (0x30), x/0.5.
    // Block 2: bamax 7 -> 7/6 = 1.1666 -> E4M3 1.125 (0x39), enc = fl(1/1.125).
    std::vector<float> x = {6,     0.25f, 0.75f, 1.25f, 1.75f, 2.5f,   3.5f,   5,      -0.25f, -0.75f, -1.25f, -1.75f,
                            -2.5f, -3.5f, -5,    -6,    3,     0.125f, 0.375f, 0.625f, 0.875f, 1.25f,  1.75f,  2.5f,
                            0,     -0.0f, 0.1f,  -0.1f, 1,     2,      -3,     1.5f,   7,      1,      2,      3,
                            4,     5,     6,     -7,    0.5f,  0.6f,   0.7f,   0.8f,   0.9f,   1.1f,   1.2f,   1.3f};
    ms::Quantized q = ms::quantize(view(x, {1, 48}), nvfp4());
    const auto* s = q.scales.data<std::uint8_t>();
    EXPECT_EQ(s[0], 0x38);
    EXPECT_EQ(s[1], 0x30);
    EXPECT_EQ(s[2], 0x39);
    const int block0[16] = {7, 0, 2, 2, 4, 4, 6, 6, 8, 10, 10, 12, 12, 14, 14, 15};
    for (int i = 0; i < 16; ++i) EXPECT_EQ(nibble(q.packed, i), block0[i]) << i;
    // Block 1 is block 0 halved (ties included), then 0, -0, 0.1, -0.1, 1, 2, -3, 1.5 at scale 0.5.
    const int block1[16] = {7, 0, 2, 2, 4, 4, 6, 6, 0, 8, 0, 8, 4, 6, 15, 5};
    for (int i = 0; i < 16; ++i) EXPECT_EQ(nibble(q.packed, 16 + i), block1[i]) << 16 + i;
    const float enc = 1.0f / 1.125f;
    for (int i = 32; i < 48; ++i) EXPECT_EQ(nibble(q.packed, i), rn_sat(Fmt::e2m1, x[i] * enc)) << i;
    EXPECT_EQ(nibble(q.packed, 32), 7);   // 7/1.125 = 6.22 -> 6
    EXPECT_EQ(nibble(q.packed, 39), 15);  // -7 -> -6

    Tensor y = ms::dequantize(q, DType::float32);
    ASSERT_EQ(y.shape(), (Shape{1, 48}));
    for (int i = 0; i < 48; ++i) {
      const float want = code_value(Fmt::e2m1, nibble(q.packed, i)) * ms::decode_e4m3(s[i / 16]);
      EXPECT_TRUE(same_bits(y.data<float>()[i], want)) << i;
    }
    EXPECT_EQ(y.data<float>()[32], 6.75f);  // 6 * 1.125
  });
}

TEST(Nvfp4, ThreeLevelByFormula) {
  for_each_backend([&] {
    // amax 21504 = 2688 * 8: S_enc = 0.125 exactly (TE's test choice), then a non-power-of-two amax.
    for (float amax : {21504.0f, 1000.0f, 3.3f}) {
      std::vector<float> x = make_data(4 * 64, Dist::student_t3, 11);
      for (float& v : x) v *= amax / 20.0f;
      ms::Quantized q = ms::quantize(view(x, {4, 64}), nvfp4(amax));
      RefFp r = ref_nvfp4(x, amax);
      ASSERT_EQ(bytes(q.scales), r.scales) << "amax " << amax;
      ASSERT_EQ(bytes(q.packed), pack_fp4(r.codes)) << "amax " << amax;
      Tensor y = ms::dequantize(q, DType::float32);
      for (std::size_t i = 0; i < x.size(); ++i) {
        // y = val(q) * fl(fl(sf * amax) * C2688)
        const float sf = ms::decode_e4m3(r.scales[i / 16]);
        const float want = code_value(Fmt::e2m1, r.codes[i]) * ((sf * amax) * kC2688);
        ASSERT_TRUE(same_bits(y.data<float>()[i], want)) << "amax " << amax << " i " << i;
      }
    }
  });
}

TEST(Nvfp4, ThreeLevelSpecialGlobalScales) {
  for_each_backend([&] {
    std::vector<float> x = make_data(32, Dist::gaussian, 3);
    // amax 0 is allowed: S_enc = 1, so codes equal the two-level ones; decode is scaled by 0.
    ms::Quantized q0 = ms::quantize(view(x, {1, 32}), nvfp4(0.0f));
    ms::Quantized q2 = ms::quantize(view(x, {1, 32}), nvfp4());
    EXPECT_EQ(bytes(q0.packed), bytes(q2.packed));
    EXPECT_EQ(bytes(q0.scales), bytes(q2.scales));
    Tensor y0 = ms::dequantize(q0, DType::float32);
    for (float v : values(y0)) EXPECT_EQ(v, 0.0f);
    // A global scale below the true amax is trusted: the scale saturates at 448 and elements clip.
    std::vector<float> big(16, 100.0f);
    ms::Quantized qs = ms::quantize(view(big, {1, 16}), nvfp4(1.0f));
    EXPECT_EQ(qs.scales.data<std::uint8_t>()[0], 0x7E);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(nibble(qs.packed, i), 7);
    // Tiny amax: S_enc clamps to FLT_MAX, decode still uses amax*C2688 (mis-scaled, as TE).
    const float tiny = 1e-37f;
    std::vector<float> t(16, tiny);
    ms::Quantized qt = ms::quantize(view(t, {1, 16}), nvfp4(tiny));
    RefFp rt = ref_nvfp4(t, tiny);
    EXPECT_EQ(bytes(qt.scales), rt.scales);
    EXPECT_EQ(bytes(qt.packed), pack_fp4(rt.codes));
  });
}

// Zero-scale corner: fl(bamax * fl(S_enc*C6)) <= 2^-10 gives s = 0, enc = FLT_MAX and codes
// rn_sat_E2M1(fl(x * FLT_MAX)), which all decode to +-0.
TEST(Nvfp4, ZeroScaleCornerCodes) {
  for_each_backend([&] {
    const float amax = 1.0e6f;  // bamax <= ~amax/458752 = 2.18 gives scale 0
    std::vector<float> x(16, 0.0f);
    x[0] = 1e-3f;      // * FLT_MAX = 3.4e35 -> +6
    x[1] = -1e-3f;     // -> -6
    x[2] = 0.0f;       // -> +0
    x[3] = -0.0f;      // -> -0 (0x8)
    x[4] = 1e-38f;     // * FLT_MAX = 3.4 -> idx 5 (3)
    x[5] = 2e-39f;     // * FLT_MAX = 0.68 -> idx 1 (0.5)
    x[6] = bits_f(1);  // 2^-149 * FLT_MAX = 4.8e-7 -> 0
    x[7] = -5e-39f;    // -1.7 -> idx 3 negative (0xB)
    x[8] = 2.0f;       // bamax 2: 2 * 2688/1e6 / 6 = 8.96e-4 <= 2^-10 -> still scale 0
    ms::Quantized q = ms::quantize(view(x, {1, 16}), nvfp4(amax));
    ASSERT_EQ(q.scales.data<std::uint8_t>()[0], 0x00);
    const int want[9] = {0x7, 0xF, 0x0, 0x8, 0x5, 0x1, 0x0, 0xB, 0x7};
    for (int i = 0; i < 9; ++i) EXPECT_EQ(nibble(q.packed, i), want[i]) << i;
    for (int i = 0; i < 9; ++i) EXPECT_EQ(nibble(q.packed, i), rn_sat(Fmt::e2m1, x[i] * FLT_MAX)) << i;
    Tensor y = ms::dequantize(q, DType::float32);
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(y.data<float>()[i], 0.0f) << i;
      EXPECT_EQ(std::signbit(y.data<float>()[i]), (nibble(q.packed, i) & 8) != 0) << i;
    }
    // Just above the corner the scale is the smallest subnormal E4M3 (2^-9).
    std::vector<float> z(16, 0.0f);
    z[0] = 2.5f;  // 2.5 * 2688/1e6/6 = 1.12e-3 > 2^-10 -> 0x01
    ms::Quantized qz = ms::quantize(view(z, {1, 16}), nvfp4(amax));
    EXPECT_EQ(qz.scales.data<std::uint8_t>()[0], 0x01);
  });
}

TEST(Nvfp4, AllZeroBlockTwoLevel) {
  for_each_backend([&] {
    std::vector<float> x(32, 0.0f);
    x[17] = -0.0f;
    ms::Quantized q = ms::quantize(view(x, {1, 32}), nvfp4());
    EXPECT_EQ(q.scales.data<std::uint8_t>()[0], 0x00);
    EXPECT_EQ(nibble(q.packed, 0), 0x0);
    EXPECT_EQ(nibble(q.packed, 17), 0x8);
    Tensor y = ms::dequantize(q, DType::float32);
    for (float v : values(y)) EXPECT_EQ(v, 0.0f);
  });
}

TEST(Nvfp4, GlobalScaleIgnoresNonFinite) {
  for_each_backend([&] {
    std::vector<float> x = {1.0f, -7.5f, kNaN, 3.0f, -kInf, kInf, 2.0f, 0.0f};
    EXPECT_EQ(ms::global_scale(view(x, {8})), 7.5f);
    std::vector<float> none = {kNaN, kInf, -kInf, kNaN};
    EXPECT_EQ(ms::global_scale(view(none, {4})), 0.0f);
    std::vector<std::uint16_t> h = to_half({0.5f, -65504.0f, 3.0f, 1.0f}, DType::float16);
    EXPECT_EQ(ms::global_scale(view(h, DType::float16, {2, 2})), 65504.0f);
  });
}

}  // namespace
