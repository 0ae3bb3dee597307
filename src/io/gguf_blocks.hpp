// The ggml block layouts of nvfp4 and mxfp4 (docs/gguf.md), and their conversion from and to
// microscale's compact form (a row's codes two per byte, value 2i in the low nibble and 2i+1 in
// the high one; one scale byte per group). Only bytes move: codes and scale bytes are kept.
//
//   mxfp4  block_mxfp4, 17 bytes per 32 values: E8M0 byte e, then 16 code bytes; byte j holds
//          value j (low nibble) and value j+16 (high nibble).
//   nvfp4  block_nvfp4, 36 bytes per 64 values: four UE4M3 scale bytes (one per 16 values), then
//          32 code bytes; in sub-block s, byte 8s+j holds value 16s+j (low) and 16s+j+8 (high).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "microscale/format.hpp"

namespace microscale::io::gguf {

// Bytes of one row of `k` values in ggml's block layout of `mode` (nvfp4: k % 64 == 0;
// mxfp4: k % 32 == 0). Throws Error otherwise.
std::int64_t ggml_row_bytes(Mode mode, std::int64_t k);

// `rows` rows of `k` values: compact codes [rows, k/2] and scales [rows, k/group] into ggml
// blocks [rows, ggml_row_bytes] (`out`), and back. Spans must have exactly those sizes.
void to_ggml_blocks(Mode mode, std::int64_t rows, std::int64_t k, std::span<const std::byte> codes,
                    std::span<const std::byte> scales, std::span<std::byte> out);
void from_ggml_blocks(Mode mode, std::int64_t rows, std::int64_t k, std::span<const std::byte> blocks,
                      std::span<std::byte> codes, std::span<std::byte> scales);

// How ggml decodes a scale byte differently from microscale. nvfp4: ggml's UE4M3 ignores the sign
// bit and reads 0x7F (E4M3 NaN) as 0, but tests for 0x7F before dropping the sign, so 0xFF (NaN
// too) reads as 480. mxfp4: E8M0 decodes alike except 0xFF (NaN), which ggml reads as 2^128.
// Counts the scale bytes of `scales` that ggml would decode to another value.
struct ScaleDifferences {
  std::int64_t negative = 0;  // nvfp4, sign bit set and nonzero (not 0xFF): ggml reads |s|
  std::int64_t nan = 0;       // NaN codes (nvfp4 0x7F and 0xFF, mxfp4 0xFF): ggml reads a number
  std::int64_t total() const { return negative + nan; }
};
ScaleDifferences ggml_scale_differences(Mode mode, std::span<const std::byte> scales);

}  // namespace microscale::io::gguf
