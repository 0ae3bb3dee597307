// quantized_matmul, gather_qmm and qqmm on the device.
//
// Every product runs through one of three kernels over batches of (x matrix, w matrix) pairs:
//   gemv_t   M <= 8, W [N, K]: one warp per output column, W's row streamed once.
//   gemv_n   M <= 8, W [K, N]: one thread per 8 columns and a slice of K; slices summed in order.
//   gemm     otherwise: 64x64 output tiles on mma.sync m16n8k16 bf16 tensor cores (sm_80+, so
//            sm_90a and sm_100a), x and decoded W tiles staged in shared memory as bf16.
// Tensor cores take bf16, so values are split into bf16 parts whose sum is exact: x as 1 (bf16),
// 2 (f16) or 3 (f32) parts, W as 1 part for fp modes (element * block scale has at most 8
// significant bits) or 3 for affine (an arbitrary f32); part pairs whose products lie below f32
// precision (index sum > 2) are skipped. Products are exact and sums are f32, so results meet the
// contract of FORMATS.md 6 up to summation order. Three-level nvfp4 and qqmm multiply the f32 sum
// by their tensor factor (alpha) once, before the bias and the single rounding to y's dtype.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <deque>
#include <vector>

#include "core/convert.hpp"
#include "cuda/device.hpp"

