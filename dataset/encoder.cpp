#include "dataset/encoder.h"

#include "core/error.h"
#include "dataset/mapped_file.h"

namespace st::dataset {

std::vector<Piece> plan_pieces(const std::vector<InputFile>& files, const Tokenizer& tokenizer) {
  std::vector<Piece> pieces;
  for (size_t f = 0; f < files.size(); ++f) {
    const size_t count = piece_count(tokenizer, files[f].bytes, kTextPieceBytes);
    for (size_t k = 0; k < count; ++k) pieces.push_back({f, k, count});
  }
  return pieces;
}

Encoded encode_piece(const Piece& p, const std::vector<InputFile>& files, const Tokenizer& tokenizer) {
  const MappedFile file(files[p.file].path, "input");
  const std::string_view text = file.text();
  const TextPiece range = text_piece(text, p.k, p.count, kTextPieceBytes);
  Encoded e;
  e.bytes = range.end - range.begin;  // the pieces of a file partition it
  if (p.k == 0 && tokenizer.bos_id() >= 0) e.ids.push_back(tokenizer.bos_id());
  if (range.end > range.begin) {
    const std::vector<int32_t> ids = tokenizer.encode(text.substr(range.begin, range.end - range.begin),
                                                      range.begin == 0 ? TextStart::Document : TextStart::Continuation);
    e.ids.insert(e.ids.end(), ids.begin(), ids.end());
  }
  if (p.k + 1 == p.count && tokenizer.eos_id() >= 0) e.ids.push_back(tokenizer.eos_id());
  for (int32_t id : e.ids) {
    const TokenKind kind = tokenizer.kind(id);
    e.unknown += kind == TokenKind::Unknown ? 1 : 0;
    e.byte_fallback += kind == TokenKind::Byte ? 1 : 0;
    e.line_ends += kind == TokenKind::Byte && tokenizer.decode_piece(id) == "\n" ? 1 : 0;
  }
  return e;
}

void OrderedEncoder::work() {
  for (;;) {
    size_t i = 0;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || next_ >= pieces_.size() || next_ < consumed_ + window_; });
      if (stop_ || next_ >= pieces_.size()) return;
      i = next_++;
    }
    std::optional<Encoded> e;
    const std::string error = error_message_of([&] { e = encode_piece(pieces_[i], files_, tokenizer_); });
    std::lock_guard lock(mu_);
    if (!error.empty() && error_.empty()) error_ = error;
    results_[i] = std::move(e);
    cv_.notify_all();
  }
}

}  // namespace st::dataset
