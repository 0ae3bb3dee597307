// quantize --budget's table and choice (budget_table.hpp).
#include "io/budget_table.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "io/tensor_values.hpp"

namespace microscale::io::ck {

// ---- the spill file

QuantSpill::QuantSpill(const std::filesystem::path& dir) : where_(dir.empty() ? "." : dir.string()) {
  // Unnamed where the file system allows it; else named only for the instant before unlink.
  fd_ = ::open(where_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd_ < 0) {
    std::string name = where_ + "/.microscale-budget-XXXXXX";
    fd_ = ::mkstemp(name.data());
    if (fd_ >= 0) ::unlink(name.c_str());
  }
  if (fd_ < 0)
    throw Error("--budget: cannot create a temporary file in " + where_ +
                " for the quantized candidates: " + std::strerror(errno));
}

QuantSpill::~QuantSpill() {
  if (fd_ >= 0) ::close(fd_);
}

QuantSpill::Entry QuantSpill::put(const LayerQuant& lq, std::int64_t nonfinite) {
  Entry e;
  e.spec = lq.q.spec;
  e.shape = lq.q.shape;
  e.nonfinite = nonfinite;
  for (const Global& g : lq.expert_globals) e.expert_amaxes.push_back(g.to_amax());
  for (const Tensor* t : {&lq.q.packed, &lq.q.scales, &lq.q.biases}) {
    e.parts.push_back({t->dtype(), t->shape(), end_});
    const std::byte* p = t->bytes();
    for (std::size_t done = 0, n = t->nbytes(); done < n;) {
      const ssize_t w = ::pwrite(fd_, p + done, n - done, static_cast<off_t>(end_ + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        throw Error("--budget: cannot write the quantized candidates to a temporary file in " + where_ + ": " +
                    (w < 0 ? std::strerror(errno) : "no space written"));
      done += static_cast<std::size_t>(w);
    }
    end_ += t->nbytes();
  }
  return e;
}

LayerQuant QuantSpill::get(const Entry& e) const {
  LayerQuant lq;
  lq.q.spec = e.spec;
  lq.q.shape = e.shape;
  Tensor* dst[] = {&lq.q.packed, &lq.q.scales, &lq.q.biases};
  for (std::size_t i = 0; i < e.parts.size(); ++i) {
    const Entry::Part& part = e.parts[i];
    if (numel(part.shape) == 0) continue;  // an affine-only part of another mode
    Tensor t(part.dtype, part.shape);
    for (std::size_t done = 0, n = t.nbytes(); done < n;) {
      const ssize_t r = ::pread(fd_, t.bytes() + done, n - done, static_cast<off_t>(part.offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        throw Error("--budget: cannot read the quantized candidates back from the temporary file in " + where_ + ": " +
                    (r < 0 ? std::strerror(errno) : "short file"));
      done += static_cast<std::size_t>(r);
    }
    *dst[i] = std::move(t);
  }
  for (float a : e.expert_amaxes) lq.expert_globals.push_back(Global::of_amax(a));
  return lq;
}

namespace {

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

// The choices: index lists into plan.layers, each taking one format. Where fused groups (q/k/v,
// gate/up) share a global scale, or load as one GEMM, a group is one choice, so that its members
// are measured with the scale they are written with.
std::vector<std::vector<std::size_t>> choice_units(const QuantizePlan& plan, const QuantizeOptions& opt) {
  std::map<std::string, std::size_t> index;
  std::vector<std::string> modules;
  for (std::size_t i = 0; i < plan.layers.size(); ++i) {
    index[plan.layers[i].module] = i;
    modules.push_back(plan.layers[i].module);
  }
  std::vector<std::vector<std::size_t>> units;
  std::vector<bool> grouped(plan.layers.size(), false);
  if (plan.layout->fused_loading || (opt.share_fused_scales && plan.layout->global_scale))
    for (const auto& g : fused_groups(modules)) {
      std::vector<std::size_t> u;
      for (const std::string& m : g) {
        u.push_back(index[m]);
        grouped[index[m]] = true;
      }
      const PlannedLayer& first = plan.layers[u.front()];
      for (std::size_t i : u)
        if (plan.layers[i].pinned != first.pinned)
          throw Error("a recipe rule gives " + detail::quote((first.pinned ? first : plan.layers[i]).module) +
                      " its format and leaves " + detail::quote((first.pinned ? plan.layers[i] : first).module) +
                      " to --budget, but they are one fused group (q/k/v, gate/up) that takes one format: give "
                      "the rule to every member or to none");
      units.push_back(std::move(u));
    }
  for (std::size_t i = 0; i < plan.layers.size(); ++i)
    if (!grouped[i]) units.push_back({i});
  std::sort(units.begin(), units.end());  // the checkpoint's order, for the CSV
  return units;
}

}  // namespace

BudgetTable choose_formats(QuantizePlan& plan, const Input& in, const Detected& det, const QuantizeOptions& opt,
                           const std::filesystem::path& out, Report& report) {
  const std::vector<LayerSpec> cands = budget_candidates(opt, *plan.layout);
  const std::vector<std::vector<std::size_t>> units = choice_units(plan, opt);
  BudgetTable result;
  std::vector<BudgetLayer>& table = result.layers;
  std::vector<std::vector<const LayerSpec*>> option_spec;  // per unit, per option
  for (const std::vector<std::size_t>& u : units) {
    BudgetLayer row{{}, 0, {}};
    std::vector<const LayerSpec*> specs;
    const PlannedLayer& first = plan.layers[u.front()];
    for (std::size_t i : u) row.tensor += (row.tensor.empty() ? "" : "+") + plan.layers[i].module;
    for (std::size_t i : u) row.numel += plan.layers[i].skel.rows() * plan.layers[i].skel.cols();
    if (first.pinned) {  // a recipe's format: one option, counted in the budget, its error not estimated
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

  // The errors, a unit at a time: each layer read once and quantized once per candidate, as the
  // write quantizes it (the group's shared amax included); the quantizations are spilled.
  result.spill = std::make_unique<QuantSpill>(out.parent_path());
  std::map<std::pair<std::size_t, std::size_t>, QuantSpill::Entry> spilled;  // (layer, option) ->
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t quantizations = 0;
  for (std::size_t ui = 0; ui < units.size(); ++ui) {
    const std::vector<std::size_t>& u = units[ui];
    BudgetLayer& row = table[ui];
    if (plan.layers[u.front()].pinned) {  // written as any quantize writes it; only its bits count
      for (std::size_t i : u) row.options[0].stored_bits += stored_bits(plan.layers[i], plan.layers[i].format, opt.to);
      continue;
    }
    std::vector<Tensor> storage(u.size());
    std::vector<TensorView> xs;
    std::vector<std::int64_t> nonfinite;
    float group_amax = 0;
    std::vector<float> group_experts;
    for (std::size_t k = 0; k < u.size(); ++k) {
      const PlannedLayer& l = plan.layers[u[k]];
      xs.push_back(l.experts ? (storage[k] = gather_rows(in.ck, det.sources, *l.experts), storage[k].view())
                             : float_values(in.ck, det.sources, l.tensor, storage[k]));
      nonfinite.push_back(checked_nonfinite(l, plan.base, xs.back()));
      group_amax = std::max(group_amax, global_scale(xs.back()));
      if (l.experts && l.experts->experts > 1) {
        const std::vector<float> a = expert_amaxes(xs.back(), l.experts->experts);
        group_experts.resize(a.size(), 0.0f);
        for (std::size_t e = 0; e < a.size(); ++e) group_experts[e] = std::max(group_experts[e], a[e]);
      }
    }
    const bool shared = u.size() > 1 && opt.share_fused_scales;
    for (std::size_t o = 0; o < row.options.size(); ++o) {
      const LayerSpec& f = *option_spec[ui][o];
      double error = 0;
      std::int64_t bits = 0;
      for (std::size_t k = 0; k < u.size(); ++k) {
        const PlannedLayer& l = plan.layers[u[k]];
        bits += stored_bits(l, f, opt.to);
        if (f.keep()) continue;
        const bool per_expert = quantizes_per_expert(plan, l, f);
        const LayerQuant lq = quantize_planned(
            plan, l, f, xs[k], shared && f.three_level && !per_expert ? std::optional(group_amax) : std::nullopt,
            shared && per_expert ? &group_experts : nullptr, opt.gptq);
        ++quantizations;
        Layer ql = Layer::of(l.skel.module, f.spec, l.skel.shape);
        ql.experts = l.skel.experts;
        ql.point_at(lq.q);
        if (lq.q.spec.global_scale) ql.global = Global::of_amax(*lq.q.spec.global_scale);
        ql.expert_globals = lq.expert_globals;
        const Tensor dq = dequantize_layer(ql, DType::float32);
        const std::vector<float> w = float32_values(xs[k]);
        std::vector<double> h;
        if (const auto it = plan.hessian_of.find(l.module); it != plan.hessian_of.end())
          h = hessian_values(plan.hessians->tensor(it->second));
        else if (!plan.hessian_of.empty())
          throw Error("--budget with --hessians weighs every layer's error by its Hessian, and the file has none for " +
                      detail::quote(l.module) + " (or leave --hessians out for the weight error)");
        error += layer_output_error(w, {dq.data<float>(), w.size()}, l.skel.rows(), l.skel.cols(), h);
        spilled[{u[k], o}] = result.spill->put(lq, nonfinite[k]);
      }
      row.options[o].stored_bits = bits;
      row.options[o].error = error;
    }
    for (std::size_t k = 0; k < u.size(); ++k) release(in.ck.tensor(plan.layers[u[k]].tensor).data);
    if (opt.progress) opt.progress(Progress{ui + 1, units.size(), 0, 0, table[ui].tensor});
  }

  result.choice = choose_under_budget(table, *opt.budget_bits);
  std::vector<const LayerSpec*> chosen(plan.layers.size(), nullptr);
  std::int64_t numel = 0;
  for (std::size_t ui = 0; ui < units.size(); ++ui) {
    const std::size_t o = result.choice.chosen[ui];
    const LayerSpec* f = option_spec[ui][o];
    for (std::size_t i : units[ui]) {
      chosen[i] = f->keep() ? nullptr : f;
      if (const auto it = spilled.find({i, o}); it != spilled.end()) result.chosen[plan.layers[i].module] = it->second;
    }
    numel += table[ui].numel;
    report.budget.push_back(
        {table[ui].tensor, f->text,
         static_cast<double>(table[ui].options[o].stored_bits) / static_cast<double>(table[ui].numel),
         table[ui].options[o].error});
  }
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "--budget %.4g bits per weight: %.4f chosen over %zu layers, estimated error %.6g (%s); %zu "
                "quantizations in %.1f s",
                *opt.budget_bits, static_cast<double>(result.choice.stored_bits) / static_cast<double>(numel),
                units.size(), result.choice.error,
                plan.hessian_of.empty() ? "sum of squared weight errors" : "trace(dW H dW^T)", quantizations,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  plan.notes.push_back(buf);
  apply_choice(plan, opt, chosen);
  return result;
}

}  // namespace microscale::io::ck
