// The files the CLI writes (--csv, --svg, --errors-csv): their paths are checked before any work
// starts, against each other, the output directory and the run's inputs, and they are written
// atomically, so a failed run leaves neither a partial file nor a stray one that looks like a
// result, and never replaces an input.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "microscale/checkpoint.hpp"
#include "microscale/microscale.hpp"

namespace microscale::cli {

// Throws microscale::Error naming `option` unless `path` can be written: its directory exists and
// is writable, and `path` is not a directory nor an existing non-regular file (a rename onto
// /dev/null would replace the device).
inline void check_output_path(const std::string& option, const std::string& path) {
  namespace fs = std::filesystem;
  const std::string what = option + " '" + path + "'";
  if (path.empty()) throw Error(option + " needs a file name");
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::is_directory(st)) throw Error(what + " is a directory; give a file name");
  if (fs::exists(st) && !fs::is_regular_file(st))
    throw Error(what + " exists and is not a regular file (use --no-files to write no files)");
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir, ec)) throw Error(what + ": directory '" + dir.string() + "' does not exist");
  if (::access(dir.c_str(), W_OK) != 0)
    throw Error(what + ": directory '" + dir.string() + "' is not writable (" + std::strerror(errno) + ")");
}

struct ReportPath {
  std::string option;  // "--errors-csv"
  std::string path;
};

// check_output_path for each report, then: none is one of the run's `inputs` or lies in its model
// directory, none is the output directory `out_dir` (when given), and no two name the same file.
inline void check_report_paths(const std::vector<ReportPath>& reports, const io::RunInputs& inputs,
                               const std::string& out_dir = {}) {
  namespace fs = std::filesystem;
  // Where a path points, links resolved; "out/" and "out" are one place.
  auto place = [](const std::string& p) {
    fs::path a = fs::weakly_canonical(fs::absolute(p));
    return a.filename().empty() ? a.parent_path() : a;
  };
  for (std::size_t i = 0; i < reports.size(); ++i) {
    const ReportPath& r = reports[i];
    check_output_path(r.option, r.path);
    inputs.check_output_file(r.option, r.path);
    if (!out_dir.empty() && place(r.path) == place(out_dir))
      throw Error(r.option + " '" + r.path + "' is the output directory (-o); give the report its own file name");
    for (std::size_t j = 0; j < i; ++j)
      if (place(r.path) == place(reports[j].path))
        throw Error(reports[j].option + " and " + r.option + " name the same file '" + r.path + "'");
  }
}

struct OutputFile {
  std::string option;  // the argument that named it, for messages
  std::string path;
  std::string bytes;
};

// Writes each file to `<path>.tmp.<pid>` in its own directory (fsynced), then renames them all into
// place. If any write fails, every temporary file is removed and no output is touched.
inline void write_outputs(const std::vector<OutputFile>& files) {
  std::vector<std::string> temps;
  auto fail = [&](const OutputFile& f, const std::string& why) {
    for (const std::string& t : temps) ::unlink(t.c_str());
    throw Error("cannot write " + f.option + " file '" + f.path + "': " + why);
  };
  for (const OutputFile& f : files) {
    const std::string tmp = f.path + ".tmp." + std::to_string(::getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) fail(f, std::strerror(errno));
    temps.push_back(tmp);
    std::size_t done = 0;
    while (done < f.bytes.size()) {
      const ssize_t n = ::write(fd, f.bytes.data() + done, f.bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int e = errno;
        ::close(fd);
        fail(f, std::strerror(e));
      }
      done += static_cast<std::size_t>(n);
    }
    const bool synced = ::fsync(fd) == 0;
    const int sync_errno = errno;
    if (::close(fd) != 0 || !synced) fail(f, std::strerror(synced ? errno : sync_errno));
  }
  for (std::size_t i = 0; i < files.size(); ++i)
    if (::rename(temps[i].c_str(), files[i].path.c_str()) != 0) {
      const int e = errno;
      temps.erase(temps.begin(), temps.begin() + static_cast<std::ptrdiff_t>(i));
      fail(files[i], std::strerror(e));
    }
}

}  // namespace microscale::cli
