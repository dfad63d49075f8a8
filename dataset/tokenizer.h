#pragma once
// Tokenizers: a SentencePiece model (a `tokenizer.model`, LLaMA's kind), or
// the byte-level stand-in used when none is given (ids are the UTF-8 bytes,
// vocabulary 256, no special tokens). `data.tokenizer` (data.kind text),
// `prepare` and `generate` all go through this class.
//
//   Tokenizer tok = Tokenizer::load("data/tokenizer.model");
//   std::vector<int32_t> ids = tok.encode("Hello world");  // no BOS/EOS added
//   std::string text = tok.decode(ids);                    // == "Hello world"
//   for (int32_t id : ids) std::fputs(tok.decode_piece(id).c_str(), stdout);  // streaming
//
// A Tokenizer is immutable and cheap to copy; every const method may be
// called from several threads at once.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace st::dataset {

/// Where a text handed to encode() starts. SentencePiece puts a "▁" (its
/// space) before a document's first word, as Hugging Face's LlamaTokenizer
/// does; `Continuation` leaves it out, for a piece of a document that starts
/// just after a '\n'. A document cut after line ends and encoded piece by
/// piece (the first as Document, the rest as Continuation) then gives the
/// ids of the whole when splits_at_lines() is true.
enum class TextStart : uint8_t { Document, Continuation };

/// What an id stands for (for coverage statistics).
enum class TokenKind : uint8_t { Normal, Unknown, Byte, Control };

class Tokenizer {
 public:
  /// The byte-level stand-in: id = byte value, vocab_size() 256, no BOS/EOS.
  static Tokenizer bytes();
  /// Reads the SentencePiece model file `path`; an error names the file when
  /// it is missing, unreadable or not a SentencePiece model.
  static Tokenizer load(const std::string& path);

  /// Ids are in [0, vocab_size()).
  int64_t vocab_size() const;
  /// The ids of `text` (UTF-8), without BOS or EOS. SentencePiece needs
  /// about 120 bytes of memory per byte it encodes at once, so when
  /// splits_at_lines() a text longer than kEncodeChunkBytes is encoded chunk
  /// by chunk, cut by text_cut(): memory follows the chunk, not the text (a
  /// 50 MB line took 5.9 GB whole).
  std::vector<int32_t> encode(std::string_view text, TextStart start = TextStart::Document) const;
  /// The text of `ids` (control tokens such as BOS/EOS give nothing); an id
  /// outside the vocabulary is an error. decode(encode(s)) == s for UTF-8 `s`
  /// with a SentencePiece model that normalizes nothing (prepare's and LLaMA's).
  std::string decode(std::span<const int32_t> ids) const;
  /// The text one token adds when appended to a decoded text, for streaming:
  /// "▁" becomes ' ', a byte token its raw byte (a character may take several
  /// tokens, so print bytes, not characters), control tokens "". The
  /// concatenation over `ids` equals decode(ids) except for the ' ' that
  /// decode() drops at the very start (the "▁" encode added).
  std::string decode_piece(int32_t id) const;
  /// Beginning/end-of-sequence ids; -1 when the tokenizer has none (byte-level).
  int32_t bos_id() const;
  int32_t eos_id() const;
  /// The unknown token's id (SentencePiece: 0); -1 for byte-level.
  int32_t unk_id() const;
  /// The piece of `id` as the model stores it ("<s>", "▁the", "<0x0A>"); for
  /// byte-level, "<0xNN>".
  std::string piece(int32_t id) const;
  TokenKind kind(int32_t id) const;

