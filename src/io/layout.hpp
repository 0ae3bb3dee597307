// The checkpoint layouts (docs/checkpoints.md): one module per ecosystem (layout_ct.cpp,
// layout_modelopt.cpp, layout_mlx.cpp) fills a LayoutOps table with how it names, types and shapes
// a layer's tensors, stores the global scale, and reads and writes its config. Adding an
// ecosystem is one such module plus its entry in `layouts()` (layout.cpp) and its enumerator in
// Convention (checkpoint.hpp).
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/ct_groups.hpp"
#include "io/layer.hpp"
#include "io/source.hpp"

namespace microscale::io::ck {

// What the config files say about the layers written.
struct QuantMeta {
  std::vector<const Layer*> layers;  // may be skeletons (no data)
  std::vector<std::string> ignore;   // weight-like tensors' modules left unquantized
  bool w4a4 = false;
  ScaleSearch scale_search = ScaleSearch::none;  // recorded in the config's producer block when searched
  int gptq_layers = 0;                           // layers rounded with GPTQ (recorded when > 0)
  GptqOptions gptq;
  bool scale_2d = false;  // recorded in the producer block when the nvfp4 scales are 16x16 tiles
  // Layouts that keep FP8 groups (LayoutOps::keeps_fp8_groups): the config groups written as they
  // were, beside the layers' own group, which is named `group_name` and has `targets` (null: "Linear").
  std::vector<const CtGroup*> kept_groups;
  std::string group_name = "group_0";
  Json targets;
  // FP8 source weights of a mixed checkpoint kept as they are beside the layers, in a layout whose
  // config lists them per module (LayoutOps::fp8_source; ModelOpt's quantized_layers).
  std::vector<const SourceWeight*> kept_fp8;
};

// The (mode, group, bits) most layers use.
struct Scheme {
  Mode mode;
  int group, bits;
};

// The modes a layout stores unless its module says otherwise: the FP4 formats.
inline constexpr Mode kFp4Modes[] = {Mode::nvfp4, Mode::mxfp4};

struct Item;          // write_pipeline.hpp
struct WriteOptions;  // write_pipeline.hpp

struct LayoutOps {
  Convention convention;
  const char* name;                            // on the command line and in reports: "modelopt"
  const char* alias;                           // another accepted name, or null
  const char* title;                           // as messages name it: "ModelOpt"
  const char* supported;                       // what it reads, for messages: "ModelOpt NVFP4"
  std::span<const std::string_view> suffixes;  // of every tensor name it gives a layer: ".weight_packed", ...
  bool global_scale;                           // stores the nvfp4 global scale (three-level); else nvfp4 is two-level
  bool activation_scales;                      // stores static activation scales (W4A4)
  bool stacked_experts;      // holds a projection's MoE experts as one [experts, N, K] layer (else one per expert)
  bool per_layer_schemes;    // its config describes layers of different schemes
  const char* shard_format;  // the safetensors metadata "format" its files carry, or null to keep the input's

