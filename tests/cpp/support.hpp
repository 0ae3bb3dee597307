// Test support: tensor helpers and an independent oracle of FORMATS.md sections 1-3.
//
// The oracle is written from the spec's formulas, not from the library: code values come from the
// closed-form definitions of section 1 and rounding to a grid is an exhaustive nearest search
// (ties to the even code), so a library bug and an oracle bug would have to coincide to hide.
#pragma once

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../targets_under_test.hpp"
#include "microscale/microscale.hpp"
#include "microscale/runtime.hpp"

namespace mst {

using microscale::DType;
using microscale::Shape;
using microscale::Tensor;
using microscale::TensorView;

inline float bits_f(std::uint32_t u) { return std::bit_cast<float>(u); }
inline std::uint32_t f_bits(float f) { return std::bit_cast<std::uint32_t>(f); }

inline const float kC6 = bits_f(0x3E2AAAABu);
inline const float kC448 = bits_f(0x3B124925u);
inline const float kC57344 = bits_f(0x37924925u);
inline const float kC2688 = bits_f(0x39C30C31u);
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// Half-precision rounding done independently of the library: f16 through the compiler's half
// type (x86: _Float16, libgcc's conversion; aarch64: __fp16, the hardware's IEEE conversion), bf16
// by integer round-to-nearest-even on the f32 bits.
#if defined(__aarch64__)
using CompilerHalf = __fp16;
#else
using CompilerHalf = _Float16;
#endif
inline std::uint16_t oracle_f16(float v) {
  CompilerHalf h = static_cast<CompilerHalf>(v);
  std::uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
inline float oracle_f16_value(std::uint16_t b) {
  CompilerHalf h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}
inline std::uint16_t oracle_bf16(float v) {
  std::uint32_t u = f_bits(v);
  if (std::isnan(v)) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  std::uint32_t hi = u >> 16, lo = u & 0xFFFF;
  if (lo > 0x8000 || (lo == 0x8000 && (hi & 1))) ++hi;
  return static_cast<std::uint16_t>(hi);
}
inline float oracle_bf16_value(std::uint16_t b) { return bits_f(std::uint32_t{b} << 16); }

// Rounds an f32 value to `t` and back (identity for float32).
inline float round_to(DType t, float v) {
  if (t == DType::bfloat16) return oracle_bf16_value(oracle_bf16(v));
  if (t == DType::float16) return oracle_f16_value(oracle_f16(v));
  return v;
}

// ---------------------------------------------------------------------------------------------
// Code values by the formulas of FORMATS.md section 1 (double is exact for all of them).
inline double e2m1_value(std::uint8_t c) {
  static const double t[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  double v = t[c & 7];
  return (c & 8) ? -v : v;
}
inline double e4m3_value(std::uint8_t c) {
  int e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  double mag = e == 0 ? m * std::ldexp(1.0, -9) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (c & 0x80) ? -mag : mag;
}
inline double e5m2_value(std::uint8_t c) {
  int e = (c >> 2) & 31, m = c & 3;
  double mag;
  if (e == 31)
    mag = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  else
    mag = e == 0 ? m * std::ldexp(1.0, -16) : (1 + m / 4.0) * std::ldexp(1.0, e - 15);
  return (c & 0x80) ? -mag : mag;
}
inline double e8m0_value(std::uint8_t e) {
  return e == 0xFF ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(1.0, e - 127);
}

enum class Fmt { e2m1, e4m3, e5m2 };

struct Grid {
  std::uint8_t max_code;
  std::uint8_t sign_bit;
  double (*value)(std::uint8_t);
};
inline Grid grid(Fmt f) {
  switch (f) {
    case Fmt::e2m1: return {0x7, 0x8, e2m1_value};
    case Fmt::e4m3: return {0x7E, 0x80, e4m3_value};
    case Fmt::e5m2: return {0x7B, 0x80, e5m2_value};
  }
  return {};
}
inline double max_value(Fmt f) {
  Grid g = grid(f);
  return g.value(g.max_code);
}

// rn_sat of section 0 for a finite or infinite v: nearest code, ties to the even code, overflow
// and +-Inf to +-max, sign copied (so -0.0 and tiny negatives give the negative zero code).
// NaN is the caller's business.
inline std::uint8_t rn_sat(Fmt f, float v) {
  Grid g = grid(f);
  double a = std::fabs(static_cast<double>(v));
  std::uint8_t s = std::signbit(v) ? g.sign_bit : 0;
  if (a >= g.value(g.max_code)) return s | g.max_code;
  // Codes 0..max_code are increasing in value: binary search for val(lo) <= a < val(lo + 1).
  int lo = 0, hi = g.max_code;
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (g.value(static_cast<std::uint8_t>(mid)) <= a)
      lo = mid;
    else
      hi = mid;
  }
  double twice = 2 * a, sum = g.value(static_cast<std::uint8_t>(lo)) + g.value(static_cast<std::uint8_t>(hi));
  int c = twice < sum ? lo : twice > sum ? hi : ((lo & 1) == 0 ? lo : hi);
  return static_cast<std::uint8_t>(s | c);
}
inline float code_value(Fmt f, std::uint8_t c) { return static_cast<float>(grid(f).value(c)); }

// ---------------------------------------------------------------------------------------------
// Block oracles. Inputs are f32 values (already widened from the input dtype), row-major
// [rows, K]; outputs are the codes per element (not packed) and the scale bytes, compact.
struct RefFp {
  std::vector<std::uint8_t> codes;   // [rows*K]
  std::vector<std::uint8_t> scales;  // [rows*K/group]
};

// nvfp4, FORMATS.md 2.1; finite inputs.
inline RefFp ref_nvfp4(const std::vector<float>& x, std::optional<float> amax) {
  float s_enc = 1.0f, s_dec = 1.0f;
  if (amax) {
    s_enc = 2688.0f / *amax;
    s_enc = std::fmin(s_enc, FLT_MAX);
    if (*amax == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
    s_dec = 1.0f / s_enc;
  }
  const float s_enc_c6 = s_enc * kC6;
  RefFp r;
  r.codes.resize(x.size());
  for (std::size_t b0 = 0; b0 < x.size(); b0 += 16) {
    float bamax = 0.0f;
    for (int i = 0; i < 16; ++i) bamax = std::max(bamax, std::fabs(x[b0 + i]));
    float t = bamax * s_enc_c6;
    std::uint8_t s = rn_sat(Fmt::e4m3, std::fmin(t, FLT_MAX));
    float sf = code_value(Fmt::e4m3, s);
    float denom = sf * s_dec;
    float enc = std::fmin(1.0f / denom, FLT_MAX);
    for (int i = 0; i < 16; ++i) r.codes[b0 + i] = rn_sat(Fmt::e2m1, x[b0 + i] * enc);
    r.scales.push_back(s);
  }
  return r;
}
// Dequantized f32 value of one nvfp4 element.
inline float ref_nvfp4_value(std::uint8_t code, std::uint8_t scale, std::optional<float> amax) {
  float sf = code_value(Fmt::e4m3, scale);
  float q = code_value(Fmt::e2m1, code);
  if (!amax) return q * sf;
  float factor = (sf * *amax) * kC2688;
  return q * factor;
}

inline float e8m0_f32(std::uint8_t e) {  // section 1, by bits
  if (e == 0xFF) return kNaN;
  return e == 0 ? bits_f(0x00400000u) : bits_f(std::uint32_t{e} << 23);
}
inline float e8m0_recip_f32(std::uint8_t e) {
  return e == 254 ? bits_f(0x00400000u) : bits_f(std::uint32_t(254 - e) << 23);
}

// E8M0 scale of a block, FORMATS.md 2.2. `t` is the input dtype (only 'nearest' looks at it).
inline std::uint8_t ref_e8m0_scale(float bamax, microscale::ScaleRule rule, Fmt f, DType t) {
  const double max_elem = max_value(f);
  const int emax = f == Fmt::e2m1 ? 2 : f == Fmt::e4m3 ? 8 : 15;
  const int m = f == Fmt::e2m1 ? 1 : f == Fmt::e4m3 ? 3 : 2;
  switch (rule) {
    case microscale::ScaleRule::ceil: {
      float c = f == Fmt::e2m1 ? kC6 : f == Fmt::e4m3 ? kC448 : kC57344;
      float v = bamax * c;
      if (std::isnan(v)) return 0xFF;
      if (v == kInf) return 0xFE;
      if (v == 0.0f) return 0x00;
      std::uint32_t b = f_bits(v), e = b >> 23, mant = b & 0x7FFFFF;
      if (mant != 0 && e != 0xFE && !(e == 0 && mant <= 0x400000)) e = e + 1;
      return static_cast<std::uint8_t>(e);
    }
    case microscale::ScaleRule::floor: {
      if (bamax == 0.0f) return 0x00;
      int e = static_cast<int>((f_bits(bamax) >> 23) & 0xFF) - 127;
      return static_cast<std::uint8_t>(std::max(e - emax, -127) + 127);
    }
    case microscale::ScaleRule::even: {
      std::uint32_t b = (f_bits(bamax) + (1u << (22 - m))) & 0xFF800000u;
      int e = static_cast<int>(b >> 23) - 127;
      return static_cast<std::uint8_t>(std::clamp(e - emax, -127, 127) + 127);
    }
    case microscale::ScaleRule::nearest: {
      float a = round_to(t, bamax / static_cast<float>(max_elem));
      if (a == 0.0f) return 0x7F;
      float l = round_to(t, std::log2(a));
      int r = static_cast<int>(std::nearbyint(l));  // default rounding mode: ties to even
      return static_cast<std::uint8_t>(std::clamp(r + 127, 0, 254));
    }
  }
  return 0;
}

// mxfp4 / mxfp8, FORMATS.md 2.2; finite inputs.
inline RefFp ref_mx(const std::vector<float>& x, Fmt f, microscale::ScaleRule rule, DType t) {
  RefFp r;
  r.codes.resize(x.size());
  for (std::size_t b0 = 0; b0 < x.size(); b0 += 32) {
    float bamax = 0.0f;
    for (int i = 0; i < 32; ++i) bamax = std::max(bamax, std::fabs(x[b0 + i]));
    std::uint8_t e = ref_e8m0_scale(bamax, rule, f, t);
    float recip = e8m0_recip_f32(e);
    for (int i = 0; i < 32; ++i) r.codes[b0 + i] = rn_sat(f, x[b0 + i] * recip);
    r.scales.push_back(e);
  }
  return r;
}
inline float ref_mx_value(Fmt f, std::uint8_t code, std::uint8_t e) { return code_value(f, code) * e8m0_f32(e); }

// affine, FORMATS.md 2.3; finite inputs. Scales and biases are returned as f32 values already
// rounded to the input dtype `t`.
struct RefAffine {
  std::vector<std::uint8_t> codes;
  std::vector<float> scales, biases;
};
inline RefAffine ref_affine(const std::vector<float>& x, int group, int bits, DType t) {
  const float n = static_cast<float>((1 << bits) - 1);
  const float eps = bits_f(0x33D6BF95u);
  RefAffine r;
  r.codes.resize(x.size());
  for (std::size_t g0 = 0; g0 < x.size(); g0 += static_cast<std::size_t>(group)) {
    float wmax = x[g0], wmin = x[g0];
    for (int i = 1; i < group; ++i) {
      wmax = std::max(wmax, x[g0 + i]);
      wmin = std::min(wmin, x[g0 + i]);
    }
    bool neg = std::fabs(wmin) > std::fabs(wmax);
    float scale = std::fmax((wmax - wmin) / n, eps);
    if (!neg) scale = -scale;
    float edge = neg ? wmin : wmax;
    float q0 = std::nearbyint(edge / scale);
    float bias;
    if (q0 != 0.0f) {
      scale = edge / q0;
      bias = edge;
    } else {
      bias = 0.0f;
    }
    for (int i = 0; i < group; ++i) {
      float q = std::nearbyint((x[g0 + i] - bias) / scale);
      r.codes[g0 + i] = static_cast<std::uint8_t>(std::clamp(q, 0.0f, n));
    }
    r.scales.push_back(round_to(t, scale));
    r.biases.push_back(round_to(t, bias));
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// Packing (FORMATS.md 3).
inline std::vector<std::uint8_t> pack_fp4(const std::vector<std::uint8_t>& codes) {
  std::vector<std::uint8_t> out(codes.size() / 2);
  for (std::size_t j = 0; j < out.size(); ++j)
    out[j] = static_cast<std::uint8_t>((codes[2 * j] & 0xF) | ((codes[2 * j + 1] & 0xF) << 4));
  return out;
}
// One LSB-first bit stream per row of `k` codes.
inline std::vector<std::uint8_t> pack_bits(const std::vector<std::uint8_t>& codes, std::int64_t k, int bits) {
  const std::int64_t rows = static_cast<std::int64_t>(codes.size()) / k;
  const std::int64_t row_bytes = k * bits / 8;
  std::vector<std::uint8_t> out(static_cast<std::size_t>(rows * row_bytes), 0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < k; ++i)
      for (int j = 0; j < bits; ++j) {
        std::int64_t t = i * bits + j;
        if ((codes[r * k + i] >> j) & 1) out[r * row_bytes + t / 8] |= static_cast<std::uint8_t>(1u << (t % 8));
      }
  return out;
}
// Reads `bits`-bit code i of one row's bit stream.
inline std::uint8_t unpack_bits(const std::uint8_t* row, std::int64_t i, int bits) {
  std::uint32_t c = 0;
  for (int j = 0; j < bits; ++j) {
    std::int64_t t = i * bits + j;
    c |= ((row[t / 8] >> (t % 8)) & 1u) << j;
  }
  return static_cast<std::uint8_t>(c);
}

// ---------------------------------------------------------------------------------------------
// Tensor helpers.
inline TensorView view(const std::vector<float>& v, Shape shape) {
  return TensorView(v.data(), DType::float32, std::move(shape));
}
inline TensorView view(const std::vector<std::uint16_t>& v, DType t, Shape shape) {
  return TensorView(v.data(), t, std::move(shape));
}
inline std::vector<std::uint8_t> bytes(const Tensor& t) {
  if (t.bytes() == nullptr) return {};  // a default-constructed Tensor has no buffer
  const auto* p = reinterpret_cast<const std::uint8_t*>(t.bytes());
  return std::vector<std::uint8_t>(p, p + t.nbytes());
}
// Values of a float tensor of any float dtype, widened to f32.
inline std::vector<float> values(const Tensor& t) {
  if (t.bytes() == nullptr) return {};
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    switch (t.dtype()) {
      case DType::float32: out[i] = t.data<float>()[i]; break;
      case DType::float16: out[i] = oracle_f16_value(t.data<std::uint16_t>()[i]); break;
      case DType::bfloat16: out[i] = oracle_bf16_value(t.data<std::uint16_t>()[i]); break;
      default: out[i] = kNaN;
    }
  }
  return out;
}
inline std::vector<std::uint16_t> to_half(const std::vector<float>& v, DType t) {
  std::vector<std::uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = t == DType::float16 ? oracle_f16(v[i]) : oracle_bf16(v[i]);
  return out;
}
inline std::vector<float> widen(const std::vector<std::uint16_t>& v, DType t) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    out[i] = t == DType::float16 ? oracle_f16_value(v[i]) : oracle_bf16_value(v[i]);
  return out;
}
// Little-endian uint32 words over a byte buffer (MLX's w_q view).
inline std::vector<std::uint32_t> le_words(const std::vector<std::uint8_t>& b) {
  std::vector<std::uint32_t> w(b.size() / 4);
  for (std::size_t i = 0; i < w.size(); ++i)
    w[i] = std::uint32_t{b[4 * i]} | std::uint32_t{b[4 * i + 1]} << 8 | std::uint32_t{b[4 * i + 2]} << 16 |
           std::uint32_t{b[4 * i + 3]} << 24;
  return w;
}
// Bitwise equality of floats (NaN == NaN, +0 != -0).
inline bool same_bits(float a, float b) { return f_bits(a) == f_bits(b) || (std::isnan(a) && std::isnan(b)); }

// ---------------------------------------------------------------------------------------------
// Deterministic test data.
enum class Dist { gaussian, student_t3, tie_rich, wide_range };
inline std::vector<float> make_data(std::size_t n, Dist d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::student_t_distribution<float> st(3.0f);
  std::uniform_int_distribution<int> small(-64, 64), expo(-20, 20), pick(0, 7);
  for (auto& x : v) {
    switch (d) {
      case Dist::gaussian: x = normal(rng); break;
      case Dist::student_t3: x = st(rng); break;
      case Dist::tie_rich:
        // Short significands (bf16-like) at nearby binades: lands on E2M1/E4M3 ties and grid points.
        x = std::ldexp(static_cast<float>(small(rng)), expo(rng) / 4 - 3);
        break;
      case Dist::wide_range:
        x = normal(rng) * std::ldexp(1.0f, expo(rng) * 3);
        if (pick(rng) == 0) x = 0.0f;
        break;
    }
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// Backends. Every configuration the library can run here: the scalar reference backend, and the
// CPU backend forced to each SIMD target this build and machine support (plus one odd thread
// count, so work splitting is exercised), less any MICROSCALE_TEST_TARGETS leaves out. The list
// is taken once, before any forcing.
struct BackendConfig {
  std::string label;
  microscale::Backend backend;
  std::string target;  // cpu only
  int threads;         // 0: default
};
inline const std::vector<BackendConfig>& backend_configs() {
  static const std::vector<BackendConfig> configs = [] {
    std::vector<BackendConfig> c;
    if (microscale_tests::under_test("reference")) c.push_back({"reference", microscale::Backend::reference, "", 0});
    std::vector<std::string> targets;
    for (const std::string& t : microscale::available_cpu_targets())
      if (microscale_tests::under_test(t)) targets.push_back(t);
    for (const std::string& t : targets) c.push_back({"cpu:" + t, microscale::Backend::cpu, t, 0});
    if (!targets.empty())
      c.push_back({"cpu:" + targets.front() + " threads=3", microscale::Backend::cpu, targets.front(), 3});
    return c;
  }();
  return configs;
}
// Applies a configuration for the lifetime of the guard, then restores cpu/auto/default threads
// or the reference backend, whichever was active.
class UseBackend {
 public:
  explicit UseBackend(const BackendConfig& c) : saved_(microscale::backend()) {
    microscale::set_backend(c.backend);
    if (c.backend == microscale::Backend::cpu) microscale::set_cpu_target(c.target);
    microscale::set_num_threads(c.threads);
  }
  ~UseBackend() {
    microscale::set_cpu_target("auto");
    microscale::set_num_threads(0);
    microscale::set_backend(saved_);
  }
  UseBackend(const UseBackend&) = delete;
  UseBackend& operator=(const UseBackend&) = delete;

 private:
  microscale::Backend saved_;
};

// Runs body once per backend configuration, with the configuration in every failure message.
template <class F>
void for_each_backend(F&& body) {
  for (const BackendConfig& b : backend_configs()) {
    UseBackend use(b);
    SCOPED_TRACE("backend " + b.label);
    body();
  }
}

}  // namespace mst
