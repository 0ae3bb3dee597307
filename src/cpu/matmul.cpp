// quantized_matmul on the CPU: a streaming GEMV for a few rows of x and a blocked GEMM that
// decodes weight panels to float32 once and reuses them across 2*L rows of x at a time.
//
// Both use the exact float32 weight values dequantize gives; only the float32 summation order
// differs from the reference (per-group partial sums, vector lanes, K blocks), and it is fixed
// for a given shape, so results do not depend on the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/matmul.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/aligned_allocator.h>

#include <algorithm>
#include <cstring>

#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "microscale/codecs.hpp"

HWY_BEFORE_NAMESPACE();
namespace microscale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// Exact dequantized values of W[r, c0 : c0+n) (c0 and n multiples of the group) into out,
// through the SIMD dequantize (bit-identical to the reference).
void DecodeRow(const QuantizedMatrix& w, std::int64_t r, std::int64_t c0, std::int64_t n, float* out) {
  const std::int64_t g = w.spec.group_size;
  const std::int64_t first = r * (w.cols / g) + c0 / g;
  const std::size_t ss = dtype_size(w.scale_dtype);
  dequantize_blocks(w.packed + first * g * w.spec.bits / 8, w.scales + static_cast<std::size_t>(first) * ss,
                    w.biases ? w.biases + static_cast<std::size_t>(first) * ss : nullptr, w.scale_dtype, w.spec,
                    DType::float32, 0, n / g, reinterpret_cast<std::byte*>(out));
}

// ---------------------------------------------------------------------------------------------
// GEMV, transpose = true: y[m, n] = sum_k x[m, k] W[n, k] for M <= kGemvRows.

constexpr std::int64_t kGemvRows = 4;  // the fp4 fast path is instantiated for 1..4
constexpr std::int64_t kChunk = 1024;  // values of a W row decoded at a time by the generic path

float Dot(const float* a, const float* b, std::int64_t n) {
  const DF df;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
  auto s0 = hn::Zero(df), s1 = hn::Zero(df);
  std::int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(df, a + i + L), hn::LoadU(df, b + i + L), s1);
  }
  for (; i + L <= n; i += L) s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
  float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(s0, s1)));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Any mode and target: decode a chunk of the row, then vector dot products.
void GemvRowsGeneric(const float* x, std::int64_t M, const QuantizedMatrix& w, std::int64_t n0, std::int64_t n1,
                     const float* bias, float* y) {
  const std::int64_t K = w.cols, N = w.rows;
  auto buf = hwy::AllocateAligned<float>(static_cast<std::size_t>(std::min(K, kChunk)));
  for (std::int64_t n = n0; n < n1; ++n) {
    float acc[kGemvRows] = {};
    for (std::int64_t k0 = 0; k0 < K; k0 += kChunk) {
      const std::int64_t kc = std::min(kChunk, K - k0);
      DecodeRow(w, n, k0, kc, buf.get());
      for (std::int64_t m = 0; m < M; ++m) acc[m] += Dot(x + m * K + k0, buf.get(), kc);
    }
    for (std::int64_t m = 0; m < M; ++m) y[m * N + n] = bias ? acc[m] + bias[n] : acc[m];
  }
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// 16-lane fast path for nvfp4 / mxfp4 (raw AVX-512: vpermps reading only the low 4 bits of an
// index is what makes the decode cheap, and Highway's table lookups require in-range indices).
// E2M1 codes index a 16-entry float table directly, against x rearranged once per call to match
// the order the codes arrive in. Shuffles bound this loop on Zen 4 (dropping the byte-to-dword
// widening took it from 1.8 to 1.3 ns per 32 weights), so the layout needs no other shuffle per
// code. Scale factors for 16 groups are decoded in one vector and spread to the lanes of their
// group by a table lookup.

HWY_ALIGN constexpr float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Float32 scale factors of 16 consecutive groups from their code bytes: E4M3 for nvfp4 (times
// the three-level factor exactly as dequantize forms it), E8M0 for mx.
HWY_INLINE __m512 ScaleFactors16(const std::uint8_t* codes, const QuantSpec& s) {
  const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  const __m512 nan = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000));
  if (s.mode == Mode::nvfp4) {
    // The E4M3 magnitude bits placed at the f32 exponent/mantissa position are its value times
    // 2^-120 (a subnormal f32 for subnormal codes), so one exact multiply rebiases them.
    const __m512i magnitude = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
    const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
    const __m512i bits =  // magnitude << 20 | (c << 24 & sign)
        _mm512_ternarylogic_epi32(_mm512_slli_epi32(magnitude, 20), _mm512_slli_epi32(c, 24), sign, 0xF8);
    __m512 sf = _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0x1p120f));
    sf = _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(magnitude, _mm512_set1_epi32(0x7F)), sf, nan);
    if (s.global_scale)
      sf = _mm512_mul_ps(_mm512_mul_ps(sf, _mm512_set1_ps(*s.global_scale)), _mm512_set1_ps(f32_from_bits(kC2688Bits)));
    return sf;
  }
  // 2^(c - 127) from its bits; c = 0 is the subnormal 2^-127, c = 255 NaN.
  __m512i bits = _mm512_slli_epi32(c, 23);
  bits = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(c, _mm512_setzero_si512()), bits,
                                 _mm512_set1_epi32(0x00400000));
  return _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(c, _mm512_set1_epi32(0xFF)), _mm512_castsi512_ps(bits), nan);
}

