// prepare: a folder of text in, a tokenizer and llm.c token shards out (issue 15).
//
//   prepare INPUT... --out DIR [--tokenizer PATH | --train-tokenizer --vocab-size N]
//           [--val-fraction F] [--threads N] [--shard-tokens N] [--tokenizer-sentences N] [--overwrite]
//
// Writes DIR/train/train_000000.bin ..., DIR/val/val_000000.bin ... (llm.c
// shards: data.kind tokens, data.path DIR/train) and DIR/tokenizer.model
// (trained, or a copy of --tokenizer; none for byte-level tokens). Each
// input file is one document: BOS, its tokens, EOS (encode_document). The
// output is the same for any --threads.
//
// Exit codes: 0 success, 1 an error (one line on stderr), 2 a usage or
// internal error (run_main, core/cli.h).
#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "core/cli.h"
#include "core/cpu/parallel.h"
#include "core/error.h"
#include "core/file.h"
#include "core/format.h"
#include "core/text.h"
#include "dataset/dataset.h"
#include "dataset/encoder.h"
#include "dataset/mapped_file.h"
#include "dataset/shard_writer.h"
#include "dataset/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using st::format;
using st::human_bytes;
using st::with_commas;
using st::dataset::Encoded;
using st::dataset::InputFile;
using st::dataset::OrderedEncoder;
using st::dataset::Piece;
using st::dataset::ShardWriter;
using st::dataset::Tokenizer;

// ---------------------------------------------------------------------------
// Command line.

struct PrepareArgs {
  std::vector<std::string> inputs;  // files and directories (searched recursively)
  std::string out;                  // --out
  std::string tokenizer;            // --tokenizer PATH
  bool train_tokenizer = false;     // --train-tokenizer
  int64_t vocab_size = 0;           // --vocab-size (with --train-tokenizer)
  int64_t tokenizer_sentences = st::dataset::TokenizerTraining{}.max_sentences;  // --tokenizer-sentences
  double val_fraction = 0.05;                                                    // --val-fraction
  int threads = 0;                   // --threads; 0 = the cores of this process's affinity mask
  int64_t shard_tokens = 100000000;  // --shard-tokens: tokens per shard file (llm.c's size)
  bool overwrite = false;            // --overwrite
};

/// The flags, writing into `a`.
st::cli::Parser prepare_parser(PrepareArgs& a) {
  st::cli::Parser p("prepare",
                    "prepare INPUT... --out DIR [--tokenizer PATH | --train-tokenizer --vocab-size N]\n"
                    "               [--val-fraction F] [--threads N] [--shard-tokens N] [--tokenizer-sentences N]\n"
                    "               [--overwrite]");
  p.text(
       "  Encodes UTF-8 text files (INPUT: files, or directories searched recursively; files that are\n"
       "  not UTF-8 text are skipped) into llm.c token shards for `data.kind: tokens`:\n"
       "    DIR/train/train_000000.bin ...   data.path: DIR/train\n"
       "    DIR/val/val_000000.bin ...       data.val_path: DIR/val\n"
       "    DIR/tokenizer.model              data.tokenizer: DIR/tokenizer.model (model.vocab_size = its size)\n"
       "  Each file is one document: BOS, its tokens, EOS. Shards hold uint16 tokens when the\n"
       "  vocabulary fits in 65536 ids, else uint32.\n")
      .option("--out", "DIR", &a.out, "the output directory")
      .option("--tokenizer", "PATH", &a.tokenizer,
              "encode with this SentencePiece model (copied to DIR/tokenizer.model)")
      .flag("--train-tokenizer", &a.train_tokenizer,
            "first train a SentencePiece BPE model with byte fallback (LLaMA's\n"
            "settings) on the input, written to DIR/tokenizer.model")
      .option("--vocab-size", "N", &a.vocab_size, "its vocabulary (with --train-tokenizer; > 259)")
      .option("--tokenizer-sentences", "N", &a.tokenizer_sentences,
              "sentences (lines; long ones cut) sampled from the input to train it\n(default 1000000)")
      .text("  (neither: byte-level tokens, vocabulary 256)")
      .option("--val-fraction", "F", &a.val_fraction,
              "fraction of every piece of text's tokens (its end) kept for\n"
              "validation, in [0, 1) (default 0.05; 0: no DIR/val)")
      .option("--threads", "N", &a.threads, "encoding threads (default: the cores this process may use)", 0, 4096)
      .option("--shard-tokens", "N", &a.shard_tokens, "tokens per shard file (default 100000000)")
      .flag("--overwrite", &a.overwrite,
            "replace an earlier output in DIR (its shards and tokenizer.model;\n"
            "nothing else is touched)")
      .positionals("INPUT", &a.inputs)
      .usage_without_arguments();
  return p;
}

