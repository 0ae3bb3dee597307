// quantize_checkpoint: the projection weights of a float checkpoint into one layout's quantized
// tensors, everything else copied (docs/checkpoints.md, "What is quantized").
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "io/tensor_values.hpp"
#include "io/weight_rules.hpp"
#include "io/write_pipeline.hpp"
#include "ops/quantize.hpp"

namespace microscale::io {

namespace {

using namespace ck;

// NaN and Inf are the values with every exponent bit set, in each float format.
template <class Bits>
std::int64_t count_exponent_all_ones(std::span<const std::byte> data, Bits mask) {
  std::int64_t n = 0;
  for (std::size_t i = 0; i + sizeof(Bits) <= data.size(); i += sizeof(Bits)) {
    Bits v;
    std::memcpy(&v, data.data() + i, sizeof(Bits));
    n += (v & mask) == mask;
  }
  return n;
}

std::int64_t count_nonfinite(std::span<const std::byte> data, StDType t) {
  switch (t) {
    case StDType::f32: return count_exponent_all_ones<std::uint32_t>(data, 0x7F800000u);
    case StDType::bf16: return count_exponent_all_ones<std::uint16_t>(data, 0x7F80u);
    case StDType::f16: return count_exponent_all_ones<std::uint16_t>(data, 0x7C00u);
    default: return 0;
  }
}

// GPT-2's Conv1D layers store their weight [in, out], transposed from Linear's [out, in]:
// quantized as stored, groups would run along the output axis. Names alone are not enough
// (GPT-BigCode uses the same names for Linear layers), so the config decides when it names the
// model type.
bool conv1d_weight(const Json& config, const std::string& module) {
  const std::string last = module.substr(module.rfind('.') + 1);
  if (last != "c_attn" && last != "c_fc" && last != "c_proj" && last != "q_attn") return false;
  if (!config.is_object()) return true;
  if (auto a = config.find("architectures"); a != config.end() && a->is_array())
    for (const Json& arch : *a)
      if (arch.is_string())
        for (const char* p : {"GPT2", "OpenAIGPT", "ImageGPT", "DecisionTransformer"})
          if (arch.get<std::string>().rfind(p, 0) == 0) return true;
  const auto t = config.find("model_type");
  if (t == config.end() || !t->is_string()) return true;
  const std::string type = t->get<std::string>();
  return type == "gpt2" || type == "openai-gpt" || type == "imagegpt" || type == "decision_transformer";
}

// The reason reported for a weight-like tensor left in high precision.
std::string kept_reason(Keep k, const std::string& name, const Shape& shape, StDType dtype, int group) {
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

double rel_error(const TensorView& w, const Tensor& y, double* sqnr) {
  const auto n = static_cast<std::size_t>(w.numel());
  const StDType st = to_st_dtype(w.dtype);
  const auto* p = static_cast<const std::byte*>(w.data);
  double err = 0, energy = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double a = element_value(p, st, i), b = y.data<float>()[i];
    if (!std::isfinite(a) || !std::isfinite(b)) continue;
    err += (a - b) * (a - b);
    energy += a * a;
  }
  *sqnr = err > 0 ? 10 * std::log10(energy / err) : INFINITY;
  return energy > 0 ? std::sqrt(err / energy) : 0.0;
}

// The options that shape a quantized output's bytes, which every part of a split run must share.
std::string options_text(const QuantSpec& base, const QuantizeOptions& opt, bool w4a4) {
  Json j = Json::object();
  j["mode"] = name(base.mode);
  j["group"] = base.group_size;
  j["bits"] = base.bits;
  j["scale_rule"] = name(base.scale_rule);
  j["nonfinite"] = name(base.nonfinite);
  j["elem"] = name(base.elem);
  j["export"] = name(opt.to);
  j["exclude"] = opt.exclude;
  j["include"] = opt.include;
  j["share_fused_scales"] = opt.share_fused_scales;
  j["w4a4"] = w4a4;
  Json amax = Json::object();
  for (const auto& [m, a] : opt.activation_amax) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%a", static_cast<double>(a));  // exact
    amax[m] = buf;
  }
  j["activation_amax"] = std::move(amax);
  return j.dump();
}

}  // namespace

