// quantize's plan (io/quantize_plan.hpp, an internal header) on the fixtures: which layers each
// layout gets, which weights stay in high precision and why, MoE stacking where the layout holds
// experts stacked, gpt-oss's split, fused groups, W4A4 and GPTQ assignment, and GGUF's row rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "io/quantize_plan.hpp"
#include "io/staging.hpp"
#include "io_support.hpp"
#include "microscale/quantize.hpp"

namespace {

namespace ck = microscale::io::ck;
using microscale::Mode;
using microscale::Shape;
using microscale::io::Convention;
using microscale::io::QuantizeOptions;
using microscale::io::StDType;
const std::filesystem::path kFixtures = MICROSCALE_FIXTURES_DIR;

struct Planned {
  ck::Input in;
  ck::Detected det;
  ck::QuantizePlan plan;
};

Planned plan_of(const std::filesystem::path& dir, const QuantizeOptions& opt) {
  Planned p{ck::open_complete(dir), {}, {}};
  p.det = ck::detect(p.in.ck, p.in.config);
  p.plan = ck::plan_quantize(dir, p.in, p.det, opt, false);
  return p;
}

QuantizeOptions options(Convention to, Mode mode = Mode::nvfp4) {
  QuantizeOptions o;
  o.to = to;
  o.spec.mode = mode;
  return o;
}

std::set<std::string> modules(const ck::QuantizePlan& p) {
  std::set<std::string> out;
  for (const ck::PlannedLayer& l : p.layers) out.insert(l.module);
  return out;
}

std::set<std::string> llama_projections() {
  std::set<std::string> out;
  for (int i = 0; i < 2; ++i)
    for (const char* p : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
      out.insert("model.layers." + std::to_string(i) + "." + p);
  return out;
}

TEST(QuantizePlan, LlamaProjectionsQuantizedEmbeddingsAndHeadKept) {
  const Planned p = plan_of(kFixtures / "llama", options(Convention::compressed_tensors));
  const ck::QuantizePlan& plan = p.plan;
  EXPECT_EQ(modules(plan), llama_projections());
  for (const ck::PlannedLayer& l : plan.layers) {
    EXPECT_EQ(l.tensor, l.module + ".weight");
    EXPECT_EQ(l.skel.format.mode, Mode::nvfp4);
    EXPECT_EQ(l.skel.shape, p.in.ck.tensor(l.tensor).shape);
    EXPECT_FALSE(l.experts);
    EXPECT_TRUE(l.skel.packed.empty());  // a skeleton: no weight read
  }
  ASSERT_EQ(plan.kept.size(), 2u);
  EXPECT_EQ(plan.kept.at("lm_head.weight"), "lm_head");
  EXPECT_EQ(plan.kept.at("model.embed_tokens.weight"), "embedding");
  EXPECT_EQ(plan.ignore, (std::vector<std::string>{"lm_head", "model.embed_tokens"}));
  EXPECT_TRUE(plan.base.three_level);  // compressed-tensors stores the nvfp4 global scale
  EXPECT_EQ(plan.base.row_block, 16);
  EXPECT_FALSE(plan.stack_experts);
  EXPECT_FALSE(plan.w4a4);
  EXPECT_TRUE(plan.gptq.empty());
  // q/k/v and gate/up of each layer share a global scale.
  ASSERT_EQ(plan.fused.size(), 4u);
  std::set<std::set<std::string>> groups;
  for (const std::vector<std::string>& g : plan.fused) groups.insert({g.begin(), g.end()});
  EXPECT_TRUE(groups.count(
      {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj"}));
  EXPECT_TRUE(groups.count({"model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"}));
  const ck::QuantMeta meta = plan.meta();
  ASSERT_EQ(meta.layers.size(), plan.layers.size());
  EXPECT_EQ(meta.layers[0], &plan.layers[0].skel);
  EXPECT_EQ(meta.ignore, plan.ignore);
}

TEST(QuantizePlan, MlxNvfp4IsTwoLevelWithoutFusedGroups) {
  const ck::QuantizePlan plan = plan_of(kFixtures / "llama", options(Convention::mlx)).plan;
  EXPECT_EQ(modules(plan), llama_projections());
  EXPECT_FALSE(plan.base.three_level);
  EXPECT_TRUE(plan.fused.empty());
  EXPECT_TRUE(plan.notes.empty());
}

TEST(QuantizePlan, IncludeExcludeAndTheirReasons) {
  QuantizeOptions o = options(Convention::compressed_tensors);
  o.include = {"lm_head"};
  o.exclude = {"down_proj"};
  const ck::QuantizePlan plan = plan_of(kFixtures / "llama", o).plan;
  std::set<std::string> want = llama_projections();
  want.erase("model.layers.0.mlp.down_proj");
  want.erase("model.layers.1.mlp.down_proj");
  want.insert("lm_head");
  EXPECT_EQ(modules(plan), want);
  EXPECT_EQ(plan.kept.at("model.layers.0.mlp.down_proj.weight"), "excluded");
  EXPECT_EQ(plan.kept.at("model.embed_tokens.weight"), "embedding");
  EXPECT_FALSE(plan.kept.count("lm_head.weight"));
}

TEST(QuantizePlan, ExpertsStackedOnlyWhereTheLayoutHoldsThemSo) {
  for (Convention to : {Convention::mlx, Convention::gguf, Convention::compressed_tensors}) {
    SCOPED_TRACE(microscale::io::name(to));
    const ck::QuantizePlan plan = plan_of(kFixtures / "qwen3_moe", options(to)).plan;
    EXPECT_EQ(plan.stack_experts, ck::layout(to).stacked_experts);
    const ck::PlannedLayer* gate = plan.find_layer("model.layers.0.mlp.switch_mlp.gate_proj");
    const ck::PlannedLayer* expert = plan.find_layer("model.layers.0.mlp.experts.2.gate_proj");
    if (!plan.stack_experts) {
      EXPECT_EQ(gate, nullptr);
      ASSERT_NE(expert, nullptr);
      EXPECT_EQ(expert->skel.shape, (Shape{64, 64}));
      EXPECT_EQ(plan.layers.size(), 2u * (4 + 4 * 3));  // attention + experts
      continue;
    }
    EXPECT_EQ(expert, nullptr);
    ASSERT_NE(gate, nullptr);
    ASSERT_TRUE(gate->experts);
    EXPECT_EQ(gate->experts->experts, 4);
    EXPECT_EQ(gate->experts->tensors,
              (std::vector<std::string>{
                  "model.layers.0.mlp.experts.0.gate_proj.weight", "model.layers.0.mlp.experts.1.gate_proj.weight",
                  "model.layers.0.mlp.experts.2.gate_proj.weight", "model.layers.0.mlp.experts.3.gate_proj.weight"}));
    EXPECT_EQ(gate->tensor, gate->experts->tensors.front());
    EXPECT_EQ(gate->skel.shape, (Shape{4 * 64, 64}));
    EXPECT_EQ(gate->skel.experts, 4);
    EXPECT_EQ(plan.layers.size(), 2u * (4 + 3));
  }
  // The router stays in high precision everywhere.
  const ck::QuantizePlan plan = plan_of(kFixtures / "qwen3_moe", options(Convention::gguf)).plan;
  EXPECT_EQ(plan.kept.at("model.layers.0.mlp.gate.weight"), "router");
}

TEST(QuantizePlan, GptossExpertsSplitIntoGateUpAndDown) {
  const ck::QuantizePlan mlx = plan_of(kFixtures / "gpt_oss", options(Convention::mlx, Mode::mxfp4)).plan;
  EXPECT_TRUE(mlx.gptoss_split);
  const ck::PlannedLayer* gate = mlx.find_layer("model.layers.0.mlp.experts.gate_proj");
  const ck::PlannedLayer* up = mlx.find_layer("model.layers.0.mlp.experts.up_proj");
  ASSERT_TRUE(gate && up && gate->experts && up->experts);
  EXPECT_EQ(gate->tensor, "model.layers.0.mlp.experts.gate_up_proj");
  // gate_up_proj [E, in, 2N]: gate the even columns, up the odd ones.
  EXPECT_EQ(gate->experts->col_start, 0);
  EXPECT_EQ(up->experts->col_start, 1);
  EXPECT_EQ(gate->experts->col_step, 2);
  EXPECT_EQ(gate->skel.shape, (Shape{4 * 64, 64}));
  // compressed-tensors has no stacked form: the float stacks stay in high precision.
  const ck::QuantizePlan ct = plan_of(kFixtures / "gpt_oss", options(Convention::compressed_tensors)).plan;
  EXPECT_FALSE(ct.gptoss_split);
  EXPECT_EQ(ct.find_layer("model.layers.0.mlp.experts.gate_proj"), nullptr);
  const std::string& why = ct.kept.at("model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_NE(why.find("3-D stacked experts: compressed-tensors has no form for them"), std::string::npos) << why;
}

// A Llama with one projection of K = 96: whole nvfp4 groups of 16 and mxfp4 groups of 32, but not
// whole GGUF nvfp4 super-blocks of 64 values.
std::filesystem::path write_k96(const iot::TempDir& dir) {
  std::vector<std::byte> a(64 * 64 * 2), b(64 * 96 * 2);
  microscale::io::save_safetensors(dir / "model.safetensors",
                                   {{"model.layers.0.self_attn.q_proj.weight", StDType::bf16, {64, 64}, a},
                                    {"model.layers.0.mlp.down_proj.weight", StDType::bf16, {64, 96}, b}});
  iot::write_bytes(dir / "config.json",
                   iot::bytes_of(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})"));
  return dir.path();
}

TEST(QuantizePlan, GgufRowsAreWholeSuperBlocks) {
  const iot::TempDir dir;
  const std::filesystem::path src = write_k96(dir);
  const ck::QuantizePlan gguf = plan_of(src, options(Convention::gguf)).plan;
  EXPECT_EQ(gguf.base.row_block, 64);
  EXPECT_EQ(modules(gguf), std::set<std::string>{"model.layers.0.self_attn.q_proj"});
  EXPECT_EQ(gguf.kept.at("model.layers.0.mlp.down_proj.weight"), "K = 96 is not a multiple of the group size 64");
  EXPECT_EQ(plan_of(src, options(Convention::gguf, Mode::mxfp4)).plan.base.row_block, 32);
  EXPECT_EQ(modules(plan_of(src, options(Convention::gguf, Mode::mxfp4)).plan).size(), 2u);
  const ck::QuantizePlan ct = plan_of(src, options(Convention::compressed_tensors)).plan;
  EXPECT_EQ(ct.base.row_block, 16);
  EXPECT_EQ(modules(ct).size(), 2u);
  EXPECT_TRUE(ct.kept.empty());
}

TEST(QuantizePlan, ActivationScalesAndGptqAreAssignedPerLayer) {
  QuantizeOptions o = options(Convention::modelopt);
  for (const std::string& m : llama_projections()) o.activation_amax[m] = 2.0f;
  const iot::TempDir dir;
  std::vector<float> h(64 * 64, 0.0f);
  for (int i = 0; i < 64; ++i) h[static_cast<std::size_t>(i * 65)] = 1.0f;
  const std::span<const std::byte> hb = std::as_bytes(std::span<const float>(h));
  o.hessians = dir / "h.safetensors";
  microscale::io::save_safetensors(o.hessians,
                                   {{"model.layers.1.self_attn.o_proj.weight", StDType::f32, {64, 64}, hb}});
  const Planned p = plan_of(kFixtures / "llama", o);
  EXPECT_TRUE(p.plan.w4a4);
  for (const ck::PlannedLayer& l : p.plan.layers) {
    ASSERT_TRUE(l.skel.act) << l.module;
    EXPECT_EQ(l.skel.act->kind, ck::Global::Kind::amax);
    EXPECT_EQ(l.skel.act->value, 2.0f);
  }
  ASSERT_EQ(p.plan.gptq.size(), 1u);
  EXPECT_EQ(p.plan.gptq.at("model.layers.1.self_attn.o_proj"), "model.layers.1.self_attn.o_proj.weight");
  ASSERT_TRUE(p.plan.hessians);
  EXPECT_EQ(p.plan.meta().gptq_layers, 1);
  EXPECT_TRUE(p.plan.meta().w4a4);
  // A layout without activation scales refuses W4A4 while planning.
  o.to = Convention::mlx;
  o.hessians.clear();
  iot::expect_error([&] { (void)plan_of(kFixtures / "llama", o); }, {"static activation scales (W4A4)"});
}

TEST(QuantizePlan, TyposAreRefusedWhilePlanning) {
  QuantizeOptions o = options(Convention::compressed_tensors);
  o.exclude = {"no_such_module"};
  iot::expect_error([&] { (void)plan_of(kFixtures / "llama", o); }, {"--exclude \"no_such_module\" matches no module"});
}

}  // namespace

// The orchestrators ask capability flags, not which ecosystem a layout is.
TEST(LayoutCapabilities, ModesAndDefaultExport) {
  using microscale::io::default_convention;
  EXPECT_EQ(default_convention(Mode::nvfp4), Convention::compressed_tensors);
  EXPECT_EQ(default_convention(Mode::mxfp4), Convention::compressed_tensors);
  EXPECT_EQ(default_convention(Mode::mxfp8), Convention::mlx);
  EXPECT_EQ(default_convention(Mode::affine), Convention::mlx);
  EXPECT_FALSE(ck::layout(Convention::modelopt).holds(Mode::mxfp4));  // gpt-oss's experts: no ModelOpt form
  EXPECT_TRUE(ck::layout(Convention::gguf).holds(Mode::mxfp4));
  EXPECT_FALSE(ck::layout(Convention::gguf).holds(Mode::affine));
  // One list of conventions, with names both ways.
  const std::vector<Convention> all = microscale::io::conventions();
  ASSERT_EQ(all.size(), ck::layouts().size());
  for (Convention c : all) EXPECT_EQ(microscale::io::convention_from_name(microscale::io::name(c)), c);
  EXPECT_TRUE(microscale::io::stores_activation_scales(Convention::modelopt));
  EXPECT_FALSE(microscale::io::stores_activation_scales(Convention::mlx));
  EXPECT_TRUE(microscale::io::is_model_directory(Convention::mlx));
  EXPECT_FALSE(microscale::io::is_model_directory(Convention::gguf));  // a file of its own
}

// save_checkpoint writes model directories: a layout with a file format of its own is refused by
// name (it used to reach the directory writer without a config writer).
TEST(LayoutCapabilities, SaveCheckpointRefusesFileLayouts) {
  const iot::TempDir dir;
  microscale::io::CheckpointData data;
  data.layers.push_back(
      {"model.layers.0.mlp.up_proj",
       microscale::quantize(microscale::Tensor(microscale::DType::float32, {16, 64}).view(), microscale::QuantSpec{}),
       std::nullopt});
  iot::expect_error([&] { microscale::io::save_checkpoint(dir / "out", data, Convention::gguf); },
                    {"unknown export 'gguf'", "compressed-tensors, modelopt, mlx"});
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}
