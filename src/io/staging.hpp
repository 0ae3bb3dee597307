// The output directory of a streaming operation, built in a hidden sibling and moved into place
// only once complete.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "io/model_dir.hpp"
#include "microscale/checkpoint.hpp"

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
  // Refuses an `out` that is or holds one of `inputs` (RunInputs::check_output_dir), and one that
  // a split run's parts are still writing (PartStaging).
  Staging(const RunInputs& inputs, const fs::path& out, bool force);
  // Takes over `parts`, the directory of a split run whose parts are all done, as this process's
  // staging directory (by renaming it, so exactly one process gets it); null when another did.
  static std::unique_ptr<Staging> claim(const RunInputs& inputs, const fs::path& out, bool force,
                                        const fs::path& parts);
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

  Staging(const RunInputs& inputs, const fs::path& out, bool force, bool create);

  fs::path out_, tmp_;
  bool replace_ = false, committed_ = false;
};

// The staging directory the parts of a split run share (Part, checkpoint.hpp):
// `.<name>.tmp.parts` next to the output, holding the parts' shards, the plan every part must
// agree on and a marker per finished part. It is never removed on errors (other parts may be
// running): it stays, refused as an input and as anyone else's output, until the failed parts are
// run again or it is deleted.
class PartStaging {
 public:
  // Creates or joins it; refuses parts started with another plan (source layout, options, count).
  // `out` is checked as Staging checks it.
  PartStaging(const RunInputs& inputs, const fs::path& out, bool force, Part part, const Json& plan);

  const fs::path& dir() const { return dir_; }
  // Marks this part done. Returns the staging directory to finish and commit when every part is
  // done and this process took it over; null otherwise (another part publishes the output).
  std::unique_ptr<Staging> done();

 private:
  RunInputs inputs_;
  fs::path out_, dir_;
  bool force_;
  Part part_;
};

// Like open_input, but refuses the leftovers of a killed run: a staging directory (by its name,
// whatever state the kill left it in) or a directory holding the marker.
Input open_complete(const fs::path& path);

}  // namespace microscale::io::ck
