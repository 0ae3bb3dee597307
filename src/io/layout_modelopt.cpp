// NVIDIA ModelOpt (TensorRT-LLM, vLLM): NVFP4 and MXFP8, quant_algo MIXED_PRECISION with a
// quant_algo per layer when a checkpoint holds several formats, FP8 layers (read as FP8 sources,
// source_fp8.cpp) among them.
//   nvfp4: <m>.weight U8 [N, K/2], <m>.weight_scale F8_E4M3 [N, K/16], <m>.weight_scale_2 F32 [] =
//   amax/2688 (the decode factor), <m>.input_scale F32 [] (W4A4 only); mxfp8: <m>.weight F8_E4M3
//   [N, K], <m>.weight_scale U8 E8M0 [N, K/32]; hf_quant_config.json and config.json
//   quantization_config.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <map>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "io/layout.hpp"

namespace microscale::io::ck {

// The stored value is the decode factor; decoding multiplies by it.
constinit const ScaleConvention kDecodeFactor{
    "weight_scale_2", "amax/2688", [](float ws2) { return ws2 * k2688; },
    // amax 0: every block scale is 0, so any factor decodes to 0; 1 keeps readers from dividing
    // by zero and matches the encode factor 1 of FORMATS.md 2.1.
    [](float amax) { return amax == 0 ? 1.0f : amax / k2688; },
    [](float ws2) { return std::isfinite(ws2) && ws2 >= 0; }};

namespace {

constexpr std::string_view kSuffixes[] = {".weight", ".weight_scale", ".weight_scale_2", ".input_scale"};
constexpr Mode kModes[] = {Mode::nvfp4, Mode::mxfp8};  // ModelOpt's FP4 export is NVFP4 only

// An MXFP8 weight has compressed-tensors' tensors too: the config says whose it is (ModelOpt's
// older exports have no quantization_config in config.json).
bool is_primary(const Checkpoint& ck, const Json& config, std::string_view tensor) {
  if (tensor.ends_with(".weight_scale_2")) return true;
  const std::string method = quant_method(config);
  return (method == "modelopt" || method.empty()) && is_mxfp8_weight(ck, tensor);
}

// A MIXED_PRECISION config gives each quantized module its quant_algo: it must be one of `algos`
// (the format the tensors hold), and a module it leaves out is not quantized.
void check_listed(const Json& config, const std::string& module, std::initializer_list<std::string_view> algos) {
  const Json* qc = config.is_object() ? quantization_config(config) : nullptr;
  const auto listed = qc ? qc->find("quantized_layers") : Json::const_iterator{};
  if (!qc || listed == qc->end() || !listed->is_object()) return;
  std::string stored;
  for (std::string_view a : algos) stored += (stored.empty() ? "" : " or ") + std::string(a);
  const auto entry = listed->find(module);
  if (entry == listed->end())
    layer_error(module, "stored quantized (" + stored +
                            "), but config.json's quantization_config.quantized_layers does not list it");
  const auto algo = entry->is_object() ? entry->find("quant_algo") : entry->end();
  const std::string a = algo != entry->end() && algo->is_string() ? algo->get<std::string>() : "";
  if (std::find(algos.begin(), algos.end(), a) == algos.end())
    layer_error(module, "stored as " + stored + ", but config.json's quantization_config.quantized_layers gives it " +
                            entry->dump());
}

Layer check_listed(const Json& config, Layer l) {
  if (l.format.mode == Mode::mxfp8)
    check_listed(config, l.module, {"MXFP8"});
  else
    check_listed(config, l.module, {"NVFP4", "W4A16_NVFP4"});
  return l;
}

// The quant_algo of a ModelOpt FP8 weight, from the form of its scale (source_fp8.cpp reads one
// per tensor or one per output channel).
const char* fp8_algo(const SourceWeight& w) {
  return w.block_rows == 1 && w.shape[0] > 1 ? "FP8_PER_CHANNEL_PER_TOKEN" : "FP8";
}

void check_fp8_source(const Json& config, const SourceWeight& w) { check_listed(config, w.module, {fp8_algo(w)}); }

Layer read_nvfp4(const Checkpoint& ck, const std::string& m) {
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
  l.format.mode = Mode::nvfp4;
  l.format.group_size = numerics::kNvfp4Group;
  check_dims(l);
  check_shape(s, StDType::f8_e4m3, {l.rows(), l.cols() / numerics::kNvfp4Group});
  l.global = Global::stored_as(kDecodeFactor, scalar_f32(g, "weight_scale_2"));
  l.sources = {{p.name, Role::packed}, {s.name, Role::scales}, {g.name, Role::global_scale}};
  if (const StTensor* a = find(ck, m + ".input_scale")) {
    l.act = Global::stored_as(kDecodeFactor, scalar_f32(*a, "input_scale"));
    l.sources.push_back({a->name, Role::activation_scale});
  }
  l.packed = p.data;
  l.scales = s.data;
  check_global(l);
  (void)l.spec();  // validates mode/group/bits and the global scale
  return l;
}

Layer read_modelopt(const Checkpoint& ck, const Json& config, const std::string& m) {
  return check_listed(config, ck.contains(m + ".weight_scale_2") ? read_nvfp4(ck, m) : read_mxfp8(ck, m));
}

void emit_modelopt(const Layer& l, std::vector<Out>& out) {
  const std::string& m = l.module;
  check_not_stacked(l, kModelOptLayout);
  const std::int64_t n = l.rows(), k = l.cols();
  if (l.format.mode == Mode::mxfp8 && l.format.elem == Elem::e4m3) {
    out.push_back(entry(m + ".weight", StDType::f8_e4m3, {n, k}, l.packed));
    out.push_back(entry(m + ".weight_scale", StDType::u8, {n, k / numerics::kMxGroup}, l.scales));
    return;
  }
  if (l.format.mode != Mode::nvfp4)
    layer_error(m, std::string("ModelOpt export holds nvfp4 and mxfp8 (E4M3), not ") + name(l.format.mode) +
                       (l.format.mode == Mode::mxfp8 ? " E5M2" : ""));
  out.push_back(entry(m + ".weight", StDType::u8, {n, k / 2}, l.packed));
  out.push_back(entry(m + ".weight_scale", StDType::f8_e4m3, {n, k / numerics::kNvfp4Group}, l.scales));
  out.push_back(scalar(m + ".weight_scale_2", {}, l.global_as(kDecodeFactor)));
  if (l.act) out.push_back(scalar(m + ".input_scale", {}, l.act_as(kDecodeFactor)));
}

void check_spec(const QuantSpec& spec) {
  if (spec.mode == Mode::mxfp8 && spec.elem != Elem::e4m3)
    throw Error("ModelOpt's MXFP8 is E4M3; E5M2 elements have no ModelOpt layout");
}

// A layer's quant_algo: NVFP4 is W4A4 and needs input_scale; W4A16_NVFP4 is weight-only.
const char* quant_algo(Mode mode, bool w4a4) { return mode == Mode::mxfp8 ? "MXFP8" : w4a4 ? "NVFP4" : "W4A16_NVFP4"; }

// The config group convert_hf_quant_config_format makes of a quantized_layers entry (without
// targets): FP8's carry no group size.
Json algo_group(const Json& entry) {
  const std::string algo = entry.at("quant_algo");
  if (algo == "FP8" || algo == "FP8_PER_CHANNEL_PER_TOKEN") {
    const Json args = {{"dynamic", false}, {"num_bits", 8}, {"type", "float"}};
    Json weights = args;
    if (algo != "FP8") weights["strategy"] = "channel";
    return {{"input_activations", args}, {"weights", weights}};
  }
  const int bits = algo == "MXFP8" ? 8 : 4;
  const Json args = {{"dynamic", false}, {"num_bits", bits}, {"type", "float"}, {"group_size", entry.at("group_size")}};
  Json g = Json::object();
  if (algo != "W4A16_NVFP4") g["input_activations"] = args;
  g["weights"] = args;
  return g;
}

// ModelOpt 0.47's export: hf_quant_config.json holds `producer` and `quantization`, and config.json's
// quantization_config is what its convert_hf_quant_config_format makes of that (compressed-tensors
// style config_groups; no kv_cache_scheme when the KV cache is not quantized). Layers of several
// formats are MIXED_PRECISION: `quantized_layers` gives each module its quant_algo and group_size,
// and config.json has one group per distinct entry, in the order the (sorted) modules first use it.
Json write_config(Json& config, const Scheme&, const Json& unsorted_ignore, const QuantMeta& meta) {
  Json ignore = unsorted_ignore;  // ModelOpt lists exclude_modules sorted, embeddings included
  std::sort(ignore.begin(), ignore.end());
  Json producer = {{"name", "modelopt"}, {"version", "microscale-" MICROSCALE_CKPT_VERSION}};
  std::map<std::string, Json> sorted;  // by module, as json.load then reads it back
  for (const Layer* l : meta.layers)
    sorted[l->module] = {{"quant_algo", quant_algo(l->format.mode, meta.w4a4)}, {"group_size", l->format.group_size}};
  for (const SourceWeight* w : meta.kept_fp8) sorted[w->module] = {{"quant_algo", fp8_algo(*w)}};
  Json layers = Json::object();
  for (auto& [m, entry] : sorted) layers[m] = std::move(entry);
  std::set<Json> distinct;
  for (const auto& [m, entry] : layers.items()) distinct.insert(entry);
  if (distinct.size() == 1) {
    const std::string algo = (*distinct.begin())["quant_algo"];
    const int group = (*distinct.begin())["group_size"];
    Json g = algo_group(*distinct.begin());
    g["targets"] = Json::array({"Linear"});
    config["quantization_config"] = {{"config_groups", {{"group_0", g}}},
                                     {"ignore", ignore},
                                     {"quant_algo", algo},
                                     {"producer", producer},
                                     {"quant_method", "modelopt"}};
    return {
        {"producer", producer},
        {"quantization",
         {{"quant_algo", algo}, {"kv_cache_quant_algo", nullptr}, {"group_size", group}, {"exclude_modules", ignore}}}};
  }
  std::vector<std::pair<Json, Json>> groups;  // entry, its modules
  for (auto layer = layers.begin(); layer != layers.end(); ++layer) {
    const Json& entry = layer.value();  // not a structured binding: clang before 16 cannot capture one
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == entry; });
    if (it == groups.end()) it = groups.insert(groups.end(), std::make_pair(entry, Json::array()));
    it->second.push_back(layer.key());
  }
  Json config_groups = Json::object();
  for (std::size_t i = 0; i < groups.size(); ++i) {
    Json g = algo_group(groups[i].first);
    g["targets"] = std::move(groups[i].second);
    config_groups["group_" + std::to_string(i)] = std::move(g);
  }
  config["quantization_config"] = {
      {"config_groups", config_groups},  {"quantized_layers", layers}, {"ignore", ignore},
      {"quant_algo", "MIXED_PRECISION"}, {"producer", producer},       {"quant_method", "modelopt"}};
  // ModelOpt's own mixed export lists no exclude_modules (a layer not in quantized_layers is not
  // quantized); they are written all the same, as config.json's ignore, for loaders that read it.
  return {{"producer", producer},
          {"quantization",
           {{"quant_algo", "MIXED_PRECISION"},
            {"kv_cache_quant_algo", nullptr},
            {"quantized_layers", layers},
            {"exclude_modules", ignore}}}};
}

}  // namespace

constinit const LayoutOps kModelOptLayout{
    .convention = Convention::modelopt,
    .name = "modelopt",
    .alias = nullptr,
    .title = "ModelOpt",
    .supported = "ModelOpt NVFP4 and MXFP8",
    .suffixes = kSuffixes,
    .global_scale = true,
    .activation_scales = true,
    .stacked_experts = false,
    .per_layer_schemes = true,
    .shard_format = nullptr,
    .is_primary = is_primary,
    .read = read_modelopt,
    .default_scale_rule = nullptr,
    .check_spec = check_spec,
    .emit = emit_modelopt,
    .write_config = write_config,
    .row_block = nullptr,
    .write_file = nullptr,
    .keeps_fp8_groups = false,
    .fp8_source = SourceKind::modelopt_fp8,
    .check_fp8_source = check_fp8_source,
    .modes = kModes,
    .default_modes = {},
    .fused_loading = true,
};

}  // namespace microscale::io::ck
