#include "dataset/tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include "core/error.h"
#include "core/file.h"
#include "core/format.h"
#include "core/tasks.h"

namespace st::dataset {

namespace {

namespace fs = std::filesystem;
namespace spm = sentencepiece;

// ---------------------------------------------------------------------------
// Just enough of the protobuf wire format to read and edit a ModelProto's
// normalizer_spec (field 3) without the generated classes, which
// libsentencepiece-dev does not ship. NormalizerSpec: name = 1 (string),
// add_dummy_prefix = 3, remove_extra_whitespaces = 4 (bools, default true).

constexpr uint32_t kNormalizerSpecField = 3;
constexpr uint32_t kNameField = 1;
constexpr uint32_t kAddDummyPrefixField = 3;
constexpr uint32_t kRemoveExtraWhitespacesField = 4;
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

uint64_t read_varint(std::string_view s, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    ST_CHECK(pos < s.size(), "truncated protobuf varint");
    const auto byte = static_cast<unsigned char>(s[pos++]);
    v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return v;
  }
  ST_FAIL("protobuf varint longer than 10 bytes");
}

void append_varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>((v & 0x7f) | 0x80));
  out.push_back(static_cast<char>(v));
}

struct WireField {
  uint32_t number = 0;
  uint32_t type = 0;
  uint64_t value = 0;        // varints
  std::string_view payload;  // length-delimited fields
  std::string_view raw;      // the whole field, key included
};

/// The fields of one message, in order; a malformed message throws.
std::vector<WireField> wire_fields(std::string_view s) {
  std::vector<WireField> fields;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t begin = pos;
    const uint64_t key = read_varint(s, pos);
    WireField f{static_cast<uint32_t>(key >> 3), static_cast<uint32_t>(key & 7), 0, {}, {}};
    if (f.type == kVarint) {
      f.value = read_varint(s, pos);
    } else if (f.type == kLengthDelimited) {
      const uint64_t n = read_varint(s, pos);
      ST_CHECK(n <= s.size() - pos, "protobuf field {} runs past the end", f.number);
      f.payload = s.substr(pos, n);
      pos += n;
    } else {
      const size_t n = f.type == kFixed64 ? 8 : 4;
      ST_CHECK(f.type == kFixed64 || f.type == kFixed32, "protobuf wire type {} is not supported", f.type);
      ST_CHECK(n <= s.size() - pos, "protobuf field {} runs past the end", f.number);
      pos += n;
    }
    f.raw = s.substr(begin, pos - begin);
    fields.push_back(f);
  }
  return fields;
}

struct NormalizerInfo {
  std::string name;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
};

NormalizerInfo normalizer_info(std::string_view model_proto) {
  NormalizerInfo info;
  for (const WireField& top : wire_fields(model_proto)) {
    if (top.number != kNormalizerSpecField || top.type != kLengthDelimited) continue;
    for (const WireField& f : wire_fields(top.payload)) {  // the last value of a field wins, as in protobuf
      if (f.number == kNameField && f.type == kLengthDelimited) info.name = std::string(f.payload);
      if (f.number == kAddDummyPrefixField && f.type == kVarint) info.add_dummy_prefix = f.value != 0;
      if (f.number == kRemoveExtraWhitespacesField && f.type == kVarint) info.remove_extra_whitespaces = f.value != 0;
    }
  }
  return info;
}

/// `model_proto` with normalizer_spec.add_dummy_prefix = false (appended to
/// the spec: protobuf keeps the last value of a repeated scalar field).
std::string without_dummy_prefix(std::string_view model_proto) {
  const std::string off = {static_cast<char>(kAddDummyPrefixField << 3 | kVarint), 0};
  std::string out;
  bool found = false;
  for (const WireField& f : wire_fields(model_proto)) {
    if (f.number != kNormalizerSpecField || f.type != kLengthDelimited) {
      out += f.raw;
      continue;
    }
    found = true;
    append_varint(out, kNormalizerSpecField << 3 | kLengthDelimited);
    append_varint(out, f.payload.size() + off.size());
    out += f.payload;
    out += off;
  }
  if (!found) {
    append_varint(out, kNormalizerSpecField << 3 | kLengthDelimited);
    append_varint(out, off.size());
    out += off;
  }
  return out;
}

