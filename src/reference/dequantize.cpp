#include <cmath>

#include "core/convert.hpp"
#include "core/numerics.hpp"
#include "reference/reference.hpp"

namespace microscale::reference {
namespace {

std::uint8_t nibble(const std::uint8_t* row, std::int64_t i) {
  return static_cast<std::uint8_t>((row[i / 2] >> ((i & 1) * 4)) & 0xFu);
}

std::uint32_t get_bits(const std::uint8_t* row, std::int64_t i, int bits) {
  std::uint32_t v = 0;
  std::int64_t t = i * bits;
  for (int k = 0; k < bits; ++k, ++t) v |= static_cast<std::uint32_t>((row[t / 8] >> (t % 8)) & 1u) << k;
  return v;
}

// Element value times block factor. Where both are NaN, which NaN a multiply returns depends on
// the operand order the compiler picks (and the ISA): the factor's NaN is taken explicitly, so
// a NaN scale decodes its whole block to itself on every platform.
float scaled(float value, float factor) { return std::isnan(factor) ? factor : value * factor; }

}  // namespace

void dequantize(const std::uint8_t* packed, const std::byte* scales, const std::byte* biases, DType scale_dtype,
                std::int64_t rows, std::int64_t K, const QuantSpec& spec, DType out, std::byte* y) {
  const int g = spec.group_size;
  const std::int64_t groups = K / g;
  const std::int64_t row_bytes = K * spec.bits / 8;
  const std::size_t out_size = dtype_size(out);
  const std::size_t scale_size = dtype_size(scale_dtype);
  const bool three_level = spec.mode == Mode::nvfp4 && spec.global_scale.has_value();
  const float amax = three_level ? *spec.global_scale : 0.0f;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint8_t* pr = packed + r * row_bytes;
    for (std::int64_t j = 0; j < groups; ++j) {
      const std::size_t gi = static_cast<std::size_t>(r * groups + j);
      const std::byte* sp = scales + gi * scale_size;
      const auto code8 = static_cast<std::uint8_t>(*sp);
      for (std::int64_t k = j * g; k < (j + 1) * g; ++k) {
        float v = 0.0f;
        switch (spec.mode) {
          case Mode::nvfp4:
            v = scaled(numerics::decode_e2m1(nibble(pr, k)), numerics::nvfp4_decode_factor(code8, three_level, amax));
            break;
          case Mode::mxfp4: v = scaled(numerics::decode_e2m1(nibble(pr, k)), numerics::decode_e8m0(code8)); break;
          case Mode::mxfp8: v = scaled(numerics::decode_fp8(spec.elem, pr[k]), numerics::decode_e8m0(code8)); break;
          case Mode::affine: {
            const float s = detail::load_f32(sp, scale_dtype);
            const float b = detail::load_f32(biases + gi * scale_size, scale_dtype);
            // The scale's NaN before the bias's, for the same reason, made quiet as arithmetic would.
            v = std::isnan(s) ? f32_from_bits(f32_bits(s) | 0x00400000u)
                              : numerics::affine_decode(get_bits(pr, k, spec.bits), s, b);
            break;
          }
        }
        detail::store_f32(v, out, y + static_cast<std::size_t>(r * K + k) * out_size);
      }
    }
  }
}

}  // namespace microscale::reference
