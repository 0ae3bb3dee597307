// Input files that another program truncates or rewrites while microscale reads them (rsync
// --inplace, a second download): a clean Error naming the file, never SIGBUS, and no output or
// staging directory left behind. The truncation happens at a fixed point (between open and read,
// or in the progress callback between two tensors), never by timing.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <thread>

#include "io_support.hpp"
#include "microscale/checkpoint.hpp"

namespace {

using namespace microscale;
using namespace microscale::io;
using namespace iot;

const auto kPage = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));

// A file of two tensors of four pages each, "a" then "b".
struct TwoTensors {
  TempDir dir;
  fs::path path = dir / "two.safetensors";
  Bytes a = pattern(4 * kPage, 1), b = pattern(4 * kPage, 2);

  TwoTensors() {
    const auto n = static_cast<std::int64_t>(a.size());
    save_safetensors(path, {{"a", StDType::u8, {n}, a}, {"b", StDType::u8, {n}, b}});
  }
  // The file cut just before b's data.
  void cut_before_b(const SafetensorsFile& f) const { fs::resize_file(path, f.file_bytes() - b.size()); }
};

timespec mtime_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0);
  return st.st_mtim;
}

void set_mtime(const fs::path& p, timespec t) {
  const timespec times[2] = {{0, UTIME_OMIT}, t};
  ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), times, 0), 0);
}

TEST(TruncatedInput, ReadingPastTheNewEndGivesZerosAndAnError) {
  TwoTensors t;
  const SafetensorsFile f = SafetensorsFile::open(t.path);
  EXPECT_NO_THROW(f.check_unchanged());
  EXPECT_EQ(to_bytes(f.tensor("a").data), t.a);
  const timespec mtime = mtime_of(t.path);
  t.cut_before_b(f);
  // b's pages are gone from the file: reading them faults, and the fault handler maps zeros.
  EXPECT_EQ(to_bytes(f.tensor("b").data), Bytes(t.b.size()));
  // Put the size and time back as they were: only the fault itself can tell now.
  fs::resize_file(t.path, f.file_bytes());
  set_mtime(t.path, mtime);
  expect_error([&] { f.check_unchanged(); },
               {t.path.string() + ": was truncated while being read", "rsync --inplace", "nothing computed"});
}

TEST(TruncatedInput, AFaultOnAnotherThreadIsSeenByTheReader) {
  TwoTensors t;
  const SafetensorsFile f = SafetensorsFile::open(t.path);
  const timespec mtime = mtime_of(t.path);
  t.cut_before_b(f);
  Bytes got;
  std::thread([&] { got = to_bytes(f.tensor("b").data); }).join();
  EXPECT_EQ(got, Bytes(t.b.size()));
  fs::resize_file(t.path, f.file_bytes());
  set_mtime(t.path, mtime);
  expect_error([&] { f.check_unchanged(); }, {t.path.string() + ": was truncated while being read"});
}

TEST(TruncatedInput, ASizeOrTimeChangeIsAnErrorEvenWithoutAFault) {
  TwoTensors t;
  const SafetensorsFile f = SafetensorsFile::open(t.path);
  const timespec mtime = mtime_of(t.path);
  t.cut_before_b(f);  // nothing of b read
  expect_error([&] { f.check_unchanged(); }, {t.path.string() + ": changed size while being read (now " +
                                              std::to_string(f.file_bytes() - t.b.size()) + " bytes, " +
                                              std::to_string(f.file_bytes()) + " bytes when opened)"});
  fs::resize_file(t.path, f.file_bytes());
  set_mtime(t.path, {mtime.tv_sec + 1, mtime.tv_nsec});  // rewritten in place, same size
  expect_error([&] { f.check_unchanged(); }, {t.path.string() + ": was modified while being read"});
  set_mtime(t.path, mtime);
  EXPECT_NO_THROW(f.check_unchanged());
  // Caller memory has no file to check.
  const Bytes mem = read_bytes(t.path);
  EXPECT_NO_THROW(SafetensorsFile::open_memory(mem.data(), mem.size()).check_unchanged());
}

// Faults outside microscale's mappings go to the handler that was there before, or kill the
// process as they would without microscale. Each runs in a fresh process (threadsafe style), where
// microscale's handler is installed after the test's own.
void install_microscale_handler() {
  TwoTensors t;
  (void)SafetensorsFile::open(t.path);  // the first mapping installs it
}