// ---------------------------------------------------------------------------

std::string read_file(const std::string& path) {
  std::error_code ec;
  ST_CHECK(fs::exists(path, ec), "tokenizer '{}' does not exist", path);
  ST_CHECK(!fs::is_directory(path, ec), "tokenizer '{}' is a directory; expected a SentencePiece tokenizer.model",
           path);
  return st::read_file(path, "tokenizer");
}

std::unique_ptr<spm::SentencePieceProcessor> processor_of(std::string_view proto, const std::string& path) {
  auto sp = std::make_unique<spm::SentencePieceProcessor>();
  const spm::util::Status status = sp->LoadFromSerializedProto(proto);
  // A file that does not parse gets SentencePiece's internal source line as
  // its message: say what it means instead.
  const bool parsed = status.ok() || status.code() != spm::util::StatusCode::kInternal;
  ST_CHECK(parsed, "tokenizer '{}' is not a SentencePiece model: its {} bytes do not parse as one", path, proto.size());
  ST_CHECK(status.ok() && sp->GetPieceSize() > 0, "tokenizer '{}' is not a usable SentencePiece model: {}", path,
           status.ok() ? std::string("it has no pieces") : std::string(status.message()));
  return sp;
}

std::string hex_byte_piece(int32_t byte) {
  return format("<0x{}{}>", "0123456789ABCDEF"[byte >> 4], "0123456789ABCDEF"[byte & 15]);
}

}  // namespace

struct Tokenizer::Impl {
  std::string path;                                           // "" for byte-level
  std::string bytes;                                          // the model file
  std::unique_ptr<spm::SentencePieceProcessor> sp;            // null for byte-level
  std::unique_ptr<spm::SentencePieceProcessor> continuation;  // sp without the dummy prefix
  int64_t vocab = 256;
  bool splits_at_lines = true;
  std::vector<TokenKind> kinds;  // per id

  const spm::SentencePieceProcessor& processor(TextStart start) const {
    return start == TextStart::Continuation ? *continuation : *sp;
  }
  void check_id(int32_t id) const {
    ST_CHECK(id >= 0 && id < vocab, "token id {} is outside the vocabulary [0, {}) of tokenizer '{}'", id, vocab,
             path.empty() ? std::string("byte-level") : path);
  }
};

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::bytes() {
  auto impl = std::make_shared<Impl>();
  impl->kinds.assign(256, TokenKind::Normal);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::string& path) {
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  impl->bytes = read_file(path);
  impl->sp = processor_of(impl->bytes, path);
  NormalizerInfo normalizer;
  std::string continuation;
  try {
    normalizer = normalizer_info(impl->bytes);
    continuation = without_dummy_prefix(impl->bytes);
  } catch (const Error& e) {
    ST_FAIL("tokenizer '{}' is not a SentencePiece model we can read ({})", path, e.message());
  }
  impl->continuation = processor_of(continuation, path);
  impl->splits_at_lines = normalizer.name == "identity" && !normalizer.remove_extra_whitespaces;
  impl->vocab = impl->sp->GetPieceSize();
  for (int id = 0; id < impl->vocab; ++id) {
    const spm::SentencePieceProcessor& sp = *impl->sp;
    impl->kinds.push_back(sp.IsUnknown(id)   ? TokenKind::Unknown
                          : sp.IsByte(id)    ? TokenKind::Byte
                          : sp.IsControl(id) ? TokenKind::Control
                                             : TokenKind::Normal);
  }
  return Tokenizer(std::move(impl));
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab; }

