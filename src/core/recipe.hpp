// The NVFP4 training recipe's numerics (docs/numerics.md, "Training-recipe numerics"), written
// once for every backend: the 16-point random Hadamard transform and stochastic rounding to
// E2M1. (2D 16x16 scaling needs no new per-element math: the tile's amax goes through the
// standard nvfp4 block-scale rule of core/numerics.hpp.) Same conventions as numerics.hpp: plain
// binary32 operations in the written order, host and device.
#pragma once

#include <cstdint>

#include "core/numerics.hpp"

namespace microscale::numerics {

// ---- random Hadamard transform --------------------------------------------------------------

constexpr int kHadamardSize = 16;
// Bit i set: input i of each chunk is negated before the Hadamard matrix (TransformerEngine's
// sign vector).
constexpr std::uint32_t kHadamardSigns = 0xD7E8u;

// Sylvester Hadamard entry H[i][j] = (-1)^popcount(i & j) is negative.
MS_HD bool hadamard_negative(int i, int j) {
  std::uint32_t p = static_cast<std::uint32_t>(i & j);
  p ^= p >> 2;
  p ^= p >> 1;
  return (p & 1u) != 0;
}

// One chunk of 16: y_j = RN_bf16(fl(s_j * 0.25)), s_j the f32 sum in index order (starting from
// the first term, so zero signs follow IEEE addition) of the terms +-x_i, the sign being
// d_i * H[i][j]. Every term is exact (a sign flip); only the sum and the bf16 rounding round.
// y holds the bf16 values as float.
MS_HD void hadamard16(const float* x, float* y) {
  for (int j = 0; j < kHadamardSize; ++j) {
    float s = 0.0f;
    for (int i = 0; i < kHadamardSize; ++i) {
      const bool negate = (((kHadamardSigns >> i) & 1u) != 0) != hadamard_negative(i, j);
      const float term = negate ? -x[i] : x[i];
      s = i == 0 ? term : s + term;
    }
    y[j] = decode_bf16(encode_bf16(s * 0.25f));
  }
}

// ---- stochastic rounding to E2M1 ------------------------------------------------------------

// The random byte of element `index` (row-major flat index in the quantized tensor) under
// `seed`: the top 8 bits of the (index+1)-th output of SplitMix64 seeded with `seed`. A pure
// function of (seed, index), so any split of the work gives the same bits.
MS_HD std::uint32_t stochastic_byte(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (index + 1u);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<std::uint32_t>(z >> 56);
}

// Magnitude code of the largest E2M1 value <= a (a >= 0).
MS_HD std::uint32_t e2m1_floor_code(float a) {
  return a >= 6.0f   ? 7u
         : a >= 4.0f ? 6u
         : a >= 3.0f ? 5u
         : a >= 2.0f ? 4u
         : a >= 1.5f ? 3u
         : a >= 1.0f ? 2u
         : a >= 0.5f ? 1u
                     : 0u;
}

// E2M1 code of v rounded stochastically with random byte u: between the grid neighbours lo <= |v|
// < hi, t = fl(|v| + fl(fl(u * 2^-8) * (hi - lo))) is floored to the grid, so |v| rounds up with
// probability (|v| - lo) / (hi - lo) to within 2^-8 (t < hi exactly, and f32 rounding never
// carries t past hi: the result is always lo or hi). |v| >= 6 and +-Inf give +-6, NaN +6 (as the
// round-to-nearest encoder); the sign is copied from v.
MS_HD std::uint8_t encode_e2m1_stochastic(float v, std::uint32_t u) {
  if (is_nan(v)) return static_cast<std::uint8_t>(E2M1::NAN_CODE);
  const std::uint32_t sign = (bits_of(v) >> 31) ? static_cast<std::uint32_t>(E2M1::SIGN_BIT) : 0u;
  const float a = fabsf(v);
  if (a >= E2M1::MAX) return static_cast<std::uint8_t>(sign | static_cast<std::uint32_t>(E2M1::MAX_CODE));
  const std::uint32_t lo = e2m1_floor_code(a);
  const float step = decode_e2m1(lo + 1u) - decode_e2m1(lo);
  const float t = a + (static_cast<float>(u) * 0.00390625f) * step;
  return static_cast<std::uint8_t>(sign | e2m1_floor_code(t));
}

}  // namespace microscale::numerics
