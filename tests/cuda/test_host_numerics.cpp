// Runs on the CPU, no GPU needed: the CUDA kernels' __host__ __device__ numerics (src/cuda/*.cuh)
// compiled for the host and compared with the CPU library. The codecs exhaustively on every code
// and every bf16/f16 pattern; whole quantize/dequantize runs (the kernels' per-group and
// per-chunk functions over the same cases the GPU tests use) byte for byte against the scalar
// reference. What this cannot show is that nvcc's device code computes what g++'s host code does;
// the GPU tests (tests/cuda/test_ops.cpp) check that on a device.
#include <array>
#include <bit>
#include <numbers>

#include "cases.hpp"
#include "cuda/blocks.cuh"
#include "microscale/cuda.hpp"

namespace {

namespace cd = microscale::cuda::detail;
using namespace mscuda;

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

TEST(CudaNumericsOnHost, DecodersMatchOnEveryCode) {
  for (std::uint32_t c = 0; c < 16; ++c)
    EXPECT_EQ(bits(cd::decode_e2m1(c)), bits(microscale::decode_e2m1(static_cast<std::uint8_t>(c)))) << c;
  for (std::uint32_t c = 0; c < 256; ++c) {
    const auto b = static_cast<std::uint8_t>(c);
    EXPECT_EQ(bits(cd::decode_e4m3(c)), bits(microscale::decode_e4m3(b))) << c;
    EXPECT_EQ(bits(cd::decode_e5m2(c)), bits(microscale::decode_e5m2(b))) << c;
    EXPECT_EQ(bits(cd::decode_e8m0(c)), bits(microscale::decode_e8m0(b))) << c;
    EXPECT_EQ(bits(cd::e8m0_reciprocal(c)), bits(microscale::e8m0_reciprocal(b))) << c;
  }
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const auto h = static_cast<std::uint16_t>(p);
    ASSERT_EQ(bits(cd::decode_bf16(p)), bits(microscale::decode_bf16(h))) << p;
    ASSERT_EQ(bits(cd::decode_f16(p)), bits(microscale::decode_f16(h))) << p;
  }
}

// Every bf16 and f16 value and its two f32 neighbours: all E2M1/E4M3/E5M2 grid points, ties and
// the values just either side of them, every binade, zeros, subnormals, Inf and NaN.
TEST(CudaNumericsOnHost, MinifloatEncodersMatchOnEveryHalfPattern) {
  long checked = 0;
  for (std::uint32_t p = 0; p < 65536; ++p)
    for (float base : {cd::decode_bf16(p), cd::decode_f16(p)})
      for (float v : {base, std::nextafter(base, INFINITY), std::nextafter(base, -INFINITY)}) {
        ASSERT_EQ(cd::encode_e2m1(v), microscale::encode_e2m1(v)) << v;
        ASSERT_EQ(cd::encode_e4m3(v), microscale::encode_e4m3(v)) << v;
        ASSERT_EQ(cd::encode_e5m2(v), microscale::encode_e5m2(v)) << v;
        ++checked;
      }
  EXPECT_EQ(checked, 65536L * 6);
}

// Every f32 high half with low halves that decide bf16 rounding (ties to either parity, one ulp
// either side) and f16 rounding (bit 13 boundary with each parity), which also covers f16's
// subnormal rounding positions (bits 14-23) through the exhaustive high half.
TEST(CudaNumericsOnHost, HalfEncodersMatchOnEveryHighHalf) {
  std::vector<std::uint32_t> lows = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
  for (std::uint32_t b = 0; b < 8; ++b)
    for (std::uint32_t t : {0x0000u, 0x0FFFu, 0x1000u, 0x1001u, 0x1FFFu}) lows.push_back(b << 13 | t);
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (std::uint32_t lo : lows) {
      const float v = std::bit_cast<float>(hi << 16 | lo);
      ASSERT_EQ(cd::encode_bf16(v), microscale::encode_bf16(v)) << std::hex << (hi << 16 | lo);
      ASSERT_EQ(cd::encode_f16(v), microscale::encode_f16(v)) << std::hex << (hi << 16 | lo);
    }
}

// The matmuls' bf16 operand parts add up exactly to the value they split.
TEST(CudaNumericsOnHost, Bf16PartsAreExact) {
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const float b = cd::decode_bf16(p), h = cd::decode_f16(p);
    std::uint16_t one[1], two[2];
    cd::split_bf16<1>(b, one);
    cd::split_bf16<2>(h, two);
    if (!std::isnan(b)) {
      ASSERT_EQ(cd::decode_bf16(one[0]), b) << p;
    }
    if (!std::isnan(h)) {
      ASSERT_EQ(double{cd::decode_bf16(two[0])} + double{cd::decode_bf16(two[1])}, double{h}) << p;
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    float v = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    if (i < 4) v = std::array<float, 4>{FLT_MAX, -FLT_MAX, 3.3961e38f, 0x1p-110f}[static_cast<std::size_t>(i)];
    if (!std::isfinite(v) || std::fabs(v) < 0x1p-110f) continue;
    std::uint16_t three[3];
    cd::split_bf16<3>(v, three);
    const double sum = double{cd::decode_bf16(three[0])} + cd::decode_bf16(three[1]) + cd::decode_bf16(three[2]);
    ASSERT_EQ(sum, double{v}) << std::hex << bits(v);
  }
  std::uint16_t three[3];
  cd::split_bf16<3>(INFINITY, three);
  EXPECT_EQ(three[0], 0x7F80u);
  EXPECT_EQ(three[1] | three[2], 0u);
}

