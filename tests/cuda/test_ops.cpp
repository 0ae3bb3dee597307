// GPU tests of microscale_cuda: quantize / dequantize / amax byte-identical to the CPU reference
// on every case of cases.hpp, the matmuls within float32-accumulation bounds of a float64 oracle.
// Each test skips (and only skips) when cudaGetDeviceCount finds no device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>

#include "cases.hpp"
#include "microscale/cuda.hpp"

namespace {

using namespace mscuda;
namespace cuda = microscale::cuda;

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount: " << (e == cudaSuccess ? "0 devices" : cudaGetErrorName(e))
                   << "); the GPU tests of microscale_cuda need one";
  }
};

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// A device copy of a tensor (or a buffer of 0xAB bytes, so unwritten outputs show).
class Dev {
 public:
  Dev(DType dtype, Shape shape) : view_{nullptr, dtype, std::move(shape)} {
    bytes_ = static_cast<std::size_t>(view_.numel()) * microscale::dtype_size(dtype);
    if (bytes_) {
      EXPECT_EQ(cudaMalloc(&view_.data, bytes_), cudaSuccess);
      EXPECT_EQ(cudaMemset(view_.data, 0xAB, bytes_), cudaSuccess);
    }
  }
  explicit Dev(const Tensor& t) : Dev(t.dtype(), t.shape()) {
    if (bytes_) {
      EXPECT_EQ(cudaMemcpy(view_.data, t.bytes(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~Dev() {
    if (view_.data) cudaFree(view_.data);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  const cuda::DeviceTensor& view() const { return view_; }
  Tensor download() const {
    Tensor t(view_.dtype, view_.shape);
    if (bytes_) {
      EXPECT_EQ(cudaMemcpy(t.bytes(), view_.data, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return t;
  }

 private:
  cuda::DeviceTensor view_;
  std::size_t bytes_ = 0;
};

// Device buffers for quantize's outputs (biases for affine only).
struct DevQuantized {
  Dev packed, scales;
  std::unique_ptr<Dev> biases;
  DevQuantized(const Shape& x, DType dtype, const QuantSpec& spec)
      : DevQuantized(cuda::quantized_shapes(x, dtype, spec), spec.mode == Mode::affine) {}
  DevQuantized(const cuda::QuantizedShapes& s, bool affine)
      : packed(DType::uint8, s.packed),
        scales(s.scale_dtype, s.scales),
        biases(affine ? std::make_unique<Dev>(s.scale_dtype, s.biases) : nullptr) {}
  explicit DevQuantized(const microscale::Quantized& q)
      : packed(q.packed),
        scales(q.scales),
        biases(q.spec.mode == Mode::affine ? std::make_unique<Dev>(q.biases) : nullptr) {}
  cuda::DeviceQuantized view() const {
    return {packed.view(), scales.view(), biases ? biases->view() : cuda::DeviceTensor{}};
  }
};

TEST_F(Gpu, AvailableMatchesTheDevice) {
  cudaDeviceProp p{};
  CUDA_OK(cudaGetDeviceProperties(&p, 0));
  const bool built_for = (p.major == 9 && p.minor == 0) || (p.major == 10 && p.minor == 0);
  EXPECT_EQ(cuda::available(), built_for) << "sm_" << p.major << p.minor;
}

TEST_F(Gpu, QuantizeMatchesReferenceOnEveryCase) {
  std::uint64_t seed = 1000;
  for (const Case& c : cases())
    for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
      std::vector<Shape> all = shapes();
      if (c.big) all.push_back(kBigShape);
      for (const Shape& shape : all) {
        if (!fits(c, shape)) continue;
        const Tensor x = input(shape, dtype, seed++);
        const QuantSpec spec = spec_for(c, x);
        const std::string what = c.name + " " + microscale::dtype_name(dtype) + " " + microscale::shape_str(shape);
        microscale::Quantized want;
        {
          const ReferenceBackend ref;
          want = microscale::quantize(x.view(), spec);
        }
        const Dev dx(x);
        const DevQuantized out(shape, dtype, spec);
        ASSERT_NO_THROW(cuda::quantize(dx.view(), spec, out.view())) << what;
        CUDA_OK(cudaDeviceSynchronize());
        const Tensor packed = out.packed.download(), scales = out.scales.download();
        ASSERT_EQ(packed.nbytes(), want.packed.nbytes()) << what;
        ASSERT_EQ(scales.nbytes(), want.scales.nbytes()) << what;
        expect_bytes(packed.bytes(), want.packed.bytes(), packed.nbytes(), what + " packed");
        expect_bytes(scales.bytes(), want.scales.bytes(), scales.nbytes(), what + " scales");
        if (spec.mode == Mode::affine) {
          const Tensor biases = out.biases->download();
          expect_bytes(biases.bytes(), want.biases.bytes(), biases.nbytes(), what + " biases");
        }

        const DevQuantized q(want);
        for (DType o : {DType::float32, DType::float16, DType::bfloat16}) {
          Tensor y_want;
          {
            const ReferenceBackend ref;
            y_want = microscale::dequantize(want, o);
          }
          const Dev y(o, shape);
          ASSERT_NO_THROW(cuda::dequantize(q.view(), want.spec, y.view())) << what;
          const Tensor y_got = y.download();
          expect_floats(y_got.bytes(), y_want.bytes(), static_cast<std::size_t>(y_got.numel()), o,
                        what + " dequantize to " + microscale::dtype_name(o));
        }
        if (HasFailure()) return;
      }
    }
}

TEST_F(Gpu, Nvfp4TieVectors) {
  for (const auto& [x, s] : nvfp4_tie_vectors()) {
    const ReferenceBackend ref;
    const microscale::Quantized want = microscale::quantize(x.view(), s);
    const Dev dx(x);
    const DevQuantized out(x.shape(), x.dtype(), s);
    cuda::quantize(dx.view(), s, out.view());
    const Tensor packed = out.packed.download(), scales = out.scales.download();
    expect_bytes(scales.bytes(), want.scales.bytes(), 1, "tie scale");
    expect_bytes(packed.bytes(), want.packed.bytes(), 8, "tie codes");
  }
}

TEST_F(Gpu, AmaxMatchesGlobalScale) {
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16})
    for (const Shape& shape : {Shape{1}, Shape{3, 48}, Shape{129, 4096}, Shape{1000003}}) {
      const Tensor x = input(shape, dtype, 77);
      const Dev dx(x);
      EXPECT_EQ(cuda::amax(dx.view()), microscale::global_scale(x.view())) << microscale::shape_str(shape);
    }
  const Tensor nan = to_tensor({NAN, -INFINITY, INFINITY}, DType::float32, {3});
  const Dev dn(nan);
  EXPECT_EQ(cuda::amax(dn.view()), 0.0f);
  const Dev empty(DType::float32, {0, 16});
  EXPECT_EQ(cuda::amax(empty.view()), 0.0f);
}

TEST_F(Gpu, NonfiniteErrorNamesTheFirstElement) {
  std::vector<float> v(2 * 3 * 32, 1.0f);
  v[100] = -INFINITY;
  v[150] = NAN;
  const Tensor x = to_tensor(v, DType::float32, {2, 3, 32});
  QuantSpec s;
  s.mode = Mode::mxfp8;
  s.nonfinite = NonFinite::error;
  const Dev dx(x);
  const DevQuantized out(x.shape(), x.dtype(), s);
  std::string cpu, gpu;
  try {
    microscale::quantize(x.view(), s);
  } catch (const microscale::Error& e) {
    cpu = e.what();
  }
  try {
    cuda::quantize(dx.view(), s, out.view());
  } catch (const microscale::Error& e) {
    gpu = e.what();
  }
  EXPECT_NE(gpu.find("flat index 100"), std::string::npos) << gpu;
  EXPECT_EQ(gpu, cpu);
}

TEST_F(Gpu, EmptyTensorsWriteNothing) {
  for (const Shape& shape : {Shape{0, 32}, Shape{4, 0}, Shape{0}}) {
    QuantSpec s;
    s.mode = Mode::mxfp4;
    const Dev x(DType::float32, shape);
    const DevQuantized q(shape, DType::float32, s);
    EXPECT_NO_THROW(cuda::quantize(x.view(), s, q.view()));
    EXPECT_NO_THROW(cuda::dequantize(q.view(), s, x.view()));
  }
}

TEST_F(Gpu, RejectsBadArguments) {
  QuantSpec s;
  const Dev x(DType::float32, {2, 48});
  const DevQuantized q({2, 32}, DType::float32, s);
  EXPECT_THROW(cuda::quantize(x.view(), s, q.view()), microscale::Error);  // outputs sized for another shape
  const Dev bad(DType::float32, {2, 40});
  EXPECT_THROW(cuda::quantized_shapes(bad.view().shape, DType::float32, s), microscale::Error);  // 40 % 16
}

// ---- matmuls ----------------------------------------------------------------------------------

// Finite test data: normal values over a few binades, some exact zeros.
Tensor matmul_input(const Shape& shape, DType dtype, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 99), binade(-4, 4);
  std::vector<float> v(static_cast<std::size_t>(microscale::numel(shape)));
  for (float& f : v) f = pick(rng) < 5 ? 0.0f : normal(rng) * std::ldexp(1.0f, binade(rng));
  return to_tensor(v, dtype, shape);
}

std::vector<float> as_f32(const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = load(t.bytes(), i, t.dtype());
  return v;
}

// Half an ulp of dtype t, relative; and its smallest subnormal.
double unit(DType t) { return t == DType::float32 ? 0x1p-24 : t == DType::float16 ? 0x1p-11 : 0x1p-8; }
double tiny(DType t) { return t == DType::float32 ? 0x1p-149 : t == DType::float16 ? 0x1p-24 : 0x1p-133; }

// got[b, m, n] against sum_k x[xb, m, k] * w(wb, k, n) * alpha + bias[n] in float64, where w(wb,
// k, n) reads the dequantized weight (stored [N, K] when transpose). The bound is float32
// accumulation of K products plus the final rounding to got's dtype.
void expect_matmul(const Tensor& got, const std::vector<float>& x, const std::vector<float>& w,
                   const std::vector<std::pair<std::int64_t, std::int64_t>>& pairs, std::int64_t M, std::int64_t N,
                   std::int64_t K, bool transpose, double alpha, const std::vector<float>& bias,
                   const std::string& what) {
  const std::vector<float> y = as_f32(got);
  ASSERT_EQ(y.size(), pairs.size() * static_cast<std::size_t>(M * N)) << what;
  for (std::size_t b = 0; b < pairs.size(); ++b)
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < N; ++n) {
        double sum = 0, mag = 0;
        for (std::int64_t k = 0; k < K; ++k) {
          const double xv = x[static_cast<std::size_t>((pairs[b].first * M + m) * K + k)];
          const double wv = w[static_cast<std::size_t>(pairs[b].second * K * N + (transpose ? n * K + k : k * N + n))];
          sum += xv * wv;
          mag += std::fabs(xv * wv);
        }
        const double want = sum * alpha + (bias.empty() ? 0.0 : bias[static_cast<std::size_t>(n)]);
        const double err = (static_cast<double>(K) + 2) * 0x1p-23 * mag * std::fabs(alpha);
        const double bound = err + unit(got.dtype()) * (std::fabs(want) + err) + tiny(got.dtype());
        const double g = y[static_cast<std::size_t>((static_cast<std::int64_t>(b) * M + m) * N + n)];
        if (!(std::fabs(g - want) <= bound)) {
          ADD_FAILURE() << what << ": y[" << b << ", " << m << ", " << n << "] = " << g << ", want " << want << " +- "
                        << bound;
          return;
        }
      }
}

struct WeightCase {
  std::string name;
  QuantSpec spec;
  bool global = false;  // nvfp4 three-level
};

std::vector<WeightCase> weight_cases() {
  std::vector<WeightCase> out;
  QuantSpec s;
  out.push_back({"nvfp4", s});
  out.push_back({"nvfp4 3-level", s, true});
  s.layout = Layout::swizzled;
  out.push_back({"nvfp4 swizzled", s});
  s = {};
  s.mode = Mode::mxfp4;
  out.push_back({"mxfp4", s});
  s.mode = Mode::mxfp8;
  out.push_back({"mxfp8 e4m3", s});
  s.elem = Elem::e5m2;
  s.scale_rule = ScaleRule::floor;
  out.push_back({"mxfp8 e5m2 floor", s});
  for (auto [gs, bits] : {std::pair{32, 3}, std::pair{64, 4}, std::pair{128, 8}}) {
    s = {};
    s.mode = Mode::affine;
    s.group_size = gs;
    s.bits = bits;
    out.push_back({"affine g" + std::to_string(gs) + " b" + std::to_string(bits), s});
  }
  return out;
}

// A quantized weight of logical shape `shape` and its CPU-dequantized float32 values.
struct QuantWeight {
  microscale::Quantized q;
  std::vector<float> values;
};
QuantWeight quantized_weight(const WeightCase& c, const Shape& shape, std::uint64_t seed) {
  const Tensor w = matmul_input(shape, DType::float32, seed);
  QuantSpec s = c.spec;
  if (c.global) s.global_scale = microscale::global_scale(w.view());
  const ReferenceBackend ref;
  QuantWeight out{microscale::quantize(w.view(), s), {}};
  out.values = as_f32(microscale::dequantize(out.q, DType::float32));
  return out;
}

TEST_F(Gpu, QuantizedMatmulWithinFloat32Bounds) {
  struct Dims {
    std::int64_t M, N, K;
  };
  // GEMV (M <= 8) and GEMM (edges in every dimension, several K tiles); K = 100 only for W [K, N].
  // K = 48: nvfp4 rows of 24 bytes, which the GEMV's 16-byte path leaves to the general kernel.
  const Dims dims[] = {{1, 64, 256},   {3, 96, 128},   {8, 128, 64},   {9, 64, 128},     {64, 128, 256},
                       {130, 96, 384}, {33, 128, 100}, {2, 256, 4096}, {100, 256, 4096}, {2, 64, 48}};
  std::uint64_t seed = 5000;
  for (const WeightCase& c : weight_cases())
    for (bool transpose : {true, false})
      for (const Dims& d : dims) {
        const int gs = microscale::resolve(c.spec).group_size;
        const std::int64_t rows = transpose ? d.N : d.K, cols = transpose ? d.K : d.N;
        if (cols % gs) continue;
        if (c.spec.layout == Layout::swizzled && !transpose) continue;
        const QuantWeight w = quantized_weight(c, {rows, cols}, seed++);
        const DevQuantized dw(w.q);
        for (DType xt : {DType::float32, DType::float16, DType::bfloat16}) {
          const Tensor x = matmul_input({d.M, d.K}, xt, seed++);
          const Dev dx(x), y(xt, {d.M, d.N});
          const std::string what = c.name + (transpose ? " W[N,K] " : " W[K,N] ") + microscale::dtype_name(xt) +
                                   " M=" + std::to_string(d.M) + " N=" + std::to_string(d.N) +
                                   " K=" + std::to_string(d.K);
          ASSERT_NO_THROW(cuda::quantized_matmul(dx.view(), dw.view(), transpose, w.q.spec, y.view())) << what;
          expect_matmul(y.download(), as_f32(x), w.values, {{0, 0}}, d.M, d.N, d.K, transpose, 1.0, {}, what);
          if (HasFailure()) return;
        }
      }
}

TEST_F(Gpu, QuantizedMatmulBatchesBiasAndVectors) {
  WeightCase c{"mxfp4", {}};
  c.spec.mode = Mode::mxfp4;
  const std::int64_t M = 12, N = 64, K = 128;
  const QuantWeight w = quantized_weight(c, {3, N, K}, 11);
  const DevQuantized dw(w.q);
  // x [2, 1, M, K] against w [3, N, K]: batch [2, 3].
  const Tensor x = matmul_input({2, 1, M, K}, DType::float32, 12);
  const Tensor bias = matmul_input({N}, DType::bfloat16, 13);
  const Dev dx(x), db(bias), y(DType::float32, {2, 3, M, N});
  cuda::quantized_matmul(dx.view(), dw.view(), true, w.q.spec, y.view(), &db.view());
  expect_matmul(y.download(), as_f32(x), w.values, {{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {1, 2}}, M, N, K, true, 1.0,
                as_f32(bias), "broadcast batch with bias");
  // Rank-1 x: one row, result [3, N].
  const Tensor v = matmul_input({K}, DType::bfloat16, 14);
  const Dev dv(v), yv(DType::bfloat16, {3, N});
  cuda::quantized_matmul(dv.view(), dw.view(), true, w.q.spec, yv.view());
  expect_matmul(yv.download(), as_f32(v), w.values, {{0, 0}, {0, 1}, {0, 2}}, 1, N, K, true, 1.0, {}, "vector x");
  // Wrong output shape.
  const Dev wrong(DType::float32, {2, 3, M, N + 1});
  EXPECT_THROW(cuda::quantized_matmul(dx.view(), dw.view(), true, w.q.spec, wrong.view()), microscale::Error);
}

TEST_F(Gpu, GatherQmmPicksMatrices) {
  WeightCase c{"affine", {}};
  c.spec.mode = Mode::affine;
  for (std::int64_t M : {std::int64_t{2}, std::int64_t{20}}) {
    const std::int64_t N = 64, K = 128;
    const QuantWeight w = quantized_weight(c, {4, N, K}, 21);
    const DevQuantized dw(w.q);
    const Tensor x = matmul_input({5, M, K}, DType::float16, 22);
    Tensor lhs(DType::int32, {6}), rhs(DType::int64, {6});
    const int l[] = {4, 0, 0, 2, 3, 1};
    const std::int64_t r[] = {3, 3, 0, 1, 2, 0};
    std::vector<std::pair<std::int64_t, std::int64_t>> pairs;
    for (int i = 0; i < 6; ++i) {
      lhs.data<std::int32_t>()[i] = l[i];
      rhs.data<std::int64_t>()[i] = r[i];
      pairs.emplace_back(l[i], r[i]);
    }
    const Dev dx(x), dl(lhs), dr(rhs), y(DType::float16, {6, M, N});
    cuda::gather_qmm(dx.view(), dw.view(), &dl.view(), &dr.view(), true, w.q.spec, y.view());
    expect_matmul(y.download(), as_f32(x), w.values, pairs, M, N, K, true, 1.0, {}, "gather_qmm");
    Tensor bad(DType::uint32, {1});
    bad.data<std::uint32_t>()[0] = 4;
    const Dev dbad(bad), y1(DType::float16, {1, M, N});
    EXPECT_THROW(cuda::gather_qmm(dx.view(), dw.view(), nullptr, &dbad.view(), true, w.q.spec, y1.view()),
                 microscale::Error);
  }
}

bool blackwell() {
  cudaDeviceProp p{};
  return cudaGetDeviceProperties(&p, 0) == cudaSuccess && p.major >= 10;
}

TEST_F(Gpu, QqmmWithinFloat32Bounds) {
  struct Mode3 {
    std::string name;
    QuantSpec spec;
    bool global;
  };
  std::vector<Mode3> modes;
  QuantSpec s;
  modes.push_back({"nvfp4", s, false});
  modes.push_back({"nvfp4 3-level", s, true});
  s.mode = Mode::mxfp4;
  modes.push_back({"mxfp4", s, false});
  s.mode = Mode::mxfp8;
  modes.push_back({"mxfp8", s, false});
  s.elem = Elem::e5m2;
  modes.push_back({"mxfp8 e5m2", s, false});
  const std::int64_t N = 128, K = 256;
  std::uint64_t seed = 9000;
  for (const Mode3& m : modes)
    for (std::int64_t M : {std::int64_t{1}, std::int64_t{8}, std::int64_t{9}, std::int64_t{130}})
      for (DType xt : {DType::float32, DType::bfloat16})
        for (int w_form = 0; w_form < 3; ++w_form)  // float, packed compact, packed swizzled
          for (cuda::QqmmPath path :
               {cuda::QqmmPath::automatic, cuda::QqmmPath::tensor_core, cuda::QqmmPath::cublaslt}) {
            const Tensor x = matmul_input({M, K}, xt, seed++), w = matmul_input({N, K}, DType::float32, seed++);
            std::optional<float> gx, gw;
            if (m.global) {
              gx = microscale::global_scale(x.view());
              gw = microscale::global_scale(w.view());
            }
            QuantSpec sx = m.spec, sw = m.spec;
            sx.global_scale = gx;
            sw.global_scale = gw;
            sw.layout = w_form == 2 ? Layout::swizzled : Layout::compact;
            microscale::Quantized qx, qw;
            {
              const ReferenceBackend ref;
              qx = microscale::quantize(x.view(), sx);
              qw = microscale::quantize(w.view(), sw);
            }
            // Oracle operands: the two-level values (element * block scale); alpha carries the rest.
            QuantSpec two_x = sx, two_w = sw;
            two_x.global_scale.reset();
            two_w.global_scale.reset();
            const std::vector<float> xv =
                as_f32(microscale::dequantize(qx.packed.view(), qx.scales.view(), nullptr, two_x, DType::float32));
            const std::vector<float> wv =
                as_f32(microscale::dequantize(qw.packed.view(), qw.scales.view(), nullptr, two_w, DType::float32));
            const double alpha = m.global ? double{*gx} * double{*gw} / (2688.0 * 2688.0) : 1.0;

            QuantSpec spec = m.spec;
            spec.layout = sw.layout;
            const Dev dx(x), y(xt, {M, N}), dwf(w), dwp(qw.packed), dws(qw.scales);
            const std::string what = m.name + " M=" + std::to_string(M) + " " + microscale::dtype_name(xt) +
                                     " w form " + std::to_string(w_form) + " path " +
                                     std::to_string(static_cast<int>(path));
            auto run = [&] {
              if (w_form == 0) {
                cuda::qqmm(dx.view(), dwf.view(), nullptr, m.spec, gx, gw, y.view(), nullptr, path);
              } else {
                cuda::qqmm(dx.view(), dwp.view(), &dws.view(), spec, gx, gw, y.view(), nullptr, path);
              }
            };
            if (path == cuda::QqmmPath::cublaslt && !blackwell()) {
              EXPECT_THROW(run(), microscale::Error) << what;
              continue;
            }
            bool lt_unsupported = false;
            try {
              run();
            } catch (const microscale::Error& e) {
              // Forced cuBLASLt may still lack a mode (e.g. E5M2 x E5M2); that is a clean error.
              lt_unsupported =
                  path == cuda::QqmmPath::cublaslt && std::string(e.what()).find("not available") != std::string::npos;
              if (!lt_unsupported) ADD_FAILURE() << what << ": " << e.what();
            }
            if (lt_unsupported) continue;
            expect_matmul(y.download(), xv, wv, {{0, 0}}, M, N, K, true, alpha, {}, what);
            if (HasFailure()) return;
          }
}

// ---- the host API under Backend::cuda ---------------------------------------------------------

using microscale::TensorView;

struct CudaBackend {
  microscale::Backend saved = microscale::backend();
  CudaBackend() { microscale::set_backend(microscale::Backend::cuda); }
  ~CudaBackend() { microscale::set_backend(saved); }
};
struct CpuBackend {
  microscale::Backend saved = microscale::backend();
  CpuBackend() { microscale::set_backend(microscale::Backend::cpu); }
  ~CpuBackend() { microscale::set_backend(saved); }
};

// A host view of device memory, as a caller with its own device tensors makes one.
TensorView device_view(const Dev& d) { return TensorView(d.view().data, d.view().dtype, d.view().shape); }

void expect_same_quantized(const microscale::Quantized& got, const microscale::Quantized& want,
                           const std::string& what) {
  ASSERT_EQ(got.packed.nbytes(), want.packed.nbytes()) << what;
  ASSERT_EQ(got.scales.nbytes(), want.scales.nbytes()) << what;
  ASSERT_EQ(got.biases.nbytes(), want.biases.nbytes()) << what;
  expect_bytes(got.packed.bytes(), want.packed.bytes(), got.packed.nbytes(), what + " packed");
  expect_bytes(got.scales.bytes(), want.scales.bytes(), got.scales.nbytes(), what + " scales");
  expect_bytes(got.biases.bytes(), want.biases.bytes(), got.biases.nbytes(), what + " biases");
}

// set_backend(cuda) with host tensors: the same bytes as the reference for quantize (every mode,
// rule, policy, layout and dtype), dequantize and global_scale.
TEST_F(Gpu, HostApiUnderCudaMatchesReference) {
  std::uint64_t seed = 20000;
  for (const Case& c : cases())
    for (DType dtype : {DType::float32, DType::float16, DType::bfloat16})
      for (const Shape& shape : shapes()) {
        if (!fits(c, shape)) continue;
        const Tensor x = input(shape, dtype, seed++);
        const QuantSpec spec = spec_for(c, x);
        const std::string what = c.name + " " + microscale::dtype_name(dtype) + " " + microscale::shape_str(shape);
        microscale::Quantized want, got;
        float amax_want = 0.0f, amax_got = 0.0f;
        {
          const ReferenceBackend ref;
          want = microscale::quantize(x.view(), spec);
          amax_want = microscale::global_scale(x.view());
        }
        {
          const CudaBackend gpu;
          ASSERT_NO_THROW(got = microscale::quantize(x.view(), spec)) << what;
          amax_got = microscale::global_scale(x.view());
        }
        expect_same_quantized(got, want, what);
        EXPECT_EQ(amax_got, amax_want) << what;
        for (DType o : {DType::float32, DType::float16, DType::bfloat16}) {
          Tensor y_want, y_got;
          {
            const ReferenceBackend ref;
            y_want = microscale::dequantize(want, o);
          }
          {
            const CudaBackend gpu;
            y_got = microscale::dequantize(want, o);
          }
          expect_floats(y_got.bytes(), y_want.bytes(), static_cast<std::size_t>(y_got.numel()), o,
                        what + " dequantize to " + microscale::dtype_name(o));
        }
        if (HasFailure()) return;
      }
}

TEST_F(Gpu, HostApiUnderCudaNamesTheFirstNonfinite) {
  std::vector<float> v(2 * 3 * 32, 1.0f);
  v[100] = -INFINITY;
  v[150] = NAN;
  const Tensor x = to_tensor(v, DType::float32, {2, 3, 32});
  QuantSpec s;
  s.mode = Mode::mxfp8;
  s.nonfinite = NonFinite::error;
  std::string cpu, gpu;
  try {
    microscale::quantize(x.view(), s);
  } catch (const microscale::Error& e) {
    cpu = e.what();
  }
  try {
    const CudaBackend on;
    microscale::quantize(x.view(), s);
  } catch (const microscale::Error& e) {
    gpu = e.what();
  }
  EXPECT_NE(gpu.find("flat index 100"), std::string::npos) << gpu;
  EXPECT_EQ(gpu, cpu);
}

// With the setting left at cpu, an operand in device memory runs the op on the device (the CPU
// kernels could not read it): the same bytes as the reference, results in host tensors.
TEST_F(Gpu, DeviceResidentOperandsSelectCuda) {
  const CpuBackend setting;
  std::uint64_t seed = 30000;
  for (const Case& c : cases()) {
    const Shape shape{3, 256};
    if (!fits(c, shape)) continue;
    const Tensor x = input(shape, DType::bfloat16, seed++);
    const QuantSpec spec = spec_for(c, x);
    const microscale::Quantized want = [&] {
      const ReferenceBackend ref;
      return microscale::quantize(x.view(), spec);
    }();
    const Dev dx(x);
    expect_same_quantized(microscale::quantize(device_view(dx), spec), want, c.name + " device x");
    EXPECT_EQ(microscale::global_scale(device_view(dx)), microscale::global_scale(x.view())) << c.name;
    const DevQuantized dq(want);  // swizzled scales too: the op unswizzles a host copy
    const TensorView biases = dq.biases ? device_view(*dq.biases) : TensorView();
    const Tensor y = microscale::dequantize(device_view(dq.packed), device_view(dq.scales),
                                            dq.biases ? &biases : nullptr, want.spec, DType::float32);
    const Tensor y_want = [&] {
      const ReferenceBackend ref;
      return microscale::dequantize(want, DType::float32);
    }();
    expect_floats(y.bytes(), y_want.bytes(), static_cast<std::size_t>(y.numel()), DType::float32,
                  c.name + " device operand dequantize");
    if (HasFailure()) return;
  }
  // A strided view cannot be gathered on the host from device memory: a clear error.
  const Tensor x = input({4, 64}, DType::float32, 1);
  const Dev dx(x);
  const TensorView strided(dx.view().data, DType::float32, {2, 64}, {128, 1});
  try {
    microscale::quantize(strided, QuantSpec{});
    ADD_FAILURE() << "a strided device view was accepted";
  } catch (const microscale::Error& e) {
    EXPECT_NE(std::string(e.what()).find("quantize: an operand in device memory is a strided view"), std::string::npos)
        << e.what();
  }
}

// The host matmuls under Backend::cuda (host operands) and with device-resident weights (setting
// cpu), within the float32 bounds of the float64 oracle.
TEST_F(Gpu, HostApiMatmulsUnderCuda) {
  std::uint64_t seed = 40000;
  // N: W [K, N] is quantized along N, so N is a multiple of every case's group (up to 128).
  const std::int64_t M = 9, N = 384, K = 256;
  for (const WeightCase& c : weight_cases())
    for (bool transpose : {true, false}) {
      if (c.spec.layout == Layout::swizzled && !transpose) continue;
      const QuantWeight w = quantized_weight(c, transpose ? Shape{N, K} : Shape{K, N}, seed++);
      const Tensor x = matmul_input({2, M, K}, DType::bfloat16, seed++);
      const Tensor bias = matmul_input({N}, DType::float32, seed++);
      const std::string what = c.name + (transpose ? " W[N,K]" : " W[K,N]");
      {
        const CudaBackend on;
        const TensorView bias_view = bias.view();
        const Tensor y = microscale::quantized_matmul(x.view(), w.q, transpose, &bias_view);
        expect_matmul(y, as_f32(x), w.values, {{0, 0}, {1, 0}}, M, N, K, transpose, 1.0, as_f32(bias),
                      what + " host operands");
      }
      const DevQuantized dw(w.q);
      const TensorView biases = dw.biases ? device_view(*dw.biases) : TensorView();
      const Tensor y = microscale::quantized_matmul(x.view(), device_view(dw.packed), device_view(dw.scales),
                                                    dw.biases ? &biases : nullptr, transpose, w.q.spec);
      expect_matmul(y, as_f32(x), w.values, {{0, 0}, {1, 0}}, M, N, K, transpose, 1.0, {}, what + " device weights");
      if (HasFailure()) return;
    }

  // gather_qmm with host indices, and qqmm on host operands.
  WeightCase c{"affine", {}};
  c.spec.mode = Mode::affine;
  const QuantWeight w = quantized_weight(c, {4, N, K}, seed++);
  const Tensor x = matmul_input({5, M, K}, DType::float16, seed++);
  Tensor lhs(DType::int32, {3}), rhs(DType::int64, {3});
  const int l[] = {4, 0, 2};
  const std::int64_t r[] = {3, 3, 0};
  for (int i = 0; i < 3; ++i) {
    lhs.data<std::int32_t>()[i] = l[i];
    rhs.data<std::int64_t>()[i] = r[i];
  }
  {
    const CudaBackend on;
    const TensorView biases = w.q.biases.view(), lhs_view = lhs.view(), rhs_view = rhs.view();
    const Tensor y = microscale::gather_qmm(x.view(), w.q.packed.view(), w.q.scales.view(), &biases, &lhs_view,
                                            &rhs_view, true, w.q.spec);
    expect_matmul(y, as_f32(x), w.values, {{4, 3}, {0, 3}, {2, 0}}, M, N, K, true, 1.0, {}, "gather_qmm");
  }
  for (bool global : {false, true}) {
    const Tensor xq = matmul_input({M, K}, DType::float32, seed++), wf = matmul_input({N, K}, DType::float32, seed++);
    std::optional<float> gx, gw;
    if (global) {
      gx = microscale::global_scale(xq.view());
      gw = microscale::global_scale(wf.view());
    }
    QuantSpec two_level;  // nvfp4: the oracle's operands are the two-level values; alpha the rest
    QuantSpec sx = two_level, sw = two_level;
    sx.global_scale = gx;
    sw.global_scale = gw;
    std::vector<float> xv, wv;
    {
      const ReferenceBackend ref;
      const microscale::Quantized qx = microscale::quantize(xq.view(), sx), qw = microscale::quantize(wf.view(), sw);
      xv = as_f32(microscale::dequantize(qx.packed.view(), qx.scales.view(), nullptr, two_level, DType::float32));
      wv = as_f32(microscale::dequantize(qw.packed.view(), qw.scales.view(), nullptr, two_level, DType::float32));
    }
    const double alpha = global ? double{*gx} * double{*gw} / (2688.0 * 2688.0) : 1.0;
    const Tensor bias = matmul_input({N}, DType::float32, seed++);
    const CudaBackend on;
    const TensorView bias_view = bias.view();
    const Tensor y = microscale::qqmm(xq.view(), wf.view(), nullptr, two_level, gx, gw, &bias_view);
    expect_matmul(y, xv, wv, {{0, 0}}, M, N, K, true, alpha, as_f32(bias), global ? "qqmm 3-level" : "qqmm");
  }
}

}  // namespace
