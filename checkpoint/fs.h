#pragma once
// File-system primitives only checkpoints need (renames that never replace,
// temporary directories, small marker files), beside the generic ones of
// core/file.h (descriptors, whole writes, fsync, atomic replace), whose
// durability rule they follow. Every error names the path and the reason.
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "core/file.h"

namespace st::checkpoint {

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