// ---- whole ops: the kernels' work items, run on the host --------------------------------------

struct HostQuantized {
  std::vector<std::uint8_t> packed, scales, biases;
};

HostQuantized emulate_quantize(const Tensor& x, const QuantSpec& spec) {
  const QuantSpec s = microscale::resolve(spec);
  const auto shapes = microscale::cuda::quantized_shapes(x.shape(), x.dtype(), s);
  const std::size_t ssize = microscale::dtype_size(shapes.scale_dtype);
  HostQuantized q;
  q.packed.assign(static_cast<std::size_t>(microscale::numel(shapes.packed)), 0xAB);  // kernels write every byte
  q.scales.assign(static_cast<std::size_t>(microscale::numel(shapes.scales)) * ssize,
                  s.layout == Layout::swizzled ? 0 : 0xAB);  // swizzled padding is pre-zeroed
  if (s.mode == Mode::affine) q.biases.assign(static_cast<std::size_t>(microscale::numel(shapes.biases)) * ssize, 0xAB);
  if (x.numel() == 0) return q;
  const std::int64_t K = x.shape().back(), rows = x.numel() / K;
  const cd::QuantizeArgs a =
      cd::quantize_args(s, x.dtype(), x.bytes(), rows, K, q.packed.data(), q.scales.data(), q.biases.data());
  for (std::int64_t g = 0; g < rows * a.groups; ++g) cd::quantize_group(a, g);
  return q;
}

void check_case(const Case& c, const Shape& shape, DType dtype, std::uint64_t seed) {
  const ReferenceBackend ref;
  const Tensor x = input(shape, dtype, seed);
  const QuantSpec spec = spec_for(c, x);
  const std::string what = c.name + " " + microscale::dtype_name(dtype) + " " + microscale::shape_str(shape);
  const microscale::Quantized want = microscale::quantize(x.view(), spec);
  const HostQuantized got = emulate_quantize(x, spec);
  ASSERT_EQ(got.packed.size(), want.packed.nbytes()) << what;
  ASSERT_EQ(got.scales.size(), want.scales.nbytes()) << what;
  expect_bytes(got.packed.data(), want.packed.bytes(), got.packed.size(), what + " packed");
  expect_bytes(got.scales.data(), want.scales.bytes(), got.scales.size(), what + " scales");
  if (spec.mode == Mode::affine)
    expect_bytes(got.biases.data(), want.biases.bytes(), got.biases.size(), what + " biases");

  const std::int64_t K = shape.back(), rows = K ? x.numel() / K : 0;
  const cd::QuantizedArgs qa = cd::quantized_args(want.spec, want.packed.bytes(), want.scales.bytes(),
                                                  want.biases.bytes(), want.scales.dtype(), rows, K);
  for (DType out : {DType::float32, DType::float16, DType::bfloat16}) {
    const Tensor y = microscale::dequantize(want, out);
    std::vector<std::uint8_t> mine(y.nbytes(), 0xAB);
    for (std::int64_t id = 0; id < rows * K / 8; ++id) cd::dequantize_chunk(qa, mine.data(), out, id);
    expect_floats(mine.data(), y.bytes(), static_cast<std::size_t>(y.numel()), out,
                  what + " dequantize to " + microscale::dtype_name(out));
  }
}

TEST(CudaNumericsOnHost, QuantizeAndDequantizeMatchReferenceOnEveryCase) {
  std::uint64_t seed = 1;
  for (const Case& c : cases())
    for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
      for (const Shape& shape : shapes())
        if (fits(c, shape)) check_case(c, shape, dtype, seed++);
      if (c.big) check_case(c, kBigShape, dtype, seed++);
      if (HasFailure()) return;
    }
}

TEST(CudaNumericsOnHost, Nvfp4TieVectors) {
  for (const auto& [x, s] : nvfp4_tie_vectors()) {
    const ReferenceBackend ref;
    const microscale::Quantized want = microscale::quantize(x.view(), s);
    const HostQuantized got = emulate_quantize(x, s);
    expect_bytes(got.scales.data(), want.scales.bytes(), 1, "tie scale");
    expect_bytes(got.packed.data(), want.packed.bytes(), 8, "tie codes");
  }
}