  // Whether `tensor` is the first tensor of a layer in this layout (detection; `config` is
  // config.json, which tells layouts with the same tensors apart); null for a layout that
  // safetensors checkpoints never hold (GGUF).
  bool (*is_primary)(const Checkpoint& ck, const Json& config, std::string_view tensor);
  Layer (*read)(const Checkpoint& ck, const Json& config, const std::string& module);
  // quantize: sets the layout's customary scale rule when the user chose none (may be null), and
  // refuses up front a spec it cannot hold that a layer would not show (may be null).
  void (*default_scale_rule)(QuantSpec& spec);
  void (*check_spec)(const QuantSpec& spec);
  // Appends `l`'s tensors in write order; throws naming the layer when the layout cannot hold it.
  void (*emit)(const Layer& l, std::vector<Out>& out);
  // Writes the quantization block into `config`; returns hf_quant_config.json's content, or null.
  // Null for a layout without a config.json (write_file).
  Json (*write_config)(Json& config, const Scheme& common, const Json& ignore, const QuantMeta& meta);
  // The values a row's length K must be a multiple of when the layout's blocks span several
  // groups (GGUF's nvfp4: 64); null: the group size.
  std::int64_t (*row_block)(Mode mode);
  // Writes the whole output as a file of the layout's own format from the items (GGUF); null for
  // the layouts written as a directory of safetensors shards and configs.
  void (*write_file)(const Input& in, const fs::path& out, std::vector<Item>& items, const QuantMeta& meta,
                     const WriteOptions& opt, Report& report);
  // Holds the FP8 weights of a compressed-tensors float-quantized config group, as they are, beside
  // its own layers (convert of a mixed checkpoint); else they are written dequantized. Its
  // config describes config groups (compressed-tensors'), which detection matches to the layers.
  bool keeps_fp8_groups = false;
  // The FP8 source form whose weights a checkpoint of this layout holds beside its layers (a mixed
  // checkpoint, Detected::mixed): convert into this layout keeps them as they are.
  std::optional<SourceKind> fp8_source = std::nullopt;
  // Refuses such an FP8 weight that the layout's config describes as another format (may be null).
  void (*check_fp8_source)(const Json& config, const SourceWeight& w) = nullptr;
  // The modes its layers can be stored in, and those quantize writes to it when no export is
  // named (default_layout): a mode another layout stores more customarily is left out.
  std::span<const Mode> modes = kFp4Modes;
  std::span<const Mode> default_modes = kFp4Modes;
  // Reads a file of the layout's own format back (GGUF); null for the safetensors layouts, which
  // detection finds in any checkpoint.
  struct FileReader {
    bool (*is_file)(const fs::path& path);  // the path is one of its files (by content)
    InspectResult (*inspect)(const fs::path& path);
    Report (*dequantize)(const fs::path& path, const fs::path& out, const DequantizeOptions& opt);
    Report (*convert)(const fs::path& path, const fs::path& out, const ConvertOptions& opt);
  };
  const FileReader* file_reader = nullptr;

  // Its loaders (vLLM) run a fused group (q/k/v, gate/up) as one GEMM: the members need one format.
  bool fused_loading = false;

  bool holds(Mode m) const { return std::find(modes.begin(), modes.end(), m) != modes.end(); }
};

extern const LayoutOps kCompressedTensorsLayout, kModelOptLayout, kMlxLayout, kGgufLayout;
// The decode factor amax/2688 as a float32 (ModelOpt's weight_scale_2 and input_scale, GGUF's
// ".scale"): a value stored so in one is carried to the other verbatim.
extern const ScaleConvention kDecodeFactor;
std::span<const LayoutOps* const> layouts();
const LayoutOps& layout(Convention c);
// The reader of the layout whose own file `path` is (GGUF), or null (a safetensors checkpoint).
const LayoutOps::FileReader* file_reader_for(const fs::path& path);
// The layout a quantize without --export writes `m` to: the first in layouts() with `m` in its
// default_modes.
const LayoutOps& default_layout(Mode m);
// "a or b" / "a, b or c" over the layouts with `flag` set (all with null), by name or by title.
std::string layouts_with(bool LayoutOps::*flag, bool titles);

// The tensors of `l` in layout `c`, in write order (with empty data when only planning).
// Throws Error naming the layer when `c` cannot hold it.
std::vector<Out> emit(const Layer& l, Convention c);

// Refuses a stacked-experts layer in a layout whose loaders read experts only as per-expert 2-D
// weights (docs/checkpoints.md, "Mixture-of-experts weights").
void check_not_stacked(const Layer& l, const LayoutOps& lay);

// Quantized layers found in a checkpoint and the tensors they use.
struct Detected {
  std::optional<Convention> convention;
  std::vector<Layer> layers;
  std::set<std::string> consumed;        // tensor names that belong to a layer
  std::vector<std::string> unsupported;  // quantized tensors of layouts we cannot read
  std::vector<std::string> strays;       // named like a part of a quantized layer its layout does not read
  Sources sources;                       // weights of a quantized source format (FP8, gpt-oss MXFP4)
  // compressed-tensors: the config groups, and each quantized module's (an index in groups.groups).
  CtGroups groups;
  std::map<std::string, std::size_t> group_of;

