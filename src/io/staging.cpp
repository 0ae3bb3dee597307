// The staging directory of quantize / convert / dequantize / save_checkpoint (staging.hpp).
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

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

// The output as it will be written, checked: not a file, not the input, and (unless `force`) empty;
// `replace` says whether a directory is there to be swapped out.
fs::path checked_output(const RunInputs& inputs, const fs::path& out, bool force, bool& replace) {
  std::error_code ec;
  // absolute("") is the working directory, which --force would replace.
  if (out.empty()) throw Error("the output directory is an empty path; name the directory to write");
  fs::path o = fs::absolute(out).lexically_normal();
  if (o.filename().empty()) o = o.parent_path();  // "out/" names "out"
  if (fs::is_symlink(o, ec)) {                    // replace the target, keep the link
    o = fs::canonical(o, ec);
    if (ec) throw Error("output " + out.string() + " is a symbolic link to nothing: " + ec.message());
  }
  if (o.filename().empty()) throw Error("output directory " + out.string() + " is a file system root; choose another");
  replace = false;
  if (fs::exists(o, ec)) {
    if (!fs::is_directory(o, ec)) throw Error("output " + out.string() + " exists and is not a directory");
    inputs.check_output_dir(out);
    if (!fs::is_empty(o, ec)) {
      if (!force) throw Error("output directory " + out.string() + " is not empty (use --force to overwrite)");
      // The whole directory is replaced: only ever a model directory, never a home or a project.
      if (!holds_checkpoint(o))
        throw Error("output directory " + out.string() +
                    " is not empty and holds no checkpoint (no config.json or "
                    ".safetensors file); --force replaces only a previous output: choose a new directory");
    }
    replace = true;
  }
  fs::create_directories(o.parent_path(), ec);
  if (ec) throw Error("cannot create output directory " + out.string() + ": " + ec.message());
  return o;
}

// The split run's files in its staging directory: the plan and one marker per finished part.
constexpr const char* kPlan = ".microscale-parts.json";
fs::path parts_dir(const fs::path& out) {
  // Appended rather than "." + name: g++ 12 on aarch64 reports a false -Wrestrict for the latter.
  std::string name = ".";
  name += out.filename().string();
  name += ".tmp.parts";
  return out.parent_path() / name;
}
constexpr std::string_view kDonePrefix = ".microscale-part-", kDoneSuffix = "-done";
fs::path done_marker(const fs::path& dir, int index) {
  return dir / (std::string(kDonePrefix) + std::to_string(index) + std::string(kDoneSuffix));
}

// The parts of `count` marked done in `dir`, from its listing: the work is bounded by the files
// there, not by the part count, which may be anything up to INT_MAX.
std::set<int> done_parts(const fs::path& dir, int count) {
  std::set<int> done;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    if (!f.starts_with(kDonePrefix) || !f.ends_with(kDoneSuffix)) continue;
    const std::string digits = f.substr(kDonePrefix.size(), f.size() - kDonePrefix.size() - kDoneSuffix.size());
    int i = -1;
    const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), i);
    if (err == std::errc() && end == digits.data() + digits.size() && std::to_string(i) == digits && i >= 0 &&
        i < count)
      done.insert(i);
  }
  return done;
}

// "parts 0, 2 of 3 are done" from what a split run's staging directory holds.
std::string parts_progress(const fs::path& dir) {
  std::int64_t count = 0;
  if (std::ifstream f(dir / kPlan); f) {
    std::ostringstream ss;
    ss << f.rdbuf();
    try {
      const Json plan = detail::parse_json(ss.str(), (dir / kPlan).string(), "plan", 8);
      if (const auto p = plan.find("parts"); p != plan.end() && p->is_number_integer()) count = p->get<std::int64_t>();
    } catch (const std::exception&) {
      count = 0;
    }
  }
  if (count < 1 || count > std::numeric_limits<int>::max()) return "its plan is missing";
  const std::set<int> done = done_parts(dir, static_cast<int>(count));
  std::string list;
  for (const int i : done) list += (list.empty() ? "" : ", ") + std::to_string(i);
  const std::size_t n = done.size();
  return n == 0 ? "none of its " + std::to_string(count) + " parts is done"
                : "part" + std::string(n > 1 ? "s " : " ") + list + " of " + std::to_string(count) +
                      (n > 1 ? " are" : " is") + " done";
}

void refuse_unfinished_parts(const fs::path& out) {
  std::error_code ec;
  const fs::path dir = parts_dir(out);
  if (!fs::exists(fs::symlink_status(dir, ec))) return;
  throw Error("a split run (--part) writing " + out.string() + " is unfinished (" + parts_progress(dir) + ", in " +
              dir.string() + "): run its missing parts again (the same command with their --part), or delete " +
              dir.string() + " to start over");
}

}  // namespace

