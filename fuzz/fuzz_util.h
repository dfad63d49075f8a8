#pragma once
// What every fuzz target shares: the rule for exceptions and a scratch
// directory for parsers that read files.
//
// The rule: a parser of untrusted input may refuse it only with st::Error
// (whose message names the file and the key; main() prints it as one line).
// Any other exception (a std::out_of_range, a json::type_error, a
// std::length_error from a bad size) is a finding, as is every sanitizer
// report: the target aborts and libFuzzer saves the input as a crash file.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include <stdlib.h>
#include <unistd.h>

#include "core/error.h"

namespace st::fuzz {

/// Runs `parse`; st::Error is an accepted refusal, any other exception aborts.
template <class F>
void expect_only_st_errors(F&& parse) {
  try {
    parse();
  } catch (const st::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: parser threw a non-st::Error exception: %s\n", e.what());
    std::abort();
  }
}

/// Aborts (a finding) when a property of a parsed value does not hold.
inline void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz: property violated: %s\n", what);
  std::abort();
}

namespace detail {
inline std::filesystem::path make_scratch_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/st-fuzz-XXXXXX";
  if (!::mkdtemp(pattern.data())) {
    std::perror("fuzz: mkdtemp");
    std::abort();
  }
  return pattern;
}
}  // namespace detail

/// One fresh directory per process under $TMPDIR (or /tmp), removed at a
/// normal exit (a crash leaves it; scripts/fuzz.sh points TMPDIR into the
/// build directory). Targets rewrite the files inside it for every input.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = detail::make_scratch_dir();
  // Registered after `dir` is built, so it runs before `dir` is destroyed.
  [[maybe_unused]] static const int cleanup = std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(scratch_dir(), ec);
  });
  return dir;
}

/// Replaces `path` with exactly `bytes`.
inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

/// Empties `dir` (creating it when missing), so no file of the previous input is left.
inline void reset_dir(const std::filesystem::path& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
}

}  // namespace st::fuzz
