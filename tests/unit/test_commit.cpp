// Checkpoint commit protocol: names, the COMPLETE marker, `latest`, resume
// fallback, retention, and crash safety; and fs.h's TempDir, which the ckpt
// tool publishes its output through. The crash tests fork a child that
// SIGKILLs itself at each stage of a commit (through the commit hook) and then
// check, in the parent, what a restarted job would see.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint/checksum.h"
#include "checkpoint/commit.h"
#include "checkpoint/fs.h"
#include "checkpoint/resume.h"
#include "checkpoint/state.h"
#include "checkpoint/topology.h"
#include "core/error.h"
#include "tests/harness/test_util.h"

namespace st::checkpoint {
namespace {

namespace fs = std::filesystem;
using st::test::error_of;

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

/// A fresh directory under the system temp dir, removed at the end of the test.
class TempRoot {
 public:
  TempRoot() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() / ("st_test_commit-" + std::to_string(::getpid()) + "-" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempRoot() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

/// `bytes` (>= 16) bytes that start like a safetensors file: the 8-byte
/// length of an 8-byte header ("{}" and spaces), then `fill` standing for
/// tensor data. The COMPLETE marker checksums the header; the data's CRCs
/// would live in an index.
std::string safetensors_like(size_t bytes, char fill = 'm') {
  EXPECT_GE(bytes, 16u);
  std::string out("\x08\0\0\0\0\0\0\0{}      ", 16);
  return out + std::string(bytes > 16 ? bytes - 16 : 0, fill);
}

std::string crc_hex_of(const std::string& text) {
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", crc32c(std::as_bytes(std::span(text.data(), text.size()))));
  return hex;
}

/// Writes two files into the pending checkpoint, the first of `bytes` bytes; returns their names.
std::vector<std::string> write_payload(const PendingCheckpoint& pending, size_t bytes) {
  write_text(pending.path() / "model.safetensors", safetensors_like(bytes));
  write_text(pending.path() / "trainer_state.json", std::string(bytes / 2 + 1, 's'));
  return {"model.safetensors", "trainer_state.json"};
}

void save(const fs::path& root, int64_t step, size_t bytes = 100) {
  PendingCheckpoint pending(root, step);
  pending.commit(write_payload(pending, bytes));
}

// A same-size edit of a file the marker lists with a checksum (trainer_state.json)
// makes the checkpoint incomplete, naming the file; so does one of a
// safetensors header. Tensor data is left to the index's CRCs.
TEST(Commit, SameSizeEditOfAChecksummedFileIsCaught) {
  TempRoot tmp;
  const fs::path root = tmp.path() / "ckpt";
  save(root, 5);
  const fs::path dir = root / "step-000005";
  ASSERT_EQ(incomplete_reason(dir, 5), "");
  write_text(dir / "trainer_state.json", std::string(51, 't'));  // same size, other bytes
  const std::string reason = incomplete_reason(dir, 5);
  EXPECT_TRUE(contains(reason, "trainer_state.json fails its checksum in COMPLETE")) << reason;
  write_text(dir / "trainer_state.json", std::string(51, 's'));  // restored
  EXPECT_EQ(incomplete_reason(dir, 5), "");
  write_text(dir / "model.safetensors", safetensors_like(100, 'x'));  // the tensors' CRCs live in the index
  EXPECT_EQ(incomplete_reason(dir, 5), "");
  std::string swapped = safetensors_like(100, 'x');
  swapped.replace(8, 2, "[]");  // same size, another header
  write_text(dir / "model.safetensors", swapped);
  EXPECT_EQ(incomplete_reason(dir, 5),
            format("model.safetensors: its header fails its checksum in COMPLETE (crc32c 0x{}, COMPLETE lists 0x{}): "
                   "the file was changed after the save",
                   crc_hex_of(swapped.substr(0, 16)), crc_hex_of(safetensors_like(16))));
}

TEST(Commit, StepNamesRoundTrip) {
  EXPECT_EQ(step_dir_name(200), "step-000200");
  EXPECT_EQ(step_dir_name(0), "step-000000");
  EXPECT_EQ(step_dir_name(1234567), "step-1234567");
  for (int64_t step : {0L, 7L, 200L, 999999L, 1000000L, 123456789012L})
    EXPECT_EQ(parse_step_dir_name(step_dir_name(step)), step);
  for (const char* bad : {"step-200", "step-0000200", "step-00020a", "step-", "latest", ".tmp-step-000200-1",
                          "step-000200x", "Step-000200"})
    EXPECT_EQ(parse_step_dir_name(bad), std::nullopt) << bad;
  EXPECT_TRUE(contains(error_of([] { step_dir_name(-1); }), "-1"));
}

TEST(Commit, CommitCreatesStepDirMarkerAndLatest) {
  TempRoot tmp;
  fs::path root = tmp.path() / "ckpt" / "llama";  // created by PendingCheckpoint
  std::vector<std::string> names;
  {
    PendingCheckpoint pending(root, 200);
    EXPECT_EQ(pending.path().filename().string(), ".tmp-step-000200-" + std::to_string(::getpid()));
    EXPECT_TRUE(fs::is_directory(pending.path()));
    names = write_payload(pending, 100);
    pending.commit(names);
    EXPECT_TRUE(pending.committed());
    EXPECT_FALSE(fs::exists(pending.path()));
    EXPECT_TRUE(contains(error_of([&] { pending.commit(names); }), "already committed"));
  }
  fs::path dir = root / "step-000200";
  EXPECT_EQ(fs::file_size(dir / "model.safetensors"), 100u);
  std::string marker = read_text(dir / "COMPLETE");
  EXPECT_TRUE(contains(marker, "step 200\n"));
  // Safetensors: listed with the CRC32C of its header (the length and the JSON).
  EXPECT_TRUE(contains(marker, "head 100 " + crc_hex_of(safetensors_like(16)) + " model.safetensors\n")) << marker;
  // Not safetensors: listed with its whole-file CRC32C.
  const std::string state(51, 's');
  char sum[64];
  std::snprintf(sum, sizeof sum, "sum 51 %08x trainer_state.json\n",
                crc32c(std::as_bytes(std::span(state.data(), state.size()))));
  EXPECT_TRUE(contains(marker, sum)) << marker;
  EXPECT_EQ(read_text(root / "latest"), "step-000200\n");
  EXPECT_FALSE(fs::exists(root / ".latest.tmp"));
  EXPECT_EQ(incomplete_reason(dir, 200), "");
  EXPECT_EQ(complete_steps(root), std::vector<int64_t>{200});
}

TEST(Commit, ListedFileMustExistAndErrorNamesIt) {
  TempRoot tmp;
  PendingCheckpoint pending(tmp.path(), 5);
  std::string msg = error_of([&] { pending.commit({"nope.safetensors"}); });
  EXPECT_TRUE(contains(msg, (pending.path() / "nope.safetensors").string()));
  EXPECT_TRUE(contains(error_of([&] { pending.commit({"../escape"}); }), "plain file name"));
}

TEST(Commit, UncommittedPendingIsRemovedAndLatestUnchanged) {
  TempRoot tmp;
  save(tmp.path(), 100);
  fs::path temp_dir;
  {
    PendingCheckpoint pending(tmp.path(), 200);
    write_payload(pending, 100);
    temp_dir = pending.path();
  }
  EXPECT_FALSE(fs::exists(temp_dir));
  EXPECT_FALSE(fs::exists(tmp.path() / "step-000200"));
  EXPECT_EQ(read_text(tmp.path() / "latest"), "step-000100\n");
}

TEST(Commit, ResaveOfSameStepReplacesIt) {
  TempRoot tmp;
  save(tmp.path(), 200, 100);
  save(tmp.path(), 200, 300);
  EXPECT_EQ(fs::file_size(tmp.path() / "step-000200" / "model.safetensors"), 300u);
  EXPECT_EQ(complete_steps(tmp.path()), std::vector<int64_t>{200});
  int tmp_dirs = 0;
  for (const auto& entry : fs::directory_iterator(tmp.path()))
    tmp_dirs += entry.path().filename().string().starts_with(".tmp-");
  EXPECT_EQ(tmp_dirs, 0);
}

TEST(Resume, GoodLatest) {
  TempRoot tmp;
  save(tmp.path(), 100);
  save(tmp.path(), 200);
  auto choice = choose_resume(tmp.path());
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->step, 200);
  EXPECT_EQ(choice->path, (tmp.path() / "step-000200").string());
  EXPECT_EQ(choice->note, "");
}

TEST(Resume, LatestNamesDirWithoutMarker) {
  TempRoot tmp;
  save(tmp.path(), 200);
  save(tmp.path(), 300);
  fs::remove(tmp.path() / "step-000300" / "COMPLETE");
  auto choice = choose_resume(tmp.path());
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->step, 200);
  EXPECT_EQ(choice->note, "latest names step-000300, which is incomplete (missing COMPLETE marker); using step-000200");
}

TEST(Resume, LatestNamesDirWithTruncatedFile) {
  TempRoot tmp;
  save(tmp.path(), 200);
  save(tmp.path(), 300);
  fs::resize_file(tmp.path() / "step-000300" / "model.safetensors", 10);
  auto choice = choose_resume(tmp.path());
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->step, 200);
  EXPECT_TRUE(contains(choice->note, "model.safetensors has 10 bytes, COMPLETE lists 100"));
  EXPECT_EQ(complete_steps(tmp.path()), std::vector<int64_t>{200});
}

TEST(Resume, TornOrEditedMarkerIsIncomplete) {
  TempRoot tmp;
  save(tmp.path(), 300);
  fs::path marker = tmp.path() / "step-000300" / "COMPLETE";
  std::string text = read_text(marker);
  write_text(marker, text.substr(0, text.size() / 2));
  EXPECT_TRUE(contains(incomplete_reason(tmp.path() / "step-000300", 300), "COMPLETE marker"));
  std::string edited = text;
  edited.replace(edited.find("head 100"), 8, "head 101");
  write_text(marker, edited);
  EXPECT_EQ(incomplete_reason(tmp.path() / "step-000300", 300), "COMPLETE marker fails its crc32c check");
  EXPECT_EQ(choose_resume(tmp.path()), std::nullopt);
}

TEST(Resume, GarbageLatest) {
  TempRoot tmp;
  save(tmp.path(), 100);
  write_text(tmp.path() / "latest", "hello\n");
  auto choice = choose_resume(tmp.path());
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->step, 100);
  EXPECT_TRUE(contains(choice->note, "holds 'hello', not a step-NNNNNN name; using step-000100"));
}

