// Tensor values: a non-owning strided view for inputs and an owning contiguous buffer for outputs.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "microscale/dtype.hpp"

namespace microscale {

using Shape = std::vector<std::int64_t>;

std::int64_t numel(const Shape& shape);
// The one shape formatter, in the style each output needs: tuple "(2, 3)", "(5,)", "()" as numpy
// prints shapes (error messages); list "[2, 3]" as safetensors headers write them; dims "2x3"
// ("scalar" for rank 0) for table columns and file names.
enum class ShapeStyle { tuple, list, dims };
std::string shape_str(const Shape& shape, ShapeStyle style = ShapeStyle::tuple);
Shape contiguous_strides(const Shape& shape);

// Non-owning view of caller memory. Strides are in elements (not bytes) and may be any
// non-negative value, so transposed or sliced numpy arrays are read in place.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::float32;
  Shape shape;
  Shape strides;  // empty means row-major contiguous

  TensorView() = default;
  TensorView(const void* data, DType dtype, Shape shape, Shape strides = {});

  int rank() const { return static_cast<int>(shape.size()); }
  std::int64_t numel() const { return microscale::numel(shape); }
  bool is_contiguous() const;
  // Byte address of the element at a multi-index (no bounds check).
  const std::byte* at(const std::int64_t* index) const;
};

// Owning row-major buffer, 64-byte aligned so vector kernels may load it whole.
class Tensor {
 public:
  Tensor() = default;                // empty: shape (0,), no buffer
  Tensor(DType dtype, Shape shape);  // zero-filled
  // Contents unspecified: for outputs an op overwrites entirely (skips a pass over the memory).
  static Tensor uninitialized(DType dtype, Shape shape);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const { return microscale::numel(shape_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  bool empty() const { return numel() == 0; }

  std::byte* bytes() { return buf_.get(); }
  const std::byte* bytes() const { return buf_.get(); }
  template <class T>
  T* data() {
    return reinterpret_cast<T*>(buf_.get());
  }
  template <class T>
  const T* data() const {
    return reinterpret_cast<const T*>(buf_.get());
  }
  TensorView view() const { return TensorView(buf_.get(), dtype_, shape_); }
  // Same bytes, new shape of equal element count.
  Tensor reshaped(Shape shape) const;

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  DType dtype_ = DType::float32;
  Shape shape_{0};  // a default Tensor holds nothing: rank 1, no elements
  std::shared_ptr<std::byte> buf_;
};

}  // namespace microscale
