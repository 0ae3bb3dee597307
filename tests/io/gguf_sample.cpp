// Test tool for check_with_gguf.py: writes a GGUF holding a key of every value type, nvfp4 and
// mxfp4 tensors quantized by microscale (in ggml's blocks) and f32/f16/bf16 tensors, so that
// llama.cpp's gguf package can read it and decode it.
//
//   gguf_sample OUT_DIR   writes OUT_DIR/sample.gguf and, per tensor NAME, NAME.input.f32 (the
//                         float data) and, for nvfp4 and mxfp4, NAME.dequant.f32 (microscale's
//                         dequantize of its quantization); raw little-endian float32, row-major
//                         in numpy's order (ne reversed)
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "io/gguf_blocks.hpp"
#include "io/gguf_file.hpp"
#include "microscale/codecs.hpp"
#include "microscale/quantize.hpp"

namespace {

using namespace microscale;
using namespace microscale::io::gguf;
using microscale::io::detail::Json;

// Keep in step with EXPECTED_KVS in check_with_gguf.py.
std::vector<Kv> sample_kvs() {
  return {
      kv_str("general.architecture", "llama"),
      {"t.u8", ValueType::u8, 200},
      {"t.i8", ValueType::i8, -100},
      {"t.u16", ValueType::u16, 60000},
      {"t.i16", ValueType::i16, -30000},
      kv_u32("t.u32", 4000000000u),
      kv_i32("t.i32", -2000000000),
      kv_f32("t.f32", 0.1f),
      kv_bool("t.bool", true),
      kv_bool("t.bool_false", false),
      kv_str("t.str", "caf\xc3\xa9 <|eot|>"),
      kv_u64("t.u64", 18446744073709551557ull),
      {"t.i64", ValueType::i64, std::int64_t{-9223372036854775807} - 1},
      {"t.f64", ValueType::f64, 1.0 / 3.0},
      kv_array("t.arr.str", ValueType::string, Json::array({"a", "", "<|end|>"})),
      kv_array("t.arr.i32", ValueType::i32, Json::array({1, -2, 3})),
      kv_array("t.arr.f32", ValueType::f32, Json::array({0.5, -1.25})),
      kv_array("t.arr.u8", ValueType::u8, Json::array({0, 255})),
      kv_array("t.arr.bool", ValueType::boolean, Json::array({true, false})),
      kv_array("t.arr.u64", ValueType::u64, Json::array({std::uint64_t{1} << 63})),
      kv_array("t.arr.empty", ValueType::i64, Json::array()),
  };
}

// Deterministic values in [-1, 1) times a magnitude that changes every row, so the nvfp4 scales
// run from E4M3 subnormals to normals; every 7th value is exactly 0.
std::vector<float> sample_values(std::int64_t rows, std::int64_t k, std::uint32_t seed) {
  std::vector<float> v(static_cast<std::size_t>(rows * k));
  std::uint32_t x = seed;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < k; ++i) {
      x = x * 1664525u + 1013904223u;
      const float u = static_cast<float>(x >> 8) / 8388608.0f - 1.0f;
      const float magnitude = std::ldexp(1.0f, static_cast<int>(r % 12) - 6);
      v[static_cast<std::size_t>(r * k + i)] = i % 7 == 0 ? 0.0f : u * magnitude;
    }
  return v;
}

// Values exact in f16 and bf16: multiples of 1/8 in [-2, 2).
std::vector<float> exact_values(std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(i % 32) / 8.0f - 2.0f;
  return v;
}

void write_floats(const std::filesystem::path& p, const float* v, std::size_t n) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(v), static_cast<std::streamsize>(n * sizeof(float)));
  if (!f) throw Error(p.string() + ": cannot write");
}

std::int64_t product(const std::vector<std::int64_t>& ne) {
  std::int64_t n = 1;
  for (std::int64_t d : ne) n *= d;
  return n;
}

int run(const std::filesystem::path& dir) {
  const std::vector<TensorInfo> tensors = {
      {"blk.0.ffn_up.weight", GgmlType::nvfp4, {128, 4, 3}},  // experts-shaped: K, rows, experts
      {"blk.0.attn_q.weight", GgmlType::mxfp4, {96, 5}},
      {"t.f32", GgmlType::f32, {6, 2}},
      {"t.f16", GgmlType::f16, {10}},
      {"t.bf16", GgmlType::bf16, {4, 1, 2}},
  };
  std::vector<std::vector<std::byte>> data;
  for (const TensorInfo& t : tensors) {
    const std::int64_t k = t.ne[0], rows = product(t.ne) / k;
    const std::string stem = (dir / t.name).string();
    if (t.type == GgmlType::nvfp4 || t.type == GgmlType::mxfp4) {
      const Mode mode = t.type == GgmlType::nvfp4 ? Mode::nvfp4 : Mode::mxfp4;
      const std::vector<float> x = sample_values(rows, k, static_cast<std::uint32_t>(data.size() + 1));
      QuantSpec spec;
      spec.mode = mode;
      const Quantized q = quantize(TensorView(x.data(), DType::float32, {rows, k}), spec);
      const Tensor back = dequantize(q, DType::float32);
      std::vector<std::byte> blocks(static_cast<std::size_t>(rows * ggml_row_bytes(mode, k)));
      to_ggml_blocks(mode, rows, k, {q.packed.bytes(), q.packed.nbytes()}, {q.scales.bytes(), q.scales.nbytes()},
                     blocks);
      write_floats(stem + ".input.f32", x.data(), x.size());
      write_floats(stem + ".dequant.f32", back.data<float>(), x.size());
      data.push_back(std::move(blocks));
      continue;
    }
    const std::vector<float> x = exact_values(product(t.ne));
    write_floats(stem + ".input.f32", x.data(), x.size());
    std::vector<std::byte> bytes;
    for (float v : x) {
      if (t.type == GgmlType::f32) {
        const auto* b = reinterpret_cast<const std::byte*>(&v);
        bytes.insert(bytes.end(), b, b + 4);
      } else {
        const std::uint16_t h = t.type == GgmlType::f16 ? encode_f16(v) : encode_bf16(v);
        bytes.push_back(std::byte(h & 0xFF));
        bytes.push_back(std::byte(h >> 8));
      }
    }
    data.push_back(std::move(bytes));
  }
  GgufWriter w(dir / "sample.gguf", sample_kvs(), tensors);
  for (std::size_t i = data.size(); i-- > 0;) w.write(i, 0, data[i]);
  w.finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: gguf_sample OUT_DIR\n";
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::cerr << "gguf_sample: " << e.what() << "\n";
    return 1;
  }
}
