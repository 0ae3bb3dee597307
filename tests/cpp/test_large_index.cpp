// Rows longer than 2^31 values: every element offset must be 64-bit. One nvfp4 row of
// K = 2^31 + 64 values per backend, checked byte for byte against small tensors holding the same
// values, which are quantized on their own (per-group numerics do not depend on position).
//
// The multi-GiB input costs a few MiB of RAM: it is one tile of random values mapped over and over
// (a temporary file mapped privately, read-only), with the pages around the first groups and
// around element 2^31 made writable (copy on write) and given values of their own. Only the
// outputs (about 1.2 GiB) are real memory.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/reference.hpp"
#include "support.hpp"

namespace {

using microscale::Backend;
using microscale::QuantSpec;
using mst::DType;
using mst::Shape;
using mst::TensorView;

constexpr std::int64_t kK = (std::int64_t{1} << 31) + 64;
constexpr std::size_t kTileBytes = std::size_t{2} << 20;  // a multiple of every page size

// `count` elements of T whose memory is one tile repeated (see the file comment).
template <class T>
class RepeatedTile {
 public:
  RepeatedTile(const std::vector<T>& tile, std::int64_t count) {
    const std::size_t tile_bytes = tile.size() * sizeof(T);
    if (tile_bytes % static_cast<std::size_t>(sysconf(_SC_PAGESIZE)) != 0)
      throw std::runtime_error("the tile is not a whole number of pages");
    const std::size_t tiles = (static_cast<std::size_t>(count) * sizeof(T) + tile_bytes - 1) / tile_bytes;
    bytes_ = tiles * tile_bytes;
    struct Close {
      void operator()(std::FILE* f) const { std::fclose(f); }
    };
    const std::unique_ptr<std::FILE, Close> file(std::tmpfile());
    if (!file || std::fwrite(tile.data(), 1, tile_bytes, file.get()) != tile_bytes || std::fflush(file.get()) != 0)
      throw std::runtime_error("cannot write the tile's temporary file");
    base_ = mmap(nullptr, bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base_ == MAP_FAILED) throw std::runtime_error("cannot reserve " + std::to_string(bytes_) + " bytes");
    for (std::size_t t = 0; t < tiles; ++t)
      if (mmap(static_cast<char*>(base_) + t * tile_bytes, tile_bytes, PROT_READ, MAP_PRIVATE | MAP_FIXED,
               fileno(file.get()), 0) == MAP_FAILED) {
        munmap(base_, bytes_);
        throw std::runtime_error("cannot map tile " + std::to_string(t));
      }
    // Closing the file leaves the mappings (and the file's pages) in place.
  }
  ~RepeatedTile() { munmap(base_, bytes_); }
  RepeatedTile(const RepeatedTile&) = delete;
  RepeatedTile& operator=(const RepeatedTile&) = delete;

  const T* data() const { return static_cast<const T*>(base_); }

  // Elements [first, first + n) made writable (their pages become private copies).
  T* writable(std::int64_t first, std::int64_t n) {
    const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
    const auto begin = reinterpret_cast<std::uintptr_t>(data() + first) / page * page;
    const auto end = reinterpret_cast<std::uintptr_t>(data() + first + n);
    if (mprotect(reinterpret_cast<void*>(begin), end - begin, PROT_READ | PROT_WRITE) != 0)
      throw std::runtime_error("cannot make elements writable");
    return static_cast<T*>(base_) + first;
  }

 private:
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
};

// Group-wise random float16 values: N(0, 1) times a power of two per group of 16, so scales vary.
std::vector<float> random_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-6, 6);
  std::vector<float> v(n);
  float scale = 1.0f;
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 16 == 0) scale = std::ldexp(1.0f, exponent(rng));
    v[i] = mst::round_to(DType::float16, normal(rng) * scale);
  }
  return v;
}

std::vector<std::uint16_t> f16_bits(const std::vector<float>& v) {
  std::vector<std::uint16_t> h(v.size());
  std::transform(v.begin(), v.end(), h.begin(), mst::oracle_f16);
  return h;
}

// Packed codes and scale codes of `values` quantized alone, placed at element `first` of the row.
struct Piece {
  std::int64_t first = 0, count = 0;
  std::vector<std::uint8_t> packed, scales;
};

// The values the big row holds: a tile repeated, then `patches` pieces of their own values.
struct RowValues {
  Piece tile;
  std::vector<Piece> patches;
};

// Compares the quantized row (rows of `bits` bits, one scale per `group` values) with `want`,
// one tile's length at a time; reports the first differing byte of at most a few stretches.
void expect_row(const std::uint8_t* packed, const std::uint8_t* scales, int bits, int group, const RowValues& want) {
  const std::int64_t T = want.tile.count;
  std::vector<std::uint8_t> p, s;
  int failures = 0;
  for (std::int64_t e0 = 0; e0 < kK && failures < 3; e0 += T) {
    const std::int64_t n = std::min(T, kK - e0);
    p.assign(want.tile.packed.begin(), want.tile.packed.begin() + n * bits / 8);
    s.assign(want.tile.scales.begin(), want.tile.scales.begin() + n / group);
    for (const Piece& piece : want.patches) {
      const std::int64_t lo = std::max(e0, piece.first), hi = std::min(e0 + n, piece.first + piece.count);
      if (lo >= hi) continue;
      std::memcpy(p.data() + (lo - e0) * bits / 8, piece.packed.data() + (lo - piece.first) * bits / 8,
                  static_cast<std::size_t>((hi - lo) * bits / 8));
      std::memcpy(s.data() + (lo - e0) / group, piece.scales.data() + (lo - piece.first) / group,
                  static_cast<std::size_t>((hi - lo) / group));
    }
    const std::uint8_t* got_p = packed + e0 * bits / 8;
    const std::uint8_t* got_s = scales + e0 / group;
    if (std::memcmp(got_p, p.data(), p.size()) != 0) {
      const auto i = std::mismatch(p.begin(), p.end(), got_p).first - p.begin();
      ADD_FAILURE() << "packed byte " << e0 * bits / 8 + i << " (element " << e0 + i * 8 / bits << "): got "
                    << int{got_p[i]} << ", want " << int{p[static_cast<std::size_t>(i)]};
      ++failures;
    }
    if (std::memcmp(got_s, s.data(), s.size()) != 0) {
      const auto i = std::mismatch(s.begin(), s.end(), got_s).first - s.begin();
      ADD_FAILURE() << "scale " << e0 / group + i << " (element " << e0 + i * group << "): got " << int{got_s[i]}
                    << ", want " << int{s[static_cast<std::size_t>(i)]};
      ++failures;
    }
  }
}

