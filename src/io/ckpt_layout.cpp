// How compressed-tensors, ModelOpt and MLX name, type and shape the tensors of a quantized layer,
// how their global scales relate (docs/checkpoints.md), and the config blocks that announce them.
#include <cfloat>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include "io/ckpt_detail.hpp"

namespace microscale::io {

const char* name(Convention c) {
  switch (c) {
    case Convention::compressed_tensors: return "compressed-tensors";
    case Convention::modelopt: return "modelopt";
    case Convention::mlx: return "mlx";
  }
  return "?";
}

Convention convention_from_name(std::string_view s) {
  if (s == "compressed-tensors" || s == "ct") return Convention::compressed_tensors;
  if (s == "modelopt") return Convention::modelopt;
  if (s == "mlx") return Convention::mlx;
  throw Error("unknown export format '" + std::string(s) + "' (expected compressed-tensors, modelopt or mlx)");
}

std::string why_kept(std::string_view name, const Shape& shape, StDType dtype) {
  if (!ck::ends_with(name, ".weight")) return "not a .weight";
  if (shape.size() != 2) return std::to_string(shape.size()) + "-D";
  if (dtype != StDType::f32 && dtype != StDType::bf16 && dtype != StDType::f16)
    return std::string("dtype ") + st_dtype_name(dtype);
  const std::string m = ck::module_of(name);
  const std::string last = m.substr(m.rfind('.') + 1);
  if (last == "lm_head") return "lm_head";
  if (m.find("embed") != std::string::npos || last == "wte" || last == "wpe") return "embedding";
  if (m.find("norm") != std::string::npos || last.rfind("ln", 0) == 0) return "norm";
  // MoE routers: tiny, and every runtime keeps them in high precision.
  if (last == "gate" || last == "router" || last == "shared_expert_gate") return "router";
  return "";
}

namespace ck {

namespace {

constexpr float k2688 = 2688.0f;

// S_enc of FORMATS.md 2.1: the encode factor microscale's nvfp4 quantizer uses for `amax`.
float s_enc(float amax) {
  float s = std::fmin(k2688 / amax, FLT_MAX);
  if (amax == 0 || s == 0) s = 1.0f;
  return s;
}

std::string quote(std::string_view s) { return detail::quote(s); }

[[noreturn]] void layer_error(const std::string& module, const std::string& what) {
  throw Error("layer " + quote(module) + ": " + what);
}

// Shape arithmetic on dims from hostile headers and configs: a product that would wrap int64 is
// an error naming the layer, never a silently wrong (negative, truncated) shape.
std::int64_t mul(const std::string& module, std::int64_t a, std::int64_t b, const std::string& what) {
  std::int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    layer_error(module, what + ": " + std::to_string(a) + " x " + std::to_string(b) + " overflows 64 bits");
  return r;
}

// Every layer leaving a reader (or entering a writer) has a group of at least one element that
// divides K, and sizes that stay far from int64 overflow: the logical tensor in 8-byte floats and a
// row in bits of the widest dtype. Downstream code may then multiply and divide these freely.
void check_dims(const Layer& l) {
  const std::string& m = l.module;
  if (l.shape.size() != 2 || l.rows() < 0 || l.cols() < 0)
    layer_error(m, "logical shape " + fmt_shape(l.shape) + " is not a 2-D shape");
  if (l.group < 1) layer_error(m, "group size " + std::to_string(l.group) + " (must be at least 1)");
  if (l.cols() % l.group != 0)
    layer_error(m, "K = " + std::to_string(l.cols()) + " is not a multiple of the group size " + std::to_string(l.group));
  (void)mul(m, mul(m, l.rows(), l.cols(), "elements of " + fmt_shape(l.shape)), 8, "bytes of " + fmt_shape(l.shape));
  (void)mul(m, l.cols(), 64, "bits in a row of K = " + std::to_string(l.cols()));
}

// K of a packed weight: its width in `item_bits`-bit words (U8 or U32) holding `bits`-bit elements.
std::int64_t unpacked_cols(const std::string& m, const StTensor& packed, int item_bits, int bits) {
  const std::int64_t total = mul(m, packed.shape[1], item_bits,
                                 "packed weight " + fmt_shape(packed.shape) + " " + st_dtype_name(packed.dtype) + ": bits per row");
  if (total % bits != 0) layer_error(m, "packed width does not hold whole " + std::to_string(bits) + "-bit elements");
  return total / bits;
}

float scalar_f32(const StTensor& t, const std::string& what) {
  if (t.dtype != StDType::f32 || t.numel() != 1)
    throw Error("tensor " + quote(t.name) + " (" + what + ") must be one F32 value, got " +
                st_dtype_name(t.dtype) + " " + fmt_shape(t.shape));
  float v;
  std::memcpy(&v, t.data.data(), 4);
  return v;
}

Out entry(std::string name, StDType dt, Shape shape, std::span<const std::byte> data = {}) {
  Out o;
  o.entry = {std::move(name), dt, std::move(shape)};
  o.data = data;
  return o;
}
Out scalar(std::string name, Shape shape, float v) {
  Out o = entry(std::move(name), StDType::f32, std::move(shape));
  std::memcpy(o.scalar.data(), &v, 4);
  o.inline_scalar = true;
  return o;
}

}  // namespace

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string module_of(std::string_view n) {
  for (std::string_view suf : {".weight_packed", ".weight_scale_2", ".weight_global_scale", ".weight_scale",
                               ".input_global_scale", ".input_scale", ".weight", ".scales", ".biases"})
    if (ends_with(n, suf)) return std::string(n.substr(0, n.size() - suf.size()));
  return std::string(n);
}

std::string fmt_shape(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string fmt_float(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// ---- global scales

float Global::to_amax() const {
  switch (kind) {
    case none: return k2688;
    case amax: return value;
    case ct_encode: return k2688 / value;
    case modelopt_decode: return value * k2688;
  }
  return value;
}

float Global::as(Kind k) const {
  if (k == kind) return value;
  if (kind == none) return k == amax ? k2688 : 1.0f;
  const float a = to_amax();
  switch (k) {
    case ct_encode: return s_enc(a);
    // amax 0: every block scale is 0, so any factor decodes to 0; 1 keeps readers from dividing
    // by zero and matches the encode factor 1 of FORMATS.md 2.1.
    case modelopt_decode: return a == 0 ? 1.0f : a / k2688;
    default: return a;
  }
}

std::string Global::describe() const {
  switch (kind) {
    case none: return "two-level (no global scale)";
    case amax: return "amax " + fmt_float(value);
    case ct_encode:
      return "weight_global_scale " + fmt_float(value) + " = 2688/amax -> amax " + fmt_float(to_amax());
    case modelopt_decode:
      return "weight_scale_2 " + fmt_float(value) + " = amax/2688 -> amax " + fmt_float(to_amax());
  }
  return "";
}

QuantSpec Layer::spec() const {
  QuantSpec s;
  s.mode = mode;
  s.group_size = group;
  s.bits = bits;
  if (mode == Mode::nvfp4 && global.kind != Global::none) s.global_scale = global.to_amax();
  try {
    return resolve(s);
  } catch (const Error& e) {
    layer_error(module, e.what());
  }
}

// ---- writing a layer

std::vector<Out> emit(const Layer& l, Convention c) {
  check_dims(l);
  const std::string& m = l.module;
  const std::int64_t n = l.rows(), k = l.cols();
  std::vector<Out> out;
  switch (c) {
    case Convention::compressed_tensors:
      if (l.mode == Mode::nvfp4) {
        out.push_back(entry(m + ".weight_packed", StDType::u8, {n, k / 2}, l.packed));
        out.push_back(entry(m + ".weight_scale", StDType::f8_e4m3, {n, k / 16}, l.scales));
        out.push_back(scalar(m + ".weight_global_scale", {1}, l.global.as(Global::ct_encode)));
        if (l.act) out.push_back(scalar(m + ".input_global_scale", {1}, l.act->as(Global::ct_encode)));
      } else if (l.mode == Mode::mxfp4) {
        out.push_back(entry(m + ".weight_packed", StDType::u8, {n, k / 2}, l.packed));
        out.push_back(entry(m + ".weight_scale", StDType::u8, {n, k / 32}, l.scales));
      } else {
        layer_error(m, std::string("compressed-tensors has no layout for ") + name(l.mode) + " " +
                           std::to_string(l.bits) + "-bit (it takes nvfp4 and mxfp4)");
      }
      break;
    case Convention::modelopt:
      if (l.mode != Mode::nvfp4)
        layer_error(m, std::string("ModelOpt export holds nvfp4 only, not ") + name(l.mode));
      out.push_back(entry(m + ".weight", StDType::u8, {n, k / 2}, l.packed));
      out.push_back(entry(m + ".weight_scale", StDType::f8_e4m3, {n, k / 16}, l.scales));
      out.push_back(scalar(m + ".weight_scale_2", {}, l.global.as(Global::modelopt_decode)));
      if (l.act) out.push_back(scalar(m + ".input_scale", {}, l.act->as(Global::modelopt_decode)));
      break;
    case Convention::mlx: {
      if (l.mode == Mode::nvfp4 && l.global.kind != Global::none && l.global.to_amax() != k2688)
        layer_error(m, "MLX (mlx-lm) nvfp4 is two-level and stores no global scale, but this layer has " +
                           l.global.describe() +
                           "; its bytes cannot be kept. Re-quantize instead: microscale dequantize, then "
                           "microscale quantize --export mlx");
      if (k * l.bits % 32 != 0) layer_error(m, "K * bits is not a multiple of 32 (MLX packs uint32 words)");
      out.push_back(entry(m + ".weight", StDType::u32, {n, k * l.bits / 32}, l.packed));
      const StDType sd = l.mode == Mode::affine ? l.float_dtype : StDType::u8;
      out.push_back(entry(m + ".scales", sd, {n, k / l.group}, l.scales));
      if (l.mode == Mode::affine) out.push_back(entry(m + ".biases", sd, {n, k / l.group}, l.biases));
      break;
    }
  }
  return out;
}

// ---- reading layers

namespace {

const StTensor* find(const Checkpoint& ck, const std::string& name) {
  return ck.contains(name) ? &ck.tensor(name) : nullptr;
}

const StTensor& need(const Checkpoint& ck, const std::string& module, const std::string& name, const char* what) {
  const StTensor* t = find(ck, name);
  if (!t) layer_error(module, "missing tensor " + quote(name) + " (" + what + ")");
  return *t;
}

void check_shape(const StTensor& t, StDType dt, const Shape& shape) {
  if (t.dtype != dt || t.shape != shape)
    throw Error("tensor " + quote(t.name) + " is " + st_dtype_name(t.dtype) + " " + fmt_shape(t.shape) +
                ", expected " + st_dtype_name(dt) + " " + fmt_shape(shape));
}

Shape rows_cols(const StTensor& t) {
  if (t.shape.size() != 2)
    throw Error("tensor " + quote(t.name) + " has shape " + fmt_shape(t.shape) + "; only 2-D quantized weights are supported");
  return t.shape;
}

// A stored scale must be finite and so must the amax it stands for: 2688 / 1e-40 is not, and a
// layer every operation would refuse later must be refused by all of them up front.
void check_global(const Layer& l) {
  auto bad = [](const Global& g) {
    const float v = g.value;
    return (g.kind == Global::ct_encode ? !(std::isfinite(v) && v > 0) : !(std::isfinite(v) && v >= 0)) ||
           !std::isfinite(g.to_amax());
  };
  if (bad(l.global)) layer_error(l.module, "invalid global scale: " + l.global.describe());
  if (l.act && bad(*l.act)) layer_error(l.module, "invalid activation scale: " + l.act->describe());
}

Layer read_ct(const Checkpoint& ck, const std::string& m) {
  Layer l;
  l.module = m;
  const StTensor& p = need(ck, m, m + ".weight_packed", "packed weights");
  if (p.dtype != StDType::u8)
    layer_error(m, "weight_packed is " + std::string(st_dtype_name(p.dtype)) +
                       "; only the nvfp4-pack-quantized and mxfp4-pack-quantized formats (uint8) are supported");
  const Shape pk = rows_cols(p);
  l.shape = {pk[0], unpacked_cols(m, p, 8, 4)};
  const StTensor& s = need(ck, m, m + ".weight_scale", "block scales");
  l.sources = {p.name, s.name};
  if (s.dtype == StDType::f8_e4m3) {
    l.mode = Mode::nvfp4;
    l.group = 16;
    const StTensor& g = need(ck, m, m + ".weight_global_scale", "global scale");
    l.global = {Global::ct_encode, scalar_f32(g, "global scale")};
    l.sources.push_back(g.name);
    if (const StTensor* a = find(ck, m + ".input_global_scale")) {
      l.act = Global{Global::ct_encode, scalar_f32(*a, "activation global scale")};
      l.sources.push_back(a->name);
    }
  } else if (s.dtype == StDType::u8 || s.dtype == StDType::f8_e8m0) {
    l.mode = Mode::mxfp4;
    l.group = 32;
  } else {
    layer_error(m, std::string("weight_scale dtype ") + st_dtype_name(s.dtype) + " is neither F8_E4M3 (nvfp4) nor U8 (mxfp4)");
  }
  check_dims(l);
  check_shape(s, s.dtype, {l.rows(), l.cols() / l.group});
  l.packed = p.data;
  l.scales = s.data;
  check_global(l);
  (void)l.spec();  // validates mode/group/bits and the global scale
  return l;
}

Layer read_modelopt(const Checkpoint& ck, const std::string& m) {
  Layer l;
  l.module = m;
  const StTensor& p = need(ck, m, m + ".weight", "packed weights");
  const StTensor& s = need(ck, m, m + ".weight_scale", "block scales");
  const StTensor& g = need(ck, m, m + ".weight_scale_2", "global scale");
  if (p.dtype != StDType::u8 || s.dtype != StDType::f8_e4m3)
    layer_error(m, std::string("ModelOpt layer with weight ") + st_dtype_name(p.dtype) + " and weight_scale " +
                       st_dtype_name(s.dtype) + " is not NVFP4 (expected U8 and F8_E4M3)");
  const Shape pk = rows_cols(p);
  l.shape = {pk[0], unpacked_cols(m, p, 8, 4)};
  l.mode = Mode::nvfp4;
  l.group = 16;
  check_dims(l);
  check_shape(s, StDType::f8_e4m3, {l.rows(), l.cols() / 16});
  l.global = {Global::modelopt_decode, scalar_f32(g, "weight_scale_2")};
  l.sources = {p.name, s.name, g.name};
  if (const StTensor* a = find(ck, m + ".input_scale")) {
    l.act = Global{Global::modelopt_decode, scalar_f32(*a, "input_scale")};
    l.sources.push_back(a->name);
  }
  l.packed = p.data;
  l.scales = s.data;
  check_global(l);
  (void)l.spec();  // validates mode/group/bits and the global scale
  return l;
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
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      layer_error(m, std::string("config.json gives ") + key + " " + v.dump() + ", out of range");
    if (v.is_number_integer()) return v.get<std::int64_t>();
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

Layer read_mlx(const Checkpoint& ck, const Json& config, const std::string& m) {
  Layer l;
  l.module = m;
  const StTensor& w = need(ck, m, m + ".weight", "packed weights");
  const StTensor& s = need(ck, m, m + ".scales", "scales");
  if (w.dtype != StDType::u32) layer_error(m, std::string("MLX packed weight is ") + st_dtype_name(w.dtype) + ", expected U32");
  const Shape ws = rows_cols(w), ss = rows_cols(s);
  if (ss[0] != ws[0] || ss[1] == 0) layer_error(m, "scales " + fmt_shape(ss) + " do not fit weight " + fmt_shape(ws));
  // Bits per packed row, before anything divides by or multiplies the width.
  (void)mul(m, ws[1], 32, "packed weight " + fmt_shape(ws) + " U32: bits per row");
  const MlxParams cfg = mlx_params(config, m);
  l.sources = {w.name, s.name};
  if (s.dtype == StDType::u8) {
    // fp modes; without a config the ratio of packed words to scales tells them apart.
    std::string mode;
    if (cfg.mode && *cfg.mode != "affine") {
      mode = *cfg.mode;
    } else {
      const std::int64_t r = ws[1] % ss[1] == 0 ? ws[1] / ss[1] : 0;
      mode = r == 2 ? "nvfp4" : r == 4 ? "mxfp4" : r == 8 ? "mxfp8" : "";
      if (mode.empty()) layer_error(m, "cannot tell the fp mode of uint8 scales " + fmt_shape(ss) + " for weight " + fmt_shape(ws));
    }
    l.mode = mode_from_name(mode);
    l.bits = l.mode == Mode::mxfp8 ? 8 : 4;
    l.group = l.mode == Mode::nvfp4 ? 16 : 32;
    l.shape = {ws[0], unpacked_cols(m, w, 32, l.bits)};
  } else if (s.dtype == StDType::f32 || s.dtype == StDType::f16 || s.dtype == StDType::bf16) {
    if (cfg.mode && *cfg.mode != "affine") layer_error(m, "config says mode " + *cfg.mode + " but scales are " + st_dtype_name(s.dtype));
    if (!cfg.bits) layer_error(m, "MLX affine layer, but config.json has no \"quantization\" block giving its bits");
    // Range-checked here because K divides by it; resolve() (via spec()) then takes only 2-6 and 8.
    if (*cfg.bits < 1 || *cfg.bits > 8)
      layer_error(m, "config.json gives bits " + std::to_string(*cfg.bits) + " (expected 2, 3, 4, 5, 6 or 8)");
    l.mode = Mode::affine;
    l.bits = static_cast<int>(*cfg.bits);
    l.float_dtype = s.dtype;
    l.shape = {ws[0], unpacked_cols(m, w, 32, l.bits)};
    const std::int64_t k = l.cols();
    if (k % ss[1] != 0) layer_error(m, "scales " + fmt_shape(ss) + " do not divide K = " + std::to_string(k));
    const std::int64_t group = k / ss[1];
    if (group < 1 || group > 1024)
      layer_error(m, "scales " + fmt_shape(ss) + " over K = " + std::to_string(k) + " give group size " +
                         std::to_string(group) + " (MLX affine uses 32, 64 or 128)");
    l.group = static_cast<int>(group);
    const StTensor& b = need(ck, m, m + ".biases", "affine biases");
    check_shape(b, s.dtype, ss);
    l.biases = b.data;
    l.sources.push_back(b.name);
  } else {
    layer_error(m, std::string("MLX scales of dtype ") + st_dtype_name(s.dtype));
  }
  if (cfg.group && l.mode != Mode::affine && *cfg.group != l.group && cfg.mode)
    layer_error(m, "config group_size " + std::to_string(*cfg.group) + " does not match " + name(l.mode));
  check_dims(l);
  check_shape(s, s.dtype, {l.rows(), l.cols() / l.group});
  l.packed = w.data;
  l.scales = s.data;
  (void)l.spec();  // validates mode/group/bits
  return l;
}

}  // namespace

Detected detect(const Checkpoint& ck, const Json& config) {
  Detected d;
  std::set<std::string> kinds;
  for (const std::string& n : ck.names()) {
    if (d.consumed.count(n)) continue;
    std::optional<Layer> l;
    if (ends_with(n, ".weight_packed")) {
      l = read_ct(ck, module_of(n));
      kinds.insert("compressed-tensors");
    } else if (ends_with(n, ".weight_scale_2")) {
      l = read_modelopt(ck, module_of(n));
      kinds.insert("modelopt");
    } else if (ends_with(n, ".scales") && ck.contains(module_of(n) + ".weight")) {
      l = read_mlx(ck, config, module_of(n));
      kinds.insert("mlx");
    }
    if (!l) continue;
    for (const std::string& s : l->sources) d.consumed.insert(s);
    d.layers.push_back(std::move(*l));
  }
  // A tensor named like a part of a quantized layer that the layer's layout does not read (a
  // ModelOpt layer beside "m.input_global_scale", say) is a mix of layouts: another layout would
  // read it as part of the layer, so it can neither be dropped nor copied through.
  std::set<std::string> modules;
  for (const Layer& l : d.layers) modules.insert(l.module);
  // Quantized data we cannot interpret: 8-bit float weights (FP8 checkpoints), leftover scales.
  for (const std::string& n : ck.names()) {
    if (d.consumed.count(n)) continue;
    if (const std::string m = module_of(n); m != n && modules.count(m)) {
      d.strays.push_back(n);
      continue;
    }
    const StTensor& t = ck.tensor(n);
    const bool fp8 = t.dtype == StDType::f8_e4m3 || t.dtype == StDType::f8_e5m2 || t.dtype == StDType::f4 ||
                     t.dtype == StDType::f8_e8m0;
    if (fp8 || ends_with(n, ".weight_scale") || ends_with(n, ".weight_zero_point") || ends_with(n, ".weight_shape"))
      d.unsupported.push_back(n);
  }
  if (kinds.size() > 1) {
    std::string all;
    for (const std::string& k : kinds) all += (all.empty() ? "" : ", ") + k;
    throw Error("checkpoint mixes quantized layouts (" + all + ")");
  }
  if (!kinds.empty()) d.convention = *kinds.begin();
  return d;
}

std::vector<std::vector<std::string>> fused_groups(const std::vector<std::string>& modules) {
  static const std::vector<std::vector<std::string>> sets = {
      {"q_proj", "k_proj", "v_proj"}, {"gate_proj", "up_proj"}, {"query", "key", "value"},
      {"w1", "w3"},                   {"wq", "wk", "wv"}};
  const std::set<std::string> have(modules.begin(), modules.end());
  std::map<std::string, std::vector<std::string>> groups;  // parent + set -> members
  for (const std::string& m : modules) {
    const std::size_t dot = m.rfind('.');
    const std::string parent = dot == std::string::npos ? "" : m.substr(0, dot + 1);
    const std::string last = m.substr(dot == std::string::npos ? 0 : dot + 1);
    for (std::size_t i = 0; i < sets.size(); ++i)
      if (std::find(sets[i].begin(), sets[i].end(), last) != sets[i].end())
        groups[parent + "#" + std::to_string(i)].push_back(m);
  }
  std::vector<std::vector<std::string>> out;
  for (auto& [key, members] : groups)
    if (members.size() >= 2) out.push_back(std::move(members));
  return out;
}

// ---- configs

Json apply_config(Json& config, std::optional<Convention> c, const QuantMeta& meta) {
  if (!config.is_object()) config = Json::object();
  for (const char* k : {"quantization_config", "quantization"}) config.erase(k);
  if (!c) return nullptr;

  // One (mode, group, bits) for the whole model, the most common; MLX takes per-layer overrides,
  // the others need a single scheme.
  std::map<std::tuple<int, int, int>, std::size_t> count;
  for (const Layer* l : meta.layers) ++count[{static_cast<int>(l->mode), l->group, l->bits}];
  if (count.empty()) throw Error("no quantized layers to describe in config.json");
  auto best = std::max_element(count.begin(), count.end(), [](auto& a, auto& b) { return a.second < b.second; });
  const auto [mode_i, group, bits] = best->first;
  const Mode mode = static_cast<Mode>(mode_i);
  if (count.size() > 1 && *c != Convention::mlx)
    throw Error(std::string("layers use several quantization schemes; ") + name(*c) + " export needs a single one");

  Json ignore = Json::array();
  for (const std::string& m : meta.ignore) ignore.push_back(m);

  switch (*c) {
    case Convention::compressed_tensors: {
      const bool nv = mode == Mode::nvfp4;
      Json w = {{"num_bits", 4}, {"type", "float"}, {"strategy", nv ? "tensor_group" : "group"},
                {"group_size", group}, {"symmetric", true}, {"dynamic", false},
                {"scale_dtype", nv ? "float8_e4m3fn" : "uint8"}};
      Json g = {{"targets", Json::array({"Linear"})}, {"weights", w}};
      if (meta.w4a4) {
        Json a = w;
        a["dynamic"] = "local";  // per-block activation scales at run time, static global scale
        g["input_activations"] = a;
      } else {
        g["input_activations"] = nullptr;  // weight-only: NVFP4A16 / MXFP4A16
      }
      g["output_activations"] = nullptr;
      g["format"] = nv ? "nvfp4-pack-quantized" : "mxfp4-pack-quantized";
      config["quantization_config"] = {{"quant_method", "compressed-tensors"},
                                       {"format", nv ? "nvfp4-pack-quantized" : "mxfp4-pack-quantized"},
                                       {"quantization_status", "compressed"},
                                       {"config_groups", {{"group_0", g}}},
                                       {"ignore", ignore},
                                       {"kv_cache_scheme", nullptr}};
      return nullptr;
    }
    case Convention::modelopt: {
      // quant_algo NVFP4 is W4A4 and needs input_scale for every layer; W4A16_NVFP4 is weight-only.
      const std::string algo = meta.w4a4 ? "NVFP4" : "W4A16_NVFP4";
      Json producer = {{"name", "modelopt"}, {"version", "microscale-" MICROSCALE_CKPT_VERSION}};
      config["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", algo},
                                       {"group_size", 16},         {"kv_cache_quant_algo", nullptr},
                                       {"exclude_modules", ignore}, {"ignore", ignore},
                                       {"producer", producer}};
      return {{"producer", producer},
              {"quantization", {{"quant_algo", algo}, {"kv_cache_quant_algo", nullptr}, {"group_size", 16},
                                {"exclude_modules", ignore}}}};
    }
    case Convention::mlx: {
      Json q = {{"group_size", group}, {"bits", bits}, {"mode", name(mode)}};
      for (const Layer* l : meta.layers)
        if (l->mode != mode || l->group != group || l->bits != bits)
          q[l->module] = {{"group_size", l->group}, {"bits", l->bits}, {"mode", name(l->mode)}};
      config["quantization"] = q;
      config["quantization_config"] = q;
      return nullptr;
    }
  }
  return nullptr;
}

}  // namespace ck
}  // namespace microscale::io