bool GemvFp4Fast(const QuantizedMatrix& w) {
  return (w.spec.mode == Mode::nvfp4 || w.spec.mode == Mode::mxfp4) && w.cols % 32 == 0;
}

// Where x[k] goes in the deinterleaved copy, given the row's 128-value blocks end at k128.
//  - Inside a 128-value block, 64 code bytes load as 16 dwords with no shuffle: dword l holds the
//    8 codes of k = 8l .. 8l+7, and shifting it right by 4j leaves code 8l+j in its low 4 bits,
//    which is all vpermps reads. So x goes to [j][l] = x[8l + j].
//  - The remaining 32-value chunks load 16 bytes widened to dwords: low nibbles are even k, high
//    nibbles odd k, so x goes to [x0 x2 .. x30 | x1 x3 .. x31].
inline std::int64_t DeinterleavedIndex(std::int64_t k, std::int64_t k128) {
  if (k < k128) return k / 128 * 128 + (k % 8) * 16 + (k % 128) / 8;
  return k / 32 * 32 + (k % 2) * 16 + (k % 32) / 2;
}

// Lane -> group of a 128-value block within the 16 groups whose factors are in one vector:
// nvfp4 (16 per group) blocks b = 0, 1 use groups 8b + l/2; mx (32 per group) blocks b = 0..3
// use groups 4b + l/4.
struct SpreadTables {
  HWY_ALIGN std::uint32_t nvfp4[2][16];
  HWY_ALIGN std::uint32_t mx[4][16];
  HWY_ALIGN std::uint32_t nvfp4_chunk[16];  // a 32-value chunk: groups 0 (lanes 0-7) and 1
};
constexpr SpreadTables MakeSpreadTables() {
  SpreadTables t{};
  for (std::uint32_t l = 0; l < 16; ++l) {
    for (std::uint32_t b = 0; b < 2; ++b) t.nvfp4[b][l] = 8 * b + l / 2;
    for (std::uint32_t b = 0; b < 4; ++b) t.mx[b][l] = 4 * b + l / 4;
    t.nvfp4_chunk[l] = l / 8;
  }
  return t;
}
constexpr SpreadTables kSpread = MakeSpreadTables();

// Float32 factors of groups [g, g + 16) of a row, zero-padded past its last group.
HWY_INLINE __m512 RowFactors(const std::uint8_t* row_codes, std::int64_t groups, std::int64_t g, const QuantSpec& s) {
  if (groups - g >= 16) return ScaleFactors16(row_codes + g, s);
  HWY_ALIGN std::uint8_t tail[16] = {};
  std::memcpy(tail, row_codes + g, static_cast<std::size_t>(groups - g));
  return ScaleFactors16(tail, s);
}

