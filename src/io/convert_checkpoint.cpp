// convert_checkpoint (same quantized bytes, another layout) and dequantize_checkpoint (back to
// float weights) of a quantized checkpoint.
#include <algorithm>
#include <map>

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

TensorReport layer_report(const Layer& l, TensorAction action, std::uint64_t bytes_in) {
  TensorReport r;
  r.name = l.module;
  r.action = action;
  r.format = name(l.format.mode);
  r.shape = l.shape;
  r.bytes_in = bytes_in;
  return r;
}

}  // namespace

// ---- dequantize

Report dequantize_checkpoint(const fs::path& in_path, const fs::path& out, const DequantizeOptions& opt) {
  if (opt.dtype && !is_float(*opt.dtype))
    throw Error(std::string("dequantize: output dtype must be a float type, got ") + dtype_name(*opt.dtype));
  const Input in = open_complete(in_path);
  const Detected det = detect(in.ck, in.config);
  check_unsupported(det);
  if (det.layers.empty() && !det.sources.kind)
    throw Error(in_path.string() + " holds no quantized layers; nothing to dequantize");
  Report report;
  const DType dtype = opt.dtype ? *opt.dtype : source_dtype(in, det, report);
  std::vector<Item> items;
  std::size_t acts = 0;
  for (const Layer& l : det.layers) {
    Item it = layer_item(in, l);
    it.entries = {{l.module + ".weight", to_st_dtype(dtype), l.shape}};
    acts += l.act.has_value();
    it.run = [&, lp = &l, bytes = it.in_bytes](SafetensorsWriter& w) {
      const Tensor y = dequantize_layer(*lp, dtype);
      w.write_tensor(lp->module + ".weight", y);
      release_sources(in.ck, *lp);
      TensorReport r = layer_report(*lp, TensorAction::dequantized, bytes);
      r.bytes_out = y.nbytes();
      report.tensors.push_back(std::move(r));
    };
    items.push_back(std::move(it));
  }
  for (const SourceWeight& w : det.sources.weights)
    items.push_back(source_item(in, w, dtype, report, TensorAction::dequantized));
  note_dropped(det.sources, report);
  for (const std::string& n : in.ck.names())
    if (!det.consumed.count(n) && !det.sources.consumed.count(n)) items.push_back(passthrough(in, n, report));
  if (acts) report.notes.push_back(std::to_string(acts) + " activation scales dropped (the output is not quantized)");

  write_output(in, out, opt.force, items, nullptr, std::nullopt, {}, opt.progress, report, dtype);
  return report;
}

// ---- convert

Report convert_checkpoint(const fs::path& in_path, const fs::path& out, const ConvertOptions& opt) {
  const Input in = open_complete(in_path);
  Detected det = detect(in.ck, in.config);
  check_unsupported(det);
  if (det.sources.kind) refuse_convert(det.sources, in_path.string());
  if (det.layers.empty()) throw Error(in_path.string() + " holds no quantized layers to convert");
  const LayoutOps& lay = layout(opt.to);
  Report report;

  // Activation scales survive only when every layer has one and the target stores them.
  const std::size_t acts = static_cast<std::size_t>(
      std::count_if(det.layers.begin(), det.layers.end(), [](const Layer& l) { return l.act.has_value(); }));
  const bool w4a4 = acts == det.layers.size() && lay.activation_scales;
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

  // All-or-nothing: every layer is planned (and refused) before any file is written.
  QuantMeta meta;
  meta.w4a4 = w4a4;
  std::vector<std::vector<StEntry>> planned;
  for (const Layer& l : det.layers) {
    Layer probe = l;
    if (auto u = unify.find(l.module); u != unify.end()) probe.global = Global::of_amax(u->second);
    planned.push_back(entries_of(emit(probe, opt.to)));
    meta.layers.push_back(&l);
  }
  for (const std::string& n : in.ck.names()) {
    if (det.consumed.count(n)) continue;
    const StTensor& t = in.ck.tensor(n);
    add_ignored_tensor(meta.ignore, n, t.shape, t.dtype);
  }

  std::vector<Item> items;
  for (std::size_t i = 0; i < det.layers.size(); ++i) {
    const Layer& l = det.layers[i];
    Item it = layer_item(in, l);
    it.entries = std::move(planned[i]);
    it.run = [&, lp = &l, bytes = it.in_bytes](SafetensorsWriter& w) {
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
  for (const std::string& n : in.ck.names())
    if (!det.consumed.count(n)) items.push_back(passthrough(in, n, report));

  write_output(in, out, opt.force, items, lay.shard_format, opt.to, meta, opt.progress, report);
  return report;
}

}  // namespace microscale::io
