// safetensors reader/writer and CRC32C. Malformed files are crafted byte by
// byte here so each validation rule is exercised with a known cause, and each
// error must name the file (and the tensor, where there is one).
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

#include "checkpoint/checksum.h"
#include "checkpoint/index.h"
#include "checkpoint/safetensors.h"
#include "core/text.h"
#include "tests/harness/test_util.h"

namespace st::checkpoint {
namespace {

using st::test::count_wrong;
using st::test::error_of;
// Substring check without gmock (the test targets link plain gtest).
::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

std::span<const std::byte> bytes_of(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }
std::span<const std::byte> bytes_of(const Tensor& t) {
  return {static_cast<const std::byte*>(t.raw_data()), t.nbytes()};
}

// --- CRC32C ------------------------------------------------------------------------

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c(bytes_of("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c_software(bytes_of("123456789")), 0xE3069283u);
  std::vector<std::byte> zeros(32, std::byte{0}), ones(32, std::byte{0xFF});
  EXPECT_EQ(crc32c(zeros), 0x8A9136AAu);
  EXPECT_EQ(crc32c_software(zeros), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones), 0x62A8AB43u);
  EXPECT_EQ(crc32c_software(ones), 0x62A8AB43u);
  EXPECT_EQ(crc32c({}), 0u);
}

// One printed form everywhere (issue 36): the trainer printed decimal, ckpt verify bare hex.
TEST(Crc32c, PrintedAsZeroXAndEightHexDigits) {
  EXPECT_EQ(crc_text(0xE3069283u), "0xe3069283");
  EXPECT_EQ(crc_text(0x1a2bu), "0x00001a2b");
  EXPECT_EQ(crc_text(0), "0x00000000");
}

TEST(Crc32c, ChainedEqualsOneShot) {
  std::mt19937 rng(7);
  std::vector<std::byte> buf(1000);
  for (auto& b : buf) b = static_cast<std::byte>(rng());
  const uint32_t whole = crc32c(buf);
  for (size_t cut : {0, 1, 7, 8, 9, 500, 999, 1000}) {
    std::span<const std::byte> all(buf);
    EXPECT_EQ(crc32c(all.subspan(cut), crc32c(all.first(cut))), whole) << "cut " << cut;
    EXPECT_EQ(crc32c_software(all.subspan(cut), crc32c_software(all.first(cut))), whole) << "cut " << cut;
  }
}

TEST(Crc32c, CombineEqualsTheChecksumOfTheConcatenation) {
  std::mt19937 rng(11);
  std::vector<std::byte> buf(70000);
  for (auto& b : buf) b = static_cast<std::byte>(rng());
  std::span<const std::byte> all(buf);
  const uint32_t whole = crc32c_software(all);
  for (size_t cut : {size_t{0}, size_t{1}, size_t{3}, size_t{8}, size_t{4096}, size_t{65537}, buf.size()}) {
    const uint32_t a = crc32c_software(all.first(cut));
    const uint32_t b = crc32c_software(all.subspan(cut));
    EXPECT_EQ(crc32c_combine(a, b, buf.size() - cut), whole) << "cut " << cut;
  }
  // Three pieces, combined left to right.
  const uint32_t ab = crc32c_combine(crc32c(all.first(100)), crc32c(all.subspan(100, 900)), 900);
  EXPECT_EQ(crc32c_combine(ab, crc32c(all.subspan(1000)), buf.size() - 1000), whole);
}

TEST(Crc32c, ScanCountsNonFiniteFromTheFirstIndexGiven) {
  std::vector<float> src(50000, 1.5f);
  src[20000] = std::numeric_limits<float>::infinity();
  src[40000] = std::numeric_limits<float>::quiet_NaN();
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(src.data()), src.size() * sizeof(float));
  const TensorScan scanned = crc32c_and_scan(bytes, DType::F32, 0, 100);
  EXPECT_EQ(scanned.crc32c, crc32c_software(bytes));
  EXPECT_EQ(scanned.nonfinite.nan, 1);
  EXPECT_EQ(scanned.nonfinite.inf, 1);
  EXPECT_EQ(scanned.nonfinite.first, 20100);
}

TEST(Crc32c, HardwareMatchesSoftware) {
  if (!crc32c_hardware_available()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  std::mt19937 rng(11);
  for (size_t n : {1, 3, 7, 13, 63, 255, 1001, 4097, 24577, 24583, 49160, 65537, 200003}) {
    std::vector<std::byte> buf(n);
    for (auto& b : buf) b = static_cast<std::byte>(rng());
    // Odd start offsets too: the hardware loop must not assume alignment.
    std::span<const std::byte> s = std::span<const std::byte>(buf).subspan(n % 3);
    EXPECT_EQ(crc32c_hardware(s, 0x1234u), crc32c_software(s, 0x1234u)) << "length " << s.size();
    EXPECT_EQ(crc32c_hardware(s), crc32c_software(s)) << "length " << s.size();
  }
}

// --- safetensors ---------------------------------------------------------------------

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           format("st_safetensors_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string write_raw(const std::string& name, const std::string& bytes) const {
    std::string p = path(name);
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  static std::string le64(uint64_t v) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
    return s;
  }
  // A file whose header is exactly `header` followed by `data_bytes` zero bytes.
  std::string craft(const std::string& header, size_t data_bytes) const {
    return write_raw("bad.safetensors", le64(header.size()) + header + std::string(data_bytes, '\0'));
  }
  std::string open_error(const std::string& p) const {
    return error_of([&] { SafetensorsFile f(p); });
  }

  std::filesystem::path dir_;
};

TEST_F(Safetensors, RoundTripEveryDtypeAndShape) {
  const Tensor f32 = Tensor::from_vector<float>({1.5f, -2.25f, 3e-8f, 1e30f, -0.0f, 7.0f}, {2, 3});
  const Tensor bf16 = Tensor::from_floats(std::vector<float>{0.1f, -3.7f, 1e10f, 2.0f, -0.5f}, {5}, DType::BF16);
  const Tensor i32 = Tensor::from_vector<int32_t>({INT32_MIN, -1, 0, INT32_MAX}, {4, 1});
  const Tensor scalar = Tensor::from_vector<float>({42.5f}, {});
  const Tensor empty = Tensor::zeros({0}, DType::I32);
  const Tensor empty2d = Tensor::zeros({3, 0}, DType::BF16);
  SafetensorsWriter w;
  // Odd-sized BF16 first, so later tensors start at unaligned offsets.
  w.add("model.bf16", bf16);
  w.add("model.f32", f32);
  w.add("empty", empty);
  w.add("model.i32", i32);
  w.add("scalar", scalar);
  w.add("empty2d", empty2d);
  w.write(path("a.safetensors"));

  SafetensorsFile f(path("a.safetensors"));
  EXPECT_EQ(f.names(),
            (std::vector<std::string>{"model.bf16", "model.f32", "empty", "model.i32", "scalar", "empty2d"}));
  for (const auto& [name, want] : std::vector<std::pair<std::string, Tensor>>{{"model.bf16", bf16},
                                                                              {"model.f32", f32},
                                                                              {"empty", empty},
                                                                              {"model.i32", i32},
                                                                              {"scalar", scalar},
                                                                              {"empty2d", empty2d}}) {
    ASSERT_TRUE(f.has(name));
    EXPECT_EQ(f.info(name).dtype, want.dtype()) << name;
    EXPECT_EQ(f.info(name).shape, want.shape()) << name;
    EXPECT_EQ(f.info(name).nbytes, want.nbytes()) << name;
    const Tensor got = f.read_tensor(name);
    EXPECT_EQ(got.shape(), want.shape()) << name;
    EXPECT_EQ(count_wrong(got, want), 0) << name;
  }
  EXPECT_FALSE(f.has("missing"));
  EXPECT_EQ(f.info("scalar").shape, Shape{});
  EXPECT_EQ(f.info("empty").nbytes, 0u);
  EXPECT_TRUE(f.metadata().empty());
}

TEST_F(Safetensors, MetadataRoundTrip) {
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  w.set_metadata("step", "200");
  w.set_metadata("unicode", "h\xC3\xA9llo \"quoted\"\n");
  w.set_metadata("step", "300");  // replaces
  w.add("x", Tensor::full({2}, 1.0, DType::F32));
  w.write(path("m.safetensors"));
  SafetensorsFile f(path("m.safetensors"));
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{
                              {"format", "pt"}, {"step", "300"}, {"unicode", "h\xC3\xA9llo \"quoted\"\n"}}));
  EXPECT_EQ(f.names(), std::vector<std::string>{"x"});
}