void check_args(const PrepareArgs& a) {
  ST_USAGE_CHECK(!a.inputs.empty(), "no INPUT given (text files or directories; see --help)");
  ST_USAGE_CHECK(!a.out.empty(), "--out DIR is required");
  ST_USAGE_CHECK(!(a.train_tokenizer && !a.tokenizer.empty()), "--tokenizer and --train-tokenizer exclude each other");
  ST_USAGE_CHECK(!a.train_tokenizer || a.vocab_size > 0, "--train-tokenizer needs --vocab-size N");
  ST_USAGE_CHECK(!a.train_tokenizer || a.vocab_size > st::dataset::kByteFallbackIds,
                 "--vocab-size {} is too small: byte fallback alone takes {} ids (<unk>, <s>, </s> and 256 bytes)",
                 a.vocab_size, st::dataset::kByteFallbackIds);
  ST_USAGE_CHECK(a.train_tokenizer || a.vocab_size == 0,
                 "--vocab-size is for --train-tokenizer (a given tokenizer has its own; byte-level has 256)");
  ST_USAGE_CHECK(a.val_fraction >= 0 && a.val_fraction < 1, "--val-fraction {} must be in [0, 1)", a.val_fraction);
  ST_USAGE_CHECK(a.shard_tokens >= 1 && a.shard_tokens <= INT32_MAX,
                 "--shard-tokens {} must be in [1, {}] (an llm.c header counts tokens in an int32)", a.shard_tokens,
                 INT32_MAX);
  ST_USAGE_CHECK(a.tokenizer_sentences >= 1, "--tokenizer-sentences {} must be positive", a.tokenizer_sentences);
}

// ---------------------------------------------------------------------------
// Inputs.

struct Inputs {
  std::vector<InputFile> files;  // in order: INPUTs as given, each directory's files sorted by path
  size_t bytes = 0;
  int64_t skipped = 0;  // files in directories that are not UTF-8 text (or empty)
  std::string first_skipped;
  std::set<fs::path> seen;  // canonical paths: a file reached twice (a symlink, a repeated INPUT) is read once
  int64_t duplicates = 0;

  /// Adds `file` unless it was added before (by another name); returns whether it was new.
  bool add(InputFile file) {
    std::error_code ec;
    const fs::path canonical = fs::canonical(file.path, ec);
    if (!seen.insert(ec ? file.path : canonical).second) {
      ++duplicates;
      return false;
    }
    bytes += file.bytes;
    files.push_back(std::move(file));
    return true;
  }
};

// "" when the file is text by data.kind text's rule (st::dataset::text_sample_problem on its
// first bytes), else what is wrong. open_regular_file: a FIFO among the inputs never blocks.
std::string text_problem(const fs::path& path) {
  const st::UniqueFd fd = st::open_regular_file(path, "input file");
  std::string sample(st::dataset::kTextSampleBytes, '\0');
  size_t got = 0;
  while (got < sample.size()) {
    const ssize_t n = ::read(fd.get(), sample.data() + got, sample.size() - got);
    if (n < 0 && errno == EINTR) continue;
    ST_CHECK(n >= 0, "cannot read input file '{}': {}", path.string(), st::errno_text());
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  sample.resize(got);
  return st::dataset::text_sample_problem(sample);
}

// The text files under directory `dir` (recursively, hidden entries and `skip` excluded), sorted.
void add_directory(const fs::path& dir, const fs::path& skip, Inputs& inputs) {
  std::vector<InputFile> found;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const fs::path& p = it->path();
    const bool hidden = p.filename().string().starts_with(".");
    std::error_code same_ec;
    if (hidden || (!skip.empty() && fs::equivalent(p, skip, same_ec))) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file()) continue;
    const size_t bytes = static_cast<size_t>(it->file_size());
    if (bytes == 0 || !text_problem(p).empty()) {
      if (inputs.skipped++ == 0 || p.string() < inputs.first_skipped) inputs.first_skipped = p.string();
      continue;
    }
    found.push_back({p, bytes});
  }
  ST_CHECK(!ec, "cannot read input directory '{}': {}", dir.string(), ec.message());
  ST_CHECK(!found.empty(), "input directory '{}' holds no UTF-8 text files{}", dir.string(),
           inputs.skipped > 0 ? format(" ({} other files skipped, e.g. '{}')", inputs.skipped, inputs.first_skipped)
                              : std::string(" (it is empty)"));
  std::sort(found.begin(), found.end(), [](const InputFile& a, const InputFile& b) { return a.path < b.path; });
  for (InputFile& f : found) inputs.add(std::move(f));
}