namespace microscale::cuda {
namespace detail {
namespace {

using ops::BatchPair;

struct MatmulArgs {
  const void* x;  // batches of M x K
  DType x_dtype;
  QuantizedArgs w;  // w.rows = rows of one stored matrix
  bool transpose;   // W stored [N, K] (else [K, N])
  std::int64_t M, N, K;
  const BatchPair* pairs;  // one per output matrix (device memory), or null: `first` is the only one
  BatchPair first;
  std::int64_t batches;
  float alpha;
  const void* bias;  // [N] or null
  DType bias_dtype;
  void* y;  // batches of M x N
  DType y_dtype;
  float* partial;  // gemv_n: splits x batches x M x N partial sums
  int splits;
};

__device__ void store_output(const MatmulArgs& a, std::int64_t z, std::int64_t m, std::int64_t n, float acc) {
  float v = acc * a.alpha;
  if (a.bias) v = v + load_float(a.bias, n, a.bias_dtype);
  store_float(a.y, (z * a.M + m) * a.N + n, a.y_dtype, v);
}

// ---- gemm ------------------------------------------------------------------------------------

constexpr int kBM = 64, kBN = 64, kBK = 32, kLds = kBK + 8;  // +8: conflict-free fragment loads
constexpr int kGemmThreads = 128;                            // 2 x 2 warps of 32 x 32 outputs

__device__ std::uint32_t lds32(const std::uint16_t* p) { return *reinterpret_cast<const std::uint32_t*>(p); }

__device__ void mma_bf16(float (&c)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <int NX, int NW>
__global__ void __launch_bounds__(kGemmThreads) gemm_kernel(MatmulArgs a) {
  __shared__ __align__(16) std::uint16_t xs[NX][kBM][kLds];  // x tile [m][k], one plane per part
  __shared__ __align__(16) std::uint16_t ws[NW][kBN][kLds];  // W tile [n][k]
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;  // mma fragment coordinates
  const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
  const std::int64_t m0 = static_cast<std::int64_t>(blockIdx.y) * kBM, n0 = static_cast<std::int64_t>(blockIdx.x) * kBN;
  for (std::int64_t z = blockIdx.z; z < a.batches; z += gridDim.z) {
    const BatchPair pr = a.pairs ? a.pairs[z] : a.first;
    float acc[2][4][4] = {};
    for (std::int64_t k0 = 0; k0 < a.K; k0 += kBK) {
      for (int i = tid; i < kBM * kBK / 8; i += kGemmThreads) {  // x: 8 consecutive k per item
        const int r = i / (kBK / 8), kc = (i % (kBK / 8)) * 8;
        const std::int64_t m = m0 + r;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const std::int64_t k = k0 + kc + j;
          const float v = m < a.M && k < a.K ? load_float(a.x, (pr.x * a.M + m) * a.K + k, a.x_dtype) : 0.0f;
          std::uint16_t parts[NX];
          split_bf16<NX>(v, parts);
#pragma unroll
          for (int p = 0; p < NX; ++p) xs[p][r][kc + j] = parts[p];
        }
      }
      for (int i = tid; i < kBN * kBK / 8; i += kGemmThreads) {  // W: 8 values along its stored row
        // transpose: stored row n, values k..k+7; else stored row k, values n..n+7.
        const int rn = a.transpose ? i / (kBK / 8) : (i % (kBN / 8)) * 8;
        const int rk = a.transpose ? (i % (kBK / 8)) * 8 : i / (kBN / 8);
        const std::int64_t n = n0 + rn, k = k0 + rk;
        float v[8] = {};
        if (n < a.N && k < a.K) decode8(a.w, pr.w, a.transpose ? n : k, a.transpose ? k : n, false, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          std::uint16_t parts[NW];
          split_bf16<NW>(v[j], parts);
#pragma unroll
          for (int p = 0; p < NW; ++p) {
            if (a.transpose)
              ws[p][rn][rk + j] = parts[p];
            else
              ws[p][rn + j][rk] = parts[p];
          }
        }
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 16) {
        std::uint32_t af[NX][2][4], bf[NW][4][2];
#pragma unroll
        for (int p = 0; p < NX; ++p)
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            const int r = wm + mi * 16 + g, c = kk + 2 * t;
            af[p][mi][0] = lds32(&xs[p][r][c]);
            af[p][mi][1] = lds32(&xs[p][r + 8][c]);
            af[p][mi][2] = lds32(&xs[p][r][c + 8]);
            af[p][mi][3] = lds32(&xs[p][r + 8][c + 8]);
          }
#pragma unroll
        for (int p = 0; p < NW; ++p)
#pragma unroll
          for (int ni = 0; ni < 4; ++ni) {
            const int r = wn + ni * 8 + g, c = kk + 2 * t;
            bf[p][ni][0] = lds32(&ws[p][r][c]);
            bf[p][ni][1] = lds32(&ws[p][r][c + 8]);
          }
#pragma unroll
        for (int i = 0; i < NX; ++i)
#pragma unroll
          for (int j = 0; j < NW; ++j)
            if (i + j <= 2)
#pragma unroll
              for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) mma_bf16(acc[mi][ni], af[i][mi], bf[j][ni]);
      }
      __syncthreads();
    }
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const std::int64_t m = m0 + wm + mi * 16 + g + (e >> 1) * 8, n = n0 + wn + ni * 8 + 2 * t + (e & 1);
          if (m < a.M && n < a.N) store_output(a, z, m, n, acc[mi][ni][e]);
        }
  }
}

// ---- gemv ------------------------------------------------------------------------------------

unsigned grid_limit(std::int64_t n) { return static_cast<unsigned>(std::clamp<std::int64_t>(n, 1, 65535)); }

// gridDim.x of a kernel that covers N output columns in `blocks` blocks: these kernels have no
// grid-stride loop over columns, so a grid that cannot hold them all is an error, not a silent
// truncation of the unsigned launch argument.
unsigned grid_x(std::int64_t blocks, std::int64_t N) {
  constexpr std::int64_t kMaxGridX = 2147483647;  // 2^31 - 1, CUDA's limit on gridDim.x
  require(blocks <= kMaxGridX, "matmul: N = " + std::to_string(N) + " output columns exceed the kernel's grid");
  return static_cast<unsigned>(blocks);
}

constexpr int kMaxGemvRows = 8;
constexpr int kGemvWarps = 4;

