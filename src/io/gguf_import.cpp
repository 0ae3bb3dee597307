// Reading a GGUF back: each tensor's transformers name from the architecture's table (the same
// rules the export applies, inverted), the config rebuilt from the keys, and the quantized layers
// with their codes and scale bytes taken out of ggml's blocks. The output is one model.safetensors
// plus config.json, written through Staging like every other output.
#include "io/gguf_import.hpp"

#include <charconv>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "core/convert.hpp"
#include "io/experts.hpp"
#include "io/gguf_arch.hpp"
#include "io/gguf_blocks.hpp"
#include "io/gguf_file.hpp"
#include "io/model_dir.hpp"
#include "io/source_gptoss.hpp"
#include "io/write_pipeline.hpp"

namespace microscale::io::ck {

namespace {

using gguf::GgmlType;

struct Named {
  const gguf::GgufTensor* t = nullptr;
  std::string hf;  // as the export presents it: "<p>.switch_mlp.<proj>.weight" for stacked experts
  gguf::TensorRule rule;
};

// A quantized weight and the scale tensors that go with it.
struct QLayer {
  Layer skel;  // shape, format, experts and global scales; no data
  const Named* weight = nullptr;
};

struct Model {
  gguf::GgufFile file;
  Json config;
  gguf::ArchPlan plan;
  std::vector<Named> named;  // file order, computed tensors (rope_freqs) left out
  std::vector<QLayer> layers;
  std::map<std::string, const Named*> by_hf;
};

std::optional<StDType> st_float(GgmlType t) {
  switch (t) {
    case GgmlType::f32: return StDType::f32;
    case GgmlType::f16: return StDType::f16;
    case GgmlType::bf16: return StDType::bf16;
    default: return std::nullopt;
  }
}

Shape hf_shape(const gguf::TensorInfo& info) { return {info.ne.rbegin(), info.ne.rend()}; }

std::vector<float> f32_values(const Named& n) {
  if (n.t->info.type != GgmlType::f32)
    throw Error("GGUF tensor " + detail::quote(n.t->info.name) + " is " + gguf::name(n.t->info.type) + ", not F32");
  std::vector<float> v(n.t->data.size() / 4);
  std::memcpy(v.data(), n.t->data.data(), v.size() * 4);
  return v;
}

// The block index of "blk.<N>.<...>", or nullopt for other names.
std::optional<std::uint64_t> block_index(std::string_view name) {
  constexpr std::string_view kBlk = "blk.";
  if (!name.starts_with(kBlk)) return std::nullopt;
  std::uint64_t n = 0;
  const char* end = name.data() + name.size();
  const auto [p, ec] = std::from_chars(name.data() + kBlk.size(), end, n);
  if (ec != std::errc() || p == end || *p != '.') return std::nullopt;
  return n;
}

// llama.cpp's q/k row order can be undone only on whole heads of an even size, as the export
// requires of them; anything else would leave rows out of place (or unwritten).
void check_permutable(const Named& n) {
  const int heads = n.rule.permute_heads;
  if (heads == 0) return;
  const std::vector<std::int64_t>& ne = n.t->info.ne;
  if (ne.size() > 2 || ne.back() % (2 * static_cast<std::int64_t>(heads)) != 0)
    throw Error("GGUF tensor " + detail::quote(n.t->info.name) + " has " + std::to_string(ne.back()) + " rows, not " +
                std::to_string(heads) +
                " heads of an even size, which llama.cpp's rotary row order needs (check the attention.head_count" +
                (n.t->info.name.find("attn_k") != std::string::npos ? "_kv" : "") + " key)");
}

Model open_model_of(const fs::path& path) {
  Model m{gguf::GgufFile::open(path), {}, {}, {}, {}, {}};
  const gguf::GgufFile& f = m.file;
  if (const gguf::Kv* count = f.find("split.count"); count && count->value.is_number() && count->value.get<int>() > 1)
    throw Error(path.string() + " is one of " + count->value.dump() +
                " split files; reading split GGUFs is not supported yet: merge them first (llama-gguf-split --merge)");
  const gguf::Kv* arch = f.find("general.architecture");
  if (!arch || !arch->value.is_string()) throw Error(path.string() + ": no general.architecture key");
  const std::string a = arch->value.get<std::string>();
  const gguf::Kv* blocks = f.find(a + ".block_count");
  if (!blocks || !blocks->value.is_number_unsigned()) throw Error(path.string() + ": no " + a + ".block_count key");
  const gguf::GgufTensor* embd = f.tensor("token_embd.weight");
  if (!embd || embd->info.ne.size() != 2) throw Error(path.string() + ": no 2-D token_embd.weight tensor");
  m.config = gguf::hf_config(f.kvs(), embd->info.ne[1], f.tensor("output.weight") != nullptr);
  try {
    m.plan = gguf::arch_plan(m.config);
  } catch (const Error& e) {
    throw Error(std::string("the config rebuilt from its ") + a + ".* keys: " + e.what());
  }
  // Names only for the blocks the file has tensors of (block 0's names renumbered): block_count
  // and the numbers in tensor names may be anything up to 2^64.
  const auto block_count = blocks->value.get<std::uint64_t>();
  std::set<std::uint64_t> present;
  for (const gguf::GgufTensor& t : f.tensors())
    if (const std::optional<std::uint64_t> b = block_index(t.info.name); b && *b < block_count) present.insert(*b);
  std::map<std::string, std::pair<std::string, gguf::TensorRule>> reverse;
  const auto map_name = [&](const std::string& hf) {
    if (std::optional<gguf::TensorRule> r = gguf::tensor_rule(m.plan, hf); r && !r->skip) reverse[r->name] = {hf, *r};
  };
  constexpr std::string_view kLayer0 = "model.layers.0.";
  for (const std::string& hf : gguf::hf_names(m.plan, 1)) {
    if (!hf.starts_with(kLayer0)) {
      map_name(hf);
      continue;
    }
    for (std::uint64_t b : present) map_name("model.layers." + std::to_string(b) + "." + hf.substr(kLayer0.size()));
  }
  std::set<std::string> computed;
  for (const gguf::ExtraTensor& x : m.plan.extra_tensors) computed.insert(x.name);
  for (const gguf::GgufTensor& t : f.tensors()) {
    if (computed.count(t.info.name) || t.info.name.starts_with("rope_")) continue;  // from the config
    const auto r = reverse.find(t.info.name);
    if (r == reverse.end())
      throw Error(path.string() + ": GGUF tensor " + detail::quote(t.info.name) +
                  " has no transformers counterpart in " + m.plan.hf_type + " here");
    m.named.push_back({&t, r->second.first, r->second.second});
    check_permutable(m.named.back());
  }
  for (const Named& n : m.named) m.by_hf[n.hf] = &n;
  for (const Named& n : m.named) {
    const GgmlType type = n.t->info.type;
    if (type != GgmlType::nvfp4 && type != GgmlType::mxfp4) continue;
    const std::string module = n.hf.substr(0, n.hf.size() - std::string_view(".weight").size());
    const std::vector<std::int64_t>& ne = n.t->info.ne;
    if (!n.hf.ends_with(".weight") || ne.size() < 2 || ne.size() > 3)
      throw Error(path.string() + ": " + gguf::name(type) + " tensor " + detail::quote(n.t->info.name) +
                  " is not a 2-D weight or a 3-D stack of experts");
    // Only a tensor of bytes bounds its expert count (each expert becomes a tensor of the output).
    if (std::find(ne.begin(), ne.end(), 0) != ne.end())
      throw Error(std::string(gguf::name(type)) + " tensor " + detail::quote(n.t->info.name) +
                  " holds no values (a dimension is 0)");
    const Mode mode = type == GgmlType::nvfp4 ? Mode::nvfp4 : Mode::mxfp4;
    const std::int64_t experts = ne.size() == 3 ? ne[2] : 0;
    Layer l;
    l.module = module;
    l.format.mode = mode;
    l.format.group_size = mode == Mode::nvfp4 ? 16 : 32;
    l.format.bits = 4;
    l.experts = experts;
    l.shape = {mul(module, experts ? experts : 1, ne[1], "experts x rows"), ne[0]};
    l.sources = {{n.t->info.name, Role::packed}};
    if (const auto s = m.by_hf.find(module + ".scale"); s != m.by_hf.end()) {
      if (mode != Mode::nvfp4)
        layer_error(module, "an MXFP4 weight has a .scale tensor, which ggml applies to NVFP4 only");
      const std::vector<float> v = f32_values(*s->second);
      if (static_cast<std::int64_t>(v.size()) != (experts ? experts : 1))
        layer_error(module, "its .scale holds " + std::to_string(v.size()) + " values for " +
                                std::to_string(experts ? experts : 1) + " experts");
      if (experts)
        for (float x : v) l.expert_globals.push_back(Global::stored_as(kDecodeFactor, x));
      l.global = Global::stored_as(kDecodeFactor, v[0]);
      l.sources.push_back({s->second->t->info.name, Role::global_scale});
    }
    if (const auto s = m.by_hf.find(module + ".input_scale"); s != m.by_hf.end()) {
      const std::vector<float> v = f32_values(*s->second);
      if (v.empty() || std::any_of(v.begin(), v.end(), [&](float x) { return x != v[0]; }))
        layer_error(module, "its experts' .input_scale values differ; the safetensors layouts hold one per layer");
      l.act = Global::stored_as(kDecodeFactor, v[0]);
      l.sources.push_back({s->second->t->info.name, Role::activation_scale});
    }
    check_dims(l);
    check_global(l);
    m.layers.push_back({std::move(l), &n});
  }
  return m;
}

// Every error of reading a GGUF names the file.
Model open_model(const fs::path& path) {
  try {
    return open_model_of(path);
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with(path.string() + ":")) throw;
    throw Error(path.string() + ": " + e.what());
  }
}

// The codes and scales of a layer, out of ggml's blocks and back into transformers' row order.
struct LayerData {
  std::vector<std::byte> codes, scales;
};
Layer load_layer(const QLayer& q, LayerData& d) {
  const Layer& s = q.skel;
  const std::int64_t rows = s.rows(), k = s.cols();
  d.codes.resize(static_cast<std::size_t>(rows * k / 2));
  d.scales.resize(static_cast<std::size_t>(rows * (k / s.format.group_size)));
  gguf::from_ggml_blocks(s.format.mode, rows, k, q.weight->t->data, d.codes, d.scales);
  if (const int heads = q.weight->rule.permute_heads; heads > 0) {
    // Inverse of the export's regrouping: old row h*d + j*d/2 + i is new row h*d + 2i + j.
    auto unpermute = [&](std::vector<std::byte>& buf) {
      const std::size_t row = buf.size() / static_cast<std::size_t>(rows);
      std::vector<std::byte> out(buf.size());
      const std::int64_t dd = rows / heads, half = dd / 2;
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t i = 0; i < half; ++i)
          for (std::int64_t j = 0; j < 2; ++j)
            std::memcpy(out.data() + static_cast<std::size_t>(h * dd + j * half + i) * row,
                        buf.data() + static_cast<std::size_t>(h * dd + 2 * i + j) * row, row);
      buf = std::move(out);
    };
    unpermute(d.codes);
    unpermute(d.scales);
  }
  Layer l = s;
  l.packed = d.codes;
  l.scales = d.scales;
  return l;
}

