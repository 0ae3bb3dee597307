// Tensor plumbing: input dtypes, output dtypes, strided views, ranks, empty tensors.
#include <gtest/gtest.h>

#include "support.hpp"

namespace ms = microscale;
using namespace mst;

namespace {

std::vector<ms::QuantSpec> every_mode() {
  std::vector<ms::QuantSpec> out;
  ms::QuantSpec s;
  out.push_back(s);  // nvfp4 two-level
  s.global_scale = 7.0f;
  out.push_back(s);
  s = {};
  s.mode = ms::Mode::mxfp4;
  out.push_back(s);
  s.mode = ms::Mode::mxfp8;
  out.push_back(s);
  s.elem = ms::Elem::e5m2;
  out.push_back(s);
  s = {};
  s.mode = ms::Mode::affine;
  out.push_back(s);
  s.bits = 3;
  s.group_size = 32;
  out.push_back(s);
  return out;
}

void expect_same(const ms::Quantized& a, const ms::Quantized& b, const std::string& what) {
  EXPECT_EQ(bytes(a.packed), bytes(b.packed)) << what;
  EXPECT_EQ(bytes(a.scales), bytes(b.scales)) << what;
  EXPECT_EQ(bytes(a.biases), bytes(b.biases)) << what;
  EXPECT_EQ(a.scales.dtype(), b.scales.dtype()) << what;
}

TEST(Tensor, DTypeNames) {
  for_each_backend([&] {
    for (DType t :
         {DType::float32, DType::float16, DType::bfloat16, DType::uint8, DType::uint32, DType::int32, DType::int64})
      EXPECT_EQ(ms::dtype_from_name(ms::dtype_name(t)), t);
    EXPECT_EQ(ms::dtype_size(DType::bfloat16), 2u);
    EXPECT_EQ(ms::dtype_size(DType::int64), 8u);
    EXPECT_THROW(ms::dtype_from_name("float8"), ms::Error);
  });
}

TEST(Tensor, HalfInputsEqualTheirWidenedF32ForFpModes) {
  for_each_backend([&] {
    // Widening is exact, so fp modes give identical bytes for a half tensor and its f32 copy
    // (except the 'nearest' rule, whose ties depend on the dtype; see the conformance test).
    std::vector<float> base = make_data(4 * 128, Dist::student_t3, 8);
    for (DType t : {DType::bfloat16, DType::float16}) {
      std::vector<std::uint16_t> h = to_half(base, t);
      std::vector<float> wide = widen(h, t);
      for (const ms::QuantSpec& s : every_mode()) {
        if (s.mode == ms::Mode::affine) continue;
        expect_same(ms::quantize(view(h, t, {4, 128}), s), ms::quantize(view(wide, {4, 128}), s),
                    std::string(ms::name(s.mode)) + " " + ms::dtype_name(t));
      }
    }
  });
}

TEST(Tensor, DequantizeToEveryDtypeRoundsTheF32Result) {
  for_each_backend([&] {
    std::vector<float> x = make_data(2 * 256, Dist::wide_range, 9);
    for (const ms::QuantSpec& s : every_mode()) {
      ms::Quantized q = ms::quantize(view(x, {2, 256}), s);
      std::vector<float> y32 = values(ms::dequantize(q, DType::float32));
      for (DType out : {DType::bfloat16, DType::float16}) {
        Tensor y = ms::dequantize(q, out);
        ASSERT_EQ(y.dtype(), out);
        ASSERT_EQ(y.shape(), (Shape{2, 256}));
        for (std::int64_t i = 0; i < y.numel(); ++i) {
          const std::uint16_t want = out == DType::bfloat16 ? oracle_bf16(y32[i]) : oracle_f16(y32[i]);
          ASSERT_EQ(y.data<std::uint16_t>()[i], want) << ms::name(s.mode) << " " << ms::dtype_name(out) << " i " << i;
        }
      }
    }
  });
}

TEST(Tensor, StridedViewsEqualContiguous) {
  for_each_backend([&] {
    const std::int64_t rows = 5, k = 128;
    std::vector<float> x = make_data(static_cast<std::size_t>(rows * k), Dist::gaussian, 10);
    // Transposed storage: buffer [k, rows], logical [rows, k] with strides {1, rows}.
    std::vector<float> t(x.size());
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < k; ++c) t[c * rows + r] = x[r * k + c];
    // Sliced storage: every other column of a [rows, 2k] buffer, and a row stride with a gap.
    std::vector<float> s(static_cast<std::size_t>(rows * (2 * k + 6)), kNaN);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < k; ++c) s[r * (2 * k + 6) + 2 * c] = x[r * k + c];
    TensorView tv(t.data(), DType::float32, {rows, k}, {1, rows});
    TensorView sv(s.data(), DType::float32, {rows, k}, {2 * k + 6, 2});
    EXPECT_FALSE(tv.is_contiguous());
    EXPECT_FALSE(sv.is_contiguous());
    // bf16 strided too.
    std::vector<std::uint16_t> hb = to_half(t, DType::bfloat16);
    std::vector<std::uint16_t> xbh = to_half(x, DType::bfloat16);
    TensorView hv(hb.data(), DType::bfloat16, {rows, k}, {1, rows});
    for (const ms::QuantSpec& spec : every_mode()) {
      ms::Quantized ref = ms::quantize(view(x, {rows, k}), spec);
      expect_same(ms::quantize(tv, spec), ref, std::string("transposed ") + ms::name(spec.mode));
      expect_same(ms::quantize(sv, spec), ref, std::string("sliced ") + ms::name(spec.mode));
      expect_same(ms::quantize(hv, spec), ms::quantize(view(xbh, DType::bfloat16, {rows, k}), spec),
                  std::string("bf16 transposed ") + ms::name(spec.mode));
    }
    // Strided global amax.
    EXPECT_EQ(ms::global_scale(tv), ms::global_scale(view(x, {rows, k})));
    EXPECT_EQ(ms::global_scale(sv), ms::global_scale(view(x, {rows, k})));
  });
}

