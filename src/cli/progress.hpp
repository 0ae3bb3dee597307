// A one-line progress bar on stderr: tensors done, bytes, rate. Drawn only when stderr is a
// terminal, so pipes and logs stay clean.
#pragma once

#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "microscale/checkpoint.hpp"

namespace microscale::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string what, bool enabled = true)
      : what_(std::move(what)), tty_(enabled && ::isatty(STDERR_FILENO) == 1) {}
  ~ProgressBar() { finish(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  bool active() const { return tty_; }
  io::ProgressFn callback() {
    return [this](const io::Progress& p) { update(p); };
  }

  void update(const io::Progress& p) {
    if (!tty_) return;
    const auto now = Clock::now();
    // Redraw at most ten times a second, and always for the last item.
    if (p.done != p.total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    const double rate = secs > 0 ? static_cast<double>(p.bytes_done) / secs : 0;
    const int width = 24;
    const int fill =
        p.bytes_total ? static_cast<int>(width * static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total))
                      : (p.total ? static_cast<int>(width * p.done / p.total) : width);
    std::string bar(static_cast<std::size_t>(fill), '#');
    bar.resize(static_cast<std::size_t>(width), '-');
    char head[160];
    std::snprintf(head, sizeof head, "%s %zu/%zu %s [%s] %s/%s  %s/s  ", what_.c_str(), p.done, p.total,
                  p.total == 1 ? "tensor" : "tensors", bar.c_str(), human(static_cast<double>(p.bytes_done)).c_str(),
                  human(static_cast<double>(p.bytes_total)).c_str(), human(rate).c_str());
    std::string line = head + std::string(p.current);
    const std::size_t cols = columns();
    if (line.size() >= cols) line.resize(cols - 1);
    std::fprintf(stderr, "\r%s\033[K", line.c_str());
    std::fflush(stderr);
    drawn_ = true;
  }

  // Ends the line (once), so later output starts on a fresh one.
  void finish() {
    if (drawn_) std::fputc('\n', stderr);
    drawn_ = false;
  }

  static std::string human(double b) {
    const char* units[] = {"B", "kB", "MB", "GB", "TB"};
    int u = 0;
    while (b >= 1000 && u < 4) {
      b /= 1000;
      ++u;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
    return buf;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static std::size_t columns() {
    winsize ws{};
    if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20) return ws.ws_col;
    return 100;
  }
  std::string what_;
  bool tty_;
  bool drawn_ = false;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_{};
};

}  // namespace microscale::cli
