// Element codecs against FORMATS.md section 1.
#include <gtest/gtest.h>

#include "support.hpp"

namespace ms = microscale;
using namespace mst;

namespace {

float next_up(float v) { return std::nextafter(v, kInf); }
float next_down(float v) { return std::nextafter(v, -kInf); }

// ---------------------------------------------------------------------------------------------
// E2M1

TEST(E2M1, DecodeAllSixteenCodes) {
  const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    float v = ms::decode_e2m1(static_cast<std::uint8_t>(c));
    float want = (c & 8) ? -mags[c & 7] : mags[c & 7];
    EXPECT_TRUE(same_bits(v, want)) << "code " << c << " got " << v;
  }
}

TEST(E2M1, EncodeTableOfSectionOne) {
  struct Case {
    float v;
    int idx;
  };
  // Every closed end of the table is a tie going to the even index; open ends go to their side.
  const Case cases[] = {
      {0.0f, 0},  {0.1f, 0},    {0.25f, 0}, {next_up(0.25f), 1}, {0.5f, 1}, {next_down(0.75f), 1},
      {0.75f, 2}, {1.0f, 2},    {1.25f, 2}, {next_up(1.25f), 3}, {1.5f, 3}, {next_down(1.75f), 3},
      {1.75f, 4}, {2.0f, 4},    {2.5f, 4},  {next_up(2.5f), 5},  {3.0f, 5}, {next_down(3.5f), 5},
      {3.5f, 6},  {4.0f, 6},    {5.0f, 6},  {next_up(5.0f), 7},  {6.0f, 7}, {7.0f, 7},
      {1e30f, 7}, {FLT_MAX, 7}, {kInf, 7},  {bits_f(1), 0},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ms::encode_e2m1(c.v), c.idx) << "v = " << c.v;
    EXPECT_EQ(ms::encode_e2m1(-c.v), c.idx | 8) << "v = " << -c.v;
  }
}

TEST(E2M1, SignIsCopied) {
  EXPECT_EQ(ms::encode_e2m1(-0.0f), 0x8);
  EXPECT_EQ(ms::encode_e2m1(-0.1f), 0x8);
  EXPECT_EQ(ms::encode_e2m1(-0.25f), 0x8);
  EXPECT_EQ(ms::encode_e2m1(-bits_f(1)), 0x8);
  EXPECT_EQ(ms::encode_e2m1(0.0f), 0x0);
}

TEST(E2M1, StandaloneNonFinite) {
  EXPECT_EQ(ms::encode_e2m1(kNaN), 0x7);
  EXPECT_EQ(ms::encode_e2m1(-kNaN), 0x7);
  EXPECT_EQ(ms::encode_e2m1(kInf), 0x7);
  EXPECT_EQ(ms::encode_e2m1(-kInf), 0xF);
}

TEST(E2M1, AgreesWithGridOracleOnDenseSweep) {
  // Every multiple of 1/64 in [-8, 8] plus its f32 neighbours.
  for (int i = -512; i <= 512; ++i) {
    float v = static_cast<float>(i) / 64.0f;
    for (float w : {v, next_up(v), next_down(v)}) ASSERT_EQ(ms::encode_e2m1(w), rn_sat(Fmt::e2m1, w)) << "v = " << w;
  }
}

// ---------------------------------------------------------------------------------------------
// E4M3 (fn)

