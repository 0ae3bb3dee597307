// The backend setting and the kernel table of each host backend: the one place that decides
// where the ops run.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/convert.hpp"
#include "microscale/runtime.hpp"
#include "ops/kernels.hpp"
#include "reference/reference.hpp"

namespace microscale {

const char* name(Backend b) {
  switch (b) {
    case Backend::cpu: return "cpu";
    case Backend::reference: return "reference";
  }
  return "?";
}

std::optional<Backend> backend_from_name(std::string_view text) {
  for (Backend b : {Backend::cpu, Backend::reference})
    if (text == name(b)) return b;
  return std::nullopt;
}

namespace {

// An unset or unknown MICROSCALE_BACKEND means the CPU kernels.
Backend initial_backend() {
  const char* v = std::getenv("MICROSCALE_BACKEND");
  return v ? backend_from_name(v).value_or(Backend::cpu) : Backend::cpu;
}

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

float reference_amax_finite(const void* x, DType src, std::int64_t n) {
  const std::vector<float> xf = widened(x, src, n);
  return reference::amax_finite(xf.data(), n);
}

std::int64_t reference_find_nonfinite(const void* x, DType src, std::int64_t n) {
  const auto* p = static_cast<const std::byte*>(x);
  const std::size_t size = dtype_size(src);
  for (std::int64_t i = 0; i < n; ++i)
    if (!std::isfinite(detail::load_f32(p + static_cast<std::size_t>(i) * size, src))) return i;
  return -1;
}

// The weight decoded to float32, then the plain float32 product.
void reference_quantized_matmul(const float* x, std::int64_t M, const cpu::QuantizedMatrix& w, bool transpose,
                                const float* bias, float* y) {
  std::vector<float> wf(static_cast<std::size_t>(w.rows * w.cols));
  reference::dequantize(w.packed, w.scales, w.biases, w.scale_dtype, w.rows, w.cols, w.spec, DType::float32,
                        reinterpret_cast<std::byte*>(wf.data()));
  reference::matmul(x, wf.data(), M, transpose ? w.rows : w.cols, transpose ? w.cols : w.rows, transpose, bias, y);
}

constexpr ops::Kernels kReference{reference_quantize,       reference::dequantize,      reference_amax_finite,
                                  reference_find_nonfinite, reference_quantized_matmul, reference::qqmm};
constexpr ops::Kernels kCpu{cpu::quantize,       cpu::dequantize,       cpu::amax_finite,
                            cpu::find_nonfinite, cpu::quantized_matmul, cpu::qqmm};

}  // namespace

Backend backend() { return setting().load(); }
void set_backend(Backend b) { setting().store(b); }

const ops::Kernels& ops::kernels() { return backend() == Backend::reference ? kReference : kCpu; }

}  // namespace microscale
