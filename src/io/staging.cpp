// The staging directory of quantize / convert / dequantize / save_checkpoint (staging.hpp).
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "io/layer.hpp"
#include "io/staging.hpp"

namespace microscale::io::ck {

namespace {

// Present in a staging directory until it is complete: microscale refuses a directory holding it.
constexpr const char* kIncomplete = ".microscale-incomplete";

// The name Staging gives its directory: `.<name>.tmp.<pid>`, or with ".old" while it holds the
// output being replaced.
bool staging_name(const std::string& f) {
  const std::size_t t = f.find(".tmp.");
  return !f.empty() && f[0] == '.' && t != std::string::npos && t + 5 < f.size() &&
         std::isdigit(static_cast<unsigned char>(f[t + 5]));
}

bool process_alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH); }

bool holds_checkpoint(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename() == "config.json" || e.path().filename().string().ends_with(".safetensors")) return true;
  return false;
}

bool is_checkpoint_file(const fs::path& name) {
  const std::string f = name.string();
  return f.ends_with(".safetensors") || f.ends_with(".safetensors.index.json") || f == "config.json" ||
         f == "hf_quant_config.json" || f == kIncomplete;
}

// Hard links (copies where links fail) of what `from` has and `to` lacks; at the top level,
// checkpoint files of the old output are left behind, as are temporary files anywhere.
void carry_over(const fs::path& from, const fs::path& to, bool top) {
  for (const auto& e : fs::directory_iterator(from)) {
    const fs::path name = e.path().filename();
    const fs::path dst = to / name;
    if ((top && is_checkpoint_file(name)) || name.string().find(".tmp.") != std::string::npos) continue;
    if (e.is_directory() && !e.is_symlink()) {
      fs::create_directories(dst);
      carry_over(e.path(), dst, false);
      continue;
    }
    std::error_code ec;
    if (fs::exists(fs::symlink_status(dst))) continue;  // written by this run
    if (e.is_symlink()) {
      fs::copy_symlink(e.path(), dst);
      continue;
    }
    fs::create_hard_link(e.path(), dst, ec);
    if (ec) fs::copy_file(e.path(), dst);
  }
}

}  // namespace

Staging::Staging(const fs::path& in_dir, const fs::path& out, bool force) {
  std::error_code ec;
  out_ = fs::absolute(out).lexically_normal();
  if (out_.filename().empty()) out_ = out_.parent_path();  // "out/" names "out"
  if (fs::is_symlink(out_, ec)) {                          // replace the target, keep the link
    out_ = fs::canonical(out_, ec);
    if (ec) throw Error("output " + out.string() + " is a symbolic link to nothing: " + ec.message());
  }
  if (out_.filename().empty())
    throw Error("output directory " + out.string() + " is a file system root; choose another");
  if (fs::exists(out_, ec)) {
    if (!fs::is_directory(out_, ec)) throw Error("output " + out.string() + " exists and is not a directory");
    if (!in_dir.empty() && fs::equivalent(in_dir, out_, ec))
      throw Error("output directory " + out.string() + " is the input directory; choose another");
    if (!fs::is_empty(out_, ec)) {
      if (!force) throw Error("output directory " + out.string() + " is not empty (use --force to overwrite)");
      // The whole directory is replaced: only ever a model directory, never a home or a project.
      if (!holds_checkpoint(out_))
        throw Error("output directory " + out.string() +
                    " is not empty and holds no checkpoint (no config.json or "
                    ".safetensors file); --force replaces only a previous output: choose a new directory");
    }
    replace_ = true;
  }
  const fs::path parent = out_.parent_path();
  fs::create_directories(parent, ec);
  if (ec) throw Error("cannot create output directory " + out.string() + ": " + ec.message());
  remove_dead_runs();
  tmp_ = parent / (prefix() + std::to_string(::getpid()));
  fs::remove_all(tmp_, ec);
  if (!fs::create_directory(tmp_, ec) || ec)
    throw Error("cannot create output directory " + tmp_.string() + ": " + (ec ? ec.message() : "it exists"));
  write_text_atomic(tmp_ / kIncomplete, "microscale is writing " + out_.string() + "\n");
}

Staging::~Staging() {
  std::error_code ec;
  if (!committed_) fs::remove_all(tmp_, ec);
}

void Staging::commit() {
  if (replace_) {
    carry_over(out_, tmp_, true);
    std::error_code ec;
    fs::permissions(tmp_, fs::status(out_).permissions(), ec);
  }
  fs::remove(tmp_ / kIncomplete);
  if (!replace_) {
    if (::rename(tmp_.c_str(), out_.c_str()) != 0) throw Error(move_error(errno));
  } else if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, out_.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno != EINVAL && errno != ENOSYS) throw Error(move_error(errno));
    // No atomic exchange on this file system: move the old one aside first (the output is
    // briefly absent, never mixed).
    const fs::path aside = tmp_.string() + ".old";
    if (::rename(out_.c_str(), aside.c_str()) != 0) throw Error(move_error(errno));
    if (::rename(tmp_.c_str(), out_.c_str()) != 0) {
      const int err = errno;
      (void)::rename(aside.c_str(), out_.c_str());
      throw Error(move_error(err));
    }
    committed_ = true;
    std::error_code ec;
    fs::remove(aside / "config.json", ec);
    fs::remove_all(aside, ec);
    return;
  }
  committed_ = true;
  // After the exchange the staging directory holds the old output: its config.json goes first,
  // so that a kill while deleting the rest leaves nothing loadable.
  std::error_code ec;
  fs::remove(tmp_ / "config.json", ec);
  fs::remove_all(tmp_, ec);
}

std::string Staging::prefix() const {
  // Appended rather than "." + name + ...: GCC 12 -O3 warns (-Wrestrict) about that inlined here.
  std::string p = ".";
  p += out_.filename().string();
  p += ".tmp.";
  return p;
}

std::string Staging::move_error(int err) const {
  return "cannot move the finished output " + tmp_.string() + " to " + out_.string() + ": " + std::strerror(err);
}

void Staging::remove_dead_runs() const {
  std::error_code ec;
  const std::string pre = prefix();
  for (const auto& e : fs::directory_iterator(out_.parent_path(), ec)) {
    const std::string f = e.path().filename().string();
    if (f.rfind(pre, 0) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(f.c_str() + pre.size(), &end, 10);
    if (end != f.c_str() + pre.size() && !process_alive(pid)) fs::remove_all(e.path(), ec);
  }
}

Input open_complete(const fs::path& path) {
  std::error_code ec;
  fs::path dir = fs::absolute(fs::is_directory(path, ec)   ? path
                              : path.parent_path().empty() ? fs::path(".")
                                                           : path.parent_path());
  dir = dir.lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  if (staging_name(dir.filename().string()) || fs::exists(dir / kIncomplete, ec))
    throw Error(dir.string() +
                " is an unfinished microscale output (the run writing it was stopped); delete it "
                "and run the command again");
  return open_input(path);
}

}  // namespace microscale::io::ck
