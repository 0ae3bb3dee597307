// The quantization cases shared by the host-side test (which runs the kernels' __host__ __device__
// code on the CPU) and the GPU tests: every mode, scale rule, non-finite policy, layout and input
// dtype, over shapes with odd row counts and ranks, on data full of special values.
#pragma once

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "microscale/microscale.hpp"
#include "microscale/runtime.hpp"

namespace mscuda {

using microscale::DType;
using microscale::Elem;
using microscale::Layout;
using microscale::Mode;
using microscale::NonFinite;
using microscale::QuantSpec;
using microscale::ScaleRule;
using microscale::Shape;
using microscale::Tensor;

// Where an nvfp4 case takes its global scale from.
enum class Global { none, data, half, zero, tiny };

struct Case {
  std::string name;
  QuantSpec spec;  // global_scale filled per input by spec_for
  Global global = Global::none;
  bool big = false;  // also run on the 129 x 4096 shape
};

inline std::vector<Case> cases() {
  std::vector<Case> out;
  const NonFinite policies[] = {NonFinite::propagate, NonFinite::saturate};
  const Layout layouts[] = {Layout::compact, Layout::swizzled};
  const ScaleRule rules[] = {ScaleRule::ceil, ScaleRule::floor, ScaleRule::even, ScaleRule::nearest};
  for (Global g : {Global::none, Global::data, Global::half, Global::zero, Global::tiny})
    for (NonFinite nf : policies)
      for (Layout l : layouts) {
        QuantSpec s;
        s.mode = Mode::nvfp4;
        s.nonfinite = nf;
        s.layout = l;
        out.push_back({"nvfp4 global" + std::to_string(static_cast<int>(g)) + " " + microscale::name(nf) + " " +
                           microscale::name(l),
                       s, g, g == Global::data && nf == NonFinite::propagate && l == Layout::compact});
      }
  for (Mode m : {Mode::mxfp4, Mode::mxfp8})
    for (Elem e : {Elem::e4m3, Elem::e5m2}) {
      if (m == Mode::mxfp4 && e == Elem::e5m2) continue;
      for (ScaleRule r : rules)
        for (NonFinite nf : policies)
          for (Layout l : layouts) {
            QuantSpec s;
            s.mode = m;
            s.elem = e;
            s.scale_rule = r;
            s.nonfinite = nf;
            s.layout = l;
            out.push_back({std::string(microscale::name(m)) + " " + microscale::name(e) + " " + microscale::name(r) +
                               " " + microscale::name(nf) + " " + microscale::name(l),
                           s, Global::none,
                           r == ScaleRule::ceil && nf == NonFinite::propagate && l == Layout::compact});
          }
    }
  for (int gs : {32, 64, 128})
    for (int bits : {2, 3, 4, 5, 6, 8}) {
      QuantSpec s;
      s.mode = Mode::affine;
      s.group_size = gs;
      s.bits = bits;
      out.push_back(
          {"affine g" + std::to_string(gs) + " b" + std::to_string(bits), s, Global::none, gs == 64 && bits == 4});
    }
  return out;
}

// More than twenty shapes: single rows, odd row counts around the swizzle tile (128), rank 1 to
// 4, empty tensors. Each case uses those whose last axis its group size divides.
inline std::vector<Shape> shapes() {
  return {{16},      {1, 16},   {3, 48},    {2, 32},       {1, 64},     {4, 128},  {7, 96},    {5, 192},
          {16, 256}, {33, 64},  {2, 3, 64}, {2, 2, 2, 32}, {1, 1, 128}, {127, 32}, {128, 32},  {129, 64},
          {3, 384},  {8, 1024}, {0, 32},    {4, 0},        {1, 512},    {17, 320}, {2, 5, 96}, {256, 16}};
}
inline const Shape kBigShape = {129, 4096};

inline bool fits(const Case& c, const Shape& s) { return s.back() % microscale::resolve(c.spec).group_size == 0; }

// f32 values that exercise the corners, before rounding to the input dtype: block scales spread
// over +-30 binades, exact grid values (E2M1 and E4M3 ties after scaling), zeros of both signs,
// subnormals of every dtype, values near each dtype's maximum, all-zero and constant blocks, and
// (when `specials`) NaN and +-Inf.
inline std::vector<float> values(std::int64_t n, DType dtype, std::uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 999), binade(-30, 30);
  static const float grid[] = {0.25f,     0.5f,       0.75f,  1.0f,   1.25f,  1.5f,   1.75f,
                               2.0f,      2.5f,       3.0f,   3.5f,   5.0f,   6.0f,   13.6875f,
                               2.390625f, 0.6953125f, 336.0f, 448.0f, 464.0f, 480.0f, 0.00390625f};
  const float big = dtype == DType::float16 ? 65504.0f : dtype == DType::bfloat16 ? 3.3895314e38f : FLT_MAX;
  const float tiny = dtype == DType::float16 ? 5.9604645e-8f : dtype == DType::bfloat16 ? 9.18355e-41f : 1.4e-45f;
  std::vector<float> v(static_cast<std::size_t>(n));
  float block_scale = 1.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    if (i % 16 == 0) block_scale = std::ldexp(1.0f, binade(rng));
    const int p = pick(rng);
    float x;
    if (p < 550)
      x = normal(rng) * block_scale;
    else if (p < 800)
      x = grid[static_cast<std::size_t>(pick(rng)) % (sizeof grid / sizeof *grid)] * block_scale;
    else if (p < 850)
      x = (p & 1) ? -0.0f : 0.0f;
    else if (p < 880)
      x = tiny * static_cast<float>(1 + pick(rng) % 7);
    else if (p < 900)
      x = big * (p % 2 ? 0.999f : 1.0f);
    else if (p < 960)
      x = normal(rng) * 1e-3f;
    else if (specials && p < 967)
      x = std::numeric_limits<float>::quiet_NaN();
    else if (specials && p < 972)
      x = (p & 1 ? -1.0f : 1.0f) * std::numeric_limits<float>::infinity();
    else
      x = normal(rng) * 1e4f;
    v[static_cast<std::size_t>(i)] = (pick(rng) & 1) ? -x : x;
  }
  // A few whole blocks of zeros and of one repeated value (every element a tie candidate).
  for (std::int64_t b = 0; b * 32 + 32 <= n; b += 7) {
    const float c = b % 2 ? 0.0f : 2.5f * std::ldexp(1.0f, static_cast<int>(b % 11) - 5);
    for (std::int64_t i = b * 32; i < b * 32 + 32; ++i) v[static_cast<std::size_t>(i)] = c;
  }
  return v;
}