TEST(E4M3, DecodeAll256ByFormula) {
  for (int c = 0; c < 256; ++c) {
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    float v = ms::decode_e4m3(static_cast<std::uint8_t>(c));
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(v)) << "code " << c;
      continue;
    }
    double mag = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
    float want = static_cast<float>(s ? -mag : mag);
    EXPECT_TRUE(same_bits(v, want)) << "code " << c << " got " << v << " want " << want;
  }
  EXPECT_EQ(ms::decode_e4m3(0x7E), 448.0f);
  EXPECT_EQ(ms::decode_e4m3(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(ms::decode_e4m3(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(ms::decode_e4m3(0x78), 256.0f);
  EXPECT_EQ(ms::decode_e4m3(0x79), 288.0f);
}

TEST(E4M3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    std::uint8_t code = static_cast<std::uint8_t>(c);
    EXPECT_EQ(ms::encode_e4m3(ms::decode_e4m3(code)), code) << "code " << c;
  }
}

TEST(E4M3, MidpointsGoToTheEvenCode) {
  for (int c = 0; c < 0x7E; ++c) {
    const double lo = e4m3_value(static_cast<std::uint8_t>(c)), hi = e4m3_value(static_cast<std::uint8_t>(c + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in f32
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(ms::encode_e4m3(mid), even) << "midpoint " << mid;
    EXPECT_EQ(ms::encode_e4m3(-mid), even | 0x80) << "midpoint " << -mid;
    EXPECT_EQ(ms::encode_e4m3(next_down(mid)), c) << "below " << mid;
    EXPECT_EQ(ms::encode_e4m3(next_up(mid)), c + 1) << "above " << mid;
    EXPECT_EQ(ms::encode_e4m3(-next_up(mid)), (c + 1) | 0x80);
  }
}

TEST(E4M3, SaturationZeroAndNaN) {
  EXPECT_EQ(ms::encode_e4m3(448.0f), 0x7E);
  EXPECT_EQ(ms::encode_e4m3(next_up(448.0f)), 0x7E);
  EXPECT_EQ(ms::encode_e4m3(464.0f), 0x7E);  // would be the tie to 480, which does not exist
  EXPECT_EQ(ms::encode_e4m3(1e6f), 0x7E);
  EXPECT_EQ(ms::encode_e4m3(FLT_MAX), 0x7E);
  EXPECT_EQ(ms::encode_e4m3(kInf), 0x7E);
  EXPECT_EQ(ms::encode_e4m3(-kInf), 0xFE);
  EXPECT_EQ(ms::encode_e4m3(-1e6f), 0xFE);
  EXPECT_EQ(ms::encode_e4m3(kNaN), 0x7F);
  EXPECT_EQ(ms::encode_e4m3(-kNaN), 0x7F);                  // sign dropped
  EXPECT_EQ(ms::encode_e4m3(std::ldexp(1.0f, -10)), 0x00);  // tie to zero
  EXPECT_EQ(ms::encode_e4m3(-std::ldexp(1.0f, -10)), 0x80);
  EXPECT_EQ(ms::encode_e4m3(next_up(std::ldexp(1.0f, -10))), 0x01);
  EXPECT_EQ(ms::encode_e4m3(bits_f(1)), 0x00);
  EXPECT_EQ(ms::encode_e4m3(-0.0f), 0x80);
  EXPECT_TRUE(std::isnan(ms::decode_e4m3(0x7F)));
  EXPECT_TRUE(std::isnan(ms::decode_e4m3(0xFF)));
}

TEST(E4M3, AgreesWithGridOracleOnRandomFloats) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> ex(-30, 20);
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  for (int i = 0; i < 20000; ++i) {
    float v = std::ldexp(mant(rng), ex(rng));
    ASSERT_EQ(ms::encode_e4m3(v), rn_sat(Fmt::e4m3, v)) << "v = " << v;
  }
}

// ---------------------------------------------------------------------------------------------
// E5M2

TEST(E5M2, DecodeAll256ByFormula) {
  for (int c = 0; c < 256; ++c) {
    const int s = c >> 7, e = (c >> 2) & 31, m = c & 3;
    float v = ms::decode_e5m2(static_cast<std::uint8_t>(c));
    if (e == 31) {
      if (m == 0)
        EXPECT_EQ(v, s ? -kInf : kInf) << "code " << c;
      else
        EXPECT_TRUE(std::isnan(v)) << "code " << c;
      continue;
    }
    double mag = e == 0 ? m * std::ldexp(1.0, -16) : (1.0 + m / 4.0) * std::ldexp(1.0, e - 15);
    float want = static_cast<float>(s ? -mag : mag);
    EXPECT_TRUE(same_bits(v, want)) << "code " << c;
  }
  EXPECT_EQ(ms::decode_e5m2(0x7B), 57344.0f);
}

TEST(E5M2, RoundTripAndMidpoints) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7C) == 0x7C) continue;
    std::uint8_t code = static_cast<std::uint8_t>(c);
    EXPECT_EQ(ms::encode_e5m2(ms::decode_e5m2(code)), code) << "code " << c;
  }
  for (int c = 0; c < 0x7B; ++c) {
    const double lo = e5m2_value(static_cast<std::uint8_t>(c)), hi = e5m2_value(static_cast<std::uint8_t>(c + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(ms::encode_e5m2(mid), even) << "midpoint " << mid;
    EXPECT_EQ(ms::encode_e5m2(-mid), even | 0x80);
    EXPECT_EQ(ms::encode_e5m2(next_down(mid)), c);
    EXPECT_EQ(ms::encode_e5m2(next_up(mid)), c + 1);
  }
}

TEST(E5M2, SaturationZeroAndNaN) {
  EXPECT_EQ(ms::encode_e5m2(57344.0f), 0x7B);
  EXPECT_EQ(ms::encode_e5m2(61440.0f), 0x7B);  // would-be tie with 65536
  EXPECT_EQ(ms::encode_e5m2(1e9f), 0x7B);
  EXPECT_EQ(ms::encode_e5m2(kInf), 0x7B);
  EXPECT_EQ(ms::encode_e5m2(-kInf), 0xFB);
  EXPECT_EQ(ms::encode_e5m2(kNaN), 0x7F);
  EXPECT_EQ(ms::encode_e5m2(std::ldexp(1.0f, -17)), 0x00);
  EXPECT_EQ(ms::encode_e5m2(next_up(std::ldexp(1.0f, -17))), 0x01);
  EXPECT_EQ(ms::encode_e5m2(-0.0f), 0x80);
  EXPECT_EQ(ms::decode_e5m2(0x7C), kInf);
  EXPECT_EQ(ms::decode_e5m2(0xFC), -kInf);
  for (int c : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF})
    EXPECT_TRUE(std::isnan(ms::decode_e5m2(static_cast<std::uint8_t>(c)))) << c;
}

