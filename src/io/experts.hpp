// Mixture-of-experts weights in mlx-lm's stacked form (docs/checkpoints.md, "Mixture-of-experts
// weights"): per-expert 2-D projections stacked into SwitchGLU's [experts, N, K], and gpt-oss's
// stacked [experts, in, out] tensors transposed and split into gate, up and down.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/detail.hpp"
#include "io/source.hpp"
#include "microscale/tensor.hpp"

namespace microscale::io::ck {

// Where the rows of one stacked layer come from.
struct ExpertRows {
  std::string module;                // the layer written: "model.layers.0.mlp.switch_mlp.gate_proj"
  std::vector<std::string> tensors;  // per expert, in expert order ([N, K] each); or one [E, K, C] stack
  // A [E, K, C] stack (gpt-oss): expert e's row r is column col_start + r * col_step, transposed.
  std::int64_t col_start = 0, col_step = 0;
  std::int64_t experts = 0, rows = 0, cols = 0;  // E, N and K of the layer
  std::int64_t first_expert = 0;                 // of a stack's experts, the first this layer holds
};

// "<p>.experts.<i>.<proj>.weight" split into its parts; nullopt for other names.
struct ExpertName {
  std::string prefix, proj;
  std::int64_t index;
};
std::optional<ExpertName> per_expert_name(std::string_view tensor);
// The SwitchGLU module mlx-lm's sanitize stacks those into: "<p>.switch_mlp.<gate|up|down>_proj"
// (Mixtral's w1, w3 and w2 are gate, up and down).
std::string switch_mlp_module(const ExpertName& e);

// The per-expert weights among `tensors` grouped by projection: each group's SwitchGLU module and
// the indices into `tensors` of experts 0 to E-1 in order. Throws naming the projection when its
// experts are not numbered 0 to E-1.
struct ExpertGroup {
  std::string module;
  std::vector<std::size_t> members;
};
std::vector<ExpertGroup> expert_groups(const std::vector<std::string>& tensors);

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

// Back to transformers' form (dequantize): the per-expert weight names of a stacked
// "<p>.switch_mlp.<proj>" layer of `experts` experts, "<p>.experts.<i>.<proj>.weight" (Mixtral:
// w1, w3, w2 for gate, up, down); empty for other modules.
std::vector<std::string> per_expert_outputs(const std::string& module, std::int64_t experts,
                                            const detail::Json& config);
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

// The layer's rows gathered into one [E * N, K] tensor of the source's float dtype (FP8 sources
// decoded), releasing the input pages as it goes.
Tensor gather_rows(const Checkpoint& ck, const Sources& sources, const ExpertRows& rows);

// convert of a gpt-oss MXFP4 source to MLX (quantize_checkpoint.cpp): what quantize --format mxfp4
// --export mlx writes for the dequantized checkpoint, the experts' E2M1 codes and E8M0 scales
// copied from the source's `_blocks` and `_scales` instead of decoded and quantized again.
Report convert_gptoss_mxfp4(const fs::path& in, const fs::path& out, const ConvertOptions& opt);

}  // namespace microscale::io::ck