// W [N, K]: warp per column n; lanes take interleaved chunks of 8 along K, then reduce.
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_t_kernel(MatmulArgs a) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  if (n >= a.N) return;
  for (std::int64_t z = blockIdx.y; z < a.batches; z += gridDim.y) {
    const BatchPair pr = a.pairs ? a.pairs[z] : a.first;
    float acc[kMaxGemvRows] = {};
    for (std::int64_t k = lane * 8; k < a.K; k += 32 * 8) {
      float w[8];
      decode8(a.w, pr.w, n, k, false, w);
#pragma unroll
      for (int m = 0; m < kMaxGemvRows; ++m)
        if (m < a.M)
#pragma unroll
          for (int j = 0; j < 8; ++j)
            acc[m] = fmaf(load_float(a.x, (pr.x * a.M + m) * a.K + k + j, a.x_dtype), w[j], acc[m]);
    }
#pragma unroll
    for (int m = 0; m < kMaxGemvRows; ++m) {
      for (int off = 16; off > 0; off >>= 1) acc[m] += __shfl_xor_sync(0xFFFFFFFFu, acc[m], off);
      if (m < a.M && lane == m) store_output(a, z, m, n, acc[m]);
    }
  }
}

// The common case of gemv_t (fp modes, compact scales, 16-byte aligned rows of W and x): a warp per
// column n, each lane reading 16 bytes of W per step (32 fp4 or 16 fp8 values) and the matching x
// as 16-byte vectors, with the mode, x's dtype and a bound MT >= M fixed at compile time. The
// elements are decoded without their block factor (fp4 through a 16-entry table in shared memory,
// which no two lanes can hit in conflicting banks), each 16 products are summed, and the sum is
// multiplied by the factor once. x * e is exact for bf16 and f16 x (and rounds once for f32 x, as
// x * (e * factor) does), so within f32's range this is gemv_t's result up to the summation
// order, which the matmul contract leaves open; docs/cuda.md gives the range.
constexpr int kGemvVecWarps = 8;

template <DType XT>
__device__ void load_x8(const void* x, std::int64_t i, float out[8]) {
  if constexpr (XT == DType::float32) {
    const float4 a = *reinterpret_cast<const float4*>(static_cast<const float*>(x) + i);
    const float4 b = *reinterpret_cast<const float4*>(static_cast<const float*>(x) + i + 4);
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else {
    const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const std::uint16_t*>(x) + i);
    const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const auto lo = static_cast<std::uint16_t>(w[j] & 0xFFFFu), hi = static_cast<std::uint16_t>(w[j] >> 16);
      out[2 * j] = XT == DType::float16 ? decode_f16(lo) : decode_bf16(lo);
      out[2 * j + 1] = XT == DType::float16 ? decode_f16(hi) : decode_bf16(hi);
    }
  }
}

// 16 fp8 codes to floats, two at a time through the hardware's fp8x2 -> f16x2 conversion (sm_89+),
// which is exact: f16 holds every E4M3 and E5M2 value, and NaN stays NaN.
template <__nv_fp8_interpretation_t KIND>
__device__ void decode_fp8_pairs(const std::uint32_t words[4], float w[16]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const auto pair = static_cast<__nv_fp8x2_storage_t>(words[i / 2] >> (16 * (i % 2)));
    const float2 v = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, KIND)));
    w[2 * i] = v.x;
    w[2 * i + 1] = v.y;
  }
}

