// Every invalid argument is a microscale::Error whose message names what is wrong.
#include <gtest/gtest.h>

#include <cctype>
#include <functional>

#include "support.hpp"

namespace ms = microscale;
using namespace mst;

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Expects fn to throw microscale::Error whose message mentions at least one of `words`
// (case-insensitive).
void expect_error(const std::function<void()>& fn, std::initializer_list<const char*> words, const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << what << ": no error";
  } catch (const ms::Error& e) {
    const std::string msg = lower(e.what());
    bool found = false;
    for (const char* w : words) found = found || msg.find(lower(w)) != std::string::npos;
    EXPECT_TRUE(found) << what << ": message \"" << e.what() << "\" names none of the expected words";
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw a non-microscale exception: " << e.what();
  }
}

ms::QuantSpec mode_spec(ms::Mode m, int group = 0, int bits = 0) {
  ms::QuantSpec s;
  s.mode = m;
  s.group_size = group;
  s.bits = bits;
  return s;
}

const std::vector<float> kData = make_data(4 * 256, Dist::gaussian, 77);

TEST(Errors, KNotMultipleOfGroup) {
  struct Case {
    ms::QuantSpec s;
    std::int64_t k;
  };
  const Case cases[] = {{mode_spec(ms::Mode::nvfp4), 24},
                        {mode_spec(ms::Mode::mxfp4), 48},
                        {mode_spec(ms::Mode::mxfp8), 16},
                        {mode_spec(ms::Mode::affine), 96},
                        {mode_spec(ms::Mode::affine, 128, 4), 192}};
  for (const Case& c : cases)
    expect_error(
        [&] {
          ms::quantize(view(kData, {2, c.k}), c.s);
        },
        {"group", "multiple", "divisible"}, std::string(ms::name(c.s.mode)) + " K=" + std::to_string(c.k));
}

TEST(Errors, UnsupportedGroupOrBits) {
  struct Case {
    ms::Mode m;
    int group, bits;
  };
  const Case cases[] = {{ms::Mode::nvfp4, 32, 0},   {ms::Mode::nvfp4, 8, 0},    {ms::Mode::nvfp4, 0, 8},
                        {ms::Mode::mxfp4, 16, 0},   {ms::Mode::mxfp4, 64, 0},   {ms::Mode::mxfp4, 0, 8},
                        {ms::Mode::mxfp8, 16, 0},   {ms::Mode::mxfp8, 0, 4},    {ms::Mode::affine, 16, 4},
                        {ms::Mode::affine, 256, 4}, {ms::Mode::affine, -64, 4}, {ms::Mode::affine, 64, 1},
                        {ms::Mode::affine, 64, 7},  {ms::Mode::affine, 64, 16}, {ms::Mode::affine, 64, -4}};
  for (const Case& c : cases) {
    const std::string what =
        std::string(ms::name(c.m)) + " group " + std::to_string(c.group) + " bits " + std::to_string(c.bits);
    const ms::QuantSpec s = mode_spec(c.m, c.group, c.bits);
    expect_error([&] { ms::resolve(s); }, {"group", "bits"}, what + " (resolve)");
    expect_error([&] { ms::quantize(view(kData, {2, 512}), s); }, {"group", "bits"}, what);
  }
  // Every supported combination resolves.
  for (int b : {2, 3, 4, 5, 6, 8})
    for (int g : {32, 64, 128}) EXPECT_NO_THROW(ms::resolve(mode_spec(ms::Mode::affine, g, b)));
  EXPECT_NO_THROW(ms::resolve(mode_spec(ms::Mode::nvfp4, 16, 4)));
  EXPECT_NO_THROW(ms::resolve(mode_spec(ms::Mode::mxfp4, 32, 4)));
  EXPECT_NO_THROW(ms::resolve(mode_spec(ms::Mode::mxfp8, 32, 8)));
}

TEST(Errors, GlobalScale) {
  for (ms::Mode m : {ms::Mode::mxfp4, ms::Mode::mxfp8, ms::Mode::affine}) {
    ms::QuantSpec s = mode_spec(m);
    s.global_scale = 1.0f;
    expect_error(
        [&] {
          ms::quantize(view(kData, {2, 128}), s);
        },
        {"global"}, std::string("global_scale with ") + ms::name(m));
  }
  for (float g : {-1.0f, -1e-30f, kNaN, kInf, -kInf}) {
    ms::QuantSpec s;
    s.global_scale = g;
    expect_error([&] { ms::quantize(view(kData, {2, 128}), s); }, {"global"}, "global_scale " + std::to_string(g));
  }
  ms::QuantSpec ok;
  ok.global_scale = 0.0f;
  EXPECT_NO_THROW(ms::quantize(view(kData, {2, 128}), ok));
}