TEST(Resume, LatestNamesMissingDir) {
  TempRoot tmp;
  save(tmp.path(), 100);
  write_text(tmp.path() / "latest", "step-000900\n");
  auto choice = choose_resume(tmp.path());
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->step, 100);
  EXPECT_EQ(choice->note, "latest names step-000900, which does not exist; using step-000100");
}

TEST(Resume, MissingLatest) {
  TempRoot tmp;
  save(tmp.path(), 100);
  save(tmp.path(), 200);
  fs::remove(tmp.path() / "latest");
  auto choice = choose_resume(tmp.path());
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->step, 200);
  EXPECT_TRUE(contains(choice->note, "latest does not exist; using step-000200"));
}

// `latest` that is not a regular file is reported like a missing one and never
// opened: a FIFO would block the reader forever, a directory reads as empty.
TEST(Resume, LatestThatIsNotARegularFileFallsBack) {
  TempRoot tmp;
  save(tmp.path(), 100);
  save(tmp.path(), 200);
  const fs::path latest = tmp.path() / "latest";
  struct Case {
    std::function<void()> make;
    std::string note;
  };
  const std::string l = latest.string();
  const std::vector<Case> cases = {
      {[&] { fs::create_directory(latest); }, l + " is a directory, not a file; using step-000200"},
      {[&] { ASSERT_EQ(::mkfifo(latest.c_str(), 0644), 0); }, l + " is not a regular file; using step-000200"},
      {[&] { fs::create_symlink(tmp.path() / "nowhere", latest); }, l + " does not exist; using step-000200"},
      {[&] { fs::create_symlink(latest, latest); },
       l + " cannot be opened: Too many levels of symbolic links; using step-000200"},
  };
  for (const Case& c : cases) {
    fs::remove_all(latest);
    c.make();
    auto choice = choose_resume(tmp.path());
    ASSERT_TRUE(choice);
    EXPECT_EQ(choice->step, 200);
    EXPECT_EQ(choice->note, c.note);
  }
}

// A step directory that cannot be opened (a symlink loop) is not complete; latest
// naming it falls back to the newest complete one.
TEST(Resume, StepDirectoryThatCannotBeOpenedFallsBack) {
  TempRoot tmp;
  save(tmp.path(), 100);
  fs::create_symlink(tmp.path() / "step-000200", tmp.path() / "step-000200");
  write_text(tmp.path() / "latest", "step-000200\n");
  EXPECT_EQ(incomplete_reason(tmp.path() / "step-000200", 200),
            "directory cannot be opened: Too many levels of symbolic links");
  EXPECT_EQ(complete_steps(tmp.path()), std::vector<int64_t>{100});
  auto choice = choose_resume(tmp.path());
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->step, 100);
  EXPECT_EQ(choice->note,
            "latest names step-000200, which is incomplete (directory cannot be opened: Too many levels of symbolic "
            "links); using step-000100");
  // A COMPLETE marker that is a FIFO makes its directory incomplete without blocking.
  save(tmp.path(), 300);
  fs::remove(tmp.path() / "step-000300" / "COMPLETE");
  ASSERT_EQ(::mkfifo((tmp.path() / "step-000300" / "COMPLETE").c_str(), 0644), 0);
  EXPECT_TRUE(contains(
      incomplete_reason(tmp.path() / "step-000300", 300),
      "COMPLETE marker unusable: " + (tmp.path() / "step-000300" / "COMPLETE").string() + " is not a regular file"));
}

TEST(Resume, NothingAtAll) {
  TempRoot tmp;
  EXPECT_EQ(choose_resume(tmp.path()), std::nullopt);
  EXPECT_EQ(choose_resume(tmp.path() / "never-created"), std::nullopt);
  fs::create_directories(tmp.path() / "step-000100");  // no marker
  write_text(tmp.path() / "latest", "step-000100\n");
  EXPECT_EQ(choose_resume(tmp.path()), std::nullopt);
  EXPECT_TRUE(complete_steps(tmp.path()).empty());
}