template <Mode MODE, DType XT, int MT>
__global__ void __launch_bounds__(kGemvVecWarps * 32) gemv_t_vec_kernel(MatmulArgs a) {
  constexpr int V = MODE == Mode::mxfp8 ? 16 : 32;  // values per 16 bytes of W
  __shared__ float e2m1[16];
  if (threadIdx.x < 16) e2m1[threadIdx.x] = decode_e2m1(threadIdx.x);
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * kGemvVecWarps + (threadIdx.x >> 5);
  if (n >= a.N) return;
  const QuantizedArgs& q = a.w;
  const std::int64_t chunks = a.K / V;
  for (std::int64_t z = blockIdx.y; z < a.batches; z += gridDim.y) {
    const BatchPair pr = a.pairs ? a.pairs[z] : a.first;
    const std::int64_t row = pr.w * q.rows + n;
    const std::uint8_t* wrow = q.packed + row * q.row_bytes;
    const std::uint8_t* srow = static_cast<const std::uint8_t*>(q.scales) + row * q.groups;
    const void* x = a.x;
    const std::int64_t x0 = pr.x * a.M * a.K;
    float acc[MT] = {};
#pragma unroll 2
    for (std::int64_t c = lane; c < chunks; c += 32) {
      const uint4 packed = *reinterpret_cast<const uint4*>(wrow + c * 16);
      const std::uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
      float w[V], f[2];  // elements; the factor of each half
      if constexpr (MODE == Mode::mxfp8) {
        f[0] = f[1] = decode_e8m0(srow[c / 2]);
        if (q.elem == Elem::e5m2)
          decode_fp8_pairs<__NV_E5M2>(words, w);
        else
          decode_fp8_pairs<__NV_E4M3>(words, w);
      } else {
        if constexpr (MODE == Mode::nvfp4) {
          f[0] = numerics::nvfp4_decode_factor(srow[2 * c], false, q.amax);
          f[1] = numerics::nvfp4_decode_factor(srow[2 * c + 1], false, q.amax);
        } else {
          f[0] = f[1] = decode_e8m0(srow[c]);
        }
        // Nibble i of a word is the table entry at byte offset (word >> (4i - 2)) & 0x3C.
        const char* table = reinterpret_cast<const char*>(e2m1);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const std::uint32_t word = words[i / 8];
          const int shift = 4 * (i % 8) - 2;
          const std::uint32_t offset = (shift < 0 ? word << 2 : word >> shift) & 0x3Cu;
          w[i] = *reinterpret_cast<const float*>(table + offset);
        }
      }
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m >= a.M) break;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float part = 0.0f;
#pragma unroll
          for (int j = 0; j < V / 2; j += 8) {
            float xv[8];
            load_x8<XT>(x, x0 + m * a.K + c * V + h * (V / 2) + j, xv);
#pragma unroll
            for (int i = 0; i < 8; ++i) part = fmaf(xv[i], w[h * (V / 2) + j + i], part);
          }
          acc[m] = fmaf(part, f[h], acc[m]);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      for (int off = 16; off > 0; off >>= 1) acc[m] += __shfl_xor_sync(0xFFFFFFFFu, acc[m], off);
      if (m < a.M && lane == m) store_output(a, z, m, n, acc[m]);
    }
  }
}

// Whether gemv_t_vec_kernel takes this product: its 16-byte loads need every row of W and x
// aligned (check_pointer saw to the first).
bool gemv_vec_fits(const MatmulArgs& a) {
  return a.w.mode != Mode::affine && !a.w.swizzled && a.w.row_bytes % 16 == 0 &&
         (a.K * static_cast<std::int64_t>(dtype_size(a.x_dtype))) % 16 == 0;
}

template <Mode MODE, DType XT>
void launch_gemv_vec(const MatmulArgs& a, dim3 grid, Stream stream) {
  constexpr int threads = kGemvVecWarps * 32;
  if (a.M <= 1)
    gemv_t_vec_kernel<MODE, XT, 1><<<grid, threads, 0, stream>>>(a);
  else if (a.M <= 2)
    gemv_t_vec_kernel<MODE, XT, 2><<<grid, threads, 0, stream>>>(a);
  else if (a.M <= 4)
    gemv_t_vec_kernel<MODE, XT, 4><<<grid, threads, 0, stream>>>(a);
  else
    gemv_t_vec_kernel<MODE, XT, kMaxGemvRows><<<grid, threads, 0, stream>>>(a);
}

template <Mode MODE>
void launch_gemv_vec_for_x(const MatmulArgs& a, dim3 grid, Stream stream) {
  if (a.x_dtype == DType::float32)
    launch_gemv_vec<MODE, DType::float32>(a, grid, stream);
  else if (a.x_dtype == DType::float16)
    launch_gemv_vec<MODE, DType::float16>(a, grid, stream);
  else
    launch_gemv_vec<MODE, DType::bfloat16>(a, grid, stream);
}

