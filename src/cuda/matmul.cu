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
#include <cuda_runtime.h>

#include <algorithm>
#include <deque>
#include <vector>

#include "cuda/device.hpp"

namespace microscale::cuda {
namespace detail {
namespace {

struct BatchPair {
  std::int64_t x, w;  // matrix indices into x's and w's flattened batches
};

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

unsigned grid_limit(std::int64_t n) { return static_cast<unsigned>(std::clamp<std::int64_t>(n, 1, 65535)); }

// gridDim.x of a kernel that covers N output columns in `blocks` blocks: these kernels have no
// grid-stride loop over columns, so a grid that cannot hold them all is an error, not a silent
// truncation of the unsigned launch argument.
unsigned grid_x(std::int64_t blocks, std::int64_t N) {
  constexpr std::int64_t kMaxGridX = 2147483647;  // 2^31 - 1, CUDA's limit on gridDim.x
  require(blocks <= kMaxGridX, "matmul: N = " + std::to_string(N) + " output columns exceed the kernel's grid");
  return static_cast<unsigned>(blocks);
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
  } else if (a.transpose) {
    const dim3 grid(grid_x((a.N + kGemvWarps - 1) / kGemvWarps, a.N), grid_limit(a.batches));
    gemv_t_kernel<<<grid, kGemvWarps * 32, 0, stream>>>(a);
    launched("gemv");
  } else {
    a.splits = static_cast<int>(std::clamp<std::int64_t>((a.K + 127) / 128, 1, 64));  // ~128 k per thread
    Scratch partial(static_cast<std::size_t>(a.splits * a.batches * a.M * a.N) * sizeof(float), stream);
    a.partial = static_cast<float*>(partial.get());
    const dim3 grid(grid_x((a.N / 8 + 127) / 128, a.N), static_cast<unsigned>(a.splits),
                    grid_limit(a.batches));
    gemv_n_kernel<<<grid, 128, 0, stream>>>(a);
    launched("gemv");
    finish(a, stream);
  }
}

Shape leading(const Shape& s, std::size_t drop) {
  return Shape(s.begin(), s.end() - static_cast<std::ptrdiff_t>(drop));
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& what) {
  Shape out(std::max(a.size(), b.size()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::int64_t da = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    const std::int64_t db = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    require(da == db || da == 1 || db == 1, what + " " + shape_str(a) + " and " + shape_str(b) + " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// For each row-major position of `out`, the flat position in `src` that broadcasts to it.
std::vector<std::int64_t> broadcast_map(const Shape& src, const Shape& out) {
  std::vector<std::int64_t> map(static_cast<std::size_t>(numel(out)));
  const std::size_t lead = out.size() - src.size();
  for (std::size_t i = 0; i < map.size(); ++i) {
    std::int64_t rest = static_cast<std::int64_t>(i), off = 0, stride = 1;
    for (std::size_t d = out.size(); d-- > lead;) {
      const std::int64_t idx = rest % out[d];
      rest /= out[d];
      if (src[d - lead] != 1) off += idx * stride;
      stride *= src[d - lead];
    }
    map[i] = off;
  }
  return map;
}

// A checked (possibly batched) weight: stored matrices of rows x cols values.
struct Weight {
  QuantizedArgs q;
  Shape batch;
  std::int64_t rows, cols;
};

Weight check_weight(const DeviceQuantized& w, const QuantSpec& s, const std::string& op) {
  const Operand o = check_operand(w, s, op);
  require(o.shape.size() >= 2, op + ": quantized weight must have rank >= 2, got " + shape_str(o.shape));
  require(s.layout == Layout::compact || o.shape.size() == 2,
          op + ": swizzled scales are only supported for 2-D weights");
  Weight out{o.q, leading(o.shape, 2), o.shape[o.shape.size() - 2], o.shape.back()};
  out.q.rows = out.rows;
  return out;
}

MatmulArgs matmul_args(const DeviceTensor& x, const Weight& w, bool transpose, const DeviceTensor& y,
                       const DeviceTensor* bias, float alpha) {
  MatmulArgs a{};
  a.x = x.data;
  a.x_dtype = x.dtype;
  a.w = w.q;
  a.transpose = transpose;
  a.K = transpose ? w.cols : w.rows;
  a.N = transpose ? w.rows : w.cols;
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

void check_bias(const DeviceTensor* bias, std::int64_t N, const std::string& op) {
  if (bias) check_float_tensor(*bias, {N}, op + ": bias");
}

std::vector<std::int64_t> read_indices(const DeviceTensor& idx, std::int64_t limit, const char* what, Stream stream) {
  const std::string op = "gather_qmm";
  require(idx.dtype == DType::int32 || idx.dtype == DType::int64 || idx.dtype == DType::uint32,
          op + ": " + what + " must be int32, int64 or uint32, got " + dtype_name(idx.dtype));
  check_pointer(idx, op + ": " + what);
  const std::size_t n = static_cast<std::size_t>(idx.numel()), size = dtype_size(idx.dtype);
  std::vector<unsigned char> raw(n * size);
  if (n) {
    check(cudaMemcpyAsync(raw.data(), idx.data, raw.size(), cudaMemcpyDeviceToHost, stream), op);
    check(cudaStreamSynchronize(stream), op);
  }
  std::vector<std::int64_t> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (idx.dtype == DType::int32) {
      std::int32_t e;
      std::memcpy(&e, raw.data() + i * size, size);
      v[i] = e;
    } else if (idx.dtype == DType::uint32) {
      std::uint32_t e;
      std::memcpy(&e, raw.data() + i * size, size);
      v[i] = e;
    } else {
      std::memcpy(&v[i], raw.data() + i * size, size);
    }
    require(v[i] >= 0 && v[i] < limit, op + ": " + what + " value " + std::to_string(v[i]) + " at position " +
                                           std::to_string(i) + " is out of range [0, " + std::to_string(limit) + ")");
  }
  return v;
}

bool blackwell_or_newer() {
  int dev = 0, major = 0;
  check(cudaGetDevice(&dev), "qqmm");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "qqmm");
  return major >= 10;
}

}  // namespace
}  // namespace detail

using namespace detail;

void quantized_matmul(const DeviceTensor& x, const DeviceQuantized& w, bool transpose, const QuantSpec& spec,
                      const DeviceTensor& y, const DeviceTensor* bias, Stream stream) {
  const std::string op = "quantized_matmul";
  const QuantSpec s = resolve(spec);
  require(is_float(x.dtype), op + ": x must be float32, float16 or bfloat16, got " + dtype_name(x.dtype));
  require(!x.shape.empty(), op + ": x must have rank >= 1");
  check_pointer(x, op + ": x");
  const Weight wt = check_weight(w, s, op);
  MatmulArgs a = matmul_args(x, wt, transpose, y, bias, weight_alpha(wt.q));
  require(x.shape.back() == a.K, op + ": x has K = " + std::to_string(x.shape.back()) + " but the weight " +
                                     (transpose ? "[N, K] = " : "[K, N] = ") + shape_str({wt.rows, wt.cols}) +
                                     " needs K = " + std::to_string(a.K));
  const bool vector = x.shape.size() == 1;
  const Shape x_batch = vector ? Shape{} : leading(x.shape, 2);
  a.M = vector ? 1 : x.shape[x.shape.size() - 2];
  const Shape batch = broadcast_shapes(x_batch, wt.batch, op + ": batch shapes");
  Shape out_shape = batch;
  if (!vector) out_shape.push_back(a.M);
  out_shape.push_back(a.N);
  check_float_tensor(y, out_shape, op + ": output");
  check_bias(bias, a.N, op);
  const std::vector<std::int64_t> xmap = broadcast_map(x_batch, batch), wmap = broadcast_map(wt.batch, batch);
  std::vector<BatchPair> pairs(xmap.size());
  for (std::size_t i = 0; i < pairs.size(); ++i) pairs[i] = {xmap[i], wmap[i]};
  run_matmul(a, pairs, stream);
}

void gather_qmm(const DeviceTensor& x, const DeviceQuantized& w, const DeviceTensor* lhs_indices,
                const DeviceTensor* rhs_indices, bool transpose, const QuantSpec& spec, const DeviceTensor& y,
                bool /*sorted_indices: every output matrix is computed independently either way*/, Stream stream) {
  if (!lhs_indices && !rhs_indices) return quantized_matmul(x, w, transpose, spec, y, nullptr, stream);
  const std::string op = "gather_qmm";
  const QuantSpec s = resolve(spec);
  require(is_float(x.dtype), op + ": x must be float32, float16 or bfloat16, got " + dtype_name(x.dtype));
  require(x.shape.size() >= 2, op + ": x must have rank >= 2 ([..., M, K])");
  check_pointer(x, op + ": x");
  const Weight wt = check_weight(w, s, op);
  MatmulArgs a = matmul_args(x, wt, transpose, y, nullptr, weight_alpha(wt.q));
  require(x.shape.back() == a.K,
          op + ": x has K = " + std::to_string(x.shape.back()) + " but the weight needs K = " + std::to_string(a.K));
  const Shape x_batch = leading(x.shape, 2);
  a.M = x.shape[x.shape.size() - 2];
  auto indices = [&](const DeviceTensor* given, const Shape& batch, const char* what) {
    const std::int64_t limit = numel(batch);
    std::pair<std::vector<std::int64_t>, Shape> r;
    if (given) {
      r.first = read_indices(*given, limit, what, stream);
      r.second = given->shape;
    } else {
      r.first.resize(static_cast<std::size_t>(limit));
      for (std::int64_t i = 0; i < limit; ++i) r.first[static_cast<std::size_t>(i)] = i;
      r.second = batch;
    }
    return r;
  };
  const auto [lhs, lhs_shape] = indices(lhs_indices, x_batch, "lhs_indices");
  const auto [rhs, rhs_shape] = indices(rhs_indices, wt.batch, "rhs_indices");
  Shape out_shape = broadcast_shapes(lhs_shape, rhs_shape, op + ": index shapes");
  const std::vector<std::int64_t> lmap = broadcast_map(lhs_shape, out_shape),
                                  rmap = broadcast_map(rhs_shape, out_shape);
  out_shape.push_back(a.M);
  out_shape.push_back(a.N);
  check_float_tensor(y, out_shape, op + ": output");
  std::vector<BatchPair> pairs(lmap.size());
  for (std::size_t i = 0; i < pairs.size(); ++i)
    pairs[i] = {lhs[static_cast<std::size_t>(lmap[i])], rhs[static_cast<std::size_t>(rmap[i])]};
  run_matmul(a, pairs, stream);
}

void qqmm(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor* w_scales, const QuantSpec& spec,
          std::optional<float> global_scale_x, std::optional<float> global_scale_w, const DeviceTensor& y,
          const DeviceTensor* bias, QqmmPath path, Stream stream) {
  const std::string op = "qqmm";
  const QqmmSpecs specs = resolve_qqmm(spec, global_scale_x, global_scale_w);
  const QuantSpec& sx = specs.x;
  QuantSpec sw = specs.w;
  require(is_float(x.dtype), op + ": x must be float32, float16 or bfloat16, got " + dtype_name(x.dtype));
  require(!x.shape.empty(), "qqmm: x must have rank >= 1");
  require(w.shape.size() == 2, "qqmm: w must be 2-D [N, K] (packed [N, K*bits/8]), got " + shape_str(w.shape));
  check_pointer(x, op + ": x");
  const bool w_float = is_float(w.dtype);
  const std::int64_t N = w.shape[0];
  std::int64_t K = w.shape[1];
  if (w_float) {
    require(w_scales == nullptr, "qqmm: w_scales given but w is float (pass packed w with its scales)");
    check_pointer(w, op + ": w");
    sw.layout = Layout::compact;  // a float w is quantized here; the layout is this function's choice
  } else {
    require(w_scales != nullptr, "qqmm: a packed w needs its scales");
    K = check_operand({w, *w_scales, {}}, sw, op).shape.back();
  }
  require(x.shape.back() == K,
          "qqmm: x has K = " + std::to_string(x.shape.back()) + " but w has K = " + std::to_string(K));
  const std::int64_t M = numel(leading(x.shape, 1));
  Shape out_shape = x.shape;
  out_shape.back() = N;
  check_float_tensor(y, out_shape, op + ": output");
  check_bias(bias, N, op);
  const float alpha = specs.alpha;
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

  // Tensor cores: x's two-level values (element * block scale) are exact in bf16, and so are w's,
  // so one bf16 part each gives exact block products; alpha applies once to the f32 sum.
  const DeviceQuantized xq = quantized(x2, sx);
  QuantSpec two_level = sx;
  two_level.global_scale.reset();
  const DeviceTensor xd = keep.emplace_back(DType::bfloat16, Shape{M, K}, stream).view;
  dequantize(xq, two_level, xd, stream);
  const DeviceQuantized wq = w_float ? quantized(w, sw) : DeviceQuantized{w, *w_scales, {}};
  MatmulArgs a = matmul_args(xd, check_weight(wq, sw, op), true, y, bias, alpha);
  a.M = M;
  run_matmul(a, {BatchPair{0, 0}}, stream);
}

}  // namespace microscale::cuda
