// Dequantize kernels of one target (Highway -inl.h, included per target): blocks of packed codes
// and scales to float32, float16 or bfloat16 outputs. Used by the dequantize module and by the
// matmul module's weight decoding, which call them directly within the same target.
//
// Bit-identical to reference::dequantize: element values are decoded exactly from their bits
// (E2M1 by table, E4M3/E5M2/E8M0 by shifting the code into f32 position), each output is the
// reference's single product (affine: product, then sum), and the rounding to bf16/f16 is the
// codecs' integer RNE, NaN -> quiet NaN, overflow -> Inf. Codes are handled by element pairs
// (one fp4 byte, one mxfp8 16-bit word), which 16-bit outputs store as one 32-bit word.

#if defined(MICROSCALE_CPU_DEQUANTIZE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MICROSCALE_CPU_DEQUANTIZE_INL_H_
#undef MICROSCALE_CPU_DEQUANTIZE_INL_H_
#else
#define MICROSCALE_CPU_DEQUANTIZE_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/convert.hpp"
#include "cpu/simd-inl.h"
#include "microscale/format.hpp"
#include "microscale/tensor.hpp"
#include "reference/reference.hpp"

HWY_BEFORE_NAMESPACE();
namespace microscale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_SCALAR

// Single-lane vectors gain nothing: the reference, on this thread's blocks.
inline void DequantizeBlocks(const std::uint8_t* packed, const std::byte* scales, const std::byte* biases,
                             DType scale_dtype, const QuantSpec& spec, DType out, std::int64_t b0, std::int64_t b1,
                             std::byte* y) {
  const std::int64_t G = spec.group_size;
  const std::size_t ss = dtype_size(scale_dtype);
  reference::dequantize(packed + b0 * G * spec.bits / 8, scales + static_cast<std::size_t>(b0) * ss,
                        biases ? biases + static_cast<std::size_t>(b0) * ss : nullptr, scale_dtype, b1 - b0, G, spec,
                        out, y + static_cast<std::size_t>(b0 * G) * dtype_size(out));
}

#else

// ---- output ----

// encode_bf16 on the high half of each lane: RNE on the low 16 bits; NaN (kNaN only) keeps its
// top bits and is made quiet.
template <bool kNaN>
HWY_INLINE VI Bf16High(VF v) {
  const DI di;
  const VI u = hn::BitCast(di, v);
  const VI r = hn::Add(hn::Add(u, hn::Set(di, 0x7FFF)), hn::And(hn::ShiftRight<16>(u), hn::Set(di, 1)));
  if constexpr (!kNaN) return r;
  return hn::IfThenElse(hn::RebindMask(di, hn::IsNaN(v)), hn::Or(u, hn::Set(di, 0x400000)), r);
}

// encode_f16 in the low half of each lane, in integer arithmetic on every target (F16C would do,
// but SSE4 and below lack it).
HWY_INLINE VI F16Low(VF v) {
  const DI di;
  const VI u = hn::BitCast(di, v);
  const VI a = hn::And(u, hn::Set(di, 0x7FFFFFFF));
  // Normal: RNE on the 13 dropped bits, exponent rebiased 127 -> 15.
  const VI lsb = hn::And(hn::ShiftRight<13>(a), hn::Set(di, 1));
  const VI normal = hn::ShiftRight<13>(hn::Add(hn::Add(a, hn::Set(di, 0xFFF - (112 << 23))), lsb));
  // Below 2^-14: multiples of 2^-24, rounded by one f32 addition of 0.5 (ulp 2^-24).
  const VI sub = hn::Sub(hn::BitCast(di, hn::Add(hn::BitCast(DF(), a), hn::Set(DF(), 0.5f))), hn::Set(di, 0x3F000000));
  VI h = hn::IfThenElse(hn::Lt(a, hn::Set(di, 0x38800000)), sub, normal);
  h = hn::IfThenElse(hn::Gt(a, hn::Set(di, 0x477FEFFF)), hn::Set(di, 0x7C00), h);  // >= 65520 -> Inf
  h = hn::IfThenElse(hn::Gt(a, hn::Set(di, 0x7F800000)),
                     hn::Or(hn::Set(di, 0x7E00), hn::And(hn::ShiftRight<13>(a), hn::Set(di, 0x1FF))), h);
  return hn::OrAnd(h, hn::ShiftRight<16>(u), hn::Set(di, 0x8000));
}

