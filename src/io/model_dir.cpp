// The model directory around a checkpoint: opening it with its config.json, copying its other
// files into an output, and matching module names against the user's patterns.
#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
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

// Whether `dir` holds safetensors weights (or their index) directly.
bool holds_weights(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    if (f.ends_with(".safetensors") || f.ends_with(".safetensors.index.json")) return true;
  }
  return false;
}

// Where the links of model directory `dir` may lead: into `dir` itself (links resolved), or, for a
// folder of a Hugging Face cache snapshot (models--<org>--<name>/snapshots/<revision>/...), into
// that repository, whose snapshot files are links into its blobs/ folder.
fs::path link_root(const fs::path& dir) {
  std::error_code ec;
  fs::path real = fs::canonical(dir, ec);
  if (ec) real = fs::absolute(dir).lexically_normal();
  for (fs::path p = real; p.has_relative_path(); p = p.parent_path()) {
    const fs::path snapshots = p.parent_path(), repo = snapshots.parent_path();
    if (snapshots.filename() == "snapshots" && repo.filename().string().starts_with("models--")) return repo;
  }
  return real;
}

// Copies the regular file `from` to `to` atomically with its permission bits. Opened without
// following a link (the caller resolved it) and without blocking (a FIFO swapped in is refused).
void copy_file_keeping_mode(const fs::path& from, const fs::path& to, std::vector<std::byte>& buf) {
  const int fd = ::open(from.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error(from.string() + ": cannot read: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) throw Error(from.string() + ": not a regular file any more");
  detail::AtomicFile dst(to, static_cast<unsigned>(st.st_mode & 0777));
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(from.string() + ": read error: " + std::strerror(errno));
    if (n == 0) break;
    dst.write(std::span(buf.data(), static_cast<std::size_t>(n)));
  }
  dst.commit();
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
  in.inputs = RunInputs(path, in.ck);
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
  std::vector<std::string> other_weights, models, links;
  std::error_code ec;
  const fs::path out_abs = fs::absolute(out).lexically_normal();
  const fs::path root = link_root(in_dir);
  std::vector<std::byte> buf(1 << 20);
  for (auto it = fs::recursive_directory_iterator(in_dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const fs::path rel = it->path().lexically_relative(in_dir);
    const std::string top = rel.begin()->string();
    fs::path from = it->path();
    if (it->is_symlink()) {
      // Copied by content only when the link stays in the model's folder (root): one that leads
      // out would publish whatever it points at (a key, another user's file).
      std::error_code lec;
      const fs::path target = fs::canonical(from, lec);
      if (lec || !detail::inside(root, target) || !fs::is_regular_file(target, lec)) {
        const fs::path to = fs::read_symlink(from, lec);
        links.push_back(rel.string() + " -> " + to.string());
        continue;
      }
      from = target;
    } else if (it->is_directory()) {
      // The output may sit inside the input; version-control and cache folders are not the model,
      // nor are staging directories (".<out>.tmp.<pid>", ".<out>.tmp.parts").
      std::error_code dec;
      if (fs::equivalent(it->path(), out_abs, dec) || top == ".git" || top == ".cache" ||
          rel.filename().string().find(".tmp.") != std::string::npos) {
        it.disable_recursion_pending();
      } else if (holds_weights(it->path())) {
        // Another model (an earlier output, say): its weights are not copied, so its
        // config.json without them would be a model that does not load.
        models.push_back(rel.string() + "/");
        it.disable_recursion_pending();
      }
      continue;
    }
    std::error_code fec;
    if (!fs::is_regular_file(from, fec) || is_checkpoint_file(rel)) continue;
    if (is_other_weights(rel)) {
      other_weights.push_back(rel.string());
      continue;
    }
    fs::create_directories((out / rel).parent_path());
    copy_file_keeping_mode(from, out / rel, buf);
  }
  if (ec) throw Error(in_dir.string() + ": cannot list: " + ec.message());
  std::vector<std::string> notes;
  auto note = [&](const std::string& what, std::vector<std::string>& list) {
    if (list.empty()) return;
    std::sort(list.begin(), list.end());
    std::string text;
    for (std::size_t i = 0; i < list.size() && i < 5; ++i) text += (i ? ", " : "") + list[i];
    if (list.size() > 5) text += ", ... (" + std::to_string(list.size()) + " in all)";
    notes.push_back("not copied (" + what + "): " + text);
  };
  note("other weight formats, which would be stale", other_weights);
  note("folders holding a model of their own, such as an earlier output", models);
  note("symbolic links that lead out of " + root.string() + ", to a folder or to nothing", links);
  return notes;
}

bool matches(const std::vector<std::string>& patterns, const std::string& module) {
  for (const std::string& p : patterns)
    if (::fnmatch(p.c_str(), module.c_str(), 0) == 0 || ::fnmatch(("*." + p).c_str(), module.c_str(), 0) == 0)
      return true;
  return false;
}

}  // namespace microscale::io::ck
