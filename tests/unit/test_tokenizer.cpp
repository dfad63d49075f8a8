// Tokenizers (dataset/tokenizer.h): the byte-level stand-in; a SentencePiece
// model trained here with prepare's settings on English text (the fortunes
// package's files, as in the tutorial) must round-trip it exactly, encode a
// text cut at line ends like the whole, and stream through decode_piece; a
// model trained by the spm_train tool must encode like spm_encode; and the
// data.tokenizer checks and dataset built on them.
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/error.h"
#include "core/format.h"
#include "core/tensor.h"
#include "dataset/dataset.h"
#include "dataset/tokenizer.h"
#include "launch/config.h"
#include "tests/harness/dataset_from_config.h"
#include "tests/harness/test_util.h"

namespace st::dataset {
namespace {

namespace fs = std::filesystem;
using test::error_of;

const fs::path kFortunes = "/usr/share/games/fortunes";
// About 1 MB of English: enough for a 512-token vocabulary, seconds to train on.
const char* const kTrainingFiles[] = {"computers", "cookie", "definitions", "art", "knghtbrd", "humorists"};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const fs::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Standard output of `command` (which must exit 0).
std::string run_command(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  if (!pipe) return {};
  std::string out;
  std::array<char, 4096> buf{};
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), pipe.get())) > 0;) out.append(buf.data(), n);
  EXPECT_EQ(::pclose(pipe.release()), 0) << command;
  return out;
}

// One directory and two tokenizers for the whole suite: training takes seconds.
class Trained : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("st_test_tokenizer_" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    std::vector<std::string> lines;
    for (const char* name : kTrainingFiles)
      for (std::string& l : lines_of(read_text(kFortunes / name))) lines.push_back(std::move(l));
    TokenizerTraining options;
    options.vocab_size = 512;
    options.threads = 2;
    size_t next = 0;
    const std::string model = train_tokenizer(options, [&](std::string& line) {
      if (next == lines.size()) return false;
      line = lines[next++];
      return true;
    });
    write_text(model_path(), model);
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
    dir_ = nullptr;
  }
  static fs::path model_path() { return *dir_ / "tokenizer.model"; }
  static const fs::path& dir() { return *dir_; }

 private:
  static fs::path* dir_;
};
fs::path* Trained::dir_ = nullptr;

TEST(TokenizerBytes, IdsAreTheBytes) {
  const Tokenizer t = Tokenizer::bytes();
  EXPECT_TRUE(t.is_bytes());
  EXPECT_EQ(t.vocab_size(), 256);
  EXPECT_EQ(t.bos_id(), -1);
  EXPECT_EQ(t.eos_id(), -1);
  const std::string text = "caf\xc3\xa9\n";
  const std::vector<int32_t> ids = t.encode(text);
  EXPECT_EQ(ids, (std::vector<int32_t>{'c', 'a', 'f', 0xc3, 0xa9, '\n'}));
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_EQ(t.decode_piece(0xc3), "\xc3");
  EXPECT_EQ(encode_document(t, text), ids);  // no BOS/EOS to add
  EXPECT_EQ(error_of([&] { t.decode(std::vector<int32_t>{300}); }),
            "token id 300 is outside the vocabulary [0, 256) of tokenizer 'byte-level'");
}

TEST(TokenizerLoad, ErrorsNameTheFile) {
  const fs::path dir = fs::temp_directory_path() / ("st_test_tokenizer_load_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path missing = dir / "missing.model";
  EXPECT_EQ(error_of([&] { Tokenizer::load(missing.string()); }),
            "tokenizer '" + missing.string() + "' does not exist");
  EXPECT_EQ(error_of([&] { Tokenizer::load(dir.string()); }),
            "tokenizer '" + dir.string() + "' is a directory; expected a SentencePiece tokenizer.model");
  const fs::path text = dir / "notes.txt";
  write_text(text, "this is not a model\n");
  EXPECT_EQ(error_of([&] { Tokenizer::load(text.string()); }),
            "tokenizer '" + text.string() + "' is not a SentencePiece model: its 20 bytes do not parse as one");
  fs::remove_all(dir);
}

TEST_F(Trained, HasLlamaSettings) {
  const Tokenizer t = Tokenizer::load(model_path().string());
  EXPECT_FALSE(t.is_bytes());
  EXPECT_EQ(t.vocab_size(), 512);
  EXPECT_EQ(t.unk_id(), 0);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.piece(0), "<unk>");
  EXPECT_EQ(t.piece(1), "<s>");
  EXPECT_EQ(t.piece(2), "</s>");
  EXPECT_EQ(t.piece(3), "<0x00>");  // byte fallback: ids 3..258 are the bytes
  EXPECT_EQ(t.kind(3 + '\n'), TokenKind::Byte);
  EXPECT_EQ(t.kind(1), TokenKind::Control);
  EXPECT_TRUE(t.splits_at_lines());  // identity normalization, whitespace kept
  // split_digits: no piece holds two digits.
  for (int32_t id : t.encode("in 2024 there were 1234567 of them")) {
    const std::string p = t.piece(id);
    EXPECT_LE(std::count_if(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; }), 1) << p;
  }
  EXPECT_EQ(t.model_bytes(), read_text(model_path()));
  EXPECT_EQ(t.path(), model_path().string());
}