TEST(Resolve, RootStandsForTheCheckpointLatestNames) {
  TempRoot tmp;
  const std::string root = tmp.path().string();
  save(tmp.path(), 100);
  save(tmp.path(), 200);
  ResolvedDir r = resolve_checkpoint_dir(root);
  EXPECT_EQ(r.path, (tmp.path() / "step-000200").string());
  EXPECT_EQ(r.note, root + ": using step-000200 (named by latest)");
  EXPECT_FALSE(r.fell_back);
  // A checkpoint directory stands for itself.
  r = resolve_checkpoint_dir((tmp.path() / "step-000100").string());
  EXPECT_EQ(r.path, (tmp.path() / "step-000100").string());
  EXPECT_EQ(r.note, "");
  // latest names an incomplete checkpoint: the older complete one, said as a fallback.
  fs::remove(tmp.path() / "step-000200" / "COMPLETE");
  r = resolve_checkpoint_dir(root);
  EXPECT_EQ(r.path, (tmp.path() / "step-000100").string());
  EXPECT_TRUE(r.fell_back);
  EXPECT_EQ(r.note,
            root + ": latest names step-000200, which is incomplete (missing COMPLETE marker); using step-000100");
  EXPECT_TRUE(r.latest_damaged);  // ckpt verify ROOT fails on it
  // Step directories without latest still make a root (a first save killed before `latest` was written).
  fs::remove(tmp.path() / "latest");
  r = resolve_checkpoint_dir(root);
  EXPECT_EQ(r.path, (tmp.path() / "step-000100").string());
  EXPECT_TRUE(r.fell_back);
  EXPECT_FALSE(r.latest_damaged);
}

TEST(Resolve, NotADirectoryOrNoCompleteCheckpointIsAnError) {
  TempRoot tmp;
  const std::string missing = (tmp.path() / "missing").string();
  EXPECT_EQ(error_of([&] { resolve_checkpoint_dir(missing); }), missing + " is not a directory");
  fs::create_directories(tmp.path() / "step-000100");  // no marker
  write_text(tmp.path() / "latest", "step-000100\n");
  const std::string root = tmp.path().string();
  EXPECT_EQ(error_of([&] { resolve_checkpoint_dir(root); }),
            root + " is a checkpoint root without a complete checkpoint");
}

// ---- the one check every way into a checkpoint applies (check_checkpoint) --------

// What --resume PATH, init_from, generate and ckpt convert used to skip: a
// COMPLETE marker that is edited, empty, a FIFO or a directory, and a
// same-size edit of trainer_state.json. Each is refused naming the file.
TEST(CheckCheckpoint, RefusesEveryDamagedMarkerNamingIt) {
  TempRoot tmp;
  save(tmp.path(), 30);
  const fs::path dir = tmp.path() / "step-000030";
  const fs::path marker = dir / "COMPLETE";
  const std::string good = read_text(marker);
  EXPECT_EQ(check_checkpoint(dir).problem, "");
  EXPECT_EQ(check_checkpoint(dir).step, 30);
  std::string edited = good;
  edited.replace(edited.find("step 30"), 7, "step 20");
  const std::vector<std::pair<std::function<void()>, std::string>> cases = {
      {[&] { write_text(marker, edited); }, "COMPLETE marker fails its crc32c check"},
      {[&] { write_text(marker, ""); }, "COMPLETE marker is truncated (no crc32c line)"},
      {[&] { ASSERT_EQ(::mkfifo(marker.c_str(), 0644), 0); }, marker.string() + " is not a regular file"},
      {[&] { fs::create_directory(marker); }, marker.string() + " is a directory, not a file"},
      {[&] { fs::remove(marker); }, "missing COMPLETE marker"},
  };
  for (const auto& [damage, want] : cases) {
    fs::remove(marker);
    damage();
    const CheckedCheckpoint checked = check_checkpoint(dir);
    EXPECT_TRUE(contains(checked.problem, want)) << want;
    EXPECT_EQ(error_of([&] { require_checkpoint(dir); }),
              format("checkpoint {} is damaged or incomplete: {}", dir.string(), checked.problem));
  }
  fs::remove(marker);
  write_text(marker, good);
  std::string state = read_text(dir / "trainer_state.json");
  state[0] = 'S';  // same size
  write_text(dir / "trainer_state.json", state);
  EXPECT_TRUE(contains(check_checkpoint(dir).problem, "trainer_state.json fails its checksum in COMPLETE (crc32c 0x"));
}

// Copied elsewhere under another name, a checkpoint is checked against its
// marker's step; a directory with neither marker nor trainer_state.json is a
// model directory, which has nothing of ours to check.
TEST(CheckCheckpoint, AnyDirectoryNameAndModelDirectories) {
  TempRoot tmp;
  save(tmp.path(), 30);
  fs::rename(tmp.path() / "step-000030", tmp.path() / "copy");
  const CheckedCheckpoint copy = check_checkpoint(tmp.path() / "copy");
  EXPECT_EQ(copy.problem, "");
  EXPECT_EQ(copy.step, 30);
  EXPECT_FALSE(copy.model_dir);
  fs::create_directory(tmp.path() / "hf");
  write_text(tmp.path() / "hf" / "model.safetensors", safetensors_like(32));
  EXPECT_TRUE(check_checkpoint(tmp.path() / "hf").model_dir);
  EXPECT_EQ(check_checkpoint(tmp.path() / "hf").problem, "");
  // Named as a step directory it must be one.
  fs::rename(tmp.path() / "hf", tmp.path() / "step-000040");
  EXPECT_EQ(check_checkpoint(tmp.path() / "step-000040").problem, "missing COMPLETE marker");
  EXPECT_EQ(check_checkpoint(tmp.path() / "nothing").problem,
            (tmp.path() / "nothing").string() + " is not a directory");
}

// Markers of earlier versions give some files' sizes alone: still loadable,
// their files named in a note; trainer_state.json's step must still agree.
TEST(CheckCheckpoint, MarkersOfEarlierVersionsLoadWithANote) {
  const CheckedCheckpoint v1 = check_checkpoint("tests/fixtures/ckpt-v1-unified");
  EXPECT_EQ(v1.problem, "");
  EXPECT_EQ(v1.step, 2);
  EXPECT_EQ(v1.unchecked.size(), 6u);
  EXPECT_TRUE(contains(v1.unchecked_note("D"),
                       "D was saved by an earlier version: its COMPLETE marker gives no "
                       "checksum for 6 file(s) (model-00001-of-00001.safetensors, "));
  EXPECT_TRUE(contains(v1.unchecked_note("D"), "`ckpt convert` writes a copy with checksums of every byte"));
  TempRoot tmp;
  const fs::path dir = tmp.path() / "v1";
  fs::copy("tests/fixtures/ckpt-v1-unified", dir);
  std::string state = read_text(dir / "trainer_state.json");
  state.replace(state.find("\"step\": 2"), 9, "\"step\": 1");  // same size
  write_text(dir / "trainer_state.json", state);
  EXPECT_EQ(check_checkpoint(dir).problem,
            "trainer_state.json is for step 1, but COMPLETE for step 2: the file was changed after the save");
  // Today's markers check every file.
  save(tmp.path(), 30);
  EXPECT_TRUE(check_checkpoint(tmp.path() / "step-000030").unchecked.empty());
  EXPECT_EQ(check_checkpoint(tmp.path() / "step-000030").unchecked_note("x"), "");
}

