// quantize_checkpoint: the projection weights of a float checkpoint into one layout's quantized
// tensors, everything else copied (docs/checkpoints.md, "What is quantized").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "io/budget_table.hpp"
#include "io/quantize_plan.hpp"
#include "io/source_gptoss.hpp"
#include "io/tensor_values.hpp"
#include "io/write_pipeline.hpp"
#include "ops/quantize.hpp"

namespace microscale::io {

namespace {

using namespace ck;

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
  j["scale_search"] = name(base.scale_search);
  j["scale_2d"] = base.scale_2d;
  j["export"] = name(opt.to);
  j["exclude"] = opt.exclude;
  j["include"] = opt.include;
  j["share_fused_scales"] = opt.share_fused_scales;
  j["w4a4"] = w4a4;
  Json amax = detail::object_with_room(opt.activation_amax.size());
  for (const auto& [m, a] : opt.activation_amax) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%a", static_cast<double>(a));  // exact
    detail::append_new_key(amax, m, buf);
  }
  j["activation_amax"] = std::move(amax);
  Json recipe = Json::array();
  for (const RecipeRule& r : opt.recipe) recipe.push_back({r.pattern, r.format.text});
  j["recipe"] = std::move(recipe);
  if (opt.budget_bits) {
    j["budget"] = *opt.budget_bits;
    Json cands = Json::array();
    for (const LayerFormat& c : opt.candidates) cands.push_back(c.text);
    j["candidates"] = std::move(cands);
  }
  if (!opt.hessians.empty()) {  // the file by name, as the parts of a split run each read it
    j["hessians"] = opt.hessians.string();
    j["gptq_damp"] = opt.gptq.damp;
    j["gptq_block_size"] = opt.gptq.block_size;
  }
  return j.dump();
}

