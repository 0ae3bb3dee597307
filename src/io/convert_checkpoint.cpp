// convert_checkpoint (same quantized bytes, another layout) and dequantize_checkpoint (back to
// float weights) of a quantized checkpoint.
#include <algorithm>
#include <map>
#include <set>

#include "io/experts.hpp"
#include "io/source_gptoss.hpp"
#include "io/weight_rules.hpp"
#include "io/write_pipeline.hpp"

namespace microscale::io {

namespace {

using namespace ck;

// The float dtype the quantized checkpoint was made from: config.json's torch_dtype (or dtype,
// its newer name), else the dtype of MLX affine scales, else bfloat16 (with a note).
DType source_dtype(const Input& in, const Detected& det, Report& report) {
  if (in.config.is_object())
    for (const char* k : {"torch_dtype", "dtype"})
      if (auto it = in.config.find(k); it != in.config.end() && it->is_string()) {
        const std::string v = it->get<std::string>();
        for (DType d : {DType::float32, DType::float16, DType::bfloat16})
          if (v == dtype_name(d)) return d;
      }
  for (const Layer& l : det.layers)
    if (l.format.mode == Mode::affine)
      if (const auto d = to_dtype(l.float_dtype); d && is_float(*d)) return *d;
  report.notes.push_back(
      "the source dtype is not recorded (no torch_dtype in config.json): wrote bfloat16; choose "
      "another with --dtype");
  return DType::bfloat16;
}

// Dequantized stacked experts go back to the form transformers loads: "<p>.switch_mlp.<proj>"
// into per-expert weights; gpt-oss's split gate, up and down (and their biases) into its
// [E, in, out] stacks. Returns false for a layer written as it is.
bool unstack_experts(const Input& in, const Layer& l, DType dtype, NonFinite nonfinite, std::vector<Item>& items,
                     Report& report) {
  if (!l.experts) return false;
  const std::int64_t n = l.rows() / l.experts, k = l.cols();
  const std::vector<std::string> names = per_expert_outputs(l.module, l.experts, in.config);
  if (names.empty()) return false;
  Item it = layer_item(in, l);
  for (const std::string& name : names) it.entries.push_back({name, to_st_dtype(dtype), {n, k}});
  it.run = [&in, &report, lp = &l, names, dtype, nonfinite, bytes = it.in_bytes](TensorSink& w) {
    const Tensor y = dequantize_layer(*lp, dtype);
    TensorReport r = layer_report(*lp, TensorAction::dequantized, bytes);
    check_nonfinite({y.bytes(), y.nbytes()}, dtype, lp->module, nonfinite, r);
    const std::size_t each = y.nbytes() / names.size();
    for (std::size_t e = 0; e < names.size(); ++e) w.write(names[e], {y.bytes() + e * each, each});
    release_sources(in.ck, *lp);
    r.bytes_out = y.nbytes();
    report.tensors.push_back(std::move(r));
  };
  items.push_back(std::move(it));
  return true;
}

// MLX holds a projection's experts stacked (mlx-lm's SwitchGLU): the per-expert layers of each
// projection become one layer, with no data until it is written (stack_data).
struct StackedLayer {
  Layer layer;
  std::vector<const Layer*> members;
};

// A layout that stores a global scale (GGUF's per-expert ".scale") keeps each expert's own.
std::vector<StackedLayer> stack_layers(const std::vector<Layer>& layers, const LayoutOps& lay) {
  std::vector<std::string> names;
  for (const Layer& l : layers) names.push_back(l.module + ".weight");
  std::vector<StackedLayer> out;
  for (const ExpertGroup& g : expert_groups(names)) {
    StackedLayer st;
    const Layer& first = layers[g.members.front()];
    for (std::size_t i : g.members) {
      const Layer& l = layers[i];
      if (l.shape != first.shape || l.format.mode != first.format.mode ||
          l.format.group_size != first.format.group_size || l.format.bits != first.format.bits ||
          l.float_dtype != first.float_dtype || l.global.three_level() != first.global.three_level() ||
          (!lay.global_scale && l.global.to_amax() != first.global.to_amax()))
        throw Error("expert layer " + detail::quote(l.module) + " differs from " + detail::quote(first.module) +
                    " in shape, format or global scale: " + lay.title +
                    " stacks a projection's experts into one layer of one format");
      st.members.push_back(&l);
    }
    st.layer = first;
    if (lay.global_scale && first.global.three_level())
      for (const Layer* m : st.members) st.layer.expert_globals.push_back(m->global);
    st.layer.module = g.module;
    st.layer.experts = static_cast<std::int64_t>(g.members.size());
    st.layer.shape = {mul(g.module, st.layer.experts, first.rows(), "experts x rows"), first.cols()};
    st.layer.packed = st.layer.scales = st.layer.biases = {};
    st.layer.sources.clear();
    for (const Layer* m : st.members)
      st.layer.sources.insert(st.layer.sources.end(), m->sources.begin(), m->sources.end());
    out.push_back(std::move(st));
  }
  return out;
}

// The other way: a stacked "<p>.switch_mlp.<proj>" layer into its per-expert layers (views of its
// rows), for layouts whose loaders read experts one by one. Other layers are kept as they are.
std::vector<Layer> unstack_layers(std::vector<Layer> layers, const Json& config) {
  std::vector<Layer> out;
  for (Layer& l : layers) {
    const std::vector<std::string> names =
        l.experts ? per_expert_outputs(l.module, l.experts, config) : std::vector<std::string>{};
    if (names.empty()) {
      out.push_back(std::move(l));
      continue;
    }
    const auto e_count = static_cast<std::size_t>(l.experts);
    auto slice = [e_count](std::span<const std::byte> s, std::size_t e) {
      return s.empty() ? s : s.subspan(e * (s.size() / e_count), s.size() / e_count);
    };
    for (std::size_t e = 0; e < e_count; ++e) {
      Layer sub = l;
      sub.module = names[e].substr(0, names[e].size() - std::string_view(".weight").size());
      sub.experts = 0;
      sub.shape = {l.rows() / l.experts, l.cols()};
      sub.packed = slice(l.packed, e);
      sub.scales = slice(l.scales, e);
      sub.biases = slice(l.biases, e);
      out.push_back(std::move(sub));
    }
  }
  return out;
}

// The stacked layer's data: its members' bytes concatenated in expert order.
struct StackData {
  std::vector<std::byte> packed, scales, biases;
};
Layer stack_data(const StackedLayer& st, StackData& d) {
  for (const Layer* m : st.members) {
    d.packed.insert(d.packed.end(), m->packed.begin(), m->packed.end());
    d.scales.insert(d.scales.end(), m->scales.begin(), m->scales.end());
    d.biases.insert(d.biases.end(), m->biases.begin(), m->biases.end());
  }
  Layer l = st.layer;
  l.packed = d.packed;
  l.scales = d.scales;
  l.biases = d.biases;
  return l;
}

// The config groups of a mixed checkpoint's FP8 weights, written as they were, and the targets
// of the group the converted layers get: those of the groups they came from, so that every module
// is claimed as it was (a layer no group claimed is named exactly).
void keep_fp8_groups(const Detected& det, QuantMeta& meta) {
  std::set<std::size_t> fp8, own;
  for (const SourceWeight& w : det.sources.weights)
    if (const auto g = det.group_of.find(w.module); g != det.group_of.end()) fp8.insert(g->second);
  meta.targets = Json::array();
  for (const Layer* l : meta.layers)
    if (const auto g = det.group_of.find(l->module); g != det.group_of.end())
      own.insert(g->second);
    else
      meta.targets.push_back(l->module);
  for (std::size_t g : own) {
    if (fp8.count(g))
      throw Error("config group " + detail::quote(det.groups.groups[g].name) +
                  " of config.json holds both FP8 and packed FP4 weights; a group has one format");
    for (const std::string& t : det.groups.groups[g].targets) meta.targets.push_back(t);
  }
  if (!own.empty()) meta.group_name = det.groups.groups[*own.begin()].name;
  for (std::size_t g : fp8) meta.kept_groups.push_back(&det.groups.groups[g]);
  for (const CtGroup* k : meta.kept_groups)
    if (k->name == meta.group_name) meta.group_name = "group_" + std::to_string(det.groups.groups.size());
}

}  // namespace

// ---- dequantize

Report dequantize_checkpoint(const fs::path& in_path, const fs::path& out, const DequantizeOptions& opt) {
  if (const LayoutOps::FileReader* r = file_reader_for(in_path)) return r->dequantize(in_path, out, opt);
  if (opt.dtype && !is_float(*opt.dtype))
    throw Error(std::string("dequantize: output dtype must be a float type, got ") + dtype_name(*opt.dtype));
  if (opt.nonfinite == NonFinite::saturate)
    throw Error("dequantize: nonfinite must be propagate (write NaN/Inf, counted per tensor) or error, not saturate");
  const Input in = open_complete(in_path);
  const Detected det = detect(in.ck, in.config);
  check_unsupported(det);
  if (det.layers.empty() && !det.sources.kind)
    throw Error(in_path.string() + " holds no quantized layers; nothing to dequantize");
  Report report;
  const DType dtype = opt.dtype ? *opt.dtype : source_dtype(in, det, report);
  std::vector<Item> items;
  std::size_t acts = 0;
  const GptossMerge merge = gptoss_merge(in, det);
  std::set<std::string> merged;  // the layers and biases gptoss_items writes
  for (const auto& [name, parts] : merge.layers)
    for (const Layer* l : parts) merged.insert(l->module);
  for (const auto& [name, parts] : merge.biases) merged.insert(parts.begin(), parts.end());
  gptoss_items(in, merge, dtype, opt.nonfinite, items, report);
  for (const Layer& l : det.layers) {
    acts += l.act.has_value();
    if (merged.count(l.module) || unstack_experts(in, l, dtype, opt.nonfinite, items, report)) continue;
    Item it = layer_item(in, l);
    it.entries = {{l.module + ".weight", to_st_dtype(dtype), l.stored(l.cols())}};
    it.run = [&, lp = &l, bytes = it.in_bytes](TensorSink& w) {
      const Tensor y = dequantize_layer(*lp, dtype);
      TensorReport r = layer_report(*lp, TensorAction::dequantized, bytes);
      check_nonfinite({y.bytes(), y.nbytes()}, dtype, lp->module + ".weight", opt.nonfinite, r);
      w.write_tensor(lp->module + ".weight", y);
      release_sources(in.ck, *lp);
      r.bytes_out = y.nbytes();
      report.tensors.push_back(std::move(r));
    };
    items.push_back(std::move(it));
  }
  for (const SourceWeight& w : det.sources.weights)
    items.push_back(source_item(in, w, dtype, report, TensorAction::dequantized, "", opt.nonfinite));
  note_dropped(det.sources, report);
  for (const std::string& n : in.ck.names())
    if (!det.consumed.count(n) && !det.sources.consumed.count(n) && !merged.count(n))
      items.push_back(passthrough(in, n, report));
  if (acts) report.notes.push_back(std::to_string(acts) + " activation scales dropped (the output is not quantized)");

  WriteOptions w;
  w.force = opt.force;
  w.progress = opt.progress;
  w.dtype = dtype;
  write_output(in, out, items, std::nullopt, {}, w, report);
  return report;
}

// ---- convert

Report convert_checkpoint(const fs::path& in_path, const fs::path& out, const ConvertOptions& opt) {
  if (const LayoutOps::FileReader* r = file_reader_for(in_path)) return r->convert(in_path, out, opt);
  const Input in = open_complete(in_path);
  Detected det = detect(in.ck, in.config);
  check_unsupported(det);
  // gpt-oss MXFP4 (detect refuses mixed layouts): split stacks where the layout stacks experts,
  // else per-expert Linears; a layout without mxfp4 (ModelOpt) is refused below.
  if (det.sources.kind == SourceKind::gptoss_mxfp4 && layout(opt.to).holds(Mode::mxfp4))
    return convert_gptoss_mxfp4(in_path, out, opt);
  if (det.sources.kind && !det.mixed()) refuse_convert(det.sources, in_path.string(), opt.to);
  if (det.layers.empty()) throw Error(in_path.string() + " holds no quantized layers to convert");
  const LayoutOps& lay = layout(opt.to);
  Report report;
  // FP8 weights of a mixed checkpoint (compressed-tensors' FP8 groups, ModelOpt's FP8 layers): kept
  // with their scales and their config group or quantized_layers entry in the layout they came
  // from, else written as floats (docs/checkpoints.md, "Mixed config groups", "MIXED_PRECISION").
  const bool fp8_as_is = det.mixed() && lay.fp8_source == det.sources.kind;
  const bool fp8_decoded = det.mixed() && !fp8_as_is;
  const DType fp8_dtype = fp8_decoded ? source_dtype(in, det, report) : DType::bfloat16;

  // Activation scales survive only when every nvfp4 layer has one (the other formats store
  // none: a mixed checkpoint's MXFP8 layers quantize activations at run time) and the target
  // stores them.
  const auto nvfp4 = [](const Layer& l) { return l.format.mode == Mode::nvfp4; };
  const std::size_t acts = static_cast<std::size_t>(
      std::count_if(det.layers.begin(), det.layers.end(), [](const Layer& l) { return l.act.has_value(); }));
  const std::size_t nvfp4_layers = static_cast<std::size_t>(std::count_if(det.layers.begin(), det.layers.end(), nvfp4));
  const bool w4a4 = acts > 0 && acts == nvfp4_layers && lay.activation_scales;
  if (acts && !w4a4) {
    report.notes.push_back(std::to_string(acts) + " activation scales dropped: " +
                           (!lay.activation_scales ? std::string(lay.title) + " is weight-only"
                                                   : "only some layers have one, so the export is weight-only"));
    for (Layer& l : det.layers) l.act.reset();
  }

  // Fused groups whose global scales differ: never merged silently.
  std::map<std::string, float> unify;  // module -> common amax to re-quantize with
  for (const FusedScales& g : fused_global_scales(det.layers)) {
    if (!g.differ()) continue;
    std::string list;
    for (const auto& [m, a] : g.members) list += (list.empty() ? "" : ", ") + m + " " + fmt_float(a);
    if (opt.unify_fused_scales) {
      for (const auto& [m, a] : g.members) unify[m] = g.hi;
      report.notes.push_back("re-quantized fused group to its common max amax " + fmt_float(g.hi) + ": " + list);
    } else {
      report.notes.push_back("fused group with differing global scales kept per shard (amax " + list +
                             "); vLLM merges them with max() and mis-scales the others: pass "
                             "--unify-fused-scales to re-quantize the group to one scale");
    }
  }

  // Layers whose rows are not whole blocks of the layout (GGUF's nvfp4 needs K a multiple of 64):
  // their values are written as float32, reported, as llama.cpp's converter writes such weights in a
  // float type.
  std::vector<Layer> unfit;
  if (lay.row_block) {
    std::vector<Layer> fit;
    for (Layer& l : det.layers)
      (l.experts == 0 && l.cols() % lay.row_block(l.format.mode) != 0 ? unfit : fit).push_back(std::move(l));
    det.layers = std::move(fit);
  }

  // MLX and GGUF: per-expert layers stacked; the others: stacked layers split per expert. Planned before
  // any file is written, like every other layer.
  std::vector<StackedLayer> stacks;
  std::set<const Layer*> stacked;
  if (!lay.stacked_experts) det.layers = unstack_layers(std::move(det.layers), in.config);
  if (lay.stacked_experts) {
    for (const Layer& l : det.layers) (void)emit(l, opt.to);  // a layer the layout cannot hold, named as such first
    stacks = stack_layers(det.layers, lay);
    for (const StackedLayer& st : stacks) stacked.insert(st.members.begin(), st.members.end());
  }

  // All-or-nothing: every layer is planned (and refused) before any file is written.
  QuantMeta meta;
  meta.w4a4 = w4a4;
  std::vector<std::vector<StEntry>> planned;
  for (const Layer& l : det.layers) {
    if (stacked.count(&l)) {
      planned.emplace_back();
      continue;
    }
    Layer probe = l;
    if (auto u = unify.find(l.module); u != unify.end()) probe.global = Global::of_amax(u->second);
    planned.push_back(entries_of(emit(probe, opt.to)));
    meta.layers.push_back(&l);
  }
  for (const StackedLayer& st : stacks) meta.layers.push_back(&st.layer);
  std::vector<std::vector<StEntry>> planned_stacks;
  for (const StackedLayer& st : stacks) planned_stacks.push_back(entries_of(emit(st.layer, opt.to)));
  for (const std::string& n : in.ck.names()) {
    if (det.consumed.count(n) || det.sources.consumed.count(n)) continue;
    const StTensor& t = in.ck.tensor(n);
    add_ignored_tensor(meta.ignore, n, t.shape, t.dtype);
  }
  if (fp8_decoded)
    for (const SourceWeight& w : det.sources.weights)
      add_ignored_tensor(meta.ignore, w.output, w.shape, to_st_dtype(fp8_dtype));
  if (fp8_as_is && lay.keeps_fp8_groups) keep_fp8_groups(det, meta);
  if (fp8_as_is)
    for (const SourceWeight& w : det.sources.weights) meta.kept_fp8.push_back(&w);

  std::vector<Item> items;
  for (std::size_t i = 0; i < stacks.size(); ++i) {
    Item it = layer_item(in, stacks[i].layer);
    it.entries = std::move(planned_stacks[i]);
    it.layer = it.label;
    it.run = [&, sp = &stacks[i], bytes = it.in_bytes](TensorSink& w) {
      StackData data;
      const Layer l = stack_data(*sp, data);
      TensorReport r = layer_report(l, TensorAction::converted, bytes);
      write_emitted(w, emit(l, opt.to), r);
      release_sources(in.ck, l);
      report.tensors.push_back(std::move(r));
    };
    items.push_back(std::move(it));
  }
  for (std::size_t i = 0; i < det.layers.size(); ++i) {
    const Layer& l = det.layers[i];
    if (stacked.count(&l)) continue;
    Item it = layer_item(in, l);
    // One expert of a split stack reads its own rows of the stack's tensors, not all of them.
    if (l.packed.size() < in.ck.tensor(l.primary()).data.size())
      it.in_bytes = l.packed.size() + l.scales.size() + l.biases.size();
    it.entries = std::move(planned[i]);
    it.layer = it.label;
    it.run = [&, lp = &l, bytes = it.in_bytes](TensorSink& w) {
      TensorReport r = layer_report(*lp, TensorAction::converted, bytes);
      if (auto u = unify.find(lp->module); u != unify.end()) {
        const Tensor y = dequantize_layer(*lp, DType::float32);
        QuantSpec spec = lp->spec();
        spec.global_scale = u->second;
        const Quantized q = quantize(y.view(), spec);
        Layer l2 = *lp;
        l2.point_at(q);
        l2.global = Global::of_amax(u->second);
        write_emitted(w, emit(l2, opt.to), r);
        r.action = TensorAction::re_quantized;
      } else {
        write_emitted(w, emit(*lp, opt.to), r);
      }
      release_sources(in.ck, *lp);
      report.tensors.push_back(std::move(r));
    };
    items.push_back(std::move(it));
  }
  for (const Layer& l : unfit) {
    Item it = layer_item(in, l);
    it.entries = {{l.module + ".weight", StDType::f32, l.shape}};
    it.run = [&, lp = &l, bytes = it.in_bytes](TensorSink& w) {
      TensorReport r = layer_report(*lp, TensorAction::dequantized, bytes);
      r.reason = "K = " + std::to_string(lp->cols()) + " is not a multiple of " + lay.title + "'s " +
                 name(lp->format.mode) + " block of " + std::to_string(lay.row_block(lp->format.mode)) +
                 " values: its values written as float32";
      w.write_tensor(lp->module + ".weight", dequantize_layer(*lp, DType::float32));
      release_sources(in.ck, *lp);
      report.tensors.push_back(std::move(r));
    };
    items.push_back(std::move(it));
  }
  if (fp8_decoded) {
    for (const SourceWeight& w : det.sources.weights) {
      const auto g = det.group_of.find(w.module);
      const std::string from = det.sources.kind == SourceKind::modelopt_fp8 ? "ModelOpt FP8 layer"
                               : g == det.group_of.end()                    ? "FP8 group"
                                                         : "FP8 group " + det.groups.groups[g->second].name;
      items.push_back(
          source_item(in, w, fp8_dtype, report, TensorAction::kept, from + ": " + lay.name + " has no FP8 form here"));
    }
    report.notes.push_back(std::to_string(det.sources.weights.size()) + " FP8 weights (" + name(*det.sources.kind) +
                           ") written as " + dtype_name(fp8_dtype) + " floats: only a " + layout(*det.convention).name +
                           " export keeps them as FP8");
    note_dropped(det.sources, report);
  }
  for (const std::string& n : in.ck.names())
    if (!det.consumed.count(n) && !(fp8_decoded && det.sources.consumed.count(n)))
      items.push_back(passthrough(in, n, report));

  WriteOptions w;
  w.force = opt.force;
  w.progress = opt.progress;
  w.split_bytes = opt.split_bytes;
  write_output(in, out, items, opt.to, meta, w, report);
  return report;
}

}  // namespace microscale::io