std::vector<int32_t> Tokenizer::encode(std::string_view text, TextStart start) const {
  if (!impl_->sp) {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::vector<int32_t> out;
  std::vector<int> ids;
  // Chunk by chunk (one chunk for a tokenizer that normalizes: it cannot be cut exactly).
  size_t begin = 0;
  do {
    const bool whole = !impl_->splits_at_lines || text.size() - begin <= kEncodeChunkBytes;
    const size_t end = whole ? text.size() : text_cut(text, begin + kEncodeChunkBytes, kEncodeChunkBytes);
    const std::string_view chunk = text.substr(begin, end - begin);
    const spm::util::Status status = impl_->processor(begin == 0 ? start : TextStart::Continuation).Encode(chunk, &ids);
    ST_CHECK(status.ok(), "tokenizer '{}' cannot encode a text of {} bytes: {}", impl_->path, chunk.size(),
             status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
    begin = end;
  } while (begin < text.size());
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  for (int32_t id : ids) impl_->check_id(id);
  if (!impl_->sp) return std::string(ids.begin(), ids.end());
  std::string text;
  const spm::util::Status status = impl_->sp->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  ST_CHECK(status.ok(), "tokenizer '{}' cannot decode {} ids: {}", impl_->path, ids.size(), status.ToString());
  return text;
}

std::string Tokenizer::decode_piece(int32_t id) const {
  impl_->check_id(id);
  if (!impl_->sp) return std::string(1, static_cast<char>(id));
  switch (impl_->kinds[static_cast<size_t>(id)]) {
    case TokenKind::Control: return {};
    case TokenKind::Byte: return std::string(1, static_cast<char>(std::stoi(piece(id).substr(3, 2), nullptr, 16)));
    case TokenKind::Unknown: return impl_->sp->DecodeIds({id});
    case TokenKind::Normal: break;
  }
  static constexpr std::string_view kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space
  const std::string p = piece(id);
  std::string text;
  for (size_t at = 0; at < p.size();) {
    const bool space = std::string_view(p).substr(at, kSpace.size()) == kSpace;
    text += space ? ' ' : p[at];
    at += space ? kSpace.size() : 1;
  }
  return text;
}

int32_t Tokenizer::bos_id() const { return impl_->sp ? impl_->sp->bos_id() : -1; }
int32_t Tokenizer::eos_id() const { return impl_->sp ? impl_->sp->eos_id() : -1; }
int32_t Tokenizer::unk_id() const { return impl_->sp ? impl_->sp->unk_id() : -1; }

std::string Tokenizer::piece(int32_t id) const {
  impl_->check_id(id);
  return impl_->sp ? impl_->sp->IdToPiece(id) : hex_byte_piece(id);
}

TokenKind Tokenizer::kind(int32_t id) const {
  impl_->check_id(id);
  return impl_->kinds[static_cast<size_t>(id)];
}

bool Tokenizer::is_bytes() const { return !impl_->sp; }
const std::string& Tokenizer::path() const { return impl_->path; }
const std::string& Tokenizer::model_bytes() const { return impl_->bytes; }
bool Tokenizer::splits_at_lines() const { return impl_->splits_at_lines; }

size_t piece_count(const Tokenizer& tokenizer, size_t text_bytes, size_t target_bytes) {
  if (!tokenizer.splits_at_lines() || target_bytes == 0) return 1;
  return std::max<size_t>(1, (text_bytes + target_bytes - 1) / target_bytes);
}

size_t text_cut(std::string_view text, size_t from, size_t window) {
  if (from >= text.size()) return text.size();
  const size_t limit = std::min(text.size(), from + window);  // candidates are < limit
  if (from > 0) {
    const size_t newline = text.find('\n', from - 1);
    if (newline != std::string_view::npos && newline + 1 < limit) return newline + 1;
  }
  for (size_t space = text.find(' ', std::max<size_t>(from, 1)); space < limit; space = text.find(' ', space + 1))
    if (text[space - 1] != ' ') return space;
  size_t at = from;
  while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xc0) == 0x80) ++at;  // UTF-8 continuation
  return at;
}

namespace {

size_t cut(std::string_view text, size_t k, size_t count, size_t target_bytes) {
  if (k == 0) return 0;
  if (k >= count) return text.size();
  return text_cut(text, k * target_bytes, target_bytes);
}

}  // namespace

TextPiece text_piece(std::string_view text, size_t k, size_t count, size_t target_bytes) {
  const size_t begin = cut(text, k, count, target_bytes);
  return {begin, std::max(begin, cut(text, k + 1, count, target_bytes))};
}

