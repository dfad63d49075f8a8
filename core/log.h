#pragma once
// Logging. Every line is prefixed with the rank ("[rank 1] ...", or "[0/4]"
// style through Logger's prefix), so interleaved mpirun output stays legible.
// A Logger is a value owned by main() and passed down; there is no global.
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

#include "core/format.h"

namespace st {

enum class LogLevel : uint8_t { Debug, Info, Warn, Error };
/// "debug" | "info" | "warn" | "error"; throws st::Error for anything else.
LogLevel parse_log_level(std::string_view name);

/// Also hands `line` to scripts/launch when it asked for it
/// ($ST_LAUNCH_ERROR_FILE, set by scripts/launch-rank on the launcher's host):
/// across hosts mpirun may hold a rank's last output back (it sleeps in its
/// kill path once another host's rank failed), and the launcher then repeats
/// this line itself. Best effort: never fails, never blocks for long.
void tell_launcher(std::string_view line);

class Logger {
 public:
  /// Lines below `level` are dropped; output goes to `out` (stderr by default).
  Logger(int rank, int world_size, LogLevel level = LogLevel::Info, std::FILE* out = stderr);

  int rank() const { return rank_; }
  LogLevel level() const { return level_; }
  void set_level(LogLevel level) { level_ = level; }

  /// Writes one line "[r/N] LEVEL message" when `level` passes the filter.
  void write(LogLevel level, std::string_view message);

  template <class... A>
  void debug(std::string_view fmt, A&&... a) {
    log(LogLevel::Debug, fmt, std::forward<A>(a)...);
  }
  template <class... A>
  void info(std::string_view fmt, A&&... a) {
    log(LogLevel::Info, fmt, std::forward<A>(a)...);
  }
  template <class... A>
  void warn(std::string_view fmt, A&&... a) {
    log(LogLevel::Warn, fmt, std::forward<A>(a)...);
  }
  template <class... A>
  void error(std::string_view fmt, A&&... a) {
    log(LogLevel::Error, fmt, std::forward<A>(a)...);
  }

  /// Rank-0-only variants, for messages every rank would repeat.
  template <class... A>
  void info0(std::string_view fmt, A&&... a) {
    if (rank_ == 0) info(fmt, std::forward<A>(a)...);
  }
  template <class... A>
  void warn0(std::string_view fmt, A&&... a) {
    if (rank_ == 0) warn(fmt, std::forward<A>(a)...);
  }
  /// Rank 0 only, at every level but error: the one line a run ends with
  /// (`--log-level warn` keeps it, so a quiet run still reports its result).
  template <class... A>
  void summary0(std::string_view fmt, A&&... a) {
    if (rank_ == 0 && level_ != LogLevel::Error) emit(LogLevel::Info, format(fmt, std::forward<A>(a)...));
  }

 private:
  template <class... A>
  void log(LogLevel level, std::string_view fmt, A&&... a) {
    if (level < level_) return;
    write(level, format(fmt, std::forward<A>(a)...));
  }
  void emit(LogLevel level, std::string_view message);

  int rank_;
  int world_size_;
  LogLevel level_;
  std::FILE* out_;
  std::mutex mutex_;  // one line at a time from the trainer and the async writer
};

}  // namespace st