Report quantize_checkpoint(const fs::path& in_path, const fs::path& out, const QuantizeOptions& opt) {
  if (opt.part.count < 1 || opt.part.index < 0 || opt.part.index >= opt.part.count)
    throw Error("part " + std::to_string(opt.part.index) + " of " + std::to_string(opt.part.count) +
                ": the number of parts must be at least 1 and the part 0 to one less");
  const Input in = open_complete(in_path);
  const Detected det = detect(in.ck, in.config);
  if (!det.layers.empty())
    throw Error(in_path.string() + " is already quantized (" + det.convention_name() +
                "); use microscale convert or microscale dequantize");
  check_quantizable(det.sources, in_path.string());  // FP8 sources are decoded below; gpt-oss is refused
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

  QuantSpec base = opt.spec;
  base.global_scale.reset();
  base.layout = Layout::compact;  // every checkpoint layout stores compact scales
  const LayoutOps& lay = layout(opt.to);
  if (lay.default_scale_rule && !opt.scale_rule_set) lay.default_scale_rule(base);
  base = resolve(base);
  // Loaders read a checkpoint's weights as they are: transformed weights would need transformed
  // activations, and stochastic rounding only adds error to a weight written once.
  if (base.hadamard || base.sr_seed)
    throw Error(std::string(base.hadamard ? "hadamard" : "sr_seed (stochastic rounding)") +
                " is not an option of checkpoint quantization (the weights must load unchanged); use it with "
                "quantize on tensors");
  if (lay.check_spec) lay.check_spec(base);
  // CT and ModelOpt store a global scale (three-level); mlx-lm's nvfp4 is two-level.
  const bool three = base.mode == Mode::nvfp4 && lay.global_scale;

  Report report;
  // Select, and plan the layers as skeletons (shapes, no data) to validate the layout up front.
  struct Sel {
    std::string name, module;
    Layer skel;
  };
  std::vector<Sel> chosen;
  std::vector<std::string> ignore;
  std::map<std::string, std::string> kept;                     // weight-like tensor -> why it stays in high precision
  std::vector<std::pair<std::string, std::string>> kept_list;  // the same, in checkpoint order
  std::map<std::string, std::string> weight_modules;           // module -> why kept ("" when quantized)
  std::vector<std::string> conv1d;
  std::set<std::string> all_modules;
  for (const std::string& n : in.ck.names()) {
    const StTensor& t = in.ck.tensor(n);
    if (det.sources.consumed.count(n) && !det.sources.find(n)) continue;  // FP8 scales: dropped
    const StDType dtype = det.sources.find(n) ? StDType::f32 : t.dtype;   // FP8 weights decode to float32
    all_modules.insert(module_of(n));
    if (!looks_like_weight(n, t.shape)) continue;  // biases, norms, buffers: copied
    const std::string m = owner_module(n);
    Keep why = t.shape.size() != 2 ? Keep::rank : default_keep(n, t.shape, dtype);
    if (by_name(why) && matches(opt.include, m)) why = Keep::quantize;
    if (why == Keep::quantize && matches(opt.exclude, m)) why = Keep::excluded;
    if (why == Keep::quantize && t.shape[1] % base.group_size != 0) why = Keep::group;
    const std::string reason = kept_reason(why, n, t.shape, dtype, base.group_size);
    if (!weight_modules.count(m) || why != Keep::quantize) weight_modules[m] = reason;
    if (why != Keep::quantize) {
      kept[n] = reason;
      kept_list.emplace_back(n, reason);
      add_ignored(ignore, m, why);
      continue;
    }
    if (conv1d_weight(in.config, m)) conv1d.push_back(n);
    Layer l = Layer::of(m, base, t.shape);
    l.float_dtype = dtype;
    if (three) l.global = Global::of_amax(1.0f);
    chosen.push_back({n, m, std::move(l)});
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
                (kept_list.empty() ? std::string(": it has no 2-D .weight tensors") : ": " + list_reasons(kept_list)));

  // Activation scales: only from the user's calibration; refuse W4A4 without them.
  const bool w4a4 = opt.w4a4 || !opt.activation_amax.empty();
  if (w4a4) {
    if (base.mode != Mode::nvfp4 || !lay.activation_scales)
      throw Error("static activation scales (W4A4) exist for nvfp4 with --export " +
                  layouts_with(&LayoutOps::activation_scales, false) + " only");
    for (Sel& s : chosen) {
      auto it = opt.activation_amax.find(s.module);
      if (it == opt.activation_amax.end())
        throw Error(
            "W4A4 needs a static activation amax for every quantized layer (microscale does not calibrate); "
            "missing for " +
            detail::quote(s.module) +
            ". Supply them all with --activation-amax, or drop --w4a4 for a weight-only (NVFP4A16) export");
      if (!std::isfinite(it->second) || it->second < 0)
        throw Error("activation amax of " + detail::quote(s.module) + " is not a finite non-negative number");
      s.skel.act = Global::of_amax(it->second);
    }
  }
  QuantMeta meta;
  meta.w4a4 = w4a4;
  meta.ignore = ignore;
  meta.scale_search = base.scale_search;
  meta.scale_2d = base.scale_2d;
  for (const Sel& s : chosen) {
    (void)emit(s.skel, opt.to);  // throws if the layout cannot hold this mode
    meta.layers.push_back(&s.skel);
  }

  // Fused groups share the largest amax of their members (vLLM keeps one scale per fused GEMM),
  // computed when a group's first member is written: a split run's part reads only its own groups.
  std::vector<std::vector<std::string>> groups;
  std::map<std::string, std::size_t> group_of;  // module -> its group
  std::map<std::size_t, float> group_amax;
  std::map<std::string, const std::string*> tensor_of;
  if (three && opt.share_fused_scales) {
    std::vector<std::string> mods;
    for (const Sel& s : chosen) {
      mods.push_back(s.module);
      tensor_of[s.module] = &s.name;
    }
    groups = fused_groups(mods);
    for (std::size_t g = 0; g < groups.size(); ++g)
      for (const std::string& m : groups[g]) group_of[m] = g;
    if (!groups.empty())
      report.notes.push_back(std::to_string(groups.size()) +
                             " fused groups (q/k/v, gate/up, ...) share one global scale each: the largest amax of "
                             "their members, as ModelOpt and llm-compressor export them");
  }
  auto shared_amax = [&](std::size_t g) {
    if (const auto it = group_amax.find(g); it != group_amax.end()) return it->second;
    float mx = 0;
    for (const std::string& m : groups[g]) {
      const StTensor& t = in.ck.tensor(*tensor_of[m]);
      Tensor storage;
      mx = std::max(mx, global_scale(float_values(in.ck, det.sources, *tensor_of[m], storage)));
      release(t.data);
    }
    return group_amax[g] = mx;
  };

  std::vector<Item> items;
  std::map<std::string, const Sel*> by_name;
  for (const Sel& s : chosen) by_name[s.name] = &s;
  for (const std::string& n : in.ck.names()) {
    auto sel = by_name.find(n);
    if (sel == by_name.end()) {
      if (det.sources.consumed.count(n) && !det.sources.find(n)) continue;  // FP8 scales: dropped
      const auto k = kept.find(n);
      if (const SourceWeight* w = det.sources.find(n))  // an FP8 weight left unquantized: its float32 values
        items.push_back(source_item(in, *w, DType::float32, report, TensorAction::kept, k->second));
      else
        items.push_back(k == kept.end() ? passthrough(in, n, report) : passthrough(in, n, report, k->second));
      continue;
    }
    const Sel& s = *sel->second;
    Item it = tensor_item(in, n, s.module);
    it.entries = entries_of(emit(s.skel, opt.to));
    it.run = [&, sp = &s](SafetensorsWriter& w) {
      const StTensor& src = in.ck.tensor(sp->name);
      Tensor storage;
      const TensorView x = float_values(in.ck, det.sources, sp->name, storage);
      const std::int64_t nonfinite = count_nonfinite(
          {static_cast<const std::byte*>(x.data), static_cast<std::size_t>(x.numel()) * dtype_size(x.dtype)},
          to_st_dtype(x.dtype));
      if (nonfinite && base.nonfinite == NonFinite::error)
        throw Error("tensor " + detail::quote(sp->name) + " has " + std::to_string(nonfinite) +
                    " non-finite values (NaN/Inf) of " + std::to_string(src.numel()) +
                    "; repair the checkpoint, or pass --nonfinite propagate (NaN/Inf stay "
                    "in the blocks they hit) or saturate");
      const auto group = group_of.find(sp->module);
      const std::optional<float> fused =
          group != group_of.end() ? std::optional(shared_amax(group->second)) : std::nullopt;
      QuantSpec spec = base;
      if (three) spec.global_scale = fused ? *fused : global_scale(x);
      Quantized q;
      try {
        // A fused group keeps its one global scale: mse searches only the block scales there.
        q = ops::quantize(x, spec, !fused.has_value());
      } catch (const Error& e) {
        throw Error("tensor " + detail::quote(sp->name) + ": " + e.what());
      }
      Layer l = sp->skel;
      l.point_at(q);
      l.global = three ? Global::of_amax(*q.spec.global_scale) : Global{};
      TensorReport r;
      r.name = sp->module;
      r.action = TensorAction::quantized;
      r.format = name(q.spec.mode);
      r.shape = src.shape;
      r.bytes_in = src.data.size();
      r.nonfinite = nonfinite;
      write_emitted(w, emit(l, opt.to), r);
      if (opt.measure_error) {
        double sqnr = 0;
        r.rel_error = rel_error(x, dequantize(q, DType::float32), &sqnr);
        r.sqnr_db = sqnr;
      }
      release(src.data);
      report.tensors.push_back(std::move(r));
    };
    items.push_back(std::move(it));
  }

  note_dropped(det.sources, report);
  write_output(in, out, opt.force, items, lay.shard_format, opt.to, meta, opt.progress, report, std::nullopt, opt.part,
               options_text(base, opt, w4a4));
  return report;
}

}  // namespace microscale::io