// A full disk while `latest` is replaced: the step is committed, and the error says so and what `latest` names.
TEST(Commit, FailureToReplaceLatestSaysWhatWasCommitted) {
  TempRoot tmp;
  save(tmp.path(), 5);
  PendingCheckpoint pending(tmp.path(), 10, [&](std::string_view stage) {
    // /dev/full fails every write with ENOSPC: .latest.tmp is written through the link.
    if (stage == "old_step_removed") fs::create_symlink("/dev/full", tmp.path() / ".latest.tmp");
  });
  const std::vector<std::string> files = write_payload(pending, 100);
  const std::string error = error_of([&] { pending.commit(files); });
  const std::string step10 = (tmp.path() / "step-000010").string();
  EXPECT_TRUE(contains(error, "No space left on device")) << error;
  EXPECT_TRUE(contains(error, format("; {} is complete (step 10 was committed), but {} still names step-000005: the "
                                     "next --resume auto starts from there, --resume {} from the committed step",
                                     step10, (tmp.path() / "latest").string(), step10)))
      << error;
  EXPECT_EQ(read_text(tmp.path() / "latest"), "step-000005\n");
  EXPECT_EQ(check_checkpoint(step10).problem, "");
}

TEST(TempDir, RemovedWithItsContentsUnlessKept) {
  TempRoot tmp;
  const fs::path dropped = tmp.path() / ".out.tmp-1";
  {
    TempDir dir(dropped);
    EXPECT_EQ(dir.path(), dropped);
    ASSERT_TRUE(fs::is_directory(dropped));
    fs::create_directories(dropped / "sub");
    write_text(dropped / "sub" / "a.safetensors", "data");
  }
  EXPECT_FALSE(fs::exists(dropped));

  const fs::path kept = tmp.path() / ".out.tmp-2";
  {
    TempDir dir(kept);
    write_text(kept / "COMPLETE", "marker");
    dir.keep();
  }
  EXPECT_EQ(read_text(kept / "COMPLETE"), "marker");
}

TEST(TempDir, DebrisOfTheSameNameIsReplacedByAnEmptyDirectory) {
  TempRoot tmp;
  const fs::path path = tmp.path() / ".out.tmp-3";
  fs::create_directories(path / "old");
  write_text(path / "old" / "shard.safetensors", "stale");
  TempDir dir(path);
  EXPECT_TRUE(fs::is_directory(path));
  EXPECT_TRUE(fs::is_empty(path));
}

TEST(TempDir, MovingHandsOverTheDirectory) {
  TempRoot tmp;
  const fs::path first = tmp.path() / ".first";
  const fs::path second = tmp.path() / ".second";
  {
    TempDir outer(first);
    {
      TempDir inner(std::move(outer));
      EXPECT_EQ(inner.path(), first);
    }
    EXPECT_FALSE(fs::exists(first));  // removed by the owner it was moved to
    fs::create_directories(first);    // no longer outer's
  }
  EXPECT_TRUE(fs::is_directory(first));  // the moved-from owner removes nothing
  fs::remove_all(first);

  TempDir a(first);
  TempDir b(second);
  a = std::move(b);  // a's own directory goes; it now owns second
  EXPECT_FALSE(fs::exists(first));
  EXPECT_EQ(a.path(), second);
  EXPECT_TRUE(fs::is_directory(second));
}

TEST(TempDir, ErrorNamesThePath) {
  TempRoot tmp;
  const fs::path path = tmp.path() / "no-such-parent" / ".out.tmp-4";
  EXPECT_TRUE(contains(error_of([&] { TempDir dir(path); }), "cannot create " + path.string() + ": "));
  EXPECT_FALSE(fs::exists(path));
}

TEST(TrainerStateFile, RoundTripsEveryField) {
  TrainerState s;
  s.step = 42;
  s.consumed_samples = 336;
  s.optimizer_steps = 41;
  s.world_size = 4;
  s.sharding_strategy = "HYBRID_SHARD";
  s.format = "sharded";
  s.model_dtype = "BF16";
  s.model_weights = false;
  s.master_weights = true;
  s.seed = 1234;
  s.schedule = ScheduleState{"cosine", 60, 2.5e-4};
  s.config_yaml = "model:\n  name: llama\n";
  const TrainerState back = parse_trainer_state(trainer_state_text(s), "x");
  EXPECT_EQ(trainer_state_text(back), trainer_state_text(s));
  EXPECT_EQ(back.step, 42);
  EXPECT_EQ(back.consumed_samples, 336);
  EXPECT_EQ(back.optimizer_steps, 41);
  EXPECT_EQ(back.sharding_strategy, "HYBRID_SHARD");
  ASSERT_TRUE(back.schedule);
  EXPECT_EQ(back.schedule->next_lr, 2.5e-4);
  EXPECT_EQ(back.config_yaml, s.config_yaml);
}

TEST(TrainerStateFile, CorruptCountsAreNamed) {
  const std::string ok = R"({"step": 3, "consumed_samples": 24, "optimizer_steps": 3})";
  EXPECT_EQ(parse_trainer_state(ok, "f").step, 3);
  EXPECT_EQ(error_of([] { parse_trainer_state(R"({"step": -5, "consumed_samples": 0, "optimizer_steps": 0})", "f"); }),
            "f is corrupt: 'step' is -5, expected a non-negative integer");
  EXPECT_EQ(
      error_of([] { parse_trainer_state(R"({"step": 1e30, "consumed_samples": 0, "optimizer_steps": 0})", "f"); }),
      "f is corrupt: 'step' is 1e+30, expected a non-negative integer");
  EXPECT_EQ(error_of([] { parse_trainer_state(R"({"step": 1, "optimizer_steps": 0})", "f"); }),
            "f lacks 'consumed_samples'");
  EXPECT_EQ(error_of([] { parse_trainer_state("[1, 2]", "f"); }), "f is not a JSON object");
  EXPECT_TRUE(contains(error_of([] { parse_trainer_state("{", "f"); }), "f is not valid JSON"));
  EXPECT_EQ(error_of([] {
              parse_trainer_state(R"({"step": 1, "consumed_samples": 0, "optimizer_steps": 0, "world_size": "x"})",
                                  "f");
            }),
            "f is corrupt: 'world_size' is \"x\", of the wrong type");
  // Found by fuzz/fuzz_trainer_state.cpp: a float where an integer belongs was cast
  // to int64_t, undefined behaviour beyond its range (UBSan: 8e+47 is outside
  // the range of 'long'); now refused naming the key.
  EXPECT_EQ(error_of([] {
              parse_trainer_state(R"({"step": 1, "consumed_samples": 0, "optimizer_steps": 0, "rng": {"seed": 8e47}})",
                                  "f");
            }),
            "f is corrupt: 'seed' is 8e+47, expected an integer");
  EXPECT_EQ(error_of([] {
              parse_trainer_state(R"({"step": 1, "consumed_samples": 0, "optimizer_steps": 0, "world_size": 2.0})",
                                  "f");
            }),
            "f is corrupt: 'world_size' is 2.0, expected an integer");
}

