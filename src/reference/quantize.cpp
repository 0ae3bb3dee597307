#include <algorithm>
#include <cmath>
#include <limits>

#include "core/convert.hpp"
#include "microscale/codecs.hpp"
#include "reference/reference.hpp"

namespace microscale::reference {
namespace {

constexpr float kFltMax = std::numeric_limits<float>::max();
const float kC6 = f32_from_bits(kC6Bits);
const float kC448 = f32_from_bits(kC448Bits);
const float kC57344 = f32_from_bits(kC57344Bits);

bool all_finite(const float* x, int n) {
  for (int i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

// Block amax. Only 'saturate' sees non-finite blocks: NaN is skipped and Inf kept, as TE. The
// explicit test matters: glibc's fmaxf returns NaN for a signaling NaN instead of skipping it.
float block_amax(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i)
    if (!std::isnan(x[i])) m = std::fmax(m, std::fabs(x[i]));
  return m;
}

// i is an element index within the row: 64-bit, since rows may hold more than 2^31 values.
void put_nibble(std::uint8_t* row, std::int64_t i, std::uint8_t code) {
  row[i / 2] = static_cast<std::uint8_t>(row[i / 2] | (code << ((i & 1) * 4)));
}

// ---- nvfp4 (FORMATS.md 2.1, TransformerEngine's operation order) ----

struct Nvfp4Factors {
  bool three_level;
  float amax, s_enc, s_dec;
};

Nvfp4Factors nvfp4_factors(const QuantSpec& spec) {
  if (!spec.global_scale) return {false, 0.0f, 1.0f, 1.0f};
  const float amax = *spec.global_scale;
  float s_enc = std::fmin(2688.0f / amax, kFltMax);
  if (amax == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
  return {true, amax, s_enc, 1.0f / s_enc};
}

void nvfp4_block(const float* x, const Nvfp4Factors& f, NonFinite policy, std::uint8_t* row,
                 std::int64_t first, std::uint8_t* scale) {
  constexpr int G = 16;
  if (policy != NonFinite::saturate && !all_finite(x, G)) {
    *scale = 0x7F;  // E4M3 NaN; element codes stay 0
    return;
  }
  const float bamax = block_amax(x, G);
  std::uint8_t s;
  float enc;
  if (f.three_level) {
    s = encode_e4m3(std::fmin(bamax * (f.s_enc * kC6), kFltMax));
    const float sf = decode_e4m3(s);
    enc = std::fmin(1.0f / (sf * f.s_dec), kFltMax);
  } else {
    s = encode_e4m3(bamax * kC6);
    enc = std::fmin(1.0f / decode_e4m3(s), kFltMax);
  }
  *scale = s;
  for (int i = 0; i < G; ++i) put_nibble(row, first + i, encode_e2m1(x[i] * enc));
}

// ---- mxfp4 / mxfp8 (FORMATS.md 2.2) ----

struct ElemFormat {
  float max;
  int emax;
  int mbits;
  float c_max;  // fl(1/max)
  std::uint8_t (*encode)(float);
};

ElemFormat elem_format(const QuantSpec& spec) {
  if (spec.mode == Mode::mxfp4) return {6.0f, 2, 1, kC6, encode_e2m1};
  if (spec.elem == Elem::e5m2) return {57344.0f, 15, 2, kC57344, encode_e5m2};
  return {448.0f, 8, 3, kC448, encode_e4m3};
}

std::uint8_t e8m0_scale(float bamax, const ElemFormat& ef, ScaleRule rule, DType src) {
  switch (rule) {
    case ScaleRule::ceil: {
      const float v = bamax * ef.c_max;
      if (std::isnan(v)) return 0xFF;
      if (std::isinf(v)) return 0xFE;
      if (v == 0.0f) return 0x00;
      const std::uint32_t b = f32_bits(v);
      std::uint32_t e = b >> 23;
      const std::uint32_t mant = b & 0x7FFFFFu;
      if (mant != 0 && e != 0xFE && !(e == 0 && mant <= 0x400000u)) e += 1;
      return static_cast<std::uint8_t>(e);
    }
    case ScaleRule::floor: {
      if (bamax == 0.0f) return 0x00;
      const int e = static_cast<int>((f32_bits(bamax) >> 23) & 0xFFu) - 127;
      return static_cast<std::uint8_t>(std::max(e - ef.emax, -127) + 127);
    }
    case ScaleRule::even: {
      const std::uint32_t b = (f32_bits(bamax) + (1u << (22 - ef.mbits))) & 0xFF800000u;
      const int e = static_cast<int>(b >> 23) - 127;
      return static_cast<std::uint8_t>(std::clamp(e - ef.emax, -127, 127) + 127);
    }
    case ScaleRule::nearest: {
      const float a = detail::round_to(bamax / ef.max, src);
      if (a == 0.0f) return 0x7F;
      const float l = detail::round_to(std::log2(a), src);
      // roundeven in the default rounding mode; clamped as a float so Inf converts safely.
      const float e = std::clamp(std::nearbyint(l) + 127.0f, 0.0f, 254.0f);
      return static_cast<std::uint8_t>(e);
    }
  }
  return 0xFF;
}

void mx_block(const float* x, const ElemFormat& ef, const QuantSpec& spec, DType src,
              std::uint8_t* row, std::int64_t first, std::uint8_t* scale) {
  constexpr int G = 32;
  if (spec.nonfinite != NonFinite::saturate && !all_finite(x, G)) {
    *scale = 0xFF;  // E8M0 NaN; element codes stay 0
    return;
  }
  const std::uint8_t e = e8m0_scale(block_amax(x, G), ef, spec.scale_rule, src);
  *scale = e;
  const float r = e8m0_reciprocal(e);
  for (int i = 0; i < G; ++i) {
    const std::uint8_t code = ef.encode(x[i] * r);
    if (spec.mode == Mode::mxfp4)
      put_nibble(row, first + i, code);
    else
      row[first + i] = code;
  }
}

// ---- affine (FORMATS.md 2.3, MLX's CPU algorithm) ----

// Writes `value` (bits wide) at element i of an LSB-first bit stream.
void put_bits(std::uint8_t* row, std::int64_t i, int bits, std::uint32_t value) {
  std::int64_t t = i * bits;
  for (int k = 0; k < bits; ++k, ++t)
    if ((value >> k) & 1u) row[t / 8] = static_cast<std::uint8_t>(row[t / 8] | (1u << (t % 8)));
}

void affine_group(const float* w, int gs, int bits, DType src, std::uint8_t* row, std::int64_t first,
                  std::byte* scale_out, std::byte* bias_out) {
  if (!all_finite(w, gs)) {  // 'saturate' has no affine form and acts as 'propagate'
    const float nan = std::numeric_limits<float>::quiet_NaN();
    detail::store_f32(nan, src, scale_out);
    detail::store_f32(nan, src, bias_out);
    return;
  }
  const float n = static_cast<float>((1 << bits) - 1);
  const float eps = 1e-7f;
  float wmax = w[0], wmin = w[0];
  for (int i = 1; i < gs; ++i) {
    wmax = std::max(wmax, w[i]);
    wmin = std::min(wmin, w[i]);
  }
  const bool neg = std::fabs(wmin) > std::fabs(wmax);
  float scale = std::fmax((wmax - wmin) / n, eps);
  if (!neg) scale = -scale;
  const float edge = neg ? wmin : wmax;
  const float q0 = std::nearbyint(edge / scale);
  float bias = 0.0f;
  if (q0 != 0.0f) {
    scale = edge / q0;
    bias = edge;
  }
  for (int i = 0; i < gs; ++i) {
    const float q = std::clamp(std::nearbyint((w[i] - bias) / scale), 0.0f, n);
    put_bits(row, first + i, bits, static_cast<std::uint32_t>(q));
  }
  detail::store_f32(scale, src, scale_out);
  detail::store_f32(bias, src, bias_out);
}

}  // namespace

float amax_finite(const float* x, std::int64_t n) {
  float m = 0.0f;
  for (std::int64_t i = 0; i < n; ++i)
    if (std::isfinite(x[i])) m = std::max(m, std::fabs(x[i]));
  return m;
}

void quantize(const float* x, std::int64_t rows, std::int64_t K, DType src, const QuantSpec& spec,
              std::uint8_t* packed, std::byte* scales, std::byte* biases) {
  const int g = spec.group_size;
  const std::int64_t groups = K / g;
  const std::int64_t row_bytes = K * spec.bits / 8;
  const Nvfp4Factors nv = nvfp4_factors(spec);
  const ElemFormat ef = elem_format(spec);
  const std::size_t scale_size = spec.mode == Mode::affine ? dtype_size(src) : 1;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * K;
    std::uint8_t* pr = packed + r * row_bytes;
    for (std::int64_t j = 0; j < groups; ++j) {
      const float* xb = xr + j * g;
      const std::int64_t first = j * g;
      std::byte* sp = scales + static_cast<std::size_t>(r * groups + j) * scale_size;
      switch (spec.mode) {
        case Mode::nvfp4:
          nvfp4_block(xb, nv, spec.nonfinite, pr, first, reinterpret_cast<std::uint8_t*>(sp));
          break;
        case Mode::mxfp4:
        case Mode::mxfp8:
          mx_block(xb, ef, spec, src, pr, first, reinterpret_cast<std::uint8_t*>(sp));
          break;
        case Mode::affine:
          affine_group(xb, g, spec.bits, src, pr, first, sp,
                       biases + static_cast<std::size_t>(r * groups + j) * scale_size);
          break;
      }
    }
  }
}

}  // namespace microscale::reference
