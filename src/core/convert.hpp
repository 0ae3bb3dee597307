// Internal: exact widening of f32/f16/bf16 elements to float32, rounding back, and gathering
// strided views into contiguous buffers.
#pragma once

#include <cstring>
#include <vector>

#include "microscale/codecs.hpp"
#include "microscale/tensor.hpp"

namespace microscale::detail {

inline float load_f32(const std::byte* p, DType t) {
  switch (t) {
    case DType::float16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return decode_f16(h);
    }
    case DType::bfloat16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return decode_bf16(h);
    }
    default: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
  }
}

// Rounds v to t (round to nearest even; IEEE overflow to Inf) and stores it at p.
inline void store_f32(float v, DType t, std::byte* p) {
  switch (t) {
    case DType::float16: {
      const std::uint16_t h = encode_f16(v);
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::bfloat16: {
      const std::uint16_t h = encode_bf16(v);
      std::memcpy(p, &h, 2);
      return;
    }
    default: std::memcpy(p, &v, 4);
  }
}

// Row-major float32 copy of a float view (any strides).
std::vector<float> to_f32(const TensorView& x);
// Row-major byte copy of a view of any dtype (any strides).
Tensor contiguous(const TensorView& x);

// Row-major bytes of x: the caller's memory when x is already contiguous, else a private copy.
struct Rows {
  Tensor copy;  // empty when borrowed
  const std::byte* data = nullptr;
  std::int64_t numel = 0;
};
Rows rows_of(const TensorView& x);

// Integer indices (int32, int64 or uint32, any strides) as int64, each checked to lie in [0, limit);
// errors name the op and the argument.
void check_index_dtype(DType dtype, const char* op, const char* what);
std::vector<std::int64_t> read_indices(const TensorView& idx, std::int64_t limit, const char* op, const char* what);

}  // namespace microscale::detail