// Rows [n0, n1) of an nvfp4 / mxfp4 W against kM rows of x laid out by DeinterleavedIndex. Per
// block, t = sum of x times E2M1 values, then acc += t * (factor of each lane's group).
template <int kM, bool kNv>
void GemvRowsFp4(const float* xd, const QuantizedMatrix& w, std::int64_t n0, std::int64_t n1, const float* bias,
                 float* y) {
  constexpr std::int64_t kGroup = kNv ? 16 : 32;
  constexpr std::int64_t kBlocksPerFactors = kNv ? 2 : 4;  // 128-value blocks covered by 16 groups
  const std::int64_t K = w.cols, N = w.rows;
  const std::int64_t groups = K / kGroup;
  const std::int64_t blocks = K / 128;
  const std::uint32_t(*spread)[16] = kNv ? kSpread.nvfp4 : kSpread.mx;
  const __m512 table = _mm512_load_ps(kE2M1Values);
  for (std::int64_t n = n0; n < n1; ++n) {
    const std::uint8_t* p = w.packed + n * (K / 2);
    const std::uint8_t* sc = reinterpret_cast<const std::uint8_t*>(w.scales) + n * groups;
    __m512 acc[kM];
    for (int m = 0; m < kM; ++m) acc[m] = _mm512_setzero_ps();
    for (std::int64_t b0 = 0; b0 < blocks; b0 += kBlocksPerFactors) {
      const __m512 factors = RowFactors(sc, groups, b0 * 128 / kGroup, w.spec);
      _mm_prefetch(reinterpret_cast<const char*>(sc + b0 * 128 / kGroup + 512), _MM_HINT_T0);
      const std::int64_t b1 = std::min(blocks, b0 + kBlocksPerFactors);
      for (std::int64_t b = b0; b < b1; ++b) {
        const __m512 f = _mm512_permutexvar_ps(_mm512_load_si512(spread[b - b0]), factors);
        // Software prefetch a few KB ahead: one core's hardware prefetch alone left the DRAM
        // stream short of the two-thread bandwidth.
        _mm_prefetch(reinterpret_cast<const char*>(p + b * 64 + 4096), _MM_HINT_T0);
        const __m512i codes = _mm512_loadu_si512(p + b * 64);
        // Two partial sums per row of x halve the FMA dependency chain of a block.
        __m512 t0[kM], t1[kM];
        auto step = [&](auto j) HWY_ATTR {
          constexpr int kJ = decltype(j)::value;
          const __m512 v = _mm512_permutexvar_ps(kJ ? _mm512_srli_epi32(codes, 4 * kJ) : codes, table);
          for (int m = 0; m < kM; ++m) {
            const __m512 xj = _mm512_load_ps(xd + m * K + b * 128 + 16 * kJ);
            __m512& t = kJ % 2 ? t1[m] : t0[m];
            t = kJ < 2 ? _mm512_mul_ps(xj, v) : _mm512_fmadd_ps(xj, v, t);
          }
        };
        step(std::integral_constant<int, 0>{}), step(std::integral_constant<int, 1>{});
        step(std::integral_constant<int, 2>{}), step(std::integral_constant<int, 3>{});
        step(std::integral_constant<int, 4>{}), step(std::integral_constant<int, 5>{});
        step(std::integral_constant<int, 6>{}), step(std::integral_constant<int, 7>{});
        for (int m = 0; m < kM; ++m) acc[m] = _mm512_fmadd_ps(_mm512_add_ps(t0[m], t1[m]), f, acc[m]);
      }
    }
    // Leftover 32-value chunks (K not a multiple of 128).
    for (std::int64_t c = blocks * 4; c < K / 32; ++c) {
      const std::int64_t g = c * 32 / kGroup;
      const __m512 chunk_factors = RowFactors(sc, groups, g, w.spec);
      const __m512 f = kNv ? _mm512_permutexvar_ps(_mm512_load_si512(kSpread.nvfp4_chunk), chunk_factors)
                          : _mm512_permutexvar_ps(_mm512_setzero_si512(), chunk_factors);
      const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + c * 16)));
      const __m512 even = _mm512_permutexvar_ps(bytes, table);
      const __m512 odd = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
      for (int m = 0; m < kM; ++m) {
        const __m512 t = _mm512_fmadd_ps(_mm512_load_ps(xd + m * K + c * 32 + 16), odd,
                                         _mm512_mul_ps(_mm512_load_ps(xd + m * K + c * 32), even));
        acc[m] = _mm512_fmadd_ps(t, f, acc[m]);
      }
    }
    for (int m = 0; m < kM; ++m) {
      const float v = _mm512_reduce_add_ps(acc[m]);
      y[m * N + n] = bias ? v + bias[n] : v;
    }
  }
}
#endif

