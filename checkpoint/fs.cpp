#include "checkpoint/fs.h"

#include <algorithm>
#include <cstdio>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/format.h"

namespace st::checkpoint {

namespace fs = std::filesystem;

void rename_no_replace(const fs::path& from, const fs::path& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return;
  ST_CHECK(errno == EINVAL || errno == ENOSYS || errno == ENOTSUP, "cannot rename '{}' to '{}': {}", from.string(),
           to.string(), errno_text());
  // File systems without RENAME_NOREPLACE: rename(2) would replace an empty directory.
  std::error_code ec;
  ST_CHECK(!fs::exists(to, ec), "'{}' already exists", to.string());
  rename_path(from, to);
}

TempDir::TempDir(fs::path path) : path_(std::move(path)) {
  std::error_code ec;
  fs::remove_all(path_, ec);
  ST_CHECK(fs::create_directory(path_, ec) && !ec, "cannot create {}: {}", path_.string(), ec.message());
}

TempDir::TempDir(TempDir&& other) noexcept : path_(std::move(other.path_)), kept_(std::exchange(other.kept_, true)) {}

TempDir& TempDir::operator=(TempDir&& other) noexcept {
  if (this != &other) {
    remove_unless_kept();
    path_ = std::move(other.path_);
    kept_ = std::exchange(other.kept_, true);
  }
  return *this;
}

TempDir::~TempDir() { remove_unless_kept(); }

void TempDir::remove_unless_kept() noexcept {
  if (kept_) return;
  std::error_code ec;  // ignored: see the class comment
  fs::remove_all(path_, ec);
}

std::optional<std::string> read_small_file(const std::filesystem::path& path, std::string* problem) {
  auto fail = [&](std::string why) -> std::optional<std::string> {
    if (problem) *problem = format("{} {}", path.string(), why);
    return std::nullopt;
  };
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) return fail("cannot be opened: " + ec.message());
  if (!fs::exists(st)) return fail("does not exist");
  if (!fs::is_regular_file(st))
    return fail(fs::is_directory(st) ? "is a directory, not a file" : "is not a regular file");
  // The status above can be stale by the time the file opens (a FIFO put in
  // its place would block a plain open): open without blocking, check again.
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd.valid()) return fail("cannot be opened: " + errno_text(errno));
  struct stat fst {};
  if (::fstat(fd.get(), &fst) != 0 || !S_ISREG(fst.st_mode)) return fail("is not a regular file");
  constexpr size_t kMaxBytes = 1 << 20;  // a marker lists a few files; anything larger is not ours
  if (static_cast<uintmax_t>(fst.st_size) > kMaxBytes) return fail(format("has {} bytes, too many", fst.st_size));
  std::string text;
  char block[1 << 14];
  for (;;) {
    const ssize_t n = ::read(fd.get(), block, sizeof block);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("cannot be read: " + errno_text(errno));
    if (n == 0) return text;
    if (text.size() + static_cast<size_t>(n) > kMaxBytes) return fail("grew past 1 MiB while being read");
    text.append(block, static_cast<size_t>(n));
  }
}

std::string trim_space(std::string s) {
  const char* space = " \t\r\n";
  s.erase(0, std::min(s.find_first_not_of(space), s.size()));
  s.erase(s.find_last_not_of(space) + 1);
  return s;
}

}  // namespace st::checkpoint