void launch_gemv_vec(const MatmulArgs& a, Stream stream) {
  const dim3 grid(grid_x((a.N + kGemvVecWarps - 1) / kGemvVecWarps, a.N), grid_limit(a.batches));
  if (a.w.mode == Mode::nvfp4)
    launch_gemv_vec_for_x<Mode::nvfp4>(a, grid, stream);
  else if (a.w.mode == Mode::mxfp4)
    launch_gemv_vec_for_x<Mode::mxfp4>(a, grid, stream);
  else
    launch_gemv_vec_for_x<Mode::mxfp8>(a, grid, stream);
}

// W [K, N]: thread per 8 columns and K slice blockIdx.y; writes partial sums for gemv_finish.
__global__ void gemv_n_kernel(MatmulArgs a) {
  const std::int64_t n = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (n >= a.N) return;
  const std::int64_t per = (a.K + a.splits - 1) / a.splits, k_begin = blockIdx.y * per;
  const std::int64_t k_end = k_begin + per < a.K ? k_begin + per : a.K;
  for (std::int64_t z = blockIdx.z; z < a.batches; z += gridDim.z) {
    const BatchPair pr = a.pairs ? a.pairs[z] : a.first;
    float acc[kMaxGemvRows][8] = {};
    for (std::int64_t k = k_begin; k < k_end; ++k) {
      float w[8];
      decode8(a.w, pr.w, k, n, false, w);
#pragma unroll
      for (int m = 0; m < kMaxGemvRows; ++m)
        if (m < a.M) {
          const float xv = load_float(a.x, (pr.x * a.M + m) * a.K + k, a.x_dtype);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[m][j] = fmaf(xv, w[j], acc[m][j]);
        }
    }
    float* out = a.partial + ((z * a.splits + blockIdx.y) * a.M) * a.N + n;
#pragma unroll
    for (int m = 0; m < kMaxGemvRows; ++m)
      if (m < a.M)
#pragma unroll
        for (int j = 0; j < 8; ++j) out[m * a.N + j] = acc[m][j];
  }
}

// Sums the K slices in order, then alpha, bias and rounding (also finishes cuBLASLt's f32 D).
__global__ void gemv_finish_kernel(MatmulArgs a) {
  const std::int64_t total = a.batches * a.M * a.N;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t z = i / (a.M * a.N), mn = i % (a.M * a.N);
    float s = 0.0f;
    for (int k = 0; k < a.splits; ++k) s += a.partial[(z * a.splits + k) * a.M * a.N + mn];
    store_output(a, z, mn / a.N, mn % a.N, s);
  }
}

void launched(const char* what) { check(cudaGetLastError(), std::string(what) + " launch"); }

void finish(MatmulArgs a, Stream stream) {
  const std::int64_t total = a.batches * a.M * a.N;
  gemv_finish_kernel<<<grid_limit((total + 255) / 256), 256, 0, stream>>>(a);
  launched("matmul epilogue");
}

template <int NX, int NW>
void launch_gemm(const MatmulArgs& a, Stream stream) {
  const std::int64_t mtiles = (a.M + kBM - 1) / kBM;
  require(mtiles <= 65535, "matmul: M = " + std::to_string(a.M) + " rows exceed the kernel's grid");
  const dim3 grid(grid_x((a.N + kBN - 1) / kBN, a.N), static_cast<unsigned>(mtiles), grid_limit(a.batches));
  gemm_kernel<NX, NW><<<grid, kGemmThreads, 0, stream>>>(a);
  launched("gemm");
}

template <int NW>
void launch_gemm_for_x(const MatmulArgs& a, Stream stream) {
  if (a.x_dtype == DType::float32)
    launch_gemm<3, NW>(a, stream);
  else if (a.x_dtype == DType::float16)
    launch_gemm<2, NW>(a, stream);
  else
    launch_gemm<1, NW>(a, stream);
}