  /// True for the byte-level stand-in.
  bool is_bytes() const;
  /// The model file as loaded ("" for byte-level): what checkpoints copy.
  const std::string& path() const;
  /// The model file's bytes as read by load() ("" for byte-level).
  const std::string& model_bytes() const;
  /// Whether encoding a text cut right after '\n' characters piece by piece
  /// (TextStart::Continuation after the first) gives exactly the ids of the
  /// whole: true for byte-level and for SentencePiece models that normalize
  /// nothing (normalization_rule_name identity, remove_extra_whitespaces
  /// false), which prepare trains and LLaMA uses.
  bool splits_at_lines() const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

/// Where a text may be cut at or after byte `from`, looking no further than
/// `window` bytes: just after a '\n'; failing that, just before a ' ' that
/// follows a byte other than ' ' (where a word starts); failing both (a run
/// of `window` bytes without a line end or a space), the first UTF-8
/// character boundary. text.size() when `from` is at or past the end. The
/// result lies in [from, from + window) for window >= 4, so cuts at
/// increasing `from` a window apart never cross.
///
/// For a tokenizer that splits_at_lines(), encoding the two sides of a cut
/// of the first two kinds (the second side as TextStart::Continuation) gives
/// exactly the ids of the whole: SentencePiece trained with
/// split_by_whitespace (prepare's and LLaMA's settings) has no piece that
/// spans a line end or runs from a word on into the space after it. At a cut
/// of the third kind the ids near the cut may differ (the text decodes the same).
size_t text_cut(std::string_view text, size_t from, size_t window);
/// Largest text SentencePiece encodes in one call (encode() cuts longer ones).
inline constexpr size_t kEncodeChunkBytes = size_t{64} << 10;

/// A text cut into pieces to encode in parallel: piece k (0 <= k <
/// piece_count) is [cut(k), cut(k + 1)), where cut(0) = 0, cut(count) = the
/// text's end, and cut(k) = text_cut(text, k * target_bytes, target_bytes).
/// Encoding the pieces (the one at 0 as TextStart::Document, the rest as
/// Continuation) gives the ids of the whole (see text_cut). Each cut depends
/// only on the text near it, so a worker finds its own piece, and the result
/// is the same for any number of threads. One piece when
/// !tokenizer.splits_at_lines(); pieces are at most 2 x target_bytes.
struct TextPiece {
  size_t begin = 0, end = 0;
};
size_t piece_count(const Tokenizer& tokenizer, size_t text_bytes, size_t target_bytes);
TextPiece text_piece(std::string_view text, size_t k, size_t count, size_t target_bytes);
/// Pieces of about this size: large enough that encoding dominates, small
/// enough that a few megabytes keep every thread busy.
inline constexpr size_t kTextPieceBytes = size_t{1} << 20;

/// The ids of one document (a file) as training data holds it: BOS, then
/// encode(text), then EOS, each special id only when the tokenizer has one
/// (byte-level: the bytes alone). prepare and data.kind text both frame
/// documents so. Encodes the pieces (text_piece) on up to `threads` threads.
std::vector<int32_t> encode_document(const Tokenizer& tokenizer, std::string_view text, int threads = 1);

/// Hugging Face files that make a checkpoint with `tokenizer.model` a
/// complete LlamaTokenizer directory. tokenizer_config.json (tokenizer_class
/// LlamaTokenizer, BOS/EOS/UNK pieces, add_bos_token true, add_eos_token
/// false, model_max_length = `model_max_length`, the model's
/// max_position_embeddings) and special_tokens_map.json. SentencePiece only.
std::string hf_tokenizer_config_json(const Tokenizer& tokenizer, int64_t model_max_length);
std::string hf_special_tokens_map_json(const Tokenizer& tokenizer);
/// File names of the tokenizer in a checkpoint / prepare's output.
inline constexpr std::string_view kTokenizerModelName = "tokenizer.model";
inline constexpr std::string_view kTokenizerConfigName = "tokenizer_config.json";
inline constexpr std::string_view kSpecialTokensMapName = "special_tokens_map.json";

/// How prepare trains a tokenizer: a SentencePiece BPE model with LLaMA's
/// settings (byte fallback, split digits, identity normalization, the dummy
/// prefix, extra whitespace kept, unk/bos/eos ids 0/1/2, no pad) on at most
/// `max_sentences` sentences sampled from the input: its lines, less those
/// that are empty or only whitespace, with a line longer than
/// `max_sentence_bytes` cut into sentences by text_cut (SentencePiece would
/// drop it).
struct TokenizerTraining {
  int64_t vocab_size = 32000;
  int64_t max_sentences = 1000000;    // input_sentence_size: sentences sampled (shuffled) for training
  int64_t max_sentence_bytes = 4192;  // max_sentence_length (SentencePiece's default)
  std::string input = "the input";    // what the lines come from, for errors: "'corpus.txt'"
  double character_coverage = 0.99995;
  int threads = 1;
  uint32_t seed = 1234;  // the line sample
};

/// Ids every trained model reserves: <unk>, <s>, </s> and byte fallback's 256 byte pieces.
inline constexpr int64_t kByteFallbackIds = 256 + 3;

/// The smallest vocab_size train_tokenizer accepts for the lines `next_line`
/// yields: kByteFallbackIds plus the characters SentencePiece must give a
/// piece of their own (the most frequent ones, up to character_coverage of
/// the text, counted on the same sentences as training). Exact when the text
/// has at most max_sentences sentences; beyond that SentencePiece samples
/// them at random and this counts the first ones.
int64_t min_vocab_size(const TokenizerTraining& options, const std::function<bool(std::string&)>& next_line);

/// Trains a model on the lines `next_line` yields (it returns false at the
/// end) and returns the serialized model, the bytes of a tokenizer.model.
/// Errors (a vocabulary too small for byte fallback, or too large for the
/// text) name `--vocab-size`; lines with no text at all (empty or only
/// whitespace) are refused before SentencePiece runs, naming `input`.
std::string train_tokenizer(const TokenizerTraining& options, const std::function<bool(std::string&)>& next_line);

}  // namespace st::dataset
