// Internals of the checkpoint converters (checkpoint.hpp): one quantized layer in a
// layout-independent form, its global scale in whichever convention it was stored, and the
// tensors a layout writes for it.
#pragma once

#include <array>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/numerics.hpp"
#include "io/detail.hpp"
#include "microscale/checkpoint.hpp"

namespace microscale::io::ck {

namespace fs = std::filesystem;
using detail::Json;

// The nvfp4 amax that a two-level layer (no global scale, decode factor 1) stands for.
inline constexpr float k2688 = numerics::kNvfp4Range;

// The smallest positive activation amax that is stored. Below it the decode factor amax / 2688
// (ModelOpt's input_scale) leaves float32's normal range and the encode factor 2688 / amax
// (compressed-tensors' input_global_scale) approaches FLT_MAX, so the stored scale would not give
// the amax back (an amax that is 0 in float32, such as 1e-50, would be written as 1.0: amax 2688).
inline constexpr float kMinActivationAmax = k2688 * std::numeric_limits<float>::min();

// Refuses an activation amax that the layouts cannot store faithfully: NaN, infinite, negative,
// beyond float32's range, or positive and below kMinActivationAmax (0 itself is stored as 1.0, as
// for weights). `what` starts the message ("activation amax of \"m\"").
void check_activation_amax(double amax, const std::string& what);

// How a layout stores the nvfp4 global scale (docs/checkpoints.md, "Global-scale conventions").
// Each layout module defines its own.
struct ScaleConvention {
  const char* weight_tensor;  // the weight's scale tensor without the module: "weight_global_scale"
  const char* formula;        // what the stored value is: "2688/amax"
  float (*to_amax)(float stored);
  float (*from_amax)(float amax);  // amax 0 must give a value readers do not divide by
  bool (*valid)(float stored);     // accepted on reading (the implied amax must be finite too)
};

// A global scale as microscale or a layout keeps it.
struct Global {
  enum class Kind { none, amax, stored };
  Kind kind = Kind::none;  // none: two-level nvfp4, equivalent to amax 2688 (decode factor 1)
  float value = 0;
  const ScaleConvention* convention = nullptr;  // Kind::stored: the convention of `value`

  static Global of_amax(float amax) { return {Kind::amax, amax, nullptr}; }
  static Global stored_as(const ScaleConvention& c, float stored) { return {Kind::stored, stored, &c}; }
  bool three_level() const { return kind != Kind::none; }
  float to_amax() const;
  std::string describe() const;  // "weight_global_scale 3584 = 2688/amax -> amax 0.75"
  // The same, naming the tensor that stores it ("input_global_scale 3584 = ...").
  std::string describe(std::string_view tensor) const;
};

// What a tensor read into a layer holds.
enum class Role { packed, scales, biases, global_scale, activation_scale };
struct Source {
  std::string tensor;
  Role role;
};

// One quantized 2-D weight. The spans point into mapped input files or caller buffers.
struct Layer {
  std::string module;
  // Mode, group_size and bits only (nvfp4's until a reader sets them); the global scale is `global`.
  QuantSpec format = [] {
    QuantSpec s;
    s.group_size = 16;
    s.bits = 4;
    return s;
  }();
  Shape shape;  // logical [N, K]; stacked experts: [experts * N, K]
  // Stacked experts (mlx-lm's SwitchLinear): the rows are `experts` blocks of one expert's N rows
  // each, quantized per expert along K like any row, and stored as [experts, N, ...]. 0: a plain layer.
  std::int64_t experts = 0;
  Global global;  // nvfp4 only
  // Stacked experts that keep a global scale each (GGUF's per-expert ".scale" vector): one per
  // expert, in expert order; empty when `global` serves them all.
  std::vector<Global> expert_globals;
  std::optional<Global> act;  // static activation scale (W4A4 checkpoints)
  std::span<const std::byte> packed, scales, biases;
  StDType float_dtype = StDType::bf16;  // dtype of affine scales and biases
  std::vector<Source> sources;          // tensors it was read from, the packed one first

  // A layer of `spec`'s mode, group size and bits (resolved), its global scale as an amax, no data.
  static Layer of(std::string module, const QuantSpec& spec, Shape shape);

  QuantSpec spec() const;  // resolved format; global_scale = amax for three-level nvfp4
  std::int64_t rows() const { return shape[0]; }
  std::int64_t cols() const { return shape[1]; }
  // A 2-D shape of this layer's rows as it is stored: [rows, x], or [experts, rows/experts, x].
  Shape stored(std::int64_t cols) const {
    return experts ? Shape{experts, rows() / experts, cols} : Shape{rows(), cols};
  }
  const std::string& primary() const { return sources.front().tensor; }
  // The value convention `c` stores for the global scale: verbatim when it is the stored one
  // (bytes preserved), otherwise through the amax, and then only when it decodes the block scales
  // held to the same values (docs/checkpoints.md, "Global-scale conventions"); throws naming the
  // layer when no value of `c` does (amax 0 or -0 over nonzero block scales, an amax whose
  // reciprocal overflows float32, a decode factor float32 holds only as a denormal).
  float global_as(const ScaleConvention& c) const;
  // The same for the activation scale, whose amax must come back within one float32 ulp.
  float act_as(const ScaleConvention& c) const;
  // Points the data spans at `q`'s buffers, which must outlive the layer.
  void point_at(const Quantized& q);
};

// An owning copy of `l`'s data with its resolved spec (load_checkpoint), and the float weight.
Quantized to_quantized(const Layer& l);
Tensor dequantize_layer(const Layer& l, DType dt);

// A float view of a tensor's bytes; copies into `storage` when the mapping is not aligned for the dtype.
TensorView view_of(std::span<const std::byte> data, StDType st, const Shape& shape, Tensor& storage);

// Every layer leaving a reader (or entering a writer) has a group of at least one element that
// divides K, and sizes that stay far from int64 overflow. Throws naming the layer.
void check_dims(const Layer& l);
// Shape arithmetic on dims from hostile headers and configs: a product that would wrap int64 is
// an error naming the layer, never a silently wrong (negative, truncated) shape.
std::int64_t mul(const std::string& module, std::int64_t a, std::int64_t b, const std::string& what);
[[noreturn]] void layer_error(const std::string& module, const std::string& what);

// A tensor to write: the entry, and its bytes (a span, or a 4-byte scalar kept inline).
struct Out {
  StEntry entry;
  std::span<const std::byte> data;
  std::shared_ptr<const void> owned;  // holds `data` when the layout rearranged the bytes
  std::array<std::byte, 4> scalar{};
  bool inline_scalar = false;
  std::span<const std::byte> bytes() const { return inline_scalar ? std::span<const std::byte>(scalar) : data; }
};
Out entry(std::string name, StDType dt, Shape shape, std::span<const std::byte> data = {});
Out scalar(std::string name, Shape shape, float v);

// Drops the pages of a mapped range from this process (they stay in the page cache), so reading a
// whole checkpoint does not grow the resident set beyond about one tensor.
void release(std::span<const std::byte> bytes);
void release_sources(const Checkpoint& ck, const Layer& l);

std::string fmt_float(double v);

}  // namespace microscale::io::ck
