// affine (FORMATS.md 2.3) and its LSB-first bit streams (section 3).
#include <gtest/gtest.h>

#include "support.hpp"

namespace ms = microscale;
using namespace mst;

namespace {

ms::QuantSpec affine(int bits, int group = 0) {
  ms::QuantSpec s;
  s.mode = ms::Mode::affine;
  s.bits = bits;
  s.group_size = group;
  return s;
}

TEST(Affine, DefaultsAndShapes) {
  for_each_backend([&] {
    std::vector<float> x(4 * 128, 0.25f);
    ms::QuantSpec s;
    s.mode = ms::Mode::affine;
    ms::Quantized q = ms::quantize(view(x, {4, 128}), s);
    EXPECT_EQ(q.spec.group_size, 64);
    EXPECT_EQ(q.spec.bits, 4);
    EXPECT_EQ(q.packed.dtype(), DType::uint8);
    EXPECT_EQ(q.packed.shape(), (Shape{4, 64}));
    EXPECT_EQ(q.scales.dtype(), DType::float32);
    EXPECT_EQ(q.scales.shape(), (Shape{4, 2}));
    EXPECT_EQ(q.biases.dtype(), DType::float32);
    EXPECT_EQ(q.biases.shape(), (Shape{4, 2}));
    for (int bits : {2, 3, 5, 6, 8}) {
      ms::Quantized qb = ms::quantize(view(x, {4, 128}), affine(bits, 32));
      EXPECT_EQ(qb.packed.shape(), (Shape{4, 128 * bits / 8})) << bits;
      EXPECT_EQ(qb.scales.shape(), (Shape{4, 4})) << bits;
    }
  });
}

// w_i = (i - 20)/10, gs 64, b 4 -> scale -0.43 (f32), bias 4.3.
TEST(Affine, SpecExample) {
  for_each_backend([&] {
    std::vector<float> w(64);
    for (int i = 0; i < 64; ++i) w[i] = static_cast<float>(i - 20) / 10.0f;
    ms::Quantized q = ms::quantize(view(w, {1, 64}), affine(4, 64));
    const float scale = q.scales.data<float>()[0], bias = q.biases.data<float>()[0];
    EXPECT_EQ(scale, -0.43f);
    EXPECT_EQ(f_bits(scale), f_bits(4.3f / -10.0f));  // fl(edge / q0) with q0 = rint(4.3 / -0.42) = -10
    EXPECT_EQ(bias, 4.3f);
    const std::uint8_t* p = q.packed.data<std::uint8_t>();
    auto code = [&](int i) { return unpack_bits(p, i, 4); };
    EXPECT_EQ(code(63), 0);   // the edge: code 0 maps exactly to wmax
    EXPECT_EQ(code(20), 10);  // w = 0: (0 - 4.3) / -0.43 = 10
    EXPECT_EQ(code(0), 15);   // w = -2: 14.65 -> 15
    RefAffine r = ref_affine(w, 64, 4, DType::float32);
    for (int i = 0; i < 64; ++i) EXPECT_EQ(code(i), r.codes[i]) << i;
    Tensor y = ms::dequantize(q, DType::float32);
    EXPECT_EQ(y.data<float>()[63], 4.3f);
    for (int i = 0; i < 64; ++i) {
      const float want = static_cast<float>(code(i)) * scale + bias;
      EXPECT_TRUE(same_bits(y.data<float>()[i], want)) << i;
      EXPECT_LE(std::fabs(y.data<float>()[i] - w[i]), 0.43f / 2 + 1e-6f) << i;
    }
  });
}

TEST(Affine, AllZeroGroup) {
  for_each_backend([&] {
    std::vector<float> w(64, 0.0f);
    for (DType t : {DType::float32, DType::bfloat16, DType::float16}) {
      std::vector<std::uint16_t> h = to_half(w, t == DType::float32 ? DType::bfloat16 : t);
      ms::Quantized q = t == DType::float32 ? ms::quantize(view(w, {1, 64}), affine(4))
                                            : ms::quantize(view(h, t, {1, 64}), affine(4));
      ASSERT_EQ(q.scales.dtype(), t);
      ASSERT_EQ(q.biases.dtype(), t);
      const float scale = values(q.scales)[0], bias = values(q.biases)[0];
      EXPECT_EQ(scale, round_to(t, -1e-7f)) << ms::dtype_name(t);
      EXPECT_TRUE(same_bits(bias, 0.0f)) << ms::dtype_name(t);
      for (std::uint8_t b : bytes(q.packed)) EXPECT_EQ(b, 0);
      for (float v : values(ms::dequantize(q, DType::float32))) EXPECT_EQ(v, 0.0f);
    }
    EXPECT_EQ(f_bits(-1e-7f), 0xB3D6BF95u);
  });
}

TEST(Affine, NegativeEdgeWins) {
  for_each_backend([&] {
    // |wmin| > |wmax|: positive scale, code 0 is wmin.
    std::vector<float> w(32);
    for (int i = 0; i < 32; ++i) w[i] = -3.0f + 0.1f * static_cast<float>(i);
    ms::Quantized q = ms::quantize(view(w, {1, 32}), affine(3, 32));
    EXPECT_GT(q.scales.data<float>()[0], 0.0f);
    EXPECT_EQ(q.biases.data<float>()[0], -3.0f);
    EXPECT_EQ(unpack_bits(q.packed.data<std::uint8_t>(), 0, 3), 0);
    RefAffine r = ref_affine(w, 32, 3, DType::float32);
    EXPECT_EQ(q.scales.data<float>()[0], r.scales[0]);
    EXPECT_EQ(bytes(q.packed), pack_bits(r.codes, 32, 3));
  });
}

// Every bit width: groups whose values are w = n - c for chosen codes c (with 0 and n present,
// so scale = -1 and bias = n exactly) reproduce the chosen codes, pack as the LSB-first stream
// and dequantize back exactly. Codes cycle so every code lands at every bit offset.
TEST(Affine, BitStreamsRoundTripEveryCodePattern) {
  for_each_backend([&] {
    for (int bits : {2, 3, 4, 5, 6, 8}) {
      const int n = (1 << bits) - 1, group = 32;
      const std::int64_t rows = 3, k = 8 * 32 * 9;  // k/8 covers every stream-bit phase many times
      std::vector<std::uint8_t> codes(static_cast<std::size_t>(rows * k));
      for (std::size_t i = 0; i < codes.size(); ++i) {
        const std::size_t g = i % group;
        codes[i] = static_cast<std::uint8_t>(g == 0 ? 0 : g == 1 ? n : (i * 7 + i / (n + 1)) % (n + 1));
      }
      std::vector<float> w(codes.size());
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(n - codes[i]);
      ms::Quantized q = ms::quantize(view(w, {rows, k}), affine(bits, group));
      ASSERT_EQ(q.packed.shape(), (Shape{rows, k * bits / 8}));
      ASSERT_EQ(bytes(q.packed), pack_bits(codes, k, bits)) << "bits " << bits;
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t i = 0; i < k; ++i)
          ASSERT_EQ(unpack_bits(q.packed.data<std::uint8_t>() + r * (k * bits / 8), i, bits), codes[r * k + i]);
      for (float s : values(q.scales)) ASSERT_EQ(s, -1.0f);
      for (float b : values(q.biases)) ASSERT_EQ(b, static_cast<float>(n));
      std::vector<float> y = values(ms::dequantize(q, DType::float32));
      ASSERT_EQ(y, w) << "bits " << bits;
    }
  });
}

