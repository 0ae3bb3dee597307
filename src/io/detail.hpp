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
// The whole of a small text file (a JSON document): refused unless require_regular_file accepts
// it, and when it is larger than `max_bytes`.
std::string read_text_file(const std::filesystem::path& path, const std::string& expected, std::uintmax_t max_bytes);

// A name as it appears in messages: JSON-quoted (control bytes escaped), long names shortened.
std::string quote(std::string_view s);

// Parses `text` as JSON in time linear in its size, rejecting duplicate keys in any object and
// nesting deeper than `max_depth` (headers and indexes are shallow, and this bounds work on hostile
// input). Objects keep the text's key order. `what` names the document in messages ("header").
Json parse_json(std::string_view text, const std::string& source, const char* what, int max_depth);

// Adds `key` to the end of `object` and returns its value. Json's operator[] and emplace search
// the keys first, one by one, so building an object of n keys with them takes n^2 / 2 string
// comparisons; callers use this instead where their keys are known to be distinct (from a map, or
// checked with a hash set) and there may be many.
Json& append_new_key(Json& object, std::string key, Json value);
// An empty object with room for `n` keys: when an object grows, its (const key, value) pairs are
// copied, not moved, so objects of many keys are sized up front.
Json object_with_room(std::size_t n);

// The header JSON for these entries, laid out back to back in order, padded with spaces to a
// multiple of 8 bytes. Validates names (unique, not "__metadata__") and sizes. Also returns
// each entry's byte size through `sizes` when non-null.
std::string build_header(const std::vector<StEntry>& entries, const Metadata& metadata, const std::string& source,
                         std::vector<std::uint64_t>* sizes = nullptr);

struct MappingGuard;

// A whole regular file mapped read-only, for its reader. Reading a page of it after another
// program truncated the file (rsync --inplace, a second download rewriting it) would raise SIGBUS
// and kill the process without a word. A process-wide handler, installed with the first mapping
// and passing other faults on to the handler it replaced, maps zero pages there instead and marks
// the mapping; check_unchanged() then throws. Code that reads the bytes (on any thread) calls it
// before it keeps anything computed from them.
class FileMapping {
 public:
  // Opens and maps `path`, named `source` in messages. An empty file is open but not mapped.
  FileMapping(const std::filesystem::path& path, std::string source);
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;
  ~FileMapping();

  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  // Throws an Error naming the file when it changed while mapped: a read found it truncated, or
  // its size or modification time differ from when it was opened (the file is kept open for this).
  void check_unchanged() const;

 private:
  std::string source_;
  int fd_ = -1;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::int64_t opened_size_ = 0, opened_mtime_ns_ = 0;
  MappingGuard* guard_ = nullptr;
};

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
  // pwrite at `offset`, leaving the sequential position alone: for files whose parts arrive in any
  // order (GGUF's tensor data).
  void write_at(std::uint64_t offset, std::span<const std::byte> bytes);
  void commit();
  void abort() noexcept;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::filesystem::path tmp_;
  int fd_ = -1;
};

}  // namespace microscale::io::detail
