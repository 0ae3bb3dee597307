// Dense GEMV of one target (Highway -inl.h, included per target): y[m, n] = sum_k x[m, k] w[n, k]
// (+ bias[n]) for a float weight w [N, K] (float32, bfloat16 or float16) read in its own dtype,
// each weight row once per pass over up to kRowsPerPass rows of x. Made for the unquantized layers
// of a quantized model at decode (a language model's head is the largest of them), where reading
// the weight is the whole cost. Sums are float32: each lane keeps two sums over the even and the
// odd vectors of k, each in order; they are added, then the lanes, then the last K % lanes
// products in order (docs/numerics.md, "Matmuls").

#if defined(MICROSCALE_CPU_LINEAR_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MICROSCALE_CPU_LINEAR_INL_H_
#undef MICROSCALE_CPU_LINEAR_INL_H_
#else
#define MICROSCALE_CPU_LINEAR_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>

#include "core/convert.hpp"
#include "cpu/gemv-inl.h"
#include "cpu/parallel.hpp"
#include "cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace microscale::cpu::HWY_NAMESPACE {

constexpr std::int64_t kLinearGrain = 16;  // weight rows per parallel chunk

inline float ToFloat(float v) { return v; }
inline float ToFloat(hwy::bfloat16_t v) {
  return detail::load_f32(reinterpret_cast<const std::byte*>(&v), DType::bfloat16);
}
inline float ToFloat(hwy::float16_t v) {
  return detail::load_f32(reinterpret_cast<const std::byte*>(&v), DType::float16);
}

#if HWY_TARGET != HWY_SCALAR
// Rows m0 .. m0 + kM - 1 of y, for weight rows [n0, n1).
template <int kM, class TW>
HWY_INLINE void LinearPass(const float* x, std::int64_t m0, const TW* w, std::int64_t n0, std::int64_t n1,
                           std::int64_t N, std::int64_t K, const float* bias, float* y) {
  const DF df;
  const std::int64_t step = static_cast<std::int64_t>(kN);
  const std::int64_t vec_end = K - K % step, pair_end = K - K % (2 * step);
  for (std::int64_t n = n0; n < n1; ++n) {
    const TW* row = w + n * K;
    // Two sums per row of x (even and odd vectors of k) halve the chain of dependent additions.
    VF a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
    VF b0 = hn::Zero(df), b1 = hn::Zero(df), b2 = hn::Zero(df), b3 = hn::Zero(df);
    for (std::int64_t k = 0; k < pair_end; k += 2 * step) {
      const VF wa = Load(row + k), wb = Load(row + k + step);
      Rows<kM>([&](auto m) {
        constexpr int kI = decltype(m)::value;
        const float* xr = x + (m0 + kI) * K + k;
        Pick<kI>(a0, a1, a2, a3) = hn::MulAdd(wa, Load(xr), Pick<kI>(a0, a1, a2, a3));
        Pick<kI>(b0, b1, b2, b3) = hn::MulAdd(wb, Load(xr + step), Pick<kI>(b0, b1, b2, b3));
      });
    }
    if (pair_end < vec_end) {
      const VF wa = Load(row + pair_end);
      Rows<kM>([&](auto m) {
        constexpr int kI = decltype(m)::value;
        Pick<kI>(a0, a1, a2, a3) = hn::MulAdd(wa, Load(x + (m0 + kI) * K + pair_end), Pick<kI>(a0, a1, a2, a3));
      });
    }
    Rows<kM>([&](auto m) {
      constexpr int kI = decltype(m)::value;
      const float* xr = x + (m0 + kI) * K;
      float acc = hn::GetLane(hn::SumOfLanes(df, hn::Add(Pick<kI>(a0, a1, a2, a3), Pick<kI>(b0, b1, b2, b3))));
      for (std::int64_t k = vec_end; k < K; ++k) acc += xr[k] * ToFloat(row[k]);
      y[(m0 + kI) * N + n] = bias ? acc + bias[n] : acc;
    });
  }
}

#else   // the scalar target: k in order, as the reference sums
template <int kM, class TW>
HWY_INLINE void LinearPass(const float* x, std::int64_t m0, const TW* w, std::int64_t n0, std::int64_t n1,
                           std::int64_t N, std::int64_t K, const float* bias, float* y) {
  for (std::int64_t m = m0; m < m0 + kM; ++m)
    for (std::int64_t n = n0; n < n1; ++n) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < K; ++k) acc += x[m * K + k] * ToFloat(w[n * K + k]);
      y[m * N + n] = bias ? acc + bias[n] : acc;
    }
}
#endif  // HWY_TARGET != HWY_SCALAR

template <class TW>
void LinearTyped(const float* x, std::int64_t M, const TW* w, std::int64_t N, std::int64_t K, const float* bias,
                 float* y) {
  parallel_for(N, kLinearGrain, [&](std::int64_t n0, std::int64_t n1) {
    // The chunk's weight rows stay in cache across the passes over x's rows.
    for (std::int64_t m0 = 0; m0 < M; m0 += kRowsPerPass) {
      switch (std::min<std::int64_t>(kRowsPerPass, M - m0)) {
        case 1: LinearPass<1>(x, m0, w, n0, n1, N, K, bias, y); break;
        case 2: LinearPass<2>(x, m0, w, n0, n1, N, K, bias, y); break;
        case 3: LinearPass<3>(x, m0, w, n0, n1, N, K, bias, y); break;
        default: LinearPass<4>(x, m0, w, n0, n1, N, K, bias, y); break;
      }
    }
  });
}

inline void Linear(const float* x, std::int64_t M, const void* w, DType w_dtype, std::int64_t N, std::int64_t K,
                   const float* bias, float* y) {
  switch (w_dtype) {
    case DType::bfloat16: return LinearTyped(x, M, static_cast<const hwy::bfloat16_t*>(w), N, K, bias, y);
    case DType::float16: return LinearTyped(x, M, static_cast<const hwy::float16_t*>(w), N, K, bias, y);
    default: return LinearTyped(x, M, static_cast<const float*>(w), N, K, bias, y);
  }
}

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MICROSCALE_CPU_LINEAR_INL_H_
