// ggml's nvfp4/mxfp4 blocks from and to microscale's compact codes and scales (docs/gguf.md).
//
// Both layouts split a scale group's codes into two halves: byte j of a group holds value j in
// its low nibble and value j + group/2 in its high nibble, where the compact form holds values 2j
// and 2j + 1. So, with c the group's compact bytes and q its ggml bytes (h = group/4):
//   q[2t]     = lo(c[t]) | lo(c[h + t]) << 4        c[t]     = lo(q[2t]) | lo(q[2t + 1]) << 4
//   q[2t + 1] = hi(c[t]) | hi(c[h + t]) << 4        c[h + t] = hi(q[2t]) | hi(q[2t + 1]) << 4
// nvfp4 blocks gather four 16-value groups after their four scale bytes; mxfp4 blocks are one
// 32-value group after its scale byte.
#include "io/gguf_blocks.hpp"

#include <cstring>
#include <limits>
#include <string>

#include "microscale/dtype.hpp"

namespace microscale::io::gguf {

namespace {

// Per layout: values per scale group, scale groups per block.
struct BlockShape {
  std::int64_t group;
  std::int64_t groups_per_block;
  std::int64_t block_values() const { return group * groups_per_block; }
  std::int64_t block_bytes() const { return groups_per_block * (1 + group / 2); }
};

BlockShape block_shape(Mode mode) {
  switch (mode) {
    case Mode::nvfp4: return {16, 4};
    case Mode::mxfp4: return {32, 1};
    default: break;
  }
  throw Error(std::string("ggml blocks: mode ") + name(mode) + " has no ggml block layout (nvfp4 and mxfp4 do)");
}

// The formulas above on four bytes of each half at once (SWAR): nibbles are split and merged in
// 32-bit words, then the even and odd output bytes are interleaved by spreading each word's bytes
// into every other byte of a 64-bit word. Hosts are little-endian (byte i at bits 8i).
constexpr std::uint32_t kLow = 0x0F0F0F0Fu, kHigh = 0xF0F0F0F0u;

std::uint64_t spread_bytes(std::uint32_t x) {  // byte i to byte 2i
  std::uint64_t v = x;
  v = (v | v << 16) & 0x0000FFFF0000FFFFull;
  return (v | v << 8) & 0x00FF00FF00FF00FFull;
}
std::uint32_t gather_bytes(std::uint64_t v) {  // byte 2i to byte i
  v &= 0x00FF00FF00FF00FFull;
  v = (v | v >> 8) & 0x0000FFFF0000FFFFull;
  return static_cast<std::uint32_t>(v | v >> 16);
}

template <int Group>
void group_to_ggml(const std::uint8_t* c, std::uint8_t* q) {
  constexpr int h = Group / 4;
  for (int u = 0; u < h; u += 4) {
    std::uint32_t a, b;
    std::memcpy(&a, c + u, 4);
    std::memcpy(&b, c + h + u, 4);
    const std::uint32_t even = (a & kLow) | (b & kLow) << 4, odd = (a >> 4 & kLow) | (b & kHigh);
    const std::uint64_t out = spread_bytes(even) | spread_bytes(odd) << 8;
    std::memcpy(q + 2 * u, &out, 8);
  }
}

template <int Group>
void group_from_ggml(const std::uint8_t* q, std::uint8_t* c) {
  constexpr int h = Group / 4;
  for (int u = 0; u < h; u += 4) {
    std::uint64_t in;
    std::memcpy(&in, q + 2 * u, 8);
    const std::uint32_t even = gather_bytes(in), odd = gather_bytes(in >> 8);
    const std::uint32_t a = (even & kLow) | (odd & kLow) << 4, b = (even >> 4 & kLow) | (odd & kHigh);
    std::memcpy(c + u, &a, 4);
    std::memcpy(c + h + u, &b, 4);
  }
}

struct Sizes {
  std::size_t codes, scales, blocks;
};

// The three buffer sizes of `rows` x `k`, checked against overflow.
Sizes sizes_of(Mode mode, std::int64_t rows, std::int64_t k) {
  const BlockShape s = block_shape(mode);
  const std::int64_t row_bytes = ggml_row_bytes(mode, k);
  if (rows < 0) throw Error("ggml blocks: rows = " + std::to_string(rows) + " is negative");
  if (rows > 0 && row_bytes > std::numeric_limits<std::int64_t>::max() / rows)
    throw Error("ggml blocks: " + std::to_string(rows) + " rows of " + std::to_string(k) + " values overflow");
  return {static_cast<std::size_t>(rows * (k / 2)), static_cast<std::size_t>(rows * (k / s.group)),
          static_cast<std::size_t>(rows * row_bytes)};
}

void require_size(const char* what, std::size_t got, std::size_t want) {
  if (got != want)
    throw Error(std::string("ggml blocks: ") + what + " has " + std::to_string(got) + " bytes, expected " +
                std::to_string(want));
}

template <int Group, int GroupsPerBlock, bool ToGgml>
void convert_rows(std::int64_t rows, std::int64_t k, const std::uint8_t* codes_in, const std::uint8_t* scales_in,
                  const std::uint8_t* blocks_in, std::uint8_t* codes_out, std::uint8_t* scales_out,
                  std::uint8_t* blocks_out) {
  constexpr int kGroupBytes = Group / 2;
  constexpr int kBlockBytes = GroupsPerBlock * (1 + kGroupBytes);
  const std::int64_t blocks_per_row = k / (Group * GroupsPerBlock);
  // Rows are contiguous in all three buffers, so the blocks of all rows run back to back.
  const std::int64_t n_blocks = rows * blocks_per_row;
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    const std::int64_t g0 = b * GroupsPerBlock;  // first scale group of the block
    if constexpr (ToGgml) {
      std::uint8_t* q = blocks_out + b * kBlockBytes;
      std::memcpy(q, scales_in + g0, GroupsPerBlock);
      for (int s = 0; s < GroupsPerBlock; ++s)
        group_to_ggml<Group>(codes_in + (g0 + s) * kGroupBytes, q + GroupsPerBlock + s * kGroupBytes);
    } else {
      const std::uint8_t* q = blocks_in + b * kBlockBytes;
      std::memcpy(scales_out + g0, q, GroupsPerBlock);
      for (int s = 0; s < GroupsPerBlock; ++s)
        group_from_ggml<Group>(q + GroupsPerBlock + s * kGroupBytes, codes_out + (g0 + s) * kGroupBytes);
    }
  }
}

const std::uint8_t* u8(std::span<const std::byte> s) { return reinterpret_cast<const std::uint8_t*>(s.data()); }
std::uint8_t* u8(std::span<std::byte> s) { return reinterpret_cast<std::uint8_t*>(s.data()); }

}  // namespace

