// The GGUF export (docs/gguf.md): the items quantize or convert planned, written into one
// llama.cpp GGUF file (or its split files) under the names, types and keys llama.cpp's converter
// gives the same model. The header follows from the plan alone, so the file is laid out before
// any weight is read, and each tensor is written as its item finishes: memory stays near one
// tensor.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "core/convert.hpp"
#include "io/gguf_arch.hpp"
#include "io/gguf_file.hpp"
#include "io/gguf_vocab.hpp"
#include "io/staging.hpp"
#include "io/write_pipeline.hpp"

namespace microscale::io::ck {

namespace {

using gguf::GgmlType;

// How a tensor an item declares becomes a GGUF tensor.
struct Target {
  StEntry from;                  // as the item declares it
  std::uint64_t from_bytes = 0;  // bytes the item writes
  gguf::TensorRule rule;
  GgmlType type = GgmlType::f32;
  Mode mode = Mode::nvfp4;  // of a quantized layer's weight (`blocks`)
  bool blocks = false;      // ggml nvfp4/mxfp4 blocks, as the GGUF layout emitted them
  std::size_t file = 0, index = 0;
  std::vector<std::int64_t> ne;
};

std::optional<GgmlType> ggml_float(StDType dt) {
  switch (dt) {
    case StDType::f32: return GgmlType::f32;
    case StDType::f16: return GgmlType::f16;
    case StDType::bf16: return GgmlType::bf16;
    default: return std::nullopt;
  }
}

// llama.cpp's converter regroups the rows of Llama-family q and k weights per head, from the
// rotation's two halves to interleaved pairs: new row h*d + 2i + j is old row h*d + j*d/2 + i.
void permute_rows(std::span<const std::byte> in, std::span<std::byte> out, std::int64_t rows, int heads) {
  const std::size_t row = in.size() / static_cast<std::size_t>(rows);
  const std::int64_t d = rows / heads, half = d / 2;
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t i = 0; i < half; ++i)
      for (std::int64_t j = 0; j < 2; ++j) {
        const auto to = static_cast<std::size_t>(h * d + 2 * i + j),
                   from = static_cast<std::size_t>(h * d + j * half + i);
        std::memcpy(out.data() + to * row, in.data() + from * row, row);
      }
}

// Float values of `bytes` (of dtype `dt`) as `to`'s bytes, with 1 added first under `plus_one`.
std::vector<std::byte> cast_values(std::span<const std::byte> bytes, StDType dt, GgmlType to, bool plus_one) {
  const DType from = *to_dtype(dt);
  const DType out = to == GgmlType::f32 ? DType::float32 : to == GgmlType::f16 ? DType::float16 : DType::bfloat16;
  const std::size_t n = bytes.size() / dtype_size(from);
  std::vector<std::byte> y(n * dtype_size(out));
  for (std::size_t i = 0; i < n; ++i) {
    float v = microscale::detail::load_f32(bytes.data() + i * dtype_size(from), from);
    if (plus_one) v += 1.0f;
    microscale::detail::store_f32(v, out, y.data() + i * dtype_size(out));
  }
  return y;
}

// Where a finished GGUF tensor goes: its place in the file, or a split run's part file.
using PutFn = std::function<void(const Target&, std::span<const std::byte>)>;

class GgufSink final : public TensorSink {
 public:
  GgufSink(PutFn put, std::map<std::string, Target, std::less<>>& targets, Report& report)
      : put_(std::move(put)), targets_(targets), report_(report) {}

  void write(std::string_view name, std::span<const std::byte> bytes) override {
    const auto it = targets_.find(name);
    if (it == targets_.end()) throw Error("GGUF export: tensor " + detail::quote(name) + " was not planned");
    Target& t = it->second;
    if (pending_name_ != name) {
      pending_name_ = std::string(name);
      pending_.clear();
    }
    if (pending_.empty() && bytes.size() == t.from_bytes) return put(t, bytes);
    pending_.insert(pending_.end(), bytes.begin(), bytes.end());
    if (pending_.size() > t.from_bytes)
      throw Error("GGUF export: tensor " + detail::quote(name) + " got more bytes than declared");
    if (pending_.size() == t.from_bytes) {
      put(t, pending_);
      pending_.clear();
      pending_.shrink_to_fit();
    }
  }