TEST(Tensor, StridedLoosePartsInDequantize) {
  for_each_backend([&] {
    // Loose-part dequantize reads strided packed/scales views (e.g. slices of a checkpoint).
    std::vector<float> x = make_data(4 * 64, Dist::gaussian, 12);
    ms::QuantSpec s;
    s.mode = ms::Mode::mxfp4;
    ms::Quantized q = ms::quantize(view(x, {4, 64}), s);
    const std::vector<std::uint8_t> p = bytes(q.packed), sc = bytes(q.scales);
    // Transposed copies of the packed [4, 32] and scales [4, 2] arrays.
    std::vector<std::uint8_t> pt(p.size()), st(sc.size());
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 32; ++c) pt[c * 4 + r] = p[r * 32 + c];
      for (int c = 0; c < 2; ++c) st[c * 4 + r] = sc[r * 2 + c];
    }
    TensorView pv(pt.data(), DType::uint8, {4, 32}, {1, 4});
    TensorView sv(st.data(), DType::uint8, {4, 2}, {1, 4});
    Tensor y = ms::dequantize(pv, sv, nullptr, q.spec, DType::float32);
    EXPECT_EQ(values(y), values(ms::dequantize(q, DType::float32)));
  });
}

TEST(Tensor, MlxUint32PackedWordsDequantizeLikeBytes) {
  for_each_backend([&] {
    // MLX stores w_q as uint32 [..., K*bits/32]: the same little-endian bytes.
    std::vector<float> x = make_data(3 * 128, Dist::student_t3, 14);
    for (const ms::QuantSpec& s : every_mode()) {
      ms::Quantized q = ms::quantize(view(x, {3, 128}), s);
      const std::vector<std::uint32_t> words = le_words(bytes(q.packed));
      const TensorView wv(words.data(), DType::uint32, {3, 128 * q.spec.bits / 32});
      const TensorView bv = s.mode == ms::Mode::affine ? q.biases.view() : TensorView();
      Tensor y =
          ms::dequantize(wv, q.scales.view(), s.mode == ms::Mode::affine ? &bv : nullptr, q.spec, DType::float32);
      EXPECT_EQ(y.shape(), (Shape{3, 128})) << ms::name(s.mode);
      EXPECT_EQ(values(y), values(ms::dequantize(q, DType::float32))) << ms::name(s.mode);
    }
  });
}

TEST(Tensor, RanksOneThreeFour) {
  for_each_backend([&] {
    std::vector<float> x = make_data(2 * 3 * 2 * 128, Dist::student_t3, 13);
    for (const ms::QuantSpec& s : every_mode()) {
      ms::Quantized flat = ms::quantize(view(x, {12, 128}), s);
      const std::string m = ms::name(s.mode);
      for (const Shape& shape : {Shape{6, 2, 128}, Shape{2, 3, 2, 128}}) {
        ms::Quantized q = ms::quantize(view(x, shape), s);
        expect_same(q, flat, m + " rank " + std::to_string(shape.size()));
        EXPECT_EQ(q.shape, shape);
        Shape pshape = shape, sshape = shape;
        pshape.back() = 128 * q.spec.bits / 8;
        sshape.back() = 128 / q.spec.group_size;
        EXPECT_EQ(q.packed.shape(), pshape) << m;
        EXPECT_EQ(q.scales.shape(), sshape) << m;
        if (s.mode == ms::Mode::affine) {
          EXPECT_EQ(q.biases.shape(), sshape) << m;
        }
        Tensor y = ms::dequantize(q, DType::float32);
        EXPECT_EQ(y.shape(), shape) << m;
        EXPECT_EQ(values(y), values(ms::dequantize(flat, DType::float32))) << m;
      }
      // Rank 1: one row.
      std::vector<float> row(x.begin(), x.begin() + 128);
      ms::Quantized q1 = ms::quantize(view(row, {128}), s);
      ms::Quantized q2 = ms::quantize(view(row, {1, 128}), s);
      expect_same(q1, q2, m + " rank 1");
      EXPECT_EQ(q1.packed.shape(), (Shape{128 * q1.spec.bits / 8})) << m;
      EXPECT_EQ(q1.scales.shape(), (Shape{128 / q1.spec.group_size})) << m;
      Tensor y1 = ms::dequantize(q1, DType::float32);
      EXPECT_EQ(y1.shape(), (Shape{128})) << m;
    }
  });
}

