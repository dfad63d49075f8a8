#include "checkpoint/dir_guard.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "checkpoint/commit.h"
#include "checkpoint/fs.h"
#include "core/comm.h"
#include "core/error.h"

namespace st::checkpoint {

namespace fs = std::filesystem;

namespace {

// From linux/magic.h: file systems that look like directories but store nothing.
constexpr long kProcMagic = 0x9fa0;
constexpr long kSysfsMagic = 0x62656572;

// Why `root` cannot be created: names the ancestor that is not a directory when there is one.
std::string creation_problem(const fs::path& root, const std::error_code& ec) {
  for (fs::path p = root.parent_path(); !p.empty(); p = p.parent_path()) {
    std::error_code stat_ec;
    const fs::file_status st = fs::status(p, stat_ec);
    if (!stat_ec && fs::exists(st) && !fs::is_directory(st)) return format("'{}' is not a directory", p.string());
    if (p == p.parent_path()) break;
  }
  return ec.message();
}

// Writes all of `data`; returns 0 or the errno of the failure.
int write_fully(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t got = ::write(fd, data, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return got < 0 ? errno : EIO;
    data += got;
    n -= static_cast<size_t>(got);
  }
  return 0;
}

}  // namespace

DirectoryLock::DirectoryLock(const fs::path& root) {
  std::error_code ec;
  fs::create_directories(root, ec);
  ST_CHECK(!ec, "'{}'{} cannot be created: {}", root.string(), absolute_note(root), creation_problem(root, ec));
  const fs::path path = root / kLockFileName;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ST_CHECK(fd_ >= 0, "cannot open the lock file '{}': {}", path.string(), errno_text(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    std::string holder(256, '\0');
    const ssize_t n = ::pread(fd_, holder.data(), holder.size(), 0);
    holder.resize(n > 0 ? static_cast<size_t>(n) : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    ST_CHECK(e != EWOULDBLOCK,
             "'{}'{} is in use by {} (its lock file {} is held); wait for that job to end or use "
             "another directory",
             root.string(), absolute_note(root), holder.empty() ? std::string("another process") : holder,
             path.string());
    ST_FAIL("cannot lock '{}': {}", path.string(), errno_text(e));
  }
  const std::string me = format("pid {} on host {}\n", ::getpid(), host_name());
  // Best effort: the lock is what protects the directory; the text only explains it.
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t ignored = ::pwrite(fd_, me.data(), me.size(), 0);
    (void)ignored;
  }
}

DirectoryLock::~DirectoryLock() {
  // Closing releases the lock. The file stays: removing it would let a
  // waiting process lock an unlinked inode while a third creates a new file.
  if (fd_ >= 0) ::close(fd_);
}

DirectoryLock::DirectoryLock(DirectoryLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

DirectoryLock& DirectoryLock::operator=(DirectoryLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void probe_writable_dir(const fs::path& root, const std::string& probe_name) {
  std::error_code ec;
  fs::create_directories(root, ec);
  ST_CHECK(!ec, "'{}'{} cannot be created: {}", root.string(), absolute_note(root), creation_problem(root, ec));
  ST_CHECK(fs::is_directory(root, ec), "'{}'{} is not a directory", root.string(), absolute_note(root));

  struct statfs sf {};
  ST_CHECK(::statfs(root.c_str(), &sf) == 0, "cannot stat the file system of '{}': {}", root.string(),
           errno_text(errno));
  ST_CHECK(sf.f_type != kProcMagic && sf.f_type != kSysfsMagic,
           "'{}' is on {}, which does not store files; choose a directory on a disk or a shared file system",
           root.string(), sf.f_type == kProcMagic ? "procfs" : "sysfs");

  // A block's worth of data: a full file system refuses it (one byte might
  // still fit in a partly used block).
  const fs::path probe = root / probe_name;
  const std::vector<char> data(4096, 'p');
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ST_CHECK(fd >= 0, "'{}'{} is not writable: {}", root.string(), absolute_note(root), errno_text(errno));
  std::string problem;
  if (const int e = write_fully(fd, data.data(), data.size()); e != 0)
    problem = errno_text(e);
  else if (::fsync(fd) != 0)
    problem = format("fsync failed: {}", errno_text(errno));
  if (::close(fd) != 0 && problem.empty()) problem = format("close failed: {}", errno_text(errno));
  ::unlink(probe.c_str());
  ST_CHECK(problem.empty(), "'{}'{} is not writable: {}", root.string(), absolute_note(root), problem);
}

int64_t free_bytes(const fs::path& root) {
  struct statvfs sv {};
  ST_CHECK(::statvfs(root.c_str(), &sv) == 0, "cannot stat the file system of '{}': {}", root.string(),
           errno_text(errno));
  return static_cast<int64_t>(sv.f_bavail) * static_cast<int64_t>(sv.f_frsize);
}

std::vector<std::string> step_dirs(const fs::path& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (std::optional<int64_t> step = parse_step_dir_name(name)) found.emplace_back(*step, name);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> names;
  for (auto& [step, name] : found) names.push_back(std::move(name));
  return names;
}

fs::path move_checkpoints_aside(const fs::path& root) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &utc);
  fs::path aside = root / (std::string("overwritten-") + stamp);
  for (int n = 2; fs::exists(aside); ++n) aside = root / format("overwritten-{}-{}", stamp, n);
  std::error_code ec;
  fs::create_directory(aside, ec);
  ST_CHECK(!ec, "cannot create '{}': {}", aside.string(), ec.message());
  std::vector<std::string> names = step_dirs(root);
  if (fs::exists(fs::symlink_status(root / kLatestFileName))) names.emplace_back(kLatestFileName);
  for (const std::string& name : names) {
    fs::rename(root / name, aside / name, ec);
    ST_CHECK(!ec, "cannot move '{}' to '{}': {}", (root / name).string(), aside.string(), ec.message());
  }
  fsync_path(root, PathKind::Directory);
  return aside;
}

RunRoot open_run_root(const std::string& dir, SharedStorage shared, bool fresh, bool overwrite, ProcessGroup& world,
                      Logger& log) {
  // The probe first, so an unusable directory is reported as such rather than
  // as a lock file that cannot be created; its file names are this process's
  // own, so probing a directory another job holds disturbs nothing.
  run_on_every_rank(world, [&] {
    try {
      probe_writable_dir(dir, format(".probe-rank{}-pid{}", world.rank(), ::getpid()));
    } catch (const Error& e) {
      ST_FAIL("checkpoint.dir {}", e.message());
    }
  });
  RunRoot out;
  out.topology = detect_storage(dir, shared, world);
  log.info0("{}", out.topology.describe(dir));
  const bool owner = out.topology.shared ? world.rank() == 0 : out.topology.leads_host(world.rank());
  const std::string where = out.topology.shared ? std::string() : format(" on host {}", host_name());
  run_on_every_rank(world, [&] {
    if (!owner) return;
    try {
      out.lock.emplace(dir);
    } catch (const Error& e) {
      ST_FAIL("checkpoint.dir {}{}", e.message(), where);
    }
    if (!fresh) return;
    const std::vector<std::string> steps = step_dirs(dir);
    std::error_code ec;
    if (steps.empty() && !fs::exists(fs::symlink_status(fs::path(dir) / kLatestFileName, ec))) return;
    if (overwrite) {
      const fs::path aside = move_checkpoints_aside(dir);
      log.info("--overwrite: moved {} checkpoint(s) of the earlier run in {}{} to {}; starting from step 0",
               steps.size(), dir, where, aside.string());
      return;
    }
    ST_FAIL(
        "checkpoint.dir '{}'{}{} already holds checkpoints (the newest is {}); a new run there would mix with "
        "them. Continue that run with --resume auto, start over with --overwrite (moves them aside, deletes "
        "nothing), or choose another checkpoint.dir",
        dir, absolute_note(dir), where, steps.empty() ? std::string(kLatestFileName) : steps.back());
  });
  return out;
}

void check_free_space(const std::string& root, int64_t need, ProcessGroup& group, Logger& log) {
  run_on_every_rank(group, [&] {
    const int64_t free = free_bytes(root);
    ST_CHECK(free >= need,
             "checkpoint.dir '{}'{} has {} free, less than one checkpoint of this run needs (about {}); free some "
             "space or choose another directory",
             root, absolute_note(root), human_bytes(free), human_bytes(need));
    if (free < 2 * need && group.rank() == 0)
      log.warn("checkpoint.dir '{}' has {} free, room for fewer than two checkpoints of about {} each", root,
               human_bytes(free), human_bytes(need));
  });
}

}  // namespace st::checkpoint
