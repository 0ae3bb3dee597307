// Element values of safetensors data (tensor_values.hpp).
#include <cmath>
#include <cstring>

#include "io/tensor_values.hpp"
#include "microscale/codecs.hpp"

namespace microscale::io::ck {

namespace {

// NaN and Inf are the values with every exponent bit set, in each float format; NaN has a
// mantissa bit set too.
template <class Bits>
NonFiniteCount count_exponent_all_ones(std::span<const std::byte> data, Bits exponent, Bits mantissa) {
  NonFiniteCount n;
  for (std::size_t i = 0; i + sizeof(Bits) <= data.size(); i += sizeof(Bits)) {
    Bits v;
    std::memcpy(&v, data.data() + i, sizeof(Bits));
    if ((v & exponent) == exponent) ++((v & mantissa) ? n.nan : n.inf);
  }
  return n;
}

}  // namespace

NonFiniteCount count_nonfinite(std::span<const std::byte> data, StDType t) {
  switch (t) {
    case StDType::f32: return count_exponent_all_ones<std::uint32_t>(data, 0x7F800000u, 0x007FFFFFu);
    case StDType::bf16: return count_exponent_all_ones<std::uint16_t>(data, 0x7F80u, 0x007Fu);
    case StDType::f16: return count_exponent_all_ones<std::uint16_t>(data, 0x7C00u, 0x03FFu);
    default: return {};
  }
}

bool has_values(StDType t) {
  switch (t) {
    case StDType::f32:
    case StDType::f16:
    case StDType::bf16:
    case StDType::f64:
    case StDType::f8_e4m3:
    case StDType::f8_e5m2:
    case StDType::f8_e8m0: return true;
    default: return false;
  }
}

double element_value(const std::byte* p, StDType t, std::size_t i) {
  switch (t) {
    case StDType::f32: {
      float v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case StDType::f64: {
      double v;
      std::memcpy(&v, p + 8 * i, 8);
      return v;
    }
    case StDType::f16: {
      std::uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return decode_f16(h);
    }
    case StDType::bf16: {
      std::uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return decode_bf16(h);
    }
    case StDType::f8_e4m3: return decode_e4m3(static_cast<std::uint8_t>(p[i]));
    case StDType::f8_e5m2: return decode_e5m2(static_cast<std::uint8_t>(p[i]));
    case StDType::f8_e8m0:
    case StDType::u8: return decode_e8m0(static_cast<std::uint8_t>(p[i]));
    default: return NAN;
  }
}

}  // namespace microscale::io::ck