Inputs find_inputs(const std::vector<std::string>& paths, const fs::path& out) {
  Inputs inputs;
  for (const std::string& p : paths) {
    std::error_code ec;
    ST_CHECK(fs::exists(p, ec), "input '{}' does not exist", p);
    if (fs::is_directory(p, ec)) {
      add_directory(p, fs::exists(out, ec) ? out : fs::path(), inputs);
      continue;
    }
    const std::string problem = text_problem(p);  // first: it refuses a FIFO or a device by name
    const size_t bytes = static_cast<size_t>(fs::file_size(p, ec));
    ST_CHECK(!ec, "cannot read input '{}': {}", p, ec.message());
    ST_CHECK(bytes > 0, "input file '{}' is empty", p);
    ST_CHECK(problem.empty(), "input file '{}' is not UTF-8 text: {} in its first {} KiB", p, problem,
             st::dataset::kTextSampleBytes >> 10);
    inputs.add({p, bytes});
  }
  return inputs;
}

// ---------------------------------------------------------------------------
// The output directory.

const char* const kSplits[] = {"train", "val"};

// Shards an earlier run wrote: DIR/train/train_*.bin and DIR/val/val_*.bin.
std::vector<fs::path> existing_shards(const fs::path& out) {
  std::vector<fs::path> shards;
  for (const char* split : kSplits) {
    std::error_code ec;
    const fs::path dir = out / split;
    if (!fs::is_directory(dir, ec)) continue;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with(std::string(split) + "_") && name.ends_with(".bin")) shards.push_back(e.path());
    }
  }
  std::sort(shards.begin(), shards.end());
  return shards;
}

// On a failure after the output directory was set up, removes the
// directories this run left empty (DIR/train, DIR/val, and DIR itself when
// this run created it), so a failed run leaves no empty output behind.
class OutputCleanup {
 public:
  explicit OutputCleanup(fs::path out) : out_(std::move(out)) {
    std::error_code ec;
    existed_ = fs::exists(out_, ec);
  }
  OutputCleanup(const OutputCleanup&) = delete;
  OutputCleanup& operator=(const OutputCleanup&) = delete;
  ~OutputCleanup() {
    if (kept_) return;
    std::error_code ec;  // best effort: a destructor reports nothing
    for (const char* split : kSplits)
      if (fs::is_empty(out_ / split, ec)) fs::remove(out_ / split, ec);
    if (!existed_ && fs::is_empty(out_, ec)) fs::remove(out_, ec);
  }
  /// The run succeeded: leave everything.
  void keep() { kept_ = true; }

 private:
  fs::path out_;
  bool existed_ = false;
  bool kept_ = false;
};

// Refuses to mix two outputs in `out`; with --overwrite removes the earlier shards (nothing else).
void prepare_output(const fs::path& out, bool overwrite, bool writes_tokenizer) {
  std::error_code ec;
  ST_CHECK(!fs::exists(out, ec) || fs::is_directory(out, ec), "--out '{}' exists and is not a directory", out.string());
  const std::vector<fs::path> shards = existing_shards(out);
  const fs::path tokenizer = out / st::dataset::kTokenizerModelName;
  const bool old_tokenizer = writes_tokenizer && fs::exists(tokenizer, ec);
  if (!overwrite) {
    ST_CHECK(shards.empty(), "--out '{}' already holds shards ('{}'{}); pass --overwrite to replace them", out.string(),
             shards.empty() ? std::string() : shards.front().string(),
             shards.size() > 1 ? format(" and {} more", shards.size() - 1) : std::string());
    ST_CHECK(!old_tokenizer, "--out '{}' already holds '{}'; pass --overwrite to replace it", out.string(),
             tokenizer.string());
  }
  for (const fs::path& shard : shards) {
    fs::remove(shard, ec);
    ST_CHECK(!ec, "cannot remove the earlier shard '{}': {}", shard.string(), ec.message());
  }
  for (const char* split : kSplits) {
    if (fs::is_empty(out / split, ec)) fs::remove(out / split, ec);  // a split this run may not write
  }
  fs::create_directories(out, ec);
  ST_CHECK(!ec, "cannot create --out '{}': {}", out.string(), ec.message());
}

