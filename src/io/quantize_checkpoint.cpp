// quantize_checkpoint: the projection weights of a float checkpoint into one layout's quantized
// tensors, everything else copied (docs/checkpoints.md, "What is quantized").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "io/budget.hpp"
#include "io/quantize_plan.hpp"
#include "io/source_gptoss.hpp"
#include "io/tensor_values.hpp"
#include "io/write_pipeline.hpp"
#include "ops/quantize.hpp"

namespace microscale::io {

namespace {

using namespace ck;

// A Hessian tensor's values as float64 (any alignment).
std::vector<double> hessian_values(const StTensor& t) {
  std::vector<double> h(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = element_value(t.data.data(), t.dtype, i);
  return h;
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
// The amax of each expert's rows of `x` [experts * N, K].
std::vector<float> expert_amaxes(const TensorView& x, std::int64_t experts) {
  const std::int64_t rows = x.shape[0] / experts, k = x.shape[1];
  const std::size_t elem = dtype_size(x.dtype);
  std::vector<float> out;
  for (std::int64_t e = 0; e < experts; ++e)
    out.push_back(global_scale(TensorView(
        static_cast<const std::byte*>(x.data) + static_cast<std::size_t>(e * rows * k) * elem, x.dtype, {rows, k})));
  return out;
}

// `x` [experts * N, K] quantized expert by expert, each with its global scale `amax[e]` (searched
// further under mse when `search_global`), into one Quantized of the whole stack; `globals` gets
// the amaxes used, in expert order.
Quantized quantize_per_expert(const TensorView& x, const QuantSpec& spec, const std::vector<float>& amax,
                              bool search_global, std::vector<Global>& globals) {
  const auto experts = static_cast<std::int64_t>(amax.size());
  const std::int64_t rows = x.shape[0] / experts, k = x.shape[1];
  const std::size_t elem = dtype_size(x.dtype);
  Quantized all;
  for (std::int64_t e = 0; e < experts; ++e) {
    const TensorView one(static_cast<const std::byte*>(x.data) + static_cast<std::size_t>(e * rows * k) * elem, x.dtype,
                         {rows, k});
    QuantSpec s = spec;
    s.global_scale = amax[static_cast<std::size_t>(e)];
    const Quantized q = ops::quantize(one, s, search_global);
    if (e == 0) {
      all.spec = q.spec;
      all.shape = x.shape;
      all.packed = Tensor(q.packed.dtype(), {x.shape[0], q.packed.shape()[1]});
      all.scales = Tensor(q.scales.dtype(), {x.shape[0], q.scales.shape()[1]});
    }
    std::memcpy(all.packed.bytes() + static_cast<std::size_t>(e) * q.packed.nbytes(), q.packed.bytes(),
                q.packed.nbytes());
    std::memcpy(all.scales.bytes() + static_cast<std::size_t>(e) * q.scales.nbytes(), q.scales.bytes(),
                q.scales.nbytes());
    globals.push_back(Global::of_amax(*q.spec.global_scale));
  }
  return all;
}

// A layer's weight as float32, for the error estimate.
std::vector<float> float32_values(const TensorView& x) {
  std::vector<float> out(static_cast<std::size_t>(x.numel()));
  const auto* p = static_cast<const std::byte*>(x.data);
  const StDType st = to_st_dtype(x.dtype);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(element_value(p, st, i));
  return out;
}

// The bits a layer takes in the output when written as `f` (kept: its float dtype's).
std::int64_t stored_bits(const PlannedLayer& l, const LayerSpec& f, Convention to) {
  if (f.keep()) return l.skel.rows() * l.skel.cols() * st_dtype_bits(l.skel.float_dtype);
  Layer skel = Layer::of(l.skel.module, f.spec, l.skel.shape);
  skel.experts = l.skel.experts;
  if (f.three_level || f.unit_global) skel.global = Global::of_amax(1.0f);
  std::int64_t bits = 0;
  for (const Out& o : emit(skel, to)) bits += static_cast<std::int64_t>(st_nbytes(o.entry.dtype, o.entry.shape)) * 8;
  return bits;
}

// --budget: tabulates each free layer's error under every candidate (one quantization per layer
// and candidate), then gives each the candidate of the exact choice. A fused group (q/k/v,
// gate/up) of a layout whose loaders fuse it is one choice, as its members need one format.
struct BudgetTable {
  std::vector<BudgetLayer> layers;
  BudgetChoice choice;
};
BudgetTable choose_formats(QuantizePlan& plan, const Input& in, const Detected& det, const QuantizeOptions& opt,
                           Report& report) {
  const std::vector<LayerSpec> cands = budget_candidates(opt, *plan.layout);
  // Units: index lists into plan.layers, each taking one format.
  std::vector<std::vector<std::size_t>> units;
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < plan.layers.size(); ++i) index[plan.layers[i].module] = i;
  std::vector<bool> grouped(plan.layers.size(), false);
  if (plan.layout->fused_loading) {
    std::vector<std::string> free;
    for (const PlannedLayer& l : plan.layers)
      if (!l.pinned) free.push_back(l.module);
    for (const auto& g : fused_groups(free)) {
      std::vector<std::size_t> u;
      for (const std::string& m : g) {
        u.push_back(index[m]);
        grouped[index[m]] = true;
      }
      units.push_back(std::move(u));
    }
  }
  for (std::size_t i = 0; i < plan.layers.size(); ++i)
    if (!grouped[i]) units.push_back({i});
  std::sort(units.begin(), units.end());  // the checkpoint's order, for the CSV

  std::vector<BudgetLayer> table;
  std::vector<std::vector<const LayerSpec*>> option_spec;  // per unit, per option
  for (const std::vector<std::size_t>& u : units) {
    BudgetLayer row{{}, 0, {}};
    std::vector<const LayerSpec*> specs;
    const PlannedLayer& first = plan.layers[u.front()];
    for (std::size_t i : u) row.tensor += (row.tensor.empty() ? "" : "+") + plan.layers[i].module;
    for (std::size_t i : u) row.numel += plan.layers[i].skel.rows() * plan.layers[i].skel.cols();
    if (first.pinned) {  // a recipe's format: one option, counted in the budget
      row.options.push_back({first.format.text, 0, 0.0});
      specs.push_back(&first.format);
    } else {
      for (const LayerSpec& c : cands) {
        bool fits = true;
        for (std::size_t i : u) fits = fits && (c.keep() || plan.layers[i].skel.cols() % c.row_block == 0);
        if (!fits) continue;
        row.options.push_back({c.text, 0, 0.0});
        specs.push_back(&c);
      }
    }
    table.push_back(std::move(row));
    option_spec.push_back(std::move(specs));
  }
  // The errors, a layer at a time: read once, quantized once per candidate.
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t quantizations = 0;
  for (std::size_t ui = 0; ui < units.size(); ++ui) {
    const std::vector<std::size_t>& u = units[ui];
    BudgetLayer& row = table[ui];
    std::vector<Tensor> storage(u.size());
    std::vector<TensorView> xs;
    float unit_amax = 0;
    const bool first_pinned = plan.layers[u.front()].pinned;
    for (std::size_t k = 0; k < u.size(); ++k) {
      const PlannedLayer& l = plan.layers[u[k]];
      xs.push_back(l.experts ? (storage[k] = gather_rows(in.ck, det.sources, *l.experts), storage[k].view())
                             : float_values(in.ck, det.sources, l.tensor, storage[k]));
      unit_amax = std::max(unit_amax, global_scale(xs.back()));
    }
    for (std::size_t o = 0; o < row.options.size(); ++o) {
      const LayerSpec& f = *option_spec[ui][o];
      double error = 0;
      std::int64_t bits = 0;
      for (std::size_t k = 0; k < u.size(); ++k) {
        const PlannedLayer& l = plan.layers[u[k]];
        bits += stored_bits(l, f, opt.to);
        if (f.keep() || first_pinned) continue;  // a pinned layer's error is not needed
        QuantSpec spec = f.spec;
        if (f.three_level) spec.global_scale = u.size() > 1 && opt.share_fused_scales ? unit_amax : global_scale(xs[k]);
        if (f.unit_global) spec.global_scale = k2688;
        Quantized q;
        try {
          q = ops::quantize(xs[k], spec, f.three_level && !(u.size() > 1 && opt.share_fused_scales));
        } catch (const Error& e) {
          throw Error("tensor " + detail::quote(l.tensor) + " (--budget, candidate " + f.text + "): " + e.what());
        }
        ++quantizations;
        Layer ql = Layer::of(l.skel.module, f.spec, l.skel.shape);
        ql.point_at(q);
        if (q.spec.global_scale) ql.global = Global::of_amax(*q.spec.global_scale);
        const Tensor dq = dequantize_layer(ql, DType::float32);
        const std::vector<float> w = float32_values(xs[k]);
        std::vector<double> h;
        if (const auto it = plan.hessian_of.find(l.module); it != plan.hessian_of.end())
          h = hessian_values(plan.hessians->tensor(it->second));
        else if (!plan.hessian_of.empty())
          throw Error("--budget with --hessians weighs every layer's error by its Hessian, and the file has none for " +
                      detail::quote(l.module) + " (or leave --hessians out for the weight error)");
        error += layer_output_error(w, {dq.data<float>(), w.size()}, l.skel.rows(), l.skel.cols(), h);
      }
      row.options[o].stored_bits = bits;
      row.options[o].error = error;
    }
    for (std::size_t k = 0; k < u.size(); ++k) release(in.ck.tensor(plan.layers[u[k]].tensor).data);
    if (opt.progress) opt.progress(Progress{ui + 1, units.size(), 0, 0, table[ui].tensor});
  }
  BudgetChoice choice = choose_under_budget(table, *opt.budget_bits);
  std::vector<const LayerSpec*> chosen(plan.layers.size(), nullptr);
  std::int64_t numel = 0;
  for (std::size_t ui = 0; ui < units.size(); ++ui) {
    const LayerSpec* f = option_spec[ui][choice.chosen[ui]];
    for (std::size_t i : units[ui]) chosen[i] = f->keep() ? nullptr : f;
    numel += table[ui].numel;
    report.budget.push_back(
        {table[ui].tensor, f->text,
         static_cast<double>(table[ui].options[choice.chosen[ui]].stored_bits) / static_cast<double>(table[ui].numel),
         table[ui].options[choice.chosen[ui]].error});
  }
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "--budget %.4g bits per weight: %.4f chosen over %zu layers, estimated error %.6g (%s); %zu "
                "quantizations in %.1f s",
                *opt.budget_bits, static_cast<double>(choice.stored_bits) / static_cast<double>(numel), units.size(),
                choice.error, plan.hessian_of.empty() ? "sum of squared weight errors" : "trace(dW H dW^T)",
                quantizations, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  plan.notes.push_back(buf);
  apply_choice(plan, in, opt, chosen);
  return {std::move(table), std::move(choice)};
}

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
      opt.budget_bits ? std::optional(choose_formats(plan, in, det, opt, report)) : std::nullopt;
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
        const TensorView x = sp->experts ? (storage = gather_rows(in.ck, det.sources, *sp->experts), storage.view())
                                         : float_values(in.ck, det.sources, sp->tensor, storage);
        const std::int64_t nonfinite = count_nonfinite({static_cast<const std::byte*>(x.data),
                                                        static_cast<std::size_t>(x.numel()) * dtype_size(x.dtype)},
                                                       to_st_dtype(x.dtype))
                                           .total();
        if (nonfinite && sp->format.spec.nonfinite == NonFinite::error)
          throw Error("tensor " + detail::quote(sp->tensor) + " has " + std::to_string(nonfinite) +
                      " non-finite values (NaN/Inf) of " + std::to_string(src.numel()) +
                      "; repair the checkpoint, or pass --nonfinite propagate (NaN/Inf stay "
                      "in the blocks they hit) or saturate");
        const auto group = group_of.find(sp->module);
        // Stacked experts where each keeps its own global scale (GGUF's per-expert .scale): each
        // expert is quantized with its own amax (its fused group's, expert by expert), as the
        // per-expert layouts quantize it.
        const bool three = sp->format.three_level;
        const bool per_expert = three && sp->experts && sp->experts->experts > 1 && !plan.gptq.count(sp->module);
        const std::optional<float> fused =
            group != group_of.end() && !per_expert ? std::optional(shared_amax(group->second)) : std::nullopt;
        QuantSpec spec = sp->format.spec;
        if (three) spec.global_scale = fused ? *fused : global_scale(x);
        if (sp->format.unit_global) spec.global_scale = k2688;
        Quantized q;
        std::vector<Global> expert_globals;
        try {
          if (per_expert) {
            const bool shared = group != group_of.end();
            q = quantize_per_expert(x, spec,
                                    shared ? shared_expert_amax(group->second) : expert_amaxes(x, sp->experts->experts),
                                    !shared, expert_globals);
          } else if (const auto h = plan.gptq.find(sp->module); h != plan.gptq.end()) {
            const StTensor& ht = plan.hessians->tensor(h->second);
            const std::vector<double> hv = hessian_values(ht);
            plan.hessians->check_unchanged();
            q = gptq(x, HessianView{hv.data(), ht.shape}, spec, opt.gptq);
          } else {
            // A fused group keeps its one global scale: mse searches only the block scales there.
            q = ops::quantize(x, spec, three && !fused.has_value());
          }
        } catch (const Error& e) {
          throw Error("tensor " + detail::quote(sp->tensor) + ": " + e.what());
        }
        Layer l = sp->skel;
        l.point_at(q);
        l.global = q.spec.global_scale ? Global::of_amax(*q.spec.global_scale) : Global{};
        l.expert_globals = std::move(expert_globals);
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