// A plain tensor's values as transformers holds them: rows back in order, Gemma's + 1 undone.
std::vector<std::byte> load_plain(const Named& n, StDType dt) {
  std::vector<std::byte> v(n.t->data.begin(), n.t->data.end());
  if (n.rule.plus_one) {
    const DType d = *to_dtype(dt);
    for (std::size_t i = 0; i < v.size(); i += dtype_size(d))
      microscale::detail::store_f32(microscale::detail::load_f32(v.data() + i, d) - 1.0f, d, v.data() + i);
  }
  if (const int heads = n.rule.permute_heads; heads > 0) {
    const Shape shape = hf_shape(n.t->info);
    const std::int64_t rows = shape[0], dd = rows / heads, half = dd / 2;
    const std::size_t row = v.size() / static_cast<std::size_t>(rows);
    std::vector<std::byte> out(v.size());
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < half; ++i)
        for (std::int64_t j = 0; j < 2; ++j)
          std::memcpy(out.data() + static_cast<std::size_t>(h * dd + j * half + i) * row,
                      v.data() + static_cast<std::size_t>(h * dd + 2 * i + j) * row, row);
    v = std::move(out);
  }
  return v;
}

// The layers an output holds: stacked experts split per expert for the layouts that hold them so
// (and for dequantize, which writes transformers' per-expert weights).
std::vector<Layer> output_layers(const Layer& l, bool keep_stacked, const Json& config) {
  if (!l.experts || keep_stacked) return {l};
  std::vector<Layer> out;
  std::vector<std::string> names = per_expert_outputs(l.module, l.experts, config);
  if (names.empty() && is_gptoss(config))  // llm-compressor's linearized experts: "<p>.experts.<e>.<proj>"
    for (std::int64_t e = 0; e < l.experts; ++e) names.push_back(gptoss_expert_name(l.module, e) + ".weight");
  if (names.empty()) layer_error(l.module, "stacked experts with no per-expert form in transformers");
  const auto e_count = static_cast<std::size_t>(l.experts);
  for (std::size_t e = 0; e < e_count; ++e) {
    Layer sub = l;
    sub.module = names[e].substr(0, names[e].size() - std::string_view(".weight").size());
    sub.experts = 0;
    sub.shape = {l.rows() / l.experts, l.cols()};
    auto slice = [&](std::span<const std::byte> s) { return s.subspan(e * (s.size() / e_count), s.size() / e_count); };
    if (!l.packed.empty()) {
      sub.packed = slice(l.packed);
      sub.scales = slice(l.scales);
    }
    sub.expert_globals.clear();
    if (!l.expert_globals.empty()) sub.global = l.expert_globals[e];
    out.push_back(std::move(sub));
  }
  return out;
}

