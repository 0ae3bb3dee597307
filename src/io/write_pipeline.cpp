// The streaming write pipeline (write_pipeline.hpp).
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <tuple>

#include "io/tensor_values.hpp"
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
  it.inputs = {t.data};
  it.label = std::move(label);
  return it;
}

Item layer_item(const Input& in, const Layer& l) {
  Item it;
  it.shard = shard_no(in, l.primary());
  it.order = in.ck.tensor(l.primary()).begin;
  for (const Source& s : l.sources) {
    it.in_bytes += in.ck.tensor(s.tensor).data.size();
    it.inputs.push_back(in.ck.tensor(s.tensor).data);
  }
  it.label = l.module;
  return it;
}

Item passthrough(const Input& in, const std::string& name, Report& report, std::optional<std::string> kept_reason) {
  const StTensor& t = in.ck.tensor(name);
  Item it = tensor_item(in, name, name);
  it.entries = {{name, t.dtype, t.shape}};
  it.run = [&in, name, reason = std::move(kept_reason), &report](TensorSink& w) {
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

void check_nonfinite(std::span<const std::byte> values, DType dt, const std::string& name, NonFinite policy,
                     TensorReport& r) {
  const NonFiniteCount n = count_nonfinite(values, to_st_dtype(dt));
  r.nonfinite = n.total();
  if (n.total() == 0 || policy != NonFinite::error) return;
  std::string what;
  if (n.nan) what = std::to_string(n.nan) + " NaN (a NaN block scale, or NaN stored)";
  if (n.inf)
    what += (what.empty() ? "" : " and ") + std::to_string(n.inf) + " infinite (beyond " + dtype_name(dt) + "'s range" +
            (dt == DType::float16 ? ", 65504: --dtype bfloat16 or float32 holds them" : "") + ")";
  throw Error("tensor " + detail::quote(name) + " dequantizes to " + what + " values of " +
              std::to_string(values.size() / dtype_size(dt)) + " in " + dtype_name(dt) +
              "; --nonfinite propagate writes them as they are");
}

TensorReport layer_report(const Layer& l, TensorAction action, std::uint64_t bytes_in) {
  TensorReport r;
  r.name = l.module;
  r.action = action;
  r.format = name(l.format.mode);
  r.shape = l.stored(l.cols());
  r.bytes_in = bytes_in;
  return r;
}

void write_emitted(TensorSink& w, const std::vector<Out>& outs, TensorReport& r) {
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

void sort_items(std::vector<Item>& items) {
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return std::tie(a.shard, a.order) < std::tie(b.shard, b.order);
  });
}

// A bounded, one-item-ahead prefetch into the page cache, which changes nothing but timing.
void prefetch(std::span<const std::byte> bytes) {
  static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto b = reinterpret_cast<std::uintptr_t>(bytes.data()) & ~(page - 1);
  const auto e = reinterpret_cast<std::uintptr_t>(bytes.data()) + bytes.size();
  if (e > b) (void)::madvise(reinterpret_cast<void*>(b), e - b, MADV_WILLNEED);
}

void run_item(const Input& in, Item& item, TensorSink& sink) {
  // Input truncated or rewritten under us reads as zeros (a system call given its bytes fails
  // with EFAULT instead): either way the input is what to report, and nothing may be kept.
  try {
    item.run(sink);
  } catch (...) {
    in.ck.check_unchanged();
    throw;
  }
  in.ck.check_unchanged();
  trim_heap();
}

namespace {

// One output shard: the input shard whose items it holds, items[first, last) once sorted.
struct OutShard {
  std::size_t input, first, last;
};

// Sorts `items` by their place in the input and groups them into output shards, one per input
// shard (none for an input shard whose tensors all moved elsewhere, when there is an index).
std::vector<OutShard> plan_shards(const Input& in, std::vector<Item>& items) {
  sort_items(items);
  std::vector<OutShard> shards;
  std::size_t next = 0;
  for (std::size_t s = 0; s < in.shard_rel.size(); ++s) {
    const std::size_t first = next;
    while (next < items.size() && items[next].shard == s) ++next;
    if (first == next && in.indexed) continue;  // every tensor of this shard moved elsewhere
    shards.push_back({s, first, next});
  }
  return shards;
}

// Writes `shards` into `out` (same relative names as the input, metadata "format" set to
// `shard_format` when given).
void write_shards(const Input& in, const fs::path& out, std::vector<Item>& items, const std::vector<OutShard>& shards,
                  const char* shard_format, const ProgressFn& progress, Report& report) {
  Progress pr;
  for (const OutShard& sh : shards) {
    pr.total += sh.last - sh.first;
    for (std::size_t i = sh.first; i < sh.last; ++i) pr.bytes_total += items[i].in_bytes;
  }
  // Item positions in writing order, to prefetch the one after the current.
  std::vector<std::size_t> order;
  for (const OutShard& sh : shards)
    for (std::size_t i = sh.first; i < sh.last; ++i) order.push_back(i);
  std::size_t at = 0;
  if (!order.empty())
    for (const auto& b : items[order[0]].inputs) prefetch(b);
  for (const OutShard& sh : shards) {
    std::vector<StEntry> entries;
    for (std::size_t i = sh.first; i < sh.last; ++i)
      entries.insert(entries.end(), items[i].entries.begin(), items[i].entries.end());
    Metadata md = in.ck.shard(sh.input).metadata();
    if (shard_format) md["format"] = shard_format;
    const fs::path path = out / in.shard_rel[sh.input];
    fs::create_directories(path.parent_path());
    SafetensorsWriter w(path, std::move(entries), md);
    SafetensorsSink sink(w);
    for (std::size_t i = sh.first; i < sh.last; ++i, ++at) {
      if (at + 1 < order.size())
        for (const auto& b : items[order[at + 1]].inputs) prefetch(b);
      run_item(in, items[i], sink);
      ++pr.done;
      pr.bytes_done += items[i].in_bytes;
      pr.current = items[i].label;
      if (progress) progress(pr);
    }
    w.finish();
    report.bytes_out += fs::file_size(path);
  }
  report.shards = shards.size();
  report.bytes_in = pr.bytes_total;
}

void write_index_of(const Input& in, const fs::path& out, const std::vector<OutShard>& shards) {
  if (!in.indexed) return;
  std::vector<fs::path> paths;
  for (const OutShard& sh : shards) paths.push_back(out / in.shard_rel[sh.input]);
  write_index(out / in.index_name, paths, in.ck.metadata());
}

// The rest of the output in the staging directory: the input's other files, hf_quant_config.json,
// then config.json last.
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

// FNV-1a: a fingerprint that every machine computes alike (std::hash need not).
struct Fingerprint {
  std::uint64_t h = 14695981039346656037ull;
  void add(std::string_view bytes) {
    for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  }
  void add(std::uint64_t v) { add(std::to_string(v) + ";"); }
  std::string hex() const {
    char buf[20];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
  }
};

// What the parts of a split run must agree on: their count, the options that shape the output's
// bytes, the source (each shard's name, size, and first and last 64 KiB: its header and a sample
// of its data, cheap enough to read at every start) and the planned output tensors.
Json split_plan(const Input& in, const std::vector<Item>& items, const std::vector<OutShard>& shards, Part part,
                const std::string& options) {
  Fingerprint src, dst;
  for (const fs::path& rel : in.shard_rel) {
    const fs::path p = in.dir / rel;
    const std::uint64_t size = fs::file_size(p);
    src.add(rel.generic_string());
    src.add(size);
    std::ifstream f(p, std::ios::binary);
    std::string buf(static_cast<std::size_t>(std::min<std::uint64_t>(size, 64 << 10)), '\0');
    for (const std::uint64_t at : {std::uint64_t{0}, size - buf.size()}) {
      f.seekg(static_cast<std::streamoff>(at));
      f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      if (!f) throw Error(p.string() + ": read error");
      src.add(buf);
    }
  }
  for (const OutShard& sh : shards) {
    dst.add(in.shard_rel[sh.input].generic_string());
    for (std::size_t i = sh.first; i < sh.last; ++i)
      for (const StEntry& e : items[i].entries) {
        dst.add(e.name);
        dst.add(static_cast<std::uint64_t>(e.dtype));
        for (const std::int64_t d : e.shape) dst.add(static_cast<std::uint64_t>(d));
      }
  }
  Json plan = Json::object();
  plan["parts"] = part.count;
  plan["source"] = src.hex();
  plan["options"] = options;
  plan["output"] = dst.hex();
  return plan;
}

}  // namespace

void write_output(const Input& in, const fs::path& out, std::vector<Item>& items, std::optional<Convention> to,
                  const QuantMeta& meta, const WriteOptions& opt, Report& report) {
  std::vector<OutputTensor> names;
  for (const Item& it : items)
    for (const StEntry& e : it.entries) names.push_back({e.name, it.layer, it.label});
  check_output_names(names);
  const LayoutOps* lay = to ? &layout(*to) : nullptr;
  if (lay && lay->write_file) return lay->write_file(in, out, items, meta, opt, report);
  if (opt.split_bytes)
    throw Error("a size limit per file splits single-file outputs (GGUF) only; " +
                std::string(lay ? lay->title : "a dequantized checkpoint") + " keeps the input's shards");
  const char* shard_format = lay ? lay->shard_format : nullptr;
  const bool force = opt.force;
  const ProgressFn& progress = opt.progress;
  const std::optional<DType>& dtype = opt.dtype;
  const Part part = opt.part;
  const std::string& options = opt.options;
  const std::vector<OutShard> shards = plan_shards(in, items);
  if (part.count <= 1) {
    Staging st(in.inputs, out, force);
    write_shards(in, st.dir(), items, shards, shard_format, progress, report);
    write_index_of(in, st.dir(), shards);
    finish_dir(in, st, to, meta, report, dtype);
    st.commit();
    return;
  }
  PartStaging parts(in.inputs, out, force, part, split_plan(in, items, shards, part, options));
  std::vector<OutShard> mine;
  for (std::size_t i = static_cast<std::size_t>(part.index); i < shards.size();
       i += static_cast<std::size_t>(part.count))
    mine.push_back(shards[i]);
  write_shards(in, parts.dir(), items, mine, shard_format, progress, report);
  const std::string which = "part " + std::to_string(part.index) + " of " + std::to_string(part.count);
  if (mine.empty())
    report.notes.push_back(which + " had no shard to write (the output has " + std::to_string(shards.size()) +
                           "): use fewer parts than shards");
  const std::unique_ptr<Staging> st = parts.done();
  report.published = st != nullptr;
  if (!st) {
    report.notes.push_back(which + " written into " + parts.dir().string() +
                           "; the part that finishes last writes the index and config and publishes the output");
    return;
  }
  write_index_of(in, st->dir(), shards);
  finish_dir(in, *st, to, meta, report, dtype);
  st->commit();
  report.notes.push_back(which + " finished last: every part is done, wrote the index and config and published " +
                         "the output");
}

}  // namespace microscale::io::ck
