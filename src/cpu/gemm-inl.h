// Quantized GEMM of one target (Highway -inl.h, included per target): y = x @ W^T or x @ W for
// rows of x beyond the GEMV's, and the transposed-weight GEMV.
//
// Weight panels are decoded once per block of rows of x through dequantize (the exact float32
// values, called directly within this target), then a register tile of float32 FMAs
// accumulates C^T[n][m] with broadcasts of the decoded weights against x packed transposed. The
// summation order is fixed by the shape, so results never depend on the thread count.

#if defined(MICROSCALE_CPU_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MICROSCALE_CPU_GEMM_INL_H_
#undef MICROSCALE_CPU_GEMM_INL_H_
#else
#define MICROSCALE_CPU_GEMM_INL_H_
#endif

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <algorithm>

#include "cpu/gemv-inl.h"
#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace microscale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Register tile: kTileRows decoded weights (broadcast) x 2 vectors of x. x86 before AVX-512 has
// 16 vector registers: 6 x 2 accumulators, 2 loads and a broadcast fit; AVX-512, NEON and SVE
// have 32 (the scalar target: one lane, any tile works).
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3
constexpr std::int64_t kTileRows = 6;
#else
constexpr std::int64_t kTileRows = 8;
#endif
// Output columns (n) per decoded panel: a multiple of every group size, since W stored [K, N]
// decodes its rows in whole groups; the panel buffer is padded with zero rows to whole tiles.
constexpr std::int64_t kPanel = 128;
constexpr std::int64_t kPanelRows = (kPanel + kTileRows - 1) / kTileRows * kTileRows;
constexpr std::int64_t kDepth = 256;    // K values per decoded panel
constexpr std::int64_t kRowsOfX = 512;  // rows of x per packed block

// ---------------------------------------------------------------------------------------------
// transpose = false with few rows: y[m, :] += x[m, k] * W[k, :], W decoded a row slice at a time.

constexpr std::int64_t kAxpyPanel = 128;  // a multiple of every group size

