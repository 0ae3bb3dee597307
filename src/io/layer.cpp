// The layout-independent quantized layer: global scales across conventions, the layer's spec and
// data, and the small helpers every layout and operation shares.
#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "io/layer.hpp"

namespace microscale::io::ck {

// ---- global scales

float Global::to_amax() const {
  switch (kind) {
    case Kind::none: return k2688;
    case Kind::amax: return value;
    case Kind::stored: return convention->to_amax(value);
  }
  return value;
}

void check_activation_amax(double amax, const std::string& what) {
  if (std::isnan(amax) || amax < 0 || amax > std::numeric_limits<float>::max())
    throw Error(what + " is " + fmt_float(amax) + ", not a finite non-negative float32 number");
  if (amax > 0 && amax < kMinActivationAmax)
    throw Error(what + " is " + fmt_float(amax) + ", below " + fmt_float(kMinActivationAmax) +
                " (2688 x FLT_MIN): its activation scale, 2688/amax or amax/2688, is not a normal float32 number");
}

std::string Global::describe() const { return describe(kind == Kind::stored ? convention->weight_tensor : ""); }

std::string Global::describe(std::string_view tensor) const {
  switch (kind) {
    case Kind::none: return "two-level (no global scale)";
    case Kind::amax: return "amax " + fmt_float(value);
    case Kind::stored:
      return std::string(tensor) + " " + fmt_float(value) + " = " + convention->formula + " -> amax " +
             fmt_float(to_amax());
  }
  return "";
}

// ---- layers

[[noreturn]] void layer_error(const std::string& module, const std::string& what) {
  throw Error("layer " + detail::quote(module) + ": " + what);
}

std::int64_t mul(const std::string& module, std::int64_t a, std::int64_t b, const std::string& what) {
  std::int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    layer_error(module, what + ": " + std::to_string(a) + " x " + std::to_string(b) + " overflows 64 bits");
  return r;
}

// The logical tensor in 8-byte floats and a row in bits of the widest dtype must fit int64, so
// downstream code may multiply and divide these freely.
void check_dims(const Layer& l) {
  const std::string& m = l.module;
  if (l.shape.size() != 2 || l.rows() < 0 || l.cols() < 0)
    layer_error(m, "logical shape " + shape_str(l.shape, ShapeStyle::list) + " is not a 2-D shape");
  if (l.format.group_size < 1)
    layer_error(m, "group size " + std::to_string(l.format.group_size) + " (must be at least 1)");
  if (l.cols() % l.format.group_size != 0)
    layer_error(m, "K = " + std::to_string(l.cols()) + " is not a multiple of the group size " +
                       std::to_string(l.format.group_size));
  (void)mul(m, mul(m, l.rows(), l.cols(), "elements of " + shape_str(l.shape, ShapeStyle::list)), 8,
            "bytes of " + shape_str(l.shape, ShapeStyle::list));
  (void)mul(m, l.cols(), 64, "bits in a row of K = " + std::to_string(l.cols()));
  if (l.experts < 0 || (l.experts > 0 && l.rows() % l.experts != 0))
    layer_error(m, std::to_string(l.rows()) + " rows do not split into " + std::to_string(l.experts) + " experts");
}

Layer Layer::of(std::string module, const QuantSpec& spec, Shape shape) {
  Layer l;
  l.module = std::move(module);
  l.format = QuantSpec{};
  l.format.mode = spec.mode;
  l.format.group_size = spec.group_size;
  l.format.bits = spec.bits;
  l.shape = std::move(shape);
  if (spec.global_scale) l.global = Global::of_amax(*spec.global_scale);
  return l;
}

QuantSpec Layer::spec() const {
  QuantSpec s = format;
  if (format.mode == Mode::nvfp4 && global.three_level()) s.global_scale = global.to_amax();
  try {
    return resolve(s);
  } catch (const Error& e) {
    layer_error(module, e.what());
  }
}

namespace {

// Crossing conventions goes through the amax and rounds twice, which may move it to a float32
// neighbour (about one layer in ten); every normal amax comes back at least that close.
bool within_ulp(float amax, float back) {
  return back == amax || back == std::nextafter(amax, INFINITY) || back == std::nextafter(amax, -INFINITY);
}

// Whether every block scale code in `scales` decodes to the same factor, bit for bit, under amax
// `a` as under `b`: then the layer's values are the same (amax 0 over all-zero block scales, say).
bool same_decode(std::span<const std::byte> scales, float a, float b) {
  std::array<bool, 256> seen{};
  for (const std::byte code : scales) {
    const auto c = std::to_integer<std::uint8_t>(code);
    if (std::exchange(seen[c], true)) continue;
    if (std::bit_cast<std::uint32_t>(numerics::nvfp4_decode_factor(c, true, a)) !=
        std::bit_cast<std::uint32_t>(numerics::nvfp4_decode_factor(c, true, b)))
      return false;
  }
  return true;
}

}  // namespace

float Layer::global_as(const ScaleConvention& c) const {
  if (global.kind == Global::Kind::stored && global.convention == &c) return global.value;
  const float amax = global.to_amax(), stored = c.from_amax(amax), back = c.to_amax(stored);
  if (c.valid(stored) && std::isfinite(back) && (within_ulp(amax, back) || same_decode(scales, amax, back)))
    return stored;
  layer_error(module, "its global scale (" + global.describe() + ") has no " +
                          detail::quote(module + "." + c.weight_tensor) + " (= " + c.formula +
                          ") that decodes its block scales to the same values: the nearest, " + fmt_float(stored) +
                          ", stands for amax " + fmt_float(back));
}

float Layer::act_as(const ScaleConvention& c) const {
  if (act->kind == Global::Kind::stored && act->convention == &c) return act->value;
  // An activation amax of 0 (or -0) is stored like a weight's: as the neutral factor 1.
  const float amax = act->to_amax(), stored = c.from_amax(amax), back = c.to_amax(stored);
  if (c.valid(stored) && std::isfinite(back) && (amax == 0 || within_ulp(amax, back))) return stored;
  layer_error(module, "its activation scale (" + act->describe() + ") has no value of the form " + c.formula +
                          " that stands for the same amax: the nearest, " + fmt_float(stored) + ", stands for amax " +
                          fmt_float(back));
}

void Layer::point_at(const Quantized& q) {
  packed = {q.packed.bytes(), q.packed.nbytes()};
  scales = {q.scales.bytes(), q.scales.nbytes()};
  if (q.spec.mode == Mode::affine) biases = {q.biases.bytes(), q.biases.nbytes()};
}

Quantized to_quantized(const Layer& l) {
  Quantized q;
  q.spec = l.spec();
  q.shape = l.stored(l.cols());
  q.packed = Tensor(DType::uint8, l.stored(l.cols() * l.format.bits / 8));
  std::memcpy(q.packed.bytes(), l.packed.data(), l.packed.size());
  const Shape ss = l.stored(l.cols() / l.format.group_size);
  q.scales = Tensor(l.format.mode == Mode::affine ? *to_dtype(l.float_dtype) : DType::uint8, ss);
  std::memcpy(q.scales.bytes(), l.scales.data(), l.scales.size());
  if (l.format.mode == Mode::affine) {
    q.biases = Tensor(*to_dtype(l.float_dtype), ss);
    std::memcpy(q.biases.bytes(), l.biases.data(), l.biases.size());
  }
  return q;
}

TensorView view_of(std::span<const std::byte> data, StDType st, const Shape& shape, Tensor& storage) {
  const DType dt = *to_dtype(st);
  if (reinterpret_cast<std::uintptr_t>(data.data()) % dtype_size(dt) == 0) return TensorView(data.data(), dt, shape);
  storage = Tensor(dt, shape);
  std::memcpy(storage.bytes(), data.data(), data.size());
  return storage.view();
}

Tensor dequantize_layer(const Layer& l, DType dt) {
  Tensor sp, bp;
  const TensorView packed(l.packed.data(), DType::uint8, {l.rows(), l.cols() * l.format.bits / 8});
  const Shape sshape = {l.rows(), l.cols() / l.format.group_size};
  const TensorView scales = l.format.mode == Mode::affine ? view_of(l.scales, l.float_dtype, sshape, sp)
                                                          : TensorView(l.scales.data(), DType::uint8, sshape);
  TensorView biases;
  if (l.format.mode == Mode::affine) biases = view_of(l.biases, l.float_dtype, sshape, bp);
  try {
    return dequantize(packed, scales, l.format.mode == Mode::affine ? &biases : nullptr, l.spec(), dt)
        .reshaped(l.stored(l.cols()));
  } catch (const Error& e) {
    throw Error("layer " + detail::quote(l.module) + ": " + e.what());
  }
}

// ---- tensors to write

Out entry(std::string name, StDType dt, Shape shape, std::span<const std::byte> data) {
  Out o;
  o.entry = {std::move(name), dt, std::move(shape)};
  o.data = data;
  return o;
}

Out scalar(std::string name, Shape shape, float v) {
  Out o = entry(std::move(name), StDType::f32, std::move(shape));
  std::memcpy(o.scalar.data(), &v, 4);
  o.inline_scalar = true;
  return o;
}

// ---- mapped input

void release(std::span<const std::byte> bytes) {
  static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto b = reinterpret_cast<std::uintptr_t>(bytes.data());
  std::uintptr_t e = b + bytes.size();
  b = (b + page - 1) & ~(page - 1);
  e &= ~(page - 1);
  // Only whole pages inside the range; the mapping is read-only and private, so dropping pages
  // loses nothing: they are read back from the page cache if touched again.
  if (e > b) (void)::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

void release_sources(const Checkpoint& ck, const Layer& l) {
  for (const Source& s : l.sources) release(ck.tensor(s.tensor).data);
}

// ---- text

std::string fmt_float(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace microscale::io::ck
