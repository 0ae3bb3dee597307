#include "microscale/runtime.hpp"

namespace microscale {

const char* name(Backend b) {
  switch (b) {
    case Backend::cpu: return "cpu";
    case Backend::reference: return "reference";
  }
  return "?";
}

std::optional<Backend> backend_from_name(std::string_view text) {
  for (Backend b : {Backend::cpu, Backend::reference})
    if (text == name(b)) return b;
  return std::nullopt;
}

}  // namespace microscale