// The patched stretches: the first 8 groups, and 4 groups either side of element 2^31.
constexpr std::int64_t kHead = 0, kTail = (std::int64_t{1} << 31) - 64, kPatch = 128;

// The reference kernel itself (the public op widens the input to float32 first: 8 GiB here).
TEST(LargeIndex, ReferenceNvfp4RowLongerThan2To31) {
  QuantSpec spec = microscale::resolve(QuantSpec{});
  ASSERT_EQ(spec.mode, microscale::Mode::nvfp4);
  auto run = [&](const float* x, std::int64_t K, Piece& out) {
    out.count = K;
    out.packed.assign(static_cast<std::size_t>(K / 2), 0);  // the kernel ORs nibbles in
    out.scales.assign(static_cast<std::size_t>(K / 16), 0);
    microscale::reference::quantize(x, 1, K, DType::float16, spec, out.packed.data(),
                                    reinterpret_cast<std::byte*>(out.scales.data()), nullptr);
  };
  const std::vector<float> tile = random_values(kTileBytes / sizeof(float), 1);
  RepeatedTile<float> x(tile, kK);
  RowValues want;
  run(tile.data(), static_cast<std::int64_t>(tile.size()), want.tile);
  for (const auto& [first, seed] : {std::pair{kHead, 2u}, std::pair{kTail, 3u}}) {
    const std::vector<float> v = random_values(kPatch, seed);
    std::copy(v.begin(), v.end(), x.writable(first, kPatch));
    Piece& piece = want.patches.emplace_back();
    run(v.data(), kPatch, piece);
    piece.first = first;
  }
  Piece got;
  run(x.data(), kK, got);
  expect_row(got.packed.data(), got.scales.data(), 4, 16, want);
}

// The public op on the CPU backend, float16 input, three-level nvfp4 with the tensor's amax (the
// largest value sits past 2^31), and nonfinite='error' locating an Inf past 2^31.
TEST(LargeIndex, CpuNvfp4RowLongerThan2To31) {
  microscale::set_backend(Backend::cpu);
  const std::vector<float> tile = random_values(kTileBytes / sizeof(std::uint16_t), 4);
  RepeatedTile<std::uint16_t> x(f16_bits(tile), kK);
  const std::vector<float> head = random_values(kPatch, 5);
  std::vector<float> tail = random_values(kPatch, 6);
  tail[64 + 7] = 30000.0f;  // the largest |x| (exact in float16), past 2^31: a 32-bit count misses it
  std::ranges::copy(f16_bits(head), x.writable(kHead, kPatch));
  std::ranges::copy(f16_bits(tail), x.writable(kTail, kPatch));
  float amax = 0.0f;
  for (const std::vector<float>& v : {tile, head, tail})
    for (float e : v) amax = std::max(amax, std::fabs(e));
  ASSERT_EQ(amax, 30000.0f);
  const TensorView big(x.data(), DType::float16, {1, kK});
  EXPECT_EQ(microscale::global_scale(big), amax);

  QuantSpec spec;
  spec.global_scale = amax;
  spec.nonfinite = microscale::NonFinite::error;
  auto piece = [&](const std::vector<float>& v, std::int64_t first) {
    const std::vector<std::uint16_t> h = f16_bits(v);
    const auto count = static_cast<std::int64_t>(v.size());
    const microscale::Quantized q = microscale::quantize(TensorView(h.data(), DType::float16, {1, count}), spec);
    const auto* p = q.packed.data<std::uint8_t>();
    const auto* s = q.scales.data<std::uint8_t>();
    return Piece{first, count, std::vector<std::uint8_t>(p, p + count / 2),
                 std::vector<std::uint8_t>(s, s + count / 16)};
  };
  const RowValues want{piece(tile, 0), {piece(head, kHead), piece(tail, kTail)}};
  {
    const microscale::Quantized q = microscale::quantize(big, spec);
    ASSERT_EQ(q.packed.shape(), (Shape{1, kK / 2}));
    ASSERT_EQ(q.scales.shape(), (Shape{1, kK / 16}));
    expect_row(q.packed.data<std::uint8_t>(), q.scales.data<std::uint8_t>(), 4, 16, want);
  }

  const std::int64_t inf_at = kTail + 64 + 5;  // element 2^31 + 5
  x.writable(inf_at, 1)[0] = mst::oracle_f16(mst::kInf);
  try {
    microscale::quantize(big, spec);
    ADD_FAILURE() << "quantize accepted an Inf with nonfinite='error'";
  } catch (const microscale::Error& e) {
    EXPECT_NE(std::string(e.what()).find("at flat index " + std::to_string(inf_at) + ", index (0, " +
                                         std::to_string(inf_at) + ")"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