TEST(Affine, HandPackedBytes) {
  for_each_backend([&] {
    // 3-bit codes 0..7 then 7..0 (8 elements per 3 bytes): the stream is the codes' bits LSB first.
    // codes 0,1,2,3,4,5,6,7 -> bits 000 100 010 110 001 101 011 111 (LSB first per code)
    // -> stream 0b 111 110 101 100 011 010 001 000 read MSB..LSB = 0xFAC688 -> bytes 88 C6 FA.
    const std::vector<std::uint8_t> seq = {0, 1, 2, 3, 4, 5, 6, 7};
    EXPECT_EQ(pack_bits(seq, 8, 3), (std::vector<std::uint8_t>{0x88, 0xC6, 0xFA}));
    std::vector<float> w(32);
    for (int i = 0; i < 32; ++i) w[i] = static_cast<float>(7 - (i % 8));
    ms::Quantized q = ms::quantize(view(w, {1, 32}), affine(3, 32));
    const std::vector<std::uint8_t> b = bytes(q.packed);
    ASSERT_EQ(b.size(), 12u);
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(b[3 * j], 0x88);
      EXPECT_EQ(b[3 * j + 1], 0xC6);
      EXPECT_EQ(b[3 * j + 2], 0xFA);
    }
    // 5-bit: 8 elements per 5 bytes; 6-bit: 4 elements per 3 bytes.
    EXPECT_EQ(pack_bits({31, 0, 0, 0, 0, 0, 0, 1}, 8, 5), (std::vector<std::uint8_t>{0x1F, 0, 0, 0, 0x08}));
    EXPECT_EQ(pack_bits({63, 0, 1, 32}, 4, 6), (std::vector<std::uint8_t>{0x3F, 0x10, 0x80}));
    // The same patterns through the library (w = n - c, so scale -1, bias n, codes c).
    struct Case {
      int bits;
      std::vector<int> codes;
      std::vector<std::uint8_t> want;
    };
    const Case cases[] = {{5, {31, 0, 0, 0, 0, 0, 0, 1}, {0x1F, 0x00, 0x00, 0x00, 0x08}},
                          {6, {63, 0, 1, 32}, {0x3F, 0x10, 0x80}}};
    for (const Case& c : cases) {
      const int n = (1 << c.bits) - 1;
      std::vector<float> v(32);
      for (int i = 0; i < 32; ++i) v[i] = static_cast<float>(n - c.codes[i % c.codes.size()]);
      ms::Quantized qc = ms::quantize(view(v, {1, 32}), affine(c.bits, 32));
      std::vector<std::uint8_t> got = bytes(qc.packed);
      ASSERT_EQ(got.size(), 32u * c.bits / 8);
      for (std::size_t j = 0; j < got.size(); ++j) EXPECT_EQ(got[j], c.want[j % c.want.size()]) << c.bits << " " << j;
    }
  });
}