// ---------------------------------------------------------------------------
// The tokenizer.

// Lines of the input files in order, for training (empty lines skipped;
// train_tokenizer skips whitespace-only ones and cuts long ones). Each file
// is mapped (MappedFile: a regular file only, never a blocking open).
class LineReader {
 public:
  explicit LineReader(const std::vector<InputFile>& files) : files_(files) {}
  bool next(std::string& line) {
    for (;;) {
      if (file_ && pos_ < file_->size()) {
        const std::string_view text = file_->text();
        const size_t nl = std::min(text.find('\n', pos_), text.size());
        line.assign(text.substr(pos_, nl - pos_));
        pos_ = nl + 1;
        if (line.empty()) continue;
        return true;
      }
      if (next_ == files_.size()) return false;
      file_.emplace(files_[next_++].path, "input");
      pos_ = 0;
    }
  }

 private:
  const std::vector<InputFile>& files_;
  size_t next_ = 0;  // the next file to map
  std::optional<st::dataset::MappedFile> file_;
  size_t pos_ = 0;  // the start of the next line in file_
};

st::dataset::TokenizerTraining training_options(const PrepareArgs& a, const Inputs& inputs, int threads) {
  st::dataset::TokenizerTraining options;
  options.vocab_size = a.vocab_size;
  options.max_sentences = a.tokenizer_sentences;
  options.threads = threads;
  options.input = inputs.files.size() == 1
                      ? format("the input '{}'", inputs.files[0].path.string())
                      : format("the {} input files ('{}', ...)", inputs.files.size(), inputs.files[0].path.string());
  return options;
}

// --vocab-size against the least SentencePiece accepts for this input, before
// anything is written: a usage error like --vocab-size 100.
void check_vocab_size(const PrepareArgs& a, const Inputs& inputs) {
  const st::dataset::TokenizerTraining options = training_options(a, inputs, 1);
  LineReader lines(inputs.files);
  const int64_t least = st::dataset::min_vocab_size(options, [&](std::string& line) { return lines.next(line); });
  ST_USAGE_CHECK(a.vocab_size >= least,
                 "--vocab-size {} is too small for {}: SentencePiece needs at least {}, the {} ids of byte fallback "
                 "(<unk>, <s>, </s> and 256 bytes) plus the {} characters that make up {:g}% of the text (its "
                 "character_coverage)",
                 a.vocab_size, options.input, least, st::dataset::kByteFallbackIds,
                 least - st::dataset::kByteFallbackIds, 100 * options.character_coverage);
}

Tokenizer train_on_inputs(const PrepareArgs& a, const Inputs& inputs, int threads, const fs::path& model_path) {
  const st::dataset::TokenizerTraining options = training_options(a, inputs, threads);
  std::fprintf(stderr, "prepare: training a SentencePiece BPE tokenizer of %lld tokens on up to %s lines of %s...\n",
               static_cast<long long>(a.vocab_size), with_commas(a.tokenizer_sentences).c_str(),
               human_bytes(static_cast<int64_t>(inputs.bytes)).c_str());
  const auto start = Clock::now();
  LineReader lines(inputs.files);
  const std::string model = st::dataset::train_tokenizer(options, [&](std::string& line) { return lines.next(line); });
  st::write_file_atomic(model_path, model);
  std::fprintf(stderr, "prepare: tokenizer trained in %.1f s: %s\n",
               std::chrono::duration<double>(Clock::now() - start).count(), model_path.string().c_str());
  return Tokenizer::load(model_path.string());
}

// Whether `given` is the tokenizer already at `model_path` (a rerun with DIR's own tokenizer).
bool same_file(const std::string& given, const fs::path& model_path) {
  std::error_code ec;
  return fs::exists(model_path, ec) && fs::equivalent(given, model_path, ec);
}

// The tokenizer to encode with: trained into DIR, or --tokenizer (copied into DIR), or bytes.
Tokenizer obtain_tokenizer(const PrepareArgs& a, const Inputs& inputs, int threads) {
  const fs::path model_path = fs::path(a.out) / st::dataset::kTokenizerModelName;
  if (a.train_tokenizer) return train_on_inputs(a, inputs, threads, model_path);
  if (a.tokenizer.empty()) return Tokenizer::bytes();
  Tokenizer tokenizer = Tokenizer::load(a.tokenizer);
  if (!same_file(a.tokenizer, model_path)) st::write_file_atomic(model_path, tokenizer.model_bytes());
  return tokenizer;
}

