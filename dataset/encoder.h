#pragma once
// prepare's encoder: input files cut into pieces (text_piece), encoded by a
// pool of threads, handed to the caller in input order with a bounded number
// in flight, so the output is the same for any thread count.
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dataset/tokenizer.h"

namespace st::dataset {

/// One input file: a document (BOS, its tokens, EOS).
struct InputFile {
  std::filesystem::path path;
  size_t bytes = 0;
};

/// Piece k of a file cut into `count`.
struct Piece {
  size_t file = 0;  // index into the input files
  size_t k = 0;     // piece k of count
  size_t count = 1;
};

/// A piece's tokens and counts.
struct Encoded {
  std::vector<int32_t> ids;  // with BOS before a file's first piece and EOS after its last
  size_t bytes = 0;          // text bytes of the piece
  int64_t unknown = 0, byte_fallback = 0;
  int64_t line_ends =
      0;  // byte-fallback tokens that are '\n' (SentencePiece trains on lines, so LLaMA's has no piece for it)
};

/// Every file's pieces, in order.
std::vector<Piece> plan_pieces(const std::vector<InputFile>& files, const Tokenizer& tokenizer);

/// Encodes one piece (BOS before a file's first piece, EOS after its last).
Encoded encode_piece(const Piece& p, const std::vector<InputFile>& files, const Tokenizer& tokenizer);

// Runs encode_piece over `pieces` on `threads` threads and hands the results
// to `consume` in order, with at most `window` pieces encoded ahead of it.
class OrderedEncoder {
 public:
  OrderedEncoder(const std::vector<Piece>& pieces, const std::vector<InputFile>& files, const Tokenizer& tokenizer,
                 int threads)
      : pieces_(pieces),
        files_(files),
        tokenizer_(tokenizer),
        results_(pieces.size()),
        window_(static_cast<size_t>(4 * threads)) {
    for (int t = 0; t < threads; ++t) workers_.emplace_back([this] { work(); });
  }
  ~OrderedEncoder() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  OrderedEncoder(const OrderedEncoder&) = delete;
  OrderedEncoder& operator=(const OrderedEncoder&) = delete;

  /// The result of piece `i`, in order (i = 0, 1, ...); rethrows a worker's error.
  Encoded take(size_t i) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return results_[i].has_value() || !error_.empty(); });
    ST_CHECK(error_.empty(), "{}", error_);
    Encoded e = std::move(*results_[i]);
    results_[i].reset();
    consumed_ = i + 1;
    cv_.notify_all();
    return e;
  }

 private:
  void work();

  const std::vector<Piece>& pieces_;
  const std::vector<InputFile>& files_;
  const Tokenizer& tokenizer_;
  std::vector<std::optional<Encoded>> results_;
  size_t window_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t next_ = 0;      // the next piece a worker claims
  size_t consumed_ = 0;  // pieces taken by the consumer
  std::string error_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace st::dataset