std::int64_t ggml_row_bytes(Mode mode, std::int64_t k) {
  const BlockShape s = block_shape(mode);
  if (k < 0 || k % s.block_values() != 0)
    throw Error(std::string("ggml blocks: ") + name(mode) + " rows need a multiple of " +
                std::to_string(s.block_values()) + " values, got " + std::to_string(k));
  return k / s.block_values() * s.block_bytes();
}

void to_ggml_blocks(Mode mode, std::int64_t rows, std::int64_t k, std::span<const std::byte> codes,
                    std::span<const std::byte> scales, std::span<std::byte> out) {
  const Sizes n = sizes_of(mode, rows, k);
  require_size("codes", codes.size(), n.codes);
  require_size("scales", scales.size(), n.scales);
  require_size("blocks", out.size(), n.blocks);
  if (mode == Mode::nvfp4)
    convert_rows<16, 4, true>(rows, k, u8(codes), u8(scales), nullptr, nullptr, nullptr, u8(out));
  else
    convert_rows<32, 1, true>(rows, k, u8(codes), u8(scales), nullptr, nullptr, nullptr, u8(out));
}

void from_ggml_blocks(Mode mode, std::int64_t rows, std::int64_t k, std::span<const std::byte> blocks,
                      std::span<std::byte> codes, std::span<std::byte> scales) {
  const Sizes n = sizes_of(mode, rows, k);
  require_size("blocks", blocks.size(), n.blocks);
  require_size("codes", codes.size(), n.codes);
  require_size("scales", scales.size(), n.scales);
  if (mode == Mode::nvfp4)
    convert_rows<16, 4, false>(rows, k, nullptr, nullptr, u8(blocks), u8(codes), u8(scales), nullptr);
  else
    convert_rows<32, 1, false>(rows, k, nullptr, nullptr, u8(blocks), u8(codes), u8(scales), nullptr);
}

ScaleDifferences ggml_scale_differences(Mode mode, std::span<const std::byte> scales) {
  block_shape(mode);  // refuses modes without a ggml layout
  ScaleDifferences d;
  for (std::byte sb : scales) {
    const auto s = std::to_integer<unsigned>(sb);
    if (mode == Mode::nvfp4) {
      // ggml tests for 0x7F before it drops the sign, so 0xFF reads as 0x7F's would-be 480.
      if (s == 0x7F || s == 0xFF)
        ++d.nan;
      else if (s > 0x80)
        ++d.negative;
    } else if (s == 0xFF) {
      ++d.nan;  // E8M0 NaN; ggml reads 2^128
    }
  }
  return d;
}

}  // namespace microscale::io::gguf
