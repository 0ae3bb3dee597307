// mxfp4 / mxfp8 (FORMATS.md 2.2) and the FP4 packing vectors of section 3.
#include <gtest/gtest.h>

#include "support.hpp"

namespace ms = microscale;
using namespace mst;

namespace {

ms::QuantSpec mx(ms::Mode mode, ms::ScaleRule rule = ms::ScaleRule::ceil, ms::Elem elem = ms::Elem::e4m3) {
  ms::QuantSpec s;
  s.mode = mode;
  s.scale_rule = rule;
  s.elem = elem;
  return s;
}

std::uint8_t block_scale(ms::Mode mode, ms::ScaleRule rule, float bamax) {
  std::vector<float> x(32, 0.0f);
  x[9] = bamax;
  x[10] = -bamax / 3.0f;
  ms::Quantized q = ms::quantize(view(x, {1, 32}), mx(mode, rule));
  return q.scales.data<std::uint8_t>()[0];
}

TEST(Mx, ResolvedSpecAndShapes) {
  for_each_backend([&] {
    std::vector<float> x(2 * 3 * 64, 0.5f);
    ms::Quantized q4 = ms::quantize(view(x, {2, 3, 64}), mx(ms::Mode::mxfp4));
    EXPECT_EQ(q4.spec.group_size, 32);
    EXPECT_EQ(q4.spec.bits, 4);
    EXPECT_EQ(q4.packed.shape(), (Shape{2, 3, 32}));
    EXPECT_EQ(q4.scales.shape(), (Shape{2, 3, 2}));
    ms::Quantized q8 = ms::quantize(view(x, {2, 3, 64}), mx(ms::Mode::mxfp8));
    EXPECT_EQ(q8.spec.group_size, 32);
    EXPECT_EQ(q8.spec.bits, 8);
    EXPECT_EQ(q8.spec.elem, ms::Elem::e4m3);
    EXPECT_EQ(q8.packed.shape(), (Shape{2, 3, 64}));
    EXPECT_EQ(q8.scales.shape(), (Shape{2, 3, 2}));
    EXPECT_TRUE(q8.biases.empty());
  });
}

// The table of FORMATS.md 2.2, every column.
TEST(Mx, ScaleRuleTableMxfp4) {
  for_each_backend([&] {
    const float bamax[6] = {4, 6, 6.5f, 7, 8, 12.5f};
    const int ceil[6] = {127, 127, 128, 128, 128, 129};
    const int floor[6] = {127, 127, 127, 127, 128, 128};
    const int even[6] = {127, 127, 127, 128, 128, 128};
    const int nearest[6] = {126, 127, 127, 127, 127, 128};
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(block_scale(ms::Mode::mxfp4, ms::ScaleRule::ceil, bamax[i]), ceil[i]) << bamax[i];
      EXPECT_EQ(block_scale(ms::Mode::mxfp4, ms::ScaleRule::floor, bamax[i]), floor[i]) << bamax[i];
      EXPECT_EQ(block_scale(ms::Mode::mxfp4, ms::ScaleRule::even, bamax[i]), even[i]) << bamax[i];
      EXPECT_EQ(block_scale(ms::Mode::mxfp4, ms::ScaleRule::nearest, bamax[i]), nearest[i]) << bamax[i];
    }
  });
}

TEST(Mx, ScaleRuleTableMxfp8E4M3) {
  for_each_backend([&] {
    const float bamax[5] = {240, 300, 448, 449, 500};
    const int ceil[5] = {127, 127, 127, 128, 128};
    const int floor[5] = {126, 127, 127, 127, 127};
    const int even[5] = {126, 127, 127, 127, 128};
    const int nearest[5] = {126, 126, 127, 127, 127};
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(block_scale(ms::Mode::mxfp8, ms::ScaleRule::ceil, bamax[i]), ceil[i]) << bamax[i];
      EXPECT_EQ(block_scale(ms::Mode::mxfp8, ms::ScaleRule::floor, bamax[i]), floor[i]) << bamax[i];
      EXPECT_EQ(block_scale(ms::Mode::mxfp8, ms::ScaleRule::even, bamax[i]), even[i]) << bamax[i];
      EXPECT_EQ(block_scale(ms::Mode::mxfp8, ms::ScaleRule::nearest, bamax[i]), nearest[i]) << bamax[i];
    }
  });
}

