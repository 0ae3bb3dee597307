// The backend setting, the kernel table of each host backend and the registered CUDA one: the one
// place that decides where the ops run.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "core/convert.hpp"
#include "core/numerics.hpp"
#include "microscale/runtime.hpp"
#include "ops/kernels.hpp"
#include "reference/reference.hpp"

namespace microscale {

const char* name(Backend b) {
  switch (b) {
    case Backend::cpu: return "cpu";
    case Backend::reference: return "reference";
    case Backend::cuda: return "cuda";
  }
  return "?";
}

std::optional<Backend> backend_from_name(std::string_view text) {
  for (Backend b : {Backend::cpu, Backend::reference, Backend::cuda})
    if (text == name(b)) return b;
  return std::nullopt;
}

namespace {

// An unset or empty MICROSCALE_BACKEND means the CPU kernels; any other value must name a backend, so that a
// typo is not silently the CPU kernels. "cuda" is kept as set (not checked here): the first op then
// fails with the reason, instead of silently running elsewhere.
Backend initial_backend() {
  const char* v = std::getenv("MICROSCALE_BACKEND");
  if (v == nullptr || *v == '\0') return Backend::cpu;
  if (const std::optional<Backend> b = backend_from_name(v)) return *b;
  throw Error(std::string("MICROSCALE_BACKEND='") + v + "' is not a backend (expected cpu, reference or cuda)");
}

// Read from the environment at the first use; a value that throws is read again at the next.
std::atomic<Backend>& setting() {
  static std::atomic<Backend> b{initial_backend()};
  return b;
}

// The reference kernels widen their input to float32 first (exact for every float dtype).
std::vector<float> widened(const void* x, DType src, std::int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  const auto* p = static_cast<const std::byte*>(x);
  const std::size_t size = dtype_size(src);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = detail::load_f32(p + i * size, src);
  return out;
}

void reference_quantize(const void* x, DType src, std::int64_t rows, std::int64_t K, const QuantSpec& spec,
                        std::uint8_t* packed, std::byte* scales, std::byte* biases) {
  const std::vector<float> xf = widened(x, src, rows * K);
  reference::quantize(xf.data(), rows, K, src, spec, packed, scales, biases);
}

bool reference_nvfp4_global_errors(const void* x, DType src, std::int64_t blocks, const float* globals, int n,
                                   double* totals, std::uint8_t* scales) {
  const std::vector<float> xf = widened(x, src, blocks * numerics::kNvfp4Group);
  return reference::nvfp4_global_errors(xf.data(), blocks, globals, n, totals, scales);
}

void reference_nvfp4_encode(const void* x, DType src, std::int64_t blocks, float global_scale,
                            const std::uint8_t* scales, std::uint8_t* packed) {
  const std::vector<float> xf = widened(x, src, blocks * numerics::kNvfp4Group);
  reference::nvfp4_encode(xf.data(), blocks, global_scale, scales, packed);
}

float reference_amax_finite(const void* x, DType src, std::int64_t n) {
  const std::vector<float> xf = widened(x, src, n);
  return reference::amax_finite(xf.data(), n);
}

float host_element(const void* x, DType src, std::int64_t i) {
  return detail::load_f32(static_cast<const std::byte*>(x) + static_cast<std::size_t>(i) * dtype_size(src), src);
}

std::int64_t reference_find_nonfinite(const void* x, DType src, std::int64_t n, float* value) {
  for (std::int64_t i = 0; i < n; ++i) {
    *value = host_element(x, src, i);
    if (!std::isfinite(*value)) return i;
  }
  return -1;
}

std::int64_t cpu_find_nonfinite(const void* x, DType src, std::int64_t n, float* value) {
  const std::int64_t i = cpu::find_nonfinite(x, src, n);
  if (i >= 0) *value = host_element(x, src, i);
  return i;
}

// The weight decoded to float32, then the plain float32 product.
void reference_quantized_matmul(const float* x, std::int64_t M, const cpu::QuantizedMatrix& w, bool transpose,
                                const float* bias, float* y) {
  std::vector<float> wf(static_cast<std::size_t>(w.rows * w.cols));
  reference::dequantize(w.packed, w.scales, w.biases, w.scale_dtype, w.rows, w.cols, w.spec, DType::float32,
                        reinterpret_cast<std::byte*>(wf.data()));
  reference::matmul(x, wf.data(), M, transpose ? w.rows : w.cols, transpose ? w.cols : w.rows, transpose, bias, y);
}

// The weight widened to float32, then the plain float32 product (k in order).
void reference_linear(const float* x, std::int64_t M, const void* w, DType w_dtype, std::int64_t N, std::int64_t K,
                      const float* bias, float* y) {
  const std::vector<float> wf = detail::to_f32(TensorView(w, w_dtype, {N, K}));
  reference::matmul(x, wf.data(), M, N, K, true, bias, y);
}

constexpr ops::Kernels kReference{reference_quantize,         reference::dequantize, reference_nvfp4_global_errors,
                                  reference_nvfp4_encode,     reference_amax_finite, reference_find_nonfinite,
                                  reference_quantized_matmul, reference::qqmm,       reference_linear};
constexpr ops::Kernels kCpu{cpu::quantize,         cpu::dequantize,  cpu::nvfp4_global_errors,
                            cpu::nvfp4_encode,     cpu::amax_finite, cpu_find_nonfinite,
                            cpu::quantized_matmul, cpu::qqmm,        cpu::linear};

// Written once, by microscale_cuda's static initializer (before main), then only read.
std::atomic<const ops::DeviceBackend*>& cuda_backend() {
  static std::atomic<const ops::DeviceBackend*> b{nullptr};
  return b;
}

// The CUDA backend, ready to run, or an Error saying what is missing and what to do.
const ops::DeviceBackend& usable_cuda() {
  const ops::DeviceBackend* c = cuda_backend().load();
  if (c == nullptr)
    throw Error(
        "backend cuda: this program has no CUDA backend (build with -DMICROSCALE_CUDA=ON and link "
        "microscale_cuda); use backend cpu or reference (set_backend, MICROSCALE_BACKEND)");
  if (!c->available())
    throw Error(
        "backend cuda: no usable CUDA device (none found, or not one this build has kernels for: "
        "sm_90a, sm_100a); use backend cpu or reference (set_backend, MICROSCALE_BACKEND)");
  return *c;
}

// The registered backend when p is in its device memory.
const ops::DeviceBackend* holder_of(const void* p) {
  const ops::DeviceBackend* c = cuda_backend().load();
  return c != nullptr && p != nullptr && c->is_device_memory(p) ? c : nullptr;
}

}  // namespace

Backend backend() { return setting().load(); }
void set_backend(Backend b) {
  if (b == Backend::cuda) usable_cuda();
  setting().store(b);
}

void ops::register_cuda(const DeviceBackend& b) {
  static const DeviceBackend registered = b;
  cuda_backend().store(&registered);
}

const ops::Kernels& ops::kernels() {
  switch (backend()) {
    case Backend::reference: return kReference;
    case Backend::cuda: return *usable_cuda().kernels;
    case Backend::cpu: break;
  }
  return kCpu;
}

const ops::Kernels& ops::kernels_for(const char* op, std::initializer_list<const TensorView*> operands) {
  const DeviceBackend* device = nullptr;
  for (const TensorView* v : operands) {
    if (v == nullptr || holder_of(v->data) == nullptr) continue;
    if (!v->is_contiguous())
      throw Error(std::string(op) + ": an operand in device memory is a strided view; pass a contiguous tensor");
    device = holder_of(v->data);
  }
  return device ? *device->kernels : kernels();
}

TensorView ops::host_readable(const TensorView& v, Tensor& keep) {
  const DeviceBackend* device = holder_of(v.data);
  if (device == nullptr) return v;
  if (!v.is_contiguous()) throw Error("a strided view of device memory cannot be read; pass a contiguous tensor");
  keep = Tensor::uninitialized(v.dtype, v.shape);
  device->copy(keep.bytes(), v.data, keep.nbytes());
  return keep.view();
}

}  // namespace microscale
