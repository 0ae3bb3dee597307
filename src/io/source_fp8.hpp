// FP8 source checkpoints, one of the quantized source forms (source.hpp, docs/checkpoints.md,
// "Quantized sources"): DeepSeek / Qwen block FP8 ("<m>.weight_scale_inv" per 128x128 block),
// compressed-tensors FP8 (per tensor, channel or block, from its config groups) and ModelOpt FP8.
#pragma once

#include <array>
#include <optional>
#include <string>

#include "io/ct_groups.hpp"
#include "io/source.hpp"

namespace microscale::io::ck {

// What the config says about a checkpoint's FP8 weights, parsed once.
struct Fp8Config {
  std::string method;                                // quant_method, lower case ("" when absent)
  std::optional<std::array<std::int64_t, 2>> block;  // fp8: weight_block_size
  std::string scale_fmt;                             // fp8: "ue8m0" when the scales are E8M0
  CtGroups ct;                                       // compressed-tensors: its config groups
  bool modelopt_file = false;                        // hf_quant_config.json names a quant_algo
};
Fp8Config fp8_config(const Checkpoint& ck, const Json& config);

// The FP8 weight `n` ("<m>.weight", E4M3) with its scale, checked against the config; `kind` is
// set to the FP8 form the config and scale name say.
SourceWeight read_fp8(const Checkpoint& ck, const Fp8Config& cfg, const std::string& n, SourceKind& kind);
// Its values: the float32 product E4M3 value x scale, rounded into `dt`.
Tensor decode_fp8(const Checkpoint& ck, const SourceWeight& w, DType dt);

}  // namespace microscale::io::ck