TEST_F(Safetensors, PartialReadsAtOddRanges) {
  std::vector<int32_t> values(257);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int32_t>(i * 2654435761u);
  const Tensor t = Tensor::from_vector(values, {257});
  SafetensorsWriter w;
  w.add("pad", Tensor::full({3}, 1.0, DType::BF16));
  w.add("t", t);
  w.write(path("p.safetensors"));
  SafetensorsFile f(path("p.safetensors"));
  const auto* src = static_cast<const unsigned char*>(t.raw_data());
  for (auto [begin, n] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, 1}, {1, 3}, {5, 17}, {1027, 1}, {3, 1025}, {0, 1028}, {1028, 0}}) {
    std::vector<unsigned char> got(n + 1, 0xAB);
    f.read("t", begin, n, got.data());
    EXPECT_EQ(std::memcmp(got.data(), src + begin, n), 0) << begin << "+" << n;
    EXPECT_EQ(got[n], 0xAB) << "read past the requested range";
  }
  std::vector<unsigned char> buf(8);
  EXPECT_EQ(error_of([&] { f.read("t", 1025, 4, buf.data()); }),
            format("tensor 't' in file '{}': read of bytes [1025, 1025+4) is outside its 1028 bytes", f.path()));
  EXPECT_EQ(error_of([&] { f.read("nope", 0, 1, buf.data()); }), format("no tensor 'nope' in file '{}'", f.path()));
}