TEST(Mx, TableFootnotes) {
  for_each_backend([&] {
    // nearest with bamax 4 stores 8 -> 6, dequantizing to 3; floor with 7 stores 6; ceil never clips.
    auto roundtrip = [](ms::ScaleRule rule, float v) {
      std::vector<float> x(32, 0.0f);
      x[0] = v;
      ms::Quantized q = ms::quantize(view(x, {1, 32}), mx(ms::Mode::mxfp4, rule));
      return ms::dequantize(q, DType::float32).data<float>()[0];
    };
    EXPECT_EQ(roundtrip(ms::ScaleRule::nearest, 4.0f), 3.0f);
    EXPECT_EQ(roundtrip(ms::ScaleRule::floor, 7.0f), 6.0f);
    // ceil: the block max divided by the scale never exceeds 6, so it is rounded, never clipped.
    for (float v : {4.0f, 6.0f, 6.5f, 7.0f, 8.0f, 12.5f, 13.0f, 100.0f}) {
      EXPECT_GE(ms::decode_e8m0(block_scale(ms::Mode::mxfp4, ms::ScaleRule::ceil, v)) * 6.0f, v) << v;
      EXPECT_LE(std::fabs(roundtrip(ms::ScaleRule::ceil, v) - v),
                ms::decode_e8m0(block_scale(ms::Mode::mxfp4, ms::ScaleRule::ceil, v)))
          << v;
    }
  });
}

// 'ceil': amax = max_elem * 2^k gives exactly e = 127 + k for every format.
TEST(Mx, CeilPowersOfTwoTimesMax) {
  for_each_backend([&] {
    for (int k = -100; k <= 100; k += 7) {
      EXPECT_EQ(block_scale(ms::Mode::mxfp4, ms::ScaleRule::ceil, std::ldexp(6.0f, k)), 127 + k) << k;
      EXPECT_EQ(block_scale(ms::Mode::mxfp8, ms::ScaleRule::ceil, std::ldexp(448.0f, k)), 127 + k) << k;
      std::vector<float> x(32, 0.0f);
      x[0] = std::ldexp(57344.0f, k);
      ms::Quantized q = ms::quantize(view(x, {1, 32}), mx(ms::Mode::mxfp8, ms::ScaleRule::ceil, ms::Elem::e5m2));
      EXPECT_EQ(q.scales.data<std::uint8_t>()[0], 127 + k) << k;
      EXPECT_EQ(q.packed.data<std::uint8_t>()[0], 0x7B) << k;
    }
    // Zero block and extremes of the ceil rule.
    EXPECT_EQ(block_scale(ms::Mode::mxfp4, ms::ScaleRule::ceil, 0.0f), 0x00);
    EXPECT_EQ(block_scale(ms::Mode::mxfp4, ms::ScaleRule::ceil, FLT_MAX), 253);
    EXPECT_EQ(block_scale(ms::Mode::mxfp8, ms::ScaleRule::ceil, 1e-40f), 0x00);
  });
}

// MLX test vector of FORMATS.md 3 (one mxfp4 block, bamax 7).
const std::vector<float> kMlxVector = {6,      .25f,  .75f,  1.25f, 1.75f, 2.5f, 3.5f,  5,   -.25f, -.75f, -1.25f,
                                       -1.75f, -2.5f, -3.5f, -5,    -6,    0,    -0.0f, .2f, .3f,   5.1f,  7,
                                       -7,     6,     .5f,   1,     1.5f,  2,    3,     4,   .1f,   -.1f};

TEST(Mx, MlxTestVectorNearest) {
  for_each_backend([&] {
    ms::Quantized q = ms::quantize(view(kMlxVector, {1, 32}), mx(ms::Mode::mxfp4, ms::ScaleRule::nearest));
    EXPECT_EQ(q.scales.data<std::uint8_t>()[0], 0x7F);
    const std::vector<std::uint32_t> want = {0x66442207u, 0xfeeccaa8u, 0x7f771080u, 0x80654321u};
    EXPECT_EQ(le_words(bytes(q.packed)), want);
  });
}

TEST(Mx, MlxTestVectorDefaultCeil) {
  for_each_backend([&] {
    ms::Quantized q = ms::quantize(view(kMlxVector, {1, 32}), mx(ms::Mode::mxfp4));
    EXPECT_EQ(q.scales.data<std::uint8_t>()[0], 0x80);
    const std::vector<std::uint32_t> want = {0x44221105u, 0xdccaa998u, 0x5e650080u, 0x80432210u};
    EXPECT_EQ(le_words(bytes(q.packed)), want);
    // Decode: val(q) * 2 exactly.
    Tensor y = ms::dequantize(q, DType::float32);
    EXPECT_EQ(y.data<float>()[0], 6.0f);   // 6 / 2 = 3 (code 5), * 2
    EXPECT_EQ(y.data<float>()[21], 8.0f);  // 7 / 2 = 3.5, a tie: even code 6 (4), * 2
    EXPECT_EQ(y.data<float>()[6], 4.0f);   // 3.5 / 2 = 1.75, a tie: even code 4 (2), * 2
  });
}

