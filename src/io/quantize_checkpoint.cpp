// quantize_checkpoint: the projection weights of a float checkpoint into one layout's quantized
// tensors, everything else copied (docs/checkpoints.md, "What is quantized").
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "io/experts.hpp"
#include "io/tensor_values.hpp"
#include "io/weight_rules.hpp"
#include "io/write_pipeline.hpp"
#include "ops/quantize.hpp"

namespace microscale::io {

namespace {

using namespace ck;

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
  if (!opt.hessians.empty()) {  // the file by name, as the parts of a split run each read it
    j["hessians"] = opt.hessians.string();
    j["gptq_damp"] = opt.gptq.damp;
    j["gptq_block_size"] = opt.gptq.block_size;
  }
  return j.dump();
}

// A layer to quantize, planned as a skeleton (shapes, no data) to validate the layout up front.
struct Sel {
  std::string name, module;  // the primary input tensor, the layer written
  Layer skel;
  std::optional<ExpertRows> experts;  // a stacked-experts layer: where its rows come from
};

// mlx-lm's SwitchGLU holds a projection's experts as one [experts, N, K] layer, and its sanitize
// stacks only float weights (Qwen3-MoE's only `.weight`), so quantized ones are stacked here:
// "<p>.experts.<i>.<proj>.weight" of experts 0 to E-1 become "<p>.switch_mlp.<proj>".
void stack_per_expert(std::vector<Sel>& chosen, const std::map<std::string, std::string>& kept) {
  std::vector<std::string> names;
  for (const Sel& s : chosen) names.push_back(s.name);
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
  std::vector<Sel> stacked;
  for (const ExpertGroup& g : groups) {
    const Sel& first = chosen[g.members.front()];
    ExpertRows r;
    r.module = g.module;
    r.experts = static_cast<std::int64_t>(g.members.size());
    r.rows = first.skel.rows();
    r.cols = first.skel.cols();
    for (std::size_t i : g.members) {
      const Sel& s = chosen[i];
      if (s.skel.shape != first.skel.shape || s.skel.float_dtype != first.skel.float_dtype)
        throw Error("expert weight " + detail::quote(s.name) + " is " + st_dtype_name(s.skel.float_dtype) + " " +
                    shape_str(s.skel.shape, ShapeStyle::list) + " but " + detail::quote(first.name) + " is " +
                    st_dtype_name(first.skel.float_dtype) + " " + shape_str(first.skel.shape, ShapeStyle::list) +
                    ": mlx-lm stacks a projection's experts into one tensor");
      r.tensors.push_back(s.name);
      drop[i] = true;
    }
    Layer l = first.skel;
    l.module = r.module;
    l.shape = {mul(r.module, r.experts, r.rows, "experts x rows"), r.cols};
    l.experts = r.experts;
    stacked.push_back({first.name, r.module, std::move(l), std::move(r)});
  }
  std::vector<Sel> out;
  for (std::size_t i = 0; i < chosen.size(); ++i)
    if (!drop[i]) out.push_back(std::move(chosen[i]));
  for (Sel& s : stacked) out.push_back(std::move(s));
  chosen = std::move(out);
}

// gpt-oss's expert biases as the split experts' modules name them (mlx-lm then skips its own
// sanitize, which would otherwise split them): gate_up_proj_bias [E, 2N] becomes gate_proj.bias and
// up_proj.bias (even and odd columns), down_proj_bias down_proj.bias; [E, N] each in mlx-lm's
// stacked form, or `per_expert` [N] for each expert as llm-compressor's linearized model holds them.
std::vector<Item> gptoss_bias_items(const Input& in, const std::string& name, Report& report, bool per_expert) {
  std::vector<Item> items;
  const StTensor& t = in.ck.tensor(name);
  if (t.shape.size() != 2)
    throw Error("gpt-oss expert bias " + detail::quote(name) + " is " + shape_str(t.shape, ShapeStyle::list) +
                ", expected [experts, columns]");
  const std::int64_t experts = t.shape[0];
  auto add = [&](const BiasPart& part, const std::string& out_name, std::int64_t first, std::int64_t count) {
    const std::int64_t cols = (t.shape[1] - part.col_start + part.col_step - 1) / part.col_step;
    const Shape shape = per_expert ? Shape{cols} : Shape{count, cols};
    Item it = tensor_item(in, name, out_name);
    it.entries = {{out_name, t.dtype, shape}};
    it.run = [&in, &report, name, part, out_name, first, count, cols, shape](TensorSink& w) {
      const StTensor& src = in.ck.tensor(name);
      const std::size_t size = st_nbytes(src.dtype, {1});
      std::vector<std::byte> out(static_cast<std::size_t>(count * cols) * size);
      for (std::int64_t e = 0; e < count; ++e)
        for (std::int64_t c = 0; c < cols; ++c)
          std::memcpy(
              out.data() + static_cast<std::size_t>(e * cols + c) * size,
              src.data.data() +
                  static_cast<std::size_t>((first + e) * src.shape[1] + part.col_start + c * part.col_step) * size,
              size);
      w.write(out_name, out);
      TensorReport r;
      r.name = out_name;
      r.action = TensorAction::copied;
      r.format = src.dtype_name();
      r.shape = shape;
      r.bytes_in = static_cast<std::size_t>(count * src.shape[1]) * size;
      r.bytes_out = out.size();
      report.tensors.push_back(std::move(r));
    };
    items.push_back(std::move(it));
  };
  if (per_expert)
    for (std::int64_t e = 0; e < experts; ++e)
      for (const BiasPart& part : gptoss_bias_parts(name)) add(part, gptoss_expert_name(part.name, e), e, 1);
  else
    for (const BiasPart& part : gptoss_bias_parts(name)) add(part, part.name, 0, experts);
  return items;
}

// A split gpt-oss expert layer (gate, up or down) made of its MXFP4 source's bytes: expert e's
// row r is row col_start + r * col_step of expert first_expert + e in `<m>_blocks` [E, C, K/32, 16]
// and `<m>_scales` [E, C, K/32]. Those bytes are what an mxfp4 layer holds (two E2M1 codes a byte,
// the even element in the low nibble; one E8M0 exponent per 32 inputs), so convert copies them
// instead of decoding and quantizing again, which could pick another scale for a block whose
// largest code is below 4.
struct CodeBytes {
  std::vector<std::byte> packed, scales;
};
CodeBytes gptoss_codes(const Checkpoint& ck, const SourceWeight& w, const ExpertRows& rows) {
  const StTensor& b = ck.tensor(w.data);
  const StTensor& s = ck.tensor(w.scale);
  const std::int64_t src_rows = b.shape[1], groups = b.shape[2];
  const auto row_bytes = static_cast<std::size_t>(groups) * 16, row_scales = static_cast<std::size_t>(groups);
  const auto n = static_cast<std::size_t>(rows.experts * rows.rows);
  CodeBytes out;
  out.packed.resize(n * row_bytes);
  out.scales.resize(n * row_scales);
  for (std::int64_t e = 0; e < rows.experts; ++e)
    for (std::int64_t r = 0; r < rows.rows; ++r) {
      const std::int64_t src_expert = rows.first_expert + e, src_row = rows.col_start + r * rows.col_step;
      const auto from = static_cast<std::size_t>(src_expert * src_rows + src_row),
                 to = static_cast<std::size_t>(e * rows.rows + r);
      const std::byte* exps = s.data.data() + from * row_scales;
      for (std::size_t g = 0; g < row_scales; ++g)
        if (exps[g] == std::byte{0xFF})
          throw Error("tensor " + detail::quote(w.scale) + " holds the E8M0 NaN code 0xFF at [" +
                      std::to_string(src_expert) + ", " + std::to_string(src_row) + ", " + std::to_string(g) +
                      "]; the block it scales has no value to convert");
      std::memcpy(out.scales.data() + to * row_scales, exps, row_scales);
      std::memcpy(out.packed.data() + to * row_bytes, b.data.data() + from * row_bytes, row_bytes);
    }
  return out;
}

// The bytes of experts [first, first + count) of a tensor stacked by expert (dim 0; stacks of no
// experts are refused when selected).
std::span<const std::byte> expert_bytes(const StTensor& t, std::int64_t first, std::int64_t count) {
  const std::size_t per = t.data.size() / static_cast<std::size_t>(t.shape[0]);
  return t.data.subspan(static_cast<std::size_t>(first) * per, static_cast<std::size_t>(count) * per);
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

Report quantize_impl(const fs::path& in_path, const fs::path& out, const QuantizeOptions& opt, bool copy_codes) {
  if (opt.part.count < 1 || opt.part.index < 0 || opt.part.index >= opt.part.count)
    throw Error("part " + std::to_string(opt.part.index) + " of " + std::to_string(opt.part.count) +
                ": the number of parts must be at least 1 and the part 0 to one less");
  Input in = open_complete(in_path);
  if (!opt.hessians.empty()) in.inputs.add("--hessians", opt.hessians);
  const Detected det = detect(in.ck, in.config);
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
  // K must be whole groups, and whole blocks where the layout's blocks span several groups (GGUF).
  const std::int64_t row_block = lay.row_block ? lay.row_block(base.mode) : base.group_size;

  Report report;
  // MLX and GGUF write experts stacked [experts, N, K], as mlx-lm's SwitchGLU and llama.cpp's
  // *_exps tensors hold them (experts.hpp).
  const bool stack = lay.stacked_experts;
  const bool gptoss = is_gptoss(in.config);
  // Select, and plan the layers as skeletons (shapes, no data) to validate the layout up front.
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
    if (why == Keep::quantize && (shape[1] == 0 || shape[1] % row_block != 0)) why = Keep::group;
    const std::string reason = kept_reason(why, logical, shape, dtype, static_cast<int>(row_block), lay, gptoss);
    if (!weight_modules.count(m) || why != Keep::quantize) weight_modules[m] = reason;
    if (why != Keep::quantize) {
      kept[n] = reason;
      kept_list.emplace_back(n, reason);
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
            Layer l = Layer::of(one.module, base, {one.rows, one.cols});
            if (three && !codes) l.global = Global::of_amax(1.0f);
            l.float_dtype = dtype;
            chosen.push_back({n, one.module, std::move(l), std::move(one)});
          }
          continue;
        }
        Layer l = Layer::of(r.module, base, {mul(n, r.experts, r.rows, "experts x rows"), r.cols});
        if (three && !codes) l.global = Global::of_amax(1.0f);
        l.experts = r.experts;
        l.float_dtype = dtype;
        chosen.push_back({n, r.module, std::move(l), std::move(r)});
      }
      continue;
    }
    Layer l = Layer::of(m, base, t.shape);
    l.float_dtype = dtype;
    if (three) l.global = Global::of_amax(1.0f);
    chosen.push_back({n, m, std::move(l), std::nullopt});
  }
  if (stack) stack_per_expert(chosen, kept);
  // gpt-oss in MLX: mlx-lm reads its experts either all split (gate_proj, up_proj, down_proj; its
  // sanitize then stands aside) or all in the original stacked form, never a mix.
  const bool gptoss_split =
      std::any_of(chosen.begin(), chosen.end(), [](const Sel& s) { return s.experts && s.experts->col_step; });
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
    for (const Sel& s : chosen)
      if (s.experts && s.experts->col_step) parents.insert(parent_of(s.experts->tensors.front()));
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
      check_activation_amax(it->second, "activation amax of " + detail::quote(s.module));
      s.skel.act = Global::of_amax(it->second);
    }
  }
  // GPTQ for the layers the --hessians file covers.
  std::optional<SafetensorsFile> hessian_file;
  std::map<std::string, const StTensor*> hessians;
  if (!opt.hessians.empty()) {
    // Checked here, before any layer is written, rather than by the first GPTQ call.
    if (!(opt.gptq.damp >= 0) || !std::isfinite(opt.gptq.damp))
      throw Error("--gptq-damp " + fmt_float(opt.gptq.damp) +
                  ": the dampening is a fraction of H's mean diagonal, a finite number >= 0");
    if (opt.gptq.block_size < 1 || opt.gptq.block_size % base.group_size != 0)
      throw Error("--gptq-block-size " + std::to_string(opt.gptq.block_size) +
                  ": GPTQ's column batches must be a positive multiple of the group size " +
                  std::to_string(base.group_size));
    if (base.scale_search != ScaleSearch::none)
      throw Error("--hessians (GPTQ) does not combine with --scale-search " + std::string(name(base.scale_search)) +
                  "; GPTQ chooses the codes itself");
    if (base.scale_2d) throw Error("--hessians (GPTQ) does not combine with --scale-2d; GPTQ rounds on 1x16 blocks");
    hessian_file = SafetensorsFile::open(opt.hessians);
    std::map<std::string, Shape> shapes;
    for (const Sel& s : chosen) shapes[s.module] = in.ck.tensor(s.name).shape;
    hessians = hessians_by_module(*hessian_file, weight_modules, shapes, example());
    if (hessians.empty()) throw Error("--hessians " + opt.hessians.string() + " holds no tensors");
    report.notes.push_back("GPTQ for " + std::to_string(hessians.size()) + " of " + std::to_string(chosen.size()) +
                           " layers (Hessians from " + opt.hessians.string() + "), round to nearest for the others");
  }
  QuantMeta meta;
  meta.w4a4 = w4a4;
  meta.gptq_layers = static_cast<int>(hessians.size());
  meta.gptq = opt.gptq;
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
  std::map<std::string, const Sel*> sel_of;
  if (three && opt.share_fused_scales) {
    std::vector<std::string> mods;
    for (const Sel& s : chosen) {
      mods.push_back(s.module);
      tensor_of[s.module] = &s.name;
      sel_of[s.module] = &s;
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
  // Stacked experts of a fused group (gate/up): expert e of every member shares the largest amax
  // of the members' expert e, as the per-expert layouts share it between gate_e and up_e.
  std::map<std::size_t, std::vector<float>> group_expert_amax;
  auto shared_expert_amax = [&](std::size_t g) -> const std::vector<float>& {
    if (const auto it = group_expert_amax.find(g); it != group_expert_amax.end()) return it->second;
    std::vector<float> mx;
    for (const std::string& m : groups[g]) {
      const ExpertRows& rows = *sel_of[m]->experts;
      const Tensor x = gather_rows(in.ck, det.sources, rows);
      const std::vector<float> a = expert_amaxes(x.view(), rows.experts);
      mx.resize(a.size(), 0.0f);
      for (std::size_t e = 0; e < a.size(); ++e) mx[e] = std::max(mx[e], a[e]);
    }
    return group_expert_amax[g] = std::move(mx);
  };

  std::vector<Item> items;
  std::map<std::string, std::vector<const Sel*>> by_name;  // primary tensor -> its layers (gate_up: two)
  std::set<std::string> stacked_parts;                     // other experts' tensors of a stacked layer
  for (const Sel& s : chosen) {
    by_name[s.name].push_back(&s);
    if (s.experts)
      for (const std::string& t : s.experts->tensors)
        if (t != s.name) stacked_parts.insert(t);
  }
  for (const std::string& n : in.ck.names()) {
    if (stacked_parts.count(n)) continue;
    if (gptoss_split && !gptoss_bias_parts(n).empty()) {
      for (Item& it : gptoss_bias_items(in, n, report, !stack)) items.push_back(std::move(it));
      continue;
    }
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
    for (const Sel* selp : sel->second) {
      const Sel& s = *selp;
      Item it = tensor_item(in, n, s.module);
      it.entries = entries_of(emit(s.skel, opt.to));
      it.layer = s.skel.module;
      if (s.experts)
        for (const std::string& t : s.experts->tensors)
          if (t != n) {
            it.inputs.push_back(in.ck.tensor(t).data);
            it.in_bytes += in.ck.tensor(t).data.size();
          }
      if (const SourceWeight* codes = copy_codes ? det.sources.find(n) : nullptr) {
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
        const StTensor& src = in.ck.tensor(sp->name);
        Tensor storage;
        const TensorView x = sp->experts ? (storage = gather_rows(in.ck, det.sources, *sp->experts), storage.view())
                                         : float_values(in.ck, det.sources, sp->name, storage);
        const std::int64_t nonfinite = count_nonfinite({static_cast<const std::byte*>(x.data),
                                                        static_cast<std::size_t>(x.numel()) * dtype_size(x.dtype)},
                                                       to_st_dtype(x.dtype))
                                           .total();
        if (nonfinite && base.nonfinite == NonFinite::error)
          throw Error("tensor " + detail::quote(sp->name) + " has " + std::to_string(nonfinite) +
                      " non-finite values (NaN/Inf) of " + std::to_string(src.numel()) +
                      "; repair the checkpoint, or pass --nonfinite propagate (NaN/Inf stay "
                      "in the blocks they hit) or saturate");
        const auto group = group_of.find(sp->module);
        // Stacked experts where each keeps its own global scale (GGUF's per-expert .scale): each
        // expert is quantized with its own amax (its fused group's, expert by expert), as the
        // per-expert layouts quantize it.
        const bool per_expert = three && sp->experts && sp->experts->experts > 1 && !hessians.count(sp->module);
        const std::optional<float> fused =
            group != group_of.end() && !per_expert ? std::optional(shared_amax(group->second)) : std::nullopt;
        QuantSpec spec = base;
        if (three) spec.global_scale = fused ? *fused : global_scale(x);
        Quantized q;
        std::vector<Global> expert_globals;
        try {
          if (per_expert) {
            const bool shared = group != group_of.end();
            q = quantize_per_expert(x, spec,
                                    shared ? shared_expert_amax(group->second) : expert_amaxes(x, sp->experts->experts),
                                    !shared, expert_globals);
          } else if (const auto h = hessians.find(sp->module); h != hessians.end()) {
            const std::vector<double> hv = hessian_values(*h->second);
            hessian_file->check_unchanged();
            q = gptq(x, HessianView{hv.data(), h->second->shape}, spec, opt.gptq);
          } else {
            // A fused group keeps its one global scale: mse searches only the block scales there.
            q = ops::quantize(x, spec, !fused.has_value());
          }
        } catch (const Error& e) {
          throw Error("tensor " + detail::quote(sp->name) + ": " + e.what());
        }
        Layer l = sp->skel;
        l.point_at(q);
        l.global = three ? Global::of_amax(*q.spec.global_scale) : Global{};
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
  w.options = options_text(base, opt, w4a4);
  w.split_bytes = opt.split_bytes;
  write_output(in, out, items, opt.to, meta, w, report);
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
