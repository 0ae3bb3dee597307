// Shared helpers of the CPU kernel tests: typed input buffers, data generators with the corner
// cases of FORMATS.md (ties, subnormals, extremes, non-finite values), the spec list, and a loop
// over every SIMD target the machine runs and over 1 and 2 threads.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../targets_under_test.hpp"

#include "core/convert.hpp"
#include "cpu/kernels.hpp"
#include "microscale/codecs.hpp"
#include "microscale/format.hpp"
#include "microscale/runtime.hpp"
#include "reference/reference.hpp"

namespace cputest {

using microscale::DType;
using microscale::Elem;
using microscale::Mode;
using microscale::NonFinite;
using microscale::QuantSpec;
using microscale::ScaleRule;

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kFltMax = std::numeric_limits<float>::max();

// Values stored in `dtype` (rounded from the f32 values given) and their exact f32 widening,
// which is what the reference kernels read.
struct Input {
  DType dtype = DType::float32;
  std::vector<std::byte> bytes;
  std::vector<float> f32;
};

inline Input make_input(const std::vector<float>& v, DType t) {
  Input in;
  in.dtype = t;
  const std::size_t es = microscale::dtype_size(t);
  in.bytes.resize(v.size() * es);
  in.f32.resize(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    microscale::detail::store_f32(v[i], t, in.bytes.data() + i * es);
    in.f32[i] = microscale::detail::load_f32(in.bytes.data() + i * es, t);
  }
  return in;
}

// Input whose elements are the given raw 16-bit patterns of t (f16 or bf16).
inline Input input_from_bits(const std::vector<std::uint16_t>& bits, DType t) {
  Input in;
  in.dtype = t;
  in.bytes.resize(bits.size() * 2);
  std::memcpy(in.bytes.data(), bits.data(), in.bytes.size());
  in.f32.resize(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) in.f32[i] = microscale::detail::load_f32(in.bytes.data() + 2 * i, t);
  return in;
}

// The input with every signaling NaN made quiet. reference::quantize's 'saturate' block amax is
// a chain of glibc fmaxf calls, which return NaN for a signaling NaN operand (IEEE 754-2008), so
// an sNaN resets the running max there instead of being skipped as FORMATS.md 2.4 says; the
// kernels skip every NaN.
inline Input quiet_nans(Input in) {
  const std::size_t es = microscale::dtype_size(in.dtype);
  const std::uint32_t quiet = in.dtype == DType::float32 ? 0x00400000u : in.dtype == DType::bfloat16 ? 0x40u : 0x200u;
  for (std::size_t i = 0; i < in.f32.size(); ++i) {
    if (!std::isnan(in.f32[i])) continue;
    std::uint32_t u = 0;
    std::memcpy(&u, in.bytes.data() + i * es, es);
    u |= quiet;
    std::memcpy(in.bytes.data() + i * es, &u, es);
    in.f32[i] = microscale::detail::load_f32(in.bytes.data() + i * es, in.dtype);
  }
  return in;
}

// Binade range of a dtype: smallest subnormal exponent and largest finite exponent.
inline int min_exp(DType t) { return t == DType::float16 ? -24 : t == DType::bfloat16 ? -133 : -149; }
inline int max_exp(DType t) { return t == DType::float16 ? 15 : 127; }

// Random data, block by block (G values), each block one of the corner-case kinds; with
// `nonfinite`, NaN and +-Inf are sprinkled in.
inline std::vector<float> corner_data(std::size_t n, int G, DType t, bool nonfinite, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  auto uint = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto sign = [&] { return uint(0, 1) ? -1.0f : 1.0f; };
  const int emin = min_exp(t), emax = max_exp(t);
  // Midpoints of the E2M1 grid and of two E4M3 binades: exact ties once scaled by a power of two.
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 1.0625f, 1.1875f, 1.9375f, 0.5625f};
  std::vector<float> x(n);
  for (std::size_t b = 0; b < n; b += static_cast<std::size_t>(G)) {
    const int kind = uint(0, 8);
    const int k = uint(std::max(emin + 24, -60), std::min(emax - 4, 60));  // block binade
    for (std::size_t i = b; i < std::min(n, b + static_cast<std::size_t>(G)); ++i) {
      float v = 0.0f;
      switch (kind) {
        case 0: v = std::ldexp(normal(rng), k); break;                                               // plain
        case 1: v = std::ldexp(normal(rng) * std::exp(3.0f * normal(rng)), k); break;                // heavy tail
        case 2: v = uint(0, 3) ? 0.0f * sign() : std::ldexp(normal(rng), k); break;                  // mostly zeros
        case 3: v = std::ldexp(sign() * unit(rng), uint(emin, emin + 20)); break;                    // subnormal-ish
        case 4: v = sign() * std::ldexp(1.0f + unit(rng), emax) * 0.99f; break;                      // near max
        case 5: v = i == b ? std::ldexp(sign() * 3.0f, k + 20) : std::ldexp(normal(rng), k); break;  // outlier
        case 6:  // ties: max 6 * 2^k pins an mx/two-level scale, the rest sit on midpoints
          v = i == b ? std::ldexp(6.0f, k) : sign() * std::ldexp(ties[uint(0, 10)], k + uint(-2, 0));
          break;
        case 7: {  // any bit pattern of the dtype
          std::uint32_t u = static_cast<std::uint32_t>(rng());
          if (t != DType::float32) u <<= 16;
          v = microscale::f32_from_bits(u);
          if (!std::isfinite(v)) v = std::ldexp(normal(rng), k);
          break;
        }
        default: v = 0.0f; break;  // all-zero block
      }
      if (nonfinite && uint(0, 200) == 0) v = uint(0, 2) == 0 ? kNaN : sign() * kInf;
      x[i] = v;
    }
  }
  return x;
}

