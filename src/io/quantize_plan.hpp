// quantize's plan: which weights become which quantized layers of the chosen layout, and why the
// others stay in high precision, decided from the checkpoint's headers and config (and the
// --hessians file's header) before any weight is read. quantize_checkpoint.cpp executes it: items
// that read, quantize and write each planned layer. A plan that cannot be written fails here, so
// nothing is written.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/layout.hpp"
#include "io/model_dir.hpp"
#include "io/source_gptoss.hpp"

namespace microscale::io::ck {

// A layer to quantize, as a skeleton (shapes, no data) that the layout validates up front.
struct PlannedLayer {
  std::string tensor;  // its primary input tensor
  std::string module;  // the layer written
  Layer skel;
  // Experts stacked into one layer, or one of gpt-oss's split experts: where its rows come from.
  std::optional<ExpertRows> experts;
};

struct QuantizePlan {
  const LayoutOps* layout = nullptr;
  QuantSpec spec;              // every layer's, resolved (its global scale is set per layer)
  bool three_level = false;    // nvfp4 with the layout's stored global scale
  std::int64_t row_block = 0;  // a quantized weight's K is a multiple of it (LayoutOps::row_block)
  bool stack_experts = false;  // MoE experts become one stacked layer (LayoutOps::stacked_experts)
  bool copy_codes = false;     // gpt-oss's MXFP4 codes and scales are copied (convert), not requantized
  bool gptoss_split = false;   // gpt-oss's experts split into gate, up and down (and their biases)
  std::vector<PlannedLayer> layers;
  std::map<std::string, std::string> kept;  // weight-like tensor -> why it stays in high precision
  std::vector<std::string> ignore;          // the config's ignore list
  bool w4a4 = false;                        // static activation scales (set in the layers' skel.act)
  // Fused groups (q/k/v, gate/up, ...) whose members share the largest amax as global scale.
  std::vector<std::vector<std::string>> fused;
  // GPTQ: module -> its Hessian's tensor in `hessians`; the other layers round to nearest.
  std::map<std::string, std::string> gptq;
  std::shared_ptr<const SafetensorsFile> hessians;
  GptqOptions gptq_options;
  std::vector<std::string> notes;  // for the report

  const PlannedLayer* find_layer(const std::string& module) const;
  // The config's description of the output, pointing at this plan's layers.
  QuantMeta meta() const;
};

// The plan of quantize_checkpoint for `in` (opened from `in_path`, which messages name; det:
// detect's result), or with `copy_codes` of convert_gptoss_mxfp4. Throws Error for what cannot be
// written (already quantized input, selections that match nothing, a layer the layout cannot
// hold, bad GPTQ or W4A4 inputs).
QuantizePlan plan_quantize(const fs::path& in_path, const Input& in, const Detected& det, const QuantizeOptions& opt,
                           bool copy_codes);

}  // namespace microscale::io::ck
