// Dense float64 products for GPTQ (src/ops/gptq.cpp): one register-tiled kernel per SIMD target
// (Highway dispatch), single-threaded; callers split rows or columns over threads and pack the
// shared operand once.
#pragma once

#include <cstdint>

namespace microscale::cpu {

// B operands are packed in panels of kDensePanel columns: B(k, j) is
// bp[(j / kDensePanel) * panel_stride + k * kDensePanel + j % kDensePanel], zero past the last
// column, so a tile reads its B values contiguously whatever B's row stride was.
inline constexpr std::int64_t kDensePanel = 16;
// Depth of one run of a sum (see dense_update).
inline constexpr std::int64_t kDenseDepth = 256;

// Doubles that pack_panels writes for n columns of kd rows (panel_stride kd * kDensePanel).
inline std::int64_t packed_size(std::int64_t kd, std::int64_t n) {
  return (n + kDensePanel - 1) / kDensePanel * kDensePanel * kd;
}
// Packs b [kd, n] (row stride ldb) into bp with panel_stride kd * kDensePanel.
void pack_panels(std::int64_t kd, std::int64_t n, const double* b, std::int64_t ldb, double* bp);

// c[i * ldc + j] -= sum_k at[k * lda + i] * B(k, j) for i < m, j < n, k < kd (`at` holds A
// transposed: the k-th row of `at` is column k of A; B packed as above), or += when `add`. Each
// element's sum is formed on its own, k in order by fused multiply-adds (separate multiply and
// add on targets without FMA) in runs of kDenseDepth, each run's sum then added to (subtracted
// from) c in order: the same bits for an element whatever m, n and the element's position, so
// splitting a product into row or column ranges never changes a result.
void dense_update(std::int64_t m, std::int64_t n, std::int64_t kd, const double* at, std::int64_t lda, const double* bp,
                  std::int64_t panel_stride, double* c, std::int64_t ldc, bool add);

}  // namespace microscale::cpu