TEST(Tensor, EmptyTensors) {
  for_each_backend([&] {
    std::vector<float> none;
    for (const ms::QuantSpec& s : every_mode()) {
      const std::string m = ms::name(s.mode);
      // rows = 0
      ms::Quantized q = ms::quantize(TensorView(none.data(), DType::float32, {0, 128}), s);
      EXPECT_EQ(q.packed.shape(), (Shape{0, 128 * q.spec.bits / 8})) << m;
      EXPECT_EQ(q.scales.shape(), (Shape{0, 128 / q.spec.group_size})) << m;
      EXPECT_TRUE(q.packed.empty()) << m;
      Tensor y = ms::dequantize(q, DType::bfloat16);
      EXPECT_EQ(y.shape(), (Shape{0, 128})) << m;
      // K = 0
      ms::Quantized qk = ms::quantize(TensorView(none.data(), DType::float32, {3, 0}), s);
      EXPECT_EQ(qk.packed.shape(), (Shape{3, 0})) << m;
      EXPECT_EQ(qk.scales.shape(), (Shape{3, 0})) << m;
      Tensor yk = ms::dequantize(qk, DType::float32);
      EXPECT_EQ(yk.shape(), (Shape{3, 0})) << m;
      // rank 3 with a zero leading axis, and rank 1 with K = 0
      ms::Quantized q3 = ms::quantize(TensorView(none.data(), DType::float16, {2, 0, 64}), s);
      EXPECT_EQ(q3.scales.shape(), (Shape{2, 0, 64 / q3.spec.group_size})) << m;
      EXPECT_EQ(ms::dequantize(q3, DType::float16).shape(), (Shape{2, 0, 64})) << m;
      ms::Quantized q1 = ms::quantize(TensorView(none.data(), DType::float32, {0}), s);
      EXPECT_EQ(q1.packed.shape(), (Shape{0})) << m;
    }
    EXPECT_EQ(ms::global_scale(TensorView(none.data(), DType::float32, {0, 16})), 0.0f);
  });
}

// An empty tensor may have dims whose product exceeds int64 (the zero makes numel 0): its view
// and its strides stay defined (UBSan checks the arithmetic), and ops see no elements.
TEST(Tensor, EmptyTensorWithHugeDims) {
  std::vector<float> none;
  const std::int64_t big = std::int64_t{1} << 40;
  const TensorView v(none.data(), DType::float32, {0, big, big});
  EXPECT_EQ(v.numel(), 0);
  EXPECT_EQ(v.strides[2], 1);
  EXPECT_EQ(v.strides[1], big);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(ms::global_scale(v), 0.0f);
}

TEST(Tensor, TensorBasics) {
  for_each_backend([&] {
    Tensor t(DType::bfloat16, {3, 4});
    EXPECT_EQ(t.numel(), 12);
    EXPECT_EQ(t.nbytes(), 24u);
    for (std::uint16_t v : std::vector<std::uint16_t>(t.data<std::uint16_t>(), t.data<std::uint16_t>() + 12))
      EXPECT_EQ(v, 0);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.bytes()) % 64, 0u);
    Tensor r = t.reshaped({12});
    EXPECT_EQ(r.shape(), (Shape{12}));
    EXPECT_EQ(r.bytes(), t.bytes());
    EXPECT_EQ(ms::contiguous_strides({2, 3, 4}), (Shape{12, 4, 1}));
    EXPECT_EQ(ms::numel({2, 0, 4}), 0);
    const float buf[6] = {};
    EXPECT_TRUE(TensorView(buf, DType::float32, {2, 3}).is_contiguous());
    EXPECT_TRUE(TensorView(buf, DType::float32, {2, 3}, {3, 1}).is_contiguous());
    EXPECT_FALSE(TensorView(buf, DType::float32, {3, 2}, {1, 3}).is_contiguous());
    EXPECT_EQ(ms::shape_str({2, 3}), "(2, 3)");
    EXPECT_EQ(ms::shape_str({5}), "(5,)");
    EXPECT_EQ(ms::shape_str({}), "()");
    EXPECT_EQ(ms::shape_str({2, 3}, ms::ShapeStyle::list), "[2, 3]");
    EXPECT_EQ(ms::shape_str({5}, ms::ShapeStyle::list), "[5]");
    EXPECT_EQ(ms::shape_str({}, ms::ShapeStyle::list), "[]");
    EXPECT_EQ(ms::shape_str({2, 3, 4}, ms::ShapeStyle::dims), "2x3x4");
    EXPECT_EQ(ms::shape_str({5}, ms::ShapeStyle::dims), "5");
    EXPECT_EQ(ms::shape_str({}, ms::ShapeStyle::dims), "scalar");
    // A default-constructed Tensor holds nothing.
    EXPECT_TRUE(Tensor().empty());
    EXPECT_EQ(Tensor().nbytes(), 0u);
  });
}

}  // namespace