TEST_F(Trained, RoundTripsEnglishText) {
  const Tokenizer t = Tokenizer::load(model_path().string());
  for (const char* name : {"fortunes", "goedel", "food", "kids"}) {  // files it was not trained on
    const std::string text = read_text(kFortunes / name);
    ASSERT_FALSE(text.empty()) << name;
    const std::vector<int32_t> ids = t.encode(text);
    EXPECT_LT(ids.size(), text.size() * 7 / 10) << name << ": BPE merges should shorten English";
    EXPECT_EQ(t.decode(ids), text) << name;
  }
  // Characters outside the vocabulary come back through byte fallback, and
  // whitespace is kept as it is.
  const std::string odd =
      "  two  spaces, tabs\tand na\xc3\xafve caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82\n";
  EXPECT_EQ(t.decode(t.encode(odd)), odd);
}

TEST_F(Trained, PiecesCutAtLineEndsEncodeLikeTheWhole) {
  const Tokenizer t = Tokenizer::load(model_path().string());
  const std::string text = read_text(kFortunes / "fortunes") + read_text(kFortunes / "goedel");
  const std::vector<int32_t> whole = t.encode(text);
  constexpr size_t kTarget = 1000;  // many pieces
  const size_t count = piece_count(t, text.size(), kTarget);
  ASSERT_GT(count, 20u);
  std::vector<int32_t> joined;
  for (size_t k = 0; k < count; ++k) {
    const TextPiece p = text_piece(text, k, count, kTarget);
    if (p.end == p.begin) continue;
    ASSERT_TRUE(p.begin == 0 || text[p.begin - 1] == '\n');
    const std::vector<int32_t> ids = t.encode(std::string_view(text).substr(p.begin, p.end - p.begin),
                                              p.begin == 0 ? TextStart::Document : TextStart::Continuation);
    joined.insert(joined.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ(joined, whole);
  std::vector<int32_t> document{t.bos_id()};
  document.insert(document.end(), whole.begin(), whole.end());
  document.push_back(t.eos_id());
  EXPECT_EQ(encode_document(t, text, 3), document);
}

// text_cut's three kinds of cut, each within [from, from + window).
TEST(TextCut, AfterALineEndElseBeforeAWordElseAtACharacter) {
  const std::string text = "one two\nthree  four";
  EXPECT_EQ(text_cut(text, 2, 8), 8u);    // just after the '\n' at 7
  EXPECT_EQ(text_cut(text, 8, 8), 8u);    // a cut at `from` itself: the byte before it is the '\n'
  EXPECT_EQ(text_cut(text, 1, 6), 3u);    // no line end in [1, 7): before the ' ' of " two"
  EXPECT_EQ(text_cut(text, 9, 10), 13u);  // before the first ' ' of "  four", not the second
  EXPECT_EQ(text_cut(text, 14, 4), 14u);  // only a ' ' after a ' ' in [14, 18): the character at 14
  EXPECT_EQ(text_cut(text, 19, 4), 19u);
  EXPECT_EQ(text_cut(text, 40, 4), text.size());
  const std::string accents = "\xc3\xa9\xc3\xa9\xc3\xa9";  // "ééé": no space, no line end
  EXPECT_EQ(text_cut(accents, 1, 4), 2u);                  // not inside a character
  EXPECT_EQ(text_cut(accents, 5, 4), 6u);
  const std::string far = "ab cd" + std::string(100, 'x') + "\nz";  // a line end past the window is not used
  EXPECT_EQ(text_cut(far, 1, 10), 2u);
}

// One long line (no line end) is cut before spaces into chunks of about
// kEncodeChunkBytes, and into pieces the same way: the ids are spm_encode's of
// the whole line, which SentencePiece encodes in one call.
TEST_F(Trained, LongLineEncodesInChunksLikeTheWhole) {
  const Tokenizer t = Tokenizer::load(model_path().string());
  std::string line;
  for (const std::string& l : lines_of(read_text(kFortunes / "computers") + read_text(kFortunes / "cookie")))
    line += l + " ";
  line.resize(std::min<size_t>(line.size(), 5 * kEncodeChunkBytes));
  ASSERT_GT(line.size(), 3 * kEncodeChunkBytes);
  ASSERT_EQ(line.find('\n'), std::string::npos);
  write_text(dir() / "line.txt", line + "\n");
  std::vector<int32_t> expected;
  std::istringstream ids(run_command("spm_encode --model=" + model_path().string() + " --output_format=id < " +
                                     (dir() / "line.txt").string()));
  for (int32_t id; ids >> id;) expected.push_back(id);
  ASSERT_GT(expected.size(), 1000u);
  EXPECT_EQ(t.encode(line), expected);
  constexpr size_t kTarget = 20000;  // pieces cut before spaces
  const size_t count = piece_count(t, line.size(), kTarget);
  std::vector<int32_t> joined;
  for (size_t k = 0; k < count; ++k) {
    const TextPiece p = text_piece(line, k, count, kTarget);
    ASSERT_TRUE(p.begin == 0 || p.begin == line.size() || line[p.begin] == ' ') << p.begin;
    const std::vector<int32_t> part = t.encode(std::string_view(line).substr(p.begin, p.end - p.begin),
                                               p.begin == 0 ? TextStart::Document : TextStart::Continuation);
    joined.insert(joined.end(), part.begin(), part.end());
  }
  EXPECT_EQ(joined, expected);
  // A run without spaces or line ends is cut between characters: the text still comes back whole.
  const std::string run = line.substr(0, 1000) + std::string(3 * kEncodeChunkBytes, 'x') + "\xc3\xa9 end";
  EXPECT_EQ(t.decode(t.encode(run)), run);
}

// Training takes sentences: whitespace-only lines are skipped, and a long
// line is cut (SentencePiece would drop a line over max_sentence_bytes); input
// without any text is refused before SentencePiece runs.
TEST(TrainTokenizer, CutsLongLinesAndRefusesInputWithoutText) {
  TokenizerTraining options;
  options.vocab_size = 300;
  options.input = "the input 'blank.txt'";
  auto lines_from = [](std::vector<std::string> lines) {
    return [lines = std::move(lines), next = size_t{0}](std::string& line) mutable {
      if (next == lines.size()) return false;
      line = lines[next++];
      return true;
    };
  };
  EXPECT_EQ(error_of([&] {
              train_tokenizer(options, lines_from({"", "   ", "\t \r", ""}));
            }),
            "cannot train a tokenizer on the input 'blank.txt': it holds no text (every line is empty or only "
            "whitespace); give it text, or encode without training: --tokenizer PATH (an existing tokenizer.model) "
            "or neither flag (byte-level tokens)");
  std::string one_line;
  for (const char* name : {"computers", "cookie"})
    for (const std::string& l : lines_of(read_text(kFortunes / name))) one_line += l + " ";
  ASSERT_GT(one_line.size(), 20 * static_cast<size_t>(options.max_sentence_bytes));
  options.vocab_size = 400;
  const std::string model = train_tokenizer(options, lines_from({"  ", one_line}));
  const fs::path path = fs::temp_directory_path() / ("st_one_line_" + std::to_string(::getpid()) + ".model");
  write_text(path, model);
  const Tokenizer t = Tokenizer::load(path.string());
  fs::remove(path);
  EXPECT_EQ(t.vocab_size(), 400);
  EXPECT_LT(t.encode(one_line).size(), one_line.size());  // it learned merges from the line
  EXPECT_EQ(t.decode(t.encode(one_line)), one_line);
}

TEST_F(Trained, DecodePieceStreamsTheText) {
  const Tokenizer t = Tokenizer::load(model_path().string());
  const std::string text = "Hello, world!\nna\xc3\xafve caf\xc3\xa9 \xf0\x9f\x99\x82  end";
  std::string streamed;
  for (int32_t id : encode_document(t, text)) streamed += t.decode_piece(id);
  EXPECT_EQ(streamed, " " + text);  // the dummy prefix's space, which decode() drops
  EXPECT_EQ(t.decode(encode_document(t, text)), text);
}

TEST_F(Trained, HuggingFaceFiles) {
  const Tokenizer t = Tokenizer::load(model_path().string());
  const nlohmann::json config = nlohmann::json::parse(hf_tokenizer_config_json(t, 256));
  EXPECT_EQ(config["tokenizer_class"], "LlamaTokenizer");
  EXPECT_EQ(config["bos_token"], "<s>");
  EXPECT_EQ(config["eos_token"], "</s>");
  EXPECT_EQ(config["unk_token"], "<unk>");
  EXPECT_TRUE(config["pad_token"].is_null());
  EXPECT_EQ(config["add_bos_token"], true);
  EXPECT_EQ(config["add_eos_token"], false);
  EXPECT_EQ(config["model_max_length"], 256);
  const nlohmann::json map = nlohmann::json::parse(hf_special_tokens_map_json(t));
  EXPECT_EQ(map, nlohmann::json({{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}}));
  EXPECT_EQ(error_of([] { hf_tokenizer_config_json(Tokenizer::bytes(), 8); }),
            "tokenizer_config.json describes a SentencePiece tokenizer; the byte-level stand-in has none");
}

// A model trained by the spm_train tool (its defaults: nmt_nfkc normalization)
// is read like ours and encodes each line exactly as spm_encode does.
TEST_F(Trained, AcceptsModelsOfSpmTrain) {
  const fs::path input = dir() / "spm_input.txt";
  std::string text;
  for (const char* name : {"computers", "cookie"}) text += read_text(kFortunes / name);
  write_text(input, text);
  const fs::path prefix = dir() / "spm";
  run_command("spm_train --input=" + input.string() + " --model_prefix=" + prefix.string() +
              " --vocab_size=400 --model_type=bpe --minloglevel=2 2>&1");
  const fs::path model = prefix.string() + ".model";
  const Tokenizer t = Tokenizer::load(model.string());
  EXPECT_EQ(t.vocab_size(), 400);
  EXPECT_FALSE(t.splits_at_lines());  // nmt_nfkc and remove_extra_whitespaces: encoded whole

  std::vector<std::string> lines = lines_of(read_text(kFortunes / "fortunes"));
  lines.resize(60);
  std::string sample;
  for (const std::string& l : lines) sample += l + "\n";
  write_text(dir() / "sample.txt", sample);
  const std::vector<std::string> expected = lines_of(
      run_command("spm_encode --model=" + model.string() + " --output_format=id < " + (dir() / "sample.txt").string()));
  ASSERT_EQ(expected.size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string ids;
    for (int32_t id : t.encode(lines[i])) {
      if (!ids.empty()) ids.push_back(' ');
      ids.append(std::to_string(id));
    }
    EXPECT_EQ(ids, expected[i]) << "line " << i << ": " << lines[i];
  }
}

// ---------------------------------------------------------------------------
// data.tokenizer

Config text_config(const std::string& path, const std::string& tokenizer, int64_t vocab_size, int64_t seq_len) {
  Config c;
  c.data.kind = DataKind::Text;
  c.data.path = path;
  c.data.tokenizer = tokenizer;
  c.model.vocab_size = vocab_size;
  c.train.seq_len = seq_len;
  return c;
}

TEST_F(Trained, DataTokenizerVocabularyMustMatchTheModel) {
  const std::string model = model_path().string();
  const Config c = text_config((kFortunes / "goedel").string(), model, 256, 16);
  EXPECT_EQ(error_of([&] { load_data_tokenizer(c); }),
            "data.tokenizer '" + model +
                "' has a vocabulary of 512 tokens but model.vocab_size is 256; they must be equal (set "
                "model.vocab_size: 512)");
  EXPECT_EQ(error_of([&] { make_dataset(c); }), error_of([&] { load_data_tokenizer(c); }));
  EXPECT_FALSE(load_data_tokenizer(text_config("x", "", 256, 16)).has_value());
  Config synthetic;
  synthetic.data.tokenizer = model;
  EXPECT_EQ(error_of([&] { synthetic.validate(); }),
            "invalid value " + model +
                " for 'data.tokenizer': expected empty with data.kind synthetic (a tokenizer is for data.kind text "
                "or tokens)");
}

TEST_F(Trained, TextDatasetTilesTheEncodedDocument) {
  const fs::path file = kFortunes / "goedel";
  const Tokenizer t = Tokenizer::load(model_path().string());
  const std::vector<int32_t> ids = encode_document(t, read_text(file));
  constexpr int64_t kSeq = 32;
  const auto d = make_dataset(text_config(file.string(), model_path().string(), 512, kSeq));
  ASSERT_EQ(d->size(), static_cast<int64_t>((ids.size() - 1) / kSeq));
  EXPECT_NE(d->describe().find(with_commas(static_cast<int64_t>(ids.size())) + " tokens of " + model_path().string() +
                               " (vocab 512)"),
            std::string::npos)
      << d->describe();
  Tensor in = Tensor::empty({1, kSeq}, DType::I32);
  Tensor tgt = Tensor::empty({1, kSeq}, DType::I32);
  const int64_t last = d->size() - 1;
  const std::vector<int64_t> index{last};
  load_batch(*d, index, in, tgt);
  for (int64_t k = 0; k < kSeq; ++k) {
    EXPECT_EQ(in.data<int32_t>()[k], ids[static_cast<size_t>(last * kSeq + k)]);
    EXPECT_EQ(tgt.data<int32_t>()[k], ids[static_cast<size_t>(last * kSeq + k + 1)]);
  }
  load_batch(*d, std::vector<int64_t>{0}, in, tgt);
  EXPECT_EQ(in.data<int32_t>()[0], t.bos_id());
}

}  // namespace
}  // namespace st::dataset
