// inspect_checkpoint: every tensor of a checkpoint with its role in a quantized layer, what it
// decodes to, and value statistics.
#include <algorithm>
#include <cmath>
#include <map>

#include "io/layout.hpp"
#include "io/staging.hpp"
#include "io/tensor_values.hpp"
#include "io/weight_rules.hpp"
#include "io/write_pipeline.hpp"

namespace microscale::io {

namespace {

using namespace ck;

TensorStats stats_of(std::span<const std::byte> data, StDType t, std::size_t n) {
  TensorStats s;
  if (!has_values(t) && t != StDType::u8) return s;
  s.valid = true;
  double sum = 0, sq = 0, lo = INFINITY, hi = -INFINITY;
  std::int64_t finite = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double v = element_value(data.data(), t, i);
    if (!std::isfinite(v)) {
      ++s.nonfinite;
      continue;
    }
    ++finite;
    s.zeros += v == 0;
    sum += v;
    sq += v * v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  if (finite) {
    s.min = lo;
    s.max = hi;
    s.mean = sum / static_cast<double>(finite);
    s.std = std::sqrt(std::max(0.0, sq / static_cast<double>(finite) - s.mean * s.mean));
    s.amax = std::max(std::fabs(lo), std::fabs(hi));
  }
  return s;
}

// The row of tensor `t`, which is `role` of layer `l`.
void describe_part(InspectRow& row, const StTensor& t, const Layer& l, Role role, bool stats) {
  const std::string mode = name(l.format.mode);
  switch (role) {
    case Role::packed:
      row.format = mode + " packed";
      row.detail = "logical " + shape_str(l.stored(l.cols()), ShapeStyle::list) + ", group " +
                   std::to_string(l.format.group_size) + ", " + std::to_string(l.format.bits) + " bits" +
                   (l.format.mode == Mode::nvfp4 ? ", " + l.global.describe() : "");
      if (stats) {
        const Tensor y = dequantize_layer(l, DType::float32);
        row.stats = stats_of({y.bytes(), y.nbytes()}, StDType::f32, static_cast<std::size_t>(y.numel()));
      }
      return;
    case Role::scales: {
      const StDType code = l.format.mode == Mode::affine  ? l.float_dtype
                           : l.format.mode == Mode::nvfp4 ? StDType::f8_e4m3
                                                          : StDType::f8_e8m0;
      row.format = mode + " scales" +
                   (l.format.mode == Mode::affine  ? ""
                    : l.format.mode == Mode::nvfp4 ? " E4M3"
                                                   : " E8M0");
      if (stats) row.stats = stats_of(t.data, code, static_cast<std::size_t>(t.numel()));
      if (stats && l.format.mode == Mode::nvfp4) {
        // Subnormal E4M3 scales (< 2^-6) keep fewer bits: typical of two-level (MLX) nvfp4.
        std::int64_t sub = 0;
        for (std::byte b : t.data)
          sub += (static_cast<unsigned>(b) & 0x78u) == 0 && (static_cast<unsigned>(b) & 7u) != 0;
        row.detail = std::to_string(sub) + " subnormal";
      }
      return;
    }
    case Role::biases:
      row.format = mode + " biases";
      if (stats) row.stats = stats_of(t.data, t.dtype, static_cast<std::size_t>(t.numel()));
      return;
    case Role::global_scale:
      row.format = mode + " global scale";
      row.detail = l.global.describe();
      return;
    case Role::activation_scale:
      row.format = "activation scale";
      row.detail = l.act->describe(std::string_view(t.name).substr(l.module.size() + 1));
      return;
  }
}

// The row of tensor `n` of a quantized source: a weight (stats of its decoded values), a scale,
// or an activation / KV-cache scale that dequantize and quantize drop.
void describe_source(InspectRow& row, const StTensor& t, const Checkpoint& ck, const Sources& s, bool stats) {
  const std::string kind = name(*s.kind);
  if (const SourceWeight* w = s.find(t.name)) {
    row.format = kind + (is_fp8(*s.kind) ? " weight" : " blocks");
    row.detail = w->describe();
    if (stats) {
      const Tensor y = decode_source(ck, *w, DType::float32);
      row.stats = stats_of({y.bytes(), y.nbytes()}, StDType::f32, static_cast<std::size_t>(y.numel()));
    }
  } else if (const SourceWeight* of = s.find(t.name, true)) {
    row.format = kind + " scales";
    row.detail = "of " + detail::quote(of->data);
    if (stats)
      row.stats =
          stats_of(t.data, t.dtype == StDType::u8 ? StDType::f8_e8m0 : t.dtype, static_cast<std::size_t>(t.numel()));
  } else {
    row.format = "dropped";
    row.detail = kind + " activation / KV-cache scale (not written by dequantize or quantize)";
  }
}

// ", config group \"group_1\"" after a quantized weight's description, when the config has groups.
std::string group_text(const Detected& det, const std::string& module) {
  const auto g = det.group_of.find(module);
  return g == det.group_of.end() ? "" : ", config group " + detail::quote(det.groups.groups[g->second].name);
}

// compressed-tensors' config groups, each with its format and how many layers of each format it
// holds, and the weights its `ignore` keeps in high precision.
void describe_groups(const Detected& det, const Checkpoint& ck, InspectResult& res) {
  if (det.groups.empty()) return;
  std::vector<std::map<std::string, std::size_t>> counts(det.groups.groups.size());  // format -> layers
  for (const Layer& l : det.layers)
    if (const auto g = det.group_of.find(l.module); g != det.group_of.end()) ++counts[g->second][name(l.format.mode)];
  for (const SourceWeight& w : det.sources.weights)
    if (const auto g = det.group_of.find(w.module); g != det.group_of.end()) ++counts[g->second]["fp8"];
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const CtGroup& g = det.groups.groups[i];
    std::string layers;
    for (const auto& [format, n] : counts[i]) layers += (layers.empty() ? "" : ", ") + std::to_string(n) + " " + format;
    std::string targets;
    for (const std::string& t : g.targets) targets += (targets.empty() ? "" : ", ") + detail::quote(t);
    res.notes.push_back("config group " + detail::quote(g.name) + " (" + (g.format.empty() ? "?" : g.format) +
                        "): " + (layers.empty() ? "no" : layers) + " layers; targets " + targets);
  }
  std::size_t kept = 0;
  for (const std::string& n : ck.names()) {
    const StTensor& t = ck.tensor(n);
    if (!det.consumed.count(n) && !det.sources.consumed.count(n) && n.ends_with(".weight") && t.shape.size() == 2 &&
        det.groups.ignored(n.substr(0, n.size() - std::string_view(".weight").size())))
      ++kept;
  }
  if (kept) res.notes.push_back(std::to_string(kept) + " weights kept in high precision by the config's ignore list");
}

}  // namespace