// quantize_checkpoint, and with `copy_codes` convert_gptoss_mxfp4: gpt-oss MXFP4 experts then
// take the path a dequantized gpt-oss's float stacks take, their codes and scales copied.
Report quantize_impl(const fs::path& in_path, const fs::path& out, const QuantizeOptions& opt, bool copy_codes) {
  if (opt.part.count < 1 || opt.part.index < 0 || opt.part.index >= opt.part.count)
    throw Error("part " + std::to_string(opt.part.index) + " of " + std::to_string(opt.part.count) +
                ": the number of parts must be at least 1 and the part 0 to one less");
  Input in = open_complete(in_path);
  if (!opt.hessians.empty()) in.inputs.add("--hessians", opt.hessians);
  const Detected det = detect(in.ck, in.config);
  QuantizePlan plan = plan_quantize(in_path, in, det, opt, copy_codes);
  Report report;
  const std::optional<BudgetTable> budget =
      opt.budget_bits ? std::optional(choose_formats(plan, in, det, opt, out, report)) : std::nullopt;
  report.notes.insert(report.notes.begin(), plan.notes.begin(), plan.notes.end());

  // Fused groups share the largest amax of their members (vLLM keeps one scale per fused GEMM),
  // computed when a group's first member is written: a split run's part reads only its own groups.
  std::map<std::string, std::size_t> group_of;  // module -> its group
  std::map<std::size_t, float> group_amax;
  for (std::size_t g = 0; g < plan.fused.size(); ++g)
    for (const std::string& m : plan.fused[g]) group_of[m] = g;
  auto shared_amax = [&](std::size_t g) {
    if (const auto it = group_amax.find(g); it != group_amax.end()) return it->second;
    float mx = 0;
    for (const std::string& m : plan.fused[g]) {
      const std::string& tensor = plan.find_layer(m)->tensor;
      const StTensor& t = in.ck.tensor(tensor);
      Tensor storage;
      mx = std::max(mx, global_scale(float_values(in.ck, det.sources, tensor, storage)));
      release(t.data);
    }
    return group_amax[g] = mx;
  };
  // Stacked experts of a fused group (gate/up): expert e of every member shares the largest amax
  // of the members' expert e, as the per-expert layouts share it between gate_e and up_e.
  std::map<std::size_t, std::vector<float>> group_expert_amax;
  auto shared_expert_amax = [&](std::size_t g) -> const std::vector<float>& {
    if (const auto it = group_expert_amax.find(g); it != group_expert_amax.end()) return it->second;
    std::vector<float> mx;
    for (const std::string& m : plan.fused[g]) {
      const ExpertRows& rows = *plan.find_layer(m)->experts;
      const Tensor x = gather_rows(in.ck, det.sources, rows);
      const std::vector<float> a = expert_amaxes(x.view(), rows.experts);
      mx.resize(a.size(), 0.0f);
      for (std::size_t e = 0; e < a.size(); ++e) mx[e] = std::max(mx[e], a[e]);
    }
    return group_expert_amax[g] = std::move(mx);
  };

  std::size_t from_table = 0;  // layers written from --budget's spilled quantizations
  std::vector<Item> items;
  std::map<std::string, std::vector<const PlannedLayer*>> by_name;  // primary tensor -> its layers (gate_up: two)
  std::set<std::string> stacked_parts;                              // other experts' tensors of a stacked layer
  for (const PlannedLayer& l : plan.layers) {
    by_name[l.tensor].push_back(&l);
    if (l.experts)
      for (const std::string& t : l.experts->tensors)
        if (t != l.tensor) stacked_parts.insert(t);
  }
  for (const std::string& n : in.ck.names()) {
    if (stacked_parts.count(n)) continue;
    if (plan.gptoss_split && !gptoss_bias_parts(n).empty()) {
      for (Item& it : gptoss_bias_items(in, n, report, !plan.stack_experts)) items.push_back(std::move(it));
      continue;
    }
    auto sel = by_name.find(n);
    if (sel == by_name.end()) {
      if (det.sources.consumed.count(n) && !det.sources.find(n)) continue;  // FP8 scales: dropped
      const auto k = plan.kept.find(n);
      if (const SourceWeight* w = det.sources.find(n))  // an FP8 weight left unquantized: its float32 values
        items.push_back(source_item(in, *w, DType::float32, report, TensorAction::kept, k->second));
      else
        items.push_back(k == plan.kept.end() ? passthrough(in, n, report) : passthrough(in, n, report, k->second));
      continue;
    }
    for (const PlannedLayer* lp : sel->second) {
      const PlannedLayer& s = *lp;
      Item it = tensor_item(in, n, s.module);
      it.entries = entries_of(emit(s.skel, opt.to));
      it.layer = s.skel.module;
      if (s.experts)
        for (const std::string& t : s.experts->tensors)
          if (t != n) {
            it.inputs.push_back(in.ck.tensor(t).data);
            it.in_bytes += in.ck.tensor(t).data.size();
          }
      if (const SourceWeight* codes = plan.copy_codes ? det.sources.find(n) : nullptr) {
        const ExpertRows& rows = *s.experts;
        it.inputs = {expert_bytes(in.ck.tensor(codes->data), rows.first_expert, rows.experts),
                     expert_bytes(in.ck.tensor(codes->scale), rows.first_expert, rows.experts)};
        it.in_bytes = it.inputs[0].size() + it.inputs[1].size();
        it.run = [&, sp = &s, codes, bytes_in = it.in_bytes, read = it.inputs](TensorSink& w) {
          const CodeBytes bytes = gptoss_codes(in.ck, *codes, *sp->experts);
          Layer l = sp->skel;
          l.packed = bytes.packed;
          l.scales = bytes.scales;
          TensorReport r;
          r.name = sp->module;
          r.action = TensorAction::converted;
          r.format = name(l.format.mode);
          r.shape = l.stored(l.cols());
          r.bytes_in = bytes_in;
          write_emitted(w, emit(l, opt.to), r);
          for (const auto& range : read) release(range);
          report.tensors.push_back(std::move(r));
        };
        items.push_back(std::move(it));
        continue;
      }
      it.run = [&, sp = &s, bytes_in = it.in_bytes](TensorSink& w) {
        const StTensor& src = in.ck.tensor(sp->tensor);
        Tensor storage;
        TensorView x;
        auto read_x = [&] {
          x = sp->experts ? (storage = gather_rows(in.ck, det.sources, *sp->experts), storage.view())
                          : float_values(in.ck, det.sources, sp->tensor, storage);
        };
        // --budget measured this layer with the very quantization written here.
        const QuantSpill::Entry* cached = nullptr;
        if (budget)
          if (const auto c = budget->chosen.find(sp->module); c != budget->chosen.end()) cached = &c->second;
        LayerQuant lq;
        std::int64_t nonfinite = 0;
        if (cached) {
          ++from_table;
          lq = budget->spill->get(*cached);
          nonfinite = cached->nonfinite;
          if (opt.measure_error) read_x();
        } else {
          read_x();
          nonfinite = checked_nonfinite(*sp, sp->format, x);
          // A fused group's members share its largest amax (per expert for stacked experts).
          const auto group = group_of.find(sp->module);
          const bool per_expert = quantizes_per_expert(plan, *sp, sp->format);
          const bool in_group = group != group_of.end();
          lq = quantize_planned(plan, *sp, sp->format, x,
                                in_group && !per_expert ? std::optional(shared_amax(group->second)) : std::nullopt,
                                in_group && per_expert ? &shared_expert_amax(group->second) : nullptr, opt.gptq);
        }
        const Quantized& q = lq.q;
        Layer l = sp->skel;
        l.point_at(q);
        l.global = q.spec.global_scale ? Global::of_amax(*q.spec.global_scale) : Global{};
        l.expert_globals = std::move(lq.expert_globals);
        TensorReport r;
        r.name = sp->module;
        r.action = TensorAction::quantized;
        r.format = name(q.spec.mode);
        r.shape = sp->experts ? l.stored(l.cols()) : src.shape;
        r.bytes_in = bytes_in;
        r.nonfinite = nonfinite;
        write_emitted(w, emit(l, opt.to), r);
        if (opt.measure_error) {
          double sqnr = 0;
          r.rel_error = rel_error(x, dequantize_layer(l, DType::float32).reshaped(x.shape), &sqnr);
          r.sqnr_db = sqnr;
        }
        release(src.data);
        report.tensors.push_back(std::move(r));
      };
      items.push_back(std::move(it));
    }
  }

  note_dropped(det.sources, report);
  WriteOptions w;
  w.force = opt.force;
  w.progress = opt.progress;
  w.part = opt.part;
  w.options = options_text(plan.base.spec, opt, plan.w4a4);
  w.split_bytes = opt.split_bytes;
  write_output(in, out, items, opt.to, plan.meta(), w, report);
  if (budget)
    report.notes.push_back("--budget: " + std::to_string(from_table) +
                           " layers written from the error table's quantizations, not quantized again");
  // After the output, so that a failed run leaves no table of a choice that was not written.
  if (budget && !opt.budget_csv.empty()) write_budget_csv(opt.budget_csv, budget->layers, budget->choice);
  return report;
}
}  // namespace