// ---------------------------------------------------------------------------------------------
// E8M0

TEST(E8M0, DecodeByBits) {
  EXPECT_EQ(f_bits(ms::decode_e8m0(0x00)), 0x00400000u);  // 2^-127, not zero
  EXPECT_EQ(ms::decode_e8m0(0x00), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(ms::decode_e8m0(0xFF)));  // NaN, not Inf
  for (int e = 1; e <= 254; ++e) {
    EXPECT_EQ(f_bits(ms::decode_e8m0(static_cast<std::uint8_t>(e))), static_cast<std::uint32_t>(e) << 23);
    EXPECT_EQ(ms::decode_e8m0(static_cast<std::uint8_t>(e)), std::ldexp(1.0f, e - 127));
  }
}

TEST(E8M0, ReciprocalIsExact) {
  for (int e = 0; e <= 254; ++e) {
    std::uint8_t code = static_cast<std::uint8_t>(e);
    float r = ms::e8m0_reciprocal(code);
    EXPECT_EQ(r, std::ldexp(1.0f, 127 - e)) << "e = " << e;
    EXPECT_EQ(f_bits(r), e <= 253 ? static_cast<std::uint32_t>(254 - e) << 23 : 0x00400000u);
    EXPECT_EQ(static_cast<double>(r) * static_cast<double>(ms::decode_e8m0(code)), 1.0);
  }
}

TEST(E8M0, StandaloneEncoder) {
  for (int e = 0; e <= 254; ++e) EXPECT_EQ(ms::encode_e8m0(std::ldexp(1.0f, e - 127)), e) << "2^" << e - 127;
  // Linear-domain nearest power of two, the midpoint 1.5 * 2^k rounds up.
  EXPECT_EQ(ms::encode_e8m0(1.5f), 128);
  EXPECT_EQ(ms::encode_e8m0(next_down(1.5f)), 127);
  EXPECT_EQ(ms::encode_e8m0(3.0f), 129);
  EXPECT_EQ(ms::encode_e8m0(0.75f), 127);
  EXPECT_EQ(ms::encode_e8m0(next_down(0.75f)), 126);
  EXPECT_EQ(ms::encode_e8m0(1.9f), 128);
  EXPECT_EQ(ms::encode_e8m0(FLT_MAX), 0xFE);                 // saturates to 2^127
  EXPECT_EQ(ms::encode_e8m0(std::ldexp(1.0f, -140)), 0x00);  // saturates to 2^-127
  EXPECT_EQ(ms::encode_e8m0(0.0f), 0xFF);
  EXPECT_EQ(ms::encode_e8m0(-1.0f), 0xFF);
  EXPECT_EQ(ms::encode_e8m0(kNaN), 0xFF);
  EXPECT_EQ(ms::encode_e8m0(kInf), 0xFF);
}

// ---------------------------------------------------------------------------------------------
// bfloat16 and float16

TEST(BF16, ExhaustiveDecodeAndRoundTrip) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const std::uint16_t h = static_cast<std::uint16_t>(b);
    const float v = ms::decode_bf16(h);
    const bool is_nan = ((b >> 7) & 0xFF) == 0xFF && (b & 0x7F) != 0;
    if (is_nan) {
      ASSERT_TRUE(std::isnan(v)) << std::hex << b;
      const std::uint16_t back = ms::encode_bf16(v);
      ASSERT_TRUE(((back >> 7) & 0xFF) == 0xFF && (back & 0x7F) != 0) << "NaN stays NaN " << std::hex << b;
      continue;
    }
    ASSERT_EQ(f_bits(v), b << 16) << std::hex << b;
    ASSERT_EQ(ms::encode_bf16(v), h) << std::hex << b;
  }
}

