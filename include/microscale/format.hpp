// Quantization modes and their options. Defaults are FORMATS.md section 2 (the contract).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace microscale {

enum class Mode { nvfp4, mxfp4, mxfp8, affine };
// E8M0 scale rule of the mx modes (FORMATS.md 2.2): ceil = TE/cuBLAS (default), floor = OCP MX v1.0,
// even = torchao EVEN / compressed-tensors, nearest = MLX 0.32.2 CPU.
enum class ScaleRule { ceil, floor, even, nearest };
// What a block holding NaN or +-Inf becomes (FORMATS.md 2.4).
enum class NonFinite { propagate, error, saturate };
// Scale storage: row-major [rows, K/group], or cuBLAS's 128x4 block-scaling tiles (FORMATS.md 4).
enum class Layout { compact, swizzled };
// Element format of mxfp8.
enum class Elem { e4m3, e5m2 };
// How fp4 block scales are chosen (docs/numerics.md, "Scale search"): none = round-to-nearest from the
// block max (the default); four_over_six ("4over6", nvfp4) = the block max maps to 6 or to 4,
// whichever decodes closer; mse (nvfp4, mxfp4) = the nearby scale with the least squared error,
// plus a search over the global scale for three-level nvfp4. The bytes stay standard.
enum class ScaleSearch { none, four_over_six, mse };

struct QuantSpec {
  Mode mode = Mode::nvfp4;
  int group_size = 0;  // 0: the mode's default (nvfp4 16, mx 32, affine 64)
  int bits = 0;        // 0: the mode's default (fp4 4, mxfp8 8, affine 4)
  ScaleRule scale_rule = ScaleRule::ceil;
  NonFinite nonfinite = NonFinite::propagate;
  Layout layout = Layout::compact;
  Elem elem = Elem::e4m3;
  ScaleSearch scale_search = ScaleSearch::none;
  // nvfp4 only: the tensor's amax as float32 (not an encode or decode factor). Present means
  // three-level NVFP4; must be finite and >= 0.
  std::optional<float> global_scale;
  // The NVFP4 training recipe (docs/numerics.md, "Training-recipe numerics"); all off by default.
  // nvfp4 only: one scale per 16x16 tile (16 rows x 16 K-columns; rows are the leading axes
  // flattened), repeated in the compact scales of the tile's 16 rows, so W and W^T quantize to
  // transposes of each other.
  bool scale_2d = false;
  // fp modes: quantize hadamard_transform(x) (the 16-point random Hadamard transform along K)
  // instead of x; a global_scale must then be the amax of the transformed tensor.
  bool hadamard = false;
  // nvfp4 and mxfp4: present = E2M1 elements are rounded stochastically, with random bits keyed
  // by (this seed, the element's row-major flat index): reproducible on every backend and
  // thread count.
  std::optional<std::uint64_t> sr_seed;
};

// Fills in default group_size and bits and checks every field against the mode; throws Error
// with the reason otherwise.
QuantSpec resolve(const QuantSpec& spec);

// qqmm's two operands from one spec and the two global scales: x (quantized on the fly, compact
// layout) and w resolved, and alpha, the factor the float32 sum takes (the product of both
// three-level decode factors, 1 for two-level). Throws Error for affine, for spec.global_scale
// set, and for one global scale without the other.
struct QqmmSpecs {
  QuantSpec x, w;
  float alpha = 1.0f;
};
QqmmSpecs resolve_qqmm(const QuantSpec& spec, std::optional<float> global_scale_x, std::optional<float> global_scale_w);

Mode mode_from_name(const std::string& s);
ScaleRule scale_rule_from_name(const std::string& s);
NonFinite nonfinite_from_name(const std::string& s);
Layout layout_from_name(const std::string& s);
Elem elem_from_name(const std::string& s);
ScaleSearch scale_search_from_name(const std::string& s);
const char* name(Mode m);
const char* name(ScaleRule r);
const char* name(NonFinite n);
const char* name(Layout l);
const char* name(Elem e);
const char* name(ScaleSearch s);

// Storage cost in bits per value, scales (and affine biases in `scale_bits`-wide floats) included;
// the 32-bit global scale is per tensor and not counted.
double bits_per_value(const QuantSpec& resolved, int scale_bits = 16);

}  // namespace microscale