Report quantize_checkpoint(const fs::path& in_path, const fs::path& out, const QuantizeOptions& opt) {
  return quantize_impl(in_path, out, opt, false);
}

std::map<std::string, float> read_activation_amax(const fs::path& path) {
  const std::string what = "--activation-amax file";
  const std::string source = path.string();
  // {module: amax} nests one level; a few more let a misplaced object be named by the type check.
  const Json j =
      detail::parse_json(detail::read_text_file(path, "the " + what + ", a JSON object {module: amax}", 256u << 20),
                         source, what.c_str(), 4);
  if (!j.is_object())
    detail::fail(source, what + " must be a JSON object {module: amax}, not " + std::string(j.type_name()));
  std::map<std::string, float> amax;
  for (const auto& [module, v] : j.items()) {
    const std::string of = what + ": amax of " + detail::quote(module);
    if (!v.is_number()) detail::fail(source, of + " is not a number (" + v.type_name() + ")");
    const auto a = v.get<double>();
    try {
      check_activation_amax(a, of);
    } catch (const Error& e) {
      detail::fail(source, e.what());
    }
    amax.emplace(module, static_cast<float>(a));
  }
  return amax;
}

namespace ck {

Report convert_gptoss_mxfp4(const fs::path& in_path, const fs::path& out, const ConvertOptions& opt) {
  QuantizeOptions q;
  q.spec.mode = Mode::mxfp4;
  q.to = opt.to;
  q.force = opt.force;
  q.split_bytes = opt.split_bytes;
  q.progress = opt.progress;
  Report report = quantize_impl(in_path, out, q, true);
  report.notes.push_back(std::string("gpt-oss MXFP4 experts: E2M1 codes and E8M0 scales copied from the source") +
                         (layout(opt.to).stacked_experts ? "" : " into one Linear per expert (llm-compressor's form)") +
                         "; the float weights quantized to mxfp4 as quantize --format mxfp4 --export " +
                         layout(opt.to).name + " does");
  return report;
}

}  // namespace ck

}  // namespace microscale::io
