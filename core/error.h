#pragma once
// Errors. Library code throws st::Error through ST_CHECK (or the *_CHECK
// wrappers around foreign APIs); main() catches what reaches it (run_main in core/cli.h), prints one
// line and exits non-zero. Other catch sites (checkpoint/ turns a rank's
// failure into a decision every rank shares, tools collect per-file
// problems) catch only to report or agree, never to hide an error. Messages name what the user can fix: file, key,
// tensor, rank.
#include <stdexcept>
#include <string>

#include "core/format.h"

namespace st {

/// An error raised by shardtrain; `what()` is "message (file:line)".
class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file, int line);
  /// The message without the source location.
  const std::string& message() const noexcept { return message_; }
  /// "file:line" of the check that failed.
  const std::string& location() const noexcept { return location_; }

 private:
  std::string message_;
  std::string location_;
};

/// An error every rank of a job raised with the same message (a bad config
/// file, a failure shared over the ranks): main() prints it once, on rank 0.
class AgreedError : public Error {
 public:
  using Error::Error;
};

/// The message of the exception `f` throws (an st::Error's without its
/// source location: these messages reach users), or "" when it returns. For
/// worker threads and ranks that must finish before an error is shared.
template <class F>
std::string error_message_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
/// Text of an MPI error code (implemented by the MPI backend; a build
/// without MPI returns the number).
std::string mpi_error_string(int code);
}  // namespace detail

}  // namespace st

/// Throws st::Error with a formatted message when `cond` is false.
#define ST_CHECK(cond, ...)                                                     \
  do {                                                                          \
    if (!(cond)) [[unlikely]]                                                   \
      ::st::detail::throw_error(__FILE__, __LINE__, ::st::format(__VA_ARGS__)); \
  } while (0)

/// Throws st::Error unconditionally.
#define ST_FAIL(...) ::st::detail::throw_error(__FILE__, __LINE__, ::st::format(__VA_ARGS__))

/// Wraps an MPI call; a non-success code throws with the call and MPI's text.
#define MPI_CHECK(call)                                                                                \
  do {                                                                                                 \
    int st_mpi_rc_ = (call);                                                                           \
    if (st_mpi_rc_ != 0) [[unlikely]]                                                                  \
      ::st::detail::throw_error(                                                                       \
          __FILE__, __LINE__,                                                                          \
          ::st::format("MPI call failed: {}: {}", #call, ::st::detail::mpi_error_string(st_mpi_rc_))); \
  } while (0)