 private:
  void put(const Target& t, std::span<const std::byte> bytes) {
    if (t.rule.skip) return;
    const Shape& shape = t.from.shape;
    std::vector<std::byte> buf;
    if (!t.blocks && (t.rule.plus_one || ggml_float(t.from.dtype) != t.type)) {
      buf = cast_values(bytes, t.from.dtype, t.type, t.rule.plus_one);
      bytes = buf;
    }
    if (t.blocks && t.mode == Mode::nvfp4) note_nan_scales(t, bytes);
    std::unique_ptr<std::byte[]> permuted;  // every byte written by permute_rows: no zero-fill
    if (t.rule.permute_heads > 0) {
      permuted = std::make_unique_for_overwrite<std::byte[]>(bytes.size());
      permute_rows(bytes, {permuted.get(), bytes.size()}, shape[0], t.rule.permute_heads);
      bytes = {permuted.get(), bytes.size()};
    }
    put_(t, bytes);
  }

  // ggml reads an nvfp4 scale byte 0x7F (E4M3 NaN) as 0: the bytes are kept, the decoded values
  // differ, and the report says where.
  void note_nan_scales(const Target& t, std::span<const std::byte> blocks) {
    std::int64_t nan = 0;
    for (std::size_t b = 0; b + 36 <= blocks.size(); b += 36)
      for (std::size_t s = 0; s < 4; ++s) nan += (std::to_integer<unsigned>(blocks[b + s]) & 0x7F) == 0x7F;
    if (nan)
      report_.notes.push_back(t.rule.name + ": " + std::to_string(nan) +
                              " block scales are E4M3 NaN, which ggml decodes as 0 (microscale as NaN): "
                              "those blocks read as zeros in llama.cpp");
  }

  PutFn put_;
  std::map<std::string, Target, std::less<>>& targets_;
  Report& report_;
  std::string pending_name_;
  std::vector<std::byte> pending_;
};

std::vector<std::int64_t> ggml_dims(const Shape& shape) {
  if (shape.empty()) return {1};
  return {shape.rbegin(), shape.rend()};
}

}  // namespace