TEST(TrainerStateFile, ReadsTheFilesOfAnEarlierVersion) {
  // Written by commit f069d83's trainer (tests/fixtures/ckpt-v1-*): step 2 of a 1-rank FULL_SHARD run.
  for (const char* dir : {"tests/fixtures/ckpt-v1-unified", "tests/fixtures/ckpt-v1-sharded"}) {
    const TrainerState s = read_trainer_state(dir);
    EXPECT_EQ(s.step, 2) << dir;
    EXPECT_EQ(s.consumed_samples, 4) << dir;
    EXPECT_EQ(s.optimizer_steps, 2) << dir;
    EXPECT_EQ(s.world_size, 1) << dir;
    EXPECT_EQ(s.sharding_strategy, "FULL_SHARD") << dir;
    EXPECT_EQ(s.seed, 1234) << dir;
    ASSERT_TRUE(s.schedule) << dir;
    EXPECT_EQ(s.schedule->total_steps, 4) << dir;
  }
  EXPECT_EQ(read_trainer_state("tests/fixtures/ckpt-v1-unified").format, "unified");
  EXPECT_EQ(read_trainer_state("tests/fixtures/ckpt-v1-sharded").format, "sharded");
  EXPECT_EQ(read_trainer_state_if_present("tests"), std::nullopt);
}

// ---- one resume decision for the job (resume.h) ----------------------------

RootView view_of(std::string host, std::vector<StepView> steps, std::optional<int64_t> latest) {
  RootView v;
  v.host = std::move(host);
  v.steps = std::move(steps);
  v.latest = latest;
  if (!latest) v.latest_problem = "/r/latest does not exist";
  return v;
}

TEST(DecideResume, FreshOnlyWhenNoRankSeesAStepDirectory) {
  const fs::path root = "/r";
  const std::vector<RootView> none = {view_of("a", {}, {}), view_of("b", {}, {})};
  const ResumePlan fresh = decide_resume(root, none);
  EXPECT_EQ(fresh.action, ResumePlan::Action::Fresh);
  EXPECT_TRUE(fresh.candidates.empty());
  // Rank 1 sees a checkpoint that rank 0 does not: starting over would lose it.
  const std::vector<RootView> one = {view_of("a", {}, {}), view_of("b", {{10, ""}}, 10)};
  const ResumePlan plan = decide_resume(root, one);
  EXPECT_EQ(plan.action, ResumePlan::Action::Refuse);
  EXPECT_TRUE(contains(plan.error, "the ranks do not see the same checkpoints in /r"));
  EXPECT_TRUE(contains(plan.error, "rank 0 on host a sees no step directory (it would start from step 0)"));
  EXPECT_TRUE(contains(plan.error, "\n  rank 1 on host b sees: step-000010 (complete)"));
}

// `latest` names a step, but no step directory is there (deleted, or renamed
// step-30): a committed checkpoint is gone, so starting from step 0 would hide it.
TEST(DecideResume, LatestNamingAStepWhenNoStepDirectoryIsThereIsAnError) {
  const std::vector<RootView> views = {view_of("a", {}, 30), view_of("b", {}, 30)};
  const ResumePlan plan = decide_resume("/r", views);
  EXPECT_EQ(plan.action, ResumePlan::Action::Refuse);
  EXPECT_TRUE(contains(plan.error,
                       "--resume auto: /r/latest names step-000030, but /r holds no step directory (it "
                       "was deleted, moved or renamed)\nNothing was trained or deleted. To go on: restore "
                       "step-000030 and run the same command again"))
      << plan.error;
  // On disk: the step directory renamed.
  TempRoot tmp;
  save(tmp.path(), 30);
  fs::rename(tmp.path() / "step-000030", tmp.path() / "step-30");
  const RootView view = view_root(tmp.path());
  EXPECT_EQ(decide_resume(tmp.path(), std::span<const RootView>(&view, 1)).action, ResumePlan::Action::Refuse);
}

TEST(DecideResume, StepDirectoriesOfWhichNoneIsCompleteAreAnError) {
  const std::vector<RootView> views = {view_of(
      "a", {{10, "COMPLETE marker is missing"}, {20, "master_weights-00001-of-00001.safetensors is missing"}}, 20)};
  const ResumePlan plan = decide_resume("/r", views);
  EXPECT_EQ(plan.action, ResumePlan::Action::Refuse);
  EXPECT_EQ(plan.error,
            "--resume auto: /r holds step directories, but none is a complete checkpoint that loads:\n"
            "  step-000020: master_weights-00001-of-00001.safetensors is missing\n"
            "  step-000010: COMPLETE marker is missing\n"
            "Nothing was trained or deleted. To go on: restore the missing or damaged files and run the same command "
            "again; or resume from another checkpoint with --resume PATH; or start over with --overwrite (moves the "
            "step directories into /r/overwritten-<UTC time>/).");
}

TEST(DecideResume, FallsBackPastADamagedNewestWithAWarning) {
  const std::vector<RootView> views = {view_of("a", {{5, ""}, {10, ""}, {20, "x is missing"}}, 20),
                                       view_of("b", {{5, ""}, {10, ""}, {20, "x is missing"}}, 20)};
  const ResumePlan plan = decide_resume("/r", views);
  EXPECT_EQ(plan.action, ResumePlan::Action::Load);
  EXPECT_EQ(plan.candidates, (std::vector<int64_t>{10, 5}));
  EXPECT_EQ(plan.warnings, std::vector<std::string>{
                               "latest names step-000020, which is incomplete (x is missing); using step-000010"});
  // Without `latest`, every skipped step is named with why.
  const std::vector<RootView> no_latest = {view_of("a", {{10, ""}, {20, "x is missing"}, {30, "y is missing"}}, {})};
  EXPECT_EQ(decide_resume("/r", no_latest).warnings,
            (std::vector<std::string>{"/r/latest does not exist; using step-000010",
                                      "skipping step-000030 (y is missing); resuming from step-000010",
                                      "skipping step-000020 (x is missing); resuming from step-000010"}));
}

TEST(DecideResume, EveryRankMustSeeTheChosenStep) {
  const RootView lead = view_of("a", {{10, ""}, {20, ""}}, 20);
  // Rank 1 lacks a file of step 20: the job stops, naming rank 1 and what it sees.
  std::vector<RootView> views = {lead, lead, view_of("c", {{10, ""}, {20, "x is missing"}}, 20)};
  ResumePlan plan = decide_resume("/r", views);
  EXPECT_EQ(plan.action, ResumePlan::Action::Refuse);
  EXPECT_TRUE(contains(plan.error,
                       "rank 0 on host a would resume step-000020\n  rank 2 on host c sees: "
                       "step-000010 (complete), step-000020 (incomplete: x is missing)\n"));
  EXPECT_FALSE(contains(plan.error, "rank 1"));
  // A rank that could not list the root takes part and is named.
  views[2] = lead;
  views[1].error = "cannot list checkpoint directory /r: Permission denied";
  views[1].steps.clear();
  plan = decide_resume("/r", views);
  EXPECT_EQ(plan.action, ResumePlan::Action::Refuse);
  EXPECT_TRUE(contains(plan.error, "rank 1 on host a sees: cannot list checkpoint directory /r: Permission denied"));
  // A rank seeing a newer complete step than rank 0 chose is a disagreement too.
  views[1] = view_of("b", {{10, ""}, {20, ""}, {30, ""}}, 20);
  EXPECT_EQ(decide_resume("/r", views).action, ResumePlan::Action::Refuse);
  // Older differences only narrow the fallbacks.
  views[1] = view_of("b", {{5, "gone"}, {10, ""}, {20, ""}}, 20);
  views[0] = view_of("a", {{5, ""}, {10, ""}, {20, ""}}, 20);
  plan = decide_resume("/r", views);
  EXPECT_EQ(plan.action, ResumePlan::Action::Load);
  EXPECT_EQ(plan.candidates, (std::vector<int64_t>{20, 10}));
  EXPECT_TRUE(plan.warnings.empty());
}