void Gemv(const float* x, std::int64_t M, const QuantizedMatrix& w, const float* bias, float* y) {
  const std::int64_t N = w.rows;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (GemvFp4Fast(w)) {
    const std::int64_t K = w.cols;
    auto xd = hwy::AllocateAligned<float>(static_cast<std::size_t>(M * K));
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t k = 0; k < K; ++k)
        xd[static_cast<std::size_t>(m * K + DeinterleavedIndex(k, K / 128 * 128))] = x[m * K + k];
    const bool nv = w.spec.mode == Mode::nvfp4;
    parallel_for(N, 64, [&](std::int64_t n0, std::int64_t n1) {
      auto rows = [&](auto m) HWY_ATTR {
        constexpr int kM = decltype(m)::value;
        return nv ? GemvRowsFp4<kM, true>(xd.get(), w, n0, n1, bias, y)
                  : GemvRowsFp4<kM, false>(xd.get(), w, n0, n1, bias, y);
      };
      switch (M) {
        case 1: return rows(std::integral_constant<int, 1>{});
        case 2: return rows(std::integral_constant<int, 2>{});
        case 3: return rows(std::integral_constant<int, 3>{});
        default: return rows(std::integral_constant<int, 4>{});
      }
    });
    return;
  }
#endif
  parallel_for(N, 64, [&](std::int64_t n0, std::int64_t n1) { GemvRowsGeneric(x, M, w, n0, n1, bias, y); });
}

// ---------------------------------------------------------------------------------------------
// transpose = false with few rows: y[m, :] += x[m, k] * W[k, :], W decoded a row at a time.

constexpr std::int64_t kPanel = 128;  // a multiple of every group size and of kRowsPerTile

