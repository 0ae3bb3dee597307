// quantize's plan (quantize_plan.hpp): the weights selected and the layers planned as skeletons,
// from the checkpoint's headers and config only.
#include "io/quantize_plan.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "io/weight_rules.hpp"

namespace microscale::io::ck {

namespace {

// The reason reported for a weight-like tensor left in high precision.
std::string kept_reason(Keep k, const std::string& name, const Shape& shape, StDType dtype, int group,
                        const LayoutOps& lay, bool gptoss) {
  if (k == Keep::rank && gptoss && gptoss_expert_weight(name, shape))
    return keep_text(k, shape, dtype) + " stacked experts: " + lay.title +
           " has no form for them (its MoE loaders read per-expert 2-D weights); --export mlx quantizes them";
  if (k == Keep::rank)
    return keep_text(k, shape, dtype) + (stacked_experts(name, shape) ? " stacked experts" : "") +
           ": the exported layouts quantize 2-D Linear weights only";
  if (k == Keep::dtype)
    return keep_text(k, shape, dtype) + ": only float32, float16 and bfloat16 weights are quantized";
  return keep_text(k, shape, dtype, group);
}

// "a (why), b (why), ..." for an error message, at most `limit` entries.
std::string list_reasons(const std::vector<std::pair<std::string, std::string>>& items, std::size_t limit = 40) {
  std::string out;
  for (std::size_t i = 0; i < items.size() && i < limit; ++i)
    out +=
        (i ? ", " : "") + detail::quote(items[i].first) + (items[i].second.empty() ? "" : " (" + items[i].second + ")");
  if (items.size() > limit) out += ", and " + std::to_string(items.size() - limit) + " more";
  return out;
}

// The --hessians file's tensors by the module they belong to, each checked against the layer it
// names: a module quantized here, [K, K] for its weight's K columns, F32 or F64.
std::map<std::string, const StTensor*> hessians_by_module(const SafetensorsFile& f,
                                                          const std::map<std::string, std::string>& weight_modules,
                                                          const std::map<std::string, Shape>& quantized_shape,
                                                          const std::string& example) {
  std::map<std::string, const StTensor*> out;
  const std::string file = "--hessians " + f.source();
  for (const StTensor& t : f.tensors()) {
    const std::string suffix = ".weight";
    const bool weight_name = t.name.size() > suffix.size() && t.name.ends_with(suffix);
    const std::string m = weight_name ? t.name.substr(0, t.name.size() - suffix.size()) : t.name;
    const auto w = weight_modules.find(m);
    if (w == weight_modules.end())
      throw Error(file + ": tensor " + detail::quote(t.name) + " names no module of this checkpoint (" + example +
                  "; name H by the module or its weight)");
    if (!w->second.empty())
      throw Error(file + ": tensor " + detail::quote(t.name) + " names " + detail::quote(m) +
                  ", which is not quantized (" + w->second + ")");
    if (!out.emplace(m, &t).second)
      throw Error(file + ": module " + detail::quote(m) + " has two Hessians (by module and by weight name)");
    const auto shape = quantized_shape.find(m);
    if (shape == quantized_shape.end())  // an expert this export stacks with the others
      throw Error(file + ": tensor " + detail::quote(t.name) + " names " + detail::quote(m) +
                  ", which this export quantizes inside a stack of experts; GPTQ takes per-expert "
                  "weights (export compressed-tensors or modelopt), so leave it out of the file");
    const std::int64_t K = shape->second[1];
    if (t.shape != Shape{K, K})
      throw Error(file + ": tensor " + detail::quote(t.name) + " has shape " + shape_str(t.shape, ShapeStyle::dims) +
                  ", expected [K, K] = [" + std::to_string(K) + ", " + std::to_string(K) + "] for the weight of " +
                  detail::quote(m));
    if (t.dtype != StDType::f32 && t.dtype != StDType::f64)
      throw Error(file + ": tensor " + detail::quote(t.name) + " is " + t.dtype_name() + ", expected F32 or F64");
  }
  return out;
}

// mlx-lm's SwitchGLU holds a projection's experts as one [experts, N, K] layer, and its sanitize
// stacks only float weights (Qwen3-MoE's only `.weight`), so quantized ones are stacked here:
// "<p>.experts.<i>.<proj>.weight" of experts 0 to E-1 become "<p>.switch_mlp.<proj>".
void stack_per_expert(std::vector<PlannedLayer>& chosen, const std::map<std::string, std::string>& kept) {
  std::vector<std::string> names;
  for (const PlannedLayer& s : chosen) names.push_back(s.tensor);
  std::set<std::string> modules;
  for (const std::string& n : names)
    if (const auto e = per_expert_name(n)) modules.insert(switch_mlp_module(*e));
  if (modules.empty()) return;
  for (const auto& [n, why] : kept)
    if (const auto e = per_expert_name(n))
      if (modules.count(switch_mlp_module(*e)))
        throw Error("expert weight " + detail::quote(n) + " is left in high precision (" + why +
                    ") while the other experts of " + detail::quote(e->prefix) +
                    " are quantized: mlx-lm holds a projection's experts as one stacked layer of one format. "
                    "Quantize all of them or none (--exclude '" +
                    e->prefix + ".experts.*')");
  const std::vector<ExpertGroup> groups = expert_groups(names);
  std::vector<bool> drop(chosen.size(), false);
  std::vector<PlannedLayer> stacked;
  for (const ExpertGroup& g : groups) {
    const PlannedLayer& first = chosen[g.members.front()];
    ExpertRows r;
    r.module = g.module;
    r.experts = static_cast<std::int64_t>(g.members.size());
    r.rows = first.skel.rows();
    r.cols = first.skel.cols();
    for (std::size_t i : g.members) {
      const PlannedLayer& s = chosen[i];
      if (s.skel.shape != first.skel.shape || s.skel.float_dtype != first.skel.float_dtype)
        throw Error("expert weight " + detail::quote(s.tensor) + " is " + st_dtype_name(s.skel.float_dtype) + " " +
                    shape_str(s.skel.shape, ShapeStyle::list) + " but " + detail::quote(first.tensor) + " is " +
                    st_dtype_name(first.skel.float_dtype) + " " + shape_str(first.skel.shape, ShapeStyle::list) +
                    ": mlx-lm stacks a projection's experts into one tensor");
      if (s.format.text != first.format.text || s.pinned != first.pinned)
        throw Error("expert weight " + detail::quote(s.tensor) + " is " +
                    (s.pinned ? s.format.text : "left to --budget") + " but " + detail::quote(first.tensor) + " is " +
                    (first.pinned ? first.format.text : "left to --budget") +
                    ": mlx-lm stacks a projection's experts into one tensor of one format");
      r.tensors.push_back(s.tensor);
      drop[i] = true;
    }
    Layer l = first.skel;
    l.module = r.module;
    l.shape = {mul(r.module, r.experts, r.rows, "experts x rows"), r.cols};
    l.experts = r.experts;
    stacked.push_back({first.tensor, r.module, std::move(l), std::move(r), first.format, first.pinned});
  }
  std::vector<PlannedLayer> out;
  for (std::size_t i = 0; i < chosen.size(); ++i)
    if (!drop[i]) out.push_back(std::move(chosen[i]));
  for (PlannedLayer& s : stacked) out.push_back(std::move(s));
  chosen = std::move(out);
}

// "nvfp4 and mxfp4": the modes a layout holds.
std::string modes_text(const LayoutOps& lay) {
  std::string out;
  for (std::size_t i = 0; i < lay.modes.size(); ++i)
    out += (i == 0 ? "" : i + 1 == lay.modes.size() ? " and " : ", ") + std::string(name(lay.modes[i]));
  return out;
}

// The checks that need every layer's final format: W4A4, GPTQ, the layout, fused groups.
void check_formats(QuantizePlan& plan, const QuantizeOptions& opt) {
  const LayoutOps& lay = *plan.layout;
  std::vector<PlannedLayer>& chosen = plan.layers;
  // Activation scales: only from the user's calibration; refuse W4A4 without them.
  const bool w4a4 = plan.w4a4 = opt.w4a4 || !opt.activation_amax.empty();
  if (w4a4) {
    for (const PlannedLayer& s : chosen)
      if (s.format.spec.mode != Mode::nvfp4 || !lay.activation_scales)
        throw Error("static activation scales (W4A4) exist for nvfp4 with --export " +
                    layouts_with(&LayoutOps::activation_scales, false) + " only" +
                    (s.format.spec.mode != Mode::nvfp4 ? "; layer " + detail::quote(s.module) + " is " + s.format.text
                                                       : std::string()));
    for (PlannedLayer& s : chosen) {
      auto it = opt.activation_amax.find(s.module);
      if (it == opt.activation_amax.end())
        throw Error(
            "W4A4 needs a static activation amax for every quantized layer (microscale does not calibrate); "
            "missing for " +
            detail::quote(s.module) +
            ". Supply them all with --activation-amax, or drop --w4a4 for a weight-only (NVFP4A16) export");
      check_activation_amax(it->second, "activation amax of " + detail::quote(s.module));
      s.skel.act = Global::of_amax(it->second);
    }
  }
  if (!plan.gptq.empty()) {
    // Checked here, before any layer is written, rather than by the first GPTQ call.
    if (!(opt.gptq.damp >= 0) || !std::isfinite(opt.gptq.damp))
      throw Error("--gptq-damp " + fmt_float(opt.gptq.damp) +
                  ": the dampening is a fraction of H's mean diagonal, a finite number >= 0");
    for (const PlannedLayer& l : chosen) {
      if (!plan.gptq.count(l.module)) continue;
      const QuantSpec& s = l.format.spec;
      if (opt.gptq.block_size < 1 || opt.gptq.block_size % s.group_size != 0)
        throw Error("--gptq-block-size " + std::to_string(opt.gptq.block_size) +
                    ": GPTQ's column batches must be a positive multiple of the group size " +
                    std::to_string(s.group_size) + " (" + l.format.text + " of " + detail::quote(l.module) + ")");
      if (s.scale_search != ScaleSearch::none)
        throw Error("--hessians (GPTQ) does not combine with --scale-search " + std::string(name(s.scale_search)) +
                    " (" + detail::quote(l.module) + "); GPTQ chooses the codes itself");
      if (s.scale_2d)
        throw Error("--hessians (GPTQ) does not combine with --scale-2d (" + detail::quote(l.module) +
                    "); GPTQ rounds on 1x16 blocks");
    }
    plan.notes.push_back("GPTQ for " + std::to_string(plan.gptq.size()) + " of " + std::to_string(chosen.size()) +
                         " layers (Hessians from " + opt.hessians.string() + "), round to nearest for the others");
  }
  for (const PlannedLayer& l : chosen) (void)emit(l.skel, opt.to);  // throws if the layout cannot hold this mode

  std::vector<std::string> mods;
  std::map<std::string, const PlannedLayer*> by_module;
  for (const PlannedLayer& l : chosen) {
    mods.push_back(l.module);
    by_module[l.module] = &l;
  }
  // vLLM loads a fused group (q/k/v, gate/up) as one GEMM of one scheme.
  if (lay.fused_loading)
    for (const auto& g : fused_groups(mods)) {
      const PlannedLayer& first = *by_module[g.front()];
      for (const std::string& m : g)
        if (by_module[m]->format.text != first.format.text ||
            by_module[m]->format.three_level != first.format.three_level)
          throw Error(detail::quote(first.module) + " is " + first.format.text + " but " + detail::quote(m) + " is " +
                      by_module[m]->format.text + ": " + lay.title +
                      " loaders (vLLM) run a fused group (q/k/v, gate/up) as one GEMM, so its members need one "
                      "format");
    }
  // Fused groups share the largest amax of their members (vLLM keeps one scale per fused GEMM),
  // computed when a group's first member is written: a split run's part reads only its own groups.
  if (opt.share_fused_scales) {
    std::vector<std::string> three;
    for (const PlannedLayer& l : chosen)
      if (l.format.three_level) three.push_back(l.module);
    plan.fused = fused_groups(three);
    if (!plan.fused.empty())
      plan.notes.push_back(std::to_string(plan.fused.size()) +
                           " fused groups (q/k/v, gate/up, ...) share one global scale each: the largest amax of "
                           "their members, as ModelOpt and llm-compressor export them");
  }
}

}  // namespace

LayerSpec layer_spec(const LayerFormat& f, const LayoutOps& lay, NonFinite nonfinite, const std::string& what) {
  LayerSpec out;
  out.text = f.text;
  QuantSpec s = *f.spec;
  s.nonfinite = nonfinite;
  s.global_scale.reset();
  s.layout = Layout::compact;  // every checkpoint layout stores compact scales
  if (lay.default_scale_rule && !f.scale_rule_set) lay.default_scale_rule(s);
  try {
    s = resolve(s);
    if (lay.check_spec) lay.check_spec(s);
  } catch (const Error& e) {
    throw Error(what + ": " + e.what());
  }
  if (!lay.holds(s.mode))
    throw Error(what + ": " + lay.title + " holds " + modes_text(lay) + " layers, not " + name(s.mode));
  if (s.mode == Mode::nvfp4 && f.levels == 3 && !lay.global_scale)
    throw Error(what + ": levels=3 needs a stored global scale, and " + lay.title + " nvfp4 is two-level");
  out.spec = s;
  // CT and ModelOpt store a global scale (three-level); mlx-lm's nvfp4 is two-level.
  out.three_level = s.mode == Mode::nvfp4 && lay.global_scale && f.levels != 2;
  out.unit_global = s.mode == Mode::nvfp4 && lay.global_scale && f.levels == 2;
  // K must be whole groups, and whole blocks where the layout's blocks span several groups (GGUF).
  out.row_block = lay.row_block ? lay.row_block(s.mode) : s.group_size;
  return out;
}

const PlannedLayer* QuantizePlan::find_layer(const std::string& module) const {
  for (const PlannedLayer& l : layers)
    if (l.module == module) return &l;
  return nullptr;
}

QuantMeta QuantizePlan::meta() const {
  QuantMeta meta;
  meta.w4a4 = w4a4;
  meta.gptq_layers = static_cast<int>(gptq.size());
  meta.gptq = gptq_options;
  meta.ignore = ignore;
  for (const PlannedLayer& l : layers) {
    meta.layers.push_back(&l.skel);
    // The producer block records a search or 2D scales when any layer used them.
    if (meta.scale_search == ScaleSearch::none) meta.scale_search = l.format.spec.scale_search;
    meta.scale_2d = meta.scale_2d || l.format.spec.scale_2d;
  }
  return meta;
}

QuantizePlan plan_quantize(const fs::path& in_path, const Input& in, const Detected& det, const QuantizeOptions& opt,
                           bool copy_codes) {
  if (!det.layers.empty())
    throw Error(in_path.string() + " is already quantized (" + det.convention_name() +
                "); use microscale convert or microscale dequantize");
  // FP8 sources are decoded below; gpt-oss is refused, unless convert copies its codes.
  if (!copy_codes) check_quantizable(det.sources, in_path.string());
  if (!det.unsupported.empty()) {  // e.g. FP8 E5M2 weights: convert and dequantize cannot read them either
    std::string list;
    for (std::size_t i = 0; i < det.unsupported.size() && i < 3; ++i) {
      const std::string& n = det.unsupported[i];
      list += (i ? ", " : "") + detail::quote(n) + " " + st_dtype_name(in.ck.tensor(n).dtype);
    }
    throw Error(in_path.string() + " holds weights already quantized in a format microscale does not read (" + list +
                "; a quantized format microscale does not read). Start from the model's float "
                "(bfloat16/float16/float32) release, or dequantize this one to float with its own tools first");
  }

  QuantizePlan plan;
  const LayoutOps& lay = *(plan.layout = &layout(opt.to));
  // Loaders read a checkpoint's weights as they are: transformed weights would need transformed
  // activations, and stochastic rounding only adds error to a weight written once.
  if (opt.spec.hadamard || opt.spec.sr_seed)
    throw Error(std::string(opt.spec.hadamard ? "hadamard" : "sr_seed (stochastic rounding)") +
                " is not an option of checkpoint quantization (the weights must load unchanged); use it with "
                "quantize on tensors");
  const LayerFormat base_format{opt.spec, opt.scale_rule_set, 0, name(opt.spec.mode)};
  const LayerSpec& base = plan.base = layer_spec(base_format, lay, opt.spec.nonfinite, "--format");
  std::vector<LayerSpec> rule_specs;
  for (std::size_t r = 0; r < opt.recipe.size(); ++r)
    rule_specs.push_back(opt.recipe[r].format.keep() ? LayerSpec{}
                                                     : layer_spec(opt.recipe[r].format, lay, opt.spec.nonfinite,
                                                                  "recipe rule " + std::to_string(r + 1) + " (" +
                                                                      detail::quote(opt.recipe[r].pattern) + ")"));
  std::vector<bool> rule_used(opt.recipe.size(), false);
  const bool budget = opt.budget_bits.has_value();
  const std::vector<LayerSpec> candidates = budget ? budget_candidates(opt, lay) : std::vector<LayerSpec>{};
  if (budget && copy_codes) throw Error("--budget chooses formats for quantize, not for convert");
  // The format of the layer of module `m` (kept: null), whether a rule pinned it, and the reason
  // it is kept when no format fits its K.
  struct Choice {
    const LayerSpec* spec = nullptr;
    bool pinned = true;
    Keep why = Keep::quantize;
    std::int64_t row_block = 0;
  };
  auto choose = [&](const std::string& m, std::int64_t k) {
    Choice c;
    for (std::size_t r = 0; r < opt.recipe.size() && !c.spec; ++r)
      if (matches({opt.recipe[r].pattern}, m)) {
        rule_used[r] = true;
        if (opt.recipe[r].format.keep()) return Choice{nullptr, true, Keep::recipe, 0};
        c.spec = &rule_specs[r];
      }
    if (!c.spec && budget) {  // the first candidate that fits stands in until the choice
      c.pinned = false;
      for (const LayerSpec& cand : candidates)
        if (!cand.keep() && k > 0 && k % cand.row_block == 0) {
          c.spec = &cand;
          return c;
        }
      for (const LayerSpec& cand : candidates)
        if (!cand.keep() && (c.row_block == 0 || cand.row_block < c.row_block)) c.row_block = cand.row_block;
      c.spec = nullptr;
      c.why = Keep::group;
      return c;
    }
    if (!c.spec) c.spec = &base;
    if (k == 0 || k % c.spec->row_block != 0) {
      c.row_block = c.spec->row_block;
      c.spec = nullptr;
      c.why = Keep::group;
    }
    return c;
  };

  plan.copy_codes = copy_codes;
  // MLX and GGUF write experts stacked [experts, N, K], as mlx-lm's SwitchGLU and llama.cpp's
  // *_exps tensors hold them (experts.hpp).
  const bool stack = plan.stack_experts = lay.stacked_experts;
  const bool gptoss = is_gptoss(in.config);
  // Select, and plan the layers as skeletons (shapes, no data) to validate the layout up front.
  std::vector<PlannedLayer>& chosen = plan.layers;
  std::vector<std::string>& ignore = plan.ignore;
  std::map<std::string, std::string>& kept = plan.kept;
  std::map<std::string, std::string> weight_modules;  // module -> why kept ("" when quantized)
  std::vector<std::string> conv1d;
  std::set<std::string> all_modules;
  for (const std::string& n : in.ck.names()) {
    const StTensor& t = in.ck.tensor(n);
    if (det.sources.consumed.count(n) && !det.sources.find(n)) continue;  // FP8 scales: dropped
    const StDType dtype = det.sources.find(n) ? StDType::f32 : t.dtype;   // FP8 weights decode to float32
    // Copied gpt-oss codes: selected as the [E, in, out] stack dequantize writes for them.
    const SourceWeight* codes = copy_codes ? det.sources.find(n) : nullptr;
    const std::string& logical = codes ? codes->output : n;
    const Shape& shape = codes ? codes->shape : t.shape;
    if (codes && !gptoss_expert_weight(logical, shape))
      throw Error("gpt-oss MXFP4 tensor " + detail::quote(n) +
                  " is not one of gpt-oss's expert stacks (<p>.experts.gate_up_proj_blocks, "
                  "<p>.experts.down_proj_blocks), the only MXFP4 tensors convert has a " +
                  lay.title + " form for");
    if (codes && shape[0] == 0)
      throw Error("gpt-oss MXFP4 tensor " + detail::quote(n) + " holds no experts (" +
                  shape_str(t.shape, ShapeStyle::list) + "): there are no codes to convert");
    all_modules.insert(module_of(logical));
    if (!looks_like_weight(logical, shape)) continue;  // biases, norms, buffers: copied
    const std::string m = owner_module(logical);
    // Split into gate, up and down: stacked for MLX and GGUF; copied codes elsewhere go per expert.
    const bool gptoss_stack = (codes || (stack && gptoss)) && gptoss_expert_weight(logical, shape);
    Keep why = gptoss_stack ? Keep::quantize : shape.size() != 2 ? Keep::rank : default_keep(n, shape, dtype);
    if (by_name(why) && matches(opt.include, m)) why = Keep::quantize;
    if (why == Keep::quantize && matches(opt.exclude, m)) why = Keep::excluded;
    // K = 0 fits no group either: its codes and scales would have no columns to tell the group from.
    Choice c;
    if (why == Keep::quantize && !copy_codes) {
      c = choose(m, shape[1]);  // K: the input dimension, [E, in, out] for gpt-oss stacks too
      why = c.why;
    } else if (why == Keep::quantize) {
      c.spec = &base;
    }
    const std::string reason = kept_reason(why, logical, shape, dtype, static_cast<int>(c.row_block), lay, gptoss);
    if (!weight_modules.count(m) || why != Keep::quantize) weight_modules[m] = reason;
    if (why != Keep::quantize) {
      kept[n] = reason;
      add_ignored(ignore, m, why);
      continue;
    }
    if (conv1d_weight(in.config, m)) conv1d.push_back(n);
    if (gptoss_stack) {  // [E, in, out]: K is the input dimension, shape[1]
      for (ExpertRows& r : gptoss_layers(logical, shape)) {
        if (codes) r.tensors = {n};
        if (!stack) {  // llm-compressor's linearized experts: one [N, K] Linear each
          for (std::int64_t e = 0; e < r.experts; ++e) {
            ExpertRows one = gptoss_expert(r, e);
            Layer l = Layer::of(one.module, c.spec->spec, {one.rows, one.cols});
            if (c.spec->three_level && !codes) l.global = Global::of_amax(1.0f);
            l.float_dtype = dtype;
            chosen.push_back({n, one.module, std::move(l), std::move(one), *c.spec, c.pinned});
          }
          continue;
        }
        Layer l = Layer::of(r.module, c.spec->spec, {mul(n, r.experts, r.rows, "experts x rows"), r.cols});
        if (c.spec->three_level && !codes) l.global = Global::of_amax(1.0f);
        l.experts = r.experts;
        l.float_dtype = dtype;
        chosen.push_back({n, r.module, std::move(l), std::move(r), *c.spec, c.pinned});
      }
      continue;
    }
    Layer l = Layer::of(m, c.spec->spec, t.shape);
    l.float_dtype = dtype;
    if (c.spec->three_level) l.global = Global::of_amax(1.0f);
    chosen.push_back({n, m, std::move(l), std::nullopt, *c.spec, c.pinned});
  }
  if (stack) stack_per_expert(chosen, kept);
  // gpt-oss in MLX: mlx-lm reads its experts either all split (gate_proj, up_proj, down_proj; its
  // sanitize then stands aside) or all in the original stacked form, never a mix.
  const bool gptoss_split = plan.gptoss_split =
      std::any_of(chosen.begin(), chosen.end(), [](const PlannedLayer& l) { return l.experts && l.experts->col_step; });
  if (gptoss_split)
    for (const auto& [n, why] : kept)
      if (gptoss_expert_weight(n, in.ck.tensor(n).shape))
        throw Error("gpt-oss expert weight " + detail::quote(n) + " is left in high precision (" + why +
                    ") while other expert weights are quantized: mlx-lm reads gpt-oss's experts all split and "
                    "quantized or all in the original form. Quantize all of them or none (--exclude experts)");
  // The stacks and biases split must fit together: a gate_up_proj of odd width would lose its
  // last column, a bias of other experts or columns would be split all the same.
  if (gptoss_split) {
    auto find = [&](const std::string& logical) -> std::optional<GptossTensor> {
      if (const SourceWeight* w = copy_codes ? det.sources.find(logical + "_blocks") : nullptr)
        return GptossTensor{w->data, w->shape};
      if (in.ck.contains(logical)) return GptossTensor{logical, in.ck.tensor(logical).shape};
      return std::nullopt;
    };
    std::set<std::string> parents;  // "<p>.experts."
    auto parent_of = [](const std::string& n) { return n.substr(0, n.rfind('.') + 1); };
    for (const PlannedLayer& l : chosen)
      if (l.experts && l.experts->col_step) parents.insert(parent_of(l.experts->tensors.front()));
    for (const std::string& n : in.ck.names())
      if (!gptoss_bias_parts(n).empty()) parents.insert(parent_of(n));
    for (const std::string& p : parents) check_gptoss_fit(p, find);
  }

  // Patterns and module names that select nothing are typos: refuse them.
  auto example = [&] {
    return weight_modules.empty() ? std::string("this checkpoint has no weights")
                                  : "modules are named like " + detail::quote(weight_modules.begin()->first);
  };
  for (const std::string& p : opt.exclude)
    if (std::none_of(all_modules.begin(), all_modules.end(), [&](const std::string& m) { return matches({p}, m); }))
      throw Error("--exclude " + detail::quote(p) + " matches no module (" + example() + ")");
  for (const std::string& p : opt.include) {
    std::vector<std::pair<std::string, std::string>> hit;
    bool used = false;
    for (const auto& [m, why] : weight_modules)
      if (matches({p}, m)) {
        used = used || why.empty();
        hit.emplace_back(m, why);
      }
    if (hit.empty()) throw Error("--include " + detail::quote(p) + " matches no weight (" + example() + ")");
    if (!used)
      throw Error("--include " + detail::quote(p) + " selects nothing that can be quantized: " + list_reasons(hit));
  }
  for (std::size_t r = 0; r < opt.recipe.size(); ++r)
    if (!rule_used[r]) {
      std::vector<std::pair<std::string, std::string>> hit;
      for (const auto& [m, why] : weight_modules)
        if (matches({opt.recipe[r].pattern}, m)) hit.emplace_back(m, why);
      const std::string rule = "recipe rule " + std::to_string(r + 1) + " (" + detail::quote(opt.recipe[r].pattern) +
                               " -> " + opt.recipe[r].format.text + ")";
      if (hit.empty()) throw Error(rule + " matches no weight (" + example() + ")");
      throw Error(rule +
                  " matches no layer left to it (an earlier rule, --exclude, or a weight kept by name, "
                  "which --include selects): " +
                  list_reasons(hit));
    }
  for (const auto& [m, amax] : opt.activation_amax) {
    const auto w = weight_modules.find(m);
    if (w == weight_modules.end())
      throw Error("--activation-amax names " + detail::quote(m) + ", which is no module of this checkpoint (" +
                  example() + ")");
    if (!w->second.empty())
      throw Error("--activation-amax names " + detail::quote(m) + ", which is not quantized (" + w->second + ")");
  }
  if (!conv1d.empty()) {
    std::vector<std::pair<std::string, std::string>> names;
    for (const std::string& n : conv1d) names.emplace_back(n, "");
    throw Error(
        "GPT-2 style Conv1D weights are stored [in, out], transposed from Linear's [out, in], and microscale "
        "does not quantize them yet (groups would run along the wrong axis): " +
        list_reasons(names, 6) + ". Keep them in high precision with --exclude c_attn --exclude c_fc --exclude c_proj");
  }
  if (chosen.empty())
    throw Error("no weights to quantize in " + in_path.string() +
                (kept.empty() ? std::string(": it has no 2-D .weight tensors")
                              : ": " + list_reasons({kept.begin(), kept.end()})));

  // Hessians: GPTQ for the layers the file covers, or under --budget the error estimate's weights.
  plan.gptq_options = opt.gptq;
  if (!opt.hessians.empty()) {
    plan.hessians = std::make_shared<const SafetensorsFile>(SafetensorsFile::open(opt.hessians));
    std::map<std::string, Shape> shapes;
    for (const PlannedLayer& l : chosen) shapes[l.module] = in.ck.tensor(l.tensor).shape;
    for (const auto& [m, t] : hessians_by_module(*plan.hessians, weight_modules, shapes, example()))
      plan.hessian_of[m] = t->name;
    if (plan.hessian_of.empty()) throw Error("--hessians " + opt.hessians.string() + " holds no tensors");
    if (!budget) plan.gptq = plan.hessian_of;
  }
  if (!budget) check_formats(plan, opt);
  return plan;
}

std::vector<LayerSpec> budget_candidates(const QuantizeOptions& opt, const LayoutOps& lay) {
  if (!(*opt.budget_bits > 0) || !std::isfinite(*opt.budget_bits))
    throw Error("--budget " + fmt_float(*opt.budget_bits) + ": the budget is a positive number of bits per weight");
  std::vector<LayerFormat> formats = opt.candidates;
  if (formats.empty())  // the defaults the layout holds (GGUF has no mxfp8)
    for (const char* f : {"nvfp4,scale_search=mse", "mxfp8", "keep"}) {
      LayerFormat d = parse_layer_format(f, "the default --candidate");
      if (d.keep() || lay.holds(d.spec->mode)) formats.push_back(std::move(d));
    }
  std::vector<LayerSpec> out;
  for (const LayerFormat& f : formats) {
    const std::string what = "--candidate " + detail::quote(f.text);
    for (const LayerSpec& o : out)
      if (o.text == f.text) throw Error(what + " is listed twice");
    if (f.keep()) {
      LayerSpec keep;
      keep.text = f.text;
      out.push_back(keep);
      continue;
    }
    out.push_back(layer_spec(f, lay, opt.spec.nonfinite, what));
  }
  if (std::all_of(out.begin(), out.end(), [](const LayerSpec& c) { return c.keep(); }))
    throw Error("--budget needs at least one quantized --candidate");
  return out;
}

void apply_choice(QuantizePlan& plan, const QuantizeOptions& opt, const std::vector<const LayerSpec*>& chosen) {
  std::vector<PlannedLayer> layers;
  for (std::size_t i = 0; i < plan.layers.size(); ++i) {
    PlannedLayer& l = plan.layers[i];
    const LayerSpec* f = chosen[i];
    if (!f) {  // kept in high precision
      for (const std::string& t : l.experts ? l.experts->tensors : std::vector<std::string>{l.tensor}) {
        plan.kept[t] = keep_text(Keep::budget, {}, StDType::f32);
        add_ignored(plan.ignore, owner_module(t), Keep::budget);
      }
      continue;
    }
    if (!l.pinned) {
      Layer skel = Layer::of(l.skel.module, f->spec, l.skel.shape);
      skel.float_dtype = l.skel.float_dtype;
      skel.experts = l.skel.experts;
      if (f->three_level) skel.global = Global::of_amax(1.0f);
      l.skel = std::move(skel);
      l.format = *f;
    }
    layers.push_back(std::move(l));
  }
  plan.layers = std::move(layers);
  if (plan.layers.empty())
    throw Error("--budget " + fmt_float(*opt.budget_bits) +
                " lets every layer stay in high precision, so there is nothing to quantize; give a lower budget");
  check_formats(plan, opt);
}

}  // namespace microscale::io::ck
