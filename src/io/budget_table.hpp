// quantize --budget (docs/checkpoints.md, "Choosing formats under a budget"): the error table of
// every free layer under every candidate, the exact choice (budget.hpp), and the chosen
// quantizations kept for the write so that no layer is quantized twice in one format.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "io/budget.hpp"
#include "io/quantize_layer.hpp"

namespace microscale::io::ck {

// Quantized layers spilled to an unnamed temporary file beside the output (it vanishes with the
// process, however it ends): the table quantizes every candidate, and only the chosen ones are
// read back.
class QuantSpill {
 public:
  explicit QuantSpill(const std::filesystem::path& dir);
  ~QuantSpill();
  QuantSpill(const QuantSpill&) = delete;
  QuantSpill& operator=(const QuantSpill&) = delete;

  struct Entry {
    QuantSpec spec;
    Shape shape;
    struct Part {
      DType dtype;
      Shape shape;
      std::uint64_t offset = 0;
    };
    std::vector<Part> parts;           // packed, scales and (affine) biases
    std::vector<float> expert_amaxes;  // LayerQuant::expert_globals as amaxes
    std::int64_t nonfinite = 0;
  };
  Entry put(const LayerQuant& lq, std::int64_t nonfinite);
  LayerQuant get(const Entry& e) const;

 private:
  int fd_ = -1;
  std::uint64_t end_ = 0;
  std::string where_;  // for messages
};

struct BudgetTable {
  std::vector<BudgetLayer> layers;
  BudgetChoice choice;
  std::unique_ptr<QuantSpill> spill;
  std::map<std::string, QuantSpill::Entry> chosen;  // module -> its chosen quantization
};

// Fills the table (each free layer read once, quantized once per candidate, as the write would),
// chooses, and applies the choice to `plan` (apply_choice). `out` is the output path, beside
// which the quantizations are spilled; `report` gets the choice and a note.
BudgetTable choose_formats(QuantizePlan& plan, const Input& in, const Detected& det, const QuantizeOptions& opt,
                           const std::filesystem::path& out, Report& report);

}  // namespace microscale::io::ck
