#include "microscale/tensor.hpp"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

namespace microscale {

std::int64_t numel(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) throw Error("negative dimension in shape " + shape_str(shape));
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d)
      throw Error("shape " + shape_str(shape) + " has too many elements");
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape, ShapeStyle style) {
  if (style == ShapeStyle::dims && shape.empty()) return "scalar";
  const char* separator = style == ShapeStyle::dims ? "x" : ", ";
  std::string s;
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? separator : "") + std::to_string(shape[i]);
  switch (style) {
    case ShapeStyle::tuple: return "(" + s + (shape.size() == 1 ? ",)" : ")");
    case ShapeStyle::list: return "[" + s + "]";
    case ShapeStyle::dims: return s;
  }
  return s;
}

namespace {
// Products of dims that may exceed int64 only for empty tensors (numel() refuses the others),
// whose strides address nothing: saturating keeps them defined.
std::int64_t saturating_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<std::int64_t>::max() : r;
}
}  // namespace

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s = saturating_mul(s, shape[i]);
  }
  return strides;
}

TensorView::TensorView(const void* d, DType t, Shape s, Shape st)
    : data(d), dtype(t), shape(std::move(s)), strides(std::move(st)) {
  if (strides.empty()) strides = contiguous_strides(shape);
  if (strides.size() != shape.size())
    throw Error("tensor view has " + std::to_string(strides.size()) + " strides for rank " +
                std::to_string(shape.size()));
  for (std::int64_t st_i : strides)
    if (st_i < 0) throw Error("negative strides are not supported");
  if (data == nullptr && microscale::numel(shape) != 0) throw Error("tensor view of null data");
}

bool TensorView::is_contiguous() const {
  std::int64_t expect = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expect) return false;
    expect = saturating_mul(expect, shape[i]);
  }
  return true;
}

const std::byte* TensorView::at(const std::int64_t* index) const {
  std::int64_t off = 0;
  for (std::size_t i = 0; i < shape.size(); ++i) off += index[i] * strides[i];
  return static_cast<const std::byte*>(data) + off * static_cast<std::int64_t>(dtype_size(dtype));
}

void Tensor::Free::operator()(std::byte* p) const { std::free(p); }

namespace {
// Bytes allocated for n bytes of data: never zero, whole cache lines.
std::size_t padded_size(std::size_t n) { return (n + 63) / 64 * 64 + 64; }
}  // namespace

Tensor Tensor::uninitialized(DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  auto* p = static_cast<std::byte*>(std::aligned_alloc(64, padded_size(t.nbytes())));
  if (p == nullptr) throw std::bad_alloc();
  t.buf_ = std::shared_ptr<std::byte>(p, Free{});
  return t;
}

Tensor::Tensor(DType dtype, Shape shape) : Tensor(uninitialized(dtype, std::move(shape))) {
  std::memset(buf_.get(), 0, padded_size(nbytes()));
}

Tensor Tensor::reshaped(Shape shape) const {
  if (microscale::numel(shape) != numel())
    throw Error("cannot reshape " + shape_str(shape_) + " to " + shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

}  // namespace microscale