TEST(DecideResume, ViewsTravelAsJson) {
  RootView v = view_of("host-1", {{10, ""}, {20, "a \"quoted\" reason"}}, 20);
  EXPECT_EQ(view_from_json(view_to_json(v)), v);
  v = view_of("h", {}, {});
  v.error = "cannot list";
  EXPECT_EQ(view_from_json(view_to_json(v)), v);
  EXPECT_TRUE(contains(error_of([] { view_from_json("{\"host\": 1}"); }), "malformed"));
}

TEST(DecideResume, ViewOfARootOnDisk) {
  TempRoot tmp;
  save(tmp.path(), 100);
  save(tmp.path(), 200);
  fs::remove(tmp.path() / "step-000200" / "model.safetensors");
  fs::remove(tmp.path() / "step-000200" / "trainer_state.json");
  const RootView v = view_root(tmp.path(), "h");
  EXPECT_EQ(v.latest, 200);
  ASSERT_EQ(v.steps.size(), 2u);
  EXPECT_EQ(v.steps[0], (StepView{100, ""}));
  EXPECT_EQ(v.steps[1], (StepView{200, "2 files are missing: model.safetensors, trainer_state.json"}));
  EXPECT_TRUE(view_root(tmp.path() / "never-created").steps.empty());
  EXPECT_TRUE(view_root(tmp.path() / "never-created").error.empty());
  write_text(tmp.path() / "file", "x");
  EXPECT_TRUE(view_root(tmp.path() / "file").error.empty());  // not a directory: holds nothing
}

TEST(ResumeAuto, FallsBackOnDamageOnlyAndTriesEachOnce) {
  TempRoot tmp;
  auto group = make_local_group();
  for (int64_t step : {100, 200, 300}) save(tmp.path(), step);
  const std::string s100 = (tmp.path() / "step-000100").string(), s200 = (tmp.path() / "step-000200").string(),
                    s300 = (tmp.path() / "step-000300").string();
  std::vector<std::string> tried, warned;
  auto warn = [&](const std::string& m) { warned.push_back(m); };
  // The newest fails its checksum: the next older one loads, and the damaged one is reported.
  auto damaged_300 = [&](const std::string& path) {
    tried.push_back(path);
    if (path == s300) ST_FAIL("checksum mismatch in '{}'", path);
  };
  const AutoResumed r = resume_auto(tmp.path(), damaged_300, warn, *group);
  EXPECT_EQ(r.path, s200);
  EXPECT_EQ(r.damaged, (std::map<int64_t, std::string>{{300, "does not load: checksum mismatch in '" + s300 + "'"}}));
  EXPECT_EQ(tried, (std::vector<std::string>{s300, s200}));
  ASSERT_EQ(warned.size(), 1u);
  EXPECT_EQ(warned[0], s300 + " does not load (checksum mismatch in '" + s300 + "'); falling back to " + s200);
  // A misfit ends it at once: an older checkpoint would not fit either.
  tried.clear();
  auto misfit = [&](const std::string& path) {
    tried.push_back(path);
    throw Misfit("checkpoint does not fit this run", __FILE__, __LINE__);
  };
  EXPECT_EQ(error_of([&] { resume_auto(tmp.path(), misfit, warn, *group); }), "checkpoint does not fit this run");
  EXPECT_EQ(tried, (std::vector<std::string>{s300}));
  // Every one damaged: each tried once, then one error naming every step and why.
  tried.clear();
  auto all_damaged = [&](const std::string& path) {
    tried.push_back(path);
    ST_FAIL("damaged {}", path);
  };
  const std::string error = error_of([&] { resume_auto(tmp.path(), all_damaged, warn, *group); });
  EXPECT_EQ(tried, (std::vector<std::string>{s300, s200, s100}));
  EXPECT_TRUE(contains(error,
                       "holds step directories, but none is a complete checkpoint that loads:\n  step-000300: "
                       "does not load: damaged " +
                           s300 + "\n  step-000200: does not load: damaged " + s200));
  // No step directory: a fresh start, nothing tried.
  TempRoot empty;
  tried.clear();
  EXPECT_EQ(resume_auto(empty.path(), all_damaged, warn, *group).path, std::nullopt);
  EXPECT_TRUE(tried.empty());
  // Step directories, none complete: an error, nothing tried.
  fs::create_directories(empty.path() / "step-000100");
  EXPECT_TRUE(contains(error_of([&] { resume_auto(empty.path(), all_damaged, warn, *group); }),
                       "step-000100: missing COMPLETE marker"));
  EXPECT_TRUE(tried.empty());
}

TEST(Retention, KeepsNewestAndLatestTarget) {
  TempRoot tmp;
  for (int64_t step : {100, 200, 300, 400, 500}) save(tmp.path(), step);
  const std::set<int64_t> ours = {100, 200, 300, 400, 500};
  EXPECT_TRUE(apply_retention(tmp.path(), {0, 0, ours, {}}).deleted.empty());
  EXPECT_EQ(complete_steps(tmp.path()), (std::vector<int64_t>{100, 200, 300, 400, 500}));

  write_text(tmp.path() / "latest", "step-000200\n");                 // e.g. the user pointed latest back
  fs::create_directories(tmp.path() / ".tmp-step-000600-999999999");  // debris of a killed run
  fs::create_directories(tmp.path() / "step-000050");                 // incomplete: not ours to delete
  PendingCheckpoint ours_pending(tmp.path(), 600);                    // this process's save in progress
  // The deleted checkpoints are reported (for the run's log); debris is not; the incomplete one is kept and named.
  const RetentionResult r = apply_retention(tmp.path(), {2, 0, ours, {}});
  EXPECT_EQ(r.deleted, (std::vector<std::string>{"step-000100", "step-000300"}));
  ASSERT_EQ(r.kept_damaged.size(), 1u);
  EXPECT_TRUE(contains(r.kept_damaged[0], "step-000050 (missing COMPLETE marker"));
  EXPECT_EQ(complete_steps(tmp.path()), (std::vector<int64_t>{200, 400, 500}));
  EXPECT_FALSE(fs::exists(tmp.path() / ".tmp-step-000600-999999999"));
  EXPECT_TRUE(fs::exists(ours_pending.path()));
  EXPECT_TRUE(fs::exists(tmp.path() / "step-000050"));

  write_text(tmp.path() / "latest", "step-000500\n");
  EXPECT_EQ(apply_retention(tmp.path(), {1, 0, ours, {}}).deleted,
            (std::vector<std::string>{"step-000200", "step-000400"}));
  EXPECT_EQ(complete_steps(tmp.path()), std::vector<int64_t>{500});
}

