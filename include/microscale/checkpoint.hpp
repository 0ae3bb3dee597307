// Whole-checkpoint operations on Hugging Face style model directories: quantize the projection
// weights into one ecosystem's layout, dequantize back to floats, convert between layouts without
// re-quantizing, inspect, and load/save quantized layers in memory.
//
// Layouts (docs/checkpoints.md), per quantized Linear `<m>` with logical weight [N, K]:
//   compressed-tensors  <m>.weight_packed U8 [N, K/2], <m>.weight_scale F8_E4M3 [N, K/16] (nvfp4) or
//                       U8 E8M0 [N, K/32] (mxfp4), <m>.weight_global_scale F32 [1] = 2688/amax
//                       (nvfp4; the encode factor), <m>.input_global_scale F32 [1] (W4A4 only);
//                       mxfp8: <m>.weight F8_E4M3 [N, K], <m>.weight_scale U8 [N, K/32];
//                       config.json quantization_config (quant_method "compressed-tensors"), a
//                       config group per format.
//   modelopt            <m>.weight U8 [N, K/2], <m>.weight_scale F8_E4M3 [N, K/16],
//                       <m>.weight_scale_2 F32 [] = amax/2688 (the decode factor), <m>.input_scale
//                       F32 [] (W4A4 only); mxfp8 as compressed-tensors'; hf_quant_config.json
//                       (MIXED_PRECISION with quantized_layers when formats differ) and config.json
//                       quantization_config (quant_method "modelopt").
//   mlx                 <m>.weight U32 [N, K*bits/32], <m>.scales [N, K/group] (U8 codes for fp
//                       modes, the weight's dtype for affine), <m>.biases (affine); config.json
//                       "quantization" {group_size, bits, mode} mirrored as "quantization_config".
//                       nvfp4 is two-level there (mlx-lm stores no global scale).
//   gguf                one llama.cpp GGUF file (or its split files), not a directory: tensors named
//                       and laid out as llama.cpp's converter writes them, nvfp4/mxfp4 weights in
//                       ggml's blocks, the nvfp4 decode factor amax/2688 as a separate F32
//                       "<weight>.scale" tensor, and the tokenizer from the model directory
//                       (docs/gguf.md).
// Packed bytes and block scales are the same bytes in every layout; only names, dtype labels,
// shapes and the global-scale convention differ. In memory microscale keeps the global scale as
// the tensor amax (QuantSpec::global_scale); import is amax = fl(2688/gs) (compressed-tensors)
// or fl(ws2*2688) (ModelOpt), export the inverse, so a value that crosses conventions moves by at
// most about one f32 ulp. Converting into the layout a value came from keeps its bytes exactly.
//
// Fused projections (q/k/v, gate/up, w1/w3, BERT query/key/value) are one GEMM in vLLM, which
// keeps a single global scale for the fused weight (the max of the shards', only warning). So
// quantize_checkpoint gives the members of such a group one global scale, the group's largest
// amax, as ModelOpt and llm-compressor do; convert_checkpoint never merges differing scales
// silently: it keeps them per shard and reports the group (or re-quantizes it with
// ConvertOptions::unify_fused_scales).
//
// Activations: no calibration happens here, so exported configs are weight-only (NVFP4A16 /
// W4A16_NVFP4) unless per-module activation amaxes are supplied; a W4A4 request without them is
// refused.
//
// The whole output is built in a hidden sibling directory `.<out>.tmp.<pid>` and moved into place
// at the end (swapped atomically with an existing one under `force`, which keeps the old
// directory's files that are not part of a checkpoint). So an error, a full disk or a kill leaves
// `out` as it was or complete, never a mix; a staging directory left by a kill is refused by every
// operation here and removed by the next run into the same `out`. An existing non-empty output
// directory is refused unless `force`, and even then unless it holds a checkpoint (config.json or
// a .safetensors file): a previous output, not a home or project directory. Tensors stream one at a time, so peak
// memory stays near the largest single tensor (input pages are released after use). The progress callback may throw to
// stop a run (the CLI does on SIGINT/SIGTERM); nothing is left behind then.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "microscale/gptq.hpp"
#include "microscale/io.hpp"
#include "microscale/quantize.hpp"

