// Read-only file mappings that survive their file being truncated (detail.hpp, FileMapping).
//
// A read from a page of a file mapping that lies past the file's current end raises SIGBUS. The
// handler installed here looks the faulting address up among the live mappings; when it is one
// of them, it maps anonymous zero pages over the rest of that mapping (mmap is async-signal-safe),
// marks the mapping, and returns, so the read goes on and sees zeros. Every code path that trusts
// bytes it read calls check_unchanged() first, which sees the mark and throws, so no value
// computed from the zeros is ever kept. Faults elsewhere go to the handler that was there before.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "io/detail.hpp"

namespace microscale::io::detail {

// One mapping's address range, in a list the signal handler walks without locks. Nodes are never
// freed, only reused, so a handler on another thread never reads freed memory.
struct MappingGuard {
  enum class Use { free, claimed, live };
  std::atomic<Use> use{Use::claimed};
  std::atomic<std::uintptr_t> begin{0}, end{0};
  std::atomic<bool> truncated{false};
  MappingGuard* next = nullptr;  // set before the node is published, then constant
};

namespace {

std::atomic<MappingGuard*> g_guards{nullptr};
std::uintptr_t g_page = 4096;
struct sigaction g_previous {};

// The fault is not ours: hand it to whoever handled SIGBUS before, as if we were not there.
void pass_on(int sig, siginfo_t* info, void* context) {
  if (g_previous.sa_flags & SA_SIGINFO) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  const bool sent = info->si_code <= 0;  // by kill() or raise(), not by a fault
  if (g_previous.sa_handler == SIG_IGN && sent) return;
  // The default action (the kernel does not let a fault be ignored either): restore it and let the
  // signal come again, from the faulting instruction when it runs again, or from raise().
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(sig, &dfl, nullptr);
  if (sent) ::raise(sig);
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
  if (info->si_code == BUS_ADRERR)  // a page past the end of its file
    for (MappingGuard* g = g_guards.load(std::memory_order_acquire); g; g = g->next) {
      if (g->use.load(std::memory_order_acquire) != MappingGuard::Use::live) continue;
      const std::uintptr_t begin = g->begin.load(std::memory_order_relaxed),
                           end = g->end.load(std::memory_order_relaxed);
      if (addr < begin || addr >= end) continue;
      // Zeros from the faulting page to the end: the file is shorter, and the rest would fault
      // page by page.
      const std::uintptr_t page = addr & ~(g_page - 1);
      if (::mmap(reinterpret_cast<void*>(page), end - page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
                 0) == MAP_FAILED)
        break;
      g->truncated.store(true, std::memory_order_release);
      errno = saved_errno;
      return;
    }
  errno = saved_errno;
  pass_on(sig, info, context);
}

void install_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    // Read the current handler first, so that g_previous is complete before ours can run.
    ::sigaction(SIGBUS, nullptr, &g_previous);
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, nullptr);
  });
}

MappingGuard* guard(const void* data, std::size_t size) {
  install_handler();
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t end = (begin + size + g_page - 1) & ~(g_page - 1);
  MappingGuard* g = g_guards.load(std::memory_order_acquire);
  for (; g; g = g->next) {
    auto expected = MappingGuard::Use::free;
    if (g->use.compare_exchange_strong(expected, MappingGuard::Use::claimed)) break;
  }
  if (!g) {
    g = new MappingGuard;
    g->next = g_guards.load(std::memory_order_relaxed);
    while (!g_guards.compare_exchange_weak(g->next, g, std::memory_order_release, std::memory_order_relaxed)) {
    }
  }
  g->begin.store(begin, std::memory_order_relaxed);
  g->end.store(end, std::memory_order_relaxed);
  g->truncated.store(false, std::memory_order_relaxed);
  g->use.store(MappingGuard::Use::live, std::memory_order_release);
  return g;
}

std::int64_t mtime_ns(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

}  // namespace

FileMapping::FileMapping(const std::filesystem::path& path, std::string source) : source_(std::move(source)) {
  // O_NONBLOCK: should the path turn into a FIFO after the caller's check, the open still returns
  // (and fstat refuses it); for regular files the flag changes nothing.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) fail(source_, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    fail(source_, std::string("cannot map: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fail(source_, "not a regular file");
  }
  opened_size_ = st.st_size;
  opened_mtime_ns_ = mtime_ns(st);
  // mmap of length 0 is an error; an empty file stays unmapped (its reader reports it too short).
  if (st.st_size == 0) return;
  size_ = static_cast<std::size_t>(st.st_size);
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    ::close(fd_);
    fail(source_, std::string("cannot map: ") + std::strerror(err));
  }
  data_ = static_cast<const std::byte*>(p);
  try {
    guard_ = guard(data_, size_);
  } catch (...) {
    ::munmap(p, size_);
    ::close(fd_);
    throw;
  }
}

FileMapping::~FileMapping() {
  if (guard_) guard_->use.store(MappingGuard::Use::free, std::memory_order_release);  // before the range can be reused
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
  ::close(fd_);
}

void FileMapping::check_unchanged() const {
  const std::string why =
      ": another program is writing it (rsync --inplace, a second download?), so what was read from it cannot be "
      "trusted and nothing computed from it was kept. Run again once it is complete";
  const std::string opened = std::to_string(opened_size_) + " bytes when opened";
  if (guard_ && guard_->truncated.load(std::memory_order_acquire))
    fail(source_, "was truncated while being read (" + opened + ")" + why);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail(source_, std::string("cannot check the file: ") + std::strerror(errno));
  if (st.st_size != opened_size_)
    fail(source_, "changed size while being read (now " + std::to_string(st.st_size) + " bytes, " + opened + ")" + why);
  if (mtime_ns(st) != opened_mtime_ns_) fail(source_, "was modified while being read" + why);
}

}  // namespace microscale::io::detail
