// read_vocab: every fixture's tokenizer, and hostile tokenizer files (each an Error naming the
// file, never a crash). check_gguf_vocab.py compares the values with the reference packages.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "io/gguf_vocab.hpp"
#include "io_support.hpp"

namespace {

namespace fs = std::filesystem;
using microscale::Error;
using namespace microscale::io::gguf;

const fs::path kFixtures = MICROSCALE_FIXTURES_DIR;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
void write_file(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }
Json config_of(const fs::path& dir) { return Json::parse(read_file(dir / "config.json")); }
const Kv* find(const Vocab& v, const std::string& key) {
  for (const Kv& kv : v.kvs)
    if (kv.key == key) return &kv;
  return nullptr;
}
// The error message of read_vocab, or "" when it succeeds.
std::string error_of(const fs::path& dir, std::int64_t vocab_size = 128) {
  try {
    read_vocab(dir, config_of(dir), vocab_size);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
// A copy of a fixture's tokenizer files (and config) in `tmp`.
void copy_tokenizer(const std::string& arch, const fs::path& tmp) {
  for (const auto& e : fs::directory_iterator(kFixtures / arch))
    if (e.path().filename() != "model.safetensors") fs::copy_file(e.path(), tmp / e.path().filename());
}
// Only config.json and tokenizer.model, for the loops over every byte of the latter.
void copy_sentencepiece(const std::string& arch, const fs::path& tmp) {
  for (const char* name : {"config.json", "tokenizer.model"}) fs::copy_file(kFixtures / arch / name, tmp / name);
}

TEST(GgufVocab, EveryFixture) {
  const std::map<std::string, std::pair<std::string, std::string>> want{
      {"llama", {"gpt2", "llama-bpe"}}, {"qwen2", {"gpt2", "qwen2"}},      {"qwen3", {"gpt2", "qwen2"}},
      {"qwen3_moe", {"gpt2", "qwen2"}}, {"mistral", {"llama", "default"}}, {"phi3", {"llama", "default"}},
      {"gemma2", {"llama", "default"}}, {"gemma3", {"llama", "default"}}};
  for (const auto& [arch, model_pre] : want) {
    SCOPED_TRACE(arch);
    const fs::path dir = kFixtures / arch;
    const Vocab v = read_vocab(dir, config_of(dir), 128);
    ASSERT_NE(find(v, "tokenizer.ggml.model"), nullptr);
    EXPECT_EQ(find(v, "tokenizer.ggml.model")->value, model_pre.first);
    EXPECT_EQ(find(v, "tokenizer.ggml.pre")->value, model_pre.second);
    const Kv* tokens = find(v, "tokenizer.ggml.tokens");
    ASSERT_NE(tokens, nullptr);
    EXPECT_EQ(tokens->type, ValueType::array);
    EXPECT_EQ(tokens->elem, ValueType::string);
    ASSERT_EQ(tokens->value.size(), 128u);
    EXPECT_EQ(tokens->value[127], "[PAD127]");  // every fixture leaves the last ids as padding
    const Kv* types = find(v, "tokenizer.ggml.token_type");
    EXPECT_EQ(types->elem, ValueType::i32);
    EXPECT_EQ(types->value[127], 5);
    const bool bpe = model_pre.first == "gpt2";
    EXPECT_EQ(find(v, "tokenizer.ggml.merges") != nullptr, bpe);
    EXPECT_EQ(find(v, "tokenizer.ggml.scores") != nullptr, !bpe);
    EXPECT_NE(find(v, "tokenizer.ggml.eos_token_id"), nullptr);
    EXPECT_NE(find(v, "tokenizer.chat_template"), nullptr);
    EXPECT_EQ(v.source, bpe ? "tokenizer.json (BPE)" : "tokenizer.model (SentencePiece)");
  }
}

TEST(GgufVocab, NoTokenizerIsEmpty) {
  const Vocab v = read_vocab(kFixtures / "deepseek_v3", config_of(kFixtures / "deepseek_v3"), 128);
  EXPECT_TRUE(v.kvs.empty());
  EXPECT_EQ(v.source, "");
}

TEST(GgufVocab, LargerVocabularyPadsSmallerRefused) {
  const Vocab v = read_vocab(kFixtures / "llama", config_of(kFixtures / "llama"), 1000);
  EXPECT_EQ(find(v, "tokenizer.ggml.tokens")->value.size(), 1000u);
  EXPECT_EQ(find(v, "tokenizer.ggml.tokens")->value[999], "[PAD999]");
  for (const char* arch : {"llama", "gemma2"}) {
    const std::string e = error_of(kFixtures / arch, 50);
    EXPECT_NE(e.find(arch), std::string::npos) << e;
    EXPECT_NE(e.find("the model's vocabulary of 50 (the embedding's rows)"), std::string::npos) << e;
  }
  EXPECT_NE(error_of(kFixtures / "mistral", 100).find("tokenizer.model: 120 pieces, more than"), std::string::npos);
}

TEST(GgufVocab, SentencePieceTruncatedAtEveryByte) {
  iot::TempDir tmp;
  copy_sentencepiece("mistral", tmp.path());
  const std::string model = read_file(tmp / "tokenizer.model");
  for (std::size_t n = 0; n < model.size(); ++n) {
    write_file(tmp / "tokenizer.model", model.substr(0, n));
    const std::string e = error_of(tmp.path());
    ASSERT_NE(e.find("tokenizer.model"), std::string::npos) << "cut at " << n << ": " << e;
  }
  write_file(tmp / "tokenizer.model", model);
  EXPECT_EQ(error_of(tmp.path()), "");
}

TEST(GgufVocab, SentencePieceGarbageNeverCrashes) {
  iot::TempDir tmp;
  copy_sentencepiece("gemma2", tmp.path());
  const std::string model = read_file(tmp / "tokenizer.model");
  int errors = 0;
  for (std::size_t at = 0; at < model.size(); ++at)
    for (unsigned b : {0x80u, 0xFFu}) {
      std::string bad = model;
      bad[at] = static_cast<char>(b);
      write_file(tmp / "tokenizer.model", bad);
      const std::string e = error_of(tmp.path());  // an Error or a vocabulary, nothing else
      if (!e.empty()) {
        ++errors;
        ASSERT_NE(e.find("tokenizer.model"), std::string::npos) << e;
      }
    }
  EXPECT_GT(errors, 0);
  write_file(tmp / "tokenizer.model", std::string(64, '\xFF'));
  EXPECT_NE(error_of(tmp.path()).find("tokenizer.model: not a valid SentencePiece model"), std::string::npos);
}

TEST(GgufVocab, HostileJsonNamesTheFile) {
  iot::TempDir tmp;
  copy_tokenizer("qwen3", tmp.path());
  const std::string good = read_file(tmp / "tokenizer.json");
  auto with = [&](const std::string& text) {
    write_file(tmp / "tokenizer.json", text);
    return error_of(tmp.path());
  };
  EXPECT_NE(with(good.substr(0, good.size() / 2)).find("tokenizer.json: tokenizer.json is not valid JSON"),
            std::string::npos);
  EXPECT_NE(with("[1, 2]").find("tokenizer.json: tokenizer.json is not a JSON object"), std::string::npos);
  EXPECT_NE(with(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}}})").find("id 0 is given to both"),
            std::string::npos);
  EXPECT_NE(with(R"({"model": {"type": "BPE", "vocab": {"a": 200}}})").find("\"a\" has id 200, outside"),
            std::string::npos);
  EXPECT_NE(with(R"({"model": {"type": "BPE", "vocab": {"a": -1}}})").find("has id -1"), std::string::npos);
  EXPECT_NE(with(R"({"model": {"type": "BPE", "vocab": {"a": "x"}}})").find("not an integer"), std::string::npos);
  EXPECT_NE(with(R"({"model": {"type": "WordPiece", "vocab": {}}})").find("model type \"WordPiece\" is not supported"),
            std::string::npos);
  EXPECT_NE(with(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "b"], "a b"]}})")
                .find("tokenizer.json: model.merges entry 1"),
            std::string::npos);
  EXPECT_NE(with(R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "added_tokens": [{"id": 0, "content": "b"}]})")
                .find("id 0 is given to both \"a\" and \"b\""),
            std::string::npos);
  EXPECT_NE(with(R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {"a": 0}}})")
                .find("SentencePiece-style tokenizer"),
            std::string::npos);
  write_file(tmp / "tokenizer.json", good);
  write_file(tmp / "tokenizer_config.json", "{");
  EXPECT_NE(error_of(tmp.path()).find("tokenizer_config.json: "), std::string::npos);
}

