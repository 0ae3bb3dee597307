// The streaming write pipeline (write_pipeline.hpp).
#include <malloc.h>

#include <algorithm>
#include <tuple>

#include "io/write_pipeline.hpp"

namespace microscale::io {

const char* name(TensorAction a) {
  switch (a) {
    case TensorAction::quantized: return "quantized";
    case TensorAction::kept: return "kept";
    case TensorAction::copied: return "copied";
    case TensorAction::converted: return "converted";
    case TensorAction::re_quantized: return "re-quantized";
    case TensorAction::dequantized: return "dequantized";
  }
  return "?";
}

}  // namespace microscale::io

namespace microscale::io::ck {

void trim_heap() {
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

namespace {

std::size_t shard_no(const Input& in, const std::string& tensor) {
  const fs::path& p = in.ck.shard_of(tensor);
  const auto& all = in.ck.shards();
  return static_cast<std::size_t>(std::find(all.begin(), all.end(), p) - all.begin());
}

}  // namespace

Item tensor_item(const Input& in, const std::string& tensor, std::string label) {
  const StTensor& t = in.ck.tensor(tensor);
  Item it;
  it.shard = shard_no(in, tensor);
  it.order = t.begin;
  it.in_bytes = t.data.size();
  it.label = std::move(label);
  return it;
}

Item layer_item(const Input& in, const Layer& l) {
  Item it;
  it.shard = shard_no(in, l.primary());
  it.order = in.ck.tensor(l.primary()).begin;
  for (const Source& s : l.sources) it.in_bytes += in.ck.tensor(s.tensor).data.size();
  it.label = l.module;
  return it;
}

Item passthrough(const Input& in, const std::string& name, Report& report, std::optional<std::string> kept_reason) {
  const StTensor& t = in.ck.tensor(name);
  Item it = tensor_item(in, name, name);
  it.entries = {{name, t.dtype, t.shape}};
  it.run = [&in, name, reason = std::move(kept_reason), &report](SafetensorsWriter& w) {
    const StTensor& src = in.ck.tensor(name);
    w.write(name, src.data);
    release(src.data);
    TensorReport r;
    r.name = name;
    r.action = reason ? TensorAction::kept : TensorAction::copied;
    r.format = src.dtype_name();
    r.shape = src.shape;
    r.bytes_in = r.bytes_out = src.data.size();
    if (reason) r.reason = *reason;
    report.tensors.push_back(std::move(r));
  };
  return it;
}

void write_emitted(SafetensorsWriter& w, const std::vector<Out>& outs, TensorReport& r) {
  for (const Out& o : outs) {
    w.write(o.entry.name, o.bytes());
    r.bytes_out += o.bytes().size();
  }
}

std::vector<StEntry> entries_of(const std::vector<Out>& outs) {
  std::vector<StEntry> e;
  for (const Out& o : outs) e.push_back(o.entry);
  return e;
}

void execute(const Input& in, const fs::path& out, std::vector<Item>& items, const char* shard_format,
             const ProgressFn& progress, Report& report) {
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return std::tie(a.shard, a.order) < std::tie(b.shard, b.order);
  });
  Progress pr;
  pr.total = items.size();
  for (const Item& it : items) pr.bytes_total += it.in_bytes;
  std::vector<fs::path> shards;
  std::size_t next = 0;
  for (std::size_t s = 0; s < in.shard_rel.size(); ++s) {
    const std::size_t first = next;
    while (next < items.size() && items[next].shard == s) ++next;
    if (first == next && in.indexed) continue;  // every tensor of this shard moved elsewhere
    std::vector<StEntry> entries;
    for (std::size_t i = first; i < next; ++i)
      entries.insert(entries.end(), items[i].entries.begin(), items[i].entries.end());
    Metadata md = in.ck.shard(s).metadata();
    if (shard_format) md["format"] = shard_format;
    const fs::path path = out / in.shard_rel[s];
    fs::create_directories(path.parent_path());
    SafetensorsWriter w(path, std::move(entries), md);
    for (std::size_t i = first; i < next; ++i) {
      items[i].run(w);
      trim_heap();
      ++pr.done;
      pr.bytes_done += items[i].in_bytes;
      pr.current = items[i].label;
      if (progress) progress(pr);
    }
    w.finish();
    shards.push_back(path);
    report.bytes_out += fs::file_size(path);
  }
  report.shards = shards.size();
  report.bytes_in = pr.bytes_total;
  if (in.indexed) write_index(out / in.index_name, shards, in.ck.metadata());
}

void finish_dir(const Input& in, const Staging& st, std::optional<Convention> to, const QuantMeta& meta, Report& report,
                std::optional<DType> dtype) {
  for (std::string& n : copy_other_files(in.dir, st.dir())) report.notes.push_back(std::move(n));
  // An output inside the input directory: its old files and other runs' staging directories
  // are not part of the model.
  std::error_code ec;
  const fs::path in_abs = fs::absolute(in.dir).lexically_normal();
  const fs::path rel = st.out().lexically_relative(in_abs);
  if (!rel.empty() && *rel.begin() != "..") fs::remove_all(st.dir() / rel, ec);
  for (const auto& e : fs::directory_iterator(st.dir(), ec))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) fs::remove_all(e.path(), ec);

  Json config = in.config;
  if (config.is_null() && to)
    report.notes.push_back("the input has no config.json; wrote one holding only the quantization block");
  if (config.is_null() && !to) return;
  Json hf = apply_config(config, to, meta);
  if (dtype)
    for (const char* k : {"torch_dtype", "dtype"})
      if (k == std::string("torch_dtype") || config.contains(k)) config[k] = dtype_name(*dtype);
  if (!hf.is_null()) write_text_atomic(st.dir() / "hf_quant_config.json", hf.dump(2) + "\n");
  write_text_atomic(st.dir() / "config.json", config.dump(2) + "\n");
}

void write_output(const Input& in, const fs::path& out, bool force, std::vector<Item>& items, const char* shard_format,
                  std::optional<Convention> to, const QuantMeta& meta, const ProgressFn& progress, Report& report,
                  std::optional<DType> dtype) {
  Staging st(in.dir, out, force);
  execute(in, st.dir(), items, shard_format, progress, report);
  finish_dir(in, st, to, meta, report, dtype);
  st.commit();
}

}  // namespace microscale::io::ck
