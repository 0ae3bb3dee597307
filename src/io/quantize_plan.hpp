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

// A layer's format resolved for the layout: what it is quantized with and how its nvfp4 global
// scale is stored.
struct LayerSpec {
  QuantSpec spec;              // resolved; the global scale is set when the layer is written
  bool three_level = false;    // nvfp4 with the tensor's own global scale, stored by the layout
  bool unit_global = false;    // two-level nvfp4 in a layout that stores a global scale: encode factor 1
  std::string text;            // as --format, a recipe rule or a candidate wrote it
  std::int64_t row_block = 0;  // K must be a multiple of it (LayoutOps::row_block, else the group size)
  bool keep() const { return row_block == 0; }  // a --budget candidate that keeps the layer in high precision
};
// `f` for layout `lay` (the --format options' nonfinite policy applied); throws naming `what` when
// the layout cannot hold it.
LayerSpec layer_spec(const LayerFormat& f, const LayoutOps& lay, NonFinite nonfinite, const std::string& what);

// A layer to quantize, as a skeleton (shapes, no data) that the layout validates up front.
struct PlannedLayer {
  std::string tensor;  // its primary input tensor
  std::string module;  // the layer written
  Layer skel;
  // Experts stacked into one layer, or one of gpt-oss's split experts: where its rows come from.
  std::optional<ExpertRows> experts;
  LayerSpec format;
  bool pinned = true;  // false: --budget chooses its format among the candidates
};

struct QuantizePlan {
  const LayoutOps* layout = nullptr;
  LayerSpec base;              // --format's, for the layers no recipe rule names
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
  std::map<std::string, std::string> hessian_of;  // every module the --hessians file covers
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

// --budget: the candidates resolved for the layout (QuantizeOptions::candidates, or the default
// set); throws naming the candidate the layout cannot hold.
std::vector<LayerSpec> budget_candidates(const QuantizeOptions& opt, const LayoutOps& lay);
// After --budget chose: sets the free layers' formats (`chosen[i]` for plan.layers[i], null: kept
// in high precision), then runs the checks plan_quantize runs on a plan without a budget.
void apply_choice(QuantizePlan& plan, const QuantizeOptions& opt, const std::vector<const LayerSpec*>& chosen);

}  // namespace microscale::io::ck
