// What a run reads, and the check that nothing it writes lands on it (RunInputs, checkpoint.hpp).
#include <sys/stat.h>

#include "io/detail.hpp"
#include "microscale/checkpoint.hpp"

namespace microscale::io {

namespace fs = std::filesystem;

namespace {

struct FileId {
  std::uint64_t dev = 0, ino = 0;
  bool operator==(const FileId&) const = default;
};

// The identity of the file `p` names (links followed): two names of one file share it.
std::optional<FileId> file_id(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return std::nullopt;
  return FileId{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
}

}  // namespace

namespace detail {

fs::path landing(const fs::path& path) {
  fs::path abs = fs::absolute(path).lexically_normal();
  if (abs.filename().empty() && abs.has_relative_path()) abs = abs.parent_path();  // "out/" names "out"
  std::error_code ec;
  fs::path dir = fs::weakly_canonical(abs.parent_path(), ec);
  if (ec) dir = abs.parent_path();
  return dir / abs.filename();
}

bool inside(const fs::path& dir, const fs::path& p) {
  const fs::path rel = p.lexically_relative(dir);
  return !rel.empty() && *rel.begin() != "..";
}

}  // namespace detail

RunInputs::RunInputs(const fs::path& model) : RunInputs(model, Checkpoint::open(model)) {}

RunInputs::RunInputs(const fs::path& model, const Checkpoint& ck) {
  std::error_code ec;
  const bool is_dir = fs::is_directory(model, ec);
  const bool index = !is_dir && model.extension() == ".json";
  const fs::path base = is_dir ? model : model.has_parent_path() ? model.parent_path() : fs::path(".");
  if (is_dir || index) {
    dir_ = fs::canonical(base, ec);
    if (ec) dir_ = fs::absolute(base).lexically_normal();
    dir_name_ = base.string();
  }
  for (const fs::path& s : ck.shards()) add_file("shard '" + s.string() + "'", s);
  const fs::path index_file = index ? model : base / "model.safetensors.index.json";
  if ((is_dir || index) && fs::exists(index_file, ec)) add_file("index '" + index_file.string() + "'", index_file);
  // The converters read config.json and hf_quant_config.json beside a single file too.
  for (const char* cfg : {"config.json", "hf_quant_config.json"})
    if (fs::exists(base / cfg, ec)) add_file(std::string(cfg) + " '" + (base / cfg).string() + "'", base / cfg);
}

void RunInputs::add(const std::string& option, const fs::path& file) {
  add_file(option + " file '" + file.string() + "'", file);
}

void RunInputs::add_file(std::string what, const fs::path& file) {
  const std::optional<FileId> id = file_id(file);
  if (id) files_.push_back({std::move(what), file, id->dev, id->ino});
}

void RunInputs::check_output_file(const std::string& option, const fs::path& path) const {
  const std::string what = option + " '" + path.string() + "'";
  if (const std::optional<FileId> id = file_id(path))
    for (const File& f : files_)
      if (f.dev == id->dev && f.ino == id->ino)
        throw Error(what + " is the " + f.what + ", which this run reads: writing it would destroy the input; " +
                    "choose another file");
  if (!dir_.empty() && detail::inside(dir_, detail::landing(path)))
    throw Error(what + " is inside the model directory '" + dir_name_ +
                "', which this run reads (and copies into outputs): choose a file outside it");
}

void RunInputs::check_output_dir(const fs::path& dir) const {
  const std::string what = "output directory " + dir.string();
  const std::optional<FileId> id = file_id(dir);
  if (!dir_.empty() && id && id == file_id(dir_)) throw Error(what + " is the input directory; choose another");
  // The directory replaced: a link's target (the link itself is kept).
  std::error_code ec;
  fs::path out = fs::weakly_canonical(fs::absolute(dir), ec);
  if (out.filename().empty()) out = out.parent_path();
  // Replacing `dir` deletes what it holds (checkpoint files are not carried over).
  if (!dir_.empty() && detail::inside(out, dir_))
    throw Error(what + " holds the model directory '" + dir_name_ + "', which this run reads; choose another");
  for (const File& f : files_) {
    const fs::path target = fs::canonical(f.path, ec);
    if (detail::inside(out, detail::landing(f.path)) || (!ec && detail::inside(out, target)))
      throw Error(what + " holds the " + f.what + ", which this run reads; choose another output directory");
  }
}

}  // namespace microscale::io
