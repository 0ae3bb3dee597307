// Helpers for the checkpoint I/O tests: scratch directories, hand-built safetensors bytes (made
// without the library's writer, so reader and writer are checked against each other and against
// the format), and error-message assertions.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "microscale/io.hpp"

namespace iot {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::path(::testing::TempDir()) / ("microscale_io_" + std::string(info->test_suite_name()) + "_" +
                                              info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  // Files in the directory, names only, sorted.
  std::vector<std::string> list() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  fs::path path_;
};

inline Bytes bytes_of(const std::string& s) {
  Bytes b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

inline Bytes le64(std::uint64_t v) {
  Bytes b(8);
  for (int i = 0; i < 8; ++i) b[static_cast<std::size_t>(i)] = std::byte((v >> (8 * i)) & 0xFF);
  return b;
}

// Length field + header text (as given, no padding) + data.
inline Bytes raw_file(const std::string& header, const Bytes& data = {}) {
  Bytes out = le64(header.size());
  Bytes h = bytes_of(header);
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

inline Bytes pattern(std::size_t n, unsigned seed = 1) {
  Bytes b(n);
  std::uint32_t x = seed * 2654435761u + 12345u;
  for (auto& v : b) {
    x = x * 1664525u + 1013904223u;
    v = std::byte(x >> 24);
  }
  return b;
}

inline void write_bytes(const fs::path& p, const Bytes& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  ASSERT_TRUE(f.good()) << p;
}

inline Bytes read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return bytes_of(s);
}

inline Bytes to_bytes(std::span<const std::byte> s) { return Bytes(s.begin(), s.end()); }

// Runs fn, which must throw microscale::Error whose message holds every one of `parts`.
inline void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const microscale::Error& e) {
    std::string msg = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message lacks \"" << p << "\": " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-microscale exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "did not throw";
}

// Parses bytes through both entry points (memory and a mapped file) and expects the same error.
inline void expect_rejected(const TempDir& dir, const Bytes& b, std::initializer_list<std::string> parts) {
  using microscale::io::SafetensorsFile;
  expect_error([&] { (void)SafetensorsFile::open_memory(b.data(), b.size(), "mem.st"); }, parts);
  expect_error([&] { (void)SafetensorsFile::open_memory(b.data(), b.size(), "mem.st"); }, {"mem.st"});
  const fs::path p = dir / "hostile.safetensors";
  write_bytes(p, b);
  expect_error([&] { (void)SafetensorsFile::open(p); }, parts);
  expect_error([&] { (void)SafetensorsFile::open(p); }, {p.string()});
}

}  // namespace iot
