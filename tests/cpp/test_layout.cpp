// Swizzled scale layout, FORMATS.md 4.
#include <gtest/gtest.h>

#include "support.hpp"

namespace ms = microscale;
using namespace mst;

namespace {

std::int64_t roundup(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }

// The layout as a view [Rp/128, 4, 32, Cp/4, 4] permuted (0, 3, 2, 1, 4) and flattened.
std::int64_t permute_offset(std::int64_t r, std::int64_t c, std::int64_t cp) {
  const std::int64_t i0 = r / 128, i1 = (r % 128) / 32, i2 = r % 32, i3 = c / 4, i4 = c % 4;
  return (((i0 * (cp / 4) + i3) * 32 + i2) * 4 + i1) * 4 + i4;
}

TEST(Layout, OffsetFormulaAndInverse) {
  for_each_backend([&] {
    for (std::int64_t rows : {1, 31, 128, 130, 300}) {
      for (std::int64_t cols : {1, 4, 6, 90}) {
        const std::int64_t rp = roundup(rows, 128), cp = roundup(cols, 4);
        std::vector<char> seen(static_cast<std::size_t>(rp * cp), 0);
        for (std::int64_t r = 0; r < rp; ++r) {
          for (std::int64_t c = 0; c < cp; ++c) {
            const std::int64_t off = ms::swizzled_offset(r, c, cp);
            ASSERT_EQ(off, permute_offset(r, c, cp)) << r << "," << c;
            ASSERT_GE(off, 0);
            ASSERT_LT(off, rp * cp);
            ASSERT_EQ(seen[static_cast<std::size_t>(off)]++, 0) << "offset used twice";
            // Inverse of section 4.
            const std::int64_t t = off / 512, w = off % 512;
            ASSERT_EQ((t / (cp / 4)) * 128 + ((w % 16) / 4) * 32 + w / 16, r);
            ASSERT_EQ((t % (cp / 4)) * 4 + w % 4, c);
          }
        }
        // rp*cp distinct offsets in [0, rp*cp): a bijection.
      }
    }
    // Rows r, r+32, r+64, r+96 sit side by side inside a tile.
    EXPECT_EQ(ms::swizzled_offset(0, 0, 4), 0);
    EXPECT_EQ(ms::swizzled_offset(32, 0, 4), 4);
    EXPECT_EQ(ms::swizzled_offset(64, 0, 4), 8);
    EXPECT_EQ(ms::swizzled_offset(96, 0, 4), 12);
    EXPECT_EQ(ms::swizzled_offset(1, 0, 4), 16);
    EXPECT_EQ(ms::swizzled_offset(0, 3, 4), 3);
    EXPECT_EQ(ms::swizzled_offset(0, 4, 8), 512);
    EXPECT_EQ(ms::swizzled_offset(128, 0, 8), 1024);
  });
}

TEST(Layout, SwizzleUnswizzleRoundTripWithZeroPadding) {
  for_each_backend([&] {
    for (std::int64_t rows : {1, 5, 128, 130, 257}) {
      for (std::int64_t cols : {1, 3, 4, 9, 90}) {
        Tensor compact(DType::uint8, {rows, cols});
        for (std::int64_t i = 0; i < compact.numel(); ++i)
          compact.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(1 + (i * 37) % 255);  // never 0
        Tensor sw = ms::swizzle_scales(compact.view());
        const std::int64_t rp = roundup(rows, 128), cp = roundup(cols, 4);
        ASSERT_EQ(sw.dtype(), DType::uint8);
        ASSERT_EQ(sw.shape(), (Shape{rp, cp}));
        const std::uint8_t* s = sw.data<std::uint8_t>();
        for (std::int64_t r = 0; r < rp; ++r)
          for (std::int64_t c = 0; c < cp; ++c) {
            const std::uint8_t want = (r < rows && c < cols) ? compact.data<std::uint8_t>()[r * cols + c] : 0;
            ASSERT_EQ(s[ms::swizzled_offset(r, c, cp)], want) << rows << "x" << cols << " at " << r << "," << c;
          }
        Tensor back = ms::unswizzle_scales(sw.view(), rows, cols);
        ASSERT_EQ(back.shape(), (Shape{rows, cols}));
        ASSERT_EQ(bytes(back), bytes(compact));
      }
    }
  });
}

TEST(Layout, HigherRankScalesFlattenLeadingAxes) {
  for_each_backend([&] {
    Tensor c3(DType::uint8, {2, 3, 5});
    for (std::int64_t i = 0; i < c3.numel(); ++i) c3.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(i + 1);
    Tensor a = ms::swizzle_scales(c3.view());
    Tensor b = ms::swizzle_scales(c3.reshaped({6, 5}).view());
    EXPECT_EQ(a.shape(), (Shape{128, 8}));
    EXPECT_EQ(bytes(a), bytes(b));
  });
}

std::vector<ms::QuantSpec> fp_modes() {
  std::vector<ms::QuantSpec> out;
  ms::QuantSpec s;
  out.push_back(s);
  s.global_scale = 3.0f;
  out.push_back(s);
  s = {};
  s.mode = ms::Mode::mxfp4;
  out.push_back(s);
  s.mode = ms::Mode::mxfp8;
  out.push_back(s);
  return out;
}

TEST(Layout, QuantizeSwizzledEqualsSwizzleOfCompact) {
  for_each_backend([&] {
    // 130 rows (a partial second row tile) and K giving scale columns that need padding.
    for (ms::QuantSpec s : fp_modes()) {
      const std::int64_t rows = 130, k = 32 * 7;
      std::vector<float> x = make_data(static_cast<std::size_t>(rows * k), Dist::student_t3, 31);
      ms::Quantized compact = ms::quantize(view(x, {rows, k}), s);
      s.layout = ms::Layout::swizzled;
      ms::Quantized sw = ms::quantize(view(x, {rows, k}), s);
      EXPECT_EQ(sw.spec.layout, ms::Layout::swizzled);
      EXPECT_EQ(bytes(sw.packed), bytes(compact.packed));
      Tensor expect = ms::swizzle_scales(compact.scales.view());
      EXPECT_EQ(sw.scales.shape(), expect.shape()) << ms::name(s.mode);
      EXPECT_EQ(bytes(sw.scales), bytes(expect)) << ms::name(s.mode);
      // Dequantize with swizzled scales equals compact, from the struct and from loose parts.
      std::vector<float> yc = values(ms::dequantize(compact, DType::float32));
      EXPECT_EQ(values(ms::dequantize(sw, DType::float32)), yc) << ms::name(s.mode);
      Tensor loose = ms::dequantize(sw.packed.view(), sw.scales.view(), nullptr, sw.spec, DType::float32);
      EXPECT_EQ(values(loose), yc) << ms::name(s.mode);
    }
  });
}

TEST(Layout, SwizzledRank3) {
  for_each_backend([&] {
    ms::QuantSpec s;
    s.mode = ms::Mode::mxfp8;
    std::vector<float> x = make_data(2 * 3 * 64, Dist::gaussian, 32);
    ms::Quantized c = ms::quantize(view(x, {2, 3, 64}), s);
    s.layout = ms::Layout::swizzled;
    ms::Quantized w = ms::quantize(view(x, {2, 3, 64}), s);
    EXPECT_EQ(w.scales.shape(), (Shape{128, 4}));
    EXPECT_EQ(bytes(w.scales), bytes(ms::swizzle_scales(c.scales.view())));
    Tensor y = ms::dequantize(w, DType::float32);
    EXPECT_EQ(y.shape(), (Shape{2, 3, 64}));
    EXPECT_EQ(values(y), values(ms::dequantize(c, DType::float32)));
  });
}

}  // namespace