TEST(Retention, NeverDeletesTheWayBack) {
  TempRoot tmp;
  for (int64_t step : {10, 20, 30}) save(tmp.path(), step);
  // Nothing committed by this run yet: nothing is deleted.
  EXPECT_TRUE(apply_retention(tmp.path(), {1, 10, {}, {}}).deleted.empty());
  // Resumed from 10, committed 11: 10 may go; 20 and 30 are newer than where the run started and not ours.
  save(tmp.path(), 11);
  EXPECT_EQ(apply_retention(tmp.path(), {1, 10, {11}, {}}).deleted, std::vector<std::string>{"step-000010"});
  EXPECT_EQ(complete_steps(tmp.path()), (std::vector<int64_t>{11, 20, 30}));
  // Committed 12 too: 11 (ours) goes; 12 is the newest of ours, 20 and 30 stay.
  save(tmp.path(), 12);
  EXPECT_EQ(apply_retention(tmp.path(), {1, 10, {11, 12}, {}}).deleted, std::vector<std::string>{"step-000011"});
  EXPECT_EQ(complete_steps(tmp.path()), (std::vector<int64_t>{12, 20, 30}));
  // A step known not to load is kept, not counted, and named.
  const RetentionResult r = apply_retention(tmp.path(), {1, 10, {11, 12}, {{30, "does not load: checksum"}}});
  EXPECT_EQ(r.kept_damaged, std::vector<std::string>{"step-000030 (does not load: checksum)"});
  EXPECT_TRUE(r.deleted.empty());
  EXPECT_EQ(read_text(tmp.path() / "latest"), "step-000030\n");  // never moved back to 11 or 12
}

TEST(Commit, LatestNeverMovesBackPastAnExistingStep) {
  TempRoot tmp;
  save(tmp.path(), 20);
  fs::remove(tmp.path() / "step-000020" / "model.safetensors");  // damaged, but there
  PendingCheckpoint p11(tmp.path(), 11);
  p11.commit(write_payload(p11, 20));
  EXPECT_EQ(p11.latest_kept(), 20);
  EXPECT_EQ(read_text(tmp.path() / "latest"), "step-000020\n");
  fs::remove_all(tmp.path() / "step-000020");  // gone: nothing to go back to, latest may move
  PendingCheckpoint p12(tmp.path(), 12);
  p12.commit(write_payload(p12, 20));
  EXPECT_EQ(p12.latest_kept(), std::nullopt);
  EXPECT_EQ(read_text(tmp.path() / "latest"), "step-000012\n");
}

// ---- crash safety ---------------------------------------------------------

/// Where the child process kills itself: a commit stage, or one of the points
/// while it is still writing files (before commit() starts).
struct KillPoint {
  std::string stage;  // a commit_stages() name, or "wrote_first_file" / "wrote_all_files"
};

std::vector<KillPoint> kill_points() {
  std::vector<KillPoint> points = {{"wrote_first_file"}, {"wrote_all_files"}};
  for (std::string_view stage : commit_stages()) points.push_back({std::string(stage)});
  return points;
}

