#include "core/convert.hpp"

namespace microscale::detail {
namespace {

// Calls f(element address) for every element of x in row-major order.
template <class F>
void for_each_element(const TensorView& x, F&& f) {
  const std::int64_t n = x.numel();
  if (n == 0) return;
  const int rank = x.rank();
  std::vector<std::int64_t> index(static_cast<std::size_t>(rank), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    f(x.at(index.data()));
    for (int d = rank - 1; d >= 0; --d) {
      if (++index[static_cast<std::size_t>(d)] < x.shape[static_cast<std::size_t>(d)]) break;
      index[static_cast<std::size_t>(d)] = 0;
    }
  }
}

}  // namespace

std::vector<float> to_f32(const TensorView& x) {
  std::vector<float> out(static_cast<std::size_t>(x.numel()));
  if (x.is_contiguous() && x.dtype == DType::float32) {
    if (!out.empty()) std::memcpy(out.data(), x.data, out.size() * 4);
    return out;
  }
  float* dst = out.data();
  for_each_element(x, [&](const std::byte* p) { *dst++ = load_f32(p, x.dtype); });
  return out;
}

Tensor contiguous(const TensorView& x) {
  Tensor out(x.dtype, x.shape);
  const std::size_t size = dtype_size(x.dtype);
  if (x.is_contiguous()) {
    if (out.nbytes()) std::memcpy(out.bytes(), x.data, out.nbytes());
    return out;
  }
  std::byte* dst = out.bytes();
  for_each_element(x, [&](const std::byte* p) {
    std::memcpy(dst, p, size);
    dst += size;
  });
  return out;
}

Rows rows_of(const TensorView& x) {
  Rows r;
  r.numel = x.numel();
  if (x.is_contiguous()) {
    r.data = static_cast<const std::byte*>(x.data);
  } else {
    r.copy = contiguous(x);
    r.data = r.copy.bytes();
  }
  return r;
}

void check_index_dtype(DType dtype, const char* op, const char* what) {
  if (dtype != DType::int32 && dtype != DType::int64 && dtype != DType::uint32)
    throw Error(std::string(op) + ": " + what + " must be int32, int64 or uint32, got " + dtype_name(dtype));
}

std::vector<std::int64_t> read_indices(const TensorView& idx, std::int64_t limit, const char* op, const char* what) {
  check_index_dtype(idx.dtype, op, what);
  const Tensor t = contiguous(idx);
  std::vector<std::int64_t> v(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) {
    switch (idx.dtype) {
      case DType::int32: v[i] = t.data<std::int32_t>()[i]; break;
      case DType::uint32: v[i] = t.data<std::uint32_t>()[i]; break;
      default: v[i] = t.data<std::int64_t>()[i]; break;
    }
    if (v[i] < 0 || v[i] >= limit)
      throw Error(std::string(op) + ": " + what + " value " + std::to_string(v[i]) + " at position " +
                  std::to_string(i) + " is out of range [0, " + std::to_string(limit) + ")");
  }
  return v;
}

}  // namespace microscale::detail
