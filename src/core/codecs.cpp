#include "microscale/codecs.hpp"

#include <array>
#include <cmath>
#include <limits>

namespace microscale {
namespace {

// Rounds a finite magnitude a (0 <= a <= the format's max) to the nearest code of a minifloat
// with M explicit mantissa bits whose smallest normal is 2^EMIN, ties to the even code. Codes
// are (biased exponent << M) | mantissa with bias 1 - EMIN, so the subnormal codes 0..2^M-1
// continue seamlessly into the normals and a carry out of the mantissa bumps the exponent.
template <int M, int EMIN>
std::uint32_t round_magnitude(float a) {
  if (a < std::ldexp(1.0f, EMIN)) {
    // Subnormal range: multiples of 2^(EMIN-M). Scaling by a power of two is exact.
    return static_cast<std::uint32_t>(std::nearbyint(a * std::ldexp(1.0f, M - EMIN)));
  }
  constexpr int kShift = 23 - M;
  std::uint32_t b = f32_bits(a);
  b += ((1u << (kShift - 1)) - 1) + ((b >> kShift) & 1u);  // RNE on the dropped bits
  b >>= kShift;
  return b - (static_cast<std::uint32_t>(126 + EMIN) << M);  // rebias 127 -> 1 - EMIN
}

// Sign-magnitude minifloat with the sign at bit kSignBit; overflow and Inf saturate to kMaxCode.
template <int M, int EMIN, int kSignBit, std::uint8_t kMaxCode>
std::uint8_t encode_saturating(float v, float max_value, std::uint8_t nan_code) {
  if (std::isnan(v)) return nan_code;
  const std::uint8_t sign = std::signbit(v) ? static_cast<std::uint8_t>(1u << kSignBit) : 0;
  const float a = std::fabs(v);
  if (a >= max_value) return static_cast<std::uint8_t>(sign | kMaxCode);
  return static_cast<std::uint8_t>(sign | round_magnitude<M, EMIN>(a));
}

template <int M, int EMIN>
float decode_minifloat(std::uint32_t magnitude_code) {
  const std::uint32_t e = magnitude_code >> M;
  const std::uint32_t m = magnitude_code & ((1u << M) - 1);
  if (e == 0) return std::ldexp(static_cast<float>(m), EMIN - M);
  return std::ldexp(1.0f + static_cast<float>(m) / static_cast<float>(1u << M),
                    static_cast<int>(e) - 1 + EMIN);
}

struct Tables {
  std::array<float, 16> e2m1;
  std::array<float, 256> e4m3;
  std::array<float, 256> e5m2;
  Tables() {
    for (std::uint32_t c = 0; c < 16; ++c) {
      const float v = decode_minifloat<1, 0>(c & 7u);
      e2m1[c] = (c & 8u) ? -v : v;
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    for (std::uint32_t c = 0; c < 256; ++c) {
      const bool neg = (c & 0x80u) != 0;
      const std::uint32_t mag = c & 0x7Fu;
      float v = mag == 0x7F ? nan : decode_minifloat<3, -6>(mag);
      e4m3[c] = neg ? -v : v;
      v = mag >= 0x7D ? nan : mag == 0x7C ? inf : decode_minifloat<2, -14>(mag);
      e5m2[c] = neg ? -v : v;
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

std::uint8_t encode_e2m1(float v) {
  return encode_saturating<1, 0, 3, 0x7>(v, 6.0f, 0x7);
}
float decode_e2m1(std::uint8_t code) { return tables().e2m1[code & 0xFu]; }

std::uint8_t encode_e4m3(float v) {
  return encode_saturating<3, -6, 7, 0x7E>(v, 448.0f, 0x7F);
}
float decode_e4m3(std::uint8_t code) { return tables().e4m3[code]; }

std::uint8_t encode_e5m2(float v) {
  return encode_saturating<2, -14, 7, 0x7B>(v, 57344.0f, 0x7F);
}
float decode_e5m2(std::uint8_t code) { return tables().e5m2[code]; }

std::uint8_t encode_e8m0(float v) {
  if (!(v > 0.0f) || std::isinf(v)) return 0xFF;  // zero, negative, NaN, Inf
  const std::uint32_t b = f32_bits(v);
  if (b < 0x00800000u) return b >= 0x00600000u ? 1 : 0;  // f32 subnormal: midpoint 1.5 * 2^-127
  const std::uint32_t e = (b + 0x00400000u) >> 23;        // the midpoint 1.5 * 2^k rounds up
  return static_cast<std::uint8_t>(e > 254 ? 254 : e);
}
float decode_e8m0(std::uint8_t code) {
  if (code == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  if (code == 0) return f32_from_bits(0x00400000u);
  return f32_from_bits(static_cast<std::uint32_t>(code) << 23);
}
float e8m0_reciprocal(std::uint8_t code) {
  if (code == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  if (code == 254) return f32_from_bits(0x00400000u);
  return f32_from_bits(static_cast<std::uint32_t>(254 - code) << 23);
}

std::uint16_t encode_bf16(float v) {
  const std::uint32_t b = f32_bits(v);
  if (std::isnan(v)) return static_cast<std::uint16_t>((b >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}
float decode_bf16(std::uint16_t bits) { return f32_from_bits(static_cast<std::uint32_t>(bits) << 16); }

std::uint16_t encode_f16(float v) {
  const std::uint32_t b = f32_bits(v);
  const std::uint16_t sign = static_cast<std::uint16_t>((b >> 16) & 0x8000u);
  const std::uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x1FFu));
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to Inf
  if (a < 0x38800000u) {  // below 2^-14: multiples of 2^-24
    const float scaled = f32_from_bits(a) * 16777216.0f;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(scaled)));
  }
  const std::uint32_t r = (a - (112u << 23) + 0xFFFu + ((a >> 13) & 1u)) >> 13;
  return static_cast<std::uint16_t>(sign | r);
}
float decode_f16(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t e = (bits >> 10) & 0x1Fu;
  const std::uint32_t m = bits & 0x3FFu;
  if (e == 0) {
    const float v = static_cast<float>(m) * f32_from_bits(0x33800000u);  // m * 2^-24, exact
    return f32_from_bits(f32_bits(v) | sign);
  }
  if (e == 31) return f32_from_bits(sign | 0x7F800000u | (m << 13));
  return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace microscale
