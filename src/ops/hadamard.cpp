// hadamard_transform: the 16-point random Hadamard transform of the NVFP4 training recipe along
// the last axis (docs/numerics.md, "Random Hadamard transform"), on the host for every backend.
#include <string>

#include "core/convert.hpp"
#include "core/recipe.hpp"
#include "cpu/parallel.hpp"
#include "microscale/quantize.hpp"
#include "ops/kernels.hpp"
#include "ops/plan.hpp"

namespace microscale {

Tensor hadamard_transform(const TensorView& x, DType out) {
  const char* op = "hadamard_transform";
  ops::check_amax_input(ops::arg_of(x), op);
  if (out != DType::float32 && out != DType::bfloat16)
    throw Error(std::string(op) + ": output dtype must be float32 or bfloat16 (the values are bfloat16), got " +
                dtype_name(out));
  if (x.rank() < 1) throw Error(std::string(op) + ": x must have rank >= 1");
  const std::int64_t K = x.shape.back();
  constexpr int N = numerics::kHadamardSize;
  if (K % N != 0)
    throw Error(std::string(op) + ": the last axis of x (K = " + std::to_string(K) + ") must be a multiple of " +
                std::to_string(N) + " (the transform acts on chunks of 16)");
  Tensor keep;
  const detail::Rows xr = detail::rows_of(ops::host_readable(x, keep));
  Tensor y = Tensor::uninitialized(out, x.shape);
  const std::size_t in_size = dtype_size(x.dtype), out_size = dtype_size(out);
  std::byte* yb = y.bytes();
  // Chunks are independent: any split across threads gives the same values.
  cpu::parallel_for(xr.numel / N, 4096, [&](std::int64_t c0, std::int64_t c1) {
    float chunk[N], transformed[N];
    for (std::int64_t c = c0 * N; c < c1 * N; c += N) {
      for (int i = 0; i < N; ++i)
        chunk[i] = detail::load_f32(xr.data + static_cast<std::size_t>(c + i) * in_size, x.dtype);
      numerics::hadamard16(chunk, transformed);
      for (int j = 0; j < N; ++j)
        detail::store_f32(transformed[j], out, yb + static_cast<std::size_t>(c + j) * out_size);
    }
  });
  return y;
}

}  // namespace microscale
