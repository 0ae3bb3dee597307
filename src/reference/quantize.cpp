#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/convert.hpp"
#include "core/numerics.hpp"
#include "core/recipe.hpp"
#include "reference/reference.hpp"

namespace microscale::reference {
namespace {

bool all_finite(const float* x, int n) {
  for (int i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

// Block amax. Only 'saturate' sees non-finite blocks.
float block_amax(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = numerics::amax_step(m, x[i]);
  return m;
}

// i is an element index within the row: 64-bit, since rows may hold more than 2^31 values.
void put_nibble(std::uint8_t* row, std::int64_t i, std::uint8_t code) {
  row[i / 2] = static_cast<std::uint8_t>(row[i / 2] | (code << ((i & 1) * 4)));
}

// E2M1 code of a scaled element: round to nearest, or stochastically with the random byte of its
// flat index.
std::uint8_t e2m1_code(float v, const QuantSpec& spec, std::int64_t index) {
  if (!spec.sr_seed) return numerics::encode_e2m1(v);
  return numerics::encode_e2m1_stochastic(v,
                                          numerics::stochastic_byte(*spec.sr_seed, static_cast<std::uint64_t>(index)));
}

// ---- nvfp4 (FORMATS.md 2.1) ----

// `index`: flat index of x[0] in the whole tensor.
void nvfp4_block(const float* x, const numerics::Nvfp4Search& t, const QuantSpec& spec, std::uint8_t* row,
                 std::int64_t first, std::uint8_t* scale, std::int64_t index) {
  constexpr int G = numerics::kNvfp4Group;
  if (spec.nonfinite != NonFinite::saturate && !all_finite(x, G)) {
    *scale = numerics::E4M3::NAN_CODE;  // element codes stay 0
    return;
  }
  const numerics::BlockScale s = numerics::nvfp4_searched_block_scale(x, block_amax(x, G), t, spec.scale_search);
  *scale = s.code;
  for (int i = 0; i < G; ++i) put_nibble(row, first + i, e2m1_code(x[i] * s.enc, spec, index + i));
}

// scale_2d: one scale per tile of 16 rows x 16 columns (fewer rows at the bottom), from the tile's
// amax by the block rule, written to each of its rows' compact scales. A non-finite tile (outside
// 'saturate') gets the NaN scale in every row and element codes 0.
void nvfp4_2d(const float* x, std::int64_t rows, std::int64_t K, const QuantSpec& spec, std::uint8_t* packed,
              std::uint8_t* scales, std::int64_t index0) {
  constexpr int G = numerics::kNvfp4Group;
  const std::int64_t groups = K / G;
  const std::int64_t row_bytes = K / 2;
  const numerics::Nvfp4Tensor t =
      numerics::nvfp4_tensor(spec.global_scale.has_value(), spec.global_scale.value_or(0.0f));
  for (std::int64_t r0 = 0; r0 < rows; r0 += G) {
    const std::int64_t r1 = std::min(r0 + G, rows);
    for (std::int64_t j = 0; j < groups; ++j) {
      float amax = 0.0f;
      bool finite = true;
      for (std::int64_t r = r0; r < r1; ++r) {
        finite = finite && all_finite(x + r * K + j * G, G);
        amax = std::max(amax, block_amax(x + r * K + j * G, G));  // NaN skipped, Inf kept, as per block
      }
      const bool nan_tile = !finite && spec.nonfinite != NonFinite::saturate;
      const numerics::BlockScale s = numerics::nvfp4_block_scale(amax, t);
      for (std::int64_t r = r0; r < r1; ++r) {
        scales[r * groups + j] = nan_tile ? static_cast<std::uint8_t>(numerics::E4M3::NAN_CODE) : s.code;
        if (nan_tile) continue;  // element codes stay 0
        const float* xb = x + r * K + j * G;
        for (int i = 0; i < G; ++i)
          put_nibble(packed + r * row_bytes, j * G + i, e2m1_code(xb[i] * s.enc, spec, index0 + r * K + j * G + i));
      }
    }
  }
}

// ---- mxfp4 / mxfp8 (FORMATS.md 2.2) ----

void mx_block(const float* x, const numerics::MxElem& ef, const QuantSpec& spec, DType src, std::uint8_t* row,
              std::int64_t first, std::uint8_t* scale, std::int64_t index) {
  constexpr int G = numerics::kMxGroup;
  if (spec.nonfinite != NonFinite::saturate && !all_finite(x, G)) {
    *scale = numerics::kE8M0NaN;  // element codes stay 0
    return;
  }
  const numerics::BlockScale s = numerics::mx_searched_block_scale(
      x, block_amax(x, G), ef, spec.scale_rule, src, spec.mode == Mode::mxfp4 ? spec.scale_search : ScaleSearch::none);
  *scale = s.code;
  for (int i = 0; i < G; ++i) {
    if (spec.mode == Mode::mxfp4)
      put_nibble(row, first + i, e2m1_code(x[i] * s.enc, spec, index + i));
    else
      row[first + i] = numerics::encode_fp8(spec.elem, x[i] * s.enc);
  }
}

// ---- affine (FORMATS.md 2.3) ----

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
  float wmax = w[0], wmin = w[0];
  for (int i = 1; i < gs; ++i) {
    wmax = std::max(wmax, w[i]);
    wmin = std::min(wmin, w[i]);
  }
  const numerics::AffineScaleBias p = numerics::affine_scale_bias(wmin, wmax, bits);
  const float max_code = numerics::affine_max_code(bits);
  for (int i = 0; i < gs; ++i) put_bits(row, first + i, bits, numerics::affine_code(w[i], p, max_code));
  detail::store_f32(p.scale, src, scale_out);
  detail::store_f32(p.bias, src, bias_out);
}

}  // namespace

float amax_finite(const float* x, std::int64_t n) {
  float m = 0.0f;
  for (std::int64_t i = 0; i < n; ++i)
    if (std::isfinite(x[i])) m = std::max(m, std::fabs(x[i]));
  return m;
}

void quantize(const float* x, std::int64_t rows, std::int64_t K, DType src, const QuantSpec& spec, std::uint8_t* packed,
              std::byte* scales, std::byte* biases, std::int64_t index0) {
  if (spec.scale_2d) return nvfp4_2d(x, rows, K, spec, packed, reinterpret_cast<std::uint8_t*>(scales), index0);
  const int g = spec.group_size;
  const std::int64_t groups = K / g;
  const std::int64_t row_bytes = K * spec.bits / 8;
  const numerics::Nvfp4Search nv =
      numerics::nvfp4_search_tensor(spec.global_scale.has_value(), spec.global_scale.value_or(0.0f), spec.scale_search);
  const numerics::MxElem ef = numerics::mx_elem(spec.mode, spec.elem);
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
          nvfp4_block(xb, nv, spec, pr, first, reinterpret_cast<std::uint8_t*>(sp), index0 + r * K + first);
          break;
        case Mode::mxfp4:
        case Mode::mxfp8:
          mx_block(xb, ef, spec, src, pr, first, reinterpret_cast<std::uint8_t*>(sp), index0 + r * K + first);
          break;
        case Mode::affine:
          affine_group(xb, g, spec.bits, src, pr, first, sp,
                       biases + static_cast<std::size_t>(r * groups + j) * scale_size);
          break;
      }
    }
  }
}