// Stores 2N outputs given as the even- and odd-indexed values. 16-bit outputs pair up in one
// 32-bit word per lane; f32 outputs take the lane order that InterleaveLower/Upper (which work
// within 128-bit blocks) restore to element order (see PairOrder).
template <bool kNaN>
HWY_INLINE void StorePairs(VF even, VF odd, float* p) {
  const DF df;
  hn::StoreU(hn::InterleaveLower(df, even, odd), df, p);
  hn::StoreU(hn::InterleaveUpper(df, even, odd), df, p + kN);
}
template <bool kNaN>
HWY_INLINE void StorePairs(VF even, VF odd, hwy::bfloat16_t* p) {
  const DU du;
  const auto w = hn::OrAnd(hn::ShiftRight<16>(hn::BitCast(du, Bf16High<kNaN>(even))),
                           hn::BitCast(du, Bf16High<kNaN>(odd)), hn::Set(du, 0xFFFF0000u));
  hn::StoreU(w, du, reinterpret_cast<std::uint32_t*>(p));
}
template <bool kNaN>
HWY_INLINE void StorePairs(VF even, VF odd, hwy::float16_t* p) {
  hn::StoreU(hn::Or(F16Low(even), hn::ShiftLeft<16>(F16Low(odd))), DI(), reinterpret_cast<std::int32_t*>(p));
}

// Lane L of the pair vectors holds pair PairOrder(L): the identity, except for f32 outputs:
// InterleaveLower/Upper emit block k's pairs 2k, 2k+1 and then N/2 + 2k, N/2 + 2k + 1.
template <class O>
HWY_INLINE VI PairOrder() {
  const DI di;
  const VI l = hn::Iota(di, 0);
  if constexpr (!std::is_same_v<O, float>) return l;
  const VI k2 = hn::ShiftRight<1>(hn::And(l, hn::Set(di, ~3)));  // 2 * block
  const VI i = hn::And(l, hn::Set(di, 1));
  return hn::Add(hn::Add(k2, i), hn::IfThenElseZero(hn::Gt(hn::And(l, hn::Set(di, 3)), hn::Set(di, 1)),
                                                    hn::Set(di, static_cast<std::int32_t>(kN / 2))));
}

// ---- block formats ----

enum class Kind { nvfp4, mxfp4, mxfp8_e4m3, mxfp8_e5m2 };

template <Kind kKind, bool kNaN>
HWY_INLINE VF DecodeElements(VI c) {
  if constexpr (kKind == Kind::mxfp8_e4m3)
    return DecodeE4M3<kNaN>(c);
  else if constexpr (kKind == Kind::mxfp8_e5m2)
    return DecodeE5M2<kNaN>(c);
  else
    return DecodeE2M1(c);
}

// One tile of N blocks: codes of 2N elements at a time split into even and odd ones (pairs share
// a byte in fp4 and a 16-bit word in mxfp8), y = val(q) * factor of the pair's block. kNaN: a
// factor or an element code is NaN; a NaN factor's block gets the factor itself (the
// reference's product: where a NaN element meets a NaN scale, which NaN an SSE multiply returns
// depends on the compiler's operand order, and the reference gets the scale's).
template <Kind kKind, bool kNaN, class O>
HWY_INLINE void DequantizeTile(const std::uint8_t* packed, VF factors, O* y) {
  constexpr std::size_t G = kKind == Kind::nvfp4 ? numerics::kNvfp4Group : numerics::kMxGroup;
  constexpr std::size_t kBits = kKind == Kind::nvfp4 || kKind == Kind::mxfp4 ? 4 : 8;
  const DF df;
  const DI di;
  const VI order = PairOrder<O>();
  alignas(64) float factor[kN];
  hn::Store(factors, df, factor);
  for (std::size_t e = 0; e < kN * G; e += 2 * kN) {
    VF f;
    if constexpr (2 * kN <= G)
      f = hn::Set(df, factor[e / G]);
    else  // pairs of two blocks: lane L's block is (e + 2 * order[L]) / G
      f = hn::TableLookupLanes(
          factors, hn::IndicesFromVec(df, hn::ShiftRight<3>(hn::Add(order, hn::Set(di, static_cast<int>(e / 2))))));
    VI words = hn::BitCast(
        di, kBits == 4 ? hn::PromoteTo(DU(), hn::LoadU(hn::Rebind<std::uint8_t, DF>(), packed + e / 2))
                       : hn::PromoteTo(DU(), hn::LoadU(hn::Rebind<std::uint16_t, DF>(),
                                                       reinterpret_cast<const std::uint16_t*>(packed + e))));
    if constexpr (std::is_same_v<O, float>) words = hn::TableLookupLanes(words, hn::IndicesFromVec(di, order));
    constexpr int kMask = kBits == 4 ? 0xF : 0xFF;
    VF even = hn::Mul(DecodeElements<kKind, kNaN>(hn::And(words, hn::Set(di, kMask))), f);
    VF odd = hn::Mul(DecodeElements<kKind, kNaN>(hn::ShiftRight<kBits>(words)), f);
    if constexpr (kNaN) {
      const auto nan = hn::IsNaN(f);
      even = hn::IfThenElse(nan, f, even);
      odd = hn::IfThenElse(nan, f, odd);
    }
    StorePairs<kNaN>(even, odd, y + e);
  }
}

