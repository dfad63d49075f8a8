#pragma once
// Generic file I/O of every program and library: whole-file reads, whole
// writes that retry short ones, fsync, and replacing a file so that a reader
// never sees half of it. The rule for durability: a file is durable once it
// has been fsynced; its name is durable once its directory has been fsynced
// after the create, rename or remove. Every error names the path and the
// system's reason. checkpoint/fs.h adds what only checkpoints need.
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace st {

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
/// "safetensors file") and name the path and the reason:
/// "text file 'x' is not a regular file (a FIFO)". Every program opens its
/// input files through here (or read_file), so no input can hang a start-up.
UniqueFd open_regular_file(const std::filesystem::path& path, const std::string& what);

/// How open_output_file opens an existing file.
enum class OutputMode : uint8_t { Append, Truncate };

/// Opens `path` for writing, creating it (mode 0644) when it does not exist,
/// only if it is a regular file or a character device (/dev/null, /dev/full:
/// sinks that never block). A FIFO (whose open waits for a reader), a socket
/// or a directory is refused before anything is written, with
/// open_regular_file's message. The open itself never blocks.
UniqueFd open_output_file(const std::filesystem::path& path, const std::string& what, OutputMode mode);

/// Refuses an existing `path` that open_output_file would refuse, for a
/// writer that replaces the file later (e.g. a safetensors file written to a
/// temporary name and renamed): checked up front, before the work that
/// produces it. A missing path is fine.
void check_output_path(const std::filesystem::path& path, const std::string& what);

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

/// Creates (or truncates) `path` (open_output_file's checks), writes `content`
/// and fsyncs it; `after_write` runs between the write and the fsync, so
/// crash tests can stop there.
void write_file_synced(const std::filesystem::path& path, std::string_view content,
                       const std::function<void()>& after_write = {});

/// rename(2) of `from` to `to` (which it replaces), naming both on failure.
void rename_path(const std::filesystem::path& from, const std::filesystem::path& to);

/// The whole of the regular file `path` (open_regular_file's checks: the
/// open never blocks, anything but a regular file is refused). Errors start
/// with or name `what` (e.g. "config file") and the path:
/// "cannot open config file 'a.yaml': No such file or directory".
std::string read_file(const std::filesystem::path& path, const std::string& what);

/// Replaces `path` atomically and durably: `path` + ".tmp" is written and
/// fsynced, renamed over `path`, and the directory fsynced, so a reader sees
/// the old file or the whole new one.
void write_file_atomic(const std::filesystem::path& path, std::string_view content);

}  // namespace st
