// What llama.cpp's converter writes per architecture (io/gguf_arch.hpp): a plan for every
// fixture's config, a rule for every tensor the exporter presents, the converter's special cases,
// and errors that name the model_type and the key.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "gguf_arch_names.hpp"
#include "io/gguf_arch.hpp"
#include "io_support.hpp"

namespace {

namespace g = microscale::io::gguf;
using g::Json;
const std::filesystem::path kFixtures = MICROSCALE_FIXTURES_DIR;

Json fixture_config(const std::string& name) {
  std::ifstream in(kFixtures / name / "config.json");
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str());
}

const g::Kv* find(const g::ArchPlan& p, const std::string& key) {
  for (const g::Kv& kv : p.kvs)
    if (kv.key == key) return &kv;
  return nullptr;
}

std::uint32_t u32(const g::ArchPlan& p, const std::string& key) {
  const g::Kv* kv = find(p, key);
  if (!kv) ADD_FAILURE() << key << " missing";
  if (!kv) return 0;
  EXPECT_EQ(kv->type, g::ValueType::u32) << key;
  return kv->value.get<std::uint32_t>();
}

float f32(const g::ArchPlan& p, const std::string& key) {
  const g::Kv* kv = find(p, key);
  if (!kv) ADD_FAILURE() << key << " missing";
  if (!kv) return 0;
  EXPECT_EQ(kv->type, g::ValueType::f32) << key;
  return kv->value.get<float>();
}

g::TensorRule rule(const g::ArchPlan& p, const std::string& hf) {
  const auto r = g::tensor_rule(p, hf);
  if (!r) ADD_FAILURE() << "no rule for " << hf;
  return r.value_or(g::TensorRule{});
}

struct FixtureArch {
  const char* fixture;
  const char* arch;
};
constexpr FixtureArch kFixtureArchs[] = {
    {"llama", "llama"},        {"mistral", "llama"}, {"mixtral", "llama"}, {"qwen2", "qwen2"}, {"qwen3", "qwen3"},
    {"qwen3_moe", "qwen3moe"}, {"gemma2", "gemma2"}, {"gemma3", "gemma3"}, {"phi3", "phi3"},   {"gpt_oss", "gpt-oss"},
};

TEST(GgufArch, EveryFixtureTensorHasOneUniqueName) {
  for (const auto& [fixture, arch] : kFixtureArchs) {
    SCOPED_TRACE(fixture);
    const g::ArchPlan plan = g::arch_plan(fixture_config(fixture));
    EXPECT_EQ(plan.arch, arch);
    ASSERT_FALSE(plan.kvs.empty());
    EXPECT_EQ(plan.kvs.front().key, "general.architecture");
    EXPECT_EQ(plan.kvs.front().value, arch);
    std::set<std::string> keys;
    for (const g::Kv& kv : plan.kvs) {
      EXPECT_TRUE(keys.insert(kv.key).second) << "duplicate key " << kv.key;
      if (kv.key != "general.architecture") {
        EXPECT_TRUE(kv.key.starts_with(std::string(arch) + ".")) << kv.key;
      }
    }
    EXPECT_EQ(u32(plan, std::string(arch) + ".block_count"), 2u);

    const auto ck = microscale::io::Checkpoint::open(kFixtures / fixture);
    std::set<std::string> written;
    std::size_t scales = 0;
    for (const auto& p : gguf_arch_test::presented_names(ck)) {
      const auto r = g::tensor_rule(plan, p.name);
      ASSERT_TRUE(r) << p.name;
      if (r->skip) continue;
      EXPECT_TRUE(written.insert(r->name).second) << "two tensors named " << r->name;
      EXPECT_LE(r->name.size(), 63u) << r->name;
      if (p.shape.size() == 1) {
        EXPECT_TRUE(r->f32) << p.name;
      }
      if (!p.weight.empty()) {  // "<m>.scale" / "<m>.input_scale": the weight's GGUF name, leaf replaced
        ++scales;
        const std::string w = rule(plan, p.weight).name;
        const std::string leaf = p.name.substr(p.name.rfind('.'));
        EXPECT_EQ(r->name, w.substr(0, w.size() - std::string(".weight").size()) + leaf);
        EXPECT_TRUE(r->f32);
        EXPECT_EQ(r->permute_heads, 0);
      }
    }
    EXPECT_GT(scales, 0u);
  }
}

