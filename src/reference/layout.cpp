#include <cstring>

#include "microscale/quantize.hpp"
#include "reference/reference.hpp"

namespace microscale::reference {
namespace {
std::int64_t roundup(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }
}  // namespace

void swizzle(const std::uint8_t* compact, std::int64_t R, std::int64_t C, std::uint8_t* out) {
  const std::int64_t cp = roundup(C, 4);
  std::memset(out, 0, static_cast<std::size_t>(roundup(R, 128) * cp));  // padding must be zero
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t c = 0; c < C; ++c) out[swizzled_offset(r, c, cp)] = compact[r * C + c];
}

void unswizzle(const std::uint8_t* swizzled, std::int64_t R, std::int64_t C, std::uint8_t* out) {
  const std::int64_t cp = roundup(C, 4);
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t c = 0; c < C; ++c) out[r * C + c] = swizzled[swizzled_offset(r, c, cp)];
}

}  // namespace microscale::reference
