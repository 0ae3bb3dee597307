// Internal: the device-independent half of every op. A plan_* function validates an op's
// arguments from their dtypes and shapes alone (so host views and CUDA device views share it),
// throws the op's Error messages, and returns what the kernels need: the resolved spec, sizes,
// (x matrix, w matrix) batch pairs and the output shape. Memory (host copies, device pointers)
// and data-dependent checks (non-finite values, index ranges) stay with the caller.
// Compiled by nvcc too (src/cuda), so C++17 only.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "microscale/format.hpp"
#include "microscale/quantize.hpp"
#include "microscale/tensor.hpp"

namespace microscale::ops {

// What validation reads of a tensor argument, wherever its memory lives.
struct Arg {
  DType dtype = DType::float32;
  Shape shape;
};
template <class View>
Arg arg_of(const View& v) {
  return Arg{v.dtype, v.shape};
}
// Of an optional argument (null: absent); pass it on with opt_ptr.
template <class View>
std::optional<Arg> optional_arg(const View* v) {
  return v ? std::optional<Arg>(arg_of(*v)) : std::nullopt;
}
inline const Arg* opt_ptr(const std::optional<Arg>& a) { return a ? &*a : nullptr; }

inline std::int64_t roundup(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }
// s without its last `drop` axes.
Shape leading(const Shape& s, std::size_t drop);
Shape with_last(Shape s, std::int64_t last);

// quantize of x [..., K]: output shapes and dtypes.
struct QuantizePlan {
  QuantSpec spec;  // resolved
  std::int64_t rows = 0, K = 0, groups = 0;
  Shape packed;                      // uint8 [..., K*bits/8]
  Shape compact_scales;              // [..., K/group]
  Shape scales;                      // as stored: compact_scales, or the swizzled [Rp, Cp]
  Shape biases;                      // affine only (like compact_scales); empty otherwise
  DType scale_dtype = DType::uint8;  // uint8 codes, or x's dtype for affine
};
QuantizePlan plan_quantize(const Arg& x, const QuantSpec& spec);
// The output of a planned quantize of an input of `shape`: spec, packed values and (affine)
// biases allocated; the kernels fill them and the caller the scales.
Quantized allocate_quantized(const QuantizePlan& p, const Shape& shape);

// nonfinite='error': the Error naming the first NaN/Inf (at row-major position `flat` of a tensor
// of `shape`, holding `value`).
[[noreturn]] void throw_nonfinite(std::int64_t flat, float value, const Shape& shape);

// global_scale / amax input: a float dtype.
void check_amax_input(const Arg& x, const char* op);

// A quantized operand (packed values + scales (+ affine biases)) checked against its spec.
struct OperandPlan {
  QuantSpec spec;                            // resolved
  Shape shape;                               // logical [..., K]
  std::int64_t rows = 0, K = 0, groups = 0;  // rows: product of the leading axes; groups per row
  DType scale_dtype = DType::uint8;
};
// Errors name `op`. Packed values are uint8 or MLX's uint32 words (the same little-endian bytes).
OperandPlan plan_operand(const Arg& packed, const Arg& scales, const Arg* biases, const QuantSpec& spec,
                         const char* op);
OperandPlan plan_dequantize(const Arg& packed, const Arg& scales, const Arg* biases, const QuantSpec& spec, DType out);

// A (possibly batched) quantized weight [..., rows, cols], groups along cols.
struct WeightPlan {
  OperandPlan q;
  Shape batch;
  std::int64_t rows = 0, cols = 0;
};

struct BatchPair {
  std::int64_t x, w;  // matrix indices into x's and w's flattened batches
};

// quantized_matmul and gather_qmm: y [out_shape] = x[pair.x] @ W[pair.w]^T (or W) per pair.
struct MatmulPlan {
  WeightPlan w;
  bool transpose = true;
  std::int64_t M = 0, N = 0, K = 0;
  std::vector<BatchPair> pairs;  // one per output matrix, in row-major order of the output batch
  Shape out_shape;
  DType out_dtype = DType::float32;  // the host ops' result dtype
};
MatmulPlan plan_quantized_matmul(const Arg& x, const Arg& wq, const Arg& scales, const Arg* biases, bool transpose,
                                 const QuantSpec& spec, const Arg* bias);

// gather_qmm's index arrays are data: `read` returns the values of the lhs or rhs indices (after
// their dtype is checked here), each checked to lie in [0, limit) with errors naming `what`.
enum class Side { lhs, rhs };
using ReadIndices = std::function<std::vector<std::int64_t>(Side side, std::int64_t limit, const char* what)>;
// Without indices this is plan_quantized_matmul's plan (for op "quantized_matmul").
MatmulPlan plan_gather_qmm(const Arg& x, const Arg& wq, const Arg& scales, const Arg* biases, const Arg* lhs_indices,
                           const Arg* rhs_indices, bool transpose, const QuantSpec& spec, const ReadIndices& read);

// qqmm: y [..., N] = x [..., K] @ w [N, K]^T, both quantized.
struct QqmmPlan {
  QqmmSpecs specs;       // specs.w.layout is compact when w is float (the op quantizes it)
  bool w_float = false;  // w is float [N, K] and is quantized by the op, else packed with w_scales
  OperandPlan w;
  std::int64_t M = 0, N = 0, K = 0;
  Shape out_shape;
};
QqmmPlan plan_qqmm(const Arg& x, const Arg& w, const Arg* w_scales, const QuantSpec& spec,
                   std::optional<float> global_scale_x, std::optional<float> global_scale_w, const Arg* bias);

// linear: y [..., N] = x [..., K] @ w^T (+ bias [N]) with w float [N, K].
struct LinearPlan {
  std::int64_t M = 0, N = 0, K = 0;  // M: the rows of x, batch axes flattened
  Shape out_shape;
};
LinearPlan plan_linear(const Arg& x, const Arg& w, const Arg* bias);

}  // namespace microscale::ops