// Blocks [b0, b1) of an fp mode, tile by tile (the last partial tile through padded copies).
template <Kind kKind, class O>
void FpBlocks(const std::uint8_t* packed, const std::uint8_t* scales, const QuantSpec& spec, std::int64_t b0,
              std::int64_t b1, O* y) {
  constexpr std::size_t G = kKind == Kind::nvfp4 ? numerics::kNvfp4Group : numerics::kMxGroup;
  constexpr std::size_t kBlockBytes = G * (kKind == Kind::nvfp4 || kKind == Kind::mxfp4 ? 4 : 8) / 8;
  constexpr bool kFp8 = kKind == Kind::mxfp8_e4m3 || kKind == Kind::mxfp8_e5m2;
  const DF df;
  const bool three_level = kKind == Kind::nvfp4 && spec.global_scale.has_value();
  const VF amax = hn::Set(df, three_level ? *spec.global_scale : 0.0f);
  const VF c2688 = hn::Set(df, f32_from_bits(kC2688Bits));
  for (std::int64_t t = b0; t < b1; t += kN) {
    const auto nb = static_cast<std::size_t>(std::min<std::int64_t>(kN, b1 - t));
    alignas(64) std::uint8_t code[kN] = {};
    std::memcpy(code, scales + t, nb);
    const VI c = LoadBytes(code);
    VF f;
    if constexpr (kKind == Kind::nvfp4) {
      f = DecodeE4M3(c);
      if (three_level) f = hn::Mul(hn::Mul(f, amax), c2688);
    } else {
      f = DecodeE8M0(c);
    }
    const std::uint8_t* in = packed + t * static_cast<std::int64_t>(kBlockBytes);
    O* out = y + t * static_cast<std::int64_t>(G);
    alignas(64) std::uint8_t in_pad[kN * kBlockBytes];
    alignas(64) O out_pad[kN * G];
    if (nb < kN) {
      std::memset(in_pad, 0, sizeof(in_pad));
      std::memcpy(in_pad, in, nb * kBlockBytes);
      in = in_pad;
      out = out_pad;
    }
    if (!hn::AllFalse(df, hn::IsNaN(f)) || (kFp8 && AnySpecialCode<kKind == Kind::mxfp8_e5m2>(in, kN * kBlockBytes)))
      DequantizeTile<kKind, true>(in, f, out);
    else
      DequantizeTile<kKind, false>(in, f, out);
    if (nb < kN) std::memcpy(y + t * static_cast<std::int64_t>(G), out_pad, nb * G * sizeof(O));
  }
}

// Inverse of the quantizer's LSB-first bit stream.
inline void UnpackBits(const std::uint8_t* in, int n, int bits, std::int32_t* codes) {
  std::uint64_t acc = 0;
  int have = 0;
  const std::uint64_t mask = (1u << bits) - 1;
  for (int i = 0; i < n; ++i) {
    for (; have < bits; have += 8) acc |= static_cast<std::uint64_t>(*in++) << have;
    codes[i] = static_cast<std::int32_t>(acc & mask);
    acc >>= bits;
    have -= bits;
  }
}

