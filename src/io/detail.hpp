// Internals shared by the safetensors reader, writer, checkpoint code and the fuzz target.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "microscale/io.hpp"

namespace microscale::io::detail {

// Header objects keep their key order, so tensors with equal offsets list in header order and
// written indexes and headers come out in the order we build them.
using Json = nlohmann::ordered_json;

// Error whose message starts with the file (or label) it is about.
[[noreturn]] void fail(const std::string& source, const std::string& what);

// Refuses `path` unless it is a regular file (symlinks followed), before anything opens it: a FIFO
// would block the open forever, and a directory or device is no checkpoint. The message names the
// path, what it is, and `expected` ("a .safetensors file").
void require_regular_file(const std::filesystem::path& path, const std::string& expected);

// Where a file written at `path` lands: its directory with links resolved, and its own name (a
// link of that name is replaced, not followed).
std::filesystem::path landing(const std::filesystem::path& path);
// Whether `p` is `dir` or lies below it (both absolute and normal).
bool inside(const std::filesystem::path& dir, const std::filesystem::path& p);

// A name as it appears in messages: JSON-quoted (control bytes escaped), long names shortened.
std::string quote(std::string_view s);

// Parses `text` as JSON, rejecting duplicate keys in any object and nesting deeper than
// `max_depth` (headers and indexes are shallow, and this bounds work on hostile input).
// `what` names the document in messages ("header", "index").
Json parse_json(std::string_view text, const std::string& source, const char* what, int max_depth);

// The header JSON for these entries, laid out back to back in order, padded with spaces to a
// multiple of 8 bytes. Validates names (unique, not "__metadata__") and sizes. Also returns
// each entry's byte size through `sizes` when non-null.
std::string build_header(const std::vector<StEntry>& entries, const Metadata& metadata, const std::string& source,
                         std::vector<std::uint64_t>* sizes = nullptr);

// A file written to `<path>.tmp.<pid>` and renamed onto `path` by commit(); the destructor (or
// abort()) removes the temporary file when commit() did not happen. Its permission bits are
// `mode` (a copy keeps its source's), else 0644 less the umask.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path, std::optional<unsigned> mode = std::nullopt);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  void write(std::span<const std::byte> bytes);
  void write(std::string_view s) { write(std::as_bytes(std::span(s.data(), s.size()))); }
  void commit();
  void abort() noexcept;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::filesystem::path tmp_;
  int fd_ = -1;
};

}  // namespace microscale::io::detail
