// What the layouts share: the table of them, detection of a checkpoint's layers, the config
// block's common part, fused groups, and the checks their readers apply.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>

#include "io/ct_groups.hpp"
#include "io/layout.hpp"
#include "io/weight_rules.hpp"

namespace microscale::io {

const char* name(Convention c) {
  for (const ck::LayoutOps* l : ck::layouts())
    if (l->convention == c) return l->name;
  return "?";
}

Convention convention_from_name(std::string_view s) {
  for (const ck::LayoutOps* l : ck::layouts())
    if (s == l->name || (l->alias && s == l->alias)) return l->convention;
  throw Error("unknown export format '" + std::string(s) + "' (expected " + ck::layouts_with(nullptr, false) + ")");
}

std::vector<Convention> conventions() {
  std::vector<Convention> out;
  for (const ck::LayoutOps* l : ck::layouts()) out.push_back(l->convention);
  return out;
}

Convention default_convention(Mode m) { return ck::default_layout(m).convention; }

bool stores_activation_scales(Convention c) { return ck::layout(c).activation_scales; }

bool is_model_directory(Convention c) { return !ck::layout(c).write_file; }

namespace ck {

std::span<const LayoutOps* const> layouts() {
  // Detection tries them in this order.
  static const LayoutOps* const all[] = {&kCompressedTensorsLayout, &kModelOptLayout, &kMlxLayout, &kGgufLayout};
  return all;
}

const LayoutOps::FileReader* file_reader_for(const fs::path& path) {
  for (const LayoutOps* l : layouts())
    if (l->file_reader && l->file_reader->is_file(path)) return l->file_reader;
  return nullptr;
}

const LayoutOps& layout(Convention c) {
  for (const LayoutOps* l : layouts())
    if (l->convention == c) return *l;
  throw Error("unknown checkpoint layout " + std::to_string(static_cast<int>(c)));
}

const LayoutOps& default_layout(Mode m) {
  for (const LayoutOps* l : layouts())
    if (std::find(l->default_modes.begin(), l->default_modes.end(), m) != l->default_modes.end()) return *l;
  throw Error(std::string("no checkpoint layout stores ") + name(m));
}

std::string layouts_with(bool LayoutOps::*flag, bool titles) {
  std::vector<std::string> names;
  for (const LayoutOps* l : layouts())
    if (!flag || l->*flag) names.push_back(titles ? l->title : l->name);
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

std::string module_of(std::string_view n) {
  // No layout's suffix ends another's, so at most one matches.
  for (const LayoutOps* l : layouts())
    for (std::string_view suf : l->suffixes)
      if (n.ends_with(suf)) return std::string(n.substr(0, n.size() - suf.size()));
  return std::string(n);
}

void check_output_names(const std::vector<OutputTensor>& tensors) {
  auto what = [](const OutputTensor& t) {
    return t.layer.empty() ? "tensor " + detail::quote(t.from) : "quantized layer " + detail::quote(t.layer);
  };
  std::map<std::string_view, const OutputTensor*> by_name;
  std::map<std::string_view, const OutputTensor*> layers;  // module -> its first tensor
  for (const OutputTensor& t : tensors) {
    if (const auto [it, fresh] = by_name.emplace(t.name, &t); !fresh)
      throw Error("output tensor " + detail::quote(t.name) + " would be written twice: for " + what(*it->second) +
                  " and for " + what(t) + "; rename or remove one of them");
    if (!t.layer.empty()) layers.emplace(t.layer, &t);
  }
  for (const OutputTensor& t : tensors) {
    if (!t.layer.empty()) continue;
    const std::string m = module_of(t.name);
    if (const auto l = layers.find(m); m != t.name && l != layers.end())
      throw Error(what(t) + (t.from == t.name ? "" : ", written as " + detail::quote(t.name)) +
                  ", is named like a part of quantized layer " + detail::quote(m) + " (written as " +
                  detail::quote(l->second->name) +
                  ", ...): readers would take it for part of that layer; rename "
                  "or remove it, or keep the layer in high precision (--exclude)");
  }
}

std::vector<Out> emit(const Layer& l, Convention c) {
  check_dims(l);
  std::vector<Out> out;
  layout(c).emit(l, out);
  return out;
}

void check_not_stacked(const Layer& l, const LayoutOps& lay) {
  if (l.experts == 0) return;
  layer_error(l.module, "stacked experts " + shape_str(l.stored(l.cols()), ShapeStyle::list) + " have no " + lay.title +
                            " form: its MoE loaders (vLLM, TensorRT-LLM) read per-expert 2-D weights "
                            "(experts.<i>.gate_proj, ...), and only the MLX layout holds stacked experts. Quantize "
                            "the float checkpoint with this export instead (it keeps per-expert weights)");
}

// ---- detection

namespace {

// Each quantized weight of a compressed-tensors checkpoint to the config group that describes it,
// refusing one whose group stores another format (FP8 under an nvfp4 group, say) or that the
// config says it left in high precision.
void match_groups(Detected& d, const Json& config) {
  d.groups = ct_groups(config);
  if (d.groups.empty()) return;
  auto match = [&](const std::string& module, const std::string& tensor, CtFormat stored) {
    const CtGroup* g = d.groups.claim(module, tensor);
    if (!g) {
      if (d.groups.ignored(module))
        throw Error("tensor " + detail::quote(tensor) + " is stored quantized (" + name(stored) +
                    "), but config.json's quantization_config.ignore lists its module as left in high precision");
      return;
    }
    if (g->kind != stored && g->kind != CtFormat::other)
      throw Error("tensor " + detail::quote(tensor) + " is stored as " + name(stored) + ", but config group " +
                  detail::quote(g->name) + " of config.json, which targets it, has format " + g->format);
    d.group_of[module] = static_cast<std::size_t>(g - d.groups.groups.data());
  };
  for (const Layer& l : d.layers)
    match(l.module, l.primary(),
          l.format.mode == Mode::nvfp4   ? CtFormat::nvfp4_pack
          : l.format.mode == Mode::mxfp8 ? CtFormat::mxfp8
                                         : CtFormat::mxfp4_pack);
  if (d.sources.kind == SourceKind::ct_fp8)
    for (const SourceWeight& w : d.sources.weights) match(w.module, w.data, CtFormat::float_quantized);
}

}  // namespace

Detected detect(const Checkpoint& ck, const Json& config) {
  Detected d;
  std::set<std::string> kinds;
  for (const std::string& n : ck.names()) {
    if (d.consumed.count(n)) continue;
    for (const LayoutOps* lay : layouts()) {
      if (!lay->is_primary || !lay->is_primary(ck, config, n)) continue;
      Layer l = lay->read(ck, config, module_of(n));
      kinds.insert(lay->name);
      d.convention = lay->convention;
      for (const Source& s : l.sources) d.consumed.insert(s.tensor);
      d.layers.push_back(std::move(l));
      break;
    }
  }
  d.sources = scan_sources(ck, config, d.consumed);
  // A layout holds the FP8 weights of its own FP8 form beside its layers (Detected::mixed:
  // compressed-tensors' FP8 groups, ModelOpt's FP8 layers); other layouts and source formats do not mix.
  const LayoutOps* own = d.convention ? &layout(*d.convention) : nullptr;
  const bool mixed = d.sources.kind && kinds.size() == 1 && own->fp8_source == d.sources.kind;
  if (d.sources.kind && !kinds.empty() && !mixed)
    throw Error("checkpoint mixes quantized layouts (" + *kinds.begin() + ", " + name(*d.sources.kind) + ")");
  if ((own && own->keeps_fp8_groups) || d.sources.kind == SourceKind::ct_fp8) match_groups(d, config);
  for (const LayoutOps* lay : layouts())
    if (lay->check_fp8_source && d.sources.kind && lay->fp8_source == d.sources.kind)
      for (const SourceWeight& w : d.sources.weights) lay->check_fp8_source(config, w);
  // A tensor named like a part of a quantized layer that the layer's layout does not read (a
  // ModelOpt layer beside "m.input_global_scale", say) is a mix of layouts: another layout would
  // read it as part of the layer, so it can neither be dropped nor copied through.
  std::set<std::string> modules;
  for (const Layer& l : d.layers) modules.insert(l.module);
  // Quantized data we cannot interpret: 8-bit float weights (FP8 checkpoints), leftover scales.
  for (const std::string& n : ck.names()) {
    if (d.consumed.count(n) || d.sources.consumed.count(n)) continue;
    if (const std::string m = module_of(n); m != n && modules.count(m)) {
      d.strays.push_back(n);
      continue;
    }
    const StTensor& t = ck.tensor(n);
    const bool fp8 = t.dtype == StDType::f8_e4m3 || t.dtype == StDType::f8_e5m2 || t.dtype == StDType::f4 ||
                     t.dtype == StDType::f8_e8m0;
    if (fp8 || n.ends_with(".weight_scale") || n.ends_with(".weight_zero_point") || n.ends_with(".weight_shape"))
      d.unsupported.push_back(n);
  }
  if (kinds.size() > 1) {
    std::string all;
    for (const std::string& k : kinds) all += (all.empty() ? "" : ", ") + k;
    throw Error("checkpoint mixes quantized layouts (" + all + ")");
  }
  return d;
}

void check_unsupported(const Detected& d) {
  if (!d.strays.empty()) {
    const std::string& n = d.strays[0];
    throw Error("tensor " + detail::quote(n) + " is named like a part of quantized layer " +
                detail::quote(module_of(n)) + ", but the " + d.convention_name() +
                " layout does not use it (a mix of layouts?); remove or rename it" +
                (d.strays.size() > 1 ? " (and " + std::to_string(d.strays.size() - 1) + " more like it)" : ""));
  }
  if (d.unsupported.empty()) return;
  std::string list;
  for (std::size_t i = 0; i < d.unsupported.size() && i < 3; ++i)
    list += (i ? ", " : "") + detail::quote(d.unsupported[i]);
  std::string supported;
  for (const LayoutOps* l : layouts()) supported += (supported.empty() ? "" : ", ") + std::string(l->supported);
  throw Error("checkpoint holds quantized tensors microscale cannot read (e.g. " + list + "); supported: " + supported);
}

// ---- fused groups

std::vector<std::vector<std::string>> fused_groups(const std::vector<std::string>& modules) {
  static const std::vector<std::vector<std::string>> sets = {{"q_proj", "k_proj", "v_proj"},
                                                             {"gate_proj", "up_proj"},
                                                             {"query", "key", "value"},
                                                             {"w1", "w3"},
                                                             {"wq", "wk", "wv"},
                                                             // DeepSeek MLA: vLLM's fused_qkv_a_proj
                                                             {"q_a_proj", "kv_a_proj_with_mqa"}};
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

std::vector<FusedScales> fused_global_scales(const std::vector<Layer>& layers) {
  std::vector<std::string> mods;
  std::map<std::string, float> amax;
  for (const Layer& l : layers)
    if (l.format.mode == Mode::nvfp4 && l.global.three_level()) {
      mods.push_back(l.module);
      amax[l.module] = l.global.to_amax();
    }
  std::vector<FusedScales> out;
  for (const auto& g : fused_groups(mods)) {
    FusedScales f;
    f.lo = INFINITY;
    for (const std::string& m : g) {
      const float a = amax[m];
      f.members.emplace_back(m, a);
      f.lo = std::min(f.lo, a);
      f.hi = std::max(f.hi, a);
    }
    out.push_back(std::move(f));
  }
  return out;
}

// ---- configs

Json apply_config(Json& config, std::optional<Convention> c, const QuantMeta& meta) {
  if (!config.is_object()) config = Json::object();
  for (const char* k : {"quantization_config", "quantization"}) config.erase(k);
  if (!c) return nullptr;

  // One (mode, group, bits) for the whole model, the most common; some layouts take per-layer
  // overrides, the others need a single scheme.
  std::map<std::tuple<int, int, int>, std::size_t> count;
  for (const Layer* l : meta.layers) ++count[{static_cast<int>(l->format.mode), l->format.group_size, l->format.bits}];
  if (count.empty()) throw Error("no quantized layers to describe in config.json");
  auto best = std::max_element(count.begin(), count.end(), [](auto& a, auto& b) { return a.second < b.second; });
  const auto [mode_i, group, bits] = best->first;
  const LayoutOps& lay = layout(*c);
  if (count.size() > 1 && !lay.per_layer_schemes)
    throw Error(std::string("layers use several quantization schemes; ") + lay.name + " export needs a single one");

  std::vector<std::string> names = meta.ignore, quantized;
  for (const Layer* l : meta.layers) quantized.push_back(l->module);
  add_tied_lm_head(names, config, quantized);
  Json ignore = Json::array();
  for (const std::string& m : names) ignore.push_back(m);
  Json extra = lay.write_config(config, {static_cast<Mode>(mode_i), group, bits}, ignore, meta);
  // A searched scale choice is recorded beside the producer; the bytes are standard either way.
  if (meta.scale_search != ScaleSearch::none || meta.scale_2d) {
    for (Json* j : {&config["quantization_config"], extra.is_object() ? &extra : nullptr}) {
      if (j == nullptr) continue;
      Json& producer = (*j)["producer"];
      if (!producer.is_object()) producer = {{"name", "microscale"}};
      if (meta.scale_search != ScaleSearch::none) producer["scale_search"] = name(meta.scale_search);
      if (meta.scale_2d) producer["scale_2d"] = true;
    }
  }
  // So are GPTQ's layers (the others round to nearest) and its options.
  if (meta.gptq_layers > 0) {
    for (Json* j : {&config["quantization_config"], extra.is_object() ? &extra : nullptr}) {
      if (j == nullptr) continue;
      Json& producer = (*j)["producer"];
      if (!producer.is_object()) producer = {{"name", "microscale"}};
      producer["gptq"] = {{"layers", meta.gptq_layers}, {"damp", meta.gptq.damp}, {"block_size", meta.gptq.block_size}};
    }
  }
  return extra;
}

// ---- reading

const StTensor* find(const Checkpoint& ck, const std::string& name) {
  return ck.contains(name) ? &ck.tensor(name) : nullptr;
}

const StTensor& need(const Checkpoint& ck, const std::string& module, const std::string& name, const char* what) {
  const StTensor* t = find(ck, name);
  if (!t) layer_error(module, "missing tensor " + detail::quote(name) + " (" + what + ")");
  return *t;
}

void check_shape(const StTensor& t, StDType dt, const Shape& shape) {
  if (t.dtype != dt || t.shape != shape)
    throw Error("tensor " + detail::quote(t.name) + " is " + st_dtype_name(t.dtype) + " " +
                shape_str(t.shape, ShapeStyle::list) + ", expected " + st_dtype_name(dt) + " " +
                shape_str(shape, ShapeStyle::list));
}

Shape rows_cols(const StTensor& t) {
  if (t.shape.size() != 2)
    throw Error("tensor " + detail::quote(t.name) + " has shape " + shape_str(t.shape, ShapeStyle::list) +
                "; only 2-D quantized weights are supported");
  return t.shape;
}

std::int64_t unpacked_cols(const std::string& m, const StTensor& packed, int item_bits, int bits) {
  const std::int64_t total = mul(m, packed.shape[1], item_bits,
                                 "packed weight " + shape_str(packed.shape, ShapeStyle::list) + " " +
                                     st_dtype_name(packed.dtype) + ": bits per row");
  if (total % bits != 0) layer_error(m, "packed width does not hold whole " + std::to_string(bits) + "-bit elements");
  return total / bits;
}

float scalar_f32(const StTensor& t, const std::string& what) {
  if (t.dtype != StDType::f32 || t.numel() != 1)
    throw Error("tensor " + detail::quote(t.name) + " (" + what + ") must be one F32 value, got " +
                st_dtype_name(t.dtype) + " " + shape_str(t.shape, ShapeStyle::list));
  float v;
  std::memcpy(&v, t.data.data(), 4);
  return v;
}

bool is_mxfp8_weight(const Checkpoint& ck, std::string_view tensor) {
  if (!tensor.ends_with(".weight") || ck.tensor(std::string(tensor)).dtype != StDType::f8_e4m3) return false;
  const StTensor* s = find(ck, std::string(tensor) + "_scale");
  return s && s->dtype == StDType::u8;
}

Layer read_mxfp8(const Checkpoint& ck, const std::string& m) {
  Layer l;
  l.module = m;
  const StTensor& w = need(ck, m, m + ".weight", "FP8 weights");
  const StTensor& s = need(ck, m, m + ".weight_scale", "E8M0 block scales");
  l.shape = rows_cols(w);
  l.format.mode = Mode::mxfp8;
  l.format.elem = Elem::e4m3;
  l.format.bits = numerics::default_bits(Mode::mxfp8);
  l.format.group_size = numerics::default_group_size(Mode::mxfp8);
  check_dims(l);
  check_shape(s, StDType::u8, {l.rows(), l.cols() / l.format.group_size});
  l.sources = {{w.name, Role::packed}, {s.name, Role::scales}};
  l.packed = w.data;
  l.scales = s.data;
  (void)l.spec();  // validates mode/group/bits
  return l;
}

std::string quant_method(const Json& config) {
  return config.is_object() ? lower_field(quantization_config(config), "quant_method") : "";
}

// A stored scale must be finite and so must the amax it stands for: 2688 / 1e-40 is not, and a
// layer every operation would refuse later must be refused by all of them up front.
void check_global(const Layer& l) {
  auto bad = [](const Global& g) {
    return (g.kind == Global::Kind::stored && !g.convention->valid(g.value)) || !std::isfinite(g.to_amax());
  };
  if (bad(l.global)) layer_error(l.module, "invalid global scale: " + l.global.describe());
  if (l.act && bad(*l.act)) layer_error(l.module, "invalid activation scale: " + l.act->describe());
}

}  // namespace ck
}  // namespace microscale::io