// Runs a checked product over the (x matrix, w matrix) pairs of its output batch.
void run_matmul(MatmulArgs a, const std::vector<BatchPair>& pairs, Stream stream) {
  a.batches = static_cast<std::int64_t>(pairs.size());
  if (a.batches == 0 || a.M == 0 || a.N == 0) return;
  // One pair travels in the kernel arguments; more are uploaded (a copy from pageable memory,
  // which waits for the stream's earlier work).
  Scratch dev_pairs(pairs.size() > 1 ? pairs.size() * sizeof(BatchPair) : 0, stream);
  a.first = pairs[0];
  if (pairs.size() > 1) {
    check(cudaMemcpyAsync(dev_pairs.get(), pairs.data(), pairs.size() * sizeof(BatchPair), cudaMemcpyHostToDevice,
                          stream),
          "matmul");
    a.pairs = static_cast<const BatchPair*>(dev_pairs.get());
  }
  if (a.M > kMaxGemvRows) {
    if (a.w.mode == Mode::affine)
      launch_gemm_for_x<3>(a, stream);
    else
      launch_gemm_for_x<1>(a, stream);
  } else if (a.transpose && gemv_vec_fits(a)) {
    launch_gemv_vec(a, stream);
    launched("gemv");
  } else if (a.transpose) {
    const dim3 grid(grid_x((a.N + kGemvWarps - 1) / kGemvWarps, a.N), grid_limit(a.batches));
    gemv_t_kernel<<<grid, kGemvWarps * 32, 0, stream>>>(a);
    launched("gemv");
  } else {
    a.splits = static_cast<int>(std::clamp<std::int64_t>((a.K + 127) / 128, 1, 64));  // ~128 k per thread
    Scratch partial(static_cast<std::size_t>(a.splits * a.batches * a.M * a.N) * sizeof(float), stream);
    a.partial = static_cast<float*>(partial.get());
    const dim3 grid(grid_x((a.N / 8 + 127) / 128, a.N), static_cast<unsigned>(a.splits), grid_limit(a.batches));
    gemv_n_kernel<<<grid, 128, 0, stream>>>(a);
    launched("gemv");
    finish(a, stream);
  }
}

MatmulArgs matmul_args(const ops::MatmulPlan& p, const DeviceTensor& x, const QuantizedArgs& w, const DeviceTensor& y,
                       const DeviceTensor* bias, float alpha) {
  MatmulArgs a{};
  a.x = x.data;
  a.x_dtype = x.dtype;
  a.w = w;
  a.transpose = p.transpose;
  a.M = p.M;
  a.N = p.N;
  a.K = p.K;
  a.alpha = alpha;
  a.bias = bias ? bias->data : nullptr;
  a.bias_dtype = bias ? bias->dtype : DType::float32;
  a.y = y.data;
  a.y_dtype = y.dtype;
  a.splits = 1;
  return a;
}

// Three-level nvfp4 weights enter the kernels as two-level values; their factor is alpha.
float weight_alpha(const QuantizedArgs& q) { return q.three_level ? numerics::nvfp4_tensor_decode(q.amax) : 1.0f; }

// Checks the device side of a planned product (pointers; y, which the caller allocated, against
// the planned output) and runs it.
void run_plan(const ops::MatmulPlan& p, const DeviceTensor& x, const DeviceQuantized& w, const DeviceTensor& y,
              const DeviceTensor* bias, const std::string& op, Stream stream) {
  check_pointer(x, op + ": x");
  const QuantizedArgs q = bind_operand(p.w.q, w, p.w.rows, op);
  check_float_tensor(y, p.out_shape, op + ": output");
  if (bias) check_pointer(*bias, op + ": bias");
  run_matmul(matmul_args(p, x, q, y, bias, weight_alpha(q)), p.pairs, stream);
}

// Device indices copied to the host and read there as the host op reads its own.
std::vector<std::int64_t> read_indices(const DeviceTensor& idx, std::int64_t limit, const char* what, Stream stream) {
  const std::string op = "gather_qmm";
  check_pointer(idx, op + ": " + what);
  std::vector<unsigned char> raw(static_cast<std::size_t>(idx.numel()) * dtype_size(idx.dtype));
  if (!raw.empty()) {
    check(cudaMemcpyAsync(raw.data(), idx.data, raw.size(), cudaMemcpyDeviceToHost, stream), op);
    check(cudaStreamSynchronize(stream), op);
  }
  return microscale::detail::read_indices(TensorView(raw.data(), idx.dtype, idx.shape), limit, op.c_str(), what);
}

