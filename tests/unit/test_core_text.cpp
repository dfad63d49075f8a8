// core/text.h (the strict UTF-8 check) and core/file.h (whole-file read and
// atomic write).
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/file.h"
#include "core/text.h"

namespace st {
namespace {

TEST(Utf8, AcceptsEveryLengthOfCharacter) {
  EXPECT_EQ(find_invalid_utf8(""), -1);
  EXPECT_EQ(find_invalid_utf8("plain ascii"), -1);
  EXPECT_EQ(find_invalid_utf8("h\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), -1);  // é € 😀
  EXPECT_EQ(find_invalid_utf8("\xED\x9F\xBF"), -1);                             // U+D7FF, below the surrogates
  EXPECT_EQ(find_invalid_utf8("\xEE\x80\x80"), -1);                             // U+E000, above them
  EXPECT_EQ(find_invalid_utf8("\xF4\x8F\xBF\xBF"), -1);                         // U+10FFFF, the last one
}

TEST(Utf8, RejectsOverlongsSurrogatesAndPastTheEnd) {
  EXPECT_EQ(find_invalid_utf8("a\xC0\xAF"), 1);         // overlong '/'
  EXPECT_EQ(find_invalid_utf8("ab\xC1\xBF"), 2);        // overlong U+007F
  EXPECT_EQ(find_invalid_utf8("\xE0\x9F\xBF"), 0);      // overlong U+07FF
  EXPECT_EQ(find_invalid_utf8("\xF0\x8F\xBF\xBF"), 0);  // overlong U+FFFF
  EXPECT_EQ(find_invalid_utf8("x\xED\xA0\x80"), 1);     // U+D800, a surrogate
  EXPECT_EQ(find_invalid_utf8("\xED\xBF\xBF"), 0);      // U+DFFF
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0);  // U+110000
  EXPECT_EQ(find_invalid_utf8("\xF5\x80\x80\x80"), 0);  // no lead byte at all
  EXPECT_EQ(find_invalid_utf8("ok\x80"), 2);            // a lone continuation byte
  EXPECT_EQ(find_invalid_utf8("\xC3\x28"), 0);          // a lead without its continuation
  EXPECT_EQ(find_invalid_utf8("\xFF"), 0);
}

TEST(Utf8, ACutSequenceAtTheEndIsAcceptedOnlyWhenAllowed) {
  EXPECT_EQ(find_invalid_utf8("ab\xE2\x82"), 2);
  EXPECT_EQ(find_invalid_utf8("ab\xE2\x82", Utf8End::MayBeCut), -1);
  EXPECT_EQ(find_invalid_utf8("ab\xF0", Utf8End::MayBeCut), -1);
  // What is there must still be right: a surrogate's first two bytes, cut.
  EXPECT_EQ(find_invalid_utf8("ab\xED\xA0", Utf8End::MayBeCut), 2);
  EXPECT_EQ(find_invalid_utf8("\xE2\x82x", Utf8End::MayBeCut), 0);
}

class FileTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("st_test_core_file_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

std::string error_of(const std::filesystem::path& path) {
  try {
    read_file(path, "config file");
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST_F(FileTest, WriteAtomicThenReadBack) {
  const std::filesystem::path p = dir_ / "a.txt";
  write_file_atomic(p, std::string("one\0two", 7));
  EXPECT_EQ(read_file(p, "file"), std::string("one\0two", 7));
  write_file_atomic(p, "replaced");
  EXPECT_EQ(read_file(p, "file"), "replaced");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "a.txt.tmp"));
}

TEST_F(FileTest, ReadErrorsNameTheFileAndWhy) {
  const std::filesystem::path missing = dir_ / "missing.yaml";
  EXPECT_EQ(error_of(missing), "cannot open config file '" + missing.string() + "': No such file or directory");
  EXPECT_EQ(error_of(dir_), "config file '" + dir_.string() + "' is not a regular file (a directory)");
  const std::filesystem::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  // Refused without blocking on the missing writer.
  EXPECT_EQ(error_of(fifo), "config file '" + fifo.string() + "' is not a regular file (a FIFO)");
}

}  // namespace
}  // namespace st