TEST(Packing, Fp4NibbleOrder) {
  for_each_backend([&] {
    // (1.0, -6.0) -> 0xF2 (even element in the low nibble). Block max 6 keeps the scale at 1.
    std::vector<float> x(16, 0.0f);
    x[0] = 1.0f;
    x[1] = -6.0f;
    x[2] = 0.0f;
    x[3] = 0.5f;
    x[4] = 4.0f;
    x[5] = -0.0f;
    ms::Quantized q = ms::quantize(view(x, {1, 16}), ms::QuantSpec{});  // nvfp4, two-level
    ASSERT_EQ(q.scales.data<std::uint8_t>()[0], 0x38);
    EXPECT_EQ(q.packed.data<std::uint8_t>()[0], 0xF2);
    // torchao's pinned (0, 0.5, 4, -0) -> 0x10, 0x86.
    EXPECT_EQ(q.packed.data<std::uint8_t>()[1], 0x10);
    EXPECT_EQ(q.packed.data<std::uint8_t>()[2], 0x86);
  });
}

TEST(Mx, Mxfp8E5M2Elements) {
  for_each_backend([&] {
    // bamax 57344 * 2^-3: scale 124, elements x * 8 on the E5M2 grid.
    std::vector<float> x(32);
    for (int i = 0; i < 32; ++i) x[i] = std::ldexp(static_cast<float>(i * i - 300), 6) * (i % 3 == 0 ? -1.0f : 1.0f);
    x[31] = 7168.0f;
    ms::Quantized q = ms::quantize(view(x, {1, 32}), mx(ms::Mode::mxfp8, ms::ScaleRule::ceil, ms::Elem::e5m2));
    EXPECT_EQ(q.spec.elem, ms::Elem::e5m2);
    RefFp r = ref_mx(x, Fmt::e5m2, ms::ScaleRule::ceil, DType::float32);
    EXPECT_EQ(bytes(q.scales), r.scales);
    EXPECT_EQ(bytes(q.packed), r.codes);
    Tensor y = ms::dequantize(q, DType::float32);
    for (int i = 0; i < 32; ++i)
      EXPECT_TRUE(same_bits(y.data<float>()[i], ref_mx_value(Fmt::e5m2, r.codes[i], r.scales[0]))) << i;
  });
}

TEST(Mx, DecodeOfExtremeScales) {
  for_each_backend([&] {
    // Scale byte 0 decodes as 2^-127, not 0; elements multiply exactly in f32.
    std::vector<float> x(32, 0.0f);
    x[0] = std::ldexp(6.0f, -127);
    x[1] = std::ldexp(-3.0f, -127);
    ms::Quantized q = ms::quantize(view(x, {1, 32}), mx(ms::Mode::mxfp4));
    ASSERT_EQ(q.scales.data<std::uint8_t>()[0], 0x00);
    Tensor y = ms::dequantize(q, DType::float32);
    EXPECT_EQ(y.data<float>()[0], std::ldexp(6.0f, -127));
    EXPECT_EQ(y.data<float>()[1], std::ldexp(-3.0f, -127));
    // Largest finite block: FLT_MAX * C6 ~ 2^125.4 rounds up to 2^126 (byte 253); FLT_MAX / 2^126 ~ 4
    // is code 6 and the f32 product 4 * 2^126 overflows to +Inf, exactly as y = val(q) * val(e) says.
    std::vector<float> b(32, 0.0f);
    b[0] = FLT_MAX;
    b[1] = std::ldexp(1.0f, 126);
    ms::Quantized qb = ms::quantize(view(b, {1, 32}), mx(ms::Mode::mxfp4));
    ASSERT_EQ(qb.scales.data<std::uint8_t>()[0], 253);
    EXPECT_EQ(qb.packed.data<std::uint8_t>()[0], 0x26);  // codes 6 (4) and 2 (1)
    Tensor yb = ms::dequantize(qb, DType::float32);
    EXPECT_EQ(yb.data<float>()[0], kInf);
    EXPECT_EQ(yb.data<float>()[1], std::ldexp(1.0f, 126));
  });
}

}  // namespace