TEST(BF16, RoundToNearestEvenByIntegerReasoning) {
  // For every non-NaN bf16 pattern hi, f32 patterns hi:lo with lo around the tie 0x8000.
  for (std::uint32_t hi = 0; hi < 65536; ++hi) {
    if (((hi >> 7) & 0xFF) == 0xFF) continue;  // Inf/NaN patterns have no finite neighbourhood
    for (std::uint32_t lo : {0x0000u, 0x0001u, 0x4000u, 0x7FFFu, 0x8000u, 0x8001u, 0xC000u, 0xFFFFu}) {
      const std::uint32_t u = hi << 16 | lo;
      const bool up = lo > 0x8000 || (lo == 0x8000 && (hi & 1));
      const std::uint32_t want = up ? hi + 1 : hi;  // the carry runs into the exponent; max -> Inf
      ASSERT_EQ(ms::encode_bf16(bits_f(u)), want) << std::hex << u;
    }
  }
  EXPECT_EQ(ms::encode_bf16(FLT_MAX), 0x7F80);  // overflow -> +Inf (IEEE, not saturating)
  EXPECT_EQ(ms::encode_bf16(-FLT_MAX), 0xFF80);
  EXPECT_EQ(ms::encode_bf16(kInf), 0x7F80);
  EXPECT_EQ(ms::encode_bf16(-0.0f), 0x8000);
}

TEST(F16, ExhaustiveDecodeAndRoundTrip) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const std::uint16_t h = static_cast<std::uint16_t>(b);
    const int s = b >> 15, e = (b >> 10) & 31, m = b & 1023;
    const float v = ms::decode_f16(h);
    if (e == 31) {
      if (m == 0) {
        ASSERT_EQ(v, s ? -kInf : kInf);
      } else {
        ASSERT_TRUE(std::isnan(v)) << std::hex << b;
        const std::uint16_t back = ms::encode_f16(v);
        ASSERT_TRUE(((back >> 10) & 31) == 31 && (back & 1023) != 0) << "NaN stays NaN " << std::hex << b;
        continue;
      }
    } else {
      double mag = e == 0 ? m * std::ldexp(1.0, -24) : (1.0 + m / 1024.0) * std::ldexp(1.0, e - 15);
      ASSERT_TRUE(same_bits(v, static_cast<float>(s ? -mag : mag))) << std::hex << b;
    }
    ASSERT_EQ(ms::encode_f16(v), h) << std::hex << b;
  }
}

TEST(F16, RoundToNearestEvenAtEveryTie) {
  // Between neighbours h and h+1 (h+1 may be Inf): the exact midpoint goes to the even pattern,
  // one f32 ulp either side to the nearer one. Sign symmetric.
  for (std::uint32_t h = 0; h < 0x7C00; ++h) {
    const double lo = ms::decode_f16(static_cast<std::uint16_t>(h));
    const double hi =
        h + 1 == 0x7C00 ? 65536.0 : static_cast<double>(ms::decode_f16(static_cast<std::uint16_t>(h + 1)));
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const std::uint32_t even = (h % 2 == 0) ? h : h + 1;
    ASSERT_EQ(ms::encode_f16(mid), even) << "midpoint above " << std::hex << h;
    ASSERT_EQ(ms::encode_f16(-mid), even | 0x8000);
    ASSERT_EQ(ms::encode_f16(next_down(mid)), h);
    ASSERT_EQ(ms::encode_f16(next_up(mid)), h + 1);
  }
  EXPECT_EQ(ms::encode_f16(65519.99f), 0x7BFF);
  EXPECT_EQ(ms::encode_f16(65520.0f), 0x7C00);  // overflow -> Inf
  EXPECT_EQ(ms::encode_f16(1e10f), 0x7C00);
  EXPECT_EQ(ms::encode_f16(-1e10f), 0xFC00);
  EXPECT_EQ(ms::encode_f16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(ms::encode_f16(next_up(std::ldexp(1.0f, -25))), 0x0001);
  EXPECT_EQ(ms::encode_f16(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(ms::encode_f16(-std::ldexp(1.0f, -30)), 0x8000);
}

TEST(F16, AgreesWithCompilerConversionOnRandomBits) {
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const float v = bits_f(static_cast<std::uint32_t>(rng()));
    if (std::isnan(v)) continue;
    ASSERT_EQ(ms::encode_f16(v), oracle_f16(v)) << std::hex << f_bits(v);
  }
}

}  // namespace