TEST(GgufArch, LlamaFamilyPermutesQueryAndKeyRowsPerHead) {
  for (const char* fixture : {"llama", "mistral", "mixtral"}) {
    SCOPED_TRACE(fixture);
    const g::ArchPlan plan = g::arch_plan(fixture_config(fixture));  // 2 heads, 1 kv head
    EXPECT_EQ(rule(plan, "model.layers.1.self_attn.q_proj.weight").permute_heads, 2);
    EXPECT_EQ(rule(plan, "model.layers.1.self_attn.k_proj.weight").permute_heads, 1);
    EXPECT_EQ(rule(plan, "model.layers.1.self_attn.q_proj.bias").permute_heads, 2);
    EXPECT_EQ(rule(plan, "model.layers.1.self_attn.v_proj.weight").permute_heads, 0);
    EXPECT_EQ(rule(plan, "model.layers.1.self_attn.q_proj.scale").permute_heads, 0);
    EXPECT_EQ(rule(plan, "model.layers.1.self_attn.q_proj.weight").name, "blk.1.attn_q.weight");
    EXPECT_EQ(u32(plan, "llama.vocab_size"), 128u);
    EXPECT_EQ(u32(plan, "llama.rope.dimension_count"), 32u);
  }
  for (const char* fixture : {"qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3", "gpt_oss"}) {
    const g::ArchPlan plan = g::arch_plan(fixture_config(fixture));
    EXPECT_EQ(rule(plan, "model.layers.0.self_attn.q_proj.weight").permute_heads, 0) << fixture;
    EXPECT_EQ(rule(plan, "model.layers.0.self_attn.k_proj.weight").permute_heads, 0) << fixture;
  }
  // Equal head counts: k is permuted by the query heads.
  Json c = fixture_config("llama");
  c["num_key_value_heads"] = 2;
  EXPECT_EQ(rule(g::arch_plan(c), "model.layers.0.self_attn.k_proj.weight").permute_heads, 2);
}

TEST(GgufArch, GemmaNormsAreStoredPlusOne) {
  const g::ArchPlan g2 = g::arch_plan(fixture_config("gemma2"));
  const g::ArchPlan g3 = g::arch_plan(fixture_config("gemma3"));
  for (const g::ArchPlan* p : {&g2, &g3}) {
    for (const char* norm :
         {"model.norm.weight", "model.layers.0.input_layernorm.weight",
          "model.layers.0.post_attention_layernorm.weight", "model.layers.0.pre_feedforward_layernorm.weight",
          "model.layers.0.post_feedforward_layernorm.weight"}) {
      EXPECT_TRUE(rule(*p, norm).plus_one) << p->arch << " " << norm;
      EXPECT_TRUE(rule(*p, norm).f32) << p->arch << " " << norm;
    }
    EXPECT_FALSE(rule(*p, "model.layers.0.mlp.down_proj.weight").plus_one);
    EXPECT_EQ(rule(*p, "model.layers.0.post_attention_layernorm.weight").name, "blk.0.post_attention_norm.weight");
    EXPECT_EQ(rule(*p, "model.layers.0.pre_feedforward_layernorm.weight").name, "blk.0.ffn_norm.weight");
    EXPECT_EQ(rule(*p, "model.layers.0.post_feedforward_layernorm.weight").name, "blk.0.post_ffw_norm.weight");
  }
  EXPECT_TRUE(rule(g3, "model.layers.0.self_attn.q_norm.weight").plus_one);
  EXPECT_TRUE(rule(g3, "model.layers.0.self_attn.k_norm.weight").plus_one);
  EXPECT_FALSE(g::tensor_rule(g2, "model.layers.0.self_attn.q_norm.weight"));  // Gemma 2 has none
  EXPECT_TRUE(rule(g2, "lm_head.weight").skip);
  EXPECT_EQ(rule(g3, "lm_head.weight").name, "output.weight");
  EXPECT_TRUE(g2.tied_embeddings && g3.tied_embeddings);
  // Other architectures' norms are stored as they are.
  const g::ArchPlan q3 = g::arch_plan(fixture_config("qwen3"));
  EXPECT_FALSE(rule(q3, "model.layers.0.self_attn.q_norm.weight").plus_one);
  EXPECT_FALSE(rule(q3, "model.norm.weight").plus_one);
  EXPECT_TRUE(q3.tied_embeddings);
}

