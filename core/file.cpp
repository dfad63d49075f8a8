#include "core/file.h"

#include <algorithm>
#include <system_error>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/format.h"

namespace st {

namespace fs = std::filesystem;

namespace {

// Linux transfers at most ~2 GiB per read/write call; staying below that keeps
// one code path for every size and lets a short transfer be retried cleanly.
constexpr size_t kMaxChunk = size_t{1} << 30;

}  // namespace

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

std::string absolute_note(const fs::path& path) {
  if (path.empty() || path.is_absolute()) return {};
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  return ec ? std::string() : format(" ({})", absolute.lexically_normal().string());
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);  // errors here cannot be reported; close_checked() reports them
}

void UniqueFd::close_checked(const fs::path& path) {
  const int rc = ::close(release());
  ST_CHECK(rc == 0, "cannot close '{}': {}", path.string(), errno_text());
}

void write_all(int fd, const void* data, size_t n, const std::string& what) {
  const auto* p = static_cast<const std::byte*>(data);
  while (n > 0) {
    const ssize_t got = ::write(fd, p, std::min(n, kMaxChunk));
    if (got < 0 && errno == EINTR) continue;
    ST_CHECK(got >= 0, "writing {} failed: {}", what, errno_text());
    ST_CHECK(got > 0, "writing {} failed: write returned 0 bytes", what);
    p += got;
    n -= static_cast<size_t>(got);
  }
}

void pwrite_all(int fd, const void* data, size_t n, uint64_t offset, const std::string& what) {
  const auto* p = static_cast<const std::byte*>(data);
  while (n > 0) {
    const ssize_t got = ::pwrite(fd, p, std::min(n, kMaxChunk), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    ST_CHECK(got >= 0, "writing {} failed: {}", what, errno_text());
    ST_CHECK(got > 0, "writing {} failed: pwrite returned 0 bytes", what);
    p += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
}

void fsync_fd(int fd, const std::string& what) {
  ST_CHECK(::fsync(fd) == 0, "cannot fsync {}: {}", what, errno_text());
}

void fsync_path(const fs::path& path, PathKind kind) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | (kind == PathKind::Directory ? O_DIRECTORY : 0)));
  ST_CHECK(fd.valid(), "cannot open '{}' to fsync it: {}", path.string(), errno_text());
  fsync_fd(fd.get(), format("'{}'", path.string()));
  fd.close_checked(path);
}

void write_file_synced(const fs::path& path, std::string_view content, const std::function<void()>& after_write) {
  // open_output_file: a FIFO left at the path (a temporary name too) is refused instead of blocking the open.
  UniqueFd fd = open_output_file(path, "file", OutputMode::Truncate);
  write_all(fd.get(), content.data(), content.size(), format("'{}'", path.string()));
  if (after_write) after_write();
  fsync_fd(fd.get(), format("'{}'", path.string()));
  fd.close_checked(path);
}

void rename_path(const fs::path& from, const fs::path& to) {
  ST_CHECK(::rename(from.c_str(), to.c_str()) == 0, "cannot rename '{}' to '{}': {}", from.string(), to.string(),
           errno_text());
}

namespace {

// "a FIFO", "a directory", ...: what a file that is not a regular one is.
const char* kind_of(mode_t mode) {
  return S_ISDIR(mode)                    ? "a directory"
         : S_ISFIFO(mode)                 ? "a FIFO"
         : S_ISCHR(mode) || S_ISBLK(mode) ? "a device"
         : S_ISSOCK(mode)                 ? "a socket"
                                          : "not a file";
}

// Whether an output may be a file of `mode`: a regular file or a character
// device (/dev/null, /dev/full), never a FIFO, socket, directory or disk.
bool writable_kind(mode_t mode) { return S_ISREG(mode) || S_ISCHR(mode); }

// Clears O_NONBLOCK (set only so that the open could not block).
void make_blocking(int fd, const fs::path& path, const std::string& what) {
  const int flags = ::fcntl(fd, F_GETFL);
  ST_CHECK(flags >= 0 && ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0, "cannot use {} '{}': {}", what, path.string(),
           errno_text(errno));
}

}  // namespace

UniqueFd open_regular_file(const std::filesystem::path& path, const std::string& what) {
  // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  ST_CHECK(fd.valid(), "cannot open {} '{}': {}", what, path.string(), errno_text(errno));
  struct stat st {};
  ST_CHECK(::fstat(fd.get(), &st) == 0, "cannot stat {} '{}': {}", what, path.string(), errno_text(errno));
  ST_CHECK(S_ISREG(st.st_mode), "{} '{}' is not a regular file ({})", what, path.string(), kind_of(st.st_mode));
  make_blocking(fd.get(), path, what);
  return fd;
}

void check_output_path(const std::filesystem::path& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // missing (or unreadable): the writer's own open says why
  ST_CHECK(writable_kind(st.st_mode), "{} '{}' is not a regular file ({})", what, path.string(), kind_of(st.st_mode));
}

UniqueFd open_output_file(const std::filesystem::path& path, const std::string& what, OutputMode mode) {
  // Checked before the open for the message: a FIFO without a reader fails a
  // non-blocking open with ENXIO, which would not say what the file is.
  check_output_path(path, what);
  const int flags =
      O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (mode == OutputMode::Append ? O_APPEND : O_TRUNC);
  UniqueFd fd(::open(path.c_str(), flags, 0644));
  ST_CHECK(fd.valid(), "cannot open {} '{}': {}", what, path.string(), errno_text(errno));
  // Checked again on what was opened: the path may have been replaced in between.
  struct stat st {};
  ST_CHECK(::fstat(fd.get(), &st) == 0, "cannot stat {} '{}': {}", what, path.string(), errno_text(errno));
  ST_CHECK(writable_kind(st.st_mode), "{} '{}' is not a regular file ({})", what, path.string(), kind_of(st.st_mode));
  make_blocking(fd.get(), path, what);
  return fd;
}

std::string read_file(const fs::path& path, const std::string& what) {
  const UniqueFd fd = open_regular_file(path, what);
  std::string text;
  char block[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), block, sizeof block);
    if (n < 0 && errno == EINTR) continue;
    ST_CHECK(n >= 0, "cannot read {} '{}': {}", what, path.string(), errno_text(errno));
    if (n == 0) return text;
    text.append(block, static_cast<size_t>(n));
  }
}

void write_file_atomic(const fs::path& path, std::string_view content) {
  fs::path tmp = path;
  tmp += ".tmp";
  write_file_synced(tmp, content);
  rename_path(tmp, path);
  const fs::path parent = path.parent_path();
  fsync_path(parent.empty() ? fs::path(".") : parent, PathKind::Directory);
}

}  // namespace st
