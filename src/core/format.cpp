#include "microscale/format.hpp"

#include <cmath>

#include "core/numerics.hpp"
#include "microscale/dtype.hpp"

namespace microscale {
namespace {

template <class E, std::size_t N>
E parse(const std::string& s, const E (&all)[N], const char* what) {
  std::string options;
  for (E e : all) {
    if (s == name(e)) return e;
    options += options.empty() ? "" : ", ";
    options += name(e);
  }
  throw Error(std::string("unknown ") + what + " '" + s + "' (expected one of " + options + ")");
}

}  // namespace

const char* name(Mode m) {
  switch (m) {
    case Mode::nvfp4: return "nvfp4";
    case Mode::mxfp4: return "mxfp4";
    case Mode::mxfp8: return "mxfp8";
    case Mode::affine: return "affine";
  }
  return "?";
}
const char* name(ScaleRule r) {
  switch (r) {
    case ScaleRule::ceil: return "ceil";
    case ScaleRule::floor: return "floor";
    case ScaleRule::even: return "even";
    case ScaleRule::nearest: return "nearest";
  }
  return "?";
}
const char* name(NonFinite n) {
  switch (n) {
    case NonFinite::propagate: return "propagate";
    case NonFinite::error: return "error";
    case NonFinite::saturate: return "saturate";
  }
  return "?";
}
const char* name(Layout l) { return l == Layout::compact ? "compact" : "swizzled"; }
const char* name(Elem e) { return e == Elem::e4m3 ? "e4m3" : "e5m2"; }
const char* name(ScaleSearch s) {
  switch (s) {
    case ScaleSearch::none: return "none";
    case ScaleSearch::four_over_six: return "4over6";
    case ScaleSearch::mse: return "mse";
  }
  return "?";
}

Mode mode_from_name(const std::string& s) {
  static constexpr Mode all[] = {Mode::nvfp4, Mode::mxfp4, Mode::mxfp8, Mode::affine};
  return parse(s, all, "mode");
}
ScaleRule scale_rule_from_name(const std::string& s) {
  static constexpr ScaleRule all[] = {ScaleRule::ceil, ScaleRule::floor, ScaleRule::even, ScaleRule::nearest};
  return parse(s, all, "scale_rule");
}
NonFinite nonfinite_from_name(const std::string& s) {
  static constexpr NonFinite all[] = {NonFinite::propagate, NonFinite::error, NonFinite::saturate};
  return parse(s, all, "nonfinite policy");
}
Layout layout_from_name(const std::string& s) {
  static constexpr Layout all[] = {Layout::compact, Layout::swizzled};
  return parse(s, all, "layout");
}
Elem elem_from_name(const std::string& s) {
  static constexpr Elem all[] = {Elem::e4m3, Elem::e5m2};
  return parse(s, all, "elem");
}
ScaleSearch scale_search_from_name(const std::string& s) {
  static constexpr ScaleSearch all[] = {ScaleSearch::none, ScaleSearch::four_over_six, ScaleSearch::mse};
  return parse(s, all, "scale_search");
}

QuantSpec resolve(const QuantSpec& spec) {
  QuantSpec r = spec;
  const std::string mode = name(spec.mode);
  auto require = [&](bool ok, const std::string& msg) {
    if (!ok) throw Error(mode + ": " + msg);
  };
  const bool fp = spec.mode != Mode::affine;
  const int default_group = numerics::default_group_size(spec.mode);
  const int default_bits = numerics::default_bits(spec.mode);
  if (r.group_size == 0) r.group_size = default_group;
  if (r.bits == 0) r.bits = default_bits;
  if (fp) {
    require(r.group_size == default_group, "group_size " + std::to_string(r.group_size) + " is not supported (only " +
                                               std::to_string(default_group) + ")");
    require(r.bits == default_bits,
            "bits " + std::to_string(r.bits) + " is not supported (only " + std::to_string(default_bits) + ")");
  } else {
    require(r.group_size == 32 || r.group_size == 64 || r.group_size == 128,
            "group_size " + std::to_string(r.group_size) + " is not supported (32, 64 or 128)");
    require(r.bits == 2 || r.bits == 3 || r.bits == 4 || r.bits == 5 || r.bits == 6 || r.bits == 8,
            "bits " + std::to_string(r.bits) + " is not supported (2, 3, 4, 5, 6 or 8)");
    require(r.layout == Layout::compact, "the swizzled scale layout is for fp modes only (affine scales are floats)");
  }
  require(r.elem == Elem::e4m3 || r.mode == Mode::mxfp8, "elem is an mxfp8 option");
  require(r.scale_rule == ScaleRule::ceil || r.mode == Mode::mxfp4 || r.mode == Mode::mxfp8,
          std::string("scale_rule '") + name(r.scale_rule) + "' is an option of the E8M0-scaled modes (mxfp4, mxfp8)");
  // 4over6 is defined for nvfp4's E4M3 scales only; mse searches the E4M3 and E8M0 scales of fp4.
  const std::string search = std::string("scale_search '") + name(r.scale_search) + "' is only defined for ";
  require(r.scale_search != ScaleSearch::four_over_six || r.mode == Mode::nvfp4,
          search + "nvfp4, not " + mode + " (use 'mse' for mxfp4, or 'none')");
  require(r.scale_search != ScaleSearch::mse || r.mode == Mode::nvfp4 || r.mode == Mode::mxfp4,
          search + "nvfp4 and mxfp4, not " + mode + " (use 'none')");
  // The training recipe's options (docs/numerics.md): 2D tiles are defined for nvfp4's E4M3
  // scales, stochastic rounding for E2M1 elements; neither combines with a scale search, which
  // scores candidates by their round-to-nearest error.
  require(!r.scale_2d || r.mode == Mode::nvfp4, "scale_2d (16x16 scale tiles) is only defined for nvfp4");
  require(!r.scale_2d || r.scale_search == ScaleSearch::none,
          "scale_2d cannot be combined with scale_search (use one or the other)");
  require(!r.hadamard || fp, "hadamard (the random Hadamard transform) is for the fp modes, not affine");
  require(!r.sr_seed || r.mode == Mode::nvfp4 || r.mode == Mode::mxfp4,
          "sr_seed (stochastic rounding) is only defined for the E2M1 elements of nvfp4 and mxfp4");
  require(!r.sr_seed || r.scale_search == ScaleSearch::none,
          "sr_seed (stochastic rounding) cannot be combined with scale_search (use one or the other)");
  if (r.global_scale) {
    require(r.mode == Mode::nvfp4, "global_scale is only supported by nvfp4");
    const float g = *r.global_scale;
    require(!std::isnan(g), "global_scale is NaN");
    require(!std::isinf(g), "global_scale is infinite");
    require(g >= 0.0f, "global_scale must be >= 0 (it is the tensor amax), got " + std::to_string(g));
  }
  return r;
}

QqmmSpecs resolve_qqmm(const QuantSpec& spec, std::optional<float> global_scale_x,
                       std::optional<float> global_scale_w) {
  auto require = [](bool ok, const char* msg) {
    if (!ok) throw Error(msg);
  };
  require(spec.mode != Mode::affine, "qqmm: mode must be nvfp4, mxfp4 or mxfp8 (affine has no quantized activations)");
  require(!spec.global_scale, "qqmm: pass global_scale_x and global_scale_w, not spec.global_scale");
  require(global_scale_x.has_value() == global_scale_w.has_value(),
          "qqmm: nvfp4 takes both global_scale_x and global_scale_w, or neither");
  QqmmSpecs out{spec, spec, 1.0f};
  out.x.global_scale = global_scale_x;
  out.w.global_scale = global_scale_w;
  out.x.layout = Layout::compact;
  out.x = resolve(out.x);
  out.w = resolve(out.w);
  if (global_scale_x) out.alpha = numerics::nvfp4_product_decode(*global_scale_x, *global_scale_w);
  return out;
}

double bits_per_value(const QuantSpec& resolved, int scale_bits) {
  const double g = resolved.group_size;
  if (resolved.mode == Mode::affine) return resolved.bits + 2.0 * scale_bits / g;
  return resolved.bits + 8.0 / g;
}

}  // namespace microscale
