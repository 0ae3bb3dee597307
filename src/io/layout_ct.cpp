// compressed-tensors (llm-compressor, vLLM): nvfp4-pack-quantized, mxfp4-pack-quantized and
// mxfp8-quantized, one config group per format when a checkpoint holds several.
//   <m>.weight_packed U8 [N, K/2], <m>.weight_scale F8_E4M3 [N, K/16] (nvfp4) or U8 E8M0 [N, K/32]
//   (mxfp4), <m>.weight_global_scale F32 [1] = 2688/amax (nvfp4, the encode factor),
//   <m>.input_global_scale F32 [1] (W4A4 only); mxfp8: <m>.weight F8_E4M3 [N, K] and
//   <m>.weight_scale U8 E8M0 [N, K/32]; config.json quantization_config.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <set>
#include <utility>
#include <vector>

#include "io/layout.hpp"
#include "io/weight_rules.hpp"

namespace microscale::io::ck {

namespace {

// The encode factor microscale's nvfp4 quantizer uses for `amax`.
float s_enc(float amax) { return numerics::nvfp4_tensor(true, amax).s_enc; }

// The stored value is the encode factor; decoding divides by it.
constinit const ScaleConvention kEncodeFactor{"weight_global_scale", "2688/amax", [](float gs) { return k2688 / gs; },
                                              s_enc, [](float gs) { return std::isfinite(gs) && gs > 0; }};

constexpr std::string_view kSuffixes[] = {".weight_packed", ".weight_scale", ".weight_global_scale",
                                          ".input_global_scale"};
constexpr Mode kModes[] = {Mode::nvfp4, Mode::mxfp4, Mode::mxfp8};

// llm-compressor's rule for mxfp4 scales: the same bytes as its own export.
void default_scale_rule(QuantSpec& spec) {
  if (spec.mode == Mode::mxfp4) spec.scale_rule = ScaleRule::even;
}

// An MXFP8 weight has ModelOpt's tensors too: the config says whose it is.
bool is_primary(const Checkpoint& ck, const Json& config, std::string_view tensor) {
  return tensor.ends_with(".weight_packed") ||
         (quant_method(config) == "compressed-tensors" && is_mxfp8_weight(ck, tensor));
}

Layer read_ct(const Checkpoint& ck, const Json&, const std::string& m) {
  if (!ck.contains(m + ".weight_packed")) return read_mxfp8(ck, m);
  Layer l;
  l.module = m;
  const StTensor& p = need(ck, m, m + ".weight_packed", "packed weights");
  if (p.dtype != StDType::u8)
    layer_error(m, "weight_packed is " + std::string(st_dtype_name(p.dtype)) +
                       "; only the nvfp4-pack-quantized and mxfp4-pack-quantized formats (uint8) are supported");
  const Shape pk = rows_cols(p);
  l.shape = {pk[0], unpacked_cols(m, p, 8, 4)};
  const StTensor& s = need(ck, m, m + ".weight_scale", "block scales");
  l.sources = {{p.name, Role::packed}, {s.name, Role::scales}};
  if (s.dtype == StDType::f8_e4m3) {
    l.format.mode = Mode::nvfp4;
    l.format.group_size = numerics::kNvfp4Group;
    const StTensor& g = need(ck, m, m + ".weight_global_scale", "global scale");
    l.global = Global::stored_as(kEncodeFactor, scalar_f32(g, "global scale"));
    l.sources.push_back({g.name, Role::global_scale});
    if (const StTensor* a = find(ck, m + ".input_global_scale")) {
      l.act = Global::stored_as(kEncodeFactor, scalar_f32(*a, "activation global scale"));
      l.sources.push_back({a->name, Role::activation_scale});
    }
  } else if (s.dtype == StDType::u8 || s.dtype == StDType::f8_e8m0) {
    l.format.mode = Mode::mxfp4;
    l.format.group_size = numerics::kMxGroup;
  } else {
    layer_error(
        m, std::string("weight_scale dtype ") + st_dtype_name(s.dtype) + " is neither F8_E4M3 (nvfp4) nor U8 (mxfp4)");
  }
  check_dims(l);
  check_shape(s, s.dtype, {l.rows(), l.cols() / l.format.group_size});
  l.packed = p.data;
  l.scales = s.data;
  check_global(l);
  (void)l.spec();  // validates mode/group/bits and the global scale
  return l;
}

void emit_ct(const Layer& l, std::vector<Out>& out) {
  const std::string& m = l.module;
  check_not_stacked(l, kCompressedTensorsLayout);
  const std::int64_t n = l.rows(), k = l.cols();
  if (l.format.mode == Mode::nvfp4) {
    out.push_back(entry(m + ".weight_packed", StDType::u8, {n, k / 2}, l.packed));
    out.push_back(entry(m + ".weight_scale", StDType::f8_e4m3, {n, k / numerics::kNvfp4Group}, l.scales));
    out.push_back(scalar(m + ".weight_global_scale", {1}, l.global_as(kEncodeFactor)));
    if (l.act) out.push_back(scalar(m + ".input_global_scale", {1}, l.act_as(kEncodeFactor)));
  } else if (l.format.mode == Mode::mxfp4) {
    out.push_back(entry(m + ".weight_packed", StDType::u8, {n, k / 2}, l.packed));
    out.push_back(entry(m + ".weight_scale", StDType::u8, {n, k / 32}, l.scales));
  } else if (l.format.mode == Mode::mxfp8 && l.format.elem == Elem::e4m3) {
    out.push_back(entry(m + ".weight", StDType::f8_e4m3, {n, k}, l.packed));
    out.push_back(entry(m + ".weight_scale", StDType::u8, {n, k / 32}, l.scales));
  } else {
    layer_error(m, std::string("compressed-tensors has no layout for ") + name(l.format.mode) + " " +
                       std::to_string(l.format.bits) + "-bit" + (l.format.mode == Mode::mxfp8 ? " E5M2" : "") +
                       " (it takes nvfp4, mxfp4 and mxfp8 with E4M3 elements)");
  }
}

void check_spec(const QuantSpec& spec) {
  if (spec.mode == Mode::mxfp8 && spec.elem != Elem::e4m3)
    throw Error("compressed-tensors' mxfp8-quantized format is E4M3; E5M2 elements have no compressed-tensors layout");
}

// The compressed-tensors release whose config form this follows (llm-compressor 0.14 writes it).
constexpr const char* kCompressedTensorsVersion = "0.19.0";

// One QuantizationArgs block with every field llm-compressor 0.14 serializes.
Json quantization_args(Mode mode, int group, Json dynamic, const char* observer) {
  const bool nv = mode == Mode::nvfp4;
  return {{"actorder", nullptr},
          {"block_structure", nullptr},
          {"dynamic", std::move(dynamic)},
          {"group_size", group},
          {"num_bits", mode == Mode::mxfp8 ? 8 : 4},
          {"observer", observer},
          {"observer_kwargs", Json::object()},
          {"scale_dtype", nv ? "torch.float8_e4m3fn" : "torch.uint8"},
          {"strategy", nv ? "tensor_group" : "group"},
          {"symmetric", true},
          {"type", "float"},
          {"zp_dtype", nullptr}};
}

const char* format_name(Mode mode) {
  return mode == Mode::nvfp4   ? "nvfp4-pack-quantized"
         : mode == Mode::mxfp8 ? "mxfp8-quantized"
                               : "mxfp4-pack-quantized";
}

// The config group of one scheme's layers, with static activation scales or without.
Json config_group(const Scheme& s, bool acts, Json targets) {
  // The weights' scales come from each block's absolute maximum, as llm-compressor's memoryless
  // min-max observer; W4A4 activations carry a static global scale from calibration (static min-max)
  // and per-block scales computed at run time ("local").
  return {{"format", format_name(s.mode)},
          {"input_activations", acts ? quantization_args(s.mode, s.group, "local", "static_minmax") : nullptr},
          {"output_activations", nullptr},
          {"targets", std::move(targets)},
          {"weights", quantization_args(s.mode, s.group, false, "memoryless_minmax")}};
}

Json write_config(Json& config, const Scheme& common, const Json& kept, const QuantMeta& meta) {
  // llm-compressor lists the Linear modules it left alone, not the embeddings (not Linear).
  Json ignore = Json::array();
  for (const Json& m : kept)
    if (!is_embedding(m.get<std::string>())) ignore.push_back(m);
  // One group per scheme, in the order the layers first use them; with several, each names its
  // layers exactly (an exact name takes precedence over the kept FP8 groups' patterns).
  std::vector<std::pair<Scheme, Json>> schemes;
  for (const Layer* l : meta.layers) {
    const Scheme s{l->format.mode, l->format.group_size, l->format.bits};
    auto it = std::find_if(schemes.begin(), schemes.end(), [&](const auto& e) {
      return e.first.mode == s.mode && e.first.group == s.group && e.first.bits == s.bits;
    });
    if (it == schemes.end()) it = schemes.insert(schemes.end(), {s, Json::array()});
    it->second.push_back(l->module);
  }
  // The layers' own groups first, then the kept FP8 groups (names unique among all of them).
  std::set<std::string> taken;
  for (const CtGroup* fp8 : meta.kept_groups) taken.insert(fp8->name);
  Json groups = Json::object();
  if (schemes.size() <= 1) {
    groups[meta.group_name] =
        config_group(common, meta.w4a4, meta.targets.is_null() ? Json::array({"Linear"}) : meta.targets);
  } else {
    int next = 0;
    for (auto& [s, modules] : schemes) {
      std::string name;
      do name = "group_" + std::to_string(next++);
      while (taken.count(name));
      // Only nvfp4 layers store activation scales (the others quantize activations at run time).
      groups[name] = config_group(s, meta.w4a4 && s.mode == Mode::nvfp4, std::move(modules));
    }
  }
  for (const CtGroup* fp8 : meta.kept_groups) groups[fp8->name] = fp8->config;
  config["quantization_config"] = {{"config_groups", groups},
                                   // compressed-tensors' name for groups of different formats
                                   {"format", groups.size() == 1 ? format_name(common.mode) : "mixed-precision"},
                                   // llm-compressor leaves the ratio unset (null) for quantized-only models.
                                   {"global_compression_ratio", nullptr},
                                   {"ignore", ignore},
                                   {"kv_cache_scheme", nullptr},
                                   {"quant_method", "compressed-tensors"},
                                   {"quantization_status", "compressed"},
                                   {"sparsity_config", Json::object()},
                                   {"transform_config", Json::object()},
                                   {"version", kCompressedTensorsVersion}};
  return nullptr;
}

}  // namespace

constinit const LayoutOps kCompressedTensorsLayout{
    .convention = Convention::compressed_tensors,
    .name = "compressed-tensors",
    .alias = "ct",
    .title = "compressed-tensors",
    .supported = "compressed-tensors nvfp4/mxfp4-pack-quantized and mxfp8-quantized",
    .suffixes = kSuffixes,
    .global_scale = true,
    .activation_scales = true,
    .stacked_experts = false,
    .per_layer_schemes = true,
    .shard_format = nullptr,
    .is_primary = is_primary,
    .read = read_ct,
    .default_scale_rule = default_scale_rule,
    .check_spec = check_spec,
    .emit = emit_ct,
    .write_config = write_config,
    .row_block = nullptr,
    .write_file = nullptr,
    .keeps_fp8_groups = true,
    .fp8_source = SourceKind::ct_fp8,
    .check_fp8_source = nullptr,  // match_groups checks each FP8 weight against its config group
    .modes = kModes,
    .default_modes = kFp4Modes,
    .fused_loading = true,
};

}  // namespace microscale::io::ck
