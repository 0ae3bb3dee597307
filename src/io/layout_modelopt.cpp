// NVIDIA ModelOpt (TensorRT-LLM, vLLM): NVFP4 only.
//   <m>.weight U8 [N, K/2], <m>.weight_scale F8_E4M3 [N, K/16], <m>.weight_scale_2 F32 [] =
//   amax/2688 (the decode factor), <m>.input_scale F32 [] (W4A4 only); hf_quant_config.json and
//   config.json quantization_config.
#include <algorithm>
#include <cmath>

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
constexpr Mode kModes[] = {Mode::nvfp4};  // ModelOpt's FP4 export is NVFP4 only

bool is_primary(const Checkpoint&, std::string_view tensor) { return tensor.ends_with(".weight_scale_2"); }

Layer read_modelopt(const Checkpoint& ck, const Json&, const std::string& m) {
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

void emit_modelopt(const Layer& l, std::vector<Out>& out) {
  const std::string& m = l.module;
  check_not_stacked(l, kModelOptLayout);
  if (l.format.mode != Mode::nvfp4)
    layer_error(m, std::string("ModelOpt export holds nvfp4 only, not ") + name(l.format.mode));
  const std::int64_t n = l.rows(), k = l.cols();
  out.push_back(entry(m + ".weight", StDType::u8, {n, k / 2}, l.packed));
  out.push_back(entry(m + ".weight_scale", StDType::f8_e4m3, {n, k / numerics::kNvfp4Group}, l.scales));
  out.push_back(scalar(m + ".weight_scale_2", {}, l.global_as(kDecodeFactor)));
  if (l.act) out.push_back(scalar(m + ".input_scale", {}, l.act_as(kDecodeFactor)));
}

// ModelOpt 0.47's export: hf_quant_config.json holds `producer` and `quantization`, and config.json's
// quantization_config is what its convert_hf_quant_config_format makes of that (compressed-tensors
// style config_groups; no kv_cache_scheme when the KV cache is not quantized).
Json write_config(Json& config, const Scheme&, const Json& unsorted_ignore, const QuantMeta& meta) {
  Json ignore = unsorted_ignore;  // ModelOpt lists exclude_modules sorted, embeddings included
  std::sort(ignore.begin(), ignore.end());
  // quant_algo NVFP4 is W4A4 and needs input_scale for every layer; W4A16_NVFP4 is weight-only.
  const std::string algo = meta.w4a4 ? "NVFP4" : "W4A16_NVFP4";
  const int group = numerics::kNvfp4Group;
  Json producer = {{"name", "modelopt"}, {"version", "microscale-" MICROSCALE_CKPT_VERSION}};
  const Json fp4 = {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", group}};
  Json g = Json::object();
  if (meta.w4a4) g["input_activations"] = fp4;
  g["weights"] = fp4;
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

}  // namespace

constinit const LayoutOps kModelOptLayout{
    .convention = Convention::modelopt,
    .name = "modelopt",
    .alias = nullptr,
    .title = "ModelOpt",
    .supported = "ModelOpt NVFP4",
    .suffixes = kSuffixes,
    .global_scale = true,
    .activation_scales = true,
    .stacked_experts = false,
    .per_layer_schemes = false,
    .shard_format = nullptr,
    .is_primary = is_primary,
    .read = read_modelopt,
    .default_scale_rule = nullptr,
    .check_spec = nullptr,
    .emit = emit_modelopt,
    .write_config = write_config,
    .row_block = nullptr,
    .write_file = nullptr,
    .keeps_fp8_groups = false,
    .modes = kModes,
    .fused_loading = true,
};

}  // namespace microscale::io::ck