namespace microscale::io {

enum class Convention { compressed_tensors, modelopt, mlx, gguf };
const char* name(Convention c);  // "compressed-tensors", "modelopt", "mlx", "gguf"
// Accepts those names (and "ct"); throws Error otherwise.
Convention convention_from_name(std::string_view s);
// Every convention, in the order detection tries them.
std::vector<Convention> conventions();
// What quantize writes mode `m` to without an explicit export: the first convention that holds it
// (compressed-tensors for nvfp4 and mxfp4, mlx for mxfp8 and affine).
Convention default_convention(Mode m);
// Whether the layout stores static activation scales (W4A4 nvfp4 configs).
bool stores_activation_scales(Convention c);
// Whether it is a model directory (safetensors shards and configs) that save_checkpoint writes,
// rather than a file of its own (GGUF).
bool is_model_directory(Convention c);

// Progress of a streaming operation, reported after each tensor (or layer) is done.
struct Progress {
  std::size_t done = 0, total = 0;                // tensors / layers
  std::uint64_t bytes_done = 0, bytes_total = 0;  // input bytes
  std::string_view current;                       // name of the item just finished
};
using ProgressFn = std::function<void(const Progress&)>;

// What happened to one tensor or layer.
enum class TensorAction { quantized, kept, copied, converted, re_quantized, dequantized };
const char* name(TensorAction a);  // "quantized", "kept", "copied", "converted", "re-quantized", "dequantized"

struct TensorReport {
  std::string name;  // tensor name, or module name for a quantized layer
  TensorAction action = TensorAction::copied;
  std::string format;  // "nvfp4", "mxfp4", ..., or the dtype for float tensors
  Shape shape;
  std::uint64_t bytes_in = 0, bytes_out = 0;
  std::string reason;               // why a weight (2-D or more, or stacked experts) was kept, when it was
  std::int64_t nonfinite = 0;       // NaN/Inf values in a quantized weight, or in a dequantized one
                                    // (warned about; fatal under NonFinite::error)
  std::optional<double> rel_error;  // ||w - dq(q(w))|| / ||w||, when measured
  std::optional<double> sqnr_db;
};
// What --budget chose for one layer, or for a fused group (q/k/v, gate/up) that takes one format.
struct BudgetReport {
  std::string layers;  // the module, or the group's modules joined by '+'
  std::string format;  // the candidate chosen, as written
  double bits = 0;     // bits per weight, scales included
  double error = 0;    // the estimated error (docs/checkpoints.md, "Choosing formats under a budget")
};
struct Report {
  std::vector<TensorReport> tensors;
  std::vector<BudgetReport> budget;  // quantize --budget: one entry per choice, in checkpoint order
  std::vector<std::string> notes;    // warnings and decisions worth telling the user
  std::uint64_t bytes_in = 0, bytes_out = 0;
  std::size_t shards = 0;
  bool published = true;  // false for a split run's part that left publishing the output to another part
};

// What a run reads, so that nothing it writes lands on it: a checkpoint's shards, its index,
// config.json and hf_quant_config.json, and the files options name (--hessians, --activation-amax).
// The output directory (quantize, convert, dequantize) and the CLI's report files (--errors-csv,
// eval's --csv and --svg) are checked against it before any work starts.
class RunInputs {
 public:
  RunInputs() = default;
  // The checkpoint at `model` (a model directory, an index .json or a .safetensors file; an index's
  // shards are listed, not opened). A directory or an index also claims its whole directory: what
  // it holds is the model's (tokenizer, generation config), and outputs copy it.
  explicit RunInputs(const std::filesystem::path& model);
  RunInputs(const std::filesystem::path& model, const Checkpoint& ck);  // `model` opened as `ck`
  // The file an option names ("--hessians"); one that does not exist is skipped (reading it fails).
  void add(const std::string& option, const std::filesystem::path& file);