TEST_F(Safetensors, HeaderIsSpacePaddedToEightBytes) {
  for (const std::string name : {"a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh"}) {
    SafetensorsWriter w;
    w.add(name, Tensor::full({1}, 2.0, DType::BF16));
    const std::string p = path(name + ".safetensors");
    const auto written = w.write(p);
    std::ifstream in(p, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GE(bytes.size(), 8u);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i)
      n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[static_cast<size_t>(i)])) << (8 * i);
    EXPECT_EQ((8 + n) % 8, 0u) << name;
    EXPECT_EQ(bytes.size(), 8 + n + 2) << name;
    const std::string header = bytes.substr(8, n);
    const size_t close = header.rfind('}');
    ASSERT_NE(close, std::string::npos);
    EXPECT_EQ(header.substr(close + 1), std::string(n - close - 1, ' ')) << name;
    EXPECT_EQ(written.at(0).offset, 8 + n);
    EXPECT_EQ(SafetensorsFile(p).info(name).data_begin, 8 + n);
  }
}

TEST_F(Safetensors, WriterReportsOffsetsAndCrcs) {
  const Tensor a = Tensor::from_floats(std::vector<float>{1, 2, 3}, {3}, DType::BF16);
  const Tensor b = Tensor::from_vector<float>({4, 5, 6, 7}, {2, 2});
  const std::string raw = "\x01\x02\x03\x04\x05\x06\x07\x08";
  SafetensorsWriter w;
  w.add("a", a);
  w.add("b", b);
  w.add("raw", DType::I32, {2}, bytes_of(raw));
  const auto written = w.write(path("c.safetensors"));
  ASSERT_EQ(written.size(), 3u);
  EXPECT_EQ(written[0].name, "a");
  EXPECT_EQ(written[0].crc32c, crc32c(bytes_of(a)));
  EXPECT_EQ(written[1].crc32c, crc32c(bytes_of(b)));
  EXPECT_EQ(written[2].crc32c, crc32c(bytes_of(raw)));
  EXPECT_EQ(written[2].nbytes, 8u);
  SafetensorsFile f(path("c.safetensors"));
  for (const auto& wt : written) {
    EXPECT_EQ(f.info(wt.name).data_begin, wt.offset) << wt.name;
    std::vector<std::byte> back(wt.nbytes);
    f.read(wt.name, 0, wt.nbytes, back.data());
    EXPECT_EQ(crc32c(back), wt.crc32c) << wt.name;
  }
  EXPECT_EQ(f.file_size(), written.back().offset + 8);
}

TEST_F(Safetensors, WriterErrors) {
  SafetensorsWriter w;
  w.add("x", Tensor::full({1}, 1.0, DType::F32));
  EXPECT_EQ(error_of([&] { w.add("x", Tensor::full({2}, 1.0, DType::F32)); }),
            "SafetensorsWriter: duplicate tensor name 'x'");
  EXPECT_EQ(error_of([&] { w.add("u", Tensor()); }), "SafetensorsWriter: tensor 'u' is undefined");
  EXPECT_TRUE(contains(error_of([&] { w.add("__metadata__", Tensor::full({1}, 1.0, DType::F32)); }), "reserved"));
  const std::string three = "abc";
  EXPECT_EQ(error_of([&] { w.add("r", DType::F32, {1}, bytes_of(three)); }),
            "SafetensorsWriter: tensor 'r' of shape [1] and dtype F32 needs 4 bytes but 3 were given");
  const std::string p = path("no/such/dir/x.safetensors");
  EXPECT_EQ(error_of([&] { w.write(p); }), format("cannot create safetensors file '{}': No such file or directory", p));
  EXPECT_EQ(open_error(p), format("cannot open safetensors file '{}': No such file or directory", p));
}