// ---------------------------------------------------------------------------
// Progress on stderr: a bar redrawn in place on a terminal, a line per 10% otherwise.

class Progress {
 public:
  explicit Progress(size_t total) : total_(total), tty_(::isatty(STDERR_FILENO) == 1), start_(Clock::now()) {}

  void update(size_t done) {
    if (finished_) return;
    finished_ = done == total_;
    const auto now = Clock::now();
    if (tty_) {
      if (!finished_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
      last_draw_ = now;
      std::fprintf(stderr, "\r%s", line(done, now).c_str());
      if (finished_) std::fputc('\n', stderr);
    } else {
      const int tenth = total_ == 0 ? 10 : static_cast<int>(10 * done / total_);
      if (tenth <= printed_tenth_) return;
      printed_tenth_ = tenth;
      std::fprintf(stderr, "%s\n", line(done, now).c_str());
    }
    std::fflush(stderr);
  }

  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  std::string line(size_t done, Clock::time_point now) const {
    const double secs = std::max(std::chrono::duration<double>(now - start_).count(), 1e-9);
    const double fraction = total_ == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total_);
    const double rate = static_cast<double>(done) / secs;
    const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : 0.0;
    constexpr int kWidth = 30;
    const auto filled = static_cast<size_t>(std::clamp(static_cast<int>(fraction * kWidth), 0, kWidth));
    std::string bar;
    if (tty_) {
      bar.push_back('[');
      bar.append(filled, '#');
      bar.append(kWidth - filled, '.');
      bar.append("] ");
    }
    return format("encoding {}{:>3.0f}% {} / {} {:.1f} MB/s ETA {}:{}{} ", bar, 100 * fraction,
                  human_bytes(static_cast<int64_t>(done)), human_bytes(static_cast<int64_t>(total_)), rate / 1e6,
                  static_cast<int64_t>(eta) / 60, static_cast<int64_t>(eta) % 60 < 10 ? "0" : "",
                  static_cast<int64_t>(eta) % 60);
  }

  size_t total_;
  bool tty_;
  Clock::time_point start_;
  Clock::time_point last_draw_{};
  int printed_tenth_ = 0;
  bool finished_ = false;  // the 100% line is out
};

// ---------------------------------------------------------------------------
// The run.

struct Totals {
  int64_t tokens = 0, unknown = 0, byte_fallback = 0, line_ends = 0;
  int64_t train_shards = 0, val_shards = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  double seconds = 0;
};

// Encodes every piece in order; the last `val_fraction` of each piece's
// tokens (rounded so that the running total stays within a token of the
// fraction) go to val, the rest to train.
Totals encode_inputs(const PrepareArgs& a, const Inputs& inputs, const Tokenizer& tokenizer, int threads) {
  const int width = tokenizer.vocab_size() <= 65536 ? 2 : 4;
  ShardWriter train(fs::path(a.out) / "train", "train", a.shard_tokens, width);
  ShardWriter val(fs::path(a.out) / "val", "val", a.shard_tokens, width);
  const std::vector<Piece> pieces = plan_pieces(inputs.files, tokenizer);
  Totals t;
  Progress progress(inputs.bytes);
  size_t done = 0;
  {
    OrderedEncoder encoder(pieces, inputs.files, tokenizer, threads);
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Encoded e = encoder.take(i);
      const int64_t n = static_cast<int64_t>(e.ids.size());
      t.tokens += n;
      t.unknown += e.unknown;
      t.byte_fallback += e.byte_fallback;
      t.line_ends += e.line_ends;
      const auto val_total = static_cast<int64_t>(std::llround(a.val_fraction * static_cast<double>(t.tokens)));
      const int64_t to_val = std::clamp<int64_t>(val_total - val.tokens(), 0, n);
      const std::span<const int32_t> ids(e.ids);
      train.write(ids.first(static_cast<size_t>(n - to_val)));
      val.write(ids.last(static_cast<size_t>(to_val)));
      done += e.bytes;
      progress.update(done);
    }
  }
  progress.update(inputs.bytes);
  t.train_shards = train.close();
  t.val_shards = val.close();
  t.train_tokens = train.tokens();
  t.val_tokens = val.tokens();
  t.seconds = progress.seconds();
  return t;
}