TEST(Affine, HalfInputsStoreScalesInInputDtype) {
  for_each_backend([&] {
    std::vector<float> base = make_data(4 * 128, Dist::student_t3, 5);
    for (DType t : {DType::bfloat16, DType::float16}) {
      std::vector<std::uint16_t> h = to_half(base, t);
      std::vector<float> wide = widen(h, t);
      for (int bits : {4, 8}) {
        ms::Quantized q = ms::quantize(view(h, t, {4, 128}), affine(bits, 64));
        ASSERT_EQ(q.scales.dtype(), t);
        ASSERT_EQ(q.biases.dtype(), t);
        RefAffine r = ref_affine(wide, 64, bits, t);
        EXPECT_EQ(values(q.scales), r.scales) << ms::dtype_name(t) << " bits " << bits;
        EXPECT_EQ(values(q.biases), r.biases) << ms::dtype_name(t) << " bits " << bits;
        EXPECT_EQ(bytes(q.packed), pack_bits(r.codes, 128, bits)) << ms::dtype_name(t);
        // Dequantize: y = RN_out(fl(fl(q * s) + b)) with the stored (rounded) s and b.
        std::vector<float> y = values(ms::dequantize(q, DType::float32));
        for (std::size_t i = 0; i < y.size(); ++i) {
          const float want = static_cast<float>(r.codes[i]) * r.scales[i / 64] + r.biases[i / 64];
          ASSERT_TRUE(same_bits(y[i], want)) << i;
        }
      }
    }
  });
}

}  // namespace