// The values as a tensor of `dtype` (f16/bf16 rounded by the CPU codecs).
inline Tensor to_tensor(const std::vector<float>& v, DType dtype, const Shape& shape) {
  Tensor t(dtype, shape);
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::float32)
      t.data<float>()[i] = v[i];
    else if (dtype == DType::float16)
      t.data<std::uint16_t>()[i] = microscale::encode_f16(v[i]);
    else
      t.data<std::uint16_t>()[i] = microscale::encode_bf16(v[i]);
  }
  return t;
}

inline Tensor input(const Shape& shape, DType dtype, std::uint64_t seed, bool specials = true) {
  return to_tensor(values(microscale::numel(shape), dtype, seed, specials), dtype, shape);
}

inline QuantSpec spec_for(const Case& c, const Tensor& x) {
  QuantSpec s = c.spec;
  const float amax = microscale::global_scale(x.view());
  switch (c.global) {
    case Global::none: break;
    case Global::data: s.global_scale = amax; break;
    case Global::half: s.global_scale = amax * 0.5f; break;  // below the true amax: saturation
    case Global::zero: s.global_scale = 0.0f; break;
    case Global::tiny: s.global_scale = 1e-37f; break;  // S_enc clamps to FLT_MAX
  }
  return s;
}

// FORMATS.md 2.1's nvfp4 vectors, one 16-value block each with its global scale: an E4M3 scale
// tie (bamax * 448 / amax = 336) and an E2M1 element tie (x * enc = 1.75) that only
// TransformerEngine's operation order resolves as the contract says.
inline std::vector<std::pair<Tensor, QuantSpec>> nvfp4_tie_vectors() {
  std::vector<std::pair<Tensor, QuantSpec>> out;
  for (auto [amax, bamax] : {std::pair{18.25f, 13.6875f}, std::pair{11.125f, 2.390625f}}) {
    std::vector<float> x(16, 0.0f);
    x[0] = bamax;
    x[1] = 0.6953125f;
    QuantSpec s;
    s.global_scale = amax;
    out.emplace_back(to_tensor(x, DType::float32, {1, 16}), s);
  }
  return out;
}

// The CPU library's scalar reference, the executable spec the CUDA kernels must match.
struct ReferenceBackend {
  microscale::Backend saved = microscale::backend();
  ReferenceBackend() { microscale::set_backend(microscale::Backend::reference); }
  ~ReferenceBackend() { microscale::set_backend(saved); }
};

inline float load(const void* p, std::size_t i, DType t) {
  if (t == DType::float32) return static_cast<const float*>(p)[i];
  const std::uint16_t h = static_cast<const std::uint16_t*>(p)[i];
  return t == DType::float16 ? microscale::decode_f16(h) : microscale::decode_bf16(h);
}

// Byte-identical, reporting the first difference.
inline void expect_bytes(const void* got, const void* want, std::size_t n, const std::string& what) {
  const auto* g = static_cast<const std::uint8_t*>(got);
  const auto* w = static_cast<const std::uint8_t*>(want);
  for (std::size_t i = 0; i < n; ++i)
    if (g[i] != w[i]) {
      ADD_FAILURE() << what << ": byte " << i << " of " << n << " is 0x" << std::hex << int{g[i]} << ", want 0x"
                    << int{w[i]};
      return;
    }
}

// Bit-identical floats of dtype t, except that any NaN matches any NaN (NaN payloads are not
// part of the contract, and GPU arithmetic returns the canonical NaN).
inline void expect_floats(const void* got, const void* want, std::size_t n, DType t, const std::string& what) {
  const std::size_t size = microscale::dtype_size(t);
  for (std::size_t i = 0; i < n; ++i) {
    const float g = load(got, i, t), w = load(want, i, t);
    if (std::isnan(g) && std::isnan(w)) continue;
    if (std::memcmp(static_cast<const std::uint8_t*>(got) + i * size, static_cast<const std::uint8_t*>(want) + i * size,
                    size) != 0) {
      ADD_FAILURE() << what << ": element " << i << " of " << n << " is " << g << ", want " << w;
      return;
    }
  }
}

}  // namespace mscuda