TEST(Errors, QuantizeInputs) {
  std::vector<std::uint8_t> u8(256, 1);
  expect_error(
      [&] {
        ms::quantize(TensorView(u8.data(), DType::uint8, {2, 128}), ms::QuantSpec{});
      },
      {"dtype", "uint8", "type"}, "uint8 input");
  std::vector<std::int32_t> i32(256, 1);
  expect_error(
      [&] {
        ms::quantize(TensorView(i32.data(), DType::int32, {2, 128}), ms::QuantSpec{});
      },
      {"dtype", "int32", "type"}, "int32 input");
  expect_error([&] { ms::quantize(TensorView(kData.data(), DType::float32, {}), ms::QuantSpec{}); },
               {"rank", "scalar", "dim", "0-d"}, "rank 0");
  expect_error(
      [&] {
        ms::quantize(TensorView(kData.data(), DType::float32, {2, 128}, {128}), ms::QuantSpec{});
      },
      {"stride"}, "strides of the wrong rank");
  ms::QuantSpec aff = mode_spec(ms::Mode::affine);
  aff.layout = ms::Layout::swizzled;
  expect_error([&] { ms::quantize(view(kData, {2, 128}), aff); }, {"swizzle", "layout"}, "swizzled affine");
  expect_error([&] { ms::global_scale(TensorView(u8.data(), DType::uint8, {256})); }, {"dtype", "uint8", "type"},
               "global_scale of uint8");
}

TEST(Errors, DequantizeShapes) {
  const std::vector<float> x(4 * 128, 0.5f);
  ms::Quantized nv = ms::quantize(view(x, {4, 128}), ms::QuantSpec{});
  ms::Quantized af = ms::quantize(view(x, {4, 128}), mode_spec(ms::Mode::affine));
  const TensorView nvp = nv.packed.view(), nvs = nv.scales.view();
  const TensorView afp = af.packed.view(), afs = af.scales.view(), afb = af.biases.view();
  // Sanity: the matching parts are accepted.
  EXPECT_NO_THROW(ms::dequantize(nvp, nvs, nullptr, nv.spec, DType::float32));
  EXPECT_NO_THROW(ms::dequantize(afp, afs, &afb, af.spec, DType::float32));

  Tensor s_rows(DType::uint8, {3, 8});     // wrong leading size
  Tensor s_cols(DType::uint8, {4, 7});     // wrong K/group
  Tensor s_rank(DType::uint8, {4, 8, 1});  // wrong rank
  Tensor s_f32(DType::float32, {4, 8});    // wrong dtype for nvfp4 scales
  Tensor p_f32(DType::float32, {4, 64});   // packed must be uint8
  Tensor p_odd(DType::uint8, {4, 63});     // K*bits/8 not whole groups
  for (const Tensor* bad : {&s_rows, &s_cols, &s_rank, &s_f32}) {
    const TensorView bv = bad->view();
    expect_error([&] { ms::dequantize(nvp, bv, nullptr, nv.spec, DType::float32); }, {"scale"},
                 "nvfp4 scales " + ms::shape_str(bad->shape()) + " " + ms::dtype_name(bad->dtype()));
  }
  for (const Tensor* bad : {&p_f32, &p_odd}) {
    const TensorView bv = bad->view();
    expect_error([&] { ms::dequantize(bv, nvs, nullptr, nv.spec, DType::float32); }, {"packed", "scale", "group"},
                 "nvfp4 packed " + ms::shape_str(bad->shape()) + " " + ms::dtype_name(bad->dtype()));
  }
  // Affine: biases missing, of the wrong shape, or of another dtype than the scales.
  expect_error([&] { ms::dequantize(afp, afs, nullptr, af.spec, DType::float32); }, {"bias"}, "affine without biases");
  Tensor b_shape(DType::float32, {4, 3});
  Tensor b_dtype(DType::bfloat16, {4, 2});
  for (const Tensor* bad : {&b_shape, &b_dtype}) {
    const TensorView bv = bad->view();
    expect_error([&] { ms::dequantize(afp, afs, &bv, af.spec, DType::float32); }, {"bias"},
                 "affine biases " + ms::shape_str(bad->shape()) + " " + ms::dtype_name(bad->dtype()));
  }
  Tensor s_aff(DType::float32, {4, 3});
  const TensorView sav = s_aff.view();
  expect_error([&] { ms::dequantize(afp, sav, &afb, af.spec, DType::float32); }, {"scale"}, "affine scales [4, 3]");
  // Biases given to an fp mode.
  expect_error([&] { ms::dequantize(nvp, nvs, &afb, nv.spec, DType::float32); }, {"bias"}, "nvfp4 with biases");
  // Swizzled layout declared, compact scales given.
  ms::QuantSpec sw = nv.spec;
  sw.layout = ms::Layout::swizzled;
  expect_error([&] { ms::dequantize(nvp, nvs, nullptr, sw, DType::float32); }, {"scale", "swizzle"},
               "swizzled spec with compact scales");
  // Output dtype must be a float type.
  expect_error([&] { ms::dequantize(nv, DType::uint8); }, {"dtype", "uint8", "type"}, "dequantize to uint8");
  expect_error([&] { ms::dequantize(nvp, nvs, nullptr, nv.spec, DType::int32); }, {"dtype", "int32", "type"},
               "dequantize to int32");
}