inline void AxpyRows(const float* x, std::int64_t M, const QuantizedMatrix& w, const float* bias, float* y) {
  const DF df;
  const auto L = static_cast<std::int64_t>(kN);
  const std::int64_t K = w.rows, N = w.cols;
  const std::int64_t panels = (N + kAxpyPanel - 1) / kAxpyPanel;
  parallel_for(panels, 1, [&](std::int64_t p0, std::int64_t p1) {
    auto buf = hwy::AllocateAligned<float>(static_cast<std::size_t>(kAxpyPanel));
    auto acc = hwy::AllocateAligned<float>(static_cast<std::size_t>(M * kAxpyPanel));
    for (std::int64_t p = p0; p < p1; ++p) {
      const std::int64_t c0 = p * kAxpyPanel, nc = std::min(kAxpyPanel, N - c0);
      std::fill(acc.get(), acc.get() + M * kAxpyPanel, 0.0f);
      for (std::int64_t k = 0; k < K; ++k) {
        DecodeRow(w, k, c0, nc, buf.get());
        for (std::int64_t m = 0; m < M; ++m) {
          const VF xs = hn::Set(df, x[m * K + k]);
          float* a = acc.get() + m * kAxpyPanel;
          std::int64_t i = 0;
          for (; i + L <= nc; i += L)
            hn::Store(hn::MulAdd(xs, hn::Load(df, buf.get() + i), hn::Load(df, a + i)), df, a + i);
          for (; i < nc; ++i) a[i] += x[m * K + k] * buf[static_cast<std::size_t>(i)];
        }
      }
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t i = 0; i < nc; ++i)
          y[m * N + c0 + i] = acc[static_cast<std::size_t>(m * kAxpyPanel + i)] + (bias ? bias[c0 + i] : 0.0f);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// GEMM: x is packed transposed in strips of 2 vectors of rows (see Gemm), W panels of kPanel output
// columns x kDepth values are decoded once per block of rows of x.

inline void DecodePanel(const QuantizedMatrix& w, bool transpose, std::int64_t n0, std::int64_t nn, std::int64_t k0,
                        std::int64_t kc, float* b /* [kPanelRows][kDepth] */, float* row /* scratch of kPanel */) {
  if (transpose) {
    for (std::int64_t i = 0; i < nn; ++i) DecodeRow(w, n0 + i, k0, kc, b + i * kDepth);
  } else {
    for (std::int64_t k = 0; k < kc; ++k) {
      DecodeRow(w, k0 + k, n0, nn, row);
      for (std::int64_t i = 0; i < nn; ++i) b[i * kDepth + k] = row[i];
    }
  }
  for (std::int64_t i = nn; i < kPanelRows; ++i) std::fill(b + i * kDepth, b + i * kDepth + kc, 0.0f);
}

// ct[i][m0 : m0+2L] += sum_k b[i][k] * at[k][m0 : m0+2L] for i < kTileRows. The accumulators are
// named vectors (SVE allows no arrays of vectors); rows past kTileRows compile away.
HWY_INLINE void Tile(const float* at, std::int64_t ld, const float* b, std::int64_t kc, float* ct, std::int64_t ldc) {
  const DF df;
  const std::size_t L = kN;
  [[maybe_unused]] VF c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51, c60, c61, c70, c71;
  // Each macro is one statement per tile row (do/while keeps the invocations statement-like).
#define MICROSCALE_TILE_LOAD(i)                                                       \
  do {                                                                                \
    if constexpr (kTileRows > i) {                                                    \
      c##i##0 = hn::Load(df, ct + (i)*ldc), c##i##1 = hn::Load(df, ct + (i)*ldc + L); \
    }                                                                                 \
  } while (0)
  MICROSCALE_TILE_LOAD(0);
  MICROSCALE_TILE_LOAD(1);
  MICROSCALE_TILE_LOAD(2);
  MICROSCALE_TILE_LOAD(3);
  MICROSCALE_TILE_LOAD(4);
  MICROSCALE_TILE_LOAD(5);
  MICROSCALE_TILE_LOAD(6);
  MICROSCALE_TILE_LOAD(7);
#undef MICROSCALE_TILE_LOAD
  for (std::int64_t k = 0; k < kc; ++k) {
    const VF a0 = hn::Load(df, at + k * ld), a1 = hn::Load(df, at + k * ld + L);
#define MICROSCALE_TILE_ROW(i)                      \
  do {                                              \
    if constexpr (kTileRows > i) {                  \
      const VF bi = hn::Set(df, b[(i)*kDepth + k]); \
      c##i##0 = hn::MulAdd(bi, a0, c##i##0);        \
      c##i##1 = hn::MulAdd(bi, a1, c##i##1);        \
    }                                               \
  } while (0)
    MICROSCALE_TILE_ROW(0);
    MICROSCALE_TILE_ROW(1);
    MICROSCALE_TILE_ROW(2);
    MICROSCALE_TILE_ROW(3);
    MICROSCALE_TILE_ROW(4);
    MICROSCALE_TILE_ROW(5);
    MICROSCALE_TILE_ROW(6);
    MICROSCALE_TILE_ROW(7);
#undef MICROSCALE_TILE_ROW
  }
#define MICROSCALE_TILE_STORE(i)                                                      \
  do {                                                                                \
    if constexpr (kTileRows > i) {                                                    \
      hn::Store(c##i##0, df, ct + (i)*ldc), hn::Store(c##i##1, df, ct + (i)*ldc + L); \
    }                                                                                 \
  } while (0)
  MICROSCALE_TILE_STORE(0);
  MICROSCALE_TILE_STORE(1);
  MICROSCALE_TILE_STORE(2);
  MICROSCALE_TILE_STORE(3);
  MICROSCALE_TILE_STORE(4);
  MICROSCALE_TILE_STORE(5);
  MICROSCALE_TILE_STORE(6);
  MICROSCALE_TILE_STORE(7);
#undef MICROSCALE_TILE_STORE
}

inline void Gemm(const float* x, std::int64_t M, const QuantizedMatrix& w, bool transpose, const float* bias,
                 float* y) {
  const auto L2 = 2 * static_cast<std::int64_t>(kN);
  const std::int64_t K = transpose ? w.cols : w.rows, N = transpose ? w.rows : w.cols;
  const std::int64_t panels = (N + kPanel - 1) / kPanel;
  for (std::int64_t mb = 0; mb < M; mb += kRowsOfX) {
    const std::int64_t mc = std::min(kRowsOfX, M - mb);
    const std::int64_t ld = (mc + L2 - 1) / L2 * L2;
    // x transposed in strips of 2L rows, each strip contiguous over k, so that a tile streams
    // through memory in order: strip s holds at[s][k][0 : 2L] = x[mb + s 2L + (0 : 2L), k].
    auto at = hwy::AllocateAligned<float>(static_cast<std::size_t>(K * ld));
    if (mc < ld) std::fill(at.get() + (ld - L2) * K, at.get() + ld * K, 0.0f);  // the last strip's padding rows
    for (std::int64_t m = 0; m < mc; ++m) {
      float* strip = at.get() + m / L2 * K * L2 + m % L2;
      for (std::int64_t k = 0; k < K; ++k) strip[k * L2] = x[(mb + m) * K + k];
    }
    parallel_for(panels, 1, [&](std::int64_t p0, std::int64_t p1) {
      auto b = hwy::AllocateAligned<float>(static_cast<std::size_t>(kPanelRows * kDepth));
      auto row = hwy::AllocateAligned<float>(static_cast<std::size_t>(kPanel));
      auto ct = hwy::AllocateAligned<float>(static_cast<std::size_t>(kPanelRows * ld));
      for (std::int64_t p = p0; p < p1; ++p) {
        const std::int64_t n0 = p * kPanel, nn = std::min(kPanel, N - n0);
        std::fill(ct.get(), ct.get() + kPanelRows * ld, 0.0f);
        for (std::int64_t k0 = 0; k0 < K; k0 += kDepth) {
          const std::int64_t kc = std::min(kDepth, K - k0);
          DecodePanel(w, transpose, n0, nn, k0, kc, b.get(), row.get());
          // A strip of x (kDepth x 2L floats) stays in L1 while every tile of the panel uses it.
          for (std::int64_t m = 0; m < ld; m += L2)
            for (std::int64_t i = 0; i < nn; i += kTileRows)
              Tile(at.get() + m * K + k0 * L2, L2, b.get() + i * kDepth, kc, ct.get() + i * ld + m, ld);
        }
        for (std::int64_t i = 0; i < nn; ++i)
          for (std::int64_t m = 0; m < mc; ++m)
            y[(mb + m) * N + n0 + i] = ct[static_cast<std::size_t>(i * ld + m)] + (bias ? bias[n0 + i] : 0.0f);
      }
    });
  }
}

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MICROSCALE_CPU_GEMM_INL_H_