TEST(GgufArch, ExpertsRoutersSinksAndFusedProjections) {
  const g::ArchPlan moe = g::arch_plan(fixture_config("qwen3_moe"));
  EXPECT_EQ(rule(moe, "model.layers.1.mlp.switch_mlp.gate_proj.weight").name, "blk.1.ffn_gate_exps.weight");
  EXPECT_EQ(rule(moe, "model.layers.1.mlp.switch_mlp.down_proj.scale").name, "blk.1.ffn_down_exps.scale");
  EXPECT_EQ(rule(moe, "model.layers.1.mlp.gate.weight").name, "blk.1.ffn_gate_inp.weight");
  EXPECT_TRUE(rule(moe, "model.layers.1.mlp.gate.weight").f32);                        // llama.cpp keeps routers in F32
  EXPECT_FALSE(g::tensor_rule(moe, "model.layers.1.mlp.experts.0.gate_proj.weight"));  // stacked first
  EXPECT_FALSE(g::tensor_rule(moe, "model.layers.1.mlp.gate.scale"));
  EXPECT_EQ(u32(moe, "qwen3moe.expert_count"), 4u);
  EXPECT_EQ(u32(moe, "qwen3moe.expert_used_count"), 2u);
  EXPECT_EQ(u32(moe, "qwen3moe.expert_feed_forward_length"), 64u);

  const g::ArchPlan mix = g::arch_plan(fixture_config("mixtral"));
  EXPECT_EQ(rule(mix, "model.layers.0.block_sparse_moe.switch_mlp.up_proj.weight").name, "blk.0.ffn_up_exps.weight");
  EXPECT_EQ(rule(mix, "model.layers.0.block_sparse_moe.gate.weight").name, "blk.0.ffn_gate_inp.weight");
  EXPECT_EQ(u32(mix, "llama.expert_count"), 4u);
  EXPECT_FALSE(find(mix, "llama.expert_feed_forward_length"));  // the converter writes none for Mixtral

  const g::ArchPlan oss = g::arch_plan(fixture_config("gpt_oss"));
  EXPECT_EQ(rule(oss, "model.layers.0.self_attn.sinks").name, "blk.0.attn_sinks.weight");
  EXPECT_TRUE(rule(oss, "model.layers.0.self_attn.sinks").f32);
  EXPECT_EQ(rule(oss, "model.layers.0.mlp.experts.up_proj.bias").name, "blk.0.ffn_up_exps.bias");
  EXPECT_EQ(rule(oss, "model.layers.0.mlp.experts.down_proj.weight").name, "blk.0.ffn_down_exps.weight");
  EXPECT_EQ(rule(oss, "model.layers.0.mlp.router.bias").name, "blk.0.ffn_gate_inp.bias");
  EXPECT_EQ(rule(oss, "model.layers.0.post_attention_layernorm.weight").name, "blk.0.post_attention_norm.weight");
  EXPECT_EQ(rule(oss, "model.layers.0.self_attn.o_proj.bias").name, "blk.0.attn_output.bias");
  EXPECT_FALSE(g::tensor_rule(oss, "model.layers.0.mlp.experts.gate_up_proj"));  // split first

  const g::ArchPlan phi = g::arch_plan(fixture_config("phi3"));
  EXPECT_EQ(rule(phi, "model.layers.0.self_attn.qkv_proj.weight").name, "blk.0.attn_qkv.weight");
  EXPECT_EQ(rule(phi, "model.layers.0.mlp.gate_up_proj.weight").name, "blk.0.ffn_up.weight");
  EXPECT_EQ(rule(phi, "model.layers.0.mlp.gate_up_proj.scale").name, "blk.0.ffn_up.scale");

  const g::ArchPlan llama = g::arch_plan(fixture_config("llama"));
  EXPECT_EQ(rule(llama, "lm_head.weight").name, "output.weight");
  EXPECT_EQ(rule(llama, "lm_head.scale").name, "output.scale");
  EXPECT_FALSE(g::tensor_rule(llama, "model.embed_tokens.scale"));  // llama.cpp reads no scale there
  EXPECT_TRUE(rule(llama, "model.layers.0.self_attn.rotary_emb.inv_freq").skip);
  EXPECT_FALSE(g::tensor_rule(llama, "model.layers.x.self_attn.q_proj.weight"));
  EXPECT_FALSE(g::tensor_rule(llama, "model.layers.0.self_attn.q_proj"));
}

