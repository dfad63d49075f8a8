#pragma once
// File-system primitives of the checkpoint subsystem: the one place in the
// tree that writes files durably. A file is durable once it has been fsynced;
// its name is durable once its directory has been fsynced after the create,
// rename or remove. Every error names the path and the system's reason.
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace st::checkpoint {

/// The system's text for error number `err`.
std::string errno_text(int err);
/// The system's text for the current errno.
inline std::string errno_text() { return errno_text(errno); }

/// " (/abs/path)" for a relative `path`, "" for an absolute one: put after a
/// path in a message, it says which directory was meant when the message is
/// read away from the working directory the path was relative to.
std::string absolute_note(const std::filesystem::path& path);

/// Move-only owner of a POSIX file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() noexcept {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  /// Closes now and throws naming `path` if close fails (a delayed write
  /// error surfaces there); the destructor cannot report it.
  void close_checked(const std::filesystem::path& path);

 private:
  int fd_ = -1;
};

/// Opens `path` for reading only if it is a regular file: the open itself
/// cannot block (a FIFO with no writer, a device), and anything but a regular
/// file is refused before a byte is read. Errors start with `what` (e.g.
/// "safetensors file") and name the path and the reason.
UniqueFd open_regular_file(const std::filesystem::path& path, const std::string& what);

/// The whole of the regular file `path` (open_regular_file's checks), for the
/// JSON files of a checkpoint; errors start with `what` and name the path.
std::string read_regular_file(const std::filesystem::path& path, const std::string& what);

/// Writes all `n` bytes at the descriptor's position (short writes and EINTR
/// retried, at most 1 GiB per call); `what` names the file in errors.
void write_all(int fd, const void* data, size_t n, const std::string& what);
/// Writes all `n` bytes at file offset `offset` (retrying short writes and
/// EINTR); throws st::Error naming `what` and the errno text.
void pwrite_all(int fd, const void* data, size_t n, uint64_t offset, const std::string& what);

/// fsync(2) of an open file; `what` names it in the error.
void fsync_fd(int fd, const std::string& what);

enum class PathKind : uint8_t { File, Directory };
/// Opens `path` and fsyncs it: a file's data, or a directory's entries.
void fsync_path(const std::filesystem::path& path, PathKind kind);

/// Creates (or truncates) `path`, writes `content` and fsyncs it; `after_write`
/// runs between the write and the fsync, so crash tests can stop there.
void write_file_synced(const std::filesystem::path& path, std::string_view content,
                       const std::function<void()>& after_write = {});
/// Replaces `path` atomically and durably: `path` + ".tmp" is written and
/// fsynced, renamed over `path`, and the directory fsynced, so a reader sees
/// the old file or the whole new one.
void write_file_atomic(const std::filesystem::path& path, std::string_view content);

/// rename(2) of `from` to `to` (which it replaces), naming both on failure.
void rename_path(const std::filesystem::path& from, const std::filesystem::path& to);
/// Renames `from` to `to`, failing instead of replacing when `to` exists
/// (RENAME_NOREPLACE; an existence check first where the file system lacks it).
void rename_no_replace(const std::filesystem::path& from, const std::filesystem::path& to);

/// Owner of a directory this process writes before publishing it: created
/// empty, and removed with its contents on destruction unless keep() was
/// called (once it has been renamed into place). Whatever is at `path`
/// beforehand is removed first: callers put their pid in the name, so it can
/// only be debris of an earlier process. Move-only; the destructor never
/// throws (a leftover hidden directory is harmless).
class TempDir {
 public:
  /// Throws st::Error naming `path` when it cannot be created.
  explicit TempDir(std::filesystem::path path);
  TempDir(TempDir&& other) noexcept;
  TempDir& operator=(TempDir&& other) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();

  const std::filesystem::path& path() const { return path_; }
  /// Leaves the directory where it is (or where it was renamed to) on destruction.
  void keep() { kept_ = true; }

 private:
  void remove_unless_kept() noexcept;

  std::filesystem::path path_;
  bool kept_ = false;
};

/// The contents of `path`, a small regular file (`latest`, a COMPLETE
/// marker, at most 1 MiB). nullopt, with "<path> <why>" in `problem`, when it
/// is missing, cannot be reached (a symlink loop, no permission), is not a
/// regular file, is larger or is unreadable. Anything but a regular file is
/// refused before it is opened, so a FIFO never blocks and a directory never
/// reads as empty.
std::optional<std::string> read_small_file(const std::filesystem::path& path, std::string* problem = nullptr);

/// `text` without leading and trailing spaces, tabs and line ends.
std::string trim_space(std::string text);

}  // namespace st::checkpoint
