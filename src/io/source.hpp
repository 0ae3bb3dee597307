// Quantized source checkpoints: formats microscale reads, dequantizes and re-quantizes but does
// not write (docs/checkpoints.md, "Quantized sources"): FP8 releases (DeepSeek / Qwen block FP8,
// compressed-tensors FP8, ModelOpt FP8) and gpt-oss MXFP4 experts. Each weight decodes to float
// values on its own, one tensor at a time.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "io/layer.hpp"
#include "microscale/codecs.hpp"

namespace microscale::io::ck {

struct Item;   // write_pipeline.hpp
struct Input;  // model_dir.hpp

enum class SourceKind { fp8_block, ct_fp8, modelopt_fp8, gptoss_mxfp4 };
// "fp8-block", "compressed-tensors fp8", "modelopt fp8", "gpt-oss mxfp4"
const char* name(SourceKind k);
bool is_fp8(SourceKind k);

// One quantized weight of a source checkpoint and the float tensor it decodes to.
struct SourceWeight {
  std::string module;  // "model.layers.0.mlp.down_proj"; gpt-oss: "model.layers.0.mlp.experts.gate_up_proj"
  std::string data;    // FP8: "<module>.weight" (E4M3 [N, K]); gpt-oss: "<module>_blocks" (U8 [E, N, K/32, 16])
  std::string scale;   // FP8: "<module>.weight_scale_inv" or ".weight_scale"; gpt-oss: "<module>_scales" (E8M0)
  std::string output;  // the float tensor written: "<module>.weight"; gpt-oss: "<module>"
  Shape shape;         // of `output`: [N, K]; gpt-oss: [E, K, N], transposed as transformers keeps it
  // FP8: the weight elements one scale covers, rows x columns (the whole tensor for a per-tensor
  // scale, 1 x K per channel, 128 x 128 for DeepSeek blocks; edge blocks may be partial).
  std::int64_t block_rows = 1, block_cols = 1;
  std::string describe() const;  // "E4M3, weight_scale_inv per 128x128 block" for messages and inspect
};

struct Sources {
  std::optional<SourceKind> kind;
  std::vector<SourceWeight> weights;
  // Activation and KV-cache scales of the FP8 formats: meaningless once the weights are float.
  std::vector<std::string> dropped;
  std::set<std::string> consumed;  // weights, their scales and the dropped tensors

  // The weight whose data (or, with `scale`, whose scale) tensor is `tensor`, or null.
  const SourceWeight* find(const std::string& tensor, bool scale = false) const;

 private:
  friend Sources scan_sources(const Checkpoint&, const Json&, const std::set<std::string>&);
  std::map<std::string, std::size_t> data_index_, scale_index_;  // tensor -> index in `weights`
};

// Finds the source weights of a checkpoint. Throws Error naming the tensor on a malformed one
// (missing or misshapen scale, non-finite FP8 scale, a config that contradicts the tensors);
// `consumed` holds tensors already read as layers of microscale's own layouts.
Sources scan_sources(const Checkpoint& ck, const Json& config, const std::set<std::string>& consumed);

// The float values of `w` in dtype `dt` (float32, float16 or bfloat16), shaped `w.shape`. FP8:
// the float32 product E4M3 value x scale (the one IEEE multiplication transformers, vLLM and
// DeepSeek's own code do), then rounded to nearest-even into `dt`. gpt-oss: E2M1 x 2^(e - 127),
// exact in float32 and bfloat16. Throws naming the tensor on a NaN E8M0 scale (0xFF).
Tensor decode_source(const Checkpoint& ck, const SourceWeight& w, DType dt);

// What quantize reads for input tensor `name`: a view of its bytes, or, for an FP8 source weight,
// its float32 values decoded into `storage`.
TensorView float_values(const Checkpoint& ck, const Sources& s, const std::string& name, Tensor& storage);

// quantize: refuses sources it cannot take (gpt-oss stacked experts), and notes the dropped scales.
void check_quantizable(const Sources& s, const std::string& input);
void note_dropped(const Sources& s, Report& report);
// convert: refused, saying what works instead (FP8 into any layout; gpt-oss MXFP4 into ModelOpt,
// which has no form for its stacked experts).
[[noreturn]] void refuse_convert(const Sources& s, const std::string& input, Convention to);

// An item writing `w` decoded to `dt` as `w.output`, reported with `action` (and `reason`); with
// `nonfinite`, its NaN and Inf are counted and checked (check_nonfinite).
Item source_item(const Input& in, const SourceWeight& w, DType dt, Report& report, TensorAction action,
                 std::string reason = "", std::optional<NonFinite> nonfinite = std::nullopt);

// ---- for the source forms' modules (source_fp8.cpp, source_gptoss.cpp)

// config.json's quantization_config object, or null.
const Json* quantization_config(const Json& config);
// A string field of `obj` in lower case; "" when `obj` is null or the field is absent or no string.
std::string lower_field(const Json* obj, const char* key);

// Element i of a float32, bfloat16 or float16 buffer set to v (rounded to nearest-even).
template <DType D>
void store(std::byte* out, std::size_t i, float v) {
  if constexpr (D == DType::float32) {
    std::memcpy(out + 4 * i, &v, 4);
  } else {
    const std::uint16_t h = D == DType::bfloat16 ? encode_bf16(v) : encode_f16(v);
    std::memcpy(out + 2 * i, &h, 2);
  }
}
void put(std::byte* out, DType dt, std::size_t i, float v);

}  // namespace microscale::io::ck
