// qqmm through cuBLASLt's block-scaled GEMM (sm_100+): NVFP4 as E2M1 with VEC16_UE4M3 scales,
// MXFP4 as E2M1 and MXFP8 as E4M3/E5M2 with VEC32_UE8M0 scales, both operands' scales in the
// swizzled layout of FORMATS.md 4 (zero padding included). cuBLASLt is column-major and its
// narrow-precision GEMMs are "TN", so the row-major product y[M, N] = x[M, K] @ w[N, K]^T is
// computed as D[N, M] (column-major, which is y row-major) = op_T(A = w as K x N) * (B = x as K x M),
// with each operand's scale rows running over its non-K dimension. cuBLASLt applies alpha to its
// f32 accumulator; which combinations run is decided by its heuristic at run time.
#include <cublasLt.h>

#include <cstdint>

#include "cuda/device.hpp"

namespace microscale::cuda::detail {
namespace {

// One GEMM's cuBLASLt objects, destroyed in reverse order of creation.
struct LtObjects {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtObjects() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (handle) cublasLtDestroy(handle);
  }
};

void check_lt(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("microscale::cuda qqmm: cuBLASLt ") + what + ": " + cublasLtGetStatusString(st));
}

template <class T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  check_lt(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof value), "matmul descriptor");
}

constexpr std::uint64_t kWorkspaceBytes = 32u << 20;

}  // namespace

bool cublaslt_block_scaled(const QuantSpec& spec, const void* x_packed, const void* x_scales, const void* w_packed,
                           const void* w_scales, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, float* y,
                           Stream stream) {
  const cudaDataType_t elem = spec.mode != Mode::mxfp8  ? CUDA_R_4F_E2M1
                              : spec.elem == Elem::e5m2 ? CUDA_R_8F_E5M2
                                                        : CUDA_R_8F_E4M3;
  const std::int32_t scale_mode =
      spec.mode == Mode::nvfp4 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 : CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
  LtObjects lt;
  check_lt(cublasLtCreate(&lt.handle), "create");
  check_lt(cublasLtMatmulDescCreate(&lt.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
  set(lt.desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set(lt.desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set(lt.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, scale_mode);
  set(lt.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, scale_mode);
  set(lt.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scales);
  set(lt.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x_scales);
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  check_lt(cublasLtMatrixLayoutCreate(&lt.a, elem, u(K), u(N), K), "layout of w");
  check_lt(cublasLtMatrixLayoutCreate(&lt.b, elem, u(K), u(M), K), "layout of x");
  check_lt(cublasLtMatrixLayoutCreate(&lt.d, CUDA_R_32F, u(N), u(M), N), "layout of y");
  check_lt(cublasLtMatmulPreferenceCreate(&lt.pref), "preference");
  check_lt(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspaceBytes,
                                                sizeof kWorkspaceBytes),
           "preference");
  cublasLtMatmulHeuristicResult_t algo{};
  int found = 0;
  // C shares D's layout (beta = 0).
  if (cublasLtMatmulAlgoGetHeuristic(lt.handle, lt.desc, lt.a, lt.b, lt.d, lt.d, lt.pref, 1, &algo, &found) !=
          CUBLAS_STATUS_SUCCESS ||
      found == 0)
    return false;
  Scratch workspace(algo.workspaceSize, stream);
  const float beta = 0.0f;
  check_lt(cublasLtMatmul(lt.handle, lt.desc, &alpha, w_packed, lt.a, x_packed, lt.b, &beta, y, lt.d, y, lt.d,
                          &algo.algo, workspace.get(), algo.workspaceSize, stream),
           "matmul");
  return true;
}

}  // namespace microscale::cuda::detail
