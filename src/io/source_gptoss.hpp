// gpt-oss's MXFP4 experts, one of the quantized source forms (source.hpp, docs/checkpoints.md,
// "Quantized sources"), in one module: reading and decoding "<m>_blocks" / "<m>_scales", the split
// of its [experts, in, out] stacks into gate, up and down (and their biases) that quantize and
// convert write, the code-copying convert, and dequantize's merge back into the stacks.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/experts.hpp"
#include "io/layout.hpp"
#include "io/source.hpp"

namespace microscale::io::ck {

// ---- the source form: "<m>_blocks" U8 [E, N, K/32, 16] with "<m>_scales" U8 [E, N, K/32]

SourceWeight read_gptoss(const Checkpoint& ck, const std::string& n);
// E2M1 x 2^(e - 127) transposed to [E, in, out]; throws naming the tensor on a NaN scale (0xFF).
Tensor decode_gptoss(const Checkpoint& ck, const SourceWeight& w, DType dt);

// ---- its experts split for the layouts (quantize, convert)

// gpt-oss: config model_type "gpt_oss"; its stacked expert tensors are [experts, in, out].
bool is_gptoss(const detail::Json& config);
// A gpt-oss stacked expert weight ("<p>.experts.gate_up_proj" or "<p>.experts.down_proj", 3-D).
bool gptoss_expert_weight(std::string_view tensor, const Shape& shape);
// The layers mlx-lm's gpt-oss model holds for such a tensor of shape [E, K, C]: gate_proj and
// up_proj (gate_up_proj's even and odd columns) or down_proj, each [E, N, K].
std::vector<ExpertRows> gptoss_layers(const std::string& tensor, const Shape& shape);
// One of gpt-oss's expert tensors as a checkpoint holds it: its name in the file (a float stack,
// an MXFP4 "<m>_blocks" tensor, or a bias) and its logical shape ([E, in, out] for the stacks).
struct GptossTensor {
  std::string file_name;
  Shape shape;
};
// Before gpt-oss's experts under "<p>.experts." are split, the tensors there must fit together:
// gate_up_proj [E, H, 2I] (gate and up interleaved, so an even width), down_proj [E, I, H],
// gate_up_proj_bias [E, 2I] and down_proj_bias [E, H]. `find` gives a sibling by its logical name
// ("<p>.experts.down_proj"), or nullopt. Throws naming the tensor and the shape expected.
void check_gptoss_fit(const std::string& parent,
                      const std::function<std::optional<GptossTensor>(const std::string&)>& find);
// A gpt-oss expert bias ("<p>.experts.gate_up_proj_bias" [E, 2N] or "down_proj_bias" [E, N]) as
// mlx-lm's model names it: (name, column start, column step) per output tensor.
struct BiasPart {
  std::string name;
  std::int64_t col_start, col_step;
};
std::vector<BiasPart> gptoss_bias_parts(std::string_view tensor);
// llm-compressor's linearized gpt-oss holds each expert as its own Linear modules: a split layer
// or bias name "<p>.experts.gate_proj[.bias]" for expert e is "<p>.experts.<e>.gate_proj[.bias]".
std::string gptoss_expert_name(const std::string& split_name, std::int64_t expert);
// Expert e of a split layer (gptoss_layers) as such a module: one [N, K] layer.
ExpertRows gptoss_expert(const ExpertRows& layer, std::int64_t expert);

// Items writing a gpt-oss expert bias split as the split experts' modules name them: stacked
// [E, N] each, or `per_expert` [N] per expert.
std::vector<Item> gptoss_bias_items(const Input& in, const std::string& name, Report& report, bool per_expert);
// A split expert layer's MXFP4 codes and scales copied out of its source stack (convert).
struct CodeBytes {
  std::vector<std::byte> packed, scales;
};
CodeBytes gptoss_codes(const Checkpoint& ck, const SourceWeight& w, const ExpertRows& rows);
// The bytes of experts [first, first + count) of a tensor stacked by expert (dim 0).
std::span<const std::byte> expert_bytes(const StTensor& t, std::int64_t first, std::int64_t count);
// convert of a gpt-oss MXFP4 source to MLX (quantize_checkpoint.cpp): what quantize --format mxfp4
// --export mlx writes for the dequantized checkpoint, the experts' E2M1 codes and E8M0 scales
// copied from the source's `_blocks` and `_scales` instead of decoded and quantized again.
Report convert_gptoss_mxfp4(const fs::path& in, const fs::path& out, const ConvertOptions& opt);

// ---- back to transformers' stacks (dequantize)

// gpt-oss's stacked tensor a split layer or bias goes back into: "<p>.experts.gate_up_proj" (gate
// the even columns, up the odd ones), "<p>.experts.down_proj", or their "_bias"; the part's
// column offset (0 gate or down, 1 up) comes with it. nullopt for other names.
struct MergedName {
  std::string name;
  std::int64_t part, parts;
};
std::optional<MergedName> gptoss_merged(std::string_view layer_or_bias);
// Columns interleaved back: parts[p] [E, N, K] (K = 1 for biases) into [E, K, parts * N], element
// (e, r, k) of part p at (e, k, parts * r + p); `size` bytes an element.
std::vector<std::byte> merge_columns(const std::vector<std::span<const std::byte>>& parts, std::int64_t experts,
                                     std::int64_t rows, std::int64_t cols, std::size_t size);

// gpt-oss (config model_type gpt_oss): its split expert layers and biases, merged back.
struct GptossMerge {
  std::map<std::string, std::vector<const Layer*>> layers;  // merged name -> its parts in column order
  std::map<std::string, std::vector<std::string>> biases;   // merged name -> bias tensors in column order
};
// Throws naming the tensor when the parts do not fit together.
GptossMerge gptoss_merge(const Input& in, const Detected& det);
// The items writing the merged stacks and biases as `dtype`.
void gptoss_items(const Input& in, const GptossMerge& g, DType dtype, NonFinite nonfinite, std::vector<Item>& items,
                  Report& report);

}  // namespace microscale::io::ck