void AxpyRows(const float* x, std::int64_t M, const QuantizedMatrix& w, const float* bias, float* y) {
  const DF df;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t K = w.rows, N = w.cols;
  const std::int64_t panels = (N + kPanel - 1) / kPanel;
  parallel_for(panels, 1, [&](std::int64_t p0, std::int64_t p1) {
    auto buf = hwy::AllocateAligned<float>(static_cast<std::size_t>(kPanel));
    auto acc = hwy::AllocateAligned<float>(static_cast<std::size_t>(kGemvRows * kPanel));
    for (std::int64_t p = p0; p < p1; ++p) {
      const std::int64_t c0 = p * kPanel, nc = std::min(kPanel, N - c0);
      std::fill(acc.get(), acc.get() + kGemvRows * kPanel, 0.0f);
      for (std::int64_t k = 0; k < K; ++k) {
        DecodeRow(w, k, c0, nc, buf.get());
        for (std::int64_t m = 0; m < M; ++m) {
          const auto xs = hn::Set(df, x[m * K + k]);
          float* a = acc.get() + m * kPanel;
          std::int64_t i = 0;
          for (; i + L <= nc; i += L)
            hn::Store(hn::MulAdd(xs, hn::Load(df, buf.get() + i), hn::Load(df, a + i)), df, a + i);
          for (; i < nc; ++i) a[i] += x[m * K + k] * buf[static_cast<std::size_t>(i)];
        }
      }
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t i = 0; i < nc; ++i)
          y[m * N + c0 + i] = acc[static_cast<std::size_t>(m * kPanel + i)] + (bias ? bias[c0 + i] : 0.0f);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// GEMM: x is packed transposed (at[k][m], m padded to 2 vectors), W panels of kPanel output
// columns x kDepth values are decoded once per block of rows of x, and an 8 x 2L register tile
// accumulates C^T[n][m] with broadcasts of the decoded weights.

constexpr std::int64_t kDepth = 256;     // K values per block
constexpr std::int64_t kRowsOfX = 512;   // rows of x per packed block
constexpr std::int64_t kRowsPerTile = 8;  // output columns (n) per register tile

void DecodePanel(const QuantizedMatrix& w, bool transpose, std::int64_t n0, std::int64_t nn, std::int64_t k0,
                 std::int64_t kc, float* b /* [kPanel][kDepth] */, float* row /* scratch of kPanel */) {
  if (transpose) {
    for (std::int64_t i = 0; i < nn; ++i) DecodeRow(w, n0 + i, k0, kc, b + i * kDepth);
  } else {
    for (std::int64_t k = 0; k < kc; ++k) {
      DecodeRow(w, k0 + k, n0, nn, row);
      for (std::int64_t i = 0; i < nn; ++i) b[i * kDepth + k] = row[i];
    }
  }
  for (std::int64_t i = nn; i < kPanel; ++i) std::fill(b + i * kDepth, b + i * kDepth + kc, 0.0f);
}

// ct[i][m0 : m0+2L] += sum_k b[i][k] * at[k][m0 : m0+2L] for i < 8.
HWY_INLINE void Tile(const float* at, std::int64_t ld, const float* b, std::int64_t kc, float* ct, std::int64_t ldc) {
  const DF df;
  const std::size_t L = hn::Lanes(df);
  auto c00 = hn::Load(df, ct + 0 * ldc), c01 = hn::Load(df, ct + 0 * ldc + L);
  auto c10 = hn::Load(df, ct + 1 * ldc), c11 = hn::Load(df, ct + 1 * ldc + L);
  auto c20 = hn::Load(df, ct + 2 * ldc), c21 = hn::Load(df, ct + 2 * ldc + L);
  auto c30 = hn::Load(df, ct + 3 * ldc), c31 = hn::Load(df, ct + 3 * ldc + L);
  auto c40 = hn::Load(df, ct + 4 * ldc), c41 = hn::Load(df, ct + 4 * ldc + L);
  auto c50 = hn::Load(df, ct + 5 * ldc), c51 = hn::Load(df, ct + 5 * ldc + L);
  auto c60 = hn::Load(df, ct + 6 * ldc), c61 = hn::Load(df, ct + 6 * ldc + L);
  auto c70 = hn::Load(df, ct + 7 * ldc), c71 = hn::Load(df, ct + 7 * ldc + L);
  for (std::int64_t k = 0; k < kc; ++k) {
    const auto a0 = hn::Load(df, at + k * ld), a1 = hn::Load(df, at + k * ld + L);
#define MICROSCALE_TILE_ROW(i)                          \
  {                                                     \
    const auto bi = hn::Set(df, b[(i) * kDepth + k]);   \
    c##i##0 = hn::MulAdd(bi, a0, c##i##0);              \
    c##i##1 = hn::MulAdd(bi, a1, c##i##1);              \
  }
    MICROSCALE_TILE_ROW(0) MICROSCALE_TILE_ROW(1) MICROSCALE_TILE_ROW(2) MICROSCALE_TILE_ROW(3)
    MICROSCALE_TILE_ROW(4) MICROSCALE_TILE_ROW(5) MICROSCALE_TILE_ROW(6) MICROSCALE_TILE_ROW(7)
#undef MICROSCALE_TILE_ROW
  }
  hn::Store(c00, df, ct + 0 * ldc), hn::Store(c01, df, ct + 0 * ldc + L);
  hn::Store(c10, df, ct + 1 * ldc), hn::Store(c11, df, ct + 1 * ldc + L);
  hn::Store(c20, df, ct + 2 * ldc), hn::Store(c21, df, ct + 2 * ldc + L);
  hn::Store(c30, df, ct + 3 * ldc), hn::Store(c31, df, ct + 3 * ldc + L);
  hn::Store(c40, df, ct + 4 * ldc), hn::Store(c41, df, ct + 4 * ldc + L);
  hn::Store(c50, df, ct + 5 * ldc), hn::Store(c51, df, ct + 5 * ldc + L);
  hn::Store(c60, df, ct + 6 * ldc), hn::Store(c61, df, ct + 6 * ldc + L);
  hn::Store(c70, df, ct + 7 * ldc), hn::Store(c71, df, ct + 7 * ldc + L);
}

void Gemm(const float* x, std::int64_t M, const QuantizedMatrix& w, bool transpose, const float* bias, float* y) {
  const DF df;
  const std::int64_t L2 = 2 * static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t K = transpose ? w.cols : w.rows, N = transpose ? w.rows : w.cols;
  const std::int64_t panels = (N + kPanel - 1) / kPanel;
  for (std::int64_t mb = 0; mb < M; mb += kRowsOfX) {
    const std::int64_t mc = std::min(kRowsOfX, M - mb);
    const std::int64_t ld = (mc + L2 - 1) / L2 * L2;
    auto at = hwy::AllocateAligned<float>(static_cast<std::size_t>(K * ld));
    for (std::int64_t k = 0; k < K; ++k) {
      float* row = at.get() + k * ld;
      for (std::int64_t m = 0; m < mc; ++m) row[m] = x[(mb + m) * K + k];
      std::fill(row + mc, row + ld, 0.0f);
    }
    parallel_for(panels, 1, [&](std::int64_t p0, std::int64_t p1) {
      auto b = hwy::AllocateAligned<float>(static_cast<std::size_t>(kPanel * kDepth));
      auto row = hwy::AllocateAligned<float>(static_cast<std::size_t>(kPanel));
      auto ct = hwy::AllocateAligned<float>(static_cast<std::size_t>(kPanel * ld));
      for (std::int64_t p = p0; p < p1; ++p) {
        const std::int64_t n0 = p * kPanel, nn = std::min(kPanel, N - n0);
        std::fill(ct.get(), ct.get() + kPanel * ld, 0.0f);
        for (std::int64_t k0 = 0; k0 < K; k0 += kDepth) {
          const std::int64_t kc = std::min(kDepth, K - k0);
          DecodePanel(w, transpose, n0, nn, k0, kc, b.get(), row.get());
          for (std::int64_t i = 0; i < nn; i += kRowsPerTile)
            for (std::int64_t m = 0; m < ld; m += L2)
              Tile(at.get() + k0 * ld + m, ld, b.get() + i * kDepth, kc, ct.get() + i * ld + m, ld);
        }
        for (std::int64_t i = 0; i < nn; ++i)
          for (std::int64_t m = 0; m < mc; ++m)
            y[(mb + m) * N + n0 + i] = ct[static_cast<std::size_t>(i * ld + m)] + (bias ? bias[n0 + i] : 0.0f);
      }
    });
  }
}

void QuantizedMatmul(const float* x, std::int64_t M, const QuantizedMatrix& w, bool transpose, const float* bias,
                     float* y) {
  const std::int64_t K = transpose ? w.cols : w.rows, N = transpose ? w.rows : w.cols;
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (std::int64_t i = 0; i < M * N; ++i) y[i] = bias ? bias[i % N] : 0.0f;
    return;
  }
  if (M <= kGemvRows) {
    if (transpose)
      Gemv(x, M, w, bias, y);
    else
      AxpyRows(x, M, w, bias, y);
    return;
  }
  Gemm(x, M, w, transpose, bias, y);
}

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace microscale::cpu {

HWY_EXPORT(QuantizedMatmul);

void quantized_matmul(const float* x, std::int64_t M, const QuantizedMatrix& w, bool transpose, const float* bias,
                      float* y) {
  HWY_DYNAMIC_DISPATCH(QuantizedMatmul)(x, M, w, transpose, bias, y);
}

}  // namespace microscale::cpu
#endif