// Writes model.safetensors and config.json into `out`: the layers through `write_layer` (its
// entries planned by `plan_layer`), every other tensor as it is.
Report write_model(const fs::path& in, const Model& m, const fs::path& out, bool force, std::optional<Convention> to,
                   std::optional<DType> dtype, const ProgressFn& progress) {
  Report report;
  RunInputs inputs;
  inputs.add("input", in);
  const LayoutOps* lay = to ? &layout(*to) : nullptr;
  const bool keep_stacked = lay && lay->stacked_experts;
  const DType float_dtype = dtype.value_or(DType::bfloat16);
  // gpt-oss dequantized goes back into transformers' stacks: gate and up interleaved into
  // gate_up_proj [E, K, 2N], down_proj [E, K, N], their biases alike.
  const bool merge_gptoss = !lay && is_gptoss(m.config);
  std::set<const Named*> in_layers;
  for (const QLayer& q : m.layers) {
    in_layers.insert(q.weight);
    for (const Source& s : q.skel.sources)
      for (const Named& n : m.named)
        if (n.t->info.name == s.tensor) in_layers.insert(&n);
  }
  std::vector<StEntry> entries;
  std::deque<Layer> skeletons;  // meta.layers points into it
  std::vector<std::function<void(SafetensorsWriter&)>> work;
  QuantMeta meta;
  auto add_report = [&](std::string name, TensorAction action, std::string format, Shape shape, std::uint64_t bytes) {
    TensorReport r;
    r.name = std::move(name);
    r.action = action;
    r.format = std::move(format);
    r.shape = std::move(shape);
    r.bytes_in = bytes;
    report.tensors.push_back(std::move(r));
  };

  // gpt-oss's merged stacks: name -> (its parts in column order, experts, rows, cols of a part).
  struct Merged {
    std::vector<const Named*> parts;
    bool layer = false;
  };
  std::map<std::string, Merged> merged;
  std::vector<std::string> merged_order;
  for (const Named& n : m.named) {
    if (in_layers.count(&n) && n.t->info.type != GgmlType::nvfp4 && n.t->info.type != GgmlType::mxfp4) continue;
    const auto q = std::find_if(m.layers.begin(), m.layers.end(), [&](const QLayer& x) { return x.weight == &n; });
    const std::optional<MergedName> to_stack =
        merge_gptoss ? gptoss_merged(q != m.layers.end() ? q->skel.module : n.hf) : std::nullopt;
    if (to_stack) {
      Merged& g = merged[to_stack->name];
      if (g.parts.empty()) merged_order.push_back(to_stack->name);
      g.parts.resize(static_cast<std::size_t>(to_stack->parts));
      g.parts[static_cast<std::size_t>(to_stack->part)] = &n;
      g.layer = q != m.layers.end();
      continue;
    }
    if (q != m.layers.end()) {
      for (Layer& l : output_layers(q->skel, keep_stacked, m.config)) {
        if (lay) {
          for (const StEntry& e : entries_of(emit(l, *to))) entries.push_back(e);
          skeletons.push_back(std::move(l));
          meta.layers.push_back(&skeletons.back());
        } else {
          entries.push_back({l.module + ".weight", to_st_dtype(float_dtype), l.shape});
        }
      }
      work.push_back([&, qp = &*q](SafetensorsWriter& w) {
        LayerData d;
        const Layer whole = load_layer(*qp, d);
        for (const Layer& l : output_layers(whole, keep_stacked, m.config)) {
          if (lay)
            for (const Out& o : emit(l, *to)) w.write(o.entry.name, o.bytes());
          else
            w.write_tensor(l.module + ".weight", dequantize_layer(l, float_dtype));
          add_report(l.module, lay ? TensorAction::converted : TensorAction::dequantized, name(l.format.mode),
                     l.stored(l.cols()), qp->weight->t->data.size());
        }
      });
      continue;
    }
    const std::optional<StDType> st = st_float(n.t->info.type);
    if (!st)
      throw Error(in.string() + ": GGUF tensor " + detail::quote(n.t->info.name) + " is " + gguf::name(n.t->info.type) +
                  "; only NVFP4, MXFP4 and float tensors are read here");
    const Shape shape = hf_shape(n.t->info);
    // gpt-oss's expert biases [E, N] for the layouts that hold experts one by one: one [N] each.
    if (!keep_stacked && lay && is_gptoss(m.config) && shape.size() == 2 && n.hf.ends_with(".bias") &&
        n.hf.find(".experts.") != std::string::npos) {
      for (std::int64_t e = 0; e < shape[0]; ++e) entries.push_back({gptoss_expert_name(n.hf, e), *st, {shape[1]}});
      work.push_back([&, np = &n, dt = *st, shape](SafetensorsWriter& w) {
        const std::vector<std::byte> v = load_plain(*np, dt);
        const std::size_t row = v.size() / static_cast<std::size_t>(shape[0]);
        for (std::int64_t e = 0; e < shape[0]; ++e)
          w.write(gptoss_expert_name(np->hf, e), {v.data() + static_cast<std::size_t>(e) * row, row});
        add_report(np->hf, TensorAction::copied, st_dtype_name(dt), shape, v.size());
      });
      continue;
    }
    entries.push_back({n.hf, *st, shape});
    work.push_back([&, np = &n, dt = *st, shape](SafetensorsWriter& w) {
      w.write(np->hf, load_plain(*np, dt));
      add_report(np->hf, TensorAction::copied, st_dtype_name(dt), shape, np->t->data.size());
    });
  }
  for (const std::string& name_ : merged_order) {
    const Merged& g = merged[name_];
    for (const Named* p : g.parts)
      if (!p) throw Error(in.string() + ": gpt-oss's " + detail::quote(name_) + " is missing a part (gate or up)");
    const Shape part = hf_shape(g.parts[0]->t->info);  // [E, N, K] of a layer, [E, N] of a bias
    const auto count = static_cast<std::int64_t>(g.parts.size());
    const std::int64_t experts = part[0], rows = part[1], cols = g.layer ? part.at(2) : 1;
    for (const Named* p : g.parts)
      if (hf_shape(p->t->info) != part)
        throw Error(in.string() + ": gpt-oss's parts of " + detail::quote(name_) + " differ in shape");
    const StDType out_dt = g.layer ? to_st_dtype(float_dtype) : *st_float(g.parts[0]->t->info.type);
    entries.push_back({name_, out_dt, g.layer ? Shape{experts, cols, count * rows} : Shape{experts, count * rows}});
    work.push_back([&, np = &name_, gp = &g, experts, rows, cols, out_dt](SafetensorsWriter& w) {
      std::vector<std::vector<std::byte>> values;
      for (const Named* p : gp->parts) {
        if (gp->layer) {
          const QLayer& q =
              *std::find_if(m.layers.begin(), m.layers.end(), [&](const QLayer& x) { return x.weight == p; });
          LayerData d;
          const Tensor y = dequantize_layer(load_layer(q, d), float_dtype);
          values.emplace_back(y.bytes(), y.bytes() + y.nbytes());
        } else {
          values.push_back(load_plain(*p, out_dt));
        }
      }
      std::vector<std::span<const std::byte>> spans(values.begin(), values.end());
      w.write(*np, merge_columns(spans, experts, rows, cols, st_dtype_bits(out_dt) / 8));
      add_report(*np, gp->layer ? TensorAction::dequantized : TensorAction::copied, st_dtype_name(out_dt), {}, 0);
    });
  }
  Json config = m.config;
  Staging st(inputs, out, force);
  {
    SafetensorsWriter w(st.dir() / "model.safetensors", entries);
    Progress pr;
    pr.total = work.size();
    for (const auto& item : work) {
      item(w);
      m.file.check_unchanged();
      ++pr.done;
      if (progress) progress(pr);
    }
    w.finish();
  }
  Json hf = apply_config(config, to, meta);
  if (!to) config["torch_dtype"] = dtype_name(float_dtype);
  if (!hf.is_null()) write_text_atomic(st.dir() / "hf_quant_config.json", hf.dump(2) + "\n");
  write_text_atomic(st.dir() / "config.json", config.dump(2) + "\n");
  report.notes.push_back(
      "config.json rebuilt from the GGUF's keys (the hyperparameters llama.cpp keeps); the "
      "vocabulary stays in the GGUF: copy the tokenizer files from the source model");
  report.bytes_in = fs::file_size(in);
  report.bytes_out = fs::file_size(st.dir() / "model.safetensors");
  report.shards = 1;
  st.commit();
  return report;
}

}  // namespace

