// The tokenizer keys of a GGUF file, read the way llama.cpp's convert_hf_to_gguf.py reads them
// (its TextModel._set_vocab_gpt2 / _set_vocab_sentencepiece / Phi3 set_vocab and gguf-py's
// SpecialVocab), without running a tokenizer. docs/gguf.md ("Tokenizer") has the rules.
#include "io/gguf_vocab.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstring>
#include <optional>
#include <string_view>
#include <unordered_set>
#include <utility>

namespace microscale::io::gguf {
namespace {

namespace fs = std::filesystem;
using detail::fail;

// tokenizer.json of a 256k-token vocabulary is about 35 MB; this only bounds hostile input.
constexpr std::uintmax_t kMaxTokenizerBytes = 1u << 30;
constexpr std::int64_t kMaxVocab = std::int64_t{1} << 24;
// The scores llama.cpp's converter gives added tokens and the padding of a SentencePiece vocabulary.
constexpr float kAddedScore = -1000.0f;
constexpr float kPadScore = -10000.0f;

// llama.cpp's token attributes (gguf-py TokenType; SentencePiece's piece types share the numbers).
enum class TokenType : std::int32_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

struct TokenTable {
  std::vector<std::string> text;
  std::vector<float> scores;  // SentencePiece only
  std::vector<TokenType> types;
  std::vector<bool> defined;  // ids some file names; the others are padding