InspectResult inspect_checkpoint(const fs::path& path, bool stats, const ProgressFn& progress) {
  if (const LayoutOps::FileReader* r = file_reader_for(path)) return r->inspect(path);
  const Input in = open_complete(path);
  const Detected det = detect(in.ck, in.config);
  InspectResult res;
  res.convention = det.convention_name();
  if (in.config.is_object())
    for (const char* k : {"quantization_config", "quantization"})
      if (auto it = in.config.find(k); it != in.config.end()) {
        res.config = std::string(k) + " " + it->dump();
        // How the bytes were chosen (scale search, GPTQ, 2D scales) leads, where truncation cannot hide it.
        if (it->is_object() && it->contains("producer") && (*it)["producer"].is_object()) {
          const nlohmann::json& producer = (*it)["producer"];
          if (auto s = producer.find("scale_search"); s != producer.end() && s->is_string())
            res.config = "scale_search " + s->get<std::string>() + "; " + res.config;
          if (auto g = producer.find("gptq"); g != producer.end() && g->is_object())
            res.config = "gptq " + g->dump() + "; " + res.config;
          if (auto s = producer.find("scale_2d"); s != producer.end() && s->is_boolean() && s->get<bool>())
            res.config = "scale_2d (16x16 scale tiles); " + res.config;
        }
        break;
      }
  if (std::error_code ec; fs::exists(in.dir / "hf_quant_config.json", ec))
    res.config += (res.config.empty() ? "" : "; ") + std::string("hf_quant_config.json present");

  std::map<std::string, std::pair<const Layer*, Role>> part;  // tensor -> (layer, role)
  for (const Layer& l : det.layers)
    for (const Source& s : l.sources) part[s.tensor] = {&l, s.role};
  std::set<std::string> unsupported(det.unsupported.begin(), det.unsupported.end());
  Progress pr;
  pr.total = in.ck.names().size();
  for (const std::string& n : in.ck.names()) {
    const StTensor& t = in.ck.tensor(n);
    InspectRow row;
    row.name = n;
    row.dtype = t.dtype_name();
    row.shape = t.shape;
    if (auto it = part.find(n); it != part.end()) {
      describe_part(row, t, *it->second.first, it->second.second, stats);
      if (it->second.second == Role::packed) row.detail += group_text(det, it->second.first->module);
    } else if (det.sources.consumed.count(n)) {
      describe_source(row, t, in.ck, det.sources, stats);
      if (const SourceWeight* w = det.sources.find(n)) row.detail += group_text(det, w->module);
    } else if (unsupported.count(n)) {
      row.format = "unsupported quantized";
    } else if (std::find(det.strays.begin(), det.strays.end(), n) != det.strays.end()) {
      row.format = "stray";
      row.detail = "named like a part of layer " + detail::quote(module_of(n)) + ", unused by " + det.convention_name();
    } else {
      row.format = "plain";
      const Keep why = default_keep(n, t.shape, t.dtype);
      row.detail = why == Keep::quantize     ? "projection weight"
                   : why == Keep::not_weight ? ""
                                             : keep_text(why, t.shape, t.dtype);
      if (stats && has_values(t.dtype)) row.stats = stats_of(t.data, t.dtype, static_cast<std::size_t>(t.numel()));
    }
    release(t.data);
    trim_heap();
    res.rows.push_back(std::move(row));
    ++pr.done;
    pr.current = n;
    if (progress) progress(pr);
  }
  if (!det.layers.empty())
    res.notes.push_back(std::to_string(det.layers.size()) + " quantized layers (" + det.convention_name() + ")");
  describe_groups(det, in.ck, res);
  if (det.sources.kind)
    res.notes.push_back(std::to_string(det.sources.weights.size()) + " quantized source weights (" +
                        name(*det.sources.kind) + "): microscale dequantize decodes them" +
                        (is_fp8(*det.sources.kind) ? ", microscale quantize re-quantizes them" : ""));
  const auto groups = fused_global_scales(det.layers);
  const auto differing = std::count_if(groups.begin(), groups.end(), [](const FusedScales& g) { return g.differ(); });
  if (differing)
    res.notes.push_back(std::to_string(differing) +
                        " fused groups (q/k/v, gate/up, ...) have differing global scales; vLLM would merge them with "
                        "max() (see microscale convert --unify-fused-scales)");
  in.ck.check_unchanged();  // a shard truncated under us read as zeros
  return res;
}

}  // namespace microscale::io