TEST(GgufVocab, AddedTokensOutOfRangeNameTheirFile) {
  iot::TempDir tmp;
  copy_tokenizer("mistral", tmp.path());
  write_file(tmp / "added_tokens.json", R"({"<extra>": 500})");
  EXPECT_NE(error_of(tmp.path()).find("added_tokens.json: token \"<extra>\" has id 500"), std::string::npos);
  fs::remove(tmp / "added_tokens.json");
  write_file(tmp / "tokenizer_config.json", R"({"added_tokens_decoder": {"x1": {"content": "a"}}})");
  EXPECT_NE(error_of(tmp.path()).find("tokenizer_config.json: added_tokens_decoder key \"x1\""), std::string::npos);
}

TEST(GgufVocab, UserDefinedAddedTokenWithSpaces) {
  iot::TempDir tmp;
  copy_tokenizer("mistral", tmp.path());
  write_file(tmp / "added_tokens.json", "{\"\xE2\x96\x81hi\": 125}");
  const Vocab v = read_vocab(tmp.path(), config_of(tmp.path()), 128);
  EXPECT_EQ(find(v, "tokenizer.ggml.tokens")->value[125], "\xE2\x96\x81hi");  // added_tokens.json: kept as is
  EXPECT_EQ(find(v, "tokenizer.ggml.token_type")->value[125], 4);
  EXPECT_FLOAT_EQ(find(v, "tokenizer.ggml.scores")->value[125].get<float>(), -1000.0f);
}

// A vocabulary of a large model's size reads whole (its speed is a benchmark's business, not a test's).
TEST(GgufVocab, LargeVocabularyIsRead) {
  iot::TempDir tmp;
  const int n = 150000;
  std::ostringstream text;
  text << R"({"model": {"type": "BPE", "vocab": {)";
  for (int i = 0; i < n; ++i) text << (i ? "," : "") << "\"t" << i << "\":" << i;
  text << R"(}, "merges": [)";
  for (int i = 0; i < n; ++i) text << (i ? "," : "") << "[\"t" << i << "\",\"x\"]";
  text << R"(]}, "added_tokens": [{"id": 0, "content": "t0", "special": true}]})";
  write_file(tmp / "tokenizer.json", text.str());
  write_file(tmp / "config.json", R"({"model_type": "qwen2", "vocab_size": 150000})");
  const Vocab v = read_vocab(tmp.path(), config_of(tmp.path()), n);
  EXPECT_EQ(find(v, "tokenizer.ggml.tokens")->value.size(), static_cast<std::size_t>(n));
  EXPECT_EQ(find(v, "tokenizer.ggml.merges")->value.size(), static_cast<std::size_t>(n));
  EXPECT_EQ(find(v, "tokenizer.ggml.pre")->value, "default");  // no pre_tokenizer: noted
}

}  // namespace