  TokenTable(std::int64_t n, bool with_scores) {
    const auto size = static_cast<std::size_t>(n);
    text.resize(size);
    types.assign(size, TokenType::unused);
    defined.assign(size, false);
    if (with_scores) scores.assign(size, kPadScore);
    for (std::size_t i = 0; i < size; ++i) text[i] = "[PAD" + std::to_string(i) + "]";
  }
  std::size_t padding() const {
    std::size_t n = 0;
    for (bool d : defined) n += d ? 0 : 1;
    return n;
  }
};

// A member of an object, or nullptr (also when `j` is not an object).
const Json* member(const Json& j, std::string_view key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}
// Python's truthiness of a JSON value, which the converter's checks rely on.
bool truthy(const Json* j) {
  if (j == nullptr || j->is_null()) return false;
  if (j->is_boolean()) return j->get<bool>();
  if (j->is_string()) return !j->get_ref<const std::string&>().empty();
  if (j->is_object() || j->is_array()) return !j->empty();
  if (j->is_number_integer()) return j->get<std::int64_t>() != 0;
  if (j->is_number_float()) return j->get<double>() != 0.0;
  return false;
}
// A JSON member that is a string, or "".
std::string string_member(const Json& j, std::string_view key) {
  const Json* m = member(j, key);
  return m != nullptr && m->is_string() ? m->get<std::string>() : std::string();
}

std::optional<Json> read_json(const fs::path& path, const char* what) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  Json j = detail::parse_json(detail::read_text_file(path, what, kMaxTokenizerBytes), path.string(), what, 64);
  if (!j.is_object()) fail(path.string(), std::string(what) + " is not a JSON object");
  return j;
}

std::int64_t token_id(const Json& v, const fs::path& file, const std::string& token, std::int64_t vocab_size) {
  if (!v.is_number_integer())
    fail(file.string(), "token " + detail::quote(token) + " has an id that is not an integer");
  const auto id = v.get<std::int64_t>();
  if (id < 0 || id >= vocab_size)
    fail(file.string(), "token " + detail::quote(token) + " has id " + std::to_string(id) +
                            ", outside the model's vocabulary of " + std::to_string(vocab_size) +
                            " (the embedding's rows)");
  return id;
}

// Added tokens the converter marks CONTROL even when tokenizer files do not call them special.
bool looks_special(std::string_view t) {
  if (t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]") return true;
  if (t.starts_with("<|") && t.ends_with("|>")) return true;
  if (t.starts_with("<\xEF\xBD\x9C") && t.ends_with("\xEF\xBD\x9C>")) return true;  // "<｜" ... "｜>"
  return t.starts_with("<unused") && t.ends_with(">");
}
// User-defined tokens are written pre-normalized: SentencePiece's "▁" back to a space.
std::string spaces_for_metaspace(std::string t) {
  static constexpr std::string_view kMeta = "\xE2\x96\x81";
  std::string out;
  out.reserve(t.size());
  for (std::size_t i = 0; i < t.size();) {
    if (std::string_view(t).substr(i, kMeta.size()) == kMeta) {
      out += ' ';
      i += kMeta.size();
    } else {
      out += t[i++];
    }
  }
  return out;
}

// ---- the pre-tokenizer's name ---------------------------------------------------------------

// The Split regexes of tokenizer.json that llama.cpp's llama-vocab.cpp quotes as the originals of
// its pre-tokenizer types; the converter names them by hashing a tokenization, we by the regex.
struct PreRegex {
  const char* name;
  const char* regex;
};
constexpr std::array kPreRegexes{
    PreRegex{
        "llama-bpe",  // Llama 3, 3.1, 3.2, 3.3
        R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"},
    PreRegex{
        "qwen2",  // Qwen 1.5, 2, 2.5, 3
        R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"},
    PreRegex{
        "qwen35",
        R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"},
    PreRegex{
        "gpt-4o",  // o200k: GPT-4o, gpt-oss
        R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"},
    PreRegex{
        "tekken",  // Mistral's Tekken (Nemo, Pixtral)
        R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"},
};

// "gpt-2" is ByteLevel with its built-in regex and nothing else; a Split with a known regex
// followed by a ByteLevel that does not split again is that regex's name. Anything else: nullopt.
std::optional<std::string> pre_tokenizer_name(const Json& tokenizer) {
  const Json* pre = member(tokenizer, "pre_tokenizer");
  if (pre == nullptr || !pre->is_object()) return std::nullopt;
  std::vector<const Json*> steps;
  if (string_member(*pre, "type") == "Sequence") {
    const Json* list = member(*pre, "pretokenizers");
    if (list == nullptr || !list->is_array()) return std::nullopt;
    for (const Json& s : *list) steps.push_back(&s);
  } else {
    steps.push_back(pre);
  }
  auto flag = [](const Json& step, std::string_view key, bool dflt) {
    const Json* v = member(step, key);
    return v != nullptr && v->is_boolean() ? v->get<bool>() : dflt;
  };
  if (steps.size() == 1 && string_member(*steps[0], "type") == "ByteLevel")
    return flag(*steps[0], "use_regex", true) && !flag(*steps[0], "add_prefix_space", false)
               ? std::optional<std::string>("gpt-2")
               : std::nullopt;
  if (steps.size() != 2 || string_member(*steps[0], "type") != "Split" ||
      string_member(*steps[1], "type") != "ByteLevel" || flag(*steps[1], "use_regex", true) ||
      flag(*steps[0], "invert", false) || string_member(*steps[0], "behavior") != "Isolated")
    return std::nullopt;
  const Json* pattern = member(*steps[0], "pattern");
  const std::string regex = pattern ? string_member(*pattern, "Regex") : std::string();
  for (const PreRegex& p : kPreRegexes)
    if (regex == p.regex) return std::string(p.name);
  return std::nullopt;
}

// ---- SentencePiece's ModelProto -------------------------------------------------------------

struct Piece {
  std::string text;
  float score = 0.0f;
  std::int32_t type = 1;  // NORMAL unless the piece says otherwise
};
struct SentencePieceModel {
  std::vector<Piece> pieces;
  std::int64_t model_type = 1;  // trainer_spec.model_type: UNIGRAM 1, BPE 2, WORD 3, CHAR 4
};

// A bounds-checked reader of protobuf's wire format over one message.
class ProtoReader {
 public:
  ProtoReader(const std::uint8_t* begin, const std::uint8_t* end, const std::uint8_t* base, const std::string& source)
      : p_(begin), end_(end), base_(base), source_(source) {}
  bool done() const { return p_ == end_; }

  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1, "a varint");
      const std::uint8_t b = *p_++;
      v |= std::uint64_t{b & 0x7Fu} << shift;
      if ((b & 0x80u) == 0) return v;
    }
    bad("a varint longer than 10 bytes");
  }
  // (field number, wire type)
  std::pair<std::uint64_t, unsigned> tag() {
    const std::uint64_t t = varint();
    if ((t >> 3) == 0) bad("field number 0");
    return {t >> 3, static_cast<unsigned>(t & 7u)};
  }
  ProtoReader message() {
    const auto n = length();
    ProtoReader sub(p_, p_ + n, base_, source_);
    p_ += n;
    return sub;
  }
  std::string_view bytes() {
    const auto n = length();
    std::string_view s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  float fixed32_float() {
    need(4, "a 32-bit value");
    std::uint32_t bits =
        std::uint32_t{p_[0]} | std::uint32_t{p_[1]} << 8 | std::uint32_t{p_[2]} << 16 | std::uint32_t{p_[3]} << 24;
    p_ += 4;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  void skip(unsigned wire) {
    switch (wire) {
      case 0: varint(); return;
      case 1:
        need(8, "a 64-bit value");
        p_ += 8;
        return;
      case 2:
        length();
        p_ = p_ + last_length_;
        return;
      case 5:
        need(4, "a 32-bit value");
        p_ += 4;
        return;
      default: bad("wire type " + std::to_string(wire) + " (groups and unknown types are not SentencePiece's)");
    }
  }
  void expect_wire(unsigned wire, unsigned want, const char* field) {
    if (wire != want)
      bad(std::string(field) + " has wire type " + std::to_string(wire) + ", not " + std::to_string(want));
  }
  [[noreturn]] void bad(const std::string& what) const {
    fail(source_,
         "not a valid SentencePiece model (protobuf ModelProto): " + what + " at byte " + std::to_string(p_ - base_));
  }

 private:
  std::size_t length() {
    const std::uint64_t n = varint();
    if (n > static_cast<std::uint64_t>(end_ - p_))
      bad("a length of " + std::to_string(n) + " past the end of its message");
    last_length_ = static_cast<std::size_t>(n);
    return last_length_;
  }
  void need(std::size_t n, const char* what) {
    if (static_cast<std::size_t>(end_ - p_) < n) bad(std::string("truncated: the data ends inside ") + what);
  }
  const std::uint8_t* p_;
  const std::uint8_t* end_;
  const std::uint8_t* base_;
  const std::string& source_;
  std::size_t last_length_ = 0;
};

bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    std::uint32_t cp = n == 1 ? c : c & (0x7Fu >> n);
    for (std::size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = cp << 6 | (d & 0x3Fu);
    }
    static constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

SentencePieceModel parse_sentencepiece(const fs::path& path) {
  const std::string source = path.string();
  const std::string bytes = detail::read_text_file(path, "a SentencePiece model (tokenizer.model)", kMaxTokenizerBytes);
  const auto* base = reinterpret_cast<const std::uint8_t*>(bytes.data());
  ProtoReader top(base, base + bytes.size(), base, source);
  SentencePieceModel model;
  bool trainer_spec = false, normalizer_spec = false;
  while (!top.done()) {
    const auto [field, wire] = top.tag();
    if (field == 1) {  // pieces
      top.expect_wire(wire, 2, "a piece");
      ProtoReader pr = top.message();
      Piece piece;
      bool has_text = false;
      while (!pr.done()) {
        const auto [f, w] = pr.tag();
        if (f == 1) {
          pr.expect_wire(w, 2, "a piece's text");
          piece.text = std::string(pr.bytes());
          has_text = true;
        } else if (f == 2) {
          pr.expect_wire(w, 5, "a piece's score");
          piece.score = pr.fixed32_float();
        } else if (f == 3) {
          pr.expect_wire(w, 0, "a piece's type");
          const std::uint64_t t = pr.varint();
          if (t < 1 || t > 6) pr.bad("piece " + std::to_string(model.pieces.size()) + " has type " + std::to_string(t));
          piece.type = static_cast<std::int32_t>(t);
        } else {
          pr.skip(w);
        }
      }
      if (!has_text || piece.text.empty())
        fail(source, "SentencePiece piece " + std::to_string(model.pieces.size()) + " has no text");
      if (!valid_utf8(piece.text))
        fail(source, "SentencePiece piece " + std::to_string(model.pieces.size()) + " is not valid UTF-8");
      model.pieces.push_back(std::move(piece));
    } else if (field == 2) {  // trainer_spec
      top.expect_wire(wire, 2, "trainer_spec");
      ProtoReader tr = top.message();
      trainer_spec = true;
      while (!tr.done()) {
        const auto [f, w] = tr.tag();
        if (f == 3 && w == 0) {
          model.model_type = static_cast<std::int64_t>(tr.varint());
        } else {
          tr.skip(w);
        }
      }
    } else if (field == 3) {  // normalizer_spec
      top.expect_wire(wire, 2, "normalizer_spec");
      top.message();
      normalizer_spec = true;
    } else {
      top.skip(wire);
    }
  }
  // sentencepiece's trainer always writes both specs after the pieces, so a file without them
  // was cut short at a field boundary, where the wire format alone cannot tell.
  if (model.pieces.empty()) fail(source, "not a valid SentencePiece model: it has no pieces");
  if (!trainer_spec || !normalizer_spec)
    fail(source, std::string("not a valid SentencePiece model: it has no ") +
                     (trainer_spec ? "normalizer_spec" : "trainer_spec") + " (truncated?)");
  return model;
}

// ---- special tokens: gguf-py's SpecialVocab ------------------------------------------------

struct SpecialTokens {
  // Each in the order first set, as the converter writes them.
  std::vector<std::pair<std::string, std::int64_t>> ids;
  std::vector<std::pair<std::string, bool>> add;
  std::vector<std::string> merges;
  Json chat_template;  // null, a string, or [{name, template}]
  std::optional<bool> lowercase, strip_accents;
};

class SpecialReader {
 public:
  SpecialReader(const fs::path& dir, const Json& config, std::int64_t n_vocab, bool load_merges,
                std::vector<std::string>& notes)
      : dir_(dir), config_(config), n_vocab_(n_vocab), load_merges_(load_merges), notes_(notes) {}

  SpecialTokens read(const std::optional<Json>& tokenizer, const std::optional<Json>& tokenizer_config) {
    from_tokenizer_files(tokenizer, tokenizer_config);
    for (const std::string& typ : types_) {
      const Json* v = member(config_, typ + "_token_id");
      if ((v == nullptr || v->is_null()) && member(config_, "text_config") != nullptr)
        v = member(*member(config_, "text_config"), typ + "_token_id");
      set_id(typ, v, "config.json");
    }
    if (load_merges_ && out_.merges.empty()) merges_txt();
    return std::move(out_);
  }

 private:
  void set_id(const std::string& typ, const Json* v, const std::string& file) {
    if (v == nullptr || !v->is_number_integer()) return;
    const auto id = v->get<std::int64_t>();
    if (id < 0) fail((dir_ / file).string(), typ + " token id " + std::to_string(id) + " is negative");
    if (id >= n_vocab_) {
      notes_.push_back(typ + " token id " + std::to_string(id) + " (" + file + ") is outside the vocabulary of " +
                       std::to_string(n_vocab_) + "; not written");
      return;
    }
    for (const auto& [t, _] : out_.ids)
      if (t == typ) return;
    out_.ids.emplace_back(typ, id);
  }
  bool* find_add(const std::string& typ) {
    for (auto& [t, v] : out_.add)
      if (t == typ) return &v;
    return nullptr;
  }
  void set_add(const std::string& typ, bool v, bool overwrite) {
    if (bool* have = find_add(typ)) {
      if (overwrite) *have = v;
      return;
    }
    out_.add.emplace_back(typ, v);
  }
  bool has_type(const std::string& typ) const {
    for (const auto& t : types_)
      if (t == typ) return true;
    return false;
  }

  void merges_from(const Json& tokenizer) {
    const Json* model = member(tokenizer, "model");
    const Json* merges = model ? member(*model, "merges") : nullptr;
    if (merges == nullptr || !merges->is_array() || merges->empty()) return;
    const std::string file = (dir_ / "tokenizer.json").string();
    auto& out = out_.merges;
    out.reserve(merges->size());
    const bool pairs = (*merges)[0].is_array();
    for (const Json& m : *merges) {
      if (!pairs && m.is_string()) {
        out.push_back(m.get<std::string>());
      } else if (pairs && m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        // Pairs may hold spaces, which the "a b" form cannot: llama.cpp takes U+0120 for them.
        std::string joined;
        for (int k = 0; k < 2; ++k) {
          if (k == 1) joined += ' ';
          for (char c : m[k].get_ref<const std::string&>())
            joined += c == ' ' ? std::string("\xC4\xA0") : std::string(1, c);
        }
        out.push_back(std::move(joined));
      } else {
        fail(file, "model.merges entry " + std::to_string(out.size()) +
                       " is neither a string \"a b\" nor a pair [\"a\", \"b\"] like the first entry");
      }
    }
  }

  void merges_txt() {
    const fs::path path = dir_ / "merges.txt";
    std::error_code ec;
    if (!fs::exists(path, ec)) return;
    const std::string text = detail::read_text_file(path, "a BPE merges list (merges.txt)", kMaxTokenizerBytes);
    std::size_t line_no = 0;
    for (std::size_t at = 0; at < text.size();) {
      std::size_t nl = text.find('\n', at);
      if (nl == std::string::npos) nl = text.size();
      std::string_view line(text.data() + at, nl - at);
      at = nl + 1;
      ++line_no;
      if (line_no == 1 && line.starts_with("#")) continue;  // "#version: 0.2"
      std::vector<std::string_view> parts;
      for (std::size_t i = 0; i < line.size();) {
        while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
        const std::size_t s = i;
        while (i < line.size() && !std::isspace(static_cast<unsigned char>(line[i]))) ++i;
        if (i > s) parts.push_back(line.substr(s, i - s));
      }
      if (parts.empty()) continue;
      if (parts.size() != 2) {
        notes_.push_back("merges.txt line " + std::to_string(line_no) + " is not two symbols; skipped");
        continue;
      }
      out_.merges.push_back(std::string(parts[0]) + " " + std::string(parts[1]));
    }
  }

  void normalizer(const Json& n) {
    const std::string type = string_member(n, "type");
    if (type == "Lowercase") {
      out_.lowercase = true;
    } else if (type == "StripAccents") {
      out_.strip_accents = true;
    } else if (type == "BertNormalizer") {
      if (const Json* v = member(n, "lowercase"); v && v->is_boolean()) out_.lowercase = v->get<bool>();
      if (const Json* v = member(n, "strip_accents"); v && v->is_boolean()) out_.strip_accents = v->get<bool>();
    } else if (type == "Sequence") {
      if (const Json* list = member(n, "normalizers"); list && list->is_array())
        for (const Json& each : *list) normalizer(each);
    }
  }

  static Json special_token_id(const Json& step) {
    const Json* st = member(step, "SpecialToken");
    const Json* id = st ? member(*st, "id") : nullptr;
    return id ? *id : Json();
  }
  static Json sequence_id(const Json& step) {
    const Json* sq = member(step, "Sequence");
    const Json* id = sq ? member(*sq, "id") : nullptr;
    return id ? *id : Json();
  }

  // What the post-processor adds around a sequence decides add_bos/add_eos/add_sep; its template
  // may also name the bos/eos/cls/sep tokens the config left out.
  void post_processor(const Json& tokenizer, Json* tc) {
    const Json* pp = member(tokenizer, "post_processor");
    if (!truthy(pp)) return;
    std::vector<const Json*> procs;
    if (const Json* list = member(*pp, "processors"); list && list->is_array()) {
      for (const Json& p : *list) procs.push_back(&p);
    } else {
      procs.push_back(pp);
    }
    const bool have_tc = tc != nullptr && truthy(tc);
    auto tc_get = [&](const char* key) { return have_tc && member(*tc, key) ? *member(*tc, key) : Json(); };
    auto tc_set = [&](const char* key, const Json& v) {
      if (have_tc) (*tc)[key] = v;
    };
    Json bos = tc_get("bos_token"), eos = tc_get("eos_token"), cls = tc_get("cls_token"), sep = tc_get("sep_token");
    for (const Json* proc : procs) {
      const std::string type = string_member(*proc, "type");
      if (type == "ByteLevel") {
        set_add("bos", false, false);
        set_add("eos", false, false);
      } else if (type == "RobertaProcessing") {
        set_add("bos", true, true);
        set_add("eos", true, true);
        set_add("sep", true, true);
        if (!truthy(&cls) && have_tc) {
          const Json* c = member(*proc, "cls");
          cls = c && c->is_array() && !c->empty() ? (*c)[0] : bos;
          tc_set("cls_token", cls);
        }
        if (!truthy(&sep) && have_tc) {
          const Json* s = member(*proc, "sep");
          sep = s && s->is_array() && !s->empty() ? (*s)[0] : eos;
          tc_set("sep_token", sep);
        }
      } else if (type == "TemplateProcessing") {
        template_processing(*proc, have_tc, tc, bos, eos, cls, sep);
      }
    }
  }

  void template_processing(const Json& proc, bool have_tc, Json* tc, Json& bos, Json& eos, Json& cls, Json& sep) {
    static const Json kEmpty = Json::array();
    const Json* single_p = member(proc, "single");
    const Json* pair_p = member(proc, "pair");
    const Json& single = single_p && single_p->is_array() ? *single_p : kEmpty;
    const Json& pair = pair_p && pair_p->is_array() ? *pair_p : kEmpty;
    Json first, last;
    if (single.size() > 1) {
      first = special_token_id(single.front());
      if (truthy(&first)) {
        if (!have_tc) {
          bos = first;
        } else if (first != bos && first != cls) {
          if (!truthy(&bos)) (*tc)["bos_token"] = bos = first;
          if (!truthy(&cls)) (*tc)["cls_token"] = cls = first;
        }
        set_add("bos", first == bos || first == cls, true);
      }
      last = special_token_id(single.back());
      if (truthy(&last)) {
        if (!have_tc) {
          eos = last;
        } else if (last != eos) {
          // The template ends with another token than eos: the old eos becomes eot (or eom).
          for (const char* extra : {"eot", "eom"}) {
            if (!has_type(extra)) {
              types_.emplace_back(extra);
              (*tc)[std::string(extra) + "_token"] = eos;
              break;
            }
          }
          (*tc)["eos_token"] = eos = last;
        }
        set_add("eos", last == eos, true);
      }
    }
    if (pair.empty()) return;
    const std::size_t start = truthy(&first) && special_token_id(pair.front()) == first ? 1 : 0;
    const std::size_t stop = truthy(&last) && special_token_id(pair.back()) == last ? pair.size() - 1 : pair.size();
    if (start >= stop) return;
    if (sequence_id(pair[start]) != "A" || sequence_id(pair[stop - 1]) != "B" || stop - start <= 2) return;
    // The tokens between sequences A and B: one or two of sep/eos mean add_sep.
    bool add_sep = false;
    const Json mid = special_token_id(pair[start + 1]);
    if (truthy(&mid) && (mid == sep || mid == eos) && !truthy(&last)) add_sep = true;
    if (stop - start - 2 == 2) {
      const Json mid2 = special_token_id(pair[start + 2]);
      if (truthy(&mid2) && (mid2 == sep || mid2 == eos)) add_sep = true;
    }
    set_add("sep", add_sep, true);
    if (add_sep && !truthy(&sep) && have_tc) (*tc)["sep_token"] = eos;
  }

  void chat_template(const Json& tc) {
    Json alt;
    const fs::path jinja = dir_ / "chat_template.jinja";
    const fs::path json = dir_ / "chat_template.json";
    std::error_code ec;
    if (fs::exists(jinja, ec)) {
      alt = detail::read_text_file(jinja, "a chat template", kMaxTokenizerBytes);
      const fs::path more = dir_ / "additional_chat_templates";
      if (fs::is_directory(more, ec)) {
        std::vector<fs::path> extra;
        for (const auto& e : fs::directory_iterator(more, ec))
          if (e.path().extension() == ".jinja") extra.push_back(e.path());
        std::sort(extra.begin(), extra.end());
        if (!extra.empty()) {
          Json list = Json::array({Json{{"name", "default"}, {"template", alt}}});
          for (const fs::path& p : extra)
            list.push_back(Json{{"name", p.stem().string()},
                                {"template", detail::read_text_file(p, "a chat template", kMaxTokenizerBytes)}});
          alt = std::move(list);
        }
      }
    } else if (auto j = read_json(json, "chat_template.json")) {
      if (const Json* t = member(*j, "chat_template")) alt = *t;
    }
    const Json* in_config = member(tc, "chat_template");
    const Json& chosen = in_config ? *in_config : alt;
    if (chosen.is_null() || chosen.is_string() || chosen.is_array()) {
      out_.chat_template = chosen;
    } else {
      notes_.push_back("tokenizer_config.json's chat_template is neither a string nor a list; ignored");
    }
  }

  void from_tokenizer_files(const std::optional<Json>& tokenizer, const std::optional<Json>& tokenizer_config) {
    static const Json kNone = Json::array();
    const Json* added = &kNone;
    if (tokenizer) {
      if (load_merges_) merges_from(*tokenizer);
      if (const Json* n = member(*tokenizer, "normalizer"); truthy(n)) normalizer(*n);
      if (const Json* a = member(*tokenizer, "added_tokens"); a && a->is_array()) added = a;
    }
    Json tc = tokenizer_config ? *tokenizer_config : Json();
    if (tokenizer) {
      if (truthy(&tc)) {
        // A config that names only cls/sep lends them to bos/eos.
        if (!truthy(member(tc, "bos_token")) && truthy(member(tc, "cls_token"))) tc["bos_token"] = tc["cls_token"];
        if (!truthy(member(tc, "eos_token")) && truthy(member(tc, "sep_token"))) tc["eos_token"] = tc["sep_token"];
      }
      post_processor(*tokenizer, tokenizer_config ? &tc : nullptr);
    }
    if (!truthy(&tc)) return;
    chat_template(tc);
    for (std::size_t k = 0; k < types_.size(); ++k) {
      const std::string typ = types_[k];
      if (const Json* a = member(tc, "add_" + typ + "_token"); a && a->is_boolean())
        set_add(typ, a->get<bool>(), false);
      const Json* entry = member(tc, typ + "_token");
      std::string content;
      if (entry && entry->is_string()) {
        content = entry->get<std::string>();
      } else if (entry && entry->is_object() && member(*entry, "content") && member(*entry, "content")->is_string()) {
        content = member(*entry, "content")->get<std::string>();
      } else {
        continue;
      }
      // Only tokenizer.json's added tokens give a special token its id here; config.json next.
      for (const Json& tok : *added)
        if (member(tok, "content") && *member(tok, "content") == content) {
          set_id(typ, member(tok, "id"), "tokenizer.json");
          break;
        }
    }
  }

  const fs::path& dir_;
  const Json& config_;
  std::int64_t n_vocab_;
  bool load_merges_;
  std::vector<std::string>& notes_;
  std::vector<std::string> types_{"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
  SpecialTokens out_;
};

// ---- the two vocabularies ------------------------------------------------------------------

std::string model_type_of(const Json& config) {
  std::string t = string_member(config, "model_type");
  if (const Json* text = member(config, "text_config"); t.empty() && text) t = string_member(*text, "model_type");
  return t;
}

// tokenizer.json in the form SentencePiece conversions take (byte fallback, "▁"), which the
// converter reads only through transformers (gguf-py's LlamaHfVocab).
bool sentencepiece_style(const Json& tokenizer) {
  const Json* model = member(tokenizer, "model");
  if (model == nullptr) return false;
  const std::string type = string_member(*model, "type");
  const Json* fallback = member(*model, "byte_fallback");
  return type == "Unigram" || (type == "BPE" && fallback && fallback->is_boolean() && fallback->get<bool>());
}

TokenTable bpe_tokens(const fs::path& file, const Json& tokenizer, std::int64_t vocab_size) {
  const Json* model = member(tokenizer, "model");
  if (model == nullptr || !model->is_object()) fail(file.string(), "has no \"model\" object");
  if (const std::string type = string_member(*model, "type"); type != "BPE")
    fail(file.string(), "model type " + detail::quote(type) +
                            " is not supported (only BPE tokenizer.json, or SentencePiece's tokenizer.model)");
  const Json* vocab = member(*model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) fail(file.string(), "model.vocab is not an object {token: id}");
  TokenTable t(vocab_size, false);
  auto place = [&](std::int64_t id, const std::string& text) {
    auto& slot = t.text[static_cast<std::size_t>(id)];
    if (t.defined[static_cast<std::size_t>(id)]) {
      if (slot == text) return false;
      fail(file.string(),
           "id " + std::to_string(id) + " is given to both " + detail::quote(slot) + " and " + detail::quote(text));
    }
    slot = text;
    t.defined[static_cast<std::size_t>(id)] = true;
    t.types[static_cast<std::size_t>(id)] = TokenType::normal;
    return true;
  };
  for (const auto& [text, id] : vocab->items()) place(token_id(id, file, text, vocab_size), text);

  const Json* added = member(tokenizer, "added_tokens");
  if (added != nullptr && !added->is_array()) fail(file.string(), "added_tokens is not a list");
  if (added == nullptr) return t;
  std::vector<bool> seen(static_cast<std::size_t>(vocab_size), false);
  for (const Json& a : *added) {
    const Json* content = member(a, "content");
    const Json* idv = member(a, "id");
    if (content == nullptr || !content->is_string() || idv == nullptr)
      fail(file.string(), "an added token lacks its \"id\" or its \"content\" string");
    std::string text = content->get<std::string>();
    const std::int64_t id = token_id(*idv, file, text, vocab_size);
    const auto i = static_cast<std::size_t>(id);
    if (seen[i]) fail(file.string(), "added tokens repeat id " + std::to_string(id));
    seen[i] = true;
    place(id, text);
    // Added tokens: control when special (or named like one), else user-defined and written with
    // spaces for "▁", as llama.cpp expects them pre-normalized.
    if (truthy(member(a, "special")) || looks_special(text)) {
      t.types[i] = TokenType::control;
    } else {
      t.types[i] = TokenType::user_defined;
      t.text[i] = spaces_for_metaspace(std::move(text));
    }
  }
  return t;
}

TokenType piece_type(std::int32_t sp_type) {
  switch (sp_type) {
    case 2: return TokenType::unknown;
    case 3: return TokenType::control;
    case 5: return TokenType::unused;
    case 6: return TokenType::byte;
    default: return TokenType::normal;  // the converter asks only for the four above: USER_DEFINED reads as NORMAL
  }
}

std::int64_t parse_id_key(const std::string& key, const fs::path& file) {
  std::int64_t id = 0;
  const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
  if (ec != std::errc() || end != key.data() + key.size())
    fail(file.string(), "added_tokens_decoder key " + detail::quote(key) + " is not a token id");
  return id;
}

// Phi-3's converter takes added tokens from tokenizer_config.json and tokenizer.json without the
// "looks special" and "▁" rules of the general SentencePiece path.
TokenTable sentencepiece_tokens(const fs::path& dir, const SentencePieceModel& sp, std::int64_t vocab_size,
                                bool phi3_rules, const std::optional<Json>& tokenizer,
                                const std::optional<Json>& tokenizer_config) {
  const fs::path model_file = dir / "tokenizer.model";
  if (static_cast<std::int64_t>(sp.pieces.size()) > vocab_size)
    fail(model_file.string(), std::to_string(sp.pieces.size()) + " pieces, more than the model's vocabulary of " +
                                  std::to_string(vocab_size) + " (the embedding's rows)");
  TokenTable t(vocab_size, true);
  for (std::size_t i = 0; i < sp.pieces.size(); ++i) {
    t.text[i] = sp.pieces[i].text;
    t.scores[i] = sp.pieces[i].score;
    t.types[i] = piece_type(sp.pieces[i].type);
    t.defined[i] = true;
  }
  auto set = [&](std::int64_t id, std::string text, TokenType type) {
    const auto i = static_cast<std::size_t>(id);
    t.text[i] = std::move(text);
    t.scores[i] = kAddedScore;
    t.types[i] = type;
    t.defined[i] = true;
  };
  const fs::path added_file = dir / "added_tokens.json";
  if (auto added = read_json(added_file, "added_tokens.json"))
    for (const auto& [text, id] : added->items())
      set(token_id(id, added_file, text, vocab_size), text, TokenType::user_defined);

  const fs::path config_file = dir / "tokenizer_config.json";
  if (tokenizer_config)
    if (const Json* decoder = member(*tokenizer_config, "added_tokens_decoder")) {
      if (!decoder->is_object()) fail(config_file.string(), "added_tokens_decoder is not an object {id: token}");
      for (const auto& [key, data] : decoder->items()) {
        const Json* content = member(data, "content");
        if (content == nullptr || !content->is_string())
          fail(config_file.string(), "added_tokens_decoder[" + detail::quote(key) + "] has no \"content\" string");
        std::string text = content->get<std::string>();
        const std::int64_t id = token_id(Json(parse_id_key(key, config_file)), config_file, text, vocab_size);
        const bool special = truthy(member(data, "special"));
        if (special || (!phi3_rules && looks_special(text))) {
          set(id, std::move(text), TokenType::control);
        } else {
          set(id, phi3_rules ? std::move(text) : spaces_for_metaspace(std::move(text)), TokenType::user_defined);
        }
      }
    }
  if (phi3_rules && tokenizer)
    if (const Json* added = member(*tokenizer, "added_tokens"); added && added->is_array()) {
      const fs::path json_file = dir / "tokenizer.json";
      for (const Json& a : *added) {
        const Json* content = member(a, "content");
        const Json* idv = member(a, "id");
        if (content == nullptr || !content->is_string() || idv == nullptr)
          fail(json_file.string(), "an added token lacks its \"id\" or its \"content\" string");
        const std::string text = content->get<std::string>();
        set(token_id(*idv, json_file, text, vocab_size), text,
            truthy(member(a, "special")) ? TokenType::control : TokenType::user_defined);
      }
    }
  return t;
}

enum class Kind { none, bpe, sentencepiece };

// Which reader llama.cpp's converter uses for this architecture, given the files present.
Kind choose(const std::string& model_type, bool has_model, const std::optional<Json>& tokenizer,
            const std::optional<Json>& tokenizer_config, const fs::path& dir) {
  const bool has_json = tokenizer.has_value();
  if (!has_model && !has_json) return Kind::none;
  // Converters that read tokenizer.model first (LlamaModel, Qwen2/3, Gemma 2/3); Gemma 2 and
  // Phi-3 know no other form.
  static const std::unordered_set<std::string> kSentencePieceFirst{"llama", "mistral", "mixtral",    "qwen2",
                                                                   "qwen3", "gemma3",  "gemma3_text"};
  if (model_type == "phi3" && tokenizer_config &&
      string_member(*tokenizer_config, "tokenizer_class") == "GPT2Tokenizer")
    return Kind::bpe;
  if (model_type == "gemma2" || model_type == "phi3") {
    if (!has_model)
      fail((dir / "tokenizer.model").string(),
           "is missing: llama.cpp's converter reads " + model_type + "'s tokenizer from it only");
    return Kind::sentencepiece;
  }
  if (has_model && (kSentencePieceFirst.contains(model_type) || !has_json)) return Kind::sentencepiece;
  return Kind::bpe;
}

Json string_array(const std::vector<std::string>& v) {
  Json a = Json::array();
  a.get_ref<Json::array_t&>().reserve(v.size());
  for (const std::string& s : v) a.push_back(s);
  return a;
}

void add_special_kvs(std::vector<Kv>& kvs, const SpecialTokens& s) {
  if (!s.merges.empty()) kvs.push_back(kv_array("tokenizer.ggml.merges", ValueType::string, string_array(s.merges)));
  static const std::array<std::pair<const char*, const char*>, 8> kIdKeys{{
      {"bos", "tokenizer.ggml.bos_token_id"},
      {"eos", "tokenizer.ggml.eos_token_id"},
      {"unk", "tokenizer.ggml.unknown_token_id"},
      {"sep", "tokenizer.ggml.seperator_token_id"},  // sic: llama.cpp's spelling
      {"pad", "tokenizer.ggml.padding_token_id"},
      {"mask", "tokenizer.ggml.mask_token_id"},
      {"eot", "tokenizer.ggml.eot_token_id"},
      {"eom", "tokenizer.ggml.eom_token_id"},
  }};
  // cls has no GGUF key: the converter skips it, as it skips add_<typ> other than bos/eos/sep.
  for (const auto& [typ, id] : s.ids)
    for (const auto& [name, key] : kIdKeys)
      if (typ == name) kvs.push_back(kv_u32(key, static_cast<std::uint32_t>(id)));
  for (const auto& [typ, v] : s.add)
    if (typ == "bos" || typ == "eos" || typ == "sep") kvs.push_back(kv_bool("tokenizer.ggml.add_" + typ + "_token", v));
  if (s.chat_template.is_string()) {
    kvs.push_back(kv_str("tokenizer.chat_template", s.chat_template.get<std::string>()));
  } else if (s.chat_template.is_array()) {
    std::vector<std::string> names;
    std::optional<std::string> fallback;
    for (const Json& choice : s.chat_template) {
      std::string name = string_member(choice, "name");
      const Json* tmpl = member(choice, "template");
      for (char& c : name)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      if (name.empty() || tmpl == nullptr || !tmpl->is_string()) continue;
      if (name == "default") {
        fallback = tmpl->get<std::string>();
      } else if (std::find(names.begin(), names.end(), name) == names.end()) {
        names.push_back(name);
        kvs.push_back(kv_str("tokenizer.chat_template." + name, tmpl->get<std::string>()));
      }
    }
    if (!names.empty()) kvs.push_back(kv_array("tokenizer.chat_templates", ValueType::string, string_array(names)));
    if (fallback) kvs.push_back(kv_str("tokenizer.chat_template", *fallback));
  }
  if (s.lowercase) kvs.push_back(kv_bool("tokenizer.ggml.normalizer.lowercase", *s.lowercase));
  if (s.strip_accents) kvs.push_back(kv_bool("tokenizer.ggml.normalizer.strip_accents", *s.strip_accents));
}

void add_token_kvs(std::vector<Kv>& kvs, const TokenTable& t, bool with_scores) {
  kvs.push_back(kv_array("tokenizer.ggml.tokens", ValueType::string, string_array(t.text)));
  if (with_scores) {
    Json scores = Json::array();
    scores.get_ref<Json::array_t&>().reserve(t.scores.size());
    for (float s : t.scores) scores.push_back(s);
    kvs.push_back(kv_array("tokenizer.ggml.scores", ValueType::f32, std::move(scores)));
  }
  Json types = Json::array();
  types.get_ref<Json::array_t&>().reserve(t.types.size());
  for (TokenType ty : t.types) types.push_back(static_cast<std::int32_t>(ty));
  kvs.push_back(kv_array("tokenizer.ggml.token_type", ValueType::i32, std::move(types)));
}

}  // namespace

Vocab read_vocab(const std::filesystem::path& dir, const Json& config, std::int64_t vocab_size) {
  Vocab out;
  const fs::path model_file = dir / "tokenizer.model";
  const fs::path json_file = dir / "tokenizer.json";
  const fs::path config_file = dir / "tokenizer_config.json";
  std::error_code ec;
  const bool has_model = fs::exists(model_file, ec);
  const std::optional<Json> tokenizer = read_json(json_file, "tokenizer.json");
  const std::optional<Json> tokenizer_config = read_json(config_file, "tokenizer_config.json");
  const std::string model_type = model_type_of(config);
  const Kind kind = choose(model_type, has_model, tokenizer, tokenizer_config, dir);
  if (kind == Kind::none) return out;
  if (vocab_size <= 0 || vocab_size > kMaxVocab)
    fail(dir.string(),
         "vocabulary size " + std::to_string(vocab_size) + " is out of range (1 to " + std::to_string(kMaxVocab) + ")");

  // LlamaModel passes tokenizer_config.json's add_prefix_space on; Gemma writes false below.
  const bool llama_family = model_type == "llama" || model_type == "mistral" || model_type == "mixtral";
  if (llama_family && tokenizer_config)
    if (const Json* p = member(*tokenizer_config, "add_prefix_space"); p && p->is_boolean())
      out.kvs.push_back(kv_bool("tokenizer.ggml.add_space_prefix", p->get<bool>()));

  TokenTable table(0, false);
  if (kind == Kind::sentencepiece) {
    const SentencePieceModel sp = parse_sentencepiece(model_file);
    table = sentencepiece_tokens(dir, sp, vocab_size, model_type == "phi3", tokenizer, tokenizer_config);
    out.source = "tokenizer.model (SentencePiece)";
    out.kvs.push_back(kv_str("tokenizer.ggml.model", "llama"));
    out.kvs.push_back(kv_str("tokenizer.ggml.pre", "default"));
    add_token_kvs(out.kvs, table, true);
    out.notes.push_back("tokenizer: tokenizer.model (SentencePiece " +
                        std::string(sp.model_type == 2   ? "BPE"
                                    : sp.model_type == 1 ? "unigram"
                                                         : "other") +
                        ", " + std::to_string(sp.pieces.size()) + " pieces)");
  } else {
    if (!tokenizer) fail(json_file.string(), "is missing: this architecture's tokenizer is read from it");
    if (sentencepiece_style(*tokenizer))
      fail(json_file.string(),
           "is a SentencePiece-style tokenizer (byte fallback or Unigram) without tokenizer.model; llama.cpp's "
           "converter reads that form through transformers, which microscale does not: add the model's "
           "tokenizer.model");
    table = bpe_tokens(json_file, *tokenizer, vocab_size);
    std::string pre;
    if (auto name = pre_tokenizer_name(*tokenizer)) {
      pre = *name;
    } else {
      pre = "default";
      out.notes.push_back(
          "tokenizer.json's pre-tokenizer is not one microscale recognises; tokenizer.ggml.pre is \"default\" "
          "(llama.cpp's converter would refuse it), so llama.cpp may split text differently");
    }
    out.source = "tokenizer.json (BPE)";
    out.kvs.push_back(kv_str("tokenizer.ggml.model", "gpt2"));
    out.kvs.push_back(kv_str("tokenizer.ggml.pre", pre));
    add_token_kvs(out.kvs, table, false);
    out.notes.push_back("tokenizer: tokenizer.json (BPE, pre-tokenizer " + pre + ")");
  }
  if (const std::size_t pad = table.padding(); pad > 0)
    out.notes.push_back("vocabulary padded to " + std::to_string(vocab_size) + " with " + std::to_string(pad) +
                        " unused [PAD<id>] tokens");

  SpecialReader specials(dir, config, vocab_size, kind == Kind::bpe, out.notes);
  add_special_kvs(out.kvs, specials.read(tokenizer, tokenizer_config));
  if (kind == Kind::bpe &&
      std::none_of(out.kvs.begin(), out.kvs.end(), [](const Kv& kv) { return kv.key == "tokenizer.ggml.merges"; }))
    out.notes.push_back("tokenizer.json has no merges (nor merges.txt): llama.cpp cannot tokenize with it");
  if (kind == Kind::sentencepiece && (model_type == "gemma2" || model_type.starts_with("gemma3")))
    out.kvs.push_back(kv_bool("tokenizer.ggml.add_space_prefix", false));
  return out;
}

}  // namespace microscale::io::gguf
