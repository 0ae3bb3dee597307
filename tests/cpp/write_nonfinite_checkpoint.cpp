// Writes DIR/model.safetensors: one 4 x 128 float32 projection weight holding a single NaN, the
// input of the cli_eval_nonfinite_weight test (a checkpoint is how a user feeds weights to eval).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <span>
#include <vector>

#include "microscale/io.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  const std::int64_t rows = 4, cols = 128;
  std::vector<float> w(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(static_cast<int>(i % 17) - 8);
  w[5] = std::nanf("");
  namespace io = microscale::io;
  io::save_safetensors(
      dir / "model.safetensors",
      {{"model.layers.0.mlp.up_proj.weight", io::StDType::f32, {rows, cols}, std::as_bytes(std::span(w))}});
  return 0;
}