  // Throws Error naming `option` when writing the file `path` would destroy an input: `path` is an
  // input file (the same file by any name, link or hard link) or lies in the model directory.
  void check_output_file(const std::string& option, const std::filesystem::path& path) const;
  // Throws Error when the output directory `dir` (written by swapping a whole directory into its
  // place) is the model directory, or holds an input or the model directory.
  void check_output_dir(const std::filesystem::path& dir) const;

 private:
  struct File {
    std::string what;  // "shard 'm/model.safetensors'", "--hessians file 'h.safetensors'"
    std::filesystem::path path;
    std::uint64_t dev = 0, ino = 0;
  };
  void add_file(std::string what, const std::filesystem::path& file);
  std::vector<File> files_;
  std::filesystem::path dir_;  // the model directory, links resolved; empty for a single file
  std::string dir_name_;       // as given, for messages
};

// One process of a quantize split across `count` processes (QuantizeOptions::part). Every part
// plans the whole output from the source alone, writes every count-th output shard (those whose
// position among the output shards is `index` mod `count`) into a staging directory
// `.<out>.tmp.parts` shared next to `out`, and marks itself done; the part that finds every part
// done writes the index, config and other files and publishes `out`, byte-identical to a
// single-process run. Parts that disagree on the source's layout or the options are refused, as
// is any other command writing `out` until the missing parts ran (the same command again) or the
// staging directory is deleted.
struct Part {
  int index = 0, count = 1;
};

// One layer's format in a recipe (QuantizeOptions::recipe) or among --budget's candidates: a
// quantized spec, or high precision. Written "FORMAT[,key=value...]" (docs/checkpoints.md,
// "Recipes"): FORMAT nvfp4, mxfp4, mxfp8, affine2 to affine8, or keep; keys scale_search,
// scale_rule, group_size, elem (mxfp8), scale_2d (nvfp4) and levels (nvfp4: 3 stores the tensor's
// global scale where the layout can, 2 fixes it at encode factor 1, the two-level form).
struct LayerFormat {
  std::optional<QuantSpec> spec;  // unset: the layer stays in high precision
  bool scale_rule_set = false;    // else the layout's customary mx rule applies
  int levels = 0;                 // nvfp4: 2 or 3 as written; 0: 3 where the layout stores a global scale
  std::string text;               // as written, for reports and the --budget-csv
  bool keep() const { return !spec.has_value(); }
};
// Throws Error naming `what` ("--layer", "recipe.json rule 2") on an unknown format or key.
LayerFormat parse_layer_format(const std::string& text, const std::string& what);

// The modules `pattern` matches (the glob of --include) take `format`; rules are tried in order
// and the first that matches a layer decides it.
struct RecipeRule {
  std::string pattern;
  LayerFormat format;
};
// A recipe file: JSON {"rules": [{"match": GLOB, "format": "mxfp8"}, {"match": GLOB, "format":
// "nvfp4", "scale_search": "mse"}, ...]} (the keys of parse_layer_format beside "format", or
// written into it). Errors name the file and the rule.
std::vector<RecipeRule> read_recipe(const std::filesystem::path& path);

struct QuantizeOptions {
  // mode, group_size, bits, scale_rule, nonfinite, elem; global_scale is ignored. Non-finite
  // weights are counted per tensor (TensorReport::nonfinite); NonFinite::error refuses them. (nvfp4 exports
  // that store one use each tensor's amax, or its fused group's). mx scale rule: compressed-tensors
  // mxfp4 uses 'even' (as llm-compressor) unless `scale_rule_set`.
  QuantSpec spec;
  bool scale_rule_set = false;
  Convention to = Convention::compressed_tensors;
  // Glob patterns (`*`, `?`, `[...]`) over module names (the tensor name without ".weight"); a
  // pattern also matches any dotted suffix ("down_proj" matches "model.layers.0.mlp.down_proj").
  // A pattern that matches no module, an include that selects nothing quantizable and an
  // activation amax for a module that is not quantized are errors (typos must not pass).
  std::vector<std::string> exclude;  // never quantize these
  std::vector<std::string> include;  // quantize these 2-D weights even if kept by default
                                     // (lm_head, embeddings, routers)
  bool share_fused_scales = true;    // one global scale per fused group (nvfp4, CT / ModelOpt)
  // Activation amax per module (static, from the user's calibration): when given for every
  // quantized layer, the config is W4A4 and input scales are stored. Otherwise weight-only.
  std::map<std::string, float> activation_amax;
  bool w4a4 = false;           // demand W4A4: refused unless activation_amax covers every layer
  bool measure_error = false;  // fill TensorReport::rel_error / sqnr_db (one dequantize per layer)
  // GPTQ (microscale/gptq.hpp) for the layers this safetensors file holds H = X^T X for: [K, K]
  // F32 or F64 tensors named by module ("model.layers.0.mlp.down_proj") or weight
  // ("...down_proj.weight"); the other layers round to nearest. Empty: none. A name that matches
  // no quantized layer, a wrong shape or dtype, and scale search together with it are errors.
  std::filesystem::path hessians;
  GptqOptions gptq;
  // Per-layer formats; layers no rule matches take `spec`. A rule that matches no layer is an error.
  std::vector<RecipeRule> recipe;
  // Average bits per weight, scales included, over the layers to quantize: each layer no recipe
  // rule pins takes the candidate that minimises the summed estimated error within the budget
  // (docs/checkpoints.md, "Choosing formats under a budget"); with `hessians`, the error is
  // trace(dW H dW^T) for the layers it covers (no GPTQ then). Empty candidates: nvfp4 with mse
  // scale search, mxfp8 and keep.
  std::optional<double> budget_bits;
  std::vector<LayerFormat> candidates;
  std::filesystem::path budget_csv;  // tensor,format,bits,error,chosen: one row per layer and candidate
  bool force = false;
  Part part;  // count 1: the whole checkpoint in this process
  // GGUF only: split the file into llama.cpp's "<name>-0000i-of-0000n.gguf" files of at most this
  // many bytes each (a tensor larger than that gets a file of its own); 0: one file.
  std::uint64_t split_bytes = 0;
  ProgressFn progress;
};
// `in`: a model directory (config.json + model.safetensors or an index with shards) or a single
// .safetensors file; `out`: the output directory (created). Every weight-like tensor left in high
// precision (3-D stacked experts, float64, kept names, excluded) is reported as "kept" with its
// reason, and the config's ignore list names the Linear ones. GPT-2 Conv1D weights ([in, out])
// are refused unless excluded.
Report quantize_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                           const QuantizeOptions& opt);

