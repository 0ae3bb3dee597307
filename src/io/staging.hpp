// The output directory of a streaming operation, built in a hidden sibling and moved into place
// only once complete.
#pragma once

#include <filesystem>
#include <string>

#include "io/model_dir.hpp"

namespace microscale::io::ck {

// The whole output is built in a hidden sibling `.<name>.tmp.<pid>` and moved into place at the
// end, swapped atomically with an existing directory (--force). A kill, a full disk or any error
// therefore leaves either the old result or the new one at `out`, never a mix; the staging
// directory is removed on errors (the CLI turns SIGINT/SIGTERM into one) and, after SIGKILL, by the
// next run. microscale refuses a leftover (by its name, and by a marker kept inside until commit);
// config.json is written last and deleted first, so loaders (which need it) find a leftover
// either complete or unloadable.
class Staging {
 public:
  // `in_dir` (may be empty) is refused as the output.
  Staging(const fs::path& in_dir, const fs::path& out, bool force);
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging();

  const fs::path& dir() const { return tmp_; }
  const fs::path& out() const { return out_; }

  // Moves the finished output into place: files of the old directory that are not part of a
  // checkpoint (the user's own) are carried over, then the two directories are swapped.
  void commit();

 private:
  std::string prefix() const;  // of this output's staging directories: ".<name>.tmp."
  std::string move_error(int err) const;
  // Staging directories of runs that were killed (their process is gone).
  void remove_dead_runs() const;

  fs::path out_, tmp_;
  bool replace_ = false, committed_ = false;
};

// Like open_input, but refuses the leftovers of a killed run: a staging directory (by its name,
// whatever state the kill left it in) or a directory holding the marker.
Input open_complete(const fs::path& path);

}  // namespace microscale::io::ck
