// Backend::cuda: the CUDA kernel table of the op layer (src/ops/kernels.hpp), registered when a
// program linked with microscale_cuda loads. The host API's ops run here when the backend setting
// is cuda or one of their operands lives in device memory. Every entry takes host or device
// pointers: host operands are copied to stream-ordered scratch, device ones are used in place,
// and results are copied (cudaMemcpyDefault) to wherever the caller's output lives before the
// entry returns.
#include <cuda_runtime.h>

#include <optional>

#include "cuda/device.hpp"
#include "ops/kernels.hpp"

namespace microscale::cuda::detail {
namespace {

constexpr Stream kStream = nullptr;  // the legacy default stream: ordered with the caller's other CUDA work

// Asked on every op of a program that links CUDA, so the no-device answer is found once.
bool device_present() {
  static const bool present = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return true;
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }();
  return present;
}

cudaMemoryType memory_type(const void* p) {
  cudaPointerAttributes a{};
  if (p == nullptr || !device_present() || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return cudaMemoryTypeUnregistered;
  }
  return a.type;
}

// Managed memory is readable by the CPU kernels too, so only device memory selects this backend.
bool is_device_memory(const void* p) { return memory_type(p) == cudaMemoryTypeDevice; }

bool device_readable(const void* p) {
  const cudaMemoryType t = memory_type(p);
  return t == cudaMemoryTypeDevice || t == cudaMemoryTypeManaged;
}

void copy_any(void* dst, const void* src, std::size_t bytes) {
  if (bytes) check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "copy");
}

// An operand the kernels can read: the caller's pointer when it is on the device, else a copy.
class Input {
 public:
  Input(const void* p, std::size_t bytes) : ptr_(p) {
    if (bytes == 0 || device_readable(p)) return;
    copy_.emplace(bytes, kStream);
    check(cudaMemcpyAsync(copy_->get(), p, bytes, cudaMemcpyDefault, kStream), "copy to the device");
    ptr_ = copy_->get();
  }
  void* get() const { return const_cast<void*>(ptr_); }  // DeviceTensor's pointer is not const

 private:
  const void* ptr_;
  std::optional<Scratch> copy_;
};

// An output the kernels write: the caller's memory when it is on the device, else scratch that
// done() copies back.
class Output {
 public:
  Output(void* p, std::size_t bytes) : dst_(p), ptr_(p), bytes_(bytes) {
    if (bytes == 0 || device_readable(p)) return;
    scratch_.emplace(bytes, kStream);
    ptr_ = scratch_->get();
  }
  void* get() const { return ptr_; }
  void done() const {
    if (scratch_) check(cudaMemcpyAsync(dst_, ptr_, bytes_, cudaMemcpyDefault, kStream), "copy from the device");
  }

 private:
  void* dst_;
  void* ptr_;
  std::size_t bytes_;
  std::optional<Scratch> scratch_;
};

// The host API returns finished results.
void finish(const char* op) { check(cudaStreamSynchronize(kStream), op); }

std::size_t bytes_of(DType t, std::int64_t n) { return static_cast<std::size_t>(n) * dtype_size(t); }

// The op layer hands over compact scales (it swizzles and unswizzles on the host).
QuantSpec compact(QuantSpec s) {
  s.layout = Layout::compact;
  return s;
}

void quantize_entry(const void* x, DType src, std::int64_t rows, std::int64_t K, const QuantSpec& spec,
                    std::uint8_t* packed, std::byte* scales, std::byte* biases) {
  const QuantSpec s = compact(spec);
  const ops::QuantizePlan p = ops::plan_quantize({src, {rows, K}}, s);
  const bool affine = s.mode == Mode::affine;
  const Input dx(x, bytes_of(src, rows * K));
  const Output dp(packed, bytes_of(DType::uint8, numel(p.packed)));
  const Output ds(scales, bytes_of(p.scale_dtype, numel(p.scales)));
  const Output db(biases, affine ? bytes_of(p.scale_dtype, numel(p.biases)) : 0);
  const DeviceQuantized out{{dp.get(), DType::uint8, p.packed},
                            {ds.get(), p.scale_dtype, p.scales},
                            {affine ? db.get() : nullptr, p.scale_dtype, p.biases}};
  quantize({dx.get(), src, {rows, K}}, s, out, kStream);
  for (const Output* o : {&dp, &ds, &db}) o->done();
  finish("quantize");
}

void dequantize_entry(const std::uint8_t* packed, const std::byte* scales, const std::byte* biases, DType scale_dtype,
                      std::int64_t rows, std::int64_t K, const QuantSpec& spec, DType out, std::byte* y) {
  const QuantSpec s = compact(spec);
  const bool affine = s.mode == Mode::affine;
  const Shape packed_shape{rows, K * s.bits / 8}, scale_shape{rows, K / s.group_size};
  const Input dp(packed, bytes_of(DType::uint8, numel(packed_shape)));
  const Input ds(scales, bytes_of(scale_dtype, numel(scale_shape)));
  const Input db(biases, affine ? bytes_of(scale_dtype, numel(scale_shape)) : 0);
  const Output dy(y, bytes_of(out, rows * K));
  const DeviceQuantized q{{dp.get(), DType::uint8, packed_shape},
                          {ds.get(), scale_dtype, scale_shape},
                          {affine ? db.get() : nullptr, scale_dtype, scale_shape}};
  dequantize(q, s, {dy.get(), out, {rows, K}}, kStream);
  dy.done();
  finish("dequantize");
}

