// cpu::amax_finite and cpu::find_nonfinite against reference::amax_finite and a scalar scan, on
// every SIMD target with 1 and 2 threads, for lengths around the vector and chunk sizes.
#include "common.hpp"

using namespace cputest;
namespace cpu = microscale::cpu;

namespace {

std::int64_t first_nonfinite(const std::vector<float>& x) {
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!std::isfinite(x[i])) return static_cast<std::int64_t>(i);
  return -1;
}

void expect_matches(const Input& in, const std::string& what) {
  const auto n = static_cast<std::int64_t>(in.f32.size());
  const float amax = microscale::reference::amax_finite(in.f32.data(), n);
  const std::int64_t first = first_nonfinite(in.f32);
  for_each_target([&](const std::string& where) {
    const float got = cpu::amax_finite(in.bytes.data(), in.dtype, n);
    EXPECT_EQ(microscale::f32_bits(got), microscale::f32_bits(amax))
        << what << " " << microscale::dtype_name(in.dtype) << " n=" << n << " " << where << ": " << got << " vs "
        << amax;
    EXPECT_EQ(cpu::find_nonfinite(in.bytes.data(), in.dtype, n), first)
        << what << " " << microscale::dtype_name(in.dtype) << " n=" << n << " " << where;
  });
}

const std::int64_t kLengths[] = {0, 1, 7, 16, 17, 63, 64, 65, 1000, 65535, 65536, 65537, 300001};

TEST(CpuAmax, RandomData) {
  std::uint64_t seed = 21;
  for (const DType t : {DType::float32, DType::float16, DType::bfloat16})
    for (const std::int64_t n : kLengths)
      for (const bool nonfinite : {false, true})
        expect_matches(make_input(corner_data(static_cast<std::size_t>(n), 16, t, nonfinite, seed++), t), "random");
}

// One non-finite value (or a pair, the later one first in a later chunk) at positions around
// vector, unroll and chunk boundaries; the largest finite value right next to it.
TEST(CpuAmax, FirstNonFinitePositions) {
  const std::int64_t n = 200000;
  for (const DType t : {DType::float32, DType::float16, DType::bfloat16})
    for (const std::int64_t pos : {std::int64_t{0}, std::int64_t{5}, std::int64_t{63}, std::int64_t{64},
                                   std::int64_t{65535}, std::int64_t{65536}, std::int64_t{131071}, n - 1})
      for (const float bad : {kNaN, kInf, -kInf}) {
        std::vector<float> x(static_cast<std::size_t>(n), 1.0f);
        x[static_cast<std::size_t>(pos)] = bad;
        if (pos + 70000 < n) x[static_cast<std::size_t>(pos + 70000)] = kNaN;
        x[static_cast<std::size_t>(pos > 0 ? pos - 1 : 1)] = -2.5f;
        expect_matches(make_input(x, t), "one non-finite");
      }
}

TEST(CpuAmax, EveryBf16AndF16Pattern) {
  std::vector<std::uint16_t> bits(65536);
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<std::uint16_t>(i);
  for (const DType t : {DType::float16, DType::bfloat16}) {
    // All patterns, then the finite ones only (the NaN/Inf patterns replaced by zero).
    expect_matches(input_from_bits(bits, t), "every pattern");
    std::vector<std::uint16_t> finite = bits;
    const std::uint16_t inf = t == DType::float16 ? 0x7C00 : 0x7F80;
    for (std::uint16_t& b : finite)
      if ((b & 0x7FFF) >= inf) b = 0;
    expect_matches(input_from_bits(finite, t), "every finite pattern");
  }
}

}  // namespace