// What the COMPLETE marker's header checksum covers: the length and the JSON, nothing of the data.
TEST_F(Safetensors, HeaderBytesAreTheLengthAndTheJson) {
  SafetensorsWriter w;
  w.add("a", Tensor::from_vector<float>({1, 2, 3}, {3}));
  const std::string p = path("h.safetensors");
  const auto written = w.write(p);
  std::ifstream in(p, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(read_header_bytes(p), bytes.substr(0, written.at(0).offset));
  const std::string shortened = write_raw("short.safetensors", le64(100) + "{}");
  EXPECT_EQ(error_of([&] { read_header_bytes(shortened); }),
            format("safetensors file '{}': header length 100 runs past the end of the file (10 bytes)", shortened));
  const std::string huge = write_raw("huge.safetensors", le64(UINT64_MAX) + "{}");
  EXPECT_TRUE(contains(error_of([&] { read_header_bytes(huge); }), "exceeds the limit"));
  EXPECT_TRUE(contains(error_of([&] { read_header_bytes(path("none.safetensors")); }), "none.safetensors"));
}

TEST_F(Safetensors, RejectsTruncatedFile) {
  const std::string p = write_raw("short.safetensors", std::string("\x05\0\0\0\0", 5));
  EXPECT_EQ(open_error(p),
            format("safetensors file '{}' is truncated: 5 bytes, too short for the 8-byte header length", p));
  EXPECT_TRUE(contains(open_error(write_raw("empty.safetensors", "")), "is truncated: 0 bytes"));
}

TEST_F(Safetensors, RejectsHeaderLengthPastEnd) {
  const std::string p = write_raw("len.safetensors", le64(100) + "{}");
  EXPECT_EQ(open_error(p),
            format("safetensors file '{}': header length 100 runs past the end of the file (10 bytes)", p));
}

TEST_F(Safetensors, RejectsHugeHeaderLength) {
  const std::string p = write_raw("huge.safetensors", le64(100'000'001) + "{}");
  EXPECT_EQ(open_error(p),
            format("safetensors file '{}': header length 100000001 exceeds the limit of 100000000 bytes", p));
  EXPECT_TRUE(contains(open_error(write_raw("max.safetensors", le64(UINT64_MAX) + "{}")), "exceeds the limit"));
}

TEST_F(Safetensors, RejectsNonUtf8Header) {
  const std::string p = craft("{\"a\xFF\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4);
  EXPECT_EQ(open_error(p),
            format("safetensors file '{}': header is not valid UTF-8 (byte 0xFF at header offset 3)", p));
  // Overlong '/' and a UTF-16 surrogate are rejected as well.
  EXPECT_TRUE(contains(open_error(craft("{\"\xC0\xAF\":1}", 0)), "byte 0xC0 at header offset 2"));
  EXPECT_TRUE(contains(open_error(craft("{\"\xED\xA0\x80\":1}", 0)), "byte 0xED at header offset 2"));
  EXPECT_EQ(find_invalid_utf8("h\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), -1);
  EXPECT_EQ(find_invalid_utf8("ab\xE2\x82"), 2);
}

TEST_F(Safetensors, RejectsNonObjectJson) {
  const std::string p = craft("[1, 2]  ", 0);
  EXPECT_EQ(open_error(p), format("safetensors file '{}': header is a JSON array, not an object", p));
  EXPECT_TRUE(contains(open_error(craft("{\"a\": ", 0)), "header is not valid JSON"));
  EXPECT_EQ(open_error(craft("{\"x\": [1]}", 0)),
            format("tensor 'x' in file '{}': entry is a JSON array, not an object", path("bad.safetensors")));
}

TEST_F(Safetensors, RejectsMissingOrExtraFields) {
  const std::string p = craft(R"({"x":{"dtype":"F32","shape":[1]}})", 4);
  EXPECT_EQ(open_error(p), format("tensor 'x' in file '{}': missing field 'data_offsets'", p));
  EXPECT_EQ(open_error(craft(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", 4)),
            format("tensor 'x' in file '{}': unexpected field 'extra'", p));
  EXPECT_EQ(open_error(craft(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4)),
            format("tensor 'x' in file '{}': 'data_offsets' must be two non-negative integers, got [0]", p));
  EXPECT_EQ(open_error(craft(R"({"__metadata__":{"k":1}})", 0)),
            format("safetensors file '{}': __metadata__ value for key 'k' is a JSON number, not a string", p));
}

TEST_F(Safetensors, RejectsUnknownDtype) {
  const std::string p = craft(R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8);
  EXPECT_EQ(open_error(p), format("unknown dtype 'F64' for tensor 'x' in file '{}' (supported: F32, BF16, I32)", p));
  EXPECT_TRUE(contains(open_error(craft(R"({"x":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})", 2)),
                       "unknown dtype 'F16' for tensor 'x'"));
}

TEST_F(Safetensors, RejectsBadShapes) {
  const std::string p = craft(R"({"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20);
  EXPECT_EQ(open_error(p),
            format("tensor 'x' in file '{}': shape [2, 3] of F32 needs 24 bytes but data_offsets span 20", p));
  EXPECT_EQ(open_error(craft(R"({"x":{"dtype":"F32","shape":[-1,2],"data_offsets":[0,0]}})", 0)),
            format("tensor 'x' in file '{}': shape [-1,2] has a negative dimension", p));
  EXPECT_EQ(open_error(craft(R"({"x":{"dtype":"F32","shape":[1.5],"data_offsets":[0,0]}})", 0)),
            format("tensor 'x' in file '{}': shape [1.5] must hold non-negative integers", p));
  EXPECT_TRUE(
      contains(open_error(craft(R"({"x":{"dtype":"I32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0)),
               "has too many elements"));
}

TEST_F(Safetensors, RejectsOverlappingOffsets) {
  const std::string p = craft(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      12);
  EXPECT_EQ(open_error(p),
            format("tensor 'b' in file '{}': data_offsets [4, 12] overlap tensor 'a', which ends at 8", p));
}

TEST_F(Safetensors, RejectsGapBetweenTensors) {
  const std::string p = craft(
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
      12);
  EXPECT_EQ(open_error(p),
            format("tensor 'b' in file '{}': data_offsets [8, 12] leave a gap of 4 bytes after tensor 'a'", p));
  EXPECT_EQ(open_error(craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)),
            format("tensor 'a' in file '{}': data_offsets [4, 8] leave a gap of 4 bytes after the header", p));
  EXPECT_EQ(open_error(craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 6)),
            format("safetensors file '{}': 2 unused bytes after tensor 'a' at the end of the data section", p));
}

TEST_F(Safetensors, RejectsDataPastTheEnd) {
  const std::string p = craft(
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}})",
      10);
  EXPECT_EQ(open_error(p),
            format("tensor 'b' in file '{}': data_offsets [4, 12] run past the end of the 10-byte data section", p));
}

TEST_F(Safetensors, AcceptsHandCraftedFile) {
  // Unpadded header, tensors listed out of data order, two empty tensors at one offset.
  std::string data(12, '\0');
  const float v = 1.25f;
  const int32_t i = -7;
  std::memcpy(data.data(), &i, 4);
  std::memcpy(data.data() + 4, &v, 4);
  std::memcpy(data.data() + 8, &v, 4);
  const std::string header =
      R"({"f":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"z2":{"dtype":"BF16","shape":[0,5],"data_offsets":[0,0]},)"
      R"("i":{"dtype":"I32","shape":[],"data_offsets":[0,4]},"z1":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
      R"("__metadata__":{"a":"b"}})";
  const std::string p = write_raw("ok.safetensors", le64(header.size()) + header + data);
  SafetensorsFile f(p);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"z1", "z2", "i", "f"}));
  EXPECT_EQ(f.read_tensor("i").data<int32_t>()[0], -7);
  EXPECT_EQ(f.read_tensor("f").to_floats(), (std::vector<float>{1.25f, 1.25f}));
  EXPECT_EQ(f.info("f").data_begin, 8 + header.size() + 4);
  EXPECT_EQ(f.metadata().at("a"), "b");
}

// Found by fuzz/fuzz_index.cpp: a sharded.index.json whose "version" or "format"
// has another JSON type escaped as nlohmann's type_error (the trainer's
// "internal error", naming no file); now an st::Error naming the index.
TEST_F(Safetensors, ShardedIndexFieldOfTheWrongTypeNamesTheIndex) {
  for (const std::string index : {R"({"format": "shardtrain-sharded", "version": "1", "tensors": {}, "chunks": []})",
                                  R"({"format": 7, "version": 1, "tensors": {}, "chunks": []})"}) {
    const std::string p = write_raw("sharded.index.json", index);
    const std::string err = error_of([&] { read_catalog(path("")); });
    EXPECT_TRUE(contains(err, format("checkpoint index '{}' is malformed: ", p))) << index;
    EXPECT_TRUE(contains(err, "type must be ")) << index;
  }
}

}  // namespace
}  // namespace st::checkpoint
