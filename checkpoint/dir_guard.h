#pragma once
// Start-up checks of a checkpoint root, so that a run that cannot save fails
// before its first step instead of after hours of training, and so that two
// jobs never write into the same root (each would delete the other's
// temporary directory as debris; see apply_retention()).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/topology.h"
#include "core/comm.h"
#include "core/log.h"

namespace st::checkpoint {

/// Name of the lock file inside a checkpoint root.
inline constexpr std::string_view kLockFileName = ".lock";

/// An exclusive advisory lock (flock) on root/.lock, held for the life of the
/// object. The file records the holder ("pid N host H"), which is what a second
/// job reports when it finds the lock taken. The kernel drops the lock when the
/// holder exits in any way (SIGKILL included), so a stale file never blocks a
/// later run. Move-only.
class DirectoryLock {
 public:
  /// Creates `root` if needed and takes the lock without waiting. Throws
  /// st::Error "'root' is in use by pid N on host H" when another process
  /// holds it, or naming the path on an I/O failure.
  explicit DirectoryLock(const std::filesystem::path& root);
  ~DirectoryLock();
  DirectoryLock(DirectoryLock&& other) noexcept;
  DirectoryLock& operator=(DirectoryLock&& other) noexcept;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

/// Makes sure checkpoints can be written under `root`: creates it, refuses a
/// file system that does not store files (procfs, sysfs), writes, fsyncs and
/// removes the probe file root/`probe_name`. Throws st::Error naming `root` and
/// the cause ("'a/ckpt' cannot be created: 'a' is not a directory",
/// "Read-only file system", "No space left on device").
void probe_writable_dir(const std::filesystem::path& root, const std::string& probe_name);

/// Bytes an unprivileged writer may still write on root's file system.
int64_t free_bytes(const std::filesystem::path& root);

/// The step-NNNNNN directories under `root` (complete or not), ascending by
/// step; empty when root does not exist.
std::vector<std::string> step_dirs(const std::filesystem::path& root);

/// Moves `latest` and every step-NNNNNN directory of `root` into a new
/// root/overwritten-YYYYMMDD-HHMMSS/ (UTC; "-2", "-3" appended when taken) and
/// fsyncs root. Nothing is deleted. Returns the new directory. Throws st::Error
/// naming the path on I/O failure.
std::filesystem::path move_checkpoints_aside(const std::filesystem::path& root);

/// A run's hold on its checkpoint root.
struct RunRoot {
  std::optional<DirectoryLock> lock;  // on the ranks that own a root (rank 0, or each host's lowest rank)
  StorageTopology topology;           // shared or node-local (topology.h)
};

/// Start-up checks of a run's checkpoint root, before the model is built, so
/// a run that could not save fails in its first second. Collective; every
/// rank throws the same error, naming `root` as checkpoint.dir. Every rank
/// creates the root and writes, fsyncs and removes a probe file; then the
/// ranks find out whether they share it (detect_storage, logged in one line).
/// The owner of each root (rank 0 when it is shared, the lowest rank of each
/// host when it is node-local) takes its lock (held by the returned object
/// for the run: a second job on the same root fails here). Then, for a fresh
/// start (`fresh`) in a root that already holds checkpoints: with `overwrite`
/// each owner moves them aside (move_checkpoints_aside), otherwise every rank
/// fails naming the newest one and its host, so that two runs never mix in
/// one directory.
RunRoot open_run_root(const std::string& root, SharedStorage shared, bool fresh, bool overwrite, ProcessGroup& group,
                      Logger& log);

/// Collective: an error when root's file system has room for less than one
/// checkpoint of `checkpoint_bytes`, a warning (rank 0) below two.
void check_free_space(const std::string& root, int64_t checkpoint_bytes, ProcessGroup& group, Logger& log);

}  // namespace st::checkpoint
