// What llama.cpp's converter (convert_hf_to_gguf.py) writes for a Hugging Face architecture: the
// architecture key and its hyperparameters, and each tensor's GGUF name and treatment.
// docs/gguf.md lists the architectures and the rules.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/gguf_file.hpp"

namespace microscale::io::gguf {

// How one tensor is written.
struct TensorRule {
  std::string name;       // GGUF name: "blk.0.attn_q.weight"
  int permute_heads = 0;  // Llama-family q/k rows regrouped per head (docs/gguf.md); 0: unchanged
  bool plus_one = false;  // Gemma's RMSNorm weights: llama.cpp stores w + 1
  bool f32 = false;       // stored as F32 whatever the source dtype (norms, biases, 1-D tensors)
  bool skip = false;      // not written (buffers llama.cpp recomputes, e.g. rotary inv_freq)
};

// A 1-D F32 tensor the converter computes from the config rather than reads from the checkpoint.
struct ExtraTensor {
  std::string name;  // "rope_freqs.weight"
  std::vector<float> values;
};

struct ArchPlan {
  std::string hf_type;           // config model_type: "qwen3_moe"
  std::string arch;              // general.architecture: "qwen3moe"
  std::vector<Kv> kvs;           // general.architecture and the "<arch>.*" hyperparameters
  std::int64_t vocab_size = 0;   // config vocab_size; 0 where the config has none
  bool tied_embeddings = false;  // no output.weight: llama.cpp uses token_embd.weight
  // Llama 3's rope_freqs (rope_type "llama3"), Phi-3's long/short rope factors (longrope configs).
  std::vector<ExtraTensor> extra_tensors;
};

// Throws Error naming model_type (and the supported ones) for an architecture without a GGUF
// form here, and naming the key for a config missing a hyperparameter llama.cpp needs.
ArchPlan arch_plan(const Json& config);

// general.file_type (llama_ftype) the converter writes for a file whose quantized weights are of
// type `weights`: NVFP4 wins over MXFP4 in a file holding both, as in the converter.
std::uint32_t llama_file_type(GgmlType weights);

// The rule for a tensor name as the exporter presents it: the checkpoint's own names, where
// per-expert weights "<p>.experts.<e>.<proj>.weight" are stacked first and presented as
// "<p>.switch_mlp.<proj>.weight" ([experts, N, K]), and a quantized layer "<m>" adds
// "<m>.scale" (its nvfp4 decode factor amax/2688) and "<m>.input_scale" (W4A4). nullopt: the
// architecture has no such tensor (the exporter refuses, naming it).
std::optional<TensorRule> tensor_rule(const ArchPlan& a, std::string_view hf_name);

// Reading a GGUF back (gguf_import.cpp): every tensor name, as the exporter presents them, that
// the architecture knows for `blocks` layers (tensor_rule maps each to its GGUF name), and a
// transformers config.json rebuilt from the keys: the architecture and the hyperparameters
// llama.cpp keeps, `vocab_size` from the embedding's rows and tie_word_embeddings from whether the
// file has an output.weight. Throws Error naming general.architecture when it is not one of these.
std::vector<std::string> hf_names(const ArchPlan& a, std::int64_t blocks);
Json hf_config(const std::vector<Kv>& kvs, std::int64_t vocab_size, bool has_output);

}  // namespace microscale::io::gguf