bool blackwell_or_newer() {
  int dev = 0, major = 0;
  check(cudaGetDevice(&dev), "qqmm");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "qqmm");
  return major >= 10;
}

}  // namespace

void qqmm_codes(const DeviceQuantized& xq, const QuantSpec& spec_x, const DeviceQuantized& wq,
                const ops::OperandPlan& w, std::int64_t M, float alpha, const DeviceTensor* bias, const DeviceTensor& y,
                Stream stream) {
  const std::int64_t N = w.rows, K = w.K;
  // Tensor cores: x's two-level values (element * block scale) are exact in bf16, and so are w's,
  // so one bf16 part each gives exact block products; alpha applies once to the f32 sum.
  QuantSpec two_level = spec_x;
  two_level.global_scale.reset();
  const ScratchTensor xd(DType::bfloat16, Shape{M, K}, stream);
  dequantize(xq, two_level, xd.view, stream);
  ops::MatmulPlan p;  // one product of xd [M, K] and w [N, K]
  p.w = {w, {}, N, K};
  p.M = M;
  p.N = N;
  p.K = K;
  p.pairs = {BatchPair{0, 0}};
  run_matmul(matmul_args(p, xd.view, bind_operand(w, wq, N, "qqmm"), y, bias, alpha), p.pairs, stream);
}

}  // namespace detail

using namespace detail;

void quantized_matmul(const DeviceTensor& x, const DeviceQuantized& w, bool transpose, const QuantSpec& spec,
                      const DeviceTensor& y, const DeviceTensor* bias, Stream stream) {
  const std::string op = "quantized_matmul";
  const OperandArgs wa = operand_args(w, spec.mode, op);
  const std::optional<ops::Arg> bias_arg = ops::optional_arg(bias);
  const ops::MatmulPlan p = ops::plan_quantized_matmul(ops::arg_of(x), wa.packed, wa.scales, ops::opt_ptr(wa.biases),
                                                       transpose, spec, ops::opt_ptr(bias_arg));
  run_plan(p, x, w, y, bias, op, stream);
}

void gather_qmm(const DeviceTensor& x, const DeviceQuantized& w, const DeviceTensor* lhs_indices,
                const DeviceTensor* rhs_indices, bool transpose, const QuantSpec& spec, const DeviceTensor& y,
                bool /*sorted_indices: every output matrix is computed independently either way*/, Stream stream) {
  if (!lhs_indices && !rhs_indices) return quantized_matmul(x, w, transpose, spec, y, nullptr, stream);
  const std::string op = "gather_qmm";
  const OperandArgs wa = operand_args(w, spec.mode, op);
  const std::optional<ops::Arg> lhs_arg = ops::optional_arg(lhs_indices), rhs_arg = ops::optional_arg(rhs_indices);
  auto read = [&](ops::Side side, std::int64_t limit, const char* what) {
    return read_indices(side == ops::Side::lhs ? *lhs_indices : *rhs_indices, limit, what, stream);
  };
  const ops::MatmulPlan p = ops::plan_gather_qmm(ops::arg_of(x), wa.packed, wa.scales, ops::opt_ptr(wa.biases),
                                                 ops::opt_ptr(lhs_arg), ops::opt_ptr(rhs_arg), transpose, spec, read);
  run_plan(p, x, w, y, nullptr, op, stream);
}

