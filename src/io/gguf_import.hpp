// Reading a GGUF back (docs/gguf.md, "Reading GGUF"): inspect, dequantize, and convert into the
// safetensors layouts, moving the NVFP4/MXFP4 codes and scale bytes out of ggml's blocks unchanged
// and undoing what the export did (q/k row order, Gemma's norm + 1, stacked experts).
#pragma once

#include <filesystem>

#include "microscale/checkpoint.hpp"

namespace microscale::io::ck {

// A regular file that starts with GGUF's magic.
bool is_gguf_file(const std::filesystem::path& path);
Report convert_gguf(const std::filesystem::path& in, const std::filesystem::path& out, const ConvertOptions& opt);
Report dequantize_gguf(const std::filesystem::path& in, const std::filesystem::path& out, const DequantizeOptions& opt);
InspectResult inspect_gguf(const std::filesystem::path& in);

}  // namespace microscale::io::ck
