// Mixture-of-experts weights in mlx-lm's stacked form (docs/checkpoints.md, "Mixture-of-experts
// weights"): per-expert 2-D projections stacked into SwitchGLU's [experts, N, K] and back. gpt-oss's
// stacked [experts, in, out] tensors are split by its own module (source_gptoss.hpp).
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

// Back to transformers' form (dequantize): the per-expert weight names of a stacked
// "<p>.switch_mlp.<proj>" layer of `experts` experts, "<p>.experts.<i>.<proj>.weight" (Mixtral:
// w1, w3, w2 for gate, up, down); empty for other modules.
std::vector<std::string> per_expert_outputs(const std::string& module, std::int64_t experts,
                                            const detail::Json& config);

// The layer's rows gathered into one [E * N, K] tensor of the source's float dtype (FP8 sources
// decoded), releasing the input pages as it goes.
Tensor gather_rows(const Checkpoint& ck, const Sources& sources, const ExpertRows& rows);

}  // namespace microscale::io::ck
