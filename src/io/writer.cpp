// safetensors writer: header first, then tensor data streamed in declaration order, published by
// an atomic rename so readers never see a partial file.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "io/detail.hpp"

namespace microscale::io {

using detail::fail;
using detail::quote;

namespace detail {

namespace {
std::string sys_error(const char* op) { return std::string(op) + ": " + std::strerror(errno); }
}  // namespace

AtomicFile::AtomicFile(std::filesystem::path path, std::optional<unsigned> mode) : path_(std::move(path)) {
  // Same directory as the target so rename() cannot cross file systems.
  tmp_ = path_;
  tmp_ += ".tmp." + std::to_string(::getpid());
  // O_EXCL: a leftover with our pid is another writer of this process (or a crashed run whose pid
  // was reused); never clobber it, say which file is in the way.
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode ? *mode & 0777 : 0644);
  if (fd_ < 0) fail(tmp_.string(), sys_error("cannot create temporary file"));
  // Created with `mode` already (never more open than it), then set exactly: the umask may have cut it.
  if (mode && ::fchmod(fd_, static_cast<mode_t>(*mode & 0777)) != 0) {
    const std::string msg = sys_error("cannot set the permissions");
    abort();
    fail(tmp_.string(), msg);
  }
}

AtomicFile::~AtomicFile() { abort(); }

void AtomicFile::abort() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(std::span<const std::byte> bytes) {
  if (fd_ < 0) fail(path_.string(), "write after the file was closed");
  const std::byte* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    // Bounded chunks: Linux writes at most ~2 GiB per call anyway.
    ssize_t w = ::write(fd_, p, std::min<std::size_t>(left, std::size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      std::string msg = sys_error("write failed");
      abort();
      fail(tmp_.string(), msg);
    }
    p += w;
    left -= static_cast<std::size_t>(w);
  }
}

void AtomicFile::write_at(std::uint64_t offset, std::span<const std::byte> bytes) {
  if (fd_ < 0) fail(path_.string(), "write after the file was closed");
  const std::byte* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    ssize_t w = ::pwrite(fd_, p, std::min<std::size_t>(left, std::size_t{1} << 30), static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      std::string msg = sys_error("write failed");
      abort();
      fail(tmp_.string(), msg);
    }
    p += w;
    offset += static_cast<std::uint64_t>(w);
    left -= static_cast<std::size_t>(w);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) fail(path_.string(), "commit after the file was closed");
  if (::fsync(fd_) != 0) {
    std::string msg = sys_error("fsync failed");
    abort();
    fail(tmp_.string(), msg);
  }
  if (::close(fd_) != 0) {
    fd_ = -1;
    std::string msg = sys_error("close failed");
    ::unlink(tmp_.c_str());
    fail(tmp_.string(), msg);
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    std::string msg = sys_error("cannot rename the temporary file onto the target");
    ::unlink(tmp_.c_str());
    fail(path_.string(), msg);
  }
  // Make the rename itself durable. Best effort: the file is already in place, and some file
  // systems refuse fsync on directories.
  std::filesystem::path dir = path_.parent_path();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace detail

struct SafetensorsWriter::Impl {
  std::filesystem::path path;
  std::vector<StEntry> entries;
  std::vector<std::uint64_t> sizes;
  std::unique_ptr<detail::AtomicFile> file;  // null once finished or failed
  std::size_t next = 0;                      // first tensor not yet complete
  std::uint64_t filled = 0;                  // bytes of entries[next] written so far
  bool started = false;                      // entries[next] was named at least once
  bool done = false;

  void check_open() const {
    if (file) return;
    fail(path.string(), done ? "writer already finished" : "writer failed earlier; file abandoned");
  }
  // Any error leaves nothing behind: drop the temporary file, then report.
  [[noreturn]] void abandon(const std::string& what) {
    file.reset();
    fail(path.string(), what);
  }
};

SafetensorsWriter::SafetensorsWriter(std::filesystem::path path, std::vector<StEntry> entries, Metadata metadata)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = std::move(path);
  impl_->entries = std::move(entries);
  // Validate and lay out before touching the disk.
  std::string header = detail::build_header(impl_->entries, metadata, impl_->path.string(), &impl_->sizes);
  impl_->file = std::make_unique<detail::AtomicFile>(impl_->path);
  std::byte len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::byte>((header.size() >> (8 * i)) & 0xFF);
  impl_->file->write(len);
  impl_->file->write(header);
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&&) noexcept = default;
SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&&) noexcept = default;
SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::write(std::string_view name, std::span<const std::byte> bytes) {
  Impl& s = *impl_;
  s.check_open();
  if (s.next == s.entries.size())
    s.abandon("tensor " + quote(name) + " written after all declared tensors were complete");
  const StEntry& e = s.entries[s.next];
  if (name != e.name) {
    std::string expect = "expected data for tensor " + quote(e.name);
    if (s.started)
      expect += " (" + std::to_string(s.filled) + " of " + std::to_string(s.sizes[s.next]) + " bytes written)";
    s.abandon(expect + ", got tensor " + quote(name));
  }
  const std::uint64_t room = s.sizes[s.next] - s.filled;
  if (bytes.size() > room)
    s.abandon("tensor " + quote(name) + " given " + std::to_string(bytes.size()) + " bytes, " + std::to_string(room) +
              " remain of its " + std::to_string(s.sizes[s.next]));
  try {
    s.file->write(bytes);
  } catch (const Error& err) {
    s.abandon(err.what());
  }
  s.filled += bytes.size();
  s.started = true;
  if (s.filled == s.sizes[s.next]) {
    ++s.next;
    s.filled = 0;
    s.started = false;
  }
}

void SafetensorsWriter::write_tensor(std::string_view name, const Tensor& t) {
  Impl& s = *impl_;
  s.check_open();
  if (s.next < s.entries.size() && name == s.entries[s.next].name) {
    const StEntry& e = s.entries[s.next];
    if (to_st_dtype(t.dtype()) != e.dtype || t.shape() != e.shape)
      s.abandon("tensor " + quote(name) + " declared " + st_dtype_name(e.dtype) + " " + shape_str(e.shape) +
                ", given " + dtype_name(t.dtype()) + " " + shape_str(t.shape()));
    if (s.started) s.abandon("tensor " + quote(name) + " already partly written");
  }
  write(name, std::span<const std::byte>(t.bytes(), t.nbytes()));
}

void SafetensorsWriter::finish() {
  Impl& s = *impl_;
  s.check_open();
  if (s.next != s.entries.size())
    s.abandon("finished with tensor " + quote(s.entries[s.next].name) + " incomplete (" + std::to_string(s.filled) +
              " of " + std::to_string(s.sizes[s.next]) + " bytes) and " +
              std::to_string(s.entries.size() - s.next - 1) + " more after it unwritten");
  try {
    s.file->commit();
  } catch (const Error&) {
    s.file.reset();
    throw;
  }
  s.file.reset();
  s.done = true;
}

const std::filesystem::path& SafetensorsWriter::path() const { return impl_->path; }
const std::vector<StEntry>& SafetensorsWriter::entries() const { return impl_->entries; }

void save_safetensors(const std::filesystem::path& path, const std::vector<StTensorData>& tensors,
                      const Metadata& metadata) {
  std::vector<StEntry> entries;
  entries.reserve(tensors.size());
  for (const StTensorData& t : tensors) entries.push_back({t.name, t.dtype, t.shape});
  SafetensorsWriter w(path, std::move(entries), metadata);
  for (const StTensorData& t : tensors) w.write(t.name, t.data);
  w.finish();
}

}  // namespace microscale::io
