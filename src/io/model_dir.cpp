// The model directory around a checkpoint: opening it with its config.json, copying its other
// files into an output, and matching module names against the user's patterns.
#include <fnmatch.h>

#include <fstream>
#include <sstream>

#include "io/layer.hpp"
#include "io/model_dir.hpp"

namespace microscale::io::ck {

namespace {

constexpr std::uintmax_t kMaxConfigBytes = 64u << 20;

bool is_checkpoint_file(const fs::path& rel) {
  const std::string f = rel.filename().string();
  return f.ends_with(".safetensors") || f.ends_with(".safetensors.index.json") ||
         (rel.parent_path().empty() && (f == "config.json" || f == "hf_quant_config.json"));
}

// Other serializations of the same weights: copying them would ship the unquantized model (or
// the old quantization) next to the new one.
bool is_other_weights(const fs::path& rel) {
  const std::string f = rel.filename().string();
  for (const char* ext : {".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".npz"})
    if (f.ends_with(ext)) return true;
  return f.find(".tmp.") != std::string::npos;  // a crashed writer's leftovers
}

}  // namespace

Input open_input(const fs::path& path) {
  static const std::string expected =
      "expected a model directory (holding model.safetensors or model.safetensors.index.json with its shards), "
      "a .safetensors file or a model.safetensors.index.json";
  if (path.empty()) throw Error("no model path given; " + expected);
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(path.string() + ": no such file or directory; " + expected);
  const bool dir = fs::is_directory(path, ec);
  if (!dir) {
    // The model's config.json parses as JSON, so without this it would be read as an index.
    if (path.filename() == "config.json" || path.filename() == "hf_quant_config.json")
      throw Error(path.string() + " is the model's configuration, not its weights; pass the directory holding it (" +
                  expected + ")");
    detail::require_regular_file(path, expected);
  }
  Input in{dir ? path : (path.has_parent_path() ? path.parent_path() : fs::path(".")),
           Checkpoint::open(path),
           nullptr,
           false,
           {},
           {}};
  in.indexed = dir ? fs::exists(path / "model.safetensors.index.json", ec) : path.extension() == ".json";
  in.index_name = dir ? fs::path("model.safetensors.index.json") : path.filename();
  // The index and its shards must agree: a tensor the weight_map leaves out would be dropped from
  // every output, one it names but its shard lacks would fail half-way through writing.
  if (in.indexed) in.ck.validate();
  const fs::path base = fs::absolute(in.dir).lexically_normal();
  for (const fs::path& s : in.ck.shards())
    in.shard_rel.push_back(fs::absolute(s).lexically_normal().lexically_relative(base));
  const fs::path cfg = in.dir / "config.json";
  if (fs::exists(cfg, ec)) {
    detail::require_regular_file(cfg, "the model's config.json");
    if (fs::file_size(cfg, ec) > kMaxConfigBytes) throw Error(cfg.string() + ": larger than 64 MiB");
    std::ifstream f(cfg, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    in.config = detail::parse_json(ss.str(), cfg.string(), "config.json", 256);
    if (!in.config.is_object()) throw Error(cfg.string() + ": not a JSON object");
  }
  return in;
}

void write_text_atomic(const fs::path& path, const std::string& text) {
  detail::AtomicFile f(path);
  f.write(text);
  f.commit();
}

std::vector<std::string> copy_other_files(const fs::path& in_dir, const fs::path& out) {
  std::vector<std::string> skipped;
  std::error_code ec;
  const fs::path out_abs = fs::absolute(out).lexically_normal();
  std::vector<char> buf(1 << 20);
  for (auto it = fs::recursive_directory_iterator(in_dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const fs::path rel = it->path().lexically_relative(in_dir);
    const std::string top = rel.begin()->string();
    if (it->is_directory()) {
      // The output may sit inside the input; version-control and cache folders are not the model.
      if (fs::equivalent(it->path(), out_abs, ec) || top == ".git" || top == ".cache") it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file() || is_checkpoint_file(rel)) continue;
    if (is_other_weights(rel)) {
      skipped.push_back(rel.string());
      continue;
    }
    fs::create_directories((out / rel).parent_path());
    std::ifstream src(it->path(), std::ios::binary);
    if (!src) throw Error(it->path().string() + ": cannot read");
    detail::AtomicFile dst(out / rel);
    while (src) {
      src.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      dst.write(std::as_bytes(std::span(buf.data(), static_cast<std::size_t>(src.gcount()))));
    }
    if (src.bad()) throw Error(it->path().string() + ": read error");
    dst.commit();
  }
  if (ec) throw Error(in_dir.string() + ": cannot list: " + ec.message());
  std::vector<std::string> notes;
  if (!skipped.empty()) {
    std::string list;
    for (std::size_t i = 0; i < skipped.size() && i < 5; ++i) list += (i ? ", " : "") + skipped[i];
    if (skipped.size() > 5) list += ", ...";
    notes.push_back("not copied (other weight formats, which would be stale): " + list);
  }
  return notes;
}

bool matches(const std::vector<std::string>& patterns, const std::string& module) {
  for (const std::string& p : patterns)
    if (::fnmatch(p.c_str(), module.c_str(), 0) == 0 || ::fnmatch(("*." + p).c_str(), module.c_str(), 0) == 0)
      return true;
  return false;
}

}  // namespace microscale::io::ck
