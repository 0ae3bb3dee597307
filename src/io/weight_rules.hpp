// Which tensors are weights, which of them stay in high precision and why, and which of those the
// configs' ignore lists name (docs/checkpoints.md, "What is quantized").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "io/detail.hpp"
#include "microscale/io.hpp"

namespace microscale::io::ck {

// Why a tensor is not quantized; `quantize` when it is.
enum class Keep {
  quantize,
  not_weight,
  rank,
  dtype,
  lm_head,
  embedding,
  norm,
  router,
  excluded,
  group,
  recipe,
  budget
};

// The default rule (why_kept): a float 2-D "<m>.weight" of a projection is quantized.
Keep default_keep(std::string_view name, const Shape& shape, StDType dtype);
// The text for `k` (why_kept's for the default rule): "" for quantize, "not a .weight", "3-D",
// "dtype F64", "lm_head", ...; `group` is the group size K did not fit (Keep::group).
std::string keep_text(Keep k, const Shape& shape, StDType dtype, int group = 0);
// The reasons that only name what a layer is: --include overrides them.
bool by_name(Keep k);

// Stacked expert tensors ([experts, ...], all experts of a layer in one tensor).
bool stacked_experts(std::string_view name, const Shape& shape);
// What a user takes for a weight: every `.weight` of two or more dimensions, and stacked experts.
// Each one left unquantized is reported with its reason.
bool looks_like_weight(std::string_view name, const Shape& shape);
// The module a weight-like tensor belongs to (stacked experts are parameters of their module).
std::string owner_module(const std::string& name);

// Whether `module`'s weight is a GPT-2 style Conv1D one, stored [in, out] (transposed from
// Linear's [out, in]): named c_attn, c_fc, c_proj or q_attn, in a model whose config (null when
// there is none) does not name another model type.
bool conv1d_weight(const detail::Json& config, const std::string& module);

// Adds `module`, left in high precision for reason `k`, to the configs' ignore list once, when
// loaders would otherwise take it for a quantized Linear: every kind of Linear weight, and the
// embeddings, which ModelOpt lists too (norms are not listed by anyone). Layouts whose loaders
// look up Linear modules only drop the embeddings again (`is_embedding`).
void add_ignored(std::vector<std::string>& ignore, const std::string& module, Keep k);
// Whether the module's name makes it an embedding table (`default_keep`'s rule).
bool is_embedding(const std::string& module);
// Adds "lm_head" when the model ties its output projection to the embedding (config
// `tie_word_embeddings`, or its `text_config`'s) and `quantized` does not hold it: such a checkpoint
// stores no lm_head weight, yet loaders build an lm_head Linear from the config and would take it
// for quantized (compressed-tensors then finds no weight to tie).
void add_tied_lm_head(std::vector<std::string>& ignore, const detail::Json& config,
                      const std::vector<std::string>& quantized);
// The same for a tensor copied through unquantized (convert, save_checkpoint).
void add_ignored_tensor(std::vector<std::string>& ignore, const std::string& name, const Shape& shape, StDType dtype);

}  // namespace microscale::io::ck