bool nvfp4_global_errors(const float* x, std::int64_t blocks, const float* globals, int n, double* totals,
                         std::uint8_t* scales) {
  constexpr int G = numerics::kNvfp4Group;
  for (std::int64_t b = 0; b < blocks; ++b)
    if (!all_finite(x + b * G, G)) return false;
  std::vector<numerics::Nvfp4Search> searches;
  for (int c = 0; c < n; ++c) searches.push_back(numerics::nvfp4_search_tensor(true, globals[c], ScaleSearch::mse));
  std::fill(totals, totals + n, 0.0);
  for (std::int64_t b = 0; b < blocks; ++b) {
    const float bamax = block_amax(x + b * G, G);
    for (int c = 0; c < n; ++c) {
      const numerics::Nvfp4Search& p = searches[static_cast<std::size_t>(c)];
      const numerics::BlockScale s = numerics::nvfp4_searched_block_scale(x + b * G, bamax, p, ScaleSearch::mse);
      totals[c] +=
          numerics::fp4_block_sq_error(x + b * G, G, s.enc, numerics::nvfp4_decode_factor(s.code, true, p.decode_amax));
      if (scales) scales[c * blocks + b] = s.code;
    }
  }
  return true;
}

void nvfp4_encode(const float* x, std::int64_t blocks, float global_scale, const std::uint8_t* scales,
                  std::uint8_t* packed) {
  constexpr int G = numerics::kNvfp4Group;
  const numerics::Nvfp4Tensor t = numerics::nvfp4_tensor(true, global_scale);
  std::fill(packed, packed + blocks * G / 2, std::uint8_t{0});  // codes are ORed in
  for (std::int64_t b = 0; b < blocks; ++b) {
    const float enc = numerics::nvfp4_scale_of_code(scales[b], t).enc;
    for (int i = 0; i < G; ++i) put_nibble(packed, b * G + i, numerics::encode_e2m1(x[b * G + i] * enc));
  }
}

}  // namespace microscale::reference
