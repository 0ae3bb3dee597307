// One planned layer quantized (quantize_layer.hpp).
#include "io/quantize_layer.hpp"

#include <cstring>

#include "io/tensor_values.hpp"
#include "ops/quantize.hpp"

namespace microscale::io::ck {

namespace {

// `x` [experts * N, K] quantized expert by expert, each with its global scale `amax[e]` (searched
// further under mse when `search_global`), into one Quantized of the whole stack; `globals` gets
// the amaxes used, in expert order.
Quantized quantize_per_expert(const TensorView& x, const QuantSpec& spec, const std::vector<float>& amax,
                              bool search_global, std::vector<Global>& globals) {
  const auto experts = static_cast<std::int64_t>(amax.size());
  const std::int64_t rows = x.shape[0] / experts, k = x.shape[1];
  const std::size_t elem = dtype_size(x.dtype);
  Quantized all;
  for (std::int64_t e = 0; e < experts; ++e) {
    const TensorView one(static_cast<const std::byte*>(x.data) + static_cast<std::size_t>(e * rows * k) * elem, x.dtype,
                         {rows, k});
    QuantSpec s = spec;
    s.global_scale = amax[static_cast<std::size_t>(e)];
    const Quantized q = ops::quantize(one, s, search_global);
    if (e == 0) {
      all.spec = q.spec;
      all.shape = x.shape;
      all.packed = Tensor(q.packed.dtype(), {x.shape[0], q.packed.shape()[1]});
      all.scales = Tensor(q.scales.dtype(), {x.shape[0], q.scales.shape()[1]});
    }
    std::memcpy(all.packed.bytes() + static_cast<std::size_t>(e) * q.packed.nbytes(), q.packed.bytes(),
                q.packed.nbytes());
    std::memcpy(all.scales.bytes() + static_cast<std::size_t>(e) * q.scales.nbytes(), q.scales.bytes(),
                q.scales.nbytes());
    globals.push_back(Global::of_amax(*q.spec.global_scale));
  }
  return all;
}

}  // namespace

bool quantizes_per_expert(const QuantizePlan& plan, const PlannedLayer& l, const LayerSpec& f) {
  return f.three_level && l.experts && l.experts->experts > 1 && !plan.gptq.count(l.module);
}

std::vector<float> expert_amaxes(const TensorView& x, std::int64_t experts) {
  const std::int64_t rows = x.shape[0] / experts, k = x.shape[1];
  const std::size_t elem = dtype_size(x.dtype);
  std::vector<float> out;
  for (std::int64_t e = 0; e < experts; ++e)
    out.push_back(global_scale(TensorView(
        static_cast<const std::byte*>(x.data) + static_cast<std::size_t>(e * rows * k) * elem, x.dtype, {rows, k})));
  return out;
}

LayerQuant quantize_planned(const QuantizePlan& plan, const PlannedLayer& l, const LayerSpec& f, const TensorView& x,
                            std::optional<float> fused, const std::vector<float>* fused_experts,
                            const GptqOptions& gptq_options) {
  QuantSpec spec = f.spec;
  if (f.three_level) spec.global_scale = fused ? *fused : global_scale(x);
  if (f.unit_global) spec.global_scale = k2688;
  LayerQuant out;
  try {
    if (quantizes_per_expert(plan, l, f)) {
      out.q = quantize_per_expert(x, spec, fused_experts ? *fused_experts : expert_amaxes(x, l.experts->experts),
                                  !fused_experts, out.expert_globals);
    } else if (const auto h = plan.gptq.find(l.module); h != plan.gptq.end()) {
      const StTensor& ht = plan.hessians->tensor(h->second);
      const std::vector<double> hv = hessian_values(ht);
      plan.hessians->check_unchanged();
      out.q = gptq(x, HessianView{hv.data(), ht.shape}, spec, gptq_options);
    } else {
      // A fused group keeps its one global scale: mse searches only the block scales there.
      out.q = ops::quantize(x, spec, f.three_level && !fused.has_value());
    }
  } catch (const Error& e) {
    throw Error("tensor " + detail::quote(l.tensor) + ": " + e.what());
  }
  return out;
}

std::int64_t checked_nonfinite(const PlannedLayer& l, const LayerSpec& f, const TensorView& x) {
  const std::int64_t nonfinite = count_nonfinite({static_cast<const std::byte*>(x.data),
                                                  static_cast<std::size_t>(x.numel()) * dtype_size(x.dtype)},
                                                 to_st_dtype(x.dtype))
                                     .total();
  if (nonfinite && f.spec.nonfinite == NonFinite::error)
    throw Error("tensor " + detail::quote(l.tensor) + " has " + std::to_string(nonfinite) +
                " non-finite values (NaN/Inf) of " + std::to_string(x.numel()) +
                "; repair the checkpoint, or pass --nonfinite propagate (NaN/Inf stay "
                "in the blocks they hit) or saturate");
  return nonfinite;
}

std::vector<double> hessian_values(const StTensor& t) {
  std::vector<double> h(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = element_value(t.data.data(), t.dtype, i);
  return h;
}

}  // namespace microscale::io::ck