// Every spec of the fp modes and of affine whose group divides K, with its label.
struct NamedSpec {
  std::string name;
  QuantSpec spec;
};

inline std::vector<NamedSpec> fp_specs(std::int64_t K, NonFinite policy, const std::vector<float>& global_scales) {
  std::vector<NamedSpec> out;
  auto add = [&](std::string name, QuantSpec s) {
    s.nonfinite = policy;
    s = microscale::resolve(s);
    if (K % s.group_size == 0) out.push_back({name + "/" + microscale::name(policy), s});
  };
  QuantSpec s;
  s.mode = Mode::nvfp4;
  add("nvfp4-2level", s);
  for (const float g : global_scales) {
    s.global_scale = g;
    add("nvfp4-3level(" + std::to_string(g) + ")", s);
  }
  for (const ScaleRule r : {ScaleRule::ceil, ScaleRule::floor, ScaleRule::even, ScaleRule::nearest}) {
    QuantSpec m;
    m.scale_rule = r;
    m.mode = Mode::mxfp4;
    add(std::string("mxfp4-") + microscale::name(r), m);
    m.mode = Mode::mxfp8;
    add(std::string("mxfp8-e4m3-") + microscale::name(r), m);
    m.elem = Elem::e5m2;
    add(std::string("mxfp8-e5m2-") + microscale::name(r), m);
  }
  return out;
}

inline std::vector<NamedSpec> affine_specs(std::int64_t K, NonFinite policy) {
  std::vector<NamedSpec> out;
  for (const int gs : {32, 64, 128})
    for (const int bits : {2, 3, 4, 5, 6, 8}) {
      if (K % gs != 0) continue;
      QuantSpec s;
      s.mode = Mode::affine;
      s.group_size = gs;
      s.bits = bits;
      s.nonfinite = policy;
      out.push_back({"affine-g" + std::to_string(gs) + "-b" + std::to_string(bits), microscale::resolve(s)});
    }
  return out;
}

// Global scales worth testing for data x: its finite amax (TE's use), a third of it (clipping),
// 0 (S_enc = 1), a tiny one (S_enc clamps to FLT_MAX) and FLT_MAX.
inline std::vector<float> global_scales_for(const std::vector<float>& x) {
  const float a = microscale::reference::amax_finite(x.data(), static_cast<std::int64_t>(x.size()));
  return {a, a / 3.0f, 0.0f, 1e-37f, kFltMax};
}

// Runs f on every target this machine runs (and MICROSCALE_TEST_TARGETS names, when set), with
// 1 and 2 threads; restores the defaults.
inline void for_each_target(const std::function<void(const std::string&)>& f) {
  for (const std::string& target : microscale::available_cpu_targets()) {
    if (!microscale_tests::under_test(target)) continue;
    microscale::set_cpu_target(target);
    for (const int threads : {1, 2}) {
      microscale::set_num_threads(threads);
      f(target + "/" + std::to_string(threads) + "t");
    }
  }
  microscale::set_cpu_target("auto");
  microscale::set_num_threads(0);
}

// Index of the first differing byte, or -1.
inline std::int64_t first_diff(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (a[i] != b[i]) return static_cast<std::int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<std::int64_t>(std::min(a.size(), b.size()));
}

}  // namespace cputest