void qqmm(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor* w_scales, const QuantSpec& spec,
          std::optional<float> global_scale_x, std::optional<float> global_scale_w, const DeviceTensor& y,
          const DeviceTensor* bias, QqmmPath path, Stream stream) {
  const std::string op = "qqmm";
  if (w_scales && !is_float(w.dtype)) operand_args({w, *w_scales, {}}, spec.mode, op);  // packed w: uint8 only
  const std::optional<ops::Arg> ws = ops::optional_arg(w_scales), bias_arg = ops::optional_arg(bias);
  const ops::QqmmPlan plan = ops::plan_qqmm(ops::arg_of(x), ops::arg_of(w), ops::opt_ptr(ws), spec, global_scale_x,
                                            global_scale_w, ops::opt_ptr(bias_arg));
  const QuantSpec& sx = plan.specs.x;
  const QuantSpec& sw = plan.specs.w;
  const bool w_float = plan.w_float;
  const std::int64_t M = plan.M, N = plan.N, K = plan.K;
  check_pointer(x, op + ": x");
  if (w_float)
    check_pointer(w, op + ": w");
  else
    bind_operand(plan.w, {w, *w_scales, {}}, N, op);
  check_float_tensor(y, plan.out_shape, op + ": output");
  if (bias) check_pointer(*bias, op + ": bias");
  const float alpha = plan.specs.alpha;
  const DeviceTensor x2{x.data, x.dtype, {M, K}};

  std::deque<ScratchTensor> keep;  // scratch buffers, freed in stream order on return
  auto quantized = [&](const DeviceTensor& t, const QuantSpec& s) {
    const QuantizedShapes shapes = quantized_shapes(t.shape, t.dtype, s);
    const DeviceTensor packed = keep.emplace_back(DType::uint8, shapes.packed, stream).view;
    const DeviceQuantized q{packed, keep.emplace_back(DType::uint8, shapes.scales, stream).view, {}};
    quantize(t, s, q, stream);
    return q;
  };

  if (path != QqmmPath::tensor_core && M * N * K > 0 && blackwell_or_newer()) {
    // cuBLASLt wants both operands' scales swizzled.
    QuantSpec lx = sx, lw = sw;
    lx.layout = lw.layout = Layout::swizzled;
    const DeviceQuantized xq = quantized(x2, lx);
    DeviceQuantized wq = w_float ? quantized(w, lw) : DeviceQuantized{w, *w_scales, {}};
    if (!w_float && sw.layout == Layout::compact) {
      const std::int64_t groups = K / sw.group_size;
      wq.scales = keep.emplace_back(DType::uint8, Shape{roundup(N, 128), roundup(groups, 4)}, stream).view;
      swizzle(static_cast<const std::uint8_t*>(w_scales->data), N, groups, static_cast<std::uint8_t*>(wq.scales.data),
              stream);
    }
    const DeviceTensor d = keep.emplace_back(DType::float32, Shape{M, N}, stream).view;
    if (cublaslt_block_scaled(lx, xq.packed.data, xq.scales.data, wq.packed.data, wq.scales.data, M, N, K, alpha,
                              static_cast<float*>(d.data), stream)) {
      MatmulArgs a{};  // bias and rounding of cuBLASLt's f32 result (alpha already applied)
      a.M = M;
      a.N = N;
      a.batches = 1;
      a.splits = 1;
      a.partial = static_cast<float*>(d.data);
      a.alpha = 1.0f;
      a.bias = bias ? bias->data : nullptr;
      a.bias_dtype = bias ? bias->dtype : DType::float32;
      a.y = y.data;
      a.y_dtype = y.dtype;
      finish(a, stream);
      return;
    }
    keep.clear();
  }
  require(path != QqmmPath::cublaslt, std::string("qqmm: cuBLASLt's block-scaled GEMM is not available for ") +
                                          name(sx.mode) + " with M = " + std::to_string(M) +
                                          ", N = " + std::to_string(N) + ", K = " + std::to_string(K) +
                                          " on this device (it needs sm_100+ and a supported mode and shape)");

  const DeviceQuantized xq = quantized(x2, sx);
  const DeviceQuantized wq = w_float ? quantized(w, sw) : DeviceQuantized{w, *w_scales, {}};
  qqmm_codes(xq, sx, wq, plan.w, M, alpha, bias, y, stream);
}

}  // namespace microscale::cuda