// Groups [g0, g1) of affine: y = fl(fl(q * s) + b), s and b the stored values widened.
template <class O>
void AffineGroups(const std::uint8_t* packed, const std::byte* scales, const std::byte* biases, DType sdt,
                  const QuantSpec& spec, std::int64_t g0, std::int64_t g1, O* y) {
  const DF df;
  const DI di;
  const int gs = spec.group_size;
  const int bits = spec.bits;
  const std::size_t ss = dtype_size(sdt);
  const VI order = PairOrder<O>();
  const bool whole_bytes = bits == 4 || bits == 8;  // pairs of codes fill a byte or a word
  alignas(64) std::int32_t codes[128];
  for (std::int64_t g = g0; g < g1; ++g) {
    const std::uint8_t* in = packed + static_cast<std::size_t>(g * gs * bits / 8);
    if (!whole_bytes) UnpackBits(in, gs, bits, codes);
    const float scale = detail::load_f32(scales + static_cast<std::size_t>(g) * ss, sdt);
    const float bias = detail::load_f32(biases + static_cast<std::size_t>(g) * ss, sdt);
    // A NaN scale decodes the group to itself (see reference::dequantize): 0 * scale + scale.
    const VF s = hn::Set(df, scale);
    const VF b = hn::Set(df, std::isnan(scale) ? scale : bias);
    for (int i = 0; i < gs; i += 2 * static_cast<int>(kN)) {
      VI even, odd;
      if (whole_bytes) {
        const VI pairs =
            hn::BitCast(di, bits == 4 ? hn::PromoteTo(DU(), hn::LoadU(hn::Rebind<std::uint8_t, DF>(), in + i / 2))
                                      : hn::PromoteTo(DU(), hn::LoadU(hn::Rebind<std::uint16_t, DF>(),
                                                                      reinterpret_cast<const std::uint16_t*>(in + i))));
        even = hn::And(pairs, hn::Set(di, (1 << bits) - 1));
        odd = bits == 4 ? hn::ShiftRight<4>(pairs) : hn::ShiftRight<8>(pairs);
      } else {
        const VI lo = hn::Load(di, codes + i), hi = hn::Load(di, codes + i + kN);
        even = hn::ConcatEven(di, hi, lo), odd = hn::ConcatOdd(di, hi, lo);
      }
      if constexpr (std::is_same_v<O, float>) {
        even = hn::TableLookupLanes(even, hn::IndicesFromVec(di, order));
        odd = hn::TableLookupLanes(odd, hn::IndicesFromVec(di, order));
      }
      StorePairs<true>(hn::Add(hn::Mul(hn::ConvertTo(df, even), s), b), hn::Add(hn::Mul(hn::ConvertTo(df, odd), s), b),
                       y + g * gs + i);
    }
  }
}

template <class O>
void Blocks(const std::uint8_t* packed, const std::byte* scales, const std::byte* biases, DType sdt,
            const QuantSpec& spec, std::int64_t b0, std::int64_t b1, O* y) {
  const auto* s8 = reinterpret_cast<const std::uint8_t*>(scales);
  switch (spec.mode) {
    case Mode::nvfp4: return FpBlocks<Kind::nvfp4>(packed, s8, spec, b0, b1, y);
    case Mode::mxfp4: return FpBlocks<Kind::mxfp4>(packed, s8, spec, b0, b1, y);
    case Mode::mxfp8:
      if (spec.elem == Elem::e5m2) return FpBlocks<Kind::mxfp8_e5m2>(packed, s8, spec, b0, b1, y);
      return FpBlocks<Kind::mxfp8_e4m3>(packed, s8, spec, b0, b1, y);
    case Mode::affine: return AffineGroups(packed, scales, biases, sdt, spec, b0, b1, y);
  }
}

// Blocks [b0, b1) (flat indices over rows x K/group) of packed codes with their scales (and
// affine biases) into y, which holds the whole output.
inline void DequantizeBlocks(const std::uint8_t* packed, const std::byte* scales, const std::byte* biases,
                             DType scale_dtype, const QuantSpec& spec, DType out, std::int64_t b0, std::int64_t b1,
                             std::byte* y) {
  switch (out) {
    case DType::float16:
      return Blocks(packed, scales, biases, scale_dtype, spec, b0, b1, reinterpret_cast<hwy::float16_t*>(y));
    case DType::bfloat16:
      return Blocks(packed, scales, biases, scale_dtype, spec, b0, b1, reinterpret_cast<hwy::bfloat16_t*>(y));
    default: return Blocks(packed, scales, biases, scale_dtype, spec, b0, b1, reinterpret_cast<float*>(y));
  }
}

#endif  // HWY_TARGET == HWY_SCALAR

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MICROSCALE_CPU_DEQUANTIZE_INL_H_