void write_gguf(const Input& in, const fs::path& out, std::vector<Item>& items, const QuantMeta& meta,
                const WriteOptions& opt, Report& report) {
  if (in.config.is_null())
    throw Error(in.dir.string() + " has no config.json: a GGUF needs the architecture's hyperparameters");
  const gguf::ArchPlan arch = gguf::arch_plan(in.config);
  const gguf::Vocab vocab = gguf::read_vocab(in.dir, in.config, arch.vocab_size);
  if (vocab.kvs.empty())
    throw Error(in.dir.string() +
                " has no tokenizer (tokenizer.json or tokenizer.model): llama.cpp loads no GGUF "
                "without its vocabulary. Copy the model's tokenizer files into the directory");
  for (const std::string& n : vocab.notes) report.notes.push_back(n);

  std::map<std::string, const Layer*> layers;
  for (const Layer* l : meta.layers) layers[l->module] = l;
  sort_items(items);

  // Plan every tensor: its GGUF name, type and dims.
  std::map<std::string, Target, std::less<>> targets;
  std::vector<std::string> order;  // tensors written, in file order
  std::map<std::string, std::string> gguf_names;
  std::vector<std::string> nvfp4_weights;
  bool any_nvfp4 = false, any_mxfp4 = false;
  for (const Item& it : items)
    for (const StEntry& e : it.entries) {
      Target t;
      t.from = e;
      t.from_bytes =
          static_cast<std::uint64_t>(numel(e.shape)) * static_cast<std::uint64_t>(st_dtype_bits(e.dtype)) / 8;
      const std::optional<gguf::TensorRule> rule = gguf::tensor_rule(arch, e.name);
      const std::string what = it.layer.empty()
                                   ? "tensor " + detail::quote(e.name)
                                   : "quantized layer " + detail::quote(it.layer) + "'s " + detail::quote(e.name);
      if (!rule && arch.arch == "gpt-oss" && e.name.find(".experts.") != std::string::npos)
        throw Error(what +
                    ": gpt-oss's experts go into GGUF from the published MXFP4 checkpoint (convert --to gguf) or "
                    "from the float release (quantize --export gguf); per-expert Linears and float [experts, in, "
                    "out] stacks in other layouts have no GGUF form here yet");
      if (!rule)
        throw Error(what + " has no place in llama.cpp's " + arch.arch +
                    " model: its loader would refuse or ignore it. Leave it out of the checkpoint, or export to "
                    "another layout");
      t.rule = *rule;
      if (const auto l = layers.find(it.layer); l != layers.end() && e.name == it.layer + ".weight") {
        t.blocks = true;
        t.mode = l->second->format.mode;
        t.type = t.mode == Mode::nvfp4 ? GgmlType::nvfp4 : GgmlType::mxfp4;
        t.ne = {l->second->cols(), l->second->experts ? l->second->rows() / l->second->experts : l->second->rows()};
        if (l->second->experts) t.ne.push_back(l->second->experts);
        (t.mode == Mode::nvfp4 ? any_nvfp4 : any_mxfp4) = true;
        if (t.mode == Mode::nvfp4) nvfp4_weights.push_back(t.rule.name);
      } else {
        const std::optional<GgmlType> f = ggml_float(e.dtype);
        if (!f)
          throw Error(what + " is " + st_dtype_name(e.dtype) +
                      ", which GGUF's float types (F32, F16, BF16) cannot hold; leave it out of the checkpoint");
        t.type = t.rule.f32 ? GgmlType::f32 : *f;
        t.ne = ggml_dims(e.shape);
      }
      if (t.rule.permute_heads > 0) {
        const std::int64_t rows = e.shape.empty() ? 0 : e.shape[0];
        if (e.shape.size() != 2 || rows % (2 * t.rule.permute_heads) != 0)
          throw Error(what + " " + shape_str(e.shape, ShapeStyle::list) + " does not split into " +
                      std::to_string(t.rule.permute_heads) +
                      " heads of an even size, which llama.cpp's rotary layout needs (check num_attention_heads "
                      "and num_key_value_heads in config.json)");
      }
      if (!t.rule.skip) {
        if (const auto [g, fresh] = gguf_names.emplace(t.rule.name, e.name); !fresh)
          throw Error("tensors " + detail::quote(g->second) + " and " + detail::quote(e.name) +
                      " would both be written as GGUF tensor " + detail::quote(t.rule.name));
        order.push_back(e.name);
      }
      if (!targets.emplace(e.name, std::move(t)).second)
        throw Error("output tensor " + detail::quote(e.name) + " would be written twice");
    }

  // Tensors llama.cpp's converter computes from the config (Llama 3's rope_freqs, ...).
  std::vector<std::pair<Target, const gguf::ExtraTensor*>> extras;
  for (const gguf::ExtraTensor& x : arch.extra_tensors) {
    if (!gguf_names.emplace(x.name, x.name).second)
      throw Error("GGUF tensor " + detail::quote(x.name) + " is both computed from config.json and in the checkpoint");
    Target t;
    t.rule.name = x.name;
    t.ne = {static_cast<std::int64_t>(x.values.size())};
    extras.emplace_back(std::move(t), &x);
  }

  // llama.cpp 0.3.36's graphs of these architectures call build_ffn (gpt-oss: build_moe_ffn)
  // without the feed-forward's scale tensors (src/models/<arch>.cpp, gpt-oss's openai-moe.cpp),
  // so an NVFP4 FFN runs amax/2688 times off there.
  constexpr std::string_view kFfnScaleUnapplied[] = {"qwen2", "gemma2", "gemma3", "phi3", "gpt-oss"};
  const bool nvfp4_ffn = std::any_of(nvfp4_weights.begin(), nvfp4_weights.end(),
                                     [](const std::string& n) { return n.find(".ffn_") != std::string::npos; });
  if (nvfp4_ffn && std::find(std::begin(kFfnScaleUnapplied), std::end(kFfnScaleUnapplied), arch.arch) !=
                       std::end(kFfnScaleUnapplied))
    report.notes.push_back("llama.cpp 0.3.36 does not apply the .scale of " + arch.arch +
                           "'s feed-forward weights (its graph drops them, as for llama.cpp's own NVFP4 conversions), "
                           "so these NVFP4 FFN weights give wrong (NaN) logits there until it does: use --format "
                           "mxfp4, or --exclude '*.mlp.*' to keep the FFN in high precision (docs/gguf.md)");

  // The keys: the architecture's, the tokenizer's, and what the file holds.
  std::vector<gguf::Kv> kvs;
  std::set<std::string> keys;
  auto add = [&](gguf::Kv kv) {
    if (keys.insert(kv.key).second) kvs.push_back(std::move(kv));
  };
  for (const gguf::Kv& kv : arch.kvs) add(kv);  // general.architecture first, as the converter writes it
  add(gguf::kv_str("general.type", "model"));
  const fs::path dir_name = fs::absolute(in.dir).lexically_normal().filename();
  if (!dir_name.empty()) add(gguf::kv_str("general.name", dir_name.string()));
  add(gguf::kv_u32("general.quantization_version", 2));
  if (any_nvfp4 || any_mxfp4)
    add(gguf::kv_u32("general.file_type", gguf::llama_file_type(any_nvfp4 ? GgmlType::nvfp4 : GgmlType::mxfp4)));
  for (const gguf::Kv& kv : vocab.kvs) add(kv);
  // Weight-only nvfp4 (W4A16): llama.cpp keeps those matmuls' activations at 8 bits, as its
  // converter asks for such checkpoints, instead of rounding them to 4-bit.
  if (!meta.w4a4 && !nvfp4_weights.empty()) {
    add(gguf::kv_array("general.tensor_extra.name", gguf::ValueType::string, Json(nvfp4_weights)));
    add(gguf::kv_array("general.tensor_extra.prec_a4", gguf::ValueType::boolean,
                       Json(std::vector<bool>(nvfp4_weights.size(), false))));
  }

  // Items this process runs: all, or every count-th of a split run (--part).
  const auto mine = [&](std::size_t i) {
    return opt.part.count <= 1 || static_cast<int>(i % static_cast<std::size_t>(opt.part.count)) == opt.part.index;
  };

  // Files: one, or llama.cpp's splits of at most split_bytes each (a larger tensor alone).
  std::vector<std::vector<const Target*>> split(1);
  std::uint64_t used = 0;
  std::vector<Target*> placed;
  for (const std::string& n : order) placed.push_back(&targets.find(n)->second);
  for (auto& [t, x] : extras) placed.push_back(&t);
  for (Target* tp : placed) {
    Target& t = *tp;
    const std::uint64_t bytes = gguf::tensor_bytes(t.type, t.ne, t.rule.name);
    if (opt.split_bytes && used > 0 && used + bytes > opt.split_bytes) {
      split.emplace_back();
      used = 0;
    }
    used += bytes;
    t.file = split.size() - 1;
    t.index = split.back().size();
    split.back().push_back(&t);
  }
  const int count = static_cast<int>(split.size());
  if (count > 9999) throw Error("--split-max-size gives " + std::to_string(count) + " files, more than GGUF's 9999");
  std::vector<fs::path> paths;
  for (int i = 0; i < count; ++i) paths.push_back(count == 1 ? out : gguf::split_path(out, i, count));
  for (const fs::path& p : paths) {
    in.inputs.check_output_file("output", p);
    std::error_code ec;
    if (fs::is_directory(p, ec)) throw Error("output " + p.string() + " is a directory; a GGUF export writes a file");
    if (fs::exists(p, ec) && !opt.force) throw Error("output " + p.string() + " exists; pass --force to replace it");
  }
  auto open_files = [&] {
    std::vector<gguf::GgufWriter> files;
    for (int i = 0; i < count; ++i) {
      std::vector<gguf::TensorInfo> infos;
      for (const Target* t : split[static_cast<std::size_t>(i)]) infos.push_back({t->rule.name, t->type, t->ne});
      std::vector<gguf::Kv> file_kvs = i == 0 ? kvs : std::vector<gguf::Kv>{};
      if (count > 1) {  // llama.cpp's split keys
        file_kvs.push_back({"split.no", gguf::ValueType::u16, Json(i)});
        file_kvs.push_back({"split.count", gguf::ValueType::u16, Json(count)});
        file_kvs.push_back(gguf::kv_i32("split.tensors.count", static_cast<std::int32_t>(placed.size())));
      }
      files.emplace_back(paths[static_cast<std::size_t>(i)], std::move(file_kvs), std::move(infos));
    }
    return files;
  };
  // Published together: a failure before the last rename removes the files already renamed.
  auto publish = [&](std::vector<gguf::GgufWriter>& files) {
    for (const auto& [t, x] : extras)
      files[t.file].write(t.index, 0, {reinterpret_cast<const std::byte*>(x->values.data()), x->values.size() * 4});
    std::size_t published = 0;
    try {
      for (gguf::GgufWriter& f : files) {
        f.finish();
        report.bytes_out += f.file_size();
        ++published;
      }
    } catch (...) {
      std::error_code ec;
      for (std::size_t i = 0; i < published; ++i) fs::remove(paths[i], ec);
      throw;
    }
    report.shards = files.size();
    report.notes.push_back("GGUF for llama.cpp's " + arch.arch + " (" + std::to_string(placed.size()) + " tensors" +
                           (count > 1 ? ", " + std::to_string(count) + " split files" : "") + "), vocabulary from " +
                           vocab.source);
  };
  Progress pr;
  for (std::size_t i = 0; i < items.size(); ++i)
    if (mine(i)) {
      ++pr.total;
      pr.bytes_total += items[i].in_bytes;
    }
  auto run_items = [&](TensorSink& sink) {
    std::size_t next = 0;
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (!mine(i)) continue;
      for (next = i + 1; next < items.size() && !mine(next);) ++next;
      if (next < items.size())
        for (const auto& b : items[next].inputs) prefetch(b);
      run_item(in, items[i], sink);
      ++pr.done;
      pr.bytes_done += items[i].in_bytes;
      pr.current = items[i].label;
      if (opt.progress) opt.progress(pr);
    }
    report.bytes_in = pr.bytes_total;
  };

  if (opt.part.count <= 1) {
    std::vector<gguf::GgufWriter> files = open_files();
    GgufSink sink([&](const Target& t, std::span<const std::byte> b) { files[t.file].write(t.index, 0, b); }, targets,
                  report);
    run_items(sink);
    publish(files);
    return;
  }

  // A split run (--part): every part plans the whole file, writes the tensors of its own items
  // (every count-th item) into a part file of the shared staging directory, and the part that
  // finds every part done copies them into the GGUF at their planned places.
  std::string fingerprint;
  for (const Target* t : placed) {
    fingerprint.append(t->rule.name).append(":").append(gguf::name(t->type));
    for (const std::int64_t d : t->ne) fingerprint.append(",").append(std::to_string(d));
    fingerprint.append(";");
  }
  for (const fs::path& rel : in.shard_rel)
    fingerprint.append(rel.generic_string())
        .append("=")
        .append(std::to_string(fs::file_size(in.dir / rel)))
        .append(";");
  Json plan = Json::object();
  plan["parts"] = opt.part.count;
  plan["options"] = opt.options;
  plan["output"] = std::to_string(std::hash<std::string>{}(fingerprint));
  // The split run's staging is keyed by a name next to the file (`<out>.parts`), which must not
  // exist: the GGUF itself is published by its writer's rename.
  PartStaging parts(in.inputs, out.parent_path() / (out.filename().string() + ".parts"), false, opt.part, plan);
  auto part_file = [&](const fs::path& dir, std::size_t p) { return dir / ("part-" + std::to_string(p) + ".bin"); };
  {
    detail::AtomicFile frag(part_file(parts.dir(), static_cast<std::size_t>(opt.part.index)));
    GgufSink sink([&](const Target&, std::span<const std::byte> b) { frag.write(b); }, targets, report);
    run_items(sink);
    frag.commit();
  }
  const std::unique_ptr<Staging> st = parts.done();
  const std::string which = "part " + std::to_string(opt.part.index) + " of " + std::to_string(opt.part.count);
  report.published = st != nullptr;
  if (!st) {
    report.notes.push_back(which + " written into " + parts.dir().string() +
                           "; the part that finishes last assembles and publishes the GGUF");
    return;
  }
  std::vector<gguf::GgufWriter> files = open_files();
  std::vector<std::ifstream> frags;
  for (std::size_t p = 0; p < static_cast<std::size_t>(opt.part.count); ++p) {
    frags.emplace_back(part_file(st->dir(), p), std::ios::binary);
    if (!frags.back()) throw Error("cannot read " + part_file(st->dir(), p).string() + " of the split run");
  }
  std::vector<std::byte> buf;
  for (std::size_t i = 0; i < items.size(); ++i)
    for (const StEntry& e : items[i].entries) {
      const Target& t = targets.find(e.name)->second;
      if (t.rule.skip) continue;
      std::ifstream& f = frags[i % static_cast<std::size_t>(opt.part.count)];
      const std::uint64_t size = gguf::tensor_bytes(t.type, t.ne, t.rule.name);
      for (std::uint64_t done = 0; done < size;) {
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(size - done, 64u << 20));
        buf.resize(n);
        if (!f.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(n)))
          throw Error("the split run's part files are shorter than planned (" + t.rule.name + ")");
        files[t.file].write(t.index, done, buf);
        done += n;
      }
    }
  publish(files);
  report.notes.push_back(which + " finished last: every part is done, assembled and published the GGUF");
}

}  // namespace microscale::io::ck
