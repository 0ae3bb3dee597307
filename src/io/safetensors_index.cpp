// Sharded checkpoints: model.safetensors.index.json reading (shards opened lazily) and writing.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include "io/detail.hpp"

namespace microscale::io {

using detail::fail;
using detail::Json;
using detail::quote;
namespace fs = std::filesystem;

namespace {

// Index files are small (a name and a file per tensor); this bounds what a hostile one costs.
constexpr std::uintmax_t kMaxIndexBytes = 256u << 20;

// Shard paths come from the index: only relative paths that stay below its directory, so a
// hostile index cannot point the reader at arbitrary files.
bool is_contained(const fs::path& rel) {
  if (rel.empty() || rel.is_absolute() || rel.has_root_name() || rel.has_root_directory()) return false;
  int depth = 0;
  for (const fs::path& part : rel.lexically_normal()) {
    if (part == "..") {
      if (--depth < 0) return false;
    } else if (part != ".") {
      ++depth;
    }
  }
  return depth > 0;
}

// For a model directory without the standard names: the safetensors files it does hold, if any,
// so the message can say which one to pass.
std::string other_weights(const fs::path& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors" || e.path().filename().string().ends_with(".safetensors.index.json"))
      found.push_back(e.path().filename().string());
  if (found.empty()) return "; expected a model directory with one of those, a .safetensors file or an index";
  std::sort(found.begin(), found.end());
  std::string list;
  for (std::size_t i = 0; i < found.size() && i < 3; ++i) list += (i ? ", " : "") + quote(found[i]);
  if (found.size() > 3) list += ", ...";
  return "; it has " + list + ": pass that file (or its index) instead of the directory";
}

}  // namespace

struct Checkpoint::Impl {
  std::string source;
  std::vector<std::string> names;
  std::unordered_map<std::string_view, std::size_t> shard_index;  // name -> shard; views into names
  std::vector<fs::path> shards;
  std::optional<std::uint64_t> total_size;
  Metadata metadata;
  mutable std::mutex mu;
  mutable std::vector<std::unique_ptr<SafetensorsFile>> open;

  std::size_t shard_no(std::string_view name) const {
    auto it = shard_index.find(name);
    if (it == shard_index.end()) fail(source, "checkpoint has no tensor named " + quote(name));
    return it->second;
  }
  const SafetensorsFile& file(std::size_t i) const {
    if (i >= shards.size()) fail(source, "shard " + std::to_string(i) + " out of range");
    std::lock_guard lock(mu);
    if (!open[i]) open[i] = std::make_unique<SafetensorsFile>(SafetensorsFile::open(shards[i]));
    return *open[i];
  }
};

Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

Checkpoint Checkpoint::open(const fs::path& path) {
  fs::path p = path;
  std::error_code ec;
  bool single_too = false;  // a directory holding both an index and model.safetensors
  if (fs::is_directory(p, ec)) {
    single_too = fs::exists(p / "model.safetensors", ec);
    if (fs::exists(p / "model.safetensors.index.json", ec))
      p /= "model.safetensors.index.json";
    else if (fs::exists(p / "model.safetensors", ec))
      p /= "model.safetensors";
    else
      fail(p.string(), "directory holds neither model.safetensors.index.json nor model.safetensors" + other_weights(p));
  }
  Checkpoint c;
  c.impl_ = std::make_unique<Impl>();
  Impl& s = *c.impl_;
  s.source = p.string();

  if (p.extension() != ".json") {
    // A single file: open it now, it is the only shard.
    s.shards.push_back(p);
    s.open.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(p)));
    s.names = s.open[0]->names();
    s.metadata = s.open[0]->metadata();
    for (const std::string& n : s.names) s.shard_index.emplace(n, 0);
    return c;
  }

  Json j =
      detail::parse_json(detail::read_text_file(p, "a checkpoint index (model.safetensors.index.json)", kMaxIndexBytes),
                         s.source, "index", 64);
  if (!j.is_object()) fail(s.source, "index is not a JSON object");
  auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object())
    fail(s.source,
         "not a checkpoint index: no \"weight_map\" object; expected a model directory (with "
         "model.safetensors or model.safetensors.index.json), a .safetensors file or an index");
  if (auto md = j.find("metadata"); md != j.end() && !md->is_null()) {
    if (!md->is_object()) fail(s.source, "index \"metadata\" is not an object");
    for (auto& [k, v] : md->items()) {
      if (k == "total_size") {
        if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
          fail(s.source, "index total_size " + v.dump() + " is not a non-negative integer");
        s.total_size = v.get<std::uint64_t>();
      } else {
        s.metadata.emplace(k, v.is_string() ? v.get<std::string>() : v.dump());
      }
    }
  }

  const fs::path dir = p.parent_path();
  std::map<std::string, std::size_t> file_no;
  s.names.reserve(wm->size());
  for (auto& [name, file] : wm->items()) {
    if (!file.is_string()) fail(s.source, "weight_map entry for " + quote(name) + " is not a file name");
    const std::string& f = file.get_ref<const std::string&>();
    auto [it, fresh] = file_no.emplace(f, s.shards.size());
    if (fresh) {
      if (!is_contained(fs::path(f)))
        fail(s.source,
             "shard " + quote(f) + " for tensor " + quote(name) + " is not a relative path inside the index directory");
      if (!f.ends_with(".safetensors"))
        fail(s.source, "weight_map maps tensor " + quote(name) + " to " + quote(f) +
                           ", which is not a .safetensors file (shards are named *.safetensors)");
      fs::path shard = dir / f;
      if (!fs::is_regular_file(shard, ec))
        fail(s.source, "tensor " + quote(name) + " maps to missing shard file " + quote(shard.string()));
      s.shards.push_back(std::move(shard));
    }
    s.names.push_back(name);
  }
  // Which of the two is the model? transformers loads model.safetensors, this reader the index.
  const fs::path single = (dir / "model.safetensors").lexically_normal();
  if (single_too &&
      std::none_of(s.shards.begin(), s.shards.end(), [&](const fs::path& f) { return f.lexically_normal() == single; }))
    fail(dir.string(),
         "holds both model.safetensors and model.safetensors.index.json, whose weight_map does not list it: "
         "transformers would load model.safetensors, other tools the index's shards. Delete the stale one, or "
         "pass the file you mean (the .safetensors file or the index) instead of the directory");
  // names no longer reallocates, so views into it are stable.
  std::size_t i = 0;
  for (auto& [name, file] : wm->items()) s.shard_index.emplace(s.names[i++], file_no.at(file.get<std::string>()));
  s.open.resize(s.shards.size());
  return c;
}