std::vector<int32_t> encode_document(const Tokenizer& tokenizer, std::string_view text, int threads) {
  const size_t count = piece_count(tokenizer, text.size(), kTextPieceBytes);
  std::vector<std::vector<int32_t>> pieces(count);
  const std::string error = run_tasks(count, threads, [&](size_t k, int) {
    const TextPiece p = text_piece(text, k, count, kTextPieceBytes);
    const std::string_view piece = text.substr(p.begin, p.end - p.begin);
    if (!piece.empty())
      pieces[k] = tokenizer.encode(piece, p.begin == 0 ? TextStart::Document : TextStart::Continuation);
  });
  ST_CHECK(error.empty(), "{}", error);
  std::vector<int32_t> ids;
  if (tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
  for (const std::vector<int32_t>& p : pieces) ids.insert(ids.end(), p.begin(), p.end());
  if (tokenizer.eos_id() >= 0) ids.push_back(tokenizer.eos_id());
  return ids;
}

// ---------------------------------------------------------------------------
// Hugging Face files.

namespace {

nlohmann::json special_token(const Tokenizer& t, int32_t id) {
  return id >= 0 ? nlohmann::json(t.piece(id)) : nlohmann::json(nullptr);
}

void check_sentencepiece(const Tokenizer& t, std::string_view file) {
  ST_CHECK(!t.is_bytes(), "{} describes a SentencePiece tokenizer; the byte-level stand-in has none", file);
}

}  // namespace

std::string hf_tokenizer_config_json(const Tokenizer& t, int64_t model_max_length) {
  check_sentencepiece(t, kTokenizerConfigName);
  // Meta's Llama-2 tokenizer_config.json, with this model's pieces and length.
  const nlohmann::ordered_json j{{"tokenizer_class", "LlamaTokenizer"},
                                 {"bos_token", special_token(t, t.bos_id())},
                                 {"eos_token", special_token(t, t.eos_id())},
                                 {"unk_token", special_token(t, t.unk_id())},
                                 {"pad_token", nullptr},
                                 {"add_bos_token", t.bos_id() >= 0},
                                 {"add_eos_token", false},
                                 {"clean_up_tokenization_spaces", false},
                                 {"legacy", false},
                                 {"model_max_length", model_max_length},
                                 {"padding_side", "right"},
                                 {"sp_model_kwargs", nlohmann::json::object()},
                                 {"spaces_between_special_tokens", false}};
  return j.dump(2) + "\n";
}

std::string hf_special_tokens_map_json(const Tokenizer& t) {
  check_sentencepiece(t, kSpecialTokensMapName);
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (t.bos_id() >= 0) j["bos_token"] = t.piece(t.bos_id());
  if (t.eos_id() >= 0) j["eos_token"] = t.piece(t.eos_id());
  if (t.unk_id() >= 0) j["unk_token"] = t.piece(t.unk_id());
  return j.dump(2) + "\n";
}

// ---------------------------------------------------------------------------
// Training.

namespace {

bool has_text(std::string_view line) { return line.find_first_not_of(" \t\r\v\f") != std::string_view::npos; }

/// Feeds SentencePiece's trainer sentences from a callback's lines: lines
/// without text are skipped, long ones cut (TokenizerTraining), so a text
/// of one long line trains too. The first sentence is read on construction,
/// so done() then says whether there is any.
class SentenceSource final : public spm::SentenceIterator {
 public:
  SentenceSource(const std::function<bool(std::string&)>& next, size_t max_bytes) : next_(next), max_(max_bytes) {
    Next();
  }
  bool done() const override { return done_; }
  void Next() override {
    do {
      while (at_ >= line_.size()) {  // the current line is used up
        at_ = 0;
        if (!next_(line_)) {
          done_ = true;
          return;
        }
      }
      const std::string_view rest = std::string_view(line_).substr(at_);
      // A cut lies in [from, from + window), so from + window - 1 = max_ bounds the sentence.
      const size_t window = std::max<size_t>(4, max_ / 4);
      const size_t end = rest.size() <= max_ ? rest.size() : text_cut(rest, max_ + 1 - window, window);
      sentence_.assign(rest.substr(0, end));
      // Cut before a space: the next sentence's dummy prefix stands for that space.
      at_ += end + (end < rest.size() && rest[end] == ' ' ? 1 : 0);
    } while (!has_text(sentence_));
  }
  const std::string& value() const override { return sentence_; }
  spm::util::Status status() const override { return {}; }

 private:
  const std::function<bool(std::string&)>& next_;
  size_t max_;
  std::string line_;
  size_t at_ = 0;  // bytes of line_ already given out
  std::string sentence_;
  bool done_ = false;
};

// The bytes of the UTF-8 sequence that starts with `lead` (1 for a byte that starts none).
size_t sequence_length(char lead) {
  const auto b = static_cast<unsigned char>(lead);
  return b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
}

// How often each character occurs in `sentences` as SentencePiece counts
// them (its trainer_interface.cc, LoadSentences): after our identity
// normalization every sentence starts with the dummy prefix U+2581 and each
// space is U+2581. Keys are the characters' UTF-8 bytes.
std::unordered_map<std::string, int64_t> count_characters(SentenceSource& sentences, int64_t max_sentences,
                                                          int64_t& total) {
  const std::string space = "\u2581";
  std::unordered_map<std::string, int64_t> count;
  for (int64_t n = 0; !sentences.done() && n < max_sentences; ++n, sentences.Next()) {
    const std::string& s = sentences.value();
    ++count[space];
    ++total;
    for (size_t i = 0; i < s.size();) {
      const size_t len = std::min(sequence_length(s[i]), s.size() - i);
      ++count[s[i] == ' ' ? space : s.substr(i, len)];
      ++total;
      i += len;
    }
  }
  return count;
}

}  // namespace

int64_t min_vocab_size(const TokenizerTraining& o, const std::function<bool(std::string&)>& next_line) {
  SentenceSource sentences(next_line, static_cast<size_t>(o.max_sentence_bytes));
  int64_t total = 0;
  const std::unordered_map<std::string, int64_t> count = count_characters(sentences, o.max_sentences, total);
  std::vector<std::pair<int64_t, std::string>> by_count;  // (-count, character): SentencePiece's order
  for (const auto& [c, n] : count) by_count.emplace_back(-n, c);
  std::sort(by_count.begin(), by_count.end());
  // The most frequent characters until they cover character_coverage of all
  // (compared in float, as SentencePiece does); a tab is counted but never a piece.
  int64_t covered = 0, required = 0;
  for (const auto& [minus_n, c] : by_count) {
    if (static_cast<float>(1.0 * static_cast<double>(covered) / static_cast<double>(total)) >=
        static_cast<float>(o.character_coverage))
      break;
    covered -= minus_n;
    if (c != "\t") ++required;
  }
  return kByteFallbackIds + required;
}

std::string train_tokenizer(const TokenizerTraining& o, const std::function<bool(std::string&)>& next_line) {
  ST_CHECK(o.vocab_size > kByteFallbackIds,
           "--vocab-size {} is too small: byte fallback alone takes {} ids (<unk>, <s>, </s> and 256 bytes)",
           o.vocab_size, kByteFallbackIds);
  // LLaMA's tokenizer.model settings (its trainer_spec and normalizer_spec).
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"split_by_unicode_script", "true"},
      {"split_by_whitespace", "true"},
      {"split_by_number", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"max_sentencepiece_length", "16"},
      {"character_coverage", format("{}", o.character_coverage)},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "true"},
      {"remove_extra_whitespaces", "false"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"input_sentence_size", std::to_string(o.max_sentences)},
      {"max_sentence_length", std::to_string(o.max_sentence_bytes)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(std::max(o.threads, 1))},
      {"minloglevel", "1"},  // SentencePiece's progress lines; warnings still print
  };
  ST_CHECK(o.max_sentence_bytes >= 16, "a sentence of at most {} bytes is too short to train on", o.max_sentence_bytes);
  spm::SetRandomGeneratorSeed(o.seed);
  SentenceSource sentences(next_line, static_cast<size_t>(o.max_sentence_bytes));
  // SentencePiece would stop with its internal "[!sentences_.empty()]".
  ST_CHECK(!sentences.done(),
           "cannot train a tokenizer on {}: it holds no text (every line is empty or only whitespace); give it "
           "text, or encode without training: --tokenizer PATH (an existing tokenizer.model) or neither flag "
           "(byte-level tokens)",
           o.input);
  std::string model;
  const spm::util::Status status = spm::SentencePieceTrainer::Train(args, &sentences, &model);
  ST_CHECK(status.ok(), "training the tokenizer (--vocab-size {}) failed: {}", o.vocab_size, status.ToString());
  return model;
}

}  // namespace st::dataset