// The activation amaxes of an `--activation-amax` file for QuantizeOptions::activation_amax: a
// JSON object {module: amax}, read as strictly as a checkpoint's own JSON (a duplicate module or
// deep nesting is refused). Each amax is a number, 0 or from 2688 x FLT_MIN (about 3.2e-35) to
// FLT_MAX: below that its activation scale is no normal float32 (docs/checkpoints.md). Errors
// name the file and the module.
std::map<std::string, float> read_activation_amax(const std::filesystem::path& path);

struct DequantizeOptions {
  // float32, float16 or bfloat16; unset: the dtype the checkpoint was quantized from (config.json
  // torch_dtype), bfloat16 when that is not recorded. The written config's torch_dtype says it.
  std::optional<DType> dtype;
  // NaN and Inf in the values written (NaN scale codes; values beyond float16's range): counted per
  // tensor (TensorReport::nonfinite) under propagate, refused naming the tensor under error (nothing
  // is published); saturate is not an option here.
  NonFinite nonfinite = NonFinite::propagate;
  bool force = false;
  ProgressFn progress;
};
// Quantized layers of any supported layout back to `<m>.weight` floats; the quantization config
// is removed, everything else is kept.
Report dequantize_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                             const DequantizeOptions& opt);

struct ConvertOptions {
  Convention to = Convention::mlx;
  // Re-quantize fused groups whose global scales differ to their common max amax (lossy for
  // those layers; everything else keeps its bytes). Without it such groups are kept per shard
  // and listed in Report::notes.
  bool unify_fused_scales = false;
  bool force = false;
  std::uint64_t split_bytes = 0;  // GGUF only, as QuantizeOptions::split_bytes
  ProgressFn progress;
};
// Same quantized bytes, other layout. Throws Error (before writing anything) when a layer cannot
// be represented: a mode the target lacks, or three-level nvfp4 into MLX's two-level layout.
Report convert_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out, const ConvertOptions& opt);

