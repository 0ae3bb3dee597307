// The element codecs of the CUDA kernels: the scalar specification's (src/core/numerics.hpp,
// __host__ __device__ under nvcc), named in this namespace, plus the kernels' typed loads and
// stores. Kernels including this are compiled with --fmad=false, so no expression is contracted
// into an FMA; the host side builds with -ffp-contract=off for the same reason.
#pragma once

#include <cstdint>

#include "core/numerics.hpp"
#include "microscale/dtype.hpp"

namespace microscale::cuda::detail {

using numerics::bits_of;
using numerics::decode_bf16;
using numerics::decode_e2m1;
using numerics::decode_e4m3;
using numerics::decode_e5m2;
using numerics::decode_e8m0;
using numerics::decode_f16;
using numerics::e8m0_reciprocal;
using numerics::encode_bf16;
using numerics::encode_e2m1;
using numerics::encode_e4m3;
using numerics::encode_e5m2;
using numerics::encode_f16;
using numerics::float_of;
using numerics::is_finite;
using numerics::is_nan;

MS_HD float load_float(const void* base, std::int64_t i, DType t) {
  if (t == DType::float32) return static_cast<const float*>(base)[i];
  const std::uint16_t h = static_cast<const std::uint16_t*>(base)[i];
  return t == DType::float16 ? decode_f16(h) : decode_bf16(h);
}
MS_HD void store_float(void* base, std::int64_t i, DType t, float v) {
  if (t == DType::float32)
    static_cast<float*>(base)[i] = v;
  else
    static_cast<std::uint16_t*>(base)[i] = t == DType::float16 ? encode_f16(v) : encode_bf16(v);
}

}  // namespace microscale::cuda::detail
