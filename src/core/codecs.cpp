// The public element codecs: the scalar specification's (src/core/numerics.hpp), out of line.
#include "microscale/codecs.hpp"

#include "core/numerics.hpp"

namespace microscale {

std::uint8_t encode_e2m1(float v) { return numerics::encode_e2m1(v); }
float decode_e2m1(std::uint8_t code) { return numerics::decode_e2m1(code); }
std::uint8_t encode_e4m3(float v) { return numerics::encode_e4m3(v); }
float decode_e4m3(std::uint8_t code) { return numerics::decode_e4m3(code); }
std::uint8_t encode_e5m2(float v) { return numerics::encode_e5m2(v); }
float decode_e5m2(std::uint8_t code) { return numerics::decode_e5m2(code); }

std::uint8_t encode_e8m0(float v) { return numerics::encode_e8m0(v); }
float decode_e8m0(std::uint8_t code) { return numerics::decode_e8m0(code); }
float e8m0_reciprocal(std::uint8_t code) { return numerics::e8m0_reciprocal(code); }

std::uint16_t encode_bf16(float v) { return numerics::encode_bf16(v); }
float decode_bf16(std::uint16_t bits) { return numerics::decode_bf16(bits); }
std::uint16_t encode_f16(float v) { return numerics::encode_f16(v); }
float decode_f16(std::uint16_t bits) { return numerics::decode_f16(bits); }

}  // namespace microscale