TEST(GgufArch, HyperparametersAsTheConverterWritesThem) {
  const g::ArchPlan llama = g::arch_plan(fixture_config("llama"));
  EXPECT_EQ(u32(llama, "llama.context_length"), 128u);
  EXPECT_EQ(u32(llama, "llama.embedding_length"), 64u);
  EXPECT_EQ(u32(llama, "llama.feed_forward_length"), 128u);
  EXPECT_EQ(u32(llama, "llama.attention.head_count"), 2u);
  EXPECT_EQ(u32(llama, "llama.attention.head_count_kv"), 1u);
  EXPECT_EQ(u32(llama, "llama.attention.key_length"), 32u);
  EXPECT_EQ(f32(llama, "llama.rope.freq_base"), 10000.0f);
  EXPECT_EQ(f32(llama, "llama.attention.layer_norm_rms_epsilon"), 1e-6f);
  EXPECT_FALSE(find(llama, "llama.attention.sliding_window"));
  EXPECT_TRUE(llama.extra_tensors.empty());

  const g::ArchPlan qwen2 = g::arch_plan(fixture_config("qwen2"));  // no head_dim in its config
  EXPECT_FALSE(find(qwen2, "qwen2.attention.key_length"));
  EXPECT_FALSE(find(qwen2, "qwen2.vocab_size"));
  EXPECT_EQ(qwen2.vocab_size, 128);

  const g::ArchPlan g2 = g::arch_plan(fixture_config("gemma2"));
  EXPECT_EQ(f32(g2, "gemma2.attn_logit_softcapping"), 50.0f);
  EXPECT_EQ(f32(g2, "gemma2.final_logit_softcapping"), 30.0f);
  EXPECT_EQ(u32(g2, "gemma2.attention.sliding_window"), 4096u);
  EXPECT_FALSE(find(g2, "gemma2.rope.freq_base"));  // Gemma 2's own list has no rope keys

  const g::ArchPlan g3 = g::arch_plan(fixture_config("gemma3"));
  EXPECT_EQ(f32(g3, "gemma3.rope.freq_base"), 1e6f);
  EXPECT_EQ(f32(g3, "gemma3.rope.freq_base_swa"), 1e4f);
  EXPECT_EQ(u32(g3, "gemma3.attention.sliding_window"), 32u);
  EXPECT_FALSE(find(g3, "gemma3.final_logit_softcapping"));  // null in the config

  const g::ArchPlan phi = g::arch_plan(fixture_config("phi3"));
  EXPECT_EQ(u32(phi, "phi3.attention.sliding_window"), 0u);  // null: 0 tells Phi-3 from Phi-4
  EXPECT_EQ(u32(phi, "phi3.rope.scaling.original_context_length"), 4096u);
  EXPECT_EQ(u32(phi, "phi3.rope.dimension_count"), 32u);

  const g::ArchPlan oss = g::arch_plan(fixture_config("gpt_oss"));
  const g::Kv* type = find(oss, "gpt-oss.rope.scaling.type");
  ASSERT_TRUE(type);
  EXPECT_EQ(type->type, g::ValueType::string);
  EXPECT_EQ(type->value, "yarn");
  EXPECT_EQ(f32(oss, "gpt-oss.rope.scaling.factor"), 32.0f);
  EXPECT_EQ(u32(oss, "gpt-oss.rope.scaling.original_context_length"), 4096u);
  EXPECT_EQ(f32(oss, "gpt-oss.rope.scaling.yarn_beta_fast"), 32.0f);
  EXPECT_EQ(f32(oss, "gpt-oss.rope.freq_base"), 150000.0f);
  EXPECT_EQ(u32(oss, "gpt-oss.attention.sliding_window"), 32u);
  EXPECT_EQ(u32(oss, "gpt-oss.expert_feed_forward_length"), 64u);
}

