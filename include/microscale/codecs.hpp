// Element codecs: float32 <-> E2M1, E4M3, E5M2, E8M0, bfloat16, float16.
//
// Encoders round to nearest, ties to the even code, and saturate finite overflow (and, for the
// 8- and 4-bit formats, infinities) to the largest finite value; bfloat16 and float16 follow IEEE
// (overflow -> Inf). Decoders are exact. Standalone NaN handling (quantizers apply the nonfinite
// policy before reaching these):
//   E2M1  NaN -> 0x7 (+6), +-Inf -> +-6            (as NVIDIA's cvt.rn.satfinite.e2m1x2)
//   E4M3  NaN -> 0x7F, +-Inf -> +-448; 0x7F/0xFF decode to NaN
//   E5M2  NaN -> 0x7F, +-Inf -> +-57344; 0x7C/0xFC decode to +-Inf
//   E8M0  see encode_e8m0.
// See docs/numerics.md and FORMATS.md section 1.
#pragma once

#include <cstdint>
#include <cstring>

namespace microscale {

inline std::uint32_t f32_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Correctly rounded reciprocals of FORMATS.md section 0 (each slightly above the true value).
inline constexpr std::uint32_t kC6Bits = 0x3E2AAAABu;       // fl(1/6)
inline constexpr std::uint32_t kC448Bits = 0x3B124925u;     // fl(1/448)
inline constexpr std::uint32_t kC57344Bits = 0x37924925u;   // fl(1/57344)
inline constexpr std::uint32_t kC2688Bits = 0x39C30C31u;    // fl(1/2688)
inline constexpr std::uint32_t kC2688SqBits = 0x34149B93u;  // fl(1/7225344)

std::uint8_t encode_e2m1(float v);  // 4-bit code in the low nibble
float decode_e2m1(std::uint8_t code);
std::uint8_t encode_e4m3(float v);
float decode_e4m3(std::uint8_t code);
std::uint8_t encode_e5m2(float v);
float decode_e5m2(std::uint8_t code);

// E8M0 holds 2^(e-127) for e = 0..254 and NaN at 0xFF. The standalone encoder rounds positive
// finite v to the nearest power of two in the linear domain (the midpoint 1.5*2^k rounds up, as
// round-to-nearest on a zero-bit mantissa), saturating to 2^127 above and 2^-127 below; zero,
// negative values, NaN and Inf encode as 0xFF. Block quantizers compute their E8M0 scales with
// the scale rules of FORMATS.md 2.2, not with this function.
std::uint8_t encode_e8m0(float v);
float decode_e8m0(std::uint8_t code);      // 0x00 -> 2^-127 (subnormal), 0xFF -> NaN
float e8m0_reciprocal(std::uint8_t code);  // 2^(127-e) for e <= 254, exact

std::uint16_t encode_bf16(float v);
float decode_bf16(std::uint16_t bits);
std::uint16_t encode_f16(float v);
float decode_f16(std::uint16_t bits);

}  // namespace microscale