// One block per positive finite value of the dtype, all 32 elements equal: every bamax a bf16 or
// f16 input can have, under every E8M0 rule (so the 'nearest' rule's log2 is checked on every
// a = RN_T(bamax / max) it can meet with half inputs).
TEST(CudaNumericsOnHost, E8m0RulesMatchOnEveryHalfBlockMax) {
  for (DType dtype : {DType::float16, DType::bfloat16}) {
    std::vector<float> v;
    const std::uint32_t end = dtype == DType::float16 ? 0x7C00u : 0x7F80u;  // +Inf
    for (std::uint32_t p = 1; p < end; ++p) {
      const float f = dtype == DType::float16 ? cd::decode_f16(p) : cd::decode_bf16(p);
      v.insert(v.end(), 32, f);
    }
    const Tensor x = to_tensor(v, dtype, {static_cast<std::int64_t>(v.size() / 32), 32});
    for (const Case& c : cases())
      if ((c.spec.mode == Mode::mxfp4 || c.spec.mode == Mode::mxfp8) && c.spec.layout == Layout::compact &&
          c.spec.nonfinite == NonFinite::propagate) {
        const ReferenceBackend ref;
        const microscale::Quantized want = microscale::quantize(x.view(), c.spec);
        const HostQuantized got = emulate_quantize(x, c.spec);
        expect_bytes(got.scales.data(), want.scales.bytes(), got.scales.size(), c.name + " scales");
        expect_bytes(got.packed.data(), want.packed.bytes(), got.packed.size(), c.name + " packed");
      }
  }
}

// float32 'nearest': block maxima within 256 ulps of sqrt(2) * 2^k * max, where log2 lands next to
// a half-integer and log2f's rounding could decide the scale. (An offline run over every positive
// f32 found glibc's log2f and the double log2 the kernels use giving the same byte everywhere.)
TEST(CudaNumericsOnHost, NearestRuleMatchesNearHalfIntegerLog2) {
  for (Elem e : {Elem::e4m3, Elem::e5m2})
    for (Mode m : {Mode::mxfp4, Mode::mxfp8}) {
      if (m == Mode::mxfp4 && e == Elem::e5m2) continue;
      QuantSpec s;
      s.mode = m;
      s.elem = e;
      s.scale_rule = ScaleRule::nearest;
      const float max = m == Mode::mxfp4 ? 6.0f : e == Elem::e4m3 ? 448.0f : 57344.0f;
      std::vector<float> v;
      for (int k = -140; k <= 127; ++k) {
        float c = std::ldexp(std::numbers::sqrt2_v<float> * max, k);
        if (!std::isfinite(c) || c == 0.0f) continue;
        for (int i = 0; i < 256; ++i) c = std::nextafter(c, 0.0f);
        for (int i = 0; i < 512 && std::isfinite(c); ++i, c = std::nextafter(c, INFINITY)) {
          v.push_back(c);
          v.insert(v.end(), 31, 0.0f);
        }
      }
      const Tensor x = to_tensor(v, DType::float32, {static_cast<std::int64_t>(v.size() / 32), 32});
      const ReferenceBackend ref;
      const microscale::Quantized want = microscale::quantize(x.view(), s);
      const HostQuantized got = emulate_quantize(x, s);
      expect_bytes(got.scales.data(), want.scales.bytes(), got.scales.size(),
                   std::string(microscale::name(m)) + " scales");
    }
}

}  // namespace

// quantized_shapes runs on the host without a device: it is quantize's plan (src/ops/plan.hpp), so
// its shapes and its errors are the CPU op's, word for word.
TEST(CudaPlansOnHost, QuantizedShapesAreTheHostQuantizesPlan) {
  const auto message = [](auto&& f) {
    try {
      f();
    } catch (const microscale::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  for (const char* mode : {"nvfp4", "mxfp8", "affine"}) {
    QuantSpec s;
    s.mode = microscale::mode_from_name(mode);
    if (s.mode == Mode::nvfp4) s.layout = Layout::swizzled;
    const Tensor x(DType::bfloat16, {3, 5, 64});
    const microscale::Quantized q = microscale::quantize(x.view(), s);
    const microscale::cuda::QuantizedShapes shapes = microscale::cuda::quantized_shapes(x.shape(), x.dtype(), s);
    EXPECT_EQ(shapes.packed, q.packed.shape()) << mode;
    EXPECT_EQ(shapes.scales, q.scales.shape()) << mode;
    EXPECT_EQ(shapes.scale_dtype, q.scales.dtype()) << mode;
    EXPECT_EQ(shapes.biases, s.mode == Mode::affine ? q.biases.shape() : Shape{}) << mode;
    const std::pair<Shape, DType> bad_inputs[] = {
        {{2, 40}, DType::float32}, {{2, 64}, DType::int32}, {{}, DType::float32}};
    for (const auto& [shape, dtype] : bad_inputs) {
      const Tensor bad(dtype, shape);
      const std::string host = message([&] { microscale::quantize(bad.view(), s); });
      EXPECT_NE(host, "no error") << mode;
      EXPECT_EQ(message([&] { microscale::cuda::quantized_shapes(shape, dtype, s); }), host) << mode;
    }
  }
}
