// cpu::dequantize against reference::dequantize, byte for byte, on every SIMD target with 1 and
// 2 threads: every (scale code, element code) pair, random codes, and affine groups quantized
// from corner-case data, to float32, float16 and bfloat16.
#include "common.hpp"

using namespace cputest;
namespace ref = microscale::reference;
namespace cpu = microscale::cpu;

namespace {

struct Quantized {
  Quantized(std::int64_t r, std::int64_t k, const QuantSpec& s, DType sd = DType::uint8)
      : rows(r), K(k), spec(s), scale_dtype(sd) {}
  std::int64_t rows, K;
  QuantSpec spec;
  DType scale_dtype;
  std::vector<std::uint8_t> packed, scales, biases;
};

const std::byte* bytes(const std::vector<std::uint8_t>& v) {
  return v.empty() ? nullptr : reinterpret_cast<const std::byte*>(v.data());
}

std::vector<std::uint8_t> run(const Quantized& q, DType out, bool reference) {
  std::vector<std::uint8_t> y(static_cast<std::size_t>(q.rows * q.K) * microscale::dtype_size(out), 0xA5);
  auto* yb = reinterpret_cast<std::byte*>(y.data());
  if (reference)
    ref::dequantize(q.packed.data(), bytes(q.scales), bytes(q.biases), q.scale_dtype, q.rows, q.K, q.spec, out, yb);
  else
    cpu::dequantize(q.packed.data(), bytes(q.scales), bytes(q.biases), q.scale_dtype, q.rows, q.K, q.spec, out, yb);
  return y;
}

void expect_matches(const Quantized& q, const std::string& what) {
  for (const DType out : {DType::float32, DType::float16, DType::bfloat16}) {
    const std::vector<std::uint8_t> want = run(q, out, true);
    const std::size_t es = microscale::dtype_size(out);
    for_each_target([&](const std::string& where) {
      const std::vector<std::uint8_t> got = run(q, out, false);
      const std::int64_t d = first_diff(got, want);
      if (d < 0) return;
      const std::int64_t e = d / static_cast<std::int64_t>(es);
      const std::int64_t g = e / q.spec.group_size;
      std::uint32_t gv = 0, wv = 0;
      std::memcpy(&gv, got.data() + e * static_cast<std::int64_t>(es), es);
      std::memcpy(&wv, want.data() + e * static_cast<std::int64_t>(es), es);
      ADD_FAILURE() << what << " " << microscale::name(q.spec.mode) << " -> " << microscale::dtype_name(out) << " "
                    << where << ": element " << e << " got 0x" << std::hex << gv << " want 0x" << wv
                    << " (packed byte 0x" << int{q.packed[static_cast<std::size_t>(e * q.spec.bits / 8)]}
                    << ", scale byte 0x"
                    << int{q.scales[static_cast<std::size_t>(g) * microscale::dtype_size(q.scale_dtype)]} << ")";
    });
  }
}

QuantSpec fp_spec(Mode m, Elem e = Elem::e4m3, std::optional<float> global = std::nullopt) {
  QuantSpec s;
  s.mode = m;
  s.elem = e;
  s.global_scale = global;
  return microscale::resolve(s);
}

// The nvfp4 and mx specs, three-level nvfp4 with amaxes that keep, overflow and underflow the
// decode factor.
std::vector<QuantSpec> dequant_specs() {
  std::vector<QuantSpec> out = {fp_spec(Mode::nvfp4), fp_spec(Mode::mxfp4), fp_spec(Mode::mxfp8, Elem::e4m3),
                                fp_spec(Mode::mxfp8, Elem::e5m2)};
  for (const float g : {1.0f, 2688.0f, 18.25f, 0.0f, 1e-37f, kFltMax})
    out.push_back(fp_spec(Mode::nvfp4, Elem::e4m3, g));
  return out;
}

// Every scale byte against every element code: block i has scale i % 256 and its elements cycle
// through all codes.
TEST(CpuDequantize, EveryScaleAndElementCode) {
  for (const QuantSpec& s : dequant_specs()) {
    Quantized q{0, 0, s};
    const int codes = s.bits == 4 ? 16 : 256;
    const int blocks_per_scale = std::max(1, codes / s.group_size);
    q.K = s.group_size * 3;
    q.rows = (256 * blocks_per_scale + 2) / 3;
    const std::int64_t blocks = q.rows * 3;
    q.scales.resize(static_cast<std::size_t>(blocks));
    q.packed.resize(static_cast<std::size_t>(q.rows * q.K * s.bits / 8));
    for (std::int64_t b = 0; b < blocks; ++b)
      q.scales[static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(b / blocks_per_scale);
    for (std::int64_t e = 0; e < q.rows * q.K; ++e) {
      const auto c = static_cast<std::uint8_t>(e % codes);
      if (s.bits == 4)
        q.packed[static_cast<std::size_t>(e / 2)] |= static_cast<std::uint8_t>(c << (e % 2 * 4));
      else
        q.packed[static_cast<std::size_t>(e)] = c;
    }
    expect_matches(q, "every code");
  }
}

TEST(CpuDequantize, RandomCodes) {
  std::mt19937_64 rng(3);
  for (const QuantSpec& s : dequant_specs())
    for (const std::int64_t rows : {1, 3, 129})
      for (const std::int64_t K : {32, 96, 4096}) {
        Quantized q{rows, K, s};
        q.packed.resize(static_cast<std::size_t>(rows * K * s.bits / 8));
        q.scales.resize(static_cast<std::size_t>(rows * (K / s.group_size)));
        for (auto& b : q.packed) b = static_cast<std::uint8_t>(rng());
        // Mostly plausible scales (E4M3 0..0x7E, E8M0 around 127), some of every byte.
        for (auto& b : q.scales)
          b = static_cast<std::uint8_t>(rng() % 4 == 0          ? rng()
                                        : s.mode == Mode::nvfp4 ? rng() % 0x7F
                                                                : 100 + rng() % 50);
        expect_matches(q, "random");
      }
}

// Codes and scales of quantized corner-case data (mostly tiles without NaN codes, which take
// their own path), with and without NaN/Inf blocks.
TEST(CpuDequantize, QuantizedData) {
  std::uint64_t seed = 31;
  for (const std::int64_t rows : {1, 3, 129})
    for (const std::int64_t K : {32, 96, 4096})
      for (const bool nonfinite : {false, true}) {
        const Input in = make_input(
            corner_data(static_cast<std::size_t>(rows * K), 16, DType::float32, nonfinite, seed++), DType::float32);
        for (const NamedSpec& ns : cputest::fp_specs(K, NonFinite::propagate, global_scales_for(in.f32))) {
          Quantized q{rows, K, ns.spec};
          q.packed.resize(static_cast<std::size_t>(rows * K * ns.spec.bits / 8));
          q.scales.resize(static_cast<std::size_t>(rows * (K / ns.spec.group_size)));
          ref::quantize(in.f32.data(), rows, K, DType::float32, ns.spec, q.packed.data(),
                        reinterpret_cast<std::byte*>(q.scales.data()), nullptr);
          expect_matches(q, ns.name);
        }
      }
}

// Affine: scales and biases from quantizing corner-case data (finite, NaN groups, extremes),
// stored in the input dtype.
TEST(CpuDequantize, Affine) {
  std::uint64_t seed = 11;
  for (const DType t : {DType::float32, DType::float16, DType::bfloat16})
    for (const std::int64_t rows : {1, 3, 129})
      for (const std::int64_t K : {128, 1024})
        for (const NamedSpec& ns : affine_specs(K, NonFinite::propagate)) {
          const Input in = make_input(corner_data(static_cast<std::size_t>(rows * K), 32, t, true, seed++), t);
          Quantized q{rows, K, ns.spec, t};
          const std::size_t groups = static_cast<std::size_t>(rows * (K / ns.spec.group_size));
          q.packed.resize(static_cast<std::size_t>(rows * K * ns.spec.bits / 8));
          q.scales.resize(groups * microscale::dtype_size(t));
          q.biases.resize(q.scales.size());
          ref::quantize(in.f32.data(), rows, K, t, ns.spec, q.packed.data(),
                        reinterpret_cast<std::byte*>(q.scales.data()), reinterpret_cast<std::byte*>(q.biases.data()));
          expect_matches(q, ns.name);
        }
}

}  // namespace
