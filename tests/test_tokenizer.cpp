// Tokenizers (launch/tokenizer.h): the byte-level stand-in; a SentencePiece
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
#include "launch/config.h"
#include "launch/data.h"
#include "launch/tokenizer.h"
#include "tests/test_util.h"

namespace st::launch {
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
}  // namespace st::launch