double percent(int64_t part, int64_t whole) {
  return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

void print_summary(const PrepareArgs& a, const Inputs& inputs, const Tokenizer& tokenizer, const Totals& t) {
  const fs::path out(a.out);
  std::printf("prepare: %zu file(s), %s -> %s tokens (%.2f bytes/token) in %.1f s (%.1f MB/s)\n", inputs.files.size(),
              human_bytes(static_cast<int64_t>(inputs.bytes)).c_str(), with_commas(t.tokens).c_str(),
              t.tokens > 0 ? static_cast<double>(inputs.bytes) / static_cast<double>(t.tokens) : 0.0, t.seconds,
              static_cast<double>(inputs.bytes) / std::max(t.seconds, 1e-9) / 1e6);
  if (inputs.skipped > 0)
    std::printf("  skipped %lld file(s) that are empty or not UTF-8 text, e.g. %s\n",
                static_cast<long long>(inputs.skipped), inputs.first_skipped.c_str());
  if (inputs.duplicates > 0)
    std::printf("  read once: %lld file(s) reached a second time (symlinks, repeated inputs)\n",
                static_cast<long long>(inputs.duplicates));
  std::printf("  train: %s tokens in %lld shard(s), %s/train_*.bin\n", with_commas(t.train_tokens).c_str(),
              static_cast<long long>(t.train_shards), (out / "train").string().c_str());
  if (t.val_shards > 0)
    std::printf("  val:   %s tokens (%.2f%%) in %lld shard(s), %s/val_*.bin\n", with_commas(t.val_tokens).c_str(),
                percent(t.val_tokens, t.tokens), static_cast<long long>(t.val_shards), (out / "val").string().c_str());
  const std::string width = tokenizer.vocab_size() <= 65536 ? "uint16" : "uint32";
  if (tokenizer.is_bytes()) {
    std::printf("  tokens: bytes (vocabulary 256, %s)\n", width.c_str());
  } else {
    std::printf(
        "  tokenizer: %s (SentencePiece, vocabulary %lld, %s); of the tokens: unknown %.3f%%, byte fallback "
        "%.3f%% (line ends '\\n' %.3f%%)\n",
        (out / st::dataset::kTokenizerModelName).string().c_str(), static_cast<long long>(tokenizer.vocab_size()),
        width.c_str(), percent(t.unknown, t.tokens), percent(t.byte_fallback, t.tokens),
        percent(t.line_ends, t.tokens));
  }
  std::string hint = format("--set data.kind=tokens --set data.path={}", (out / "train").string());
  if (t.val_shards > 0) hint += format(" --set data.val_path={}", (out / "val").string());
  if (!tokenizer.is_bytes())
    hint += format(" --set data.tokenizer={}", (out / st::dataset::kTokenizerModelName).string());
  std::printf("  train with: %s --set model.vocab_size=%lld\n", hint.c_str(),
              static_cast<long long>(tokenizer.vocab_size()));
}

int run(const std::vector<std::string>& argv) {
  PrepareArgs a;
  const st::cli::Parser parser = prepare_parser(a);
  if (parser.parse_or_help(argv)) return 0;
  check_args(a);
  // The one thread-count rule: the cores of this process's affinity mask.
  const int threads = a.threads > 0 ? a.threads : st::cpu::auto_cpu_threads(1);
  const Inputs inputs = find_inputs(a.inputs, a.out);
  const fs::path model_path = fs::path(a.out) / st::dataset::kTokenizerModelName;
  const bool writes_tokenizer = a.train_tokenizer || (!a.tokenizer.empty() && !same_file(a.tokenizer, model_path));
  if (a.train_tokenizer) check_vocab_size(a, inputs);
  OutputCleanup cleanup(a.out);
  prepare_output(a.out, a.overwrite, writes_tokenizer);
  const Tokenizer tokenizer = obtain_tokenizer(a, inputs, threads);
  const Totals totals = encode_inputs(a, inputs, tokenizer, threads);
  cleanup.keep();
  print_summary(a, inputs, tokenizer, totals);
  if (a.val_fraction > 0 && totals.val_tokens == 0)
    std::fprintf(stderr, "prepare: warning: the input is too small for --val-fraction %g: no validation tokens\n",
                 a.val_fraction);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  return st::run_main("prepare", [&] { return run(args); });
}
