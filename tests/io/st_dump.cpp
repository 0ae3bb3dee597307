// Test tool for the Python cross-check (check_with_safetensors.py): prints safetensors files and
// checkpoints as JSON, and writes files and indexes from a JSON description, so that the
// reference `safetensors` package and microscale can read each other's output.
//
//   st_dump FILE                     {"metadata": {..}, "tensors": [{name, dtype, shape, data: hex}]}
//   st_dump --checkpoint PATH        same for a checkpoint (after validate()), plus "total_size"
//   st_dump --write OUT SPEC.json    writes SPEC (same JSON shape) with SafetensorsWriter, each
//                                    tensor streamed in chunks of at most 5 bytes
//   st_dump --index INDEX SHARD...   write_index
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "microscale/io.hpp"

namespace {

using namespace microscale::io;
using Json = nlohmann::ordered_json;

std::string hex(std::span<const std::byte> b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  s.reserve(b.size() * 2);
  for (std::byte x : b) {
    s += d[std::to_integer<int>(x) >> 4];
    s += d[std::to_integer<int>(x) & 15];
  }
  return s;
}

std::vector<std::byte> unhex(const std::string& s) {
  std::vector<std::byte> b(s.size() / 2);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  return b;
}

Json tensor_json(const StTensor& t) {
  return Json{{"name", t.name}, {"dtype", t.dtype_name()}, {"shape", t.shape}, {"data", hex(t.data)}};
}

int run(int argc, char** argv) {
  const std::vector<std::string> a(argv + 1, argv + argc);
  if (a.size() == 1) {
    SafetensorsFile f = SafetensorsFile::open(a[0]);
    Json j{{"metadata", Json(f.metadata())}, {"tensors", Json::array()}};
    for (const StTensor& t : f.tensors()) j["tensors"].push_back(tensor_json(t));
    std::cout << j.dump() << "\n";
    return 0;
  }
  if (a.size() == 2 && a[0] == "--checkpoint") {
    Checkpoint c = Checkpoint::open(a[1]);
    c.validate();
    Json j{{"metadata", Json(c.metadata())}, {"tensors", Json::array()}};
    if (c.total_size()) j["total_size"] = *c.total_size();
    for (const std::string& n : c.names()) j["tensors"].push_back(tensor_json(c.tensor(n)));
    std::cout << j.dump() << "\n";
    return 0;
  }
  if (a.size() == 3 && a[0] == "--write") {
    std::ifstream in(a[2]);
    Json spec = Json::parse(in);
    std::vector<StEntry> entries;
    std::vector<std::vector<std::byte>> data;
    for (const Json& t : spec["tensors"]) {
      auto dt = st_dtype_from_name(t["dtype"].get<std::string>());
      if (!dt) throw microscale::Error("unknown dtype in spec");
      entries.push_back({t["name"], *dt, t["shape"].get<microscale::Shape>()});
      data.push_back(unhex(t["data"]));
    }
    Metadata md = spec["metadata"].get<Metadata>();
    SafetensorsWriter w(a[1], entries, md);
    for (std::size_t i = 0; i < entries.size(); ++i) {
      std::span<const std::byte> s(data[i]);
      w.write(entries[i].name, s.subspan(0, 0));
      for (std::size_t o = 0; o < s.size(); o += 5)
        w.write(entries[i].name, s.subspan(o, std::min<std::size_t>(5, s.size() - o)));
    }
    w.finish();
    return 0;
  }
  if (a.size() >= 2 && a[0] == "--index") {
    std::vector<std::filesystem::path> shards(a.begin() + 2, a.end());
    write_index(a[1], shards);
    return 0;
  }
  std::cerr << "usage: st_dump FILE | --checkpoint PATH | --write OUT SPEC | --index INDEX SHARD...\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "st_dump: " << e.what() << "\n";
    return 1;
  }
}