// Reads a page of a mapping whose (anonymous) file was cut to nothing: SIGBUS.
void read_past_the_end_of_a_foreign_mapping() {
  const int fd = ::memfd_create("foreign", 0);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(4 * kPage)) != 0) std::_Exit(3);
  const void* m = ::mmap(nullptr, 4 * kPage, PROT_READ, MAP_PRIVATE, fd, 0);
  if (m == MAP_FAILED || ::ftruncate(fd, 0) != 0) std::_Exit(3);
  (void)*(static_cast<const volatile unsigned char*>(m) + 2 * kPage);
  std::_Exit(4);  // not reached
}

TEST(TruncatedInputDeathTest, OtherFaultsReachThePreviousHandlerOrKill) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        struct sigaction sa {};
        sa.sa_handler = [](int) { std::_Exit(42); };
        ::sigaction(SIGBUS, &sa, nullptr);
        install_microscale_handler();
        read_past_the_end_of_a_foreign_mapping();
      },
      ::testing::ExitedWithCode(42), "");
  EXPECT_EXIT(
      {
        std::signal(SIGBUS, SIG_DFL);  // a sanitizer's handler would report and exit instead
        install_microscale_handler();
        read_past_the_end_of_a_foreign_mapping();
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

// A float model of several 128 KiB weights in one shard.
struct Model {
  TempDir dir;
  fs::path in = dir / "in";
  fs::path shard = in / "model.safetensors";
  std::vector<Bytes> store;

  Model() {
    fs::create_directories(in);
    std::vector<StTensorData> tensors;
    for (int l = 0; l < 4; ++l)
      for (const char* p : {"q_proj", "o_proj"}) {
        store.push_back(pattern(256 * 256 * 2, static_cast<unsigned>(store.size() + 1)));
        for (std::size_t i = 0; i < store.back().size(); i += 2) store.back()[i + 1] &= std::byte{0x3F};  // finite bf16
        tensors.push_back({"model.layers." + std::to_string(l) + ".self_attn." + p + ".weight",
                           StDType::bf16,
                           {256, 256},
                           store.back()});
      }
    save_safetensors(shard, tensors);
    write_bytes(in / "config.json", bytes_of(R"({"model_type": "llama"})"));
  }
  // A progress callback that cuts `file` to its header after the first tensor.
  static ProgressFn cut_after_first(const fs::path& file) {
    return [file](const Progress& p) {
      if (p.done == 1) fs::resize_file(file, 8 + SafetensorsFile::open(file).header_bytes());
    };
  }
  // Nothing left next to the input: no output, no staging directory.
  void expect_only_input() const { EXPECT_EQ(dir.list(), std::vector<std::string>{"in"}); }
};

TEST(TruncatedInput, QuantizeAndConvertStopWithTheFileNamedAndNothingLeft) {
  Model m;
  QuantizeOptions q;
  q.spec.mode = Mode::nvfp4;
  q.to = Convention::compressed_tensors;
  ASSERT_NO_THROW(quantize_checkpoint(m.in, m.dir / "q", q));
  fs::rename(m.dir / "q", m.in / "quantized");  // a quantized input, beside the float one

  q.progress = Model::cut_after_first(m.shard);
  expect_error([&] { quantize_checkpoint(m.in, m.dir / "out", q); },
               {m.shard.string() + ": was truncated while being read"});
  m.expect_only_input();

  const fs::path qshard = m.in / "quantized" / "model.safetensors";
  ConvertOptions c;
  c.to = Convention::modelopt;
  c.progress = Model::cut_after_first(qshard);
  // convert hands the mapped bytes to write(2), which fails (EFAULT) where a read would fault:
  // the changed size tells.
  expect_error([&] { convert_checkpoint(m.in / "quantized", m.dir / "out", c); },
               {qshard.string() + ": changed size while being read", "nothing computed from it was kept"});
  m.expect_only_input();
}

TEST(TruncatedInput, InspectStopsWithTheFileNamed) {
  Model m;
  expect_error([&] { (void)inspect_checkpoint(m.in, true, Model::cut_after_first(m.shard)); },
               {m.shard.string() + ": was truncated while being read"});
}

}  // namespace
