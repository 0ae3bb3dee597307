// MLX (mlx-lm): nvfp4 (two-level: mlx-lm stores no global scale), mxfp4, mxfp8 (E4M3) and affine.
//   <m>.weight U32 [N, K*bits/32], <m>.scales [N, K/group] (U8 codes for fp modes, the weight's
//   dtype for affine), <m>.biases (affine); config.json "quantization" {group_size, bits, mode}
//   with per-module overrides, mirrored as "quantization_config". Stacked experts (mlx-lm's
//   SwitchLinear, `switch_mlp.gate_proj`, ...) are the same tensors with a leading experts axis.
#include <limits>

#include "io/layout.hpp"

namespace microscale::io::ck {

namespace {

constexpr std::string_view kSuffixes[] = {".weight", ".scales", ".biases"};
constexpr Mode kModes[] = {Mode::nvfp4, Mode::mxfp4, Mode::mxfp8, Mode::affine};

bool is_primary(const Checkpoint& ck, const Json&, std::string_view tensor) {
  return tensor.ends_with(".scales") && ck.contains(module_of(tensor) + ".weight");
}

// MLX's quantization block: the global one with a module's own overrides applied. Integers are
// kept at full width so that a hostile 2^32 + 4 is not read as 4.
struct MlxParams {
  std::optional<std::string> mode;
  std::optional<std::int64_t> group, bits;
};
MlxParams mlx_params(const Json& config, const std::string& m) {
  MlxParams p;
  if (!config.is_object()) return p;
  auto q = config.find("quantization");
  if (q == config.end() || !q->is_object()) {
    q = config.find("quantization_config");
    if (q == config.end() || !q->is_object() || !q->contains("bits")) return p;
  }
  auto integer = [&m](const Json& v, const char* key) -> std::optional<std::int64_t> {
    if (v.is_number_unsigned() &&
        v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      layer_error(m, std::string("config.json gives ") + key + " " + v.dump() + ", out of range");
    if (v.is_number_integer()) return v.get<std::int64_t>();
    if (!v.is_null())
      layer_error(m, std::string("config.json gives ") + key + " " + v.dump() + ", which must be an integer");
    return std::nullopt;
  };
  auto take = [&](const Json& o) {
    if (auto it = o.find("mode"); it != o.end() && it->is_string()) p.mode = it->get<std::string>();
    if (auto it = o.find("group_size"); it != o.end())
      if (auto v = integer(*it, "group_size")) p.group = v;
    if (auto it = o.find("bits"); it != o.end())
      if (auto v = integer(*it, "bits")) p.bits = v;
  };
  take(*q);
  if (auto it = q->find(m); it != q->end() && it->is_object()) take(*it);
  return p;
}

// The fp mode of uint8 scales from the ratio of packed words to scales per row.
std::optional<Mode> mode_from_ratio(std::int64_t words, std::int64_t scales) {
  if (words % scales != 0) return std::nullopt;
  switch (words / scales) {
    case 2: return Mode::nvfp4;
    case 4: return Mode::mxfp4;
    case 8: return Mode::mxfp8;
    default: return std::nullopt;
  }
}

Layer read_mlx(const Checkpoint& ck, const Json& config, const std::string& m) {
  Layer l;
  l.module = m;
  const StTensor& w = need(ck, m, m + ".weight", "packed weights");
  const StTensor& s = need(ck, m, m + ".scales", "scales");
  if (w.dtype != StDType::u32)
    layer_error(m, std::string("MLX packed weight is ") + st_dtype_name(w.dtype) + ", expected U32");
  // [experts, N, x] stacks are read as [experts * N, x], quantized per row all the same.
  auto flat = [&m](const StTensor& t) -> Shape {
    if (t.shape.size() != 3) return rows_cols(t);
    if (t.shape[0] < 1) layer_error(m, "stacked experts tensor " + detail::quote(t.name) + " holds no experts");
    return {mul(m, t.shape[0], t.shape[1], "experts x rows of " + detail::quote(t.name)), t.shape[2]};
  };
  const Shape ws = flat(w), ss = flat(s);
  if (w.shape.size() == 3) l.experts = w.shape[0];
  if (ss[0] != ws[0] || ss[1] == 0 || s.shape.size() != w.shape.size() || s.shape[0] != w.shape[0])
    layer_error(m,
                "scales " + shape_str(ss, ShapeStyle::list) + " do not fit weight " + shape_str(ws, ShapeStyle::list));
  // Bits per packed row, before anything divides by or multiplies the width.
  (void)mul(m, ws[1], 32, "packed weight " + shape_str(ws, ShapeStyle::list) + " U32: bits per row");
  const MlxParams cfg = mlx_params(config, m);
  auto words_to_cols = [&m](std::int64_t words, int bits) {
    if (words * 32 % bits != 0)
      layer_error(m, "packed width does not hold whole " + std::to_string(bits) + "-bit elements");
    return words * 32 / bits;
  };
  l.sources = {{w.name, Role::packed}, {s.name, Role::scales}};
  if (s.dtype == StDType::u8) {
    // fp modes; without a config the ratio of packed words to scales tells them apart.
    if (cfg.mode && *cfg.mode != "affine") {
      l.format.mode = mode_from_name(*cfg.mode);
    } else if (const std::optional<Mode> mode = mode_from_ratio(ws[1], ss[1])) {
      l.format.mode = *mode;
    } else {
      layer_error(m, "cannot tell the fp mode of uint8 scales " + shape_str(ss, ShapeStyle::list) + " for weight " +
                         shape_str(ws, ShapeStyle::list));
    }
    l.format.bits = numerics::default_bits(l.format.mode);
    l.format.group_size = numerics::default_group_size(l.format.mode);
    l.shape = {ws[0], words_to_cols(ws[1], l.format.bits)};
  } else if (s.dtype == StDType::f32 || s.dtype == StDType::f16 || s.dtype == StDType::bf16) {
    if (cfg.mode && *cfg.mode != "affine")
      layer_error(m, "config says mode " + *cfg.mode + " but scales are " + st_dtype_name(s.dtype));
    if (!cfg.bits) layer_error(m, "MLX affine layer, but config.json has no \"quantization\" block giving its bits");
    // Range-checked here because K divides by it; resolve() (via spec()) then takes only 2-6 and 8.
    if (*cfg.bits < 1 || *cfg.bits > 8)
      layer_error(m, "config.json gives bits " + std::to_string(*cfg.bits) + " (expected 2, 3, 4, 5, 6 or 8)");
    l.format.mode = Mode::affine;
    l.format.bits = static_cast<int>(*cfg.bits);
    l.float_dtype = s.dtype;
    l.shape = {ws[0], words_to_cols(ws[1], l.format.bits)};
    const std::int64_t k = l.cols();
    if (k % ss[1] != 0)
      layer_error(m, "scales " + shape_str(ss, ShapeStyle::list) + " do not divide K = " + std::to_string(k));
    const std::int64_t group = k / ss[1];
    if (group < 1 || group > 1024)
      layer_error(m, "scales " + shape_str(ss, ShapeStyle::list) + " over K = " + std::to_string(k) +
                         " give group size " + std::to_string(group) + " (MLX affine uses 32, 64 or 128)");
    // Any bits whose K the scale columns divide would pass the checks above: the config's group
    // size is what tells a contradiction from a layer of other bits.
    if (cfg.group && *cfg.group != group)
      layer_error(m, "config.json gives bits " + std::to_string(*cfg.bits) + " and group_size " +
                         std::to_string(*cfg.group) + ", but then weight " + shape_str(w.shape, ShapeStyle::list) +
                         " holds K = " + std::to_string(k) + " values a row (" + std::to_string(ws[1]) + " x 32 / " +
                         std::to_string(*cfg.bits) + ") and scales " + shape_str(s.shape, ShapeStyle::list) +
                         " groups of " + std::to_string(group) + ", not " + std::to_string(*cfg.group) +
                         ": the config contradicts the tensors");
    l.format.group_size = static_cast<int>(group);
    const StTensor& b = need(ck, m, m + ".biases", "affine biases");
    check_shape(b, s.dtype, s.shape);
    l.biases = b.data;
    l.sources.push_back({b.name, Role::biases});
  } else {
    layer_error(m, std::string("MLX scales of dtype ") + st_dtype_name(s.dtype));
  }
  if (cfg.group && l.format.mode != Mode::affine && *cfg.group != l.format.group_size && cfg.mode)
    layer_error(m, "config group_size " + std::to_string(*cfg.group) + " does not match " + name(l.format.mode));
  check_dims(l);
  check_shape(s, s.dtype, l.stored(l.cols() / l.format.group_size));
  l.packed = w.data;
  l.scales = s.data;
  (void)l.spec();  // validates mode/group/bits
  return l;
}

void check_spec(const QuantSpec& spec) {
  if (spec.mode == Mode::mxfp8 && spec.elem != Elem::e4m3)
    throw Error("MLX mxfp8 is E4M3; E5M2 elements have no MLX layout");
}

void emit_mlx(const Layer& l, std::vector<Out>& out) {
  const std::string& m = l.module;
  const std::int64_t k = l.cols();
  if (l.format.mode == Mode::nvfp4 && l.global.three_level() && l.global.to_amax() != k2688)
    layer_error(m, "MLX (mlx-lm) nvfp4 is two-level and stores no global scale, but this layer has " +
                       l.global.describe() +
                       "; its bytes cannot be kept. Re-quantize instead: microscale dequantize, then "
                       "microscale quantize --export mlx");
  if (k * l.format.bits % 32 != 0) layer_error(m, "K * bits is not a multiple of 32 (MLX packs uint32 words)");
  out.push_back(entry(m + ".weight", StDType::u32, l.stored(k * l.format.bits / 32), l.packed));
  const StDType sd = l.format.mode == Mode::affine ? l.float_dtype : StDType::u8;
  out.push_back(entry(m + ".scales", sd, l.stored(k / l.format.group_size), l.scales));
  if (l.format.mode == Mode::affine)
    out.push_back(entry(m + ".biases", sd, l.stored(k / l.format.group_size), l.biases));
}

Json write_config(Json& config, const Scheme& common, const Json&, const QuantMeta& meta) {
  const auto [mode, group, bits] = common;
  Json q = {{"group_size", group}, {"bits", bits}, {"mode", name(mode)}};
  for (const Layer* l : meta.layers)
    if (l->format.mode != mode || l->format.group_size != group || l->format.bits != bits)
      q[l->module] = {{"group_size", l->format.group_size}, {"bits", l->format.bits}, {"mode", name(l->format.mode)}};
  config["quantization"] = q;
  config["quantization_config"] = q;
  return nullptr;
}

}  // namespace

constinit const LayoutOps kMlxLayout{
    .convention = Convention::mlx,
    .name = "mlx",
    .alias = nullptr,
    .title = "MLX",
    .supported = "MLX",
    .suffixes = kSuffixes,
    .global_scale = false,
    .activation_scales = false,
    .stacked_experts = true,
    .per_layer_schemes = true,
    .shard_format = "mlx",  // what mlx.core.save_safetensors writes
    .is_primary = is_primary,
    .read = read_mlx,
    .default_scale_rule = nullptr,
    .check_spec = check_spec,
    .emit = emit_mlx,
    .write_config = write_config,
    .row_block = nullptr,
    .write_file = nullptr,
    .keeps_fp8_groups = false,
    .modes = kModes,
    .default_modes = kModes,
};

}  // namespace microscale::io::ck