/// Forks a child that saves `step` (files of `bytes` bytes) into `root` and
/// SIGKILLs itself at `point`; returns true when it died of SIGKILL.
bool save_in_child_and_kill(const fs::path& root, int64_t step, size_t bytes, const std::string& point) {
  pid_t pid = ::fork();
  if (pid == 0) {
    // Child: no gtest assertions here; report only through the exit status.
    try {
      auto die_at = [&](std::string_view stage) {
        if (stage == point) ::raise(SIGKILL);
      };
      PendingCheckpoint pending(root, step, die_at);
      write_text(pending.path() / "model.safetensors", safetensors_like(bytes));
      die_at("wrote_first_file");
      write_text(pending.path() / "trainer_state.json", std::string(bytes / 2 + 1, 's'));
      die_at("wrote_all_files");
      pending.commit({"model.safetensors", "trainer_state.json"});
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

int stage_index(const std::string& stage) {
  auto stages = commit_stages();
  for (size_t i = 0; i < stages.size(); ++i)
    if (stages[i] == stage) return static_cast<int>(i);
  return -1;
}

TEST(CrashSafety, StagesAreDistinctAndReported) {
  TempRoot tmp;
  std::vector<std::string> seen;
  PendingCheckpoint pending(tmp.path(), 1, [&](std::string_view s) { seen.emplace_back(s); });
  pending.commit(write_payload(pending, 20));
  ASSERT_EQ(seen.size(), commit_stages().size());
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], commit_stages()[i]);
  EXPECT_GE(kill_points().size(), 10u);
}

TEST(CrashSafety, KillAtEveryStageOfNewSave) {
  int latest_renamed = stage_index("latest_renamed");
  int renamed = stage_index("renamed");
  for (const KillPoint& point : kill_points()) {
    SCOPED_TRACE("killed at " + point.stage);
    TempRoot tmp;
    save(tmp.path(), 100);
    ASSERT_TRUE(save_in_child_and_kill(tmp.path(), 200, 100, point.stage));
    int k = stage_index(point.stage);  // -1 for the points before commit()
    bool new_is_latest = k >= latest_renamed;
    EXPECT_EQ(read_text(tmp.path() / "latest"), new_is_latest ? "step-000200\n" : "step-000100\n");
    auto choice = choose_resume(tmp.path());
    ASSERT_TRUE(choice);
    EXPECT_EQ(choice->step, new_is_latest ? 200 : 100);
    EXPECT_EQ(choice->note, "");  // latest always names a complete checkpoint
    EXPECT_EQ(incomplete_reason(choice->path, choice->step), "");
    std::vector<int64_t> want = {100};
    if (k >= renamed) want.push_back(200);
    EXPECT_EQ(complete_steps(tmp.path()), want);
    // The next run cleans up the dead child's temporary directory.
    apply_retention(tmp.path(), RetentionRules{});
    for (const auto& entry : fs::directory_iterator(tmp.path()))
      EXPECT_FALSE(entry.path().filename().string().starts_with(".tmp-")) << entry.path();
  }
}

TEST(CrashSafety, KillAtEveryStageOfResaveOfLatestStep) {
  int renamed = stage_index("renamed");
  for (const KillPoint& point : kill_points()) {
    SCOPED_TRACE("killed at " + point.stage);
    TempRoot tmp;
    save(tmp.path(), 100);
    save(tmp.path(), 200, 100);
    ASSERT_TRUE(save_in_child_and_kill(tmp.path(), 200, 300, point.stage));
    EXPECT_EQ(read_text(tmp.path() / "latest"), "step-000200\n");
    auto choice = choose_resume(tmp.path());
    ASSERT_TRUE(choice);
    // step-000200 is complete at every instant: old contents until the swap, new after.
    EXPECT_EQ(choice->step, 200);
    EXPECT_EQ(choice->note, "");
    int k = stage_index(point.stage);
    EXPECT_EQ(fs::file_size(tmp.path() / "step-000200" / "model.safetensors"), k >= renamed ? 300u : 100u);
  }
}

// ---- Shared or node-local checkpoint.dir (topology.h) ----

TEST(StorageTopology, HostsInTheOrderOfTheirLowestRank) {
  const std::vector<std::string> hosts{"b", "b", "a", "b", "a"};
  const StorageTopology t = group_hosts(hosts);
  EXPECT_EQ(t.hosts, (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(t.host_of_rank, (std::vector<int>{0, 0, 1, 0, 1}));
  EXPECT_EQ(t.ranks_of_host(0), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(t.ranks_of_host(1), (std::vector<int>{2, 4}));
  EXPECT_TRUE(t.leads_host(0));
  EXPECT_FALSE(t.leads_host(1));
  EXPECT_TRUE(t.leads_host(2));
  EXPECT_FALSE(t.leads_host(4));
}

TEST(StorageTopology, SharedWhenEveryRankSeesEveryHostsToken) {
  const std::vector<std::string> hosts{"h1", "h1", "h2", "h2"};
  const std::vector<std::set<int>> seen(4, std::set<int>{0, 1});
  const StorageTopology t = classify_storage("/ckpt", hosts, seen);
  EXPECT_TRUE(t.shared);
  EXPECT_EQ(t.describe("/ckpt"), "checkpoint.dir /ckpt: one file system shared by the 2 hosts h1, h2 (detected)");
}

TEST(StorageTopology, NodeLocalWhenEachHostSeesOnlyItsOwn) {
  const std::vector<std::string> hosts{"h1", "h1", "h2", "h2"};
  const std::vector<std::set<int>> seen{{0}, {0}, {1}, {1}};
  const StorageTopology t = classify_storage("/local/ckpt", hosts, seen);
  EXPECT_FALSE(t.shared);
  EXPECT_EQ(t.describe("/local/ckpt"),
            "checkpoint.dir /local/ckpt: node-local, each of the 2 hosts h1, h2 has its own (detected)");
}

TEST(StorageTopology, AMixOfSharedAndLocalIsAnErrorNamingWhatEachRankSees) {
  // h1 and h2 share a file system, h3 has its own.
  const std::vector<std::string> hosts{"h1", "h2", "h3"};
  const std::vector<std::set<int>> seen{{0, 1}, {0, 1}, {2}};
  const std::string e = error_of([&] { classify_storage("/ck", hosts, seen); });
  EXPECT_NE(e.find("checkpoint.dir '/ck' is neither shared by all hosts nor separate on each"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 0 on h1 sees the files of h1, h2; rank 1 on h2 sees the files of h1, h2; rank 2 on h3 "
                   "sees the files of h3"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("checkpoint.shared: true | false"), std::string::npos) << e;
  // A rank that saw nothing at all (not even its own host's token).
  const std::vector<std::set<int>> blind{{0}, {}, {2}};
  EXPECT_NE(error_of([&] { classify_storage("/ck", hosts, blind); }).find("rank 1 on h2 sees the files of no host"),
            std::string::npos);
}

// ---- --resume auto over node-local roots (merge_host_views) ----

StepView part_of(int64_t step, std::vector<std::string> held, std::vector<std::string> away) {
  return {step, "holds one host's part: ...", true, std::move(held), std::move(away)};
}

TEST(NodeLocalResume, TwoHostsPartsMakeOneCompleteStep) {
  RootView h1{"h1", "", {part_of(10, {"a", "idx"}, {"b"})}, 10, ""};
  RootView h2{"h2", "", {part_of(10, {"b", "idx"}, {"a"})}, 10, ""};
  const std::vector<RootView> hosts{h1, h2};
  const RootView merged = merge_host_views(hosts);
  ASSERT_EQ(merged.steps.size(), 1u);
  EXPECT_EQ(merged.steps[0].problem, "");
  EXPECT_EQ(merged.latest, 10);
  EXPECT_EQ(merged.host, "the hosts h1, h2");
}

TEST(NodeLocalResume, AMissingHostsFilesAreNamed) {
  // Two hosts saved; only h1 takes part (h2's disk is lost): h2's files are on none of the hosts.
  const std::vector<RootView> hosts{RootView{"h1", "", {part_of(10, {"a"}, {"b", "c"})}, 10, "", true}};
  const RootView merged = merge_host_views(hosts);
  EXPECT_EQ(merged.steps[0].problem,
            "2 file(s) are on none of these hosts: b, c (the hosts that saved them must take part, or the files be "
            "copied to one that does)");
}

TEST(NodeLocalResume, ADamagedPartIsNamedWithItsHost) {
  RootView h1{"h1", "", {part_of(10, {"a"}, {"b"}), part_of(20, {"a"}, {"b"})}, 20, ""};
  RootView h2{
      "h2", "", {part_of(10, {"b"}, {"a"}), StepView{20, "b is missing (No such file)", false, {}, {}}}, 20, ""};
  const std::vector<RootView> hosts{h1, h2};
  const RootView merged = merge_host_views(hosts);
  ASSERT_EQ(merged.steps.size(), 2u);
  EXPECT_EQ(merged.steps[0].problem, "");
  // The damaged part counts for nothing, so its file is missing too.
  EXPECT_EQ(merged.steps[1].problem.substr(0, 82),
            "on host h2: b is missing (No such file); 1 file(s) are on none of these hosts: b (");
}

TEST(NodeLocalResume, DecisionFallsBackAndANewEmptyHostAddsNothing) {
  StorageTopology t = group_hosts(std::vector<std::string>{"h1", "h1", "h2", "h3"});
  t.shared = false;
  RootView h1{"h1", "", {part_of(10, {"a"}, {"b"}), part_of(20, {"a"}, {"b"})}, 20, ""};
  RootView h2{"h2", "", {part_of(10, {"b"}, {"a"})}, 10, ""};  // step 20's part never reached h2
  RootView h3{"h3", "", {}, std::nullopt, "does not exist"};   // a new host, empty disk
  const std::vector<RootView> views{h1, h1, h2, h3};
  const ResumePlan plan = decide_resume("/ck", views, t);
  ASSERT_EQ(plan.action, ResumePlan::Action::Load) << plan.error;
  EXPECT_EQ(plan.candidates, (std::vector<int64_t>{10}));
  ASSERT_FALSE(plan.warnings.empty());
  EXPECT_NE(plan.warnings[0].find("step-000020"), std::string::npos) << plan.warnings[0];
  // Only new hosts: a fresh start.
  const std::vector<RootView> empty{h3, h3, h3, h3};
  EXPECT_EQ(decide_resume("/ck", empty, t).action, ResumePlan::Action::Fresh);
}

TEST(NodeLocalResume, RanksOfOneHostMustAgree) {
  StorageTopology t = group_hosts(std::vector<std::string>{"h1", "h1", "h2"});
  t.shared = false;
  RootView h1{"h1", "", {part_of(10, {"a"}, {"b"})}, 10, ""};
  RootView odd{"h1", "", {}, std::nullopt, "does not exist"};
  RootView h2{"h2", "", {part_of(10, {"b"}, {"a"})}, 10, ""};
  const std::vector<RootView> views{h1, odd, h2};
  const ResumePlan plan = decide_resume("/ck", views, t);
  ASSERT_EQ(plan.action, ResumePlan::Action::Refuse);
  EXPECT_NE(plan.error.find("rank 1 on host h1 sees: no step directory in /ck"), std::string::npos) << plan.error;
}

TEST(NodeLocalResume, ViewStepReadsAPartAndCopiedFilesCount) {
  TempRoot tmp;
  const fs::path dir = tmp.path() / "step-000010";
  fs::create_directories(dir);
  std::ofstream(dir / "a.json") << "{}";
  {
    std::ofstream marker(dir / "COMPLETE", std::ios::binary);
    marker << complete_marker_text(dir, 10, {"a.json"}, {"b.safetensors"});
  }
  StepView v = view_step(dir, 10);
  EXPECT_TRUE(v.part);
  EXPECT_EQ(v.held, (std::vector<std::string>{"a.json"}));
  EXPECT_EQ(v.away, (std::vector<std::string>{"b.safetensors"}));
  EXPECT_EQ(v.problem,
            "holds one host's part: 1 file(s) are on other hosts (b.safetensors); run on those hosts too, or copy the "
            "files here from their step-000010");
  std::ofstream(dir / "b.safetensors") << "x";  // copied here from the other host
  v = view_step(dir, 10);
  EXPECT_FALSE(v.part);
  EXPECT_EQ(v.problem, "");
}

}  // namespace
}  // namespace st::checkpoint