bool is_gguf_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  f.read(magic, 4);
  return f && std::memcmp(magic, "GGUF", 4) == 0;
}

Report convert_gguf(const fs::path& in, const fs::path& out, const ConvertOptions& opt) {
  if (opt.to == Convention::gguf) throw Error(in.string() + " is already a GGUF");
  const Model m = open_model(in);
  if (m.layers.empty()) throw Error(in.string() + " holds no NVFP4 or MXFP4 tensors to convert");
  return write_model(in, m, out, opt.force, opt.to, std::nullopt, opt.progress);
}

Report dequantize_gguf(const fs::path& in, const fs::path& out, const DequantizeOptions& opt) {
  const Model m = open_model(in);
  return write_model(in, m, out, opt.force, std::nullopt, opt.dtype, opt.progress);
}

InspectResult inspect_gguf(const fs::path& in) {
  const Model m = open_model(in);
  InspectResult res;
  res.convention = "gguf";
  res.config = "GGUF v" + std::to_string(m.file.version()) + ", " + m.plan.arch + ", " +
               std::to_string(m.file.kvs().size()) + " keys; as transformers " + m.config.dump();
  for (const Named& n : m.named) {
    InspectRow r;
    r.name = n.t->info.name;
    r.dtype = gguf::name(n.t->info.type);
    r.shape = hf_shape(n.t->info);
    const GgmlType type = n.t->info.type;
    r.format = type == GgmlType::nvfp4   ? "nvfp4 ggml blocks"
               : type == GgmlType::mxfp4 ? "mxfp4 ggml blocks"
               : st_float(type)          ? std::string(st_dtype_name(*st_float(type)))
                                         : std::string(gguf::name(type)) + " ggml blocks";
    r.detail = n.hf;
    if (n.t->info.name.ends_with(".scale")) {
      const std::vector<float> v = f32_values(n);
      r.detail += " (decode factor amax/2688 = " + fmt_float(v.empty() ? 0.0f : v[0]) +
                  (v.size() > 1 ? ", ... per expert" : "") + ")";
    }
    res.rows.push_back(std::move(r));
  }
  return res;
}

}  // namespace microscale::io::ck