  // A layout's layers beside FP8 weights of its own FP8 form (LayoutOps::fp8_source): compressed-tensors
  // float-quantized groups, ModelOpt FP8 layers of a MIXED_PRECISION checkpoint.
  bool mixed() const {
    return convention && !layers.empty() && sources.kind && layout(*convention).fp8_source == sources.kind;
  }

  std::string convention_name() const {
    return convention ? name(*convention) : sources.kind ? name(*sources.kind) : "none";
  }
};
Detected detect(const Checkpoint& ck, const Json& config);
// Refuses strays and unsupported tensors (convert, dequantize, load).
void check_unsupported(const Detected& d);

// Groups of sibling modules that vLLM fuses into one GEMM (q/k/v, gate/up, ...), only groups of
// two or more that are all in `modules`.
std::vector<std::vector<std::string>> fused_groups(const std::vector<std::string>& modules);
// The fused groups of three-level nvfp4 layers, each with its members' amaxes.
struct FusedScales {
  std::vector<std::pair<std::string, float>> members;  // module, amax
  float lo = 0, hi = 0;
  bool differ() const { return lo != hi; }
};
std::vector<FusedScales> fused_global_scales(const std::vector<Layer>& layers);

// Rewrites `config` (an object) for layout `c` and returns hf_quant_config.json (ModelOpt) or
// null. With c unset, removes every quantization block (dequantize).
Json apply_config(Json& config, std::optional<Convention> c, const QuantMeta& meta);

// The module of a layer tensor: the name without any layout's suffix (".weight", ".scales", ...).
std::string module_of(std::string_view tensor_name);

// One tensor an output will hold: its name, the quantized layer it is part of (empty for a tensor
// of its own) and, for messages, what it is written from (an input tensor or a layer's module).
struct OutputTensor {
  std::string_view name, layer, from;
};
// Refuses, before anything is written, an output that holds a name twice, or that its own readers
// would refuse or misread: a tensor of its own named like a part of a quantized layer written
// beside it ("<m>.weight_global_scale" or "<m>.scales" next to layer <m>, in any layout). Every
// export and save_checkpoint passes here; the errors name both tensors.
void check_output_names(const std::vector<OutputTensor>& tensors);

// ---- for the layout modules' readers

const StTensor* find(const Checkpoint& ck, const std::string& name);
const StTensor& need(const Checkpoint& ck, const std::string& module, const std::string& name, const char* what);
void check_shape(const StTensor& t, StDType dt, const Shape& shape);
Shape rows_cols(const StTensor& t);  // refuses all but 2-D
// K of a packed weight: its width in `item_bits`-bit words (U8 or U32) holding `bits`-bit elements.
std::int64_t unpacked_cols(const std::string& m, const StTensor& packed, int item_bits, int bits);
float scalar_f32(const StTensor& t, const std::string& what);
// Whether `tensor` is an MXFP8 weight as compressed-tensors and ModelOpt store it: "<m>.weight"
// F8_E4M3 [N, K] beside "<m>.weight_scale" U8 (E8M0 exponents). FP8 source weights have float
// scales (source_fp8.cpp).
bool is_mxfp8_weight(const Checkpoint& ck, std::string_view tensor);
// Reads such a layer (mode mxfp8, E4M3 elements, group 32).
Layer read_mxfp8(const Checkpoint& ck, const std::string& module);
// quantization_config.quant_method of config.json in lower case, or "".
std::string quant_method(const Json& config);
// Refuses a stored global or activation scale that is invalid, or whose amax is not finite.
void check_global(const Layer& l);

}  // namespace microscale::io::ck