TEST(Errors, Layouts) {
  Tensor f(DType::float32, {4, 4});
  expect_error([&] { ms::swizzle_scales(f.view()); }, {"dtype", "uint8", "type", "scale"}, "swizzle float32");
  Tensor sw(DType::uint8, {128, 4});
  expect_error([&] { ms::unswizzle_scales(sw.view(), 129, 4); }, {"row", "shape", "swizzle"}, "unswizzle rows too big");
  expect_error([&] { ms::unswizzle_scales(sw.view(), 4, 5); }, {"col", "shape", "swizzle"}, "unswizzle cols too big");
  Tensor odd(DType::uint8, {100, 4});
  expect_error([&] { ms::unswizzle_scales(odd.view(), 100, 4); }, {"shape", "swizzle", "128"},
               "unpadded swizzled buffer");
}

TEST(Format, Names) {
  EXPECT_EQ(ms::mode_from_name("nvfp4"), ms::Mode::nvfp4);
  EXPECT_EQ(ms::mode_from_name("affine"), ms::Mode::affine);
  EXPECT_EQ(ms::scale_rule_from_name("nearest"), ms::ScaleRule::nearest);
  EXPECT_EQ(ms::nonfinite_from_name("saturate"), ms::NonFinite::saturate);
  EXPECT_EQ(ms::layout_from_name("swizzled"), ms::Layout::swizzled);
  EXPECT_EQ(ms::elem_from_name("e5m2"), ms::Elem::e5m2);
  for (ms::Mode m : {ms::Mode::nvfp4, ms::Mode::mxfp4, ms::Mode::mxfp8, ms::Mode::affine})
    EXPECT_EQ(ms::mode_from_name(ms::name(m)), m);
  for (ms::ScaleRule r : {ms::ScaleRule::ceil, ms::ScaleRule::floor, ms::ScaleRule::even, ms::ScaleRule::nearest})
    EXPECT_EQ(ms::scale_rule_from_name(ms::name(r)), r);
  expect_error([] { ms::mode_from_name("fp4"); }, {"fp4", "mode"}, "mode name");
  expect_error([] { ms::scale_rule_from_name("up"); }, {"up", "rule"}, "rule name");
  expect_error([] { ms::nonfinite_from_name("ignore"); }, {"ignore", "nonfinite", "non-finite"}, "nonfinite name");
  expect_error([] { ms::layout_from_name("tiled"); }, {"tiled", "layout"}, "layout name");
  expect_error([] { ms::elem_from_name("e3m4"); }, {"e3m4", "elem"}, "elem name");
}

TEST(Format, BitsPerValue) {
  auto bpv = [](ms::QuantSpec s, int scale_bits = 16) { return ms::bits_per_value(ms::resolve(s), scale_bits); };
  EXPECT_DOUBLE_EQ(bpv(mode_spec(ms::Mode::nvfp4)), 4.5);
  EXPECT_DOUBLE_EQ(bpv(mode_spec(ms::Mode::mxfp4)), 4.25);
  EXPECT_DOUBLE_EQ(bpv(mode_spec(ms::Mode::mxfp8)), 8.25);
  EXPECT_DOUBLE_EQ(bpv(mode_spec(ms::Mode::affine)), 4.5);  // 4 + 2*16/64
  EXPECT_DOUBLE_EQ(bpv(mode_spec(ms::Mode::affine, 128, 4)), 4.25);
  EXPECT_DOUBLE_EQ(bpv(mode_spec(ms::Mode::affine, 32, 3), 32), 5.0);  // 3 + 2*32/32
}

}  // namespace

TEST(Errors, ScaleRuleOnlyForMxModes) {
  for (ms::Mode mode : {ms::Mode::nvfp4, ms::Mode::affine}) {
    ms::QuantSpec s;
    s.mode = mode;
    s.scale_rule = ms::ScaleRule::floor;
    EXPECT_THROW(ms::resolve(s), ms::Error);
  }
  ms::QuantSpec s;
  s.mode = ms::Mode::mxfp4;
  s.scale_rule = ms::ScaleRule::floor;
  EXPECT_NO_THROW(ms::resolve(s));
}