Staging::Staging(const RunInputs& inputs, const fs::path& out, bool force) : Staging(inputs, out, force, true) {}

Staging::Staging(const RunInputs& inputs, const fs::path& out, bool force, bool create) {
  out_ = checked_output(inputs, out, force, replace_);
  tmp_ = out_.parent_path() / (prefix() + std::to_string(::getpid()));
  // Taking over a split run's directory, nothing is removed: the parts may have run on other
  // machines, whose process ids say nothing here.
  if (!create) return;
  refuse_unfinished_parts(out_);
  remove_dead_runs();
  std::error_code ec;
  fs::remove_all(tmp_, ec);
  if (!fs::create_directory(tmp_, ec) || ec)
    throw Error("cannot create output directory " + tmp_.string() + ": " + (ec ? ec.message() : "it exists"));
  write_text_atomic(tmp_ / kIncomplete, "microscale is writing " + out_.string() + "\n");
}

std::unique_ptr<Staging> Staging::claim(const RunInputs& inputs, const fs::path& out, bool force,
                                        const fs::path& parts) {
  std::unique_ptr<Staging> st(new Staging(inputs, out, force, false));
  if (::rename(parts.c_str(), st->tmp_.c_str()) == 0) return st;
  const int err = errno;
  st->committed_ = true;              // whatever is at tmp_ is not ours to remove
  if (err == ENOENT) return nullptr;  // another part took it
  throw Error("cannot move " + parts.string() + " to " + st->tmp_.string() + ": " + std::strerror(err));
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

PartStaging::PartStaging(const RunInputs& inputs, const fs::path& out, bool force, Part part, const Json& plan)
    : inputs_(inputs), force_(force), part_(part) {
  bool replace = false;
  out_ = checked_output(inputs, out, force, replace);
  dir_ = parts_dir(out_);
  std::error_code ec;
  fs::create_directory(dir_, ec);
  if (ec || !fs::is_directory(dir_, ec))
    throw Error("cannot create " + dir_.string() +
                ", the staging directory of a split run: " + (ec ? ec.message() : "a file of that name is in the way"));
  // Written by every part at once, maybe with equal process ids (containers): a plain file, not
  // write_text_atomic's pid-named temporary.
  std::ofstream(dir_ / kIncomplete) << "microscale parts are writing " << out_.string() << "\n";
  if (!fs::exists(dir_ / kIncomplete, ec)) throw Error("cannot write in " + dir_.string());
  // The first part records the plan (link() creates it only where it is absent, atomically);
  // every other part must agree with it.
  // Named ".tmp." like every temporary file, so that one a kill leaves is never published.
  const fs::path mine = dir_ / (kPlan + std::string(".tmp.part") + std::to_string(part.index));
  write_text_atomic(mine, plan.dump(1) + "\n");
  const int linked = ::link(mine.c_str(), (dir_ / kPlan).c_str()), err = errno;
  fs::remove(mine, ec);
  if (linked != 0 && err != EEXIST) throw Error("cannot write " + (dir_ / kPlan).string() + ": " + std::strerror(err));
  std::ifstream f(dir_ / kPlan);
  std::ostringstream ss;
  ss << f.rdbuf();
  const Json have = detail::parse_json(ss.str(), (dir_ / kPlan).string(), "plan", 8);
  if (have != plan) {
    std::string what;
    if (have.value("parts", 0) != plan.value("parts", 0))
      what = "--part .../" + std::to_string(have.value("parts", 0)) + " (this one is .../" +
             std::to_string(part.count) + ")";
    else if (have.value("source", "") != plan.value("source", ""))
      what = "another source checkpoint (its files differ from this one's)";
    else
      what = "other options";
    throw Error(dir_.string() + " holds parts of a split run of " + out_.string() + " started with " + what +
                ": run every part with the same source, options and part count, or delete " + dir_.string() +
                " to start over");
  }
  fs::remove(done_marker(dir_, part.index), ec);  // a part run again is done only once it finishes again
}

std::unique_ptr<Staging> PartStaging::done() {
  write_text_atomic(done_marker(dir_, part_.index), "done\n");
  // Whoever marks itself done last sees every marker; several may, and claim() picks one.
  if (done_parts(dir_, part_.count).size() < static_cast<std::size_t>(part_.count)) return nullptr;
  std::unique_ptr<Staging> st = Staging::claim(inputs_, out_, force_, dir_);
  if (!st) return nullptr;
  std::error_code ec;
  fs::remove(st->dir() / kPlan, ec);
  for (const int i : done_parts(st->dir(), part_.count)) fs::remove(done_marker(st->dir(), i), ec);
  return st;
}

}  // namespace microscale::io::ck