// ---- inspection

struct TensorStats {
  bool valid = false;  // false for tensors without values to summarize (ints, bools, ...)
  double min = 0, max = 0, mean = 0, std = 0, amax = 0;
  std::int64_t nonfinite = 0, zeros = 0;
};
struct InspectRow {
  std::string name, dtype;
  Shape shape;
  std::string format;  // "bf16" for plain tensors; "nvfp4 packed", "nvfp4 scales E4M3", ...
  std::string detail;  // e.g. "weight_global_scale 3584 = 2688/amax -> amax 0.75"
  TensorStats stats;   // packed rows: the dequantized layer; scale rows: decoded scales
};
struct InspectResult {
  std::string convention;  // "compressed-tensors", "modelopt", "mlx" or "none"
  std::string config;      // summary of the quantization config found, if any
  std::vector<InspectRow> rows;
  std::vector<std::string> notes;
};
InspectResult inspect_checkpoint(const std::filesystem::path& path, bool stats = true, const ProgressFn& progress = {});

// ---- in-memory checkpoints (the Python load_checkpoint / save_checkpoint)

struct QuantizedLayer {
  std::string module;               // "model.layers.0.mlp.down_proj"
  Quantized weight;                 // spec.global_scale = amax for three-level nvfp4
  std::optional<float> input_amax;  // static activation amax (W4A4 checkpoints)
};
struct RawTensor {
  std::string name;
  StDType dtype = StDType::f32;
  Shape shape;
  std::vector<std::byte> data;
};
struct CheckpointData {
  std::string convention;  // as detected; "none" for a float checkpoint
  std::vector<QuantizedLayer> layers;
  std::vector<RawTensor> tensors;  // everything that is not part of a quantized layer
  std::string config_json;         // config.json text ("" when absent)
};
CheckpointData load_checkpoint(const std::filesystem::path& path);
// Writes model.safetensors and config.json (from data.config_json, quantization block replaced)
// into `out` in the layout `to`, plus hf_quant_config.json for ModelOpt.
void save_checkpoint(const std::filesystem::path& out, const CheckpointData& data, Convention to, bool force = false);

// The default selection rule of quantize_checkpoint: a float 2-D "<m>.weight" of a projection;
// returns "" when it would be quantized, else why not ("1-D", "embedding", "lm_head", ...).
std::string why_kept(std::string_view name, const Shape& shape, StDType dtype);
// The weights of the checkpoint at `model` that the default rule selects and that are GPT-2 style
// Conv1D weights, stored [in, out] (transposed from Linear's [out, in]; config.json decides, as
// for quantize_checkpoint): their quantization groups run along the first axis.
std::vector<std::string> conv1d_weights(const std::filesystem::path& model);

}  // namespace microscale::io
