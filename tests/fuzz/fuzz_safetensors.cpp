// libFuzzer target for the safetensors reader (built and run by tests/fuzz/run.sh).
//
// Any input must either parse or throw microscale::Error; anything else (a crash, a sanitizer
// report, another exception type escaping) is a finding. Inputs that parse are checked against
// the format's invariants and re-serialized: the header the writer would build for the same
// entries must parse back to the same tensors and metadata.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "io/detail.hpp"
#include "microscale/io.hpp"

using namespace microscale;
using namespace microscale::io;

namespace {

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

void check_parsed(const SafetensorsFile& f, const std::uint8_t* data, std::size_t size) {
  const auto* lo = reinterpret_cast<const std::byte*>(data);
  const std::byte* area = lo + 8 + f.header_bytes();
  std::uint64_t expect = 0;
  std::vector<StEntry> entries;
  for (const StTensor& t : f.tensors()) {
    // Tensors tile the data area in file order, each inside the input and sized by its shape.
    require(t.data.data() == area + t.begin, "span start matches data_offsets");
    require(t.begin == expect, "tensors tile the data area");
    require(t.data.data() >= lo && t.data.data() + t.data.size() <= lo + size, "span inside input");
    require(st_nbytes(t.dtype, t.shape) == t.data.size(), "size matches shape x dtype");
    require(f.find(t.name) == &t, "find returns the tensor");
    expect += t.data.size();
    if (t.microscale_dtype()) {
      Tensor c = t.copy();
      require(c.nbytes() == t.data.size(), "copy size");
      require(t.data.empty() || std::memcmp(c.bytes(), t.data.data(), t.data.size()) == 0, "copy bytes");
      try {
        TensorView v = t.view();
        require(v.numel() == t.numel(), "view numel");
      } catch (const Error&) {
        // misaligned data: allowed to refuse
      }
    }
    entries.push_back({t.name, t.dtype, t.shape});
  }
  require(8 + f.header_bytes() + expect == size, "no trailing bytes");

  // Round trip through the writer's header builder.
  std::string header = detail::build_header(entries, f.metadata(), "fuzz-rewrite");
  std::vector<std::byte> again(8 + header.size() + expect);
  for (int i = 0; i < 8; ++i)
    again[static_cast<std::size_t>(i)] = static_cast<std::byte>((header.size() >> (8 * i)) & 0xFF);
  std::memcpy(again.data() + 8, header.data(), header.size());
  if (expect) std::memcpy(again.data() + 8 + header.size(), area, expect);
  SafetensorsFile g = SafetensorsFile::open_memory(again.data(), again.size(), "fuzz-rewrite");
  require(g.size() == f.size(), "rewrite keeps the tensor count");
  require(g.metadata() == f.metadata(), "rewrite keeps metadata");
  for (std::size_t i = 0; i < f.size(); ++i) {
    const StTensor &a = f.tensors()[i], &b = g.tensors()[i];
    require(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.begin == b.begin,
            "rewrite keeps entries in order");
    require(a.data.size() == b.data.size() &&
                (a.data.empty() || std::memcmp(a.data.data(), b.data.data(), a.data.size()) == 0),
            "rewrite keeps bytes");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    SafetensorsFile f = SafetensorsFile::open_memory(data, size, "fuzz");
    check_parsed(f, data, size);
  } catch (const Error&) {
    // a clean rejection
  }
  return 0;
}