const std::vector<std::string>& Checkpoint::names() const { return impl_->names; }
bool Checkpoint::contains(std::string_view name) const { return impl_->shard_index.count(name) != 0; }
const std::vector<fs::path>& Checkpoint::shards() const { return impl_->shards; }
const fs::path& Checkpoint::shard_of(std::string_view name) const { return impl_->shards[impl_->shard_no(name)]; }
const SafetensorsFile& Checkpoint::shard(std::size_t i) const { return impl_->file(i); }
std::optional<std::uint64_t> Checkpoint::total_size() const { return impl_->total_size; }
const Metadata& Checkpoint::metadata() const { return impl_->metadata; }

const StTensor& Checkpoint::tensor(std::string_view name) const {
  const SafetensorsFile& f = impl_->file(impl_->shard_no(name));
  if (const StTensor* t = f.find(name)) return *t;
  fail(impl_->source,
       "shard " + quote(f.source()) + " does not contain tensor " + quote(name) + " that the index maps to it");
}

void Checkpoint::validate() const {
  const Impl& s = *impl_;
  std::vector<std::size_t> mapped(s.shards.size(), 0);
  for (const std::string& n : s.names) {
    (void)tensor(n);
    ++mapped[s.shard_no(n)];
  }
  // Every tensor found; a shard holding more than the index lists has tensors nobody would load.
  for (std::size_t i = 0; i < s.shards.size(); ++i) {
    const SafetensorsFile& f = s.file(i);
    if (f.size() == mapped[i]) continue;
    std::vector<std::string> extra;
    for (const StTensor& t : f.tensors())
      if (s.shard_index.count(t.name) == 0 || s.shard_no(t.name) != i) extra.push_back(quote(t.name));
    std::string list;
    for (std::size_t k = 0; k < extra.size() && k < 5; ++k) list += (k ? ", " : "") + extra[k];
    if (extra.size() > 5) list += ", ... (" + std::to_string(extra.size()) + " in all)";
    fail(s.source,
         "shard " + quote(f.source()) + " holds " + (extra.size() == 1 ? "tensor " : "tensors ") + list +
             " that the index does not map to it (its weight_map would drop them); fix the index or the shard");
  }
}

void Checkpoint::check_unchanged() const {
  std::lock_guard lock(impl_->mu);
  for (const auto& f : impl_->open)
    if (f) f->check_unchanged();
}

std::string shard_file_name(std::size_t i, std::size_t n) {
  if (i >= n) throw Error("shard " + std::to_string(i) + " of " + std::to_string(n));
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

void write_index(const fs::path& index_path, const std::vector<fs::path>& shards, const Metadata& extra) {
  const std::string src = index_path.string();
  // Relative paths mean relative to the working directory, as everywhere else.
  const fs::path dir = fs::absolute(index_path).lexically_normal().parent_path();
  std::map<std::string, std::string> weight_map;  // sorted by name, as Hugging Face writes it
  std::uint64_t total = 0;
  for (const fs::path& shard : shards) {
    fs::path rel = fs::absolute(shard).lexically_normal().lexically_relative(dir);
    if (!is_contained(rel)) fail(src, "shard " + quote(shard.string()) + " is not inside the index directory");
    SafetensorsFile f = SafetensorsFile::open(dir / rel);
    for (const StTensor& t : f.tensors()) {
      auto [it, fresh] = weight_map.emplace(t.name, rel.generic_string());
      if (!fresh)
        fail(src,
             "tensor " + quote(t.name) + " is in both " + quote(it->second) + " and " + quote(rel.generic_string()));
      total += t.data.size();
    }
  }
  Json md = Json::object();
  md["total_size"] = total;
  for (const auto& [k, v] : extra) {
    if (k == "total_size") fail(src, "extra metadata cannot override total_size");
    detail::append_new_key(md, k, v);
  }
  Json files = detail::object_with_room(weight_map.size());
  for (const auto& [n, f] : weight_map) detail::append_new_key(files, n, f);
  Json j = Json::object();
  j["metadata"] = std::move(md);
  j["weight_map"] = std::move(files);
  std::string text;
  try {
    text = j.dump(2) + "\n";
  } catch (const Json::exception& e) {
    fail(src, std::string("metadata is not valid UTF-8: ") + e.what());
  }
  detail::AtomicFile out(index_path);
  out.write(text);
  out.commit();
}

}  // namespace microscale::io
