// llama.cpp's GGUF (docs/gguf.md): one file, not a directory. A quantized layer <m> is written as
//   <m>.weight        NVFP4 or MXFP4 in ggml's blocks, [N, K] ([experts, N, K] for stacked experts)
//   <m>.scale         F32 [1] ([experts]): the nvfp4 decode factor amax/2688, left out when it is 1
//   <m>.input_scale   F32 [1] ([experts]): W4A4's activation decode factor
// under the names the items give them; gguf_export.cpp renames every tensor as llama.cpp's
// converter does, writes the architecture and tokenizer keys, and lays out the file.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "io/gguf_blocks.hpp"
#include "io/gguf_import.hpp"
#include "io/layout.hpp"
#include "io/write_pipeline.hpp"

namespace microscale::io::ck {

void write_gguf(const Input& in, const fs::path& out, std::vector<Item>& items, const QuantMeta& meta,
                const WriteOptions& opt, Report& report);

namespace {

std::int64_t row_block(Mode mode) { return mode == Mode::nvfp4 ? 64 : 32; }

void check_spec(const QuantSpec& spec) {
  if (spec.mode != Mode::nvfp4 && spec.mode != Mode::mxfp4)
    throw Error(std::string("GGUF export holds nvfp4 and mxfp4 (ggml's NVFP4 and MXFP4 types), not ") +
                name(spec.mode));
}

// ggml reads nvfp4 block scales without their sign: a negative scale's block is written with the
// scale's magnitude and every code's sign flipped, which decodes to the same values (E2M1 is
// sign-magnitude, so -0 stays -0).
void fold_scale_signs(std::vector<std::byte>& codes, std::vector<std::byte>& scales, std::int64_t group) {
  const std::size_t per_scale = static_cast<std::size_t>(group) / 2;
  for (std::size_t b = 0; b < scales.size(); ++b) {
    const auto s = std::to_integer<unsigned>(scales[b]);
    if (!(s & 0x80) || (s & 0x7F) == 0x7F) continue;  // positive, or NaN (reported by the writer)
    scales[b] = std::byte(s & 0x7F);
    for (std::size_t i = b * per_scale; i < (b + 1) * per_scale; ++i) codes[i] ^= std::byte{0x88};
  }
}

void emit_gguf(const Layer& l, std::vector<Out>& out) {
  const std::string& m = l.module;
  const Mode mode = l.format.mode;
  if (mode != Mode::nvfp4 && mode != Mode::mxfp4)
    layer_error(m, std::string("GGUF holds nvfp4 and mxfp4 layers, not ") + name(mode));
  const std::int64_t k = l.cols();
  if (k % row_block(mode) != 0)
    layer_error(m, "K = " + std::to_string(k) + " is not a multiple of ggml's " + name(mode) + " block of " +
                       std::to_string(row_block(mode)) + " values");
  const std::int64_t row_bytes = gguf::ggml_row_bytes(mode, k);
  Out w = entry(m + ".weight", StDType::u8, l.stored(row_bytes));
  if (!l.packed.empty()) {
    // Every byte is written by to_ggml_blocks: no zero-fill of a weight-sized buffer.
    const auto size = static_cast<std::size_t>(l.rows() * row_bytes);
    std::shared_ptr<std::byte[]> blocks = std::make_shared_for_overwrite<std::byte[]>(size);
    std::span<const std::byte> codes = l.packed, scales = l.scales;
    std::vector<std::byte> codes_copy, scales_copy;
    const bool negative =
        mode == Mode::nvfp4 && std::any_of(scales.begin(), scales.end(), [](std::byte s) {
          return (std::to_integer<unsigned>(s) & 0x80) && (std::to_integer<unsigned>(s) & 0x7F) != 0x7F;
        });
    if (negative) {
      codes_copy.assign(codes.begin(), codes.end());
      scales_copy.assign(scales.begin(), scales.end());
      fold_scale_signs(codes_copy, scales_copy, l.format.group_size);
      codes = codes_copy;
      scales = scales_copy;
    }
    gguf::to_ggml_blocks(mode, l.rows(), k, codes, scales, {blocks.get(), size});
    w.data = {blocks.get(), size};
    w.owned = std::move(blocks);
  }
  out.push_back(std::move(w));
  if (mode != Mode::nvfp4) return;
  const std::int64_t n = l.experts ? l.experts : 1;
  // One value per expert: each expert's own global scale where the source had one each.
  auto per_expert = [&](auto&& value_of) {
    auto values = std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(n) * 4);
    for (std::int64_t e = 0; e < n; ++e) {
      const float v = value_of(e);
      std::memcpy(values->data() + e * 4, &v, 4);
    }
    return values;
  };
  // Two-level nvfp4 has no factor: llama.cpp's converter leaves out a factor of 1, and its loader
  // then applies none. (A three-level layer keeps its tensor even when the factor is 1, so that the
  // file's layout follows from the plan alone.)
  if (l.global.three_level() || !l.expert_globals.empty()) {
    const auto scale = per_expert([&](std::int64_t e) {
      if (l.expert_globals.empty()) return l.global_as(kDecodeFactor);
      Layer one = l;
      one.global = l.expert_globals[static_cast<std::size_t>(e)];
      return one.global_as(kDecodeFactor);
    });
    Out s = entry(m + ".scale", StDType::f32, {n}, *scale);
    s.owned = scale;
    out.push_back(std::move(s));
  }
  if (l.act) {
    const auto act = per_expert([&](std::int64_t) { return l.act_as(kDecodeFactor); });
    Out a = entry(m + ".input_scale", StDType::f32, {n}, *act);
    a.owned = act;
    out.push_back(std::move(a));
  }
}

constinit const LayoutOps::FileReader kGgufReader{is_gguf_file, inspect_gguf, dequantize_gguf, convert_gguf};

}  // namespace

constinit const LayoutOps kGgufLayout{
    .convention = Convention::gguf,
    .name = "gguf",
    .alias = nullptr,
    .title = "GGUF",
    .supported = "GGUF NVFP4 and MXFP4",
    .suffixes = {},
    .global_scale = true,
    .activation_scales = true,
    .stacked_experts = true,
    .per_layer_schemes = true,
    .shard_format = nullptr,
    .is_primary = nullptr,
    .read = nullptr,
    .default_scale_rule = nullptr,
    .check_spec = check_spec,
    .emit = emit_gguf,
    .write_config = nullptr,
    .row_block = row_block,
    .write_file = write_gguf,
    .keeps_fp8_groups = false,  // GGUF has no FP8 type: FP8 groups are written as BF16
    .modes = kFp4Modes,
    .file_reader = &kGgufReader,
};

}  // namespace microscale::io::ck
