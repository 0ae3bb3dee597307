// cpu/dense.hpp: float64 C -= A B with A given transposed and B packed in panels. A is packed per
// depth run in strips of kRows rows, so a tile's loads are contiguous; a B panel's run stays in
// L1 while every strip of A passes it. Padding rows and columns are zero and never stored, so an
// element's arithmetic does not depend on where its tile starts.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/dense.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <hwy/aligned_allocator.h>
#include <hwy/cache_control.h>
#include <algorithm>

#include "cpu/dense.hpp"

HWY_BEFORE_NAMESPACE();
namespace microscale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
// At most 8 lanes, so that two vectors never exceed a kDensePanel-wide panel.
using DD = hn::CappedTag<double, kDensePanel / 2>;
using VD = hn::Vec<DD>;

// Register tile: kRows broadcast A values x 2 vectors of B. x86 before AVX-512 has 16 vector
// registers (6 x 2 accumulators, 2 loads and a broadcast fit); the other targets have 32.
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3
constexpr std::int64_t kRows = 6;
#else
constexpr std::int64_t kRows = 8;
#endif

// out[i][0 : 2L] = sum_k ap[k][i] * bp[k][0 : 2L] for i < kRows (ap: kRows values per k; bp: 2L).
// The accumulators are named vectors (SVE allows no arrays of vectors).
HWY_INLINE void Tile(const double* HWY_RESTRICT ap, const double* HWY_RESTRICT bp, std::int64_t kd,
                     double* HWY_RESTRICT out) {
  constexpr std::int64_t P = kDensePanel;
  const DD d;
  const std::size_t L = hn::Lanes(d);
  const VD z = hn::Zero(d);
  [[maybe_unused]] VD c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z, c40 = z, c41 = z, c50 = z,
                      c51 = z, c60 = z, c61 = z, c70 = z, c71 = z;
  for (std::int64_t k = 0; k < kd; ++k) {
    const VD b0 = hn::LoadU(d, bp + k * P);
    const VD b1 = hn::LoadU(d, bp + k * P + static_cast<std::int64_t>(L));
    const double* a = ap + k * kRows;
#define MICROSCALE_DENSE_ROW(i)              \
  do {                                       \
    if constexpr (kRows > i) {               \
      const VD ai = hn::Set(d, a[i]);        \
      c##i##0 = hn::MulAdd(ai, b0, c##i##0); \
      c##i##1 = hn::MulAdd(ai, b1, c##i##1); \
    }                                        \
  } while (0)
    MICROSCALE_DENSE_ROW(0);
    MICROSCALE_DENSE_ROW(1);
    MICROSCALE_DENSE_ROW(2);
    MICROSCALE_DENSE_ROW(3);
    MICROSCALE_DENSE_ROW(4);
    MICROSCALE_DENSE_ROW(5);
    MICROSCALE_DENSE_ROW(6);
    MICROSCALE_DENSE_ROW(7);
#undef MICROSCALE_DENSE_ROW
  }
#define MICROSCALE_DENSE_STORE(i)                                                           \
  do {                                                                                      \
    if constexpr (kRows > i) {                                                              \
      hn::StoreU(c##i##0, d, out + (i)*2 * L), hn::StoreU(c##i##1, d, out + (i)*2 * L + L); \
    }                                                                                       \
  } while (0)
  MICROSCALE_DENSE_STORE(0);
  MICROSCALE_DENSE_STORE(1);
  MICROSCALE_DENSE_STORE(2);
  MICROSCALE_DENSE_STORE(3);
  MICROSCALE_DENSE_STORE(4);
  MICROSCALE_DENSE_STORE(5);
  MICROSCALE_DENSE_STORE(6);
  MICROSCALE_DENSE_STORE(7);
#undef MICROSCALE_DENSE_STORE
}

void DenseUpdate(std::int64_t m, std::int64_t n, std::int64_t kd, const double* at, std::int64_t lda, const double* bp,
                 std::int64_t panel_stride, double* c, std::int64_t ldc, bool add) {
  if (m <= 0 || n <= 0 || kd <= 0) return;
  const DD d;
  const auto W = 2 * static_cast<std::int64_t>(hn::Lanes(d));  // tile width: a panel is P / W tiles
  const std::int64_t strips = (m + kRows - 1) / kRows;
  auto ap = hwy::AllocateAligned<double>(static_cast<std::size_t>(strips * kRows * std::min(kd, kDenseDepth)));
  auto out = hwy::AllocateAligned<double>(static_cast<std::size_t>(kRows * W));
  for (std::int64_t k0 = 0; k0 < kd; k0 += kDenseDepth) {
    const std::int64_t kc = std::min(kDenseDepth, kd - k0);
    // A strip s: ap[s][k][i] = at[k0 + k][s kRows + i], zero past m.
    for (std::int64_t s = 0; s < strips; ++s) {
      double* dst = ap.get() + s * kRows * kc;
      const std::int64_t i0 = s * kRows, rows = std::min(kRows, m - i0);
      for (std::int64_t k = 0; k < kc; ++k) {
        const double* src = at + (k0 + k) * lda + i0;
        for (std::int64_t i = 0; i < rows; ++i) dst[k * kRows + i] = src[i];
        for (std::int64_t i = rows; i < kRows; ++i) dst[k * kRows + i] = 0.0;
      }
    }
    for (std::int64_t j0 = 0; j0 < n; j0 += W) {
      const std::int64_t cols = std::min(W, n - j0);
      const double* panel = bp + j0 / kDensePanel * panel_stride + k0 * kDensePanel + j0 % kDensePanel;
      for (std::int64_t s = 0; s < strips; ++s) {
        const std::int64_t i0 = s * kRows, rows = std::min(kRows, m - i0);
        // c's rows are far apart, beyond the prefetchers' reach: fetch the tile's lines while
        // the tile computes.
        for (std::int64_t i = 0; i < rows; ++i) {
          hwy::Prefetch(c + (i0 + i) * ldc + j0);
          hwy::Prefetch(c + (i0 + i) * ldc + j0 + cols - 1);
        }
        Tile(ap.get() + s * kRows * kc, panel, kc, out.get());
        for (std::int64_t i = 0; i < rows; ++i) {
          double* ci = c + (i0 + i) * ldc + j0;
          const double* oi = out.get() + i * W;
          if (add)
            for (std::int64_t j = 0; j < cols; ++j) ci[j] += oi[j];
          else
            for (std::int64_t j = 0; j < cols; ++j) ci[j] -= oi[j];
        }
      }
    }
  }
}

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace microscale::cpu {

HWY_EXPORT(DenseUpdate);

void dense_update(std::int64_t m, std::int64_t n, std::int64_t kd, const double* at, std::int64_t lda, const double* bp,
                  std::int64_t panel_stride, double* c, std::int64_t ldc, bool add) {
  HWY_DYNAMIC_DISPATCH(DenseUpdate)(m, n, kd, at, lda, bp, panel_stride, c, ldc, add);
}

// Row by row, so that b is read in order (its rows may be far apart).
void pack_panels(std::int64_t kd, std::int64_t n, const double* b, std::int64_t ldb, double* bp) {
  const std::int64_t panels = (n + kDensePanel - 1) / kDensePanel, stride = kd * kDensePanel;
  for (std::int64_t k = 0; k < kd; ++k) {
    const double* src = b + k * ldb;
    for (std::int64_t p = 0; p < panels; ++p) {
      double* dst = bp + p * stride + k * kDensePanel;
      const std::int64_t j0 = p * kDensePanel, cols = std::min(kDensePanel, n - j0);
      for (std::int64_t j = 0; j < cols; ++j) dst[j] = src[j0 + j];
      for (std::int64_t j = cols; j < kDensePanel; ++j) dst[j] = 0.0;
    }
  }
}

}  // namespace microscale::cpu
#endif