TEST(GgufArch, TransformersFourConfigsGiveTheSameKeys) {
  // rope_theta at the top level and no rope_parameters, as transformers 4 writes it.
  Json c = fixture_config("qwen3");
  c.erase("rope_parameters");
  c["rope_theta"] = 500000.0;
  EXPECT_EQ(f32(g::arch_plan(c), "qwen3.rope.freq_base"), 500000.0f);

  // Gemma 3 4B's form: linear rope scaling for the global layers, a local base frequency.
  Json g3 = fixture_config("gemma3");
  g3.erase("rope_parameters");
  g3["rope_theta"] = 1000000.0;
  g3["rope_local_base_freq"] = 10000.0;
  g3["rope_scaling"] = Json{{"factor", 8.0}, {"rope_type", "linear"}};
  const g::ArchPlan p = g::arch_plan(g3);
  EXPECT_EQ(find(p, "gemma3.rope.scaling.type")->value, "linear");
  EXPECT_EQ(f32(p, "gemma3.rope.scaling.factor"), 8.0f);
  EXPECT_EQ(f32(p, "gemma3.rope.freq_base"), 1e6f);
  EXPECT_EQ(f32(p, "gemma3.rope.freq_base_swa"), 1e4f);
}

TEST(GgufArch, GeneratedRopeTensors) {
  Json c = fixture_config("llama");  // head_dim 32: 16 frequencies
  c["rope_parameters"] =
      Json{{"rope_theta", 500000.0}, {"rope_type", "llama3"},   {"factor", 32.0},
           {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  const g::ArchPlan p = g::arch_plan(c);
  ASSERT_EQ(p.extra_tensors.size(), 1u);
  EXPECT_EQ(p.extra_tensors[0].name, "rope_freqs.weight");
  const std::vector<float>& f = p.extra_tensors[0].values;
  ASSERT_EQ(f.size(), 16u);
  EXPECT_EQ(f.front(), 1.0f);  // wavelength 2*pi: kept
  EXPECT_EQ(f.back(), 32.0f);  // wavelength ~ 2*pi*500000^(30/32) > 8192: divided by the factor
  for (std::size_t i = 1; i < f.size(); ++i) EXPECT_GE(f[i], f[i - 1]);

  Json phi = fixture_config("phi3");
  phi["max_position_embeddings"] = 131072;
  phi["rope_parameters"] = Json{{"rope_theta", 10000.0},
                                {"rope_type", "longrope"},
                                {"long_factor", std::vector<double>(16, 2.0)},
                                {"short_factor", std::vector<double>(16, 1.0)},
                                {"original_max_position_embeddings", 4096}};
  const g::ArchPlan q = g::arch_plan(phi);
  ASSERT_EQ(q.extra_tensors.size(), 2u);
  EXPECT_EQ(q.extra_tensors[0].name, "rope_factors_long.weight");
  EXPECT_EQ(q.extra_tensors[1].name, "rope_factors_short.weight");
  EXPECT_FLOAT_EQ(f32(q, "phi3.rope.scaling.attn_factor"),
                  static_cast<float>(std::sqrt(1 + std::log(32.0) / std::log(4096.0))));
  phi["rope_parameters"]["short_factor"] = std::vector<double>(15, 1.0);
  iot::expect_error([&] { (void)g::arch_plan(phi); }, {"phi3", "short_factor", "16"});
}

TEST(GgufArch, ErrorsNameTheModelTypeAndTheKey) {
  Json bert{{"model_type", "bert"}};
  iot::expect_error([&] { (void)g::arch_plan(bert); }, {"\"bert\"", "llama", "qwen3_moe", "gemma3_text", "gpt_oss"});
  iot::expect_error([&] { (void)g::arch_plan(Json::object()); }, {"model_type", "phi3"});
  const auto missing = [](const char* fixture, const char* key) {
    Json c = fixture_config(fixture);
    c.erase(key);
    iot::expect_error([&] { (void)g::arch_plan(c); }, {c["model_type"].get<std::string>(), key});
  };
  missing("llama", "num_hidden_layers");
  missing("mistral", "vocab_size");
  missing("gemma2", "attn_logit_softcapping");
  missing("gemma2", "head_dim");
  missing("gemma3", "sliding_window");
  missing("phi3", "original_max_position_embeddings");
  missing("gpt_oss", "sliding_window");
  Json c = fixture_config("qwen2");
  c["num_attention_heads"] = -2;
  iot::expect_error([&] { (void)g::arch_plan(c); }, {"qwen2", "num_attention_heads", "-2"});
}

TEST(GgufArch, FileTypeOfTheQuantizedWeights) {
  EXPECT_EQ(g::llama_file_type(g::GgmlType::nvfp4), 39u);
  EXPECT_EQ(g::llama_file_type(g::GgmlType::mxfp4), 38u);
  EXPECT_EQ(g::llama_file_type(g::GgmlType::bf16), 32u);
}

}  // namespace

// Reading a GGUF back rebuilds config.json from its keys (hf_config), and the importer plans the
// architecture again from that config: every fixture's keys must survive the trip unchanged.
TEST(GgufArch, RebuiltConfigGivesTheSameKeys) {
  for (const auto& [fixture, arch] : kFixtureArchs) {
    SCOPED_TRACE(fixture);
    const g::ArchPlan plan = g::arch_plan(fixture_config(fixture));
    const Json rebuilt = g::hf_config(plan.kvs, plan.vocab_size, !plan.tied_embeddings);
    g::ArchPlan again;
    try {
      again = g::arch_plan(rebuilt);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what() << "\n" << rebuilt.dump();
      continue;
    }
    EXPECT_EQ(again.arch, plan.arch);
    std::set<std::string> keys, again_keys;
    for (const g::Kv& kv : plan.kvs) keys.insert(kv.key);
    for (const g::Kv& kv : again.kvs) again_keys.insert(kv.key);
    EXPECT_EQ(again_keys, keys) << rebuilt.dump();
    if (again_keys != keys) continue;
    for (std::size_t i = 0; i < plan.kvs.size(); ++i) {
      EXPECT_EQ(again.kvs[i].key, plan.kvs[i].key);
      EXPECT_EQ(again.kvs[i].type, plan.kvs[i].type) << plan.kvs[i].key;
      EXPECT_EQ(again.kvs[i].value, plan.kvs[i].value) << plan.kvs[i].key;
    }
    EXPECT_EQ(again.tied_embeddings, plan.tied_embeddings);
  }
}

// What llama.cpp's graphs fix without a key, in the rebuilt config.json: Gemma's attention scale
// (1/sqrt(head_dim) below 27B), Qwen3-MoE's renormalized expert weights, Phi-3's window 0 as none,
// and the special token ids (null where the file has none, so that no transformers default points
// outside the vocabulary).
TEST(GgufArch, RebuiltConfigHoldsWhatLlamaCppAssumes) {
  for (const char* fixture : {"gemma2", "gemma3"}) {
    SCOPED_TRACE(fixture);
    const g::ArchPlan plan = g::arch_plan(fixture_config(fixture));
    const Json c = g::hf_config(plan.kvs, plan.vocab_size, !plan.tied_embeddings);
    EXPECT_EQ(c.value("query_pre_attn_scalar", Json()), Json(32));  // head_dim; the fixture says 256
  }
  Json big = fixture_config("gemma2");
  big["num_hidden_layers"] = 46;  // Gemma 2 27B: hidden / heads, not head_dim
  big["num_attention_heads"] = 4;
  const g::ArchPlan p27 = g::arch_plan(big);
  EXPECT_EQ(g::hf_config(p27.kvs, p27.vocab_size, true).value("query_pre_attn_scalar", Json()), Json(64 / 4));

  const g::ArchPlan moe = g::arch_plan(fixture_config("qwen3_moe"));
  EXPECT_EQ(g::hf_config(moe.kvs, moe.vocab_size, true).value("norm_topk_prob", Json()), Json(true));

  const g::ArchPlan phi = g::arch_plan(fixture_config("phi3"));
  std::vector<g::Kv> kvs = phi.kvs;
  const Json bare = g::hf_config(kvs, phi.vocab_size, true);
  EXPECT_TRUE(bare.contains("pad_token_id") && bare["pad_token_id"].is_null()) << bare.dump();
  EXPECT_TRUE(bare.contains("sliding_window") && bare["sliding_window"].is_null()) << bare.dump();  // 0: none
  kvs.push_back(g::kv_u32("tokenizer.ggml.bos_token_id", 1));
  kvs.push_back(g::kv_u32("tokenizer.ggml.padding_token_id", 120));
  const Json with_ids = g::hf_config(kvs, phi.vocab_size, true);
  EXPECT_EQ(with_ids["bos_token_id"], Json(1));
  EXPECT_EQ(with_ids["pad_token_id"], Json(120));
  EXPECT_TRUE(with_ids["eos_token_id"].is_null());
}