float amax_entry(const void* x, DType src, std::int64_t n) {
  const Input dx(x, bytes_of(src, n));
  return amax({dx.get(), src, {n}}, kStream);
}

std::int64_t find_nonfinite_entry(const void* x, DType src, std::int64_t n, float* value) {
  const Input dx(x, bytes_of(src, n));
  const std::int64_t i = first_nonfinite({dx.get(), src, {n}}, kStream);
  if (i >= 0) {
    alignas(4) unsigned char element[4] = {};
    copy_any(element, static_cast<const unsigned char*>(dx.get()) + bytes_of(src, i), dtype_size(src));
    *value = load_float(element, 0, src);
  }
  return i;
}

void quantized_matmul_entry(const float* x, std::int64_t M, const cpu::QuantizedMatrix& w, bool transpose,
                            const float* bias, float* y) {
  const QuantSpec s = compact(w.spec);
  const std::int64_t N = transpose ? w.rows : w.cols, K = transpose ? w.cols : w.rows;
  const Shape packed_shape{w.rows, w.cols * s.bits / 8}, scale_shape{w.rows, w.cols / s.group_size};
  const bool affine = s.mode == Mode::affine;
  const Input dx(x, bytes_of(DType::float32, M * K));
  const Input dp(w.packed, bytes_of(DType::uint8, numel(packed_shape)));
  const Input ds(w.scales, bytes_of(w.scale_dtype, numel(scale_shape)));
  const Input db(w.biases, affine ? bytes_of(w.scale_dtype, numel(scale_shape)) : 0);
  const Input dbias(bias, bias ? bytes_of(DType::float32, N) : 0);
  const Output dy(y, bytes_of(DType::float32, M * N));
  const DeviceQuantized dw{{dp.get(), DType::uint8, packed_shape},
                           {ds.get(), w.scale_dtype, scale_shape},
                           {affine ? db.get() : nullptr, w.scale_dtype, scale_shape}};
  const DeviceTensor bias_view{dbias.get(), DType::float32, {N}};
  quantized_matmul({dx.get(), DType::float32, {M, K}}, dw, transpose, s, {dy.get(), DType::float32, {M, N}},
                   bias ? &bias_view : nullptr, kStream);
  dy.done();
  finish("quantized_matmul");
}

void qqmm_entry(const std::uint8_t* px, const std::uint8_t* sx, const std::uint8_t* pw, const std::uint8_t* sw,
                std::int64_t M, std::int64_t N, std::int64_t K, const QuantSpec& spec, float alpha, const float* bias,
                float* y) {
  const QuantSpec s = compact(spec);
  const std::int64_t packed_cols = K * s.bits / 8, groups = K / s.group_size;
  const Input dpx(px, bytes_of(DType::uint8, M * packed_cols)), dsx(sx, bytes_of(DType::uint8, M * groups));
  const Input dpw(pw, bytes_of(DType::uint8, N * packed_cols)), dsw(sw, bytes_of(DType::uint8, N * groups));
  const Input dbias(bias, bias ? bytes_of(DType::float32, N) : 0);
  const Output dy(y, bytes_of(DType::float32, M * N));
  const DeviceQuantized xq{{dpx.get(), DType::uint8, {M, packed_cols}}, {dsx.get(), DType::uint8, {M, groups}}, {}};
  const DeviceQuantized wq{{dpw.get(), DType::uint8, {N, packed_cols}}, {dsw.get(), DType::uint8, {N, groups}}, {}};
  const ops::OperandPlan w = ops::plan_operand(ops::arg_of(wq.packed), ops::arg_of(wq.scales), nullptr, s, "qqmm");
  const DeviceTensor bias_view{dbias.get(), DType::float32, {N}};
  qqmm_codes(xq, s, wq, w, M, alpha, bias ? &bias_view : nullptr, {dy.get(), DType::float32, {M, N}}, kStream);
  dy.done();
  finish("qqmm");
}

constexpr ops::Kernels kCuda{quantize_entry,       dequantize_entry,       nullptr,    nullptr, amax_entry,
                             find_nonfinite_entry, quantized_matmul_entry, qqmm_entry, nullptr};

[[maybe_unused]] const bool kRegistered = [] {
  ops::register_cuda({&kCuda, available, is_device_memory, copy_any});
  return true;
}();

}  // namespace
}  // namespace microscale::cuda::detail

// Referenced by every program that links microscale_cuda (the library's INTERFACE link option
// -u, src/cuda/CMakeLists.txt), so the linker keeps this object and its registration above,
// which nothing else in the program refers to.
extern "C" void microscale_cuda_backend_anchor() {}
